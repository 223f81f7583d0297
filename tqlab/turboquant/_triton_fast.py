"""Fast decode / dequant kernels for the TurboQuant cache (issue 20), same slot layout as
:mod:`._triton_kernels` (whose portable kernels stay the reference).

What differs from the portable kernels (see ``benchmarks/NOTES_turboquant.md``):

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

import numpy as np
import torch
import triton
import triton.language as tl

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant.codebook import lloyd_max
from tqlab.turboquant.spec import TurboQuantSpec

_LUT_ASM: dict = {}


# ----------------------------------------------------------------------------- centroid table
def _fp16_bits(values) -> list[int]:
    return [int(v) for v in np.asarray(values, dtype=np.float16).view(np.uint16)]


def lut_asm(spec: TurboQuantSpec, d: int) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=4)``: four uint8 codes in ``$2`` -> four fp16
    centroids in ``$0, $1`` (two per register), by ``prmt`` lookups in the byte tables of the
    fp16 centroids.  3 bits: one 8-entry table.  4 bits: the 8 positive centroids
    ``c[8..15]`` (``c[i] = -c[15 - i]``, symmetric Lloyd-Max), index ``i ^ 7`` and the sign bit
    set for ``i < 8``.  2 bits: the 4 centroids padded to 8.  (Key presets use 3 and 4 bits.)"""
    key = (spec.key_bits, d)
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    bits = spec.key_bits
    cent = np.asarray(lloyd_max(bits, d).centroids, dtype=np.float64)
    if bits == 4:
        table = cent[8:]
    else:
        table = np.concatenate([cent, np.zeros(8 - len(cent))])
    h = _fp16_bits(table)
    lo = [x & 0xFF for x in h]
    hi = [x >> 8 for x in h]

    def word(bs):
        return bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24

    lines = ["{", ".reg .b32 x, s, t, l, h, m, f;"]
    if bits == 4:
        # m: 0x07 in each byte whose code is < 8 (negative centroid); index = code ^ 7 there
        lines += ["shr.b32 f, $2, 3;", "and.b32 f, f, 0x01010101;", "xor.b32 f, f, 0x01010101;",
                  "mul.lo.u32 m, f, 7;", "xor.b32 x, $2, m;", "and.b32 x, x, 0x07070707;"]
    else:
        lines += ["and.b32 x, $2, 0x07070707;"]
    lines += [
        "shr.b32 t, x, 4;", "or.b32 s, x, t;",            # byte0 = c0 | c1 << 4, byte2 = c2 | c3 << 4
        "and.b32 t, s, 0xFF;", "shr.b32 s, s, 8;", "and.b32 s, s, 0xFF00;", "or.b32 s, s, t;",
        f"prmt.b32 l, {word(lo[:4])}, {word(lo[4:])}, s;",
        f"prmt.b32 h, {word(hi[:4])}, {word(hi[4:])}, s;",
        "prmt.b32 $0, l, h, 0x5140;", "prmt.b32 $1, l, h, 0x7362;",
    ]
    if bits == 4:  # sign bit 15 of each fp16 from the per-byte flags f (bit 0 of byte k)
        lines += ["shl.b32 s, f, 15;", "and.b32 l, s, 0x8000;", "shl.b32 s, f, 23;", "and.b32 s, s, 0x80000000;",
                  "or.b32 l, l, s;", "xor.b32 $0, $0, l;",
                  "shr.b32 s, f, 1;", "and.b32 l, s, 0x8000;", "shl.b32 s, f, 7;", "and.b32 s, s, 0x80000000;",
                  "or.b32 l, l, s;", "xor.b32 $1, $1, l;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


def lut_group_asm(spec: TurboQuantSpec, d: int) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=1)``: the 32-bit windows ``$16, $17, ...`` of one
    group of 16 key codes -> their 16 fp16 centroids ``$0 .. $15``, four codes at a time.

    3 bits: a nibble selector cut from the packed bits by shifts and masks, then ``prmt`` lookups
    of the low and high bytes of the 8 fp16 centroids and two ``prmt`` to interleave them.
    4 bits (the nibbles are the selectors): ``prmt`` takes 8 table bytes, so the low 3 bits of each
    code look up both halves of the 16-entry table (codes 0-7 and 8-15) and one more ``prmt`` per
    byte plane picks the half by the code's bit 3 (selector ``0x3210 | (bit 3 << 2)`` per byte):
    13 instructions per 4 codes instead of 24 for the symmetric table with sign fix-up (issue 20)."""
    bits = spec.key_bits
    key = ("group", bits, d)
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    if bits not in (3, 4):
        raise ValueError("group table lookup: 3- or 4-bit keys")
    cent = np.asarray(lloyd_max(bits, d).centroids, dtype=np.float64)
    h = _fp16_bits(cent)
    lo = [x & 0xFF for x in h]
    hi = [x >> 8 for x in h]

    def word(bs):
        return bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24

    lines = ["{", ".reg .b32 q, s, t, l, h, a, b, r0, r1, tl0, tl1, th0, th1;",
             f"mov.b32 tl0, {word(lo[:4])};", f"mov.b32 tl1, {word(lo[4:8])};",
             f"mov.b32 th0, {word(hi[:4])};", f"mov.b32 th1, {word(hi[4:8])};"]
    for k in range(4):  # quad k: codes 4k .. 4k+3
        if bits == 3:  # bits 12k .. 12k+11 of the group: window 12k // 16 shifted by 12k % 16
            lines += [f"shr.b32 q, ${16 + 12 * k // 16}, {12 * k % 16};",
                      "and.b32 s, q, 0x7;", "shl.b32 t, q, 1;", "and.b32 t, t, 0x70;", "or.b32 s, s, t;",
                      "shl.b32 t, q, 2;", "and.b32 t, t, 0x700;", "or.b32 s, s, t;",
                      "shl.b32 t, q, 3;", "and.b32 t, t, 0x7000;", "or.b32 s, s, t;",
                      "prmt.b32 l, tl0, tl1, s;", "prmt.b32 h, th0, th1, s;"]
        else:  # low 3 bits index both table halves; bit 3 picks the half, byte by byte
            lines += [f"and.b32 s, ${16 + k}, 0x7777;", f"shr.b32 t, ${16 + k}, 1;", "and.b32 t, t, 0x4444;",
                      "or.b32 t, t, 0x3210;",
                      "prmt.b32 a, tl0, tl1, s;", f"prmt.b32 b, {word(lo[8:12])}, {word(lo[12:])}, s;",
                      "prmt.b32 l, a, b, t;",
                      "prmt.b32 a, th0, th1, s;", f"prmt.b32 b, {word(hi[8:12])}, {word(hi[12:])}, s;",
                      "prmt.b32 h, a, b, t;"]
        lines += ["prmt.b32 r0, l, h, 0x5140;", "prmt.b32 r1, l, h, 0x7362;",
                  f"mov.b32 {{${4 * k}, ${4 * k + 1}}}, r0;", f"mov.b32 {{${4 * k + 2}, ${4 * k + 3}}}, r1;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


VALUE4_PTX = "\n".join(
    ["{", ".reg .b32 t, r, m;", "mov.b32 m, 0x64006400;"]
    + [line for w in range(2) for k in range(4) for line in (
        ([f"shr.b32 t, ${16 + w}, {4 * k};"] if k else [f"mov.b32 t, ${16 + w};"])
        + ["and.b32 r, t, 0x000F000F;", "or.b32 r, r, m;", "sub.f16x2 r, r, m;",
           f"mov.b32 {{${8 * w + k}, ${8 * w + k + 4}}}, r;"])]
    + ["}"])
"""PTX for ``tl.inline_asm_elementwise(pack=1)``: 4-bit value codes -> exact fp16 integers.  ``$16``
holds codes 0-7 of a group of 16 (nibble ``j`` = code ``j``), ``$17`` codes 8-15; codes ``j`` and
``j + 4`` sit 16 bits apart, so one mask puts both in the low mantissa bits of a half2 under the
exponent of 1024 (``0x6400``): ``(w >> 4k) & 0x000F000F | 0x64006400`` is ``(1024 + c_k, 1024 + c_{k+4})``,
and one ``sub.f16x2`` of 1024 leaves the codes exactly: 2-3 instructions per two codes (issue 20)."""
VALUE4_ASM = tl.constexpr(VALUE4_PTX)  # a jit function may read a global only as a constexpr


@triton.jit
def _values4(w0, w1, D: tl.constexpr, T: tl.constexpr):
    """fp16 value codes ``[T, D]`` (exact integers) of a 4-bit field from the windows of codes 0-7
    (``w0``) and 8-15 (``w1``) of each group of 16, by :data:`VALUE4_ASM` (PTX: CUDA only)."""
    e = tl.inline_asm_elementwise(VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w0, w1],
                                  dtype=(tl.float16,) * 16, is_pure=True, pack=1)
    return _tree16(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14], e[15],
                   D, T)


@triton.jit
def _tree16(e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15, D: tl.constexpr, T: tl.constexpr):
    """``[T, D]`` in natural head-dim order from the 16 per-code tensors ``e[i]`` (code ``i`` of
    every group of 16): ``tl.join`` adds its axis last, so the first joins pair codes 8 apart."""
    a0 = tl.join(e0, e8)
    a1 = tl.join(e1, e9)
    a2 = tl.join(e2, e10)
    a3 = tl.join(e3, e11)
    a4 = tl.join(e4, e12)
    a5 = tl.join(e5, e13)
    a6 = tl.join(e6, e14)
    a7 = tl.join(e7, e15)
    b = tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7)))
    return tl.reshape(b, (T, D))


@triton.jit
def _lut_group(w0, w1, w2, w3, KBITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr, ASM: tl.constexpr):
    """fp16 centroids ``[T, D]`` of the key codes by :func:`lut_group_asm` (one asm per group)."""
    if KBITS == 3:
        e = tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [w0, w1, w2], dtype=(tl.float16,) * 16,
                                      is_pure=True, pack=1)
    else:
        e = tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [w0, w1, w2, w3], dtype=(tl.float16,) * 16,
                                      is_pure=True, pack=1)
    return _tree16(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14], e[15],
                   D, T)


# ----------------------------------------------------------------------------- nibble planes
def _word(bs) -> int:
    return bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24


def planes_asm(table16: list[int] | None) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=1)`` on a 3-bit field in nibble-plane order
    (``TurboQuantSpec.code_order``): ``$16`` = a plane word ``L`` (``L0`` or ``L1``), ``$17`` = the
    chunk's ``H`` shifted so that code ``j``'s high bit is at bit ``4j + 2`` (``H << 2`` for codes
    0-15 of the chunk, ``H`` for codes 16-31) -> 16 fp16 ``$0 .. $15`` of codes ``0..15`` of that
    half.  The ``prmt`` selector of 8 codes is ``(L & 0x33333333) | (H' & 0x44444444)`` (3 ops; the
    next 8: both shifted right by 2 and 1 first).  ``table16``: the 8 fp16 bit patterns (key
    centroids: low- and high-byte tables, two ``prmt`` to interleave); None = the values' table
    fp16(0..7), whose low bytes are all zero (one ``prmt`` of the high bytes, two against zero)."""
    key = ("planes", None if table16 is None else tuple(table16))
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    lines = ["{", ".reg .b32 s, t, u, l, h, r0, r1, z;", "mov.b32 z, 0;"]
    if table16 is not None:
        lo = [x & 0xFF for x in table16]
        hi = [x >> 8 for x in table16]
        tlo = (_word(lo[:4]), _word(lo[4:]))
    else:
        hi = [x >> 8 for x in _fp16_bits(np.arange(8))]
    thi = (_word(hi[:4]), _word(hi[4:]))
    for half in range(2):  # codes 8*half .. 8*half + 7
        if half == 0:
            lines += ["and.b32 s, $16, 0x33333333;", "and.b32 t, $17, 0x44444444;", "or.b32 s, s, t;"]
        else:
            lines += ["shr.b32 s, $16, 2;", "and.b32 s, s, 0x33333333;", "shr.b32 t, $17, 1;",
                      "and.b32 t, t, 0x44444444;", "or.b32 s, s, t;"]
        for quad in range(2):
            sel = "s" if quad == 0 else "u"
            if quad == 1:
                lines.append("shr.b32 u, s, 16;")
            o = 8 * half + 4 * quad
            lines.append(f"prmt.b32 h, {thi[0]}, {thi[1]}, {sel};")
            if table16 is not None:
                lines += [f"prmt.b32 l, {tlo[0]}, {tlo[1]}, {sel};",
                          "prmt.b32 r0, l, h, 0x5140;", "prmt.b32 r1, l, h, 0x7362;"]
            else:
                lines += ["prmt.b32 r0, h, z, 0x1404;", "prmt.b32 r1, h, z, 0x3424;"]
            lines += [f"mov.b32 {{${o}, ${o + 1}}}, r0;", f"mov.b32 {{${o + 2}, ${o + 3}}}, r1;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


def planes_key_asm(spec: TurboQuantSpec, d: int) -> str:
    """:func:`planes_asm` with the fp16 Lloyd-Max centroids of 3-bit keys."""
    if spec.key_bits != 3:
        raise ValueError(f"nibble planes hold 3-bit codes; {spec.name} has {spec.key_bits}-bit keys")
    return planes_asm(_fp16_bits(lloyd_max(3, d).centroids))


# the values' tables, globals the kernels read as constexprs: fp16(0..7) (the SoA decode's MMA operand) and
# the bits 0x6400 | code = fp16(1024 + code) (the fast dequant's, which subtracts 1024 as for the other fields)
PLANES_VALUE_ASM = tl.constexpr(planes_asm(None))
PLANES_VALUE1024_ASM = tl.constexpr(planes_asm([0x6400 | c for c in range(8)]))


@triton.jit
def _planes16(lw, hw, ASM: tl.constexpr):
    """:func:`planes_asm` on int32 tensors: 16 fp16 tensors, codes 0..15 of each half chunk."""
    return tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r", [lw, hw],
                                     dtype=(tl.float16,) * 16, is_pure=True, pack=1)


