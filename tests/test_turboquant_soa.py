"""The opt-in block-SoA cache layout (``cache_layout="block_soa"``, issue 20): the conversion (a byte
permutation, and the 3-bit code fields re-encoded as nibble planes, ``TurboQuantSpec.code_order``) is
exactly invertible; the store kernel writes vLLM's bytes in the new order, except the key norm of the
``_nc`` presets, which holds ``fp16(||k|| / ||c_hat||)`` (``TurboQuantSpec.norm_folded``, as vLLM
0.33's SoA store), and the 3-bit fields' bit order; every reader then reads the planes and skips the
norm correction: decode / dequant on block-SoA equal, bit for bit, the same bytes in vLLM's order read
without correction, and the vLLM-order results of the unfolded cache to the fp16 rounding of the norm
(portable kernels, the fast dequant and the torch reference under Triton's interpreter on CPU; the fast
SoA decode kernel natively with CUDA; the planes' PTX tables by the emulator).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_turboquant_triton's PTX emulator

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv, get_spec, kv_cache_shape, store_kv
from tqlab.turboquant.ops import heads_view  # the (num_blocks, Hk, block_size, slot) view kernels and conversions read
from tqlab.turboquant.codebook import lloyd_max
from tqlab.turboquant.quant import (
    bytes_to_fp16,
    codes_from_planes,
    decode_slots,
    planes_from_codes,
    to_cache_layout,
    to_slot_order,
    unpack_indices,
)

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PRESETS = sorted(TQ_PRESETS)
ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


def _soa(name):
    return get_spec(name, cache_layout="block_soa")


def _inputs(d=64, hk=2, bs=16, nb=12, n=None, seed=5, pad_every=0):
    """``(slots, k, v)`` on the CPU: ``n`` tokens scattered over ``nb`` blocks, every ``pad_every``-th padding."""
    g = torch.Generator().manual_seed(seed)
    n = n or nb * bs
    slots = torch.randperm(nb * bs, generator=g)[:n]
    if pad_every:
        slots[::pad_every] = -1
    return slots, torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g) * 2 + 0.5


def _stored(spec, d=64, hk=2, bs=16, nb=12, n=None, seed=5, backend="torch", pad_every=0):
    slots, k, v = _inputs(d, hk, bs, nb, n, seed, pad_every)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    store_kv(cache, k.to(DEV), v.to(DEV), slots.to(DEV), spec, backend=backend)
    return cache


def _in_vllm_order(blocks, soa, d):
    """The same bytes in vLLM's slot order (vLLM's own token-major tensor) and the spec that reads them as ``soa`` reads ``blocks``:
    vLLM's order, norm correction only where ``soa`` corrects on read (a folded norm: none)."""
    flat = to_slot_order(blocks, soa, d).transpose(1, 2).contiguous()  # vLLM's tensor (num_blocks, block_size, Hk, slot)
    return flat, replace(get_spec(soa, "vllm"), norm_correction=soa.norm_correction_on_read)


def _folded_norm(spec, k, key_codes, d):
    """fp16(||k|| / ||c_hat||) computed here: fp32 norm of the fp32 input key, fp32 norm of the fp32
    Lloyd-Max centroids of the stored codes (``key_codes``: uint8 ``(..., key_index_bytes)``), fp32 ratio."""
    cent = torch.tensor(lloyd_max(spec.key_bits, d).centroids, dtype=torch.float32)
    idx = unpack_indices(key_codes.cpu(), spec.key_bits, d).long()
    return (torch.linalg.vector_norm(k.float(), dim=-1) / torch.linalg.vector_norm(cent[idx], dim=-1)).half()


def test_layout_is_opt_in_and_validated():
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    assert spec.cache_layout == "vllm" and get_spec("turboquant_3bit_nc") is spec
    soa = _soa("turboquant_3bit_nc")
    assert soa.cache_layout == "block_soa" and soa.name == spec.name and soa != spec
    assert get_spec(soa) is soa and get_spec(soa, "vllm") == spec
    # the same bytes; vLLM's tensor is token-major (num_blocks, block_size, Hk, slot), block-SoA a region per head
    assert kv_cache_shape(4, 2, 16, 128, soa) == (4, 2, 16, 102) and kv_cache_shape(4, 2, 16, 128, spec) == (4, 16, 2, 102)
    with pytest.raises(ValueError, match="cache_layout must be one of"):
        get_spec("turboquant_3bit_nc", cache_layout="soa")


def test_norm_folded_is_block_soa_and_norm_correction():
    """One question for every store and reader: folded exactly for the _nc presets on block-SoA."""
    for name in PRESETS:
        spec, soa = TQ_PRESETS[name], _soa(name)
        assert not spec.norm_folded and spec.norm_correction_on_read == spec.norm_correction
        assert soa.norm_folded == spec.norm_correction == (name != "turboquant_k8v4")
        assert not soa.norm_correction_on_read


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


