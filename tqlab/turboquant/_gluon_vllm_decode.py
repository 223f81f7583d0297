"""Gluon decode that reads vLLM 0.33's own cache tensor for the 3- and 4-bit rotated presets (``turboquant_3bit_nc``,
``turboquant_k3v4_nc``, ``turboquant_4bit_nc``; also ``k4v4`` without norm correction): issue 34, "a decode for
that tensor".

vLLM's tensor is ``(num_blocks, block_size, Hk, slot_size_aligned)`` uint8 (``TurboQuantAttentionImpl.forward`` in
``vllm/v1/attention/backends/turboquant_attn.py``; the kernels get it as ``stride_cache_block/pos/head``,
``triton_turboquant_decode.py``).  Inside a slot the fields follow vLLM's store (``_tq_fused_store_mse`` in
``triton_turboquant_store.py``): key codes (LSB-first 3- or 4-bit stream, code ``j`` at bit ``bits * j``), fp16
key norm, value codes (same stream), fp16 value scale and zero.  This kernel is :mod:`._gluon_decode`'s
``_decode_planes_kernel`` (same layouts, MMAs, online softmax, ``_finish``) with three differences:

* **Addresses**: token ``o`` of block ``blk``, head ``hk`` starts at 16-bit word ``blk * sb + o * st + hk * sh``
  (the strides of ``ops.heads_view``).  ``slot_size_aligned`` is only even (102 / 118 / 134 bytes at D 128), so a
  field's 32-bit words are 2 bytes off alignment on every other head: each run of ``n`` words is loaded as
  ``n + 1`` aligned words and put together by a funnel shift (``shf.r.clamp.b32``); the extra word stays inside
  the slot (a code field is followed by the norm / scale fields).
* **Codes**: 4-bit words are what ``ptx_tables.key4_pair_ptx`` / ``value4_pair_ptx`` read; a 3-bit chunk of 32
  codes (12 bytes) is cut into 24-bit groups and spread to 4-bit pitch (:func:`_spread`), then read by
  ``ptx_tables.key3_nibble_pair_ptx`` (keys: a 3-bit code is a ``prmt`` selector of the 8-entry table) and
  ``value4_pair_ptx`` (values).
* **Norm correction on read** (``TurboQuantSpec.norm_correction_on_read``, as vLLM's ``_tq_decode_stage1``
  ``NORM_CORRECTION`` branch): ``||c_hat||^2`` of every token by one more MMA of the fp16 squared centroids
  against ones, in the score tile's own layout (as ``_triton_fast``'s ``NORM_MMA``).

GPU only (Gluon does not run under the interpreter); ``tests/test_turboquant_gluon_vllm.py`` compares it with the
torch reference on vLLM's tensor.  ``routing.decode_kernels`` serves it (measured 2.4-3.4x faster than
``_triton_fast`` on the H200: ``benchmarks/NOTES_turboquant.md``, issue 34 round 2).
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from tqlab.turboquant import _gluon_decode as gd
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import ptx_tables as pt
from tqlab.turboquant.spec import TurboQuantSpec

__all__ = ["use_gluon_vllm", "decode_attention"]

NQ = gd.NQ


def use_gluon_vllm(spec: TurboQuantSpec, cache: torch.Tensor, head_dim: int, group: int) -> bool:
    """This kernel serves 3- or 4-bit MSE keys and 3- or 4-bit values (3bit_nc, k3v4_nc, 4bit_nc) on vLLM's tensor (``cache`` is
    ``ops.heads_view`` of it: ``(num_blocks, Hk, block_size, slot)``, strides ``(bs*Hk*slot, slot, Hk*slot, 1)``)
    of an sm_80+ CUDA GPU with ``head_dim`` 128, a GQA group of at most 8, ``block_size % 16 == 0`` and a 4-byte
    aligned cache."""
    return (spec.cache_layout == "vllm" and cache.device.type == "cuda" and not pt.tk_interpret()
            and torch.cuda.get_device_capability(cache.device)[0] >= 8 and head_dim == 128 and group <= NQ.value
            and not spec.key_fp8 and spec.key_bits in (3, 4) and spec.value_bits in (3, 4) and cache.shape[2] % 16 == 0
            and cache.data_ptr() % 4 == 0 and cache.stride(1) % 2 == 0 and cache.stride(2) % 2 == 0
            and cache.stride(0) % 4 == 0 and cache.stride(3) == 1)


SHF_ASM = gl.constexpr("shf.r.clamp.b32 $0, $1, $2, $3;")


@gluon.jit
def _fshift(a, b, sh):
    """``(b:a) >> sh`` (low 32 bits): the unaligned word starting ``sh / 8`` bytes into ``a``."""
    return gl.inline_asm_elementwise(SHF_ASM, "=r,r,r,r", [a, b, sh], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _rows(bt_row, first, i, start, end, num_blocks, hk, sb16, sh16, st16, BLOCK_SIZE: gl.constexpr):
    """Tokens ``first + i`` of 16-token groups (one block table load per group): inside ``[start, end)`` and a
    valid block, and the 16-bit word index of each token's slot."""
    blk = gl.load(bt_row + first // BLOCK_SIZE, mask=first < end, other=-1).to(gl.int64)
    tok = first + i
    ok = (tok >= start) & (tok < end) & (blk >= 0) & (blk < num_blocks)
    o = (first % BLOCK_SIZE + i).to(gl.int64)
    return ok, gl.where(blk >= 0, blk, 0) * sb16 + hk * sh16 + o * st16


@gluon.jit
def _words2(c32, idx16, ok):
    """Two consecutive 32-bit words starting at 16-bit word ``idx16`` (any parity)."""
    i32 = idx16 // 2
    sh = ((idx16 % 2) * 16).to(gl.int32)
    a0 = gl.load(c32 + i32, mask=ok, other=0)
    a1 = gl.load(c32 + i32 + 1, mask=ok, other=0)
    a2 = gl.load(c32 + i32 + 2, mask=ok, other=0)
    return _fshift(a0, a1, sh), _fshift(a1, a2, sh)


@gluon.jit
def _words4(c32, idx16, ok):
    """Four consecutive 32-bit words starting at 16-bit word ``idx16`` (any parity)."""
    i32 = idx16 // 2
    sh = ((idx16 % 2) * 16).to(gl.int32)
    a0 = gl.load(c32 + i32, mask=ok, other=0)
    a1 = gl.load(c32 + i32 + 1, mask=ok, other=0)
    a2 = gl.load(c32 + i32 + 2, mask=ok, other=0)
    a3 = gl.load(c32 + i32 + 3, mask=ok, other=0)
    a4 = gl.load(c32 + i32 + 4, mask=ok, other=0)
    return _fshift(a0, a1, sh), _fshift(a1, a2, sh), _fshift(a2, a3, sh), _fshift(a3, a4, sh)


@gluon.jit
def _spread(g):
    """The 8 3-bit codes of bits 0..23 of ``g`` (vLLM's stream: code ``j`` at bits ``3j``) at 4-bit pitch (code ``j``
    at bits ``4j .. 4j + 2``, bit ``4j + 3`` zero), the word format of ``ptx_tables.key4_pair_ptx`` /
    ``value4_pair_ptx``; bits 24..31 of ``g`` are ignored."""
    t = (g & 0xFFF) | ((g << 4) & 0x0FFF0000)  # codes 0..3 at bits 0..11, 4..7 at 16..27
    y = (t & 0x003F003F) | ((t << 2) & 0x3F003F00)  # codes 2, 3 (6, 7) up by 2
    return (y & 0x07070707) | ((y << 1) & 0x70707070)  # codes 1, 3 (5, 7) up by 1


@gluon.jit
def _key_words(c32, idx16, ok, KBITS: gl.constexpr):
    """The 4 words (codes 0..7, 8..15, 16..23, 24..31 at 4-bit pitch) of the 32-code key chunk starting at 16-bit
    word ``idx16``: 4-bit codes as stored, 3-bit codes (12 bytes) spread by :func:`_spread`."""
    w0, w1, w2, w3 = _words4(c32, idx16, ok)
    if KBITS == 3:
        w3 = _spread(_fshift(w2, w2, 8))
        w2 = _spread(_fshift(w1, w2, 16))
        w1 = _spread(_fshift(w0, w1, 24))
        w0 = _spread(w0)
    return w0, w1, w2, w3


@gluon.jit
def _value_words(c32, idx16, ok, VBITS: gl.constexpr):
    """The 2 words (codes 0..7, 8..15 at 4-bit pitch) of the 16-code value half chunk starting at 16-bit word
    ``idx16``: 4-bit codes as stored, 3-bit codes (6 bytes) spread by :func:`_spread`."""
    if VBITS == 3:
        i32 = idx16 // 2
        sh = ((idx16 % 2) * 16).to(gl.int32)
        a0 = gl.load(c32 + i32, mask=ok, other=0)
        a1 = gl.load(c32 + i32 + 1, mask=ok, other=0)  # 48 bits from bit sh <= 16: inside the two words
        lo = _fshift(a0, a1, sh)
        va = _spread(lo)
        vb = _spread(_fshift(lo, _fshift(a1, a1, sh), 24))
    else:
        va, vb = _words2(c32, idx16, ok)
    return va, vb


@gluon.jit
def _decode_vllm_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, sb16, sh16, st16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: gl.constexpr, BLOCK_SIZE: gl.constexpr, D: gl.constexpr, TW: gl.constexpr, NC: gl.constexpr,
    KBITS: gl.constexpr, VBITS: gl.constexpr,
    KO: gl.constexpr, NO: gl.constexpr, VO: gl.constexpr, SO: gl.constexpr, ZO: gl.constexpr,
    KASM: gl.constexpr, VASM: gl.constexpr, VSHIFT: gl.constexpr,
    MMA: gl.constexpr, KA: gl.constexpr, QB: gl.constexpr, VA: gl.constexpr, PB: gl.constexpr,
    KW: gl.constexpr, VW: gl.constexpr, QL: gl.constexpr, QL2: gl.constexpr,
):
    W: gl.constexpr = gl.num_warps()
    NG: gl.constexpr = TW // 16
    SL: gl.constexpr = gl.SliceLayout(2, MMA)
    RL: gl.constexpr = gl.SliceLayout(1, MMA)
    b = gl.program_id(0)
    hk = gl.program_id(1)
    s = gl.program_id(2)
    seq_len = gl.load(sl_ptr + b)
    chunk = gl.cdiv(seq_len, num_splits)  # ops.split_bounds
    start = gl.minimum(s * chunk, seq_len)
    end = gl.minimum(start + chunk, seq_len)
    bt_row = bt_ptr + b.to(gl.int64) * stride_btb

    qt = gd._query(q_ptr, b, hk, stride_qb, stride_qh, inv_sqrt_d, GROUP, D, W, QL, QL2, QB)
    ones = gl.convert_layout(gl.full([W, D, NQ], 1.0, gl.float16, layout=MMA), QB)
    m_i = gl.full([W, NQ], float("-inf"), gl.float32, layout=RL)
    l_i = gl.zeros([W, NQ], gl.float32, layout=RL)
    acc_z = gl.zeros([W, NQ], gl.float32, layout=RL)
    acc = gl.zeros([W, D, NQ], gl.float32, layout=MMA)
    kg = gd._ix4(W, 0, KW) * TW + gd._ix4(NG, 1, KW) * 16
    ki = gd._ix4(16, 2, KW)
    kc = gd._ix4(D // 32, 3, KW)
    vg = gd._ix4(W, 0, VW) * TW + gd._ix4(NG, 1, VW) * 16
    vi = gd._ix4(16, 2, VW)
    hc = gd._ix4(8, 3, VW)
    ts = gd._ix(W, 0, MMA) * TW + gd._ix(TW, 1, MMA)
    for t0 in range((start // 16) * 16, end, W * TW):
        ok, base = _rows(bt_row, t0 + kg, ki, start, end, num_blocks, hk, sb16, sh16, st16, BLOCK_SIZE)
        w0, w1, w2, w3 = _key_words(c32, base + KO + (KBITS * 2) * kc, ok, KBITS)  # chunk kc: 32 codes
        k0 = gd._key4_pairs(w0, KASM, W * NG, 16, D // 32)
        k1 = gd._key4_pairs(w1, KASM, W * NG, 16, D // 32)
        k2 = gd._key4_pairs(w2, KASM, W * NG, 16, D // 32)
        k3 = gd._key4_pairs(w3, KASM, W * NG, 16, D // 32)
        x = gl.join(gl.join(k0, k2), gl.join(k1, k3))
        kx = gl.reshape(gl.permute(x, (0, 1, 2, 4, 5, 3)), [W * NG, 16, D // 32, 32])
        kt = gl.reshape(gl.permute(gl.reshape(kx, [W, TW, 4, 8, 2, 2]), (0, 1, 3, 4, 2, 5)), [W, TW, D])
        sc = mma_v2(gl.convert_layout(kt, KA), qt, gl.zeros([W, TW, NQ], gl.float32, layout=MMA))
        kn = gd._per_token(c16, base + NO, ok, W, TW, SL)
        vs = gd._per_token(c16, base + SO, ok, W, TW, SL)
        vz = gd._per_token(c16, base + ZO, ok, W, TW, SL)
        kscale = gl.expand_dims(kn * qk_scale, 2)
        if NC:  # vLLM's NORM_CORRECTION: divide by ||c_hat|| (sum of squares by an MMA against ones)
            n2 = mma_v2(gl.convert_layout(kt * kt, KA), ones, gl.zeros([W, TW, NQ], gl.float32, layout=MMA))
            kscale = kscale * gl.where(n2 > 0, gl.rsqrt(n2), 1.0)
        sc = gl.where((t0 + ts >= start) & (t0 + ts < end), sc * kscale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(sc - gl.expand_dims(m_use, 1))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc_z = acc_z * alpha + gl.sum(p * gl.expand_dims(vz, 2), axis=1)
        pt_ = gl.convert_layout((p * gl.expand_dims(vs, 2)).to(gl.float16), PB)
        ok_v, base_v = _rows(bt_row, t0 + vg, vi, start, end, num_blocks, hk, sb16, sh16, st16, BLOCK_SIZE)
        va, vb = _value_words(c32, base_v + VO + VBITS * hc, ok_v, VBITS)  # half chunk hc: 16 codes
        vx = gd._stack16(gd._value_pairs(va, vb, VASM), W * NG, 16, 8)
        vt = gl.reshape(gl.permute(gl.reshape(vx, [W, TW, 8, 8, 2]), (0, 3, 4, 2, 1)), [W, D, TW])
        acc = mma_v2(gl.convert_layout(vt, VA), pt_, acc * gl.expand_dims(alpha, 1))
        m_i = m_new
    gd._finish(mid_ptr, b, hk, s, m_i, l_i, acc, acc_z, stride_mb, stride_mh, stride_ms, GROUP, D, W, MMA, VSHIFT)


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     stats: dict | None = None, num_warps: int | None = None):
    """Split-KV decode of vLLM's tensor (``cache`` = ``ops.heads_view`` of it, uint8 ``(num_blocks, Hk,
    block_size, slot)``) by :func:`_decode_vllm_kernel`, then the portable reduction (``_triton_kernels.reduce``);
    the inputs and outputs of ``_gluon_decode.decode_attention``: query ``(B, Hq, D)`` fp16/bf16, block_tables
    int32 ``(B, max_blocks)``, seq_lens ``(B,)``, mid_out fp32 ``(B, Hq, S, D + 1)`` (bounds of
    ``ops.split_bounds``), output ``(B, Hq, D)`` and lse fp32 ``(B, Hq)`` written in place.

    Raises:
        ValueError: ``num_warps`` not 1, 2, 4 or 8, or a call :func:`use_gluon_vllm` does not serve."""
    if num_warps is not None and (isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8)):
        raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {num_warps!r}")
    bsz, hq, d = query.shape
    nb, hk, bs, _ = cache.shape
    if not use_gluon_vllm(spec, cache, d, hq // hk):
        raise ValueError(f"the Gluon vLLM-tensor decode does not serve {spec.name} on {spec.cache_layout} with "
                         f"head_dim {d}, GQA {hq // hk}, block_size {bs} on {cache.device} (use_gluon_vllm is False)")
    nw = num_warps or gd.launch_warps(bsz * hk * mid_out.shape[2],
                                      torch.cuda.get_device_properties(cache.device).multi_processor_count)
    fa = spec.field_addresses(d, bs)
    # the tensor's bytes as one flat run from its first byte to its last (whole 32-bit words; any strides, e.g. a
    # layer's view of a larger allocation); the kernel indexes it with the tensor's own strides
    span = 1 + sum((n - 1) * st for n, st in zip(cache.shape, cache.stride()))
    base = cache.as_strided((span // 4 * 4,), (1,), cache.storage_offset())
    kern = _decode_vllm_kernel[(bsz, hk, mid_out.shape[2])](
        query, base.view(torch.uint16), base.view(torch.int32), block_tables, seq_lens, mid_out,
        scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
        query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2, cache.stride(2) // 2,
        block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        GROUP=hq // hk, BLOCK_SIZE=bs, D=d, NC=spec.norm_correction_on_read, KBITS=spec.key_bits,
        VBITS=spec.value_bits,
        KO=fa["key_idx"][0] // 2, NO=fa["key_norm"][0] // 2, VO=fa["val_idx"][0] // 2,
        SO=fa["val_scale"][0] // 2, ZO=fa["val_zero"][0] // 2,
        KASM=pt.key4_pair_ptx(spec, d) if spec.key_bits == 4 else pt.key3_nibble_pair_ptx(spec, d),
        VASM=pt.VALUE4_PAIR_ASM.value, VSHIFT=pt.VALUE4_PAIR_SHIFT,
        **gd.layouts(nw), num_warps=nw)
    tk._record(stats, kern)
    if stats is not None:
        stats["num_warps"] = nw
    tk.reduce(mid_out, output, lse)
    return output
