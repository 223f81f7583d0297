"""The opt-in block-SoA cache layout (``cache_layout="block_soa"``, issue 20): the byte permutation
keeps every byte, the store kernel writes exactly vLLM's bytes in the new order, and decode /
dequant on it equal the vLLM-order results (portable kernels bit for bit, under Triton's
interpreter on CPU; the fast SoA decode kernel to fp16 rounding, natively with CUDA).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv, get_spec, kv_cache_shape, store_kv
from tqlab.turboquant.quant import to_cache_layout, to_slot_order

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRESETS = sorted(TQ_PRESETS)
ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


def _soa(name):
    return get_spec(name, cache_layout="block_soa")


def _stored(spec, d=64, hk=2, bs=16, nb=12, n=None, seed=5, backend="torch", pad_every=0):
    g = torch.Generator().manual_seed(seed)
    n = n or nb * bs
    slots = torch.randperm(nb * bs, generator=g)[:n]
    if pad_every:
        slots[::pad_every] = -1
    k, v = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g) * 2 + 0.5
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    store_kv(cache, k.to(DEV), v.to(DEV), slots.to(DEV), spec, backend=backend)
    return cache


def test_layout_is_opt_in_and_validated():
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    assert spec.cache_layout == "vllm" and get_spec("turboquant_3bit_nc") is spec
    soa = _soa("turboquant_3bit_nc")
    assert soa.cache_layout == "block_soa" and soa.name == spec.name and soa != spec
    assert get_spec(soa) is soa and get_spec(soa, "vllm") == spec
    assert kv_cache_shape(4, 2, 16, 128, soa) == kv_cache_shape(4, 2, 16, 128, spec)
    with pytest.raises(ValueError, match="cache_layout must be one of"):
        get_spec("turboquant_3bit_nc", cache_layout="soa")


@pytest.mark.parametrize("name", PRESETS)
def test_field_addresses_tile_the_block(name):
    """vLLM's order: the slot offsets with stride slot_bytes; block-SoA: each field contiguous,
    in the order key codes, value codes, norm, scale, zero, pad; both tile the region exactly."""
    d, bs = 128, 16
    vl, soa = TQ_PRESETS[name].field_addresses(d, bs), _soa(name).field_addresses(d, bs)
    sb = TQ_PRESETS[name].slot_bytes(d)
    assert {k: (o, n) for k, (o, s, n) in vl.items()} == {f.kind: (f.offset, f.nbytes) for f in TQ_PRESETS[name].layout(d)}
    assert all(s == sb for _, s, _ in vl.values())
    for fa in (vl, soa):
        covered = sorted(o + t * s + j for o, s, n in fa.values() for t in range(bs) for j in range(n))
        assert covered == list(range(bs * sb))
    order = [k for k in ("key_idx", "key_fp8", "val_idx", "key_norm", "val_scale", "val_zero", "pad") if k in soa]
    offs = [soa[k][0] for k in order]
    assert offs == sorted(offs) and offs[0] == 0
    assert all(soa[k][1] == soa[k][2] for k in order)  # stride = field size: contiguous per block
    assert all(o % 16 == 0 for o in offs)  # 16-byte aligned fields at block_size 16


@pytest.mark.parametrize("name", PRESETS)
def test_layout_conversion_round_trips_and_places_fields(name):
    spec, soa = TQ_PRESETS[name], _soa(name)
    d, bs = 64, 16
    cache = _stored(spec, d=d)
    blocks = to_cache_layout(cache, soa, d)
    assert blocks.shape == cache.shape and torch.equal(to_slot_order(blocks, soa, d), cache)
    assert to_cache_layout(cache, spec, d) is cache
    region = blocks.reshape(cache.shape[0], cache.shape[1], -1)
    fa, off = soa.field_addresses(d, bs), spec.offsets(d)
    o, _, n = fa["val_idx"]
    assert torch.equal(region[..., o: o + bs * n].reshape(cache.shape[:3] + (n,)), cache[..., off["val_idx"]: off["val_idx"] + n])
    o, _, n = fa["val_zero"]
    assert torch.equal(region[..., o: o + bs * n].reshape(cache.shape[:3] + (n,)), cache[..., off["val_zero"]: off["val_zero"] + 2])


@pytest.mark.parametrize("name", PRESETS)
def test_store_writes_vllm_bytes_in_block_soa_order(name):
    """Both backends, padding slots and a partly filled cache: the block-SoA cache is exactly the
    vLLM-order cache, permuted."""
    ref = _stored(TQ_PRESETS[name], n=150, pad_every=7)
    for backend in ("torch", "triton"):
        got = _stored(_soa(name), n=150, pad_every=7, backend=backend)
        assert torch.equal(to_slot_order(got, _soa(name), 64), ref), backend


def _decode(spec, cache, backend, d=64, hq=8):
    g = torch.Generator().manual_seed(9)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(3)]).to(torch.int32).to(DEV)
    q = torch.randn(3, hq, d, generator=g).to(DEV)
    seq_lens = torch.tensor([0, 5, 171], device=DEV)
    mid = torch.full((3, hq, 4, d + 1), float("nan"), device=DEV)
    out, lse = torch.full((3, hq, d), float("nan"), device=DEV), torch.full((3, hq), float("nan"), device=DEV)
    decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse, backend=backend)
    return q, bt, seq_lens, mid, out, lse


@pytest.mark.parametrize("name", PRESETS)
def test_decode_and_dequant_on_block_soa_equal_vllm_order(name):
    """The portable kernels (the interpreter on CPU; on CUDA the rotated presets take the fast SoA
    decode, compared to fp16 rounding in the gpu test) and the torch reference give on the
    block-SoA cache exactly what they give on vLLM's order."""
    spec, soa = TQ_PRESETS[name], _soa(name)
    cache = _stored(spec)
    blocks = to_cache_layout(cache, soa, 64)
    backends = ("torch",) if DEV.type == "cuda" else ("torch", "triton")
    for backend in backends:
        *_, mid0, o0, l0 = _decode(spec, cache, backend)
        *_, mid1, o1, l1 = _decode(soa, blocks, backend)
        assert not torch.isnan(o1).any() and torch.equal(o0, o1) and torch.equal(l0, l1), backend
        row = torch.randperm(12, generator=torch.Generator().manual_seed(3)).to(DEV)
        outs = []
        for sp, c in ((spec, cache), (soa, blocks)):
            k = torch.full((1, 2, 176, 64), 9.0, dtype=torch.float16, device=DEV)
            v = k.clone()
            dequant_kv(c, row, 171, k, v, sp, backend=backend)
            outs.append((k, v))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), backend
        assert torch.all(outs[1][0][:, :, 171:] == 9)