@triton.jit
def _plane_code(lw, hw, I: tl.constexpr, OR: tl.constexpr, LSB: tl.constexpr):
    """Integer code ``I = 8r + j`` (``r`` 0/1) of a half chunk in nibble-plane order, ``lw`` = its
    plane word, ``hw`` = ``H`` shifted as ``$17`` of :func:`planes_asm` (code ``j``'s high bit at
    ``4j + 2``): ``(lw >> (4j + 2r)) & 3 | ((hw >> (4j + 2 + r)) & 1) << 2``, moved to bit ``LSB``
    and OR'd with ``OR`` (the fallback where PTX does not run: the interpreter, ``LUT`` 0)."""
    J: tl.constexpr = I % 8
    R: tl.constexpr = I // 8
    code = ((lw >> (4 * J + 2 * R)) & 3) | (((hw >> (4 * J + 2 + R)) & 1) << 2)
    return (code << LSB) | OR


@triton.jit
def _planes_words(cache16_ptr, base16, ok, D: tl.constexpr):
    """``(lw, hw)`` int32 ``[T, D // 16]`` of a nibble-plane field at 16-bit word ``base16``: group
    ``g`` of 16 codes = half ``g % 2`` of chunk ``g // 2`` (6 words per chunk: ``L0, L1, H``);
    ``lw`` = its plane word, ``hw`` = ``H << 2`` (half 0) or ``H`` (half 1), as :func:`planes_asm`."""
    g = tl.arange(0, D // 16)
    row = cache16_ptr + base16[:, None]
    lp = row + ((g // 2) * 6 + (g % 2) * 2)[None, :]
    hp = row + ((g // 2) * 6 + 4)[None, :]
    m = ok[:, None]
    lw = tl.load(lp, mask=m, other=0).to(tl.int32) | (tl.load(lp + 1, mask=m, other=0).to(tl.int32) << 16)
    hw = tl.load(hp, mask=m, other=0).to(tl.int32) | (tl.load(hp + 1, mask=m, other=0).to(tl.int32) << 16)
    return lw, tl.where((g % 2 == 0)[None, :], hw << 2, hw)


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
                 LUT: tl.constexpr, LUT_ASM: tl.constexpr):
    """fp16 key centroids ``[T, D]`` of a 3-bit key field in nibble-plane order (the fast dequant's
    ``KP``): LUT 2 = :func:`planes_key_asm` (in ``LUT_ASM``), else the exact polynomial."""
    kl, kh = _planes_words(cache16_ptr, kb16, ok, D)
    if LUT == 2:
        yh = _planes_tile(kl, kh, T, D, LUT_ASM, 0, 0)
    else:
        x = _planes_tile(kl, kh, T, D, "", 0x3F800000, 20).to(tl.float32, bitcast=True)
        yh = tk._centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, 3).to(tl.float16)
    return yh


@triton.jit
def _planes_values(cache16_ptr, vb16, ok, D: tl.constexpr, T: tl.constexpr, LUT: tl.constexpr):
    """int32 ``0x6400 | code`` ``[T, D]`` of a 3-bit value field in nibble-plane order (the fast
    dequant's ``VP``; the caller's ``bits(.) - 1024`` gives the exact integer codes): LUT 2 =
    :data:`PLANES_VALUE1024_ASM` (a ``prmt`` table of those bits), else :func:`_plane_code`."""
    vl, vh = _planes_words(cache16_ptr, vb16, ok, D)
    if LUT == 2:
        vc = _planes_tile(vl, vh, T, D, PLANES_VALUE1024_ASM, 0, 0).to(tl.int16, bitcast=True).to(tl.int32)
    else:
        vc = _planes_tile(vl, vh, T, D, "", 0x6400, 0)
    return vc


# ----------------------------------------------------------------------------- group unpacking
@triton.jit
def _pick(w0, w1, w2, w3, w4, w5, w6, w7, K: tl.constexpr):
    if K == 0:
        r = w0
    elif K == 1:
        r = w1
    elif K == 2:
        r = w2
    elif K == 3:
        r = w3
    elif K == 4:
        r = w4
    elif K == 5:
        r = w5
    elif K == 6:
        r = w6
    else:
        r = w7
    return r


@triton.jit
def _group_words(cache16_ptr, base16, ok, WOFF: tl.constexpr, BITS: tl.constexpr, D: tl.constexpr):
    """The ``BITS`` 16-bit words of each group of 16 codes of the field at word ``WOFF``, as
    32-bit windows ``W_k = w_k | w_{k+1} << 16`` (int32 ``[T, D // 16]``; unused ones are W_0)."""
    g = tl.arange(0, D // 16)
    ptr = cache16_ptr + (base16[:, None] + WOFF) + g[None, :] * BITS
    m = ok[:, None]
    w0 = tl.load(ptr, mask=m, other=0).to(tl.int32)
    w1 = tl.load(ptr + 1, mask=m, other=0).to(tl.int32)
    w2 = w0
    w3 = w0
    w4 = w0
    w5 = w0
    w6 = w0
    w7 = w0
    if BITS > 2:
        w2 = tl.load(ptr + 2, mask=m, other=0).to(tl.int32)
    if BITS > 3:
        w3 = tl.load(ptr + 3, mask=m, other=0).to(tl.int32)
    if BITS > 4:
        w4 = tl.load(ptr + 4, mask=m, other=0).to(tl.int32)
        w5 = tl.load(ptr + 5, mask=m, other=0).to(tl.int32)
        w6 = tl.load(ptr + 6, mask=m, other=0).to(tl.int32)
        w7 = tl.load(ptr + 7, mask=m, other=0).to(tl.int32)
    return (w0 | (w1 << 16), w1 | (w2 << 16), w2 | (w3 << 16), w3 | (w4 << 16),
            w4 | (w5 << 16), w5 | (w6 << 16), w6 | (w7 << 16), w7)


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
def _code(w0, w1, w2, w3, w4, w5, w6, w7, I: tl.constexpr, BITS: tl.constexpr, OR: tl.constexpr,
          LSB: tl.constexpr):
    """Code ``I`` of each group, moved to bit ``LSB`` and OR'd with ``OR``."""
    P: tl.constexpr = I * BITS
    S: tl.constexpr = P % 16 - LSB
    win = _pick(w0, w1, w2, w3, w4, w5, w6, w7, P // 16)
    if S > 0:
        win = win >> S  # arithmetic shift: the sign bits land above the code's mask
    elif S < 0:
        win = win << (-S)
    return (win & (((1 << BITS) - 1) << LSB)) | OR


@triton.jit
def _codes(w0, w1, w2, w3, w4, w5, w6, w7, BITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
           OR: tl.constexpr = 0, LSB: tl.constexpr = 0):
    """All codes of the tile, int32 ``[T, D]`` in natural head-dim order (a thread keeps the 16
    codes of its group: ``tl.join`` adds in-thread axes)."""
    # tl.join adds its axis last (least significant), so the first joins pair codes 8 apart
    a0 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 0, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 8, BITS, OR, LSB))
    a1 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 1, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 9, BITS, OR, LSB))
    a2 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 2, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 10, BITS, OR, LSB))
    a3 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 3, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 11, BITS, OR, LSB))
    a4 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 4, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 12, BITS, OR, LSB))
    a5 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 5, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 13, BITS, OR, LSB))
    a6 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 6, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 14, BITS, OR, LSB))
    a7 = tl.join(_code(w0, w1, w2, w3, w4, w5, w6, w7, 7, BITS, OR, LSB), _code(w0, w1, w2, w3, w4, w5, w6, w7, 15, BITS, OR, LSB))
    b = tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7)))
    return tl.reshape(b, (T, D))


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


