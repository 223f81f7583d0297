"""The environment check at the top of every notebook: which torch, whether CUDA is there, whether vLLM is.

:func:`environment` gathers the facts (nothing is imported but ``torch`` and ``tqlab``; vLLM is only looked
for, with :func:`tqlab.vllm.source_scan.find_vllm_source`, never imported: the notebooks' kernel has no vLLM);
:func:`show_environment` prints them as one Markdown table, with what each missing piece changes.
"""

from __future__ import annotations

import platform
from typing import Any

__all__ = ["environment", "environment_rows", "show_environment"]


def environment() -> dict[str, Any]:
    """``{"tqlab", "python", "torch", "cuda", "gpu", "vllm_parity"}``: versions (str), whether CUDA is available
    (bool), the first GPU's name (str, ``None`` without CUDA) and the folder of the vLLM package of the parity
    environment ``.venv-parity`` (str, ``None`` when there is none; see ``parity/README.md``)."""
    from importlib.metadata import version

    import torch

    from tqlab.vllm.source_scan import find_vllm_source

    cuda = bool(torch.cuda.is_available())
    vllm_root = find_vllm_source()
    return {
        "tqlab": version("tqlab"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "vllm_parity": None if vllm_root is None else str(vllm_root),
    }


def environment_rows(env: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(what, found, what it changes)`` rows of :func:`environment`'s dict, for the table."""
    return [
        ("tqlab / Python", f"{env['tqlab']} / {env['python']}", "—"),
        ("torch", env["torch"], "—"),
        ("CUDA", env["gpu"] if env["cuda"] else "not available",
         "live GPU cells run" if env["cuda"] else "GPU cells show recorded runs under a banner"),
        ("vLLM 0.33 (parity env)", env["vllm_parity"] or "not found",
         "vLLM's own classes can be run live" if env["vllm_parity"] else
         "vLLM's results come from data/parity_results.json (recorded)"),
    ]


def show_environment() -> dict[str, Any]:
    """Display the environment table (Markdown in Jupyter, text elsewhere) and return :func:`environment`'s dict."""
    from tqlab.lab.display import markdown_table, show_md

    env = environment()
    show_md(markdown_table(("environment", "found", "what it changes here"), environment_rows(env)))
    return env
