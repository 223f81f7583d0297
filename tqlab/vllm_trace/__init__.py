"""Watch a vLLM workspace manager, run vLLM's own classes on a CPU, and predict the locked-workspace crash.

- ``tracer.py``      — :class:`WorkspaceTracer` and :func:`install_vllm_hook` for a live vLLM (or tqlab) manager
- ``cpu_harness.py`` — vLLM 0.33's ``WorkspaceManager`` / ``TurboQuantMetadataBuilder`` on a CPU, beside tqlab's
- ``vllm_args.py``   — a deployment from ``vllm serve`` arguments plus the model's ``config.json``
- ``predict.py``     — the crash predictor behind ``tqlab inspect-vllm``

vLLM is imported lazily, only by functions whose names say ``vllm``; ``import tqlab.vllm_trace``
works without it. Bytes everywhere; "MB" in text means 2**20 bytes, as in vLLM's messages.
"""

from __future__ import annotations

from .tracer import (
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
from .cpu_harness import (
    PARITY_RESULTS,
    ScenarioResult,
    compare_managers,
    compare_reservations,
    demo_steps,
    fake_vllm_configs,
    load_parity_results,
    run_seed_scenario,
    run_vllm_seed_scenario,
    vllm_cpu_patches,
    vllm_prefill_chunk_requests,
    vllm_reservation_calls,
)
from .hf_config import HFConfigError, ModelShape, read_hf_config
from .vllm_args import (
    VllmDeployment,
    deployment_from_vllm,
    engine_config_from_vllm,
    engine_config_kwargs_from_vllm,
    parse_engine_args,
    vllm_default_limits,
)
from .vllm_flags import VllmArgsError, parse_serve_args
from ..reservation import CONTINUATION_DECODE_THRESHOLD
from .predict import (
    DECODE,
    DEQUANT_CHUNK,
    SHORT_CHUNK,
    BUG_REPORT_LOCKED_MB,
    BUG_REPORT_REQUIRED_MB,
    ConsumerNeed,
    Prediction,
    RequestPrediction,
    bug_report_max_num_batched_tokens,
    chunk_shapes,
    inspect_vllm,
    locked_bytes_without_fix,
    predict,
    safe_max_model_len,
    stable_json,
)

__all__ = [
    "CONTINUATION_DECODE_THRESHOLD",
    "DECODE",
    "DEQUANT_CHUNK",
    "PARITY_RESULTS",
    "SHORT_CHUNK",
    "BUG_REPORT_LOCKED_MB",
    "BUG_REPORT_REQUIRED_MB",
    "CallerStats",
    "ConsumerNeed",
    "LockRecord",
    "Prediction",
    "RequestPrediction",
    "ScenarioResult",
    "Violation",
    "WorkspaceTracer",
    "bug_report_max_num_batched_tokens",
    "chunk_shapes",
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
    "inspect_vllm",
    "install_vllm_hook",
    "load_parity_results",
    "locked_bytes_without_fix",
    "parse_engine_args",
    "predict",
    "run_seed_scenario",
    "run_vllm_seed_scenario",
    "safe_max_model_len",
    "stable_json",
    "uninstall_vllm_hook",
    "vllm_available",
    "vllm_cpu_patches",
    "vllm_default_limits",
    "vllm_prefill_chunk_requests",
    "vllm_reservation_calls",
    "vllm_version",
]
