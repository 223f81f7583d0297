"""Block-SoA decode with explicit register layouts (Gluon) for the rotated presets (``turboquant_3bit_nc``,
``turboquant_k3v4_nc``, ``turboquant_4bit_nc``: 3-bit nibble-plane or 4-bit key and value codes, folded norms).

Issue 20, round 5 (measured in ``benchmarks/NOTES_turboquant.md``, "Issue 20, round 5").  The Triton kernel
``_triton_soa._decode_soa4_kernel`` leaves its layouts to the compiler; Triton 3.6 then builds both MMAs with
kWidth 4, re-reads q from shared memory every tile and stages the value tile through shared memory.  Here, in
Triton's Gluon dialect (``triton.experimental.gluon``), every layout is written down (:func:`layouts`), and
nothing but the loads touches memory in the loop.  Lane ``(g, t)``: ``g = lane // 4``, ``t = lane % 4``.

* **One warp = one batch of the MMAs** (``mma_v2`` m16n8k16, fp16 in, fp32 accumulators).  A program (request,
  KV head, split) has 2 or 4 warps (:func:`launch_warps`); each takes its own 32 tokens of every step and keeps its own online
  softmax; the warps' partials merge once, after the loop (:func:`_finish`).  ``P V`` sums over tokens, so the
  value tile never needs another warp's tokens and never leaves the registers.
* **Scores** ``S^T = K q'^T`` ``[32 tokens, 8 query rows]``: keys as the A operand, q' (rotated, scaled, the GQA
  group padded to ``NQ`` = 8 rows) as B.  Lane ``(g, t)`` holds tokens ``g + 8h + 16k`` and, per k step ``j``,
  slots ``16j + 8h' + 2t + p``; q and k contract over D in any order, so that slot is head dim
  ``32t + 4j + 2h' + p``: lane ``t``'s slots are exactly chunk ``t`` of its tokens, the words it loads.
* **Values** ``O^T += V^T P^T`` ``[D, 8]``: ``P^T`` (B operand) comes from ``S^T`` by a few shuffles; ``V^T``
  (A operand) row ``16i + 8h + g`` is head dim ``16g + 2i + h``, so a lane's 16 rows are one half chunk of its
  8 tokens ``2t + p + 8h' + 16k``.
* **Codes to fp16**: key centroids by the ``prmt`` tables of ``ptx_tables.planes_key_pair_ptx`` /
  ``key4_pair_ptx``, written as half2 registers; value codes without a table (``planes_value_pair_ptx`` /
  ``value4_pair_ptx``): two tokens' codes as fp16 bit patterns ``code << s``, i.e. ``code * 2^(s - 24)``
  exactly, undone per output row at the end.  Key norms are read folded (``TurboQuantSpec.norm_folded``), value
  scales multiply ``P``, zeros add ``sum(p * zero)``, as in ``_triton_soa``.

GPU only (Gluon does not run under the interpreter).  The GPU tests compare it with the torch reference
(``tests/test_turboquant_gluon.py``); ``ops.decode_attention`` routes to it (``ops.decode_kernel_name``).
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import ptx_tables as pt
from tqlab.turboquant.launch import SOA_DEFAULTS
from tqlab.turboquant.spec import TurboQuantSpec

__all__ = ["use_gluon", "launch_warps", "decode_attention"]

TW_DEFAULT = 32  # tokens per warp and step
NQ = gl.constexpr(8)  # query rows of the MMAs (the GQA group, padded)


def use_gluon(spec: TurboQuantSpec, cache: torch.Tensor, head_dim: int, group: int) -> bool:
    """This kernel serves the rotated presets (MSE keys, folded norms: 3-bit nibble-plane or 4-bit key and value
    codes; ``turboquant_3bit_nc``, ``turboquant_k3v4_nc``, ``turboquant_4bit_nc``) on a CUDA block-SoA cache of an
    sm_80+ GPU (``mma_v2``: m16n8k16) with ``head_dim`` 128, a GQA group of at most 8 and 16-byte aligned fields."""
    planes = tk._planes_flags(spec, head_dim, cache.shape[2])
    return (spec.cache_layout == "block_soa" and cache.device.type == "cuda" and not pt.tk_interpret()
            and torch.cuda.get_device_capability(cache.device)[0] >= 8
            and head_dim == 128 and group <= NQ.value and not spec.key_fp8 and not spec.norm_correction_on_read
            and (bool(planes["KP"]) or spec.key_bits == 4) and (bool(planes["VP"]) or spec.value_bits == 4)
            and cache.shape[2] % 16 == 0 and cache.data_ptr() % 16 == 0)


def launch_warps(programs: int, num_sms: int) -> int:
    """Warps per program: ``launch.SOA_DEFAULTS["gluon_decode"]``'s ``num_warps`` when the launch has at least one
    of its ``programs`` (request x KV head x split) per multiprocessor, else ``num_warps_below_one_program_per_sm``
    (fixed per captured CUDA graph: ``B``, ``Hk``, ``S``)."""
    cfg = SOA_DEFAULTS["gluon_decode"]
    return cfg["num_warps"] if programs >= num_sms else cfg["num_warps_below_one_program_per_sm"]


def layouts(num_warps: int | None = None, tw: int = TW_DEFAULT) -> dict:
    """The kernel's register layouts (constexprs, plus ``TW`` = ``tw`` tokens per warp and step): the MMA
    accumulator ``MMA`` (one batch per warp) and its kWidth-2 operands (keys ``KA`` and values ``VA`` as A, q'
    ``QB`` and P ``PB`` as B); the word tiles ``[W, NG, 16, C]`` (warp, 16-token group ``k``, token ``i`` of the
    group, chunk / half chunk; ``NG = tw / 16``) laid out as the operands need them: keys ``KW`` (lane
    ``(g, t)``: tokens ``i = g + 8h``, chunk ``t``), values ``VW`` (lane ``(g, t)``: tokens ``i = 2t + p + 8h'``,
    half chunk ``g``); the query tiles ``QL`` / ``QL2`` ``[W, 8, D]`` of the Walsh-Hadamard transform (a thread's
    32 consecutive head dims, then dims ``d + 32 m``).  D = 128 only."""
    num_warps = num_warps or SOA_DEFAULTS["gluon_decode"]["num_warps"]
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1, 1], instr_shape=[1, 16, 8])
    warps4 = [[1 << i, 0, 0, 0] for i in range(int(math.log2(num_warps)))]
    warps3 = [w[:3] for w in warps4]
    ng = tw // 16
    groups = [[0, 1 << i, 0, 0] for i in range(int(math.log2(ng)))]
    kw = gl.DistributedLinearLayout(reg_bases=[[0, 0, 8, 0]] + groups,
                                    lane_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
                                    warp_bases=warps4, block_bases=[], shape=[num_warps, ng, 16, 4])
    vw = gl.DistributedLinearLayout(reg_bases=[[0, 0, 1, 0], [0, 0, 8, 0]] + groups,
                                    lane_bases=[[0, 0, 2, 0], [0, 0, 4, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]],
                                    warp_bases=warps4, block_bases=[], shape=[num_warps, ng, 16, 8])
    ql2 = gl.DistributedLinearLayout(reg_bases=[[0, 0, 32], [0, 0, 64], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
                                     lane_bases=[[0, 0, 8], [0, 0, 16], [0, 1, 0], [0, 2, 0], [0, 4, 0]],
                                     warp_bases=warps3, block_bases=[], shape=[num_warps, 8, 128])
    return dict(TW=tw, MMA=mma, KA=gl.DotOperandLayout(0, mma, 2), QB=gl.DotOperandLayout(1, mma, 2),
                VA=gl.DotOperandLayout(0, mma, 2), PB=gl.DotOperandLayout(1, mma, 2), KW=kw, VW=vw,
                QL=gl.BlockedLayout([1, 1, 32], [1, 8, 4], [num_warps, 1, 1], [2, 1, 0]), QL2=ql2)


# ----------------------------------------------------------------------------- index helpers
@gluon.jit
def _ix(N: gl.constexpr, AXIS: gl.constexpr, L: gl.constexpr):
    """``arange(N)`` along ``AXIS`` of a rank-3 layout ``L``, expanded to rank 3."""
    if AXIS == 0:
        return gl.expand_dims(gl.expand_dims(gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(2, L))), 1), 2)
    elif AXIS == 1:
        return gl.expand_dims(gl.expand_dims(gl.arange(0, N, layout=gl.SliceLayout(0, gl.SliceLayout(2, L))), 0), 2)
    else:
        return gl.expand_dims(gl.expand_dims(gl.arange(0, N, layout=gl.SliceLayout(0, gl.SliceLayout(1, L))), 0), 1)


@gluon.jit
def _ix4(N: gl.constexpr, AXIS: gl.constexpr, L: gl.constexpr):
    """``arange(N)`` along ``AXIS`` of a rank-4 layout ``L``, expanded to rank 4."""
    if AXIS == 0:
        return gl.expand_dims(_ix(N, 0, gl.SliceLayout(3, L)), 3)
    elif AXIS == 1:
        return gl.expand_dims(_ix(N, 1, gl.SliceLayout(3, L)), 3)
    elif AXIS == 2:
        return gl.expand_dims(_ix(N, 2, gl.SliceLayout(3, L)), 3)
    else:
        return gl.expand_dims(_ix(N, 2, gl.SliceLayout(1, L)), 1)


@gluon.jit
def _group_rows(bt_row, first, i, start, end, num_blocks, hk, stride_cb32, stride_ch32, BLOCK_SIZE: gl.constexpr):
    """Tokens ``first + i`` of 16-token groups (``first``: ``[W, NG, 1, 1]``, multiples of 16, so one block table
    load per group; ``i``: ``[1, 1, 16, 1]``): inside the split ``[start, end)`` and a valid block, the 32-bit index
    of the group's (block, KV head) region, and the tokens' slots in the block."""
    blk = gl.load(bt_row + first // BLOCK_SIZE, mask=first < end, other=-1).to(gl.int64)
    tok = first + i
    ok = (tok >= start) & (tok < end) & (blk >= 0) & (blk < num_blocks)
    return ok, gl.where(blk >= 0, blk, 0) * stride_cb32 + hk * stride_ch32, (first % BLOCK_SIZE + i).to(gl.int64)


# ----------------------------------------------------------------------------- codes -> fp16
@gluon.jit
def _key_pairs(lw, hw, ASM: gl.constexpr, A: gl.constexpr, B: gl.constexpr, C: gl.constexpr):
    """``ptx_tables.planes_key_pair_ptx`` on ``[W, NG, 16, C]`` words (``A = W * NG``, ``B = 16``): ``[A, B, C, 16]``
    fp16 centroids of codes 0..15
    of the half chunk; each packed instance writes the half2 of codes ``2m, 2m + 1`` (the words joined with
    themselves give the pair its parity axis)."""
    o = gl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [gl.join(lw, lw), gl.join(hw, hw)],
                                  dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    x = gl.join(gl.join(gl.join(o[0], o[4]), gl.join(o[2], o[6])), gl.join(gl.join(o[1], o[5]), gl.join(o[3], o[7])))
    # x: [W, NG, 16, C, 2 (parity), 2 (m bit 2), 2 (m bit 1), 2 (m bit 0)]
    return gl.reshape(gl.permute(x, (0, 1, 2, 3, 5, 6, 7, 4)), [A, B, C, 16])


@gluon.jit
def _key4_pairs(w, ASM: gl.constexpr, A: gl.constexpr, B: gl.constexpr, C: gl.constexpr):
    """``ptx_tables.key4_pair_ptx`` on ``[W, NG, 16, C]`` words of 4-bit key codes (``A = W * NG``, ``B = 16``):
    ``[A, B, C, 8]`` fp16 centroids of the word's codes 0..7."""
    o = gl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,r,r", [gl.join(w, w)], dtype=(gl.float16,) * 4, is_pure=True,
                                  pack=2)
    x = gl.join(gl.join(o[0], o[2]), gl.join(o[1], o[3]))  # [W, NG, 16, C, 2 (parity), 2 (m bit 1), 2 (m bit 0)]
    return gl.reshape(gl.permute(x, (0, 1, 2, 3, 5, 6, 4)), [A, B, C, 8])


