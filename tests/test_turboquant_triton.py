"""Triton kernels vs the torch reference: same bytes, same dequantized K/V, same decode.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set here before
triton is imported) at small sizes; with CUDA they run natively and the ``gpu`` tests add
larger shapes and CUDA graph capture.  Skipped when triton is not installed.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv, kv_cache_shape, store_kv
from tqlab.turboquant.ops import heads_view  # the kernels' (num_blocks, Hk, block_size, slot) view

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRESETS = sorted(TQ_PRESETS)


def _both_caches(spec, d, hk, bs, nb, n, seed=0, pad_every=7):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, hk, d, generator=g).to(DEV)
    v = (torch.randn(n, hk, d, generator=g) * 2 + 0.5).to(DEV)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    slots[::pad_every] = -1  # padding rows are skipped
    slots = slots.to(DEV)
    caches = []
    for backend in ("torch", "triton"):
        c = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
        store_kv(c, k, v, slots, spec, backend=backend)
        caches.append(c)
    return caches


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", PRESETS)
def test_store_bytes_match_reference(name, d):
    ref, tri = _both_caches(TQ_PRESETS[name], d, hk=2, bs=16, nb=6, n=40)
    # identical except, at most, an index sitting exactly on a decision boundary (float
    # summation order); in practice 0 bytes differ
    assert (ref != tri).float().mean().item() <= 1e-3
    assert ref.count_nonzero() > 0


def _filled(spec, d=64, hk=2, bs=16, nb=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = nb * bs
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV), torch.randn(n, hk, d, generator=g).to(DEV),
             torch.randperm(n, generator=g).to(DEV), spec, backend="torch")
    return cache


@pytest.mark.parametrize("name", PRESETS)
def test_dequant_matches_reference(name):
    spec = TQ_PRESETS[name]
    cache = _filled(spec)
    row = torch.tensor([5, 0, 11, 3, 7, 2], dtype=torch.int32, device=DEV)
    outs = []
    for backend in ("torch", "triton"):
        k_out = torch.full((1, 2, 96, 64), 9.0, dtype=torch.float16, device=DEV)
        v_out = k_out.clone()
        dequant_kv(cache, row, 83, k_out, v_out, spec, backend=backend)
        outs.append((k_out, v_out))
    (k0, v0), (k1, v1) = outs
    assert torch.all(k1[:, :, 83:] == 9) and torch.all(v1[:, :, 83:] == 9)  # tail untouched
    # keys: fp16 rounding of the centroid operand, <= 1 ulp at |k| < 4; values bit-identical
    assert torch.allclose(k0.float(), k1.float(), atol=2e-3, rtol=1e-3)
    assert torch.equal(v0, v1)


def _decode_both(spec, q, cache, bt, seq_lens, s, out_dtype=torch.float32):
    res = []
    for backend in ("torch", "triton"):
        b, hq, d = q.shape
        mid = torch.full((b, hq, s, d + 1), 7.0, device=DEV)
        out = torch.empty(b, hq, d, dtype=out_dtype, device=DEV)
        lse = torch.empty(b, hq, device=DEV)
        decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse, backend=backend)
        res.append((mid, out, lse))
    return res


def _assert_decode_close(res, atol=2e-3, rtol=0.0):
    """rtol: bf16 outputs round differently by one ulp (2**-8 relative) at |x| > 1."""
    (m0, o0, l0), (m1, o1, l1) = res
    fin = torch.isfinite(m0)
    assert torch.equal(fin, torch.isfinite(m1))  # same empty splits
    assert torch.allclose(m0[fin], m1[fin], atol=atol)
    assert torch.allclose(o0.float(), o1.float(), atol=atol, rtol=rtol)
    assert torch.equal(torch.isfinite(l0), torch.isfinite(l1))
    f = torch.isfinite(l0)
    assert torch.allclose(l0[f], l1[f], atol=atol)


@pytest.mark.parametrize("name", PRESETS)
def test_decode_matches_reference(name):
    spec = TQ_PRESETS[name]
    cache = _filled(spec)
    g = torch.Generator().manual_seed(3)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(3)]).to(torch.int32).to(DEV)
    q = torch.randn(3, 8, 64, generator=g).to(DEV)  # GQA group 4
    seq_lens = torch.tensor([0, 5, 150], device=DEV)  # empty request, fewer tokens than splits, several tiles
    _assert_decode_close(_decode_both(spec, q, cache, bt, seq_lens, s=4))


def test_decode_continuation_rows_bf16():
    """Short continuation chunk as decode rows: one block-table row broadcast (stride 0),
    causal seq_lens, bf16 query/output, no GQA, block_size 32."""
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    cache = _filled(spec, hk=2, bs=32, nb=6)
    row = torch.tensor([4, 1, 5, 0, 2, 3], dtype=torch.int64, device=DEV)
    bt = row[None, :].expand(4, -1)
    seq_lens = torch.arange(97, 101, device=DEV)
    q = torch.randn(4, 2, 64, generator=torch.Generator().manual_seed(4)).to(DEV, torch.bfloat16)
    res = _decode_both(spec, q, cache, bt, seq_lens, s=3, out_dtype=torch.bfloat16)
    _assert_decode_close(res, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_large_decode_and_dequant(name):
    spec = TQ_PRESETS[name]
    d, hk, hq, bs, ctx, b = 128, 8, 32, 16, 4096, 4
    nb = b * ctx // bs
    g = torch.Generator().manual_seed(5)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV, torch.bfloat16),
             torch.randn(n, hk, d, generator=g).to(DEV, torch.bfloat16),
             torch.randperm(n, generator=g).to(DEV), spec)
    bt = torch.randperm(nb, generator=g).view(b, -1).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.bfloat16)
    seq_lens = torch.tensor([ctx, 1, 3000, 17], device=DEV)
    _assert_decode_close(_decode_both(spec, q, cache, bt, seq_lens, s=32, out_dtype=torch.bfloat16), atol=1e-2, rtol=1e-2)
    outs = []
    for backend in ("torch", "triton"):
        k_out = torch.zeros(1, hk, ctx, d, dtype=torch.float16, device=DEV)
        v_out = torch.zeros_like(k_out)
        dequant_kv(cache, bt[0], ctx - 5, k_out, v_out, spec, backend=backend)
        outs.append((k_out, v_out))
    assert torch.allclose(outs[0][0].float(), outs[1][0].float(), atol=4e-3, rtol=2e-3)
    assert torch.allclose(outs[0][1].float(), outs[1][1].float(), atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
def test_gpu_decode_in_cuda_graph():
    """Store + decode captured in a CUDA graph replay with new inputs written into the same
    (frozen) buffers and give the eager result."""
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    d, hk, hq, bs, nb, b, s = 128, 2, 8, 16, 64, 4, 8
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, device=DEV), torch.randn(n, hk, d, device=DEV),
             torch.arange(n, device=DEV), spec)
    bt = torch.arange(nb, device=DEV, dtype=torch.int32).view(b, -1)
    seq_lens = torch.tensor([100, 200, 50, 255], device=DEV)
    q = torch.randn(b, hq, d, device=DEV, dtype=torch.float16)
    new_k = torch.randn(b, hk, d, device=DEV, dtype=torch.float16)
    slots = (bt[:, 0].long() * bs + seq_lens - 1).to(torch.int64)
    mid = torch.empty(b, hq, s, d + 1, device=DEV)
    out = torch.empty(b, hq, d, device=DEV, dtype=torch.float16)
    lse = torch.empty(b, hq, device=DEV)

    def step():
        store_kv(cache, new_k, new_k, slots, spec)
        decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse)

    step()  # warm up: compile + constants on the device
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    q.copy_(torch.randn_like(q))
    new_k.copy_(torch.randn_like(new_k))
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    step()
    torch.cuda.synchronize()
    assert torch.equal(replayed, out)


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k8v4"])
def test_decode_launch_variants_match_reference(name, prefetch):
    """Small token tiles (several per split) with and without the software prefetch of the next
    tile give the reference decode."""
    from tqlab.turboquant import _triton_kernels as tk

    spec = TQ_PRESETS[name]
    cache = _filled(spec)
    g = torch.Generator().manual_seed(8)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(2)]).to(torch.int32).to(DEV)
    q = torch.randn(2, 8, 64, generator=g).to(DEV)
    seq_lens = torch.tensor([191, 40], device=DEV)
    (m0, o0, l0), _ = _decode_both(spec, q, cache, bt, seq_lens, s=2)
    mid = torch.full_like(m0, 7.0)
    out, lse = torch.empty_like(o0), torch.empty_like(l0)
    tk.decode_attention(q, heads_view(cache, spec), bt, seq_lens, spec, 64**-0.5, mid, out, lse, block_t=16, num_warps=4,
                        prefetch=prefetch)
    _assert_decode_close([(m0, o0, l0), (mid, out, lse)])


def test_decode_num_splits_policies():
    from tqlab.turboquant.ops import VLLM_NUM_SPLITS, decode_num_splits

    assert VLLM_NUM_SPLITS == 32
    assert decode_num_splits(1, 1) == 32 and decode_num_splits(256, 8) == 32  # default: vLLM's, any batch
    assert decode_num_splits(4, 1, "fill") == 256  # 528 programs wanted: 132 per request -> 256 (capped)
    assert decode_num_splits(1, 8, "fill") == 128  # 66 -> 128
    assert decode_num_splits(16, 8, "fill") == 32  # 5 -> never below vLLM's 32
    assert decode_num_splits(4, 1, "fill", max_splits=64) == 64
    assert decode_num_splits(2, 1, "fill", num_sms=8, programs_per_sm=1) == 32
    with pytest.raises(ValueError, match="policy"):
        decode_num_splits(4, 1, "auto")
    with pytest.raises(ValueError, match="batch"):
        decode_num_splits(0, 1, "fill")


def test_decode_with_more_splits_than_tokens():
    """The "fill" policy's large S: most splits are empty (lse -inf) and the reduction ignores them."""
    from tqlab.turboquant.ops import decode_num_splits

    spec = TQ_PRESETS["turboquant_4bit_nc"]
    cache = _filled(spec)
    bt = torch.arange(12, dtype=torch.int32, device=DEV).view(1, 12)
    q = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(9)).to(DEV)
    s = decode_num_splits(1, 2, "fill", num_sms=16)
    assert s == 32
    _assert_decode_close(_decode_both(spec, q, cache, bt, torch.tensor([45], device=DEV), s=s))


