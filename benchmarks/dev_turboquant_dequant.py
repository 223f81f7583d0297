"""Continuation-prefill dequant variants of issue 20 (launch arguments of ``_triton_dequant.dequant_kv``).

GPU (one device call, ~2-3 min): every variant is checked bit for bit against the default kernel (NaN-poisoned
outputs, a 5-token tail that must stay untouched), then timed exactly like ``bench_turboquant.py``'s dequant
section: ``_tq_bench.time_graph`` (CUDA-graph replay, warm L2, median), share of copy = (bytes read + bytes
written) / time / ``copy_bandwidth(1 GiB)``, bytes from ``_tq_bench.dequant_bytes``; both shapes of the bench
(Llama-3.1-8B shard Hk 8, the seed TP-8 rank Hk 1; D 128, block 16) at 32K and 128K, the rotated presets, vLLM's
slot order and the block-SoA order.

CPU (``--sass``): each variant compiled for sm_90 by ``_sass_sm90.compile_sm90`` (local Triton; the H200 runs 3.6,
so counts are estimates): registers, shared memory, SASS count and the loads, stores, barriers and MMAs in it.

    python benchmarks/dev_turboquant_dequant.py --out $OUT/dequant.json
    python benchmarks/dev_turboquant_dequant.py --layouts block_soa \
        --variants default,p16,t1,t2,t4,w8,w8_r64,fill,b128_w8_t1 --out $OUT/dq.json   # 32-bit planes, seed tiling
    python benchmarks/dev_turboquant_dequant.py --record --commit X   # data/turboquant_dequant_variants_h200.json
    PYTHONPATH=$PWD python benchmarks/dev_turboquant_dequant.py --sass [--sass-dir /tmp/sass]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recording import default_dir

from tqlab.turboquant import TQ_PRESETS

ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]
SHAPES = {"seed_per_rank": 1, "llama3.1-8b": 8}  # name (as bench_turboquant.SHAPES) -> Hk; D 128
CONTEXTS = (32768, 131072)
VARIANTS = {  # label -> td.dequant_kv keyword arguments ({} = the default: launch.DEFAULTS["fast_dequant"])
    "default": {},
    "v8": {"v8": True},
    "w32": {"w32": True},
    "v8_w32": {"v8": True, "w32": True},
    "grid_v8_w32": {"split": "grid", "v8": True, "w32": True},
    "grid_v8_w32_t1": {"split": "grid", "v8": True, "w32": True, "tiles_per_program": 1},
    "launch_v8_w32": {"split": "launch", "v8": True, "w32": True},
}
EXTRA_VARIANTS = {  # not run by default (compile time); --variants picks them by name
    "grid": {"split": "grid"},
    "grid_v8": {"split": "grid", "v8": True},
    "launch_v8": {"split": "launch", "v8": True},
    "v8_128x8": {"v8": True, "w32": True, "block_t": 128, "num_warps": 8},
    "v8_w32_t4": {"v8": True, "w32": True, "tiles_per_program": 4},
    # issue 20's continuation-dequant target on block-SoA (branch dq32): nibble-plane words as 16-bit pairs (the
    # kernel before p32), and the tokens per program for the seed rank (1 KV head): fixed tiles, warps, "fill"
    "p16": {"p32": False},
    "t1": {"split": "none", "tiles_per_program": 1},
    "t2": {"split": "none", "tiles_per_program": 2},
    "t4": {"split": "none", "tiles_per_program": 4},
    "w8": {"num_warps": 8},
    "t1_w8": {"split": "none", "tiles_per_program": 1, "num_warps": 8},
    "w8_r64": {"num_warps": 8, "maxnreg": 64},
    "fill": {"tiling": "fill"},
    "b128_w8_t1": {"split": "none", "block_t": 128, "tiles_per_program": 1, "num_warps": 8},
}
ALL_VARIANTS = {**VARIANTS, **EXTRA_VARIANTS}
PATTERNS = {"LDG16": r"LDG\.E\.U16", "LDG32": r"LDG\.E ", "LDG128": r"LDG\.E\.128", "STG128": r"STG\.E\.128",
            "STG16": r"STG\.E\.U16", "STS": r"\bSTS", "LDS": r"\bLDS", "STSM": r"STSM", "LDSM": r"LDSM",
            "BAR": r"BAR\.SYNC", "HGMMA": r"HGMMA", "SHFL": r"SHFL"}


def _case_inputs(hk: int, ctx: int, d: int = 128):
    """bench_dequant's K/V (same seed, ``torch.manual_seed(ctx)``) and its output buffers."""
    torch.manual_seed(ctx)
    k = torch.randn(1, hk, ctx, d, device="cuda", dtype=torch.float16)
    v = torch.randn(1, hk, ctx, d, device="cuda", dtype=torch.float16)
    return k, v


