"""Seed 002's consumer table, read off the census of vLLM's workspace call sites.

The one scan of vLLM's source is ``parity/gen_consumer_census.py`` (``ast``, nothing imported), recorded
with provenance in ``data/vllm_0_33_workspace_consumers.json`` (every ``get_simultaneous`` /
``get_persistent`` / ``get_persistent_resource`` call site outside ``vllm/v1/worker/workspace.py``,
classified by platform, role and the phase that first sizes it, plus the ``unlock_workspace()`` sites).
:func:`load_census` runs that generator on an installed vLLM (e.g. ``.venv-parity``'s) or reads the
recording; :func:`workspace_consumers` turns a census into what notebooks 03 and 07 show: the files that
call the workspace, which of them reserve ahead, seed 002's rows ("WorkspaceManager 被以下场景使用") and
how ``FlashMLASparseImpl.__init__`` (``vllm/v1/attention/backends/mla/flashmla_sparse.py``) reserves.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Mapping

__all__ = ["CENSUS", "SEED_002_TABLE", "find_vllm_source", "load_census", "workspace_consumers"]

CENSUS = "vllm_0_33_workspace_consumers"
"""The recording's name under ``data/`` (``parity/gen_consumer_census.py`` writes it)."""

_GENERATOR = Path(__file__).resolve().parents[2] / "parity" / "gen_consumer_census.py"

#: Seed 002's table: (scenario, consumer, file under vllm/ as the seed names it, the call it must hold there).
SEED_002_TABLE: tuple[tuple[str, str, str, str], ...] = (
    ("DCP attention", "FlashAttnImpl", "v1/attention/backends/flash_attn.py", "get_simultaneous"),
    ("MLA sparse attention", "FlashMLASparseImpl", "v1/attention/backends/mla/flashmla_sparse.py", "get_simultaneous"),
    ("MoE experts", "FusedMoEModularKernel", "model_executor/layers/fused_moe/modular_kernel.py", "get_simultaneous"),
    ("sparse attention indexer", "sparse_attn_indexer", "model_executor/layers/sparse_attn_indexer.py",
     "get_simultaneous"),
    ("Elastic EP scaling", "elastic_execute", "distributed/elastic_ep/elastic_execute.py", "unlock_workspace"),
)

_AHEAD = ("init", "profile_run", "kernel_warmup", "capture", "jit_warmup_v2")
"""Census phases that run before the lock (``never_called`` and ``none`` do not)."""


def find_vllm_source(*candidates: Path | str) -> Path | None:
    """The first ``<candidate>/lib/python3*/site-packages/vllm`` (or ``<candidate>`` itself) holding
    ``v1/worker/workspace.py``; ``None`` when there is none (vLLM not installed here). Without
    candidates: ``$PARITY_VENV`` when set (as ``parity/run.sh``), else the repository's ``.venv-parity``
    (``bash parity/run.sh`` makes it), then the one next to the running environment (a worktree sharing
    the main checkout's ``.venv``)."""
    if not candidates:
        env = os.environ.get("PARITY_VENV")
        candidates = (env,) if env else (_GENERATOR.parents[1] / ".venv-parity",
                                         Path(sys.prefix).resolve().parent / ".venv-parity")
    for c in candidates:
        c = Path(c)
        for root in [c, *sorted(c.glob("lib/python3*/site-packages/vllm"))]:
            if (root / "v1" / "worker" / "workspace.py").is_file():
                return root
    return None


def load_census(vllm_root: Path | str | None = None) -> tuple[dict[str, Any], str]:
    """The census and where it came from: live from ``vllm_root`` (a ``vllm/`` package folder) with
    ``parity/gen_consumer_census.py``'s :func:`census`, else the recording ``data/vllm_0_33_workspace_consumers.json``.

    Returns ``(census, where)``; ``where`` names the folder, or the recording's vLLM version, date,
    commit and command. Raises ``FileNotFoundError`` when ``vllm_root`` is given but holds no
    ``v1/worker/workspace.py``.
    """
    if vllm_root is None:
        from tqlab.core.provenance import load_recorded

        rec = load_recorded(CENSUS)
        p = rec.provenance
        return dict(rec.data), (f"recorded: vLLM {p['vllm']}, {p['date']}, commit {p['commit'][:12]}, "
                                f"`{p['command']}`, {p['device']}")
    root = Path(vllm_root)
    if not (root / "v1" / "worker" / "workspace.py").is_file():
        raise FileNotFoundError(f"{root} is not a vLLM package folder (no v1/worker/workspace.py)")
    spec = importlib.util.spec_from_file_location("gen_consumer_census", _GENERATOR)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen.census(root), f"live, from {root}"


def _reserves_ahead(site: Mapping[str, Any]) -> bool:
    """A CUDA site read by hand as a reservation (``reserve``/``reserve+use``) that a phase before the lock runs."""
    return str(site.get("role") or "").startswith("reserve") and site.get("first_sized_by") in _AHEAD


def workspace_consumers(census: Mapping[str, Any]) -> dict[str, Any]:
    """What seed 002's table and notebooks 03/07 need, derived from a census (:func:`load_census`).

    Returns a JSON-able dict: ``vllm_version``; ``files`` (sorted paths under ``vllm/`` with a call
    site), ``get_simultaneous_calls`` per file; ``reservers`` (files with a CUDA site that reserves
    ahead: role ``reserve`` or ``reserve+use``, first sized by a phase before the lock); ``seed_table``
    (one row per :data:`SEED_002_TABLE` entry: ``present`` = the census has that call in that file;
    ``get_simultaneous_calls`` there) and ``flashmla_sparse_init`` (``found``, its ``get_simultaneous``
    calls, and ``views_kept_as_attributes`` = those read as ``use`` rather than a reservation).
    """
    sites = census["call_sites"]
    files = sorted({s["path"] for s in sites})
    gs = {f: sum(1 for s in sites if s["path"] == f and s["call"] == "get_simultaneous") for f in files}
    unlocks = {u["path"] for u in census.get("unlock_sites", [])}
    table = []
    for scenario, consumer, rel, call in SEED_002_TABLE:
        present = rel in unlocks if call == "unlock_workspace" else any(
            s["path"] == rel and s["call"] == call for s in sites)
        table.append({"scenario": scenario, "consumer": consumer, "file": rel, "call": call,
                      "present": present, "get_simultaneous_calls": gs.get(rel, 0)})
    init = [s for s in sites if s["function"] == "FlashMLASparseImpl.__init__"]
    return {
        "vllm_version": census.get("vllm_version", "unknown"),
        "files": files,
        "get_simultaneous_calls": gs,
        "reservers": sorted({s["path"] for s in sites if s["platform"] == "cuda" and _reserves_ahead(s)}),
        "seed_table": table,
        "flashmla_sparse_init": {"found": bool(init), "get_simultaneous_calls": len(init),
                                 "views_kept_as_attributes": sum(1 for s in init if "use" in str(s.get("role")))},
    }
