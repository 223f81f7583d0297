"""Workspace figures for the notebooks; each has a pure data function (tested exactly) and a ``plot_*``.

* byte maps of layouts — :func:`layout_segments` / :func:`plot_byte_maps` (views, padding, offsets; they live in
  :mod:`tqlab.lab.plots_layout` and are re-exported here);
* the lifecycle from a manager's event log — :func:`timeline_points` / :func:`plot_workspace_timeline`
  (a line per ubatch slot, locked stretches shaded, violations at the size they asked for; a log axis
  when sizes span orders of magnitude);
* engine phases — :func:`plot_phases`, :func:`phases_markdown`, :class:`PhaseMarker`;
* need-vs-length curves — :func:`plot_need_curve`; bar charts — :func:`plot_bars`.

matplotlib is imported lazily. Sizes on axes are MiB (2**20 bytes), as vLLM's "MB";
the manager and its events mirror ``vllm/v1/worker/workspace.py``.
"""

from __future__ import annotations

from typing import Any, Sequence

from tqlab.core.workspace import MiB, WorkspaceEvent
from tqlab.lab.display import BYTE_UNITS, byte_unit, markdown_table
from tqlab.lab.plots_layout import _VIEW_COLORS, _finish_axes
from tqlab.lab.plots_layout import Segment, layout_segments, plot_byte_maps, plot_layout  # re-exported

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
