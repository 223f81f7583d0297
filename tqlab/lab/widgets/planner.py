"""Interactive explorers for JupyterLab: workspace layout, reservation planner, lifecycle stepper.

Three explorers, each in two layers:

* **Pure functions** (no ipywidgets needed; used for the static figures that
  every notebook cell shows first, so HTML exports and headless runs show
  something): :func:`layout_rows` / :func:`layout_figure`,
  :func:`plan_summary` / :func:`planner_figure`,
  :func:`lifecycle_trace` / :func:`lifecycle_figure`.
* **Widgets** built by :func:`layout_explorer`, :func:`reservation_planner`
  and :func:`lifecycle_stepper`. Each returns a small object holding its
  controls as attributes (``.shape``, ``.max_num_seqs``, ``.step`` ...), an
  ``ipywidgets.Image`` (``.image``, PNG bytes) and ``ipywidgets.HTML`` panels,
  and the top-level box ``.view`` (what the notebook displays). The callbacks
  are the module-level functions ``layout_add``, ``layout_remove``,
  ``refresh_layout``, ``planner_load_preset``, ``refresh_planner``,
  ``refresh_lifecycle`` and ``render_lifecycle``; tests drive them by setting
  ``.value`` on the controls (or ``.click()`` on buttons).

``ipywidgets`` is imported lazily inside the widget builders: ``import tqlab``
and ``import tqlab.widgets`` work without it. Figures are drawn on
``matplotlib.figure.Figure`` objects (no pyplot state, any backend).

Everything is per tensor-parallel rank, sizes in bytes unless a name says MiB
(2**20 bytes, which vLLM's messages call "MB"). The fix shown is vLLM PR #44053
(``_reserve_workspace`` in ``TurboQuantMetadataBuilder``,
``vllm/v1/attention/backends/turboquant_attn.py``); the workspace mirrors
``vllm/v1/worker/workspace.py``.
"""

from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .config import KV_CACHE_DTYPES, EngineConfig, list_presets, load_preset
from .reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
)
from .analysis import first_failing_prompt, prompt_chunks, unfixed_locked_bytes
from .workspace import ALIGNMENT, MiB, WorkspaceEvent, WorkspaceLayout, compute_layout, round_up

__all__ = [
    "DTYPE_CHOICES",
    "LifecycleStep",
    "LifecycleTrace",
    "PlannerResult",
    "figure_png",
    "layout_add",
    "layout_explorer",
    "layout_figure",
    "layout_remove",
    "layout_rows",
    "lifecycle_figure",
    "lifecycle_stepper",
    "lifecycle_trace",
    "parse_shape",
    "plan_summary",
    "planner_figure",
    "planner_load_preset",
    "refresh_layout",
    "refresh_lifecycle",
    "refresh_planner",
    "render_lifecycle",
    "reservation_planner",
    "snapshot",
    "default_layout_requests",
    "unfixed_locked_bytes",
]

DTYPE_CHOICES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
"""dtypes the layout explorer offers, by name."""

_FIX_COLOR = "#1f77b4"
_NOFIX_COLOR = "#ff7f0e"
_CRASH_COLOR = "#d62728"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _esc(value: object) -> str:
    """HTML-escape for the text panels (quotes kept readable)."""
    return html.escape(str(value), quote=False)


def _mib(nbytes: int) -> float:
    return nbytes / MiB


def _require_widgets():
    try:
        import ipywidgets
    except ImportError as e:  # pragma: no cover - exercised only without the notebooks extra
        raise ImportError(
            "the tqlab explorers need ipywidgets (pip install 'tqlab[notebooks]'); "
            "the static figures (layout_figure, planner_figure, lifecycle_figure) work without it"
        ) from e
    return ipywidgets


def figure_png(fig, dpi: int = 100) -> bytes:
    """PNG bytes of a matplotlib ``Figure`` (for ``ipywidgets.Image`` or ``IPython.display.Image``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _new_figure(width: float, height: float, ncols: int = 1, width_ratios=None):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, gridspec_kw={"width_ratios": width_ratios} if width_ratios else None)
    return fig, axes


# =========================================================================== #
# 1. Layout explorer                                                          #
# =========================================================================== #

_SHAPE_RE = re.compile(r"^\s*[\(\[]?\s*(.*?)\s*[\)\]]?\s*$")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"16, 8, 4, 129"`` or ``"(16, 8, 4, 129)"`` -> ``(16, 8, 4, 129)``; ``"()"`` -> ``()`` (a scalar).

    Raises ``TypeError`` if ``text`` is not a str, ``ValueError`` naming the text
    for anything that is not a comma-separated list of non-negative integers.
    """
    if not isinstance(text, str):
        raise TypeError(f"shape text must be a str, got {type(text).__name__} {text!r}")
    inner = _SHAPE_RE.match(text).group(1)
    if inner == "":
        return ()
    parts = [p.strip() for p in inner.split(",")]
    if parts and parts[-1] == "":  # "(4,)"
        parts = parts[:-1]
    dims = []
    for p in parts:
        if not re.fullmatch(r"\d+", p):
            raise ValueError(f"bad shape {text!r}: {p!r} is not a non-negative integer")
        dims.append(int(p))
    return tuple(dims)


