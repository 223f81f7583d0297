"""Pictures and small display helpers for the notebooks.

Each figure has a pure "data" function (tested with exact values) and a
``plot_*`` function that draws it with matplotlib:

* byte map of a workspace layout — :func:`layout_segments` / :func:`plot_byte_maps`
  (views, alignment padding, unused bytes, offsets);
* workspace size over the lifecycle from a manager's event log —
  :func:`timeline_points` / :func:`plot_workspace_timeline` (one line per ubatch
  slot, lock/unlock shading, violations marked at the size they asked for);
* workspace size after each engine phase — :func:`plot_phases` and
  :func:`phases_markdown` (``LLMEngine.phases``);
* a need-vs-length curve with reference levels — :func:`plot_need_curve`;
* plain bar charts — :func:`plot_bars`.

Display helpers: :func:`fmt_bytes`, :func:`markdown_table`, :func:`show_md`,
:func:`show_error`, :class:`PhaseMarker` (an ``on_phase`` callback that
remembers where each phase ends in the event log) and
:func:`debug_workspace_log` (capture ``TQLAB_DEBUG_WORKSPACE=1`` log lines).

matplotlib is imported lazily: importing this module never needs a display.
Sizes on axes are MiB (2**20 bytes), as vLLM's "MB".
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .workspace import ALIGNMENT, MiB, WorkspaceEvent, WorkspaceLayout, round_up

__all__ = [
    "PhaseMarker",
    "Segment",
    "debug_workspace_log",
    "fmt_bytes",
    "layout_segments",
    "markdown_table",
    "phases_markdown",
    "plot_bars",
    "plot_byte_maps",
    "plot_layout",
    "plot_need_curve",
    "plot_phases",
    "plot_workspace_timeline",
    "show_error",
    "show_md",
    "slot_sizes_after_events",
    "timeline_points",
]

_VIEW_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")
_PAD_COLOR = "#d9d9d9"
_FREE_COLOR = "#ffffff"
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _unit(max_bytes: int) -> tuple[str, int]:
    """The binary unit that shows ``max_bytes`` as a number between 1 and 1024."""
    for name in ("GiB", "MiB", "KiB"):
        if max_bytes >= _UNITS[name]:
            return name, _UNITS[name]
    return "B", 1


# --------------------------------------------------------------------------- #
# Formatting                                                                  #
# --------------------------------------------------------------------------- #


def fmt_bytes(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1: ``'256 B'``, ``'1.50 KiB'``, ``'2.00 MiB'``.

    Raises ``ValueError`` for a negative count, ``TypeError`` for a non-integer.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes < 1024:
        return f"{nbytes} B"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:.2f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed and ``|`` is escaped.

    Raises ``ValueError`` if a row's length differs from the header's.
    """
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells, the header has {len(headers)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def _display(obj_html: str | None, md: str | None, text: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import HTML, Markdown, display
    except ImportError:
        print(text)
        return
    if get_ipython() is None:
        print(text)
    elif obj_html is not None:
        display(HTML(obj_html))
    else:
        display(Markdown(md))


def show_md(text: str) -> None:
    """Render Markdown in a notebook (``IPython.display.Markdown``); print it elsewhere."""
    _display(None, text, text)


def show_error(exc: BaseException, title: str | None = None) -> None:
    """Show a caught exception as a red box: ``'Type: message'`` under ``title`` (printed outside notebooks).

    For the notebooks' *expected* failures: the cell catches the exception and
    shows it, so the executed notebook has no error cells.
    """
    text = f"{type(exc).__name__}: {exc}"
    head = title or "Caught, as expected"
    box = (
        '<div style="border:2px solid #c53030;background:#fff5f5;color:#742a2a;padding:8px 12px;'
        'margin:6px 0;border-radius:4px">'
        f"<b>{html.escape(head)}</b>"
        f'<pre style="white-space:pre-wrap;margin:4px 0 0 0;background:transparent">{html.escape(text)}</pre></div>'
    )
    _display(box, None, f"{head}\n{text}")


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
    Returns the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not rows:
        raise ValueError("plot_byte_maps needs at least one (name, layout, labels) row")
    size = max([lay.total_bytes for _, lay, _ in rows] + [buffer_bytes or 0])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.9 * len(rows)))
    all_segs = [layout_segments(lay, labs, size) for _, lay, labs in rows]

    def xmap_for(segs: list[Segment]):
        if not schematic:
            return lambda b: b
        # piecewise linear: each segment gets width max(its share, a floor)
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

    for r, ((name, lay, labs), segs) in enumerate(zip(rows, all_segs)):
        y = len(rows) - 1 - r
        f = xmap_for(segs)
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
        if show_offsets:
            last_x = None
            for off in lay.offsets:
                x = f(off)
                ax.plot([x], [y + 0.36], marker="v", color="black", markersize=5)
                crowded = last_x is not None and (x - last_x) < 0.07 * size
                ax.text(x, y + 0.42, f"{off:,}", ha="left" if crowded else "center", va="bottom", fontsize=7)
                last_x = x
            end = f(lay.total_bytes)
            ax.plot([end, end], [y - 0.34, y + 0.34], color="black", linewidth=1.5)
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
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


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