def test_decode_vs_vllm_figure_from_recorded():
    """Notebook 04's chart works on a CPU box from data/turboquant_vs_vllm_h200.json."""
    import matplotlib

    matplotlib.use("Agg")
    from tqlab.core.provenance import load_recorded
    from tqlab.lab import plots_turboquant as figures

    rec = load_recorded("turboquant_vs_vllm_h200")
    assert rec.provenance["device"] == "NVIDIA H200"
    for shape in ("llama3.1-8b", "seed_tp8_rank"):
        data = figures.vs_vllm_series(rec, shape)
        for preset in TQ_PRESETS:
            assert [c for c, _ in data[preset]["tqlab"]] == [8192, 32768, 131072]
            assert len(data[preset]["byte_limit"]) == 3
        assert len(data["turboquant_3bit_nc"]["vllm"]) == 3 and len(data["sdpa"]) == 3
        ax = figures.plot_decode_vs_vllm(rec, shape)
        assert len(ax.get_lines()) == 4 * 3 + 1
    with pytest.raises(ValueError, match="no rows"):
        figures.vs_vllm_series(rec, "nope")


# ----------------------------------------------------------------------------- fast kernels (issue 20)
def _ptx_emulate(asm: str, inputs: dict[str, int]) -> dict[str, int]:
    """Run the straight-line 32-bit PTX of ``ptx_tables``' table lookups (shr, shl, and, or,
    xor, not, mul.lo, mov, prmt, sub.f16x2, ``mov.b32 {a, b}, r``) on python ints."""
    import re

    m32 = 0xFFFFFFFF

    def prmt(a, b, sel):
        src, out = (b << 32) | a, 0
        for k in range(4):
            nib = (sel >> (4 * k)) & 0xF
            byte = (src >> (8 * (nib & 7))) & 0xFF
            out |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * k)
        return out

    def sub_f16x2(a, b):  # two fp16 lanes, IEEE round to nearest (numpy float16)
        import numpy as np

        x = np.array([a & 0xFFFF, a >> 16], dtype=np.uint16).view(np.float16)
        y = np.array([b & 0xFFFF, b >> 16], dtype=np.uint16).view(np.float16)
        z = (x - y).astype(np.float16).view(np.uint16)
        return int(z[0]) | int(z[1]) << 16

    reg = dict(inputs)
    ops = {"sub.f16x2": sub_f16x2, "shr.b32": lambda a, b: a >> b, "shl.b32": lambda a, b: (a << b) & m32, "and.b32": lambda a, b: a & b,
           "or.b32": lambda a, b: a | b, "xor.b32": lambda a, b: a ^ b, "not.b32": lambda a: ~a & m32,
           "mul.lo.u32": lambda a, b: (a * b) & m32, "mov.b32": lambda a: a, "prmt.b32": prmt}
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        pair = re.fullmatch(r"\{(\S+), (\S+)\}, (\S+)", args)
        if pair:
            reg[pair[1]], reg[pair[2]] = reg[pair[3]] & 0xFFFF, reg[pair[3]] >> 16
            continue
        dst, *src = [a.strip() for a in args.split(",")]
        reg[dst] = ops[op](*[int(a, 0) if a[0].isdigit() else reg[a] for a in src])
    return reg


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_4bit_nc"])
def test_fast_centroid_tables_are_exact(name, d):
    """The prmt tables give the fp16 centroid of every code, bit for bit (per 4 byte codes, and
    per group of 16 packed codes)."""
    import numpy as np

    from tqlab.turboquant import ptx_tables as pt
    from tqlab.turboquant.codebook import lloyd_max

    spec = TQ_PRESETS[name]
    bits = spec.key_bits
    cent = np.asarray(lloyd_max(bits, d).centroids, dtype=np.float16).view(np.uint16)
    rng = np.random.default_rng(d + bits)
    for _ in range(200):
        c = rng.integers(0, 1 << bits, 16)
        r = _ptx_emulate(pt.lut_asm(spec, d), {"$2": int(sum(int(c[i]) << (8 * i) for i in range(4)))})
        got = [r["$0"] & 0xFFFF, r["$0"] >> 16, r["$1"] & 0xFFFF, r["$1"] >> 16]
        assert got == cent[c[:4]].tolist()
        packed = sum(int(c[i]) << (i * bits) for i in range(16))
        words = [(packed >> (16 * k)) & 0xFFFF for k in range(bits + 1)]
        r = _ptx_emulate(pt.lut_group_asm(spec, d), {f"${16 + k}": words[k] | words[k + 1] << 16 for k in range(bits)})
        assert [r[f"${i}"] for i in range(16)] == cent[c].tolist()


