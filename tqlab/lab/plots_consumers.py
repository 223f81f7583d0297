"""Notebook 10's picture: the bytes each workspace consumer asks for, per model, the maximum marked.

:func:`consumer_bars` (pure, tested exactly) turns ``{model: ConsumerTable}`` (``tqlab.predict.analysis.consumer_table``,
the registry :mod:`tqlab.core.consumers.registry`) into one :class:`ConsumerBar` per active consumer;
:func:`plot_consumer_bytes` draws them, one panel per model: a solid bar per consumer for ``reserved_bytes``
(its largest request before ``lock_workspace()``), an outline for ``max_runtime_bytes`` (its largest request
while serving), a solid line at the slot size at the lock (the **maximum** of the reservations) and, where two
or more consumers reserve, a dotted line where the **sum** would be — the size a slot would need if separate
``get_simultaneous`` calls did not alias the same bytes (vLLM 0.33 ``vllm/v1/worker/workspace.py``
``WorkspaceManager.get_simultaneous``: every call carves its views from offset 0 of the same buffer).
Sizes are MiB (2**20 bytes, vLLM's "MB").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

from tqlab.core.workspace import MiB

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.consumers.registry import ConsumerTable

__all__ = ["ConsumerBar", "consumer_bars", "lock_setters", "plot_consumer_bytes", "sum_of_reservations"]

RESERVED_COLOR = "#4c78a8"
LOCK_SETTER_COLOR = "#e45756"
RUNTIME_COLOR = "#54a24b"


class ConsumerBar(NamedTuple):
    """One active consumer of one model: registry name, vLLM call site, phase, bytes, and whether it sets the lock."""

    model: str
    name: str
    consumer: str
    phase: str
    reserved_bytes: int
    max_runtime_bytes: int
    covered: bool
    sets_lock: bool


def consumer_bars(tables: Mapping[str, "ConsumerTable"]) -> list[ConsumerBar]:
    """One :class:`ConsumerBar` per row of every table, in the tables' order then the registry's.

    ``sets_lock`` is True for the row(s) whose ``reserved_bytes`` equals the table's ``locked_bytes`` (the
    maximum); False everywhere when start-up never locks (``locked_bytes is None``) or the slot stays empty.
    """
    bars = []
    for model, table in tables.items():
        for r in table.rows:
            sets = bool(table.locked_bytes) and r.reserved_bytes == table.locked_bytes
            bars.append(ConsumerBar(model, r.name, r.consumer, r.phase, r.reserved_bytes, r.max_runtime_bytes,
                                    r.covered, sets))
    return bars


def lock_setters(bars: Sequence[ConsumerBar], model: str) -> list[str]:
    """Registry names of the consumers that set ``model``'s lock size (usually one)."""
    return [b.name for b in bars if b.model == model and b.sets_lock]


def sum_of_reservations(bars: Sequence[ConsumerBar], model: str) -> int:
    """What ``model``'s slot would need if separate calls did not alias: the sum of ``reserved_bytes``."""
    return sum(b.reserved_bytes for b in bars if b.model == model)


def _panel(ax, model: str, rows: list[ConsumerBar], locked: int | None, unmodelled: Sequence[str]) -> None:
    ys = list(range(len(rows)))[::-1]
    labels = [f"{b.name}\n({b.phase})" for b in rows]
    colors = [LOCK_SETTER_COLOR if b.sets_lock else RESERVED_COLOR for b in rows]
    ax.barh(ys, [b.reserved_bytes / MiB for b in rows], height=0.55, color=colors, label="reserved before the lock")
    ax.barh(ys, [b.max_runtime_bytes / MiB for b in rows], height=0.75, fill=False, edgecolor=RUNTIME_COLOR,
            linewidth=1.5, label="largest request while serving")
    top = max([b.reserved_bytes for b in rows] + [b.max_runtime_bytes for b in rows] + [1]) / MiB
    for y, b in zip(ys, rows):
        mark = "  ← the maximum: sets the lock" if b.sets_lock else ""
        ax.text(max(b.reserved_bytes, b.max_runtime_bytes) / MiB + top * 0.01, y,
                f"{b.reserved_bytes / MiB:,.2f} MiB{mark}", va="center", fontsize=8)
    if locked:
        ax.axvline(locked / MiB, color=LOCK_SETTER_COLOR, linewidth=1.5, label="slot at the lock = max")
    total = sum(b.reserved_bytes for b in rows)
    if sum(b.reserved_bytes > 0 for b in rows) > 1:
        ax.axvline(total / MiB, color="grey", linestyle=":", linewidth=1.5, label="a sum would be (it is not)")
        top = max(top, total / MiB)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlim(0, top * 1.6)  # room on the right for the labels
    ax.set_ylim(-0.7, len(rows) - 0.3)
    note = f"   unmodelled: {', '.join(unmodelled)}" if unmodelled else ""
    ax.set_title(f"{model}{note}", fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def plot_consumer_bytes(tables: Mapping[str, "ConsumerTable"], title: str | None = None):
    """One panel per model (x: MiB, each panel its own scale), bars per consumer; returns the pyplot Figure.

    Panel ``i``'s first bar container holds the ``reserved_bytes`` bars (widths in MiB, registry order, top to
    bottom) and the second the ``max_runtime_bytes`` outlines. Raises ``ValueError`` for no tables or a model
    without an active consumer.
    """
    import matplotlib.pyplot as plt

    if not tables:
        raise ValueError("plot_consumer_bytes: no models given")
    empty = [m for m, t in tables.items() if not t.rows]
    if empty:
        raise ValueError(f"plot_consumer_bytes: no active consumer for {', '.join(empty)}")
    bars = consumer_bars(tables)
    heights = [len(t.rows) + 0.8 for t in tables.values()]
    fig = plt.figure(figsize=(9.5, 1.0 + 0.55 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(tables), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (model, table) in zip(axes, tables.items()):
        unmod = [u["consumer"].split(" (")[0].split(":")[0] for u in table.unmodelled]
        _panel(ax, model, [b for b in bars if b.model == model], table.locked_bytes, unmod)
    axes[-1].set_xlabel("workspace bytes per slot, MiB (2**20 B; vLLM's message calls it MB)")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
