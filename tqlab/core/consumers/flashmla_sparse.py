"""FlashMLA sparse (DeepSeek-V3.2): ``workspace_specs`` reserved in the impl's ``__init__``.

vLLM 0.33 ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` ``FlashMLASparseImpl.__init__`` builds
``workspace_specs`` and reserves them with one ``get_simultaneous(*workspace_specs)`` (phase ``init``,
slot ubatch 0 / lane 0); the forward paths (``forward_mqa``, ``_forward_fp8_kv_separate_prefill_decode``,
``_gather_prefill_chunk``, ``_bf16_flash_mla_kernel``) ask for the same specs, so serving never asks for more:

* ``q_concat``: ``(max_num_batched_tokens, Hq', q_head_size)`` bf16, ``Hq' = Hq`` for a quantized KV cache,
  else ``round_up(Hq, 64)`` (``prefill_padding``); ``q_head_size`` = the MLA head size (576), or
  ``kv_lora_rank + 64`` for ``fp8_ds_mla`` with ``qk_rope_head_dim == 0``;
* only for ``fp8_ds_mla``/``nvfp4_ds_mla``: the prefill workspace ``(factor * max_model_len, q_head_size)`` bf16
  (``get_prefill_workspace_size``; ``factor`` = ``attention_config.sparse_mla_prefill_workspace_factor``, resolved
  in ``vllm/config/vllm.py`` to 5 when ``max_model_len <= 256 Ki`` tokens, else 2), then
  ``(max_num_batched_tokens, round_up(Hq, 64), q_head_size)``, ``(max_num_batched_tokens, round_up(Hq, 64),
  kv_lora_rank)`` and ``(max_num_batched_tokens, Hq, kv_lora_rank)``, all bf16.

``Hq`` = query heads per TP rank. Prefill context parallelism (PCP + DCP KV gather) is not modelled.
Reads: ``mla``, ``kv_cache_dtype``, ``num_attention_heads``, ``tensor_parallel_size``, ``max_num_batched_tokens``,
``max_model_len``, ``attention_backend``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core import dtypes
from tqlab.core.consumers.backends import DS_MLA_CACHE_FORMATS, attention_backend
from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.workspace_layout import round_up

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["FlashMLASparse", "flashmla_sparse_workspace_specs", "sparse_mla_prefill_workspace_factor", "step_call"]

_PREFILL_PADDING = 64
_FP8_DS_MLA_ROPE_DIM = 64


def sparse_mla_prefill_workspace_factor(max_model_len: int) -> int:
    """vLLM's default ``sparse_mla_prefill_workspace_factor``: 5 if ``max_model_len <= 256 * 1024`` else 2."""
    return 5 if max_model_len <= 256 * 1024 else 2


def flashmla_sparse_workspace_specs(num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int, kv_cache_dtype: str,
                                    max_num_batched_tokens: int, max_model_len: int, factor: int | None = None):
    """``FlashMLASparseImpl.workspace_specs`` (one ``get_simultaneous`` call) for ``num_heads`` query heads per rank."""
    bf16 = dtypes.bfloat16
    quantized = kv_cache_dtype not in ("auto", "bfloat16", "float16")
    q_head_size = kv_lora_rank + qk_rope_head_dim
    if kv_cache_dtype == "fp8_ds_mla" and qk_rope_head_dim == 0:
        q_head_size = kv_lora_rank + _FP8_DS_MLA_ROPE_DIM
    heads = num_heads if quantized else round_up(num_heads, _PREFILL_PADDING)
    specs = [((max_num_batched_tokens, heads, q_head_size), bf16)]
    if kv_cache_dtype in DS_MLA_CACHE_FORMATS:
        f = sparse_mla_prefill_workspace_factor(max_model_len) if factor is None else factor
        padded = round_up(num_heads, _PREFILL_PADDING)
        specs += [
            ((max_model_len * f, q_head_size), bf16),
            ((max_num_batched_tokens, padded, q_head_size), bf16),
            ((max_num_batched_tokens, padded, kv_lora_rank), bf16),
            ((max_num_batched_tokens, num_heads, kv_lora_rank), bf16),
        ]
    return tuple(specs)


def step_call(config: "EngineConfig"):
    """``FlashMLASparseImpl.workspace_specs`` for ``config``: the ``__init__`` reservation, and the call ``forward_mqa``
    (and the FP8 prefill/decode paths) make in every forward pass with attention metadata."""
    m = config.mla
    return flashmla_sparse_workspace_specs(config.num_heads_per_rank, m.kv_lora_rank, m.qk_rope_head_dim,
                                           config.kv_cache_dtype, config.max_num_batched_tokens, config.max_model_len)


class FlashMLASparse(Consumer):
    """FlashMLA sparse's ``workspace_specs`` (see the module docstring)."""

    name = "flashmla_sparse"
    consumer = "flashmla_sparse.py:__init__"
    source = "vllm/v1/attention/backends/mla/flashmla_sparse.py FlashMLASparseImpl.__init__, get_prefill_workspace_size"
    reads = ("mla", "kv_cache_dtype", "num_attention_heads", "tensor_parallel_size", "max_num_batched_tokens",
             "max_model_len", "attention_backend")

    def active(self, config: "EngineConfig") -> bool:
        return config.mla is not None and attention_backend(config) == "FLASHMLA_SPARSE"

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = step_call(config)
        return ConsumerSizes("init", [call], [call])