def test_value4_asm_gives_exact_integer_codes():
    """The 4-bit value asm (``ptx_tables.VALUE4_PTX``, 0x6400 half2 trick minus 1024) turns every
    4-bit code of a group of 16 into its exact fp16 integer, in code order."""
    import numpy as np

    from tqlab.turboquant import ptx_tables as pt

    want = np.arange(16, dtype=np.float16).view(np.uint16)
    rng = np.random.default_rng(4)
    for _ in range(300):
        c = rng.integers(0, 16, 16)
        w0 = sum(int(c[i]) << (4 * i) for i in range(8))
        w1 = sum(int(c[8 + i]) << (4 * i) for i in range(8))
        r = _ptx_emulate(pt.VALUE4_PTX, {"$16": w0, "$17": w1})
        assert [r[f"${i}"] for i in range(16)] == want[c].tolist()
    assert pt.VALUE4_ASM.value == pt.VALUE4_PTX


@pytest.mark.parametrize("prefetch,norm_mma,staged", [(False, False, False), (True, True, False), (False, True, True)])
@pytest.mark.parametrize("name", PRESETS)
def test_fast_decode_matches_reference(name, prefetch, norm_mma, staged):
    """The fast decode kernel (lanes along D, polynomial centroids off the GPU) gives the
    reference decode: empty request, fewer tokens than splits, several tiles, GQA 4; also the
    staged experiment (whole blocks through shared memory, split edges inside blocks)."""
    from tqlab.turboquant import _triton_fast as tf

    spec = TQ_PRESETS[name]
    cache = _filled(spec)
    g = torch.Generator().manual_seed(13)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(3)]).to(torch.int32).to(DEV)
    q = torch.randn(3, 8, 64, generator=g).to(DEV)
    seq_lens = torch.tensor([0, 5, 171], device=DEV)
    (m0, o0, l0), _ = _decode_both(spec, q, cache, bt, seq_lens, s=4)
    mid = torch.full_like(m0, float("nan"))
    out, lse = torch.full_like(o0, float("nan")), torch.full_like(l0, float("nan"))
    tf.decode_attention(q, heads_view(cache, spec), bt, seq_lens, spec, 64**-0.5, mid, out, lse, block_t=32 if staged else 16,
                        prefetch=prefetch, norm_mma=norm_mma, staged=staged)
    _assert_decode_close([(m0, o0, l0), (mid, out, lse)])


