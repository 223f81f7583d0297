"""Triton kernels for the TurboQuant cache (imported lazily by :mod:`tqlab.turboquant.ops`).

Same math, same byte layout as the torch reference in :mod:`tqlab.turboquant.quant`; the
wrappers here assume the inputs were already validated by ``ops``.  Written for Triton 3.x
(tested with the interpreter of 3.9 on CPU and 3.6 on an H200).

Tricks worth knowing (decode and dequant read the same packed fields, see ``_unpack``):

* Every field sits at an even byte offset of an even-sized slot, so reads go through a 16-bit view
  of the cache; a group of codes spans 2 or 3 16-bit words, each loaded once, and codes are cut
  out of 32-bit windows ``w0 | w1 << 16`` by a shift and a mask.
* Integers become floats by magic numbers: ``bits(0x3F800000 | i << (23 - b)) = 1 + i / 2**b``
  (fp32, then one exact FMA) and ``bits(0x6400 | i) - 1024`` (fp16): the OR is fused with the
  mask, no int->float conversion unit.
* Key centroids come from an odd polynomial through the symmetric Lloyd-Max codebook
  (``_centroid_poly``), a few FMAs, instead of a per-element gather or compare/select chain.
* Norm correction on a block-SoA cache is folded into the stored norm by the store
  (``TurboQuantSpec.norm_folded``, vLLM 0.33's SoA "Opt#1"); readers take ``NORM_CORR`` from
  ``TurboQuantSpec.norm_correction_on_read``.
* Decode never rotates keys back: ``q . (H y_hat) = (H q) . y_hat`` (``H`` symmetric), so the query is
  rotated once per program and dotted with the centroid values directly.
* Decode folds the value scale/zero out of the inner product:
  ``sum_t p_t (z_t + s_t c_t) = sum_t p_t z_t + sum_t (p_t s_t) c_t``; the MMA multiplies the
  exact integer codes.
* One decode program serves the whole GQA group of a KV head, so each slot is read once.
* ``H`` is used as its exact +-1 sign matrix in fp16 (tensor cores, no rounding) and the
  ``1/sqrt(D)`` factor is applied afterwards in fp32.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import triton
import triton.language as tl

from tqlab.turboquant.codebook import hadamard, hadamard_sign_matrix, lloyd_max
from tqlab.turboquant.launch import DEFAULTS as _LAUNCH_DEFAULTS
from tqlab.turboquant.spec import TurboQuantSpec

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


_LOG2E = 1.4426950408889634


def _centroid_poly(spec: TurboQuantSpec, d: int) -> tuple[float, ...]:
    """Eight fp32 coefficients ``a_k`` (zero-padded) of the odd polynomial
    ``c(i) = y * sum_k a_k y**(2k)``, ``y = i - (2**b - 1)/2``, through the Lloyd-Max centroids
    of codes ``i = 0 .. 2**b - 1`` (``2**(b-1)`` terms: exact interpolation, solved in float64).
    fp8 keys: all zero (unused)."""
    key = ("poly", spec.key_bits, d)
    if key not in _CONSTS:
        a = np.zeros(8)
        if not spec.key_fp8:
            c = np.asarray(lloyd_max(spec.key_bits, d).centroids, dtype=np.float64)
            half = len(c) // 2
            y = np.arange(half, len(c)) - (len(c) - 1) / 2
            a[:half] = np.linalg.solve(np.vander(y * y, half, increasing=True) * y[:, None], c[half:])
        _CONSTS[key] = tuple(float(np.float32(v)) for v in a)
    return _CONSTS[key]


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _store_codes(cache_ptr, base, codes, mask, OFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                 PLANES: tl.constexpr = False):
    """Bit-pack int32 codes [ROWS, D] into the field at byte ``base + OFF`` of each row: vLLM's
    LSB-first stream, or with ``PLANES`` (3 bits, ``TurboQuantSpec.code_order``) the nibble planes."""
    if BITS == 8:
        cols = tl.arange(0, D)
        tl.store(cache_ptr + base[:, None] + OFF + cols[None, :], codes.to(tl.uint8), mask=mask[:, None])
    elif PLANES:
        _store_planes(cache_ptr, base, codes, mask, OFF, D, ROWS, PLANES)
    else:
        c3 = tl.reshape(codes.to(tl.int64), (ROWS, D // 8, 8))
        sh = (tl.arange(0, 8) * BITS).to(tl.int64)
        word = tl.sum(c3 << sh[None, None, :], axis=2)  # disjoint bit ranges: sum == or
        g = tl.arange(0, D // 8)
        for m in tl.static_range(BITS):
            byte = ((word >> (8 * m)) & 255).to(tl.uint8)
            tl.store(cache_ptr + base[:, None] + OFF + g[None, :] * BITS + m, byte, mask=mask[:, None])


@triton.jit
def _store_planes(cache_ptr, base, codes, mask, OFF: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                  PS: tl.constexpr):
    """3-bit codes [ROWS, D] as nibble planes (``quant.planes_from_codes``): code ``i = 8r + j`` of a
    32-code chunk puts its low 2 bits at bit ``4j + 2 (r % 2)`` of word ``r // 2`` (``L0``, ``L1``)
    and its high bit at bit ``4j + r`` of word 2 (``H``); word ``w`` of chunk ``c`` is stored LE at byte
    ``base + OFF + 4 c + 2 w PS`` (``PS``: the plane stride in 16-bit words, :func:`_planes_flags`)."""
    c3 = tl.reshape(codes.to(tl.int64), (ROWS, D // 32, 32))
    i = tl.arange(0, 32)
    j4 = ((i % 8) * 4).to(tl.int64)
    r = (i // 8).to(tl.int64)
    lo = (c3 & 3) << (j4 + 2 * (r % 2))[None, None, :]  # disjoint bit ranges: sum == or
    l0 = tl.sum(tl.where((i < 16)[None, None, :], lo, 0), axis=2)
    l1 = tl.sum(tl.where((i >= 16)[None, None, :], lo, 0), axis=2)
    hw = tl.sum(((c3 >> 2) & 1) << (j4 + r)[None, None, :], axis=2)
    ch = tl.arange(0, D // 32)
    ptr = cache_ptr + base[:, None] + OFF + ch[None, :] * 4
    for m in tl.static_range(4):
        tl.store(ptr + m, ((l0 >> (8 * m)) & 255).to(tl.uint8), mask=mask[:, None])
        tl.store(ptr + 2 * PS + m, ((l1 >> (8 * m)) & 255).to(tl.uint8), mask=mask[:, None])
        tl.store(ptr + 4 * PS + m, ((hw >> (8 * m)) & 255).to(tl.uint8), mask=mask[:, None])


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


# ----------------------------------------------------------------------------- store
@triton.jit
def _store_kernel(
    key_ptr, val_ptr, slot_ptr, cache_ptr, cache16_ptr, y_ptr, nrm_ptr, bnd_ptr, cent_ptr,
    N, num_slots, block_size,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_cb, stride_ch, stride_ct,
    D: tl.constexpr, NUM_HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_FOLD: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
):
    """Quantize BLOCK_N tokens of KV head ``h``; each field goes to word ``region + XO + o * XS`` of
    its (block, head) region (:func:`_field_addr`: vLLM's slot order or the block-SoA order); in vLLM's order
    (one stride for every field, ``KS == SS``) the token step is the cache's own ``stride_ct`` bytes (``Hk *
    slot`` on vLLM's token-major tensor, ``ops.heads_view``).
    ``NORM_FOLD`` (``TurboQuantSpec.norm_folded``): the norm field gets ``||k|| / ||c_hat||``,
    ``c_hat`` gathered from the fp32 centroid table ``cent_ptr``, IEEE sqrt and divide (vLLM 0.33's
    SoA ``_tq_fused_store_mse`` step 3, "Opt#1").  ``KP`` / ``VP`` (:func:`_planes_flags`): 0, or the plane
    stride of key / value codes in nibble-plane order."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    slot = tl.load(slot_ptr + rows, mask=rows < N, other=-1).to(tl.int64)
    ok = (rows < N) & (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    region16 = ((slot // block_size) * stride_cb + h * stride_ch) // 2  # 16-bit words, int64
    o = slot % block_size
    if KS == SS:  # vLLM's slot order: fold the token step into the region, o * XS -> 0
        region16 += (o * stride_ct) // 2
        o = o * 0
    rows64 = rows.to(tl.int64)

    # ---- keys
    if KEY_FP8:
        x = tl.load(key_ptr + rows64[:, None] * stride_kn + h * stride_kh + cols[None, :], mask=ok[:, None], other=0.0)
        x = x.to(tl.float32)
        tl.store(cache_ptr + 2 * (region16 + o * KS + KO)[:, None] + cols[None, :], _fp8_e4m3_bits(x), mask=ok[:, None])
    else:
        # ||k|| and y = (k / (||k|| + 1e-8)) @ H come from torch (store_kv), the very operations vLLM 0.33's
        # triton_turboquant_store runs before its kernel: the same floats, so the same cells and norm bytes
        yrow = (rows64 * NUM_HEADS + h) * D
        nrm = tl.load(nrm_ptr + rows64 * NUM_HEADS + h, mask=ok, other=0.0)
        y = tl.load(y_ptr + yrow[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
        idx = tl.zeros([BLOCK_N, D], dtype=tl.int32)
        for i in tl.static_range((1 << KBITS) - 1):
            idx += (y >= tl.load(bnd_ptr + i)).to(tl.int32)  # vLLM: count of midpoints <= y (torch.bucketize right=True)
        _store_codes(cache_ptr, 2 * (region16 + o * KS + KO), idx, ok, 0, KBITS, D, BLOCK_N, KP)
        if NORM_FOLD:  # ||c_hat|| > 0: an even Lloyd-Max codebook has no zero centroid
            cv = tl.load(cent_ptr + idx)
            nrm = tl.div_rn(nrm, tl.sqrt_rn(tl.sum(cv * cv, axis=1)))
        tl.store(cache16_ptr + region16 + o * NS + NO, tl.minimum(nrm, 65504.0).to(tl.float16), mask=ok)

    # ---- values
    v = tl.load(val_ptr + rows64[:, None] * stride_vn + h * stride_vh + cols[None, :], mask=ok[:, None], other=0.0)
    v = v.to(tl.float32)
    levels = (1 << VBITS) - 1
    vmin = tl.min(v, axis=1)
    vmax = tl.max(v, axis=1)
    # vLLM 0.33's _store_quantized_value: codes from the fp32 min and the fp32 scale clamped to >= 1e-8
    raw = (vmax - vmin) / levels
    raw = tl.where(raw > 1e-8, raw, 1e-8)
    scale = tl.minimum(raw, 65504.0).to(tl.float16)
    zero = tl.minimum(tl.maximum(vmin, -65504.0), 65504.0).to(tl.float16)
    q = tl.floor((v - vmin[:, None]) / raw[:, None] + 0.5)
    q = tl.minimum(tl.maximum(q, 0.0), levels).to(tl.int32)
    _store_codes(cache_ptr, 2 * (region16 + o * VS + VO), q, ok, 0, VBITS, D, BLOCK_N, VP)
    tl.store(cache16_ptr + region16 + o * SS + SO, scale, mask=ok)
    tl.store(cache16_ptr + region16 + o * ZS + ZO, zero, mask=ok)


def store_kv(cache, key, value, slot_mapping, spec: TurboQuantSpec, block_n: int = 16, num_warps: int = 4):
    """Quantize and store ``(N, Hk, D)`` keys/values into ``cache`` (the ``ops.heads_view``).  Rotated keys: the norm
    and the rotation run in torch first, as vLLM 0.33's ``triton_turboquant_store`` runs them (``k_flat.norm``, ``x_hat
    = k_flat / (norms + 1e-8)``, ``y = x_hat @ PiT`` in fp32; ``PiT`` the Hadamard of ``codebook.hadamard``, equal to
    vLLM's ``_build_hadamard``), so the kernel buckets the same floats vLLM's kernel does."""
    n, hk, d = key.shape
    nb, _, bs, sb = cache.shape
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    _, _, cent, bnd = _consts(spec, d, cache.device)
    if spec.key_fp8:
        y = nrm = torch.zeros(1, dtype=torch.float32, device=cache.device)
    else:
        k_flat = key.float().reshape(n * hk, d)
        nrm = k_flat.norm(dim=1, keepdim=True)
        y = (k_flat / (nrm + 1e-8)) @ _rotation32(d, cache.device)
        nrm = nrm.reshape(-1)
    grid = (triton.cdiv(n, block_n), hk)
    _store_kernel[grid](
        key, value, slot_mapping, cache, cache.view(torch.float16), y, nrm, bnd, cent,
        n, nb * bs, bs,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        D=d, NUM_HEADS=hk, BLOCK_N=block_n,
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_FOLD=spec.norm_folded,
        **_field_addr(spec, d, bs), **_planes_flags(spec, d, bs), num_warps=num_warps,
    )


def _rotation32(d: int, device) -> torch.Tensor:
    key = ("H32", d, str(device))
    if key not in _CONSTS:
        _CONSTS[key] = hadamard(d, torch.float32, device)
    return _CONSTS[key]


# ----------------------------------------------------------------------------- token tile load
@triton.jit
def _words_t(cache16_ptr, base16, mask, WOFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr,
             PLANES: tl.constexpr = 0):
    """The packed field at 16-bit word ``base16 + WOFF`` of each token (column), as three int32
    tensors ``[NG, COLS]``: the words 0, 1, 2 of each group of codes (word 2 only for 3 bits;
    else a copy of word 1).  Groups of ``CPG`` codes span ``WPG`` 16-bit words (2 bits: 16 codes
    / 2 words, 3: 16 / 3, 4: 8 / 2, 8: 4 / 2); each word is loaded once.  ``PLANES`` (3 bits in
    nibble-plane order, ``TurboQuantSpec.code_order``; the plane stride of :func:`_planes_flags`, 0 = a bit
    stream): group ``g`` = half ``g % 2`` of chunk ``g // 2``; word 0 = its 32-bit plane word (``L0`` or
    ``L1``), word 1 = the chunk's ``H``
    shifted right by ``2 * (g % 2)`` (so code ``8r' + j`` of the group has its high bit at
    ``4j + r'``), word 2 = word 1."""
    CPG: tl.constexpr = 16 if BITS < 4 else 32 // BITS
    WPG: tl.constexpr = CPG * BITS // 16
    g = tl.arange(0, D // CPG)
    if PLANES:
        ptr = cache16_ptr + (base16[None, :] + WOFF) + ((g // 2) * 2)[:, None]
        lw = ptr + ((g % 2) * PLANES)[:, None]
        w0 = tl.load(lw, mask=mask[None, :], other=0).to(tl.int32) | (
            tl.load(lw + 1, mask=mask[None, :], other=0).to(tl.int32) << 16)
        hw = tl.load(ptr + 2 * PLANES, mask=mask[None, :], other=0).to(tl.int32) | (
            tl.load(ptr + 2 * PLANES + 1, mask=mask[None, :], other=0).to(tl.int32) << 16)
        w1 = hw >> ((g % 2) * 2)[:, None]  # arithmetic shift: only bits >= 30 see the sign, unused
        w2 = w1
    else:
        ptr = cache16_ptr + (base16[None, :] + WOFF) + g[:, None] * WPG
        w0 = tl.load(ptr, mask=mask[None, :], other=0).to(tl.int32)  # uint16 words: zero-extended
        w1 = tl.load(ptr + 1, mask=mask[None, :], other=0).to(tl.int32)
        if WPG == 3:
            w2 = tl.load(ptr + 2, mask=mask[None, :], other=0).to(tl.int32)
        else:
            w2 = w1
    return w0, w1, w2


@triton.jit
def _cut_t(w0, w1, w2, BITS: tl.constexpr, D: tl.constexpr, COLS: tl.constexpr, OR: tl.constexpr,
           NATURAL: tl.constexpr = False, LSB: tl.constexpr = 0, PLANES: tl.constexpr = False):
    """``codes | OR`` (int32 ``[D, COLS]``, one column per token) from :func:`_words_t`.

    Two neighbouring words make a 32-bit window ``u = w0 | w1 << 16``; a code is
    ``(u >> shift) & mask`` (for 3 bits, codes 10..15 of a group come from the window over words
    1 and 2), placed at bit ``LSB`` (``code << LSB``, then ``| OR``).  ``PLANES``: code ``8r' + j``
    of a group is ``(w0 >> (4j + 2r')) & 3 | ((w1 >> (4j + r')) & 1) << 2``.  Row ``r = i * NG + g``
    holds code ``g * CPG + i`` (group ``g``, position ``i``; :func:`_perm` maps rows to head dims),
    or code ``r`` with ``NATURAL``.  A thread keeps whole tokens, so sums over D stay in registers."""
    CPG: tl.constexpr = 16 if BITS < 4 else 32 // BITS
    WPG: tl.constexpr = CPG * BITS // 16
    if PLANES:
        i = tl.arange(0, CPG)
        sl = ((i % 8) * 4 + (i // 8) * 2)[:, None, None]
        sh = ((i % 8) * 4 + i // 8)[:, None, None]
        code = ((w0[None, :, :] >> sl) & 3) | (((w1[None, :, :] >> sh) & 1) << 2)
        c = (code << LSB) | OR
    else:
        pos = tl.arange(0, CPG) * BITS
        lo = w0 | (w1 << 16)
        if WPG == 3:
            hi = (pos + BITS) > 32
            src = tl.where(hi[:, None, None], (w1 | (w2 << 16))[None, :, :], lo[None, :, :])
            sh = tl.where(hi, pos - 16, pos)
        else:
            src = lo[None, :, :]
            sh = pos
        # code moved to bit LSB (a per-register constant shift, left or right), masked, OR'd
        sh = sh[:, None, None] - LSB
        src = tl.where(sh >= 0, src >> tl.maximum(sh, 0), src << tl.maximum(-sh, 0))
        c = (src & (((1 << BITS) - 1) << LSB)) | OR
    if NATURAL:
        c = tl.permute(c, (1, 0, 2))
    return tl.reshape(c, (D, COLS))


@triton.jit
def _unpack_t(cache16_ptr, base16, mask, WOFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr,
              COLS: tl.constexpr, OR: tl.constexpr, NATURAL: tl.constexpr = False, LSB: tl.constexpr = 0,
              PLANES: tl.constexpr = False):
    """:func:`_cut_t` of :func:`_words_t`: load and unpack one field of COLS tokens."""
    w0, w1, w2 = _words_t(cache16_ptr, base16, mask, WOFF, BITS, D, PLANES)
    return _cut_t(w0, w1, w2, BITS, D, COLS, OR, NATURAL, LSB, PLANES)


@triton.jit
def _perm(D: tl.constexpr, BITS: tl.constexpr):
    """Head dim held by each row of :func:`_unpack_t`'s result."""
    CPG: tl.constexpr = 16 if BITS < 4 else 32 // BITS
    NG: tl.constexpr = D // CPG
    r = tl.arange(0, D)
    return (r % NG) * CPG + r // NG


@triton.jit
def _centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, KBITS: tl.constexpr):
    """Centroid (f32) of codes given as ``x = bits(0x3F800000 | code << (23 - b)) = 1 + code / 2**b``
    (exact): ``y = code - (2**b - 1)/2 = 2**b x - (2**b + (2**b - 1)/2)`` in one exact FMA, then the
    odd interpolating polynomial of :func:`_centroid_poly`, Horner in ``y*y``."""
    NC: tl.constexpr = 1 << (KBITS - 1)
    y = x * (2.0 * NC) - (2.0 * NC + NC - 0.5)
    y2 = y * y
    p = y2 * 0.0 + (c7 if NC == 8 else (c3 if NC == 4 else c1))
    if NC == 8:
        p = p * y2 + c6
        p = p * y2 + c5
        p = p * y2 + c4
        p = p * y2 + c3
    if NC >= 4:
        p = p * y2 + c2
        p = p * y2 + c1
    p = p * y2 + c0
    return p * y


@triton.jit
def _field_bases(bt_row, t, valid, block_size: tl.constexpr, num_blocks, hk, stride_cb, stride_ch, stride_ct,
                 KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr,
                 VS: tl.constexpr, SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr):
    """16-bit word index (int64) of each token's key codes, key norm, value codes, value scale and
    value zero (``region + o * XS + XO``, :func:`_field_addr`), and whether its block id is usable.
    vLLM's order (one stride for every field) keeps the slot-base form ``(region bytes + o *
    stride_ct) // 2 + XO`` of the kernels before the block-SoA layout (same PTX as 36b4f2f)."""
    blk = tl.load(bt_row + t // block_size, mask=valid, other=-1).to(tl.int64)
    ok = valid & (blk >= 0) & (blk < num_blocks)
    blk = tl.where(ok, blk, 0)
    o = (t % block_size).to(tl.int64)
    if KS == SS:  # vLLM's slot order
        base = (blk * stride_cb + hk * stride_ch + o * stride_ct) // 2
        fk, fn, fv, fs, fz = base + KO, base + NO, base + VO, base + SO, base + ZO
    else:
        region = (blk * stride_cb + hk * stride_ch) // 2
        fk, fn, fv, fs, fz = region + o * KS + KO, region + o * NS + NO, region + o * VS + VO, region + o * SS + SO, region + o * ZS + ZO
    return fk, fn, fv, fs, fz, ok


# ----------------------------------------------------------------------------- dequant
@triton.jit
def _dequant_tile(cache16_ptr, bt_ptr, k_ptr, v_ptr, sg, t, c0, c1, c2, c3, c4, c5, c6, c7,
                  cached_len, block_size: tl.constexpr, num_blocks, h,
                  stride_cb, stride_ch, stride_ct, stride_kh, stride_kt, stride_vh, stride_vt, inv_sqrt_d,
                  D: tl.constexpr, BLOCK_T: tl.constexpr,
                  KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
                  KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr,
                  VS: tl.constexpr, SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr,
                  KP: tl.constexpr, VP: tl.constexpr):
    """Dequantize tokens ``t`` ([BLOCK_T]) of KV head ``h``; ``sg`` = the +-1 signs (fp16 [D, D]).
    ``NORM_CORR`` = ``TurboQuantSpec.norm_correction_on_read`` (False on a folded block-SoA cache)."""
    in_len = t < cached_len
    kb16, nb16, vb16, sb16, zb16, ok = _field_bases(bt_ptr, t, in_len, block_size, num_blocks, h, stride_cb, stride_ch, stride_ct,
                                                    KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
    rows = tl.arange(0, D)
    k_head = k_ptr + h.to(tl.int64) * stride_kh  # int32 offsets inside one head: L * D < 2**31
    v_head = v_ptr + h.to(tl.int64) * stride_vh
    vc = _unpack_t(cache16_ptr, vb16, ok, 0, VBITS, D, BLOCK_T, 0x6400, True, 0, VP)
    vs = tl.load(cache16_ptr + sb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vz = tl.load(cache16_ptr + zb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vv = vz[None, :] + vs[None, :] * (vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0).to(tl.float32)
    tl.store(v_head + t[None, :] * stride_vt + rows[:, None], vv.to(tl.float16), mask=in_len[None, :])
    if KEY_FP8:
        kb = _unpack_t(cache16_ptr, kb16, ok, 0, 8, D, BLOCK_T, 0, True)
        kf = kb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        tl.store(k_head + t[None, :] * stride_kt + rows[:, None], kf, mask=in_len[None, :])
    else:
        x = _unpack_t(cache16_ptr, kb16, ok, 0, KBITS, D, BLOCK_T, 0x3F800000, True, 23 - KBITS, KP).to(tl.float32,
                                                                                                     bitcast=True)
        yh = _centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, KBITS)  # [D, BLOCK_T]
        fac = tl.load(cache16_ptr + nb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        if NORM_CORR:
            yn = tl.sqrt(tl.sum(yh * yh, axis=0))
            fac = fac / tl.where(yn > 0, yn, 1.0)
        kc = tl.dot(tl.trans(yh.to(tl.float16)), sg) * (fac * inv_sqrt_d)[:, None]  # [BLOCK_T, D]
        tl.store(k_head + t[:, None] * stride_kt + rows[None, :], kc.to(tl.float16), mask=in_len[:, None])


@triton.jit
def _dequant_kernel(
    cache16_ptr, bt_ptr, k_ptr, v_ptr, signs_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    cached_len, num_blocks,
    stride_cb, stride_ch, stride_ct,
    stride_kh, stride_kt, stride_vh, stride_vt,
    inv_sqrt_d,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, TILES: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
):
    """One program = TILES tiles of BLOCK_T tokens of one KV head (the sign matrix is loaded
    once per program); a thread keeps whole tokens ([D, BLOCK_T] tiles)."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.arange(0, D)
    sg = tl.load(signs_ptr + rows[:, None] * D + rows[None, :])  # fp16 +-1, exact
    for i in tl.range(0, TILES):
        t = (pid * TILES + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        _dequant_tile(cache16_ptr, bt_ptr, k_ptr, v_ptr, sg, t, c0, c1, c2, c3, c4, c5, c6, c7,
                      cached_len, BLOCK_SIZE, num_blocks, h,
                      stride_cb, stride_ch, stride_ct, stride_kh, stride_kt, stride_vh, stride_vt, inv_sqrt_d,
                      D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS, KP, VP)


def _field_words(spec: TurboQuantSpec, d: int) -> dict:
    """16-bit word offsets of the fields inside a vLLM-order slot (every field starts at an even
    byte); the staged experiment of ``_triton_fast`` reads whole slots with them."""
    off = spec.offsets(d)
    return dict(KNORM_W=max(off["key_norm"], 0) // 2, VIDX_W=off["val_idx"] // 2, VSCALE_W=off["val_scale"] // 2)


def _planes_flags(spec: TurboQuantSpec, d: int, block_size: int) -> dict:
    """Kernel constexprs ``KP, VP``: 0 when the key / value code field is not in nibble-plane order, else
    (:meth:`TurboQuantSpec.code_order` is ``"planes"``: 3-bit fields of the block-SoA layout) the plane
    stride in 16-bit words, :meth:`TurboQuantSpec.plane_stride` / 2: word ``w`` (``L0, L1, H``) of chunk
    ``c`` of token ``o`` is at 16-bit word ``field + o * (D // 16) + 2 * c + w * KP`` (``_field_addr``
    gives the token stride ``D // 16``)."""
    return dict(_planes_items(spec, d, block_size))


@functools.lru_cache(maxsize=256)
def _planes_items(spec: TurboQuantSpec, d: int, block_size: int) -> tuple:
    """:func:`_planes_flags` as a tuple of items, computed once per (spec, head_dim, block_size): every decode
    and dequant launch asks (a frozen spec is hashable)."""
    kp = not spec.key_fp8 and spec.code_order("key_idx", d) == "planes"
    ps = spec.plane_stride(d, block_size) // 2
    return (("KP", ps if kp else 0), ("VP", ps if spec.code_order("val_idx", d) == "planes" else 0))


def _field_addr(spec: TurboQuantSpec, d: int, block_size: int) -> dict:
    """Kernel constexprs ``XO, XS``: 16-bit word offset and per-token stride of each field inside a
    (block, KV head) region (:meth:`TurboQuantSpec.field_addresses`, either layout): K = key codes
    (or fp8 keys), N = key norm (fp8 keys: none, 0/0), V = value codes, S = value scale, Z = value
    zero.  Every field of both layouts starts at an even byte and has an even stride.  A nibble-plane code
    field (``TurboQuantSpec.code_order`` ``"planes"``) gets the token stride of its plane-major words,
    ``plane_stride / block_size`` bytes = ``D / 16`` words, not ``nbytes / 2`` (:func:`_planes_flags`)."""
    return dict(_field_items(spec, d, block_size))


@functools.lru_cache(maxsize=256)
def _field_items(spec: TurboQuantSpec, d: int, block_size: int) -> tuple:
    """:func:`_field_addr` as a tuple of items, computed once per (spec, head_dim, block_size)."""
    fa = spec.field_addresses(d, block_size)
    out = {}
    for c, kind in (("K", "key_fp8" if spec.key_fp8 else "key_idx"), ("N", "key_norm"), ("V", "val_idx"),
                    ("S", "val_scale"), ("Z", "val_zero")):
        off, stride, _ = fa.get(kind, (0, 0, 0))
        if kind in ("key_idx", "val_idx") and spec.code_order(kind, d) == "planes":
            stride = spec.plane_stride(d, block_size) // block_size  # the planes' words interleave tokens
        out[c + "O"], out[c + "S"] = off // 2, stride // 2
    return tuple(out.items())


def dequant_kv(cache, block_table_row, cached_len, k_out, v_out, spec: TurboQuantSpec,
               block_t: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
               maxnreg: int | None = None, stats: dict | None = None, tiles_per_program: int | None = None):
    block_t, opts = _launch_opts("dequant", block_t=block_t, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    tiles_per_program = tiles_per_program or DEFAULTS["dequant"].get("tiles", 8)
    nb, hk, bs, sb = cache.shape
    d = k_out.shape[-1]
    signs16, _, _, _ = _consts(spec, d, cache.device)
    n_tiles = triton.cdiv(cached_len, block_t)
    tiles = max(1, min(tiles_per_program, n_tiles))
    grid = (triton.cdiv(n_tiles, tiles), hk)
    kern = _dequant_kernel[grid](
        cache.view(torch.uint16), block_table_row, k_out, v_out, signs16, *_centroid_poly(spec, d),
        cached_len, nb,
        cache.stride(0), cache.stride(1), cache.stride(2),
        k_out.stride(1), k_out.stride(2), v_out.stride(1), v_out.stride(2),
        1.0 / math.sqrt(d),
        BLOCK_SIZE=bs, D=d, BLOCK_T=block_t, TILES=tiles,
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read,
        **_field_addr(spec, d, bs), **_planes_flags(spec, d, bs), **opts,
    )
    _record(stats, kern)


# ----------------------------------------------------------------------------- decode
@triton.jit
def _fwht(x, ROWS: tl.constexpr, D: tl.constexpr):
    """``x @ H`` for the +-1 Sylvester Hadamard ``H`` (``H[k, j] = (-1)**popcount(k & j)``), f32
    ``[ROWS, D]``: log2(D) butterfly stages in registers instead of a D x D matrix product."""
    for st in tl.static_range(10):  # D <= 512 (checked by ops)
        if (1 << st) < D:
            x4 = tl.permute(tl.reshape(x, (ROWS, D // (2 << st), 2, 1 << st)), (0, 1, 3, 2))
            a, c = tl.split(x4)
            x = tl.reshape(tl.permute(tl.join(a + c, a - c), (0, 1, 3, 2)), (ROWS, D))
    return x


@triton.jit
def _key_order(x, ROWS: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """Columns of ``x`` ([ROWS, D]) in the row order of :func:`_cut_t` (column ``i * NG + g`` =
    head dim ``g * CPG + i``): a transpose of the ``[NG, CPG]`` grid."""
    CPG: tl.constexpr = 16 if BITS < 4 else 32 // BITS
    return tl.reshape(tl.permute(tl.reshape(x, (ROWS, D // CPG, CPG)), (0, 2, 1)), (ROWS, D))


@triton.jit
def _tile_words(cache16_ptr, kb16, nb16, vb16, sb16, zb16, ok, D: tl.constexpr, KB: tl.constexpr,
                VBITS: tl.constexpr, KP: tl.constexpr = 0, VP: tl.constexpr = 0):
    """Every 16-bit word a decode tile needs (word addresses of :func:`_field_bases`): key words,
    key norm (f32; fp8 keys read a dummy), value words, value scale and zero (f32); masked-out
    tokens read as zeros."""
    k0, k1, k2 = _words_t(cache16_ptr, kb16, ok, 0, KB, D, KP)
    kn = tl.load(cache16_ptr + nb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    v0, v1, v2 = _words_t(cache16_ptr, vb16, ok, 0, VBITS, D, VP)
    vs = tl.load(cache16_ptr + sb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vz = tl.load(cache16_ptr + zb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    return k0, k1, k2, kn, v0, v1, v2, vs, vz


@triton.jit
def _tile_update(q, k0, k1, k2, kn, v0, v1, v2, vs, vz, in_seq, m_i, l_i, acc, acc_z,
                 c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
                 D: tl.constexpr, BLOCK_T: tl.constexpr, KEY_FP8: tl.constexpr, KBITS: tl.constexpr,
                 VBITS: tl.constexpr, NORM_CORR: tl.constexpr, KP: tl.constexpr = 0, VP: tl.constexpr = 0):
    """One online-softmax step of a decode program over a tile of BLOCK_T tokens (columns).
    ``NORM_CORR`` = ``TurboQuantSpec.norm_correction_on_read``: divide the stored norm by ``||y_hat||``
    here, unless the store already folded it in (block-SoA ``_nc`` caches)."""
    if KEY_FP8:
        kb = _cut_t(k0, k1, k2, 8, D, BLOCK_T, 0)
        k_t = kb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        kfac = tl.full([BLOCK_T], 1.0, dtype=tl.float32)
    else:
        x = _cut_t(k0, k1, k2, KBITS, D, BLOCK_T, 0x3F800000, False, 23 - KBITS, KP).to(tl.float32, bitcast=True)
        yh = _centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, KBITS)  # [D, BLOCK_T]
        kfac = kn
        if NORM_CORR:
            yn = tl.sqrt(tl.sum(yh * yh, axis=0))
            kfac = kn / tl.where(yn > 0, yn, 1.0)
        k_t = yh.to(tl.float16)
    sc = tl.dot(q, k_t) * (kfac * qk_scale)[None, :]  # [GP, BLOCK_T], log2 units
    m_new, alpha, p, l_i = _online_step(sc, in_seq, m_i, l_i)
    vc = _cut_t(v0, v1, v2, VBITS, D, BLOCK_T, 0x6400, False, 0, VP)
    v_t = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0  # exact integer codes [D, BLOCK_T]
    acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), tl.trans(v_t))
    acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
    return m_new, l_i, acc, acc_z


@triton.jit
def _split_range(sl_ptr, b, s, num_splits):
    """``[start, end)`` tokens of split ``s`` of request ``b`` (``ops.split_bounds``: chunks of
    ``ceil(seq_len / num_splits)``, trailing splits possibly empty)."""
    seq_len = tl.load(sl_ptr + b).to(tl.int32)
    chunk = tl.cdiv(seq_len, num_splits)
    start = tl.minimum(s * chunk, seq_len)
    return start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _group_rows(q_ptr, b, hk, stride_qb, stride_qh, GROUP: tl.constexpr, GP: tl.constexpr):
    """The query heads of KV head ``hk``'s GQA group (``GP`` rows, ``GROUP`` real): head ids, the
    row mask and the rows' query pointers."""
    g = tl.arange(0, GP)
    heads = hk * GROUP + g
    return heads, g < GROUP, q_ptr + b.to(tl.int64) * stride_qb + heads.to(tl.int64) * stride_qh


@triton.jit
def _online_step(sc, in_seq, m_i, l_i):
    """One online-softmax step over a tile of scores ``sc`` [GP, T] (log2 units; columns outside the sequence
    masked by ``in_seq``): ``(m_new, alpha, p, l_new)``, the running max, the rescale of the old sums, the tile's
    probabilities and the new row sums. Shared by the portable, fast and block-SoA decodes."""
    sc = tl.where(in_seq[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(sc - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _online_init(GP: tl.constexpr, D: tl.constexpr):
    """Online-softmax state of a decode program: running max, sum, value accumulator, zero-point sum."""
    return (tl.full([GP], float("-inf"), dtype=tl.float32), tl.zeros([GP], dtype=tl.float32),
            tl.zeros([GP, D], dtype=tl.float32), tl.zeros([GP], dtype=tl.float32))


@triton.jit
def _store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, out_cols, stride_mb, stride_mh, stride_ms,
                   D: tl.constexpr):
    """Write split ``s``'s normalized partial output (columns ``out_cols`` of the accumulator's
    order) and its natural-log log-sum-exp (``-inf`` for an empty split) into ``mid_out``."""
    has = l_i > 0
    inv_l = 1.0 / tl.where(has, l_i, 1.0)
    out = (acc + acc_z[:, None]) * inv_l[:, None]
    part_lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    mrow = mid_ptr + b.to(tl.int64) * stride_mb + heads.to(tl.int64) * stride_mh + s.to(tl.int64) * stride_ms
    tl.store(mrow[:, None] + out_cols[None, :], out, mask=gmask[:, None])
    tl.store(mrow + D, part_lse, mask=gmask)


@triton.jit
def _decode_split_kernel(
    q_ptr, cache16_ptr, bt_ptr, sl_ptr, mid_ptr, signs_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh,
    stride_cb, stride_ch, stride_ct,
    stride_btb,
    stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    D: tl.constexpr, BLOCK_T: tl.constexpr, KC: tl.constexpr, NUM_STAGES: tl.constexpr, PREFETCH: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
):
    """One program = one (request, KV head, split): the whole query group (GP rows, GROUP real)
    against each packed slot, loaded once.  Scores in the log2 domain (``qk_scale`` includes
    log2(e)).  Values are folded: ``sum_t p_t (z_t + s_t c_t) = sum_t p_t z_t + (p * s) @ codes``."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    cols = tl.arange(0, D)
    heads, gmask, q_rows = _group_rows(q_ptr, b, hk, stride_qb, stride_qh, GROUP, GP)
    start, end = _split_range(sl_ptr, b, s, num_splits)

    # query tile [GP, D], columns in the key tile's row order (_perm); MSE keys: q' = (q @ H) / sqrt(D)
    KB: tl.constexpr = 8 if KEY_FP8 else KBITS
    if KEY_FP8:
        q = tl.load(q_rows[:, None] + _perm(D, KB)[None, :], mask=gmask[:, None], other=0.0).to(tl.float16)
    else:
        q = tl.load(q_rows[:, None] + cols[None, :], mask=gmask[:, None], other=0.0).to(tl.float32)
        q = _key_order(_fwht(q, GP, D) * inv_sqrt_d, GP, D, KB).to(tl.float16)

    m_i, l_i, acc, acc_z = _online_init(GP, D)  # acc columns in the value tile's row order
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    if PREFETCH:  # raw words of tile i+1 are loaded before tile i is computed
        t = start + tl.arange(0, BLOCK_T)
        fk, fn, fv, fs, fz, ok = _field_bases(bt_row, t, t < end, BLOCK_SIZE, num_blocks, hk, stride_cb, stride_ch, stride_ct,
                                              KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
        k0, k1, k2, kn, v0, v1, v2, vs, vz = _tile_words(cache16_ptr, fk, fn, fv, fs, fz, ok, D, KB, VBITS, KP, VP)
        for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
            tn = t0 + BLOCK_T + tl.arange(0, BLOCK_T)
            fk, fn, fv, fs, fz, ok_n = _field_bases(bt_row, tn, tn < end, BLOCK_SIZE, num_blocks, hk, stride_cb,
                                                    stride_ch, stride_ct, KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
            nxt = _tile_words(cache16_ptr, fk, fn, fv, fs, fz, ok_n, D, KB, VBITS, KP, VP)
            m_i, l_i, acc, acc_z = _tile_update(
                q, k0, k1, k2, kn, v0, v1, v2, vs, vz, (t0 + tl.arange(0, BLOCK_T)) < end, m_i, l_i, acc, acc_z,
                c0, c1, c2, c3, c4, c5, c6, c7, qk_scale, D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, KP, VP)
            k0, k1, k2, kn, v0, v1, v2, vs, vz = nxt
    else:
        for t0 in tl.range(start, end, BLOCK_T, num_stages=NUM_STAGES):
            t = t0 + tl.arange(0, BLOCK_T)
            in_seq = t < end
            fk, fn, fv, fs, fz, ok = _field_bases(bt_row, t, in_seq, BLOCK_SIZE, num_blocks, hk, stride_cb, stride_ch, stride_ct,
                                                  KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
            k0, k1, k2, kn, v0, v1, v2, vs, vz = _tile_words(cache16_ptr, fk, fn, fv, fs, fz, ok, D, KB, VBITS, KP, VP)
            m_i, l_i, acc, acc_z = _tile_update(
                q, k0, k1, k2, kn, v0, v1, v2, vs, vz, in_seq, m_i, l_i, acc, acc_z,
                c0, c1, c2, c3, c4, c5, c6, c7, qk_scale, D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, KP, VP)

    _store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, _perm(D, VBITS), stride_mb, stride_mh, stride_ms, D)


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
                     maxnreg: int | None = None, stats: dict | None = None, prefetch: bool | None = None):
    kind = "decode_fp8" if spec.key_fp8 else "decode"
    block_t, opts = _launch_opts(kind, block_t=block_t, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    n_stages = opts.pop("num_stages", None) or 1
    prefetch = bool(DEFAULTS[kind].get("prefetch", False) if prefetch is None else prefetch)
    bsz, hq, d = query.shape
    nb, hk, bs, sb = cache.shape
    group = hq // hk
    s_splits = mid_out.shape[2]
    signs16, _, _, _ = _consts(spec, d, cache.device)
    kern = _decode_split_kernel[(bsz, hk, s_splits)](
        query, cache.view(torch.uint16), block_tables, seq_lens, mid_out, signs16, *_centroid_poly(spec, d),
        scale * _LOG2E, 1.0 / math.sqrt(d), nb, s_splits,
        query.stride(0), query.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        block_tables.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        GROUP=group, GP=query_tile_rows(group), BLOCK_SIZE=bs,
        D=d, BLOCK_T=block_t, KC=min(d, 32), NUM_STAGES=n_stages, PREFETCH=prefetch,
        KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read,
        **_field_addr(spec, d, bs), **_planes_flags(spec, d, bs), **opts,
    )
    _record(stats, kern)
    reduce(mid_out, output, lse)
    return output


def query_tile_rows(group: int, minimum: int = 16) -> int:
    """Rows ``GP`` of a decode program's query tile: the GQA group size ``Hq // Hk`` rounded up to a power of
    two, at least ``minimum`` (16 = one m16n8k16 MMA tile; below it Triton pads the MMA itself and the
    softmax runs on the real rows only -- the block-SoA decode's ``gp_min``, ``launch.SOA_DEFAULTS``)."""
    return max(minimum, triton.next_power_of_2(group))


def reduce(mid_out, output, lse) -> None:
    """Launch :func:`_reduce_kernel`: combine the split partials of ``mid_out`` into ``output``, ``lse``."""
    bsz, hq, s_splits, d1 = mid_out.shape
    _reduce_kernel[(bsz, hq)](
        mid_out, output, lse, s_splits,
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
        D=d1 - 1, SP=max(2, triton.next_power_of_2(s_splits)),
    )
