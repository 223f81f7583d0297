"""Where the workspace's bytes come from: allocator experiments behind notebook 06's memory and latency charts.

``torch.empty`` per call vs workspace views over one long request's trace
(:func:`long_request_trace`, :func:`replay_trace`), growth by ``resize_`` vs
free-then-allocate (:func:`growth_peak`), the two DBO slot policies
(:func:`dbo_memory_held`), and the manager's own host cost per call
(:func:`workspace_call_overhead`). On CUDA memory is measured with
``torch.cuda`` statistics; elsewhere it is computed from the manager's bookkeeping.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tqlab.core.dtypes import as_torch
import torch

from tqlab.predict.analysis import prefill_chunks, prompt_chunks, unfixed_locked_bytes
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import (
    chunk_workspace_request,
    deployment_decode_shapes,
    reserve_workspace,
)
from tqlab.core.workspace import WorkspaceManager, ubatch_context
from tqlab.strategies.measure import free_memory

__all__ = [
    "TraceCall",
    "dbo_memory_held",
    "growth_peak",
    "growth_sizes_for_prompt",
    "long_request_trace",
    "memory_experiments",
    "overhead_requests",
    "replay_trace",
    "workspace_call_overhead",
]


# Chart helpers: torch.empty per call vs workspace views over a request trace #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class TraceCall:
    """One workspace call of a request trace: the step it belongs to, its kind and its shapes."""

    step: int
    kind: str  # "continuation" | "decode_kernel" | "decode"
    shapes: tuple
    activation_tokens: int  # tokens of this step (activations alive during it)


def long_request_trace(config: EngineConfig, prompt_tokens: int, decode_steps: int = 16) -> list[TraceCall]:
    """The workspace calls one request makes, in order: per prefill chunk and decode step, per layer.

    Chunks come from :func:`tqlab.predict.analysis.prefill_chunks`, each chunk's call
    from :func:`~tqlab.core.reservation.chunk_workspace_request` (the backend's own
    path choice), decode steps use one decode row.
    """
    if prompt_tokens < 1 or prompt_tokens + decode_steps > config.max_model_len:
        raise ValueError(f"prompt_tokens {prompt_tokens} + decode_steps {decode_steps} must fit in max_model_len "
                         f"{config.max_model_len}")
    calls: list[TraceCall] = []
    step = 0
    for cached, q in prefill_chunks(config, prompt_tokens):
        req = chunk_workspace_request(config, cached, q)
        if req.shapes is not None:
            for _ in range(config.num_hidden_layers):
                calls.append(TraceCall(step, req.path, req.shapes, q))
        step += 1
    dec = deployment_decode_shapes(config, 1)
    for _ in range(decode_steps):
        for _ in range(config.num_hidden_layers):
            calls.append(TraceCall(step, "decode", dec, 1))
        step += 1
    return calls


def replay_trace(config: EngineConfig, trace: Sequence[TraceCall], mode: str, *, device: str | torch.device = "cpu",
                 repeats: int = 1) -> dict[str, Any]:
    """Replay a trace's workspace calls and time each one; on CUDA also track the caching allocator.

    Modes:
        ``"workspace"``: a manager reserved up front with PR #44053's plan and
        locked; each call is ``get_simultaneous`` (views into one buffer).
        ``"torch_empty"``: each call allocates its tensors with ``torch.empty``
        and drops them once the next layer's call has returned (what consumers
        did before the workspace manager).

    Each step also allocates a ``(tokens, hidden)`` model-dtype activation that
    lives for the step, as a forward pass would. Buffers are not written: the
    consumer's work is the same either way; what differs is getting the memory.

    Returns a dict: ``per_call_us`` (list, host microseconds of the call itself,
    best of ``repeats``), ``kinds``, ``steps``, and on CUDA ``allocated``,
    ``reserved`` (bytes after each step), ``peak_allocated``, ``peak_reserved``
    (all relative to what the process held when the replay started:
    ``base_allocated``, ``base_reserved``; from the last repeat) and
    ``num_alloc_retries``/``num_device_alloc`` from ``torch.cuda.memory_stats``.
    """
    if mode not in ("workspace", "torch_empty"):
        raise ValueError(f"mode must be 'workspace' or 'torch_empty', got {mode!r}")
    dev = torch.device(device)
    best: list[float] | None = None
    mem: tuple[list[int], list[int]] = ([], [])
    stats: dict[str, Any] = {}
    for _ in range(max(1, repeats)):
        free_memory(dev)
        base = (0, 0)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
            s0 = torch.cuda.memory_stats(dev)
            base = (torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev))
        ws = None
        if mode == "workspace":
            ws = WorkspaceManager(dev)
            reserve_workspace(config, ws)
            ws.lock()
        times, mem_after = _replay_once(config, trace, ws, dev, base)
        if dev.type == "cuda":
            s1 = torch.cuda.memory_stats(dev)
            stats = dict(base_allocated=int(base[0]), base_reserved=int(base[1]),
                         peak_allocated=int(torch.cuda.max_memory_allocated(dev) - base[0]),
                         peak_reserved=int(torch.cuda.max_memory_reserved(dev) - base[1]),
                         **{k: int(s1.get(k, 0) - s0.get(k, 0)) for k in ("num_alloc_retries", "num_device_alloc")})
            mem = mem_after
        best = times if best is None else [min(a, b) for a, b in zip(best, times)]
        ws = None  # nothing of this repeat may survive into the next one's baseline
    out: dict[str, Any] = dict(mode=mode, device=str(dev), per_call_us=[x * 1e6 for x in (best or [])],
                               kinds=[c.kind for c in trace], steps=[c.step for c in trace])
    if dev.type == "cuda":
        out.update(allocated=mem[0], reserved=mem[1], **stats)
    return out


def _replay_once(config: EngineConfig, trace: Sequence[TraceCall], ws: WorkspaceManager | None, dev: torch.device,
                 base: tuple[int, int]) -> tuple[list[float], tuple[list[int], list[int]]]:
    """One pass over ``trace``: host seconds per call; on CUDA, allocated and reserved bytes above ``base`` per step.

    A step's activation lives for the step; a layer's buffers live until the
    next layer's call has returned; the last views are still alive at the
    final measurement.
    """
    hidden = config.num_heads_per_rank * config.head_dim
    times: list[float] = []
    alloc_after: list[int] = []
    res_after: list[int] = []

    def measure() -> None:
        torch.cuda.synchronize(dev)
        alloc_after.append(torch.cuda.memory_allocated(dev) - base[0])
        res_after.append(torch.cuda.memory_reserved(dev) - base[1])

    views = act = None
    cur_step = -1
    for call in trace:
        if call.step != cur_step:
            if dev.type == "cuda" and cur_step >= 0:
                measure()
            cur_step = call.step
            act = None
            act = torch.empty((call.activation_tokens, hidden), dtype=config.torch_dtype, device=dev)
        # The previous layer's views are dropped when ``views`` is rebound, after the new call returns.
        t = time.perf_counter()
        if ws is not None:
            views = ws.get_simultaneous(*call.shapes)
        else:
            views = [torch.empty(s, dtype=as_torch(d), device=dev) for s, d in call.shapes]
        times.append(time.perf_counter() - t)
    del act  # the request is over; the workspace (if any) and the last views stay
    if dev.type == "cuda":
        measure()
    del views
    return times, (alloc_after, res_after)


# --------------------------------------------------------------------------- #
# Chart helpers: growth by resize_ vs free-then-allocate                      #
# --------------------------------------------------------------------------- #


def growth_peak(sizes: Sequence[int], method: str, *, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Grow one buffer through ``sizes`` (bytes, increasing) and report the peak memory.

    Methods:
        ``"resize_"``: ``buf.resize_(n)`` on a ``uint8`` tensor (torch allocates
        the new storage, copies, then frees the old one);
        ``"free_then_allocate"``: :class:`~tqlab.core.workspace.WorkspaceManager` as vLLM grows it;
        ``"allocate_then_free"``: the manager allocating the new buffer before dropping the old.

    Returns ``{"method", "device", "final_bytes", "peak_bytes", "peak_source", "computed_peak_bytes"}``;
    on CUDA ``peak_bytes`` is ``torch.cuda.max_memory_allocated`` above the
    starting allocation (and ``peak_reserved_bytes`` likewise), elsewhere the
    computed peak (largest ``old + new`` for ``resize_`` and
    ``allocate_then_free``, largest ``new`` for ``free_then_allocate``).
    """
    if method not in ("resize_", "free_then_allocate", "allocate_then_free"):
        raise ValueError(f"method must be resize_, free_then_allocate or allocate_then_free, got {method!r}")
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes) or sizes != sorted(sizes):
        raise ValueError(f"sizes must be positive and increasing, got {sizes!r}")
    dev = torch.device(device)
    free_memory(dev)
    base = base_r = 0
    if dev.type == "cuda":
        base, base_r = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    computed = 0
    prev = 0
    if method == "resize_":
        buf = torch.empty(0, dtype=torch.uint8, device=dev)
        for s in sizes:
            if s > prev:
                buf.resize_(s)
                computed = max(computed, prev + s)
                prev = s
        final = buf.numel()
        del buf
    else:
        m = WorkspaceManager(dev, growth_policy=method)
        for s in sizes:
            m.get_simultaneous(((s,), torch.uint8))
        computed = m.peak_live_bytes
        final = m.size_bytes()
        del m
    out = dict(method=method, device=str(dev), final_bytes=final, computed_peak_bytes=computed)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        out.update(peak_bytes=int(torch.cuda.max_memory_allocated(dev) - base),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved(dev) - base_r),
                   peak_source="torch.cuda.max_memory_allocated")
    else:
        out.update(peak_bytes=computed, peak_source="computed")
    free_memory(dev)
    return out


