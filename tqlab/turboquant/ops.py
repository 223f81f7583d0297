"""The three TurboQuant cache operations the attention backend calls.

* :func:`store_kv` -- quantize new K/V and write their slots (vLLM: the TurboQuant
  ``reshape_and_cache`` step).
* :func:`dequant_kv` -- dequantize one request's cached K/V into the two fp16 continuation-prefill
  workspace buffers ``(1, Hk, alloc_len, D)`` (vLLM: ``_continuation_prefill`` in
  ``vllm/v1/attention/backends/turboquant_attn.py``; these are the buffers whose late growth
  crashed a locked workspace, fixed by ``_reserve_workspace`` in PR #44053).
* :func:`decode_attention` -- split-KV decode straight from the packed cache; per-split partial
  outputs and log-sum-exp go into the decode workspace buffer ``(B, Hq, S, D+1)`` float32, then a
  reduction writes ``output (B, Hq, D)`` and ``lse (B, Hq)``.

Each has a torch reference (any device) and a Triton kernel (CUDA, or CPU under
``TRITON_INTERPRET=1``), chosen by ``backend="auto" | "torch" | "triton"``; ``auto`` is Triton on
CUDA when it imports, torch otherwise.  On ``meta`` tensors the shapes are checked and nothing
else happens (the engine's dry run).

Validation: wrong types/dtypes raise ``TypeError``, wrong shapes/values ``ValueError``, before any
tensor is touched.  Index contents (slot ids, block ids, sequence lengths) are range-checked when
the tensors live on the CPU; on CUDA that check would need a host sync (and would break CUDA graph
capture), so there the kernels never touch memory out of bounds instead: an out-of-range slot is not
written, an out-of-range block id reads as an all-zero slot (key and value 0).
"""

from __future__ import annotations

import math
import os

import torch

from tqlab.core.reservation import filling_kv_splits
from tqlab.turboquant.quant import decode_slots, encode_slots, to_cache_layout, to_slot_order
from tqlab.turboquant.spec import TurboQuantSpec, get_spec

__all__ = [
    "store_kv",
    "dequant_kv",
    "decode_attention",
    "heads_view",
    "triton_available",
    "resolve_backend",
    "FLOAT_DTYPES",
    "split_bounds",
    "decode_num_splits",
    "decode_kernel_name",
    "SPLIT_POLICIES",
    "VLLM_NUM_SPLITS",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT_DTYPES = (torch.int32, torch.int64)
_BACKENDS = ("auto", "torch", "triton")


# ----------------------------------------------------------------------------- dispatch
def triton_available() -> bool:
    """True when ``import triton`` works in this process."""
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - depends on the environment
        return False
    return True


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"torch"`` or ``"triton"`` for this device.

    Raises:
        ValueError: unknown backend name, or ``"triton"`` where it cannot run (no triton, or a
            non-CUDA device without ``TRITON_INTERPRET=1``).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    dev = torch.device(device)
    if backend == "torch" or dev.type == "meta":
        return "torch"
    if backend == "auto":
        return "triton" if dev.type == "cuda" and triton_available() else "torch"
    if not triton_available():
        raise ValueError("backend='triton' asked for but triton is not installed")
    if dev.type != "cuda" and not _interpret():
        raise ValueError(f"backend='triton' on {dev.type} tensors needs TRITON_INTERPRET=1 (set before importing triton)")
    return "triton"


# ----------------------------------------------------------------------------- checks
def _need_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check_head_dim(d: int, spec: TurboQuantSpec) -> None:
    if d < 16 or d > 512 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 512] (Hadamard rotation, Triton tiles), got {d}")


def heads_view(cache: torch.Tensor, spec: TurboQuantSpec | str) -> torch.Tensor:
    """The ``(num_blocks, Hk, block_size, slot_bytes)`` view of a cache of :func:`tqlab.turboquant.kv_cache_shape`
    (no copy): vLLM's tensor ``(num_blocks, block_size, Hk, slot_bytes)`` (``"vllm"`` layout) comes back as
    ``cache.transpose(1, 2)`` -- strides ``(block_size*Hk*slot, slot, Hk*slot, 1)`` bytes, the strides vLLM's
    kernels get as ``stride_cache_block/head/pos`` --, a block-SoA cache unchanged.  Every op and kernel of this
    package indexes the cache through it, so ``[block, head, position]`` means the same slot in both layouts."""
    return cache.transpose(1, 2) if get_spec(spec).cache_layout == "vllm" else cache


