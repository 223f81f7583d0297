"""Prototype (issue 20, one device call): an in-block structure-of-arrays byte order for the
TurboQuant cache, so the fast decode kernel's loads are wide and contiguous.

Layout of one (block, KV head) region of ``block_size * slot_bytes`` bytes (same bytes per token,
same quantizer, the same LSB-first bit stream inside each token's code field)::

    [key codes of token 0 .. BS-1 : BS x key_index_bytes]     16-byte aligned (48 / 64 B each)
    [value codes of token 0 .. BS-1 : BS x value_index_bytes] 16-byte aligned
    [key norms fp16 : BS x 2][value scales fp16 : BS x 2][value zeros fp16 : BS x 2][pad]

vLLM's order keeps all fields of one token together (102-byte slots for 3bit_nc, 2-byte aligned),
so the per-token scalars sit 102 bytes apart (one 32-byte sector per 2 useful bytes) and the
code groups are read as 16-bit words.  Here the scalars of 16 tokens fill one sector and a group
of 16 codes is read as two aligned 32-bit words (``W32``) or three 16-bit ones (``W16``, only the
addresses change).  The SoA cache is made from tqlab's cache by a byte permutation in torch
(``aos_to_soa``), so the prototype needs no new store kernel.  ``soa_x32*``: the same order, 32
codes per thread (4 lanes per token at D = 128), so a 4-bit field chunk is one 16-byte load per
thread and a 3-bit one three 32-bit loads, and fewer lanes share each token's scalars.

Checks every variant against the torch reference (fresh random K/V, shuffled blocks, uneven
sequence lengths, poisoned outputs), then times fp16 SDPA, today's fast kernel and the SoA
variants on the Llama-3.1-8B shard (Hq 32, Hk 8, B 16) and the seed TP-8 rank (Hq 4, Hk 1, B 4)
at 8K / 32K / 128K, CUDA-graph replay with L2 flushed (``_tq_bench.ColdTimer``), splits from
``ops.decode_num_splits(B, Hk, "fill")``.

    python benchmarks/dev_turboquant_soa.py --out $OUT/soa.json
    python benchmarks/dev_turboquant_soa.py --record --commit X   # data/turboquant_soa_prototype_h200.json
    python benchmarks/dev_turboquant_soa.py --profile soa_w32   # one Llama 32K 3bit_nc launch, for ncu
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recording import default_dir
from _tq_bench import ColdTimer, fill_paged, provenance, random_decode_inputs, sdpa

from tqlab.turboquant import TQ_PRESETS, decode_attention
from tqlab.turboquant import _triton_fast as tf
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant.ops import decode_num_splits

ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


def aos_to_soa(cache: torch.Tensor, spec, d: int) -> torch.Tensor:
    """tqlab/vLLM slot order -> the in-block SoA order above (same shape, same bytes per token)."""
    nb, hk, bs, sb = cache.shape
    o = spec.offsets(d)
    kb, vb = spec.key_index_bytes(d), spec.value_index_bytes(d)
    fields = [(0, kb), (o["val_idx"], vb), (o["key_norm"], 2), (o["val_scale"], 2), (o["val_zero"], 2)]
    used = kb + vb + 6
    if used < sb:
        fields.append((used, sb - used))
    parts = [cache[..., a:a + n].reshape(nb, hk, bs * n) for a, n in fields]
    return torch.cat(parts, dim=-1).reshape(nb, hk, bs, sb).contiguous()


@triton.jit
def _words32(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr):
    """The windows of ``_triton_fast._group_words`` from two aligned 32-bit loads per group
    (group ``g`` of 16 codes = bytes ``[2*BITS*g, 2*BITS*g + 2*BITS)`` of a 4-byte aligned field)."""
    g = tl.arange(0, D // 16)
    a = (g * BITS) // 2
    odd = ((g * BITS) % 2 == 1)[None, :]
    ptr = c32 + base32[:, None] + a[None, :]
    m = ok[:, None]
    x0 = tl.load(ptr, mask=m, other=0)
    x1 = tl.load(ptr + 1, mask=m, other=0)
    x0h = (x0 >> 16) & 0xFFFF
    x1h = (x1 >> 16) & 0xFFFF
    mid = x0h | (x1 << 16)
    w0 = tl.where(odd, mid, x0)
    w1 = tl.where(odd, x1, mid)
    w2 = tl.where(odd, x1h, x1)
    return w0, w1, w2, x1h, w0, w0, w0, w0


@triton.jit
def _soa_loads(c16, c32, region16, o, ok, BS: tl.constexpr, D: tl.constexpr, KBITS: tl.constexpr,
               VBITS: tl.constexpr, W32: tl.constexpr):
    """Windows of keys and values, key norm, value scale and zero (fp32) of each token."""
    KW: tl.constexpr = D * KBITS // 16  # 16-bit words of a key field
    VW: tl.constexpr = D * VBITS // 16
    kbase = region16 + o * KW
    vbase = region16 + BS * KW + o * VW
    sbase = region16 + BS * (KW + VW) + o
    if W32:
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _words32(c32, kbase // 2, ok, KBITS, D)
        vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _words32(c32, vbase // 2, ok, VBITS, D)
    else:
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = tf._group_words(c16, kbase, ok, 0, KBITS, D)
        vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = tf._group_words(c16, vbase, ok, 0, VBITS, D)
    kn = tl.load(c16 + sbase, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vs = tl.load(c16 + sbase + BS, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vz = tl.load(c16 + sbase + 2 * BS, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    return kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz


@triton.jit
def _decode_soa_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    W32: tl.constexpr,
):
    """``_triton_fast._decode_fast_kernel`` (no prefetch, in-thread norm) on the SoA order."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, False)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        t = t0 + tl.arange(0, BLOCK_T)
        in_seq = t < end
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=in_seq, other=-1).to(tl.int64)
        ok = in_seq & (blk >= 0) & (blk < num_blocks)
        region16 = tl.where(ok, blk, 0) * stride_cb16 + hk * stride_ch16
        o = (t % BLOCK_SIZE).to(tl.int64)
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz = _soa_loads(
            c16, c32, region16, o, ok, BLOCK_SIZE, D, KBITS, VBITS, W32)
        m_i, l_i, acc, acc_z = tf._fast_tile(
            q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
            in_seq, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
            D, BLOCK_T, False, KBITS, VBITS, NORM_CORR, LUT, LUT_ASM, False)
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