@pytest.mark.parametrize("name", PRESETS)
def test_fast_dequant_matches_reference(name):
    from tqlab.turboquant import _triton_dequant as td

    spec = TQ_PRESETS[name]
    cache = _filled(spec)
    row = torch.tensor([5, 0, 11, 3, 7, 2], dtype=torch.int32, device=DEV)
    k0 = torch.full((1, 2, 96, 64), 9.0, dtype=torch.float16, device=DEV)
    v0 = k0.clone()
    dequant_kv(cache, row, 83, k0, v0, spec, backend="torch")
    for tiles in (1, 3):
        k1, v1 = torch.full_like(k0, 9.0), torch.full_like(v0, 9.0)
        td.dequant_kv(heads_view(cache, spec), row, 83, k1, v1, spec, block_t=16, tiles_per_program=tiles)
        assert torch.all(k1[:, :, 83:] == 9) and torch.all(v1[:, :, 83:] == 9)
        assert torch.allclose(k0.float(), k1.float(), atol=2e-3, rtol=1e-3)
        assert torch.equal(v0, v1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_fast_equals_portable(name):
    """On the GPU the fast kernels (prmt tables, every launch variant) equal the portable
    kernels to fp16 rounding, at the benchmark's size class (GQA 4, 4K context, block 16).

    Not bit-equal by design: the fast kernel normalizes each key by the norm of the fp16
    centroids its MMA multiplies, the portable one by the fp32 centroids' norm (rotated presets;
    up to 2**-11 relative per centroid, the same for every token), so partial log-sum-exps
    of |x| ~ 10 move by a few 1e-3: the tolerance is fp16's spacing at 16."""
    from tqlab.turboquant import _triton_dequant as td
    from tqlab.turboquant import _triton_fast as tf
    from tqlab.turboquant import _triton_kernels as tk

    spec = TQ_PRESETS[name]
    d, hk, hq, bs, ctx, b = 128, 8, 32, 16, 4096, 4
    nb = b * ctx // bs
    g = torch.Generator().manual_seed(21)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV), torch.randn(n, hk, d, generator=g).to(DEV) * 2,
             torch.randperm(n, generator=g).to(DEV), spec)
    bt = torch.randperm(nb, generator=g).view(b, -1).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.float16)
    seq_lens = torch.tensor([ctx, 1, 3001, 64], device=DEV)

    def run(fn, **kw):
        mid = torch.full((b, hq, 32, d + 1), float("nan"), device=DEV)
        out = torch.full((b, hq, d), float("nan"), device=DEV, dtype=torch.float16)
        lse = torch.full((b, hq), float("nan"), device=DEV)
        fn(q, heads_view(cache, spec), bt, seq_lens, spec, d**-0.5, mid, out, lse, **kw)
        return mid, out, lse

    ref = run(tk.decode_attention)
    for lut in ((0,) if spec.key_fp8 else (0, 1, 2)):
        for block_t, warps, prefetch, norm_mma in ((64, 4, False, False), (32, 4, True, True), (128, 8, False, True)):
            got = run(tf.decode_attention, lut=lut, block_t=block_t, num_warps=warps, prefetch=prefetch,
                      norm_mma=norm_mma)
            _assert_decode_close([ref, got], atol=1e-2, rtol=2e-3)
    k0 = torch.full((1, hk, ctx, d), float("nan"), dtype=torch.float16, device=DEV)
    v0 = k0.clone()
    tk.dequant_kv(heads_view(cache, spec), bt[0], ctx - 5, k0, v0, spec)
    for lut in ((0,) if spec.key_fp8 else (0, 2)):
        k1, v1 = torch.full_like(k0, float("nan")), torch.full_like(v0, float("nan"))
        td.dequant_kv(heads_view(cache, spec), bt[0], ctx - 5, k1, v1, spec, lut=lut)
        assert torch.isnan(k1[:, :, ctx - 5:]).all() and torch.isnan(v1[:, :, ctx - 5:]).all()
        assert torch.allclose(k0[:, :, :ctx - 5].float(), k1[:, :, :ctx - 5].float(), atol=4e-3, rtol=2e-3)
        assert torch.equal(v0[:, :, :ctx - 5], v1[:, :, :ctx - 5])


