"""Block-SoA cache layout under inputs the other tests do not use (issue 20 review): head dims that are not
a multiple of 32 (the 3-bit fields stay in vLLM's bit stream there, ``TurboQuantSpec.code_order``), block
sizes 8 and 32, an empty request, and bad arguments to the layout conversions (one-line errors naming the
value).  Store / decode / dequant run on the torch reference and on the Triton kernels (the interpreter on
CPU; on CUDA ``ops`` routes these shapes as it would in a deployment).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (as the other kernel tests)

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv, get_spec, kv_cache_shape, store_kv
from tqlab.turboquant.ops import heads_view
from tqlab.turboquant.quant import to_cache_layout, to_slot_order

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRESETS = sorted(TQ_PRESETS)


@pytest.mark.parametrize("d", [24, 48, 80, 96, 136])
@pytest.mark.parametrize("name", PRESETS)
def test_conversions_round_trip_for_any_head_dim(name, d):
    """Any head dim ``slot_bytes`` accepts (the kernels take powers of two; the conversions are bytes):
    the 3-bit fields are nibble planes exactly where ``d % 32 == 0`` (96 yes, 48 / 80 / 24 / 136 no),
    and ``to_slot_order`` inverts ``to_cache_layout`` on random bytes, block sizes 8 and 32."""
    soa = get_spec(name, "block_soa")
    three = [k for k, b in (("key_idx", soa.key_bits), ("val_idx", soa.value_bits)) if b == 3]
    assert {k: soa.code_order(k, d) for k in three} == {k: "planes" if d == 96 else "stream" for k in three}
    g = torch.Generator().manual_seed(d)
    for bs in (8, 32):
        x = torch.randint(0, 256, kv_cache_shape(3, 2, bs, d, soa), dtype=torch.uint8, generator=g)
        y = to_cache_layout(x, soa, d)
        assert y.shape == x.shape and torch.equal(to_slot_order(y, soa, d), x)
        assert not torch.equal(y, x)  # the order did change


@pytest.mark.parametrize("layout", ["vllm", "block_soa"])
def test_conversions_name_the_bad_blocks(layout):
    spec = get_spec("turboquant_3bit_nc", layout)
    sb = spec.slot_bytes(128)
    for fn in (to_cache_layout, to_slot_order):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: blocks must be \(\.\.\., block_size, {sb}\).*"
                                             r"got shape \(2, 1, 16, 10\)"):
            fn(torch.zeros(2, 1, 16, 10, dtype=torch.uint8), spec, 128)
        with pytest.raises(ValueError, match=rf"got shape \(2, 1, 16, {sb}\)"):  # the cache of another head dim
            fn(torch.zeros(2, 1, 16, sb, dtype=torch.uint8), spec, 64)
        with pytest.raises(ValueError, match=rf"got shape \({sb},\)"):
            fn(torch.zeros(sb, dtype=torch.uint8), spec, 128)
        with pytest.raises(TypeError, match="blocks must be a uint8 tensor.*got torch.float16"):
            fn(torch.zeros(2, 1, 16, sb, dtype=torch.float16), spec, 128)
        with pytest.raises(ValueError, match="head_dim must be a positive multiple of 8, got 100"):
            fn(torch.zeros(2, 1, 16, sb, dtype=torch.uint8), spec, 100)


def _backends():
    pytest.importorskip("triton")
    return ("torch", "triton")


@pytest.mark.parametrize(("name", "d", "bs"), [("turboquant_3bit_nc", 16, 8), ("turboquant_k3v4_nc", 32, 32),
                                               ("turboquant_k8v4", 32, 8), ("turboquant_4bit_nc", 16, 32)])
def test_block_soa_odd_shapes_agree_with_the_torch_reference(name, d, bs):
    """Block sizes 8 / 32 and head dims 16 (3-bit fields in vLLM's stream on block-SoA) / 32 (one chunk of
    planes): the Triton store writes the torch store's bytes; decode (one empty request: output 0, lse
    -inf) and dequant agree with the torch reference (keys to fp16 rounding, values bit for bit) and
    leave the dequant tail untouched; the cache equals the vLLM-order cache through ``to_slot_order``
    except the folded key norm."""
    soa, hk, hq, nb = get_spec(name, "block_soa"), 2, 4, 5
    g = torch.Generator().manual_seed(bs + d)
    n = 2 * bs + 3
    k, v = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    bt = torch.stack([torch.randperm(nb, generator=g) for _ in range(3)]).to(DEV)
    seq, q = torch.tensor([0, 1, nb * bs - 1], device=DEV), torch.randn(3, hq, d, generator=g).to(DEV)
    res = {}
    for be in _backends():
        cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, soa), dtype=torch.uint8, device=DEV)
        store_kv(cache, k.to(DEV), v.to(DEV), slots.to(DEV), soa, backend=be)
        mid, out, lse = (torch.zeros(3, hq, 4, d + 1, device=DEV), torch.zeros(3, hq, d, device=DEV),
                         torch.zeros(3, hq, device=DEV))
        decode_attention(q, cache, bt, seq, soa, d**-0.5, mid, out, lse, backend=be)
        ko = torch.full((1, hk, 3 * bs, d), 7.0, dtype=torch.float16, device=DEV)
        vo = ko.clone()
        dequant_kv(cache, bt[2], 2 * bs + 1, ko, vo, soa, backend=be)
        assert (ko[:, :, 2 * bs + 1:] == 7).all() and (vo[:, :, 2 * bs + 1:] == 7).all(), be
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all(), be
        res[be] = cache, out, lse, ko, vo
    c0, o0, l0, k0, v0 = res["torch"]
    for be, (c1, o1, l1, k1, v1) in res.items():
        assert torch.equal(c1, c0), be
        assert torch.allclose(o1, o0, atol=2e-3, rtol=1e-3) and torch.allclose(l1[1:], l0[1:], atol=1e-3), be
        assert torch.allclose(k1.float(), k0.float(), atol=2e-3, rtol=1e-3) and torch.equal(v1, v0), be
    vllm = torch.zeros(kv_cache_shape(nb, hk, bs, d, get_spec(name)), dtype=torch.uint8, device=DEV)
    store_kv(vllm, k.to(DEV), v.to(DEV), slots.to(DEV), get_spec(name), backend="torch")
    vllm = heads_view(vllm, get_spec(name))  # vLLM's tensor as (num_blocks, Hk, block_size, slot)
    back, off = to_slot_order(c0, soa, d), get_spec(name).offsets(d)
    keep = torch.ones(back.shape[-1], dtype=torch.bool)
    if soa.norm_folded:
        keep[off["key_norm"]: off["key_norm"] + 2] = False
    assert torch.equal(back[..., keep], vllm[..., keep])


def test_bad_block_ids_and_strides_are_named():
    """The range and stride errors of ``ops`` name the offending value (CPU checks)."""
    spec = get_spec("turboquant_3bit_nc", "block_soa")
    cache = torch.zeros(kv_cache_shape(4, 1, 16, 64, spec), dtype=torch.uint8)
    ko = torch.zeros(1, 1, 32, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"block_table_row\[:2\] holds block ids outside \[0, 4\): 9"):
        dequant_kv(cache, torch.tensor([1, 9, 0]), 20, ko, ko.clone(), spec, backend="torch")
    with pytest.raises(ValueError, match=r"unit stride .* got 2/1"):
        dequant_kv(cache, torch.tensor([1, 2]), 20, torch.zeros(1, 1, 32, 128, dtype=torch.float16)[..., ::2], ko, spec)
    q, mid, out, lse = torch.zeros(2, 4, 64), torch.zeros(2, 4, 2, 65), torch.zeros(2, 4, 64), torch.zeros(2, 4)
    bt, seq = torch.tensor([[0, 1], [2, -3]]), torch.tensor([20, 17])
    with pytest.raises(ValueError, match=r"block_tables\[1\] holds block ids outside \[0, 4\) .*\(seq_lens\[1\] = 17\): -3"):
        decode_attention(q, cache, bt, seq, spec, 0.125, mid, out, lse, backend="torch")
    with pytest.raises(ValueError, match=r"cache must be contiguous \(num_blocks, num_kv_heads, block_size, slot_bytes\), got strides"):
        two_heads = torch.zeros(kv_cache_shape(4, 2, 16, 64, spec), dtype=torch.uint8).transpose(0, 1)
        decode_attention(q, two_heads, torch.tensor([[0, 1], [1, 0]]), torch.tensor([1, 1]), spec, 0.125, mid, out, lse)


def test_planes_from_codes_refuses_codes_outside_3_bits():
    from tqlab.turboquant.quant import codes_from_planes, planes_from_codes

    codes = torch.arange(32) % 8
    assert torch.equal(codes_from_planes(planes_from_codes(codes), 32), codes.to(torch.uint8))
    with pytest.raises(ValueError, match=r"3-bit codes 0\.\.7, got codes in \[0, 9\]"):
        planes_from_codes(torch.cat([codes[:31], torch.tensor([9])]))
    with pytest.raises(ValueError, match=r"got codes in \[-1, 7\]"):
        planes_from_codes(torch.cat([codes[:31], torch.tensor([-1])]))
