"""tqlab.vllm.source_scan: seed 002's consumer table read off the census of vLLM's workspace call sites."""

from __future__ import annotations

import pytest

from tqlab.vllm.source_scan import SEED_002_TABLE, find_vllm_source, load_census, workspace_consumers


def _site(path, function, call="get_simultaneous", platform="cuda", role="use", phase="profile_run"):
    return {"path": path, "function": function, "call": call, "platform": platform, "role": role,
            "first_sized_by": phase}


def test_summary_of_a_made_up_census():
    census = {"vllm_version": "9.9", "unlock_sites": [], "call_sites": [
        _site("v1/attention/backends/flash_attn.py", "FlashAttentionImpl._forward_with_dcp", phase="capture"),
        _site("v1/attention/backends/turboquant_attn.py", "B._reserve_workspace", role="reserve", phase="init"),
        _site("v1/attention/backends/turboquant_attn.py", "Impl._continuation_prefill", phase="init"),
        _site("models/x/nvidia/attention.py", "B._reserve", role="reserve", phase="never_called"),  # not ahead
        _site("v1/attention/ops/rocm_x.py", "f", platform="rocm", role="reserve", phase="init"),  # not CUDA
        _site("model_executor/layers/quantization/utils/marlin_utils.py", "g", call="get_persistent_resource",
              role="persistent"),
        _site("v1/attention/backends/mla/flashmla_sparse.py", "FlashMLASparseImpl.__init__", role="reserve+use",
              phase="init"),
    ]}
    r = workspace_consumers(census)
    assert r["vllm_version"] == "9.9"
    assert r["files"] == sorted({s["path"] for s in census["call_sites"]})
    assert r["get_simultaneous_calls"]["v1/attention/backends/turboquant_attn.py"] == 2
    assert r["get_simultaneous_calls"]["model_executor/layers/quantization/utils/marlin_utils.py"] == 0
    assert r["reservers"] == ["v1/attention/backends/mla/flashmla_sparse.py", "v1/attention/backends/turboquant_attn.py"]
    assert [row["present"] for row in r["seed_table"]] == [True, True, False, False, False]
    assert r["flashmla_sparse_init"] == {"found": True, "get_simultaneous_calls": 1, "views_kept_as_attributes": 1}
    census["unlock_sites"] = [{"path": "distributed/elastic_ep/elastic_execute.py"}]
    assert workspace_consumers(census)["seed_table"][4]["present"] is True


def test_find_vllm_source_and_a_bad_folder(tmp_path):
    root = tmp_path / "vllm"
    (root / "v1" / "worker").mkdir(parents=True)
    (root / "v1" / "worker" / "workspace.py").write_text("")
    assert find_vllm_source(tmp_path / "nowhere", root) == root
    assert find_vllm_source(tmp_path / "nowhere") is None
    with pytest.raises(FileNotFoundError, match="not a vLLM package folder"):
        load_census(tmp_path)


def test_census_recording_from_vllm_033_holds_every_seed_row():
    census, where = load_census()
    assert where.startswith("recorded: vLLM 0.33.0, ")
    rec = workspace_consumers(census)
    assert [row["consumer"] for row in rec["seed_table"]] == [c for _, c, _, _ in SEED_002_TABLE]
    assert all(row["present"] for row in rec["seed_table"])
    assert len(rec["files"]) == len(rec["get_simultaneous_calls"]) == 39
    assert sum(rec["get_simultaneous_calls"].values()) == census["counts"]["get_simultaneous"] == 81
    assert "v1/attention/backends/turboquant_attn.py" in rec["reservers"] and len(rec["reservers"]) == 14
    assert "model_executor/layers/sparse_mqa_indexer.py" in rec["reservers"]  # via SparseMQAIndexer._reserve_workspaces
    assert "models/dots3_note/nvidia/attention.py" not in rec["reservers"]  # its reservation is never called
    # vLLM 0.33's FlashMLA sparse reserves in __init__ without keeping the views (seed 002 kept them)
    assert rec["flashmla_sparse_init"] == {"found": True, "get_simultaneous_calls": 1, "views_kept_as_attributes": 0}


def test_parity_venv_overrides_the_default_places(tmp_path, monkeypatch):
    root = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm"
    (root / "v1" / "worker").mkdir(parents=True)
    (root / "v1" / "worker" / "workspace.py").write_text("")
    monkeypatch.setenv("PARITY_VENV", str(tmp_path / "venv"))
    assert find_vllm_source() == root
    monkeypatch.setenv("PARITY_VENV", str(tmp_path / "nowhere"))
    assert find_vllm_source() is None  # then notebooks 03, 06 and 07 read the recording
