"""MLA prefill through FlashInfer or TRT-LLM ragged: one FlashInfer workspace buffer.

vLLM 0.33 ``vllm/v1/attention/backends/mla/prefill/trtllm_ragged.py`` ``TrtllmRaggedPrefillBackend.__init__``
and ``mla/prefill/flashinfer.py`` ``FlashInferPrefillBackend.__init__`` reserve
``((VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE,), uint8)`` (``vllm/envs.py``: 394 MiB unless the environment
variable says otherwise: ``EngineConfig.flashinfer_workspace_buffer_size``, read from the serve line's environment;
phase ``init``) and ``prepare_metadata`` asks for the same view at serve time.
TRT-LLM ragged runs on SM100 only (``is_supported``: ``device_capability.major == 10``); vLLM picks it by
default on SM100 for ``(qk_nope, qk_rope, v) = (192, 64, 256)``, FLASH_ATTN (no workspace) otherwise; the
``--attention-config.mla_prefill_backend`` flag pins it (the Kimi-K2.6 TP 4 report, vLLM PR #42539).

Reads: ``mla``, ``mla_prefill_backend``, ``gpu``, ``attention_backend`` (sparse MLA has its own prefill),
``flashinfer_workspace_buffer_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core import dtypes
from tqlab.core.consumers.backends import mla_prefill_backend
from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["FLASHINFER_WORKSPACE_BUFFER_SIZE", "MLAPrefillFlashInfer", "MLAPrefillTrtllmRagged", "flashinfer_workspace_call"]

FLASHINFER_WORKSPACE_BUFFER_SIZE = 394 * 1024 * 1024
"""``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``'s default in vLLM 0.33 (bytes)."""


def flashinfer_workspace_call(nbytes: int = FLASHINFER_WORKSPACE_BUFFER_SIZE):
    """``(((nbytes,), uint8),)``: the one reservation of both prefill backends."""
    return (((nbytes,), dtypes.uint8),)


class _MLAPrefill(Consumer):
    backend: str

    def active(self, config: "EngineConfig") -> bool:
        if config.mla is None or config.indexer is not None:
            return False
        if mla_prefill_backend(config) != self.backend:
            return False
        return self.backend != "TRTLLM_RAGGED" or gpu_target(config.gpu).is_sm100

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = flashinfer_workspace_call(config.flashinfer_workspace_buffer_size)
        return ConsumerSizes("init", [call], [call])


class MLAPrefillTrtllmRagged(_MLAPrefill):
    """TRT-LLM ragged MLA prefill (SM100)."""

    name = "mla_prefill_trtllm_ragged"
    backend = "TRTLLM_RAGGED"
    consumer = "trtllm_ragged.py:prepare_metadata"
    source = "vllm/v1/attention/backends/mla/prefill/trtllm_ragged.py TrtllmRaggedPrefillBackend.__init__, prepare_metadata"
    reads = ("mla", "mla_prefill_backend", "gpu", "flashinfer_workspace_buffer_size")


class MLAPrefillFlashInfer(_MLAPrefill):
    """FlashInfer ragged MLA prefill."""

    name = "mla_prefill_flashinfer"
    backend = "FLASHINFER"
    consumer = "flashinfer.py:prepare_metadata"
    source = "vllm/v1/attention/backends/mla/prefill/flashinfer.py FlashInferPrefillBackend.__init__, prepare_metadata"
    reads = ("mla", "mla_prefill_backend", "gpu", "flashinfer_workspace_buffer_size")
