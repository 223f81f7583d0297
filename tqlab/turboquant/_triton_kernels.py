"""Triton kernels for the TurboQuant cache (imported lazily by :mod:`tqlab.turboquant.ops`).

Same math, same byte layout as the torch reference in :mod:`tqlab.turboquant.quant`; the
wrappers here assume the inputs were already validated by ``ops``.  Written for Triton 3.x
(tested with the interpreter of 3.9 on CPU and 3.6 on an H200).

Tricks worth knowing:

* Every field sits at an even byte offset of an even-sized slot, so reads go through a 16-bit view
  of the cache: fp16 fields (norm, scale, zero) directly, packed indices as 16-bit words, ``bits``
  words per group of 16 indices, glued into one int64 and shifted apart.
* Centroid values come from a compare/select chain over the (symmetric) codebook, not a gather:
  a per-element gather needs a 64-bit address per element and made the decode loop spill.
* Decode never rotates keys back: ``q . (H y_hat) = (H q) . y_hat`` (``H`` symmetric), so the query is
  rotated once per program and dotted with the centroid values directly.
* ``H`` is used as its exact +-1 sign matrix in fp16 (tensor cores, no rounding) and the
  ``1/sqrt(D)`` factor is applied afterwards in fp32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .codebook import hadamard_sign_matrix, lloyd_max
from .launch import DEFAULTS as _LAUNCH_DEFAULTS
from .spec import TurboQuantSpec

_CONSTS: dict = {}

# Launch configuration of the two hot kernels: see launch.py (the benchmark's sweep may override).
DEFAULTS = _LAUNCH_DEFAULTS


def _launch_opts(kind: str, **override) -> tuple[int, dict]:
    cfg = {**DEFAULTS[kind], **{k: v for k, v in override.items() if v is not None}}
    opts = {"num_warps": cfg["num_warps"]}
    if cfg.get("num_stages") is not None:
        opts["num_stages"] = cfg["num_stages"]
    if cfg.get("maxnreg") is not None:
        opts["maxnreg"] = cfg["maxnreg"]
    return cfg["block_t"], opts


def _record(stats, kernel) -> None:
    """Copy register / spill counts of a launched kernel into ``stats`` (GPU only)."""
    if stats is None or kernel is None:
        return
    for attr in ("n_regs", "n_spills"):
        if hasattr(kernel, attr):
            stats[attr] = getattr(kernel, attr)
    meta = getattr(kernel, "metadata", None)
    if meta is not None and hasattr(meta, "shared"):
        stats["shared_bytes"] = meta.shared


def _consts(spec: TurboQuantSpec, d: int, device: torch.device):
    """(signs fp16 (D,D), signs fp32 (D,D), centroids f32 (2^b,), boundaries f32 (2^b,) padded with +inf)."""
    key = (spec.key_bits, d, str(device))
    if key not in _CONSTS:
        s = torch.from_numpy(hadamard_sign_matrix(d).astype("float32"))
        if spec.key_fp8:
            cent = torch.zeros(2)
            bnd = torch.full((2,), math.inf)
        else:
            cb = lloyd_max(spec.key_bits, d)
            cent = torch.tensor(cb.centroids, dtype=torch.float32)
            bnd = torch.cat([torch.tensor(cb.boundaries, dtype=torch.float32), torch.tensor([math.inf])])
        _CONSTS[key] = tuple(t.to(device) for t in (s.half(), s, cent, bnd))
    return _CONSTS[key]


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _load_codes(cache16_ptr, base, mask, OFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr):
    """Codes (int32, [ROWS, D]) of the bit-packed field at byte ``base + OFF`` of each row.

    Reads 16-bit words (every field starts at an even byte of an even-sized slot): a group of 16
    indices is ``BITS`` words, glued into one little-endian int64 and shifted apart.  ``BITS == 8``
    (fp8 keys) splits each word into its two bytes."""
    if BITS == 8:
        w = tl.arange(0, D // 2)
        v = tl.load(cache16_ptr + (base[:, None] + OFF) // 2 + w[None, :], mask=mask[:, None], other=0.0)
        v = v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        codes = tl.reshape(tl.join(v & 255, v >> 8), (ROWS, D))
    else:
        g = tl.arange(0, D // 16)
        word = tl.zeros([ROWS, D // 16], dtype=tl.int64)
        for m in tl.static_range(BITS):
            h = tl.load(cache16_ptr + (base[:, None] + OFF) // 2 + g[None, :] * BITS + m, mask=mask[:, None], other=0.0)
            h = h.to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF
            word = word | (h << (16 * m))
        sh = (tl.arange(0, 16) * BITS).to(tl.int64)
        c3 = (word[:, :, None] >> sh[None, None, :]) & ((1 << BITS) - 1)
        codes = tl.reshape(c3.to(tl.int32), (ROWS, D))
    return codes


@triton.jit
def _store_codes(cache_ptr, base, codes, mask, OFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr):
    """Bit-pack int32 codes [ROWS, D] into the field at byte ``base + OFF`` of each row."""
    if BITS == 8:
        cols = tl.arange(0, D)
        tl.store(cache_ptr + base[:, None] + OFF + cols[None, :], codes.to(tl.uint8), mask=mask[:, None])
    else:
        c3 = tl.reshape(codes.to(tl.int64), (ROWS, D // 8, 8))
        sh = (tl.arange(0, 8) * BITS).to(tl.int64)
        word = tl.sum(c3 << sh[None, None, :], axis=2)  # disjoint bit ranges: sum == or
        g = tl.arange(0, D // 8)
        for m in tl.static_range(BITS):
            byte = ((word >> (8 * m)) & 255).to(tl.uint8)
            tl.store(cache_ptr + base[:, None] + OFF + g[None, :] * BITS + m, byte, mask=mask[:, None])


@triton.jit
def _fp8_e4m3_bits(x):
    """float32 -> float8_e4m3fn bits (uint8), round-to-nearest-even, saturating at +-448.

    Done with integer arithmetic so that the Triton interpreter (whose fp8 cast loses the carry
    into the exponent) and the GPU give exactly torch's bytes."""
    a = tl.minimum(tl.abs(x), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    # normal range (a >= 2**-6): keep 3 mantissa bits of fp32's 23, round half to even
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) >> 20) - ((127 - 7) << 3)
    # subnormal range: units of 2**-9, exact in fp32, round half to even by hand
    s = a * 512.0
    fl = tl.floor(s)
    fr = s - fl
    fli = fl.to(tl.int32)
    up = (fr > 0.5) | ((fr == 0.5) & ((fli & 1) == 1))
    sub = fli + up.to(tl.int32)
    code = tl.where(a >= 0.015625, normal, sub)
    code = code | tl.where(x.to(tl.int32, bitcast=True) < 0, 128, 0)  # sign bit, -0.0 too
    return code.to(tl.uint8)


