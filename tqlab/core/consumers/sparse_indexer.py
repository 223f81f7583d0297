"""The sparse attention indexer (DeepSeek-V3.2): K-gather buffers and the radix top-k scratch.

vLLM 0.33 ``vllm/model_executor/layers/sparse_attn_indexer.py`` ``sparse_attn_indexer``: in the profile run
(``attn_metadata`` not a dict) it reserves ``_gather_workspace_shapes(total_seq_lens, head_dim, fp8, False)`` =
``(total_seq_lens, index_head_dim)`` fp8 + ``(total_seq_lens, 4)`` uint8, plus ``(RADIX_TOPK_WORKSPACE_SIZE,)``
uint8 (1 MiB, ``layers/indexer_topk.py``) in one call (phase ``profile_run``); prefill asks for the two
K-gather views, decode top-k (``SparseIndexerTopk.forward``) for the 1 MiB alone. ``total_seq_lens`` is the
layer's ``max_total_seq_len`` = ``get_max_prefill_buffer_size`` (``v1/attention/backends/mla/indexer.py``)
= ``max_model_len * (576 * 2 // 132) * factor`` = ``max_model_len * 8 * factor``, with the sparse MLA
prefill factor (5 up to 256 Ki tokens, else 2). The MXFP4 indexer cache and PCP + DCP gathers are not modelled.

Reads: ``indexer`` (index_head_dim), ``max_model_len``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core import dtypes
from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.consumers.flashmla_sparse import sparse_mla_prefill_workspace_factor

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["RADIX_TOPK_WORKSPACE_SIZE", "SparseIndexer", "indexer_profile_call", "max_prefill_buffer_size", "prefill_call",
           "profile_call"]

RADIX_TOPK_WORKSPACE_SIZE = 1024 * 1024
"""``vllm/model_executor/layers/indexer_topk.py`` (bytes)."""


def max_prefill_buffer_size(max_model_len: int, factor: int | None = None) -> int:
    """``get_max_prefill_buffer_size``: ``max_model_len * (576 * 2 // 132) * factor`` rows."""
    f = sparse_mla_prefill_workspace_factor(max_model_len) if factor is None else factor
    return max_model_len * (576 * 2 // 132) * f


def indexer_profile_call(total_seq_lens: int, head_dim: int):
    """The profile-run reservation: K values fp8, scales uint8 (4 bytes per row), 1 MiB top-k scratch."""
    return (((total_seq_lens, head_dim), dtypes.float8_e4m3fn), ((total_seq_lens, 4), dtypes.uint8),
            ((RADIX_TOPK_WORKSPACE_SIZE,), dtypes.uint8))


def profile_call(config: "EngineConfig"):
    """The profile-run reservation of ``sparse_attn_indexer`` (``attn_metadata`` not a dict) for ``config``."""
    return indexer_profile_call(max_prefill_buffer_size(config.max_model_len), config.indexer.index_head_dim)


def prefill_call(config: "EngineConfig"):
    """The K-gather call ``sparse_attn_indexer`` makes in a step with prefill rows: the profile call's two views
    (``total_seq_lens`` is the layer's ``max_total_seq_len``, not the step's)."""
    return profile_call(config)[:2]


class SparseIndexer(Consumer):
    """The sparse attention indexer's K-gather and top-k scratch (see the module docstring)."""

    name = "sparse_indexer"
    consumer = "sparse_attn_indexer.py:sparse_attn_indexer"
    source = ("vllm/model_executor/layers/sparse_attn_indexer.py sparse_attn_indexer, _gather_workspace_shapes; "
              "v1/attention/backends/mla/indexer.py get_max_prefill_buffer_size")
    reads = ("indexer", "max_model_len")

    def active(self, config: "EngineConfig") -> bool:
        return config.indexer is not None

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        return ConsumerSizes("profile_run", [profile_call(config)], [prefill_call(config)],
                             slot="each ubatch the profile run uses")