@triton.jit
def _centroids16(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, c0, c1, c2, c3, c4, c5, c6, c7,
                 KBITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr):
    """fp16 centroids ``[T, D]`` of the key codes: LUT 2 = one ``prmt`` table asm per group of 16
    codes, 1 = per 4 byte codes, 0 = the exact polynomial (portable, the interpreter's)."""
    if LUT == 2:
        yh = _lut_group(kw0, kw1, kw2, kw3, KBITS, D, T, LUT_ASM)
    elif LUT == 1:
        codes = _codes(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, KBITS, D, T).to(tl.uint8)
        yh = tl.inline_asm_elementwise(LUT_ASM, "=r,=r,r", [codes], dtype=tl.float16, is_pure=True, pack=4)
    else:
        x = _codes(kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, KBITS, D, T, 0x3F800000, 23 - KBITS).to(tl.float32, bitcast=True)
        yh = tk._centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, KBITS).to(tl.float16)
    return yh


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
    """The staged kernel reads whole blocks as int32 x 4: a block's slots must be 16-byte sized."""
    nb, hk, bs, sb = cache.shape
    return (bs * sb) % 16 == 0


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
    return dict(GROUP=group, GP=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=bs, D=d, BLOCK_T=block_t,
                KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read,
                **fields, LUT=lut, LUT_ASM=_asm_for(spec, d, lut))


