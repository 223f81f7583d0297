"""TurboQuant KV cache: packed slots, Hadamard + Lloyd-Max keys, uniform values.

Mirrors vLLM's TurboQuant attention backend (``vllm/v1/attention/backends/turboquant_attn.py``,
``--kv-cache-dtype turboquant_*``) closely enough to show the bytes, the accuracy and the two
workspace consumers whose late growth caused the "Workspace is locked" crash (fixed by
``_reserve_workspace``, vLLM PR #44053).  Written from the description; no vLLM code.

Worked example -- ``turboquant_3bit_nc``, head_dim ``D = 128``, one (position, kv-head) slot::

    key_packed   = ceil(128*3/8) + 2 (fp16 norm)          = 48 + 2 = 50 bytes
    value_packed = ceil(128*3/8) + 4 (fp16 scale + zero)  = 48 + 4 = 52 bytes
    slot         = 50 + 52 = 102 bytes (already even)
    fp16 K + V   = 2 * 128 * 2                            = 512 bytes   -> 512 / 102 = 5.02x smaller

Layout of a layer's cache: vLLM 0.33's own uint8 tensor ``(num_blocks, block_size, num_kv_heads, slot_bytes)``
(:func:`kv_cache_shape`; the opt-in block-SoA order keeps ``(num_blocks, num_kv_heads, block_size, slot_bytes)``).

Public API (what the engine calls)::

    TQ_PRESETS, TurboQuantSpec, get_spec(kv_cache_dtype), kv_cache_shape(...)
    store_kv(cache, key, value, slot_mapping, spec)
    dequant_kv(cache, block_table_row, cached_len, k_out, v_out, spec)       # continuation prefill
    decode_attention(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse)

Every op takes ``backend="auto" | "torch" | "triton"``.  Reference pieces for teaching:
:mod:`.codebook` (Hadamard, Lloyd-Max), :mod:`.quant` (vector <-> slot bytes),
:mod:`.accuracy` (error measurements). Plots of all this live in :mod:`tqlab.lab.plots_turboquant`.

The format (:mod:`.spec`) is torch-free and imported with the package; the ops and the reference pieces
(torch, numpy) are imported on first use of their name (PEP 562 ``__getattr__``), so reading a
deployment's cache format (``tqlab inspect-vllm``, ``tqlab plan``) never imports torch.
"""

from tqlab.turboquant.spec import TQ_PRESETS, SlotField, TurboQuantSpec, fp16_slot_bytes, get_spec, kv_cache_shape

__all__ = [
    "TQ_PRESETS",
    "TurboQuantSpec",
    "SlotField",
    "get_spec",
    "kv_cache_shape",
    "fp16_slot_bytes",
    "store_kv",
    "dequant_kv",
    "decode_attention",
    "reduce_splits",
    "split_bounds",
    "resolve_backend",
    "triton_available",
    "LloydMaxCodebook",
    "lloyd_max",
    "lloyd_max_standard",
    "hadamard",
    "pack_indices",
    "unpack_indices",
    "encode_keys",
    "decode_keys",
    "encode_values",
    "decode_values",
    "encode_slots",
    "decode_slots",
    "key_journey",
]

_LAZY = {
    **dict.fromkeys(("LloydMaxCodebook", "hadamard", "lloyd_max", "lloyd_max_standard"), "codebook"),
    **dict.fromkeys(("dequant_kv", "decode_attention", "reduce_splits", "resolve_backend", "split_bounds", "store_kv",
                     "triton_available"), "ops"),
    **dict.fromkeys(("decode_keys", "decode_slots", "decode_values", "encode_keys", "encode_slots", "encode_values",
                     "key_journey", "pack_indices", "unpack_indices"), "quant"),
}
"""Names the package exports from a module that imports torch: imported on first use."""


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tqlab.turboquant' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"tqlab.turboquant.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
