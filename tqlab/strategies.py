"""The four candidate fixes of the bug report, as engine options, and the measurements that compare them.

The bug report (seed 003, vLLM 0.20 + TurboQuant) lists four ways to stop a
locked workspace from killing the engine when a long prompt's continuation
prefill asks for more than the start-up run ever touched. vLLM merged one
(static worst-case reservation, PR #44053). Each is one name here::

    make_engine(config, strategy, device=...)

================  ==============================================================
``none``          the unfixed baseline (vLLM 0.20): lock whatever capture touched
``dummy_run``     fix 1: a long-context dummy run at start-up — one dummy step per
                  continuation path at its worst case, after the profile run and
                  before capture (``LLMEngine(after_profile=...)``)
``reserve``       fix 2: static worst-case reservation from the config in the
                  metadata builder, ``_reserve_workspace`` (PR #44053, merged)
``replay_aware``  fix 3: replay-aware lock: a request that does not fit unlocks,
                  grows, re-captures every captured decode bucket, and locks again
``fallback``      fix 4: per-call fallback: the call that does not fit gets
                  ``torch.empty`` buffers and one :class:`WorkspaceFallbackWarning`
================  ==============================================================

plus ``grow_no_recapture``, a negative control that is *not* a fix: it grows
after the lock without re-capturing, so captured CUDA graphs keep pointers into
a freed buffer (:func:`captured_graphs_valid` says False).

``replay_aware`` and ``fallback`` wrap the backend's workspace
(``engine.backend.workspace``, anything with ``get_simultaneous``); the model
runner keeps the manager itself, so captures still record its pointers.

The rest of the module measures what the notebook ``06_memory_and_latency``
charts: :func:`run_strategy` / :func:`compare_strategies` (start-up time,
reserved bytes, peak memory, time to first token, decode step latency,
survival of a ``max_model_len`` request, graph safety), workspace bytes against
``max_model_len``, the unfixed threshold sweep, the workspace lifecycle
timeline, ``torch.empty`` per call vs workspace views over a long request
trace, growth by ``resize_`` vs free-then-allocate, and DBO slot policies.
Everything runs on ``cpu``, ``meta`` and ``cuda``; on CPU/meta, memory is
computed from the workspace's own bookkeeping, on CUDA it is measured with
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from .config import EngineConfig
from .engine import LLMEngine
from .reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
    reserve_workspace,
)
from .analysis import first_failing_prompt, prompt_chunks, unfixed_locked_bytes
from .workspace import (
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    rewarm_workspace,
    ubatch_context,
    workspace_wrapper,
)

__all__ = [
    "workspace_call_overhead",
    "overhead_requests",
    "warm_up_process",
    "plot_workspace_vs_len",
    "plot_trace",
    "plot_threshold_sweep",
    "plot_strategy_comparison",
    "plot_growth",
    "plot_dbo",
    "results_from_payload",
    "results_payload",
    "memory_experiments",
    "growth_sizes_for_prompt",
    "ALL_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_INFO",
    "FallbackWorkspace",
    "PromptResult",
    "ReplayAwareWorkspace",
    "StrategyResult",
    "TraceCall",
    "WorkspaceFallbackWarning",
    "captured_graphs_valid",
    "compare_strategies",
    "dbo_memory_held",
    "default_prompts",
    "dummy_run_chunks",
    "fmt_bytes",
    "format_table",
    "growth_peak",
    "kv_bytes_for_max_model_len",
    "long_context_dummy_run",
    "long_request_trace",
    "longest_surviving_prompt",
    "make_engine",
    "replay_trace",
    "run_strategy",
    "strategy_table",
    "threshold_sweep",
    "unfixed_locked_bytes",
    "workspace_timeline",
    "workspace_vs_max_model_len",
]

STRATEGIES = ("none", "dummy_run", "reserve", "replay_aware", "fallback")
"""The unfixed baseline and the bug report's four fixes, in the report's order of invasiveness."""

ALL_STRATEGIES = STRATEGIES + ("grow_no_recapture",)
""":data:`STRATEGIES` plus the negative control ``grow_no_recapture`` (not a fix)."""

STRATEGY_INFO: dict[str, dict[str, str]] = {
    "none": {
        "title": "unfixed baseline (vLLM 0.20)",
        "seed_fix": "-",
        "how": "lock after decode capture; a long continuation prefill raises WorkspaceLockedError and the engine dies",
    },
    "dummy_run": {
        "title": "long-context dummy run at start-up",
        "seed_fix": "1",
        "how": "after the profile run, one dummy step per continuation path at its worst case grows the workspace "
        "before capture",
    },
    "reserve": {
        "title": "static worst-case reservation (PR #44053, merged)",
        "seed_fix": "2",
        "how": "TurboQuantMetadataBuilder._reserve_workspace() sizes every slot from the config before capture",
    },
    "replay_aware": {
        "title": "replay-aware lock",
        "seed_fix": "3",
        "how": "on a locked-workspace miss: unlock -> grow -> re-capture every captured bucket -> lock",
    },
    "fallback": {
        "title": "per-call torch.empty fallback",
        "seed_fix": "4",
        "how": "on a locked-workspace miss: that call's buffers come from torch.empty; one warning",
    },
    "grow_no_recapture": {
        "title": "late growth without re-capture (negative control)",
        "seed_fix": "-",
        "how": "unlock -> grow -> lock, graphs not re-captured: they keep pointers into the freed buffer",
    },
}


def _check_strategy(strategy: object) -> str:
    if not isinstance(strategy, str) or strategy not in ALL_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(ALL_STRATEGIES)}")
    return strategy


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- #
# Fix 4: per-call fallback                                                    #
# --------------------------------------------------------------------------- #


class WorkspaceFallbackWarning(RuntimeWarning):
    """A locked workspace was too small; the call's buffers were allocated with ``torch.empty`` instead."""