def _check(td, cache, row, ctx, spec, hk, d, kw) -> dict:
    """The variant's bits vs the default's on ``ctx - 5`` tokens of a ``ctx`` buffer (tail must stay NaN)."""
    outs = []
    for args in ({}, kw):
        ko = torch.full((1, hk, ctx, d), float("nan"), device="cuda", dtype=torch.float16)
        vo = ko.clone()
        td.dequant_kv(cache, row, ctx - 5, ko, vo, spec, **args)
        outs.append((ko, vo))
    (k0, v0), (k1, v1) = outs
    n = ctx - 5
    return {"bit_equal": bool(torch.equal(k0[:, :, :n], k1[:, :, :n]) and torch.equal(v0[:, :, :n], v1[:, :, :n])),
            "tail_untouched": bool(torch.isnan(k1[:, :, n:]).all() and torch.isnan(v1[:, :, n:]).all()),
            "written": bool(not torch.isnan(k1[:, :, :n]).any() and not torch.isnan(v1[:, :, :n]).any())}


def run_gpu(args, log, save=lambda res: None) -> dict:
    from _tq_bench import copy_bandwidth, dequant_bytes, fill_paged, provenance, time_graph

    from tqlab.turboquant import _triton_dequant as td

    res = {"provenance": provenance(args), "method": __doc__, "variants": {k: ALL_VARIANTS[k] for k in args.variants},
           "copy": copy_bandwidth(1024 * 2**20), "rows": [], "errors": []}
    copy_gbps = res["copy"]["GBps"]
    log({"copy_GBps": copy_gbps})
    d = 128
    for shape in args.shapes:
        hk = SHAPES[shape]
        for ctx in args.contexts:
            k, v = _case_inputs(hk, ctx, d)
            k_out = torch.empty_like(k)
            v_out = torch.empty_like(v)
            for preset in args.presets:
                for layout in args.layouts:
                    spec = dataclasses.replace(TQ_PRESETS[preset], cache_layout=layout)
                    cache, bt = fill_paged(spec, k, v)
                    read, written = dequant_bytes(spec, hk, d, ctx, bt.shape[1])
                    for label in args.variants:
                        kw = ALL_VARIANTS[label]
                        base = {"shape": shape, "hk": hk, "cached_len": ctx, "preset": preset, "layout": layout,
                                "variant": label, **kw}
                        try:
                            row = {**base, **_check(td, cache, bt[0], ctx, spec, hk, d, kw)}
                            stats: dict = {}
                            td.dequant_kv(cache, bt[0], ctx, k_out, v_out, spec, stats=stats, **kw)
                            ms = time_graph(lambda c=cache, ko=k_out, vo=v_out, a=kw: td.dequant_kv(c, bt[0], ctx, ko, vo, spec, **a))
                            gbps = (read + written) / ms / 1e6
                            row.update(ms=ms, bytes_read=read, bytes_written=written, GBps=gbps,
                                       share_of_copy=gbps / copy_gbps, **stats)
                        except Exception as exc:  # one failure must not lose the rest
                            traceback.print_exc()
                            res["errors"].append({**base, "error": repr(exc)[:400]})
                            continue
                        res["rows"].append(row)
                        log(row)
                    del cache
            del k, v, k_out, v_out
            torch.cuda.empty_cache()
            save(res)  # a partial file survives a time-out
    res["all_bit_equal"] = all(r["bit_equal"] and r["tail_untouched"] and r["written"] for r in res["rows"])
    res["best"] = _best(res["rows"])
    return res


