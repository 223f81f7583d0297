"""Development run for the TurboQuant decode/dequant kernels (one device call): correctness against
the torch reference at real sizes, then launch-config variants timed the same way as the
side-by-side benchmark (CUDA-graph replay, L2 flushed, median).

Writes ``build/turboquant_variants.json`` (git-ignored); ``--record`` writes
``data/turboquant_variants.json`` instead; ``--out`` names any file. Needs a CUDA device.

    python benchmarks/dev_turboquant_variants.py [--out $OUT/variants.json] [--quick]
    python benchmarks/dev_turboquant_variants.py --one llama_3bit_32k

``--quick`` is a smoke run: the correctness check, the first case only, 5 replays, no dequant
variants. ``--one CASE`` runs a single decode launch of that case (for Nsight Compute).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recording import default_dir  # noqa: E402
from _tq_bench import ColdTimer, copy_bandwidth, fill_paged, progress_log, provenance  # noqa: E402

from tqlab.turboquant import TQ_PRESETS, decode_attention, dequant_kv  # noqa: E402
from tqlab.turboquant import _triton_kernels as tk  # noqa: E402

DECODE_CFGS = [(64, 4, 1, False), (64, 4, 1, True), (128, 8, 1, False), (128, 8, 1, True), (128, 4, 1, False),
               (64, 8, 1, True), (32, 4, 1, True)]
DEQUANT_CFGS = [(32, 4, 8), (64, 4, 8), (64, 8, 8), (128, 8, 4), (32, 4, 32), (64, 8, 32)]
CASES = {  # name: (hq, hk, batch, ctx, preset, splits)
    "llama_3bit_32k": (32, 8, 16, 32768, "turboquant_3bit_nc", (32,)),
    "llama_k8v4_32k": (32, 8, 16, 32768, "turboquant_k8v4", (32,)),
    "llama_3bit_128k": (32, 8, 16, 131072, "turboquant_3bit_nc", (32,)),
    "seed_3bit_128k": (4, 1, 4, 131072, "turboquant_3bit_nc", (32, 256)),
}


def check(log) -> list:
    """Triton vs torch reference: decode (several lengths, GQA 4, bf16) and dequant, every preset."""
    out = []
    g = torch.Generator(device="cuda").manual_seed(7)
    hq, hk, d, b, ctx = 32, 8, 128, 4, 4096
    k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16, generator=g) * 2 + 0.5
    q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    seq_lens = torch.tensor([ctx, 1, 3000, 17], device="cuda", dtype=torch.int32)
    for name, spec in TQ_PRESETS.items():
        cache, bt = fill_paged(spec, k, v)
        res = []
        for backend in ("torch", "triton"):
            mid = torch.full((b, hq, 32, d + 1), 7.0, device="cuda")
            o = torch.empty(b, hq, d, device="cuda", dtype=torch.float32)
            lse = torch.empty(b, hq, device="cuda")
            decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, o, lse, backend=backend)
            ko = torch.full((1, hk, ctx, d), 9.0, device="cuda", dtype=torch.float16)
            vo = ko.clone()
            dequant_kv(cache, bt[0], ctx - 5, ko, vo, spec, backend=backend)
            res.append((o, lse, ko, vo))
        (o0, l0, k0, v0), (o1, l1, k1, v1) = res
        row = {"check": name, "out_max_abs": float((o0 - o1).abs().max()), "lse_max_abs": float((l0 - l1).abs().max()),
               "deq_k_max_abs": float((k0.float() - k1.float()).abs().max()),
               "deq_v_max_abs": float((v0.float() - v1.float()).abs().max()),
               "tail_untouched": bool((k1[:, :, ctx - 5:] == 9).all() and (v1[:, :, ctx - 5:] == 9).all())}
        row["ok"] = row["out_max_abs"] < 2e-3 and row["lse_max_abs"] < 2e-3 and row["deq_k_max_abs"] < 4e-3 \
            and row["deq_v_max_abs"] < 2e-3 and row["tail_untouched"]
        out.append(row)
        log(row)
    return out


def decode_variants(timer, log, cases) -> list:
    out = []
    for case in cases:
        hq, hk, b, ctx, preset, splits = CASES[case]
        spec, d = TQ_PRESETS[preset], 128
        k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16)
        cache, bt = fill_paged(spec, k, k * 0.5 + 0.1)
        del k
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
        sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
        for s in splits:
            mid = torch.empty(b, hq, s, d + 1, device="cuda")
            o = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(b, hq, device="cuda")
            for bt_, nw, ns, pf in DECODE_CFGS:
                st: dict = {}
                try:
                    tk.decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o, lse, block_t=bt_, num_warps=nw,
                                        num_stages=ns, stats=st, prefetch=pf)
                    ms = timer(lambda: tk.decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o, lse, block_t=bt_,
                                                           num_warps=nw, num_stages=ns, prefetch=pf))
                    row = {"op": "decode", "case": case, "splits": s, "block_t": bt_, "num_warps": nw, "num_stages": ns,
                           "prefetch": pf,
                           "ms": ms, "GBps": cache.numel() / ms / 1e6, **st}
                except Exception as exc:  # noqa: BLE001
                    row = {"op": "decode", "case": case, "splits": s, "block_t": bt_, "error": repr(exc)[:300]}
                out.append(row)
                log(row)
        del cache
        torch.cuda.empty_cache()
    return out


def dequant_variants(timer, copy_gbps, log) -> list:
    out = []
    hk, d, n = 8, 128, 131072
    k = torch.randn(1, hk, n, d, device="cuda", dtype=torch.float16)
    ko, vo = torch.empty_like(k), torch.empty_like(k)
    for preset in ("turboquant_3bit_nc", "turboquant_k8v4", "turboquant_4bit_nc"):
        spec = TQ_PRESETS[preset]
        cache, bt = fill_paged(spec, k, k)
        moved = n * hk * spec.slot_bytes(d) + 2 * n * hk * d * 2
        for bt_, nw, tiles in DEQUANT_CFGS:
            st: dict = {}
            try:
                tk.dequant_kv(cache, bt[0], n, ko, vo, spec, block_t=bt_, num_warps=nw, tiles_per_program=tiles, stats=st)
                ms = timer(lambda: tk.dequant_kv(cache, bt[0], n, ko, vo, spec, block_t=bt_, num_warps=nw,
                                                 tiles_per_program=tiles))
                row = {"op": "dequant", "preset": preset, "block_t": bt_, "num_warps": nw, "tiles": tiles, "ms": ms,
                       "share_of_copy": moved / ms / 1e6 / copy_gbps, **st}
            except Exception as exc:  # noqa: BLE001
                row = {"op": "dequant", "preset": preset, "block_t": bt_, "error": repr(exc)[:300]}
            out.append(row)
            log(row)
        del cache
    return out


def one(case: str) -> None:
    hq, hk, b, ctx, preset, splits = CASES[case]
    spec, d = TQ_PRESETS[preset], 128
    k = torch.randn(b, hk, ctx, d, device="cuda", dtype=torch.float16)
    cache, bt = fill_paged(spec, k, k)
    q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
    sl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    mid = torch.empty(b, hq, splits[-1], d + 1, device="cuda")
    o = torch.empty(b, hq, d, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(b, hq, device="cuda")
    decode_attention(q, cache, bt, sl, spec, d**-0.5, mid, o, lse)
    torch.cuda.synchronize()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output file (default: build/turboquant_variants.json, or data/ with --record)")
    ap.add_argument("--record", action="store_true", help="write the recording under data/ (default: build/)")
    ap.add_argument("--commit", default=None, help="git commit to record (the GPU box has no .git)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: correctness check, the first case only, 5 replays, no dequant variants")
    ap.add_argument("--one", default=None, choices=sorted(CASES), help="one decode launch of this case, no JSON")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-dequant", action="store_true")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The files this run writes: ``--out``, else ``build/`` (``data/`` with ``--record``); none with ``--one``."""
    if args.one:
        return []
    return [Path(args.out) if args.out else default_dir(args) / "turboquant_variants.json"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"--cases: unknown case(s) {bad}; choose from {sorted(CASES)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("dev_turboquant_variants.py needs a CUDA device (torch.cuda.is_available() is False); nothing written",
              file=sys.stderr)
        return 2
    if args.one:
        one(args.one)
        return 0
    if args.quick:
        cases = cases[:1]
    t0 = time.time()

    log = progress_log(t0)

    res = {"provenance": provenance(args)}
    res["copy"] = copy_bandwidth((64 if args.quick else 1024) * 2**20)
    log({"copy_GBps": res["copy"]["GBps"]})
    timer = ColdTimer(replays=5 if args.quick else 15)
    res["check"] = check(log)
    res["decode"] = decode_variants(timer, log, cases)
    if not (args.no_dequant or args.quick):
        res["dequant"] = dequant_variants(timer, res["copy"]["GBps"], log)
    res["wall_s"] = time.time() - t0
    out = output_paths(args)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out} in {res['wall_s']:.1f}s")
    return 0 if all(r["ok"] for r in res["check"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
