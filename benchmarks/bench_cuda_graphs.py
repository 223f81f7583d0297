"""Eager vs CUDA-graph replay latency of one decode step; writes ``build/cuda_graphs_latency.json``.

With ``--record`` it writes the recording ``data/cuda_graphs_latency.json``,
which a run of fewer timed iterations (``--iters`` x batches, summed over the
models) than it holds does not replace unless ``--force``.

Two models on one rank, TurboQuant KV cache, every decode bucket captured by
the engine (``tqlab.engine.cuda_graph.CUDAGraphDecodeRunner``):

* ``seed``  -- the bug report's deployment (``nemotron-3-super-120b-a12b`` preset,
  TP 8): 4 query heads, 1 KV head, head_dim 128, 8 attention layers,
  ``max_num_seqs`` 4; batches 1..4.
* ``llama`` -- a 32-layer model (``llama-3.1-8b`` preset, TP 1): 32 query heads,
  8 KV heads, head_dim 128, ``max_num_seqs`` 256; batches 1, 2, 4, ..., 256.

Per batch: median of ``--iters`` CUDA-event timings after ``--warmup`` runs, for
the eager step, a bare replay and the runner's full step (guard + copy into the
static inputs + padding + replay), plus the summed device time of the replay's
kernels under torch.profiler. Targets from issue 4: replay >= 5x faster than
eager at batch 1; replay within 1.3x of the summed kernel time.

Usage (needs CUDA; exits with status 2 and a message otherwise)::

    python benchmarks/bench_cuda_graphs.py --record          # -> data/cuda_graphs_latency.json
    python benchmarks/bench_cuda_graphs.py --models seed --iters 10 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from tqlab.lab import graph_latency as latency  # noqa: E402
from tqlab.core.provenance import jsonable, make_provenance  # noqa: E402
from tqlab.core.config import EngineConfig  # noqa: E402

from _recording import add_record_arguments, default_dir, overwrite_refusal  # noqa: E402

MODELS = {
    "seed": dict(preset="nemotron-3-super-120b-a12b", batches=[1, 2, 3, 4], overrides={}),
    "llama": dict(preset="llama-3.1-8b", batches=[1, 2, 4, 8, 16, 32, 64, 128, 256], overrides={}),
}

TARGETS = {"speedup_at_batch_1_min": 5.0, "replay_over_kernel_sum_max": 1.3}


def _run_child(name: str, args) -> tuple[dict, object]:
    """Measure one model in a child process; returns its JSON output and exit code."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        child_out = Path(tmp) / f"{name}.json"
        child = [sys.executable, str(Path(__file__).resolve()), "--no-isolate", "--models", name,
                 "--iters", str(args.iters), "--warmup", str(args.warmup),
                 "--context-len", str(args.context_len), "--out", str(child_out)]
        try:
            rc = subprocess.run(child, timeout=args.model_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        return (json.loads(child_out.read_text()) if child_out.is_file() else {}), rc


def _summary(results: dict) -> dict:
    """Per model: speedup at batch 1 and replay / kernel-sum ratios against TARGETS."""
    summary = {}
    for name, res in results.items():
        b1 = next((r for r in res["rows"] if r["batch"] == 1), None)
        ratios = [r["replay_over_kernel_sum"] for r in res["rows"] if r["replay_over_kernel_sum"]]
        summary[name] = {
            "speedup_at_batch_1": b1["speedup"] if b1 else None,
            "speedup_target_met": bool(b1 and b1["speedup"] >= TARGETS["speedup_at_batch_1_min"]),
            "replay_over_kernel_sum": {"min": min(ratios), "max": max(ratios)} if ratios else None,
            "kernel_sum_target_met_all_batches": bool(ratios) and max(ratios) <= TARGETS["replay_over_kernel_sum_max"],
        }
    return summary


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output file (default: build/cuda_graphs_latency.json, or data/ with --record)")
    ap.add_argument("--models", default="seed,llama", help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--context-len", type=int, default=512)
    ap.add_argument("--no-isolate", dest="isolate", action="store_false",
                    help="measure every model in this process (default: one child process per model, so "
                         "one model's profiler sessions and captures cannot slow the next one's timings)")
    ap.add_argument("--model-timeout", type=float, default=900.0, help="seconds per child process")
    add_record_arguments(ap)
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file this run writes: ``--out``, else ``build/`` (``data/`` with ``--record``)."""
    return [Path(args.out) if args.out else default_dir(args) / "cuda_graphs_latency.json"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        print(f"unknown model(s) {bad}; choose from {sorted(MODELS)}", file=sys.stderr)
        return 2
    dest = output_paths(args)[0]
    refusal = overwrite_refusal(dest, args.iters * sum(len(MODELS[m]["batches"]) for m in names),
                                lambda d: sum(r["iters"] * len(r["rows"]) for r in d["results"].values()),
                                force=args.force, unit="timed iterations (iters x batches)")
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_cuda_graphs.py needs a CUDA device (torch.cuda.is_available() is False); nothing recorded",
              file=sys.stderr)
        return 2
    cmd = "python benchmarks/bench_cuda_graphs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    prov = make_provenance(cmd.strip(), extra={"cuda": torch.version.cuda, "python": platform.python_version()})
    out = {"provenance": prov, "targets": TARGETS, "results": {}, "errors": {}}
    dest.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every model, so a run cut short keeps what it measured
        dest.write_text(json.dumps(jsonable(out), indent=2))
    for name in names:
        spec = MODELS[name]
        t0 = time.perf_counter()
        if args.isolate:
            got, rc = _run_child(name, args)
            if name in got.get("results", {}):
                out["results"][name] = got["results"][name]
            else:
                out["errors"][name] = got.get("errors", {}).get(name, f"child process ended with {rc}, no result")
            save()
            continue
        cfg = EngineConfig.from_preset(spec["preset"], **spec["overrides"])
        try:
            res = latency.measure_decode_latency(cfg, "cuda", batch_sizes=spec["batches"], context_len=args.context_len,
                                            iters=args.iters, warmup=args.warmup, label=name)
        except Exception as e:  # record and go on with the next model
            out["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
            print(f"[{name}] FAILED: {e}", file=sys.stderr)
            save()
            continue
        res["wall_s"] = time.perf_counter() - t0
        out["results"][name] = res
        save()
        for r in res["rows"]:
            ks = r["kernel_sum_replay_us"]
            print(f"[{name}] batch {r['batch']:>3} (bucket {r['bucket']:>3}): eager {r['eager_us']:9.1f} us  "
                  f"replay {r['replay_us']:8.1f} us  run {r['run_us']:8.1f} us  kernels {ks if ks is None else round(ks, 1)} us  "
                  f"speedup {r['speedup']:5.1f}x  |diff| {r['max_abs_diff']:.2e}", flush=True)
    out["summary"] = summary = _summary(out["results"])
    save()
    print(json.dumps(summary, indent=2))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
