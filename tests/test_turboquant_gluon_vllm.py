"""The Gluon decode on vLLM's own cache tensor (``tqlab.turboquant._gluon_vllm_decode``, issue 34): 4-bit keys and
values, 3-bit keys and / or values (``turboquant_4bit_nc``, ``turboquant_3bit_nc``, ``turboquant_k3v4_nc``; ``k4v4``
without norm correction) read from ``(num_blocks, block_size, Hk,
slot_size_aligned)`` with its 2-byte-aligned slots.

CPU: the 3-bit key table (``ptx_tables.key3_nibble_pair_ptx``) by the PTX emulator; the entry point refuses calls
it does not serve (a CPU tensor, fp8 keys, block-SoA) with a one-line
ValueError before any launch.  GPU: the kernel against the torch reference on the same vLLM tensor (an empty
request, one token, splits whose starts are not 16-aligned, Hk 1 (odd token stride in 16-bit words), 2, 3 and 8,
GQA 1 to 8, blocks of 16, 32 and 64 tokens), every ``mid_out`` partial and the reduced output.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

from tqlab.turboquant import TurboQuantSpec, decode_attention, get_spec, kv_cache_shape, store_kv
from tqlab.turboquant.ops import heads_view

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_refuses_what_it_does_not_serve():
    """A CPU cache, fp8 keys (k8v4) and a block-SoA cache are refused by name; ``output`` stays untouched; a bad
    warp count is refused first."""
    from tqlab.turboquant import _gluon_vllm_decode as gv

    q, bt, sl = torch.zeros(1, 4, 128), torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    mid, out, lse = torch.zeros(1, 4, 2, 129), torch.full((1, 4, 128), 7.0), torch.zeros(1, 4)
    for name, layout in (("turboquant_4bit_nc", "vllm"), ("turboquant_k8v4", "vllm"),
                         ("turboquant_4bit_nc", "block_soa")):
        spec = get_spec(name, cache_layout=layout)
        cache = heads_view(torch.zeros(kv_cache_shape(4, 1, 16, 128, spec), dtype=torch.uint8), spec)
        assert not gv.use_gluon_vllm(spec, cache, 128, 4)
        with pytest.raises(ValueError, match=f"does not serve {name} on {layout} with head_dim 128, GQA 4"):
            gv.decode_attention(q, cache, bt, sl, spec, 0.1, mid, out, lse)
    with pytest.raises(ValueError, match="num_warps must be 1, 2, 4 or 8, got 3"):
        gv.decode_attention(q, cache, bt, sl, spec, 0.1, mid, out, lse, num_warps=3)
    assert (out == 7.0).all()


def _case(spec, hq, hk, seq, d=128, bs=16, seed=5):
    b = len(seq)
    per = -(-max(seq) // bs) + 3
    nb = b * per
    g = torch.Generator().manual_seed(seed)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV), (torch.randn(n, hk, d, generator=g) * 2 + 0.5).to(DEV),
             torch.randperm(n, generator=g).to(DEV), spec)
    bt = torch.randperm(nb, generator=g).view(b, per).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.bfloat16)
    return cache, bt, q, torch.tensor(seq, device=DEV, dtype=torch.int32)


def _run(fn, q, splits, d=128):
    b, hq, _ = q.shape
    mid = torch.full((b, hq, splits, d + 1), float("nan"), device=DEV)
    out = torch.full((b, hq, d), float("nan"), device=DEV, dtype=q.dtype)
    lse = torch.full((b, hq), float("nan"), device=DEV)
    fn(mid, out, lse)
    return mid, out, lse


def test_key3_nibble_pair_ptx_gives_centroid_pairs():
    """``ptx_tables.key3_nibble_pair_ptx`` (run by the PTX emulator): on a word of 8 3-bit codes at 4-bit pitch,
    output ``m`` = the fp16 centroids of codes ``2m`` (low half) and ``2m + 1`` (high half), for 64 random words;
    4-bit keys refused."""
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_turboquant_triton import _ptx_emulate

    from tqlab.turboquant import TQ_PRESETS
    from tqlab.turboquant import ptx_tables as pt
    from tqlab.turboquant.codebook import lloyd_max

    cent = np.asarray(lloyd_max(3, 128).centroids, dtype=np.float16).view(np.uint16)
    asm = pt.key3_nibble_pair_ptx(TQ_PRESETS["turboquant_3bit_nc"], 128)
    codes = torch.randint(0, 8, (64, 8), generator=torch.Generator().manual_seed(11)).tolist()
    for c in codes:
        w = sum(x << (4 * j) for j, x in enumerate(c))
        r = _ptx_emulate(asm, {"$4": w, "$5": w})
        for m in range(4):
            assert r[f"${m}"] == int(cent[c[2 * m]]) | int(cent[c[2 * m + 1]]) << 16, (c, m)
    with pytest.raises(ValueError, match="3-bit codes; turboquant_4bit_nc has 4-bit keys"):
        pt.key3_nibble_pair_ptx(TQ_PRESETS["turboquant_4bit_nc"], 128)


PRESETS = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc", "k4v4"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("hq,hk,bs,splits", [(8, 2, 16, 3), (32, 8, 16, 3), (4, 1, 16, 32), (12, 3, 32, 3),
                                             (2, 2, 64, 3)])
def test_gpu_gluon_vllm_decode_matches_reference(hq, hk, bs, splits, name):
    """The kernel called directly on vLLM's tensor, against the torch reference: every ``mid_out`` split partial
    (output columns and LSE, ``-inf`` for empty splits) and the output to fp16 rounding; ``ops.decode_attention``
    routes 4-bit presets on vLLM's tensor to it (``decode_kernel_name`` ``"gluon_vllm"``)."""
    from tqlab.turboquant import _gluon_vllm_decode as gv
    from tqlab.turboquant.ops import decode_kernel_name

    spec = (TurboQuantSpec("turboquant_k4v4", key_bits=4, value_bits=4, norm_correction=False) if name == "k4v4"
            else get_spec(name))
    cache, bt, q, seq = _case(spec, hq, hk, [0, 1, 1000, 2999], bs=bs)
    view = heads_view(cache, spec)
    assert gv.use_gluon_vllm(spec, view, 128, hq // hk)
    ref = _run(lambda m, o, s: decode_attention(q, cache, bt, seq, spec, 128**-0.5, m, o, s, backend="torch"), q,
               splits)
    got = _run(lambda m, o, s: gv.decode_attention(q, view, bt, seq, spec, 128**-0.5, m, o, s), q, splits)
    (m0, o0, l0), (m1, o1, l1) = ref, got
    assert not torch.isnan(m1).any() and not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.equal(torch.isinf(m0[..., -1]), torch.isinf(m1[..., -1]))
    live = ~torch.isinf(m0[..., -1])
    assert torch.allclose(m0[live], m1[live], atol=1e-2, rtol=2e-3)
    assert torch.allclose(o0.float(), o1.float(), atol=1e-2, rtol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=1e-2, rtol=2e-3)
    if name != "k4v4":
        assert decode_kernel_name(q, cache, spec) == "gluon_vllm"


_SASS_SNIPPET = """
import sys, json
sys.path.insert(0, "benchmarks")
import torch  # noqa
import _sass_sm90 as ss
from tqlab.turboquant import _gluon_vllm_decode as gv, _gluon_decode as gd, get_spec, ptx_tables as pt
spec, d, bs = get_spec(sys.argv[1]), 128, 16
fa = spec.field_addresses(d, bs)
sig = {"q_ptr": "*fp16", "c16": "*u16", "c32": "*i32", "bt_ptr": "*i32", "sl_ptr": "*i32", "mid_ptr": "*fp32",
       "qk_scale": "fp32", "inv_sqrt_d": "fp32", "num_blocks": "i32", "num_splits": "i32"}
sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "sb16", "sh16", "st16", "stride_btb", "stride_mb",
                               "stride_mh", "stride_ms")})
meta = dict(GROUP=4, BLOCK_SIZE=bs, D=d, TW=32, NC=spec.norm_correction_on_read, KBITS=spec.key_bits,
            VBITS=spec.value_bits, KO=fa["key_idx"][0] // 2, NO=fa["key_norm"][0] // 2, VO=fa["val_idx"][0] // 2,
            SO=fa["val_scale"][0] // 2, ZO=fa["val_zero"][0] // 2,
            KASM=pt.key4_pair_ptx(spec, d) if spec.key_bits == 4 else pt.key3_nibble_pair_ptx(spec, d),
            VASM=pt.VALUE4_PAIR_ASM.value, VSHIFT=pt.VALUE4_PAIR_SHIFT,
            **{k: v for k, v in gd.layouts(2).items() if k != "TW"})
k = ss.compile_sm90(gv._decode_vllm_kernel, sig, meta, num_warps=2, gluon=True,
                    divisible=["q_ptr", "c16", "c32", "bt_ptr", "sl_ptr", "mid_ptr", "stride_qb", "stride_qh",
                               "stride_btb", "stride_mb", "stride_mh"])
r = ss.report(k, sys.argv[2], sys.argv[1])
print("RESULT " + json.dumps({"usage": r["usage"], "loop": dict(r["loop_opcodes"])}))
"""


@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"])
def test_gluon_vllm_kernel_compiles_for_sm90_without_spills(name, tmp_path):
    """No GPU needed: the kernel compiles for sm_90 (2 warps, the launch's constexprs, ``benchmarks/_sass_sm90.py``)
    with the local Triton and ptxas: no stack, no local memory, no shared-memory traffic in the loop, and exactly
    48 HMMA per warp and step (16 scores, 16 ``P V``, 16 for the norm correction's ``||c_hat||^2``)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import _sass_sm90 as ss
    finally:
        sys.path.pop(0)
    if not (ss._BIN / "nvdisasm").exists():
        pytest.skip(f"no nvdisasm in this Triton ({ss._BIN})")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, "-c", _SASS_SNIPPET, name, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=300, cwd=root)
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert rep["usage"].get("STACK", 0) == 0 and rep["usage"].get("LOCAL", 0) == 0, rep["usage"]
    loop = rep["loop"]
    assert loop.get("HMMA", 0) == 48 and not any(loop.get(op, 0) for op in ("STS", "LDS", "LDSM", "LDL", "STL")), loop