# --------------------------------------------------------------------------- #
# Chart helpers: DBO slot growth policies                                     #
# --------------------------------------------------------------------------- #


def dbo_memory_held(config: EngineConfig, prompt_tokens: int, *, grow_all_slots: bool,
                    device: str | torch.device = "meta", decode_rows: int | None = None) -> dict[str, Any]:
    """Workspace bytes held with two DBO ubatch slots while one long prompt prefills next to decodes.

    The workload, step by step: ubatch 0 runs the prompt's next prefill chunk
    (its workspace call from :func:`~tqlab.core.reservation.chunk_workspace_request`),
    ubatch 1 runs ``decode_rows`` decode rows (default ``max_num_seqs - 1``).
    The manager is unlocked and grows lazily; ``grow_all_slots=True`` resizes
    every slot to each new high-water mark, False only
    the requesting slot (vLLM today). ``meta`` needs no memory.

    Returns ``{"grow_all_slots", "held_bytes" (per step, all slots), "slot_bytes"
    (final, per slot), "final_bytes", "peak_bytes"}``.
    """
    rows = max(1, config.max_num_seqs - 1) if decode_rows is None else int(decode_rows)
    m = WorkspaceManager(device, 2, grow_all_slots=grow_all_slots)
    dec = deployment_decode_shapes(config, rows)
    budget = config.chunk_budget - rows
    if budget < 1:
        raise ValueError(f"a step of {config.chunk_budget} tokens leaves no room next to {rows} decodes")
    held = []
    for cached, q in prompt_chunks(prompt_tokens, budget):
        req = chunk_workspace_request(config, cached, q)
        if req.shapes is not None:
            with ubatch_context(0):
                m.get_simultaneous(*req.shapes)
        with ubatch_context(1):
            m.get_simultaneous(*dec)
        held.append(m.live_bytes())
    return dict(grow_all_slots=grow_all_slots, held_bytes=held, slot_bytes=m.sizes_bytes(),
                final_bytes=m.live_bytes(), peak_bytes=m.peak_live_bytes)