def test_code_order_is_the_block_soa_3bit_fields():
    """Nibble planes exactly for the 3-bit code fields of the block-SoA layout with whole 32-code
    chunks: keys of 3bit_nc and k3v4_nc, values of 3bit_nc; vLLM's order never (parity)."""
    want = {"turboquant_3bit_nc": ("planes", "planes"), "turboquant_k3v4_nc": ("planes", "stream"),
            "turboquant_4bit_nc": ("stream", "stream"), "turboquant_k8v4": ("stream", "stream")}
    for name in PRESETS:
        spec, soa = TQ_PRESETS[name], _soa(name)
        assert (soa.code_order("key_idx", 128), soa.code_order("val_idx", 64)) == want[name], name
        assert {spec.code_order(k, 128) for k in ("key_idx", "val_idx")} == {"stream"}
        assert {soa.code_order(k, 48) for k in ("key_idx", "val_idx")} == {"stream"}  # 48 % 32 != 0
    with pytest.raises(ValueError, match="kind must be 'key_idx' or 'val_idx', got 'key_norm'"):
        _soa("turboquant_3bit_nc").code_order("key_norm", 128)
    with pytest.raises(ValueError, match="head_dim must be a positive multiple of 8"):
        _soa("turboquant_3bit_nc").code_order("key_idx", 100)


