"""Block-SoA decode with the key tile built in the MMA B-operand order (issue 20 experiment, not integrated).

``_triton_soa._decode_soa4_kernel`` dequantizes K ``[T, D]`` in registers (a thread: 32 contiguous codes of a
token) and Triton stages it through shared memory for ``tl.dot(q, trans(k16))``.  The contraction order over D
is free: permuting q's and k's columns by the same ``pi`` leaves the scores unchanged.  For mma v2
(m16n8k16) the B operand's lane ``t = lane % 4`` holds, per 16-wide k tile ``j``, the slots
``16j + 8h + 2t + p``; ``pi(16j + 8h + 2t + p) = 32t + 4j + 2h + p`` makes those 32 slots exactly the thread's 32
contiguous natural codes, and with ``warpsPerCTA [1, 4]`` warp ``w`` / lane ``g = lane // 4`` own tokens
``32r + 8w + g`` in both layouts.  So ``kT = reshape(permute(reshape(k16, (T, D/32, 8, 2, 2))), (D, T))`` is, bit
for bit, the dot operand's distribution: the conversion needs no shared memory *if* Triton infers that layout.

``VARIANT`` (constexpr) of :func:`_decode_frag_kernel`:

* 0 -- a copy of ``_decode_soa4_kernel`` (same loads, ``tl.trans(k16)``): the static-compile baseline.
* 1 -- q's and k's columns in the kWidth-2 slot order above (Triton 3.9 builds the first dot with kWidth 2).
* 2 -- only the chunk loads rewritten (:func:`_words_x32t`): Triton 3.6 -- the H200's -- lays the default
  kernel's ``[T, D/32]`` chunk loads out one token per thread (``threadsPerWarp [32, 1]``: every thread holds a
  whole token, 128 codes, and both operand tiles are staged with 16-bit ``STS``); 3.9 uses ``[8, 4]`` (4 lanes
  per token, the design).  A 4-bit token read as one contiguous ``[T, D/8]`` load and 3-bit pointers built
  ``[D/32, T]`` and transposed give 4 lanes per token on 3.6.
* 3 -- 2 plus the kWidth-4 slot order (Triton 3.6 builds both dots with kWidth 4: lane ``t`` holds slots
  ``32j + 16h + 4t + i``, ``pi = 32t + 8j + 4h + i``): on 3.6 the key tile reaches ``tl.dot`` in registers.

Static compile for sm_90 (``--sass``; with the launcher's ``tt.divisibility = 16`` on pointers and strides --
without it the 4-bit loads compile as 4-byte loads and spill), Llama GQA 4, D 128, 128 x 4, ``maxnreg`` 128,
main at aa4d1ae (folded key norms, 4-bit values by ``VALUE4_ASM``), Triton 3.6 (the H200's), no spills in any;
whole-kernel SASS / loop SASS / loop STS / loop LDS (v0 compiles to exactly ``_decode_soa4_kernel``'s SASS count):

=========  =======================  =======================  =============================
preset     v0 (= soa4)              v2 (loads)               v3 (loads + K in registers)
3bit_nc    2968 / 2315 / 268 / 79   2688 / 1985 / 47 / 90    2544 / 1830 / 31 / 58
k3v4_nc    2680 / 2032 / 268 / 79   2664 / 1926 / 48 / 93    2528 / 1796 / 32 / 61
4bit_nc    2728 / 2063 / 268 / 79   2624 / 1909 / 47 / 90    2496 / 1780 / 31 / 58
=========  =======================  =======================  =============================

The same variants on ``dev_turboquant_planes``' cache (3-bit fields in nibble planes; ``p<N>``, p0 = its kernel;
4bit_nc has no 3-bit field, so its row equals the table above).  Since the nibble planes are integrated (branch
``planes``: the block-SoA store writes them, ``_decode_soa4_kernel`` reads them), the block-SoA cache *is* the
planes cache: for 3bit_nc and k3v4_nc, ``soa4`` / ``v<N>`` are now these ``p0`` / ``p<N>`` (the prototype
script is gone; ``--families planes`` with it):

=========  =======================  =======================  =============================
preset     p0 (= planes kernel)     p2                       p3
3bit_nc    2448 / 1792 / 268 / 79   2352 / 1648 / 47 / 90    2192 / 1482 / 31 / 58
k3v4_nc    2480 / 1832 / 268 / 79   2456 / 1727 / 48 / 93    2336 / 1604 / 32 / 61
=========  =======================  =======================  =============================

Load/store instructions in the 3bit_nc planes loop (per thread and 128-token tile): p0 393 (259 of them 16-bit
``STS``), p3 135.  v0 uncapped takes 158 registers, as the H200 reported for ``soa_x32_128x4`` -- the local 3.6
compile reproduces the GPU's.  On Triton 3.9 (this box's default) variant 1 is the one that removes the key
tile's ``local_alloc`` (3bit_nc: STS 77 -> 61, LDS 100 -> 68), while 2 and 3 do not fit 3.9's layouts.  The
layouts are Triton's inference, not ours: re-check with ``--sass`` under the GPU's Triton after an upgrade.

The value tile stays staged (``STS.128`` + ``LDSM.T``): P V contracts over tokens, which mma v2 keeps inside a
warp (lanes ``t`` and registers), while the tile's tokens are spread over the 4 warps and its loads give a
thread 4 tokens x 32 codes, the B operand 32 tokens x 4 columns -- no permutation of tokens or columns maps one
onto the other.

Usage (the GPU run checks each variant against its baseline -- ``_decode_soa4_kernel``, or the planes
kernel -- on the Llama shard and the seed rank and times both with ``_tq_bench.ColdTimer``)::

    python benchmarks/dev_turboquant_frag.py --json $OUT/frag.json    # soa4 / v3 and planes / p3, 32K + 128K
    python benchmarks/dev_turboquant_frag.py --json $OUT/frag.json --variants 2,3 --contexts 32768
    python benchmarks/dev_turboquant_frag.py --sass /tmp/frag          # static sm_90 compile, no GPU needed
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tqlab.turboquant import _triton_fast as tf
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import _triton_soa as ts
from tqlab.turboquant.launch import SOA_DEFAULTS
from tqlab.turboquant.spec import TurboQuantSpec

ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


@triton.jit
def _perm_cols(x, R: tl.constexpr, D: tl.constexpr, KW: tl.constexpr):
    """Columns of ``x [R, D]`` in mma-slot order.  ``KW`` 2 (the dot operand's kWidth): slot ``16j + 8h + 2t + p``
    <- natural ``32t + 4j + 2h + p``; ``KW`` 4: slot ``32j + 16h + 4t + i`` <- natural ``32t + 8j + 4h + i``."""
    y = tl.permute(tl.reshape(x, (R, D // 32, 32 // (2 * KW), 2, KW)), (0, 2, 3, 1, 4))
    return tl.reshape(y, (R, D))


@triton.jit
def _perm_rows_t(x, T: tl.constexpr, D: tl.constexpr, KW: tl.constexpr):
    """``trans(_perm_cols(x))`` in one permute: ``[D, T]`` with rows in mma-slot order."""
    y = tl.permute(tl.reshape(x, (T, D // 32, 32 // (2 * KW), 2, KW)), (2, 3, 1, 4, 0))
    return tl.reshape(y, (D, T))


@triton.jit
def _words_x32t(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr, T: tl.constexpr):
    """``_triton_soa._words_x32`` with the loads written so Triton's coalescing puts the chunks of a token on
    4 lanes: 4 bits -- the token's 16 words as one contiguous ``[T, D // 8]`` load (16-byte vectors); 3 bits --
    ``[D // 32, T]`` pointer tensors transposed (Triton 3.6 breaks the contiguity tie towards dim 0)."""
    NC: tl.constexpr = D // 32
    if BITS == 4:
        offs = tl.multiple_of(base32, 4)[:, None] + tl.arange(0, D // 8)[None, :]
        x = tl.load(c32 + offs, mask=ok[:, None], other=0)
        xa, xb = tl.split(tl.reshape(x, (T, NC, 2, 2)))  # words (0, 2) and (1, 3) of each chunk
        x0, x2 = tl.split(xa)
        x1, x3 = tl.split(xb)
    else:
        ptr = c32 + base32[None, :] + tl.arange(0, NC)[:, None] * BITS
        m = ok[None, :]
        x0 = tl.trans(tl.load(ptr, mask=m, other=0))
        x1 = tl.trans(tl.load(ptr + 1, mask=m, other=0))
        x2 = tl.trans(tl.load(ptr + 2, mask=m, other=0))
        x3 = x2
    return x0, x1, x2, x3


@triton.jit
def _decode_frag_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr, VARIANT: tl.constexpr,
    PLANES: tl.constexpr, KASM: tl.constexpr, VASM: tl.constexpr,
):
    """``_triton_soa._decode_soa4_kernel`` with the key operand in mma-slot order (``VARIANT`` 1, 3) and / or
    the chunk loads rewritten (2, 3); ``PLANES``: 3-bit fields in nibble-plane order (``TurboQuantSpec.code_order``,
    the block-SoA store's; ``_triton_soa._planes32`` with ``KASM`` / ``VASM`` = ``_triton_fast.planes_key_asm`` /
    ``PLANES_VALUE_ASM`` where PTX runs, "" for the interpreter's fallback)."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, False)
    KW: tl.constexpr = 2 if VARIANT == 1 else (4 if VARIANT == 3 else 0)  # slot order for this dot kWidth, 0: none
    if KW > 0:
        q = _perm_cols(q, GP, D, KW)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        in_seq, ok, region16, o = ts._soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16,
                                               BLOCK_SIZE, BLOCK_T)
        if VARIANT >= 2:  # chunk loads Triton 3.6 lays out 4 lanes per token
            kx0, kx1, kx2, kx3 = _words_x32t(c32, (region16 + o * KS + KO) // 2, ok, KBITS, D, BLOCK_T)
        else:
            kx0, kx1, kx2, kx3 = ts._words_x32(c32, (region16 + o * KS + KO) // 2, ok, KBITS, D)
        if PLANES and KBITS == 3:  # KASM "" (no PTX): the integer / polynomial fallback
            k16 = ts._planes32(kx0, kx1, kx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, KASM, 0x3F800000, 20, True)
        else:
            ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3 = ts._chunk_windows(kx0, kx1, kx2, kx3, KBITS)
            k16 = ts._keys32(ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3, c0, c1, c2, c3, c4, c5, c6, c7, KBITS, D,
                             BLOCK_T, LUT, LUT_ASM)
        kn = tl.load(c16 + region16 + o * NS + NO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        if KW > 0:
            sc = tl.dot(q, _perm_rows_t(k16, BLOCK_T, D, KW))
        else:
            sc = tl.dot(q, tl.trans(k16))
        if NORM_CORR:
            y32 = k16.to(tl.float32)
            n2 = tl.sum(y32 * y32, axis=1)
            sc = sc * (kn * qk_scale * tl.where(n2 > 0, tl.rsqrt(n2), 1.0))[None, :]
        else:
            sc = sc * (kn * qk_scale)[None, :]
        m_new, alpha, p, l_i = tk._online_step(sc, in_seq, m_i, l_i)
        if VARIANT >= 2:
            vx0, vx1, vx2, vx3 = _words_x32t(c32, (region16 + o * VS + VO) // 2, ok, VBITS, D, BLOCK_T)
        else:
            vx0, vx1, vx2, vx3 = ts._words_x32(c32, (region16 + o * VS + VO) // 2, ok, VBITS, D)
        if PLANES and VBITS == 3 and VASM != "":
            v16 = ts._planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, VASM, 0, 0, False)
        elif PLANES and VBITS == 3:
            vc = ts._planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, "", 0x6400, 0, False)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        elif VBITS == 4 and LUT == 2:  # as _decode_soa4_kernel: exact integer codes by the 0x6400 half2 trick (PTX)
            e = tl.inline_asm_elementwise(tf.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx0, vx1], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            f = tl.inline_asm_elementwise(tf.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx2, vx3], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            v16 = ts._tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13],
                             e[14], e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11],
                             f[12], f[13], f[14], f[15], BLOCK_T, D)
        else:
            va0, va1, va2, va3, vb0, vb1, vb2, vb3 = ts._chunk_windows(vx0, vx1, vx2, vx3, VBITS)
            vc = ts._codes32(va0, va1, va2, va3, vb0, vb1, vb2, vb3, VBITS, D, BLOCK_T, 0x6400)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        vs = tl.load(c16 + region16 + o * SS + SO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        vz = tl.load(c16 + region16 + o * ZS + ZO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), v16)
        acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
        m_i = m_new
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


def _meta(spec: TurboQuantSpec, hq: int, hk: int, d: int, bs: int, lut: int, block_t: int, variant: int) -> dict:
    """Constexprs of :func:`_decode_frag_kernel` for a block-SoA cache of ``spec`` (3-bit fields as nibble planes
    where ``spec.code_order`` says so, read with the PTX tables when ``lut`` is 2)."""
    planes = tk._planes_flags(spec, d)
    return dict(GROUP=hq // hk, GP=max(16, triton.next_power_of_2(hq // hk)), BLOCK_SIZE=bs, D=d, BLOCK_T=block_t,
                KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read, LUT=lut,
                LUT_ASM=tf._asm_for(spec, d, lut), VARIANT=variant, PLANES=any(planes.values()),
                KASM=tf.planes_key_asm(spec, d) if planes["KP"] and lut == 2 else "",
                VASM=tf.PLANES_VALUE_ASM.value if planes["VP"] and lut == 2 else "", **tk._field_addr(spec, d, bs))


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     variant: int = 1, block_t: int | None = None, num_warps: int | None = None,
                     maxnreg: int | None = None, lut: int | None = None, stats: dict | None = None):
    """:func:`_decode_frag_kernel` on a block-SoA cache (the store's: folded norms, 3-bit fields as nibble
    planes), then the portable reduction; arguments and launch defaults as ``_triton_soa.decode_attention``
    (``launch.SOA_DEFAULTS["soa_decode"]``)."""
    cfg = SOA_DEFAULTS["soa_decode"]
    bsz, hq, d = query.shape
    nb, hk, bs, _ = cache.shape
    if d % 32:
        raise ValueError(f"dev_turboquant_frag: head_dim {d} is not a multiple of 32 (whole 32-code chunks)")
    lut = tf._lut_mode(spec, query.device, lut, cfg)
    args = (query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
            *tk._centroid_poly(spec, d), scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
            query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))
    meta = _meta(spec, hq, hk, d, bs, lut, block_t or cfg["block_t"], variant)
    meta["num_warps"] = num_warps or cfg["num_warps"]
    maxnreg = cfg.get("maxnreg") if maxnreg is None else maxnreg
    if maxnreg and query.device.type == "cuda" and not tf.tk_interpret():
        meta["maxnreg"] = maxnreg
    kern = _decode_frag_kernel[(bsz, hk, mid_out.shape[2])](*args, **meta)
    tk._record(stats, kern)
    tk.reduce(mid_out, output, lse)
    return output


# ----------------------------------------------------------------------------- static compile (no GPU)
def _sig() -> dict:
    sig = {"q_ptr": "*fp16", "c16": "*u16", "c32": "*i32", "bt_ptr": "*i32", "sl_ptr": "*i32", "mid_ptr": "*fp32"}
    sig.update({f"c{i}": "fp32" for i in range(8)})
    sig.update(qk_scale="fp32", inv_sqrt_d="fp32", num_blocks="i32", num_splits="i32")
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "stride_cb16", "stride_ch16", "stride_btb", "stride_mb",
                                   "stride_mh", "stride_ms")})
    return sig


# arguments the GPU launch specializes as multiples of 16 (torch allocations; strides of the benchmark shapes:
# stride_cb16 = Hk * 16 * slot / 2, stride_ch16 = 16 * slot / 2 with slot 102 / 136 / 120 B; not stride_ms = D + 1)
_DIV16 = ("q_ptr", "c16", "c32", "bt_ptr", "sl_ptr", "mid_ptr", "num_blocks", "num_splits", "stride_qb", "stride_qh",
          "stride_cb16", "stride_ch16", "stride_btb", "stride_mb", "stride_mh")


def compile_sm90_div16(fn, signature: dict, constexprs: dict, num_warps: int = 4, maxnreg: int | None = None):
    """``_sass_sm90.compile_sm90`` plus the ``tt.divisibility = 16`` that Triton's launcher gives 16-byte aligned
    pointers and multiples of 16 (without it, vector loads of 16-byte aligned fields compile as 4-byte loads)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in _DIV16}
    opts = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def sass(out_dir: str, presets, variants=(0, 1), maxnreg: int = 128, div16: bool = True) -> list[dict]:
    """Compile each (preset, variant) for sm_90 (Llama GQA 4, D 128, 128 x 4, LUT 2) and report registers,
    stack, SASS totals, shared-memory traffic opcodes and the TTGIR's local_alloc / convert_layout counts."""
    from _sass_sm90 import compile_sm90, report

    from tqlab.turboquant import get_spec

    rows = []
    for name in presets:
        spec = get_spec(name, cache_layout="block_soa")
        for var in variants:
            meta = _meta(spec, 32, 8, 128, 16, 2, 128, var)
            comp = compile_sm90_div16 if div16 else compile_sm90
            r = report(comp(_decode_frag_kernel, _sig(), meta, num_warps=4, maxnreg=maxnreg), out_dir,
                       f"frag_{name.removeprefix('turboquant_')}_v{var}")
            ops = dict(r["opcodes"])
            row = {"triton": triton.__version__, "div16": div16, "preset": name, "variant": var,
                   "regs": r["usage"].get("REG"),
                   "stack": r["usage"].get("STACK"), "sass": r["sass_total"], "local_alloc": r["local_alloc"],
                   "convert_layout": r["convert_layout"],
                   **{op: ops.get(op, 0) for op in ("STS", "LDS", "LDSM", "STSM", "LDL", "STL", "SHFL", "BAR", "HMMA")}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ----------------------------------------------------------------------------- GPU check + timing
SHAPES = {"llama": (32, 8, 16), "seed": (4, 1, 4)}


def _soa4(q, caches, bt, sl, spec, mid, out, lse, stats=None):
    ts.decode_attention(q, caches["soa"], bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, stats=stats)


def _frag(var: int):
    def call(q, caches, bt, sl, spec, mid, out, lse, stats=None):
        decode_attention(q, caches["soa"], bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, variant=var, stats=stats)
    return call


def kernels(variants, families) -> dict:
    """name -> (call, baseline name): ``soa4`` (today's ``_decode_soa4_kernel``: nibble planes for the 3-bit
    fields since they are integrated, so the former ``planes`` / ``p<N>`` family) and ``v<N>`` against it."""
    out = {}
    if "soa" in families:
        out["soa4"] = (_soa4, "soa4")
        out.update({f"v{v}": (_frag(v), "soa4") for v in variants})
    return out


def run(log, contexts, presets, variants, families, rows, save) -> None:
    """Per (shape, context, preset), every kernel of :func:`kernels` on the same K/V (the block-SoA store's
    cache: key norms folded, 3-bit fields as nibble planes): max |out - out_base| and |lse - lse_base| against its baseline, registers,
    ColdTimer ms (CUDA-graph replay, L2 flushed)."""
    from _tq_bench import ColdTimer, fill_paged, random_decode_inputs

    from tqlab.turboquant import get_spec
    from tqlab.turboquant import ops as _ops

    timer, d, kern = ColdTimer(), 128, kernels(variants, families)
    for shape, (hq, hk, b) in SHAPES.items():
        for ctx in contexts:
            k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=1000 + ctx + b + hq)
            dev = q.device
            sl = torch.full((b,), ctx, device=dev, dtype=torch.int32)
            sl[-1] = ctx - 1037  # one uneven request: a partial tile and a partial block
            s = _ops.decode_num_splits(b, hk, "fill")
            for name in presets:
                spec = get_spec(name, cache_layout="block_soa")
                cache, bt = fill_paged(spec, k, v)  # the block-SoA store: key norms folded, 3-bit nibble planes
                caches = {"soa": cache}
                res = {}
                for var, (fn, base) in kern.items():
                    mid = torch.full((b, hq, s, d + 1), float("nan"), device=dev)
                    out = torch.full((b, hq, d), float("nan"), device=dev, dtype=torch.bfloat16)
                    lse = torch.full((b, hq), float("nan"), device=dev)
                    st: dict = {}
                    fn(q, caches, bt, sl, spec, mid, out, lse, stats=st)
                    res[var] = (out.float().clone(), lse.clone())
                    row = {"shape": shape, "ctx": ctx, "preset": name, "splits": s, "variant": var, "base": base,
                           "regs": st.get("n_regs"), "spills": st.get("n_spills"),
                           "nan": bool(torch.isnan(out.float()).any() or torch.isnan(lse).any()),
                           "out_max_abs_vs_base": float((out.float() - res[base][0]).abs().max()),
                           "lse_max_abs_vs_base": float((lse - res[base][1]).abs().max()),
                           "ms": timer(lambda: fn(q, caches, bt, sl, spec, mid, out, lse))}
                    if "soa4" in res and var != "soa4":
                        row["out_max_abs_vs_soa4"] = float((out.float() - res["soa4"][0]).abs().max())
                    row["ok"] = not row["nan"] and row["out_max_abs_vs_base"] < 2e-2 and row["lse_max_abs_vs_base"] < 1e-2
                    rows.append(row)
                    log(row)
                caches = None
                torch.cuda.empty_cache()
            del k, v
            save()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None,
                    help="output file (default: build/turboquant_frag_h200.json, data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--presets", default=",".join(ROTATED))
    ap.add_argument("--variants", default="3", help="VARIANTs of _decode_frag_kernel to time beside each baseline")
    ap.add_argument("--families", default="soa",
                    help="soa: soa4 + v<N> on the block-SoA cache (the only family since the nibble planes are "
                         "integrated: the former 'planes' / p<N>)")
    ap.add_argument("--sass", default=None, metavar="DIR",
                    help="no GPU: compile soa4-equivalent (0) and the variants for sm_90 into DIR and print counts")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file this run writes: ``--json``, else ``build/turboquant_frag_h200.json``; none with ``--sass``."""
    if args.sass:
        return []
    from _recording import default_dir

    return [Path(args.json) if args.json else default_dir(args) / "turboquant_frag_h200.json"]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    variants = [int(v) for v in args.variants.split(",") if v]
    if args.sass:
        sass(args.sass, args.presets.split(","), [0, *variants])
        return 0
    if not torch.cuda.is_available():
        print("dev_turboquant_frag.py times CUDA kernels: no CUDA device here (use --sass DIR)", file=sys.stderr)
        return 2
    from _tq_bench import provenance

    t0 = time.time()
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"provenance": provenance(args), "method": __doc__, "rows": []}

    def log(row):
        print(f"[{time.time() - t0:6.1f}s] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in row.items()), flush=True)

    def save():
        res["wall_s"] = time.time() - t0
        out.write_text(json.dumps(res, indent=1))

    run(log, [int(c) for c in args.contexts.split(",")], args.presets.split(","), variants, args.families.split(","),
        res["rows"], save)
    bad = [r for r in res["rows"] if not r["ok"]]
    print(f"CHECK: {len(res['rows']) - len(bad)} ok, {len(bad)} failed", flush=True)
    for r in res["rows"]:
        if r["variant"] != r["base"]:
            base = next(x for x in res["rows"] if x["variant"] == r["base"] and all(x[k] == r[k] for k in ("shape", "ctx", "preset")))
            print(f"{r['shape']:5s} {r['ctx'] // 1024:4d}K {r['preset']:20s} {r['variant']}: {r['ms']:.3f} ms vs {r['base']} "
                  f"{base['ms']:.3f} ms ({base['ms'] / r['ms']:.2f}x), regs {r['regs']}, out diff {r['out_max_abs_vs_base']:.2e}")
    save()
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
