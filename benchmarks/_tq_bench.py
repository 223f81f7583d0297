"""Shared pieces of the TurboQuant benchmarks (``bench_turboquant.py``, ``_vs_vllm.py`` and the
``dev_turboquant_*`` scripts): provenance, the two timers, copy bandwidth, paged-cache filling,
random decode inputs, the byte count of a dequant call and the flash-preferring fp16 SDPA.

Every script imports these from here (one way: nothing here imports a script), so a timing or a
formula lives in one place.

* :func:`progress_log` / :func:`json_saver` -- the progress line and the incremental JSON write.
* :func:`time_graph` -- median ms of one call, ``reps`` calls captured in one CUDA graph, warm L2.
* :class:`ColdTimer` -- median ms of one graph-replayed call with L2 flushed (256 MiB write)
  before every replay: the side-by-side's timing (a model step reads other layers in between).
"""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
import sys

import torch

from tqlab.core.provenance import make_provenance
from tqlab.turboquant import kv_cache_shape, store_kv

BLOCK = 16
MODEL_DTYPE = torch.bfloat16
FLUSH_BYTES = 256 * 2**20


def provenance(args) -> dict:
    """:func:`tqlab.core.provenance.make_provenance` plus the triton, CUDA, Python and driver versions."""
    import triton

    extra = {"triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        extra["driver"] = subprocess.check_output(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], text=True).strip()
    except Exception:
        pass
    return make_provenance("python " + " ".join(sys.argv), device=None if torch.cuda.is_available() else "cpu",
                           commit=args.commit or None, extra=extra)


def progress_log(t0: float):
    """``log(row)``: prints a result row (a dict) on one line after the seconds since ``t0``
    (``time.time()``), floats to 4 significant digits -- every script's progress line."""
    import time

    def log(row: dict) -> None:
        print(f"[{time.time() - t0:6.1f}s] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                      for k, v in row.items()), flush=True)
    return log


def json_saver(res: dict, out, t0: float):
    """``save()``: writes ``res`` with ``wall_s`` (seconds since ``t0``) to the path ``out`` as indented
    JSON; the scripts call it after every case, so a run cut short keeps what it measured."""
    import json
    import time

    def save() -> None:
        res["wall_s"] = time.time() - t0
        out.write_text(json.dumps(res, indent=1))
    return save


def time_graph(fn, target_ms: float = 2.0, replays: int = 15) -> float:
    """Median milliseconds of one ``fn()`` call, timed by CUDA-graph replay."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    est = max(s.elapsed_time(e), 1e-3)
    reps = int(min(200, max(1, math.ceil(target_ms / est))))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / reps)
    del g
    return statistics.median(times)


class ColdTimer:
    """Median ms of one graph-replayed call, L2 flushed before every replay."""

    def __init__(self, replays: int = 25):
        self.replays = replays
        self.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def __call__(self, fn) -> float:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.replays)]
        for a, b in evs:
            self.flush.zero_()
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        del g
        return statistics.median(a.elapsed_time(b) for a, b in evs)


def copy_bandwidth(nbytes: int) -> dict:
    """Device copy bandwidth (bytes read + written per second), the best of a graph-replayed
    ``copy_`` and an eager one (median of 20, CUDA events)."""
    x = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms_graph = time_graph(lambda: y.copy_(x), target_ms=20.0)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        s.record()
        y.copy_(x)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    ms_eager = statistics.median(times)
    ms = min(ms_graph, ms_eager)
    return {"bytes_each_way": nbytes, "ms": ms, "GBps": 2 * nbytes / ms / 1e6,
            "graph_GBps": 2 * nbytes / ms_graph / 1e6, "eager_GBps": 2 * nbytes / ms_eager / 1e6}


def fill_paged(spec, k, v, bs=BLOCK, seed=0):
    """k, v (B, Hk, L, D) -> packed cache with shuffled blocks + block table (B, L/bs) int32."""
    b, hk, length, d = k.shape
    per = length // bs
    g = torch.Generator().manual_seed(seed)
    bt = torch.randperm(b * per, generator=g).view(b, per).to(torch.int32).cuda()
    cache = torch.empty(kv_cache_shape(b * per, hk, bs, d, spec), dtype=torch.uint8, device="cuda")
    pos = torch.arange(length, device="cuda")
    for i in range(b):
        slots = bt[i, pos // bs].long() * bs + pos % bs
        store_kv(cache, k[i].transpose(0, 1), v[i].transpose(0, 1), slots, spec)
    return cache, bt


def random_decode_inputs(batch: int, hq: int, hk: int, ctx: int, d: int = 128, seed: int | None = None):
    """``(k, v, q)`` on CUDA: fp16 K and V ``(B, Hk, ctx, D)`` and a bf16 query ``(B, Hq, D)``,
    standard normal (``torch.manual_seed(seed)`` first when a seed is given)."""
    if seed is not None:
        torch.manual_seed(seed)
    k = torch.randn(batch, hk, ctx, d, device="cuda", dtype=torch.float16)
    v = torch.randn(batch, hk, ctx, d, device="cuda", dtype=torch.float16)
    q = torch.randn(batch, hq, d, device="cuda", dtype=MODEL_DTYPE)
    return k, v, q


def dequant_bytes(spec, hk: int, d: int, cached_len: int, table_len: int) -> tuple[int, int]:
    """(bytes read, bytes written) of one ``dequant_kv`` call: packed slots of ``cached_len``
    tokens x ``Hk`` heads + the int32 block-table row, then fp16 K and V out."""
    return cached_len * hk * spec.slot_bytes(d) + table_len * 4, 2 * cached_len * hk * d * 2


_SDPA_BACKEND: list = []


def sdpa_backend() -> str:
    """The SDPA backend :func:`sdpa` settled on (``"?"`` before its first call)."""
    return str(_SDPA_BACKEND[0]) if _SDPA_BACKEND else "?"


def sdpa(q, k, v, scale):
    """fp16 SDPA with GQA; prefers the flash kernel, records which backend ran."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    f = torch.nn.functional.scaled_dot_product_attention
    if not _SDPA_BACKEND:
        for cand in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, None):
            try:
                if cand is None:
                    f(q, k, v, scale=scale, enable_gqa=True)
                else:
                    with sdpa_kernel([cand]):
                        f(q, k, v, scale=scale, enable_gqa=True)
                _SDPA_BACKEND.append(cand)
                break
            except RuntimeError:
                continue
    cand = _SDPA_BACKEND[0]
    if cand is None or q.dtype == torch.float32:
        return f(q, k, v, scale=scale, enable_gqa=True)
    with sdpa_kernel([cand]):
        return f(q, k, v, scale=scale, enable_gqa=True)