@pytest.mark.parametrize("layout", ["vllm", "block_soa"])
@pytest.mark.parametrize("name", PRESETS)
def test_fast_dequant_variants_equal_default(name, layout):
    """Every launch variant of the fast dequant (issue 20: keys and values split over programs or
    launches, values 8 codes per thread, more tiles per program, 32-bit words) writes exactly the
    default's bits, on both cache layouts, and leaves the tail untouched; on the GPU, keys whose norm
    correction is summed at read time (vLLM's order, ``_nc`` presets) agree to fp16 rounding."""
    import dataclasses

    from tqlab.turboquant import _triton_dequant as td

    spec = dataclasses.replace(TQ_PRESETS[name], cache_layout=layout)
    cache = _filled(spec)
    row = torch.tensor([5, 0, 11, 3, 7, 2], dtype=torch.int32, device=DEV)
    k0 = torch.full((1, 2, 96, 64), 9.0, dtype=torch.float16, device=DEV)
    v0 = k0.clone()
    td.dequant_kv(heads_view(cache, spec), row, 83, k0, v0, spec, block_t=16, tiles_per_program=1)
    assert not torch.equal(k0[:, :, :83], torch.full_like(k0[:, :, :83], 9.0))
    for kw in (dict(split="grid"), dict(split="launch"), dict(v8=True), dict(split="grid", v8=True),
               dict(split="launch", v8=True, tiles_per_program=3), dict(block_t=32, tiles_per_program=2, v8=True),
               dict(w32=True), dict(w32=False), dict(split="grid", v8=True, w32=True), dict(p32=False),
               dict(tiles_per_program=None, block_t=64, tiling="fill"), dict(num_warps=8, tiles_per_program=2)):
        k1, v1 = torch.full_like(k0, 9.0), torch.full_like(v0, 9.0)
        td.dequant_kv(heads_view(cache, spec), row, 83, k1, v1, spec, **{"block_t": 16, "tiles_per_program": 1, **kw})
        assert torch.equal(v0, v1), kw
        if DEV.type == "cuda" and spec.norm_correction_on_read:
            # on the GPU the key norm correction's fp32 sum over D runs in the register layout of the
            # variant's loads, so its rounding (and, rarely, one fp16 ulp of a key) may differ
            assert torch.allclose(k0.float(), k1.float(), rtol=2**-10, atol=0), kw
            assert (k0 == k1).float().mean() >= 0.9, kw
        else:
            assert torch.equal(k0, k1), kw