def _check_cache(cache, spec: TurboQuantSpec, head_dim: int) -> tuple[int, int, int, int]:
    """Checks a cache of :func:`tqlab.turboquant.kv_cache_shape`; returns the shape of :func:`heads_view`
    ``(num_blocks, Hk, block_size, slot_bytes)``."""
    _need_tensor("cache", cache)
    if cache.dtype != torch.uint8:
        raise TypeError(f"cache must be uint8 (packed TurboQuant slots), got {cache.dtype}")
    order = "(num_blocks, block_size, num_kv_heads, slot_bytes)" if spec.cache_layout == "vllm" else \
        "(num_blocks, num_kv_heads, block_size, slot_bytes)"
    if cache.dim() != 4:
        raise ValueError(f"cache must be {order} ({spec.cache_layout} layout), got shape {tuple(cache.shape)}")
    if cache.shape[3] != spec.slot_bytes(head_dim):
        raise ValueError(
            f"cache slot size {cache.shape[3]} bytes != {spec.name}.slot_bytes({head_dim}) = {spec.slot_bytes(head_dim)}"
        )
    if not cache.is_contiguous():
        raise ValueError(f"cache must be contiguous {order}, got strides {cache.stride()} for shape {tuple(cache.shape)}")
    return tuple(heads_view(cache, spec).shape)  # type: ignore[return-value]


def _same_device(**tensors: torch.Tensor) -> torch.device:
    devs = {k: v.device for k, v in tensors.items()}
    first = next(iter(devs.values()))
    if any(d != first for d in devs.values()):
        raise ValueError(f"all tensors must be on one device; got {({k: str(d) for k, d in devs.items()})}")
    return first