@gluon.jit
def _key_tile(c32, reg, o, kc, ok, KO: gl.constexpr, KP: gl.constexpr, KASM: gl.constexpr, A: gl.constexpr,
              D: gl.constexpr):
    """fp16 key centroids ``[A, 16, D // 32, 32]`` (natural order within each chunk) of the word tile's tokens:
    3-bit nibble planes (``KP``: ``L0, L1, H`` of the chunk) or 4-bit codes (the chunk's 4 words)."""
    if KP:
        kp = c32 + reg + KO // 2 + o * (D // 32) + kc
        kl0 = gl.load(kp, mask=ok, other=0)
        kl1 = gl.load(kp + KP // 2, mask=ok, other=0)
        kh = gl.load(kp + KP, mask=ok, other=0)
        ke = _key_pairs(kl0, kh << 2, KASM, A, 16, D // 32)
        kf = _key_pairs(kl1, kh, KASM, A, 16, D // 32)
        kx = gl.reshape(gl.permute(gl.join(ke, kf), (0, 1, 2, 4, 3)), [A, 16, D // 32, 32])
    else:
        kp = c32 + reg + KO // 2 + o * (D // 8) + 4 * kc
        k0 = _key4_pairs(gl.load(kp, mask=ok, other=0), KASM, A, 16, D // 32)
        k1 = _key4_pairs(gl.load(kp + 1, mask=ok, other=0), KASM, A, 16, D // 32)
        k2 = _key4_pairs(gl.load(kp + 2, mask=ok, other=0), KASM, A, 16, D // 32)
        k3 = _key4_pairs(gl.load(kp + 3, mask=ok, other=0), KASM, A, 16, D // 32)
        x = gl.join(gl.join(k0, k2), gl.join(k1, k3))  # [A, 16, C, 8, word bit 1, word bit 0]
        kx = gl.reshape(gl.permute(x, (0, 1, 2, 4, 5, 3)), [A, 16, D // 32, 32])
    return kx


@gluon.jit
def _value_pairs(lw, hw, ASM: gl.constexpr):
    """``ptx_tables.planes_value_pair_ptx`` / ``value4_pair_ptx`` on token pairs (``pack`` 2: consecutive register
    elements of ``lw`` / ``hw``, tokens ``2t, 2t + 1``): 16 fp16 tensors, code ``j`` of each token as
    ``code * 2^(s_j - 24)``."""
    return gl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [lw, hw],
                                     dtype=(gl.float16,) * 16, is_pure=True, pack=2)


@gluon.jit
def _stack16(e, A: gl.constexpr, B: gl.constexpr, C: gl.constexpr):
    """``[A, B, C, 16]`` from 16 ``[A, B, C]`` tensors (element ``i`` = ``e[i]``); joins most significant index bit
    first."""
    a0 = gl.join(e[0], e[8])
    a1 = gl.join(e[1], e[9])
    a2 = gl.join(e[2], e[10])
    a3 = gl.join(e[3], e[11])
    a4 = gl.join(e[4], e[12])
    a5 = gl.join(e[5], e[13])
    a6 = gl.join(e[6], e[14])
    a7 = gl.join(e[7], e[15])
    b0 = gl.join(a0, a4)
    b1 = gl.join(a1, a5)
    b2 = gl.join(a2, a6)
    b3 = gl.join(a3, a7)
    c0 = gl.join(b0, b2)
    c1 = gl.join(b1, b3)
    x = gl.join(c0, c1)  # [A, B, C, bit3, bit2, bit1, bit0]: each join appends the next less significant bit
    return gl.reshape(x, [A, B, C, 16])


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def _decode_planes_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb32, stride_ch32, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: gl.constexpr, BLOCK_SIZE: gl.constexpr, D: gl.constexpr, TW: gl.constexpr,
    KO: gl.constexpr, KP: gl.constexpr, NO: gl.constexpr, NS: gl.constexpr, VO: gl.constexpr, VP: gl.constexpr,
    SO: gl.constexpr, SS: gl.constexpr, ZO: gl.constexpr, ZS: gl.constexpr,
    KASM: gl.constexpr, VASM: gl.constexpr, VSHIFT: gl.constexpr,
    MMA: gl.constexpr, KA: gl.constexpr, QB: gl.constexpr, VA: gl.constexpr, PB: gl.constexpr,
    KW: gl.constexpr, VW: gl.constexpr, QL: gl.constexpr, QL2: gl.constexpr,
):
    W: gl.constexpr = gl.num_warps()
    NG: gl.constexpr = TW // 16
    SL: gl.constexpr = gl.SliceLayout(2, MMA)  # per token of the score tile [W, 32]
    RL: gl.constexpr = gl.SliceLayout(1, MMA)  # per query row [W, NQ]
    b = gl.program_id(0)
    hk = gl.program_id(1)
    s = gl.program_id(2)
    seq_len = gl.load(sl_ptr + b)
    chunk = gl.cdiv(seq_len, num_splits)  # ops.split_bounds
    start = gl.minimum(s * chunk, seq_len)
    end = gl.minimum(start + chunk, seq_len)
    bt_row = bt_ptr + b.to(gl.int64) * stride_btb

    qt = _query(q_ptr, b, hk, stride_qb, stride_qh, inv_sqrt_d, GROUP, D, W, QL, QL2, QB)
    m_i = gl.full([W, NQ], float("-inf"), gl.float32, layout=RL)
    l_i = gl.zeros([W, NQ], gl.float32, layout=RL)
    acc_z = gl.zeros([W, NQ], gl.float32, layout=RL)
    acc = gl.zeros([W, D, NQ], gl.float32, layout=MMA)
    # [W, NG, 16, C] word tiles: warp w's tokens t0 + TW w + 16 k + i; first token of each 16-token group
    kg = _ix4(W, 0, KW) * TW + _ix4(NG, 1, KW) * 16
    ki = _ix4(16, 2, KW)
    kc = _ix4(D // 32, 3, KW)
    vg = _ix4(W, 0, VW) * TW + _ix4(NG, 1, VW) * 16
    vi = _ix4(16, 2, VW)
    hc = _ix4(8, 3, VW)
    ts = _ix(W, 0, MMA) * TW + _ix(TW, 1, MMA)  # [W, TW, 1] tokens of the score tile
    v_word = hc // 2 + (hc % 2) * (VP // 2)  # L0 / L1 of the half chunk's chunk
    h_shift = 2 - 2 * (hc % 2)  # H << 2 for codes 0..15 of a chunk
    for t0 in range((start // 16) * 16, end, W * TW):  # whole 16-token groups: one block each (block_size % 16 == 0)
        # keys: chunk t of tokens g + 8h + 16k -> A operand [W, TW, D] (slot order)
        ok, reg, o = _group_rows(bt_row, t0 + kg, ki, start, end, num_blocks, hk, stride_cb32, stride_ch32,
                                 BLOCK_SIZE)
        kx = _key_tile(c32, reg, o, kc, ok, KO, KP, KASM, W * NG, D)  # [W * NG, 16, D // 32, 32]
        kt = gl.reshape(gl.permute(gl.reshape(kx, [W, TW, 4, 8, 2, 2]), (0, 1, 3, 4, 2, 5)), [W, TW, D])
        sc = mma_v2(gl.convert_layout(kt, KA), qt, gl.zeros([W, TW, NQ], gl.float32, layout=MMA))  # [W, 32, NQ]
        reg16 = reg * 2
        kn = _per_token(c16, reg16 + o * NS + NO, ok, W, TW, SL)
        vs = _per_token(c16, reg16 + o * SS + SO, ok, W, TW, SL)
        vz = _per_token(c16, reg16 + o * ZS + ZO, ok, W, TW, SL)
        sc = gl.where((t0 + ts >= start) & (t0 + ts < end), sc * gl.expand_dims(kn * qk_scale, 2), float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a warp with no token yet
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(sc - gl.expand_dims(m_use, 1))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc_z = acc_z * alpha + gl.sum(p * gl.expand_dims(vz, 2), axis=1)
        pt_ = gl.convert_layout((p * gl.expand_dims(vs, 2)).to(gl.float16), PB)  # [W, TW, NQ]
        # values: half chunk g of tokens 2t + p + 8h' + 16k -> A operand [W, D, TW] (row order of _finish)
        ok_v, reg_v, o_v = _group_rows(bt_row, t0 + vg, vi, start, end, num_blocks, hk, stride_cb32, stride_ch32,
                                       BLOCK_SIZE)
        if VP:  # 3-bit nibble planes: the half chunk's L word and its chunk's H
            vp = c32 + reg_v + VO // 2 + o_v * (D // 32) + v_word
            va = gl.load(vp, mask=ok_v, other=0)
            vb = gl.load(vp - (hc % 2) * (VP // 2) + VP, mask=ok_v, other=0) << h_shift
        else:  # 4-bit codes: the half chunk's two words
            vp = c32 + reg_v + VO // 2 + o_v * (D // 8) + 2 * hc
            va = gl.load(vp, mask=ok_v, other=0)
            vb = gl.load(vp + 1, mask=ok_v, other=0)
        vx = _stack16(_value_pairs(va, vb, VASM), W * NG, 16, 8)  # [W * NG, 16, 8, 16]: code i of half chunk hc
        vt = gl.reshape(gl.permute(gl.reshape(vx, [W, TW, 8, 8, 2]), (0, 3, 4, 2, 1)), [W, D, TW])
        acc = mma_v2(gl.convert_layout(vt, VA), pt_, acc * gl.expand_dims(alpha, 1))
        m_i = m_new
    _finish(mid_ptr, b, hk, s, m_i, l_i, acc, acc_z, stride_mb, stride_mh, stride_ms, GROUP, D, W, MMA, VSHIFT)


@gluon.jit
def _per_token(c16, idx16, ok, W: gl.constexpr, TW: gl.constexpr, SL: gl.constexpr):
    """An fp16 field of each token of a ``[W, NG, 16, C]`` key-word tile (index ``[W, NG, 16, 1]``), fp32, as
    ``[W, TW]`` in the score tile's token layout ``SL`` (the same lanes: a register move); 0 where not ``ok``."""
    x = gl.load(c16 + idx16, mask=ok, other=0).to(gl.float16, bitcast=True).to(gl.float32)
    return gl.convert_layout(gl.reshape(x, [W, TW]), SL)


@gluon.jit
def _butterfly(x, ST: gl.constexpr, W: gl.constexpr, D: gl.constexpr):
    """Stage ``ST`` of the fast Walsh-Hadamard transform of ``x [W, NQ, D]`` (pairs ``2^ST`` apart, both in one
    thread's registers)."""
    x5 = gl.permute(gl.reshape(x, [W, NQ, D // (2 << ST), 2, 1 << ST]), (0, 1, 2, 4, 3))
    a, c = gl.split(x5)
    return gl.reshape(gl.permute(gl.join(a + c, a - c), (0, 1, 2, 4, 3)), [W, NQ, D])


@gluon.jit
def _query(q_ptr, b, hk, stride_qb, stride_qh, inv_sqrt_d, GROUP: gl.constexpr, D: gl.constexpr, W: gl.constexpr,
           QL: gl.constexpr, QL2: gl.constexpr, QB: gl.constexpr):
    """q' = (q @ H) / sqrt(D) of the GQA group (``_triton_kernels._fwht``'s butterflies, fp32), fp16, in the slot
    order of the keys (slot ``16j + 8h + 2t + p`` = head dim ``32t + 4j + 2h + p``), rows padded to NQ, one copy
    per warp: ``q'^T`` ``[W, D, NQ]`` in the B-operand layout ``QB``."""
    r = _ix(NQ, 1, QL)
    cols = _ix(D, 2, QL)
    ptr = q_ptr + b.to(gl.int64) * stride_qb + (hk * GROUP + r).to(gl.int64) * stride_qh + cols + _ix(W, 0, QL) * 0
    x = gl.load(ptr, mask=(r < GROUP) & (cols < D), other=0.0).to(gl.float32)
    for st in gl.static_range(5):  # butterflies inside a thread's 32 head dims
        x = _butterfly(x, st, W, D)
    x = gl.convert_layout(x, QL2)  # a thread's dims d, d + 32, d + 64, d + 96
    for st in gl.static_range(5, 7):
        x = _butterfly(x, st, W, D)
    x = x * inv_sqrt_d
    xs = gl.reshape(gl.permute(gl.reshape(x, [W, NQ, 4, 8, 2, 2]), (0, 1, 3, 4, 2, 5)), [W, NQ, D])
    return gl.convert_layout(gl.permute(xs.to(gl.float16), (0, 2, 1)), QB)


@gluon.jit
def _finish(mid_ptr, b, hk, s, m_i, l_i, acc, acc_z, stride_mb, stride_mh, stride_ms, GROUP: gl.constexpr,
            D: gl.constexpr, W: gl.constexpr, MMA: gl.constexpr, VSHIFT: gl.constexpr):
    """Merge the warps' online softmaxes and write the split's partial (``_triton_kernels._store_partial``'s
    format: normalized output in natural head-dim order, natural-log LSE at column D)."""
    mx = gl.max(m_i, axis=0)
    mx_use = gl.where(mx == float("-inf"), 0.0, mx)
    wgt = gl.exp2(m_i - gl.expand_dims(mx_use, 0))  # [W, NQ]; 0 for a warp that saw no token
    tot = gl.sum(l_i * wgt, axis=0)
    z = gl.sum(acc_z * wgt, axis=0)
    o = gl.sum(acc * gl.expand_dims(wgt, 1), axis=0)  # [D rows, NQ]
    OL: gl.constexpr = gl.SliceLayout(0, MMA)
    row = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, OL)), 1)
    ci = 2 * (row // 16) + (row // 8) % 2  # the row's code index within its half chunk
    j = ci % 4  # the values' half2 held code * 2^(VSHIFT[j] - 24)
    o = o * gl.where(j == 0, 2.0 ** (24 - VSHIFT[0]), gl.where(j == 1, 2.0 ** (24 - VSHIFT[1]),
                     gl.where(j == 2, 2.0 ** (24 - VSHIFT[2]), 2.0 ** (24 - VSHIFT[3]))))
    has = tot > 0
    inv = gl.convert_layout(1.0 / gl.where(has, tot, 1.0), gl.SliceLayout(0, OL))
    zq = gl.convert_layout(z, gl.SliceLayout(0, OL))
    out = (o + gl.expand_dims(zq, 0)) * gl.expand_dims(inv, 0)
    qr = gl.expand_dims(gl.arange(0, NQ, layout=gl.SliceLayout(0, OL)), 0)
    dim = 16 * (row % 8) + 2 * (row // 16) + (row // 8) % 2  # row 16i + 8h + g = head dim 16g + 2i + h
    base = mid_ptr + b.to(gl.int64) * stride_mb + s.to(gl.int64) * stride_ms
    heads = (hk * GROUP + qr).to(gl.int64)
    gl.store(base + heads * stride_mh + dim, out, mask=(qr < GROUP) & (row < D))
    lse = gl.where(has, (mx_use + gl.log2(gl.where(has, tot, 1.0))) * 0.6931471805599453, float("-inf"))
    q1 = gl.arange(0, NQ, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    gl.store(base + (hk * GROUP + q1).to(gl.int64) * stride_mh + D, lse, mask=q1 < GROUP)


def _value_table(spec: TurboQuantSpec) -> dict:
    """The value pair PTX and its per-code shifts: 3-bit nibble planes or 4-bit codes."""
    if spec.value_bits == 3:
        return dict(VASM=pt.PLANES_VALUE_PAIR_ASM.value, VSHIFT=pt.VALUE_PAIR_SHIFT)
    return dict(VASM=pt.VALUE4_PAIR_ASM.value, VSHIFT=pt.VALUE4_PAIR_SHIFT)


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     stats: dict | None = None, maxnreg: int | None = None, num_warps: int | None = None):
    """Split-KV decode of a block-SoA cache of a rotated preset by :func:`_decode_planes_kernel`, then the portable
    reduction (``_triton_kernels.reduce``); the same inputs and outputs as ``_triton_soa.decode_attention``: query
    ``(B, Hq, D)`` fp16/bf16, cache uint8 ``(num_blocks, Hk, block_size, slot_bytes)`` (``ops.heads_view``), block_tables int32
    ``(B, max_blocks)``, seq_lens ``(B,)``, mid_out fp32 ``(B, Hq, S, D + 1)`` (split partials, bounds of
    ``ops.split_bounds``), output ``(B, Hq, D)`` and lse fp32 ``(B, Hq)`` written in place.  ``ops.decode_attention``
    validates the inputs and routes here (``routing``).

    Args:
        stats: filled with the kernel's registers / spills and ``num_warps``.
        maxnreg: register cap (None: none; 96 spills, ``benchmarks/NOTES_turboquant.md``).
        num_warps: warps per program, a power of two <= 8 (None: :func:`launch_warps`).

    Raises:
        ValueError: ``num_warps`` not a power of two in 1..8, or a call :func:`use_gluon` does not serve
            (another preset or layout, ``head_dim`` != 128, a GQA group above 8, a CPU tensor, an old GPU)."""
    if num_warps is not None and (isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8)):
        raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {num_warps!r}")
    bsz, hq, d = query.shape
    nb, hk, bs, _ = cache.shape
    if not use_gluon(spec, cache, d, hq // hk):
        raise ValueError(f"the Gluon decode does not serve {spec.name} on {spec.cache_layout} with head_dim {d}, "
                         f"GQA {hq // hk}, block_size {bs} on {cache.device} (use_gluon is False; "
                         f"ops.decode_attention picks the kernel)")
    nw = num_warps or launch_warps(bsz * hk * mid_out.shape[2],
                                   torch.cuda.get_device_properties(cache.device).multi_processor_count)
    fa = tk._field_addr(spec, d, bs)
    planes = tk._planes_flags(spec, d, bs)
    kern = _decode_planes_kernel[(bsz, hk, mid_out.shape[2])](
        query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
        scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
        query.stride(0), query.stride(1), cache.stride(0) // 4, cache.stride(1) // 4, block_tables.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        GROUP=hq // hk, BLOCK_SIZE=bs, D=d, KO=fa["KO"], KP=planes["KP"], NO=fa["NO"], NS=fa["NS"], VO=fa["VO"],
        VP=planes["VP"], SO=fa["SO"], SS=fa["SS"], ZO=fa["ZO"], ZS=fa["ZS"],
        KASM=pt.planes_key_pair_ptx(spec, d) if spec.key_bits == 3 else pt.key4_pair_ptx(spec, d),
        **_value_table(spec), **layouts(nw), num_warps=nw,
        **({"maxnreg": maxnreg} if maxnreg else {}))
    tk._record(stats, kern)
    if stats is not None:
        stats["num_warps"] = nw
    tk.reduce(mid_out, output, lse)
    return output