# --------------------------------------------------------------------------- #
# Lifecycle timeline from the event log                                       #
# --------------------------------------------------------------------------- #


def slot_sizes_after_events(events: Sequence[WorkspaceEvent], num_slots: int) -> list[tuple[int, ...]]:
    """Size of every slot (bytes) after each event: ``resize`` sets its slot, other kinds change nothing.

    Raises ``ValueError`` if an event names a slot outside ``range(num_slots)``.
    """
    sizes = [0] * num_slots
    out = []
    for i, ev in enumerate(events):
        if not 0 <= ev.ubatch < num_slots:
            raise ValueError(f"event {i} is for slot {ev.ubatch}, outside 0..{num_slots - 1}")
        if ev.kind == "resize":
            sizes[ev.ubatch] = ev.new_bytes
        elif ev.kind == "alloc_failed":
            sizes[ev.ubatch] = 0
        out.append(tuple(sizes))
    return out


def timeline_points(
    events: Sequence[WorkspaceEvent],
    phases: Sequence[tuple[str, int]] | None = None,
    num_slots: int | None = None,
) -> tuple[list[tuple[float, tuple[int, ...], WorkspaceEvent | None]], list[tuple[str, float, float]]]:
    """Positions for a lifecycle chart: one x step per event, one step for an event-less phase.

    Args:
        events: a manager's ``events``.
        phases: ``(label, events_so_far)`` in order, ``events_so_far`` being
            ``len(events)`` when the phase ended (what :class:`PhaseMarker`
            records). Events after the last phase form an unlabeled tail.
            None: no phases, one step per event.
        num_slots: slots to track (default: 1 + the largest slot in the events).

    Returns:
        ``(points, spans)``: ``points`` are ``(x, sizes_per_slot, event_or_None)``
        starting with ``(0, zeros, None)``; a phase without events adds a point
        with ``None``. ``spans`` are ``(label, x_start, x_end)`` per phase.

    Raises ``ValueError`` when phase ends decrease or exceed ``len(events)``.
    """
    n = len(events)
    slots = num_slots if num_slots is not None else 1 + max((e.ubatch for e in events), default=0)
    sizes = slot_sizes_after_events(events, slots)
    marks = list(phases or [])
    prev = 0
    for label, end in marks:
        if end < prev or end > n:
            raise ValueError(f"phase {label!r} ends at event {end}, outside {prev}..{n}")
        prev = end
    if not marks or marks[-1][1] < n:
        marks.append(("", n))
    points: list[tuple[float, tuple[int, ...], WorkspaceEvent | None]] = [(0.0, tuple([0] * slots), None)]
    spans = []
    x, start_ev = 0.0, 0
    current = tuple([0] * slots)
    for label, end in marks:
        x0 = x
        if end == start_ev:
            x += 1
            points.append((x, current, None))
        for i in range(start_ev, end):
            x += 1
            current = sizes[i]
            points.append((x, current, events[i]))
        if label:
            spans.append((label, x0, x))
        start_ev = end
    return points, spans


