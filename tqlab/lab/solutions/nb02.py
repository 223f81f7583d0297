"""Reference answers of notebook 02's exercises (reproducing the crash); each calls the package's own function.

* :func:`kv_heads_per_rank` — KV heads one tensor-parallel rank holds (``EngineConfig.num_kv_heads_per_rank``);
* :func:`decode_scratch_bytes` — the split-KV decode scratch that capture locks (``decode_workspace_shapes``);
* :func:`continuation_bytes` — a continuation chunk's two fp16 dequant buffers (``continuation_workspace_shapes``);
* :func:`fits_after_lock` — whether a chunk's workspace request fits a locked size (``chunk_workspace_request``).
"""

from __future__ import annotations

import torch

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import chunk_workspace_request, continuation_workspace_shapes, decode_workspace_shapes
from tqlab.core.workspace import compute_layout

__all__ = ["continuation_bytes", "decode_scratch_bytes", "fits_after_lock", "kv_heads_per_rank"]


def kv_heads_per_rank(num_key_value_heads: int, tensor_parallel_size: int) -> int:
    """KV heads per rank: split evenly, or one replicated head when there are fewer KV heads than ranks."""
    return EngineConfig(num_attention_heads=8 * tensor_parallel_size, num_key_value_heads=num_key_value_heads,
                        head_dim=128, tensor_parallel_size=tensor_parallel_size).num_kv_heads_per_rank


def decode_scratch_bytes(max_num_seqs: int, heads_per_rank: int, head_dim: int, num_kv_splits: int) -> int:
    """Bytes of one split-KV decode call (bf16 output) at ``max_num_seqs`` rows: what capture locks without the fix."""
    return compute_layout(decode_workspace_shapes(max_num_seqs, heads_per_rank, head_dim, num_kv_splits,
                                                  torch.bfloat16)).total_bytes


def continuation_bytes(cached_len: int, kv_heads_per_rank: int, head_dim: int, block_size: int) -> int:
    """Bytes of a continuation chunk's K and V fp16 buffers ``(1, Hk, round_up(cached_len, block_size), D)``."""
    return compute_layout(continuation_workspace_shapes(cached_len, kv_heads_per_rank, head_dim, block_size)).total_bytes


def fits_after_lock(preset: str, cached_len: int, new_tokens: int, locked_bytes: int) -> bool:
    """Whether the chunk (``cached_len`` cached, ``new_tokens`` new) of ``preset`` fits ``locked_bytes``."""
    return chunk_workspace_request(EngineConfig.from_preset(preset), cached_len, new_tokens).nbytes <= locked_bytes
