"""The bug report's four fixes for a locked workspace, each an option of :func:`make_strategy_engine`.

================  ==============================================================
``none``          the unfixed baseline (vLLM 0.20): lock whatever capture touched
``dummy_run``     fix 1: a long-context dummy run at start-up, before capture
                  (``LLMEngine(after_profile=long_context_dummy_run)``)
``reserve``       fix 2: static worst-case reservation in the metadata builder,
                  ``_reserve_workspace`` (vLLM PR #44053, merged)
``replay_aware``  fix 3: a request that does not fit unlocks, grows, re-captures
                  every captured decode bucket, and locks again
``fallback``      fix 4: the call that does not fit gets ``torch.empty`` buffers
================  ==============================================================

plus ``grow_no_recapture``, a negative control (grows without re-capturing).

The fixes exist to keep TurboQuant's workspace consumers alive, so a strategy engine always has
them: a config with an unquantized ``auto`` cache (the CPU-cheap stand-in the lectures use) runs
with the named teaching variant ``turboquant_backend_on_unquantized`` (:func:`strategy_config`).
No real-deployment answer (``plan``, ``inspect-vllm``, ``repro``) uses that variant: in vLLM 0.33 an
``auto`` cache has no TurboQuant consumer.
Fixes 3 and 4 are workspace clients given to the backend with
:class:`tqlab.engine.workspace_client.set_workspace`.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from tqlab.core.config import EngineConfig
from tqlab.core.dtypes import as_torch
from tqlab.engine import LLMEngine
from tqlab.engine.workspace_client import set_workspace
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, chunk_workspace_request
from tqlab.core.workspace import (
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    rewarm_workspace,
    ubatch_context,
    workspace_wrapper,
)

__all__ = [
    "ALL_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_INFO",
    "FallbackWorkspace",
    "ReplayAwareWorkspace",
    "WorkspaceFallbackWarning",
    "captured_graphs_valid",
    "check_strategy",
    "dummy_run_chunks",
    "long_context_dummy_run",
    "make_strategy_engine",
    "strategy_config",
    "sync_device",
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
        "how": "TurboQuantMetadataBuilder._reserve_workspace() sizes the slot it runs in (slot 0) from the config "
        "before capture",
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


def check_strategy(strategy: object) -> str:
    """``strategy`` if it names one of :data:`ALL_STRATEGIES`; else ``ValueError``."""
    if not isinstance(strategy, str) or strategy not in ALL_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(ALL_STRATEGIES)}")
    return strategy


def sync_device(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); a no-op elsewhere. Host timings need it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- #
# Fix 4: per-call fallback                                                    #
# --------------------------------------------------------------------------- #


class WorkspaceFallbackWarning(RuntimeWarning):
    """A locked workspace was too small; the call's buffers were allocated with ``torch.empty`` instead."""


class FallbackWorkspace:
    """Workspace client for fix 4: serve what fits from the manager, ``torch.empty`` the rest.

    ``get_simultaneous`` first asks the manager. If it raises
    :class:`~tqlab.core.workspace.WorkspaceLockedError`, the call's tensors are
    allocated one by one with ``torch.empty(shape, dtype=dtype, device=...)``
    (freed when the consumer drops them), and a :class:`WorkspaceFallbackWarning`
    is issued the first time only. The manager stays locked and unchanged (it
    records a ``"violation"`` event per miss).

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
            out = [torch.empty(s, dtype=as_torch(d), device=dev) for s, d in zip(lay.shapes, lay.dtypes)]
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



# --------------------------------------------------------------------------- #
# Fix 3: replay-aware lock (and the negative control)                         #
# --------------------------------------------------------------------------- #


class ReplayAwareWorkspace:
    """Workspace client for fix 3: late growth followed by re-capture of every captured graph.

    On :class:`~tqlab.core.workspace.WorkspaceLockedError` (outside a CUDA stream
    capture) it runs, inside :func:`tqlab.core.workspace.rewarm_workspace` (which
    re-locks even if something raises):

    1. grow the requesting slot to ``max(required, growth_factor * current)`` bytes;
    2. re-capture every decode bucket the engine captured
       (``engine.runner.capture_model(sizes)``, i.e. ``decode_runner.capture`` per
       bucket, in ubatch slot 0 as at start-up; a capture puts its recorder in
       front of this client and removes it afterwards), and store the new
       records in ``engine.captures``;
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
                    with ubatch_context(0):
                        self.engine.captures = self.engine.runner.capture_model(sizes)
                    self.recaptures += 1
                    self.recaptured_graphs += len(sizes)
            sync_device(m.device)
            self.regrowths.append(
                dict(old_bytes=err.current_bytes, new_bytes=target, seconds=time.perf_counter() - t0, caller=caller)
            )
            return m.get_simultaneous(*shapes_and_dtypes)