def growth_sizes_for_prompt(config: EngineConfig, prompt_tokens: int) -> list[int]:
    """The sizes (bytes, increasing) a lazily growing workspace goes through while ``prompt_tokens`` prefill alone.

    Starts from :func:`unfixed_locked_bytes` (what capture left) and adds every
    chunk's call that needs more than the size before it.
    """
    size = unfixed_locked_bytes(config)
    out = [size] if size else []
    for cached, q in prefill_chunks(config, prompt_tokens):
        need = chunk_workspace_request(config, cached, q).nbytes
        if need > size:
            size = need
            out.append(size)
    return out


def memory_experiments(config: EngineConfig, prompt_tokens: int, *, device: str | torch.device = "cpu",
                       decode_steps: int = 16, repeats: int = 2, progress: bool = True) -> dict[str, Any]:
    """The notebook's two allocator experiments for one long request, on ``device``.

    * ``trace``: :func:`replay_trace` of :func:`long_request_trace` in both modes
      (``"workspace"`` and ``"torch_empty"``);
    * ``growth``: :func:`growth_peak` for ``resize_``, ``free_then_allocate`` and
      ``allocate_then_free`` over :func:`growth_sizes_for_prompt`. Off CUDA the
      peaks are computed, so the growth runs on ``meta`` (same numbers, no copies).

    Returns ``{"prompt_tokens", "device", "trace": {mode: ...}, "growth": {method: ...}, "growth_sizes"}``.
    """
    growth_device = device if torch.device(device).type == "cuda" else "meta"
    trace = long_request_trace(config, prompt_tokens, decode_steps)
    sizes = growth_sizes_for_prompt(config, prompt_tokens)
    jobs = [("trace", m) for m in ("workspace", "torch_empty")] + \
           [("growth", m) for m in ("resize_", "free_then_allocate", "allocate_then_free")]
    it: Iterable = jobs
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(jobs, desc=f"allocator experiments on {device}", unit="run")
    out: dict[str, Any] = dict(prompt_tokens=prompt_tokens, device=str(device), growth_sizes=sizes,
                               trace={}, growth={})
    for what, m in it:
        if what == "trace":
            out["trace"][m] = replay_trace(config, trace, m, device=device, repeats=repeats)
        else:
            out["growth"][m] = growth_peak(sizes, m, device=growth_device)
    return out



