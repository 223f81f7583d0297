"""vLLM's inputs and vLLM itself: read a deployment as vLLM reads it, watch a workspace manager, run vLLM's own
classes on a CPU. The prediction is not here: it is :mod:`tqlab.predict` (``tqlab plan`` / ``inspect-vllm``),
which reads the deployments built here.

- ``tracer.py``      — :class:`WorkspaceTracer` and :func:`install_vllm_hook` for a live vLLM (or tqlab) manager;
  ``trace_record.py``: the plugin's per-process record
- ``cpu_harness.py`` — vLLM 0.33's ``WorkspaceManager`` / ``TurboQuantMetadataBuilder`` on a CPU, beside tqlab's
- ``flags.py``       — vLLM 0.33's ``vllm serve`` flags (generated data) and the line parser
- ``hf_config.py``   — the model's ``config.json`` (``hf_families.py``: the families read their own way)
- ``deployment.py``  — a deployment from ``vllm serve`` arguments plus ``config.json`` (or a preset), built
  once on a ``draft.py`` :class:`DeploymentDraft` (per field: value, source, notes); ``hybrid.py``: hybrid
  models' block size and Mamba block-aligned split; its readers: ``flag_map.py`` (the line's flags ->
  EngineConfig fields), ``defaults.py`` (config.json and vLLM's defaults and limits) and ``preset_server.py``
  (a preset's server limits from vLLM's defaults for the GPU)

vLLM is imported lazily, only by functions whose names say ``vllm``; ``import tqlab.vllm``
works without it. ``cpu_harness.py`` (torch) is imported on first use of one of its names, so reading a
deployment never imports torch. Bytes everywhere; "MB" in text means 2**20 bytes, as in vLLM's messages.
"""

from __future__ import annotations

from tqlab.vllm.tracer import (
    CallerStats,
    LockRecord,
    Violation,
    WorkspaceTracer,
    format_trace_report,
    install_vllm_hook,
    uninstall_vllm_hook,
    vllm_available,
    vllm_version,
)
from tqlab.vllm.hf_config import HFConfigError, ModelShape, read_hf_config
from tqlab.vllm.deployment import (
    VllmDeployment,
    deployment_from_vllm,
    engine_config_from_vllm,
    engine_config_kwargs_from_vllm,
    parse_engine_args,
    vllm_default_limits,
)
from tqlab.vllm.flags import VllmArgsError, parse_serve_args

__all__ = [
    "PARITY_RESULTS",
    "CallerStats",
    "LockRecord",
    "ScenarioResult",
    "Violation",
    "WorkspaceTracer",
    "compare_managers",
    "compare_reservations",
    "demo_steps",
    "HFConfigError",
    "ModelShape",
    "VllmArgsError",
    "VllmDeployment",
    "deployment_from_vllm",
    "engine_config_from_vllm",
    "engine_config_kwargs_from_vllm",
    "parse_serve_args",
    "read_hf_config",
    "fake_vllm_configs",
    "format_trace_report",
    "install_vllm_hook",
    "load_parity_results",
    "parse_engine_args",
    "run_seed_scenario",
    "run_vllm_seed_scenario",
    "uninstall_vllm_hook",
    "vllm_available",
    "vllm_cpu_patches",
    "vllm_default_limits",
    "vllm_prefill_chunk_requests",
    "vllm_reservation_calls",
    "vllm_version",
]

_CPU_HARNESS = ("PARITY_RESULTS", "ScenarioResult", "compare_managers", "compare_reservations", "demo_steps",
                "fake_vllm_configs", "load_parity_results", "run_seed_scenario", "run_vllm_seed_scenario",
                "vllm_cpu_patches", "vllm_prefill_chunk_requests", "vllm_reservation_calls")
"""The names exported from ``cpu_harness.py``, which imports torch: imported on first use (PEP 562)."""


def __getattr__(name: str):
    if name not in _CPU_HARNESS:
        raise AttributeError(f"module 'tqlab.vllm' has no attribute {name!r}")
    from tqlab.vllm import cpu_harness

    value = getattr(cpu_harness, name)
    globals()[name] = value
    return value
