"""Measuring the fixes: one strategy end to end, the comparison, and the sweeps notebook 06 charts.

:func:`run_strategy` / :func:`compare_strategies` build an engine per strategy
and serve prompts (start-up time, reserved and peak bytes, time to first
token, decode step, survival of a ``max_model_len`` request, graph safety);
:func:`workspace_vs_max_model_len` and :func:`threshold_sweep` are arithmetic
on :mod:`tqlab.predict.analysis`; :func:`workspace_timeline` tags the workspace events
with the start-up phase they happened in. Runs on ``cpu``, ``meta`` and ``cuda``.
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

from tqlab.predict.analysis import first_failing_prompt, unfixed_locked_bytes
from tqlab.predict.kv_pool import kv_bytes_per_token
from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, plan_bytes, reservation_plan
from tqlab.core.workspace import WorkspaceLockedError
from tqlab.strategies.fixes import (
    STRATEGIES,
    FallbackWorkspace,
    ReplayAwareWorkspace,
    WorkspaceFallbackWarning,
    captured_graphs_valid,
    check_strategy,
    make_strategy_engine,
    strategy_config,
    sync_device,
)

__all__ = [
    "PromptResult",
    "StrategyResult",
    "compare_strategies",
    "default_prompts",
    "free_memory",
    "longest_surviving_prompt",
    "results_from_payload",
    "run_strategy",
    "threshold_sweep",
    "warm_up_process",
    "workspace_timeline",
    "workspace_vs_max_model_len",
]


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
        sync_device(dev)
        t0 = time.perf_counter()
        rid = engine.add_request(prompt_tokens, max_tokens=max_tokens)
        out = engine.outputs[rid]
        while not out.output_token_ids:
            engine.step()
        sync_device(dev)
        res.ttft_s = time.perf_counter() - t0
        steps = []
        while not out.finished:
            t = time.perf_counter()
            engine.step()
            sync_device(dev)
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


def free_memory(device: torch.device) -> None:
    """Collect garbage and, on CUDA, return cached blocks, so the next measurement starts from a clean baseline."""
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
        config, strategy: the deployment; one of :data:`ALL_STRATEGIES`.
        device: ``cpu``, ``cuda`` or ``meta`` (meta: bytes, survival and graph
            safety are exact; seconds are Python overhead, not compute).
        prompts: prompt lengths in tokens, served in turn on one engine (default
            :func:`default_prompts`), each generating ``1 + decode_steps`` tokens;
            after the engine dies, the next prompt gets a fresh one.
        decode_steps: decode-only steps timed after the first token.

    Returns a :class:`StrategyResult`; its ``survives_max_model_len`` is False
    unless a prompt that fills ``max_model_len`` was served and survived.
    """
    check_strategy(strategy)
    config = strategy_config(config)
    dev = torch.device(device)
    prompts = tuple(default_prompts(config, decode_steps) if prompts is None else prompts)
    free_memory(dev)
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    build = lambda: make_strategy_engine(config, strategy, device=dev, seed=seed, **engine_kwargs)  # noqa: E731
    engine, start, results, tally = _build_and_serve(build, prompts, decode_steps)
    final_ws = engine.workspace.live_bytes()
    sync_device(dev)
    if dev.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(dev) - base, "torch.cuda.max_memory_allocated"
    else:
        peak, source = tally["computed_peak"], "computed"
    full = [r for r in results if r.prompt_tokens + r.max_tokens == config.max_model_len]
    res = StrategyResult(
        strategy=strategy, device=str(dev), config=config.to_dict(), startup_s=start["startup_s"],
        reserved_bytes=start["reserved_bytes"], final_workspace_bytes=final_ws, peak_bytes=int(peak),
        peak_source=source, computed_peak_bytes=int(tally["computed_peak"]),
        kv_cache_bytes=int(start["kv_cache_bytes"]), prompts=results,
        survives_max_model_len=bool(full) and all(r.survived for r in full), graph_safe=tally["graph_safe"],
        cuda_graphs=start["cuda_graphs"], startup_phases=start["startup_phases"], engines_built=tally["engines"],
        recaptures=tally["recaptures"], fallback_calls=tally["fallbacks"],
        notes="meta device: seconds are Python overhead only" if dev.type == "meta" else "",
    )
    del engine
    free_memory(dev)
    return res


