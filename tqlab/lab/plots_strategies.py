"""Figures of notebook 06: the strategy comparison, workspace vs ``max_model_len``, the threshold sweep,
the request trace, growth peaks and DBO slot policies (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from tqlab.core.config import EngineConfig
from tqlab.strategies.measure import StrategyResult
from tqlab.core.workspace import MiB

__all__ = ["plot_dbo", "plot_growth", "plot_strategy_comparison", "plot_threshold_sweep", "plot_trace",
           "plot_workspace_vs_len"]

# --------------------------------------------------------------------------- #

_COLORS = {"none": "#c53030", "dummy_run": "#d69e2e", "reserve": "#2f855a", "replay_aware": "#2b6cb0",
           "fallback": "#6b46c1", "grow_no_recapture": "#718096"}


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_strategy_comparison(results: Sequence[StrategyResult], *, title: str | None = None):
    """The comparison as one figure: start-up, memory, time to first token, decode step. Returns the Figure.

    Each x tick names the strategy and whether it survives a ``max_model_len``
    request and stays graph-safe; a request the engine died on is a red cross.
    """
    import matplotlib.pyplot as plt

    names = [r.strategy for r in results]
    x = list(range(len(results)))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    ticks = [f"{r.strategy}\n{'survives' if r.survives_max_model_len else 'DIES'} · "
             f"{'graph-safe' if r.graph_safe else 'NOT graph-safe'}" for r in results]
    cols = [_COLORS.get(n, "#4a5568") for n in names]
    ax = axes[0]
    ax.bar(x, [r.startup_s for r in results], color=cols)
    ax.set_ylabel("start-up (s)")
    ax.set_title("start-up time", loc="left", fontsize=10)
    ax = axes[1]
    w = 0.38
    floor = 1e-3  # MiB; keeps a zero-byte bar drawable on the log axis
    ax.bar([i - w / 2 for i in x], [max(r.reserved_bytes / MiB, floor) for r in results], w, color=cols,
           label="reserved at lock")
    ax.bar([i + w / 2 for i in x], [max(r.peak_bytes / MiB, floor) for r in results], w, color=cols, alpha=0.45,
           hatch="//",
           label=("peak: torch.cuda.max_memory_allocated" if results and results[0].peak_source != "computed"
                  else "peak: computed workspace (+ fallback) bytes"))
    ax.set_ylabel("MiB")
    ax.set_yscale("log")
    lows = [max(v / MiB, floor) for r in results for v in (r.reserved_bytes, r.peak_bytes)]
    if lows:
        ax.set_ylim(bottom=min(lows) / 2)
    ax.set_title("workspace memory", loc="left", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    for ax, attr, label in ((axes[2], "ttft_s", "time to first token (s)"),
                            (axes[3], "decode_step_s", "decode step (ms)")):
        _per_prompt_bars(ax, results, attr, label, cols)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(ticks, fontsize=7, rotation=30, ha="right")
        _style(ax)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _per_prompt_bars(ax, results: Sequence[StrategyResult], attr: str, label: str, cols: list[str]) -> None:
    """One bar per (strategy, prompt) of ``attr``; a red cross where the engine died before it had a value."""
    x = list(range(len(results)))
    nprompts = max((len(r.prompts) for r in results), default=0)
    scale = 1.0 if attr == "ttft_s" else 1e3
    width = 0.8 / max(1, nprompts)
    for j in range(nprompts):
        xs = [i - 0.4 + width * (j + 0.5) for i in x]

        def died(p):  # no value because the engine died before it (TTFT counts until the first token)
            return p is not None and getattr(p, attr) is None and (attr == "ttft_s" or not p.survived)

        vals = []
        for r in results:
            p = r.prompts[j] if j < len(r.prompts) else None
            v = None if p is None else getattr(p, attr)
            vals.append(v * scale if v is not None and (attr == "ttft_s" or p.survived) else 0.0)
        tag = f"{results[0].prompts[j].prompt_tokens}-token prompt" if results[0].prompts[j:] else ""
        ax.bar(xs, vals, width, color=cols, alpha=1.0 if j == 0 else 0.5, edgecolor="black", linewidth=0.3,
               label=tag)
        for xi, r in zip(xs, results):
            p = r.prompts[j] if j < len(r.prompts) else None
            if died(p) or (p is not None and attr != "ttft_s" and not p.survived):
                ax.plot([xi], [0], marker="X", color="#c53030", markersize=10, linestyle="none")
    ax.set_ylabel(label)
    ax.set_title(label.split(" (")[0] + " (✗ = engine died; light = long prompt)", loc="left", fontsize=10)


def plot_workspace_vs_len(rows_by_preset: dict[str, list[dict[str, Any]]]):
    """Two panels: reserved workspace (MiB) and its share of one ``max_model_len`` sequence's KV cache, vs ``max_model_len``."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2))
    for name, rows in rows_by_preset.items():
        xs = [r["max_model_len"] for r in rows]
        a.plot(xs, [r["reserved_bytes"] / MiB for r in rows], marker="o", label=name)
        b.plot(xs, [100 * r["share"] for r in rows], marker="o", label=name)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_model_len (tokens)")
        _style(ax)
    a.set_yscale("log", base=2)
    a.set_ylabel("reserved workspace per GPU (MiB)")
    a.set_title("PR #44053's reservation (all ubatch slots)", loc="left", fontsize=10)
    b.set_ylabel("% of the KV cache of one max_model_len sequence")
    b.set_title("workspace as a share of the smallest KV cache vLLM accepts", loc="left", fontsize=10)
    a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_threshold_sweep(sweeps: dict[str, list[dict[str, Any]]], config: EngineConfig):
    """One panel per swept parameter: the longest prompt the unfixed engine survives; the deployment's value marked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5.2 * len(sweeps), 4))
    axes = [axes] if len(sweeps) == 1 else list(axes)
    for ax, (param, rows) in zip(axes, sweeps.items()):
        xs = [r[param] for r in rows]
        ys = [r["longest_prompt"] for r in rows]
        ax.plot(xs, ys, marker="o", color="#c53030", label="longest surviving prompt (no fix)")
        ax.axhline(config.max_model_len, color="#2f855a", linestyle="--", label=f"max_model_len {config.max_model_len}")
        here = getattr(config, param)
        if here in xs:
            ax.plot([here], [ys[xs.index(here)]], marker="*", markersize=14, color="black", linestyle="none",
                    label=f"this deployment ({param}={here})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel(param)
        ax.set_ylabel("prompt tokens")
        _style(ax)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_trace(exp: dict[str, Any], *, recorded_note: str = ""):
    """Per-call latency of both modes along the trace; with CUDA data, reserved vs allocated bytes per step."""
    import matplotlib.pyplot as plt

    tr = exp["trace"]
    has_mem = all("reserved" in v for v in tr.values())
    fig, axes = plt.subplots(1, 2 if has_mem else 1, figsize=(15 if has_mem else 8, 4))
    axes = list(axes) if has_mem else [axes]
    ax = axes[0]
    for mode, color in (("torch_empty", "#c53030"), ("workspace", "#2f855a")):
        v = tr[mode]
        ax.plot(range(len(v["per_call_us"])), v["per_call_us"], ".", markersize=3, color=color,
                label=f"{mode} (median {statistics.median(v['per_call_us']):.1f} µs)")
    ax.set_yscale("log")
    ax.set_xlabel("workspace call of the request (prefill chunks x layers, then decode steps x layers)")
    ax.set_ylabel("host µs per call")
    ax.set_title(f"per-call latency, {exp['prompt_tokens']}-token request on {exp['device']}{recorded_note}",
                 loc="left", fontsize=10)
    ax.legend(fontsize=8)
    _style(ax)
    if has_mem:
        ax = axes[1]
        for mode, color in (("torch_empty", "#c53030"), ("workspace", "#2f855a")):
            v = tr[mode]
            ax.plot([b / MiB for b in v["reserved"]], color=color, label=f"{mode}: memory_reserved")
            ax.plot([b / MiB for b in v["allocated"]], color=color, linestyle=":", label=f"{mode}: memory_allocated")
        ax.set_xlabel("engine step of the request")
        ax.set_ylabel("MiB")
        ax.set_title("caching allocator after each step (above what the process held before)", loc="left", fontsize=10)
        ax.legend(fontsize=7)
        _style(ax)
    fig.tight_layout()
    return fig


def plot_growth(growth: dict[str, dict[str, Any]], *, title: str = ""):
    """Bars: final size and peak memory of each growth method (MiB)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    methods = list(growth)
    x = range(len(methods))
    ax.bar([i - 0.2 for i in x], [growth[m]["final_bytes"] / MiB for m in methods], 0.4, color="#a0aec0",
           label="final buffer")
    ax.bar([i + 0.2 for i in x], [growth[m]["peak_bytes"] / MiB for m in methods], 0.4, color="#2b6cb0",
           label=f"peak ({growth[methods[0]]['peak_source']})")
    if all("peak_reserved_bytes" in growth[m] for m in methods):
        ax.plot([i + 0.2 for i in x], [growth[m]["peak_reserved_bytes"] / MiB for m in methods], "D", color="#c53030",
                label="peak memory_reserved")
    ax.set_xticks(list(x))
    ax.set_xticklabels(methods)
    ax.set_ylabel("MiB")
    ax.set_title(title or "growth: peak memory", loc="left", fontsize=10)
    ax.legend(fontsize=8)
    _style(ax)
    fig.tight_layout()
    return fig


def plot_dbo(grow_all: dict[str, Any], grow_one: dict[str, Any]):
    """Workspace bytes held per step under the two DBO slot policies."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for d, color, label in ((grow_all, "#c53030", "resize all slots (grow_all_slots=True)"),
                            (grow_one, "#2f855a", "resize the requesting slot (vLLM today)")):
        ax.step(range(1, len(d["held_bytes"]) + 1), [b / MiB for b in d["held_bytes"]], where="post", color=color,
                label=f"{label}: {d['final_bytes'] / MiB:.2f} MiB held at the end")
    ax.set_xlabel("engine step (ubatch 0: next prefill chunk; ubatch 1: decodes)")
    ax.set_ylabel("workspace held, both slots (MiB)")
    ax.legend(fontsize=8)
    _style(ax)
    fig.tight_layout()
    return fig

