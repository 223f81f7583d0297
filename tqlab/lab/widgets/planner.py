"""Reservation planner: what PR #44053's ``_reserve_workspace`` reserves for a config, and which prompt crashes without it.

:func:`plan_summary` / :func:`planner_figure` (static) and the widget
:func:`reservation_planner` (preset + sliders; callbacks :func:`planner_load_preset`,
:func:`refresh_planner`). Every number comes from :mod:`tqlab.predict.analysis` and
:mod:`tqlab.core.reservation` (the plan); nothing is recomputed here. Per
tensor-parallel rank; bytes unless MiB. Mirrors ``TurboQuantMetadataBuilder._reserve_workspace``
in ``vllm/v1/attention/backends/turboquant_attn.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tqlab.predict.analysis import (
    Prediction,
    decode_rows_at_lock,
    predict,
    prefill_chunks,
    workspace_bytes_for_prompt,
)
from tqlab.predict.kv_pool import KvPool, kv_pool
from tqlab.core.consumers.registry import TURBOQUANT
from tqlab.core.config import KV_CACHE_DTYPES, EngineConfig, list_presets, load_preset
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, plan_bytes, reservation_plan
from tqlab.core.workspace import compute_layout
from tqlab.lab.widgets._common import CRASH_COLOR, FIX_COLOR, NOFIX_COLOR, dtype_name, esc, figure_png, mib, new_figure, require_widgets

__all__ = [
    "PlannerResult",
    "ReservationPlanner",
    "need_curve",
    "plan_summary",
    "planner_figure",
    "planner_load_preset",
    "refresh_planner",
    "reservation_planner",
]

_CONSUMER_NAMES = (
    "split-KV decode scratch (max_num_seqs rows)",
    "continuation-prefill dequant K+V (max_model_len - 1 cached)",
)


@dataclass(frozen=True)
class PlannerResult:
    """What the reservation planner shows for one configuration (per rank; bytes unless MiB).

    ``consumers``: ``(name, shapes, bytes)`` per reservation call;
    ``reserved_bytes``: one ubatch slot after the fix (the largest call);
    ``slots``: ubatch slots (2 with DBO); ``kv``: the KV pool one GPU of the rank holds
    (:func:`tqlab.predict.kv_pool.kv_pool`: ``gpu_memory_utilization × memory − weights − activations``,
    vLLM's boundary layers in the model dtype), None when the preset records no weights;
    ``kv_cache_bytes``: its ``pool_bytes`` (0 when unknown); ``kv_share``: ``reserved_bytes * slots`` over it
    (None when unknown);
    ``prediction``: the one :class:`~tqlab.predict.analysis.Prediction` (without the fix) these come from;
    ``unfixed_locked_bytes``: its ``locked_bytes`` (None: never locked);
    ``first_failing_unfixed`` / ``first_failing_fixed``: shortest prompt (tokens)
    that crashes, or None when every prompt up to ``max_model_len`` survives.
    """

    config: EngineConfig
    consumers: tuple[tuple[str, Any, int], ...]
    reserved_bytes: int
    slots: int
    kv_cache_bytes: int
    kv_share: float | None
    unfixed_locked_bytes: int | None
    first_failing_unfixed: int | None
    first_failing_fixed: int | None
    prediction: Prediction | None = None
    kv: KvPool | None = None

    @property
    def longest_surviving_unfixed(self) -> int:
        """Longest prompt (tokens) that survives without the fix (``max_model_len - 1`` when all do)."""
        if self.first_failing_unfixed is None:
            return self.config.max_model_len - 1
        return self.first_failing_unfixed - 1


def plan_summary(config: EngineConfig) -> PlannerResult:
    """The planner's numbers for ``config`` (see :class:`PlannerResult`), each from :mod:`tqlab.predict.analysis`.

    Raises ``TypeError`` for anything but an ``EngineConfig``.
    """
    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
    plan = reservation_plan(config)
    consumers = tuple(
        (name, call, compute_layout(call).total_bytes) for name, call in zip(_CONSUMER_NAMES, plan)
    )
    reserved = plan_bytes(plan)
    try:
        kv = kv_pool(config)  # the one "share of the KV cache" (notebook 06 §2)
    except ValueError:  # a preset without weights, or weights over the GPU's budget: the share is unknown
        kv = None
    pred, with_fix = predict(config), predict(config, fix=True)  # the one Prediction, without and with the fix
    return PlannerResult(
        config=config,
        consumers=consumers,
        reserved_bytes=reserved,
        slots=config.num_ubatches,
        kv_cache_bytes=kv.pool_bytes if kv else 0,
        kv_share=kv.share if kv else None,
        unfixed_locked_bytes=pred.locked_bytes,  # None: start-up never locks (eager, cudagraph_mode NONE)
        first_failing_unfixed=pred.first_failing_prompt_tokens,
        first_failing_fixed=with_fix.first_failing_prompt_tokens,
        prediction=pred,
        kv=kv,
    )


def _share_html(r: PlannerResult) -> str:
    """The workspace's share of the KV pool, with what the pool is made of (or why it is unknown)."""
    k = r.kv
    if k is None:
        return "an unknown share of the KV cache (the preset records no weights, or they fill the GPU)"
    return (f"<b>{100 * k.share:.3f}%</b> of the KV pool one {k.gpu} holds ({k.pool_bytes / 2**30:,.1f} GiB = "
            f"{k.utilization} x {k.gpu_bytes / 2**30:.1f} GiB - weights {k.weight_bytes / 2**30:.1f} GiB - "
            f"activations {k.activation_bytes / 2**30:.1f} GiB (assumed); {k.turboquant_layers} TurboQuant + "
            f"{k.boundary_layers} bf16 boundary layer(s): {k.tokens:,} tokens)")


def need_curve(config: EngineConfig, points: int = 240) -> tuple[list[int], list[int]]:
    """Prompt lengths (tokens) and the largest workspace call (bytes) each makes while prefilling alone.

    ``points`` evenly spaced lengths in ``1 .. max_model_len - 1``, plus every chunk
    start of :func:`tqlab.predict.analysis.prefill_chunks` (and one step's budget past the
    previous start) at ``+0``, ``+1``, ``+128`` and ``+129`` (up to 256 chunks): a last chunk of at most 128 tokens runs the decode
    kernel with its own scratch (no workspace call, vLLM 0.33), one of 129
    dequantizes the cached tokens, so the curve steps exactly there. Each value
    is :func:`tqlab.predict.analysis.workspace_bytes_for_prompt`.
    """
    n = config.max_model_len - 1
    m = config.chunk_budget if config.enable_chunked_prefill else n
    t = CONTINUATION_DECODE_THRESHOLD
    even = {max(1, round(1 + i * (n - 1) / (points - 1))) for i in range(points)}
    starts = [c for c, _ in prefill_chunks(config, n)] if n // m <= 256 else [0]  # beyond: finer than the figure
    edges = {e + d for prev, start in zip(starts, starts[1:]) for e in (start, prev + m)
             for d in (0, 1, t, t + 1) if e + d <= n}
    lengths = sorted(even | edges)
    return lengths, [workspace_bytes_for_prompt(config, p) for p in lengths]


def planner_figure(result: PlannerResult):
    """Two panels: reserved MiB per consumer (per rank) and workspace need vs prompt length.

    The right panel draws the need of a prompt prefilling alone against the
    size locked without the fix (decode capture only) and with it; the red
    marker is the shortest prompt that crashes without the fix.
    """
    cfg = result.config
    fig, (ax1, ax2) = new_figure(10.0, 3.6, ncols=2, width_ratios=[1, 1.6])
    names = ["decode\nscratch", "continuation\ndequant"][: len(result.consumers)]
    vals = [mib(b) for _, _, b in result.consumers]
    colors = [FIX_COLOR, "#2ca02c"][: len(vals)]
    for row in other_consumers(result):  # the registry's other consumers of this deployment (max, not sum)
        names.append(row["name"].replace("_", "\n", 1))
        vals.append(mib(row["reserved_bytes"]))
        colors.append("#7f7f7f")
    bars = ax1.bar(names, vals, color=colors)
    for b, v in zip(bars, vals):
        ax1.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    unfixed = result.unfixed_locked_bytes or 0  # None: never locked (eager) -- nothing to overflow
    if result.unfixed_locked_bytes is not None:
        ax1.axhline(mib(unfixed), color=NOFIX_COLOR, ls="--", lw=1, label=f"locked w/o fix {mib(unfixed):.2f}")
    ax1.set_ylabel("MiB per rank (one ubatch slot)")
    ax1.set_title(f"reservation ({cfg.preset or 'custom'}, TP {cfg.tensor_parallel_size})", fontsize=9)
    ax1.legend(fontsize=7, loc="upper left")
    ax1.margins(y=0.2)

    lengths, need = need_curve(cfg)
    ax2.plot(lengths, [mib(b) for b in need], color="black", lw=1.2, label="largest call of the prompt")
    if result.unfixed_locked_bytes is not None:
        ax2.axhline(mib(unfixed), color=NOFIX_COLOR, ls="--", lw=1.2, label="locked without fix")
    ax2.axhline(mib(max(result.reserved_bytes, unfixed)), color=FIX_COLOR, ls="-", lw=1.2,
                label="locked with fix (PR #44053)")
    bad = result.first_failing_unfixed
    if bad is not None:
        at = next(i for i, p in enumerate(lengths) if p >= bad)
        ax2.axvline(bad, color=CRASH_COLOR, lw=1, ls=":")
        ax2.plot([bad], [mib(need[at])], "x", color=CRASH_COLOR, ms=10, mew=2.5,
                 label=f"first crash without fix: {bad:,} tokens")
    ax2.set_xlabel("prompt tokens (request alone, chunked prefill)")
    ax2.set_ylabel("workspace MiB per rank")
    ax2.set_title(
        f"max_model_len {cfg.max_model_len:,}, max_num_batched_tokens {cfg.max_num_batched_tokens:,}, "
        f"block {cfg.block_size}, {cfg.kv_cache_dtype}",
        fontsize=8,
    )
    ax2.legend(fontsize=7, loc="lower right")
    ax2.set_xlim(0, cfg.max_model_len)
    ax2.set_ylim(bottom=0)
    return fig


def other_consumers(r: PlannerResult) -> list[dict[str, Any]]:
    """The deployment's workspace consumers other than TurboQuant's, as the registry sizes them
    (:func:`tqlab.predict.analysis.consumer_table` rows: ``consumer``, ``name``, ``phase``, ``reserved_bytes``,
    ``max_runtime_bytes``, ``covered``); ``[]`` without a prediction."""
    rows = r.prediction.consumers.get("consumers", []) if r.prediction is not None else []
    return [row for row in rows if row["name"] not in TURBOQUANT]


def _registry_html(r: PlannerResult) -> str:
    """Every other consumer (registry rows) and the unmodelled ones the deployment would use."""
    rows = "".join(
        f"<tr><td>{esc(c['consumer'])}</td><td>{esc(c['phase'])}</td><td>{c['reserved_bytes']:,}</td>"
        f"<td>{c['max_runtime_bytes']:,}</td><td>{'yes' if c['covered'] else '<b>no</b>'}</td></tr>"
        for c in other_consumers(r))
    unmodelled = r.prediction.consumers.get("unmodelled", []) if r.prediction is not None else []
    out = ("<p>other workspace consumers of this deployment (vLLM 0.33; a slot is as large as the largest request "
           "before the lock):</p><table class='tqlab-table'><tr><th>consumer</th><th>phase</th><th>reserved bytes</th>"
           f"<th>max at serve time</th><th>covered</th></tr>{rows}</table>" if rows else "")
    if unmodelled:
        out += "<p>not modelled (the answer is partial): " + "; ".join(
            f"{esc(u['consumer'])} ({esc(u['reason'])})" for u in unmodelled) + "</p>"
    return out


def _planner_html(r: PlannerResult) -> str:
    cfg = r.config
    rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{'<br>'.join(f'{tuple(s)} {dtype_name(d)}' for s, d in call)}</td>"
        f"<td>{b:,}</td><td>{mib(b):.2f}</td></tr>"
        for name, call, b in r.consumers
    )
    table = (
        "<table class='tqlab-table'><tr><th>consumer</th><th>views</th><th>bytes</th><th>MiB per rank</th></tr>"
        f"{rows}</table>"
    )
    if r.first_failing_unfixed is None:
        unfixed = f"every prompt up to max_model_len ({cfg.max_model_len:,}) survives"
    else:
        unfixed = (
            f"longest prompt that survives: <b>{r.longest_surviving_unfixed:,} tokens</b> "
            f"(a {r.first_failing_unfixed:,}-token prompt hits the locked-workspace assertion)"
        )
    fixed = ("every prompt up to max_model_len survives" if r.first_failing_fixed is None
             else f"<span style='color:{CRASH_COLOR}'>shortest failing prompt still {r.first_failing_fixed:,} tokens</span>")
    return (
        f"{table}{_registry_html(r)}"
        + (f"<p>with the fix: <b>{mib(r.reserved_bytes):.2f} MiB</b> per ubatch slot x {r.slots} slot(s) = "
           f"{_share_html(r)}; {fixed}.</p>"
           if cfg.has_turboquant_consumers else
           f"<p>PR #44053 reserves nothing here: kv_cache_dtype {esc(cfg.kv_cache_dtype)} runs no TurboQuant "
           "backend.</p>")
        + (f"<p>without the fix: never locked (no CUDA graph capture: vLLM 0.33 locks only in "
           f"<code>capture_model</code>); {unfixed}.</p>" if r.unfixed_locked_bytes is None else
           f"<p>without the fix: locked at {mib(r.unfixed_locked_bytes):.2f} MiB (the largest request before the "
           f"lock: {esc(_lock_setter(r))}); {unfixed}.</p>")
    )