def plot_workspace_timeline(
    events: Sequence[WorkspaceEvent],
    phases: Sequence[tuple[str, int]] | None = None,
    *,
    num_slots: int | None = None,
    ax=None,
    title: str | None = None,
    annotate_resizes: bool = True,
    unit: str | None = None,
):
    """Workspace size of each ubatch slot along the event log (unit: B/KiB/MiB/GiB, picked to fit, or ``unit``).

    Steps at every ``resize``; the locked stretch (``lock`` .. ``unlock``) is
    shaded; a ``violation`` is a red cross at the size it asked for, with a
    dotted line from the size it had. ``phases`` labels spans of the log
    (see :func:`timeline_points`). Returns the ``Axes``.
    """
    import matplotlib.pyplot as plt

    points, spans = timeline_points(events, phases, num_slots)
    slots = len(points[0][1])
    biggest = max([max(p[1]) for p in points] + [e.new_bytes for e in events if e.kind == "violation"] + [1])
    if unit is not None and unit not in _UNITS:
        raise ValueError(f"unit must be one of {tuple(_UNITS)}, got {unit!r}")
    uname, div = _unit(biggest) if unit is None else (unit, _UNITS[unit])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.8))
    xs = [p[0] for p in points] + [points[-1][0] + 0.5]
    for s in range(slots):
        ys = [p[1][s] / div for p in points] + [points[-1][1][s] / div]
        ax.step(xs, ys, where="post", linewidth=2,
                color=_VIEW_COLORS[s % len(_VIEW_COLORS)], label=f"slot {s}" if slots > 1 else "workspace size")
    top = biggest / div
    # locked stretches
    lock_x = None
    for x, _, ev in points:
        if ev is None:
            continue
        if ev.kind == "lock" and lock_x is None:
            lock_x = x
        elif ev.kind == "unlock" and lock_x is not None:
            ax.axvspan(lock_x, x, color="#fed7d7", alpha=0.5, lw=0)
            lock_x = None
    if lock_x is not None:
        ax.axvspan(lock_x, xs[-1], color="#fed7d7", alpha=0.5, lw=0, label="locked")
    for x, _, ev in points:
        if ev is None:
            continue
        if ev.kind == "violation":
            ax.plot([x], [ev.new_bytes / div], marker="X", color="#c53030", markersize=11, linestyle="none")
            ax.plot([x, x], [ev.old_bytes / div, ev.new_bytes / div], color="#c53030", linestyle=":")
            high = ev.new_bytes / div > 0.5 * top  # write below a high cross, above a low one
            ax.annotate(f"violation: asks {ev.new_bytes / div:.2f} {uname}\nfrom {ev.caller}", (x, ev.new_bytes / div),
                        textcoords="offset points", xytext=(-12, -8 if high else 8), ha="right",
                        va="top" if high else "bottom", fontsize=8, color="#c53030")
        elif ev.kind in ("lock", "unlock"):
            ax.axvline(x, color="#444444", linestyle="--", linewidth=0.8)
            ax.text(x, top * 1.13, ev.kind, rotation=90, ha="right", va="top", fontsize=8, color="#444444")
        elif ev.kind == "resize" and annotate_resizes:
            ax.annotate(f"{ev.new_bytes / div:.2f}", (x, ev.new_bytes / div), textcoords="offset points",
                        xytext=(3, 3), fontsize=7)
    for k, (label, x0, x1) in enumerate(spans):
        if k:
            ax.axvline(x0 + 0.5, color="#999999", linewidth=0.6)
    handles, labs = ax.get_legend_handles_labels()
    if lock_x is not None or any(e.kind == "lock" for e in events):
        from matplotlib.patches import Patch

        if "locked" not in labs:
            handles.append(Patch(color="#fed7d7", alpha=0.5, label="locked"))
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    ax.set_ylim(-0.04 * top, top * 1.18)
    ax.set_xlim(-0.2, xs[-1] + 0.2)
    if spans:
        ax.set_xticks([(x0 + x1) / 2 + 0.5 for _, x0, x1 in spans])
        ax.set_xticklabels([label for label, _, _ in spans], fontsize=8, rotation=15 if len(spans) > 4 else 0)
        ax.tick_params(axis="x", length=0)
        ax.set_xlabel("lifecycle phase (one step per workspace event)")
    else:
        ax.set_xticks([])
        ax.set_xlabel("workspace events, in order")
    ax.set_ylabel(f"workspace size ({uname})")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