def test_fast_dequant_w32_default_is_on_for_4bit_fields():
    from tqlab.turboquant import _triton_dequant as td

    assert {n: td.dequant_w32_default(s) for n, s in TQ_PRESETS.items()} == {
        "turboquant_k8v4": True, "turboquant_4bit_nc": True, "turboquant_k3v4_nc": True, "turboquant_3bit_nc": False}


def test_fast_dequant_tiling_fills_the_gpu_only_where_the_default_does_not():
    """``dequant_tiling``: 2 tiles of 64 tokens per program where that leaves >= 4 programs per SM (132 SMs:
    528), else 1 tile; ``"fill"`` then halves the tile down to 32 tokens while 1 tile per program still
    leaves fewer (the seed rank, 1 KV head, at 32K: 512 -> 1024 programs)."""
    from tqlab.turboquant import _triton_dequant as td

    assert td.dequant_tiling(32768, 1, 132, 64, 2) == (64, 1)  # 512 programs
    assert td.dequant_tiling(32768, 1, 132, 64, 2, "fill") == (32, 1)  # 1024
    assert td.dequant_tiling(131072, 1, 132, 64, 2, "fill") == (64, 2)  # 1024 programs already
    assert td.dequant_tiling(32768, 8, 132, 64, 2, "fill") == (64, 2)  # the Llama shard: 2048
    assert td.dequant_tiling(8192, 1, 132, 64, 2, "fill") == (32, 1)  # 256 programs: never below 32 tokens
    assert td.dequant_tiling(33792, 1, 132, 64, 2) == (64, 1)  # 528 tiles // 2 = 264 < 528
    assert td.dequant_tiling(67584, 1, 132, 64, 2) == (64, 2)  # 1056 // 2 = 528
    with pytest.raises(ValueError, match="tiling must be one of"):
        td.dequant_tiling(1024, 1, 132, 64, 2, "waves")