# ----------------------------------------------------------------------------- 32 codes per thread
@triton.jit
def _words_x32(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr):
    """The ``BITS`` 32-bit words of each chunk of 32 codes (a thread's chunk; 4 lanes per token at
    D = 128), int32 ``[T, D // 32]`` each; 4 bits: one 16-byte vector load per chunk."""
    NC: tl.constexpr = D // 32
    gg = tl.arange(0, NC)
    m = ok[:, None]
    if BITS == 4:
        kk = tl.arange(0, 4)
        offs = tl.multiple_of(base32, 4)[:, None, None] + gg[None, :, None] * 4 + kk[None, None, :]
        x = tl.load(c32 + offs, mask=ok[:, None, None], other=0)
        xa, xb = tl.split(tl.reshape(x, (base32.shape[0], NC, 2, 2)))  # words (0, 2) and (1, 3)
        x0, x2 = tl.split(xa)
        x1, x3 = tl.split(xb)
    else:
        ptr = c32 + base32[:, None] + gg[None, :] * BITS
        x0 = tl.load(ptr, mask=m, other=0)
        x1 = tl.load(ptr + 1, mask=m, other=0)
        x2 = tl.load(ptr + 2, mask=m, other=0)
        x3 = x2
    return x0, x1, x2, x3


@triton.jit
def _hi(x):
    return (x >> 16) & 0xFFFF


