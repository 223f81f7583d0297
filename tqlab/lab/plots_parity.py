"""Notebook 07's picture: tqlab next to vLLM 0.33, value by value.

:func:`parity_points` (pure, tested exactly) turns the reservation per preset and the bug
report's scenario, each measured on both sides, into rows ``(panel, label, vllm_bytes,
tqlab_bytes)``; :func:`plot_parity_side_by_side` draws them as paired markers on a log axis
(MiB = 2**20 bytes, vLLM's "MB"), one row per quantity, vLLM above tqlab, so a mismatch shows
as two markers that do not line up. The vLLM side comes from vLLM's own classes (live, or
``data/parity_results.json``); the tqlab side from tqlab's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tqlab.core.workspace import MiB

__all__ = ["parity_points", "plot_parity_side_by_side"]

VLLM_COLOR = "#4c78a8"
TQLAB_COLOR = "#f58518"


def _high_water(side: Mapping[str, Any], caller_suffix: str) -> int:
    """The largest request of the traced caller whose name ends with ``caller_suffix`` (bytes)."""
    return max(c["high_water_bytes"] for c in side["trace"]["callers"] if c["caller"].endswith(caller_suffix))


def parity_points(
    reservations: Mapping[str, tuple[int, int]], seed_rows: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, int, int]]:
    """Rows ``(panel, label, vllm_bytes, tqlab_bytes)`` for :func:`plot_parity_side_by_side`.

    ``reservations``: preset -> (vLLM builder's reserved bytes, tqlab ``reservation_plan`` bytes).
    ``seed_rows``: notebook 07 §3's rows (``{"fixed", "vllm", "tqlab"}``, each side a seed
    scenario dict with ``size_at_lock`` and ``trace``). Raises ``ValueError`` when the seed rows
    are not one unfixed and one fixed run.
    """
    by_fix = {bool(r["fixed"]): r for r in seed_rows}
    if set(by_fix) != {False, True} or len(seed_rows) != 2:
        raise ValueError(f"seed_rows must hold one unfixed and one fixed run, got fixed={[r['fixed'] for r in seed_rows]}")
    rows = [("reservation per preset (PR #44053)", name, v, t) for name, (v, t) in reservations.items()]
    off, on = by_fix[False], by_fix[True]
    rows += [
        ("the bug report's scenario", "size at lock, no fix", off["vllm"]["size_at_lock"][0],
         off["tqlab"]["size_at_lock"][0]),
        ("the bug report's scenario", "_continuation_prefill asks", _high_water(off["vllm"], "_continuation_prefill"),
         _high_water(off["tqlab"], "_continuation_prefill")),
        ("the bug report's scenario", "size at lock, with the fix", on["vllm"]["size_at_lock"][0],
         on["tqlab"]["size_at_lock"][0]),
    ]
    return rows


def plot_parity_side_by_side(points: Sequence[tuple[str, str, int, int]], title: str | None = None):
    """Paired markers per row (vLLM ●, tqlab ◆), one panel per ``panel`` name; returns the pyplot Figure.

    A row of zero bytes (a preset that reserves nothing) is drawn at the axis' left edge and labelled, not
    left empty: the axis is logarithmic.
    """
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(p[0] for p in points))
    positive = [b for p in points for b in p[2:4] if b > 0]
    lo = min(positive) / MiB if positive else 1.0  # a zero (nothing reserved) sits at the left edge, labelled
    hi = max(positive) / MiB if positive else 1.0

    def at(b: int) -> float:
        return b / MiB if b > 0 else lo / 3

    heights = [sum(p[0] == name for p in points) for name in panels]
    fig = plt.figure(figsize=(8.5, 1.4 + 0.42 * len(points)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    for ax, name in zip(axes, panels):
        rows = [p for p in points if p[0] == name]
        ys = list(range(len(rows)))[::-1]
        for y, (_, label, v, t) in zip(ys, rows):
            ax.plot([at(v)], [y + 0.17], "o", color=VLLM_COLOR, ms=8, label="vLLM 0.33 (its own classes)")
            ax.plot([at(t)], [y - 0.17], "D", color=TQLAB_COLOR, ms=7, label="tqlab")
            text = (("both 0 B (nothing reserved)" if t == 0 else f"both {t / MiB:.2f} MiB") if v == t
                    else f"vLLM {v / MiB:.2f} ≠ tqlab {t / MiB:.2f} MiB")
            ax.annotate(text, (at(max(v, t)), y), xytext=(10, 0), textcoords="offset points",
                        va="center", fontsize=8)
        ax.set_yticks(ys, [p[1] for p in rows], fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(lo / 5, hi * 8)  # room on the left for a zero, on the right for the labels
    axes[-1].set_xlabel("workspace bytes, MiB (2**20 B; vLLM's message calls it MB), log scale")
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), uniq.keys(), loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