def test_fast_dequant_stats_report_the_launch():
    """``stats`` gets the launch actually made: the ``fill`` tiling's 32-token tiles for a short request on the
    CPU's assumed 132 SMs, and ``p32`` off for vLLM's order (no nibble planes)."""
    from tqlab.turboquant import _triton_dequant as td

    spec = TQ_PRESETS["turboquant_3bit_nc"]
    row = torch.tensor([5, 0, 11, 3, 7, 2], dtype=torch.int32, device=DEV)
    k = torch.full((1, 2, 96, 64), 9.0, dtype=torch.float16, device=DEV)
    st: dict = {}
    td.dequant_kv(heads_view(_filled(spec), spec), row, 83, k, k.clone(), spec, tiling="fill", stats=st)
    assert {x: st[x] for x in ("block_t", "tiles", "programs", "p32")} == {"block_t": 32, "tiles": 1, "programs": 6,
                                                                          "p32": False}


def test_fast_dequant_rejects_unknown_split():
    from tqlab.turboquant import _triton_dequant as td

    spec = TQ_PRESETS["turboquant_3bit_nc"]
    buf = torch.zeros((1, 2, 16, 64), dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match="split must be one of"):
        td.dequant_kv(heads_view(_filled(spec), spec), torch.tensor([0], dtype=torch.int32, device=DEV), 16, buf, buf.clone(), spec,
                      split="halves")
    with pytest.raises(ValueError, match="tiling must be one of"):
        td.dequant_kv(heads_view(_filled(spec), spec), torch.tensor([0], dtype=torch.int32, device=DEV), 16, buf, buf.clone(), spec,
                      tiling="waves")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["vllm", "block_soa"])
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_fast_dequant_variants_bit_equal_or_one_ulp(name, layout):
    """On the GPU (prmt tables, 64-token tiles, wgmma) every dequant variant writes the default's bits, except
    one case measured on the H200 (b92cd53): in vLLM's order the ``_nc`` keys are renormalized on read, and a
    launch that changes the tile or warp shape (``tiling="fill"``, 32-token tiles, 8 warps) sums ``c_hat**2`` in
    another order, so ~6e-5 of the keys move by one fp16 ulp (max relative 9.75e-4); values stay bit-equal."""
    import dataclasses

    from tqlab.turboquant import _triton_dequant as td

    spec = dataclasses.replace(TQ_PRESETS[name], cache_layout=layout)
    d, hk, bs, ctx = 128, 8, 16, 4096
    nb = ctx // bs
    g = torch.Generator().manual_seed(23)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    store_kv(cache, torch.randn(ctx, hk, d, generator=g).to(DEV), torch.randn(ctx, hk, d, generator=g).to(DEV),
             torch.randperm(ctx, generator=g).to(DEV), spec)
    row = torch.randperm(nb, generator=g).to(torch.int32).to(DEV)
    k0 = torch.full((1, hk, ctx, d), float("nan"), dtype=torch.float16, device=DEV)
    v0 = k0.clone()
    td.dequant_kv(heads_view(cache, spec), row, ctx - 5, k0, v0, spec)
    for kw in (dict(v8=True), dict(w32=True), dict(v8=True, w32=True), dict(split="grid", v8=True, w32=True),
               dict(split="launch", v8=True, w32=True), dict(split="grid", v8=True, w32=True, tiles_per_program=1),
               dict(p32=False), dict(tiling="fill"), dict(block_t=32, tiles_per_program=1),
               dict(tiles_per_program=4), dict(num_warps=8), dict(num_warps=8, maxnreg=64)):
        k1, v1 = torch.full_like(k0, float("nan")), torch.full_like(v0, float("nan"))
        td.dequant_kv(heads_view(cache, spec), row, ctx - 5, k1, v1, spec, **kw)
        k_a, k_b = k0[:, :, :ctx - 5], k1[:, :, :ctx - 5]
        assert torch.equal(v0[:, :, :ctx - 5], v1[:, :, :ctx - 5]), kw
        reshaped = "tiling" in kw or kw.get("block_t") == 32 or kw.get("num_warps") == 8
        if reshaped and spec.norm_correction_on_read:  # the norm-sum order follows the launch shape (docstring)
            ulps = (k_a.view(torch.int16).int() - k_b.view(torch.int16).int()).abs()  # same sign: bit patterns 1 apart
            assert int(ulps.max()) <= 1 and float((ulps > 0).float().mean()) < 1e-3, kw
        else:
            assert torch.equal(k_a, k_b), kw
        assert torch.isnan(k1[:, :, ctx - 5:]).all() and torch.isnan(v1[:, :, ctx - 5:]).all(), kw