class PhaseMarker:
    """An ``on_phase`` callback for :class:`~tqlab.engine.LLMEngine` that remembers phase ends.

    ``marks`` gets ``(phase name, len(manager.events))`` after each phase (the
    manager is the process-wide one, which the engine creates in its first
    phase); ``records`` keeps the ``PhaseRecord`` objects. With ``echo=True``
    each phase is printed as it ends, with its workspace size.
    """

    def __init__(self, echo: bool = False):
        self.echo = echo
        self.marks: list[tuple[str, int]] = []
        self.records: list[Any] = []

    def __call__(self, record: Any) -> None:
        from .workspace import current_workspace_manager, is_workspace_manager_initialized

        n = len(current_workspace_manager().events) if is_workspace_manager_initialized() else 0
        self.marks.append((record.name, n))
        self.records.append(record)
        if self.echo:
            sizes = ", ".join(f"{b / MiB:.2f}" for b in record.workspace_bytes)
            print(f"{record.name:<15} workspace [{sizes}] MiB   {record.note}")

    def mark(self, name: str, manager: Any) -> None:
        """Add a phase by hand (e.g. ``"serve"``) ending at ``len(manager.events)``."""
        self.marks.append((name, len(manager.events)))


# --------------------------------------------------------------------------- #
# Engine phases                                                               #
# --------------------------------------------------------------------------- #


def phases_markdown(phases: Sequence[Any]) -> str:
    """Markdown table of ``LLMEngine.phases``: phase, workspace MiB per slot (two decimals, as vLLM), seconds, note."""
    rows = []
    for p in phases:
        sizes = " / ".join(f"{b / MiB:.2f}" for b in p.workspace_bytes)
        rows.append((p.name, sizes, f"{p.workspace_bytes[0]:,}", f"{p.seconds:.2f}", p.note))
    return markdown_table(("phase", "workspace after it (MiB)", "bytes (slot 0)", "seconds", "what happens"), rows)


