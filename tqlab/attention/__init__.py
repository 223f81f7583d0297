"""The attention layer: vLLM's TurboQuant attention backend and its metadata builder.

``turboquant_attn.py`` mirrors ``vllm/v1/attention/backends/turboquant_attn.py``:
the KV-cache formats, ``TurboQuantMetadataBuilder`` (the fix of vLLM PR #44053
lives in its ``__init__``) and ``TurboQuantAttentionBackend`` with its two
workspace consumers (split-KV decode, continuation prefill). The packed-cache
kernels themselves are in :mod:`tqlab.turboquant`.
"""

from tqlab.attention.turboquant_attn import (
    AttentionMetadata,
    Fp16KVCache,
    KVCacheFormat,
    TurboQuantAttentionBackend,
    TurboQuantKVCache,
    TurboQuantMetadataBuilder,
    kv_cache_bytes_per_token,
    make_kv_cache_format,
    split_kv_decode_reference,
)

__all__ = [
    "AttentionMetadata",
    "Fp16KVCache",
    "KVCacheFormat",
    "TurboQuantAttentionBackend",
    "TurboQuantKVCache",
    "TurboQuantMetadataBuilder",
    "kv_cache_bytes_per_token",
    "make_kv_cache_format",
    "split_kv_decode_reference",
]
