"""Triton MLA decode: the split-KV attention logits, reserved at the worst case.

vLLM 0.33 ``vllm/v1/attention/backends/mla/triton_mla.py``: ``_reserve_attn_logits_workspace`` asks
``((max_decode_rows, Hq * dcp, max_splits, kv_lora_rank + 1), float32)`` with
``max_splits = _compute_num_kv_splits(max_model_len, sm_count) = min(next_pow2(max(1, max_model_len // 512)),
2 * sm_count)``. ``TritonMLAImpl.reserve_workspace`` calls it first, from the profile run (``mla_attention.py`` ``forward_impl``,
``attn_metadata is None``: phase ``profile_run``), and ``TritonMLAMetadataBuilder.__init__`` again after memory
profiling, both with ``max_decode_rows = max_num_seqs * reorder_batch_threshold`` (1 + speculative tokens).
``TritonMLAImpl.forward_mqa`` asks ``(B, Hq, splits(max_seq_len), kv_lora_rank + 1)`` with ``B <= max_decode_rows``.
The SM count comes from the GPU target (``--gpu``). ``Hq`` = query heads per TP rank.

Reads: ``mla``, ``max_num_seqs``, ``num_speculative_tokens``, ``num_attention_heads``, ``tensor_parallel_size``,
``decode_context_parallel_size``, ``max_model_len``, ``gpu``, ``attention_backend``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core import dtypes
from tqlab.core.consumers.backends import attention_backend
from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["TritonMLALogits", "attn_logits_call", "num_kv_splits", "reservation_call", "step_call"]

_MIN_WORK_PER_SPLIT = 512
_SPLIT_OCCUPANCY_MULTIPLIER = 2


def num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """``_compute_num_kv_splits``: ``min(next_pow2(max(1, max_seq_len // 512)), 2 * sm_count)``."""
    ideal = max(1, max_seq_len // _MIN_WORK_PER_SPLIT)
    return min(1 << (ideal - 1).bit_length(), sm_count * _SPLIT_OCCUPANCY_MULTIPLIER)


def attn_logits_call(max_decode_rows: int, q_num_heads: int, kv_lora_rank: int, max_model_len: int, sm_count: int):
    """``_reserve_attn_logits_workspace``'s call: ``(((rows, heads, splits, kv_lora_rank + 1), float32),)``."""
    splits = num_kv_splits(max_model_len, sm_count)
    return (((max_decode_rows, q_num_heads, splits, kv_lora_rank + 1), dtypes.float32),)


def reservation_call(config: "EngineConfig"):
    """``_reserve_attn_logits_workspace``'s call (``TritonMLAImpl.reserve_workspace`` in the profile run,
    ``TritonMLAMetadataBuilder.__init__``): ``max_num_seqs * (1 + k)`` rows at ``max_model_len``'s split count."""
    return step_call(config, config.max_num_seqs * config.uniform_decode_query_len, config.max_model_len)


def step_call(config: "EngineConfig", num_decode_tokens: int, max_seq_len: int):
    """``TritonMLAImpl.forward_mqa``'s call for ``num_decode_tokens`` decode rows (``B``) whose longest sequence is
    ``max_seq_len`` tokens: ``(B, Hq_per_rank * dcp, splits(max_seq_len), kv_lora_rank + 1)`` float32."""
    return attn_logits_call(num_decode_tokens, config.num_heads_per_rank * config.decode_context_parallel_size,
                            config.mla.kv_lora_rank, max_seq_len, gpu_target(config.gpu).sm_count)


class TritonMLALogits(Consumer):
    """Triton MLA's decode logits (see the module docstring)."""

    name = "triton_mla_logits"
    consumer = "triton_mla.py:forward_mqa"
    reached = "decode"  # forward_mqa runs the decode rows only (prefill goes to the MLA prefill backend)
    source = "vllm/v1/attention/backends/mla/triton_mla.py _reserve_attn_logits_workspace, TritonMLAImpl.forward_mqa"
    reads = ("mla", "max_num_seqs", "num_speculative_tokens", "num_attention_heads", "tensor_parallel_size",
             "decode_context_parallel_size", "max_model_len", "gpu", "attention_backend")

    def active(self, config: "EngineConfig") -> bool:
        return config.mla is not None and attention_backend(config) == "TRITON_MLA"

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = reservation_call(config)
        return ConsumerSizes("profile_run", [call], [call])  # impl.reserve_workspace() in the profile run comes first