# --------------------------------------------------------------------------- #
# The manager's own cost per call                                             #
# --------------------------------------------------------------------------- #


def overhead_requests(config: EngineConfig | None = None) -> tuple:
    """Four ``(shape, dtype)`` requests: the decode views at ``max_num_seqs`` rows, then ``(B, Hq, D) float32``.

    Default config: the bug report's deployment (``(4,4,32,129) f32``, ``(4,4,128) bf16``, ``(4,4) f32``,
    ``(4,4,128) f32``).
    """
    c = EngineConfig.from_preset("nemotron-3-super-120b-a12b") if config is None else config
    b, h, d = c.max_num_seqs, c.num_heads_per_rank, c.head_dim
    dec = deployment_decode_shapes(c, b)
    return dec + (((b, h, d), torch.float32),)


def _time_calls(fn: Callable[[], Any], number: int, repeats: int, sync: Callable[[], None]) -> tuple[float, float]:
    per = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        per.append((time.perf_counter() - t) / number)
    return min(per), statistics.median(per)


def workspace_call_overhead(device: str | torch.device = "cpu", number: int = 20000, repeats: int = 7, *,
                            config: EngineConfig | None = None, echo: bool = False) -> list[dict[str, Any]]:
    """Host microseconds per call of ``get_simultaneous`` for 1-4 views, and of ``torch.empty`` per view.

    For ``k`` = 1..4 views of :func:`overhead_requests`, on a locked manager big
    enough for all of them: ``hot_us`` (same signature every call: cached
    layout and views), ``cold_us`` (layout and view caches emptied before every
    call; the emptying is timed too), ``torch_empty_us`` (one ``torch.empty`` per
    view). Each is the minimum over ``repeats`` runs of the mean of ``number``
    calls; ``*_median_us`` is the median over the runs. Returns one dict per ``k``.
    """
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    reqs = overhead_requests(config)
    rows = []
    for k in range(1, 5):
        r = reqs[:k]
        m = WorkspaceManager(dev)
        m.get_simultaneous(*reqs)
        m.lock()

        def hot(m=m, r=r):
            return m.get_simultaneous(*r)

        def cold(m=m, r=r):
            m.clear_caches()  # on purpose: a never-seen signature
            return m.get_simultaneous(*r)

        def empty(r=r):
            return [torch.empty(s, dtype=as_torch(d), device=dev) for s, d in r]

        for fn in (hot, cold, empty):
            for _ in range(200):
                fn()
        row: dict[str, Any] = dict(views=k, shapes=[[list(s), str(d).removeprefix("torch.")] for s, d in r])
        for name, fn in (("hot", hot), ("cold", cold), ("torch_empty", empty)):
            lo, med = _time_calls(fn, number, repeats, sync)
            row[f"{name}_us"] = lo * 1e6
            row[f"{name}_median_us"] = med * 1e6
        rows.append(row)
        if echo:
            print(f"{k} view(s): hot {row['hot_us']:.2f} us, cold {row['cold_us']:.2f} us, "
                  f"torch.empty {row['torch_empty_us']:.2f} us per call")
    return rows