# --------------------------------------------------------------------------- #
# Fix 1: long-context dummy run                                               #
# --------------------------------------------------------------------------- #


def dummy_run_chunks(config: EngineConfig) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` of the dummy steps the long-context dummy run executes.

    One step per continuation path that asks the workspace for memory, each at
    the largest request it can make (the path and its call come from
    :func:`tqlab.core.reservation.chunk_workspace_request`, as in the backend):

    * the dequant path (``q_len > 128``): ``q_len = 129`` new tokens after
      ``cached_len = max_model_len - 1 - 129`` cached ones — the longest cached
      prefix a continuation chunk of a request of at most ``max_model_len``
      tokens (one of them generated) can have;
    * the decode-kernel path (``q_len <= 128``), only if it makes a workspace
      call: ``q_len = min(128, max_num_batched_tokens)`` rows after one cached
      block (its request does not depend on ``cached_len``). As in vLLM 0.33
      it makes none, so this step is normally absent.

    Without chunked prefill the list is empty: only a prefix-cache hit makes a
    continuation chunk then, and this strategy, like PR #44053, does not cover it. For the bug report's deployment
    (``max_model_len`` 131072): ``[(130942, 129)]``.
    """
    if not config.enable_chunked_prefill:
        return []
    top = config.max_model_len - 1  # longest prompt: one token is generated
    m = config.chunk_budget
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
    sync_device(engine.device)


# --------------------------------------------------------------------------- #
# The engine factory                                                          #
# --------------------------------------------------------------------------- #


def strategy_config(config: EngineConfig) -> EngineConfig:
    """The config a strategy engine runs: ``config``, or for an ``auto`` cache without TurboQuant's consumers
    the teaching variant ``turboquant_backend_on_unquantized=True`` (TurboQuant's backend on the unquantized
    cache; see the module docstring). Other caches are returned as they are."""
    if config.has_turboquant_consumers or config.kv_cache_dtype != "auto":
        return config
    return config.replace(turboquant_backend_on_unquantized=True)


def make_strategy_engine(config: EngineConfig, strategy: str = "reserve", *, device: str | torch.device = "cpu",
                         **engine_kwargs: Any) -> LLMEngine:
    """An :class:`~tqlab.engine.LLMEngine` hardened (or not) by ``strategy``.

    Args:
        config: the deployment (run as :func:`strategy_config` of it).
        strategy: one of :data:`ALL_STRATEGIES` (see the module docstring).
        device: ``"cpu"``, ``"cuda"`` or ``"meta"``.
        **engine_kwargs: passed to ``LLMEngine`` (``seed``, ``kv_cache_tokens``,
            ``on_phase``, ``use_cuda_graphs``, ...); ``fix`` and
            ``after_profile`` are set by the strategy and may not be given.

    Returns:
        The engine, locked and ready, with ``engine.strategy`` (the name),
        ``engine.strategy_state`` (the workspace client given to the backend for
        ``replay_aware``, ``fallback`` and ``grow_no_recapture``, else None) and
        ``engine.phase_marks`` (``(phase name, time.monotonic() at its end)``,
        led by ``("start", t)``; the clock of the workspace events).

    Raises:
        ValueError: unknown strategy, or ``fix``/``after_profile`` passed.
    """
    check_strategy(strategy)
    for k in ("fix", "after_profile"):
        if k in engine_kwargs:
            raise ValueError(f"{k}= is chosen by the strategy ({strategy!r}); do not pass it to make_strategy_engine")
    fix = strategy == "reserve"
    after_profile = long_context_dummy_run if strategy == "dummy_run" else None
    marks: list[tuple[str, float]] = []
    user_on_phase = engine_kwargs.pop("on_phase", None)

    def on_phase(rec) -> None:
        marks.append((rec.name, time.monotonic()))  # the clock of WorkspaceEvent.t
        if user_on_phase is not None:
            user_on_phase(rec)

    t_start = time.monotonic()
    engine = LLMEngine(strategy_config(config), fix=fix, device=device, after_profile=after_profile, on_phase=on_phase,
                       **engine_kwargs)
    engine.phase_marks = [("start", t_start)] + marks
    state: Any = None
    if strategy == "fallback":
        state = FallbackWorkspace(engine.workspace)
    elif strategy in ("replay_aware", "grow_no_recapture"):
        state = ReplayAwareWorkspace(engine, recapture=strategy == "replay_aware")
    if state is not None:
        set_workspace(engine.backend, state)  # for the engine's life
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
    ``tqlab.engine.replay_guard``): if the allocator happens to hand the grown buffer
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