def _lut_mode(spec: TurboQuantSpec, device, lut, cfg) -> int:
    """0 (polynomial), 1 or 2 (``prmt`` tables): the table only where PTX runs and keys are 3/4-bit."""
    if lut is None:
        lut = cfg.get("lut", 2)
    return int(lut) if lut and use_lut(spec, device) else 0


def _num_sms(device) -> int:
    dev = torch.device(device)
    if dev.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _asm_for(spec: TurboQuantSpec, d: int, lut: int) -> str:
    """The key table asm for ``LUT``: 2 = per group of 16 codes (:func:`planes_key_asm` where the key
    field is in nibble-plane order, ``TurboQuantSpec.code_order``), 1 = per 4 byte codes, 0 = none."""
    if lut == 2 and not spec.key_fp8 and spec.code_order("key_idx", d) == "planes":
        return planes_key_asm(spec, d)
    return {0: "", 1: lut_asm, 2: lut_group_asm}[lut](spec, d) if lut else ""


def use_lut(spec: TurboQuantSpec, device: torch.device) -> bool:
    """The ``prmt`` table needs PTX (a CUDA device, not the interpreter) and MSE keys."""
    return torch.device(device).type == "cuda" and spec.key_bits in (3, 4) and not tk_interpret()


def tk_interpret() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
    if any(tk._planes_flags(spec, query.shape[-1]).values()):
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
    KP: tl.constexpr = False, VP: tl.constexpr = False,
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
    ``VP``: key / value codes in nibble-plane order (``_triton_kernels._planes_flags``), cut by
    :func:`_planes_keys` / :func:`_planes_values` (``V8`` and ``W32`` do not apply to them)."""
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
    for i in tl.range(0, TILES, num_stages=1 if W32 else None):  # 32-bit loads: no cp.async staging
        t = (pid * TILES + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_len = t < cached_len
        fk, fn, fv, fs, fz, ok = tk._field_bases(bt_ptr, t, in_len, BLOCK_SIZE, num_blocks, h, stride_cb, stride_ch, stride_ct,
                                                 KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
        if do_v:
            if VP:
                vc = _planes_values(cache16_ptr, fv, ok, D, BLOCK_T, LUT)
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
                yh = _planes_keys(cache16_ptr, fk, ok, c0, c1, c2, c3, c4, c5, c6, c7, D, BLOCK_T, LUT, LUT_ASM)
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
               maxnreg: int | None = None, w32: bool | None = None):
    """The fast dequant (:func:`_dequant_fast_kernel`); launch arguments default to
    ``launch.DEFAULTS["fast_dequant"]``.  Variants (issue 20's dequant target; every one writes the
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
      when the key or value field is 4-bit (measured faster there, slower for 3bit_nc).

    Raises:
        ValueError: unknown ``split``.
    """
    cfg = FAST_DEFAULTS["fast_dequant"]
    block_t = block_t or cfg["block_t"]
    split = split or cfg.get("split", "none")
    if split not in DEQUANT_SPLITS:
        raise ValueError(f"split must be one of {DEQUANT_SPLITS}, got {split!r}")
    v8 = bool(cfg.get("v8", False) if v8 is None else v8) and spec.value_bits in (2, 3, 4)
    maxnreg = maxnreg or cfg.get("maxnreg")
    w32 = bool(dequant_w32_default(spec) if w32 is None else w32) and cache.numel() % 4 == 0 and cache.data_ptr() % 4 == 0
    lut = _lut_mode(spec, cache.device, lut, cfg)
    nb, hk, bs, sb = cache.shape
    d = k_out.shape[-1]
    signs16, _, _, _ = tk._consts(spec, d, cache.device)
    cache32 = cache.view(-1).view(torch.int32) if w32 else signs16  # unused when not w32
    fields = tk._field_addr(spec, d, bs)
    even = w32 and codes_even(fields, cache.stride(0), cache.stride(1), cache.stride(2))
    n_tiles = triton.cdiv(cached_len, block_t)
    if tiles_per_program is None:  # fewer tiles per program where 2 would leave < 4 programs per SM
        tiles_per_program = cfg["tiles"] if hk * n_tiles // cfg["tiles"] >= 4 * _num_sms(cache.device) else 1
    tiles = max(1, min(tiles_per_program, n_tiles))
    n_prog = triton.cdiv(n_tiles, tiles)
    opts = {"num_warps": num_warps or cfg["num_warps"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    args = (cache.view(torch.uint16), block_table_row, k_out, v_out, signs16, cache32, *tk._centroid_poly(spec, d),
            cached_len, nb, cache.stride(0), cache.stride(1), cache.stride(2),
            k_out.stride(1), k_out.stride(2), v_out.stride(1), v_out.stride(2), 1.0 / math.sqrt(d))
    meta = dict(BLOCK_SIZE=bs, D=d, BLOCK_T=block_t, TILES=tiles, KEY_FP8=spec.key_fp8, KBITS=spec.key_bits,
                VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read, **fields, LUT=lut,
                LUT_ASM=_asm_for(spec, d, lut), V8=v8, W32=w32, EVEN=even, **tk._planes_flags(spec, d), **opts)
    if split == "launch":
        _dequant_fast_kernel[(n_prog, hk)](*args, **meta, PART=1)
        kern = _dequant_fast_kernel[(n_prog, hk)](*args, **meta, PART=2)
    elif split == "grid":
        kern = _dequant_fast_kernel[(2 * n_prog, hk)](*args, **meta, PART=0)
    else:
        kern = _dequant_fast_kernel[(n_prog, hk)](*args, **meta)
    tk._record(stats, kern)