def test_planes_round_trip_and_word_layout():
    """``planes_from_codes`` / ``codes_from_planes`` are inverse on random codes, and one code lands
    where the rule says: code 9 = 8*1 + 1 puts its low bits at 4*1 + 2 of L0, its high bit at 4*1 + 1 of H."""
    codes = torch.randint(0, 8, (64, 128), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    by = planes_from_codes(codes)
    assert by.shape == (64, 48) and torch.equal(codes_from_planes(by, 128), codes)
    one = torch.zeros(1, 32, dtype=torch.uint8)
    one[0, 9] = 0b101
    assert planes_from_codes(one).view(torch.int32)[0].tolist() == [0b01 << 6, 0, 1 << 5]
    one[0, 9], one[0, 31] = 0, 0b111  # code 31 = 8*3 + 7: low bits at 28 + 2 of L1 (the sign bit), high bit at 28 + 3
    assert planes_from_codes(one).view(torch.int32)[0].tolist() == [0, (3 << 30) - (1 << 32), -(1 << 31)]  # int32 views
    with pytest.raises(ValueError, match="whole chunks of 32 codes"):
        planes_from_codes(torch.zeros(2, 48, dtype=torch.uint8))
    with pytest.raises(ValueError, match="3 \\* head_dim / 8"):
        codes_from_planes(torch.zeros(2, 18, dtype=torch.uint8), 48)


@pytest.mark.parametrize("table", ["keys", "values", "values1024"])
def test_planes_asm_is_exact(table):
    """The package's nibble-plane ``prmt`` PTX (``ptx_tables.planes_key_asm`` / ``PLANES_VALUE_ASM`` /
    ``PLANES_VALUE1024_ASM``) on the words of random chunks, run by the PTX emulator: the fp16 centroid
    (keys), fp16 integer (values) or ``0x6400 | code`` (the fast dequant's values) of every code, in order."""
    import numpy as np
    from test_turboquant_triton import _ptx_emulate

    from tqlab.turboquant import ptx_tables as pt

    if table == "keys":
        want = np.asarray(lloyd_max(3, 128).centroids, dtype=np.float16).view(np.uint16)
        asm = pt.planes_key_asm(TQ_PRESETS["turboquant_3bit_nc"], 128)
    elif table == "values":
        want = np.arange(8, dtype=np.float16).view(np.uint16)
        asm = pt.PLANES_VALUE_ASM.value
    else:  # the fast dequant's: the bits 0x6400 | code (fp16 1024 + code)
        want = np.arange(1024, 1032, dtype=np.float16).view(np.uint16)
        asm = pt.PLANES_VALUE1024_ASM.value
    codes = torch.randint(0, 8, (40, 32), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    words = planes_from_codes(codes).view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    for t in range(40):
        l0, l1, h = (int(x) for x in words[t])
        a = _ptx_emulate(asm, {"$16": l0, "$17": (h << 2) & 0xFFFFFFFF})
        b = _ptx_emulate(asm, {"$16": l1, "$17": h})
        got = [a[f"${i}"] for i in range(16)] + [b[f"${i}"] for i in range(16)]
        assert got == want[codes[t].numpy()].tolist()
    with pytest.raises(ValueError, match="3-bit codes; turboquant_4bit_nc has 4-bit keys"):
        pt.planes_key_asm(TQ_PRESETS["turboquant_4bit_nc"], 128)


@pytest.mark.parametrize("name", PRESETS)
def test_layout_conversion_round_trips_and_places_fields(name):
    spec, soa = TQ_PRESETS[name], _soa(name)
    d, bs = 64, 16
    cache = heads_view(_stored(spec, d=d), spec)  # the conversions work on (num_blocks, Hk, block_size, slot)
    blocks = to_cache_layout(cache, soa, d)
    assert blocks.shape == cache.shape and torch.equal(to_slot_order(blocks, soa, d), cache)
    assert to_cache_layout(cache, spec, d) is cache
    region = blocks.reshape(cache.shape[0], cache.shape[1], -1)
    fa, off = soa.field_addresses(d, bs), spec.offsets(d)
    for kind, bits in (("key_idx", spec.key_bits), ("val_idx", spec.value_bits)):
        if kind not in fa:
            continue
        o, _, n = fa[kind]
        vllm_bytes = cache[..., off[kind]: off[kind] + n]
        field = region[..., o: o + bs * n]
        if soa.code_order(kind, d) == "planes":  # the 3-bit fields: nibble planes of vLLM's codes, plane-major:
            tok = planes_from_codes(unpack_indices(vllm_bytes, bits, d))  # word w of chunk c of token t at byte
            ps, nc = soa.plane_stride(d, bs), d // 32  # w * plane_stride + 4 * (t * nc + c)
            assert ps == bs * d // 8 and 3 * ps == bs * n
            for t, c, w in ((0, 0, 0), (1, 0, 2), (5, 1, 1), (15, 1, 2)):
                assert torch.equal(field[..., w * ps + 4 * (t * nc + c): w * ps + 4 * (t * nc + c) + 4],
                                   tok[..., t, 12 * c + 4 * w: 12 * c + 4 * w + 4]), (kind, t, c, w)
            field = field.reshape(cache.shape[:2] + (3, bs, nc, 4)).movedim(-4, -2)
            vllm_bytes = tok
        assert torch.equal(field.reshape(cache.shape[:3] + (n,)), vllm_bytes), kind
    o, _, n = fa["val_zero"]
    assert torch.equal(region[..., o: o + bs * n].reshape(cache.shape[:3] + (n,)), cache[..., off["val_zero"]: off["val_zero"] + 2])


@pytest.mark.parametrize("name", PRESETS)
def test_store_writes_vllm_bytes_in_block_soa_order(name):
    """Both backends, padding slots and a partly filled cache: each 3-bit code field's words are
    ``planes_from_codes`` of vLLM's codes, stored plane-major (``TurboQuantSpec.plane_stride``); converted
    back (``to_slot_order``) the block-SoA cache is exactly the vLLM-order cache except the key norm field of the _nc presets, which holds
    fp16(||k|| / ||c_hat||) computed independently here (equal bit for bit: the same fp32 operations,
    IEEE sqrt and divide in the kernel); k8v4 (fp8 keys, no norm): every byte equal."""
    spec, soa, d, bs = TQ_PRESETS[name], _soa(name), 64, 16
    ref = heads_view(_stored(spec, n=150, pad_every=7), spec)
    slots, k, _ = _inputs(n=150, pad_every=7)
    keep = slots >= 0
    blk, o = slots[keep] // bs, slots[keep] % bs
    rest = torch.ones(spec.slot_bytes(d), dtype=torch.bool)
    nrm = spec.offsets(d)["key_norm"]
    if spec.norm_correction:
        rest[nrm: nrm + 2] = False
        want = _folded_norm(spec, k[keep], ref[blk, :, o, : spec.key_index_bytes(d)], d)
        assert not torch.equal(want, bytes_to_fp16(ref[blk, :, o, nrm: nrm + 2]).cpu())  # ||c_hat|| != 1
    fa, off = soa.field_addresses(d, bs), spec.offsets(d)
    for backend in ("torch", "triton"):
        blocks = _stored(soa, n=150, pad_every=7, backend=backend)
        region = blocks.reshape(*blocks.shape[:2], -1)
        for kind in ("key_idx", "val_idx"):  # the 3-bit fields' words: planes_from_codes of vLLM's codes
            if kind in fa and soa.code_order(kind, d) == "planes":
                o_, _, n_ = fa[kind]
                field = region[..., o_: o_ + bs * n_].reshape(*blocks.shape[:2], 3, bs, d // 32, 4)  # plane-major
                field = field.movedim(-4, -2).reshape(*blocks.shape[:3], n_)
                assert torch.equal(field, planes_from_codes(unpack_indices(ref[..., off[kind]: off[kind] + n_], 3, d))), kind
        got = to_slot_order(blocks, soa, d)
        assert torch.equal(got[..., rest], ref[..., rest]), backend
        if spec.norm_correction:
            assert torch.equal(bytes_to_fp16(got[blk, :, o, nrm: nrm + 2]).cpu(), want), backend
        else:
            assert torch.equal(got, ref), backend


def _decode(spec, cache, backend, d=64, hq=8):
    g = torch.Generator().manual_seed(9)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(3)]).to(torch.int32).to(DEV)
    q = torch.randn(3, hq, d, generator=g).to(DEV)
    seq_lens = torch.tensor([0, 5, 171], device=DEV)
    mid = torch.full((3, hq, 4, d + 1), float("nan"), device=DEV)
    out, lse = torch.full((3, hq, d), float("nan"), device=DEV), torch.full((3, hq), float("nan"), device=DEV)
    decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse, backend=backend)
    return q, bt, seq_lens, mid, out, lse