class FallbackWorkspace:
    """Workspace wrapper for fix 4: serve what fits from the manager, ``torch.empty`` the rest.

    ``get_simultaneous`` first asks the manager. If it raises
    :class:`~tqlab.workspace.WorkspaceLockedError`, the call's tensors are
    allocated one by one with ``torch.empty(shape, dtype=dtype, device=...)``
    (freed when the consumer drops them), and a :class:`WorkspaceFallbackWarning`
    is issued the first time only. The manager stays locked and unchanged (it
    records a ``"violation"`` event per miss). Other attributes are the manager's.

    Attributes:
        fallback_calls: calls served by ``torch.empty``.
        fallback_bytes_total: bytes those calls allocated, summed (``numel * itemsize``).
        fallback_bytes_max: the largest single call's bytes (they are alive
            together, so this is what the fallback adds to the peak).
        fallback_seconds: host time spent in fallback calls (miss + allocation), seconds.
    """

    def __init__(self, manager: WorkspaceManager):
        if not hasattr(manager, "get_simultaneous"):
            raise TypeError(f"manager must have get_simultaneous(), got {type(manager).__name__}")
        self.manager = manager
        self.fallback_calls = 0
        self.fallback_bytes_total = 0
        self.fallback_bytes_max = 0
        self.fallback_seconds = 0.0
        self.warned = False

    @workspace_wrapper  # the manager names the consumer, not this method
    def get_simultaneous(self, *shapes_and_dtypes):
        try:
            return self.manager.get_simultaneous(*shapes_and_dtypes)
        except WorkspaceLockedError as err:
            t0 = time.perf_counter()
            caller = err.caller
            lay = compute_layout(shapes_and_dtypes)
            dev = self.manager.device
            out = [torch.empty(s, dtype=d, device=dev) for s, d in zip(lay.shapes, lay.dtypes)]
            n = sum(lay.nbytes)
            self.fallback_calls += 1
            self.fallback_bytes_total += n
            self.fallback_bytes_max = max(self.fallback_bytes_max, n)
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"workspace fallback: '{caller}' needs {err.required_bytes / MiB:.2f} MiB but the locked "
                    f"workspace holds {err.current_bytes / MiB:.2f} MiB; allocating this and later such calls with "
                    "torch.empty (slower, not CUDA-graph capturable). Warned once.",
                    WorkspaceFallbackWarning,
                    stacklevel=2,
                )
            self.fallback_seconds += time.perf_counter() - t0
            return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)


# --------------------------------------------------------------------------- #
# Fix 3: replay-aware lock (and the negative control)                         #
# --------------------------------------------------------------------------- #


class ReplayAwareWorkspace:
    """Workspace wrapper for fix 3: late growth followed by re-capture of every captured graph.

    On :class:`~tqlab.workspace.WorkspaceLockedError` (outside a CUDA stream
    capture) it runs, inside :func:`tqlab.workspace.rewarm_workspace` (which
    re-locks even if something raises):

    1. grow the requesting slot to ``max(required, growth_factor * current)`` bytes;
    2. re-capture every decode bucket the engine captured
       (``engine.runner.capture_model(sizes)``, i.e. ``decode_runner.capture`` per
       bucket: a real ``torch.cuda.CUDAGraph`` on CUDA, :class:`EagerDecodeRunner`
       elsewhere), in ubatch slot 0 as at start-up, and store the new records in
       ``engine.captures``;
    3. lock, then serve the call from the grown workspace.

    With ``recapture=False`` it is the negative control ``grow_no_recapture``:
    the graphs keep the old pointers.

    Attributes: ``regrowths`` (list of dicts: ``old_bytes``, ``new_bytes``,
    ``seconds``, ``caller``), ``recaptures`` (number of re-capture rounds),
    ``recaptured_graphs`` (buckets captured again, summed).
    """

    def __init__(self, engine: LLMEngine, *, recapture: bool = True, growth_factor: float = 1.0):
        if not isinstance(growth_factor, (int, float)) or isinstance(growth_factor, bool) or growth_factor < 1.0:
            raise ValueError(f"growth_factor must be a number >= 1.0, got {growth_factor!r}")
        self.engine = engine
        self.manager: WorkspaceManager = engine.workspace
        self.recapture = bool(recapture)
        self.growth_factor = float(growth_factor)
        self.regrowths: list[dict[str, Any]] = []
        self.recaptures = 0
        self.recaptured_graphs = 0

    @workspace_wrapper  # the manager names the consumer, not this method
    def get_simultaneous(self, *shapes_and_dtypes):
        m = self.manager
        try:
            return m.get_simultaneous(*shapes_and_dtypes)
        except WorkspaceLockedError as err:
            caller = err.caller
            if m.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise  # cannot allocate while a graph is being captured
            t0 = time.perf_counter()
            target = max(err.required_bytes, int(err.current_bytes * self.growth_factor))
            sizes = tuple(r.batch_size for r in getattr(self.engine, "captures", []) or [])
            with rewarm_workspace(m):
                m.get_simultaneous(((target,), torch.uint8))  # grows the requesting slot
                if self.recapture and sizes:
                    try:
                        with ubatch_context(0):
                            self.engine.captures = self.engine.runner.capture_model(sizes)
                    finally:
                        # a capture may swap backend.workspace for its own recorder and restore
                        # the manager (tqlab.cuda_graphs does): put this wrapper back
                        self.engine.backend.workspace = self
                    self.recaptures += 1
                    self.recaptured_graphs += len(sizes)
            _sync(m.device)
            self.regrowths.append(
                dict(old_bytes=err.current_bytes, new_bytes=target, seconds=time.perf_counter() - t0, caller=caller)
            )
            return m.get_simultaneous(*shapes_and_dtypes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)


# --------------------------------------------------------------------------- #
# Fix 1: long-context dummy run                                               #
# --------------------------------------------------------------------------- #


