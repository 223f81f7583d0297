"""Benchmark the TurboQuant Triton kernels on a CUDA GPU and record the numbers to JSON.

What it measures (issue 3 targets in brackets):

* device copy bandwidth: a large device-to-device ``copy_``, bytes read + written / time;
* ``dequant_kv`` (continuation prefill): effective bandwidth = (packed bytes read + fp16 K/V bytes
  written) / time, as a share of the copy bandwidth [>= 70%];
* ``decode_attention`` (split-KV decode) for batch 1 and 16, context 4K / 32K / 128K, vs
  ``scaled_dot_product_attention`` on an unquantized fp16 cache of the same context
  [>= 1.5x faster at 32K], plus the accuracy of each decode against fp32 SDPA on the same K/V;
* ``store_kv`` throughput (one 16K-token prefill chunk);
* first, a sweep of launch configs (tokens per tile, warps, pipeline stages, register cap) for
  the decode and dequant kernels; the fastest becomes the default for the rest of the run
  (recorded as ``chosen_defaults``; ``_triton_kernels.DEFAULTS`` is set from it).

Shapes (per tensor-parallel rank): the seed model's ``Hq 4, Hk 1, D 128`` and Llama-3.1-8B's
``Hq 32, Hk 8, D 128``; block_size 16, bf16 model dtype, paged cache with shuffled blocks.

Timing: every measured call is captured ``reps`` times in one CUDA graph (launch overhead out,
as in the engine's CUDA-graph decode) and the graph is replayed; median of the replays / reps.

``--vs-vllm`` instead runs the side-by-side mode of ``benchmarks/_vs_vllm.py``: vLLM 0.33's own
TurboQuant kernels (imported from the anchor folder given by ``--vllm-anchor``), tqlab (vLLM's 32
splits and the ``"fill"`` split policy; vLLM's slot order and the opt-in block-SoA
order), fp16 SDPA and the byte limit, on the same K/V, CUDA-graph
replays with L2 flushed; it writes ``data/turboquant_vs_vllm_h200.json`` and prints the table.

Usage (on a CUDA machine)::

    TQLAB_COMMIT=$(git rev-parse HEAD) python benchmarks/bench_turboquant.py --vs-vllm \
        --vllm-anchor .devrun/anchors/vllm_tq --out data/turboquant_vs_vllm_h200.json


    python benchmarks/bench_turboquant.py --out data/turboquant_bench.json --commit $(git rev-parse HEAD)

``--quick`` shrinks everything for a smoke run.  Partial results are written after each section.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tq_bench import (BLOCK, MODEL_DTYPE, ColdTimer, copy_bandwidth, dequant_bytes, fill_paged, sdpa_backend,  # noqa: E402
                       json_saver, progress_log, provenance, random_decode_inputs, sdpa, time_graph)
from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv, kv_cache_shape, store_kv  # noqa: E402

SHAPES = {
    "seed_per_rank": dict(hq=4, hk=1, d=128),
    "llama3.1-8b": dict(hq=32, hk=8, d=128),
}
__all__ = ["BLOCK", "ColdTimer", "copy_bandwidth", "fill_paged", "provenance", "sdpa", "time_graph", "main"]


def _err(out, ref):
    o, r = out.float().reshape(-1, out.shape[-1]), ref.float().reshape(-1, ref.shape[-1])
    cos = torch.nn.functional.cosine_similarity(o, r, dim=-1)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
            "rel_err": float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))}


def bench_decode(res: dict, shape_name: str, batch: int, ctx: int, splits_list, presets, log):
    sh = SHAPES[shape_name]
    hq, hk, d = sh["hq"], sh["hk"], sh["d"]
    scale = d**-0.5
    k, v, q = random_decode_inputs(batch, hq, hk, ctx, d, seed=ctx + batch)
    q4 = q.to(torch.float16)[:, :, None, :]
    ref32 = None
    if batch * ctx <= 16 * 32768:  # fp32 reference on the same K/V (skipped for the largest case)
        ref32 = torch.nn.functional.scaled_dot_product_attention(
            q4.float(), k.float(), v.float(), scale=scale, enable_gqa=True)[:, :, 0]
    base = {"shape": shape_name, "hq": hq, "hk": hk, "d": d, "batch": batch, "context": ctx}
    fp16_bytes = 2 * batch * hk * ctx * d * 2
    ms = time_graph(lambda: sdpa(q4, k, v, scale))
    row = {**base, "kind": "sdpa_fp16", "ms": ms, "cache_bytes": fp16_bytes, "GBps": fp16_bytes / ms / 1e6,
           "sdpa_backend": sdpa_backend()}
    if ref32 is not None:
        row.update(_err(sdpa(q4, k, v, scale)[:, :, 0], ref32))
    res["decode"].append(row)
    log(row)
    seq_lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    for name in presets:
        spec = TQ_PRESETS[name]
        cache, bt = fill_paged(spec, k, v)
        for s in splits_list:
            mid = torch.empty(batch, hq, s, d + 1, device="cuda")
            out = torch.empty(batch, hq, d, device="cuda", dtype=MODEL_DTYPE)
            lse = torch.empty(batch, hq, device="cuda")

            def run():
                decode_attention(q, cache, bt, seq_lens, spec, scale, mid, out, lse)

            ms_tq = time_graph(run)
            row = {**base, "kind": name, "splits": s, "ms": ms_tq, "cache_bytes": cache.numel(),
                   "GBps": cache.numel() / ms_tq / 1e6, "speedup_vs_sdpa_fp16": ms / ms_tq}
            if ref32 is not None:
                run()
                row.update(_err(out, ref32))
            res["decode"].append(row)
            log(row)
        del cache
    del k, v


def bench_dequant(res: dict, shape_name: str, cached_len: int, presets, copy_gbps: float, log):
    sh = SHAPES[shape_name]
    hk, d = sh["hk"], sh["d"]
    torch.manual_seed(cached_len)
    k = torch.randn(1, hk, cached_len, d, device="cuda", dtype=torch.float16)
    v = torch.randn(1, hk, cached_len, d, device="cuda", dtype=torch.float16)
    k_out = torch.empty(1, hk, cached_len, d, device="cuda", dtype=torch.float16)
    v_out = torch.empty_like(k_out)
    for name in presets:
        spec = TQ_PRESETS[name]
        cache, bt = fill_paged(spec, k, v)
        ms = time_graph(lambda: dequant_kv(cache, bt[0], cached_len, k_out, v_out, spec))
        read, written = dequant_bytes(spec, hk, d, cached_len, bt.shape[1])
        gbps = (read + written) / ms / 1e6
        err_k = float(torch.linalg.vector_norm(k_out.float() - k.float()) / torch.linalg.vector_norm(k.float()))
        err_v = float(torch.linalg.vector_norm(v_out.float() - v.float()) / torch.linalg.vector_norm(v.float()))
        row = {"shape": shape_name, "hk": hk, "d": d, "cached_len": cached_len, "kind": name, "ms": ms,
               "bytes_read": read, "bytes_written": written, "GBps": gbps, "share_of_copy": gbps / copy_gbps,
               "k_rel_err": err_k, "v_rel_err": err_v}
        res["dequant"].append(row)
        log(row)
        del cache


def bench_store(res: dict, presets, log, tokens=16384):
    sh = SHAPES["llama3.1-8b"]
    hk, d = sh["hk"], sh["d"]
    k = torch.randn(tokens, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tokens, hk, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(tokens, device="cuda")
    for name in presets:
        spec = TQ_PRESETS[name]
        cache = torch.empty(kv_cache_shape(tokens // BLOCK, hk, BLOCK, d, spec), dtype=torch.uint8, device="cuda")
        ms = time_graph(lambda: store_kv(cache, k, v, slots, spec))
        moved = 2 * k.numel() * 2 + cache.numel()
        row = {"shape": "llama3.1-8b", "tokens": tokens, "kind": name, "ms": ms,
               "Mtoken_heads_per_s": tokens * hk / ms / 1e3, "GBps": moved / ms / 1e6}
        res["store"].append(row)
        log(row)


DECODE_CANDIDATES = [  # (block_t, num_warps, num_stages, maxnreg, prefetch); rotated-key presets only
    (64, 4, 1, None, True), (64, 4, 1, 128, True), (64, 4, 1, None, False), (32, 4, 1, None, True),
    (32, 4, 1, 128, True), (64, 8, 1, None, True), (128, 8, 1, None, True),
]
DEQUANT_CANDIDATES = [(32, 4, None, None), (64, 4, None, None), (64, 8, None, None)]


def _sweep_decode_one(cfg, q, cache, bt, seq_lens, spec, mid, out, lse) -> dict:
    """One decode launch config ``(block_t, num_warps, num_stages, maxnreg, prefetch)``: a sweep
    row with ``ms`` (graph replay, warm L2) and register / spill counts, or ``error``."""
    from tqlab.turboquant import _triton_kernels as tk

    bt_, nw, ns, mx, pf = cfg
    row = {"op": "decode", "block_t": bt_, "num_warps": nw, "num_stages": ns, "maxnreg": mx, "prefetch": pf}
    d = q.shape[-1]

    def run(stats=None):
        tk.decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse, block_t=bt_, num_warps=nw,
                            num_stages=ns, maxnreg=mx, stats=stats, prefetch=pf)

    try:
        stats: dict = {}
        run(stats)
        row.update({"ms": time_graph(run), **stats})
    except Exception as exc:  # noqa: BLE001 - record and go on
        row["error"] = repr(exc)[:300]
    return row


def sweep(res: dict, log, quick: bool = False):
    """Time candidate launch configs of decode and dequant on the 32K shapes, then make the
    fastest (geometric mean over the cases) the default for the rest of the run."""
    from tqlab.turboquant import _triton_kernels as tk

    ctx = 4096 if quick else 32768
    cases = [("llama3.1-8b", 16, 32, "turboquant_3bit_nc"), ("llama3.1-8b", 16, 32, "turboquant_4bit_nc"),
             ("seed_per_rank", 1, 128, "turboquant_3bit_nc")]
    dec_times: dict = {c: [] for c in DECODE_CANDIDATES}
    deq_times: dict = {c: [] for c in DEQUANT_CANDIDATES}
    for shape_name, batch, s, name in cases:
        spec = TQ_PRESETS[name]
        sh = SHAPES[shape_name]
        hq, hk, d = sh["hq"], sh["hk"], sh["d"]
        k = torch.randn(batch, hk, ctx, d, device="cuda", dtype=torch.float16)
        cache, bt = fill_paged(spec, k, k)
        q = torch.randn(batch, hq, d, device="cuda", dtype=MODEL_DTYPE)
        seq_lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        mid = torch.empty(batch, hq, s, d + 1, device="cuda")
        out = torch.empty(batch, hq, d, device="cuda", dtype=MODEL_DTYPE)
        lse = torch.empty(batch, hq, device="cuda")
        for cfg in DECODE_CANDIDATES:
            row = _sweep_decode_one(cfg, q, cache, bt, seq_lens, spec, mid, out, lse)
            dec_times[cfg].append(row.get("ms", float("inf")))
            row.update({"shape": shape_name, "preset": name, "batch": batch, "context": ctx, "splits": s})
            res["sweep"].append(row)
            log(row)
        if batch == 1:
            continue
        k_out = torch.empty(1, hk, ctx * batch, d, device="cuda", dtype=torch.float16)
        v_out = torch.empty_like(k_out)
        # one long request: all B rows of the block table back to back
        row_all = bt.reshape(-1).contiguous()
        for cfg in DEQUANT_CANDIDATES:
            bt_, nw, ns, mx = cfg
            stats = {}
            try:
                tk.dequant_kv(cache, row_all, ctx * batch, k_out, v_out, spec, block_t=bt_, num_warps=nw,
                              num_stages=ns, maxnreg=mx, stats=stats)
                ms = time_graph(lambda: tk.dequant_kv(cache, row_all, ctx * batch, k_out, v_out, spec, block_t=bt_,
                                                      num_warps=nw, num_stages=ns, maxnreg=mx))
                deq_times[cfg].append(ms)
                row = {"op": "dequant", "shape": shape_name, "preset": name, "cached_len": ctx * batch, "block_t": bt_,
                       "num_warps": nw, "ms": ms, **stats}
            except Exception as exc:  # noqa: BLE001
                deq_times[cfg].append(float("inf"))
                row = {"op": "dequant", "preset": name, "block_t": bt_, "num_warps": nw, "error": repr(exc)[:300]}
            res["sweep"].append(row)
            log(row)
        del cache, k, k_out, v_out
        torch.cuda.empty_cache()

    def best(times):
        def gm(v):
            return math.exp(sum(math.log(x) for x in v) / len(v)) if all(math.isfinite(x) for x in v) else float("inf")
        return min(times, key=lambda c: gm(times[c]))

    for kind, times in (("decode", dec_times), ("dequant", deq_times)):
        b = best(times)
        tk.DEFAULTS[kind] = {**tk.DEFAULTS[kind], "block_t": b[0], "num_warps": b[1], "num_stages": b[2], "maxnreg": b[3]}
        if kind == "decode":
            tk.DEFAULTS[kind]["prefetch"] = b[4]
    res["chosen_defaults"] = {k: dict(v) for k, v in tk.DEFAULTS.items()}
    log({"chosen": json.dumps(res["chosen_defaults"])})


def main_vs_vllm(args) -> int:
    """Side-by-side mode (``--vs-vllm``): see benchmarks/_vs_vllm.py."""
    import _vs_vllm as vs
    from tqlab.turboquant.launch import SOA_DEFAULTS

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.defaults_from:  # launch defaults chosen by a sweep run (its chosen_defaults)
        from tqlab.turboquant import _triton_kernels as tk

        tk.DEFAULTS.update(json.loads(Path(args.defaults_from).read_text())["chosen_defaults"])
    anchor = vs.load_anchor(args.vllm_anchor)
    from tqlab.turboquant import _triton_kernels as tk

    res = {"provenance": {**provenance(args), **anchor[2]}, "method": vs.__doc__, "copy": None, "rows": [], "errors": [],
           "launch_defaults": {**{k: dict(v) for k, v in tk.DEFAULTS.items()}, **SOA_DEFAULTS}}
    res["copy"] = copy_bandwidth(1024 * 2**20)
    res["targets"] = {"vllm_over_tqlab_min": 5.0, "sdpa_over_tqlab_min_32k_128k": 1.0,
                      "sdpa_over_tqlab_llama_3bit_128k": 2.0, "soa_frac_of_byte_limit_llama": 0.4}
    timer = ColdTimer()
    presets = list(TQ_PRESETS)
    vllm_presets = args.vllm_presets.split(",") if args.vllm_presets else presets
    t0 = time.time()

    log = progress_log(t0)

    for shape in vs.SHAPES:
        for ctx in [int(c) for c in args.contexts.split(",")]:
            try:
                res["rows"] += vs.bench_context(shape, ctx, presets, vllm_presets, anchor, res["copy"]["GBps"],
                                                timer, log)
            except Exception as exc:  # noqa: BLE001 - keep the other rows
                traceback.print_exc()
                res["errors"].append({"shape": shape, "ctx": ctx, "error": repr(exc)[:500]})
            res["wall_s"] = time.time() - t0
            out.write_text(json.dumps(res, indent=1))
    res["table"] = vs.table(res["rows"])
    out.write_text(json.dumps(res, indent=1))
    print(res["table"])
    print(f"wrote {out} in {time.time() - t0:.1f}s, errors: {len(res['errors'])}")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output file (default: build/turboquant_bench.json, with --vs-vllm "
                    "build/turboquant_vs_vllm_h200.json; data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--commit", default=None, help="git commit to record (the GPU box has no .git)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--sections", default="copy,sweep,store,dequant,decode")
    ap.add_argument("--vs-vllm", action="store_true", help="side-by-side mode with vLLM's kernels (see above)")
    ap.add_argument("--vllm-anchor", default="../shared/anchors/vllm_tq", help="folder holding vllm_tq_kernels/")
    ap.add_argument("--vllm-presets", default="", help="comma list; default all four")
    ap.add_argument("--contexts", default="8192,32768,131072", help="side-by-side mode: comma list")
    ap.add_argument("--defaults-from", default=None, help="side-by-side mode: take launch defaults from a bench JSON")
    return ap


build_parser = _parser


def output_paths(args) -> list[Path]:
    """The file this run writes: ``--out``, else ``build/`` (``data/`` with ``--record``), as benchmarks/_recording.py."""
    from _recording import default_dir

    return [Path(args.out) if args.out else
            default_dir(args) / ("turboquant_vs_vllm_h200.json" if args.vs_vllm else "turboquant_bench.json")]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.out = str(output_paths(args)[0])
    if not torch.cuda.is_available():
        print("bench_turboquant: needs a CUDA device", file=sys.stderr)
        return 2
    if args.vs_vllm:
        return main_vs_vllm(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"provenance": provenance(args), "targets": {"dequant_share_of_copy": 0.70, "decode_speedup_at_32k": 1.5},
           "copy": None, "store": [], "dequant": [], "decode": [], "sweep": [], "errors": []}
    presets = list(TQ_PRESETS)
    sections = args.sections.split(",")
    ctxs = (1024, 4096) if args.quick else (4096, 32768, 131072)
    t0 = time.time()

    log, save = progress_log(t0), json_saver(res, out, t0)

    def guarded(label, fn, *a):
        try:
            fn(*a)
        except Exception as exc:  # noqa: BLE001 - one failure must not lose the rest
            traceback.print_exc()
            res["errors"].append({"section": label, "error": repr(exc)[:500]})
        torch.cuda.empty_cache()
        save()

    if "copy" in sections:
        res["copy"] = copy_bandwidth((64 if args.quick else 1024) * 2**20)
        log({"copy_GBps": res["copy"]["GBps"], "copy_eager_GBps": res["copy"]["eager_GBps"]})
        save()
    copy_gbps = res["copy"]["GBps"] if res["copy"] else 4300.0
    if "sweep" in sections and not args.no_sweep:
        guarded("sweep", sweep, res, log, args.quick)
    from tqlab.turboquant import _triton_kernels as tk

    res["chosen_defaults"] = {k: dict(v) for k, v in tk.DEFAULTS.items()}  # what the rest of the run used
    if "store" in sections:
        guarded("store", bench_store, res, presets, log, 2048 if args.quick else 16384)
    if "dequant" in sections:
        for shape in SHAPES:
            for cl in ((4096,) if args.quick else (32768, 131072)):
                guarded(f"dequant {shape} {cl}", bench_dequant, res, shape, cl, presets, copy_gbps, log)
    if "decode" in sections:
        for shape in SHAPES:
            for batch in (1, 16):
                for ctx in ctxs:
                    splits = (32, 128) if batch == 1 else (32,)
                    guarded(f"decode {shape} B{batch} {ctx}", bench_decode, res, shape, batch, ctx, splits, presets, log)
    save()
    print(f"wrote {out} in {time.time() - t0:.1f}s, errors: {len(res['errors'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
