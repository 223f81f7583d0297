"""Fast decode for the block-SoA cache layout (``TurboQuantSpec.cache_layout == "block_soa"``,
issue 20; measured in ``benchmarks/NOTES_turboquant.md``, driver ``benchmarks/dev_turboquant_soa.py``).

The block-SoA order of one (block, KV head) region (:meth:`TurboQuantSpec.field_addresses`): the
key codes of all BS tokens, then their value codes, then the BS key norms, value scales and value
zeros as fp16 arrays; with ``BS % 16 == 0`` every field starts 16-byte aligned.  The store kernel,
the portable decode / dequant and the fast dequant read and write either layout through per-field
addresses; only the decode has a kernel of its own here:

* ``_decode_soa4_kernel`` (the default, ``x32``): 32 codes per thread (4 lanes per token at
  D = 128): a 4-bit chunk is one 16-byte load per thread, a 3-bit one three aligned 32-bit loads;
  the two groups of 16 codes of a chunk go through the ``prmt`` table asm of ``ptx_tables``; 128-token
  tiles, 4 warps, at most 96 registers (5 CTAs per SM), a query tile of the GQA group's own rows
  (``gp_min``; issue 20 round 4, below); the key tile goes to the score MMA in registers (below).
* ``_decode_soa_kernel`` (prototype kept for the driver's comparison): the fast kernel's 16 codes
  per thread on this order, ``W32`` = two aligned 32-bit loads per group; it reads vLLM's bit
  stream only, so :func:`decode_attention` refuses it for a cache with nibble-plane fields (the
  3-bit presets, ``TurboQuantSpec.code_order``).

3-bit code fields on this layout are nibble planes (``TurboQuantSpec.code_order``, words ``L0, L1,
H`` per 32-code chunk): the 8-code ``prmt`` selector is 3 ops (``ptx_tables.planes_asm``) instead
of ~22; static SASS of the 3bit_nc loop ``benchmarks/NOTES_turboquant.md`` "Nibble planes, integrated".

Then ``_triton_kernels``' reduction.  Every preset: fp8 keys (k8v4) too, two 16-byte loads per 32 key bytes
converted by ``cvt.rn.f16x2.e4m3x2`` (issue 20; the portable kernel's one-token-per-lane loads gained nothing
from the block-SoA order).  Caches whose fields are not 16-byte aligned take the per-field portable / fast
kernels (:func:`use_soa`).

The load / unpack jit helpers of ``_decode_soa4_kernel`` (``_words_x32``, ``_chunk_words4``, ``_chunk_windows``,
``_perm_cols``, ``_perm_rows_t``, ``_fp8_keys32``, ``_fp8_to_f16``, ``_tree32``, ``_codes32``, ``_keys32``,
``_planes32``) are in ``_triton_soa_unpack``, ``FP8_PTX`` / ``FP8_ASM`` in ``ptx_tables`` (moved there, same SASS).

The key tile straight to the MMA (issue 20; prototype ``benchmarks/dev_turboquant_frag.py``, its
variant 3).  ``q . k`` contracts over D in any order, so q's and k's columns are both permuted by
``pi(32j + 16h + 4t + i) = 32t + 8j + 4h + i`` (:func:`_perm_cols`, :func:`_perm_rows_t`): for the mma
m16n8k16 B operand with kWidth 4 (Triton 3.6 builds the score dot with kWidth 4), lane ``t = lane % 4``
holds per 32-wide k step ``j`` exactly the slots of its own 32 contiguous natural codes, and warp
``w`` / lane ``lane // 4`` own tokens ``32r + 8w + lane // 4`` in both the unpacking layout and the
operand layout, so ``convert_layout`` to the dot operand is a register no-op (no ``local_alloc`` of
the key tile).  It relies on Triton's layout inference, not on explicit layouts:

* Triton 3.6 (the H200's) lays the natural ``[T, D // 32]`` chunk loads out one token per thread
  (``threadsPerWarp [32, 1]``); :func:`_words_x32` / :func:`_chunk_words4` therefore load 4-bit codes
  and fp8 keys as contiguous ``[T, D // 8]`` tiles (16-byte vectors: 4 lanes per token) and 3-bit codes
  through ``[D // 32, T]`` pointers, transposed (the chunk words ``L0, L1, H`` of the nibble planes
  too).  Static sm_90 compile (``benchmarks/_sass_sm90.py`` with the launcher's 16-divisibility,
  Triton 3.6, D 128, GQA 4, ``maxnreg`` 128, no spills), loop SASS / loop ``STS`` per thread and
  128-token tile, before (``dev_turboquant_frag.py`` v0) -> after: 3bit_nc 1792 / 268 -> 1482 / 31,
  k3v4_nc 1832 / 268 -> 1604 / 32, 4bit_nc 2063 / 268 -> 1780 / 31, k8v4 1892 / 229 -> 1298 / 29.
  H200 (``data/turboquant_frag_prototype_h200.json``, the prototype = this kernel's loads and order,
  ColdTimer): Llama shard B 16, 3-bit fields as nibble planes (``p3``): 3bit_nc 0.543 -> 0.418 ms at
  32K, 2.092 -> 1.593 ms at 128K (fp16 SDPA 1.91 ms); in vLLM's bit order (``v3``) 1.23-1.33x over
  the rotated presets; seed rank 1.07-1.26x.
* Triton 3.9 builds the first dot with kWidth 2 and lays the ``[T, D // 32]`` loads out 4 lanes per
  token already; there the matching order is ``pi(16j + 8h + 2t + p) = 32t + 4j + 2h + p`` with the
  natural loads (``dev_turboquant_frag.py`` variant 1).  This kernel compiled by 3.9 (static, same
  settings) has no key-tile ``local_alloc`` either but converts 3-bit chunks through shared memory:
  loop SASS v0 -> this kernel 3bit_nc 1314 -> 1283 (loop ``STS`` 41 -> 137), k3v4_nc 1322 -> 1160,
  4bit_nc 1595 -> 1463 (stack 40 -> 80 B), k8v4 1543 -> 1062 (stack 136 -> 8 B).  After a Triton
  upgrade on the GPU, re-check with ``_sass_sm90.py`` under the GPU's version (loop ``STS`` ~30, no
  spills) and time ``dev_turboquant_frag.py``.

Query tile rows (issue 20, round 4; ``launch.SOA_DEFAULTS`` ``gp_min`` 4, :func:`_triton_kernels.query_tile_rows`):
``tl.dot`` takes M below 16 and Triton pads the m16n8k16 MMA itself, so a GQA group of 4 no longer pads q to 16 rows
in the program: the online softmax, the rescale and the partials run on 4 rows instead of 16.  Static sm_90 (Triton
3.6, 128 x 4): loop SASS 3bit_nc 1482 -> 1348 at 128 registers, 124 -> 108 registers, and at a cap of 96 (5 CTAs per
SM) 1342 with no spills (4bit_nc spills 72 B at 96).  H200 (``data/turboquant_gp_launch_h200.json``): Llama shard
128K 3bit_nc 1.592 -> 1.418 ms (4 rows) -> 1.319 ms (4 rows, 96 registers).

The value tile stays staged through shared memory (``STS.128`` + ``LDSM.T``): ``P V`` contracts over
tokens, which the MMA keeps inside a warp, while a tile's tokens are spread over the 4 warps.

Key norms on this layout are folded (``TurboQuantSpec.norm_folded``): the store wrote
``||k|| / ||c_hat||`` for the ``_nc`` presets, so a score is ``(q . c_hat) * stored * scale`` with no
per-token ``sum(c_hat**2)`` / rsqrt (``NORM_CORR`` = ``norm_correction_on_read`` is False here; vLLM
0.33's SoA readers likewise multiply only: ``vllm/v1/attention/ops/turboquant_soa/
triton_turboquant_decode.py`` ``_tq_decode_stage1``, ``triton_turboquant_unified_attention.py``
``_tq_load_k_tile``).  Measured with ``benchmarks/_sass_sm90.py`` (sm_90, Triton 3.9): the loop of
``_decode_soa4_kernel`` for 3bit_nc went from 2033 to 1632 SASS instructions.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tqlab.turboquant import _triton_fast as tf
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import _triton_unpack as tu
from tqlab.turboquant import ptx_tables as pt
from tqlab.turboquant._triton_soa_unpack import (_chunk_windows, _codes32, _fp8_keys32, _keys32, _perm_cols,
                                                 _perm_rows_t, _planes32, _tree32, _words_x32)
from tqlab.turboquant.launch import SOA_DEFAULTS
from tqlab.turboquant.spec import TurboQuantSpec

__all__ = ["use_soa", "decode_attention"]


def use_soa(spec: TurboQuantSpec, cache: torch.Tensor, head_dim: int) -> bool:
    """This module's decode serves a block-SoA cache on CUDA (every preset: MSE keys, and fp8 keys
    since issue 20's k8v4 path) when every field is 16-byte aligned: ``block_size % 16 == 0``, whole
    32-code chunks (``head_dim`` a multiple of 32) and a 16-byte aligned cache pointer."""
    return (spec.cache_layout == "block_soa" and cache.device.type == "cuda" and not pt.tk_interpret()
            and cache.shape[2] % 16 == 0 and head_dim >= 32 and head_dim % 32 == 0 and cache.data_ptr() % 16 == 0)


@triton.jit
def _words32(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr):
    """The windows of ``_triton_unpack._group_words`` from two aligned 32-bit loads per group
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
def _soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16, BLOCK_SIZE: tl.constexpr,
              BLOCK_T: tl.constexpr):
    """Tokens ``t0 .. t0 + BLOCK_T`` of a split: ``(in_seq, ok, region16, o)``: inside the sequence, a valid
    block, the 16-bit index of the token's (block, KV head) region, and the token's slot in its block."""
    t = t0 + tl.arange(0, BLOCK_T)
    in_seq = t < end
    blk = tl.load(bt_row + t // BLOCK_SIZE, mask=in_seq, other=-1).to(tl.int64)
    ok = in_seq & (blk >= 0) & (blk < num_blocks)
    return in_seq, ok, tl.where(ok, blk, 0) * stride_cb16 + hk * stride_ch16, (t % BLOCK_SIZE).to(tl.int64)


@triton.jit
def _soa_loads(c16, c32, region16, o, ok, D: tl.constexpr, KBITS: tl.constexpr, VBITS: tl.constexpr,
               W32: tl.constexpr, KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr,
               VO: tl.constexpr, VS: tl.constexpr, SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr,
               ZS: tl.constexpr):
    """Windows of keys and values, key norm, value scale and zero (fp32) of each token."""
    kbase = region16 + o * KS + KO
    vbase = region16 + o * VS + VO
    if W32:
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = _words32(c32, kbase // 2, ok, KBITS, D)
        vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = _words32(c32, vbase // 2, ok, VBITS, D)
    else:
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7 = tu._group_words(c16, kbase, ok, 0, KBITS, D)
        vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7 = tu._group_words(c16, vbase, ok, 0, VBITS, D)
    kn = tl.load(c16 + region16 + o * NS + NO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vs = tl.load(c16 + region16 + o * SS + SO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    vz = tl.load(c16 + region16 + o * ZS + ZO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    return kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz


@triton.jit
def _decode_soa_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    W32: tl.constexpr, KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr,
    VS: tl.constexpr, SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr,
):
    """``_triton_fast._decode_fast_kernel`` (no prefetch) on the SoA order; ``NORM_CORR`` =
    ``norm_correction_on_read``, False on a folded block-SoA cache."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, False)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        in_seq, ok, region16, o = _soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16,
                                            BLOCK_SIZE, BLOCK_T)
        kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz = _soa_loads(
            c16, c32, region16, o, ok, D, KBITS, VBITS, W32, KO, KS, NO, NS, VO, VS, SO, SS, ZO, ZS)
        m_i, l_i, acc, acc_z = tf._fast_tile(
            q, ones, kw0, kw1, kw2, kw3, kw4, kw5, kw6, kw7, kn, vw0, vw1, vw2, vw3, vw4, vw5, vw6, vw7, vs, vz,
            in_seq, m_i, l_i, acc, acc_z, c0, c1, c2, c3, c4, c5, c6, c7, qk_scale,
            D, BLOCK_T, False, KBITS, VBITS, NORM_CORR, LUT, LUT_ASM, False)
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


@triton.jit
def _decode_soa4_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, KEY_FP8: tl.constexpr = False,
    PTX: tl.constexpr = False, KP: tl.constexpr = 0, VP: tl.constexpr = 0,
):
    """The SoA order, 32 codes per thread (4 lanes per token): 4-bit fields as one 16-byte load
    per thread and chunk, 3-bit fields as three 32-bit loads, fp8 keys (``KEY_FP8``, k8v4) as two
    16-byte loads; q and the key tile in the kWidth-4 slot order (module docstring: Triton 3.6's
    layouts put the key tile in the score MMA's registers).  ``PTX``: inline-PTX conversions (fp8
    keys, 4-bit values, nibble-plane values; not under the interpreter).  Key norms are read folded
    (``TurboQuantSpec.norm_folded``): ``NORM_CORR`` must be False (static assert).  3-bit fields in
    nibble-plane order (``KP`` / ``VP``: their plane stride, 0 = none; ``TurboQuantSpec.code_order``) are cut by :func:`_planes32`
    from the chunk words ``L0, L1, H`` (keys with ``LUT`` 2: ``LUT_ASM`` = ``ptx_tables.planes_key_asm``)."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, KEY_FP8)
    q = _perm_cols(q, GP, D)  # q . k over D in the kWidth-4 slot order: the key tile reaches tl.dot in registers
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        in_seq, ok, region16, o = _soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16,
                                            BLOCK_SIZE, BLOCK_T)
        if KEY_FP8:
            k16 = _fp8_keys32(c32, (region16 + o * KS + KO) // 2, ok, D, BLOCK_T, PTX)
            sc = tl.dot(q, _perm_rows_t(k16, BLOCK_T, D)) * qk_scale
        else:
            kx0, kx1, kx2, kx3 = _words_x32(c32, (region16 + o * KS + KO) // 2, ok, KBITS, D, KP)
            if KP:
                k16 = _planes32(kx0, kx1, kx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D,
                                LUT_ASM if LUT == 2 else "", 0x3F800000, 20, True)
            else:
                ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3 = _chunk_windows(kx0, kx1, kx2, kx3, KBITS)
                k16 = _keys32(ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3, c0, c1, c2, c3, c4, c5, c6, c7, KBITS, D, BLOCK_T,
                              LUT, LUT_ASM)
            kn = tl.load(c16 + region16 + o * NS + NO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
            tl.static_assert(not NORM_CORR, "block-SoA key norms are folded (TurboQuantSpec.norm_folded)")
            sc = tl.dot(q, _perm_rows_t(k16, BLOCK_T, D)) * (kn * qk_scale)[None, :]  # kn = ||k|| / ||c_hat|| for the _nc presets
        m_new, alpha, p, l_i = tk._online_step(sc, in_seq, m_i, l_i)
        vx0, vx1, vx2, vx3 = _words_x32(c32, (region16 + o * VS + VO) // 2, ok, VBITS, D, VP)
        if VP and PTX:  # exact integers from the planes asm's table of fp16(0..7)
            v16 = _planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, pt.PLANES_VALUE_ASM, 0, 0, False)
        elif VP:
            vc = _planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, "", 0x6400, 0, False)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        elif VBITS == 4 and PTX:  # exact integer codes by the 0x6400 half2 trick
            e = tl.inline_asm_elementwise(pt.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx0, vx1], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            f = tl.inline_asm_elementwise(pt.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx2, vx3], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            v16 = _tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14],
                          e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13],
                          f[14], f[15], BLOCK_T, D)
        else:
            va0, va1, va2, va3, vb0, vb1, vb2, vb3 = _chunk_windows(vx0, vx1, vx2, vx3, VBITS)
            vc = _codes32(va0, va1, va2, va3, vb0, vb1, vb2, vb3, VBITS, D, BLOCK_T, 0x6400)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        vs = tl.load(c16 + region16 + o * SS + SO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        vz = tl.load(c16 + region16 + o * ZS + ZO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), v16)
        acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
        m_i = m_new
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     block_t: int | None = None, num_warps: int | None = None, maxnreg: int | None = None,
                     lut: int | None = None, x32: bool = True, w32: bool = True, stats: dict | None = None,
                     gp_min: int | None = None):
    """Split-KV decode on a block-SoA cache (``x32``: :func:`_decode_soa4_kernel`, else the prototype
    :func:`_decode_soa_kernel` with ``w32``), then the portable reduction; the block-SoA counterpart of
    vLLM 0.33's ``triton_turboquant_decode_attention`` (``vllm/v1/attention/ops/triton_turboquant_decode.py``:
    ``_tq_decode_stage1`` + stage 2).  Inputs are validated by :func:`tqlab.turboquant.ops.decode_attention`,
    which routes here only when :func:`use_soa` holds (CUDA, ``head_dim`` a multiple of 32, 16-byte
    aligned fields); called directly, other head dims fail inside Triton.

    Args:
        query: ``(B, Hq, D)`` fp16/bf16.  cache: uint8 ``(num_blocks, Hk, block_size, slot_bytes)`` (``ops.heads_view``) in the
            block-SoA order of ``spec`` (norms folded, 3-bit fields as nibble planes).  block_tables: int32
            ``(B, max_blocks)``.  seq_lens: ``(B,)`` tokens per request.  scale: softmax scale.
        mid_out: fp32 ``(B, Hq, S, D + 1)`` split partials (``S`` = the split count).  output: ``(B, Hq, D)``,
            lse: fp32 ``(B, Hq)`` (natural log), written in place.
        block_t, num_warps, maxnreg, lut, gp_min: launch overrides (default ``launch.SOA_DEFAULTS["soa_decode"]``;
            the register cap only where the kernel is compiled; ``gp_min``: the fewest query-tile rows,
            :func:`tqlab.turboquant._triton_kernels.query_tile_rows`).  stats: filled with the kernel's registers
            and the query tile rows ``gp``.

    Raises:
        ValueError: ``x32=False`` on a cache with fp8 keys or nibble-plane fields (the prototype reads
            neither)."""
    cfg = SOA_DEFAULTS["soa_decode"]
    bsz, hq, d = query.shape
    nb, hk, bs, sb = cache.shape
    lut = pt._lut_mode(spec, query.device, lut, cfg)
    args = (query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
            *tk._centroid_poly(spec, d), scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
            query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))
    gp_min = cfg.get("gp_min", 16) if gp_min is None else gp_min
    meta = dict(GROUP=hq // hk, GP=tk.query_tile_rows(hq // hk, gp_min), BLOCK_SIZE=bs, D=d,
                BLOCK_T=block_t or cfg["block_t"], KBITS=spec.key_bits, VBITS=spec.value_bits,
                NORM_CORR=spec.norm_correction_on_read, LUT=lut, LUT_ASM=pt._asm_for(spec, d, lut),
                num_warps=num_warps or cfg["num_warps"], **tk._field_addr(spec, d, bs))
    if x32:
        meta.update(KEY_FP8=spec.key_fp8, PTX=query.device.type == "cuda" and not pt.tk_interpret())
    elif spec.key_fp8:
        raise ValueError("the 16-codes-per-thread block-SoA prototype (x32=False) has no fp8-key path")
    maxnreg = cfg.get("maxnreg") if maxnreg is None else maxnreg
    if maxnreg and query.device.type == "cuda" and not pt.tk_interpret():
        meta["maxnreg"] = maxnreg
    grid = (bsz, hk, mid_out.shape[2])
    planes = tk._planes_flags(spec, d, bs)
    if not x32 and any(planes.values()):
        raise ValueError(f"_triton_soa.decode_attention(x32=False): the 16-codes-per-thread prototype reads vLLM's bit "
                         f"stream only; {spec.name} on block_soa stores its 3-bit codes as nibble planes "
                         f"(TurboQuantSpec.code_order): use x32=True")
    kern = _decode_soa4_kernel[grid](*args, **meta, **planes) if x32 else _decode_soa_kernel[grid](*args, W32=w32, **meta)
    tk._record(stats, kern)
    if stats is not None:
        stats["gp"] = meta["GP"]
    tk.reduce(mid_out, output, lse)
    return output
