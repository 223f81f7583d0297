"""Unpacking jit helpers of the fast TurboQuant kernels, 16 codes per thread (issue 20), shared by the fast
decode (``_triton_fast``), the fast dequant (``_triton_dequant``) and the block-SoA decode
(``_triton_soa``, ``_triton_soa_unpack``).  Moved here from ``_triton_fast`` (no change to any function).

* the code words of a group of 16 codes as 32-bit windows (:func:`_group_words`) and the codes cut
  from them (:func:`_code`, :func:`_codes`), joined into a ``[T, D]`` tile in natural head-dim order
  (``tl.join`` adds in-thread axes: :func:`_tree16`);
* key centroids (:func:`_centroids16`: the ``prmt`` table asm of ``ptx_tables`` or the exact
  polynomial), 4-bit values by :data:`ptx_tables.VALUE4_ASM` (:func:`_values4`), nibble-plane codes
  (:func:`_planes16`, :func:`_plane_code`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant.ptx_tables import VALUE4_ASM


# ----------------------------------------------------------------------------- 16 codes per asm
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
