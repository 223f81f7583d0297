"""Prototype for issue 20 (not integrated): a "nibble-plane" bit order for the 3-bit code fields of the
block-SoA cache, plus the key norm correction folded into the stored norm, timed against today's
block-SoA decode on the H200.

Why (static SASS of ``_triton_soa._decode_soa4_kernel``, ``benchmarks/_sass_sm90.py``, Triton 3.9, sm_90,
3bit_nc, per 128-token tile and thread, 256 codes): a loop of 2033 instructions.  Two parts are pure
overhead of the stored form, not of the arithmetic:

* the norm correction ``||c_t||`` recomputed per token (fp16 -> fp32, square, sum): ~400 instructions.
  vLLM 0.33's own SoA store folds it at store time (``vllm/v1/attention/ops/turboquant_soa/
  triton_turboquant_store.py`` ``triton_turboquant_store``: stored value = ``||k_t|| / ||c_t||``), so
  the decode skips it.  Here: the same fold, applied by :func:`to_planes` (fp32 centroids).
* cutting 3-bit codes out of vLLM's LSB-first bit stream into ``prmt`` nibble selectors: shifts and
  masks per 4 codes (``_triton_fast.lut_group_asm``: 11 PTX ops per 4 codes before the 4 ``prmt``).

Nibble planes (same 12 bytes per 32 codes, same codes, only the bit order inside a thread's chunk of
32 codes changes): word ``L0`` holds the low 2 bits of codes 0-7 at bits ``4j .. 4j+1`` and of codes
8-15 at ``4j+2 .. 4j+3``; ``L1`` the same for codes 16-31; ``H`` the high bit of code ``8r + j`` at bit
``4j + r``.  The ``prmt`` selector of 8 codes is then ``(L & 0x33333333) | ((H << s) & 0x44444444)``:
two logic ops and a shift instead of ~22.  Values use the same selectors against a table of the
high bytes of fp16(0..7) (the low bytes are all zero): exact integer codes with no ``- 1024``.

    python benchmarks/dev_turboquant_planes.py --out $OUT/planes.json      # check + timing, ~1 min
    python benchmarks/dev_turboquant_planes.py --sass                       # static counts, no GPU
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recording import default_dir
from tqlab.turboquant import TQ_PRESETS, get_spec
from tqlab.turboquant import _triton_fast as tf
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import _triton_soa as ts
from tqlab.turboquant.codebook import lloyd_max
from tqlab.turboquant.quant import pack_indices, unpack_indices

ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


# ----------------------------------------------------------------------------- the byte order (torch)
def planes_from_codes(codes: torch.Tensor) -> torch.Tensor:
    """3-bit codes ``(..., D)`` (``D % 32 == 0``) -> the nibble-plane bytes ``(..., 3 * D / 8)``: per chunk
    of 32 codes the little-endian words ``L0, L1, H`` described in the module docstring."""
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, 4, 8)  # (..., chunk, r, j): code 8r + j
    j4 = torch.arange(8, device=codes.device, dtype=torch.int64) * 4
    lo = c & 3
    l0 = ((lo[..., 0, :] << j4) | (lo[..., 1, :] << (j4 + 2))).sum(-1)
    l1 = ((lo[..., 2, :] << j4) | (lo[..., 3, :] << (j4 + 2))).sum(-1)
    r = torch.arange(4, device=codes.device, dtype=torch.int64)[:, None]
    h = (((c >> 2) & 1) << (j4[None, :] + r)).sum((-1, -2))
    words = torch.stack([l0, l1, h], -1)  # (..., chunk, 3)
    by = (words[..., None] >> (torch.arange(4, device=codes.device) * 8)) & 0xFF
    return by.to(torch.uint8).reshape(*codes.shape[:-1], -1)


def codes_from_planes(planes: torch.Tensor, d: int) -> torch.Tensor:
    """Inverse of :func:`planes_from_codes` (uint8 codes ``(..., D)``)."""
    w = planes.to(torch.int64).reshape(*planes.shape[:-1], d // 32, 3, 4)
    w = (w << (torch.arange(4, device=planes.device) * 8)).sum(-1)  # (..., chunk, 3)
    j4 = torch.arange(8, device=planes.device, dtype=torch.int64) * 4
    out = []
    for r in range(4):
        lw = w[..., r // 2]
        lo = (lw[..., None] >> (j4 + 2 * (r % 2))) & 3
        hi = (w[..., 2][..., None] >> (j4 + r)) & 1
        out.append(lo | (hi << 2))
    return torch.stack(out, -2).reshape(*planes.shape[:-1], d).to(torch.uint8)


def to_planes(blocks: torch.Tensor, spec, d: int, fold: bool = True, planes: bool = True) -> torch.Tensor:
    """A block-SoA cache -> the same cache with its 3-bit code fields in nibble-plane order (``planes``)
    and, for a norm-corrected preset, each key norm divided by its centroid vector's norm (``fold``,
    fp32 centroids, stored fp16, as vLLM's SoA store does).  Returns a new tensor."""
    spec = get_spec(spec, "block_soa")
    nb, hk, bs, sb = blocks.shape
    fa = spec.field_addresses(d, bs)
    reg = blocks.reshape(nb, hk, bs * sb).clone()
    for kind, bits in (("key_idx", spec.key_bits), ("val_idx", spec.value_bits)):
        if kind not in fa:
            continue
        off, stride, n = fa[kind]
        field = reg[..., off:off + bs * n].reshape(nb, hk, bs, n)
        codes = unpack_indices(field, bits, d)
        if kind == "key_idx" and fold and spec.norm_correction:
            cent = torch.tensor(list(lloyd_max(bits, d).centroids), dtype=torch.float32, device=blocks.device)
            cn = cent[codes.long()].pow(2).sum(-1).sqrt()
            noff, _, _ = fa["key_norm"]
            nf = reg[..., noff:noff + 2 * bs].reshape(nb, hk, bs, 2).contiguous().view(torch.float16)[..., 0]
            folded = (nf.float() / torch.where(cn > 0, cn, torch.ones_like(cn))).to(torch.float16)
            reg[..., noff:noff + 2 * bs] = folded.contiguous().view(torch.uint8).reshape(nb, hk, 2 * bs)
        if planes and bits == 3:
            reg[..., off:off + bs * n] = planes_from_codes(codes).reshape(nb, hk, bs * n)
        else:
            reg[..., off:off + bs * n] = pack_indices(codes, bits).reshape(nb, hk, bs * n)
    return reg.reshape(nb, hk, bs, sb)