@dataclass(frozen=True)
class LayoutRow:
    """One view of a ``get_simultaneous`` call: bytes used, padding after it, its offset (bytes)."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    padding: int
    offset: int


def layout_rows(requests: Sequence[tuple[Sequence[int], torch.dtype]]) -> tuple[list[LayoutRow], WorkspaceLayout]:
    """The rows of :func:`tqlab.workspace.compute_layout` for ``requests``, plus the layout itself.

    Raises what ``compute_layout`` raises (``TypeError``/``ValueError`` naming the bad request).
    """
    lay = compute_layout(list(requests))
    rows = [
        LayoutRow(i, s, d, n, p, o)
        for i, (s, d, n, p, o) in enumerate(zip(lay.shapes, lay.dtypes, lay.nbytes, lay.padding, lay.offsets))
    ]
    return rows, lay


def layout_figure(requests: Sequence[tuple[Sequence[int], torch.dtype]], scale: str = "schematic"):
    """Byte map of one ``get_simultaneous`` call: each view's bytes, then its padding to 256 bytes.

    Drawn by :func:`tqlab.viz.plot_layout`. ``scale="bytes"`` draws every
    segment in proportion to its bytes (the truth: tiny views vanish next to
    big ones); ``scale="schematic"`` gives small views and padding a readable
    width (labels keep the true offsets). Returns a matplotlib ``Figure``.
    Raises ``ValueError`` for another scale, and what ``compute_layout`` raises.
    """
    from matplotlib.figure import Figure

    from .viz import plot_layout

    if scale not in ("bytes", "schematic"):
        raise ValueError(f"scale must be 'bytes' or 'schematic', got {scale!r}")
    rows, lay = layout_rows(requests)
    fig = Figure(figsize=(10.0, 2.3), layout="constrained")
    ax = fig.subplots()
    pad = sum(r.padding for r in rows)
    plot_layout(lay, [f"#{r.index}" for r in rows], schematic=(scale == "schematic"), ax=ax,
                title=f"get_simultaneous: {len(rows)} view(s), {lay.total_bytes:,} bytes = "
                      f"{_mib(lay.total_bytes):.3f} MiB (padding {pad:,} B)")
    return fig


def _layout_table_html(requests) -> str:
    rows, lay = layout_rows(requests)
    head = "<tr><th>#</th><th>shape</th><th>dtype</th><th>bytes</th><th>offset</th><th>padding</th><th>end (aligned)</th></tr>"
    body = "".join(
        f"<tr><td>{r.index}</td><td>{tuple(r.shape)}</td><td>{_dtype_name(r.dtype)}</td>"
        f"<td>{r.nbytes:,}</td><td>{r.offset:,}</td><td>{r.padding:,}</td>"
        f"<td>{r.offset + round_up(r.nbytes, ALIGNMENT):,}</td></tr>"
        for r in rows
    )
    total = (
        f"<p><b>total {lay.total_bytes:,} bytes = {_mib(lay.total_bytes):.4f} MiB</b> "
        f"(sum of round_up(nbytes, {ALIGNMENT})); padding {sum(lay.padding):,} bytes</p>"
    )
    return f"<table class='tqlab-table'>{head}{body}</table>{total}"


def _default_layout_requests() -> list[tuple[tuple[int, ...], torch.dtype]]:
    cfg = EngineConfig.from_preset("pr-44053-unit-test")
    return [(tuple(s), d) for s, d in reservation_plan(cfg)[0]]


def _request_label(i: int, req) -> str:
    return f"{i}: {tuple(req[0])} {_dtype_name(req[1])}"


class LayoutExplorer:
    """Controls and state of :func:`layout_explorer` (see there)."""

    def __init__(self, requests):
        w = _require_widgets()
        self.requests: list[tuple[tuple[int, ...], torch.dtype]] = list(requests)
        self.shape = w.Text(value="5, 7", description="shape", placeholder="e.g. 16, 8, 4, 129")
        self.dtype = w.Dropdown(options=list(DTYPE_CHOICES), value="float16", description="dtype")
        self.add_button = w.Button(description="add view", icon="plus")
        self.listing = w.Select(options=[], rows=5, description="views", layout=w.Layout(width="420px"))
        self.remove_button = w.Button(description="remove selected", icon="minus")
        self.scale = w.ToggleButtons(options=["schematic", "bytes"], value="schematic", description="widths")
        self.status = w.HTML(value="")
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.table = w.HTML()
        self.add_button.on_click(lambda _b: layout_add(self))
        self.remove_button.on_click(lambda _b: layout_remove(self))
        self.scale.observe(lambda _c: refresh_layout(self), names="value")
        self.view = w.VBox(
            [
                w.HTML("<b>Layout explorer</b>: one <code>get_simultaneous</code> call, view by view"),
                w.HBox([self.shape, self.dtype, self.add_button]),
                w.HBox([self.listing, self.remove_button]),
                self.scale,
                self.status,
                self.image,
                self.table,
            ],
            layout=w.Layout(border="1px solid #ddd", padding="6px"),
        )
        self.view.add_class("tqlab-explorer")
        refresh_layout(self)

    def _repr_mimebundle_(self, **kw):
        return self.view._repr_mimebundle_(**kw)


def refresh_layout(ui: LayoutExplorer) -> None:
    """Redraw the byte map and table of ``ui`` from ``ui.requests`` (callback)."""
    ui.listing.options = [_request_label(i, r) for i, r in enumerate(ui.requests)]
    ui.image.value = figure_png(layout_figure(ui.requests, ui.scale.value))
    ui.table.value = _layout_table_html(ui.requests)


def layout_add(ui: LayoutExplorer) -> None:
    """Append ``(parse_shape(ui.shape.value), ui.dtype.value)`` to the call (callback of "add view").

    A bad shape leaves the requests untouched and shows the error in ``ui.status``.
    """
    try:
        req = (parse_shape(ui.shape.value), DTYPE_CHOICES[ui.dtype.value])
        compute_layout(ui.requests + [req])
    except (TypeError, ValueError) as e:
        ui.status.value = f"<span style='color:{_CRASH_COLOR}'>not added: {_esc(str(e))}</span>"
        return
    ui.requests.append(req)
    ui.status.value = f"added {_esc(_request_label(len(ui.requests) - 1, req))}"
    refresh_layout(ui)


def layout_remove(ui: LayoutExplorer) -> None:
    """Remove the view selected in ``ui.listing`` (callback of "remove selected"); nothing selected: say so."""
    label = ui.listing.value
    if label is None:
        ui.status.value = "select a view to remove"
        return
    idx = int(label.split(":", 1)[0])
    removed = ui.requests.pop(idx)
    ui.status.value = f"removed {_esc(_request_label(idx, removed))}"
    refresh_layout(ui)


def layout_explorer(requests: Sequence[tuple[Sequence[int], torch.dtype]] | None = None) -> LayoutExplorer:
    """Build the layout explorer: add/remove ``(shape, dtype)`` views, see the byte map, offsets, padding, total.

    ``requests`` defaults to the split-KV decode call of the ``pr-44053-unit-test``
    preset (``(16,8,4,129) f32, (16,8,128) f16, (16,8) f32``). Raises what
    ``compute_layout`` raises for bad requests, ``ImportError`` without ipywidgets.
    """
    reqs = _default_layout_requests() if requests is None else [(tuple(s), d) for s, d in requests]
    compute_layout(reqs)  # validate before building anything
    return LayoutExplorer(reqs)


# =========================================================================== #
# 2. Reservation planner                                                      #
# =========================================================================== #




_CONSUMER_NAMES = (
    "split-KV decode scratch (max_num_seqs rows)",
    "continuation-prefill dequant K+V (max_model_len - 1 cached)",
)


@dataclass(frozen=True)
class PlannerResult:
    """What the reservation planner shows for one configuration (per rank; bytes unless MiB).

    ``consumers``: ``(name, shapes, bytes)`` per reservation call;
    ``reserved_bytes``: one ubatch slot after the fix (the largest call);
    ``slots``: ubatch slots (2 with DBO); ``kv_cache_bytes``: KV cache of
    ``max_num_seqs x max_model_len`` tokens in ``kv_cache_dtype``, all layers;
    ``kv_share``: ``reserved_bytes * slots / kv_cache_bytes``;
    ``unfixed_locked_bytes``: see :func:`unfixed_locked_bytes`;
    ``first_failing_unfixed`` / ``first_failing_fixed``: shortest prompt (tokens)
    that crashes, or None when every prompt up to ``max_model_len`` survives.
    """

    config: EngineConfig
    consumers: tuple[tuple[str, Any, int], ...]
    reserved_bytes: int
    slots: int
    kv_cache_bytes: int
    kv_share: float
    unfixed_locked_bytes: int
    first_failing_unfixed: int | None
    first_failing_fixed: int | None

    @property
    def longest_surviving_unfixed(self) -> int:
        """Longest prompt (tokens) that survives without the fix (``max_model_len - 1`` when all do)."""
        if self.first_failing_unfixed is None:
            return self.config.max_model_len - 1
        return self.first_failing_unfixed - 1


def plan_summary(config: EngineConfig) -> PlannerResult:
    """Compute the planner's numbers for ``config`` with :mod:`tqlab.reservation` (see :class:`PlannerResult`)."""
    from .attention import kv_cache_bytes_per_token

    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
    plan = reservation_plan(config)
    consumers = tuple(
        (name, call, compute_layout(call).total_bytes) for name, call in zip(_CONSUMER_NAMES, plan)
    )
    reserved = plan_bytes(plan)
    kv = kv_cache_bytes_per_token(config) * config.max_model_len * config.max_num_seqs
    locked = unfixed_locked_bytes(config)
    return PlannerResult(
        config=config,
        consumers=consumers,
        reserved_bytes=reserved,
        slots=config.num_ubatches,
        kv_cache_bytes=kv,
        kv_share=reserved * config.num_ubatches / kv,
        unfixed_locked_bytes=locked,
        first_failing_unfixed=first_failing_prompt(config, locked),
        first_failing_fixed=first_failing_prompt(config, max(locked, reserved)),
    )