@pytest.mark.parametrize("x32", [False, True])
@pytest.mark.parametrize("name", ROTATED)
def test_soa_decode_kernels_match_reference(name, x32):
    """The SoA decode kernels (``_triton_soa``; the polynomial centroids under the interpreter):
    empty request, fewer tokens than splits, several tiles, shuffled blocks, GQA 4; every output
    element written (NaN-poisoned before)."""
    from tqlab.turboquant import _triton_soa as ts

    spec, soa = TQ_PRESETS[name], _soa(name)
    cache = _stored(spec)
    q, bt, seq_lens, _, o0, l0 = _decode(spec, cache, "torch")
    mid = torch.full((3, 8, 4, 65), float("nan"), device=DEV)
    o1, l1 = torch.full_like(o0, float("nan")), torch.full_like(l0, float("nan"))
    ts.decode_attention(q, to_cache_layout(cache, soa, 64), bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, x32=x32)
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.allclose(o0, o1, atol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_block_soa_equals_vllm_order(name):
    """On the GPU at the benchmark's size class (GQA 4, 4K context, block 16): store on block-SoA
    = vLLM's bytes permuted; ``ops.decode_attention`` on block-SoA (the fast SoA kernel for the
    rotated presets, default launch) equals the fast kernel on vLLM's order to fp16 rounding (the
    tolerance of ``test_gpu_fast_equals_portable``); dequant equal bit for bit."""
    from tqlab.turboquant import _triton_soa as ts

    spec, soa = TQ_PRESETS[name], _soa(name)
    d, hk, hq, bs, ctx, b = 128, 8, 32, 16, 4096, 4
    nb = b * ctx // bs
    g = torch.Generator().manual_seed(21)
    n = nb * bs
    kv = (torch.randn(n, hk, d, generator=g).to(DEV), torch.randn(n, hk, d, generator=g).to(DEV) * 2,
          torch.randperm(n, generator=g).to(DEV))
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    blocks = torch.zeros_like(cache)
    store_kv(cache, *kv, spec)
    store_kv(blocks, *kv, soa)
    assert torch.equal(to_slot_order(blocks, soa, d), cache)
    assert ts.use_soa(soa, blocks, d) == (not spec.key_fp8)
    bt = torch.randperm(nb, generator=g).view(b, -1).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.float16)
    seq_lens = torch.tensor([ctx, 1, 3001, 64], device=DEV)
    res = []
    for sp, c in ((spec, cache), (soa, blocks)):
        mid = torch.full((b, hq, 32, d + 1), float("nan"), device=DEV)
        out = torch.full((b, hq, d), float("nan"), device=DEV, dtype=torch.float16)
        lse = torch.full((b, hq), float("nan"), device=DEV)
        decode_attention(q, c, bt, seq_lens, sp, d**-0.5, mid, out, lse)
        k = torch.full((1, hk, ctx, d), float("nan"), dtype=torch.float16, device=DEV)
        v = k.clone()
        dequant_kv(c, bt[0], ctx - 5, k, v, sp)
        res.append((out, lse, k, v))
    (o0, l0, k0, v0), (o1, l1, k1, v1) = res
    assert not torch.isnan(o1).any() and not torch.isnan(l1[1:]).any()
    assert torch.allclose(o0.float(), o1.float(), atol=1e-2, rtol=2e-3)
    assert torch.allclose(l0, l1, atol=1e-2, rtol=2e-3)
    assert torch.equal(k0[:, :, :ctx - 5], k1[:, :, :ctx - 5]) and torch.equal(v0[:, :, :ctx - 5], v1[:, :, :ctx - 5])


@pytest.mark.parametrize("variant", [0, 1, 2, 3])
@pytest.mark.parametrize("name", ROTATED)
def test_frag_decode_variants_match_reference(name, variant):
    """``benchmarks/dev_turboquant_frag.py`` (issue 20 experiment: the key operand in mma-slot order, q's
    columns permuted alike; variants 2/3 load the chunks in another tensor shape): the same cases as
    :func:`test_soa_decode_kernels_match_reference`, against the torch reference."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import dev_turboquant_frag as fr
    finally:
        sys.path.pop(0)
    spec, soa = TQ_PRESETS[name], _soa(name)
    cache = _stored(spec)
    q, bt, seq_lens, _, o0, l0 = _decode(spec, cache, "torch")
    mid = torch.full((3, 8, 4, 65), float("nan"), device=DEV)
    o1, l1 = torch.full_like(o0, float("nan")), torch.full_like(l0, float("nan"))
    fr.decode_attention(q, to_cache_layout(cache, soa, 64), bt, seq_lens, soa, 64**-0.5, mid, o1, l1, variant=variant,
                        block_t=16)
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.allclose(o0, o1, atol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=2e-3)
