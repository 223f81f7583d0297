"""Seed 002's consumer table, counted in vLLM's own source (text only: nothing is imported).

:func:`workspace_consumers` walks an installed ``vllm`` package (e.g. ``.venv-parity``'s) and
reports, for every ``.py`` file outside ``vllm/v1/worker/workspace.py``: whether it calls
``current_workspace_manager()``, how many ``get_simultaneous(`` calls it holds, and whether it
defines or calls a reservation (``reserve_workspace()``, ``_reserve_workspace``,
``_reserve_workspaces``). It also checks the rows of seed 002's table ("WorkspaceManager 被以下场景使用")
one by one, and how ``FlashMLASparseImpl.__init__`` (``vllm/v1/attention/backends/mla/flashmla_sparse.py``)
reserves. ``tools/record_consumers.py`` writes the result to ``data/vllm_workspace_consumers.json``
with provenance; notebook 07 shows it live when vLLM's source is present, else that recording.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

__all__ = ["SEED_002_TABLE", "find_vllm_source", "workspace_consumers"]

#: Seed 002's table: (scenario, consumer, file under vllm/ as the seed names it, what it must hold there).
SEED_002_TABLE: tuple[tuple[str, str, str, str], ...] = (
    ("DCP attention", "FlashAttnImpl", "v1/attention/backends/flash_attn.py", "get_simultaneous("),
    ("MLA sparse attention", "FlashMLASparseImpl", "v1/attention/backends/mla/flashmla_sparse.py", "get_simultaneous("),
    ("MoE experts", "FusedMoEModularKernel", "model_executor/layers/fused_moe/modular_kernel.py", "get_simultaneous("),
    ("sparse attention indexer", "sparse_attn_indexer", "model_executor/layers/sparse_attn_indexer.py",
     "get_simultaneous("),
    ("Elastic EP scaling", "elastic_execute", "distributed/elastic_ep/elastic_execute.py", "unlock_workspace()"),
)

_RESERVES = re.compile(r"def _?reserve_workspaces?\(|reserve_workspace\(\)|_reserve_workspaces?\(\)")


def find_vllm_source(*candidates: Path | str) -> Path | None:
    """The first ``<candidate>/lib/python3*/site-packages/vllm`` (or ``<candidate>`` itself) holding
    ``v1/worker/workspace.py``; ``None`` when there is none (vLLM not installed here)."""
    for c in candidates:
        c = Path(c)
        for root in [c, *sorted(c.glob("lib/python3*/site-packages/vllm"))]:
            if (root / "v1" / "worker" / "workspace.py").is_file():
                return root
    return None


def _flashmla_sparse_init(text: str) -> dict[str, Any]:
    """How ``FlashMLASparseImpl.__init__`` calls the workspace: calls, and whether it keeps the views."""
    cls = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "FlashMLASparseImpl"), None)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if cls else None
    if init is None:
        return {"found": False}
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get_simultaneous"]
    kept = [n for n in ast.walk(init) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "attr", "") == "get_simultaneous"]
    return {"found": True, "get_simultaneous_calls": len(calls), "views_kept_as_attributes": len(kept)}


def workspace_consumers(vllm_root: Path | str) -> dict[str, Any]:
    """Count the workspace consumers of the vLLM package at ``vllm_root`` (its ``vllm/`` folder).

    Returns a JSON-able dict: ``files`` (sorted relative paths that call
    ``current_workspace_manager()``), ``get_simultaneous_calls`` per file, ``reservers``
    (files among them that define or call a reservation), ``seed_table`` (one row per
    :data:`SEED_002_TABLE` entry: ``present`` = the file exists and holds the seed's call) and
    ``flashmla_sparse_init``. Raises ``FileNotFoundError`` when ``vllm_root`` has no
    ``v1/worker/workspace.py``.
    """
    root = Path(vllm_root)
    if not (root / "v1" / "worker" / "workspace.py").is_file():
        raise FileNotFoundError(f"{root} is not a vLLM package folder (no v1/worker/workspace.py)")
    files, calls, reservers = [], {}, []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("v1/worker/workspace"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "current_workspace_manager()" not in text:
            continue
        files.append(rel)
        calls[rel] = text.count("get_simultaneous(")
        if _RESERVES.search(text):
            reservers.append(rel)
    table = []
    for scenario, consumer, rel, needle in SEED_002_TABLE:
        path = root / rel
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        table.append({"scenario": scenario, "consumer": consumer, "file": rel, "needle": needle,
                      "present": needle in text, "get_simultaneous_calls": text.count("get_simultaneous(")})
    mla = root / "v1/attention/backends/mla/flashmla_sparse.py"
    return {
        "files": files,
        "get_simultaneous_calls": calls,
        "reservers": reservers,
        "seed_table": table,
        "flashmla_sparse_init": _flashmla_sparse_init(mla.read_text(encoding="utf-8")) if mla.is_file() else
        {"found": False},
    }