def _is_meta(*ts: torch.Tensor) -> bool:
    return any(t.device.type == "meta" for t in ts)


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` token range of each split for one request.

    ``chunk = ceil(seq_len / num_splits)``; split ``s`` covers ``[s*chunk, min((s+1)*chunk, seq_len))``
    (possibly empty: its partial is 0 with log-sum-exp ``-inf``).  Kernel and reference agree on this.
    """
    chunk = -(-seq_len // num_splits) if seq_len > 0 else 0
    return [(min(s * chunk, seq_len), min((s + 1) * chunk, seq_len)) for s in range(num_splits)]


VLLM_NUM_SPLITS = 32  # vLLM's attention_config.tq_max_kv_splits_for_cuda_graph
SPLIT_POLICIES = ("vllm", "fill")


def decode_num_splits(batch: int, num_kv_heads: int, policy: str = "vllm", *, num_sms: int | None = None,
                      programs_per_sm: int = 4, max_splits: int = 256) -> int:
    """Split count ``S`` of a decode call, i.e. ``mid_out.shape[2]`` (pass it to
    :func:`tqlab.core.reservation.decode_workspace_shapes` as ``num_kv_splits``).

    * ``"vllm"`` (default): 32, vLLM's fixed ``tq_max_kv_splits_for_cuda_graph``.
    * ``"fill"``: enough splits for ``programs_per_sm * num_sms`` programs (one per request x
      KV head x split), as a power of two in ``[32, max_splits]``.  Small batches get more
      splits, so more bytes are in flight; ``B * S`` stays about ``programs_per_sm * num_sms /
      Hk``, so the workspace ``B * Hq * S * (D + 1) * 4`` bytes is no larger than at the batch
      where the policy reaches 32.  Depends on ``B`` and ``Hk`` only, never on the context, so
      it is fixed per captured CUDA graph.  ``num_sms``: None = the current CUDA device's
      multiprocessor count (132 on an H200; 132 without CUDA).  4 programs per SM is what the fast
      decode kernel's 127 registers allow (issue 20); measured on the seed rank at 128K: 128 and
      256 splits within 2 %, 64 and 512 splits 19 % / 67 % slower (``split_rows`` of
      ``data/turboquant_fast_variants_h200.json``).

    This is the one place the split count is chosen: size the decode workspace with it
    (:func:`tqlab.core.reservation.decode_workspace_shapes`' ``num_kv_splits``, which the engine and
    planner take from ``tq_max_kv_splits_for_cuda_graph``) and allocate ``mid_out`` with it.

    Raises:
        ValueError: unknown policy or non-positive sizes.
    """
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
            if torch.cuda.is_available() else 132
    for name, v in (("batch", batch), ("num_kv_heads", num_kv_heads), ("num_sms", num_sms),
                    ("programs_per_sm", programs_per_sm), ("max_splits", max_splits)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if policy not in SPLIT_POLICIES:
        raise ValueError(f"policy must be one of {SPLIT_POLICIES}, got {policy!r}")
    if policy == "vllm":
        return VLLM_NUM_SPLITS
    return filling_kv_splits(batch, num_kv_heads, num_sms, floor=VLLM_NUM_SPLITS, programs_per_sm=programs_per_sm,
                             max_splits=max_splits)


# ----------------------------------------------------------------------------- store
def store_kv(
    cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    spec: TurboQuantSpec | str,
    *,
    backend: str = "auto",
) -> None:
    """Quantize ``key``/``value`` and write them into their cache slots (in place).

    On a block-SoA cache of an ``_nc`` preset (``spec.norm_folded``) the key norm field holds
    ``fp16(||k|| / ||c_hat||)`` instead of ``fp16(||k||)``, as vLLM 0.33's SoA store writes it
    (``vllm/v1/attention/ops/turboquant_soa/triton_turboquant_store.py``, "Opt#1"); :func:`decode_attention`
    and :func:`dequant_kv` then skip the norm correction (``spec.norm_correction_on_read``).

    Args:
        cache: uint8, contiguous, :func:`tqlab.turboquant.kv_cache_shape`: ``(num_blocks, block_size, Hk,
            slot_bytes)`` (vLLM's tensor, the ``"vllm"`` layout) or ``(num_blocks, Hk, block_size, slot_bytes)``
            (block-SoA).
        key, value: ``(N, Hk, D)`` float16/bfloat16/float32 (D a power of two, 16..512).
        slot_mapping: ``(N,)`` int32/int64 flat slot ``block * block_size + offset``; negative
            entries are padding and are skipped (vLLM's ``PAD_SLOT_ID = -1``).
        spec: a :class:`TurboQuantSpec` or preset name.
        backend: ``"auto" | "torch" | "triton"``.

    Raises:
        TypeError: wrong dtypes.  ValueError: shape/device mismatch, slot out of range (CPU).
    """
    spec = get_spec(spec)
    _need_tensor("key", key), _need_tensor("value", value), _need_tensor("slot_mapping", slot_mapping)
    if key.dtype not in FLOAT_DTYPES or value.dtype not in FLOAT_DTYPES:
        raise TypeError(f"key/value must be one of {FLOAT_DTYPES}, got {key.dtype}/{value.dtype}")
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key and value must both be (N, Hk, D); got {tuple(key.shape)} and {tuple(value.shape)}")
    n, hk, d = key.shape
    _check_head_dim(d, spec)
    nb, chk, bs, _ = _check_cache(cache, spec, d)
    if hk != chk:
        raise ValueError(f"key has {hk} kv heads, cache has {chk}")
    if slot_mapping.dtype not in _INT_DTYPES:
        raise TypeError(f"slot_mapping must be int32/int64, got {slot_mapping.dtype}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != n:
        raise ValueError(f"slot_mapping must be ({n},), got {tuple(slot_mapping.shape)}")
    dev = _same_device(cache=cache, key=key, value=value, slot_mapping=slot_mapping)
    if _is_meta(cache, key, value, slot_mapping):
        return
    if dev.type == "cpu" and n:
        hi = int(slot_mapping.max())
        if hi >= nb * bs:
            raise ValueError(f"slot_mapping holds slot {hi} but the cache has {nb * bs} slots ({nb} blocks x {bs})")
    if n == 0:
        return
    cache = heads_view(cache, spec)
    if resolve_backend(backend, dev) == "triton":
        from tqlab.turboquant import _triton_kernels as tk

        tk.store_kv(cache, key, value, slot_mapping, spec)
        return
    valid = slot_mapping >= 0
    slots = encode_slots(key[valid], value[valid], spec)  # (n_valid, Hk, slot_bytes)
    sm = slot_mapping[valid].long()
    if spec.cache_layout == "vllm":
        cache[sm // bs, :, sm % bs] = slots
        return
    blk = torch.unique(sm // bs)  # the touched blocks, through vLLM's slot order and back
    view = torch.full((nb,), -1, dtype=torch.long, device=sm.device)
    view[blk] = torch.arange(blk.numel(), device=sm.device)
    part = to_slot_order(cache[blk], spec, d)
    part[view[sm // bs], :, sm % bs] = slots
    cache[blk] = to_cache_layout(part, spec, d)


# ----------------------------------------------------------------------------- dequant
def _gather_request(cache, block_row: torch.Tensor, length: int, spec: TurboQuantSpec, d: int) -> torch.Tensor:
    """Slots of one request's first ``length`` tokens in vLLM's slot order (whatever the cache's
    layout), uint8 ``(Hk, length, slot_bytes)``."""
    nb, hk, bs, sb = cache.shape
    nblk = -(-length // bs)
    slots = to_slot_order(cache[block_row[:nblk].long()], spec, d)  # (nblk, Hk, bs, sb)
    return slots.permute(1, 0, 2, 3).reshape(hk, nblk * bs, sb)[:, :length]


def _check_dequant(cache, block_table_row, cached_len, k_out, v_out, spec) -> tuple[torch.device, int]:
    """Types, shapes and devices of :func:`dequant_kv`'s arguments; (device, blocks used)."""
    for nm, t in (("block_table_row", block_table_row), ("k_out", k_out), ("v_out", v_out)):
        _need_tensor(nm, t)
    if isinstance(cached_len, bool) or not isinstance(cached_len, int) or cached_len < 0:
        raise ValueError(f"cached_len must be a non-negative python int, got {cached_len!r}")
    if k_out.dtype != torch.float16 or v_out.dtype != torch.float16:
        raise TypeError(f"k_out/v_out must be float16 workspace buffers, got {k_out.dtype}/{v_out.dtype}")
    if k_out.dim() != 4 or k_out.shape != v_out.shape or k_out.shape[0] != 1:
        raise ValueError(f"k_out and v_out must both be (1, Hk, L, D); got {tuple(k_out.shape)} and {tuple(v_out.shape)}")
    _, hk, length, d = k_out.shape
    _check_head_dim(d, spec)
    nb, chk, bs, _ = _check_cache(cache, spec, d)
    if hk != chk:
        raise ValueError(f"k_out has {hk} kv heads, cache has {chk}")
    if cached_len > length:
        raise ValueError(f"cached_len {cached_len} exceeds the workspace buffer length {length}")
    if block_table_row.dtype not in _INT_DTYPES or block_table_row.dim() != 1:
        raise TypeError(f"block_table_row must be a 1-D int32/int64 tensor, got {block_table_row.dtype} {tuple(block_table_row.shape)}")
    need = -(-cached_len // bs)
    if need > block_table_row.shape[0]:
        raise ValueError(f"cached_len {cached_len} needs {need} blocks, block_table_row has {block_table_row.shape[0]}")
    if k_out.stride(-1) != 1 or v_out.stride(-1) != 1:
        raise ValueError(f"k_out/v_out must have a unit stride in the last (head_dim) dimension, got "
                         f"{k_out.stride(-1)}/{v_out.stride(-1)}")
    dev = _same_device(cache=cache, block_table_row=block_table_row, k_out=k_out, v_out=v_out)
    return dev, need


def dequant_kv(
    cache: torch.Tensor,
    block_table_row: torch.Tensor,
    cached_len: int,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    spec: TurboQuantSpec | str,
    *,
    backend: str = "auto",
) -> None:
    """Dequantize one request's first ``cached_len`` tokens into fp16 workspace buffers.

    Mirrors vLLM 0.33's ``_tq_full_dequant_kv`` (``vllm/v1/attention/ops/triton_turboquant_decode.py``),
    called from ``_continuation_prefill``.  Kernels (``backend="triton"``): the fast dequant
    (``_triton_dequant.dequant_kv``, launch ``launch.DEFAULTS["fast_dequant"]``) for the rotated presets on
    CUDA in either layout, the portable kernel otherwise; keys agree with the torch reference to fp16
    rounding, values bit for bit.

    Args:
        cache: uint8, as in :func:`store_kv`.
        block_table_row: ``(max_blocks,)`` int32/int64 block ids of this request.
        cached_len: tokens already in the cache (python int, ``0 <= cached_len <= L``).
        k_out, v_out: float16 ``(1, Hk, L, D)`` with ``L >= cached_len`` -- the continuation-prefill
            workspace buffers (``L = round_up(cached_len, block_size)`` in vLLM).  Positions
            ``>= cached_len`` are left untouched.
        spec, backend: as in :func:`store_kv`.

    Raises:
        TypeError: wrong dtypes.  ValueError: shape/device mismatch, too few blocks in the row,
            block id out of range (CPU).
    """
    spec = get_spec(spec)
    dev, need = _check_dequant(cache, block_table_row, cached_len, k_out, v_out, spec)
    cache = heads_view(cache, spec)
    nb = cache.shape[0]
    d = k_out.shape[-1]
    if _is_meta(cache, block_table_row, k_out, v_out) or cached_len == 0:
        return
    if dev.type == "cpu":
        used = block_table_row[:need]
        if int(used.min()) < 0 or int(used.max()) >= nb:
            bad = int(used[(used < 0) | (used >= nb)][0])
            raise ValueError(f"block_table_row[:{need}] holds block ids outside [0, {nb}): {bad}")
    if resolve_backend(backend, dev) == "triton":
        from tqlab.turboquant import _triton_dequant as td
        from tqlab.turboquant import _triton_fast as tf
        from tqlab.turboquant import _triton_kernels as tk

        (td if tf.use_fast(spec, dev) else tk).dequant_kv(cache, block_table_row, cached_len, k_out, v_out, spec)
        return
    k, v = decode_slots(_gather_request(cache, block_table_row, cached_len, spec, d), spec, d)
    k_out[0, :, :cached_len] = k.to(torch.float16)
    v_out[0, :, :cached_len] = v.to(torch.float16)


# ----------------------------------------------------------------------------- decode
def decode_attention(
    query: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    spec: TurboQuantSpec | str,
    scale: float,
    mid_out: torch.Tensor,
    output: torch.Tensor,
    lse: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Split-KV decode attention (one query token per request) over the packed cache.

    Mirrors vLLM 0.33's ``triton_turboquant_decode_attention`` (``_tq_decode_stage1`` per split, then
    ``_fwd_kernel_stage2``'s reduction; ``vllm/v1/attention/ops/triton_turboquant_decode.py``) on vLLM's
    slot order.  Kernels (``backend="triton"``): on CUDA, on vLLM's tensor, the Gluon decode that reads it
    (``_gluon_vllm_decode``: 3/4-bit rotated presets, D 128, GQA <= 8, sm_80+, Triton >= 3.6), else the fast kernel
    (``_triton_fast``) for the rotated presets; on a block-SoA cache (``spec.cache_layout == "block_soa"``) the block-SoA decode
    (``_triton_soa``, every preset; for the rotated presets with D 128 and GQA <= 8 on sm_80+ and Triton >= 3.6 the
    Gluon decode ``_gluon_decode``, issue 20 round 5; the rule: ``routing``) where ``block_size % 16 == 0``,
    ``D % 32 == 0`` and the cache is 16-byte aligned, else the portable kernel (``_triton_kernels``), which also
    serves the interpreter.  All read the same bytes and agree to fp16 rounding.

    Args:
        query: ``(B, Hq, D)`` float16/bfloat16/float32; ``Hq % Hk == 0`` (GQA).
        cache: uint8, as in :func:`store_kv`.
        block_tables: ``(B, max_blocks)`` int32/int64.
        seq_lens: ``(B,)`` int32/int64 context length per request (0 allowed: output 0, lse -inf).
        spec: a :class:`TurboQuantSpec` or preset name.
        scale: softmax scale (usually ``D**-0.5``).
        mid_out: float32 ``(B, Hq, S, D+1)`` decode workspace; split ``s`` writes its normalized
            partial output to ``[..., s, :D]`` and its log-sum-exp to ``[..., s, D]``.
            ``S = mid_out.shape[2]`` splits, bounds from :func:`split_bounds`.
        output: ``(B, Hq, D)`` float16/bfloat16/float32 (the model dtype), written in place.
        lse: float32 ``(B, Hq)``, written in place (natural-log log-sum-exp of the scaled scores).
        backend: ``"auto" | "torch" | "triton"``.

    Returns:
        ``output``.

    Raises:
        TypeError: wrong dtypes.  ValueError: shape/device mismatch, ``Hq % Hk != 0``, bad scale,
            sequence longer than its block table row or block id out of range (CPU).
    """
    spec = get_spec(spec)
    dev = _check_decode(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse)
    if _is_meta(query, cache, block_tables, seq_lens, mid_out, output, lse):
        return output
    cache = heads_view(cache, spec)
    if dev.type == "cpu":
        _check_decode_ranges(cache, block_tables, seq_lens)
    if query.shape[0] == 0:
        return output
    if resolve_backend(backend, dev) == "triton":
        from tqlab.turboquant.routing import decode_kernels

        kernels = decode_kernels(spec, dev, query, cache)  # the routing rule (tqlab/turboquant/routing.py)
        return kernels.decode_attention(query, cache, block_tables, seq_lens, spec, float(scale), mid_out, output, lse)
    return _decode_reference(query, cache, block_tables, seq_lens, spec, float(scale), mid_out, output, lse)


def decode_kernel_name(query, cache, spec, backend: str = "auto") -> str:
    """Which kernel :func:`decode_attention` runs for this query ``(B, Hq, D)``, cache and spec (no launch; the rule
    reads nothing else): ``"torch"`` (the reference), ``"portable"``
    (``_triton_kernels``), ``"fast"`` (``_triton_fast``), ``"gluon_vllm"`` (``_gluon_vllm_decode``), ``"block_soa"``
    (``_triton_soa``) or ``"gluon"``
    (``_gluon_decode``); the rule: :mod:`tqlab.turboquant.routing`.  Benchmarks record it next to their timings.

    Raises:
        ValueError: unknown ``backend`` or preset (as :func:`decode_attention`)."""
    spec = get_spec(spec)
    if resolve_backend(backend, query.device) != "triton":
        return "torch"
    from tqlab.turboquant.routing import decode_kernel_name as name

    return name(query, heads_view(cache, spec), spec)


def _check_decode(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse) -> torch.device:
    """Types, shapes and devices of :func:`decode_attention`'s arguments; returns the device."""
    for nm, t in (("query", query), ("block_tables", block_tables), ("seq_lens", seq_lens),
                  ("mid_out", mid_out), ("output", output), ("lse", lse)):
        _need_tensor(nm, t)
    if query.dtype not in FLOAT_DTYPES or output.dtype not in FLOAT_DTYPES:
        raise TypeError(f"query/output must be one of {FLOAT_DTYPES}, got {query.dtype}/{output.dtype}")
    if mid_out.dtype != torch.float32 or lse.dtype != torch.float32:
        raise TypeError(f"mid_out and lse must be float32, got {mid_out.dtype}/{lse.dtype}")
    if query.dim() != 3:
        raise ValueError(f"query must be (B, Hq, D), got {tuple(query.shape)}")
    b, hq, d = query.shape
    _check_head_dim(d, spec)
    nb, hk, bs, _ = _check_cache(cache, spec, d)
    if hq % hk:
        raise ValueError(f"num query heads {hq} is not a multiple of num kv heads {hk}")
    if output.shape != query.shape:
        raise ValueError(f"output must be {tuple(query.shape)}, got {tuple(output.shape)}")
    if lse.shape != (b, hq):
        raise ValueError(f"lse must be {(b, hq)}, got {tuple(lse.shape)}")
    if mid_out.dim() != 4 or mid_out.shape[:2] != (b, hq) or mid_out.shape[3] != d + 1 or mid_out.shape[2] < 1:
        raise ValueError(f"mid_out must be (B, Hq, S, D+1) = ({b}, {hq}, S>=1, {d + 1}), got {tuple(mid_out.shape)}")
    if block_tables.dtype not in _INT_DTYPES or seq_lens.dtype not in _INT_DTYPES:
        raise TypeError(f"block_tables/seq_lens must be int32/int64, got {block_tables.dtype}/{seq_lens.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(f"block_tables must be ({b}, max_blocks), got {tuple(block_tables.shape)}")
    if seq_lens.shape != (b,):
        raise ValueError(f"seq_lens must be ({b},), got {tuple(seq_lens.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    if query.stride(-1) != 1 or output.stride(-1) != 1 or mid_out.stride(-1) != 1:
        raise ValueError(f"query/output/mid_out must have unit stride in the last dimension, got "
                         f"{query.stride(-1)}/{output.stride(-1)}/{mid_out.stride(-1)}")
    return _same_device(query=query, cache=cache, block_tables=block_tables, seq_lens=seq_lens,
                        mid_out=mid_out, output=output, lse=lse)


def _check_decode_ranges(cache, block_tables, seq_lens) -> None:
    """CPU only (a host sync elsewhere): sequence lengths and the block ids they use."""
    nb, bs = cache.shape[0], cache.shape[2]
    max_len = block_tables.shape[1] * bs
    if not seq_lens.numel():
        return
    if int(seq_lens.min()) < 0 or int(seq_lens.max()) > max_len:
        raise ValueError(f"seq_lens must lie in [0, {max_len}] (max_blocks x block_size), got {seq_lens.tolist()}")
    for i in range(seq_lens.shape[0]):
        used = block_tables[i, : -(-int(seq_lens[i]) // bs)]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= nb):
            bad = int(used[(used < 0) | (used >= nb)][0])
            raise ValueError(f"block_tables[{i}] holds block ids outside [0, {nb}) within its sequence "
                             f"(seq_lens[{i}] = {int(seq_lens[i])}): {bad}")


def _decode_reference(query, cache, block_tables, seq_lens, spec, scale, mid_out, output, lse):
    b, hq, d = query.shape
    hk = cache.shape[1]
    g = hq // hk
    s_splits = mid_out.shape[2]
    for i in range(b):
        n = int(seq_lens[i])
        if n == 0:
            mid_out[i, :, :, :d] = 0.0
            mid_out[i, :, :, d] = -math.inf
            continue
        k, v = decode_slots(_gather_request(cache, block_tables[i], n, spec, d), spec, d)  # (Hk, n, D) f32
        k = k.repeat_interleave(g, dim=0)
        v = v.repeat_interleave(g, dim=0)
        scores = torch.einsum("hd,hnd->hn", query[i].float(), k) * scale  # (Hq, n)
        chunk = -(-n // s_splits)
        pad = chunk * s_splits - n
        sc = torch.nn.functional.pad(scores, (0, pad), value=-math.inf).view(hq, s_splits, chunk)
        vv = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(hq, s_splits, chunk, d)
        part_lse = torch.logsumexp(sc, dim=-1)  # (Hq, S), -inf for empty splits
        p = torch.where(torch.isfinite(part_lse)[..., None], torch.exp(sc - part_lse[..., None]), 0.0)
        mid_out[i, :, :, :d] = torch.einsum("hsn,hsnd->hsd", p, vv)
        mid_out[i, :, :, d] = part_lse
    reduce_splits(mid_out, output, lse)
    return output


def reduce_splits(mid_out: torch.Tensor, output: torch.Tensor, lse: torch.Tensor) -> None:
    """Torch reduction of split partials: ``lse = logsumexp_s(lse_s)``,
    ``output = sum_s exp(lse_s - lse) * o_s`` (0 and ``-inf`` where every split is empty)."""
    d = mid_out.shape[-1] - 1
    part = mid_out[..., d]
    tot = torch.logsumexp(part, dim=-1)  # (B, Hq)
    w = torch.where(torch.isfinite(tot)[..., None], torch.exp(part - tot[..., None]), 0.0)
    output.copy_(torch.einsum("bhs,bhsd->bhd", w, mid_out[..., :d]).to(output.dtype))
    lse.copy_(tot)
