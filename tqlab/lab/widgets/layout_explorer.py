"""Layout explorer: one ``get_simultaneous`` call view by view — bytes, 256-byte padding, offsets, total.

Pure functions :func:`layout_rows` / :func:`layout_figure` (static figures for
headless runs) and the widget :func:`layout_explorer`, whose callbacks
:func:`layout_add`, :func:`layout_remove` and :func:`refresh_layout` tests drive
by setting ``.value`` on its controls. The layout is
:func:`tqlab.core.workspace.compute_layout`, mirroring ``WorkspaceManager.get_simultaneous``
in ``vllm/v1/worker/workspace.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import torch

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import reservation_plan
from tqlab.core.workspace import ALIGNMENT, WorkspaceLayout, compute_layout, round_up
from tqlab.lab.plots_workspace import plot_layout
from tqlab.lab.widgets._common import CRASH_COLOR, dtype_name, esc, figure_png, mib, require_widgets

__all__ = [
    "DTYPE_CHOICES",
    "LayoutExplorer",
    "LayoutRow",
    "default_layout_requests",
    "layout_add",
    "layout_explorer",
    "layout_figure",
    "layout_remove",
    "layout_rows",
    "parse_shape",
    "refresh_layout",
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
    """The rows of :func:`tqlab.core.workspace.compute_layout` for ``requests``, plus the layout itself.

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

    Drawn by :func:`tqlab.lab.plots_workspace.plot_layout`. ``scale="bytes"`` draws every
    segment in proportion to its bytes (the truth: tiny views vanish next to
    big ones); ``scale="schematic"`` gives small views and padding a readable
    width (labels keep the true offsets). Returns a matplotlib ``Figure``.
    Raises ``ValueError`` for another scale, and what ``compute_layout`` raises.
    """
    from matplotlib.figure import Figure


    if scale not in ("bytes", "schematic"):
        raise ValueError(f"scale must be 'bytes' or 'schematic', got {scale!r}")
    rows, lay = layout_rows(requests)
    fig = Figure(figsize=(10.0, 2.3), layout="constrained")
    ax = fig.subplots()
    pad = sum(r.padding for r in rows)
    plot_layout(lay, [f"#{r.index}" for r in rows], schematic=(scale == "schematic"), ax=ax,
                title=f"get_simultaneous: {len(rows)} view(s), {lay.total_bytes:,} bytes = "
                      f"{mib(lay.total_bytes):.3f} MiB (padding {pad:,} B)")
    return fig


def _layout_table_html(requests) -> str:
    rows, lay = layout_rows(requests)
    head = "<tr><th>#</th><th>shape</th><th>dtype</th><th>bytes</th><th>offset</th><th>padding</th><th>end (aligned)</th></tr>"
    body = "".join(
        f"<tr><td>{r.index}</td><td>{tuple(r.shape)}</td><td>{dtype_name(r.dtype)}</td>"
        f"<td>{r.nbytes:,}</td><td>{r.offset:,}</td><td>{r.padding:,}</td>"
        f"<td>{r.offset + round_up(r.nbytes, ALIGNMENT):,}</td></tr>"
        for r in rows
    )
    total = (
        f"<p><b>total {lay.total_bytes:,} bytes = {mib(lay.total_bytes):.4f} MiB</b> "
        f"(sum of round_up(nbytes, {ALIGNMENT})); padding {sum(lay.padding):,} bytes</p>"
    )
    return f"<table class='tqlab-table'>{head}{body}</table>{total}"


def default_layout_requests() -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The layout explorer's default call: split-KV decode views of the ``pr-44053-unit-test`` preset."""
    cfg = EngineConfig.from_preset("pr-44053-unit-test")
    return [(tuple(s), d) for s, d in reservation_plan(cfg)[0]]


def _request_label(i: int, req) -> str:
    return f"{i}: {tuple(req[0])} {dtype_name(req[1])}"


class LayoutExplorer:
    """Controls and state of :func:`layout_explorer` (see there)."""

    def __init__(self, requests):
        w = require_widgets()
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
        ui.status.value = f"<span style='color:{CRASH_COLOR}'>not added: {esc(str(e))}</span>"
        return
    ui.requests.append(req)
    ui.status.value = f"added {esc(_request_label(len(ui.requests) - 1, req))}"
    refresh_layout(ui)


def layout_remove(ui: LayoutExplorer) -> None:
    """Remove the view selected in ``ui.listing`` (callback of "remove selected"); nothing selected: say so."""
    label = ui.listing.value
    if label is None:
        ui.status.value = "select a view to remove"
        return
    idx = int(label.split(":", 1)[0])
    removed = ui.requests.pop(idx)
    ui.status.value = f"removed {esc(_request_label(idx, removed))}"
    refresh_layout(ui)


def layout_explorer(requests: Sequence[tuple[Sequence[int], torch.dtype]] | None = None) -> LayoutExplorer:
    """Build the layout explorer: add/remove ``(shape, dtype)`` views, see the byte map, offsets, padding, total.

    ``requests`` defaults to the split-KV decode call of the ``pr-44053-unit-test``
    preset (``(16,8,4,129) f32, (16,8,128) f16, (16,8) f32``). Raises what
    ``compute_layout`` raises for bad requests, ``ImportError`` without ipywidgets.
    """
    reqs = default_layout_requests() if requests is None else [(tuple(s), d) for s, d in requests]
    compute_layout(reqs)  # validate before building anything
    return LayoutExplorer(reqs)
