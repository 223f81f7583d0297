"""The fast dequant of the TurboQuant cache (issue 20's continuation-prefill target): :func:`dequant_kv` and
its kernel ``_dequant_fast_kernel`` (variants: ``split``, ``v8``, ``w32``), either cache layout.  Moved here
from ``_triton_fast`` (no change to any function; the compiled kernels are byte-identical), with the
loads only the dequant uses: nibble-plane fields (``_planes_keys`` / ``_planes_values``), aligned 32-bit
code words (``_group_words32``) and 8 codes per thread (``_codes8``).  The 16-codes-per-thread unpacking it
shares with the fast decode is in ``_triton_unpack``; the PTX tables in ``ptx_tables``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant._triton_unpack import _centroids16, _codes, _group_words, _plane_code, _planes16, _tree16
from tqlab.turboquant.ptx_tables import PLANES_VALUE1024_ASM, _asm_for, _lut_mode
from tqlab.turboquant.spec import TurboQuantSpec

FAST_DEFAULTS = tk.DEFAULTS  # key "fast_dequant" (launch.py); the same dict as ``_triton_fast.FAST_DEFAULTS``


# ----------------------------------------------------------------------------- nibble planes
@triton.jit
def _planes_words(cache16_ptr, base16, ok, D: tl.constexpr, P32: tl.constexpr = 0, PS: tl.constexpr = 0):
    """``(lw, hw)`` int32 ``[T, D // 16]`` of a nibble-plane field at 16-bit word ``base16``: group
    ``g`` of 16 codes = half ``g % 2`` of chunk ``g // 2`` (words ``L0, L1, H`` of chunk ``c`` at 16-bit
    words ``2 c``, ``2 c + PS``, ``2 c + 2 PS``: ``PS`` = the plane stride of ``_triton_kernels._planes_flags``);
    ``lw`` = its plane word, ``hw`` = ``H << 2`` (half 0) or ``H`` (half 1), as :func:`planes_asm`.

    ``P32`` 0: each word as two 16-bit loads, ORed.  Else ``base16`` must be even (a 4-byte aligned
    block-SoA cache, :func:`codes_even`) and the words are aligned 32-bit loads (the same int32 values, bit
    for bit): 1 -- ``lw`` and ``hw`` as two ``[T, D // 16]`` loads (``H`` read once per half chunk); 2 --
    ``L0``, ``L1``, ``H`` as three ``[T, D // 32]`` loads joined in registers (``H`` read once).  Static
    sm_90 (Triton 3.6): 2 is the shorter loop for keys, but for the value field it adds 6 barriers and 8
    ``LDSM`` per tile to the key tile's staging (so the kernel reads keys by 2 and values by 1)."""
    g = tl.arange(0, D // 16)
    m = ok[:, None]
    if P32 == 0:
        row = cache16_ptr + base16[:, None]
        lp = row + ((g // 2) * 2 + (g % 2) * PS)[None, :]
        hp = row + ((g // 2) * 2 + 2 * PS)[None, :]
        lw = tl.load(lp, mask=m, other=0).to(tl.int32) | (tl.load(lp + 1, mask=m, other=0).to(tl.int32) << 16)
        hw = tl.load(hp, mask=m, other=0).to(tl.int32) | (tl.load(hp + 1, mask=m, other=0).to(tl.int32) << 16)
        return lw, tl.where((g % 2 == 0)[None, :], hw << 2, hw)
    row32 = (cache16_ptr + base16[:, None]).to(tl.pointer_type(tl.int32), bitcast=True)
    if P32 == 1:
        # contiguity 1 declared: pairs of L words are contiguous, and Triton would load them across lanes and
        # convert the tile to the token-per-thread layout the unpacking wants (through shared memory)
        lw = tl.load(row32 + tl.max_contiguous(g // 2 + (g % 2) * (PS // 2), 1)[None, :], mask=m, other=0)
        hw = tl.load(row32 + (g // 2 + PS)[None, :], mask=m, other=0)
        return lw, tl.where((g % 2 == 0)[None, :], hw << 2, hw)
    c1 = tl.max_contiguous(tl.arange(0, D // 32), 1)[None, :]  # as P32 1: no vector load of a token's 4 words
    l0 = tl.load(row32 + c1, mask=m, other=0)
    l1 = tl.load(row32 + c1 + PS // 2, mask=m, other=0)
    h = tl.load(row32 + c1 + PS, mask=m, other=0)
    T: tl.constexpr = base16.shape[0]
    return tl.reshape(tl.join(l0, l1), (T, D // 16)), tl.reshape(tl.join(h << 2, h), (T, D // 16))


@triton.jit
def _planes_tile(lw, hw, T: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr, OR: tl.constexpr, LSB: tl.constexpr):
    """``[T, D]`` of a nibble-plane field from :func:`_planes_words`, natural head-dim order (the
    join tree :func:`_tree16`): fp16 table values by :func:`planes_asm` when ``ASM`` is given,
    else int32 ``code << LSB | OR`` (:func:`_plane_code`)."""
    if ASM != "":
        e = _planes16(lw, hw, ASM)
        e0, e1, e2, e3, e4, e5, e6, e7 = e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]
        e8, e9, e10, e11, e12, e13, e14, e15 = e[8], e[9], e[10], e[11], e[12], e[13], e[14], e[15]
    else:
        e0, e1, e2, e3 = (_plane_code(lw, hw, 0, OR, LSB), _plane_code(lw, hw, 1, OR, LSB),
                          _plane_code(lw, hw, 2, OR, LSB), _plane_code(lw, hw, 3, OR, LSB))
        e4, e5, e6, e7 = (_plane_code(lw, hw, 4, OR, LSB), _plane_code(lw, hw, 5, OR, LSB),
                          _plane_code(lw, hw, 6, OR, LSB), _plane_code(lw, hw, 7, OR, LSB))
        e8, e9, e10, e11 = (_plane_code(lw, hw, 8, OR, LSB), _plane_code(lw, hw, 9, OR, LSB),
                            _plane_code(lw, hw, 10, OR, LSB), _plane_code(lw, hw, 11, OR, LSB))
        e12, e13, e14, e15 = (_plane_code(lw, hw, 12, OR, LSB), _plane_code(lw, hw, 13, OR, LSB),
                              _plane_code(lw, hw, 14, OR, LSB), _plane_code(lw, hw, 15, OR, LSB))
    return _tree16(e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15, D, T)


@triton.jit
def _planes_keys(cache16_ptr, kb16, ok, c0, c1, c2, c3, c4, c5, c6, c7, D: tl.constexpr, T: tl.constexpr,
                 LUT: tl.constexpr, LUT_ASM: tl.constexpr, P32: tl.constexpr = 0, PS: tl.constexpr = 0):
    """fp16 key centroids ``[T, D]`` of a 3-bit key field in nibble-plane order (the fast dequant's
    ``KP``): LUT 2 = :func:`planes_key_asm` (in ``LUT_ASM``), else the exact polynomial.  ``P32``: as
    :func:`_planes_words`."""
    kl, kh = _planes_words(cache16_ptr, kb16, ok, D, P32, PS)
    if LUT == 2:
        yh = _planes_tile(kl, kh, T, D, LUT_ASM, 0, 0)
    else:
        x = _planes_tile(kl, kh, T, D, "", 0x3F800000, 20).to(tl.float32, bitcast=True)
        yh = tk._centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, 3).to(tl.float16)
    return yh


@triton.jit
def _planes_values(cache16_ptr, vb16, ok, D: tl.constexpr, T: tl.constexpr, LUT: tl.constexpr,
                   P32: tl.constexpr = 0, PS: tl.constexpr = 0):
    """int32 ``0x6400 | code`` ``[T, D]`` of a 3-bit value field in nibble-plane order (the fast
    dequant's ``VP``; the caller's ``bits(.) - 1024`` gives the exact integer codes): LUT 2 =
    :data:`PLANES_VALUE1024_ASM` (a ``prmt`` table of those bits), else :func:`_plane_code`.  ``P32``: as
    :func:`_planes_words`."""
    vl, vh = _planes_words(cache16_ptr, vb16, ok, D, P32, PS)
    if LUT == 2:
        vc = _planes_tile(vl, vh, T, D, PLANES_VALUE1024_ASM, 0, 0).to(tl.int16, bitcast=True).to(tl.int32)
    else:
        vc = _planes_tile(vl, vh, T, D, "", 0x6400, 0)
    return vc


# ----------------------------------------------------------------------------- 32-bit words, 8 codes per thread
@triton.jit
def _group_words32(cache32_ptr, base16, ok, BITS: tl.constexpr, D: tl.constexpr, EVEN: tl.constexpr = False):
    """:func:`_group_words` (``WOFF`` 0, ``BITS`` 2, 3 or 4) from aligned 32-bit words: a group of 16
    codes starts at 16-bit word ``w = base16 + g * BITS``, read as the 32-bit words ``w >> 1, +1`` (and
    ``+2`` for 4 bits), shifted down one 16-bit word where ``w`` is odd.  Equal to :func:`_group_words`'s
    windows in every bit the code extraction reads (full 32 bits for windows 0 and 1, the low 16 bits
    above); 2 loads per group instead of 3 (3 bits), 3 instead of 4 (4 bits).  Reads at most one
    16-bit word past the group, which is still inside the slot (a key or value field is followed by
    another field in both layouts).  ``EVEN``: ``base16`` is known even (block-SoA), so 2- and 4-bit
    groups start on a 32-bit word: 1 load (2 bits) or 2 (4 bits), no shift."""
    g = tl.arange(0, D // 16)
    w = base16[:, None] + g[None, :] * BITS
    odd = (w & 1) == 1
    ptr = cache32_ptr + (w >> 1)
    m = ok[:, None]
    a = tl.load(ptr, mask=m, other=0)
    if EVEN and BITS == 2:
        return a, (a >> 16) & 0xFFFF, a, a, a, a, a, a
    if EVEN and BITS == 4:
        b4 = tl.load(ptr + 1, mask=m, other=0)
        return a, ((a >> 16) & 0xFFFF) | (b4 << 16), b4, (b4 >> 16) & 0xFFFF, a, a, a, a
    b = tl.load(ptr + 1, mask=m, other=0)
    ab = ((a >> 16) & 0xFFFF) | (b << 16)
    w0 = tl.where(odd, ab, a)
    w1 = tl.where(odd, b, ab)
    w2 = w0
    w3 = w0
    if BITS == 3:
        w2 = tl.where(odd, (b >> 16) & 0xFFFF, b)
    if BITS == 4:
        c = tl.load(ptr + 2, mask=m, other=0)
        bc = ((b >> 16) & 0xFFFF) | (c << 16)
        w2 = tl.where(odd, bc, b)
        w3 = tl.where(odd, c, bc)
    return w0, w1, w2, w3, w0, w0, w0, w0


@triton.jit
def _codes8(cache16_ptr, base16, ok, BITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr, OR: tl.constexpr,
            cache32_ptr=None, EVEN32: tl.constexpr = False):
    """``codes | OR`` of the field at 16-bit word ``base16`` of each token, int32 ``[T, D]`` with 8
    consecutive codes per thread (16 lanes per token at D = 128): the layout Triton gives a 16-byte
    fp16 store, so nothing moves between threads before it.  Group ``g`` of 8 codes starts at bit
    ``8 * BITS * g``: word ``BITS * g // 2``, bit 8 for odd ``BITS * g``; one (2 bits) or two 16-bit
    words make its window.  ``BITS`` 2, 3 or 4.  ``EVEN32`` (4 bits, ``base16`` known even): the
    window is one aligned 32-bit word of ``cache32_ptr``."""
    g = tl.arange(0, D // 8)
    m = ok[:, None]
    if EVEN32 and BITS == 4:
        # (w >> 1), not base16 // 2 + g: Triton would see 16 contiguous words, load them as 16-byte
        # vectors in another layout and convert it through shared memory
        win = tl.load(cache32_ptr + ((base16[:, None] + 2 * g[None, :]) >> 1), mask=m, other=0)
    else:
        ptr = cache16_ptr + base16[:, None] + ((g * BITS) // 2)[None, :]
        win = tl.load(ptr, mask=m, other=0).to(tl.int32)  # uint16: zero-extended
        if BITS != 2:
            win = win | (tl.load(ptr + 1, mask=m, other=0).to(tl.int32) << 16)
    if BITS % 2 == 1:
        win = win >> (((g * BITS) % 2) * 8)[None, :]
    M: tl.constexpr = (1 << BITS) - 1
    c0 = (win & M) | OR
    c1 = ((win >> BITS) & M) | OR
    c2 = ((win >> (2 * BITS)) & M) | OR
    c3 = ((win >> (3 * BITS)) & M) | OR
    c4 = ((win >> (4 * BITS)) & M) | OR
    c5 = ((win >> (5 * BITS)) & M) | OR
    c6 = ((win >> (6 * BITS)) & M) | OR
    c7 = ((win >> (7 * BITS)) & M) | OR
    # tl.join puts its axis last: the innermost joins pair codes 4 apart (see _codes)
    b = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(b, (T, D))


# ----------------------------------------------------------------------------- dequant
@triton.jit
def _dequant_fast_kernel(
    cache16_ptr, bt_ptr, k_ptr, v_ptr, signs_ptr, cache32_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    cached_len, num_blocks, stride_cb, stride_ch, stride_ct, stride_kh, stride_kt, stride_vh, stride_vt, inv_sqrt_d,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, TILES: tl.constexpr,
    KEY_FP8: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    PART: tl.constexpr = 3, V8: tl.constexpr = False, W32: tl.constexpr = False, EVEN: tl.constexpr = False,
    KP: tl.constexpr = 0, VP: tl.constexpr = 0, P32: tl.constexpr = False,
):
    """One program = TILES tiles of BLOCK_T tokens of one KV head; ``[T, D]`` tiles, a thread
    writes 16 contiguous fp16 of a row (32 bytes), keys rotated back by one MMA with the signs.
    ``NORM_CORR`` = ``TurboQuantSpec.norm_correction_on_read`` (False on a folded block-SoA cache).

    ``PART``: 3 = values and keys (the default), 1 = values only, 2 = keys only (two launches),
    0 = even programs of axis 0 values, odd ones keys (one launch, the two halves of a tile run side
    by side).  ``V8``: values unpacked 8 codes per thread (:func:`_codes8`), the layout of the
    16-byte store, so they skip the layout conversion through shared memory.  ``W32``: the code words of
    2- to 4-bit fields read as aligned 32-bit words of ``cache32_ptr`` (:func:`_group_words32`); ``EVEN``:
    every code field starts at an even 16-bit word (block-SoA), so 4-bit groups need no shift.  ``KP`` /
    ``VP``: 0, or the plane stride of key / value codes in nibble-plane order (``_triton_kernels._planes_flags``), cut by
    :func:`_planes_keys` / :func:`_planes_values` (``V8`` and ``W32`` do not apply to them); ``P32``: their
    plane words as aligned 32-bit loads (every code field at an even 16-bit word of a 4-byte aligned cache;
    :func:`_planes_words` mode 2 for keys, 1 for values)."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    if PART == 0:
        do_v = pid % 2 == 0
        do_k = pid % 2 == 1
        pid = pid // 2
    else:
        do_v: tl.constexpr = PART % 2 == 1
        do_k: tl.constexpr = PART >= 2
    cols = tl.arange(0, D)
    if not KEY_FP8 and PART != 1:
        sg = tl.load(signs_ptr + cols[:, None] * D + cols[None, :])  # fp16 +-1, exact
    k_head = k_ptr + h.to(tl.int64) * stride_kh
    v_head = v_ptr + h.to(tl.int64) * stride_vh
    for i in tl.range(0, TILES, num_stages=1 if W32 or P32 else None):  # 32-bit loads: no cp.async staging
        t = (pid * TILES + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_len = t < cached_len
        fk, fn, fv, fs, fz, ok = tk._field_bases(bt_ptr, t, in_len, BLOCK_SIZE, num_blocks, h, stride_cb, stride_ch, stride_ct,
                                                 KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
        if do_v:
            if VP:
                vc = _planes_values(cache16_ptr, fv, ok, D, BLOCK_T, LUT, 1 if P32 else 0, VP)
            elif V8:
                vc = _codes8(cache16_ptr, fv, ok, VBITS, D, BLOCK_T, 0x6400, cache32_ptr, W32 and EVEN)
            elif W32 and VBITS <= 4:
                vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _group_words32(cache32_ptr, fv, ok, VBITS, D, EVEN)
                vc = _codes(vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, VBITS, D, BLOCK_T, 0x6400)
            else:
                vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _group_words(cache16_ptr, fv, ok, 0, VBITS, D)
                vc = _codes(vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, VBITS, D, BLOCK_T, 0x6400)
            vs = tl.load(cache16_ptr + fs, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
            vz = tl.load(cache16_ptr + fz, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
            vv = vz[:, None] + vs[:, None] * (vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0).to(tl.float32)
            tl.store(v_head + t[:, None] * stride_vt + cols[None, :], vv.to(tl.float16), mask=in_len[:, None])
        if not do_k:  # a values-only program
            pass
        elif KEY_FP8:
            kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _group_words(cache16_ptr, fk, ok, 0, 8, D)
            kb = _codes(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, 8, D, BLOCK_T)
            kf = kb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
            tl.store(k_head + t[:, None] * stride_kt + cols[None, :], kf, mask=in_len[:, None])
        else:
            if KP:
                yh = _planes_keys(cache16_ptr, fk, ok, c0, c1, c2, c3, c4, c5, c6, c7, D, BLOCK_T, LUT, LUT_ASM,
                                  2 if P32 else 0, KP)
            elif W32:
                kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _group_words32(cache32_ptr, fk, ok, KBITS, D, EVEN)
            else:
                kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _group_words(cache16_ptr, fk, ok, 0, KBITS, D)
            if not KP:
                yh = _centroids16(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, c0, c1, c2, c3, c4, c5, c6, c7,
                                  KBITS, D, BLOCK_T, LUT, LUT_ASM)
            fac = tl.load(cache16_ptr + fn, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
            if NORM_CORR:
                y32 = yh.to(tl.float32)
                yn = tl.sqrt(tl.sum(y32 * y32, axis=1))
                fac = fac / tl.where(yn > 0, yn, 1.0)
            kc = tl.dot(yh, sg) * (fac * inv_sqrt_d)[:, None]
            tl.store(k_head + t[:, None] * stride_kt + cols[None, :], kc.to(tl.float16), mask=in_len[:, None])


DEQUANT_SPLITS = ("none", "grid", "launch")
DEQUANT_TILINGS = ("tiles", "fill")
MIN_FILL_BLOCK_T = 32


def dequant_tiling(cached_len: int, num_kv_heads: int, num_sms: int, block_t: int, tiles: int, policy: str = "tiles",
                   programs_per_sm: int = 4) -> tuple[int, int]:
    """``(block_t, tiles per program)`` of a fast dequant launch: one program per KV head and group of
    ``tiles * block_t`` tokens; ``programs_per_sm * num_sms`` programs fill the GPU (4 CTAs per SM: the
    kernel's ~125 registers and 48 KB of shared memory).

    * ``"tiles"`` (default): ``tiles`` tiles per program where that leaves at least ``programs_per_sm *
      num_sms`` programs, else 1 (the seed rank, 1 KV head, at 32K: 512 programs of 64 tokens).
    * ``"fill"``: the same, then, while one ``block_t`` tile per program still leaves fewer programs than
      that, halve ``block_t`` (down to ``MIN_FILL_BLOCK_T``): the seed rank at 32K gets 1024 programs of
      32 tokens, the Llama shard (8 KV heads) is unchanged.  The decode's ``"fill"`` split policy
      (``ops.decode_num_splits``) fills the GPU the same way.

    Raises:
        ValueError: unknown ``policy``.
    """
    if policy not in DEQUANT_TILINGS:
        raise ValueError(f"tiling must be one of {DEQUANT_TILINGS}, got {policy!r}")
    want = programs_per_sm * num_sms
    if num_kv_heads * triton.cdiv(cached_len, block_t) // tiles >= want:
        return block_t, tiles
    while policy == "fill" and block_t > MIN_FILL_BLOCK_T and num_kv_heads * triton.cdiv(cached_len, block_t) < want:
        block_t //= 2
    return block_t, 1


def codes_even(fields: dict, stride_cb: int, stride_ch: int, stride_ct: int) -> bool:
    """True when every token's key and value code field starts at an even 16-bit word (a 4-byte
    boundary), whatever the block and token: the kernels' ``EVEN``.  ``fields``: :func:`tk._field_addr`;
    strides in bytes.  vLLM's order adds ``o * stride_ct`` bytes (``_field_bases``), block-SoA
    ``o * KS`` words."""
    strides = (stride_cb, stride_ch) + ((stride_ct,) if fields["KS"] == fields["SS"] else ())
    return all(fields[x] % 2 == 0 for x in ("KO", "KS", "VO", "VS")) and all(st % 4 == 0 for st in strides)


def dequant_w32_default(spec: TurboQuantSpec) -> bool:
    """Whether the fast dequant reads code words as aligned 32-bit words by default:
    ``launch.DEFAULTS["fast_dequant"]["w32"]``, where ``"4bit"`` means when the key or the value field
    is 4-bit (k3v4_nc, 4bit_nc; measured faster there, 1-4 % slower for 3bit_nc)."""
    w32 = FAST_DEFAULTS["fast_dequant"].get("w32", False)
    return 4 in (spec.key_bits, spec.value_bits) if w32 == "4bit" else bool(w32)


def dequant_kv(cache, block_table_row, cached_len, k_out, v_out, spec: TurboQuantSpec,
               block_t: int | None = None, num_warps: int | None = None, tiles_per_program: int | None = None,
               lut: int | None = None, stats: dict | None = None, split: str | None = None, v8: bool | None = None,
               maxnreg: int | None = None, w32: bool | None = None, p32: bool | None = None,
               tiling: str | None = None):
    """The fast continuation-prefill dequant (:func:`_dequant_fast_kernel`): the first ``cached_len``
    tokens of one request into fp16 ``k_out``/``v_out`` ``(1, Hk, L, D)``, keys rotated back; tqlab's
    counterpart of vLLM 0.33's ``_tq_full_dequant_kv`` (``vllm/v1/attention/ops/triton_turboquant_decode.py``).
    Inputs are validated by :func:`tqlab.turboquant.ops.dequant_kv`.  Launch arguments default to
    ``launch.DEFAULTS["fast_dequant"]``; ``v8`` and ``w32`` do not apply to nibble-plane fields (block-SoA
    3-bit codes, read by their own helpers).  Variants (issue 20's dequant target; every one writes the
    same bits as the default, checked by tests/test_turboquant_triton.py and, on the GPU,
    benchmarks/dev_turboquant_dequant.py):

    * ``split``: ``"none"`` (keys and values in one program), ``"grid"`` (one launch, twice the
      programs: even ones values, odd ones keys of the same tiles), ``"launch"`` (a values launch,
      then a keys launch: each compiled for its half, so the values run at their own register count);
    * ``v8``: values 8 codes per thread, stored without a layout conversion (value bits 2-4; ignored
      for 8-bit values);
    * ``maxnreg``: register cap per thread (None = none);
    * ``w32``: 3- and 4-bit code words read as aligned 32-bit words (needs a 4-byte aligned cache whose
      size is a multiple of 4 bytes; ignored otherwise).  Default ``launch.DEFAULTS``' ``"4bit"``: on
      when the key or value field is 4-bit (measured faster there; 1-4 % slower for 3bit_nc in vLLM's
      order, data/turboquant_dequant_variants_sweep_h200.json);
    * ``p32``: nibble-plane words (block-SoA 3-bit fields) read as aligned 32-bit words instead of pairs of
      16-bit words (default on: ``launch.DEFAULTS["fast_dequant"].get("p32", True)``); needs a 4-byte aligned
      cache whose code fields all start on 4 bytes (:func:`codes_even`; block size 16 does) -- else the
      16-bit reads;
    * ``tiling``: how ``block_t`` and the tiles per program follow the grid when ``tiles_per_program`` is
      None (:func:`dequant_tiling`): ``"tiles"`` (default) or ``"fill"``.

    ``stats`` (when given) gets the launch's ``block_t``, ``tiles``, ``programs`` (all heads), ``p32``, and on
    the GPU the kernel's registers, spills and shared memory.

    Raises:
        ValueError: unknown ``split`` or ``tiling``.
    """
    cfg = FAST_DEFAULTS["fast_dequant"]
    block_t = block_t or cfg["block_t"]
    split = split or cfg.get("split", "none")
    if split not in DEQUANT_SPLITS:
        raise ValueError(f"split must be one of {DEQUANT_SPLITS}, got {split!r}")
    tiling = tiling or cfg.get("tiling", "tiles")
    if tiling not in DEQUANT_TILINGS:
        raise ValueError(f"tiling must be one of {DEQUANT_TILINGS}, got {tiling!r}")
    v8 = bool(cfg.get("v8", False) if v8 is None else v8) and spec.value_bits in (2, 3, 4)
    maxnreg = maxnreg or cfg.get("maxnreg")
    aligned = cache.data_ptr() % 4 == 0
    w32 = bool(dequant_w32_default(spec) if w32 is None else w32) and aligned and cache.numel() % 4 == 0 \
        and cache.is_contiguous()
    lut = _lut_mode(spec, cache.device, lut, cfg)
    nb, hk, bs, sb = cache.shape
    d = k_out.shape[-1]
    signs16, _, _, _ = tk._consts(spec, d, cache.device)
    fields = tk._field_addr(spec, d, bs)
    planes = tk._planes_flags(spec, d, bs)
    even = aligned and codes_even(fields, cache.stride(0), cache.stride(1), cache.stride(2))
    p32 = bool(cfg.get("p32", True) if p32 is None else p32) and even and bool(planes["KP"] or planes["VP"])
    cache32 = cache.view(-1).view(torch.int32) if w32 else signs16  # unused when not w32
    even = even and w32
    if tiles_per_program is None:
        block_t, tiles_per_program = dequant_tiling(cached_len, hk, _num_sms(cache.device), block_t, cfg["tiles"], tiling)
    n_tiles = triton.cdiv(cached_len, block_t)
    tiles = max(1, min(tiles_per_program, n_tiles))
    n_prog = triton.cdiv(n_tiles, tiles)
    if stats is not None:
        stats.update(block_t=block_t, tiles=tiles, programs=n_prog * hk, p32=p32)
    opts = {"num_warps": num_warps or cfg["num_warps"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    args = (cache.view(torch.uint16), block_table_row, k_out, v_out, signs16, cache32, *tk._centroid_poly(spec, d),
            cached_len, nb, cache.stride(0), cache.stride(1), cache.stride(2),
            k_out.stride(1), k_out.stride(2), v_out.stride(1), v_out.stride(2), 1.0 / math.sqrt(d))
    meta = dict(BLOCK_SIZE=bs, D=d, BLOCK_T=block_t, TILES=tiles, KEY_FP8=spec.key_fp8, KBITS=spec.key_bits,
                VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read, **fields, LUT=lut,
                LUT_ASM=_asm_for(spec, d, lut), V8=v8, W32=w32, EVEN=even, **planes, P32=p32, **opts)
    if split == "launch":
        _dequant_fast_kernel[(n_prog, hk)](*args, **meta, PART=1)
        kern = _dequant_fast_kernel[(n_prog, hk)](*args, **meta, PART=2)
    elif split == "grid":
        kern = _dequant_fast_kernel[(2 * n_prog, hk)](*args, **meta, PART=0)
    else:
        kern = _dequant_fast_kernel[(n_prog, hk)](*args, **meta)
    tk._record(stats, kern)


def _num_sms(device) -> int:
    dev = torch.device(device)
    if dev.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(dev).multi_processor_count