@triton.jit
def _chunk_windows(x0, x1, x2, x3, BITS: tl.constexpr):
    """Windows (as ``_triton_fast._group_words``) of the two groups of 16 codes of a 32-code chunk."""
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
    head-dim order: the first join (most significant in-thread axis) pairs A and B."""
    c0 = tl.join(e0, f0)
    c1 = tl.join(e1, f1)
    c2 = tl.join(e2, f2)
    c3 = tl.join(e3, f3)
    c4 = tl.join(e4, f4)
    c5 = tl.join(e5, f5)
    c6 = tl.join(e6, f6)
    c7 = tl.join(e7, f7)
    c8 = tl.join(e8, f8)
    c9 = tl.join(e9, f9)
    c10 = tl.join(e10, f10)
    c11 = tl.join(e11, f11)
    c12 = tl.join(e12, f12)
    c13 = tl.join(e13, f13)
    c14 = tl.join(e14, f14)
    c15 = tl.join(e15, f15)
    a0 = tl.join(c0, c8)
    a1 = tl.join(c1, c9)
    a2 = tl.join(c2, c10)
    a3 = tl.join(c3, c11)
    a4 = tl.join(c4, c12)
    a5 = tl.join(c5, c13)
    a6 = tl.join(c6, c14)
    a7 = tl.join(c7, c15)
    b = tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7)))
    return tl.reshape(b, (T, D))


@triton.jit
def _codes32(a0, a1, a2, a3, b0, b1, b2, b3, BITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
             OR: tl.constexpr = 0, LSB: tl.constexpr = 0):
    """All codes ``[T, D]`` (int32, ``code << LSB | OR``) of the chunks' two groups."""
    return _tree32(
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 0, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 1, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 2, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 3, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 4, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 5, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 6, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 7, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 8, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 9, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 10, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 11, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 12, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 13, BITS, OR, LSB),
        tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 14, BITS, OR, LSB), tf._code(a0, a1, a2, a3, a0, a0, a0, a0, 15, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 0, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 1, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 2, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 3, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 4, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 5, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 6, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 7, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 8, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 9, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 10, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 11, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 12, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 13, BITS, OR, LSB),
        tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 14, BITS, OR, LSB), tf._code(b0, b1, b2, b3, b0, b0, b0, b0, 15, BITS, OR, LSB),
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
def _decode_soa4_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
):
    """The SoA order, 32 codes per thread (4 lanes per token): 4-bit fields as one 16-byte load
    per thread and chunk, 3-bit fields as three 32-bit loads."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, False)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    KW: tl.constexpr = D * KBITS // 16
    VW: tl.constexpr = D * VBITS // 16
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        t = t0 + tl.arange(0, BLOCK_T)
        in_seq = t < end
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=in_seq, other=-1).to(tl.int64)
        ok = in_seq & (blk >= 0) & (blk < num_blocks)
        region16 = tl.where(ok, blk, 0) * stride_cb16 + hk * stride_ch16
        o = (t % BLOCK_SIZE).to(tl.int64)
        sbase = region16 + BLOCK_SIZE * (KW + VW) + o
        kx0, kx1, kx2, kx3 = _words_x32(c32, (region16 + o * KW) // 2, ok, KBITS, D)
        ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3 = _chunk_windows(kx0, kx1, kx2, kx3, KBITS)
        k16 = _keys32(ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3, c0, c1, c2, c3, c4, c5, c6, c7, KBITS, D, BLOCK_T, LUT, LUT_ASM)
        kn = tl.load(c16 + sbase, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        sc = tl.dot(q, tl.trans(k16))
        if NORM_CORR:
            y32 = k16.to(tl.float32)
            n2 = tl.sum(y32 * y32, axis=1)
            sc = sc * (kn * qk_scale * tl.where(n2 > 0, tl.rsqrt(n2), 1.0))[None, :]
        else:
            sc = sc * (kn * qk_scale)[None, :]
        sc = tl.where(in_seq[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vx0, vx1, vx2, vx3 = _words_x32(c32, (region16 + BLOCK_SIZE * KW + o * VW) // 2, ok, VBITS, D)
        va0, va1, va2, va3, vb0, vb1, vb2, vb3 = _chunk_windows(vx0, vx1, vx2, vx3, VBITS)
        vc = _codes32(va0, va1, va2, va3, vb0, vb1, vb2, vb3, VBITS, D, BLOCK_T, 0x6400)
        v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        vs = tl.load(c16 + sbase + BLOCK_SIZE, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        vz = tl.load(c16 + sbase + 2 * BLOCK_SIZE, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), v16)
        acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
        m_i = m_new
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


def decode_soa(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse, block_t=64, num_warps=4,
               w32=True, lut=2, stats=None, x32=False, maxnreg=None):
    """Split kernel on an SoA cache, then the portable reduction."""
    bsz, hq, d = query.shape
    nb, hk, bs, sb = cache.shape
    lut = lut if tf.use_lut(spec, query.device) else 0
    args = (query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
            *tk._centroid_poly(spec, d), scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
            query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))
    meta = dict(GROUP=hq // hk, GP=max(16, triton.next_power_of_2(hq // hk)), BLOCK_SIZE=bs, D=d, BLOCK_T=block_t,
                KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction, LUT=lut,
                LUT_ASM=tf._asm_for(spec, d, lut), num_warps=num_warps)
    if maxnreg:
        meta["maxnreg"] = maxnreg
    if x32:
        kern = _decode_soa4_kernel[(bsz, hk, mid_out.shape[2])](*args, **meta)
    else:
        kern = _decode_soa_kernel[(bsz, hk, mid_out.shape[2])](*args, W32=w32, **meta)
    tk._record(stats, kern)
    tk.reduce(mid_out, output, lse)
    return output


VARIANTS = {  # name: (kernel, kwargs) -- "fast" = today's kernel on tqlab's (vLLM's) order
    "fast": ("fast", {}),
    "soa_w16": ("soa", {"w32": False}),
    "soa_w32": ("soa", {"w32": True}),
    "soa_w32_128x8": ("soa", {"w32": True, "block_t": 128, "num_warps": 8}),
    "soa_w32_32x4": ("soa", {"w32": True, "block_t": 32, "num_warps": 4}),
    "soa_x32": ("soa", {"x32": True}),
    "soa_x32_128x4": ("soa", {"x32": True, "block_t": 128, "num_warps": 4}),
    "soa_x32_64x8": ("soa", {"x32": True, "block_t": 64, "num_warps": 8}),
    "soa_x32_128x4_r128": ("soa", {"x32": True, "block_t": 128, "num_warps": 4, "maxnreg": 128}),
    "soa_x32_128x8": ("soa", {"x32": True, "block_t": 128, "num_warps": 8}),
    "soa_x32_256x8": ("soa", {"x32": True, "block_t": 256, "num_warps": 8}),
}


def _call(variant, q, caches, bt, sl, spec, mid, out, lse, stats=None):
    kind, kw = VARIANTS[variant]
    d = q.shape[-1]
    if kind == "fast":
        tf.decode_attention(q, caches[0], bt, sl, spec, d**-0.5, mid, out, lse, stats=stats)
    else:
        decode_soa(q, caches[1], bt, sl, spec, d**-0.5, mid, out, lse, stats=stats, **kw)


def check(log) -> list:
    rows = []
    for seed, (hq, hk, b, ctx) in enumerate([(32, 8, 4, 2048), (4, 1, 3, 3008)]):
        g = torch.Generator(device="cuda").manual_seed(300 + seed)
        d = 128
        k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g) * 2 + 0.5
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        sl = torch.tensor([ctx, 1, ctx - 1096, 17][:b], device="cuda", dtype=torch.int32)
        for name in ROTATED:
            spec = TQ_PRESETS[name]
            cache, bt = fill_paged(spec, k, v, seed=seed)
            caches = (cache, aos_to_soa(cache, spec, d))
            mid = torch.empty(b, hq, 32, d + 1, device="cuda")
            o_ref, l_ref = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16), torch.empty(b, hq, device="cuda")
            decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o_ref, l_ref, backend="torch")
            for var in VARIANTS:
                mid = torch.full((b, hq, 32, d + 1), float("nan"), device="cuda")
                out = torch.full((b, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
                lse = torch.full((b, hq), float("nan"), device="cuda")
                _call(var, q, caches, bt, sl, spec, mid, out, lse)
                row = {"check": "decode", "hq": hq, "preset": name, "variant": var,
                       "nan": bool(torch.isnan(out.float()).any() or torch.isnan(lse).any()),
                       "out_max_abs_vs_torch": float((out.float() - o_ref.float()).abs().max()),
                       "lse_max_abs_vs_torch": float((lse - l_ref).abs().max())}
                row["ok"] = (not row["nan"]) and row["out_max_abs_vs_torch"] < 2e-2 and row["lse_max_abs_vs_torch"] < 1e-2
                rows.append(row)
                log(row)
    return rows


SHAPES = {"llama": (32, 8, 16), "seed": (4, 1, 4)}


def timing(log, contexts, presets, rows, save, variants=None) -> list:
    timer = ColdTimer()
    for shape, (hq, hk, b) in SHAPES.items():
        for ctx in contexts:
            d = 128
            k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=1000 + ctx + b + hq)
            q4 = q.to(torch.float16)[:, :, None, :]
            sdpa_ms = timer(lambda: sdpa(q4, k, v, d**-0.5))
            sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
            s = decode_num_splits(b, hk, "fill")
            for name in presets:
                spec = TQ_PRESETS[name]
                cache, bt = fill_paged(spec, k, v)
                caches = (cache, aos_to_soa(cache, spec, d))
                mid = torch.empty(b, hq, s, d + 1, device="cuda")
                out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, hq, device="cuda")
                row = {"shape": shape, "hq": hq, "hk": hk, "batch": b, "ctx": ctx, "preset": name, "splits": s,
                       "sdpa_ms": sdpa_ms}
                for var in variants or VARIANTS:
                    try:
                        st: dict = {}
                        _call(var, q, caches, bt, sl, spec, mid, out, lse, stats=st)
                        row[f"{var}_ms"] = timer(lambda: _call(var, q, caches, bt, sl, spec, mid, out, lse))
                        row[f"{var}_regs"] = st.get("n_regs")
                    except Exception as exc:  # keep the other variants
                        traceback.print_exc()
                        row[f"{var}_error"] = repr(exc)[:300]
                best = min((row[f"{v}_ms"], v) for v in VARIANTS if v != "fast" and f"{v}_ms" in row)
                row["best_soa"], row["best_soa_ms"] = best[1], best[0]
                row["fast_over_best_soa"] = row["fast_ms"] / best[0]
                row["sdpa_over_fast"] = sdpa_ms / row["fast_ms"]
                row["sdpa_over_best_soa"] = sdpa_ms / best[0]
                rows.append(row)
                log(row)
                torch.cuda.empty_cache()
            save()
    return rows


def table(rows) -> str:
    names = [v for v in VARIANTS if v != "fast" and any(f"{v}_ms" in r for r in rows)]
    out = ["| shape | ctx | preset | SDPA ms | fast ms | " + " | ".join(f"{v} ms" for v in names)
           + " | fast / best SoA | SDPA / fast | SDPA / best SoA |", "|" + "---|" * (8 + len(names))]
    for r in rows:
        soa = " | ".join(f"{r.get(f'{v}_ms', float('nan')):.3f}" for v in names)
        out.append(f"| {r['shape']} B{r['batch']} | {r['ctx'] // 1024}K | {r['preset'].removeprefix('turboquant_')} | "
                   f"{r['sdpa_ms']:.3f} | {r['fast_ms']:.3f} | {soa} | {r['fast_over_best_soa']:.2f}x | "
                   f"{r['sdpa_over_fast']:.2f}x | {r['sdpa_over_best_soa']:.2f}x |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output file (default: build/turboquant_soa_prototype_h200.json, data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--presets", default=",".join(ROTATED))
    ap.add_argument("--variants", default="", help="comma list of VARIANTS to time (default: all; 'fast' always runs)")
    ap.add_argument("--profile", default=None, choices=list(VARIANTS),
                    help="run one launch of this variant (Llama shard, B 16, 32K, 3bit_nc) after a warm-up: for ncu")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file this run writes: ``--out``, else ``build/`` (``data/`` with ``--record``); none with ``--profile``."""
    if args.profile:
        return []
    return [Path(args.out) if args.out else default_dir(args) / "turboquant_soa_prototype_h200.json"]


