"""Fast decode kernels for the TurboQuant cache (issue 20), same slot layout as :mod:`._triton_kernels`
(whose portable kernels stay the reference): :func:`decode_attention`, its split kernel
``_decode_fast_kernel`` and the staged experiment ``_decode_staged_kernel``.

Split by concern (the kernels compile to the same SASS as before the split): the fast dequant
(``dequant_kv``, ``_dequant_fast_kernel``, ``codes_even``, ``dequant_w32_default``, ``DEQUANT_SPLITS``)
is in ``_triton_dequant``; the 16-codes-per-thread unpacking both share (``_group_words``, ``_codes``,
``_centroids16``, ``_values4``, ``_tree16``, ``_planes16``, ``_plane_code``) in ``_triton_unpack``; the PTX
tables (``lut_asm``, ``lut_group_asm``, ``planes_asm``, ``planes_key_asm``, ``VALUE4_PTX``, ``PLANES_*``)
and which one a launch uses (``_lut_mode``, ``_asm_for``, ``use_lut``, ``tk_interpret``) in ``ptx_tables``.

What the fast decode and dequant do differently from the portable kernels (see ``benchmarks/NOTES_turboquant.md``):

* **Lanes along D.**  A tile is ``[BLOCK_T tokens, D]``; a thread holds one *group* of 16
  consecutive codes of one token (``BITS`` 16-bit words, loaded once), eight lanes share a token
  (D = 128), so one warp load reads the contiguous field bytes of four tokens instead of one
  word of 32 tokens 102 bytes apart.  Codes are cut out of 32-bit windows of neighbouring words
  and assembled with ``tl.join`` (the new axis stays in the thread), so a thread's 16 dims are
  contiguous in registers: operand staging for the MMAs is wide, sums over D are 16 in-thread
  adds and 3 shuffles.  Head dims stay in their natural order (no permutation of q or output).
* **Exact centroid table lookup** (``LUT``): on the GPU a byte-permute (``prmt``) table of the
  fp16 centroids (low bytes and high bytes, two ``prmt`` per 4 codes, two more to interleave),
  through ``tl.inline_asm_elementwise``; the interpreter (no PTX) uses the exact odd polynomial
  of the portable kernel, rounded to fp16 the same way.
* **Norm correction by an MMA**: ``||y_hat||^2`` of every token is ``ones @ (y_hat * y_hat)^T``
  on the tensor cores, in the score tile's own layout (fp16 squares, fp32 sums).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant._triton_unpack import _centroids16, _codes, _group_words, _values4
from tqlab.turboquant.ptx_tables import _asm_for, _lut_mode, tk_interpret
from tqlab.turboquant.spec import TurboQuantSpec


# ----------------------------------------------------------------------------- decode
@triton.jit
def _tile_loads(cache16_ptr, kb16, nb16, vb16, sb16, zb16, ok, D: tl.constexpr, KB: tl.constexpr, VBITS: tl.constexpr):
    """Every word a decode tile needs (word addresses of ``_triton_kernels._field_bases``), as the
    32-bit windows of :func:`_group_words` (keys, values) and fp32 key norm, value scale and zero;
    masked-out tokens read as zeros."""
    kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _group_words(cache16_ptr, kb16, ok, 0, KB, D)
    kn = tl.load(cache16_ptr + nb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _group_words(cache16_ptr, vb16, ok, 0, VBITS, D)
    vs = tl.load(cache16_ptr + sb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vz = tl.load(cache16_ptr + zb16, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    return kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz


@triton.jit
def _fast_tile(q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
               in_seq, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
               D: tl.constexpr, T: tl.constexpr, KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
               NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr, NORM_MMA: tl.constexpr):
    """One online-softmax step over a tile of T tokens; keys and values as ``[T, D]`` fp16.
    ``NORM_CORR`` = ``TurboQuantSpec.norm_correction_on_read`` (False on a folded block-SoA cache)."""
    if KEY_FP8:
        kb = _codes(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, 8, D, T)
        k16 = kb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        sc = tl.dot(q, tl.trans(k16)) * qk_scale
    else:
        k16 = _centroids16(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, c0, c1, c2, c3, c4, c5, c6, c7,
                           KBITS, D, T, LUT, LUT_ASM)
        sc = tl.dot(q, tl.trans(k16))
        if NORM_CORR:
            if NORM_MMA:  # ||y_hat||^2 per token, every row of the [GP, T] tile, by an MMA against ones
                n2 = tl.dot(ones, tl.trans(k16 * k16))
                sc = sc * (kn * qk_scale)[None, :] * tl.where(n2 > 0, tl.rsqrt(n2), 1.0)
            else:  # 16 in-thread products per row, then 3 shuffles
                y32 = k16.to(tl.float32)
                n2 = tl.sum(y32 * y32, axis=1)
                sc = sc * (kn * qk_scale * tl.where(n2 > 0, tl.rsqrt(n2), 1.0))[None, :]
        else:
            sc = sc * (kn * qk_scale)[None, :]
    m_new, alpha, p, l_i = tk._online_step(sc, in_seq, m_i, l_i)
    if VBITS == 4 and LUT == 2:
        v16 = _values4(vw0, vw2, D, T)  # exact integer codes, PTX
    else:
        vc = _codes(vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, VBITS, D, T, 0x6400)
        v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0  # exact integer codes
    acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), v16)
    acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
    return m_new, l_i, acc, acc_z


@triton.jit
def _fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb, stride_qh, inv_sqrt_d,
                   GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, KEY_FP8: tl.constexpr):
    """What every fast decode program starts with: its GQA group's heads and row mask, the split's
    ``[start, end)``, the fp16 query tile ``[GP, D]`` in natural head-dim order (rotated keys:
    ``q' = (q @ H) / sqrt(D)``, so keys are never rotated back), a ones tile, and ``arange(D)``."""
    cols = tl.arange(0, D)
    heads, gmask, q_rows = tk._group_rows(q_ptr, b, hk, stride_qb, stride_qh, GROUP, GP)
    start, end = tk._split_range(sl_ptr, b, s, num_splits)
    q = tl.load(q_rows[:, None] + cols[None, :], mask=gmask[:, None], other=0.0).to(tl.float32)
    if not KEY_FP8:
        q = tk._fwht(q, GP, D) * inv_sqrt_d
    return heads, gmask, start, end, q.to(tl.float16), tl.full([GP, D], 1.0, dtype=tl.float16), cols


@triton.jit
def _decode_fast_kernel(
    q_ptr, cache16_ptr, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb, stride_ch, stride_ct, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    PREFETCH: tl.constexpr, NORM_MMA: tl.constexpr,
):
    """One program = one (request, KV head, split), the whole GQA group against each slot;
    with PREFETCH the packed words of tile i+1 are loaded before tile i is computed."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    KB: tl.constexpr = 8 if KEY_FP8 else KBITS
    heads, gmask, start, end, q, ones, cols = _fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb, stride_qh,
                                                             inv_sqrt_d, GROUP, GP, D, KEY_FP8)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    if PREFETCH:
        t = start + tl.arange(0, BLOCK_T)
        fk, fn, fv, fs, fz, ok = tk._field_bases(bt_row, t, t < end, BLOCK_SIZE, num_blocks, hk, stride_cb, stride_ch, stride_ct,
                                                 KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz = _tile_loads(
            cache16_ptr, fk, fn, fv, fs, fz, ok, D, KB, VBITS)
        for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
            tn = t0 + BLOCK_T + tl.arange(0, BLOCK_T)
            fk, fn, fv, fs, fz, ok_n = tk._field_bases(bt_row, tn, tn < end, BLOCK_SIZE, num_blocks, hk, stride_cb,
                                                       stride_ch, stride_ct, KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
            nxt = _tile_loads(cache16_ptr, fk, fn, fv, fs, fz, ok_n, D, KB, VBITS)
            m_i, l_i, acc, acc_z = _fast_tile(
                q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
                (t0 + tl.arange(0, BLOCK_T)) < end, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
                D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, LUT, LUT_ASM, NORM_MMA)
            kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz = nxt
    else:
        for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
            t = t0 + tl.arange(0, BLOCK_T)
            in_seq = t < end
            fk, fn, fv, fs, fz, ok = tk._field_bases(bt_row, t, in_seq, BLOCK_SIZE, num_blocks, hk, stride_cb, stride_ch, stride_ct,
                                                     KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
            kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz = _tile_loads(
                cache16_ptr, fk, fn, fv, fs, fz, ok, D, KB, VBITS)
            m_i, l_i, acc, acc_z = _fast_tile(
                q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
                in_seq, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
                D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, LUT, LUT_ASM, NORM_MMA)

    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


# ----------------------------------------------------------------------------- staged decode
@triton.jit
def _g(flat, idx, T: tl.constexpr, NG: tl.constexpr):
    """``flat[idx]`` for an int32 index tensor ``[T, NG]`` (Triton stages ``flat`` through shared
    memory: one ``LDS`` per element)."""
    return tl.reshape(tl.gather(flat, tl.reshape(idx, (T * NG,)), 0), (T, NG))


@triton.jit
def _fun(a, b):
    """The 32-bit window over the high half of ``a`` and the low half of ``b``."""
    return ((a >> 16) & 0xFFFF) | (b << 16)


@triton.jit
def _staged_windows(flat, a, par, BITS: tl.constexpr, T: tl.constexpr, NG: tl.constexpr):
    """The windows of :func:`_group_words` from the staged block: ``a`` = int32 index of each
    group's first word (``[T, NG]``), ``par`` = that word is the high half."""
    a0 = _g(flat, a, T, NG)
    a1 = _g(flat, a + 1, T, NG)
    f0 = a0
    f1 = _fun(a0, a1)
    f2 = a1
    f3 = a1
    f4 = a1
    f5 = a1
    f6 = a1
    f7 = a1
    f8 = a1
    if BITS > 2:
        a2 = _g(flat, a + 2, T, NG)
        f3 = _fun(a1, a2)
        f4 = a2
    if BITS > 4:
        a3 = _g(flat, a + 3, T, NG)
        a4 = _g(flat, a + 4, T, NG)
        f5 = _fun(a2, a3)
        f6 = a3
        f7 = _fun(a3, a4)
        f8 = a4
    return (tl.where(par, f1, f0), tl.where(par, f2, f1), tl.where(par, f3, f2), tl.where(par, f4, f3),
            tl.where(par, f5, f4), tl.where(par, f6, f5), tl.where(par, f7, f6), tl.where(par, f8, f7))


@triton.jit
def _decode_staged_kernel(
    q_ptr, cache32_ptr, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb32, stride_ch32, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KNORM_W: tl.constexpr, VIDX_W: tl.constexpr, VSCALE_W: tl.constexpr, SLOT_W: tl.constexpr, BWP: tl.constexpr,
    LUT: tl.constexpr, LUT_ASM: tl.constexpr, NORM_MMA: tl.constexpr,
):
    """As :func:`_decode_fast_kernel`, but each tile is whole cache blocks: every block's
    contiguous slot bytes are read with 16-byte loads (``BLOCK_SIZE * slot_bytes`` a multiple of
    16) and staged through shared memory, from where each thread gathers its group's words."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    KB: tl.constexpr = 8 if KEY_FP8 else KBITS
    NG: tl.constexpr = D // 16
    NBLK: tl.constexpr = BLOCK_T // BLOCK_SIZE
    BW32: tl.constexpr = BLOCK_SIZE * SLOT_W // 2
    heads, gmask, start, end, q, ones, cols = _fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb, stride_qh,
                                                             inv_sqrt_d, GROUP, GP, D, KEY_FP8)

    # gather indices inside a tile of NBLK staged blocks (the same for every tile)
    tt = tl.arange(0, BLOCK_T)
    jj = tt // BLOCK_SIZE
    pw = (tt % BLOCK_SIZE) * SLOT_W  # first 16-bit word of each token's slot in its block
    gg = tl.arange(0, NG)
    wk = pw[:, None] + gg[None, :] * KB
    ak = jj[:, None] * BWP + (wk >> 1)
    park = (wk & 1) == 1
    wv = pw[:, None] + VIDX_W + gg[None, :] * VBITS
    av = jj[:, None] * BWP + (wv >> 1)
    parv = (wv & 1) == 1
    wn = pw + (0 if KEY_FP8 else KNORM_W)
    an = jj * BWP + (wn >> 1)
    parn = (wn & 1) == 1
    ws = pw + VSCALE_W
    as_ = jj * BWP + (ws >> 1)
    pars = (ws & 1) == 1
    ii = tl.arange(0, BWP)

    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    blo = start // BLOCK_SIZE
    bhi = tl.where(end > start, tl.cdiv(end, BLOCK_SIZE), blo)  # an empty split runs no tile
    for b0 in tl.range(blo, bhi, NBLK, num_stages=1):
        jb = b0 + tl.arange(0, NBLK)
        bid = tl.load(bt_row + jb, mask=jb < bhi, other=-1).to(tl.int64)
        okb = (jb < bhi) & (bid >= 0) & (bid < num_blocks)
        base = tl.multiple_of(tl.where(okb, bid, 0) * stride_cb32 + hk * stride_ch32, 4)
        src = tl.load(cache32_ptr + base[:, None] + ii[None, :], mask=okb[:, None] & (ii[None, :] < BW32), other=0)
        flat = tl.reshape(src, (NBLK * BWP,))
        t = b0 * BLOCK_SIZE + tt
        in_seq = (t >= start) & (t < end)  # a bad block id reads as zero slots (score 0, value 0)
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _staged_windows(flat, ak, park, KB, BLOCK_T, NG)
        vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _staged_windows(flat, av, parv, VBITS, BLOCK_T, NG)
        xn = tl.gather(flat, an, 0)
        kn = tl.where(parn, (xn >> 16) & 0xFFFF, xn & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        xs0 = tl.gather(flat, as_, 0)
        xs1 = tl.gather(flat, as_ + 1, 0)
        vs = tl.where(pars, (xs0 >> 16) & 0xFFFF, xs0 & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        vz = tl.where(pars, xs1 & 0xFFFF, (xs0 >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        vs = tl.where(in_seq, vs.to(tl.float32), 0.0)  # slots outside the split may hold anything
        vz = tl.where(in_seq, vz.to(tl.float32), 0.0)
        m_i, l_i, acc, acc_z = _fast_tile(
            q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
            in_seq, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
            D, BLOCK_T, KEY_FP8, KBITS, VBITS, NORM_CORR, LUT, LUT_ASM, NORM_MMA)

    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


def staged_ok(cache) -> bool:
    """The staged kernel reads a (block, head) region as int32 x 4: its slots must be contiguous (a head-major
    view, not vLLM's token-major tensor, ``ops.heads_view``) and 16-byte sized."""
    nb, hk, bs, sb = cache.shape
    return (bs * sb) % 16 == 0 and cache.stride(2) == sb and cache.stride(1) == bs * sb


def _split_args(query, cache, cache_view, cache_strides, block_tables, seq_lens, mid_out, spec, scale) -> tuple:
    """Positional arguments shared by the fast and staged split kernels, in their order (the
    cache's view and strides are the only ones that differ)."""
    d = query.shape[-1]
    return (query, cache_view, block_tables, seq_lens, mid_out, *tk._centroid_poly(spec, d),
            scale * tk._LOG2E, 1.0 / math.sqrt(d), cache.shape[0], mid_out.shape[2],
            query.stride(0), query.stride(1), *cache_strides,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))


def _split_meta(query, cache, spec, block_t: int, lut: int, staged: bool = False) -> dict:
    """Compile-time parameters shared by the fast and staged split kernels (field addresses:
    the staged kernel's slot words, vLLM's order only; the others' :func:`tk._field_addr`)."""
    hq, d = query.shape[1], query.shape[2]
    hk, bs = cache.shape[1], cache.shape[2]
    group = hq // hk
    fields = tk._field_words(spec, d) if staged else tk._field_addr(spec, d, bs)
    return dict(GROUP=group, GP=tk.query_tile_rows(group), BLOCK_SIZE=bs, D=d, BLOCK_T=block_t,
                KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read,
                **fields, LUT=lut, LUT_ASM=_asm_for(spec, d, lut))


FAST_DEFAULTS = tk.DEFAULTS  # keys "fast_decode", "fast_dequant" (launch.py)


def use_fast(spec: TurboQuantSpec, device: torch.device) -> bool:
    """The fast kernels serve the rotated (MSE-key) presets on CUDA; fp8 keys keep the portable
    kernels (measured as fast or faster, benchmarks/NOTES_turboquant.md)."""
    return torch.device(device).type == "cuda" and not spec.key_fp8 and not tk_interpret()


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     block_t: int | None = None, num_warps: int | None = None, lut: int | None = None,
                     maxnreg: int | None = None, stats: dict | None = None, prefetch: bool | None = None,
                     norm_mma: bool | None = None, staged: bool | None = None):
    """The fast split kernel, then the portable reduction (``_triton_kernels._reduce_kernel``).
    ``staged``: whole cache blocks through shared memory (:func:`_decode_staged_kernel`).

    Raises:
        ValueError: a cache with nibble-plane code fields (``TurboQuantSpec.code_order``; block-SoA
            caches of the 3-bit presets take ``_triton_soa`` or the portable decode, ``ops``)."""
    if any(tk._planes_flags(spec, query.shape[-1], cache.shape[2]).values()):
        raise ValueError(f"_triton_fast.decode_attention reads vLLM's bit stream only; {spec.name} on "
                         f"{spec.cache_layout} has nibble-plane code fields (TurboQuantSpec.code_order)")
    cfg = FAST_DEFAULTS["fast_decode"]
    block_t = block_t or cfg["block_t"]
    opts = {"num_warps": num_warps or cfg["num_warps"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    lut = _lut_mode(spec, query.device, lut, cfg)
    grid = (query.shape[0], cache.shape[1], mid_out.shape[2])
    if bool(cfg.get("staged", False) if staged is None else staged) and staged_ok(cache) and spec.cache_layout == "vllm":
        nb, hk, bs, sb = cache.shape
        args = _split_args(query, cache, cache.view(-1).view(torch.int32), (cache.stride(0) // 4, cache.stride(1) // 4),
                           block_tables, seq_lens, mid_out, spec, scale)
        kern = _decode_staged_kernel[grid](
            *args, **_split_meta(query, cache, spec, max(block_t, bs), lut, staged=True), SLOT_W=sb // 2,
            BWP=triton.next_power_of_2(bs * sb // 4), NORM_MMA=bool(cfg.get("norm_mma", True) if norm_mma is None else norm_mma),
            **opts)
    else:
        args = _split_args(query, cache, cache.view(torch.uint16), (cache.stride(0), cache.stride(1), cache.stride(2)),
                           block_tables, seq_lens, mid_out, spec, scale)
        kern = _decode_fast_kernel[grid](
            *args, **_split_meta(query, cache, spec, block_t, lut),
            PREFETCH=bool(cfg.get("prefetch", False) if prefetch is None else prefetch),
            NORM_MMA=bool(cfg.get("norm_mma", True) if norm_mma is None else norm_mma), **opts)
    tk._record(stats, kern)
    tk.reduce(mid_out, output, lse)
    return output