def _dequant(spec, cache, backend, n=171):
    row = torch.randperm(12, generator=torch.Generator().manual_seed(3)).to(DEV)
    k = torch.full((1, 2, 176, 64), 9.0, dtype=torch.float16, device=DEV)
    v = k.clone()
    dequant_kv(cache, row, n, k, v, spec, backend=backend)
    assert torch.all(k[:, :, n:] == 9) and torch.all(v[:, :, n:] == 9)  # tail untouched
    return k, v


@pytest.mark.parametrize("name", PRESETS)
def test_block_soa_readers_skip_the_folded_correction(name):
    """The portable kernels (the interpreter on CPU; on CUDA the rotated presets take the fast SoA
    decode, checked in the gpu test) and the torch reference give on a block-SoA cache exactly, bit
    for bit, what they give on the same bytes in vLLM's order read without norm correction."""
    soa = _soa(name)
    blocks = _stored(soa)
    flat, flat_spec = _in_vllm_order(blocks, soa, 64)
    backends = ("torch",) if DEV.type == "cuda" else ("torch", "triton")
    for backend in backends:
        *_, o0, l0 = _decode(flat_spec, flat, backend)
        *_, o1, l1 = _decode(soa, blocks, backend)
        assert not torch.isnan(o1).any() and torch.equal(o0, o1) and torch.equal(l0, l1), backend
        (k0, v0), (k1, v1) = _dequant(flat_spec, flat, backend), _dequant(soa, blocks, backend)
        assert torch.equal(k0, k1) and torch.equal(v0, v1), backend


@pytest.mark.parametrize("name", ROTATED)
def test_fast_dequant_on_block_soa_equals_vllm_order(name):
    """The fast dequant (the continuation-prefill path on CUDA; here the interpreter, polynomial
    centroids) on a block-SoA cache -- 3-bit fields through ``_planes_keys`` / ``_planes_values`` --
    writes bit for bit what it writes on the same bytes in vLLM's order read without correction, in
    the default launch and the ``v8`` / ``w32`` / split variants (which do not apply to plane fields)."""
    from tqlab.turboquant import _triton_dequant as td

    soa = _soa(name)
    blocks = _stored(soa)
    flat, flat_spec = _in_vllm_order(blocks, soa, 64)
    row = torch.randperm(12, generator=torch.Generator().manual_seed(3)).to(DEV)
    for kw in ({}, {"v8": True, "w32": True, "split": "grid"}):
        res = []
        for sp, c in ((flat_spec, flat), (soa, blocks)):
            k = torch.full((1, 2, 176, 64), 9.0, dtype=torch.float16, device=DEV)
            v = k.clone()
            td.dequant_kv(heads_view(c, sp), row, 171, k, v, sp, block_t=16, tiles_per_program=2, lut=0, **kw)
            res.append((k, v))
        (k0, v0), (k1, v1) = res
        assert not torch.equal(k1[:, :, :171], torch.full_like(k1[:, :, :171], 9.0)), kw
        assert torch.equal(k0, k1) and torch.equal(v0, v1), kw