def profile(variant: str) -> int:
    """Two launches of one variant on the Llama shard at 32K (3bit_nc): ncu profiles the second."""
    hq, hk, b = SHAPES["llama"]
    d, ctx = 128, 32768
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16)
    cache, bt = fill_paged(spec, k, k * 0.5 + 0.1)
    caches = (cache, aos_to_soa(cache, spec, d))
    q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
    sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    mid = torch.empty(b, hq, 32, d + 1, device="cuda")
    out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(b, hq, device="cuda")
    for _ in range(2):
        _call(variant, q, caches, bt, sl, spec, mid, out, lse)
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("dev_turboquant_soa.py times CUDA kernels: no CUDA device here", file=sys.stderr)
        return 2
    if args.profile:
        return profile(args.profile)
    t0 = time.time()
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"provenance": provenance(args), "method": __doc__, "check": [], "rows": []}

    def log(row):
        print(f"[{time.time() - t0:6.1f}s] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in row.items()), flush=True)

    def save():
        res["wall_s"] = time.time() - t0
        out.write_text(json.dumps(res, indent=1))

    res["check"] = check(log)
    bad = [r for r in res["check"] if not r["ok"]]
    print(f"CHECK: {len(res['check']) - len(bad)} ok, {len(bad)} failed", flush=True)
    save()
    variants = ["fast"] + [v for v in args.variants.split(",") if v and v != "fast"] if args.variants else None
    timing(log, [int(c) for c in args.contexts.split(",")], args.presets.split(","), res["rows"], save, variants)
    res["table"] = table(res["rows"])
    save()
    print(res["table"])
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