# ----------------------------------------------------------------------------- PTX
def _word(bs):
    return bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24


def planes_asm(table16: list[int] | None) -> str:
    """PTX: ``$16`` = a plane word L, ``$17`` = H shifted so that code ``j``'s high bit is at bit ``4j + 2``
    (``H << 2`` for codes 0-15 of the chunk, ``H`` for codes 16-31) -> 16 fp16 ``$0 .. $15`` of codes
    ``0..15`` of that half.  ``table16``: the 8 fp16 bit patterns (key centroids); None = the values'
    integer table (fp16(0..7): low bytes zero)."""
    lines = ["{", ".reg .b32 s, t, u, l, h, r0, r1, z;", "mov.b32 z, 0;"]
    if table16 is not None:
        lo = [x & 0xFF for x in table16]
        hi = [x >> 8 for x in table16]
        tl_ = (_word(lo[:4]), _word(lo[4:]))
    else:
        hi = [int(v) >> 8 for v in torch.arange(8, dtype=torch.float16).view(torch.int16).tolist()]
    th = (_word(hi[:4]), _word(hi[4:]))
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
            lines.append(f"prmt.b32 h, {th[0]}, {th[1]}, {sel};")
            if table16 is not None:
                lines += [f"prmt.b32 l, {tl_[0]}, {tl_[1]}, {sel};",
                          "prmt.b32 r0, l, h, 0x5140;", "prmt.b32 r1, l, h, 0x7362;"]
            else:
                lines += ["prmt.b32 r0, h, z, 0x1404;", "prmt.b32 r1, h, z, 0x3424;"]
            lines += [f"mov.b32 {{${o}, ${o + 1}}}, r0;", f"mov.b32 {{${o + 2}, ${o + 3}}}, r1;"]
    lines.append("}")
    return "\n".join(lines)


def key_table(spec, d: int) -> list[int]:
    import numpy as np
    cent = np.asarray(lloyd_max(spec.key_bits, d).centroids, dtype=np.float16).view(np.uint16)
    return [int(x) for x in cent]


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _planes16(lw, hw, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r", [lw, hw],
                                     dtype=(tl.float16,) * 16, is_pure=True, pack=1)


