"""Notebook 10's two helpers: the lock without PR #44053 over every consumer, and the latent-crash checks re-run.

* :func:`lock_without_fix` — what each active consumer asks before ``lock_workspace()`` when TurboQuant's
  builder does **not** reserve (vLLM before PR #44053): TurboQuant's share is the decode scratch of the FULL
  decode capture (:func:`tqlab.predict.analysis.decode_bytes` at ``decode_rows_at_lock`` rows), every other consumer's is its
  registry reservation (``tqlab.predict.analysis.consumer_table``: the fix changes only TurboQuant's builder).
  The slot is the maximum (separate ``get_simultaneous`` calls alias the same bytes).
* :func:`run_latent_crash_checks` — ``parity/latent_crashes.py``'s four checks, run with vLLM 0.33's own classes
  in the parity environment's Python (a subprocess: the notebook's kernel has no vLLM), returning the same
  records as ``data/vllm_0_33_latent_crashes.json`` without writing it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tqlab.predict import analysis

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["REPO_ROOT", "lock_without_fix", "parity_python", "run_latent_crash_checks"]

REPO_ROOT = Path(__file__).resolve().parents[2]

_CHECKS_SCRIPT = (
    "import json, latent_crashes as lc\n"
    "from tqlab.vllm import vllm_cpu_patches\n"
    "with vllm_cpu_patches():\n"
    "    out = [check() for check in lc.CHECKS]\n"
    "print('LATENT_CRASHES ' + json.dumps(out, default=str))\n"
)


def lock_without_fix(config: "EngineConfig") -> dict[str, int]:
    """``{registry name: bytes before the lock}`` without PR #44053; the slot at the lock is ``max`` of the values.

    ``turboquant`` (when the deployment uses TurboQuant) is the decode capture's scratch; the other keys are the
    non-TurboQuant consumers' ``reserved_bytes``. Empty for a start-up that never locks (eager). Raises
    ``ValueError`` like :func:`tqlab.predict.analysis.consumer_table` for a config a consumer cannot size.
    """
    if not analysis.locks_workspace(config):
        return {}
    out = {}
    if config.has_turboquant_consumers:  # the FULL decode capture's _decode_attention call (none with k > 0)
        rows = analysis.decode_rows_at_lock(config)
        out["turboquant"] = analysis.decode_bytes(config, rows) if rows and not config.num_speculative_tokens else 0
    for row in analysis.consumer_table(config).rows:
        if not row.name.startswith("turboquant"):
            out[row.name] = row.reserved_bytes
    return out


def parity_python(vllm_root: Path | str | None) -> Path | None:
    """The parity environment's Python for a vLLM package folder ``<venv>/lib/python3.X/site-packages/vllm``
    (:func:`tqlab.vllm.source_scan.find_vllm_source`), or ``None`` when there is none."""
    if vllm_root is None:
        return None
    python = Path(vllm_root).resolve().parents[3] / "bin" / "python"
    return python if python.is_file() else None


def run_latent_crash_checks(python: Path | str, timeout_s: float = 120.0) -> list[dict]:
    """``parity/latent_crashes.py``'s checks with vLLM's own classes, run by ``python`` (the parity venv's).

    Returns the four ``{"candidate", "name", "verdict", "evidence", "limits"}`` records (nothing is written).
    Raises ``RuntimeError`` (one line: the exit status and the last line of stderr) when the run fails, or when it
    runs past ``timeout_s`` seconds.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "parity")]))
    try:
        proc = subprocess.run([str(python), "-c", _CHECKS_SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{python} parity/latent_crashes.py checks ran past {timeout_s:g} s") from None
    line = next((x for x in proc.stdout.splitlines() if x.startswith("LATENT_CRASHES ")), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} parity/latent_crashes.py checks failed (exit {proc.returncode}): {last}")
    return json.loads(line.removeprefix("LATENT_CRASHES "))
