"""Torch-free dtypes (issue 30: ``plan`` and ``inspect-vllm`` answer without importing torch).

The stand-ins of :mod:`tqlab.core.dtypes` must give :func:`compute_layout` exactly the bytes torch's dtypes give,
and the manager must hand out views in torch's dtype for either. The speed target itself lives in
``benchmarks/bench_inspect_vllm.py`` (no timing here); what is tested is that torch is never imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tqlab.core import dtypes
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import decode_workspace_shapes, reservation_plan
from tqlab.core.workspace import WorkspaceManager
from tqlab.core.workspace_layout import compute_layout

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [(getattr(dtypes, n), getattr(torch, n)) for n in
         ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "int64", "int32", "int8", "uint8")]


@pytest.mark.parametrize("standin, real", PAIRS, ids=[p[0].name for p in PAIRS])
def test_standin_is_torch_dtype_by_name_size_text_and_equality(standin, real):
    assert (standin.itemsize, str(standin), repr(standin)) == (real.itemsize, str(real), repr(real))
    assert standin == real and real == standin and not (standin != real)
    assert dtypes.standin(real) is standin and dtypes.as_torch(standin) is real and dtypes.as_torch(real) is real
    assert dtypes.by_name(str(real)) is standin and dtypes.dtype_name(standin) == dtypes.dtype_name(real)
    assert dtypes.is_dtype(standin) and dtypes.is_dtype(real) and dtypes.is_torch_dtype(real)
    assert not dtypes.is_torch_dtype(standin)
    assert standin != dtypes.DType(standin.name + "x", standin.itemsize) and standin != str(real)


def test_standin_rejects_what_is_no_dtype():
    for bad in (None, 4, object()):
        assert not dtypes.is_dtype(bad)
        with pytest.raises(TypeError, match="expected a dtype"):
            dtypes.standin(bad)
        with pytest.raises(TypeError, match="expected a dtype"):
            dtypes.as_torch(bad)
    with pytest.raises(ValueError, match="'complex32' is not one of"):
        dtypes.by_name("complex32")
    with pytest.raises(TypeError, match=r"request 0: dtype must be a torch.dtype \(or a tqlab.core.dtypes.DType\), got 'float32'"):
        compute_layout((((3,), "float32"),))


_shape = st.lists(st.integers(0, 70), min_size=0, max_size=4).map(tuple)
_pair = st.tuples(_shape, st.sampled_from(range(len(PAIRS))))


@settings(max_examples=200, deadline=None)
@given(st.lists(_pair, min_size=0, max_size=5))
def test_compute_layout_gives_identical_bytes_for_torch_dtypes_and_standins(call):
    """Every field of the layout but the dtypes' type is identical, and the dtypes compare equal."""
    real = compute_layout([(s, PAIRS[i][1]) for s, i in call])
    standin = compute_layout([(s, PAIRS[i][0]) for s, i in call])
    assert (standin.shapes, standin.nbytes, standin.offsets, standin.total_bytes, standin.padding) == (
        real.shapes, real.nbytes, real.offsets, real.total_bytes, real.padding)
    assert standin.dtypes == real.dtypes and all(type(d) is dtypes.DType for d in standin.dtypes)


def test_a_deployments_reservation_is_the_same_bytes_either_way():
    c = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
    for call in reservation_plan(c):
        real = tuple((s, dtypes.as_torch(d)) for s, d in call)
        assert compute_layout(call).total_bytes == compute_layout(real).total_bytes > 0
    assert compute_layout(decode_workspace_shapes(4, 4, 128, 32, torch.bfloat16)).total_bytes == \
        compute_layout(decode_workspace_shapes(4, 4, 128, 32, dtypes.bfloat16)).total_bytes == 268544


def test_the_manager_hands_out_torch_views_for_standins_at_torchs_offsets():
    call = decode_workspace_shapes(3, 2, 64, 8, dtypes.bfloat16)
    m_s, m_t = WorkspaceManager("cpu"), WorkspaceManager("cpu")
    got = m_s.get_simultaneous(*call)
    want = m_t.get_simultaneous(*dtypes.torch_call(call))
    assert [(tuple(v.shape), v.dtype) for v in got] == [(tuple(v.shape), v.dtype) for v in want] == [
        ((3, 2, 8, 65), torch.float32), ((3, 2, 64), torch.bfloat16), ((3, 2), torch.float32)]
    base = got[0].untyped_storage().data_ptr()
    assert [v.data_ptr() - base for v in got] == [0, 12544, 12544 + 768]  # 12,480 bytes rounded up to 256
    p = m_s.get_persistent("k", (2, 3), dtypes.float16)
    assert p.dtype is torch.float16 and m_s.get_persistent("k", (2, 3), torch.float16) is p


_NO_TORCH = """
import sys
from click.testing import CliRunner
from tqlab.cli import app
for args in {runs}:
    r = CliRunner().invoke(app, args)
    assert r.exit_code in (0, 3, 4, 5), (args, r.exit_code, r.output)
heavy = sorted(m for m in ("torch", "numpy", "triton", "vllm") if m in sys.modules)
assert not heavy, heavy
print("torch-free")
"""


def test_plan_and_inspect_vllm_never_import_torch(tmp_path):
    """A fresh interpreter answers ``inspect-vllm`` (a preset, a config.json with MLA and experts) and ``plan``
    (TurboQuant, a hybrid) and still has no torch, numpy, triton or vLLM in ``sys.modules``."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(
        model_type="kimi_k2", hidden_size=7168, num_attention_heads=64, num_hidden_layers=61, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536, max_position_embeddings=262144,
        n_routed_experts=384, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1,
        torch_dtype="bfloat16")))
    runs = [
        ["inspect-vllm", "--preset", "llama-3.1-8b", "--args", "vllm serve M"],
        ["inspect-vllm", "--preset", "llama-3.1-8b", "--args", "vllm serve M --kv-cache-dtype turboquant_4bit_nc",
         "--json", "-"],
        ["inspect-vllm", "--config", str(cfg), "--args", "vllm serve K -tp 4"],
        ["plan", "--preset", "nemotron-3-super-120b-a12b"],
        ["plan", "--preset", "llama-3.1-8b", "--kv-cache-dtype", "turboquant_3bit_nc", "--json", "-"],
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _NO_TORCH.format(runs=runs)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("torch-free"), done.stdout[-2000:] + done.stderr[-3000:]