def plot_phases(
    phases: Sequence[Any],
    *,
    need_bytes: int | None = None,
    need_label: str = "request needs",
    ax=None,
    title: str | None = None,
):
    """Bars: workspace size (MiB, slot 0) after each engine phase; optional dashed line at ``need_bytes``.

    Returns the ``Axes``.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    names = [p.name for p in phases]
    vals = [p.workspace_bytes[0] / MiB for p in phases]
    bars = ax.bar(names, vals, color=[_VIEW_COLORS[0]] * len(vals))
    top = max(vals + [0 if need_bytes is None else need_bytes / MiB, 1e-9])
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, v + top * 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=9)
    if need_bytes is not None:
        ax.axhline(need_bytes / MiB, color="#c53030", linestyle="--", linewidth=1.5)
        ax.text(len(vals) - 0.5, need_bytes / MiB, f"{need_label}: {need_bytes / MiB:.2f} MiB", color="#c53030",
                ha="right", va="bottom", fontsize=9)
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel("workspace after phase (MiB)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


# --------------------------------------------------------------------------- #
# Bars                                                                        #
# --------------------------------------------------------------------------- #


def plot_bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ax=None,
    ylabel: str = "",
    title: str | None = None,
    fmt: str = "{:.2f}",
    log: bool = False,
    hline: float | None = None,
    hline_label: str | None = None,
    colors: Sequence[str] | None = None,
    horizontal: bool = False,
):
    """A labelled bar chart; each bar carries ``fmt.format(value)``. Returns the ``Axes``.

    Raises ``ValueError`` when ``labels`` and ``values`` differ in length.
    """
    import matplotlib.pyplot as plt

    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels but {len(values)} values")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(labels)) if horizontal else (9, 3.4))
    cols = list(colors) if colors is not None else [_VIEW_COLORS[i % len(_VIEW_COLORS)] for i in range(len(values))]
    if horizontal:
        bars = ax.barh(list(labels), list(values), color=cols)
        ax.invert_yaxis()
        ax.set_xlabel(ylabel)
        if log:
            ax.set_xscale("log")
        for b, v in zip(bars, values):
            ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt.format(v), va="center", fontsize=9)
        if hline is not None:
            ax.axvline(hline, color="#c53030", linestyle="--", label=hline_label)
        ax.set_xlim(right=(max(values) if values else 1) * (3 if log else 1.25))
    else:
        bars = ax.bar(list(labels), list(values), color=cols)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        for b, v in zip(bars, values):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), fmt.format(v), ha="center", va="bottom", fontsize=9)
        if hline is not None:
            ax.axhline(hline, color="#c53030", linestyle="--", label=hline_label)
        ax.set_ylim(top=(max(values) if values else 1) * (3 if log else 1.18))
    if hline is not None and hline_label:
        ax.legend(fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


def plot_need_curve(
    xs: Sequence[int],
    need_bytes: Sequence[int],
    *,
    levels: Sequence[tuple[str, int]] = (),
    points: Sequence[tuple[str, int, int]] = (),
    ax=None,
    xlabel: str = "cached_len (tokens)",
    title: str | None = None,
    label: str = "workspace the request needs",
):
    """A workspace need (MiB) as a step curve over ``xs``, with horizontal ``levels`` and marked ``points``.

    ``levels``: ``(label, bytes)`` drawn as dashed lines (e.g. the locked size,
    the reservation). ``points``: ``(label, x, bytes)`` drawn as dots (e.g. a
    prompt's chunk). Raises ``ValueError`` when ``xs`` and ``need_bytes``
    differ in length or are empty. Returns the ``Axes``.
    """
    import matplotlib.pyplot as plt

    if len(xs) != len(need_bytes) or not xs:
        raise ValueError(f"need as many values as x positions (got {len(xs)} and {len(need_bytes)}), and at least one")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6))
    ax.step(list(xs), [b / MiB for b in need_bytes], where="post", linewidth=2, color=_VIEW_COLORS[0], label=label)
    line_colors = ("#c53030", "#2f855a", "#6b46c1", "#b7791f")
    for k, (lab, b) in enumerate(levels):
        ax.axhline(b / MiB, color=line_colors[k % len(line_colors)], linestyle="--", linewidth=1.3,
                   label=f"{lab}: {b / MiB:.2f} MiB")
    for k, (lab, x, b) in enumerate(points):
        ax.plot([x], [b / MiB], marker="o", color="black", markersize=6, linestyle="none")
        ax.annotate(f"{lab}\n{b / MiB:.2f} MiB", (x, b / MiB), textcoords="offset points", xytext=(6, 6),
                    fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("workspace (MiB)")
    ax.set_xlim(0, max(xs) * 1.02 if max(xs) else 1)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    return ax


# --------------------------------------------------------------------------- #
# Debug logging                                                               #
# --------------------------------------------------------------------------- #


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(level=logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


@contextlib.contextmanager
def debug_workspace_log(echo: bool = True) -> Iterator[list[str]]:
    """Turn on ``TQLAB_DEBUG_WORKSPACE=1`` for the body and collect the workspace log lines.

    Yields the list that receives each message; with ``echo`` every line is
    also printed to stdout (not stderr, so notebooks show it as normal output).
    The variable, the logger's handlers, level and propagation are restored on
    exit, even if the body raises.
    """
    lines: list[str] = []
    log = logging.getLogger("tqlab.workspace")
    old_env = os.environ.get("TQLAB_DEBUG_WORKSPACE")
    old_level, old_prop = log.level, log.propagate
    handler = _ListHandler(lines)
    printer = None
    if echo:
        import sys

        printer = logging.StreamHandler(sys.stdout)
        printer.setLevel(logging.INFO)
        printer.setFormatter(logging.Formatter("%(message)s"))
    os.environ["TQLAB_DEBUG_WORKSPACE"] = "1"
    log.addHandler(handler)
    if printer is not None:
        log.addHandler(printer)
    log.propagate = False
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        if printer is not None:
            log.removeHandler(printer)
        log.setLevel(old_level)
        log.propagate = old_prop
        if old_env is None:
            os.environ.pop("TQLAB_DEBUG_WORKSPACE", None)
        else:
            os.environ["TQLAB_DEBUG_WORKSPACE"] = old_env
