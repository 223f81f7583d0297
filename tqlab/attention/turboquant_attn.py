"""The attention backend: paged KV cache, metadata builder, and the two workspace consumers.

Mirrors the structure of ``vllm/v1/attention/backends/turboquant_attn.py``:

* :class:`TurboQuantMetadataBuilder` — builds per-step metadata; with the fix
  (vLLM PR #44053) its ``__init__`` calls :meth:`~TurboQuantMetadataBuilder._reserve_workspace`,
  which reserves the worst case before CUDA graph capture.
* :class:`TurboQuantAttentionBackend` — per layer: store K/V into the cache,
  then attention. Decode rows use the split-KV decode kernel, whose scratch
  lives in the workspace; a prefill chunk with cached tokens either runs the
  decode kernel (``q_len <= 128``) or dequantizes the cached K/V into workspace
  buffers (``_continuation_prefill``) — the call that crashed in the bug report.

The cache format plugs in behind :class:`KVCacheFormat`: :class:`Fp16KVCache`
(unquantized, model dtype) here, the packed TurboQuant cache in
``tqlab/turboquant``. Workspace shapes always come from ``tqlab/core/reservation.py``.
All code runs on ``cpu``, ``cuda`` and ``meta`` (shape-only) tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from tqlab.core.dtypes import as_torch
import torch
import torch.nn.functional as F

from tqlab.core.workspace_layout import cdiv
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import (
    chunk_workspace_request,
    deployment_decode_shapes,
    reservation_plan,
    reserve_workspace,
)
from tqlab.core.workspace import WorkspaceManager
from tqlab.turboquant.spec import kv_cache_bytes_per_token  # noqa: F401  (re-exported: tqlab.attention)

__all__ = [
    "AttentionMetadata",
    "Fp16KVCache",
    "KVCacheFormat",
    "TurboQuantAttentionBackend",
    "TurboQuantMetadataBuilder",
    "make_kv_cache_format",
    "split_kv_decode_reference",
]


# --------------------------------------------------------------------------- #
# Cache formats                                                               #
# --------------------------------------------------------------------------- #


class KVCacheFormat(Protocol):
    """How K/V are laid out in the paged cache (one tensor per layer)."""

    name: str

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor: ...

    def bytes_per_token(self) -> int: ...

    def store(self, cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None: ...

    def dequant(
        self, cache: torch.Tensor, block_table_row: torch.Tensor, cached_len: int, k_out: torch.Tensor, v_out: torch.Tensor
    ) -> None: ...

    def decode(
        self,
        query: torch.Tensor,
        cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        mid_out: torch.Tensor,
        output: torch.Tensor,
        lse: torch.Tensor,
    ) -> torch.Tensor: ...


def _gather_tokens(paged: torch.Tensor, block_tables: torch.Tensor, num_tokens: int, block_size: int) -> torch.Tensor:
    """``paged`` is ``(num_blocks, Hk, block_size, X)``; returns ``(B, Hk, num_tokens, X)`` in logical order."""
    nblk = cdiv(num_tokens, block_size)
    blocks = paged[block_tables[:, :nblk].long()]  # (B, nblk, Hk, bs, X)
    b, _, hk, bs, x = blocks.shape
    return blocks.permute(0, 2, 1, 3, 4).reshape(b, hk, nblk * bs, x)[:, :, :num_tokens]


def split_kv_decode_reference(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    mid_out: torch.Tensor,
    output: torch.Tensor,
    lse: torch.Tensor,
) -> torch.Tensor:
    """Split-KV (flash-decoding) attention on dense per-request K/V, writing the workspace views.

    Args:
        query: ``(B, Hq, D)``.
        keys, values: ``(B, Hk, L, D)`` float32, ``L >= max(seq_lens)``; ``Hq % Hk == 0``.
        seq_lens: ``(B,)`` context length of each row (>= 1).
        mid_out: ``(B, Hq, S, D+1)`` float32: split ``s`` covers positions
            ``[s*ceil(L/S), (s+1)*ceil(L/S))``; ``[..., :D]`` gets its normalized
            partial output, ``[..., D]`` its log-sum-exp (``-inf`` if empty).
        output: ``(B, Hq, D)`` model dtype, receives the reduced result.
        lse: ``(B, Hq)`` float32, receives the total log-sum-exp.
    Returns ``output``.
    """
    if query.dim() != 3 or keys.dim() != 4 or keys.shape != values.shape:
        raise ValueError(
            f"expected query (B, Hq, D) and keys/values (B, Hk, L, D); got {tuple(query.shape)}, "
            f"{tuple(keys.shape)}, {tuple(values.shape)}"
        )
    b, hq, d = query.shape
    hk, length = keys.shape[1], keys.shape[2]
    if keys.shape[0] != b or keys.shape[3] != d or hq % hk:
        raise ValueError(f"query {tuple(query.shape)} and keys {tuple(keys.shape)} disagree (B, D, or Hq % Hk != 0)")
    if keys.dtype != torch.float32 or values.dtype != torch.float32:
        raise TypeError(f"keys/values must be float32, got {keys.dtype}/{values.dtype}")
    s = mid_out.shape[2]
    if tuple(mid_out.shape) != (b, hq, s, d + 1) or tuple(output.shape) != (b, hq, d) or tuple(lse.shape) != (b, hq):
        raise ValueError(
            f"workspace views do not match (B={b}, Hq={hq}, D={d}): mid_out {tuple(mid_out.shape)}, "
            f"output {tuple(output.shape)}, lse {tuple(lse.shape)}"
        )
    if seq_lens.device.type == "cpu" and seq_lens.numel() and int(seq_lens.max()) > length:
        raise ValueError(f"seq_lens up to {int(seq_lens.max())} exceed the {length} positions of keys/values")
    if b == 0:
        return output
    group = hq // hk
    per = max(1, cdiv(length, s))
    pad = per * s - length
    k = keys.repeat_interleave(group, dim=1)
    v = values.repeat_interleave(group, dim=1)
    if pad:
        k = F.pad(k, (0, 0, 0, pad))
        v = F.pad(v, (0, 0, 0, pad))
    scores = torch.einsum("bhd,bhld->bhl", query.float(), k) * scale  # (B, Hq, S*per)
    pos = torch.arange(per * s, device=query.device)
    valid = pos[None, :] < seq_lens.to(query.device)[:, None]  # (B, S*per)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf")).view(b, hq, s, per)
    m = scores.amax(dim=-1, keepdim=True)  # (B, Hq, S, 1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m_safe)
    denom = p.sum(dim=-1, keepdim=True)
    acc = torch.einsum("bhsl,bhsld->bhsd", p, v.view(b, hq, s, per, d))
    part = torch.where(denom > 0, acc / denom.clamp_min(1e-30), torch.zeros_like(acc))
    split_lse = torch.where(denom > 0, m_safe + torch.log(denom.clamp_min(1e-30)), torch.full_like(denom, float("-inf")))
    mid_out[..., :d] = part
    mid_out[..., d] = split_lse.squeeze(-1)
    # Reduction across splits, reading back from the workspace.
    lse_all = mid_out[..., d]
    total = torch.logsumexp(lse_all, dim=-1)  # (B, Hq)
    w = torch.exp(lse_all - total[..., None]).nan_to_num(0.0)
    lse.copy_(total)
    output.copy_(torch.einsum("bhs,bhsd->bhd", w, mid_out[..., :d]).to(output.dtype))
    return output


class Fp16KVCache:
    """Unquantized paged cache in the model dtype: ``(num_blocks, 2, Hk, block_size, D)``.

    ``kv_cache_dtype="auto"``. ``dequant`` is a copy (converted to float16, the
    dtype of the workspace buffers); ``decode`` is :func:`split_kv_decode_reference`.
    """

    name = "auto"

    def __init__(self, config: EngineConfig):
        self.num_kv_heads = config.num_kv_heads_per_rank
        self.head_dim = config.head_dim
        self.block_size = config.block_size
        self.dtype = config.torch_dtype

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(
            (num_blocks, 2, self.num_kv_heads, self.block_size, self.head_dim), dtype=self.dtype, device=device
        )

    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def store(self, cache, key, value, slot_mapping) -> None:
        if cache.device.type == "meta" or slot_mapping.numel() == 0:
            return
        # Padding rows (slot -1) rewrite slot 0 of the null block with its own
        # value: no boolean indexing, so no host sync (capture-safe), and no change.
        keep = (slot_mapping >= 0)[:, None, None]
        slots = slot_mapping.long().clamp_min(0)
        blk, off = slots // self.block_size, slots % self.block_size
        cache[blk, 0, :, off] = torch.where(keep, key.to(cache.dtype), cache[blk, 0, :, off])
        cache[blk, 1, :, off] = torch.where(keep, value.to(cache.dtype), cache[blk, 1, :, off])

    def dequant(self, cache, block_table_row, cached_len, k_out, v_out) -> None:
        if cache.device.type == "meta" or cached_len == 0:
            return
        kv = _gather_tokens(cache.flatten(1, 2), block_table_row[None], cached_len, self.block_size)[0]  # (2*Hk, cached, D)
        k_out[0, :, :cached_len].copy_(kv[: self.num_kv_heads])
        v_out[0, :, :cached_len].copy_(kv[self.num_kv_heads :])

    def decode(self, query, cache, block_tables, seq_lens, scale, mid_out, output, lse):
        if cache.device.type == "meta":
            return output
        if query.device.type == "cuda":
            # Static length (the whole block table) so the step can be captured in a
            # CUDA graph: reading seq_lens on the host would sync.
            length = block_tables.shape[1] * self.block_size
        else:
            length = int(seq_lens.max()) if seq_lens.numel() else 0
        kv = _gather_tokens(cache.flatten(1, 2), block_tables, max(length, 1), self.block_size).float()
        k, v = kv[:, : self.num_kv_heads], kv[:, self.num_kv_heads :]
        return split_kv_decode_reference(query, k, v, seq_lens, scale, mid_out, output, lse)


class TurboQuantKVCache:
    """Packed TurboQuant cache uint8, vLLM 0.33's own tensor ``(num_blocks, block_size, Hk, slot_bytes)``
    (``tqlab.turboquant.kv_cache_shape``)."""

    def __init__(self, config: EngineConfig):
        from tqlab import turboquant as tq

        self._tq = tq
        self.spec = tq.get_spec(config.kv_cache_dtype)
        self.name = config.kv_cache_dtype
        self.num_kv_heads = config.num_kv_heads_per_rank
        self.head_dim = config.head_dim
        self.block_size = config.block_size

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        shape = self._tq.kv_cache_shape(num_blocks, self.num_kv_heads, self.block_size, self.head_dim, self.spec)
        return torch.zeros(shape, dtype=torch.uint8, device=device)

    def bytes_per_token(self) -> int:
        return self.num_kv_heads * self.spec.slot_bytes(self.head_dim)

    def store(self, cache, key, value, slot_mapping) -> None:
        if cache.device.type == "meta" or slot_mapping.numel() == 0:
            return
        # store_kv skips negative (padding) slots itself: no boolean indexing, capture-safe.
        self._tq.store_kv(cache, key, value, slot_mapping, self.spec)

    def dequant(self, cache, block_table_row, cached_len, k_out, v_out) -> None:
        if cache.device.type == "meta" or cached_len == 0:
            return
        self._tq.dequant_kv(cache, block_table_row, cached_len, k_out, v_out, self.spec)

    def decode(self, query, cache, block_tables, seq_lens, scale, mid_out, output, lse):
        if cache.device.type == "meta":
            return output
        return self._tq.decode_attention(query, cache, block_tables, seq_lens, self.spec, scale, mid_out, output, lse)


def make_kv_cache_format(config: EngineConfig) -> KVCacheFormat:
    """``Fp16KVCache`` for ``auto``, the packed TurboQuant cache for ``turboquant_*``."""
    if config.is_turboquant:
        return TurboQuantKVCache(config)
    return Fp16KVCache(config)


# --------------------------------------------------------------------------- #
# Metadata builder (where the fix lives)                                      #
# --------------------------------------------------------------------------- #


@dataclass
class AttentionMetadata:
    """One step's batch, decodes first (vLLM reorders batches the same way).

    ``slot_mapping`` ``(N,)`` int64 flat cache slot per token (-1: do not store);
    ``block_tables`` ``(R, max_blocks)`` int32; ``seq_lens`` ``(R,)`` context
    length after this step; ``query_lens`` per request (python ints);
    ``num_decodes`` rows that are single-token decodes.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: list[int]
    num_decodes: int

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes


class TurboQuantMetadataBuilder:
    """Builds :class:`AttentionMetadata`; with ``reserve=True`` reserves the workspace in ``__init__``.

    ``reserve=True`` is the fix of vLLM PR #44053: ``_reserve_workspace()``
    runs when the attention backend is built, i.e. before the profile run and
    CUDA graph capture, so the lock freezes a workspace already big enough for
    a ``max_model_len`` continuation prefill. ``reserve=False`` is vLLM 0.20.
    """

    def __init__(self, config: EngineConfig, workspace: WorkspaceManager, *, reserve: bool = True,
                 decode_batch: int | None = None):
        self.config = config
        self.workspace = workspace
        self.reserved_plan: list = []
        self._decode_batch = decode_batch
        if reserve:
            self._reserve_workspace()

    def _reserve_workspace(self) -> None:
        """Grow the caller's ubatch slot (slot 0 at start-up, as vLLM's builder) to :func:`tqlab.core.reservation.reservation_plan`."""
        self.reserved_plan = reserve_workspace(self.config, self.workspace, decode_batch=self._decode_batch)

    def plan(self) -> list:
        return reservation_plan(self.config, decode_batch=self._decode_batch)

    def build(self, slot_mapping, block_tables, seq_lens, query_lens, num_decodes) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping, block_tables, seq_lens, list(query_lens), num_decodes)


