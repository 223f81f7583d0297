"""The environment check at the top of every notebook: which vLLM version it shows, which torch, CUDA, vLLM.

:func:`environment` gathers the facts (nothing is imported but ``torch`` and ``tqlab``; vLLM is only looked
for, with :func:`tqlab.vllm.source_scan.find_vllm_source`, never imported: the notebooks' kernel has no vLLM);
:func:`show_environment` chooses the vLLM version the notebook shows (:func:`tqlab.core.vllm_versions.select`,
so every tqlab call in the notebook answers for that version whatever the package default is) and prints the
facts as one Markdown table, with what each missing piece changes.

The parity environment of a version is ``parity/venv.sh``'s: ``.venv-parity`` for 0.33, ``.venv-parity-<v>``
for a later one (``.venv-parity-0.34``), ``$PARITY_VENV`` first, then in the repository or next to the running
environment; its vLLM must
be that version (its ``vllm-<release>.dist-info``), else it is reported as not found.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["environment", "environment_rows", "parity_venv_names", "show_environment"]

_REPO = Path(__file__).resolve().parents[2]


def parity_venv_names(version: str) -> tuple[str, ...]:
    """The folder names ``parity/venv.sh`` gives the parity environment of ``version`` (``"0.33"``:
    ``(".venv-parity",)``; ``"0.34"``: ``(".venv-parity-0.34",)``). ``ValueError`` for an unsupported version."""
    from tqlab.core import vllm_versions

    v = vllm_versions.get(version)
    return (".venv-parity",) if v.name == vllm_versions.SUPPORTED[0] else (f".venv-parity-{v.name}",)


def _parity_vllm(version: str) -> Path | None:
    """The ``vllm`` package folder of ``version``'s parity environment, or None (absent, or another release)."""
    from tqlab.core import vllm_versions
    from tqlab.vllm.source_scan import find_vllm_source

    release = vllm_versions.get(version).release
    bases = (_REPO, Path(sys.prefix).resolve().parent)
    candidates = [os.environ["PARITY_VENV"]] if os.environ.get("PARITY_VENV") else []
    candidates += [b / name for name in parity_venv_names(version) for b in bases]
    for c in candidates:
        root = find_vllm_source(c)
        if root is not None and (root.parent / f"vllm-{release}.dist-info").is_dir():
            return root
    return None


def environment(vllm: str | None = None) -> dict[str, Any]:
    """``{"vllm", "tqlab", "python", "torch", "cuda", "gpu", "vllm_parity"}``: the vLLM version shown (``"0.33"``;
    ``vllm`` None: :func:`tqlab.core.vllm_versions.current`, nothing selected), versions (str), whether CUDA is
    available (bool), the first GPU's name (str, ``None`` without CUDA) and the folder of the vLLM package of that
    version's parity environment (str, ``None`` when there is none; see ``parity/README.md``).
    ``ValueError`` (from :func:`tqlab.core.vllm_versions.get`) for an unsupported version."""
    from importlib.metadata import version as dist_version

    import torch

    from tqlab.core import vllm_versions

    version = vllm_versions.get(vllm)
    cuda = bool(torch.cuda.is_available())
    vllm_root = _parity_vllm(version.name)
    return {
        "vllm": version.name,
        "tqlab": dist_version("tqlab"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "vllm_parity": None if vllm_root is None else str(vllm_root),
    }


def environment_rows(env: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(what, found, what it changes)`` rows of :func:`environment`'s dict, for the table."""
    v = env["vllm"]
    return [
        ("tqlab / Python", f"{env['tqlab']} / {env['python']}", "—"),
        ("torch", env["torch"], "—"),
        ("CUDA", env["gpu"] if env["cuda"] else "not available",
         "live GPU cells run" if env["cuda"] else "GPU cells show recorded runs under a banner"),
        (f"vLLM {v} (parity env)", env["vllm_parity"] or "not found",
         "vLLM's own classes can be run live" if env["vllm_parity"] else
         "vLLM's results come from data/ (recorded, with provenance)"),
    ]


def show_environment(vllm: str | None = None) -> dict[str, Any]:
    """Select the vLLM version the notebook shows (``vllm``: ``"0.33"``, ``"0.34"``; None keeps
    :func:`tqlab.core.vllm_versions.current`), display the environment table (Markdown in Jupyter, text
    elsewhere) and return :func:`environment`'s dict. A bad version raises ``ValueError`` naming it and leaves
    the selection as it was."""
    from tqlab.core import vllm_versions
    from tqlab.lab.display import markdown_table, show_md

    if vllm is not None:
        vllm_versions.select(vllm)
    env = environment()
    v = vllm_versions.get(env["vllm"])
    show_md(f"**This notebook shows vLLM {v.name}** (release {v.release}; `tqlab.core.vllm_versions.select(\"{v.name}\")`: "
            f"every tqlab answer below is for that release's code).")
    show_md(markdown_table(("environment", "found", "what it changes here"), environment_rows(env)))
    return env