@triton.jit
def _centroid(codes, cent_ptr, BITS: tl.constexpr):
    """Lloyd-Max centroid value (float32) of int32 codes, without a per-element memory gather.

    The codebook is symmetric, ``c[i] = -c[N-1-i]``: the top bit of the code is the sign and the
    magnitude is one of the N/2 positive centroids, chosen with a short compare/select chain over
    scalars (a [rows, D] gather would need a 64-bit address per element: register spills)."""
    HALF: tl.constexpr = 1 << (BITS - 1)
    neg = codes < HALF
    j = tl.where(neg, (HALF - 1) - codes, codes - HALF)
    mag = tl.zeros(codes.shape, dtype=tl.float32) + tl.load(cent_ptr + HALF)
    for i in tl.static_range(1, HALF):
        mag = tl.where(j >= i, tl.load(cent_ptr + HALF + i), mag)
    return tl.where(neg, -mag, mag)


# ----------------------------------------------------------------------------- store
@triton.jit
def _store_kernel(
    key_ptr, val_ptr, slot_ptr, cache_ptr, cache16_ptr, signs_ptr, bnd_ptr,
    N, num_slots, block_size,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_cb, stride_ch, stride_ct,
    inv_sqrt_d,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
    KNORM_OFF: tl.constexpr, VIDX_OFF: tl.constexpr, VSCALE_OFF: tl.constexpr,
):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    slot = tl.load(slot_ptr + rows, mask=rows < N, other=-1).to(tl.int64)
    ok = (rows < N) & (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    base = (slot // block_size) * stride_cb + h * stride_ch + (slot % block_size) * stride_ct  # bytes, int64
    rows64 = rows.to(tl.int64)

    # ---- keys
    x = tl.load(key_ptr + rows64[:, None] * stride_kn + h * stride_kh + cols[None, :], mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)
    if KEY_FP8:
        tl.store(cache_ptr + base[:, None] + cols[None, :], _fp8_e4m3_bits(x), mask=ok[:, None])
    else:
        nrm = tl.sqrt(tl.sum(x * x, axis=1))
        u = x / tl.where(nrm > 0, nrm, 1.0)[:, None]
        signs = tl.load(signs_ptr + cols[:, None] * D + cols[None, :])
        y = tl.dot(u, signs, input_precision="ieee") * inv_sqrt_d
        idx = tl.zeros([BLOCK_N, D], dtype=tl.int32)
        for i in tl.static_range((1 << KBITS) - 1):
            idx += (y > tl.load(bnd_ptr + i)).to(tl.int32)
        _store_codes(cache_ptr, base, idx, ok, 0, KBITS, D, BLOCK_N)
        tl.store(cache16_ptr + (base + KNORM_OFF) // 2, tl.minimum(nrm, 65504.0).to(tl.float16), mask=ok)

    # ---- values
    v = tl.load(val_ptr + rows64[:, None] * stride_vn + h * stride_vh + cols[None, :], mask=ok[:, None], other=0.0)
    v = v.to(tl.float32)
    levels = (1 << VBITS) - 1
    vmin = tl.min(v, axis=1)
    vmax = tl.max(v, axis=1)
    scale = tl.minimum((vmax - vmin) / levels, 65504.0).to(tl.float16)
    zero = tl.minimum(tl.maximum(vmin, -65504.0), 65504.0).to(tl.float16)
    sf = scale.to(tl.float32)
    zf = zero.to(tl.float32)
    safe = tl.where(sf > 0, sf, 1.0)
    q = tl.floor((v - zf[:, None]) / safe[:, None] + 0.5)
    q = tl.where(sf[:, None] > 0, q, 0.0)
    q = tl.minimum(tl.maximum(q, 0.0), levels).to(tl.int32)
    _store_codes(cache_ptr, base, q, ok, VIDX_OFF, VBITS, D, BLOCK_N)
    tl.store(cache16_ptr + (base + VSCALE_OFF) // 2, scale, mask=ok)
    tl.store(cache16_ptr + (base + VSCALE_OFF + 2) // 2, zero, mask=ok)


def store_kv(cache, key, value, slot_mapping, spec: TurboQuantSpec, block_n: int = 16, num_warps: int = 4):
    n, hk, d = key.shape
    nb, _, bs, sb = cache.shape
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    signs16, signs32, _, bnd = _consts(spec, d, cache.device)
    off = spec.offsets(d)
    grid = (triton.cdiv(n, block_n), hk)
    _store_kernel[grid](
        key, value, slot_mapping, cache, cache.view(torch.float16), signs32, bnd,
        n, nb * bs, bs,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        1.0 / math.sqrt(d),
        D=d, BLOCK_N=block_n,
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits,
        KNORM_OFF=max(off["key_norm"], 0), VIDX_OFF=off["val_idx"], VSCALE_OFF=off["val_scale"],
        num_warps=num_warps,
    )


# ----------------------------------------------------------------------------- token tile load
@triton.jit
def _load_kv_tile(
    cache_ptr, cache16_ptr, base, tok_ok, cent_ptr,
    D: tl.constexpr, ROWS: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KNORM_OFF: tl.constexpr, VIDX_OFF: tl.constexpr, VSCALE_OFF: tl.constexpr,
):
    """For ROWS token slots: (key operand fp16 [ROWS, D], per-token key factor f32 [ROWS],
    values fp16 [ROWS, D]).  MSE keys: operand = centroid values (rotated domain) and
    factor = norm / ||y_hat|| (norm correction) or norm; fp8 keys: operand = key, factor = 1."""
    if KEY_FP8:
        kb = _load_codes(cache16_ptr, base, tok_ok, 0, 8, D, ROWS)
        kop = kb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        kfac = tl.full([ROWS], 1.0, dtype=tl.float32)
    else:
        kc = _load_codes(cache16_ptr, base, tok_ok, 0, KBITS, D, ROWS)
        yh = _centroid(kc, cent_ptr, KBITS)
        nrm = tl.load(cache16_ptr + (base + KNORM_OFF) // 2, mask=tok_ok, other=0.0).to(tl.float32)
        if NORM_CORR:
            yn = tl.sqrt(tl.sum(yh * yh, axis=1))
            kfac = nrm / tl.where(yn > 0, yn, 1.0)
        else:
            kfac = nrm
        kop = yh.to(tl.float16)
    vc = _load_codes(cache16_ptr, base, tok_ok, VIDX_OFF, VBITS, D, ROWS)
    vs = tl.load(cache16_ptr + (base + VSCALE_OFF) // 2, mask=tok_ok, other=0.0).to(tl.float32)
    vz = tl.load(cache16_ptr + (base + VSCALE_OFF + 2) // 2, mask=tok_ok, other=0.0).to(tl.float32)
    vv = (vz[:, None] + vs[:, None] * vc.to(tl.float32)).to(tl.float16)
    return kop, kfac, vv


# ----------------------------------------------------------------------------- dequant
@triton.jit
def _dequant_kernel(
    cache_ptr, cache16_ptr, bt_ptr, k_ptr, v_ptr, signs_ptr, cent_ptr,
    cached_len, block_size, num_blocks,
    stride_cb, stride_ch, stride_ct,
    stride_kh, stride_kt, stride_vh, stride_vt,
    inv_sqrt_d,
    D: tl.constexpr, BLOCK_T: tl.constexpr, DC: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KNORM_OFF: tl.constexpr, VIDX_OFF: tl.constexpr, VSCALE_OFF: tl.constexpr,
):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    in_len = t < cached_len
    blk = tl.load(bt_ptr + t // block_size, mask=in_len, other=-1).to(tl.int64)
    ok = in_len & (blk >= 0) & (blk < num_blocks)
    blk = tl.where(ok, blk, 0)
    base = blk * stride_cb + h * stride_ch + (t % block_size).to(tl.int64) * stride_ct
    kop, kfac, vv = _load_kv_tile(
        cache_ptr, cache16_ptr, base, ok, cent_ptr, D, BLOCK_T,
        KEY_FP8, KBITS, VBITS, NORM_CORR, KNORM_OFF, VIDX_OFF, VSCALE_OFF,
    )
    t64 = t.to(tl.int64)
    cols = tl.arange(0, D)
    tl.store(v_ptr + h * stride_vh + t64[:, None] * stride_vt + cols[None, :], vv, mask=in_len[:, None])
    if KEY_FP8:
        tl.store(k_ptr + h * stride_kh + t64[:, None] * stride_kt + cols[None, :], kop, mask=in_len[:, None])
    else:
        fac = kfac * inv_sqrt_d
        rows = tl.arange(0, D)
        for c in tl.static_range(D // DC):
            cc = c * DC + tl.arange(0, DC)
            sg = tl.load(signs_ptr + rows[:, None] * D + cc[None, :])  # fp16 +-1, exact
            kc = tl.dot(kop, sg) * fac[:, None]
            tl.store(k_ptr + h * stride_kh + t64[:, None] * stride_kt + cc[None, :], kc.to(tl.float16), mask=in_len[:, None])


def dequant_kv(cache, block_table_row, cached_len, k_out, v_out, spec: TurboQuantSpec,
               block_t: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
               maxnreg: int | None = None, stats: dict | None = None):
    block_t, opts = _launch_opts("dequant", block_t=block_t, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    nb, hk, bs, sb = cache.shape
    d = k_out.shape[-1]
    signs16, _, cent, _ = _consts(spec, d, cache.device)
    off = spec.offsets(d)
    grid = (triton.cdiv(cached_len, block_t), hk)
    kern = _dequant_kernel[grid](
        cache, cache.view(torch.float16), block_table_row, k_out, v_out, signs16, cent,
        cached_len, bs, nb,
        cache.stride(0), cache.stride(1), cache.stride(2),
        k_out.stride(1), k_out.stride(2), v_out.stride(1), v_out.stride(2),
        1.0 / math.sqrt(d),
        D=d, BLOCK_T=block_t, DC=min(d, 64),
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction,
        KNORM_OFF=max(off["key_norm"], 0), VIDX_OFF=off["val_idx"], VSCALE_OFF=off["val_scale"],
        **opts,
    )
    _record(stats, kern)


# ----------------------------------------------------------------------------- decode
@triton.jit
def _decode_split_kernel(
    q_ptr, cache_ptr, cache16_ptr, bt_ptr, sl_ptr, mid_ptr, signs_ptr, cent_ptr,
    sm_scale, inv_sqrt_d, block_size, num_blocks, num_splits,
    stride_qb, stride_qh,
    stride_cb, stride_ch, stride_ct,
    stride_btb,
    stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr,
    D: tl.constexpr, BLOCK_T: tl.constexpr, KC: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KNORM_OFF: tl.constexpr, VIDX_OFF: tl.constexpr, VSCALE_OFF: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    g = tl.arange(0, GP)
    gmask = g < GROUP
    heads = hk * GROUP + g
    cols = tl.arange(0, D)

    seq_len = tl.load(sl_ptr + b).to(tl.int32)
    chunk = tl.cdiv(seq_len, num_splits)
    start = tl.minimum(s * chunk, seq_len)
    end = tl.minimum(start + chunk, seq_len)

    # query tile [GP, D]; for MSE keys rotate it once: q' = (q @ signs) / sqrt(D)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads.to(tl.int64) * stride_qh
    if KEY_FP8:
        q = tl.load(q_rows[:, None] + cols[None, :], mask=gmask[:, None], other=0.0).to(tl.float16)
    else:
        qr = tl.zeros([GP, D], dtype=tl.float32)
        for c in tl.static_range(D // KC):
            kk = c * KC + tl.arange(0, KC)
            qc = tl.load(q_rows[:, None] + kk[None, :], mask=gmask[:, None], other=0.0).to(tl.float16)
            sg = tl.load(signs_ptr + kk[:, None] * D + cols[None, :])
            qr += tl.dot(qc, sg)
        q = (qr * inv_sqrt_d).to(tl.float16)

    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        in_seq = t < end
        blk = tl.load(bt_row + t // block_size, mask=in_seq, other=-1).to(tl.int64)
        ok = in_seq & (blk >= 0) & (blk < num_blocks)
        blk = tl.where(ok, blk, 0)
        base = blk * stride_cb + hk * stride_ch + (t % block_size).to(tl.int64) * stride_ct
        kop, kfac, vv = _load_kv_tile(
            cache_ptr, cache16_ptr, base, ok, cent_ptr, D, BLOCK_T,
            KEY_FP8, KBITS, VBITS, NORM_CORR, KNORM_OFF, VIDX_OFF, VSCALE_OFF,
        )
        sc = tl.dot(q, tl.trans(kop)) * (kfac * sm_scale)[None, :]  # [GP, BLOCK_T]
        sc = tl.where(in_seq[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vv)
        m_i = m_new

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    part_lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    mrow = mid_ptr + b.to(tl.int64) * stride_mb + heads.to(tl.int64) * stride_mh + s.to(tl.int64) * stride_ms
    tl.store(mrow[:, None] + cols[None, :], out, mask=gmask[:, None])
    tl.store(mrow + D, part_lse, mask=gmask)


@triton.jit
def _reduce_kernel(
    mid_ptr, out_ptr, lse_ptr, num_splits,
    stride_mb, stride_mh, stride_ms,
    stride_ob, stride_oh, stride_lb, stride_lh,
    D: tl.constexpr, SP: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SP)
    smask = sp < num_splits
    cols = tl.arange(0, D)
    row = mid_ptr + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh + sp.to(tl.int64) * stride_ms
    part_lse = tl.load(row + D, mask=smask, other=float("-inf"))
    mx = tl.max(part_lse, axis=0)
    has = mx > float("-inf")
    mx_safe = tl.where(has, mx, 0.0)
    w = tl.where(smask & (part_lse > float("-inf")), tl.exp(part_lse - mx_safe), 0.0)
    tot = tl.sum(w, axis=0)
    o = tl.load(row[:, None] + cols[None, :], mask=smask[:, None] & (w[:, None] > 0), other=0.0)
    out = tl.sum(o * w[:, None], axis=0) / tl.where(has, tot, 1.0)
    lse_v = tl.where(has, mx_safe + tl.log(tl.where(has, tot, 1.0)), float("-inf"))
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + cols, out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, lse_v)


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     block_t: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                     maxnreg: int | None = None, stats: dict | None = None):
    block_t, opts = _launch_opts("decode", block_t=block_t, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    bsz, hq, d = query.shape
    nb, hk, bs, sb = cache.shape
    group = hq // hk
    s_splits = mid_out.shape[2]
    signs16, _, cent, _ = _consts(spec, d, cache.device)
    off = spec.offsets(d)
    kern = _decode_split_kernel[(bsz, hk, s_splits)](
        query, cache, cache.view(torch.float16), block_tables, seq_lens, mid_out, signs16, cent,
        scale, 1.0 / math.sqrt(d), bs, nb, s_splits,
        query.stride(0), query.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        block_tables.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        GROUP=group, GP=max(16, triton.next_power_of_2(group)),
        D=d, BLOCK_T=block_t, KC=min(d, 32),
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction,
        KNORM_OFF=max(off["key_norm"], 0), VIDX_OFF=off["val_idx"], VSCALE_OFF=off["val_scale"],
        **opts,
    )
    _record(stats, kern)
    _reduce_kernel[(bsz, hq)](
        mid_out, output, lse, s_splits,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
        D=d, SP=max(2, triton.next_power_of_2(s_splits)),
    )
    return output