def _build_and_serve(build: Callable[[], LLMEngine], prompts: Sequence[int], decode_steps: int
                     ) -> tuple[LLMEngine, dict[str, Any], list[PromptResult], dict[str, Any]]:
    """Build an engine (timed), then serve ``prompts`` in turn; a dead engine is replaced by ``build()``.

    Only this function holds the engines, so a dead one is freed before its
    successor is built. Returns the last engine; the first one's start-up
    facts (``startup_s``, ``reserved_bytes``, ``startup_phases``,
    ``kv_cache_bytes``, ``cuda_graphs``); one :class:`PromptResult` per prompt;
    and tallies over every engine: ``graph_safe``, ``recaptures``,
    ``fallbacks``, ``engines``, ``computed_peak`` (bytes).
    """
    t0 = time.perf_counter()
    engine = build()
    sync_device(engine.device)
    start = dict(startup_s=time.perf_counter() - t0, reserved_bytes=engine.workspace.live_bytes(),
                 startup_phases=[dict(name=p.name, seconds=p.seconds, workspace_bytes=list(p.workspace_bytes),
                                      note=p.note) for p in engine.phases],
                 kv_cache_bytes=sum(c.numel() * c.element_size() for c in engine.runner.kv_caches),
                 cuda_graphs=getattr(engine.runner.decode_runner, "kind", "eager") != "eager")
    tally: dict[str, Any] = dict(graph_safe=True, recaptures=0, fallbacks=0, engines=1,
                                 computed_peak=_computed_peak(engine))

    def retire(e: LLMEngine) -> None:
        tally["graph_safe"] = tally["graph_safe"] and captured_graphs_valid(e)
        tally["recaptures"] += _state_counters(e)[1]
        tally["fallbacks"] += _state_counters(e)[0]

    results: list[PromptResult] = []
    for n in prompts:
        rebuilt = engine.dead is not None
        if rebuilt:
            retire(engine)
            dev = engine.device
            del engine
            free_memory(dev)
            engine = build()
            tally["engines"] += 1
        r = _serve_one(engine, n, decode_steps)
        r.engine_rebuilt = rebuilt
        results.append(r)
        tally["computed_peak"] = max(tally["computed_peak"], _computed_peak(engine))
    retire(engine)
    return engine, start, results, tally


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
        e = make_strategy_engine(config, "dummy_run", device=dev, seed=seed, **engine_kwargs)
        for n in prompts:
            e.generate(int(n), max_tokens=min(3, config.max_model_len - int(n)))
        del e
        free_memory(dev)
        return
    m = config.chunk_budget
    n = min(config.max_model_len - 4, m + CONTINUATION_DECODE_THRESHOLD + 8) if config.enable_chunked_prefill else 64
    e = make_strategy_engine(config, "reserve", device=dev, seed=seed, **engine_kwargs)
    e.generate(max(1, n), max_tokens=3)
    if config.enable_chunked_prefill and m + 64 < config.max_model_len - 3:
        e.generate(m + 64, max_tokens=2)
    del e
    free_memory(dev)


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
    names = [check_strategy(s) for s in strategies]
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


def workspace_vs_max_model_len(config: EngineConfig, lengths: Iterable[int]) -> list[dict[str, Any]]:
    """For each ``max_model_len``: reserved workspace bytes, unfixed locked bytes, KV bytes, share.

    Rows: ``max_model_len``, ``reserved_bytes`` (PR #44053's plan, in slot 0: with DBO vLLM's
    builder reserves only the slot it runs in, as :func:`~tqlab.core.reservation.reserve_workspace`),
    ``unfixed_bytes`` (every ubatch slot), ``kv_bytes`` (one ``max_model_len`` sequence's KV cache on
    one rank, all layers, vLLM 0.33's boundary layers in the model dtype:
    :func:`tqlab.predict.kv_pool.kv_bytes_per_token`; the smallest KV cache vLLM starts with), ``share`` =
    reserved / kv. Pure arithmetic.
    """
    rows = []
    for n in lengths:
        n = int(n)
        c = config.replace(max_model_len=n)
        if not config.enable_chunked_prefill:  # then the step budget must hold a whole prompt
            c = c.replace(max_num_batched_tokens=max(n, config.max_num_batched_tokens))
        reserved = plan_bytes(reservation_plan(c))
        kv = kv_bytes_per_token(c)[0] * c.max_model_len
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
    (exact, from :func:`tqlab.predict.analysis.first_failing_prompt`).
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
    :func:`~tqlab.strategies.fixes.make_strategy_engine` (it records the phase end times); raises
    ``ValueError`` otherwise.
    """
    marks = getattr(engine, "phase_marks", None)
    if not marks:
        raise ValueError("workspace_timeline needs an engine built by tqlab.strategies.make_strategy_engine (phase_marks)")
    t0 = marks[0][1]
    ends = marks[1:]
    rows = []
    for i, ev in enumerate(engine.workspace.events):
        phase = next((name for name, t_end in ends if ev.t <= t_end), "serve")
        rows.append(dict(index=i, t=ev.t - t0, kind=ev.kind, caller=ev.caller, ubatch=ev.ubatch,
                         old_bytes=ev.old_bytes, new_bytes=ev.new_bytes, live_bytes=ev.live_bytes, phase=phase))
    return rows



def results_from_payload(payload: dict[str, Any]) -> list[StrategyResult]:
    """The :class:`StrategyResult` list back from a ``data/strategies_<tag>.json`` object
    (:func:`tqlab.lab.strategy_tables.results_payload` writes it)."""
    return [StrategyResult.from_dict(d) for d in payload["strategies"]]