def _lock_setter(r: PlannerResult) -> str:
    setter = r.prediction.lock_set_by if r.prediction is not None else None
    if setter is None or setter.startswith("turboquant_attn.py:_decode_attention"):
        return f"TurboQuant's decode capture at {decode_rows_at_lock(r.config)} rows"
    return setter


def _with_value(options: Sequence[int], value: int) -> list[int]:
    return sorted(set(options) | {value})


_MODEL_LEN_OPTIONS = [1 << k for k in range(10, 21)]
_SEQS_OPTIONS = [1 << k for k in range(0, 11)]
_BATCHED_OPTIONS = [1 << k for k in range(7, 17)]
_TP_OPTIONS = [1, 2, 4, 8]
_BLOCK_OPTIONS = [16, 32, 64, 128, 256, 2080]


class ReservationPlanner:
    """Controls and state of :func:`reservation_planner` (see there)."""

    def __init__(self, preset: str):
        w = require_widgets()
        self._suspend = False
        slider = dict(continuous_update=False, style={"description_width": "200px"}, layout=w.Layout(width="560px"))
        self.preset = w.Dropdown(options=list_presets(), value=preset, description="preset")
        self.max_model_len = w.SelectionSlider(options=_MODEL_LEN_OPTIONS, description="max_model_len", **slider)
        self.max_num_seqs = w.SelectionSlider(options=_SEQS_OPTIONS, description="max_num_seqs", **slider)
        self.max_num_batched_tokens = w.SelectionSlider(
            options=_BATCHED_OPTIONS, description="max_num_batched_tokens", **slider
        )
        self.tensor_parallel_size = w.SelectionSlider(options=_TP_OPTIONS, description="tensor_parallel_size", **slider)
        self.block_size = w.SelectionSlider(options=_BLOCK_OPTIONS, description="block_size", **slider)
        self.kv_cache_dtype = w.Dropdown(options=list(KV_CACHE_DTYPES), description="kv_cache_dtype",
                                         style={"description_width": "200px"}, layout=w.Layout(width="420px"))
        self.status = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.summary = w.HTML()
        self.result: PlannerResult | None = None
        self.controls = [self.max_model_len, self.max_num_seqs, self.max_num_batched_tokens,
                         self.tensor_parallel_size, self.block_size, self.kv_cache_dtype]
        self.preset.observe(lambda _c: planner_load_preset(self), names="value")
        for c in self.controls:
            c.observe(lambda _c: refresh_planner(self), names="value")
        self.view = w.VBox(
            [w.HTML("<b>Reservation planner</b>: what <code>_reserve_workspace</code> reserves, per rank"),
             self.preset, *self.controls, self.status, self.image, self.summary],
            layout=w.Layout(border="1px solid #ddd", padding="6px"),
        )
        self.view.add_class("tqlab-explorer")
        planner_load_preset(self)

    def config(self) -> EngineConfig:
        """The ``EngineConfig`` the controls describe (raises ``ValueError`` if invalid)."""
        return EngineConfig.from_preset(
            self.preset.value,
            max_model_len=self.max_model_len.value,
            max_num_seqs=self.max_num_seqs.value,
            max_num_batched_tokens=self.max_num_batched_tokens.value,
            tensor_parallel_size=self.tensor_parallel_size.value,
            block_size=self.block_size.value,
            kv_cache_dtype=self.kv_cache_dtype.value,
        )

    def _repr_mimebundle_(self, **kw):
        return self.view._repr_mimebundle_(**kw)


