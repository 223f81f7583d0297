"""The engine's consumer stand-ins (``tqlab/engine/standins/``) name vLLM 0.33's own call sites.

A refused call names its caller ``file.py:LINE:function`` from the first frame outside the manager, in vLLM
(``vllm/v1/worker/workspace.py`` ``_ensure_workspace_size`` → ``get_caller_info``) and in tqlab. So each stand-in
must live in a file with vLLM's file name and make its ``get_simultaneous`` call from a function with vLLM's
name, and vLLM's function must make a ``get_simultaneous`` call itself (or call the one function that does).
Read from vLLM's source with ``ast`` (nothing imported or run); tqlab's side from its stand-in classes.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from functools import lru_cache
from pathlib import Path

import pytest

from tqlab.engine.standins import (
    flash_attn,
    flashinfer,
    flashmla_sparse,
    modular_kernel,
    sparse_attn_indexer,
    triton_mla,
    trtllm_ragged,
)

VLLM = Path(importlib.util.find_spec("vllm").origin).parent

# (tqlab stand-in module, vLLM file, class or None for a module function, function, what it calls)
SITES = [
    (modular_kernel, "model_executor/layers/fused_moe/modular_kernel.py", "FusedMoEKernelModularImpl", "_allocate_buffers",
     "get_simultaneous"),
    (flash_attn, "v1/attention/backends/flash_attn.py", "FlashAttentionImpl", "_forward_with_dcp", "get_simultaneous"),
    (flashmla_sparse, "v1/attention/backends/mla/flashmla_sparse.py", "FlashMLASparseImpl", "__init__", "get_simultaneous"),
    (flashmla_sparse, "v1/attention/backends/mla/flashmla_sparse.py", "FlashMLASparseImpl", "forward_mqa", "get_simultaneous"),
    (trtllm_ragged, "v1/attention/backends/mla/prefill/trtllm_ragged.py", "TrtllmRaggedPrefillBackend", "__init__",
     "get_simultaneous"),
    (trtllm_ragged, "v1/attention/backends/mla/prefill/trtllm_ragged.py", "TrtllmRaggedPrefillBackend", "prepare_metadata",
     "get_simultaneous"),
    (flashinfer, "v1/attention/backends/mla/prefill/flashinfer.py", "FlashInferPrefillBackend", "__init__",
     "get_simultaneous"),
    (flashinfer, "v1/attention/backends/mla/prefill/flashinfer.py", "FlashInferPrefillBackend", "prepare_metadata",
     "get_simultaneous"),
    (triton_mla, "v1/attention/backends/mla/triton_mla.py", None, "_reserve_attn_logits_workspace", "get_simultaneous"),
    (triton_mla, "v1/attention/backends/mla/triton_mla.py", "TritonMLAImpl", "reserve_workspace",
     "_reserve_attn_logits_workspace"),
    (triton_mla, "v1/attention/backends/mla/triton_mla.py", "TritonMLAImpl", "forward_mqa", "get_simultaneous"),
    (sparse_attn_indexer, "model_executor/layers/sparse_attn_indexer.py", None, "sparse_attn_indexer", "get_simultaneous"),
]


@lru_cache(maxsize=None)
def _tree(rel: str) -> ast.Module:
    return ast.parse((VLLM / rel).read_text())


def _function(rel: str, cls: str | None, func: str) -> ast.FunctionDef:
    body = _tree(rel).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == func)


def _called(fn: ast.FunctionDef) -> set[str]:
    return {(c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", ""))
            for c in ast.walk(fn) if isinstance(c, ast.Call)}


@pytest.mark.parametrize("module, rel, cls, func, calls", SITES, ids=[f"{s[1].rsplit('/', 1)[1]}:{s[3]}" for s in SITES])
def test_standin_names_vllms_call_site(module, rel, cls, func, calls):
    assert Path(module.__file__).name == Path(rel).name  # the caller's file name in the assertion
    assert calls in _called(_function(rel, cls, func))  # vLLM's function makes (or delegates) the call
    ours = getattr(getattr(module, cls), func) if cls else getattr(module, func)
    assert ours.__code__.co_name == func
    src = inspect.getsource(ours)
    assert calls in src  # the stand-in makes the same call from the same-named function


def test_triton_mla_builder_reserves_through_the_module_function():
    # TritonMLAMetadataBuilder.__init__ -> _reserve_attn_logits_workspace: the engine's build_backend call
    assert "_reserve_attn_logits_workspace" in _called(_function("v1/attention/backends/mla/triton_mla.py",
                                                                 "TritonMLAMetadataBuilder", "__init__"))


def test_profile_run_is_a_dummy_run_of_max_num_batched_tokens():
    # GPUModelRunner.profile_run -> _dummy_run(self.max_num_tokens, is_profile=True); max_num_tokens = max_num_batched_tokens
    import vllm

    from tqlab.core import vllm_versions

    runner = vllm_versions.get(".".join(vllm.__version__.split(".")[:2])).model_runner  # 0.34: V2 only
    fn = _function(runner, "GPUModelRunner", "profile_run")
    run = next(c for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "_dummy_run")
    assert ast.unparse(run.args[0]) == "self.max_num_tokens"
    assert any(k.arg == "is_profile" and ast.unparse(k.value) == "True" for k in run.keywords)
    init = _function(runner, "GPUModelRunner", "__init__")
    assigns = [ast.unparse(n) for n in ast.walk(init) if isinstance(n, ast.Assign)]
    assert {"self.max_num_tokens = scheduler_config.max_num_batched_tokens",
            "self.max_num_tokens = self.scheduler_config.max_num_batched_tokens"} & set(assigns)
