"""The side-by-side tables notebook 07 shows (live with vLLM, else from data/parity_results.json)."""

from __future__ import annotations

from tqlab.core.config import EngineConfig
from tqlab.vllm import compare_managers, compare_reservations, run_seed_scenario, run_vllm_seed_scenario
from tqlab.predict.report import inspect_vllm


def test_manager_table(record):
    rows = compare_managers()
    assert all(r["same"] for r in rows), [r for r in rows if not r["same"]]
    assert sum("AssertionError" in r["vllm"] for r in rows) == 2
    record("rows", rows)


def test_reservation_table(record):
    rows = compare_reservations()
    assert rows and all(r["same"] for r in rows)
    record("rows", rows)


def test_seed_scenario_table(record):
    cfg = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
    rows = []
    for fixed in (False, True):
        v = run_vllm_seed_scenario(cfg, cached_len=4096, fixed=fixed)
        t = run_seed_scenario(cfg, cached_len=4096, fixed=fixed)
        assert v.size_at_lock == t.size_at_lock and (v.error is None) == (t.error is None)
        rows.append({"fixed": fixed, "vllm": v.to_dict(), "tqlab": t.to_dict()})
    record("rows", rows)


def test_inspect_demo(record):
    rep = inspect_vllm(preset="nemotron-3-super-120b-a12b", prompt_tokens=[8192], demo=True, quiet=True)
    assert rep["demo"][0]["error"].endswith("requires 2.00 MB, current size is 0.26 MB. Workspace growth is not allowed after locking.")
    assert rep["demo"][1]["error"] is None
    record("text", rep["text"])