def _best(rows) -> list:
    """Per (shape, context, preset, layout): the default's share and the best variant's."""
    out = {}
    for r in rows:
        key = (r["shape"], r["cached_len"], r["preset"], r["layout"])
        e = out.setdefault(key, {"shape": key[0], "cached_len": key[1], "preset": key[2], "layout": key[3]})
        if r["variant"] == "default":
            e["default_share"] = r["share_of_copy"]
        if r["share_of_copy"] > e.get("best_share", 0):
            e["best_share"], e["best_variant"] = r["share_of_copy"], r["variant"]
    return list(out.values())


# ----------------------------------------------------------------------------- static analysis (CPU)
def compile_variant(preset: str, layout: str, kw: dict, hk: int = 8, d: int = 128, bs: int = 16, ctx: int = 32768):
    """``_dequant_fast_kernel`` compiled for sm_90 as ``td.dequant_kv(**kw)`` launches it on ``hk`` KV heads and
    ``ctx`` cached tokens of an aligned, contiguous cache on 132 SMs (its last launch for ``split="launch"``),
    with the JIT's divisibility specialization of that shape; ``w32`` and ``p32`` default as in ``dequant_kv``."""
    from _sass_sm90 import compile_sm90

    from tqlab.turboquant import _triton_dequant as td
    from tqlab.turboquant import _triton_kernels as tk
    from tqlab.turboquant import ptx_tables as pt

    spec = dataclasses.replace(TQ_PRESETS[preset], cache_layout=layout)
    cfg = td.FAST_DEFAULTS["fast_dequant"]
    sig = {"cache16_ptr": "*u16", "bt_ptr": "*i32", "k_ptr": "*fp16", "v_ptr": "*fp16", "signs_ptr": "*fp16",
           "cache32_ptr": "*i32"}
    sig.update({f"c{i}": "fp32" for i in range(8)})
    sig.update({n: "i32" for n in ("cached_len", "num_blocks", "stride_cb", "stride_ch", "stride_ct", "stride_kh",
                                   "stride_kt", "stride_vh", "stride_vt")}, inv_sqrt_d="fp32")
    split = kw.get("split", "none")
    block_t, tiles = kw.get("block_t", cfg["block_t"]), kw.get("tiles_per_program")
    if tiles is None:
        block_t, tiles = td.dequant_tiling(ctx, hk, 132, block_t, cfg["tiles"], kw.get("tiling") or cfg.get("tiling", "tiles"))
    sb = spec.slot_bytes(d)
    fields, planes = tk._field_addr(spec, d, bs), tk._planes_flags(spec, d, bs)
    even = td.codes_even(fields, hk * bs * sb, bs * sb, sb)
    w32 = bool(kw.get("w32", td.dequant_w32_default(spec)))
    p32 = bool(kw.get("p32", cfg.get("p32", True))) and even and bool(planes["KP"] or planes["VP"])
    meta = dict(BLOCK_SIZE=bs, D=d, BLOCK_T=block_t, TILES=tiles,
                KEY_FP8=spec.key_fp8, KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read,
                **fields, **planes, LUT=2, LUT_ASM=pt._asm_for(spec, d, 2),
                PART={"none": 3, "grid": 0, "launch": 2}[split], V8=bool(kw.get("v8", False)), W32=w32,
                EVEN=w32 and even, P32=p32)
    div = ["cache16_ptr", "bt_ptr", "k_ptr", "v_ptr", "signs_ptr", "cache32_ptr", "cached_len", "num_blocks", "stride_kh",
           "stride_kt", "stride_vh", "stride_vt"]
    div += [n for n, val in (("stride_cb", hk * bs * sb), ("stride_ch", bs * sb), ("stride_ct", sb)) if val % 16 == 0]
    nw, mr = kw.get("num_warps", cfg["num_warps"]), kw.get("maxnreg")
    kernels = [compile_sm90(td._dequant_fast_kernel, sig, meta, num_warps=nw, maxnreg=mr, divisible=div)]
    if split == "launch":
        kernels.insert(0, compile_sm90(td._dequant_fast_kernel, sig, {**meta, "PART": 1}, num_warps=nw, maxnreg=mr,
                                       divisible=div))
    return kernels


