"""Figures of notebook 05: buckets, warm-up vs capture, pointers at replay, the stale replay, which captured
graphs are stale, the piecewise forward, and eager decode vs CUDA-graph replay latency.

Each function takes the numbers a :mod:`tqlab.lab.graph_demos` demonstration returns and draws them; none of
them runs anything. Bytes are in MB = 2**20 bytes (vLLM's "MB").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["plot_bucket_lanes", "plot_capture_resizes", "plot_forward_plans", "plot_graph_status", "plot_latency",
           "plot_pointer_steps", "plot_stale_replay"]

_OK, _BAD, _PAD, _GRAPH, _EAGER = "#2f855a", "#c53030", "#cbd5e0", "#55a868", "#dd8452"


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_bucket_lanes(batches: Sequence[int], sizes: Sequence[int], *, ax=None):
    """One bar per decode batch: its rows (green) and the padding lanes of the bucket it replays in (grey).

    ``sizes``: the captured bucket sizes; each batch goes to the smallest bucket that holds it. Returns the Axes.
    """
    import matplotlib.pyplot as plt

    from tqlab.engine.cuda_graph import select_bucket

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.45 * len(batches) + 1.2))
    for i, b in enumerate(batches):
        bucket = select_bucket(b, sizes)
        ax.barh(i, b, color=_OK, label="the batch's rows" if i == 0 else None)
        ax.barh(i, bucket - b, left=b, color=_PAD, label="padding lanes" if i == 0 else None)
        ax.text(bucket, i, f"  bucket {bucket}", va="center", fontsize=8)
    ax.set_yticks(range(len(batches)), [f"batch {b}" for b in batches], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log", base=2)
    ax.set_xlim(0.8, max(select_bucket(b, sizes) for b in batches) * 3)
    ax.set_xlabel("decode rows (log scale)")
    ax.set_title("each batch replays in the smallest captured bucket that holds it", loc="left", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    _style(ax)
    return ax


def plot_capture_resizes(result: Mapping[str, Mapping[str, Any]], *, ax=None):
    """Workspace resizes during the eager warm-up and during the capture, per variant of ``warmup_demo``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 2.8))
    names = list(result)
    for j, (key, color, label) in enumerate((("resizes_in_warmup", _OK, "during the eager warm-up"),
                                             ("resizes_in_capture", _BAD, "during the capture"))):
        vals = [result[n][key] or 0 for n in names]
        ax.barh([i + 0.2 * (2 * j - 1) for i in range(len(names))], vals, 0.38, color=color, label=label)
    ax.set_yticks(range(len(names)), [n.replace("_", " ") for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("workspace resizes")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("where the workspace grew", loc="left", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    _style(ax)
    return ax


def plot_pointer_steps(result: Mapping[str, Any], *, ax=None):
    """The decode views' offsets in the workspace buffer at capture and at each replay step (bytes from the start).

    ``result``: :func:`tqlab.lab.graph_demos.pointer_stability_demo`. A point off the capture's line would be a
    moved view; a red step is a replay whose output differs from eager.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.8))
    base = result["capture_buffer_ptr"]
    cols = ["capture"] + [f"replay {s['step']}" for s in result["steps"]]
    ptr_sets = [result["capture_view_ptrs"]] + [s["view_ptrs"] for s in result["steps"]]
    for k, name in enumerate(("mid_out", "output", "lse")):
        ax.plot(range(len(cols)), [ptrs[k] - base for ptrs in ptr_sets], "o-", label=f"view {name}")
    for i, s in enumerate(result["steps"], start=1):
        ok = s["bitwise_equal"]
        ax.annotate("= eager" if ok else "≠ eager", (i, 0), textcoords="offset points", xytext=(0, -16),
                    ha="center", fontsize=8, color=_OK if ok else _BAD)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_ylabel("offset in the buffer (bytes)")
    ax.set_xlim(-0.4, len(cols) - 0.6)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo - 0.25 * (hi - lo), hi)
    ax.set_title(f"the views a graph baked in, at every replay (batch {result['batch']} in bucket {result['bucket']})",
                 loc="left", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    _style(ax)
    return ax


def plot_stale_replay(no_guard: Mapping[str, Any], *, ax=None):
    """Bytes one stale replay (no guard) wrote into the freed buffer and into the new one, and what it destroyed."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 2.4))
    rows = [("written into the freed (captured) buffer", no_guard["old_buffer_bytes_overwritten"], _BAD),
            ("written into the new workspace buffer", no_guard["new_buffer_bytes_touched"], _OK),
            ("a new owner's bytes destroyed", no_guard["new_owner_bytes_corrupted"], _BAD)]
    ax.barh(range(len(rows)), [r[1] for r in rows], color=[r[2] for r in rows])
    for i, (_, v, _) in enumerate(rows):
        ax.text(v, i, f" {v:,}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("bytes")
    ax.set_xlim(0, max(r[1] for r in rows) * 1.25 + 1)
    ax.set_title("one replay of a graph whose workspace buffer was freed (no guard)", loc="left", fontsize=10)
    _style(ax)
    return ax


def plot_graph_status(variants: Mapping[str, Mapping[int, Mapping[str, Any]]], *, title: str = "", ax=None):
    """A grid: one row per variant, one cell per captured bucket; green = replays, red = the guard refused it (stale).

    ``variants``: ``{label: {bucket: {"ok": bool, ...}}}``, the ``replay`` dicts of the graph demonstrations.
    """
    import matplotlib.pyplot as plt

    buckets = sorted({b for rep in variants.values() for b in rep})
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 * len(buckets) + 4.5, 0.55 * len(variants) + 1.1))
    for i, rep in enumerate(variants.values()):
        for j, b in enumerate(buckets):
            if b not in rep:
                continue
            ok = rep[b]["ok"]
            ax.add_patch(plt.Rectangle((j + 0.05, i + 0.08), 0.9, 0.84, color=_OK if ok else _BAD))
            ax.text(j + 0.5, i + 0.5, "replays" if ok else "stale", ha="center", va="center", color="white",
                    fontsize=8, fontweight="bold")
    ax.set_xlim(0, len(buckets))
    ax.set_ylim(len(variants), 0)
    ax.set_xticks([j + 0.5 for j in range(len(buckets))], [f"bucket {b}" for b in buckets], fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(variants))], list(variants), fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title or "each captured graph, replayed with the guard on", loc="left", fontsize=10)
    return ax


