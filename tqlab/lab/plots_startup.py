"""vLLM 0.33's start-up, step by step, against every workspace consumer: the one start-up figure of the notebooks.

vLLM 0.33's ``EngineCore._initialize_kv_caches`` (``vllm/v1/engine/core.py``) calls the worker's
``determine_available_memory``, ``initialize_from_config`` and ``compile_or_warm_up_model``. Inside
``determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``) the profile run is followed — when CUDA graphs
will be captured — by ``GPUModelRunner.profile_cudagraph_memory`` (``vllm/v1/worker/gpu_model_runner.py``), which
first builds a **minimal KV cache** (``_init_minimal_kv_cache_for_profiling`` -> ``initialize_kv_cache`` ->
``initialize_metadata_builders``: this is where ``TurboQuantMetadataBuilder._reserve_workspace``, vLLM PR #44053,
runs for the first time) and then warms up and captures the two largest graphs of each CUDA-graph mode
(``_warmup_and_capture`` over ``descs[:2]``; ``CudagraphDispatcher.get_capture_descs`` sorts them largest
first). ``initialize_from_config`` builds the real KV cache and the builders again; ``compile_or_warm_up_model``
runs the kernel warm-ups and ``capture_model``, which ends with ``lock_workspace()``.

tqlab's engine (:mod:`tqlab.engine.llm_engine`) runs these as six coarser phases (``build_backend`` stands for
both builder steps, ``capture`` for both capture steps); the workspace sizes are the same because every step
after the first one of its kind asks at most what the first asked. This module draws the finer vLLM order:

* :func:`startup_steps` — the steps a deployment's start-up runs (eager: no CUDA-graph profiling, no capture);
* :func:`startup_requests` — ``{consumer: {step: bytes}}``: what each consumer asks before the lock, with or
  without PR #44053's reservation, from the registry (:func:`tqlab.predict.analysis.consumer_table`);
* :func:`slot_after_steps` — workspace slot (ubatch 0, lane 0) after each step: the running maximum;
* :func:`plot_startup_consumers` — the steps × consumers grid, the cells that grow the slot outlined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tqlab.core.workspace import MiB
from tqlab.lab.consumer_cases import lock_without_fix
from tqlab.predict import analysis

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["StartupStep", "plot_startup_consumers", "slot_after_steps", "startup_requests", "startup_steps"]


@dataclass(frozen=True)
class StartupStep:
    """One step of vLLM 0.33's start-up: ``name`` (short label), ``vllm`` (the call it is), ``phases`` (the
    registry phases, :data:`tqlab.core.consumers.base.PHASES`, whose requests it makes), ``builders`` (TurboQuant's
    metadata builder is built here), ``engine_phase`` (tqlab's engine phase it belongs to)."""

    name: str
    vllm: str
    phases: tuple[str, ...]
    builders: bool
    engine_phase: str


_DAM = "Worker.determine_available_memory"
_STEPS = (
    StartupStep("init_device", "Worker.init_device -> init_workspace_manager", (), False, "init_workspace"),
    StartupStep("load_model", "Worker.load_model (attention impls' __init__)", ("init",), False, "load_model"),
    StartupStep("profile_run", f"{_DAM} -> GPUModelRunner.profile_run", ("profile_run",), False, "profile_run"),
    StartupStep("cudagraph profiling:\nminimal KV cache", f"{_DAM} -> profile_cudagraph_memory -> "
                "_init_minimal_kv_cache_for_profiling -> initialize_kv_cache -> initialize_metadata_builders",
                (), True, "build_backend"),
    StartupStep("cudagraph profiling:\n2 largest graphs/mode", f"{_DAM} -> profile_cudagraph_memory -> "
                "_warmup_and_capture(descs[:2])", ("capture",), False, "capture"),
    StartupStep("initialize_kv_cache", "Worker.initialize_from_config -> initialize_kv_cache -> "
                "initialize_metadata_builders", (), True, "build_backend"),
    StartupStep("kernel warm-up", "Worker.compile_or_warm_up_model -> kernel_warmup, warmup_kernels",
                ("kernel_warmup", "jit_warmup_v2"), False, "— (no engine phase)"),
    StartupStep("capture_model", "GPUModelRunner.capture_model (every size, largest first)", ("capture",), False,
                "capture"),
)
_LOCK = "lock_workspace"


def startup_steps(config: "EngineConfig") -> list[StartupStep]:
    """The steps ``config``'s start-up runs, in vLLM 0.33's order. With ``cudagraph_mode`` NONE (eager) there is no
    ``profile_cudagraph_memory`` and no ``capture_model`` (``gpu_worker.py``: both need a CUDA-graph mode)."""
    graphs = analysis.cudagraph_mode(config) != "NONE"
    return [s for s in _STEPS if graphs or "capture" not in s.phases and "profiling" not in s.name]


def startup_requests(config: "EngineConfig", fix: bool = True) -> dict[str, dict[str, int]]:
    """``{consumer name: {step name: bytes}}``: the largest request each active consumer makes in each start-up step
    before the lock. ``fix``: TurboQuant's builder reserves (PR #44053, vLLM 0.33 as shipped) or not (the v0.20
    report's path, :func:`tqlab.lab.consumer_cases.lock_without_fix`). The FULL decode capture asks TurboQuant's
    decode scratch at ``decode_rows_at_lock`` rows in both capture steps. Empty for a start-up that never locks."""
    if not analysis.locks_workspace(config):
        return {}
    steps = startup_steps(config)
    table = analysis.consumer_table(config)
    unfixed = lock_without_fix(config)
    out: dict[str, dict[str, int]] = {}
    for row in table.rows:
        tq = row.name.startswith("turboquant")
        asks: dict[str, int] = {}
        for s in steps:
            if tq and s.builders and fix and row.reserved_bytes:
                asks[s.name] = row.reserved_bytes
            elif not tq and row.phase in s.phases and row.reserved_bytes:
                asks[s.name] = row.reserved_bytes
            elif row.name == "turboquant_decode" and "capture" in s.phases and unfixed.get("turboquant"):
                asks[s.name] = unfixed["turboquant"]
        out[row.name] = asks
    return out


def slot_after_steps(requests: dict[str, dict[str, int]], steps: list[StartupStep]) -> list[int]:
    """Slot (ubatch 0, lane 0) bytes after each step: the running maximum of every request so far (separate
    ``get_simultaneous`` calls alias the same bytes, so the slot is a maximum, not a sum)."""
    size, out = 0, []
    for s in steps:
        size = max([size] + [asks.get(s.name, 0) for asks in requests.values()])
        out.append(size)
    return out


def plot_startup_consumers(config: "EngineConfig", fix: bool = True, *, ax=None, title: str | None = None):
    """Grid: vLLM 0.33's start-up steps (columns, then the lock) × active consumers (rows) and the slot after each
    step (bottom row); a cell shows the MiB a consumer asks in that step, outlined red where it grows the slot.
    Returns the ``Axes``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    steps = startup_steps(config)
    reqs = startup_requests(config, fix)
    names = list(reqs) or ["(no lock: nothing is frozen)"]
    slot = slot_after_steps(reqs, steps)
    cols = [s.name for s in steps] + [_LOCK]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.45 * len(cols) + 2.5, 0.55 * (len(names) + 1) + 1.6), layout="constrained")
    locks = analysis.locks_workspace(config)
    prev = 0
    for j, s in enumerate(steps):
        for i, name in enumerate(names):
            b = reqs.get(name, {}).get(s.name)
            if b is None:
                continue
            grows = b > prev and b == slot[j]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#c6dbef", edgecolor="#e45756" if grows else "white",
                                   linewidth=2.5 if grows else 1))
            ax.text(j + 0.5, i + 0.5, f"{b / MiB:,.2f}", ha="center", va="center", fontsize=8)
        prev = slot[j]
    bottom = len(names)
    for j, b in enumerate(slot + [slot[-1] if slot and locks else None]):
        text = "never" if b is None else f"{b / MiB:,.2f}"
        ax.add_patch(Rectangle((j, bottom), 1, 1, facecolor="#fdd0a2" if j == len(steps) else "#eeeeee",
                               edgecolor="white"))
        ax.text(j + 0.5, bottom + 0.5, text, ha="center", va="center", fontsize=8, weight="bold")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(bottom + 1, 0)
    ax.set_xticks([j + 0.5 for j in range(len(cols))], cols, fontsize=7, rotation=30, ha="right")
    ax.set_yticks([i + 0.5 for i in range(bottom + 1)], names + ["slot 0 after the step"], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fix_txt = "with PR #44053" if fix else "without PR #44053"
    ax.set_title(title or f"{config.preset or 'deployment'}, {fix_txt}: MiB each consumer asks, vLLM 0.33's "
                 "start-up order (red: grows the slot)", loc="left", fontsize=10)
    return ax
