"""Block-SoA decode before / after the key tile went straight to the MMA (issue 20; integrated, not an experiment).

``_triton_soa._decode_soa4_kernel`` is since this branch the former prototype's variant 3 (its module docstring
says how and why): the chunk loads shaped so Triton 3.6 -- the H200's -- puts a token's chunks on 4 lanes, and q's
and k's columns in the kWidth-4 mma slot order, so the dequantized key tile reaches ``tl.dot`` in registers.  This
script keeps what is still worth comparing against it, ``VARIANT`` of :func:`_decode_frag_kernel`:

* 0 -- the kernel before (main at 1c4cdc5 plus the fp8-key path and the nibble planes: natural ``[T, D/32]`` chunk
  loads, which Triton 3.6 lays out one token per thread, and ``tl.trans(k16)``, staged through shared memory):
  the timing baseline.
* 1 -- 0 with q's and k's columns in the kWidth-2 slot order ``pi(16j + 8h + 2t + p) = 32t + 4j + 2h + p``: the
  order made for Triton 3.9's first dot (kWidth 2, and 3.9 lays the natural loads out 4 lanes per token); kept
  for the day the GPU's Triton is upgraded (statically it does not beat the package kernel on 3.9 today).

The prototype's variant 2 (the loads alone) and 3 (= the package kernel now) are gone.  Static compile for sm_90
(``--sass``: ``_sass_sm90.compile_sm90`` with the launcher's 16-divisibility, Llama GQA 4, D 128, 128 x 4,
``maxnreg`` 128); whole-kernel SASS / loop SASS / loop STS / loop LDS, 3-bit fields as nibble planes:

=======  ============================  ============================  ============================
preset   Triton 3.6: v0 (before)       3.6: package                  3.9: v0 / v1 / package loop
3bit_nc  2448 / 1792 / 268 / 79        2192 / 1482 / 31 / 58         1314 / 1430 / 1283
k3v4_nc  2480 / 1832 / 268 / 79        2336 / 1604 / 32 / 61         1322 / 1379 / 1160
4bit_nc  2728 / 2063 / 268 / 79        2496 / 1780 / 31 / 58         1595 / 1714 / 1463
k8v4     2336 / 1892 / 229 / 161       1736 / 1298 / 29 / 52         1543 / 916 / 1062
=======  ============================  ============================  ============================

Triton 3.6 (the H200's): no spills but k8v4 v0 (8 B of stack); 3.9: spills in 4bit_nc (40 / 80 / 80 B) and k8v4
(136 / 24 / 8 B).  In vLLM's 3-bit bit order (main at 1c4cdc5) v0 -> package were 3bit_nc 2315 -> 1830 and k3v4_nc
2032 -> 1796 loop SASS on 3.6.

Recording of the prototype on the H200 (``data/turboquant_frag_prototype_h200.json``, a403c29, Triton 3.6, ColdTimer,
48 checks ok; its ``soa4`` / ``planes`` = v0 here in vLLM's bit order / with the nibble planes, its ``v3`` / ``p3`` =
the package kernel): Llama shard B 16, 3bit_nc 0.614 -> 0.464 ms at 32K and 2.376 -> 1.801 ms at 128K (1.23-1.33x
over the rotated presets), seed rank 1.07-1.26x; with the planes 3bit_nc 0.543 -> 0.418 ms at 32K, 2.092 -> 1.593
ms at 128K (fp16 SDPA 1.91 ms).

``--gluon default,w1,w4,r96`` adds the Gluon decode (``tqlab/turboquant/_gluon_decode.py``, issue 20 round 5; the
rotated presets) beside ``soa4`` (the Triton block-SoA decode, the baseline of every check): ``gluon`` = its launch
(``launch_warps``: 2 warps per program from one program per SM, else 4), ``gluon_w<N>`` = N warps, ``gluon_r<N>`` =
a register cap of N.  ``--splits fill,32`` times each distinct split count ("fill" = ``ops.decode_num_splits``).
Recorded: ``data/turboquant_gluon_launch_h200.json`` (f09f119, before the split counts were de-duplicated: the
Llama rows appear twice there, "fill" being 32).

Usage (the GPU run checks each variant against the package kernel on the Llama shard and the seed rank -- exit 1
if any row is off by more than 2e-2 in the output or 1e-2 in the lse, or NaN -- and times both with
``_tq_bench.ColdTimer``)::

    python benchmarks/dev_turboquant_frag.py --json $OUT/frag.json    # package vs v0, 32K + 128K, every SoA preset
    python benchmarks/dev_turboquant_frag.py --json $OUT/frag.json --variants 0,1 --contexts 32768
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
from tqlab.turboquant import _triton_soa_unpack as tsu
from tqlab.turboquant import ptx_tables as pt
from tqlab.turboquant.launch import SOA_DEFAULTS
from tqlab.turboquant.spec import TurboQuantSpec

PRESETS = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc", "turboquant_k8v4"]


@triton.jit
def _perm_cols2(x, R: tl.constexpr, D: tl.constexpr):
    """Columns of ``x [R, D]`` in the kWidth-2 mma slot order: slot ``16j + 8h + 2t + p`` <- natural
    ``32t + 4j + 2h + p`` (Triton 3.9's first dot; ``_triton_soa_unpack._perm_cols`` is the kWidth-4 one)."""
    return tl.reshape(tl.permute(tl.reshape(x, (R, D // 32, 8, 2, 2)), (0, 2, 3, 1, 4)), (R, D))


@triton.jit
def _perm_rows_t2(x, T: tl.constexpr, D: tl.constexpr):
    """``trans(_perm_cols2(x))`` in one permute: ``[D, T]`` with rows in the kWidth-2 slot order."""
    return tl.reshape(tl.permute(tl.reshape(x, (T, D // 32, 8, 2, 2)), (2, 3, 1, 4, 0)), (D, T))


@triton.jit
def _words_before(c32, base32, ok, BITS: tl.constexpr, D: tl.constexpr, PLANES: tl.constexpr = 0):
    """``_triton_soa_unpack._words_x32`` before the integration: ``[T, D // 32]`` pointer tensors (4 bits: a
    ``[T, D // 32, 4]`` vector load), which Triton 3.6 lays out one token per thread; ``PLANES``: as
    ``_words_x32`` (the plane-major nibble planes, ``TurboQuantSpec.plane_stride``)."""
    NC: tl.constexpr = D // 32
    gg = tl.arange(0, NC)
    if BITS == 4:
        kk = tl.arange(0, 4)
        offs = tl.multiple_of(base32, 4)[:, None, None] + gg[None, :, None] * 4 + kk[None, None, :]
        x = tl.load(c32 + offs, mask=ok[:, None, None], other=0)
        xa, xb = tl.split(tl.reshape(x, (base32.shape[0], NC, 2, 2)))
        x0, x2 = tl.split(xa)
        x1, x3 = tl.split(xb)
    elif PLANES:
        ptr = c32 + base32[:, None] + gg[None, :]
        x0 = tl.load(ptr, mask=ok[:, None], other=0)
        x1 = tl.load(ptr + PLANES // 2, mask=ok[:, None], other=0)
        x2 = tl.load(ptr + PLANES, mask=ok[:, None], other=0)
        x3 = x2
    else:
        ptr = c32 + base32[:, None] + gg[None, :] * BITS
        x0 = tl.load(ptr, mask=ok[:, None], other=0)
        x1 = tl.load(ptr + 1, mask=ok[:, None], other=0)
        x2 = tl.load(ptr + 2, mask=ok[:, None], other=0)
        x3 = x2
    return x0, x1, x2, x3


@triton.jit
def _fp8_before(c32, base32, ok, D: tl.constexpr, T: tl.constexpr, PTX: tl.constexpr):
    """``_triton_soa_unpack._fp8_keys32`` before the integration: one ``[T, D // 32, 8]`` load of 32 key bytes per chunk."""
    NC: tl.constexpr = D // 32
    offs = (tl.multiple_of(base32, 8)[:, None, None] + tl.arange(0, NC)[None, :, None] * 8
            + tl.arange(0, 8)[None, None, :])
    x = tl.load(c32 + offs, mask=ok[:, None, None], other=0)
    xa, xb = tl.split(tl.reshape(x, (T, NC, 4, 2)))  # words 0, 2, 4, 6 and 1, 3, 5, 7
    xa0, xa1 = tl.split(tl.reshape(xa, (T, NC, 2, 2)))  # words 0, 4 and 2, 6
    xb0, xb1 = tl.split(tl.reshape(xb, (T, NC, 2, 2)))  # words 1, 5 and 3, 7
    w0, w4 = tl.split(xa0)
    w2, w6 = tl.split(xa1)
    w1, w5 = tl.split(xb0)
    w3, w7 = tl.split(xb1)
    return tsu._fp8_to_f16(w0, w1, w2, w3, w4, w5, w6, w7, D, T, PTX)


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
    KEY_FP8: tl.constexpr, PTX: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
):
    """``_triton_soa._decode_soa4_kernel`` before the integration (the natural chunk loads, ``tl.trans(k16)``;
    ``VARIANT`` 1: q and k in the kWidth-2 slot order).  Folded key norms (``NORM_CORR`` False); 3-bit fields in
    nibble-plane order (``KP`` / ``VP``) through ``_triton_soa_unpack._planes32`` as the package kernel reads them."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, KEY_FP8)
    if VARIANT == 1:
        q = _perm_cols2(q, GP, D)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        in_seq, ok, region16, o = ts._soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16,
                                               BLOCK_SIZE, BLOCK_T)
        if KEY_FP8:
            k16 = _fp8_before(c32, (region16 + o * KS + KO) // 2, ok, D, BLOCK_T, PTX)
            ks = tl.full([BLOCK_T], 1.0, tl.float32) * qk_scale
        else:
            kx0, kx1, kx2, kx3 = _words_before(c32, (region16 + o * KS + KO) // 2, ok, KBITS, D, KP)
            if KP:
                k16 = tsu._planes32(kx0, kx1, kx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D,
                                   LUT_ASM if LUT == 2 else "", 0x3F800000, 20, True)
            else:
                ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3 = tsu._chunk_windows(kx0, kx1, kx2, kx3, KBITS)
                k16 = tsu._keys32(ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3, c0, c1, c2, c3, c4, c5, c6, c7, KBITS, D,
                                 BLOCK_T, LUT, LUT_ASM)
            kn = tl.load(c16 + region16 + o * NS + NO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
            tl.static_assert(not NORM_CORR, "block-SoA key norms are folded (TurboQuantSpec.norm_folded)")
            ks = kn * qk_scale
        if VARIANT == 1:
            sc = tl.dot(q, _perm_rows_t2(k16, BLOCK_T, D)) * ks[None, :]
        else:
            sc = tl.dot(q, tl.trans(k16)) * ks[None, :]
        m_new, alpha, p, l_i = tk._online_step(sc, in_seq, m_i, l_i)
        vx0, vx1, vx2, vx3 = _words_before(c32, (region16 + o * VS + VO) // 2, ok, VBITS, D, VP)
        if VP and PTX:  # as _decode_soa4_kernel: exact integers from the planes asm's table of fp16(0..7)
            v16 = tsu._planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, pt.PLANES_VALUE_ASM, 0, 0,
                               False)
        elif VP:
            vc = tsu._planes32(vx0, vx1, vx2, c0, c1, c2, c3, c4, c5, c6, c7, BLOCK_T, D, "", 0x6400, 0, False)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        elif VBITS == 4 and PTX:  # as _decode_soa4_kernel: exact integer codes by the 0x6400 half2 trick
            e = tl.inline_asm_elementwise(pt.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx0, vx1], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            f = tl.inline_asm_elementwise(pt.VALUE4_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                          [vx2, vx3], dtype=(tl.float16,) * 16, is_pure=True, pack=1)
            v16 = tsu._tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13],
                             e[14], e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11],
                             f[12], f[13], f[14], f[15], BLOCK_T, D)
        else:
            va0, va1, va2, va3, vb0, vb1, vb2, vb3 = tsu._chunk_windows(vx0, vx1, vx2, vx3, VBITS)
            vc = tsu._codes32(va0, va1, va2, va3, vb0, vb1, vb2, vb3, VBITS, D, BLOCK_T, 0x6400)
            v16 = vc.to(tl.int16).to(tl.float16, bitcast=True) - 1024.0
        vs = tl.load(c16 + region16 + o * SS + SO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        vz = tl.load(c16 + region16 + o * ZS + ZO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(tl.float16), v16)
        acc_z = acc_z * alpha + tl.sum(p * vz[None, :], axis=1)
        m_i = m_new
    tk._store_partial(mid_ptr, b, heads, gmask, s, m_i, l_i, acc, acc_z, cols, stride_mb, stride_mh, stride_ms, D)


def _meta(spec: TurboQuantSpec, hq: int, hk: int, d: int, bs: int, lut: int, block_t: int, variant: int,
          ptx: bool) -> dict:
    return dict(GROUP=hq // hk, GP=tk.query_tile_rows(hq // hk), BLOCK_SIZE=bs, D=d, BLOCK_T=block_t,
                KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read, LUT=lut,
                LUT_ASM=pt._asm_for(spec, d, lut), VARIANT=variant, KEY_FP8=spec.key_fp8, PTX=ptx,
                **tk._field_addr(spec, d, bs), **tk._planes_flags(spec, d, bs))


def decode_attention(query, cache, block_tables, seq_lens, spec: TurboQuantSpec, scale, mid_out, output, lse,
                     variant: int = 0, block_t: int | None = None, num_warps: int | None = None,
                     maxnreg: int | None = None, lut: int | None = None, stats: dict | None = None):
    """:func:`_decode_frag_kernel` on a block-SoA cache, then the portable reduction; arguments and launch
    defaults as ``_triton_soa.decode_attention`` (``launch.SOA_DEFAULTS["soa_decode"]``)."""
    cfg = SOA_DEFAULTS["soa_decode"]
    bsz, hq, d = query.shape
    nb, hk, bs, _ = cache.shape
    if d % 32:
        raise ValueError(f"dev_turboquant_frag: head_dim {d} is not a multiple of 32 (whole 32-code chunks)")
    lut = pt._lut_mode(spec, query.device, lut, cfg)
    args = (query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
            *tk._centroid_poly(spec, d), scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
            query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))
    compiled = query.device.type == "cuda" and not pt.tk_interpret()
    meta = _meta(spec, hq, hk, d, bs, lut, block_t or cfg["block_t"], variant, compiled)
    meta["num_warps"] = num_warps or cfg["num_warps"]
    maxnreg = cfg.get("maxnreg") if maxnreg is None else maxnreg
    if maxnreg and compiled:
        meta["maxnreg"] = maxnreg
    kern = _decode_frag_kernel[(bsz, hk, mid_out.shape[2])](*args, **meta)
    tk._record(stats, kern)
    tk.reduce(mid_out, output, lse)
    return output


# ----------------------------------------------------------------------------- static compile (no GPU)
def sass(out_dir: str, presets, variants=(0,), maxnreg: int = 128, div16: bool = True) -> list[dict]:
    """Compile the package kernel and each variant for sm_90 (Llama GQA 4, D 128, 128 x 4, the GPU's constexprs,
    ``_sass_sm90.DECODE_DIV16`` unless ``div16`` is False) and report registers, stack, SASS totals (whole
    kernel, loop), shared-memory and local-memory opcodes of the loop and the TTGIR's local_alloc / convert_layout."""
    from _sass_sm90 import DECODE_DIV16, compile_sm90, decode_signature, report, soa_decode_meta

    from tqlab.turboquant import get_spec

    rows, div = [], DECODE_DIV16 if div16 else ()
    for name in presets:
        spec = get_spec(name, cache_layout="block_soa")
        for var in ["soa4", *variants]:
            if var == "soa4":
                fn, meta = ts._decode_soa4_kernel, soa_decode_meta(spec)
            else:
                fn, meta = _decode_frag_kernel, _meta(spec, 32, 8, 128, 16, 0 if spec.key_fp8 else 2, 128, var, True)
            r = report(compile_sm90(fn, decode_signature(), meta, num_warps=4, maxnreg=maxnreg, divisible=div), out_dir,
                       f"frag_{name.removeprefix('turboquant_')}_{var if var == 'soa4' else f'v{var}'}")
            lp = dict(r["loop_opcodes"])
            row = {"triton": triton.__version__, "div16": div16, "preset": name,
                   "variant": var if var == "soa4" else f"v{var}", "regs": r["usage"].get("REG"),
                   "stack": r["usage"].get("STACK"), "sass": r["sass_total"], "loop_sass": r["loop_sass"],
                   "local_alloc": r["local_alloc"], "convert_layout": r["convert_layout"],
                   **{f"loop_{op}": lp.get(op, 0) for op in ("STS", "LDS", "LDSM", "LDL", "STL", "SHFL", "BAR", "HMMA")}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ----------------------------------------------------------------------------- GPU check + timing
SHAPES = {"llama": (32, 8, 16), "seed": (4, 1, 4)}


def _soa4(q, cache, bt, sl, spec, mid, out, lse, stats=None):
    ts.decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, stats=stats)


def _frag(var: int):
    def call(q, cache, bt, sl, spec, mid, out, lse, stats=None):
        decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, variant=var, stats=stats)
    return call


# launch variants of the package kernel (``_triton_soa.decode_attention`` keyword overrides, each pinned in full so
# a re-run means what data/turboquant_gp_launch_h200.json recorded; ``soa4`` is the package's current launch, which
# since then is gp4_r96): ``gp_min`` 1 = the query tile has the GQA group's own rows (4 on both bench shapes)
LAUNCH = {"gp4": {"gp_min": 1, "maxnreg": 128}, "gp4_r96": {"gp_min": 1, "maxnreg": 96},
          "gp4_r112": {"gp_min": 1, "maxnreg": 112},
          "gp4_t256w8": {"gp_min": 1, "block_t": 256, "num_warps": 8, "maxnreg": 128},
          "gp16": {"gp_min": 16, "maxnreg": 128}}


def _launch(kw: dict):
    def call(q, cache, bt, sl, spec, mid, out, lse, stats=None):
        ts.decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, stats=stats, **kw)
    return call


def kernels(variants, launches=(), gluon=()) -> dict:
    """name -> call: ``soa4`` (the package's ``_decode_soa4_kernel``, the baseline of every check), ``v<N>``, the
    :data:`LAUNCH` variants named in ``launches`` and the Gluon decode with each override of ``gluon``
    (:func:`_gluon`)."""
    out = {"soa4": _soa4, **{f"v{v}": _frag(v) for v in variants}, **{n: _launch(LAUNCH[n]) for n in launches}}
    return {**out, **{f"gluon_{g}" if g else "gluon": _gluon(g) for g in gluon}}


def _gluon(name: str):
    """The Gluon decode with launch overrides ``name``: "" (defaults), ``r<N>`` (register cap), ``w<N>`` (warps)."""
    kw = {"maxnreg": int(name[1:])} if name.startswith("r") else {"num_warps": int(name[1:])} if name else {}

    def call(q, cache, bt, sl, spec, mid, out, lse, stats=None):
        from tqlab.turboquant import _gluon_decode as gd

        gd.decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, stats=stats, **kw)
    return call


def run(log, contexts, presets, variants, rows, save, launches=(), gluon=(), splits=("fill",)) -> None:
    """Per (shape, context, preset), every kernel of :func:`kernels` on the same K/V (the block-SoA store's cache,
    key norms folded): max |out - out_soa4| and |lse - lse_soa4|, registers, ColdTimer ms (CUDA-graph replay, L2
    flushed)."""
    from _tq_bench import ColdTimer, fill_paged, random_decode_inputs

    from tqlab.turboquant import get_spec
    from tqlab.turboquant import ops as _ops

    timer, d, kern = ColdTimer(), 128, kernels(variants, launches, gluon)
    for shape, (hq, hk, b) in SHAPES.items():
        for ctx in contexts:
            k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=1000 + ctx + b + hq)
            dev = q.device
            sl = torch.full((b,), ctx, device=dev, dtype=torch.int32)
            sl[-1] = ctx - 1037  # one uneven request: a partial tile and a partial block
            for s in sorted({_ops.decode_num_splits(b, hk, "fill") if sp == "fill" else int(sp) for sp in splits}):
                for name in presets:
                    spec = get_spec(name, cache_layout="block_soa")
                    cache, bt = fill_paged(spec, k, v)  # the block-SoA store: key norms folded
                    res = {}
                    for var, fn in kern.items():
                        mid = torch.full((b, hq, s, d + 1), float("nan"), device=dev)
                        out = torch.full((b, hq, d), float("nan"), device=dev, dtype=torch.bfloat16)
                        lse = torch.full((b, hq), float("nan"), device=dev)
                        st: dict = {}
                        fn(q, cache, bt, sl, spec, mid, out, lse, stats=st)
                        res[var] = (out.float().clone(), lse.clone())
                        row = {"shape": shape, "ctx": ctx, "preset": name, "splits": s, "variant": var, "base": "soa4",
                               "regs": st.get("n_regs"), "spills": st.get("n_spills"),
                               "nan": bool(torch.isnan(out.float()).any() or torch.isnan(lse).any()),
                               "out_max_abs_vs_base": float((out.float() - res["soa4"][0]).abs().max()),
                               "lse_max_abs_vs_base": float((lse - res["soa4"][1]).abs().max()),
                               "ms": timer(lambda: fn(q, cache, bt, sl, spec, mid, out, lse))}
                        row["ok"] = not row["nan"] and row["out_max_abs_vs_base"] < 2e-2 and row["lse_max_abs_vs_base"] < 1e-2
                        rows.append(row)
                        log(row)
                    cache = None
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
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--variants", default="0",
                    help="VARIANTs of _decode_frag_kernel to time beside the package kernel (0: before, 1: kWidth 2)")
    ap.add_argument("--launch", default="", help=f"launch variants of the package kernel, comma-separated: {sorted(LAUNCH)}")
    ap.add_argument("--splits", default="fill", help="split counts, comma-separated: 'fill' (ops.decode_num_splits) "
                    "or integers")
    ap.add_argument("--gluon", default=None, help="time the Gluon kernel (_gluon_decode; the rotated presets) too, "
                    "with these launch overrides, comma-separated: 'default' (launch_warps' rule), r<N> (register "
                    "cap), w<N> (warps)")
    ap.add_argument("--sass", default=None, metavar="DIR",
                    help="no GPU: compile the package kernel and the variants for sm_90 into DIR and print counts")
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
        sass(args.sass, args.presets.split(","), variants)
        return 0
    if not torch.cuda.is_available():
        print("dev_turboquant_frag.py times CUDA kernels: no CUDA device here (use --sass DIR)", file=sys.stderr)
        return 2
    from _tq_bench import json_saver, progress_log, provenance

    t0 = time.time()
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"provenance": provenance(args), "method": __doc__, "rows": []}

    log, save = progress_log(t0), json_saver(res, out, t0)

    gluon = [("" if g == "default" else g) for g in args.gluon.split(",")] if args.gluon else []
    launches = [n for n in args.launch.split(",") if n]
    unknown = sorted(set(launches) - set(LAUNCH))
    if unknown:
        print(f"dev_turboquant_frag.py: unknown --launch {unknown}; known: {sorted(LAUNCH)}", file=sys.stderr)
        return 2
    run(log, [int(c) for c in args.contexts.split(",")], args.presets.split(","), variants, res["rows"], save, launches,
        gluon, args.splits.split(","))
    bad = [r for r in res["rows"] if not r["ok"]]
    print(f"CHECK: {len(res['rows']) - len(bad)} ok, {len(bad)} failed", flush=True)
    for r in res["rows"]:
        if r["variant"] != "soa4":
            base = next(x for x in res["rows"]
                        if x["variant"] == "soa4" and all(x[k] == r[k] for k in ("shape", "ctx", "preset", "splits")))
            print(f"{r['shape']:5s} {r['ctx'] // 1024:4d}K S {r['splits']:3d} {r['preset']:20s} soa4 {base['ms']:.3f} ms "
                  f"(regs {base['regs']}) "
                  f"vs {r['variant']} {r['ms']:.3f} ms (regs {r['regs']}): soa4 {r['ms'] / base['ms']:.2f}x faster, "
                  f"out diff {r['out_max_abs_vs_base']:.2e}")
    save()
    print(f"done in {time.time() - t0:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
