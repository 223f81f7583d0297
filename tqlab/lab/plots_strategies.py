"""Figures of notebook 06: the strategy comparison, workspace vs ``max_model_len``, the threshold sweep,
the request trace, growth peaks and DBO slot policies (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from tqlab.core.config import EngineConfig
from tqlab.strategies.measure import StrategyResult
from tqlab.core.workspace import MiB

__all__ = ["plot_dbo", "plot_growth", "plot_strategy_comparison", "plot_strategy_lifecycles", "plot_threshold_sweep",
           "plot_trace",
           "plot_workspace_vs_len"]

# --------------------------------------------------------------------------- #

_COLORS = {"none": "#c53030", "dummy_run": "#d69e2e", "reserve": "#2f855a", "replay_aware": "#2b6cb0",
           "fallback": "#6b46c1", "grow_no_recapture": "#718096"}


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_strategy_comparison(results: Sequence[StrategyResult], *, title: str | None = None, timings: bool = True):
    """The comparison as one figure: start-up, memory, time to first token, decode step. Returns the Figure.

    Each x tick names the strategy and whether it survives a ``max_model_len``
    request and stays graph-safe; a request the engine died on is a red cross.
    ``timings=False`` draws the memory panel alone (bytes and survival): single CPU timings are noise.
    """
    import matplotlib.pyplot as plt

    names = [r.strategy for r in results]
    x = list(range(len(results)))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2)) if timings else plt.subplots(1, 2, figsize=(11, 4.2))
    ticks = [f"{r.strategy}\n{'survives' if r.survives_max_model_len else 'DIES'} · "
             f"{'graph-safe' if r.graph_safe else 'NOT graph-safe'}" for r in results]
    cols = [_COLORS.get(n, "#4a5568") for n in names]
    if timings:
        ax = axes[0]
        ax.bar(x, [r.startup_s for r in results], color=cols)
        ax.set_ylabel("start-up (s)")
        ax.set_title("start-up time", loc="left", fontsize=10)
    else:  # survival, one row per prompt: the request the engine served (green) or died on (red)
        _survival_grid(axes[0], results)
    ax = axes[1]
    w = 0.38
    floor = 1e-3  # MiB; keeps a zero-byte bar drawable on the log axis
    ax.bar([i - w / 2 for i in x], [max(r.reserved_bytes / MiB, floor) for r in results], w, color=cols,
           label="reserved at lock")
    ax.bar([i + w / 2 for i in x], [max(r.peak_bytes / MiB, floor) for r in results], w, color=cols, alpha=0.45,
           hatch="//",
           label=("peak: torch.cuda.max_memory_allocated" if results and results[0].peak_source != "computed"
                  else "peak: computed workspace (+ fallback) bytes"))
    ax.set_ylabel("MiB (2**20 bytes)")
    ax.set_yscale("log")
    vals = [max(v / MiB, floor) for r in results for v in (r.reserved_bytes, r.peak_bytes)]
    if vals:  # two decades of headroom above the tallest bar hold the legend
        ax.set_ylim(min(vals) / 2, max(vals) * 300)
    ax.set_title("workspace memory", loc="left", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    if timings:
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


def _survival_grid(ax, results: Sequence[StrategyResult]) -> None:
    """Strategies × prompts: a green tick where the engine served the prompt, a red cross where it died."""
    prompts = [p.prompt_tokens for p in results[0].prompts] if results else []
    for i, r in enumerate(results):
        for j, p in enumerate(r.prompts):
            ax.scatter(i, j, marker="o" if p.survived else "X", s=110,
                       color="#2f855a" if p.survived else "#c53030")
    ax.set_yticks(range(len(prompts)), [f"{n:,}-token prompt" for n in prompts], fontsize=8)
    ax.set_ylim(-0.6, len(prompts) - 0.4)
    ax.set_title("served (o) or died (x)", loc="left", fontsize=10)


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
    from matplotlib.patches import Patch

    ax.set_ylim(0, max([b.get_height() for b in ax.patches] + [1e-9]) * 1.3)  # headroom for the legend
    handles = [Patch(facecolor="#718096", alpha=1.0 if j == 0 else 0.5, edgecolor="black", linewidth=0.3,
                     label=f"{results[0].prompts[j].prompt_tokens:,}-token prompt") for j in range(nprompts)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=2, frameon=False)
    ax.set_title(label.split(" (")[0] + " (✗ = engine died)", loc="left", fontsize=10)


def plot_workspace_vs_len(rows_by_preset: dict[str, list[dict[str, Any]]]):
    """Two panels: reserved workspace (MiB) and its share of one ``max_model_len`` sequence's KV cache, vs ``max_model_len``.

    Presets often coincide at some lengths (the same heads and head_dim): each preset gets its own marker,
    every other one hollow, and its points are shifted sideways by a few percent of a doubling, so a preset
    is never hidden under another. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.4))
    markers = "osD^vP*X"
    n = len(rows_by_preset)
    for k, (name, rows) in enumerate(rows_by_preset.items()):
        shift = 2 ** (0.06 * (k - (n - 1) / 2))  # a few percent of a doubling on the log2 axis
        xs = [r["max_model_len"] * shift for r in rows]
        style = dict(marker=markers[k % len(markers)], color=f"C{k % 10}", markersize=7, label=name,
                     markerfacecolor="white" if k % 2 else f"C{k % 10}", linewidth=1.6)
        a.plot(xs, [r["reserved_bytes"] / MiB for r in rows], **style)
        b.plot(xs, [100 * r["share"] for r in rows], **style)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_model_len (tokens)")
        _style(ax)
    b.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    a.set_yscale("log", base=2)
    a.set_ylabel("reserved workspace per GPU (MiB)")
    a.set_title("PR #44053's reservation (one ubatch slot)", loc="left", fontsize=10)
    b.set_ylabel("% of the KV cache of one max_model_len sequence")
    b.set_title("workspace as a share of the smallest KV cache vLLM accepts", loc="left", fontsize=10)
    fig.tight_layout()
    return fig