def run_sass(args, log) -> dict:
    """Static sm_90 counts of each variant, per preset, layout and shape (at the first ``--contexts`` entry: the
    tiling rule depends on it); ``loop_*``: the main loop (``_sass_sm90.loop_ops``)."""
    from _sass_sm90 import report

    rows = []
    ctx = args.contexts[0]
    for preset in args.presets:
        for layout in args.layouts:
            for shape in args.shapes:
                for label in args.variants:
                    kw = ALL_VARIANTS[label]
                    for part, kern in enumerate(compile_variant(preset, layout, kw, hk=SHAPES[shape], ctx=ctx)):
                        name = f"{preset}_{layout}_{shape}_{label}" + (f"_launch{part + 1}" if kw.get("split") == "launch" else "")
                        r = report(kern, args.sass_dir, name)
                        sass = (Path(args.sass_dir) / f"{name}.sass").read_text()
                        row = {"preset": preset, "layout": layout, "shape": shape, "variant": label, "kernel": name,
                               "registers": r["usage"].get("REG"), "stack": r["usage"].get("STACK", 0),
                               "shared_bytes": kern.metadata.shared, "sass": r["sass_total"], "loop_sass": r["loop_sass"],
                               "convert_layout": r["convert_layout"],
                               **{k: len(re.findall(p, sass)) for k, p in PATTERNS.items()},
                               **{f"loop_{k}": len(re.findall(p, r["loop_text"])) for k, p in PATTERNS.items() if k.startswith("LDG")}}
                        rows.append(row)
                        log(row)
    return {"sass": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", "--json", dest="out", default=None,
                    help="output file (default: build/turboquant_dequant_variants_h200.json, data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--sass", action="store_true", help="static SASS of each variant for sm_90 instead (no GPU, no JSON)")
    ap.add_argument("--sass-dir", default="/tmp/sass", help="--sass: where the .sass/.ttgir/.cubin files go")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--presets", default=",".join(ROTATED))
    ap.add_argument("--layouts", default="vllm,block_soa")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--commit", default=None, help="git commit to record (the GPU box has no .git)")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file a run writes: ``--out``, else ``build/`` (``data/`` with ``--record``); none with ``--sass``."""
    if args.sass:
        return []
    return [Path(args.out) if args.out else default_dir(args) / "turboquant_dequant_variants_h200.json"]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("variants", "presets", "layouts", "shapes"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    args.contexts = [int(x) for x in args.contexts.split(",") if x]
    bad = [v for v in args.variants if v not in ALL_VARIANTS] + [s for s in args.shapes if s not in SHAPES]
    if bad:
        print(f"unknown --variants/--shapes entries {bad}; known: {list(ALL_VARIANTS)}, {list(SHAPES)}", file=sys.stderr)
        return 2
    from _tq_bench import progress_log

    t0 = time.time()
    log = progress_log(t0)

    if args.sass:
        run_sass(args, log)
        return 0
    if not torch.cuda.is_available():
        print("dev_turboquant_dequant: the timing run needs a CUDA GPU; --sass runs anywhere", file=sys.stderr)
        return 2
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    res = run_gpu(args, log, save=lambda r: out.write_text(json.dumps(r, indent=1)))
    for e in res["best"]:
        log(e)
    res["wall_s"] = time.time() - t0
    out.write_text(json.dumps(res, indent=1))
    print(f"all variants bit-equal to the default: {res['all_bit_equal']}; errors: {len(res['errors'])}; "
          f"wrote {out} in {res['wall_s']:.1f}s")
    return 0 if res["all_bit_equal"] and not res["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
