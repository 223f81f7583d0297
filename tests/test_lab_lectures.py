"""tqlab.lab.piecewise and tqlab.lab.memory_budget: the rules notebook 05 teaches."""
import pytest
import torch

from tqlab.lab import memory_budget as mb
from tqlab.lab import piecewise as pw
from tqlab.core.workspace import WorkspaceManager


def test_turboquant_modes_match_vllm_rules():
    got = {m.name: pw.resolve_cudagraph_mode(m, pw.TURBOQUANT_CG_SUPPORT)[0].name for m in pw.CUDAGraphMode}
    assert got == {"NONE": "NONE", "PIECEWISE": "PIECEWISE", "FULL": "FULL_AND_PIECEWISE",
                   "FULL_DECODE_ONLY": "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE": "FULL_AND_PIECEWISE"}
    with pytest.raises(ValueError):
        pw.resolve_cudagraph_mode(pw.CUDAGraphMode.FULL, pw.AttentionCGSupport.NEVER)
    assert pw.resolve_cudagraph_mode(pw.CUDAGraphMode.FULL_DECODE_ONLY, pw.AttentionCGSupport.NEVER)[0].name == "PIECEWISE"


def test_enum_mirrors_vllm_if_installed():
    comp = pytest.importorskip("vllm.config.compilation")
    for m in pw.CUDAGraphMode:
        v = comp.CUDAGraphMode[m.name]
        assert v.decode_mode().name == m.decode_mode().name and v.mixed_mode().name == m.mixed_mode().name


def test_piecewise_replay_calls_workspace_only_in_eager_attention():
    ws = WorkspaceManager("cpu")
    fwd = pw.PiecewiseForward(ws, num_layers=3, num_heads=4, head_dim=64, num_splits=8, dtype=torch.float16)
    fwd.capture(pw.CUDAGraphMode.FULL, 2)
    fwd.capture(pw.CUDAGraphMode.PIECEWISE, 2)
    ws.lock()
    assert fwd.step(pw.CUDAGraphMode.FULL, 2).workspace_calls == 0
    assert fwd.step(pw.CUDAGraphMode.PIECEWISE, 2).workspace_calls == 3
    with pytest.raises(AssertionError, match="Workspace is locked"):
        fwd.step(pw.CUDAGraphMode.NONE, 16)
    with pytest.raises(KeyError):
        fwd.step(pw.CUDAGraphMode.FULL, 1)
    assert len(pw.pieces(pw.forward_plan(3, pw.CUDAGraphMode.PIECEWISE))) == 4
    assert pw.pieces(pw.forward_plan(3, pw.CUDAGraphMode.NONE)) == []


def test_split_count_writes():
    assert pw.dynamic_num_splits(35) == 1 and pw.dynamic_num_splits(2400) == 32
    assert pw.replay_writes(32, 32, 4, 8, 128)["out_of_bounds_bytes"] == 0
    assert pw.replay_writes(1, 32, 1, 4, 128)["out_of_bounds_bytes"] == 31 * 4 * 129 * 4


def test_memory_budget_lazy_fails_at_serve_reserved_at_startup():
    g, m = 2**30, 2**20
    base = dict(total=24 * g, util=0.9, weights=16 * g, activation_peak=g, after_profile=int(2.4 * g) - 40 * m,
                workspace_startup=0)
    lazy = mb.memory_budget(**base, workspace_need=88 * m, reserved=False)
    res = mb.memory_budget(**base, workspace_need=128 * m, reserved=True)
    assert lazy.fails_at == "serve" and res.fails_at == "start-up"
    assert sum(lazy.segments.values()) == lazy.total
    ok = mb.memory_budget(**{**base, "util": 0.8}, workspace_need=128 * m, reserved=True)
    assert ok.fails_at is None and ok.segments["KV cache"] < lazy.segments["KV cache"]
    with pytest.raises(ValueError):
        mb.memory_budget(**{**base, "weights": 30 * g}, workspace_need=0, reserved=True)