@triton.jit
def _planes32(x0, x1, x2, T: tl.constexpr, D: tl.constexpr, ASM: tl.constexpr):
    """fp16 ``[T, D]`` of a 3-bit field in nibble-plane order (chunk words ``L0, L1, H``)."""
    e = _planes16(x0, x2 << 2, ASM)
    f = _planes16(x1, x2, ASM)
    return ts._tree32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[13], e[14],
                      e[15], f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13],
                      f[14], f[15], T, D)


@triton.jit
def _decode_planes_kernel(
    q_ptr, c16, c32, bt_ptr, sl_ptr, mid_ptr,
    c0, c1, c2, c3, c4, c5, c6, c7,
    qk_scale, inv_sqrt_d, num_blocks, num_splits,
    stride_qb, stride_qh, stride_cb16, stride_ch16, stride_btb, stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    KBITS: tl.constexpr, VBITS: tl.constexpr, NORM_CORR: tl.constexpr, LUT: tl.constexpr, LUT_ASM: tl.constexpr,
    KO: tl.constexpr, KS: tl.constexpr, NO: tl.constexpr, NS: tl.constexpr, VO: tl.constexpr, VS: tl.constexpr,
    SO: tl.constexpr, SS: tl.constexpr, ZO: tl.constexpr, ZS: tl.constexpr,
    PLANES: tl.constexpr, KASM: tl.constexpr, VASM: tl.constexpr,
):
    """``_triton_soa._decode_soa4_kernel`` with the norm folded (``NORM_CORR`` False: the stored norm is
    ``||k|| / ||c||``) and, with ``PLANES``, 3-bit fields read in nibble-plane order."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    heads, gmask, start, end, q, ones, cols = tf._fast_prologue(q_ptr, sl_ptr, b, hk, s, num_splits, stride_qb,
                                                                stride_qh, inv_sqrt_d, GROUP, GP, D, False)
    m_i, l_i, acc, acc_z = tk._online_init(GP, D)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in tl.range(start, end, BLOCK_T, num_stages=1):
        in_seq, ok, region16, o = ts._soa_rows(bt_row, t0, end, num_blocks, hk, stride_cb16, stride_ch16,
                                               BLOCK_SIZE, BLOCK_T)
        kx0, kx1, kx2, kx3 = ts._words_x32(c32, (region16 + o * KS + KO) // 2, ok, KBITS, D)
        if PLANES and KBITS == 3:
            k16 = _planes32(kx0, kx1, kx2, BLOCK_T, D, KASM)
        else:
            ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3 = ts._chunk_windows(kx0, kx1, kx2, kx3, KBITS)
            k16 = ts._keys32(ka0, ka1, ka2, ka3, kb0, kb1, kb2, kb3, c0, c1, c2, c3, c4, c5, c6, c7, KBITS, D,
                             BLOCK_T, LUT, LUT_ASM)
        kn = tl.load(c16 + region16 + o * NS + NO, mask=ok, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        sc = tl.dot(q, tl.trans(k16))
        if NORM_CORR:
            y32 = k16.to(tl.float32)
            n2 = tl.sum(y32 * y32, axis=1)
            sc = sc * (kn * qk_scale * tl.where(n2 > 0, tl.rsqrt(n2), 1.0))[None, :]
        else:
            sc = sc * (kn * qk_scale)[None, :]
        m_new, alpha, p, l_i = tk._online_step(sc, in_seq, m_i, l_i)
        vx0, vx1, vx2, vx3 = ts._words_x32(c32, (region16 + o * VS + VO) // 2, ok, VBITS, D)
        if PLANES and VBITS == 3:
            v16 = _planes32(vx0, vx1, vx2, BLOCK_T, D, VASM)
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


def _meta(spec, d, bs, planes, fold, block_t=128, num_warps=4):
    spec = get_spec(spec, "block_soa")
    lut = 2
    return dict(GROUP=None, BLOCK_SIZE=bs, D=d, BLOCK_T=block_t, KBITS=spec.key_bits, VBITS=spec.value_bits,
                NORM_CORR=spec.norm_correction and not fold, LUT=lut, LUT_ASM=tf._asm_for(spec, d, lut),
                PLANES=planes, KASM=planes_asm(key_table(spec, d)) if spec.key_bits == 3 else "",
                VASM=planes_asm(None), num_warps=num_warps, **tk._field_addr(spec, d, bs))


def decode(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse, planes=True, fold=True,
           maxnreg=128):
    """Split kernel + ``_triton_kernels.reduce`` on a cache prepared by :func:`to_planes` (same flags)."""
    bsz, hq, d = query.shape
    nb, hk, bs, sb = cache.shape
    args = (query, cache.view(torch.uint16), cache.view(-1).view(torch.int32), block_tables, seq_lens, mid_out,
            *tk._centroid_poly(spec, d), scale * tk._LOG2E, 1.0 / math.sqrt(d), nb, mid_out.shape[2],
            query.stride(0), query.stride(1), cache.stride(0) // 2, cache.stride(1) // 2,
            block_tables.stride(0), mid_out.stride(0), mid_out.stride(1), mid_out.stride(2))
    meta = _meta(spec, d, bs, planes, fold)
    meta.update(GROUP=hq // hk, GP=max(16, triton.next_power_of_2(hq // hk)))
    if maxnreg and query.device.type == "cuda" and not tf.tk_interpret():
        meta["maxnreg"] = maxnreg
    _decode_planes_kernel[(bsz, hk, mid_out.shape[2])](*args, **meta)
    tk.reduce(mid_out, output, lse)
    return output


# ----------------------------------------------------------------------------- static counts / GPU run
def sass() -> None:
    from _sass_sm90 import compile_sm90, report
    sig = {"q_ptr": "*fp16", "c16": "*u16", "c32": "*i32", "bt_ptr": "*i32", "sl_ptr": "*i32", "mid_ptr": "*fp32"}
    sig.update({f"c{i}": "fp32" for i in range(8)})
    sig.update(qk_scale="fp32", inv_sqrt_d="fp32", num_blocks="i32", num_splits="i32")
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "stride_cb16", "stride_ch16", "stride_btb", "stride_mb",
                                   "stride_mh", "stride_ms")})
    for name in ROTATED:
        for planes, fold in ((False, False), (False, True), (True, True)):
            meta = _meta(TQ_PRESETS[name], 128, 16, planes, fold)
            meta.update(GROUP=4, GP=16)
            nw = meta.pop("num_warps")
            r = report(compile_sm90(_decode_planes_kernel, sig, meta, num_warps=nw, maxnreg=128), "/tmp/planes",
                       f"{name}_{int(planes)}{int(fold)}")
            print(f"{name:22s} planes={planes!s:5} fold={fold!s:5} regs {r['usage'].get('REG')} stack "
                  f"{r['usage'].get('STACK')} SASS {r['sass_total']}  " + ", ".join(f"{o} {n}" for o, n in r["opcodes"][:8]))


# "soa" = the block-SoA decode before the fold (this kernel with NORM_CORR on the unfolded
# ``to_cache_layout`` cache): tqlab's ``_triton_soa`` now reads block-SoA norms as folded
# (``TurboQuantSpec.norm_folded``), so it cannot serve the unfolded baseline any more
VARIANTS = {"soa": (False, False), "soa_fold": (False, True), "planes_fold": (True, True)}


def run_gpu(out_path: str | None, contexts, commit: str | None = None) -> dict:
    from _tq_bench import ColdTimer, fill_paged, provenance, random_decode_inputs, sdpa
    from tqlab.turboquant import decode_attention
    from tqlab.turboquant.ops import decode_num_splits
    from tqlab.turboquant.quant import to_cache_layout
    rows, timer = [], ColdTimer()
    res = {"provenance": provenance(argparse.Namespace(commit=commit)), "rows": rows}

    def call(var, q, caches, bt, sl, spec, mid, out, lse):
        soa_spec = get_spec(spec, "block_soa")
        pl, fo = VARIANTS[var]
        return decode(q, caches[var], bt, sl, soa_spec, q.shape[-1] ** -0.5, mid, out, lse, planes=pl, fold=fo)

    # correctness: every variant against the torch reference on vLLM order
    for seed, (hq, hk, b, ctx) in enumerate([(32, 8, 4, 2048), (4, 1, 3, 3008)]):
        g = torch.Generator(device="cuda").manual_seed(500 + seed)
        d = 128
        k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g) * 2 + 0.5
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        sl = torch.tensor([ctx, 1, ctx - 1096, 17][:b], device="cuda", dtype=torch.int32)
        for name in ROTATED:
            spec = TQ_PRESETS[name]
            cache, bt = fill_paged(spec, k, v, seed=seed)
            soa = to_cache_layout(cache, get_spec(spec, "block_soa"), d)
            caches = {"soa": soa, "soa_fold": to_planes(soa, spec, d, True, False),
                      "planes_fold": to_planes(soa, spec, d, True, True)}
            mid = torch.empty(b, hq, 32, d + 1, device="cuda")
            o_ref, l_ref = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16), torch.empty(b, hq, device="cuda")
            decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o_ref, l_ref, backend="torch")
            for var in VARIANTS:
                mid = torch.full((b, hq, 32, d + 1), float("nan"), device="cuda")
                out = torch.full((b, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
                lse = torch.full((b, hq), float("nan"), device="cuda")
                call(var, q, caches, bt, sl, spec, mid, out, lse)
                row = {"check": "decode", "hq": hq, "preset": name, "variant": var,
                       "out_max_abs_vs_torch": float((out.float() - o_ref.float()).abs().max()),
                       "lse_max_abs_vs_torch": float((lse - l_ref).abs().max())}
                row["ok"] = row["out_max_abs_vs_torch"] < 2e-2 and row["lse_max_abs_vs_torch"] < 1e-2
                rows.append(row)
                print(json.dumps(row), flush=True)
    shapes = {"llama": (32, 8, 16), "seed": (4, 1, 4)}
    for shape, (hq, hk, b) in shapes.items():
        for ctx in contexts:
            d = 128
            k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=1000 + ctx + b + hq)
            q4 = q.to(torch.float16)[:, :, None, :]
            sdpa_ms = timer(lambda: sdpa(q4, k, v, d**-0.5))
            sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
            s = decode_num_splits(b, hk, "fill")
            for name in ROTATED:
                spec = TQ_PRESETS[name]
                cache, bt = fill_paged(spec, k, v)
                soa = to_cache_layout(cache, get_spec(spec, "block_soa"), d)
                del cache
                caches = {"soa": soa, "soa_fold": to_planes(soa, spec, d, True, False),
                          "planes_fold": to_planes(soa, spec, d, True, True)}
                mid = torch.empty(b, hq, s, d + 1, device="cuda")
                out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, hq, device="cuda")
                row = {"shape": shape, "hq": hq, "hk": hk, "batch": b, "ctx": ctx, "preset": name, "splits": s,
                       "sdpa_ms": sdpa_ms}
                for var in VARIANTS:
                    try:
                        call(var, q, caches, bt, sl, spec, mid, out, lse)
                        row[f"{var}_ms"] = timer(lambda: call(var, q, caches, bt, sl, spec, mid, out, lse))
                    except Exception as exc:
                        traceback.print_exc()
                        row[f"{var}_error"] = repr(exc)[:300]
                for var in VARIANTS:
                    if f"{var}_ms" in row:
                        row[f"sdpa_over_{var}"] = sdpa_ms / row[f"{var}_ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                caches = None
                torch.cuda.empty_cache()
            if out_path:
                Path(out_path).write_text(json.dumps(res, indent=1))
    if out_path:
        Path(out_path).write_text(json.dumps(res, indent=1))
    return res


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output file (default: build/turboquant_planes_prototype_h200.json, data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--commit", default=None, help="git commit to record (the GPU box has no .git)")
    ap.add_argument("--sass", action="store_true", help="static SASS counts for sm_90 (no GPU needed, writes nothing)")
    ap.add_argument("--contexts", default="32768,131072")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file a run writes: ``--out``, else ``build/`` (``data/`` with ``--record``); none with ``--sass``."""
    if args.sass:
        return []
    return [Path(args.out) if args.out else default_dir(args) / "turboquant_planes_prototype_h200.json"]


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.sass:
        sass()
        return 0
    if not torch.cuda.is_available():
        print("dev_turboquant_planes: needs a CUDA GPU (the kernels use PTX); --sass runs anywhere", file=sys.stderr)
        return 2
    (path,) = output_paths(a)
    path.parent.mkdir(parents=True, exist_ok=True)
    run_gpu(str(path), [int(x) for x in a.contexts.split(",")], a.commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