def dummy_run_chunks(config: EngineConfig) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` of the dummy steps the long-context dummy run executes.

    One step per continuation path that asks the workspace for memory, each at
    the largest request it can make (the path and its call come from
    :func:`tqlab.reservation.chunk_workspace_request`, as in the backend):

    * the dequant path (``q_len > 128``): ``q_len = 129`` new tokens after
      ``cached_len = max_model_len - 1 - 129`` cached ones — the longest cached
      prefix a continuation chunk of a request of at most ``max_model_len``
      tokens (one of them generated) can have;
    * the decode-kernel path (``q_len <= 128``), only if it makes a workspace
      call: ``q_len = min(128, max_num_batched_tokens)`` rows after one cached
      block (its request does not depend on ``cached_len``). As in vLLM 0.33
      it makes none, so this step is normally absent.

    Without chunked prefill there are no continuation chunks (tqlab has no
    prefix caching) and the list is empty. For the seed's deployment
    (``max_model_len`` 131072): ``[(130942, 129)]``.
    """
    if not config.enable_chunked_prefill:
        return []
    top = config.max_model_len - 1  # longest prompt: one token is generated
    m = config.max_num_batched_tokens
    chunks: list[tuple[int, int]] = []
    q_long = CONTINUATION_DECODE_THRESHOLD + 1
    if m >= q_long and top - q_long >= 1:
        chunks.append((top - q_long, q_long))
    q_short = min(CONTINUATION_DECODE_THRESHOLD, m)
    cached_short = min(config.block_size, top - q_short)
    if cached_short >= 1 and chunk_workspace_request(config, cached_short, q_short).shapes is not None:
        chunks.append((cached_short, q_short))
    return chunks


def _dummy_prefill_chunk(engine: LLMEngine, cached_len: int, q_len: int) -> None:
    """Run one prefill chunk of ``q_len`` dummy tokens after ``cached_len`` (garbage) cached ones.

    Every block-table entry points at the null block, nothing is stored in
    the KV cache: only the shapes matter, exactly as in vLLM's dummy runs.
    """
    r = engine.runner
    dev = r.device
    h = r.model.embed[torch.zeros(q_len, dtype=torch.long, device=dev)]
    bt = torch.zeros(r.max_blocks_per_seq, dtype=torch.int32, device=dev)
    for i, cache in enumerate(r.kv_caches):
        q, k, v = r.model.qkv(i, h)
        h = r.model.out(i, h, r.backend.forward_prefill(q, k, v, cache, bt, cached_len=cached_len))


def long_context_dummy_run(engine: LLMEngine) -> None:
    """Fix 1: exercise :func:`dummy_run_chunks` in every ubatch slot, before capture.

    Passed as ``LLMEngine(after_profile=long_context_dummy_run)``; the
    workspace grows to the high-water mark of those steps, and the lock that
    follows capture freezes it. Real arithmetic on ``cpu``/``cuda`` (the
    ``max_model_len`` dequant and attention are its start-up cost), shapes
    only on ``meta``.
    """
    for slot in range(engine.workspace.num_ubatches):
        with ubatch_context(slot):
            for cached_len, q_len in dummy_run_chunks(engine.config):
                _dummy_prefill_chunk(engine, cached_len, q_len)
    _sync(engine.device)


# --------------------------------------------------------------------------- #
# The engine factory                                                          #
# --------------------------------------------------------------------------- #


def make_engine(config: EngineConfig, strategy: str = "reserve", *, device: str | torch.device = "cpu",
                **engine_kwargs: Any) -> LLMEngine:
    """An :class:`~tqlab.engine.LLMEngine` hardened (or not) by ``strategy``.

    Args:
        config: the deployment.
        strategy: one of :data:`ALL_STRATEGIES` (see the module docstring).
        device: ``"cpu"``, ``"cuda"`` or ``"meta"``.
        **engine_kwargs: passed to ``LLMEngine`` (``seed``, ``kv_cache_tokens``,
            ``on_phase``, ``use_cuda_graphs``, ...); ``fix`` and
            ``after_profile`` are set by the strategy and may not be given.

    Returns:
        The engine, locked and ready, with ``engine.strategy`` (the name),
        ``engine.strategy_state`` (the workspace wrapper for ``replay_aware``,
        ``fallback`` and ``grow_no_recapture``, else None) and
        ``engine.phase_marks`` (``(phase name, time.monotonic() at its end)``,
        led by ``("start", t)``; the clock of the workspace events).

    Raises:
        ValueError: unknown strategy, or ``fix``/``after_profile`` passed.
    """
    _check_strategy(strategy)
    for k in ("fix", "after_profile"):
        if k in engine_kwargs:
            raise ValueError(f"{k}= is chosen by the strategy ({strategy!r}); do not pass it to make_engine")
    fix = strategy == "reserve"
    after_profile = long_context_dummy_run if strategy == "dummy_run" else None
    marks: list[tuple[str, float]] = []
    user_on_phase = engine_kwargs.pop("on_phase", None)

    def on_phase(rec) -> None:
        marks.append((rec.name, time.monotonic()))  # the clock of WorkspaceEvent.t
        if user_on_phase is not None:
            user_on_phase(rec)

    t_start = time.monotonic()
    engine = LLMEngine(config, fix=fix, device=device, after_profile=after_profile, on_phase=on_phase,
                       **engine_kwargs)
    engine.phase_marks = [("start", t_start)] + marks
    state: Any = None
    if strategy == "fallback":
        state = FallbackWorkspace(engine.workspace)
    elif strategy in ("replay_aware", "grow_no_recapture"):
        state = ReplayAwareWorkspace(engine, recapture=strategy == "replay_aware")
    if state is not None:
        engine.backend.workspace = state
    engine.strategy = strategy
    engine.strategy_state = state
    return engine


def _capture_records(engine: LLMEngine) -> list:
    runner = getattr(engine.runner, "decode_runner", None)
    recs = getattr(runner, "records", None)
    if isinstance(recs, dict) and recs:
        return list(recs.values())
    return list(getattr(engine, "captures", []) or [])


def captured_graphs_valid(engine: LLMEngine) -> bool:
    """True if every captured decode bucket still points at the workspace buffers that exist now.

    A capture record holds each slot's ``data_ptr`` and size at capture time
    (``CaptureRecord.workspace_ptrs`` / ``workspace_bytes``). The manager never
    grows in place, so a slot whose size or pointer changed since was
    reallocated, and a CUDA graph replayed on it would read and write freed
    memory. This is stricter than a pointer-only replay guard (the one in
    ``tqlab.cuda_graphs``): if the allocator happens to hand the grown buffer
    out at the old address, the graph works by luck; we count that as unsafe.
    Slots empty at capture time are ignored. On ``meta`` every pointer is 0
    and sizes decide. No captures (``enforce_eager``): True.
    """
    ws = engine.workspace
    ptrs, sizes = ws.data_ptrs(), ws.sizes_bytes()
    for rec in _capture_records(engine):
        rp = getattr(rec, "workspace_ptrs", None)
        rb = getattr(rec, "workspace_bytes", None)
        if rp is None or rb is None:
            continue
        for slot, (p0, b0) in enumerate(zip(rp, rb)):
            if p0 == 0 and b0 == 0:
                continue
            if p0 != ptrs[slot] or b0 != sizes[slot]:
                return False
    return True


# --------------------------------------------------------------------------- #
# Measuring one strategy                                                      #
# --------------------------------------------------------------------------- #


@dataclass
class PromptResult:
    """One request of ``prompt_tokens`` tokens plus ``1 + decode_steps`` generated ones.

    ``ttft_s``: seconds from ``add_request`` to the first sampled token (all
    prefill chunks); ``decode_step_s``: median seconds of the following
    decode-only steps; both None if the engine died. ``error``: the exception
    text if it died. ``engine_rebuilt``: a fresh engine was built for this
    request because an earlier one died. Counters are for this request only.
    """

    prompt_tokens: int
    max_tokens: int
    survived: bool
    ttft_s: float | None = None
    decode_step_s: float | None = None
    decode_steps_timed: int = 0
    error: str | None = None
    engine_rebuilt: bool = False
    workspace_bytes_after: int = 0
    fallback_calls: int = 0
    recaptures: int = 0
    recapture_seconds: float = 0.0


@dataclass
class StrategyResult:
    """Everything the comparison table shows for one strategy (bytes, seconds).

    ``reserved_bytes``: workspace bytes (all ubatch slots) right after the lock.
    ``peak_bytes``: ``torch.cuda.max_memory_allocated`` minus what was allocated
    before the engine was built, on CUDA (``peak_source="torch.cuda.max_memory_allocated"``);
    elsewhere the computed ``computed_peak_bytes`` (``peak_source="computed"``):
    the most workspace bytes alive at once (growth included) or the locked
    workspace plus the largest fallback call, whichever is larger. Weights,
    KV cache and activations are not in the computed figure; ``kv_cache_bytes``
    gives the KV cache for reference.
    """

    strategy: str
    device: str
    config: dict[str, Any]
    startup_s: float
    reserved_bytes: int
    final_workspace_bytes: int
    peak_bytes: int
    peak_source: str
    computed_peak_bytes: int
    kv_cache_bytes: int
    prompts: list[PromptResult]
    survives_max_model_len: bool
    graph_safe: bool
    cuda_graphs: bool
    startup_phases: list[dict[str, Any]] = field(default_factory=list)
    engines_built: int = 1
    recaptures: int = 0
    fallback_calls: int = 0
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StrategyResult":
        d = dict(d)
        d["prompts"] = [PromptResult(**p) for p in d["prompts"]]
        return cls(**d)

    def prompt(self, n: int) -> PromptResult | None:
        return next((p for p in self.prompts if p.prompt_tokens == n), None)


def default_prompts(config: EngineConfig, decode_steps: int = 8, seed_prompt: int = 8192) -> tuple[int, int]:
    """``(seed prompt, max_model_len prompt)``: the bug report's ~8K prompt and the longest one.

    The second leaves room for ``1 + decode_steps`` generated tokens, so the
    request is exactly ``max_model_len`` tokens. The first is capped below it.
    """
    long = config.max_model_len - 1 - decode_steps
    if long < 1:
        raise ValueError(f"max_model_len {config.max_model_len} leaves no room for {decode_steps} decode steps")
    return (min(seed_prompt, long), long)


def _state_counters(engine: LLMEngine) -> tuple[int, int, float, int]:
    st = getattr(engine, "strategy_state", None)
    if isinstance(st, FallbackWorkspace):
        return st.fallback_calls, 0, 0.0, st.fallback_bytes_max
    if isinstance(st, ReplayAwareWorkspace):
        return 0, st.recaptures, sum(g["seconds"] for g in st.regrowths), 0
    return 0, 0, 0.0, 0


def _serve_one(engine: LLMEngine, prompt_tokens: int, decode_steps: int) -> PromptResult:
    dev = engine.device
    max_tokens = 1 + decode_steps
    fb0, rc0, rs0, _ = _state_counters(engine)
    res = PromptResult(prompt_tokens, max_tokens, survived=False)
    try:
        _sync(dev)
        t0 = time.perf_counter()
        rid = engine.add_request(prompt_tokens, max_tokens=max_tokens)
        out = engine.outputs[rid]
        while not out.output_token_ids:
            engine.step()
        _sync(dev)
        res.ttft_s = time.perf_counter() - t0
        steps = []
        while not out.finished:
            t = time.perf_counter()
            engine.step()
            _sync(dev)
            steps.append(time.perf_counter() - t)
        res.decode_step_s = statistics.median(steps) if steps else None
        res.decode_steps_timed = len(steps)
        res.survived = True
    except (WorkspaceLockedError, RuntimeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        if engine.dead is None:
            raise
    fb1, rc1, rs1, _ = _state_counters(engine)
    res.fallback_calls, res.recaptures, res.recapture_seconds = fb1 - fb0, rc1 - rc0, rs1 - rs0
    res.workspace_bytes_after = engine.workspace.live_bytes()
    return res


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _computed_peak(engine: LLMEngine) -> int:
    ws = engine.workspace
    _, _, _, fb_max = _state_counters(engine)
    return max(ws.peak_live_bytes, ws.live_bytes() + fb_max)


def run_strategy(
    config: EngineConfig,
    strategy: str,
    *,
    device: str | torch.device = "cpu",
    prompts: Sequence[int] | None = None,
    decode_steps: int = 8,
    seed: int = 0,
    **engine_kwargs: Any,
) -> StrategyResult:
    """Build an engine with ``strategy``, serve each prompt in turn, and measure.

    Args:
        config: the deployment.
        strategy: one of :data:`ALL_STRATEGIES`.
        device: ``cpu``, ``cuda`` or ``meta`` (meta: bytes, survival and graph
            safety are exact; seconds are Python overhead, not compute).
        prompts: prompt lengths in tokens, served one after the other on the
            same engine (default :func:`default_prompts`); each generates
            ``1 + decode_steps`` tokens. If the engine dies, the next prompt
            gets a freshly built one (``PromptResult.engine_rebuilt``).
        decode_steps: decode-only steps timed after the first token.

    Returns:
        A :class:`StrategyResult`. ``survives_max_model_len`` is the survival of
        a prompt that fills ``max_model_len`` with its generated tokens (False
        if no such prompt was served).
    """
    _check_strategy(strategy)
    dev = torch.device(device)
    prompts = tuple(default_prompts(config, decode_steps) if prompts is None else prompts)
    _free(dev)
    base = 0
    if dev.type == "cuda":
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    engine = make_engine(config, strategy, device=dev, seed=seed, **engine_kwargs)
    _sync(dev)
    startup = time.perf_counter() - t0
    reserved = engine.workspace.live_bytes()
    phases = [dict(name=p.name, seconds=p.seconds, workspace_bytes=list(p.workspace_bytes), note=p.note)
              for p in engine.phases]
    kv_bytes = sum(c.numel() * c.element_size() for c in engine.runner.kv_caches)
    cuda_graphs = getattr(engine.runner.decode_runner, "kind", "eager") != "eager"
    results: list[PromptResult] = []
    computed_peak = _computed_peak(engine)
    graph_safe = True
    engines = 1
    recaptures = fallbacks = 0
    for n in prompts:
        rebuilt = False
        if engine.dead is not None:
            graph_safe = graph_safe and captured_graphs_valid(engine)
            recaptures += _state_counters(engine)[1]
            fallbacks += _state_counters(engine)[0]
            del engine
            _free(dev)
            engine = make_engine(config, strategy, device=dev, seed=seed, **engine_kwargs)
            engines += 1
            rebuilt = True
        r = _serve_one(engine, n, decode_steps)
        r.engine_rebuilt = rebuilt
        results.append(r)
        computed_peak = max(computed_peak, _computed_peak(engine))
    graph_safe = graph_safe and captured_graphs_valid(engine)
    rc, fb = _state_counters(engine)[1], _state_counters(engine)[0]
    recaptures += rc
    fallbacks += fb
    final_ws = engine.workspace.live_bytes()
    _sync(dev)
    if dev.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(dev) - base, "torch.cuda.max_memory_allocated"
    else:
        peak, source = computed_peak, "computed"
    full = [r for r in results if r.prompt_tokens + r.max_tokens == config.max_model_len]
    notes = ""
    if dev.type == "meta":
        notes = "meta device: seconds are Python overhead only"
    res = StrategyResult(
        strategy=strategy,
        device=str(dev),
        config=config.to_dict(),
        startup_s=startup,
        reserved_bytes=reserved,
        final_workspace_bytes=final_ws,
        peak_bytes=int(peak),
        peak_source=source,
        computed_peak_bytes=int(computed_peak),
        kv_cache_bytes=int(kv_bytes),
        prompts=results,
        survives_max_model_len=bool(full) and all(r.survived for r in full),
        graph_safe=graph_safe,
        cuda_graphs=cuda_graphs,
        startup_phases=phases,
        engines_built=engines,
        recaptures=recaptures,
        fallback_calls=fallbacks,
        notes=notes,
    )
    del engine
    _free(dev)
    return res


def warm_up_process(config: EngineConfig, device: torch.device | str, seed: int = 0,
                    prompts: Sequence[int] | None = None, **engine_kwargs: Any) -> None:
    """Pay one-time costs (kernel compilation, library handles, autotuning) before anything is timed.

    On CUDA a ``dummy_run`` engine (its start-up runs the worst continuation
    chunk; its workspace then covers every single request) serves each of
    ``prompts`` once, so every kernel specialization the measured requests
    will hit is compiled here. Elsewhere (nothing is compiled), a ``reserve``
    engine serves two short prompts that take every path: a fresh chunk, a
    long continuation chunk, a short (decode-kernel) continuation chunk, and decodes.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and prompts:
        e = make_engine(config, "dummy_run", device=dev, seed=seed, **engine_kwargs)
        for n in prompts:
            e.generate(int(n), max_tokens=min(3, config.max_model_len - int(n)))
        del e
        _free(dev)
        return
    m = config.max_num_batched_tokens
    n = min(config.max_model_len - 4, m + CONTINUATION_DECODE_THRESHOLD + 8) if config.enable_chunked_prefill else 64
    e = make_engine(config, "reserve", device=dev, seed=seed, **engine_kwargs)
    e.generate(max(1, n), max_tokens=3)
    if config.enable_chunked_prefill and m + 64 < config.max_model_len - 3:
        e.generate(m + 64, max_tokens=2)
    del e
    _free(dev)


def compare_strategies(
    config: EngineConfig,
    strategies: Iterable[str] = STRATEGIES,
    *,
    device: str | torch.device = "cpu",
    prompts: Sequence[int] | None = None,
    decode_steps: int = 8,
    seed: int = 0,
    warm_up: bool = True,
    progress: bool = True,
    on_result: Callable[[list[StrategyResult]], None] | None = None,
    **engine_kwargs: Any,
) -> list[StrategyResult]:
    """:func:`run_strategy` for each strategy (fresh engine each), after one untimed warm-up.

    ``progress`` shows a ``tqdm.auto`` bar; ``on_result`` is called with the
    results so far after each strategy (e.g. to save partial results).
    Returns the results in order.
    """
    names = [_check_strategy(s) for s in strategies]
    dev = torch.device(device)
    if warm_up:
        warm_up_process(config, dev, seed,
                        prompts=tuple(default_prompts(config, decode_steps) if prompts is None else prompts),
                        **engine_kwargs)
    it: Iterable[str] = names
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(names, desc=f"strategies on {dev}", unit="strategy")
        it = bar
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkspaceFallbackWarning)
        for name in it:
            if bar is not None:
                bar.set_postfix_str(name)
            out.append(run_strategy(config, name, device=dev, prompts=prompts, decode_steps=decode_steps,
                                    seed=seed, **engine_kwargs))
            if on_result is not None:
                on_result(list(out))
    return out


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "dies"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def fmt_bytes(n: int) -> str:
    """Bytes for people: ``'64.00 MiB'``, ``'1.75 KiB'``, ``'512 B'`` (binary units)."""
    if n >= MiB // 10:
        return f"{n / MiB:.2f} MiB"
    if n >= 1024:
        return f"{n / 1024:.2f} KiB"
    return f"{n} B"


def strategy_table(results: Sequence[StrategyResult]) -> list[dict[str, str]]:
    """One row per strategy with the columns of the comparison table, as display strings.

    Prompt columns are named after the first two prompts' token counts.
    """
    rows = []
    for r in results:
        row = {
            "strategy": r.strategy,
            "seed fix": STRATEGY_INFO[r.strategy]["seed_fix"],
            "start-up": _fmt_s(r.startup_s),
            "reserved": fmt_bytes(r.reserved_bytes),
            ("peak (cuda max allocated)" if r.peak_source != "computed" else "peak (computed)"): fmt_bytes(r.peak_bytes),
        }
        for p in r.prompts[:2]:
            tag = f"{p.prompt_tokens}-token"
            row[f"TTFT {tag}"] = _fmt_s(p.ttft_s) if p.ttft_s is not None else "dies"
            row[f"decode step {tag}"] = _fmt_s(p.decode_step_s) if p.survived else "dies"
        row["survives max_model_len"] = "yes" if r.survives_max_model_len else "no"
        row["graph-safe"] = "yes" if r.graph_safe else "no"
        extra = []
        if r.recaptures:
            extra.append(f"{r.recaptures} re-captures")
        if r.fallback_calls:
            extra.append(f"{r.fallback_calls} fallback calls")
        if r.engines_built > 1:
            extra.append(f"{r.engines_built} engines built")
        row["notes"] = ", ".join(extra)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of equal keys as a Markdown table (what the notebook displays)."""
    if not rows:
        return ""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Chart helpers: bytes against the configuration                              #
# --------------------------------------------------------------------------- #


def longest_surviving_prompt(config: EngineConfig, locked_bytes: int | None = None) -> int:
    """Longest prompt (tokens) that prefills alone without outgrowing ``locked_bytes`` (default: unfixed).

    ``first_failing_prompt - 1``, or ``max_model_len - 1`` (the longest prompt
    there is) when nothing fails.
    """
    lb = unfixed_locked_bytes(config) if locked_bytes is None else locked_bytes
    ff = first_failing_prompt(config, lb)
    return config.max_model_len - 1 if ff is None else min(ff - 1, config.max_model_len - 1)


def kv_bytes_for_max_model_len(config: EngineConfig) -> int:
    """KV-cache bytes of one ``max_model_len`` sequence on one rank, all layers, in the cache dtype.

    vLLM refuses to start if the KV cache cannot hold one such sequence, so
    this is the smallest KV cache a deployment can have.
    """
    from .attention import make_kv_cache_format

    return make_kv_cache_format(config).bytes_per_token() * config.num_hidden_layers * config.max_model_len


def workspace_vs_max_model_len(config: EngineConfig, lengths: Iterable[int]) -> list[dict[str, Any]]:
    """For each ``max_model_len``: reserved workspace bytes (all slots), unfixed locked bytes, KV bytes, share.

    Rows: ``max_model_len``, ``reserved_bytes`` (PR #44053's plan, every ubatch
    slot), ``unfixed_bytes``, ``kv_bytes`` (:func:`kv_bytes_for_max_model_len`),
    ``share`` = reserved / kv. Pure arithmetic.
    """
    rows = []
    for n in lengths:
        n = int(n)
        c = config.replace(max_model_len=n)
        if not config.enable_chunked_prefill:  # then the step budget must hold a whole prompt
            c = c.replace(max_num_batched_tokens=max(n, config.max_num_batched_tokens))
        reserved = plan_bytes(reservation_plan(c)) * c.num_ubatches
        kv = kv_bytes_for_max_model_len(c)
        rows.append(dict(max_model_len=int(n), reserved_bytes=reserved,
                         unfixed_bytes=unfixed_locked_bytes(c) * c.num_ubatches, kv_bytes=kv, share=reserved / kv))
    return rows


def threshold_sweep(config: EngineConfig, param: str, values: Iterable[int], *, progress: bool = True) -> list[dict[str, Any]]:
    """The bug report's threshold sweep, rebuilt: longest prompt that survives without the fix.

    Args:
        config: the base deployment.
        param: ``"max_num_batched_tokens"``, ``"max_num_seqs"`` or ``"tensor_parallel_size"``.
        values: the values to try (invalid combinations are skipped, e.g.
            ``max_num_seqs > max_num_batched_tokens``).

    Returns rows ``{param: v, "locked_bytes", "longest_prompt", "first_failing"}``
    (exact, from :func:`tqlab.reservation.first_failing_prompt`).
    """
    if param not in ("max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size"):
        raise ValueError(f"param must be max_num_batched_tokens, max_num_seqs or tensor_parallel_size, got {param!r}")
    vals = list(values)
    it: Iterable[int] = vals
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(vals, desc=f"sweep {param}", unit="value")
    rows = []
    for v in it:
        try:
            c = config.replace(**{param: int(v)})
        except ValueError:
            continue
        lb = unfixed_locked_bytes(c)
        ff = first_failing_prompt(c, lb)
        rows.append({param: int(v), "locked_bytes": lb, "longest_prompt": longest_surviving_prompt(c, lb),
                     "first_failing": ff})
    return rows


# --------------------------------------------------------------------------- #
# Chart helpers: lifecycle timeline                                           #
# --------------------------------------------------------------------------- #


def workspace_timeline(engine: LLMEngine) -> list[dict[str, Any]]:
    """The workspace event log as rows, each tagged with the lifecycle phase it happened in.

    Rows: ``index``, ``t`` (seconds since the engine started), ``kind``,
    ``caller``, ``ubatch``, ``old_bytes``, ``new_bytes``, ``live_bytes``,
    ``phase``: the start-up phase (``init_workspace``, ``build_backend``,
    ``profile_run``, ``after_profile``, ``capture``, ``lock``, ...) during which
    it happened, or ``"serve"`` after start-up. Needs an engine from
    :func:`make_engine` (it records the phase end times); raises
    ``ValueError`` otherwise.
    """
    marks = getattr(engine, "phase_marks", None)
    if not marks:
        raise ValueError("workspace_timeline needs an engine built by tqlab.strategies.make_engine (phase_marks)")
    t0 = marks[0][1]
    ends = marks[1:]
    rows = []
    for i, ev in enumerate(engine.workspace.events):
        phase = next((name for name, t_end in ends if ev.t <= t_end), "serve")
        rows.append(dict(index=i, t=ev.t - t0, kind=ev.kind, caller=ev.caller, ubatch=ev.ubatch,
                         old_bytes=ev.old_bytes, new_bytes=ev.new_bytes, live_bytes=ev.live_bytes, phase=phase))
    return rows


# --------------------------------------------------------------------------- #
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

    Chunks come from :func:`tqlab.reservation.prompt_chunks`, each chunk's call
    from :func:`~tqlab.reservation.chunk_workspace_request` (the backend's own
    path choice), decode steps use one decode row.
    """
    if prompt_tokens < 1 or prompt_tokens + decode_steps > config.max_model_len:
        raise ValueError(f"prompt_tokens {prompt_tokens} + decode_steps {decode_steps} must fit in max_model_len "
                         f"{config.max_model_len}")
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else prompt_tokens
    calls: list[TraceCall] = []
    step = 0
    for cached, q in prompt_chunks(prompt_tokens, budget):
        req = chunk_workspace_request(config, cached, q)
        if req.shapes is not None:
            for _ in range(config.num_hidden_layers):
                calls.append(TraceCall(step, req.path, req.shapes, q))
        step += 1
    dec = decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim,
                                  config.tq_max_kv_splits_for_cuda_graph, config.dtype)
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
        and frees them when the next layer starts (what consumers did before
        the workspace manager).

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
    hidden = config.num_heads_per_rank * config.head_dim
    best: list[float] | None = None
    mem_alloc: list[int] = []
    mem_res: list[int] = []
    stats: dict[str, Any] = {}
    for rep in range(max(1, repeats)):
        _free(dev)
        base_alloc = base_res = 0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
            s0 = torch.cuda.memory_stats(dev)
            base_alloc, base_res = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
        ws = None
        if mode == "workspace":
            ws = WorkspaceManager(dev)
            reserve_workspace(config, ws)
            ws.lock()
        times: list[float] = []
        alloc_after: list[int] = []
        res_after: list[int] = []
        held: list[torch.Tensor] | None = []
        views = None
        act = None
        cur_step = -1
        for call in trace:
            if call.step != cur_step:
                if dev.type == "cuda" and cur_step >= 0:
                    torch.cuda.synchronize(dev)
                    alloc_after.append(torch.cuda.memory_allocated(dev) - base_alloc)
                    res_after.append(torch.cuda.memory_reserved(dev) - base_res)
                cur_step = call.step
                act = None
                act = torch.empty((call.activation_tokens, hidden), dtype=config.dtype, device=dev)
            held = []  # the previous layer's buffers die here
            t = time.perf_counter()
            if ws is not None:
                views = ws.get_simultaneous(*call.shapes)
            else:
                views = [torch.empty(s, dtype=d, device=dev) for s, d in call.shapes]
            times.append(time.perf_counter() - t)
            held = views
        held = act = None  # the request is over; the workspace (if any) and the last views stay
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            alloc_after.append(torch.cuda.memory_allocated(dev) - base_alloc)
            res_after.append(torch.cuda.memory_reserved(dev) - base_res)
            s1 = torch.cuda.memory_stats(dev)
            stats = dict(
                base_allocated=int(base_alloc),
                base_reserved=int(base_res),
                peak_allocated=int(torch.cuda.max_memory_allocated(dev) - base_alloc),
                peak_reserved=int(torch.cuda.max_memory_reserved(dev) - base_res),
                num_alloc_retries=int(s1.get("num_alloc_retries", 0) - s0.get("num_alloc_retries", 0)),
                num_device_alloc=int(s1.get("num_device_alloc", 0) - s0.get("num_device_alloc", 0)),
            )
            mem_alloc, mem_res = alloc_after, res_after
        best = times if best is None else [min(a, b) for a, b in zip(best, times)]
        views = ws = None  # nothing of this repeat may survive into the next one's baseline
    out: dict[str, Any] = dict(
        mode=mode,
        device=str(dev),
        per_call_us=[x * 1e6 for x in (best or [])],
        kinds=[c.kind for c in trace],
        steps=[c.step for c in trace],
    )
    if dev.type == "cuda":
        out.update(allocated=mem_alloc, reserved=mem_res, **stats)
    return out


# --------------------------------------------------------------------------- #
# Chart helpers: growth by resize_ vs free-then-allocate                      #
# --------------------------------------------------------------------------- #


def growth_peak(sizes: Sequence[int], method: str, *, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Grow one buffer through ``sizes`` (bytes, increasing) and report the peak memory.

    Methods:
        ``"resize_"``: ``buf.resize_(n)`` on a ``uint8`` tensor (torch allocates
        the new storage, copies, then frees the old one);
        ``"free_then_allocate"``: :class:`~tqlab.workspace.WorkspaceManager` as vLLM grows it;
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
    _free(dev)
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
    _free(dev)
    return out


# --------------------------------------------------------------------------- #
# Chart helpers: DBO slot growth policies                                     #
# --------------------------------------------------------------------------- #


def dbo_memory_held(config: EngineConfig, prompt_tokens: int, *, grow_all_slots: bool,
                    device: str | torch.device = "meta", decode_rows: int | None = None) -> dict[str, Any]:
    """Workspace bytes held with two DBO ubatch slots while one long prompt prefills next to decodes.

    The workload, step by step: ubatch 0 runs the prompt's next prefill chunk
    (its workspace call from :func:`~tqlab.reservation.chunk_workspace_request`),
    ubatch 1 runs ``decode_rows`` decode rows (default ``max_num_seqs - 1``).
    The manager is unlocked and grows lazily; ``grow_all_slots=True`` resizes
    every slot to each new high-water mark (as seed 002 describes), False only
    the requesting slot (vLLM today). ``meta`` needs no memory.

    Returns ``{"grow_all_slots", "held_bytes" (per step, all slots), "slot_bytes"
    (final, per slot), "final_bytes", "peak_bytes"}``.
    """
    rows = max(1, config.max_num_seqs - 1) if decode_rows is None else int(decode_rows)
    m = WorkspaceManager(device, 2, grow_all_slots=grow_all_slots)
    dec = decode_workspace_shapes(rows, config.num_heads_per_rank, config.head_dim,
                                  config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    budget = config.max_num_batched_tokens - rows
    if budget < 1:
        raise ValueError(f"max_num_batched_tokens {config.max_num_batched_tokens} leaves no room next to {rows} decodes")
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
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else prompt_tokens
    for cached, q in prompt_chunks(prompt_tokens, budget):
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


def results_payload(config: EngineConfig, results: Sequence[StrategyResult], *, prompts: Sequence[int],
                    decode_steps: int, preset: str | None = None, overrides: dict | None = None) -> dict[str, Any]:
    """The JSON object stored as ``data/strategies_<tag>.json`` (without provenance): inputs, results, table."""
    return dict(
        preset=preset or config.preset,
        overrides=dict(overrides or {}),
        config=config.to_dict(),
        prompts=list(prompts),
        decode_steps=decode_steps,
        strategies=[r.to_dict() for r in results],
        table=strategy_table(results),
    )


def results_from_payload(payload: dict[str, Any]) -> list[StrategyResult]:
    """The :class:`StrategyResult` list back from :func:`results_payload`'s object (or a loaded recording)."""
    return [StrategyResult.from_dict(d) for d in payload["strategies"]]


# --------------------------------------------------------------------------- #
# Figures (matplotlib imported lazily)                                        #
# --------------------------------------------------------------------------- #

_COLORS = {"none": "#c53030", "dummy_run": "#d69e2e", "reserve": "#2f855a", "replay_aware": "#2b6cb0",
           "fallback": "#6b46c1", "grow_no_recapture": "#718096"}


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_strategy_comparison(results: Sequence[StrategyResult], *, title: str | None = None):
    """The comparison as one figure: start-up, memory, time to first token, decode step. Returns the Figure.

    Each x tick names the strategy and whether it survives a ``max_model_len``
    request and stays graph-safe; a request the engine died on is a red cross.
    """
    import matplotlib.pyplot as plt

    names = [r.strategy for r in results]
    x = list(range(len(results)))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    ticks = [f"{r.strategy}\n{'survives' if r.survives_max_model_len else 'DIES'} · "
             f"{'graph-safe' if r.graph_safe else 'NOT graph-safe'}" for r in results]
    cols = [_COLORS.get(n, "#4a5568") for n in names]
    ax = axes[0]
    ax.bar(x, [r.startup_s for r in results], color=cols)
    ax.set_ylabel("start-up (s)")
    ax.set_title("start-up time", loc="left", fontsize=10)
    ax = axes[1]
    w = 0.38
    floor = 1e-3  # MiB; keeps a zero-byte bar drawable on the log axis
    ax.bar([i - w / 2 for i in x], [max(r.reserved_bytes / MiB, floor) for r in results], w, color=cols,
           label="reserved at lock")
    ax.bar([i + w / 2 for i in x], [max(r.peak_bytes / MiB, floor) for r in results], w, color=cols, alpha=0.45,
           hatch="//",
           label=("peak: torch.cuda.max_memory_allocated" if results and results[0].peak_source != "computed"
                  else "peak: computed workspace (+ fallback) bytes"))
    ax.set_ylabel("MiB")
    ax.set_yscale("log")
    lows = [max(v / MiB, floor) for r in results for v in (r.reserved_bytes, r.peak_bytes)]
    if lows:
        ax.set_ylim(bottom=min(lows) / 2)
    ax.set_title("workspace memory", loc="left", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    nprompts = max((len(r.prompts) for r in results), default=0)
    for k, (ax, attr, label) in enumerate(((axes[2], "ttft_s", "time to first token (s)"),
                                           (axes[3], "decode_step_s", "decode step (ms)"))):
        scale = 1.0 if attr == "ttft_s" else 1e3
        width = 0.8 / max(1, nprompts)
        for j in range(nprompts):
            xs = [i - 0.4 + width * (j + 0.5) for i in x]
            def died(p):  # no value because the engine died before it (TTFT counts until the first token)
                return p is not None and getattr(p, attr) is None and (attr == "ttft_s" or not p.survived)

            vals = []
            for r in results:
                p = r.prompts[j] if j < len(r.prompts) else None
                v = None if p is None else getattr(p, attr)
                vals.append(v * scale if v is not None and (attr == "ttft_s" or p.survived) else 0.0)
            tag = f"{results[0].prompts[j].prompt_tokens}-token prompt" if results[0].prompts[j:] else ""
            ax.bar(xs, vals, width, color=cols, alpha=1.0 if j == 0 else 0.5, edgecolor="black", linewidth=0.3,
                   label=tag)
            for xi, r in zip(xs, results):
                p = r.prompts[j] if j < len(r.prompts) else None
                if died(p) or (p is not None and attr != "ttft_s" and not p.survived):
                    ax.plot([xi], [0], marker="X", color="#c53030", markersize=10, linestyle="none")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0] + " (✗ = engine died; light = long prompt)", loc="left", fontsize=10)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(ticks, fontsize=7, rotation=30, ha="right")
        _style(ax)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def plot_workspace_vs_len(rows_by_preset: dict[str, list[dict[str, Any]]]):
    """Two panels: reserved workspace (MiB) and its share of one ``max_model_len`` sequence's KV cache, vs ``max_model_len``."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2))
    for name, rows in rows_by_preset.items():
        xs = [r["max_model_len"] for r in rows]
        a.plot(xs, [r["reserved_bytes"] / MiB for r in rows], marker="o", label=name)
        b.plot(xs, [100 * r["share"] for r in rows], marker="o", label=name)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_model_len (tokens)")
        _style(ax)
    a.set_yscale("log", base=2)
    a.set_ylabel("reserved workspace per GPU (MiB)")
    a.set_title("PR #44053's reservation (all ubatch slots)", loc="left", fontsize=10)
    b.set_ylabel("% of the KV cache of one max_model_len sequence")
    b.set_title("workspace as a share of the smallest KV cache vLLM accepts", loc="left", fontsize=10)
    a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_threshold_sweep(sweeps: dict[str, list[dict[str, Any]]], config: EngineConfig):
    """One panel per swept parameter: the longest prompt the unfixed engine survives; the deployment's value marked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4))
    axes = [axes] if len(sweeps) == 1 else list(axes)
    for ax, (param, rows) in zip(axes, sweeps.items()):
        xs = [r[param] for r in rows]
        ys = [r["longest_prompt"] for r in rows]
        ax.plot(xs, ys, marker="o", color="#c53030", label="longest surviving prompt (no fix)")
        ax.axhline(config.max_model_len, color="#2f855a", linestyle="--", label=f"max_model_len {config.max_model_len}")
        here = getattr(config, param)
        if here in xs:
            ax.plot([here], [ys[xs.index(here)]], marker="*", markersize=14, color="black", linestyle="none",
                    label=f"this deployment ({param}={here})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel(param)
        ax.set_ylabel("prompt tokens")
        _style(ax)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_trace(exp: dict[str, Any], *, recorded_note: str = ""):
    """Per-call latency of both modes along the trace; with CUDA data, reserved vs allocated bytes per step."""
    import matplotlib.pyplot as plt

    tr = exp["trace"]
    has_mem = all("reserved" in v for v in tr.values())
    fig, axes = plt.subplots(1, 2 if has_mem else 1, figsize=(15 if has_mem else 8, 4))
    axes = list(axes) if has_mem else [axes]
    ax = axes[0]
    for mode, color in (("torch_empty", "#c53030"), ("workspace", "#2f855a")):
        v = tr[mode]
        ax.plot(range(len(v["per_call_us"])), v["per_call_us"], ".", markersize=3, color=color,
                label=f"{mode} (median {statistics.median(v['per_call_us']):.1f} µs)")
    ax.set_yscale("log")
    ax.set_xlabel("workspace call of the request (prefill chunks x layers, then decode steps x layers)")
    ax.set_ylabel("host µs per call")
    ax.set_title(f"per-call latency, {exp['prompt_tokens']}-token request on {exp['device']}{recorded_note}",
                 loc="left", fontsize=10)
    ax.legend(fontsize=8)
    _style(ax)
    if has_mem:
        ax = axes[1]
        for mode, color in (("torch_empty", "#c53030"), ("workspace", "#2f855a")):
            v = tr[mode]
            ax.plot([b / MiB for b in v["reserved"]], color=color, label=f"{mode}: memory_reserved")
            ax.plot([b / MiB for b in v["allocated"]], color=color, linestyle=":", label=f"{mode}: memory_allocated")
        ax.set_xlabel("engine step of the request")
        ax.set_ylabel("MiB")
        ax.set_title("caching allocator after each step (above what the process held before)", loc="left", fontsize=10)
        ax.legend(fontsize=7)
        _style(ax)
    fig.tight_layout()
    return fig


def plot_growth(growth: dict[str, dict[str, Any]], *, title: str = ""):
    """Bars: final size and peak memory of each growth method (MiB)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    methods = list(growth)
    x = range(len(methods))
    ax.bar([i - 0.2 for i in x], [growth[m]["final_bytes"] / MiB for m in methods], 0.4, color="#a0aec0",
           label="final buffer")
    ax.bar([i + 0.2 for i in x], [growth[m]["peak_bytes"] / MiB for m in methods], 0.4, color="#2b6cb0",
           label=f"peak ({growth[methods[0]]['peak_source']})")
    if all("peak_reserved_bytes" in growth[m] for m in methods):
        ax.plot([i + 0.2 for i in x], [growth[m]["peak_reserved_bytes"] / MiB for m in methods], "D", color="#c53030",
                label="peak memory_reserved")
    ax.set_xticks(list(x))
    ax.set_xticklabels(methods)
    ax.set_ylabel("MiB")
    ax.set_title(title or "growth: peak memory", loc="left", fontsize=10)
    ax.legend(fontsize=8)
    _style(ax)
    fig.tight_layout()
    return fig


def plot_dbo(grow_all: dict[str, Any], grow_one: dict[str, Any]):
    """Workspace bytes held per step under the two DBO slot policies."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for d, color, label in ((grow_all, "#c53030", "resize all slots (seed 002)"),
                            (grow_one, "#2f855a", "resize the requesting slot (vLLM today)")):
        ax.step(range(1, len(d["held_bytes"]) + 1), [b / MiB for b in d["held_bytes"]], where="post", color=color,
                label=f"{label}: {d['final_bytes'] / MiB:.2f} MiB held at the end")
    ax.set_xlabel("engine step (ubatch 0: next prefill chunk; ubatch 1: decodes)")
    ax.set_ylabel("workspace held, both slots (MiB)")
    ax.legend(fontsize=8)
    _style(ax)
    fig.tight_layout()
    return fig


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
    dec = decode_workspace_shapes(b, h, d, c.tq_max_kv_splits_for_cuda_graph, c.dtype)
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
            m._layouts.clear()  # the caches are emptied on purpose: a never-seen signature
            m._views.clear()
            return m.get_simultaneous(*r)

        def empty(r=r):
            return [torch.empty(s, dtype=d, device=dev) for s, d in r]

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
