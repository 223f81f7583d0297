"""FlashAttention with decode context parallelism: the DCP context output buffer.

vLLM 0.33 ``vllm/v1/attention/backends/flash_attn.py`` ``FlashAttentionImpl._forward_with_dcp``: when the
batch has DCP context (``attn_metadata.max_dcp_context_kv_len > 0``) it asks for one view
``(max(n, max_num_batched_tokens), num_heads * dcp_world_size, head_size)`` in the model dtype
(``_dcp_max_num_tokens`` and ``_dcp_dtype`` are set in ``__init__``; ``num_heads`` is per TP rank,
``n`` the tokens after the query all-gather), so every such call asks for the same
``max_num_batched_tokens`` rows. Nothing reserves it. Before the lock it is reached only by a FULL
CUDA-graph capture of uniform decode (``gpu_model_runner.py`` ``_dummy_run`` builds attention metadata
only for ``force_attention or cudagraph_runtime_mode == FULL``, and ``cp_utils.get_dcp_dummy_context_len``
gives the dummy decode DCP context only while capturing uniform decode); the profile run passes no
metadata (``forward`` returns early for ``attn_metadata is None``). With PIECEWISE-only graphs nothing
sizes it before the lock: latent crash 2.

Reads: ``decode_context_parallel_size``, ``attention_backend`` (FLASH_ATTN), ``num_attention_heads``,
``tensor_parallel_size``, ``head_dim``, ``dtype``, ``max_num_batched_tokens``, and the start-up's CUDA graph mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.backends import attention_backend
from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tqlab.core.config import EngineConfig

__all__ = ["FlashAttentionDCP", "dcp_context_out_shapes", "step_call"]


def dcp_context_out_shapes(max_num_batched_tokens: int, num_heads: int, dcp_world_size: int, head_size: int,
                           dtype: "torch.dtype", n: int = 0):
    """``(((max(n, max_num_batched_tokens), num_heads * dcp_world_size, head_size), dtype),)``; ``num_heads`` per TP rank."""
    return (((max(n, max_num_batched_tokens), num_heads * dcp_world_size, head_size), dtype),)


def step_call(config: "EngineConfig", num_tokens: int = 0):
    """``_forward_with_dcp``'s one call in a forward pass of ``num_tokens`` tokens (``n``, after the query
    all-gather) that has DCP context (``max_dcp_context_kv_len > 0``): ``(max(n, max_num_batched_tokens),
    Hq_per_rank * dcp, head_dim)`` in the model dtype. A pass without DCP context makes no call."""
    return dcp_context_out_shapes(config.max_num_batched_tokens, config.num_heads_per_rank,
                                  config.decode_context_parallel_size, config.head_dim, config.dtype, n=num_tokens)


class FlashAttentionDCP(Consumer):
    """The DCP context output of FlashAttention (see the module docstring)."""

    name = "flash_attn_dcp"
    consumer = "flash_attn.py:_forward_with_dcp"
    reached = "context"  # max_dcp_context_kv_len > 0: a continuation chunk or a decode step
    source = "vllm/v1/attention/backends/flash_attn.py FlashAttentionImpl.__init__, _forward_with_dcp"
    reads = ("decode_context_parallel_size", "attention_backend", "num_attention_heads", "tensor_parallel_size",
             "head_dim", "dtype", "max_num_batched_tokens", "cudagraph_mode", "enforce_eager")

    def active(self, config: "EngineConfig") -> bool:
        return config.decode_context_parallel_size > 1 and attention_backend(config) == "FLASH_ATTN"

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = step_call(config)
        if startup.captures_full:
            return ConsumerSizes("capture", [call], [call], slot="each ubatch captured")
        return ConsumerSizes("none", [], [call], slot="-")
