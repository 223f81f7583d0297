"""The start-up order: tqlab's ``LLMEngine`` phases against the installed vLLM's own call graph (0.33, 0.34).

vLLM's order is read from its source (``ast``, nothing imported or run):

- ``vllm/v1/engine/core.py`` ``EngineCore._initialize_kv_caches`` calls the worker's
  ``determine_available_memory`` before ``initialize_from_config`` before
  ``compile_or_warm_up_model``;
- ``vllm/v1/worker/gpu_worker.py`` ``Worker.init_device`` -> ``_init_workspace_and_model_runner`` ->
  ``init_workspace_manager``; ``Worker.determine_available_memory`` calls
  ``profile_run`` before ``profile_cudagraph_memory`` (which builds the metadata builders
  through ``_init_minimal_kv_cache_for_profiling`` -> ``initialize_kv_cache``), and
  ``Worker.initialize_from_config`` calls ``initialize_kv_cache`` again;
- ``GPUModelRunner.initialize_kv_cache`` -> ``initialize_attn_backend`` (attention groups), then
  ``initialize_metadata_builders`` -> ``AttentionGroup.create_metadata_builders``; ``TurboQuantMetadataBuilder.__init__`` -> ``_reserve_workspace``;
- ``GPUModelRunner.capture_model`` ends in ``lock_workspace``.

vLLM 0.34 (only Model Runner V2, ``v1/worker/gpu/model_runner.py``): ``GPUModelRunner.profile_cudagraph_memory``
-> ``cudagraph_utils.profile_cudagraph_memory`` -> ``_init_minimal_kv_cache_for_profiling`` ->
``runner.initialize_kv_cache`` -> ``init_attn_backend`` (``attn_utils.py``) -> ``create_metadata_builders``; its
``capture_model`` ends in ``lock_workspace`` after ``cudagraph_manager.capture``.

So PR #44053's reservation runs after the profile run and before capture and the lock;
tqlab's engine records the same order (``tqlab.engine.llm_engine.startup_phases`` of the installed release; vLLM
0.34's ``Worker._compile_or_warm_up_model`` runs ``warmup_kernels`` before ``capture_model``: the ``jit_warmup`` phase).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from functools import lru_cache
from pathlib import Path

from tqlab.core import vllm_versions
from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.engine.llm_engine import startup_phases

VLLM = Path(importlib.util.find_spec("vllm").origin).parent
VERSION = vllm_versions.get(".".join(importlib.metadata.version("vllm").split(".")[:2]))


@lru_cache(maxsize=None)
def _tree(rel: str) -> ast.Module:
    return ast.parse((VLLM / rel).read_text())


def _calls(rel: str, cls: str, func: str) -> list[tuple[int, str]]:
    """``(line, called name)`` of every call in ``cls.func`` of vLLM file ``rel``, in source order."""
    klass = next(n for n in _tree(rel).body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == func)
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            out.append((node.lineno, name))
    return sorted(out)


def _fn_calls(rel: str, func: str) -> set[str]:
    """Names called in module-level function ``func`` of vLLM file ``rel``."""
    fn = next(n for n in _tree(rel).body if isinstance(n, ast.FunctionDef) and n.name == func)
    return {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            for f in (c.func for c in ast.walk(fn) if isinstance(c, ast.Call))}


def _runner_builds_the_builders_before_the_lock(runner: str) -> list:
    """The runner's chain from ``profile_cudagraph_memory`` to ``create_metadata_builders``, and its capture's calls."""
    if runner == "v1/worker/gpu_model_runner.py":  # vLLM 0.33's V1 runner
        chain = [("profile_cudagraph_memory", "_init_minimal_kv_cache_for_profiling"),
                 ("_init_minimal_kv_cache_for_profiling", "initialize_kv_cache"),
                 ("initialize_kv_cache", "initialize_attn_backend"),
                 ("initialize_kv_cache", "initialize_metadata_builders"),
                 ("initialize_metadata_builders", "create_metadata_builders")]
        for caller, callee in chain:
            assert callee in {n for _, n in _calls(runner, "GPUModelRunner", caller)}, (caller, callee)
        capture = _calls(runner, "GPUModelRunner", "capture_model")
        assert _first(capture, "lock_workspace") > _first(capture, "set_cudagraph_capturing_enabled")
        return chain
    # vLLM 0.34: Model Runner V2 only
    assert "_profile_cudagraph_memory" in {n for _, n in _calls(runner, "GPUModelRunner", "profile_cudagraph_memory")}
    utils = "v1/worker/gpu/cudagraph_utils.py"
    assert "_init_minimal_kv_cache_for_profiling" in _fn_calls(utils, "profile_cudagraph_memory")
    assert "initialize_kv_cache" in _fn_calls(utils, "_init_minimal_kv_cache_for_profiling")
    assert "init_attn_backend" in {n for _, n in _calls(runner, "GPUModelRunner", "initialize_kv_cache")}
    assert "create_metadata_builders" in _fn_calls("v1/worker/gpu/attn_utils.py", "init_attn_backend")
    capture = _calls(runner, "GPUModelRunner", "capture_model")
    assert _first(capture, "lock_workspace") > _first(capture, "capture")
    return ["profile_cudagraph_memory", "cudagraph_utils.profile_cudagraph_memory", "_init_minimal_kv_cache_for_profiling",
            "initialize_kv_cache", "init_attn_backend", "create_metadata_builders"]


def _first(calls: list[tuple[int, str]], name: str) -> int:
    lines = [line for line, n in calls if n == name]
    assert lines, f"{name} not called"
    return lines[0]


def test_vllm_reserves_after_the_profile_run_and_locks_after_capture(record):
    core = _calls("v1/engine/core.py", "EngineCore", "_initialize_kv_caches")
    assert (_first(core, "determine_available_memory") < _first(core, "initialize_from_config")
            < _first(core, "compile_or_warm_up_model"))
    worker = "v1/worker/gpu_worker.py"
    assert "_init_workspace_and_model_runner" in {n for _, n in _calls(worker, "Worker", "init_device")}
    assert "init_workspace_manager" in {n for _, n in _calls(worker, "Worker", "_init_workspace_and_model_runner")}
    dam = _calls(worker, "Worker", "determine_available_memory")
    assert _first(dam, "profile_run") < _first(dam, "profile_cudagraph_memory")
    assert "initialize_kv_cache" in {n for _, n in _calls(worker, "Worker", "initialize_from_config")}
    record("runner_chain", _runner_builds_the_builders_before_the_lock(VERSION.model_runner))
    tq = _calls("v1/attention/backends/turboquant_attn.py", "TurboQuantMetadataBuilder", "__init__")
    assert "_reserve_workspace" in {n for _, n in tq}
    vllm_order = ["init_workspace", "load_model", "profile_run", "build_backend", "capture", "lock"]
    warm = _calls(worker, "Worker", "_compile_or_warm_up_model")
    if VERSION.jit_warmup_always:  # V2's JIT warm-up, before capture_model, on every deployment
        assert _first(warm, "warmup_kernels") < _first(warm, "capture_model")
        vllm_order.insert(vllm_order.index("capture"), "jit_warmup")
    assert [name for name, _ in startup_phases(VERSION)] == vllm_order
    with vllm_versions.using(VERSION):
        engine = LLMEngine(EngineConfig.from_preset("nemotron-3-super-120b-a12b"), fix=True, device="meta")
    assert [p.name for p in engine.phases] == vllm_order
    record("vllm_order", vllm_order)
    record("engine_phases", [p.name for p in engine.phases])


def test_reservation_returns_early_without_a_manager_in_both(vws, record):
    """PR #44053's ``_reserve_workspace`` starts with ``if not is_workspace_manager_initialized(): return``."""
    import importlib

    import torch

    from tqlab.core.reservation import reserve_workspace
    from tqlab.core.workspace import is_workspace_manager_initialized, reset_workspace_manager
    from tqlab.vllm import fake_vllm_configs

    tq = importlib.import_module("vllm.v1.attention.backends.turboquant_attn")
    config = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
    vllm_config, spec = fake_vllm_configs(config)
    assert not vws.is_workspace_manager_initialized()
    tq.TurboQuantMetadataBuilder(kv_cache_spec=spec, layer_names=["model.layers.0.self_attn.attn"],
                                 vllm_config=vllm_config, device=torch.device("cpu"))  # no error, no manager made
    assert not vws.is_workspace_manager_initialized()
    reset_workspace_manager()
    assert reserve_workspace(config) == [] and not is_workspace_manager_initialized()
    record("outcome", "vLLM builder and tqlab reserve_workspace: no manager -> return, nothing reserved")