def planner_load_preset(ui: ReservationPlanner) -> None:
    """Set every control to ``ui.preset.value``'s numbers, then recompute once (callback)."""
    cfg = EngineConfig.from_preset(ui.preset.value)
    ui._suspend = True
    try:
        for name, base in (("max_model_len", _MODEL_LEN_OPTIONS), ("max_num_seqs", _SEQS_OPTIONS),
                           ("max_num_batched_tokens", _BATCHED_OPTIONS), ("tensor_parallel_size", _TP_OPTIONS),
                           ("block_size", _BLOCK_OPTIONS)):
            ctl = getattr(ui, name)
            value = getattr(cfg, name)
            opts = _with_value(base, value)
            if list(ctl.options) != opts:
                ctl.options = opts
            ctl.value = value
        ui.kv_cache_dtype.value = cfg.kv_cache_dtype
    finally:
        ui._suspend = False
    refresh_planner(ui)


def refresh_planner(ui: ReservationPlanner) -> None:
    """Recompute :func:`plan_summary` for the controls' config and redraw (callback).

    An invalid combination (e.g. TP not dividing the heads, or
    ``max_num_batched_tokens < max_num_seqs``) shows the ``ValueError`` in
    ``ui.status`` and keeps the last valid figure and numbers.
    """
    if ui._suspend:
        return
    try:
        result = plan_summary(ui.config())
    except ValueError as e:
        ui.status.value = f"<span style='color:{CRASH_COLOR}'>invalid configuration: {esc(str(e))}</span>"
        return
    ui.result = result
    ui.status.value = ""
    ui.image.value = figure_png(planner_figure(result))
    ui.summary.value = _planner_html(result)


def reservation_planner(preset: str = "nemotron-3-super-120b-a12b") -> ReservationPlanner:
    """Build the reservation planner: preset + sliders -> per-consumer MiB per rank, KV-cache share, crash bound.

    Raises ``ValueError`` for an unknown preset, ``ImportError`` without ipywidgets.
    """
    load_preset(preset)  # ValueError listing the known presets
    return ReservationPlanner(preset)