@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc"])
def test_fast_dequant_planes_32bit_words_equal_16bit_pairs(name):
    """The fast dequant reads a block-SoA cache's nibble-plane words as aligned 32-bit loads (``p32``, the
    default where the cache is 4-byte aligned) or as pairs of 16-bit loads: the same bits either way; a
    cache 2 bytes off a 4-byte boundary takes the 16-bit reads (``stats["p32"]`` False) with the same result."""
    from tqlab.turboquant import _triton_dequant as td

    soa = _soa(name)
    blocks = _stored(soa)
    buf = torch.zeros(blocks.numel() + 2, dtype=torch.uint8, device=DEV)
    odd = buf[2:].view(blocks.shape)
    odd.copy_(blocks)
    assert blocks.data_ptr() % 4 == 0 and odd.data_ptr() % 4 == 2
    row = torch.randperm(12, generator=torch.Generator().manual_seed(3)).to(DEV)
    res = []
    for c, kw, used in ((blocks, {}, True), (blocks, {"p32": False}, False), (odd, {}, False)):
        k = torch.full((1, 2, 176, 64), 9.0, dtype=torch.float16, device=DEV)
        v = k.clone()
        st: dict = {}
        td.dequant_kv(c, row, 171, k, v, soa, block_t=16, tiles_per_program=2, lut=0, stats=st, **kw)
        assert st["p32"] is used, kw
        res.append((k, v))
    (k0, v0) = res[0]
    assert not torch.equal(k0[:, :, :171], torch.full_like(k0[:, :, :171], 9.0))
    assert torch.all(k0[:, :, 171:] == 9) and torch.all(v0[:, :, 171:] == 9)
    for k1, v1 in res[1:]:
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_fast_decode_refuses_nibble_planes():
    """``_triton_fast.decode_attention`` reads vLLM's bit stream only: a block-SoA 3-bit cache gets a
    clear error (``ops`` sends such caches to ``_triton_soa`` or, off its alignment, the portable decode)."""
    from tqlab.turboquant import _triton_fast as tf

    soa = _soa("turboquant_k3v4_nc")
    blocks = torch.zeros(kv_cache_shape(12, 2, 16, 64, soa), dtype=torch.uint8, device=DEV)
    q, bt, seq_lens, mid, out, lse = _decode(soa, blocks, "torch")
    with pytest.raises(ValueError, match="turboquant_k3v4_nc on block_soa has nibble-plane code fields"):
        tf.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, out, lse)


