"""tqlab.vllm.source_scan on a made-up vLLM tree, and the recording it wrote from vLLM 0.33."""

from __future__ import annotations

import pytest

from tqlab.core.provenance import load_recorded
from tqlab.vllm.source_scan import SEED_002_TABLE, find_vllm_source, workspace_consumers


def _tree(root, files: dict[str, str]):
    for rel, text in files.items():
        p = root / "vllm" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "vllm"


def test_counts_consumers_reservers_and_the_seed_rows(tmp_path):
    root = _tree(tmp_path, {
        "v1/worker/workspace.py": "def current_workspace_manager(): ...\n",
        "v1/attention/backends/flash_attn.py": "current_workspace_manager().get_simultaneous(a)\n",
        "v1/attention/backends/turboquant_attn.py": (
            "def _reserve_workspace(self):\n    current_workspace_manager().get_simultaneous(a)\n"
            "    current_workspace_manager().get_simultaneous(b)\n"),
        "v1/attention/backends/mla/flashmla_sparse.py": (
            "class FlashMLASparseImpl:\n    def __init__(self):\n"
            "        self.q, = current_workspace_manager().get_simultaneous(a)\n"),
        "other.py": "x = 1\n",
    })
    r = workspace_consumers(root)
    assert r["files"] == ["v1/attention/backends/flash_attn.py", "v1/attention/backends/mla/flashmla_sparse.py",
                          "v1/attention/backends/turboquant_attn.py"]
    assert r["get_simultaneous_calls"]["v1/attention/backends/turboquant_attn.py"] == 2
    assert r["reservers"] == ["v1/attention/backends/turboquant_attn.py"]
    assert [row["present"] for row in r["seed_table"]] == [True, True, False, False, False]
    assert r["flashmla_sparse_init"] == {"found": True, "get_simultaneous_calls": 1, "views_kept_as_attributes": 1}
    assert find_vllm_source(tmp_path / "nowhere", root) == root
    with pytest.raises(FileNotFoundError, match="not a vLLM package folder"):
        workspace_consumers(tmp_path)


def test_recording_from_vllm_033_holds_every_seed_row():
    rec = load_recorded("vllm_workspace_consumers")
    assert rec["vllm_version"] == rec.provenance["vllm"] == "0.33.0"
    assert [row["consumer"] for row in rec["seed_table"]] == [c for _, c, _, _ in SEED_002_TABLE]
    assert all(row["present"] for row in rec["seed_table"])
    assert "v1/attention/backends/turboquant_attn.py" in rec["reservers"]
    # vLLM 0.33's FlashMLA sparse reserves in __init__ without keeping the views (seed 002 kept them)
    assert rec["flashmla_sparse_init"] == {"found": True, "get_simultaneous_calls": 1, "views_kept_as_attributes": 0}
    assert len(rec["files"]) == len(rec["get_simultaneous_calls"]) == 39