def plot_threshold_sweep(sweeps: dict[str, list[dict[str, Any]]], config: EngineConfig,
                         titles: dict[str, str] | None = None):
    """One panel per swept parameter: the longest prompt the unfixed engine survives; the deployment's value marked.

    ``sweeps``: ``{param: tqlab.strategies.threshold_sweep(config, param, values)}``; ``titles``: a panel title
    per parameter. One legend below the panels. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4.2))
    axes = [axes] if len(sweeps) == 1 else list(axes)
    for ax, (param, rows) in zip(axes, sweeps.items()):
        xs = [r[param] for r in rows]
        ys = [r["longest_prompt"] for r in rows]
        ax.plot(xs, ys, marker="o", color="#c53030", label="longest surviving prompt, no fix")
        ax.axhline(config.max_model_len, color="#2f855a", linestyle="--", label=f"max_model_len {config.max_model_len:,}")
        here = getattr(config, param)
        if here in xs:
            ax.plot([here], [ys[xs.index(here)]], marker="*", markersize=14, color="black", linestyle="none",
                    label="the bug report's deployment")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel(param)
        ax.set_ylabel("prompt tokens")
        ax.grid(alpha=0.3, which="both")
        if titles and param in titles:
            ax.set_title(titles[param], fontsize=10)
        _style(ax)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
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
        ax.set_ylabel("MiB (2**20 bytes)")
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
    ax.set_ylabel("MiB (2**20 bytes)")
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



def plot_strategy_lifecycles(runs: Sequence[tuple[str, Sequence[Any], Sequence[tuple[str, int]], str]]):
    """Stacked panels, one per strategy: the workspace size along its event log, all in MiB on one log scale.

    ``runs``: ``(strategy, workspace events, phase marks, outcome)`` each (marks as
    :class:`tqlab.lab.plots_workspace.PhaseMarker` collects them). A refused request is a red cross; what it
    asked for goes in the panel's title (``outcome``), so no label crosses the data. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from tqlab.lab.plots_workspace import plot_workspace_timeline, set_size_log_ticks

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.9 * len(runs)))
    axes = [axes] if len(runs) == 1 else list(axes)
    for ax, (name, events, marks, outcome) in zip(axes, runs):
        plot_workspace_timeline(events, marks, ax=ax, title=f"{name}: {outcome}", unit="MiB", yscale="log",
                                annotate_violations=False)
        ax.set_ylabel("workspace (MiB)")
    top = max(ax.get_ylim()[1] for ax in axes)
    for ax in axes:  # one scale for every panel, so heights compare across strategies
        set_size_log_ticks(ax, top)
    fig.tight_layout()
    return fig
