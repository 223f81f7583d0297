#!/usr/bin/env python3
"""Record seed 002's consumer table, counted in vLLM's source, to data/vllm_workspace_consumers.json.

    python tools/record_consumers.py [--vllm-venv .venv-parity] [--out data]

Reads the installed vLLM package of ``--vllm-venv`` (text only, nothing imported; see
``tqlab.vllm.source_scan.workspace_consumers``) and writes the counts with provenance
(device, date, commit, command, torch, plus the vLLM version read from its dist-info).
Notebook 07 shows the recording when vLLM's source is not installed. Exit status 2 when
no vLLM source is found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tqlab.core.provenance import make_provenance, save_recorded  # noqa: E402
from tqlab.vllm.source_scan import find_vllm_source, workspace_consumers  # noqa: E402

NAME = "vllm_workspace_consumers"


def vllm_version(src: Path) -> str:
    """The ``Version:`` of the ``vllm-*.dist-info`` next to ``src``, or ``"unknown"``."""
    for meta in sorted(src.parent.glob("vllm-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-venv", default=str(ROOT / ".venv-parity"), help="venv holding vLLM (parity/install.sh)")
    parser.add_argument("--out", default=None, help="data folder (default: data/)")
    args = parser.parse_args(argv)
    src = find_vllm_source(args.vllm_venv)
    if src is None:
        print(f"error: no vLLM source under {args.vllm_venv} (run `bash parity/install.sh`)", file=sys.stderr)
        return 2
    result = workspace_consumers(src)
    version = vllm_version(src)
    prov = make_provenance("python tools/record_consumers.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
                           extra={"vllm": version})
    path = save_recorded(NAME, {"vllm_version": version, **result}, prov, args.out)
    print(f"{len(result['files'])} files call current_workspace_manager(); {len(result['reservers'])} reserve; "
          f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
