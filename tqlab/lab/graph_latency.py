"""Eager decode vs CUDA-graph replay, timed on a GPU (the numbers notebook 05 shows from a recording without one).

:func:`measure_decode_latency` (CUDA events, medians, then torch.profiler's
summed kernel time) is what ``benchmarks/bench_cuda_graphs.py`` records as
``data/cuda_graphs_<name>.json`` (read and shown with :mod:`tqlab.lab.recorded`,
printed with :func:`tqlab.lab.display.text_table`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from tqlab.predict.analysis import decode_capture_rows
from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.engine.cuda_graph import CUDAGraphDecodeRunner, select_bucket
from tqlab.lab.graph_demos import compare_logits, prepare_decode_batch

__all__ = ["measure_decode_latency"]

logger = logging.getLogger(__name__)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _time_cuda(fn: Callable[[], Any], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000.0)  # microseconds
    return out


def _kernel_time_us(fn: Callable[[], Any], reps: int) -> tuple[float | None, int | None, list[dict]]:
    """Summed device time (kernels, memcpy, memset) per call of ``fn`` under torch.profiler, events per call,
    and the five most expensive kernel names with microseconds per call."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        try:
            evs = [(e.name(), e.duration_ns()) for e in prof.profiler.kineto_results.events()
                   if e.device_type() == DeviceType.CUDA]
        except Exception:
            evs = [(e.name, int(e.time_range.elapsed_us() * 1000)) for e in prof.events()
                   if getattr(e, "device_type", None) == DeviceType.CUDA]
        if not evs:
            return None, 0, []
        by: dict[str, int] = {}
        for name, ns in evs:
            by[name] = by.get(name, 0) + ns
        top = sorted(by.items(), key=lambda kv: -kv[1])[:5]
        return (sum(ns for _, ns in evs) / 1000.0 / reps, len(evs) // reps,
                [{"kernel": k[:120], "us_per_call": v / 1000.0 / reps} for k, v in top])
    except Exception as e:  # profiler unavailable: report, do not fail the run
        logger.warning("torch.profiler failed: %s", e)
        return None, None, []


def _time_batch(eng: LLMEngine, dr: CUDAGraphDecodeRunner, sub, iters: int, warmup: int) -> tuple[dict, tuple]:
    """One batch: eager step, bare replay and full runner step timed; replay vs eager logits compared."""
    n = len(sub)
    bucket = select_bucket(n, dr.captured_sizes)
    eager = lambda: eng.runner.decode_forward(*sub.astuple())  # noqa: E731
    dr.static.fill(sub, bucket)
    ref = eager()[:n].clone()
    rep = lambda: dr.replay(bucket)  # noqa: E731
    got = rep()[:n].clone()
    run = lambda: dr.run(*sub.astuple())  # noqa: E731
    te = _median(_time_cuda(eager, iters, warmup))
    tr = _median(_time_cuda(rep, iters, warmup))
    tu = _median(_time_cuda(run, iters, warmup))
    d = compare_logits(got, ref)
    row = {"batch": n, "bucket": bucket, "eager_us": te, "replay_us": tr, "run_us": tu, "speedup": te / tr,
           "max_abs_diff": d["max_abs_diff"], "bitwise_equal": d["bitwise_equal"],
           "argmax_mismatch": d["argmax_mismatch"]}
    return row, (sub, bucket, eager, rep)


def _profile_batch(dr: CUDAGraphDecodeRunner, row: dict, fns: tuple, reps: int) -> None:
    """Add torch.profiler's summed kernel time of a replay and of an eager step to ``row``."""
    sub, bucket, eager, rep = fns
    dr.static.fill(sub, bucket)
    kr, nkr, topr = _kernel_time_us(rep, reps) if reps else (None, None, [])
    ke, nke, _ = _kernel_time_us(eager, reps) if reps else (None, None, [])
    row.update(kernel_sum_replay_us=kr, kernels_per_replay=nkr, kernel_sum_eager_us=ke, kernels_per_eager=nke,
               replay_over_kernel_sum=(row["replay_us"] / kr) if kr else None, top_kernels_replay=topr)


def measure_decode_latency(config: EngineConfig, device: str | torch.device = "cuda", *,
                           batch_sizes: Sequence[int] | None = None, context_len: int = 512, iters: int = 30,
                           warmup: int = 5, profile_reps: int = 5, label: str | None = None) -> dict:
    """Eager vs CUDA-graph replay per decode step, CUDA events, medians (microseconds).

    Builds ``LLMEngine(config, device="cuda")`` (the engine installs
    :class:`CUDAGraphDecodeRunner`, captures every bucket largest first, locks),
    fills ``max(batch_sizes)`` requests of ``context_len`` tokens, then per batch:

    * ``eager_us``: ``runner.decode_forward`` on the batch (what runs without graphs);
    * ``replay_us``: ``graph.replay()`` of the bucket on already-filled static inputs;
    * ``run_us``: the runner's full step: guard + copy into static inputs + padding + replay;
    * ``kernel_sum_replay_us`` / ``kernel_sum_eager_us``: summed device time under torch.profiler
      (measured after every timing; ``profile_reps=0`` skips it), with the top kernels of a replay;
    * ``max_abs_diff``: replay vs eager logits.

    Raises ``ValueError`` without CUDA.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError("measure_decode_latency needs a CUDA device")
    sizes = list(batch_sizes) if batch_sizes is not None else list(decode_capture_rows(config))
    nmax = max(sizes)
    t0 = time.perf_counter()
    eng = LLMEngine(config, device=dev, kv_cache_tokens=nmax * context_len + 8 * config.block_size)
    build_s = time.perf_counter() - t0
    dr = eng.runner.decode_runner
    if not isinstance(dr, CUDAGraphDecodeRunner):
        raise RuntimeError(f"the engine did not install the CUDA graph runner (got {type(dr).__name__})")
    capture_s = next((p.seconds for p in eng.phases if p.name == "capture"), None)
    db = prepare_decode_batch(eng.runner, nmax, context_len)
    timed = [_time_batch(eng, dr, db.rows(n), iters, warmup) for n in sizes]
    # All timings first: a torch.profiler session leaves overhead on later kernel launches in the
    # process (seen on the H200: eager steps measured after profiling were slower), so profiling
    # comes last.
    for row, fns in timed:
        _profile_batch(dr, row, fns, profile_reps)
    res = {"label": label or config.preset, "preset": config.preset, "num_hidden_layers": config.num_hidden_layers,
           "num_heads_per_rank": config.num_heads_per_rank, "num_kv_heads_per_rank": config.num_kv_heads_per_rank,
           "head_dim": config.head_dim, "kv_cache_dtype": config.kv_cache_dtype, "max_num_seqs": config.max_num_seqs,
           "max_model_len": config.max_model_len, "context_len": context_len, "iters": iters, "warmup": warmup,
           "buckets": dr.captured_sizes, "engine_build_s": build_s, "capture_s": capture_s,
           "workspace_bytes": eng.workspace.size_bytes(0), "rows": [row for row, _ in timed]}
    del eng, dr, db, timed
    torch.cuda.empty_cache()
    return res
