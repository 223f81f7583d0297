"""Byte maps of workspace layouts: :func:`layout_segments` (pure, tested exactly) and :func:`plot_byte_maps` /
:func:`plot_layout` (views, alignment padding, offsets). Also the palette and axis finish every workspace figure
shares. :mod:`tqlab.lab.plots_workspace` re-exports the public names.

matplotlib is imported lazily. Sizes on axes are MiB (2**20 bytes), as vLLM's "MB".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tqlab.core.workspace import ALIGNMENT, WorkspaceLayout, round_up
from tqlab.lab.display import fmt_bytes

__all__ = ["Segment", "layout_segments", "plot_byte_maps", "plot_layout"]

_VIEW_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")
_PAD_COLOR = "#d9d9d9"
_FREE_COLOR = "#ffffff"
# --------------------------------------------------------------------------- #
# Byte map of a layout                                                        #
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Byte map of a layout                                                        #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Segment:
    """A byte range ``[start, end)`` of a workspace buffer.

    ``kind``: ``"view"`` (bytes a requested tensor uses), ``"pad"`` (alignment
    padding after view ``index``) or ``"free"`` (buffer bytes this call leaves unused).
    """

    kind: str
    label: str
    start: int
    end: int
    index: int = -1

    @property
    def nbytes(self) -> int:
        return self.end - self.start



def _finish_axes(ax, title: str | None):
    """The house style every plot here ends with: no top/right spines, a left-aligned title. Returns ``ax``."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax

def layout_segments(
    layout: WorkspaceLayout, labels: Sequence[str] | None = None, buffer_bytes: int | None = None
) -> list[Segment]:
    """Cut ``[0, max(total, buffer_bytes))`` into view / padding / free segments, in byte order.

    Views of zero bytes give no segment (their padding is zero too). Raises
    ``ValueError`` when ``labels`` has the wrong length or ``buffer_bytes`` is
    negative.
    """
    n = len(layout.shapes)
    if labels is None:
        labels = [f"view {i}" for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} views")
    if buffer_bytes is not None and buffer_bytes < 0:
        raise ValueError(f"buffer_bytes must be >= 0, got {buffer_bytes}")
    segs: list[Segment] = []
    for i, (off, nb) in enumerate(zip(layout.offsets, layout.nbytes)):
        if nb:
            segs.append(Segment("view", labels[i], off, off + nb, i))
        end = off + round_up(nb, ALIGNMENT)
        if end > off + nb:
            segs.append(Segment("pad", f"pad after {labels[i]}", off + nb, end, i))
    if buffer_bytes is not None and buffer_bytes > layout.total_bytes:
        segs.append(Segment("free", "unused", layout.total_bytes, buffer_bytes))
    return segs


def _layout_title(layout: WorkspaceLayout, labels: Sequence[str]) -> str:
    return ", ".join(f"{lab} {tuple(s)} {str(d).removeprefix('torch.')}" for lab, s, d in zip(labels, layout.shapes, layout.dtypes))


def _byte_xmap(segs: list[Segment], size: int, schematic: bool):
    """Byte offset -> x position: identity, or (schematic) piecewise linear with every segment
    at least 12 % of the buffer wide, so sizes differing by orders of magnitude stay visible."""
    if not schematic:
        return lambda b: b
    floor = 0.12 * size
    xs, acc = [0.0], 0.0
    for s in segs:
        acc += max(float(s.nbytes), floor)
        xs.append(acc)
    scale = size / acc if acc else 1.0
    bounds = [segs[0].start] + [s.end for s in segs] if segs else [0, size]

    def f(b: float) -> float:
        for j in range(len(segs)):
            lo, hi = bounds[j], bounds[j + 1]
            if lo <= b <= hi:
                frac = 0.0 if hi == lo else (b - lo) / (hi - lo)
                return (xs[j] + frac * (xs[j + 1] - xs[j])) * scale
        return size

    return f


