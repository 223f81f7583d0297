"""Workspace figures for the notebooks; each has a pure data function (tested exactly) and a ``plot_*``.

* byte maps of layouts — :func:`layout_segments` / :func:`plot_byte_maps` (views, padding, offsets);
* the lifecycle from a manager's event log — :func:`timeline_points` / :func:`plot_workspace_timeline`
  (a line per ubatch slot, locked stretches shaded, violations at the size they asked for; a log axis
  when sizes span orders of magnitude);
* engine phases — :func:`plot_phases`, :func:`phases_markdown`, :class:`PhaseMarker`;
* need-vs-length curves — :func:`plot_need_curve`; bar charts — :func:`plot_bars`.

matplotlib is imported lazily. Sizes on axes are MiB (2**20 bytes), as vLLM's "MB";
the manager and its events mirror ``vllm/v1/worker/workspace.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tqlab.core.workspace import ALIGNMENT, MiB, WorkspaceEvent, WorkspaceLayout, round_up
from tqlab.lab.display import BYTE_UNITS, byte_unit, fmt_bytes, markdown_table

__all__ = [
    "PhaseMarker",
    "Segment",
    "layout_segments",
    "phases_markdown",
    "plot_bars",
    "plot_byte_maps",
    "plot_layout",
    "plot_need_curve",
    "set_size_log_ticks",
    "plot_phases",
    "plot_workspace_timeline",
    "slot_sizes_after_events",
    "timeline_points",
]

_VIEW_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")
_PAD_COLOR = "#d9d9d9"
_FREE_COLOR = "#ffffff"
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


def _timeline_scale(values: Sequence[int], yscale: str) -> bool:
    """True for a log axis: ``yscale="log"``, or ``"auto"`` when the plotted sizes span more than 20x."""
    if yscale not in ("auto", "linear", "log"):
        raise ValueError(f"yscale must be 'auto', 'linear' or 'log', got {yscale!r}")
    nonzero = [v for v in values if v > 0]
    if yscale == "auto":
        return len(nonzero) > 1 and max(nonzero) > 20 * min(nonzero)
    return yscale == "log"


def _shade_locked(ax, points, x_end: float) -> bool:
    """Shade each ``lock`` .. ``unlock`` stretch; True when the log ends locked."""
    lock_x = None
    for x, _, ev in points:
        if ev is not None and ev.kind == "lock" and lock_x is None:
            lock_x = x
        elif ev is not None and ev.kind == "unlock" and lock_x is not None:
            ax.axvspan(lock_x, x, color="#fed7d7", alpha=0.5, lw=0)
            lock_x = None
    if lock_x is not None:
        ax.axvspan(lock_x, x_end, color="#fed7d7", alpha=0.5, lw=0, label="locked")
    return lock_x is not None


def _mark_events(ax, points, div: int, uname: str, top: float, log: bool, annotate_resizes: bool,
                 annotate_violations: bool = True) -> None:
    """Violations (red cross at the size asked for, and a label unless ``annotate_violations`` is False),
    lock/unlock lines, resize values."""
    label_y = top * (2.2 if log else 1.13)
    for x, _, ev in points:
        if ev is None:
            continue
        if ev.kind == "violation" and not annotate_violations:
            y = ev.new_bytes / div
            ax.plot([x], [y], marker="X", color="#c53030", markersize=11, linestyle="none")
            ax.plot([x, x], [ev.old_bytes / div, y], color="#c53030", linestyle=":")
        elif ev.kind == "violation":
            y = ev.new_bytes / div
            ax.plot([x], [y], marker="X", color="#c53030", markersize=11, linestyle="none")
            ax.plot([x, x], [ev.old_bytes / div, y], color="#c53030", linestyle=":")
            high = y > (top / 8 if log else 0.5 * top)  # write below a high cross, above a low one
            ax.annotate(f"violation: asks {y:.2f} {uname}\nfrom {ev.caller}", (x, y),
                        textcoords="offset points", xytext=(-12, -8 if high else 8), ha="right",
                        va="top" if high else "bottom", fontsize=8, color="#c53030")
        elif ev.kind in ("lock", "unlock"):
            ax.axvline(x, color="#444444", linestyle="--", linewidth=0.8)
            ax.text(x, label_y, ev.kind, rotation=90, ha="right", va="top", fontsize=8, color="#444444")
        elif ev.kind == "resize" and annotate_resizes:
            ax.annotate(f"{ev.new_bytes / div:.2f}", (x, ev.new_bytes / div), textcoords="offset points",
                        xytext=(3, 3), fontsize=7)


def _label_phases(ax, spans, x_end: float) -> None:
    for k, (_, x0, _) in enumerate(spans):
        if k:
            ax.axvline(x0 + 0.5, color="#999999", linewidth=0.6)
    ax.set_xlim(-0.2, x_end + 0.2)
    if spans:
        ax.set_xticks([(x0 + x1) / 2 + 0.5 for _, x0, x1 in spans])
        ax.set_xticklabels([label for label, _, _ in spans], fontsize=8, rotation=15 if len(spans) > 4 else 0)
        ax.tick_params(axis="x", length=0)
        ax.set_xlabel("lifecycle phase (one step per workspace event)")
    else:
        ax.set_xticks([])
        ax.set_xlabel("workspace events, in order")


def set_size_log_ticks(ax, top: float) -> None:
    """On a symmetric-log size axis: y from 0 to ``top``, ticks at 0 and at 1, 2, 5 × each power of 10 above
    the linear region (a tick inside it would print on top of the 0)."""
    import math

    from matplotlib.ticker import FixedLocator, NullLocator

    linthresh = ax.yaxis.get_transform().linthresh
    ax.set_ylim(0, top)
    k0, k1 = math.floor(math.log10(linthresh)), math.floor(math.log10(top))
    ticks = [m * 10.0**k for k in range(k0, k1 + 1) for m in (1, 2, 5) if linthresh <= m * 10.0**k <= top]
    ax.yaxis.set_major_locator(FixedLocator([0.0] + ticks))
    ax.yaxis.set_minor_locator(NullLocator())


def plot_workspace_timeline(
    events: Sequence[WorkspaceEvent],
    phases: Sequence[tuple[str, int]] | None = None,
    *,
    num_slots: int | None = None,
    ax=None,
    title: str | None = None,
    annotate_resizes: bool = True,
    unit: str | None = None,
    yscale: str = "auto",
    annotate_violations: bool = True,
):
    """Workspace size of each ubatch slot along the event log (unit: B/KiB/MiB/GiB, picked to fit, or ``unit``).

    Steps at every ``resize``; the locked stretch (``lock`` .. ``unlock``) is
    shaded; a ``violation`` is a red cross at the size it asked for, with a
    dotted line from the size it had. ``phases`` labels spans of the log
    (see :func:`timeline_points`). ``yscale``: ``"linear"``, ``"log"`` (a
    symmetric-log axis, so size 0 stays on it), or ``"auto"`` — log when the
    sizes span more than 20x (0.26 MiB locked against a 64 MiB request would
    otherwise sit on the baseline). ``annotate_violations=False`` draws a
    violation's cross without its text label (say it in the title instead).
    Returns the ``Axes``.
    Raises ``ValueError`` for an unknown ``unit`` or ``yscale``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    points, spans = timeline_points(events, phases, num_slots)
    slots = len(points[0][1])
    asked = [e.new_bytes for e in events if e.kind == "violation"]
    biggest = max([max(p[1]) for p in points] + asked + [1])
    if unit is not None and unit not in BYTE_UNITS:
        raise ValueError(f"unit must be one of {tuple(BYTE_UNITS)}, got {unit!r}")
    log = _timeline_scale([v for p in points for v in p[1]] + asked, yscale)
    uname, div = byte_unit(biggest) if unit is None else (unit, BYTE_UNITS[unit])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.8))
    xs = [p[0] for p in points] + [points[-1][0] + 0.5]
    for s in range(slots):
        ys = [p[1][s] / div for p in points] + [points[-1][1][s] / div]
        ax.step(xs, ys, where="post", linewidth=2,
                color=_VIEW_COLORS[s % len(_VIEW_COLORS)], label=f"slot {s}" if slots > 1 else "workspace size")
    top = biggest / div
    ends_locked = _shade_locked(ax, points, xs[-1])
    _mark_events(ax, points, div, uname, top, log, annotate_resizes, annotate_violations)
    _label_phases(ax, spans, xs[-1])
    handles, labs = ax.get_legend_handles_labels()
    if (ends_locked or any(e.kind == "lock" for e in events)) and "locked" not in labs:
        handles.append(Patch(color="#fed7d7", alpha=0.5, label="locked"))
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    if log:
        smallest = min([v for p in points for v in p[1] if v > 0] + asked + [biggest]) / div
        ax.set_yscale("symlog", linthresh=smallest / 2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))  # 0.1, 1, 10 rather than 10^k
        set_size_log_ticks(ax, top * 3)
    else:
        ax.set_ylim(-0.04 * top, top * 1.18)
    ax.set_ylabel(f"workspace size ({uname})")
    return _finish_axes(ax, title)


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
        from tqlab.core.workspace import current_workspace_manager, is_workspace_manager_initialized

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
    return _finish_axes(ax, title)


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
    return _finish_axes(ax, title)


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
    return _finish_axes(ax, title)
