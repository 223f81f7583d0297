"""Figures of notebook 05: eager decode vs CUDA-graph replay latency."""

from __future__ import annotations

__all__ = ["plot_latency"]


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