def _draw_segments(ax, y: int, segs: list[Segment], f, size: int) -> None:
    """One row's bars: coloured views (labelled inside when wide, below when narrow), hatched padding, white free."""
    n_small = 0
    for s in segs:
        x0, x1 = f(s.start), f(s.end)
        if s.kind == "view":
            color, hatch, ec = _VIEW_COLORS[s.index % len(_VIEW_COLORS)], None, "black"
        elif s.kind == "pad":
            color, hatch, ec = _PAD_COLOR, "///", "#888888"
        else:
            color, hatch, ec = _FREE_COLOR, None, "#bbbbbb"
        ax.barh(y, x1 - x0, left=x0, height=0.6, color=color, hatch=hatch, edgecolor=ec, linewidth=0.8)
        if s.kind == "view" and (x1 - x0) > 0.08 * size:
            ax.text((x0 + x1) / 2, y, f"{s.label}\n{fmt_bytes(s.nbytes)}", ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold")
        elif s.kind == "view":
            ax.text(x0, y - 0.34 - 0.16 * (n_small % 2), f"{s.label} {fmt_bytes(s.nbytes)}", ha="left",
                    va="top", fontsize=7, color=color)
            n_small += 1
        elif s.kind == "free" and (x1 - x0) > 0.08 * size:
            ax.text((x0 + x1) / 2, y, f"unused {fmt_bytes(s.nbytes)}", ha="center", va="center",
                    fontsize=8, color="#666666")


def _draw_offsets(ax, y: int, layout: WorkspaceLayout, f, size: int) -> None:
    """A tick and the byte offset above each view's start; a bar at the layout's end."""
    last_x = None
    for off in layout.offsets:
        x = f(off)
        ax.plot([x], [y + 0.36], marker="v", color="black", markersize=5)
        crowded = last_x is not None and (x - last_x) < 0.07 * size
        ax.text(x, y + 0.42, f"{off:,}", ha="left" if crowded else "center", va="bottom", fontsize=7)
        last_x = x
    end = f(layout.total_bytes)
    ax.plot([end, end], [y - 0.34, y + 0.34], color="black", linewidth=1.5)


def plot_byte_maps(
    rows: Sequence[tuple[str, WorkspaceLayout, Sequence[str] | None]],
    *,
    buffer_bytes: int | None = None,
    schematic: bool = False,
    ax=None,
    title: str | None = None,
    show_offsets: bool = True,
):
    """Draw one horizontal byte map per ``(name, layout, labels)`` row, on one byte axis.

    Every row starts at byte 0 of the same buffer: rows are successive
    ``get_simultaneous`` calls, which all reuse the buffer from offset 0.
    Views are coloured, padding is grey and hatched, unused buffer bytes are
    white. ``buffer_bytes`` (default: the largest total) is the buffer size.

    ``schematic=True`` gives every segment a readable width (sizes differing by
    orders of magnitude stay visible); labels still give the true offsets.
    Returns the matplotlib ``Axes``. Raises ``ValueError`` for no rows.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not rows:
        raise ValueError("plot_byte_maps needs at least one (name, layout, labels) row")
    size = max([lay.total_bytes for _, lay, _ in rows] + [buffer_bytes or 0])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.9 * len(rows)))
    all_segs = [layout_segments(lay, labs, size) for _, lay, labs in rows]
    for r, ((_, lay, _), segs) in enumerate(zip(rows, all_segs)):
        y = len(rows) - 1 - r
        f = _byte_xmap(segs, size, schematic)
        _draw_segments(ax, y, segs, f, size)
        if show_offsets:
            _draw_offsets(ax, y, lay, f, size)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name for name, _, _ in reversed(rows)])
    ax.set_xlim(0, size * 1.01 if size else 1)
    ax.set_ylim(-0.75, len(rows) - 0.2)
    if schematic:
        ax.set_xticks([])
        ax.set_xlabel(f"byte offset (schematic widths; buffer = {fmt_bytes(size)}, numbers are true offsets)")
    else:
        ax.set_xlabel(f"byte offset (buffer = {size:,} bytes = {fmt_bytes(size)})")
    handles = [Patch(facecolor=_PAD_COLOR, hatch="///", edgecolor="#888888", label=f"padding to {ALIGNMENT} B")]
    if any(s.kind == "free" for segs in all_segs for s in segs):
        handles.append(Patch(facecolor=_FREE_COLOR, edgecolor="#bbbbbb", label="unused by this call"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9, bbox_to_anchor=(1.0, 1.35))
    return _finish_axes(ax, title)


def plot_layout(
    layout: WorkspaceLayout,
    labels: Sequence[str] | None = None,
    *,
    buffer_bytes: int | None = None,
    schematic: bool = False,
    ax=None,
    title: str | None = None,
):
    """Byte map of one ``get_simultaneous`` layout (see :func:`plot_byte_maps`). Returns the ``Axes``."""
    labels = list(labels) if labels is not None else [f"view {i}" for i in range(len(layout.shapes))]
    return plot_byte_maps(
        [("buffer", layout, labels)], buffer_bytes=buffer_bytes, schematic=schematic, ax=ax,
        title=title if title is not None else _layout_title(layout, labels),
    )
