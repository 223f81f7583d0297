"""One GPU's memory budget at start-up and at serve time, lazy workspace vs reserved (PR #44053).

The arithmetic is vLLM 0.33's ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``):
the profile run measures everything that is not KV cache (weights, the activation peak, non-torch memory),
and the KV cache gets the rest of ``gpu_memory_utilization × total``. Memory a consumer allocates
*later* must come out of what is left after that: the ``1 − gpu_memory_utilization`` headroom minus what
CUDA graphs, NCCL and the CUDA context took from it.

* lazy (vLLM 0.20): the workspace holds its start-up size; a long request's continuation prefill asks for
  its dequant buffers at serve time, from the headroom: it fails there if they do not fit;
* reserved (PR #44053): ``TurboQuantMetadataBuilder.__init__`` reserves the worst case when the builders are
  first created, so if it does not fit, start-up fails, not a request. With CUDA graphs that is inside
  ``determine_available_memory`` itself: after the profile run's measurement (``memory_profiling`` has ended),
  ``GPUModelRunner.profile_cudagraph_memory`` builds a minimal KV cache (``_init_minimal_kv_cache_for_profiling``
  → ``initialize_kv_cache`` → ``initialize_metadata_builders``) before it samples free memory around its
  captures; eager start-ups create the builders in ``initialize_from_config`` → ``initialize_kv_cache``. Either
  way the reservation is in neither the profiled non-KV memory nor the CUDA-graph estimate: it comes out of the
  headroom. (Without the fix the decode scratch first grows inside the first profiled capture, so it is part of
  that estimate, which vLLM subtracts only with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``.)
  :mod:`tqlab.lab.plots_startup` draws these steps.
"""
from __future__ import annotations

from dataclasses import dataclass

SEGMENTS = ("weights", "activations (profile peak)", "KV cache", "graphs, NCCL, context", "workspace", "free")


@dataclass(frozen=True)
class Budget:
    """Bytes per segment of one GPU, and where (if anywhere) an allocation fails."""

    total: int
    requested: int
    segments: dict
    need_at_serve: int
    fails_at: str | None  # None, "start-up" or "serve"

    @property
    def free(self) -> int:
        return self.segments["free"]


def memory_budget(*, total: int, util: float, weights: int, activation_peak: int, after_profile: int,
                  workspace_startup: int, workspace_need: int, reserved: bool) -> Budget:
    """The budget while a long request runs its continuation prefill.

    Args:
        total: the GPU's bytes. util: ``gpu_memory_utilization``.
        weights, activation_peak: what the profile run measured (the KV cache gets ``util × total`` minus these).
        after_profile: memory taken after the KV cache was sized (CUDA graph pools, NCCL buffers, the CUDA
            context's growth): it comes out of the ``(1 − util) × total`` headroom.
        workspace_startup: the workspace at the lock without the fix (the decode scratch).
        workspace_need: the workspace the long request needs (the continuation dequant buffers, or the
            reservation for ``max_model_len`` with the fix).
        reserved: ``True``: PR #44053 (allocated at start-up); ``False``: lazy growth at serve time.
    """
    requested = int(util * total)
    kv = requested - (weights + activation_peak)
    if kv <= 0:
        raise ValueError("nothing left for the KV cache: weights + activations exceed the budget")
    ws = workspace_need if reserved else workspace_startup
    used = weights + activation_peak + kv + after_profile + ws
    free_now = total - used
    fails_at = None
    if free_now < 0:
        fails_at = "start-up" if reserved else None
    need_at_serve = 0 if reserved else max(0, workspace_need - workspace_startup)
    if not reserved and need_at_serve > free_now:
        fails_at = "serve"
    segs = {"weights": weights, "activations (profile peak)": activation_peak, "KV cache": kv,
            "graphs, NCCL, context": after_profile, "workspace": ws, "free": free_now}
    return Budget(total=total, requested=requested, segments=segs, need_at_serve=need_at_serve, fails_at=fails_at)


def plot_budgets(budgets: dict, *, title: str = "", ax=None, unit: int = 2**30, unit_name: str = "GiB"):
    """One stacked bar per budget (label → :class:`Budget`), the lazy request's need drawn on top of its bar."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#8c8c8c", "#c44e52", "#e8e8e8"]
    labels = list(budgets)
    for i, name in enumerate(labels):
        b = budgets[name]
        bottom = 0.0
        for seg, c in zip(SEGMENTS, colors):
            h = max(0, b.segments[seg]) / unit
            ax.bar(i, h, bottom=bottom, color=c, edgecolor="white", width=0.55, label=seg if i == 0 else None)
            bottom += h
        if b.need_at_serve:  # too small to see at this scale: a marker beside the bar, the size in the label
            ax.plot(i + 0.34, (b.total - b.free) / unit, marker="<", color="black", markersize=9, linestyle="none",
                    label="asked at serve time (size above the bar)" if i == 0 else None)
        status = {None: "runs", "serve": "OOM at serve time", "start-up": "fails at start-up"}[b.fails_at]
        if b.need_at_serve:
            status += f"\nasks {b.need_at_serve / 2**20:.0f} MiB\n{max(0, b.free) / 2**20:.0f} MiB free"
        ax.text(i, b.total / unit * 1.02, status, ha="center", va="bottom",
                fontsize=8, fontweight="bold", color="#c44e52" if b.fails_at else "#2f855a")
        ax.hlines(b.requested / unit, i - 0.3, i + 0.3, colors="black", linestyles="dashed",
                  label="gpu_memory_utilization × total" if i == 0 else None)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(0, max(b.total for b in budgets.values()) / unit * 1.25)
    ax.set_ylabel(unit_name)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def zoom_budgets(budgets: dict, *, title: str = "", ax=None):
    """The top of each bar in MiB (2**20 bytes): workspace held, free, and what a lazy request asks for."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    names = list(budgets)
    x = range(len(names))
    mb = 2**20
    bars = (("workspace held", "#c44e52", lambda b: b.segments["workspace"]),
            ("free", "#b0b0b0", lambda b: max(0, b.free)),
            ("asked at serve time", "black", lambda b: b.need_at_serve))
    top = max(f(budgets[n]) for n in names for _, _, f in bars) / mb
    for k, (label, color, f) in enumerate(bars):
        xs = [i + 0.26 * (k - 1) for i in x]
        vals = [f(budgets[n]) / mb for n in names]
        ax.bar(xs, vals, 0.26, color=color, label=label)
        for xi, v in zip(xs, vals):
            if v:
                ax.text(xi, v + top * 0.01, f"{v:.0f}" if v >= 1 else f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylabel("MiB (2**20 bytes)")
    ax.set_ylim(0, top * 1.35)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=3, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax
