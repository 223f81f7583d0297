"""Which attention and MLA-prefill backend a deployment gets, as far as tqlab reads vLLM 0.33's choice.

``--attention-backend`` / ``--attention-config.mla_prefill_backend`` (``EngineConfig.attention_backend``,
``mla_prefill_backend``) pin it. Otherwise tqlab takes the first entry of vLLM's priority list that
it knows to be valid for the GPU target (``vllm/platforms/cuda.py`` ``_get_backend_priorities``;
``vllm/platforms/interface.py`` ``Platform.get_mla_prefill_backend_cls``). vLLM also drops candidates
whose ``validate_configuration`` fails (head size, block size, installed kernels), which tqlab does not
replay: pin the backend to be sure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["DS_MLA_CACHE_FORMATS", "SM100_MLA_PREFILL", "attention_backend", "mla_prefill_backend"]

DS_MLA_CACHE_FORMATS = frozenset({"fp8_ds_mla", "nvfp4_ds_mla"})
"""vLLM's ``QUANTIZED_DS_MLA_CACHE_FORMATS`` (``mla/flashmla_sparse.py``)."""


def attention_backend(config: "EngineConfig") -> str:
    """The ``AttentionBackendEnum`` name the deployment's attention layers use (see the module docstring)."""
    if config.attention_backend:
        return config.attention_backend
    if config.has_turboquant_consumers:  # a TurboQuant cache (or the teaching variant turboquant_backend_on_unquantized)
        return "TURBOQUANT"
    major = gpu_target(config.gpu).capability[0]
    if config.mla is None:
        return "FLASHINFER" if major == 10 else "FLASH_ATTN"
    if config.indexer is not None:  # sparse MLA (DeepSeek-V3.2)
        ds_cache = config.kv_cache_dtype in DS_MLA_CACHE_FORMATS
        if major == 10:
            if ds_cache:
                return "FLASHINFER_MLA_SPARSE"
            return "FLASHMLA_SPARSE" if config.num_heads_per_rank > 16 else "FLASH_ATTN_MLA_SPARSE_FA4"
        return "FLASHMLA_SPARSE" if ds_cache else "FLASH_ATTN_MLA_SPARSE"
    if major == 10:
        return "FLASHINFER_MLA"
    return "FLASH_ATTN_MLA" if major == 9 else "TRITON_MLA"


SM100_MLA_PREFILL = frozenset({"TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"})
"""MLA prefill backends whose ``supports_compute_capability`` is ``device_capability.major == 10``
(``mla/prefill/trtllm_ragged.py``, ``flashinfer.py``, ``tokenspeed_mla.py``)."""


def mla_prefill_backend(config: "EngineConfig") -> str | None:
    """The MLA prefill backend (``None`` for a model without MLA): pinned, else ``TRTLLM_RAGGED`` on SM100 for
    ``(qk_nope, qk_rope, v) = (192, 64, 256)`` and ``FLASH_ATTN`` otherwise (vLLM's first choice).

    A pinned SM100-only backend (:data:`SM100_MLA_PREFILL`) on another GPU target raises ``ValueError``, as vLLM
    0.33 refuses to start: ``vllm/v1/attention/backends/mla/prefill/selector.py`` ``get_mla_prefill_backend``
    validates the selected backend (``MLAPrefillBackend.validate_configuration``, ``mla/prefill/base.py``) and
    raises "Selected MLA prefill backend ... is not valid for this configuration" (no fallback).
    """
    if config.mla is None:
        return None
    if config.mla_prefill_backend:
        g = gpu_target(config.gpu)
        if config.mla_prefill_backend in SM100_MLA_PREFILL and not g.is_sm100:
            major, minor = g.capability
            raise ValueError(
                f"--attention-config.mla_prefill_backend {config.mla_prefill_backend} on --gpu {g.name}: vLLM 0.33 "
                f"refuses to start (\"Selected MLA prefill backend {config.mla_prefill_backend} is not valid for this "
                f"configuration. Reason: ['compute capability {major}.{minor} not supported']\", mla/prefill/selector.py "
                "get_mla_prefill_backend); it runs on SM100 only (--gpu B200 or B300)")
        return config.mla_prefill_backend
    m = config.mla
    if gpu_target(config.gpu).is_sm100 and (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (192, 64, 256):
        return "TRTLLM_RAGGED"
    return "FLASH_ATTN"
