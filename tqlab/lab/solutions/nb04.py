"""Reference answers of notebook 04's exercises (the TurboQuant cache format); each calls the package's own function.

* :func:`slot_bytes` — bytes of one (position, KV head) slot of a preset (``TurboQuantSpec.slot_bytes``);
* :func:`compression_vs_fp16` — how many times smaller than fp16 K+V a slot is;
* :func:`packed_index_bytes` — bytes of ``D`` packed indices of ``bits`` bits (``TurboQuantSpec.key_index_bytes``);
* :func:`continuation_vs_packed` — the fp16 dequant buffers and the packed bytes they are read from
  (``tqlab.lab.plots_turboquant.workspace_vs_cache``).
"""

from __future__ import annotations

from tqlab.lab.plots_turboquant import workspace_vs_cache
from tqlab.turboquant import TurboQuantSpec, get_spec

__all__ = ["compression_vs_fp16", "continuation_vs_packed", "packed_index_bytes", "slot_bytes"]


def slot_bytes(preset: str, head_dim: int) -> int:
    """Bytes of one slot (a key and a value) of ``preset`` at ``head_dim``."""
    return get_spec(preset).slot_bytes(head_dim)


def compression_vs_fp16(preset: str, head_dim: int) -> float:
    """fp16 K+V bytes of one (position, KV head), ``2 * head_dim * 2``, over the slot's bytes."""
    return 2 * head_dim * 2 / get_spec(preset).slot_bytes(head_dim)


def packed_index_bytes(head_dim: int, bits: int) -> int:
    """Bytes ``head_dim`` rotated-key indices of ``bits`` bits pack into (no norm)."""
    return TurboQuantSpec(f"k{bits}", bits, 4, False).key_index_bytes(head_dim)


def continuation_vs_packed(cached_len: int, kv_heads: int, head_dim: int, block_size: int,
                           preset: str) -> tuple[int, int]:
    """``(packed bytes read, fp16 workspace bytes written)`` when a continuation chunk dequantizes ``cached_len``
    cached tokens of ``kv_heads`` heads (the workspace buffers are rounded up to ``block_size`` tokens)."""
    row = workspace_vs_cache([cached_len], kv_heads, head_dim, block_size, preset)[0]
    return row["packed_bytes"], row["workspace_bytes"]