@pytest.mark.parametrize("name", PRESETS)
def test_decode_and_dequant_on_block_soa_equal_vllm_order(name):
    """Same K/V stored in both orders: block-SoA results = vLLM-order results to the fp16 rounding of
    the norm; k8v4 (nothing folded) and every value bit for bit.

    Why these tolerances: vLLM's order reads ``fp16(||k||) / ||c_hat||``, block-SoA ``fp16(||k|| /
    ||c_hat||)``; each is within 2**-11 (half an fp16 ulp) of the exact ratio, so a key's scale and each
    score ``s_t`` differ by a factor within ``1 +- 2**-10`` (+ fp32 noise).  Dequantized keys (fp16,
    rounded once more on each side): ``|k1 - k0| <= 2**-9 |k0|``, + 1e-5 absolute for the fp32 rounding
    of the inverse rotation where an element cancels to ~0 (the two paths divide before / after it).
    Decode: ``d lse / d s_t = p_t`` and ``d o / d s_t = p_t (v_t - o)``, so ``|lse1 - lse0| <= max|ds|``
    and ``|o1 - o0| <= max|ds| * (max v - min v)`` with ``max|ds| <= 2**-10 max|s|``."""
    spec, soa, d = TQ_PRESETS[name], _soa(name), 64
    cache, blocks = _stored(spec), _stored(soa)
    backends = ("torch",) if DEV.type == "cuda" else ("torch", "triton")
    for backend in backends:
        q, bt, seq_lens, _, o0, l0 = _decode(spec, cache, backend)
        *_, o1, l1 = _decode(soa, blocks, backend)
        (k0, v0), (k1, v1) = _dequant(spec, cache, backend), _dequant(soa, blocks, backend)
        assert torch.equal(v0, v1), backend
        if not spec.norm_correction:
            assert torch.equal(o0, o1) and torch.equal(l0, l1) and torch.equal(k0, k1), backend
            continue
        assert not torch.equal(k0, k1), backend  # the fold changes the norm's rounding
        assert torch.allclose(k1.float(), k0.float(), rtol=2**-9 * 1.001, atol=1e-5), backend
        s_max, v_rng = 0.0, 0.0
        for i, n in enumerate(seq_lens.tolist()):  # the reference's scores and values of each request
            if n:
                kk, vv = decode_slots(to_slot_order(cache[bt[i, : -(-n // 16)].long()], spec, d), spec, d)
                kk, vv = kk.permute(1, 0, 2, 3).reshape(2, -1, d)[:, :n], vv.permute(1, 0, 2, 3).reshape(2, -1, d)[:, :n]
                sc = torch.einsum("gqd,gnd->gqn", q[i].float().view(2, 4, d), kk) * d**-0.5
                s_max, v_rng = max(s_max, sc.abs().max().item()), max(v_rng, (vv.amax(1) - vv.amin(1)).max().item())
        ds = 2**-10 * 1.001 * s_max + 1e-5
        assert (l1[1:] - l0[1:]).abs().max() <= ds and torch.isinf(l1[0]).all(), backend
        assert (o1 - o0).abs().max() <= ds * v_rng + 1e-5, backend


def _poisoned(o0, l0):
    """NaN-filled ``(mid_out, output, lse)`` for a decode of :func:`_decode`'s shapes: an element a kernel
    does not write stays NaN."""
    return (torch.full((3, 8, 4, 65), float("nan"), device=DEV), torch.full_like(o0, float("nan")),
            torch.full_like(l0, float("nan")))


def _assert_like_reference(o0, l0, o1, l1):
    """Every element written; output and lse = the torch reference's to 2e-3; the empty request's lse -inf."""
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.allclose(o0, o1, atol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=2e-3)


@pytest.mark.parametrize("x32,gp_min", [(False, 16), (True, 16), (True, 1)])
@pytest.mark.parametrize("name", ROTATED)
def test_soa_decode_kernels_match_reference(name, x32, gp_min):
    """The SoA decode kernels (``_triton_soa``; the polynomial centroids under the interpreter) on a
    block-SoA cache (folded norms) against the torch reference on the same cache: empty request,
    fewer tokens than splits, several tiles, shuffled blocks, GQA 4 (query tile padded to 16 rows, or
    ``gp_min`` 1: the group's own 4); every output element written (NaN-poisoned before).
    ``x32=False`` (``_decode_soa_kernel``, vLLM's bit stream only) refuses the 3-bit presets'
    nibble-plane fields with a clear error."""
    from tqlab.turboquant import _triton_soa as ts

    soa = _soa(name)
    blocks = _stored(soa)
    q, bt, seq_lens, _, o0, l0 = _decode(soa, blocks, "torch")
    mid, o1, l1 = _poisoned(o0, l0)
    if not x32 and soa.key_bits == 3:  # the 16-codes-per-thread prototype reads vLLM's bit stream only
        with pytest.raises(ValueError, match="nibble planes"):
            ts.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, x32=x32)
        assert torch.isnan(o1).all() and torch.isnan(mid).all()  # refused before any launch
        return
    ts.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, x32=x32, gp_min=gp_min)
    _assert_like_reference(o0, l0, o1, l1)


@pytest.mark.parametrize("hq", [2, 4, 16])
def test_soa_decode_query_tile_rows_per_group(hq):
    """GQA 1, 2 and 8 (cache Hk 2) with the default ``gp_min`` (``launch.SOA_DEFAULTS``): the query tile has
    ``query_tile_rows(group, gp_min)`` rows (4, 4, 8: Triton pads the MMA below 16) and the decode still
    matches the torch reference, every element written."""
    from tqlab.turboquant import _triton_kernels as tk
    from tqlab.turboquant import _triton_soa as ts
    from tqlab.turboquant.launch import SOA_DEFAULTS

    gp_min = SOA_DEFAULTS["soa_decode"]["gp_min"]
    assert [tk.query_tile_rows(g, gp_min) for g in (1, 2, 4, 8)] == [4, 4, 4, 8]
    soa = _soa("turboquant_3bit_nc")
    blocks = _stored(soa)
    q, bt, seq_lens, _, o0, l0 = _decode(soa, blocks, "torch", hq=hq)
    mid = torch.full((3, hq, 4, 65), float("nan"), device=DEV)
    o1, l1 = torch.full_like(o0, float("nan")), torch.full_like(l0, float("nan"))
    st: dict = {}
    ts.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, stats=st)
    _assert_like_reference(o0, l0, o1, l1)
    assert st["gp"] == tk.query_tile_rows(hq // 2, gp_min)  # the launch used the group's rows, not 16


def test_plane_stride_rule_and_errors():
    """``plane_stride`` = block_size * head_dim / 8 bytes (three planes fill the field), and bad arguments are
    refused with the bad value named."""
    soa = _soa("turboquant_3bit_nc")
    assert soa.plane_stride(128, 16) == 256 and 3 * soa.plane_stride(128, 16) == 16 * soa.key_index_bytes(128)
    for bad in (0, -16, 16.0, True):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            soa.plane_stride(128, bad)
    with pytest.raises(ValueError, match="head_dim"):
        soa.plane_stride(100, 16)


@pytest.mark.parametrize("gp_min", [16, 1])
def test_soa_decode_serves_fp8_keys(gp_min):
    """k8v4 (fp8 e4m3 keys, 4-bit values) on block-SoA: the 32-codes-per-thread decode reads the key
    bytes itself (interpreter: through Triton's fp8 type; GPU: ``FP8_PTX``) and matches the torch
    reference; the 16-codes prototype refuses fp8 keys; ``use_soa`` takes every preset on CUDA only."""
    from tqlab.turboquant import _triton_soa as ts

    soa = _soa("turboquant_k8v4")
    blocks = _stored(soa)
    q, bt, seq_lens, _, o0, l0 = _decode(soa, blocks, "torch")
    mid, o1, l1 = _poisoned(o0, l0)
    ts.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, gp_min=gp_min)
    _assert_like_reference(o0, l0, o1, l1)
    with pytest.raises(ValueError, match="no fp8-key path"):
        ts.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, block_t=16, x32=False)
    assert not ts.use_soa(soa, blocks.cpu(), 64)


def test_fp8_ptx_converts_bytes_in_code_order():
    """``FP8_PTX`` unpacks four little-endian words of e4m3 bytes in code order, two per cvt."""
    from tqlab.turboquant import ptx_tables as pt

    lines = [x.strip() for x in pt.FP8_PTX.splitlines()]
    assert lines.count("cvt.rn.f16x2.e4m3x2 r, l;") == 4 and lines.count("cvt.rn.f16x2.e4m3x2 r, h;") == 4
    assert lines[3:8] == ["mov.b32 {l, h}, $16;", "cvt.rn.f16x2.e4m3x2 r, l;", "mov.b32 {$0, $1}, r;",
                          "cvt.rn.f16x2.e4m3x2 r, h;", "mov.b32 {$2, $3}, r;"]
    assert lines[-2] == "mov.b32 {$14, $15}, r;"
    assert pt.FP8_ASM.value == pt.FP8_PTX


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_block_soa_equals_vllm_order(name):
    """On the GPU at the benchmark's size class (GQA 4, 4K context, block 16): store on block-SoA =
    vLLM's bytes permuted except the _nc presets' key norm, fp16(||k|| / ||c_hat||) to 1 fp16 ulp
    (the kernel's ||k|| uses the GPU's fast sqrt; >= 99.9 % bit-equal); ``ops.decode_attention`` on
    block-SoA (the Gluon decode for the rotated presets, the Triton block-SoA decode for k8v4) equals the fast kernel on
    the same bytes in vLLM's order read without correction, to fp16 rounding (the tolerance of
    ``test_gpu_fast_equals_portable``); dequant of both bit for bit; dequantized keys against the
    unfolded vLLM-order cache within the norm's fp16 rounding (2**-10), the fast kernels' fp16
    centroid norm on vLLM's order (2**-11) and the fp16 output rounding (2 x 2**-11)."""
    from tqlab.turboquant import _triton_soa as ts

    spec, soa = TQ_PRESETS[name], _soa(name)
    d, hk, hq, bs, ctx, b = 128, 8, 32, 16, 4096, 4
    nb = b * ctx // bs
    g = torch.Generator().manual_seed(21)
    n = nb * bs
    k_cpu, v_cpu, slots = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g) * 2, torch.randperm(n, generator=g)
    kv = (k_cpu.to(DEV), v_cpu.to(DEV), slots.to(DEV))
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    blocks = torch.zeros(kv_cache_shape(nb, hk, bs, d, soa), dtype=torch.uint8, device=DEV)
    store_kv(cache, *kv, spec)
    store_kv(blocks, *kv, soa)
    flat, flat_spec = _in_vllm_order(blocks, soa, d)
    rest = torch.ones(spec.slot_bytes(d), dtype=torch.bool, device=DEV)
    if spec.norm_correction:
        nrm = spec.offsets(d)["key_norm"]
        rest[nrm: nrm + 2] = False
        tok = flat.reshape(n, hk, -1)[slots.to(DEV)]  # token i's slots, (n, Hk, slot_bytes)
        got = bytes_to_fp16(tok[..., nrm: nrm + 2]).float().cpu()
        want = _folded_norm(spec, k_cpu, tok[..., : spec.key_index_bytes(d)], d).float()
        assert ((got - want).abs() <= 2**-10 * want).all() and (got == want).float().mean() >= 0.999
    assert torch.equal(flat[..., rest], cache[..., rest])
    assert ts.use_soa(soa, blocks, d)  # every preset, fp8 keys included (k8v4 path, issue 20)
    bt = torch.randperm(nb, generator=g).view(b, -1).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.float16)
    seq_lens = torch.tensor([ctx, 1, 3001, 64], device=DEV)
    res = []
    for sp, c in ((flat_spec, flat), (soa, blocks), (spec, cache)):
        mid = torch.full((b, hq, 32, d + 1), float("nan"), device=DEV)
        out = torch.full((b, hq, d), float("nan"), device=DEV, dtype=torch.float16)
        lse = torch.full((b, hq), float("nan"), device=DEV)
        decode_attention(q, c, bt, seq_lens, sp, d**-0.5, mid, out, lse)
        k = torch.full((1, hk, ctx, d), float("nan"), dtype=torch.float16, device=DEV)
        v = k.clone()
        dequant_kv(c, bt[0], ctx - 5, k, v, sp)
        res.append((out, lse, k[:, :, :ctx - 5], v[:, :, :ctx - 5]))
    (o0, l0, k0, v0), (o1, l1, k1, v1), (_, _, k2, v2) = res
    assert not torch.isnan(o1).any() and not torch.isnan(l1[1:]).any()
    assert torch.allclose(o0.float(), o1.float(), atol=1e-2, rtol=2e-3)
    assert torch.allclose(l0, l1, atol=1e-2, rtol=2e-3)
    assert torch.equal(k0, k1) and torch.equal(v0, v1) and torch.equal(v1, v2)
    assert torch.allclose(k1.float(), k2.float(), rtol=(2**-9 + 2**-11) * 1.001, atol=1e-6)


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("name", [*ROTATED, "turboquant_k8v4"])
def test_frag_decode_variants_match_reference(name, variant):
    """``benchmarks/dev_turboquant_frag.py``'s comparison kernels (0: the block-SoA decode before the key tile
    went to the MMA in registers; 1: the same with q and k in the kWidth-2 slot order) on a block-SoA cache
    (folded norms; fp8 keys for k8v4): the same cases as :func:`test_soa_decode_kernels_match_reference`,
    against the torch reference."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import dev_turboquant_frag as fr
    finally:
        sys.path.pop(0)
    soa = _soa(name)
    blocks = _stored(soa)
    q, bt, seq_lens, _, o0, l0 = _decode(soa, blocks, "torch")
    mid, o1, l1 = _poisoned(o0, l0)
    fr.decode_attention(q, blocks, bt, seq_lens, soa, 64**-0.5, mid, o1, l1, variant=variant, block_t=16)
    _assert_like_reference(o0, l0, o1, l1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc"])
def test_gpu_planes_cache_off_soa_alignment_takes_the_portable_decode(name):
    """Block size 8 (fields not 16-byte aligned: ``use_soa`` False): ``ops.decode_attention`` on a block-SoA
    cache with nibble-plane fields runs the portable decode (the fast one refuses planes) and matches the
    torch reference on the same cache; the fast dequant (which reads planes) equals the torch dequant to fp16
    rounding of the centroids (keys) and bit for bit (values)."""
    from tqlab.turboquant import _triton_soa as ts

    soa, d, hk, hq, bs, nb = _soa(name), 128, 2, 8, 8, 64
    g = torch.Generator().manual_seed(31)
    n = nb * bs
    blocks = torch.zeros(kv_cache_shape(nb, hk, bs, d, soa), dtype=torch.uint8, device=DEV)
    store_kv(blocks, torch.randn(n, hk, d, generator=g).to(DEV), torch.randn(n, hk, d, generator=g).to(DEV),
             torch.randperm(n, generator=g).to(DEV), soa)
    assert not ts.use_soa(soa, blocks, d)
    bt = torch.randperm(nb, generator=g).view(2, -1).to(torch.int32).to(DEV)
    q = torch.randn(2, hq, d, generator=g).to(DEV, torch.float16)
    seq_lens = torch.tensor([n // 2, 77], device=DEV)
    res = []
    for backend in ("torch", "auto"):
        mid = torch.full((2, hq, 8, d + 1), float("nan"), device=DEV)
        out = torch.full((2, hq, d), float("nan"), device=DEV, dtype=torch.float16)
        lse = torch.full((2, hq), float("nan"), device=DEV)
        decode_attention(q, blocks, bt, seq_lens, soa, d**-0.5, mid, out, lse, backend=backend)
        k = torch.full((1, hk, n // 2, d), float("nan"), dtype=torch.float16, device=DEV)
        v = k.clone()
        dequant_kv(blocks, bt[0], n // 2 - 3, k, v, soa, backend=backend)
        res.append((out, lse, k[:, :, : n // 2 - 3], v[:, :, : n // 2 - 3]))
    (o0, l0, k0, v0), (o1, l1, k1, v1) = res
    assert not torch.isnan(o1).any() and torch.allclose(o0.float(), o1.float(), atol=1e-2, rtol=2e-3)
    assert torch.allclose(l0, l1, atol=1e-2, rtol=2e-3)
    assert torch.equal(v0, v1) and torch.allclose(k0.float(), k1.float(), atol=4e-3, rtol=2e-3)