def _prompt_need_curve(config: EngineConfig, points: int = 240) -> tuple[list[int], list[int]]:
    """Prompt lengths and the largest workspace call (bytes) each makes while prefilling alone.

    Exact at every sampled length: need(P) = max(largest full chunk before the
    last, the last chunk's call); computed in O(chunks + points). Every chunk
    boundary ``k * m`` is sampled with ``+1``, ``+128`` and ``+129``: a last
    chunk of at most 128 tokens runs the decode kernel with its own scratch
    (no workspace call, vLLM 0.33), one of 129 dequantizes the cached tokens,
    so the curve steps exactly there.
    """
    n = config.max_model_len - 1
    m = config.max_num_batched_tokens if config.enable_chunked_prefill else n
    t = CONTINUATION_DECODE_THRESHOLD
    lengths = sorted({max(1, round(1 + i * (n - 1) / (points - 1))) for i in range(points)}
                     | {k * m + d for k in range(1, n // m + 1) for d in (0, 1, t, t + 1) if k * m + d <= n})
    full = [chunk_workspace_request(config, k * m, m).nbytes for k in range(0, n // m + 1)]
    prefix = [0]
    for b in full:
        prefix.append(max(prefix[-1], b))
    need = []
    for p in lengths:
        k = (p - 1) // m
        last = chunk_workspace_request(config, k * m, p - k * m).nbytes
        need.append(max(prefix[k], last))
    return lengths, need


def planner_figure(result: PlannerResult):
    """Two panels: reserved MiB per consumer (per rank) and workspace need vs prompt length.

    The right panel draws the need of a prompt prefilling alone against the
    size locked without the fix (decode capture only) and with it; the red
    marker is the shortest prompt that crashes without the fix.
    """
    cfg = result.config
    fig, (ax1, ax2) = _new_figure(10.0, 3.6, ncols=2, width_ratios=[1, 1.6])
    names = ["decode\nscratch", "continuation\ndequant"][: len(result.consumers)]
    vals = [_mib(b) for _, _, b in result.consumers]
    bars = ax1.bar(names, vals, color=[_FIX_COLOR, "#2ca02c"][: len(vals)])
    for b, v in zip(bars, vals):
        ax1.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax1.axhline(_mib(result.unfixed_locked_bytes), color=_NOFIX_COLOR, ls="--", lw=1,
                label=f"locked w/o fix {_mib(result.unfixed_locked_bytes):.2f}")
    ax1.set_ylabel("MiB per rank (one ubatch slot)")
    ax1.set_title(f"reservation ({cfg.preset or 'custom'}, TP {cfg.tensor_parallel_size})", fontsize=9)
    ax1.legend(fontsize=7, loc="upper left")
    ax1.margins(y=0.2)

    lengths, need = _prompt_need_curve(cfg)
    ax2.plot(lengths, [_mib(b) for b in need], color="black", lw=1.2, label="largest call of the prompt")
    ax2.axhline(_mib(result.unfixed_locked_bytes), color=_NOFIX_COLOR, ls="--", lw=1.2, label="locked without fix")
    ax2.axhline(_mib(max(result.reserved_bytes, result.unfixed_locked_bytes)), color=_FIX_COLOR, ls="-", lw=1.2,
                label="locked with fix (PR #44053)")
    bad = result.first_failing_unfixed
    if bad is not None:
        at = next(i for i, p in enumerate(lengths) if p >= bad)
        ax2.axvline(bad, color=_CRASH_COLOR, lw=1, ls=":")
        ax2.plot([bad], [_mib(need[at])], "x", color=_CRASH_COLOR, ms=10, mew=2.5,
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


def _planner_html(r: PlannerResult) -> str:
    cfg = r.config
    rows = "".join(
        f"<tr><td>{_esc(name)}</td><td>{'<br>'.join(f'{tuple(s)} {_dtype_name(d)}' for s, d in call)}</td>"
        f"<td>{b:,}</td><td>{_mib(b):.2f}</td></tr>"
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
             else f"<span style='color:{_CRASH_COLOR}'>shortest failing prompt still {r.first_failing_fixed:,} tokens</span>")
    return (
        f"{table}"
        f"<p>with the fix: <b>{_mib(r.reserved_bytes):.2f} MiB</b> per ubatch slot x {r.slots} slot(s) = "
        f"<b>{100 * r.kv_share:.3f}%</b> of the KV cache ({_mib(r.kv_cache_bytes):,.1f} MiB for "
        f"max_num_seqs x max_model_len tokens, {cfg.kv_cache_dtype}, {cfg.num_hidden_layers} layer(s)); {fixed}.</p>"
        f"<p>without the fix: locked at {_mib(r.unfixed_locked_bytes):.2f} MiB (decode capture at "
        f"{max(cfg.capture_sizes())} rows); {unfixed}.</p>"
    )


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
        w = _require_widgets()
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
        ui.status.value = f"<span style='color:{_CRASH_COLOR}'>invalid configuration: {_esc(str(e))}</span>"
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


# =========================================================================== #
# 3. Lifecycle stepper                                                        #
# =========================================================================== #


@dataclass(frozen=True)
class LifecycleStep:
    """One step of the lifecycle: a start-up phase or a serving step.

    ``kind`` is ``"phase"`` or ``"serve"``; ``workspace_bytes`` per ubatch slot
    after the step; ``events`` the workspace events during it; ``need_bytes``
    the largest call a serving step asks for (0 for phases); ``error`` the
    exception text if the step raised.
    """

    index: int
    kind: str
    name: str
    note: str
    workspace_bytes: tuple[int, ...]
    events: tuple[WorkspaceEvent, ...]
    need_bytes: int = 0
    error: str | None = None

    @property
    def live_bytes(self) -> int:
        return sum(self.workspace_bytes)


@dataclass
class LifecycleTrace:
    """The steps of one engine (``fix`` on or off) serving one prompt of ``prompt_tokens`` alone."""

    config: EngineConfig
    fix: bool
    prompt_tokens: int
    max_tokens: int
    steps: list[LifecycleStep] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return any(s.error for s in self.steps)

    @property
    def locked_bytes(self) -> int:
        """Slot-0 bytes after the ``lock`` phase."""
        return next(s.workspace_bytes[0] for s in self.steps if s.name == "lock")


_TRACE_CACHE: dict[tuple, LifecycleTrace] = {}


def lifecycle_trace(
    config: EngineConfig, prompt_tokens: int, fix: bool, *, max_tokens: int = 2, device: str = "meta"
) -> LifecycleTrace:
    """Build an :class:`~tqlab.engine.LLMEngine` (``fix`` on/off) and serve one prompt, recording every step.

    The start-up phases come from ``engine.phases`` with the workspace events
    of each (split by counting ``workspace.events`` in the engine's
    ``on_phase`` callback); then one serving step per ``engine.step()`` until
    the request finishes or a step raises (recorded in the step's ``error``;
    the engine is then dead). ``device="meta"`` runs shapes only (seconds).
    Results are cached per (config, prompt, fix, max_tokens, device). Leaves
    the engine's workspace as the current workspace manager.

    Raises ``ValueError`` for a prompt that does not fit ``max_model_len``.
    """
    from .engine import LLMEngine
    from .workspace import current_workspace_manager, is_workspace_manager_initialized

    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be an int >= 1, got {prompt_tokens!r}")
    if prompt_tokens + max_tokens > config.max_model_len:
        raise ValueError(
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len ({config.max_model_len})"
        )
    key = (repr(sorted(config.to_dict().items())), prompt_tokens, bool(fix), max_tokens, str(device))
    if key in _TRACE_CACHE:
        return _TRACE_CACHE[key]

    marks: list[int] = []

    def on_phase(_rec) -> None:
        marks.append(len(current_workspace_manager().events) if is_workspace_manager_initialized() else 0)

    engine = LLMEngine(config, fix=bool(fix), device=device, on_phase=on_phase)
    events = engine.workspace.events
    trace = LifecycleTrace(config, bool(fix), prompt_tokens, max_tokens)
    prev = 0
    for i, (rec, mark) in enumerate(zip(engine.phases, marks)):
        trace.steps.append(LifecycleStep(i, "phase", rec.name, rec.note, tuple(rec.workspace_bytes),
                                         tuple(events[prev:mark])))
        prev = mark
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else prompt_tokens
    plan = [("prefill", c, q) for c, q in prompt_chunks(prompt_tokens, budget)]
    plan += [("decode", prompt_tokens + j, 1) for j in range(max_tokens - 1)]
    engine.add_request(prompt_tokens, max_tokens)
    for kind, cached, q in plan:
        if kind == "prefill":
            req = chunk_workspace_request(config, cached, q)
            name = f"chunk {cached:,}+{q:,}"
            note = {"prefill": "first chunk: no cached tokens, no workspace",
                    "decode_kernel": (f"continuation of {q} tokens <= {CONTINUATION_DECODE_THRESHOLD}: decode "
                                      f"kernel, {q} rows, its own scratch: no workspace call (vLLM 0.33)"),
                    "continuation": f"continuation prefill: dequantize {cached:,} cached tokens"}[req.path]
            need = req.nbytes
        else:
            name, note = f"decode @{cached:,}", "one decode row (CUDA graph replay)"
            need = compute_layout(decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim,
                                                          config.tq_max_kv_splits_for_cuda_graph, config.dtype)).total_bytes
        before = len(events)
        error = None
        try:
            engine.step()
        except Exception as e:  # the engine is dead after this; record and stop
            error = f"{type(e).__name__}: {e}"
        trace.steps.append(LifecycleStep(len(trace.steps), "serve", name, note, tuple(engine.workspace.sizes_bytes()),
                                         tuple(events[before:]), need, error))
        if error is not None or not engine.has_unfinished_requests():
            break
    if len(_TRACE_CACHE) > 32:
        _TRACE_CACHE.clear()
    _TRACE_CACHE[key] = trace
    return trace


_SHORT = {"init_workspace": "init", "build_backend": "backend", "profile_run": "profile",
          "capture": "capture", "before_lock": "hook", "lock": "lock"}


def _step_label(s: LifecycleStep) -> str:
    return _SHORT.get(s.name, s.name) if s.kind == "phase" else s.name.replace("chunk ", "")


def lifecycle_figure(traces: Sequence[LifecycleTrace], step: int | None = None):
    """One panel per trace: workspace MiB (all ubatch slots) after each step, as bars.

    Serving steps also mark what their largest workspace call needs (black
    tick); a step that raised gets a red X at its need. The grey band is the
    lock; ``step`` frames that step index and greys out the steps after it
    (not taken yet). Returns a matplotlib ``Figure``.
    """
    if not traces:
        raise ValueError("lifecycle_figure needs at least one trace")
    from matplotlib.figure import Figure

    longest = max(traces, key=lambda t: len(t.steps))
    n = len(longest.steps)
    fig = Figure(figsize=(10.0, 1.2 + 1.9 * len(traces)), layout="constrained")
    axes = fig.subplots(len(traces), 1, sharex=True, squeeze=False)[:, 0]
    lock_idx = next(s.index for s in longest.steps if s.name == "lock")
    for ax, t in zip(axes, traces):
        color = _FIX_COLOR if t.fix else _NOFIX_COLOR
        xs = [s.index for s in t.steps]
        ys = [_mib(s.live_bytes) for s in t.steps]
        shown = [step is None or x <= step for x in xs]  # steps after the cursor: faded, not yet taken
        ax.bar(xs, ys, width=0.7, color=[color if v else "#dddddd" for v in shown], alpha=0.85)
        prev = None
        for x, y, v in zip(xs, ys, shown):
            if y != prev and v:
                ax.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                            textcoords="offset points")
            prev = y
        serve = [s for s in t.steps if s.kind == "serve"]
        ax.plot([s.index for s in serve], [_mib(s.need_bytes) for s in serve], "_", color="black", ms=14, mew=2,
                label="what the step's largest call needs")
        for s in t.steps:
            if s.error and (step is None or s.index <= step):
                ax.plot([s.index], [_mib(s.need_bytes)], "x", color=_CRASH_COLOR, ms=11, mew=2.5)
                ax.annotate(f"needs {_mib(s.need_bytes):.2f} MiB: Workspace is locked",
                            (s.index, _mib(s.need_bytes)), xytext=(-8, 0), textcoords="offset points",
                            fontsize=8, color=_CRASH_COLOR, ha="right", va="center")
        ax.axvspan(lock_idx - 0.5, lock_idx + 0.5, color="grey", alpha=0.15, lw=0)
        if step is not None:
            ax.axvspan(step - 0.45, step + 0.45, fill=False, edgecolor="black", lw=1.2, ls="--")
        ax.set_ylim(0, max([1e-6] + ys + [_mib(s.need_bytes) for s in serve]) * 1.3)
        ax.set_ylabel("MiB", fontsize=8)
        ax.set_title(f"{'with' if t.fix else 'without'} the fix: locked at {_mib(t.locked_bytes):.2f} MiB"
                     + (" -> the request crashes" if t.crashed else " -> the request is served"),
                     fontsize=9, loc="left", color=color)
        ax.legend(fontsize=7, loc="upper left")
    stride = max(1, n // 14)
    ticks = [s.index for s in longest.steps if s.index % stride == 0 or s.kind == "phase"]
    axes[-1].set_xticks(ticks)
    axes[-1].set_xticklabels([_step_label(longest.steps[i]) for i in ticks], rotation=30, ha="right", fontsize=7)
    axes[-1].set_xlim(-0.6, n - 0.4)
    cfg = longest.config
    fig.suptitle(f"{cfg.preset or 'custom'}: prompt {longest.prompt_tokens:,} tokens in chunks of "
                 f"{cfg.max_num_batched_tokens:,}; workspace after each step (grey = lock)", fontsize=9)
    return fig


def _event_text(e: WorkspaceEvent) -> str:
    if e.kind == "resize":
        return f"resize {_mib(e.old_bytes):.2f} -> {_mib(e.new_bytes):.2f} MiB by {e.caller}"
    if e.kind == "violation":
        return f"VIOLATION: {e.caller} asked {_mib(e.new_bytes):.2f} MiB, locked at {_mib(e.old_bytes):.2f} MiB"
    return f"{e.kind} at {_mib(e.new_bytes):.2f} MiB ({e.caller})"


def _step_html(t: LifecycleTrace, i: int) -> str:
    who = "with fix" if t.fix else "without fix"
    color = _FIX_COLOR if t.fix else _NOFIX_COLOR
    if i >= len(t.steps):
        last = t.steps[-1]
        body = ("<i>engine dead (EngineDeadError): no further steps</i>" if last.error
                else "<i>request finished</i>")
        return f"<div style='border-left:4px solid {color};padding-left:6px'><b>{who}</b>: {body}</div>"
    s = t.steps[i]
    ev = "".join(f"<li>{_esc(_event_text(e))}</li>" for e in s.events) or "<li>no workspace events</li>"
    need = f"; call needs {_mib(s.need_bytes):.2f} MiB" if s.kind == "serve" else ""
    err = (f"<div style='color:{_CRASH_COLOR}'><b>{_esc(s.error)}</b></div>" if s.error else "")
    return (
        f"<div style='border-left:4px solid {color};padding-left:6px'><b>{who}</b> — step {i}: "
        f"<code>{_esc(s.name)}</code> ({_esc(s.note)})<br>"
        f"workspace after: {', '.join(f'{_mib(b):.2f}' for b in s.workspace_bytes)} MiB{need}"
        f"<ul style='margin:2px 0'>{ev}</ul>{err}</div>"
    )


class LifecycleStepper:
    """Controls and state of :func:`lifecycle_stepper` (see there)."""

    def __init__(self, preset: str, prompt_tokens: int | None, device: str = "meta"):
        w = _require_widgets()
        self._suspend = False
        self.device = device
        self.traces: list[LifecycleTrace] = []
        self.preset = w.Dropdown(options=list_presets(), value=preset, description="preset")
        self.prompt_tokens = w.IntSlider(min=1, max=2, value=1, description="prompt tokens", continuous_update=False,
                                         style={"description_width": "120px"}, layout=w.Layout(width="560px"))
        self.step = w.IntSlider(min=0, max=1, value=0, description="step", continuous_update=True,
                                style={"description_width": "120px"}, layout=w.Layout(width="560px"))
        self.back_button = w.Button(description="back", icon="step-backward")
        self.next_button = w.Button(description="step", icon="step-forward")
        self.status = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.detail = w.HTML()
        self.preset.observe(lambda _c: _stepper_load_preset(self, None), names="value")
        self.prompt_tokens.observe(lambda _c: refresh_lifecycle(self), names="value")
        self.step.observe(lambda _c: render_lifecycle(self), names="value")
        self.back_button.on_click(lambda _b: _move(self, -1))
        self.next_button.on_click(lambda _b: _move(self, +1))
        self.view = w.VBox(
            [w.HTML(f"<b>Lifecycle stepper</b>: the engine on device={device!r}, with and without the fix"),
             self.preset, self.prompt_tokens, w.HBox([self.back_button, self.next_button]), self.step,
             self.status, self.image, self.detail],
            layout=w.Layout(border="1px solid #ddd", padding="6px"),
        )
        self.view.add_class("tqlab-explorer")
        _stepper_load_preset(self, prompt_tokens)

    def config(self) -> EngineConfig:
        return EngineConfig.from_preset(self.preset.value)

    def _repr_mimebundle_(self, **kw):
        return self.view._repr_mimebundle_(**kw)


def _default_prompt(cfg: EngineConfig, max_tokens: int = 2) -> int:
    return max(1, min(load_preset(cfg.preset)["default_prompt_tokens"], cfg.max_model_len - max_tokens))


def _stepper_load_preset(ui: LifecycleStepper, prompt_tokens: int | None) -> None:
    cfg = ui.config()
    top = cfg.max_model_len - 2
    value = _default_prompt(cfg) if prompt_tokens is None else prompt_tokens
    if not 1 <= value <= top:
        raise ValueError(f"prompt_tokens must be in [1, {top}] for preset {cfg.preset!r}, got {value}")
    ui._suspend = True
    try:
        ui.prompt_tokens.max = max(top, ui.prompt_tokens.min + 1)
        ui.prompt_tokens.value = value
    finally:
        ui._suspend = False
    refresh_lifecycle(ui)


def _move(ui: LifecycleStepper, delta: int) -> None:
    ui.step.value = min(max(ui.step.value + delta, ui.step.min), ui.step.max)


def refresh_lifecycle(ui: LifecycleStepper) -> None:
    """Build both engines (fix off / on) for the controls' preset and prompt, reset the step slider (callback)."""
    if ui._suspend:
        return
    cfg = ui.config()
    ui.status.value = f"building both engines on device={ui.device!r} ..."
    ui.traces = [lifecycle_trace(cfg, ui.prompt_tokens.value, fix, device=ui.device) for fix in (False, True)]
    n = max(len(t.steps) for t in ui.traces)
    ui._suspend = True
    try:
        ui.step.max = n - 1
        ui.step.value = 0
    finally:
        ui._suspend = False
    ui.status.value = " | ".join(
        f"{'with' if t.fix else 'without'} fix: {len(t.steps)} steps, "
        + ("crashes" if t.crashed else "serves the prompt") for t in ui.traces
    )
    render_lifecycle(ui)


def render_lifecycle(ui: LifecycleStepper) -> None:
    """Redraw the figure with a cursor at ``ui.step.value`` and describe that step for both engines (callback)."""
    if ui._suspend or not ui.traces:
        return
    i = ui.step.value
    ui.image.value = figure_png(lifecycle_figure(ui.traces, i))
    ui.detail.value = "".join(_step_html(t, i) for t in ui.traces)


def lifecycle_stepper(
    preset: str = "pr-44053-unit-test", prompt_tokens: int | None = None, device: str = "meta"
) -> LifecycleStepper:
    """Build the lifecycle stepper: step both engines (fix off / on) phase by phase, then serving step by step.

    ``prompt_tokens`` defaults to the preset's ``default_prompt_tokens`` (at
    most ``max_model_len - 2``: one prefill-sampled token plus one decode).
    Each preset/prompt change builds two engines on ``device`` (``"meta"``:
    shapes only, under a second for the default preset; presets with many
    decode buckets, e.g. ``max_num_seqs=256``, take several seconds).

    Raises ``ValueError`` for an unknown preset, a prompt out of range or a bad
    device, ``ImportError`` without ipywidgets.
    """
    load_preset(preset)
    if device not in ("meta", "cpu", "cuda"):
        raise ValueError(f"device must be 'meta', 'cpu' or 'cuda', got {device!r}")
    return LifecycleStepper(preset, prompt_tokens, device)


def snapshot(fig):
    """``IPython.display.Image`` of a figure: the static picture a notebook cell shows before its widget."""
    from IPython.display import Image

    return Image(data=figure_png(fig), format="png")


def default_layout_requests() -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The layout explorer's default call: split-KV decode views of the ``pr-44053-unit-test`` preset."""
    return _default_layout_requests()