# --------------------------------------------------------------------------- #
# The backend                                                                 #
# --------------------------------------------------------------------------- #


class TurboQuantAttentionBackend:
    """Attention for one rank: cache store, split-KV decode, prefill and continuation prefill.

    ``workspace`` is anything with ``get_simultaneous``: the manager itself, or
    a wrapper (the per-call fallback strategy wraps it).
    """

    def __init__(self, config: EngineConfig, workspace: WorkspaceManager, cache_format: KVCacheFormat | None = None):
        self.config = config
        self.workspace = workspace
        self.cache_format = cache_format or make_kv_cache_format(config)
        self.num_heads = config.num_heads_per_rank
        self.num_kv_heads = config.num_kv_heads_per_rank
        self.head_dim = config.head_dim
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.num_kv_splits = config.tq_max_kv_splits_for_cuda_graph
        # vLLM 0.33 runs TurboQuant's backend only for a TurboQuant cache; for any other cache tqlab computes the
        # same attention as a stand-in for vLLM's backend there, with its scratch in torch.empty buffers: it asks
        # the workspace for nothing (unless the teaching variant turboquant_backend_on_unquantized is on).
        self.uses_workspace = config.has_turboquant_consumers
        self.path_counts: dict[str, int] = {"prefill": 0, "decode": 0, "decode_kernel": 0, "continuation": 0}
        if config.num_speculative_tokens:
            self.path_counts["spec_verify"] = 0

    # -- cache ---------------------------------------------------------------- #
    def do_kv_cache_update(self, cache, key, value, slot_mapping) -> None:
        """Store this step's K/V ``(N, Hk, D)`` at ``slot_mapping`` (vLLM stores before attention)."""
        self.cache_format.store(cache, key, value, slot_mapping)

    # -- decode --------------------------------------------------------------- #
    def _decode_attention(self, query, cache, block_tables, seq_lens, *, use_workspace: bool = True) -> torch.Tensor:
        """Split-KV decode for ``B`` rows: query ``(B, Hq, D)`` -> ``(B, Hq, D)`` model dtype.

        Scratch is :func:`decode_workspace_shapes` with ``B`` rows: views from the
        workspace, or (``use_workspace=False``, the short-continuation path of
        vLLM 0.33) the kernel's own ``torch.empty`` buffers of the same shapes.
        """
        b = query.shape[0]
        shapes = deployment_decode_shapes(self.config, b, self.num_kv_splits)
        if use_workspace and self.uses_workspace:
            mid_out, output, lse = self.workspace.get_simultaneous(*shapes)
        else:
            mid_out, output, lse = (torch.empty(s, dtype=as_torch(d), device=query.device) for s, d in shapes)
        self.cache_format.decode(query, cache, block_tables, seq_lens, self.scale, mid_out, output, lse)
        return output

    def forward_decode(self, query, cache, block_tables, seq_lens) -> torch.Tensor:
        self.path_counts["decode"] += 1
        return self._decode_attention(query, cache, block_tables, seq_lens)

    def forward_spec_verify(self, query, cache, block_tables, seq_lens) -> torch.Tensor:
        """Target-model decode rows under speculative decoding: the decode kernel with its own scratch.

        vLLM 0.33: a ``1 + k``-token row exceeds ``TurboQuantMetadataBuilder``'s
        ``reorder_batch_threshold`` (1, ``supports_spec_as_decode=False``), so the batch is
        ``is_prefill`` and each row a short continuation in ``_prefill_attention``:
        ``triton_turboquant_decode_attention`` without workspace buffers. tqlab runs the
        row's accepted token only (no draft is accepted); the workspace sees no call either way.
        """
        self.path_counts["spec_verify"] += 1
        return self._decode_attention(query, cache, block_tables, seq_lens, use_workspace=False)

    # -- prefill -------------------------------------------------------------- #
    def forward_prefill(self, query, key, value, cache, block_table_row, cached_len: int) -> torch.Tensor:
        """One request's prefill chunk: query ``(q, Hq, D)``, key/value ``(q, Hk, D)`` -> ``(q, Hq, D)``.

        The path is :func:`tqlab.core.reservation.chunk_workspace_request`'s.
        """
        q_len = query.shape[0]
        req = chunk_workspace_request(self.config, cached_len, q_len)
        self.path_counts[req.path] += 1
        if req.path == "prefill":
            return self._sdpa(query, key, value, cached_len=0)
        if req.path == "decode_kernel":
            # One synthetic decode row per new token, causal by its seq_len.
            seq_lens = torch.arange(cached_len + 1, cached_len + q_len + 1, device=query.device)
            bt = block_table_row[None].expand(q_len, -1)
            return self._decode_attention(query, cache, bt, seq_lens, use_workspace=False)
        return self._continuation_prefill(query, key, value, cache, block_table_row, cached_len)

    def _continuation_prefill(self, query, key, value, cache, block_table_row, cached_len: int) -> torch.Tensor:
        """Dequantize the ``cached_len`` cached tokens into workspace buffers, then attend.

        This is the call of the bug report (vLLM ``turboquant_attn.py``
        ``_continuation_prefill``): the buffers are sized by ``cached_len``, so a
        long prompt asks for far more than decode capture ever did.
        """
        shapes = chunk_workspace_request(self.config, cached_len, query.shape[0]).shapes
        if self.uses_workspace:
            k_buf, v_buf = self.workspace.get_simultaneous(*shapes)
        else:  # not TurboQuant's backend in vLLM: the buffers are this call's own
            k_buf, v_buf = (torch.empty(s, dtype=as_torch(d), device=query.device) for s, d in shapes)
        self.cache_format.dequant(cache, block_table_row, cached_len, k_buf, v_buf)
        if query.device.type == "meta":  # shapes only: skip the O(context) cat, mask and SDPA shape arithmetic
            return self._sdpa(query, key, value, cached_len=cached_len)
        k_cached = k_buf[0, :, :cached_len].transpose(0, 1)  # (cached, Hk, D)
        v_cached = v_buf[0, :, :cached_len].transpose(0, 1)
        k_all = torch.cat([k_cached.to(query.dtype), key.to(query.dtype)], dim=0)
        v_all = torch.cat([v_cached.to(query.dtype), value.to(query.dtype)], dim=0)
        return self._sdpa(query, k_all, v_all, cached_len=cached_len)

    def _sdpa(self, query, key, value, *, cached_len: int) -> torch.Tensor:
        """Causal attention of ``q`` new tokens at positions ``cached_len..`` over ``key``/``value`` (all positions).

        ``query`` ``(q, Hq, D)``, ``key``/``value`` ``(total, Hk, D)`` -> ``(q, Hq, D)`` in the query's dtype. On
        ``meta`` only the output's shape: SDPA's meta kernel decomposes in Python (~10 ms a call, per layer and chunk).
        """
        if query.device.type == "meta":
            return query.new_empty(query.shape[1], query.shape[0], value.shape[-1]).transpose(0, 1)  # SDPA's strides
        q = query.transpose(0, 1)[None]  # (1, Hq, q, D)
        k = key.transpose(0, 1)[None]
        v = value.transpose(0, 1)[None]
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if cached_len == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            q_len, total = query.shape[0], key.shape[0]
            qpos = torch.arange(cached_len, cached_len + q_len, device=query.device)
            kpos = torch.arange(total, device=query.device)
            mask = kpos[None, :] <= qpos[:, None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return out[0].transpose(0, 1)

