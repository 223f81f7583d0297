"""TurboQuant / UltraQuant attention: split-KV decode and continuation prefill (vLLM PR #44053).

vLLM 0.33 ``vllm/v1/attention/backends/turboquant_attn.py``: ``TurboQuantMetadataBuilder._reserve_workspace``
(called from the builder's ``__init__``: phase ``init``, slot ubatch 0 / lane 0) reserves the decode
views at ``max_num_seqs`` rows and, only with chunked prefill on and ``max_num_batched_tokens > 128``,
the continuation buffers at ``cached_len = max_model_len - 1``; ``TurboQuantAttentionImpl._decode_attention``
and ``_continuation_prefill`` use them. UltraQuant (``ultraquant_attn.py``) inherits the builder and its
reservation. The shape formulas are :mod:`tqlab.core.reservation`'s (one source of truth); this module
only calls them.

Reads: ``kv_cache_dtype``, ``max_num_seqs``, ``num_attention_heads``/``num_key_value_heads``/``tensor_parallel_size``,
``head_dim``, ``tq_max_kv_splits_for_cuda_graph``, ``dtype``, ``enable_chunked_prefill``, ``max_num_batched_tokens``,
``max_model_len``, ``block_size``, ``enable_prefix_caching``.

Runtime bound of the continuation: a chunk of more than 128 new tokens after ``cached_len`` cached ones,
so ``cached_len <= max_model_len - 129``; it can happen with chunked prefill on (a request's prompt is split
across steps) or with prefix caching on (a cache hit, even with chunked prefill off: latent crash 1, confirmed
by ``parity/test_seed_parity.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    continuation_workspace_shapes,
    reservation_plan,
)

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["TurboQuantContinuation", "TurboQuantDecode"]

_READS = ("kv_cache_dtype", "max_num_seqs", "num_attention_heads", "num_key_value_heads", "tensor_parallel_size",
          "head_dim", "tq_max_kv_splits_for_cuda_graph", "dtype", "enable_chunked_prefill", "max_num_batched_tokens",
          "max_model_len", "block_size", "enable_prefix_caching")


class TurboQuantDecode(Consumer):
    """Split-KV decode views ``((B, Hq, S, D+1) f32, (B, Hq, D) dtype, (B, Hq) f32)`` at ``B = max_num_seqs``."""

    name = "turboquant_decode"
    consumer = "turboquant_attn.py:_decode_attention"
    source = "vllm/v1/attention/backends/turboquant_attn.py TurboQuantMetadataBuilder._reserve_workspace, _decode_attention"
    reads = _READS

    def active(self, config: "EngineConfig") -> bool:
        return config.has_turboquant_consumers  # a TurboQuant cache, or the teaching variant on an auto cache

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = reservation_plan(config)[0]
        return ConsumerSizes("init", [call], [call])


class TurboQuantContinuation(Consumer):
    """Continuation-prefill dequant buffers: two ``(1, Hk, round_up(cached_len, block_size), D) f16``."""

    name = "turboquant_continuation"
    consumer = "turboquant_attn.py:_continuation_prefill"
    source = ("vllm/v1/attention/backends/turboquant_attn.py TurboQuantMetadataBuilder._reserve_workspace, "
              "TurboQuantAttentionImpl._continuation_prefill")
    reads = _READS

    def active(self, config: "EngineConfig") -> bool:
        return config.has_turboquant_consumers  # a TurboQuant cache, or the teaching variant on an auto cache

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        plan = reservation_plan(config)
        reserved = plan[1:]
        runtime = []
        cached = config.max_model_len - (CONTINUATION_DECODE_THRESHOLD + 1)
        can_chunk = config.enable_chunked_prefill or (config.enable_prefix_caching and cached >= config.block_size)
        if can_chunk and cached >= 1 and config.chunk_budget > CONTINUATION_DECODE_THRESHOLD:
            runtime = [continuation_workspace_shapes(cached, config.num_kv_heads_per_rank, config.head_dim,
                                                     config.block_size)]
        return ConsumerSizes("init" if reserved else "none", reserved, runtime)

