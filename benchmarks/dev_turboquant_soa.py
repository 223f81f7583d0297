"""Driver of the block-SoA decode kernels (issue 20; integrated as ``cache_layout="block_soa"``):
an in-block structure-of-arrays byte order for the TurboQuant cache, so the fast decode kernel's loads are wide and contiguous.

Layout of one (block, KV head) region of ``block_size * slot_bytes`` bytes (same bytes per token,
same quantizer; 3-bit code fields in nibble-plane bit order, ``TurboQuantSpec.code_order``, so the
16-codes-per-thread ``soa_w*`` variants, which read vLLM's bit stream only, run on the 4-bit presets only)::

    [key codes of token 0 .. BS-1 : BS x key_index_bytes]     16-byte aligned (48 / 64 B each)
    [value codes of token 0 .. BS-1 : BS x value_index_bytes] 16-byte aligned
    [key norms fp16 : BS x 2][value scales fp16 : BS x 2][value zeros fp16 : BS x 2][pad]

vLLM's order keeps all fields of one token together (102-byte slots for 3bit_nc, 2-byte aligned),
so the per-token scalars sit 102 bytes apart (one 32-byte sector per 2 useful bytes) and the
code groups are read as 16-bit words.  Here the scalars of 16 tokens fill one sector and a group
of 16 codes is read as two aligned 32-bit words (``W32``) or three 16-bit ones (``W16``, only the
addresses change).  The SoA cache is written by tqlab's store with the block-SoA spec from the same
K/V and block table (:func:`paged_pair`): tqlab's bytes permuted, except the key norms of the ``_nc``
presets, which hold ``||k|| / ||c_hat||`` (``TurboQuantSpec.norm_folded``, as vLLM 0.33's SoA store),
so the byte permutation ``to_cache_layout`` alone would not give a valid SoA cache; the kernels are in
``tqlab/turboquant/_triton_soa.py``.  ``soa_x32*``: the same order, 32
codes per thread (4 lanes per token at D = 128), so a 4-bit field chunk is one 16-byte load per
thread and a 3-bit one three 32-bit loads, and fewer lanes share each token's scalars.

Checks every variant against the torch reference (fresh random K/V, shuffled blocks, uneven
sequence lengths, poisoned outputs), then times fp16 SDPA, today's fast kernel and the SoA
variants on the Llama-3.1-8B shard (Hq 32, Hk 8, B 16) and the seed TP-8 rank (Hq 4, Hk 1, B 4)
at 8K / 32K / 128K, CUDA-graph replay with L2 flushed (``_tq_bench.ColdTimer``), splits from
``ops.decode_num_splits(B, Hk, "fill")``.

    python benchmarks/dev_turboquant_soa.py --out $OUT/soa.json
    python benchmarks/dev_turboquant_soa.py --record --commit X   # data/turboquant_soa_prototype_h200.json
    python benchmarks/dev_turboquant_soa.py --profile package   # one Llama 32K 3bit_nc launch, for ncu
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recording import default_dir
from _tq_bench import ColdTimer, fill_paged, json_saver, progress_log, provenance, random_decode_inputs, sdpa
from tqlab.turboquant import TQ_PRESETS, decode_attention, get_spec
from tqlab.turboquant import _triton_fast as tf
from tqlab.turboquant import _triton_kernels as tk
from tqlab.turboquant import _triton_soa as ts
from tqlab.turboquant.ops import decode_num_splits

ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]

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
    # the package's launch (``launch.SOA_DEFAULTS["soa_decode"]``: tile, warps, register cap, query tile rows)
    "package": ("soa", {"x32": True, "block_t": None, "num_warps": None, "maxnreg": None}),
    # the Gluon decode (``_gluon_decode``, issue 20 round 5; the rotated presets), for ``--profile gluon``
    "gluon": ("gluon", {}),
}


def paged_pair(spec, k, v, seed=0):
    """``((cache in vLLM's order, cache in block-SoA order), block table)``: the same K/V stored twice
    by tqlab's store (``_tq_bench.fill_paged``, the same shuffled block table for the same ``seed``)."""
    cache, bt = fill_paged(spec, k, v, seed=seed)
    soa, bt_soa = fill_paged(get_spec(spec, "block_soa"), k, v, seed=seed)
    assert torch.equal(bt, bt_soa)
    return (cache, soa), bt


def _call(variant, q, caches, bt, sl, spec, mid, out, lse, stats=None):
    kind, kw = VARIANTS[variant]
    d = q.shape[-1]
    if kind == "fast":
        tf.decode_attention(q, caches[0], bt, sl, spec, d**-0.5, mid, out, lse, stats=stats)
    elif kind == "gluon":
        from tqlab.turboquant import _gluon_decode as gd

        gd.decode_attention(q, caches[1], bt, sl, get_spec(spec, "block_soa"), d**-0.5, mid, out, lse, stats=stats)
    else:
        kw = {"block_t": 64, "num_warps": 4, "maxnreg": 0, "x32": False, **kw}  # the prototypes' launch
        ts.decode_attention(q, caches[1], bt, sl, get_spec(spec, "block_soa"), d**-0.5, mid, out, lse, stats=stats,
                            **kw)


def _serves(variant, spec, d) -> bool:
    """False for the ``soa_w*`` prototypes (``x32`` False) on a cache with nibble-plane fields:
    ``_triton_soa.decode_attention`` refuses them (they read vLLM's bit stream only)."""
    kind, kw = VARIANTS[variant]
    planes = any(tk._planes_flags(get_spec(spec, "block_soa"), d, 16).values())
    if kind == "gluon":
        return get_spec(spec).name in ROTATED
    return kind == "fast" or kw.get("x32", False) or not planes


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
            caches, bt = paged_pair(spec, k, v, seed=seed)
            cache = caches[0]
            mid = torch.empty(b, hq, 32, d + 1, device="cuda")
            o_ref, l_ref = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16), torch.empty(b, hq, device="cuda")
            decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o_ref, l_ref, backend="torch")
            for var in (v for v in VARIANTS if _serves(v, spec, d)):
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
                caches, bt = paged_pair(spec, k, v)
                mid = torch.empty(b, hq, s, d + 1, device="cuda")
                out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, hq, device="cuda")
                row = {"shape": shape, "hq": hq, "hk": hk, "batch": b, "ctx": ctx, "preset": name, "splits": s,
                       "sdpa_ms": sdpa_ms}
                for var in (v for v in variants or VARIANTS if _serves(v, spec, d)):
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
    caches, bt = paged_pair(spec, k, k * 0.5 + 0.1)
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

    log, save = progress_log(t0), json_saver(res, out, t0)

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
