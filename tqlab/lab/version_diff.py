"""Notebook 12's comparisons: what changed for the workspace from one vLLM version to the next.

Two sources, the same questions:

* **recorded** — the generated data of each version (:class:`tqlab.core.vllm_versions.VllmVersion`'s
  ``census_file``: every workspace call site, ``parity/gen_consumer_census.py``; ``architectures_file``: the
  architecture -> reachable consumers table, ``parity/gen_arch_consumers.py``), loaded with their provenance;
* **live** — vLLM's own source in a version's parity environment (``.venv-parity``, ``.venv-parity-0.34``;
  :func:`tqlab.lab.environment.environment`), read as text and with ``ast``, never imported.

:func:`cuda_sites` and :func:`site_diff` compare censuses, :func:`arch_diff` the architecture tables,
:func:`source_facts` reads one vLLM package folder, :func:`plot_sites_by_phase` draws the censuses' CUDA call
sites by the start-up phase that first sizes them (matplotlib imported there only). Pure functions over dicts
and folders; nothing here knows a version number (the notebook names the versions it compares).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Mapping

__all__ = ["PHASE_ORDER", "arch_diff", "cuda_sites", "manager_methods", "plot_sites_by_phase", "site_diff",
           "source_facts"]

_RUNNERS = ("v1/worker/gpu_model_runner.py", "v1/worker/gpu/model_runner.py")


def cuda_sites(census: Mapping[str, Any]) -> set[str]:
    """``{"path:function"}`` of a census's CUDA call sites (``platform == "cuda"``), as
    :attr:`~tqlab.core.vllm_versions.VllmVersion.added_consumers` names them."""
    return {f"{c['path']}:{c['function']}" for c in census["call_sites"] if c["platform"] == "cuda"}


def site_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{"added", "removed", "kept"}``: sorted CUDA call sites (:func:`cuda_sites`) of census ``new`` not in
    ``old``, of ``old`` not in ``new``, and in both."""
    a, b = cuda_sites(old), cuda_sites(new)
    return {"added": sorted(b - a), "removed": sorted(a - b), "kept": sorted(a & b)}


def _reached(row: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(c["consumer"] for c in row.get("call_sites", ()))


def arch_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Two architecture tables (``data/vllm_<v>_arch_consumers.json``) side by side: ``added`` / ``removed``
    architectures (sorted names), ``changed``: ``{architecture: {"gained": [...], "lost": [...]}}`` for those in
    both whose reachable call sites (their ``call_sites[].consumer``) differ, and ``counts`` of each table."""
    a, b = old["architectures"], new["architectures"]
    changed = {}
    for name in sorted(set(a) & set(b)):
        x, y = _reached(a[name]), _reached(b[name])
        if x != y:
            changed[name] = {"gained": sorted(y - x), "lost": sorted(x - y)}
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)), "changed": changed,
            "counts": (len(a), len(b))}


def manager_methods(workspace_py: str) -> list[str]:
    """The public methods of class ``WorkspaceManager`` in the text of ``vllm/v1/worker/workspace.py`` (``ast``),
    in source order. ``ValueError`` when the text defines no such class."""
    for node in ast.walk(ast.parse(workspace_py)):
        if isinstance(node, ast.ClassDef) and node.name == "WorkspaceManager":
            return [f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]
    raise ValueError("no class WorkspaceManager in the given workspace.py")


def source_facts(vllm_root: Path | str) -> dict[str, Any]:
    """What a vLLM package folder says about the workspace, read from its files: ``runners`` (which of the two
    GPU model runners it ships, as paths under ``vllm/``), ``v2_runner_flag`` (``VLLM_USE_V2_MODEL_RUNNER`` is
    in ``envs.py``), ``manager_methods`` (:func:`manager_methods`), ``workspace_lines`` (lines of
    ``v1/worker/workspace.py``), ``view_alignment_named`` (``_VIEW_ALIGNMENT`` is defined there).
    ``FileNotFoundError`` naming the folder when it holds no ``v1/worker/workspace.py``."""
    root = Path(vllm_root)
    ws = root / "v1" / "worker" / "workspace.py"
    if not ws.is_file():
        raise FileNotFoundError(f"{root} is not a vLLM package folder (no v1/worker/workspace.py)")
    text = ws.read_text()
    envs = root / "envs.py"
    return {
        "runners": [r for r in _RUNNERS if (root / r).is_file()],
        "v2_runner_flag": envs.is_file() and "VLLM_USE_V2_MODEL_RUNNER" in envs.read_text(),
        "manager_methods": manager_methods(text),
        "workspace_lines": len(text.splitlines()),
        "view_alignment_named": "_VIEW_ALIGNMENT" in text,
    }


PHASE_ORDER = ("init", "profile_run", "kernel_warmup", "jit_warmup_v2", "capture", "never_called")
"""The census's ``first_sized_by`` values in start-up order (``parity/gen_consumer_census.py``); others follow."""


def plot_sites_by_phase(counts: Mapping[str, Mapping[str, int]], ax=None, title: str | None = None):
    """Grouped horizontal bars: for each start-up phase (:data:`PHASE_ORDER`, then any other), the number of
    CUDA call sites each census first sizes there. ``counts``: ``{label: census["counts"]["cuda_by_first_sized_by"]}``
    in the order to draw. Returns the Axes. ``ValueError`` when ``counts`` is empty."""
    import matplotlib.pyplot as plt

    if not counts:
        raise ValueError("plot_sites_by_phase needs at least one census")
    phases = [p for p in PHASE_ORDER if any(p in c for c in counts.values())]
    phases += sorted({p for c in counts.values() for p in c} - set(phases))
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.55 * len(phases) * len(counts) + 1.2))
    height = 0.8 / len(counts)
    for i, (label, c) in enumerate(counts.items()):
        ys = [k + i * height for k in range(len(phases))]
        vals = [c.get(p, 0) for p in phases]
        bars = ax.barh(ys, vals, height=height, label=label)
        ax.bar_label(bars, padding=2, fontsize=8)
    ax.set_yticks([k + height * (len(counts) - 1) / 2 for k in range(len(phases))], phases)
    ax.invert_yaxis()
    ax.set_xlabel("CUDA call sites first sized in this phase")
    ax.set_title(title or "Workspace call sites by the start-up phase that first sizes them")
    ax.legend(loc="lower right")
    return ax
