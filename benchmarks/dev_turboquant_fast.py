"""Development run for the fast TurboQuant kernels of issue 20 (one device call): correctness of
``_triton_fast`` / ``_triton_dequant`` against the torch reference and the portable kernels (fresh random inputs,
poisoned outputs), then decode and dequant variants timed like the side-by-side benchmark
(decode: CUDA-graph replay, L2 flushed, median; dequant: graph replay, bandwidth share of copy).

    python benchmarks/dev_turboquant_fast.py --out $OUT/fast.json [--sections check,decode,dequant]
    python benchmarks/dev_turboquant_fast.py --record --commit X   # data/turboquant_fast_variants_h200.json
    python benchmarks/dev_turboquant_fast.py --one llama_3bit_32k --lut 2 --block-t 64   # for ncu
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

from _recording import default_dir  # noqa: E402
from _tq_bench import (ColdTimer, copy_bandwidth, dequant_bytes, fill_paged, json_saver, progress_log,  # noqa: E402
                       provenance, random_decode_inputs, sdpa, time_graph)

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv  # noqa: E402
from tqlab.turboquant import _triton_dequant as td  # noqa: E402
from tqlab.turboquant import _triton_fast as tf  # noqa: E402
from tqlab.turboquant import _triton_kernels as tk  # noqa: E402

CASES = {  # name: (hq, hk, batch, ctx, presets, splits)
    "llama_32k": (32, 8, 16, 32768, list(TQ_PRESETS), (32,)),
    "llama_128k": (32, 8, 16, 131072, ["turboquant_3bit_nc"], (32,)),
    "seed_128k": (4, 1, 4, 131072, ["turboquant_3bit_nc", "turboquant_k8v4"], (128, 256)),
    "seed_32k": (4, 1, 4, 32768, ["turboquant_3bit_nc"], (256,)),
    "llama_32k_splits": (32, 8, 16, 32768, ["turboquant_3bit_nc"], (16, 32, 64)),
    "seed_128k_splits": (4, 1, 4, 131072, ["turboquant_3bit_nc"], (64, 128, 256, 512)),
}
FAST_CFGS = [(64, 4), (32, 4)]
STAGED = False
FAST_MODES = [(False, False), (True, False), (False, True), (True, True)]  # (prefetch, norm_mma)


def _run_decode(impl, q, cache, bt, sl, spec, mid, out, lse, **kw):
    if impl == "torch":
        decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, backend="torch")
    elif impl == "portable":
        tk.decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, **kw)
    else:
        tf.decode_attention(q, cache, bt, sl, spec, q.shape[-1] ** -0.5, mid, out, lse, **kw)


def check(log) -> list:
    """Fast vs torch reference and vs the portable kernel, every preset and LUT mode."""
    rows = []
    for seed, (hq, hk, b, ctx) in enumerate([(32, 8, 4, 4096), (4, 1, 3, 3008)]):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        d = 128
        k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g) * 2 + 0.5
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        sl = torch.tensor([ctx, 1, ctx - 1096, 17][:b], device="cuda", dtype=torch.int32)
        for name, spec in TQ_PRESETS.items():
            cache, bt = fill_paged(spec, k, v, seed=seed)
            res = {}
            variants = [("torch", {}), ("portable", {})]
            for lut in ((0,) if spec.key_fp8 else (0, 1, 2)):
                for bt_, nw in ((64, 4), (32, 4), (128, 8)):
                    variants.append(("fast", {"lut": lut, "block_t": bt_, "num_warps": nw}))
            if STAGED:
                variants = variants[:2] + [("fast", {}), ("fast", {"staged": True, "norm_mma": True}),
                                           ("fast", {"staged": True, "norm_mma": True, "block_t": 128, "num_warps": 8})]
            for impl, kw in variants:
                mid = torch.full((b, hq, 32, d + 1), float("nan"), device="cuda")
                out = torch.full((b, hq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
                lse = torch.full((b, hq), float("nan"), device="cuda")
                _run_decode(impl, q, cache, bt, sl, spec, mid, out, lse, **kw)
                res[(impl, tuple(sorted(kw.items())))] = (out.float(), lse)
            o_ref, l_ref = res[("torch", ())]
            o_por, l_por = res[("portable", ())]
            for key, (o, lse) in res.items():
                row = {"check": "decode", "hq": hq, "preset": name, "impl": key[0], **dict(key[1]),
                       "nan": bool(torch.isnan(o).any() or torch.isnan(lse).any()),
                       "out_max_abs_vs_torch": float((o - o_ref).abs().max()),
                       "out_max_abs_vs_portable": float((o - o_por).abs().max()),
                       "lse_max_abs_vs_torch": float((lse - l_ref).abs().max())}
                row["ok"] = (not row["nan"]) and row["out_max_abs_vs_torch"] < 2e-2 and row["lse_max_abs_vs_torch"] < 2e-3
                rows.append(row)
                if not row["ok"] or key[0] != "fast" or dict(key[1]).get("block_t") == 64:
                    log(row)
            # dequant
            outs = {}
            for impl, kw in ([] if STAGED else [("torch", {}), ("portable", {}), ("fast", {"lut": 0}), ("fast", {"lut": 2})]):
                if spec.key_fp8 and kw.get("lut") == 2:
                    continue
                ko = torch.full((1, hk, ctx, d), float("nan"), device="cuda", dtype=torch.float16)
                vo = ko.clone()
                if impl == "torch":
                    dequant_kv(cache, bt[0], ctx - 5, ko, vo, spec, backend="torch")
                elif impl == "portable":
                    tk.dequant_kv(cache, bt[0], ctx - 5, ko, vo, spec)
                else:
                    td.dequant_kv(cache, bt[0], ctx - 5, ko, vo, spec, **kw)
                outs[(impl, kw.get("lut"))] = (ko, vo)
            if not outs:
                continue
            k0, v0 = outs[("torch", None)]
            for key, (ko, vo) in outs.items():
                row = {"check": "dequant", "hq": hq, "preset": name, "impl": key[0], "lut": key[1],
                       "written": bool(not torch.isnan(ko[:, :, :ctx - 5]).any() and not torch.isnan(vo[:, :, :ctx - 5]).any()),
                       "tail_untouched": bool(torch.isnan(ko[:, :, ctx - 5:]).all() and torch.isnan(vo[:, :, ctx - 5:]).all()),
                       "k_max_abs": float((ko[:, :, :ctx - 5].float() - k0[:, :, :ctx - 5].float()).abs().max()),
                       "v_equal": bool(torch.equal(vo[:, :, :ctx - 5], v0[:, :, :ctx - 5]))}
                row["ok"] = row["written"] and row["tail_untouched"] and row["k_max_abs"] < 4e-3 and row["v_equal"]
                rows.append(row)
                log(row)
            del cache
    return rows


def decode_variants(timer, log, cases, cfgs, rows=None, save=lambda: None) -> list:
    rows = [] if rows is None else rows
    for case in cases:
        hq, hk, b, ctx, presets, splits = CASES[case]
        d = 128
        k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=ctx + b)
        q4 = q.to(torch.float16)[:, :, None, :]
        sdpa_ms = timer(lambda: sdpa(q4, k, v, d**-0.5))
        log({"case": case, "impl": "sdpa", "ms": sdpa_ms})
        rows.append({"case": case, "impl": "sdpa", "ms": sdpa_ms})
        sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
        for preset in presets:
            spec = TQ_PRESETS[preset]
            cache, bt = fill_paged(spec, k, v)
            for s in splits:
                mid = torch.empty(b, hq, s, d + 1, device="cuda")
                out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, hq, device="cuda")
                variants = [("portable", {})]
                if not cfgs:  # the launch defaults only (ops' choice of kernel)
                    variants = [("fast" if not spec.key_fp8 else "portable", {})]
                if STAGED:  # whole blocks staged through shared memory (experiment)
                    variants += [("fast", {"staged": True, "norm_mma": True, "block_t": bt_, "num_warps": nw})
                                 for bt_, nw in ((64, 4), (32, 4), (128, 8), (64, 8))]
                lut = 0 if spec.key_fp8 else 2
                for pf, nm in (FAST_MODES if cfgs else []):
                    if spec.key_fp8 and nm:
                        continue
                    variants += [("fast", {"lut": lut, "block_t": bt_, "num_warps": nw, "prefetch": pf, "norm_mma": nm})
                                 for bt_, nw in cfgs]
                if cfgs:
                    variants.append(("fast", {"lut": lut, "block_t": 64, "num_warps": 4, "prefetch": True,
                                              "norm_mma": False, "maxnreg": 128}))
                for impl, kw in variants:
                    stats: dict = {}
                    try:
                        _run_decode(impl, q, cache, bt, sl, spec, mid, out, lse, stats=stats, **kw)
                        ms = timer(lambda: _run_decode(impl, q, cache, bt, sl, spec, mid, out, lse, **kw))
                    except Exception as exc:  # noqa: BLE001
                        traceback.print_exc()
                        rows.append({"case": case, "preset": preset, "splits": s, "impl": impl, **kw, "error": repr(exc)[:300]})
                        continue
                    row = {"case": case, "preset": preset, "splits": s, "impl": impl, **kw, "ms": ms,
                           "sdpa_over": sdpa_ms / ms, **stats}
                    rows.append(row)
                    log(row)
            del cache
            torch.cuda.empty_cache()
        del k, v
        torch.cuda.empty_cache()
        save()
    return rows


def dequant_variants(log, copy_gbps, rows=None, save=lambda: None) -> list:
    rows = [] if rows is None else rows
    for shape, hk, cl in (("llama", 8, 32768), ("llama", 8, 131072), ("seed", 1, 32768), ("seed", 1, 131072)):
        d = 128
        k = torch.randn(1, hk, cl, d, device="cuda", dtype=torch.float16)
        v = torch.randn(1, hk, cl, d, device="cuda", dtype=torch.float16)
        ko = torch.empty_like(k)
        vo = torch.empty_like(v)
        for preset in ("turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc"):
            spec = TQ_PRESETS[preset]
            cache, bt = fill_paged(spec, k, v)
            nbytes = sum(dequant_bytes(spec, hk, d, cl, bt.shape[1]))
            variants = [("portable", {})]
            variants += [("fast", {"lut": 2, "block_t": bt_, "num_warps": nw, "tiles_per_program": tl_})
                         for bt_, nw, tl_ in ((64, 4, 2), (64, 4, 1), (32, 4, 2), (32, 4, 4), (64, 8, 1), (32, 2, 2))]
            for impl, kw in variants:
                fn = (lambda: tk.dequant_kv(cache, bt[0], cl, ko, vo, spec)) if impl == "portable" else \
                    (lambda: td.dequant_kv(cache, bt[0], cl, ko, vo, spec, **kw))
                try:
                    ms = time_graph(fn)
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    rows.append({"shape": shape, "cached_len": cl, "preset": preset, "impl": impl, **kw, "error": repr(exc)[:300]})
                    continue
                row = {"shape": shape, "cached_len": cl, "preset": preset, "impl": impl, **kw, "ms": ms,
                       "share_of_copy": nbytes / ms / 1e6 / copy_gbps}
                rows.append(row)
                log(row)
            del cache
        del k, v, ko, vo
        torch.cuda.empty_cache()
        save()
    return rows


def one(args) -> int:
    """A single decode launch (after a warm-up) for Nsight Compute."""
    hq, hk, b, ctx, _, _ = CASES[args.one]
    spec = TQ_PRESETS[args.preset]
    d = 128
    k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16)
    cache, bt = fill_paged(spec, k, k * 0.5 + 0.1)
    q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
    sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    mid = torch.empty(b, hq, args.splits, d + 1, device="cuda")
    out = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(b, hq, device="cuda")
    kw = {"lut": args.lut, "block_t": args.block_t, "num_warps": args.num_warps, "prefetch": bool(args.prefetch),
          "norm_mma": bool(args.norm_mma)}
    for _ in range(2):
        _run_decode(args.impl, q, cache, bt, sl, spec, mid, out, lse, **({} if args.impl == "portable" else kw))
    torch.cuda.synchronize()
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output file (default: build/turboquant_fast_variants_h200.json, or data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--sections", default="check,decode,dequant")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--cfgs", default=",".join(f"{a}x{b}" for a, b in FAST_CFGS))
    ap.add_argument("--one", default=None)
    ap.add_argument("--preset", default="turboquant_3bit_nc")
    ap.add_argument("--lut", type=int, default=2)
    ap.add_argument("--block-t", type=int, default=64)
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--splits", type=int, default=32)
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--norm-mma", type=int, default=0)
    ap.add_argument("--impl", default="fast")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--staged", action="store_true")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The files this run writes: ``--out``, else ``build/`` (``data/`` with ``--record``); none with ``--one``."""
    if args.one:
        return []
    return [Path(args.out) if args.out else default_dir(args) / "turboquant_fast_variants_h200.json"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("dev_turboquant_fast.py times CUDA kernels: no CUDA device here", file=sys.stderr)
        return 2
    global STAGED
    STAGED = args.staged
    if args.one:
        return one(args)
    t0 = time.time()
    res = {"provenance": provenance(args), "check": [], "decode": [], "dequant": []}
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)

    log, save = progress_log(t0), json_saver(res, out, t0)

    res["copy"] = copy_bandwidth(1024 * 2**20)
    secs = args.sections.split(",")
    for sec in secs:
        if sec == "check":
            res["check"] = check(log)
            bad = [r for r in res["check"] if not r["ok"]]
            print(f"CHECK: {len(res['check']) - len(bad)} ok, {len(bad)} failed", flush=True)
        elif sec == "decode":
            cfgs = [] if args.cfgs == "default" else [tuple(int(x) for x in c.split("x")) for c in args.cfgs.split(",")]
            decode_variants(ColdTimer(), log, args.cases.split(","), cfgs, res["decode"], save)
        elif sec == "dequant":
            dequant_variants(log, res["copy"]["GBps"], res["dequant"], save)
        save()
    save()
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
