"""Load and unpack jit helpers of the block-SoA decode ``_triton_soa._decode_soa4_kernel`` (32 codes per
thread, issue 20; the module docstring of ``_triton_soa`` explains the loads and the kWidth-4 slot order).
Moved here from ``_triton_soa`` (no change to any function; the compiled kernels are byte-identical).

* chunk loads: :func:`_words_x32`, :func:`_chunk_words4`, :func:`_fp8_keys32`; windows of the two groups of
  16 codes of a chunk: :func:`_chunk_windows`;
* the kWidth-4 slot order of q and the key tile: :func:`_perm_cols`, :func:`_perm_rows_t`;
* ``[T, D]`` tiles from 32 per-code tensors: :func:`_tree32`, :func:`_codes32`, :func:`_keys32` (the
  ``prmt`` group table), :func:`_planes32` (nibble planes), :func:`_fp8_to_f16` (``ptx_tables.FP8_PTX``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import _triton_unpack as tu
from tqlab.turboquant.ptx_tables import FP8_ASM


@triton.jit
def _words_x32(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr, PLANES: tl.constexpr = 0):
    """The ``BITS`` 32-bit words of each chunk of 32 codes (a thread's chunk; 4 lanes per token at
    D = 128), int32 ``[T, D // 32]`` each (3 bits: words 0, 1, 2 of the chunk and word 2 again).  The
    loads are shaped so Triton 3.6 puts a token's chunks on 4 lanes (module docstring): 4 bits -- the
    token's ``D // 8`` words as one contiguous ``[T, D // 8]`` load (one 16-byte vector per chunk);
    3 bits -- ``[D // 32, T]`` pointer tensors, loaded and transposed: with ``PLANES`` (the nibble planes' plane
    stride in 16-bit words, ``_triton_kernels._planes_flags``) ``L0, L1, H`` of chunk ``c`` at 32-bit words ``c``,
    ``c + PLANES / 2``, ``c + PLANES`` (each load instruction of a warp: 8 tokens x 4 chunks = 128 contiguous
    bytes), else chunk ``c``'s three words at ``3 c``."""
    NC: tl.constexpr = D // 32
    if BITS == 4:
        x0, x1, x2, x3 = _chunk_words4(c32, base32, ok, 4, D)
    else:
        m = ok[None, :]
        if PLANES:
            # contiguity 1 declared: a token's 4 chunk words are contiguous now, and Triton would load them as one
            # vector per thread (a token per thread), then convert the tile to 4 lanes per token through shared memory
            ptr = c32 + base32[None, :] + tl.max_contiguous(tl.arange(0, NC), 1)[:, None]
            x0 = tl.trans(tl.load(ptr, mask=m, other=0))
            x1 = tl.trans(tl.load(ptr + PLANES // 2, mask=m, other=0))
            x2 = tl.trans(tl.load(ptr + PLANES, mask=m, other=0))
        else:
            ptr = c32 + base32[None, :] + tl.arange(0, NC)[:, None] * BITS
            x0 = tl.trans(tl.load(ptr, mask=m, other=0))
            x1 = tl.trans(tl.load(ptr + 1, mask=m, other=0))
            x2 = tl.trans(tl.load(ptr + 2, mask=m, other=0))
        x3 = x2
    return x0, x1, x2, x3


@triton.jit
def _chunk_words4(c32, base32, ok, STEP: tl.constexpr, D: tl.constexpr):
    """Words 0 .. 3 of each chunk (int32 ``[T, D // 32]`` each) from one ``[T, D // 8]`` load: chunk ``g``'s
    words at ``base32 + STEP * g`` (``STEP`` 4: contiguous, 4-bit codes; 8: the first half of fp8 keys)."""
    j = tl.arange(0, D // 8)
    if STEP == 4:
        offs = tl.multiple_of(base32, 4)[:, None] + j[None, :]
    else:
        offs = tl.multiple_of(base32, 4)[:, None] + ((j // 4) * STEP + j % 4)[None, :]
    x = tl.load(c32 + offs, mask=ok[:, None], other=0)
    xa, xb = tl.split(tl.reshape(x, (base32.shape[0], D // 32, 2, 2)))  # words (0, 2) and (1, 3) of each chunk
    x0, x2 = tl.split(xa)
    x1, x3 = tl.split(xb)
    return x0, x1, x2, x3


@triton.jit
def _perm_cols(x, R: tl.constexpr, D: tl.constexpr):
    """Columns of ``x [R, D]`` in the kWidth-4 mma slot order: slot ``32j + 16h + 4t + i`` <- natural head dim
    ``32t + 8j + 4h + i`` (module docstring)."""
    return tl.reshape(tl.permute(tl.reshape(x, (R, D // 32, 4, 2, 4)), (0, 2, 3, 1, 4)), (R, D))


@triton.jit
def _perm_rows_t(x, T: tl.constexpr, D: tl.constexpr):
    """``trans(_perm_cols(x))`` as one permute: ``[D, T]``, rows in the kWidth-4 mma slot order."""
    return tl.reshape(tl.permute(tl.reshape(x, (T, D // 32, 4, 2, 4)), (2, 3, 1, 4, 0)), (D, T))



@triton.jit
def _fp8_keys32(c32, base32, ok, D: tl.constexpr, T: tl.constexpr, PTX: tl.constexpr):
    """fp16 keys ``[T, D]`` of a block-SoA fp8 (e4m3) key field (k8v4): a thread's 32 bytes as two
    16-byte loads (two ``[T, D // 8]`` loads, each laid out 4 lanes per token by Triton 3.6), then
    :func:`_fp8_to_f16`."""
    w0, w1, w2, w3 = _chunk_words4(c32, base32, ok, 8, D)  # bytes 0 .. 15 of each chunk
    w4, w5, w6, w7 = _chunk_words4(c32, base32 + 4, ok, 8, D)  # bytes 16 .. 31
    return _fp8_to_f16(w0, w1, w2, w3, w4, w5, w6, w7, D, T, PTX)


@triton.jit
def _fp8_to_f16(w0, w1, w2, w3, w4, w5, w6, w7, D: tl.constexpr, T: tl.constexpr, PTX: tl.constexpr):
    """``[T, D]`` fp16 of the chunks' words 0 .. 7 (int32 ``[T, D // 32]`` each, fp8 e4m3 bytes, little
    endian); ``PTX``: by :data:`FP8_PTX`, else (interpreter) byte by byte through Triton's fp8 type."""
    if PTX:
        e = tl.inline_asm_elementwise(FP8_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
                                      [w0, w1, w2, w3], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
        f = tl.inline_asm_elementwise(FP8_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
                                      [w4, w5, w6, w7], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
        k16 = _tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14],
                      e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13],
                      f[14], f[15], T, D)
    else:
        k16 = _tree32(_b8(w0, 0), _b8(w0, 1), _b8(w0, 2), _b8(w0, 3), _b8(w1, 0), _b8(w1, 1), _b8(w1, 2), _b8(w1, 3),
                      _b8(w2, 0), _b8(w2, 1), _b8(w2, 2), _b8(w2, 3), _b8(w3, 0), _b8(w3, 1), _b8(w3, 2), _b8(w3, 3),
                      _b8(w4, 0), _b8(w4, 1), _b8(w4, 2), _b8(w4, 3), _b8(w5, 0), _b8(w5, 1), _b8(w5, 2), _b8(w5, 3),
                      _b8(w6, 0), _b8(w6, 1), _b8(w6, 2), _b8(w6, 3), _b8(w7, 0), _b8(w7, 1), _b8(w7, 2), _b8(w7, 3),
                      T, D)
    return k16


@triton.jit
def _b8(w, K: tl.constexpr):
    """Byte ``K`` of each word as an fp8 e4m3 value, in fp16."""
    return ((w >> (8 * K)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _hi(x):
    return (x >> 16) & 0xFFFF


@triton.jit
def _chunk_windows(x0, x1, x2, x3, BITS: tl.constexpr):
    """Windows (as ``_triton_unpack._group_words``) of the two groups of 16 codes of a 32-code chunk."""
    if BITS == 4:
        a0, a1, a2, a3 = x0, _hi(x0) | (x1 << 16), x1, _hi(x1)
        b0, b1, b2, b3 = x2, _hi(x2) | (x3 << 16), x3, _hi(x3)
    else:
        a0, a1, a2, a3 = x0, _hi(x0) | (x1 << 16), x1, x0
        b0, b1, b2, b3 = _hi(x1) | (x2 << 16), x2, _hi(x2), x0
    return a0, a1, a2, a3, b0, b1, b2, b3


@triton.jit
def _tree32(e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15,
            f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, T: tl.constexpr, D: tl.constexpr):
    """``[T, D]`` from code i of group A (``e_i``) and of group B (``f_i``) of every chunk, natural
    head-dim order: the first join (most significant in-thread axis) pairs A and B, then
    :func:`_triton_unpack._tree16`'s tree over the 16 pairs."""
    return tu._tree16(tl.join(e0, f0), tl.join(e1, f1), tl.join(e2, f2), tl.join(e3, f3), tl.join(e4, f4),
                      tl.join(e5, f5), tl.join(e6, f6), tl.join(e7, f7), tl.join(e8, f8), tl.join(e9, f9),
                      tl.join(e10, f10), tl.join(e11, f11), tl.join(e12, f12), tl.join(e13, f13), tl.join(e14, f14),
                      tl.join(e15, f15), D, T)


@triton.jit
def _codes32(a0, a1, a2, a3, b0, b1, b2, b3, BITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
             OR: tl.constexpr = 0, LSB: tl.constexpr = 0):
    """All codes ``[T, D]`` (int32, ``code << LSB | OR``) of the chunks' two groups."""
    return _tree32(
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 0, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 1, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 2, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 3, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 4, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 5, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 6, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 7, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 8, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 9, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 10, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 11, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 12, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 13, BITS, OR, LSB),
        tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 14, BITS, OR, LSB), tu._code(a0, a1, a2, a3, a0, a0, a0, a0, 15, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 0, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 1, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 2, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 3, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 4, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 5, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 6, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 7, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 8, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 9, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 10, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 11, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 12, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 13, BITS, OR, LSB),
        tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 14, BITS, OR, LSB), tu._code(b0, b1, b2, b3, b0, b0, b0, b0, 15, BITS, OR, LSB),
        T, D)


@triton.jit
def _asm16(w0, w1, w2, w3, KBITS: tl.constexpr, ASM: tl.constexpr):
    if KBITS == 3:
        e = tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [w0, w1, w2],
                                      dtype=(tl.float16,) * 16, is_pure=True, pack=1)
    else:
        e = tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [w0, w1, w2, w3],
                                      dtype=(tl.float16,) * 16, is_pure=True, pack=1)
    return e


@triton.jit
def _keys32(a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, c4, c5, c6, c7,
            KBITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr, LUT: tl.constexpr, ASM: tl.constexpr):
    """fp16 centroids ``[T, D]``: the group ``prmt`` table asm per 16 codes (LUT 2) or the polynomial."""
    if LUT == 2:
        e = _asm16(a0, a1, a2, a3, KBITS, ASM)
        f = _asm16(b0, b1, b2, b3, KBITS, ASM)
        yh = _tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14], e[15],
                     f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15],
                     T, D)
    else:
        x = _codes32(a0, a1, a2, a3, b0, b1, b2, b3, KBITS, D, T, 0x3F800000, 23 - KBITS).to(tl.float32, bitcast=True)
        yh = tk._centroid_value(x, c0, c1, c2, c3, c4, c5, c6, c7, KBITS).to(tl.float16)
    return yh


@triton.jit
def _planes32(x0, x1, x2, c0, c1, c2, c3, c4, c5, c6, c7, T: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr,
              OR: tl.constexpr, LSB: tl.constexpr, CENT: tl.constexpr):
    """``[T, D]`` of a 3-bit field in nibble-plane order from the chunk words ``x0, x1, x2`` = ``L0,
    L1, H`` (:func:`_words_x32`): with ``ASM`` (``ptx_tables.planes_asm``) fp16 table values, the
    half chunks ``(L0, H << 2)`` and ``(L1, H)``; else (the interpreter, ``LUT`` 0) the integer
    codes ``code << LSB | OR`` of ``_triton_unpack._plane_code``, fp16 centroids by the exact
    polynomial with ``CENT`` (3-bit keys), int32 otherwise."""
    h2 = x2 << 2
    if ASM != "":
        e = tu._planes16(x0, h2, ASM)
        f = tu._planes16(x1, x2, ASM)
        r = _tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14],
                    e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13],
                    f[14], f[15], T, D)
    else:
        r = _tree32(
            tu._plane_code(x0, h2, 0, OR, LSB), tu._plane_code(x0, h2, 1, OR, LSB), tu._plane_code(x0, h2, 2, OR, LSB),
            tu._plane_code(x0, h2, 3, OR, LSB), tu._plane_code(x0, h2, 4, OR, LSB), tu._plane_code(x0, h2, 5, OR, LSB),
            tu._plane_code(x0, h2, 6, OR, LSB), tu._plane_code(x0, h2, 7, OR, LSB), tu._plane_code(x0, h2, 8, OR, LSB),
            tu._plane_code(x0, h2, 9, OR, LSB), tu._plane_code(x0, h2, 10, OR, LSB), tu._plane_code(x0, h2, 11, OR, LSB),
            tu._plane_code(x0, h2, 12, OR, LSB), tu._plane_code(x0, h2, 13, OR, LSB), tu._plane_code(x0, h2, 14, OR, LSB),
            tu._plane_code(x0, h2, 15, OR, LSB),
            tu._plane_code(x1, x2, 0, OR, LSB), tu._plane_code(x1, x2, 1, OR, LSB), tu._plane_code(x1, x2, 2, OR, LSB),
            tu._plane_code(x1, x2, 3, OR, LSB), tu._plane_code(x1, x2, 4, OR, LSB), tu._plane_code(x1, x2, 5, OR, LSB),
            tu._plane_code(x1, x2, 6, OR, LSB), tu._plane_code(x1, x2, 7, OR, LSB), tu._plane_code(x1, x2, 8, OR, LSB),
            tu._plane_code(x1, x2, 9, OR, LSB), tu._plane_code(x1, x2, 10, OR, LSB), tu._plane_code(x1, x2, 11, OR, LSB),
            tu._plane_code(x1, x2, 12, OR, LSB), tu._plane_code(x1, x2, 13, OR, LSB), tu._plane_code(x1, x2, 14, OR, LSB),
            tu._plane_code(x1, x2, 15, OR, LSB), T, D)
        if CENT:
            r = tk._centroid_value(r.to(tl.float32, bitcast=True), c0, c1, c2, c3, c4, c5, c6, c7, 3).to(tl.float16)
    return r