def plot_forward_plans(plans: Mapping[str, Sequence[tuple[str, str]]]):
    """One row per CUDA-graph mode: each op of the forward, green inside a captured graph, orange eager."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(plans), 1, figsize=(9, 0.85 * len(plans) + 0.4), sharex=True)
    axes = [axes] if len(plans) == 1 else list(axes)
    for ax, (mode, plan) in zip(axes, plans.items()):
        ax.barh(0, [1] * len(plan), left=range(len(plan)), color=[_GRAPH if w == "graph" else _EAGER for _, w in plan],
                edgecolor="white")
        for i, (op, _) in enumerate(plan):
            ax.text(i + 0.5, 0, op.split(".")[1].replace("o_proj_mlp", "o_proj+mlp"), ha="center", va="center",
                    fontsize=8)
        ax.set_yticks([0], [mode])
        ax.set_xlim(0, len(plan))
        for side in ax.spines.values():
            side.set_visible(False)
    axes[0].set_title("2-layer forward: green = inside a captured graph, orange = eager (Python runs it every step)",
                      loc="left", fontsize=9)
    axes[-1].set_xticks([])
    fig.tight_layout()
    return fig


def plot_latency(results: dict, *, title: str = "", ax=None):
    """Eager vs replay vs summed kernel time (microseconds, log scale) against batch, one line set per model.

    ``results``: ``{label: tqlab.lab.graph_latency.measure_decode_latency(...) result}``. Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5.5 * max(1, len(results)), 3.8), squeeze=False)
        axes = list(axes[0])
    else:
        fig, axes = ax.figure, [ax] * len(results)
    for a, (label, res) in zip(axes, results.items()):
        rows = res["rows"]
        xs = [r["batch"] for r in rows]
        a.plot(xs, [r["eager_us"] for r in rows], "o-", label="eager step")
        a.plot(xs, [r["replay_us"] for r in rows], "s-", label="graph replay")
        a.plot(xs, [r["run_us"] for r in rows], "^--", label="runner step (copy+pad+guard+replay)")
        ks = [r["kernel_sum_replay_us"] for r in rows]
        if any(k for k in ks):
            a.plot(xs, ks, "k:", label="summed kernel time (profiler)")
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("decode batch (requests)")
        a.set_ylabel("microseconds per decode step")
        a.set_title(f"{label}: {res['num_hidden_layers']} layers, {res['kv_cache_dtype']}")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
