"""CUDA graphs for the decode step: capture, replay, frozen workspace pointers, and a replay guard.

Seed 002 §8 in code. A captured ``torch.cuda.CUDAGraph`` replays raw device
pointers, including the ``data_ptr()`` of every workspace view that the decode
step asked :meth:`~tqlab.workspace.WorkspaceManager.get_simultaneous` for while
it was being captured. vLLM keeps those pointers valid with a chain of rules
(``vllm/v1/worker/gpu_model_runner.py``: ``_warmup_and_capture`` then
``capture_model`` then ``lock_workspace()``):

1. eager warm-up *before* capture grows the workspace to what the step needs,
   so the capture itself allocates nothing (``_ensure_workspace_size`` takes the
   fast path);
2. buckets are captured largest first, so later (smaller) buckets fit;
3. the workspace is locked after capture: growth is an error, so the buffer a
   graph baked in is never freed.

This module implements that for the tqlab engine, plus a *replay guard* that
vLLM does not have: at capture the runner records the workspace buffers' data
pointers, and before every replay it checks them, raising
:class:`StalePointerError` (naming the moved ubatch slot) instead of replaying
into freed memory.

Main pieces
-----------
* :class:`CUDAGraphDecodeRunner` -- the engine's decode runner on CUDA
  (``LLMEngine._install_cuda_graphs``): one graph per decode batch-size bucket,
  eager warm-up on a side stream, one shared graph memory pool, static input
  buffers sized for the largest bucket and ``max_blocks_per_seq``; replay picks
  the smallest bucket >= batch and pads the unused lanes onto the null block.
  ``mode="simulated"`` runs the same runner without CUDA: a
  :class:`SimulatedGraph` re-runs the step with the workspace views it recorded
  at capture (the frozen pointers) instead of asking the manager again, which is
  exactly the part of a graph that matters here.
* :class:`StaticDecodeInputs` -- the static buffers and the padding rule.
* :func:`select_bucket`, :func:`snapshot_workspace`, :func:`check_workspace`.
* :class:`BatchDependentSplitsBackend` -- a decode consumer whose workspace need
  is *not* monotonic in the batch (small batches use more KV splits), and
  :func:`reserve_for_buckets`, the only safe answer to it.
* Demonstrations used by ``notebooks/05_cuda_graphs_live``: :func:`warmup_demo`,
  :func:`pointer_stability_demo`, :func:`stale_replay_demo`,
  :func:`capture_order_demo`, :func:`nonmonotonic_demo`, :func:`late_warmup_demo`,
  and :func:`measure_decode_latency`. Every demonstration stays inside memory
  the process owns: when a graph is shown writing to a buffer the workspace has
  let go of, the runner holds a reference to that buffer, so the writes land in
  live memory instead of crashing the process (vLLM's public report saw an
  illegal memory access there).

Imports no vLLM; works without CUDA (``mode="simulated"``).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as _dt
import gc
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .attention import Fp16KVCache, TurboQuantAttentionBackend, TurboQuantKVCache, split_kv_decode_reference
from .attention.turboquant_attn import _gather_tokens
from .config import EngineConfig
from .engine.model_runner import CaptureRecord
from .reservation import decode_workspace_shapes
from .workspace import (
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    current_ubatch_id,
    format_mb,
    ubatch_context,
)

__all__ = [
    "NULL_BLOCK",
    "PAD_SLOT",
    "BatchDependentSplitsBackend",
    "CUDAGraphDecodeRunner",
    "DecodeBatch",
    "LiveCells",
    "SimulatedGraph",
    "StaticDecodeInputs",
    "StalePointerError",
    "WorkspaceSnapshot",
    "bucket_workspace_bytes",
    "capture_buckets",
    "capture_order_demo",
    "check_workspace",
    "decode_shapes_for",
    "format_table",
    "install_decode_runner",
    "jsonable",
    "late_warmup_demo",
    "load_recorded",
    "make_demo_config",
    "make_engine",
    "make_graph_safe",
    "plot_latency",
    "measure_decode_latency",
    "no_gc_during_capture",
    "nonmonotonic_demo",
    "pointer_stability_demo",
    "prepare_decode_batch",
    "provenance",
    "recorded_banner",
    "reserve_for_buckets",
    "select_bucket",
    "snapshot_workspace",
    "stale_replay_demo",
    "warmup_demo",
]

logger = logging.getLogger(__name__)

NULL_BLOCK = 0
"""Block id padded lanes point at (the scheduler never hands out block 0)."""

PAD_SLOT = -1
"""Slot id of a padded lane: the cache store skips it (vLLM's ``PAD_SLOT_ID``)."""

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def _pos_int(name: str, v: object, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return v


# --------------------------------------------------------------------------- #
# Buckets                                                                     #
# --------------------------------------------------------------------------- #


def select_bucket(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured bucket that holds ``batch_size`` decode rows, or None.

    Args:
        batch_size: decode rows in this step (>= 1).
        sizes: captured bucket sizes (any order, positive ints).

    Returns:
        ``min(s for s in sizes if s >= batch_size)``; ``None`` when the batch is
        larger than every bucket (the runner then runs the step eagerly, as vLLM
        does for batches above its largest capture size).

    Raises:
        ValueError: ``batch_size < 1`` or an empty / non-positive ``sizes``.
    """
    b = _pos_int("batch_size", batch_size)
    ordered = sorted(sizes)
    if not ordered or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in ordered):
        raise ValueError(f"sizes must be a non-empty sequence of positive ints, got {sizes!r}")
    i = bisect.bisect_left(ordered, b)
    return ordered[i] if i < len(ordered) else None


# --------------------------------------------------------------------------- #
# Static input buffers and the padding rule                                   #
# --------------------------------------------------------------------------- #


@dataclass
class DecodeBatch:
    """Inputs of one pure-decode step (what ``ModelRunner.execute_model`` passes to the decode runner).

    ``input_ids`` ``(B,)`` int64 last token of each request; ``slot_mapping``
    ``(B,)`` int64 flat cache slot of that token; ``block_tables`` ``(B, W)``
    int32 block ids (0-padded); ``seq_lens`` ``(B,)`` int32 context length after
    this step.
    """

    input_ids: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, n: int) -> "DecodeBatch":
        """The first ``n`` requests."""
        return DecodeBatch(self.input_ids[:n], self.slot_mapping[:n], self.block_tables[:n], self.seq_lens[:n])

    def astuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.input_ids, self.slot_mapping, self.block_tables, self.seq_lens


class StaticDecodeInputs:
    """The static tensors a decode graph reads, sized for the largest bucket.

    A graph reads its inputs from fixed addresses, so every step copies the
    batch *into* these tensors before replay. Lanes ``[n, bucket)`` of a batch of
    ``n`` rows replayed in a ``bucket``-row graph are padding: token 0, slot
    :data:`PAD_SLOT` (the store skips it), block table all :data:`NULL_BLOCK`,
    ``seq_len`` 1 (one position, on the null block). They are rewritten on every
    step: lanes left over from an earlier, larger batch would otherwise still
    hold a real request's slot and blocks, and the replay would store into that
    request's cache slot (the "stale padded lanes" pitfall).

    Args:
        max_batch: rows (the largest bucket, at least ``max_num_seqs``).
        max_blocks_per_seq: block-table width, ``ceil(max_model_len / block_size)``;
            a narrower static table could not hold a long request's blocks.
        device: where the tensors live.

    Tensors: ``input_ids (max_batch,) int64``, ``slot_mapping (max_batch,) int64``,
    ``block_tables (max_batch, max_blocks_per_seq) int32``, ``seq_lens (max_batch,) int32``.
    """

    def __init__(self, max_batch: int, max_blocks_per_seq: int, device: torch.device | str):
        self.max_batch = _pos_int("max_batch", max_batch)
        self.max_blocks_per_seq = _pos_int("max_blocks_per_seq", max_blocks_per_seq)
        self.device = torch.device(device)
        dev = self.device
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_batch,), PAD_SLOT, dtype=torch.long, device=dev)
        self.block_tables = torch.full((max_batch, max_blocks_per_seq), NULL_BLOCK, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.device = self.input_ids.device  # concrete ("cuda:0", not "cuda"), as the inputs' devices are

    def nbytes(self) -> int:
        """Bytes of the four static tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.input_ids, self.slot_mapping, self.block_tables, self.seq_lens

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``bucket`` rows of each static tensor: the arguments a bucket's graph is captured with."""
        self._check_bucket(bucket)
        return (self.input_ids[:bucket], self.slot_mapping[:bucket], self.block_tables[:bucket], self.seq_lens[:bucket])

    def _check_bucket(self, bucket: int) -> int:
        b = _pos_int("bucket", bucket)
        if b > self.max_batch:
            raise ValueError(f"bucket {b} is larger than the static buffers ({self.max_batch} rows)")
        return b

    def pad(self, start: int, stop: int) -> None:
        """Reset lanes ``[start, stop)`` to padding (token 0, slot -1, null-block row, seq_len 1)."""
        if not 0 <= start <= stop <= self.max_batch:
            raise ValueError(f"lanes [{start}, {stop}) are outside [0, {self.max_batch}]")
        if start == stop:
            return
        self.input_ids[start:stop].zero_()
        self.slot_mapping[start:stop].fill_(PAD_SLOT)
        self.block_tables[start:stop].fill_(NULL_BLOCK)
        self.seq_lens[start:stop].fill_(1)

    def fill(self, batch: DecodeBatch | Sequence[torch.Tensor], bucket: int) -> int:
        """Copy a batch of ``n`` rows into lanes ``[0, n)`` and pad lanes ``[n, bucket)``.

        Validates everything before writing: on error the static tensors are unchanged.

        Returns:
            ``n``.
        Raises:
            ValueError: ``n`` is 0 or larger than ``bucket``; the four tensors
                disagree on ``n``; the block table is not 2-D or is wider than
                ``max_blocks_per_seq`` (a request longer than the static table);
                a tensor is on another device.
            TypeError: a non-integer dtype.
        """
        ids, slots, bt, seq = batch.astuple() if isinstance(batch, DecodeBatch) else tuple(batch)
        b = self._check_bucket(bucket)
        for name, t in (("input_ids", ids), ("slot_mapping", slots), ("block_tables", bt), ("seq_lens", seq)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise TypeError(f"{name} must hold integers, got {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the static buffers on {self.device}")
        n = int(ids.shape[0]) if ids.dim() == 1 else -1
        if n < 1:
            raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(ids.shape)}")
        if n > b:
            raise ValueError(f"batch of {n} rows does not fit bucket {b}")
        if slots.shape != (n,) or seq.shape != (n,):
            raise ValueError(
                f"slot_mapping {tuple(slots.shape)} and seq_lens {tuple(seq.shape)} must both be ({n},)"
            )
        if bt.dim() != 2 or bt.shape[0] != n:
            raise ValueError(f"block_tables must be ({n}, width), got {tuple(bt.shape)}")
        w = int(bt.shape[1])
        if w > self.max_blocks_per_seq:
            raise ValueError(
                f"block table is {w} blocks wide but the static table holds {self.max_blocks_per_seq} "
                "(max_blocks_per_seq = ceil(max_model_len / block_size)): a request this long cannot be replayed"
            )
        self.input_ids[:n].copy_(ids, non_blocking=True)
        self.slot_mapping[:n].copy_(slots, non_blocking=True)
        self.seq_lens[:n].copy_(seq, non_blocking=True)
        self.block_tables[:n, :w].copy_(bt, non_blocking=True)
        if w < self.max_blocks_per_seq:
            self.block_tables[:n, w:].fill_(NULL_BLOCK)
        self.pad(n, b)
        return n


# --------------------------------------------------------------------------- #
# Pointer snapshots and the replay guard                                      #
# --------------------------------------------------------------------------- #


class StalePointerError(RuntimeError):
    """A captured graph would replay into a workspace buffer the manager no longer holds.

    Raised by the replay guard of :class:`CUDAGraphDecodeRunner` *before* the
    replay. Attributes: ``bucket``, ``slot`` (ubatch slot), ``captured_ptr``,
    ``current_ptr``, ``captured_bytes``, ``current_bytes``.
    """

    def __init__(self, bucket: int, slot: int, captured_ptr: int, current_ptr: int, captured_bytes: int,
                 current_bytes: int):
        self.bucket = bucket
        self.slot = slot
        self.captured_ptr = captured_ptr
        self.current_ptr = current_ptr
        self.captured_bytes = captured_bytes
        self.current_bytes = current_bytes
        super().__init__(
            f"refusing to replay the CUDA graph of decode bucket {bucket}: it was captured with workspace "
            f"ubatch slot {slot} at 0x{captured_ptr:x} ({format_mb(captured_bytes)} MB), but that slot now "
            f"lives at 0x{current_ptr:x} ({format_mb(current_bytes)} MB). The workspace was reallocated after "
            "capture, so the graph would write into the freed buffer. Reserve the maximum workspace over all "
            "buckets before capture, lock it after capture, or re-capture."
        )


@dataclass(frozen=True)
class WorkspaceSnapshot:
    """Workspace buffer pointers and sizes (bytes) per ubatch slot, and the slots a graph used."""

    ptrs: tuple[int, ...]
    sizes: tuple[int, ...]
    slots: tuple[int, ...]


def snapshot_workspace(manager: WorkspaceManager, slots: Sequence[int] | None = None) -> WorkspaceSnapshot:
    """Record ``data_ptr()`` and size of every slot's buffer; ``slots`` are the ones to guard (default all)."""
    ptrs = tuple(manager.data_ptrs())
    sizes = tuple(manager.sizes_bytes())
    used = tuple(range(len(ptrs))) if slots is None else tuple(sorted(set(slots)))
    for s in used:
        if not 0 <= s < len(ptrs):
            raise ValueError(f"ubatch slot {s} is out of range (workspace has {len(ptrs)} slot(s))")
    return WorkspaceSnapshot(ptrs, sizes, used)


def stale_slots(manager: WorkspaceManager, snap: WorkspaceSnapshot) -> list[int]:
    """Guarded slots whose buffer pointer differs from the snapshot."""
    cur = manager.data_ptrs()
    return [s for s in snap.slots if cur[s] != snap.ptrs[s]]


def check_workspace(manager: WorkspaceManager, snap: WorkspaceSnapshot, bucket: int) -> None:
    """The replay guard: raise :class:`StalePointerError` if a guarded slot's buffer moved since ``snap``.

    A buffer that grew *in place* (same pointer) still contains every byte the
    graph baked in, so only a changed pointer is an error.
    """
    cur = manager.data_ptrs()
    for s in snap.slots:
        if cur[s] != snap.ptrs[s]:
            raise StalePointerError(bucket, s, snap.ptrs[s], cur[s], snap.sizes[s], manager.size_bytes(s))


# --------------------------------------------------------------------------- #
# Workspace proxies: record what a capture saw, replay it frozen              #
# --------------------------------------------------------------------------- #


def _frame_caller(depth: int = 2) -> str:
    f = sys._getframe(depth)
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}:{f.f_code.co_name}"


class _RecordingWorkspace:
    """Passes ``get_simultaneous`` through to the manager and records each call's views and pointers."""

    def __init__(self, inner: WorkspaceManager):
        self._inner = inner
        self.calls: list[tuple[tuple, list[torch.Tensor]]] = []
        self.ptrs: list[tuple[int, ...]] = []
        self.slots: set[int] = set()

    def get_simultaneous(self, *reqs):
        try:
            views = self._inner.get_simultaneous(*reqs)
        except WorkspaceLockedError as e:
            # Re-raise naming the real consumer, not this proxy.
            raise WorkspaceLockedError(_frame_caller(), e.required_bytes, e.current_bytes, e.ubatch) from None
        self.calls.append((tuple((tuple(s), d) for s, d in reqs), list(views)))
        self.ptrs.append(tuple(v.data_ptr() for v in views))
        self.slots.add(current_ubatch_id())
        return views

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _FrozenWorkspace:
    """Hands out, in order, the views recorded at capture: the "baked-in pointers" of a simulated replay."""

    def __init__(self, calls: list[tuple[tuple, list[torch.Tensor]]]):
        self._calls = calls
        self._i = 0

    def get_simultaneous(self, *reqs):
        if self._i >= len(self._calls):
            raise RuntimeError(f"simulated replay asked the workspace {self._i + 1} times; the capture asked {len(self._calls)}")
        sig, views = self._calls[self._i]
        got = tuple((tuple(s), d) for s, d in reqs)
        if got != sig:
            raise RuntimeError(f"simulated replay call {self._i} asked for {got}, the capture recorded {sig}")
        self._i += 1
        return list(views)


class SimulatedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph`` where there is no CUDA.

    At capture the step runs once while its workspace requests are recorded
    (views included). :meth:`replay` runs the step again, reading the static
    inputs as they are *now*, but every workspace request is answered with the
    view recorded at capture instead of asking the manager: the workspace
    pointers are frozen, the one property of a CUDA graph that this module is
    about. The output goes into a static tensor, as a graph's does. Unlike a
    real graph, the recorded views keep their buffer alive, so a stale replay
    writes into memory this object owns (it cannot crash).
    """

    def __init__(self, backend, fn: Callable[[], torch.Tensor], calls, output: torch.Tensor):
        self._backend = backend
        self._fn = fn
        self.calls = calls
        self.output = output

    def replay(self) -> None:
        frozen = _FrozenWorkspace(self.calls)
        ws = self._backend.workspace
        self._backend.workspace = frozen
        try:
            out = self._fn()
        finally:
            self._backend.workspace = ws
        if frozen._i != len(self.calls):
            raise RuntimeError(f"simulated replay asked the workspace {frozen._i} times; the capture asked {len(self.calls)}")
        self.output.copy_(out)


# --------------------------------------------------------------------------- #
# Graph-safe cache formats                                                    #
# --------------------------------------------------------------------------- #


@contextlib.contextmanager
def no_gc_during_capture():
    """Collect garbage now, then keep the cyclic garbage collector off until the capture ends.

    A collection *during* a global-mode capture can destroy an unreachable
    engine from earlier (a ``CUDAGraph``, its pool, its tensors), and a
    driver call that this makes is not permitted while a stream captures: the
    capture is invalidated ("operation failed due to a previous error during
    capture"). vLLM freezes the collector around capture for the same reason.
    Recent PyTorch no longer collects on entering ``torch.cuda.graph``.
    """
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _is_capturing(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class _GraphSafeFormat:
    """Wraps a cache format so its decode-path ops make no host syncs (capturable).

    Delegates everything else to the wrapped format. ``static_width``: decode
    over the whole block-table width instead of ``max(seq_lens)`` (a host read).
    """

    graph_safe = True

    def __init__(self, inner):
        self.inner = inner
        self.static_width = False

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _GraphSafeTurboQuant(_GraphSafeFormat):
    """TurboQuant: the Triton store kernel skips negative slots itself, so no boolean mask (a host sync) is needed."""

    def store(self, cache, key, value, slot_mapping) -> None:
        if cache.device.type == "meta" or slot_mapping.numel() == 0:
            return
        self.inner._tq.store_kv(cache, key, value, slot_mapping, self.inner.spec)


class _GraphSafeFp16(_GraphSafeFormat):
    """Unquantized cache: masked store by read-modify-write; decode over the full block-table width while capturing."""

    def store(self, cache, key, value, slot_mapping) -> None:
        if cache.device.type == "meta" or slot_mapping.numel() == 0:
            return
        bs = self.inner.block_size
        keep = (slot_mapping >= 0)[:, None, None]
        s = slot_mapping.clamp_min(0).long()
        blk, off = s // bs, s % bs
        # Padded lanes rewrite the null block's first slot with its own value: a no-op.
        cache[blk, 0, :, off] = torch.where(keep, key.to(cache.dtype), cache[blk, 0, :, off])
        cache[blk, 1, :, off] = torch.where(keep, value.to(cache.dtype), cache[blk, 1, :, off])

    def decode(self, query, cache, block_tables, seq_lens, scale, mid_out, output, lse):
        if cache.device.type == "meta":
            return output
        if not (self.static_width or _is_capturing(query)):
            return self.inner.decode(query, cache, block_tables, seq_lens, scale, mid_out, output, lse)
        bs = self.inner.block_size
        length = block_tables.shape[1] * bs
        kv = _gather_tokens(cache.flatten(1, 2), block_tables, length, bs).float()
        hk = self.inner.num_kv_heads
        return split_kv_decode_reference(query, kv[:, :hk], kv[:, hk:], seq_lens, scale, mid_out, output, lse)


def make_graph_safe(fmt):
    """A capturable version of a cache format (TurboQuant or fp16); other formats are returned unchanged."""
    if getattr(fmt, "graph_safe", False):
        return fmt
    if isinstance(fmt, TurboQuantKVCache):
        return _GraphSafeTurboQuant(fmt)
    if isinstance(fmt, Fp16KVCache):
        return _GraphSafeFp16(fmt)
    return fmt


# --------------------------------------------------------------------------- #
# The decode runner                                                           #
# --------------------------------------------------------------------------- #


@dataclass
class CapturedBucket:
    """One captured bucket: the graph, its static output, what it froze, and what capture did to the workspace.

    ``view_ptrs``: ``data_ptr()`` of each view of each workspace request made
    during capture, in order; ``resizes_in_warmup`` / ``resizes_in_capture``:
    workspace resize events during the eager warm-up and during the capture
    itself; ``kept_buffers``: references to the captured buffers, held only when
    asked (``keep_captured_buffers``), so a stale replay stays in owned memory.
    """

    bucket: int
    graph: Any
    output: torch.Tensor
    snapshot: WorkspaceSnapshot
    view_ptrs: list[tuple[int, ...]]
    requests: list[tuple]
    resizes_in_warmup: int
    resizes_in_capture: int
    kept_buffers: dict[int, torch.Tensor] = field(default_factory=dict)


class CUDAGraphDecodeRunner:
    """Decode runner with one CUDA graph per batch-size bucket (the ``ModelRunner.decode_runner`` seam).

    Args:
        runner: the :class:`~tqlab.model_runner.ModelRunner`; its
            ``decode_forward`` is what gets captured and ``workspace`` is guarded.
        mode: ``"cuda"`` (real ``torch.cuda.CUDAGraph``), ``"simulated"``
            (:class:`SimulatedGraph`, any device but meta) or ``"auto"`` (cuda on a
            CUDA runner, else simulated).
        guard: check the workspace pointers before every replay (default True).
        num_warmups: eager warm-up runs before each capture (vLLM runs at least one).
        keep_captured_buffers: hold a reference to each captured workspace buffer
            so that a stale replay writes into memory the process still owns
            (demonstrations only; real graphs hold no reference).
        max_batch: rows of the static buffers (default: the largest of
            ``max_num_seqs`` and the config's capture sizes).

    On CUDA the backend's cache format is wrapped by :func:`make_graph_safe`
    (same cache tensors, no host syncs). Raises ``ValueError`` for a bad mode,
    ``mode="cuda"`` without a CUDA runner, or a meta runner.
    """

    def __init__(self, runner, *, mode: str = "auto", guard: bool = True, num_warmups: int = 2,
                 keep_captured_buffers: bool = False, max_batch: int | None = None):
        if mode not in ("auto", "cuda", "simulated"):
            raise ValueError(f"mode must be 'auto', 'cuda' or 'simulated', got {mode!r}")
        dev = runner.device
        if dev.type == "meta":
            raise ValueError("a meta-device runner has no memory to capture; use the EagerDecodeRunner")
        if mode == "auto":
            mode = "cuda" if dev.type == "cuda" else "simulated"
        if mode == "cuda" and dev.type != "cuda":
            raise ValueError(f"mode='cuda' needs a CUDA runner, this one is on {dev}")
        _pos_int("num_warmups", num_warmups, 0)
        self.runner = runner
        self.mode = mode
        self.kind = "cuda_graph" if mode == "cuda" else "simulated_graph"
        self.guard = bool(guard)
        self.num_warmups = num_warmups
        self.keep_captured_buffers = bool(keep_captured_buffers) or mode == "simulated"
        cfg = runner.config
        largest = max(max(cfg.capture_sizes()), cfg.max_num_seqs)
        self.max_batch = largest if max_batch is None else _pos_int("max_batch", max_batch)
        self.static = StaticDecodeInputs(self.max_batch, runner.max_blocks_per_seq, dev)
        self.graphs: dict[int, CapturedBucket] = {}
        self.records: dict[int, CaptureRecord] = {}
        self._sizes: list[int] = []
        self.stats = {"replays": 0, "eager_fallbacks": 0, "guard_checks": 0, "guard_trips": 0}
        self._warned_fallback = False
        if mode == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(device=dev)
            runner.backend.cache_format = make_graph_safe(runner.backend.cache_format)
        else:
            self.pool = None
            self.stream = None

    # -- introspection ------------------------------------------------------ #
    @property
    def captured_sizes(self) -> list[int]:
        """Captured buckets, ascending."""
        return list(self._sizes)

    @property
    def workspace(self) -> WorkspaceManager:
        return self.runner.workspace

    def stale_buckets(self) -> list[int]:
        """Buckets whose guarded workspace pointers no longer match the manager (ascending)."""
        return [b for b in self._sizes if stale_slots(self.workspace, self.graphs[b].snapshot)]

    # -- capture ------------------------------------------------------------ #
    def capture(self, batch_size: int, num_warmups: int | None = None) -> CaptureRecord:
        """Warm up eagerly, then capture the decode step for ``batch_size`` rows.

        The static lanes ``[0, batch_size)`` are set to padding first (the
        dummy run: null block, ``seq_len`` 1, nothing stored). Re-capturing a
        bucket replaces its graph. Returns the engine's
        :class:`~tqlab.model_runner.CaptureRecord` (pointers and sizes after capture).

        Raises:
            ValueError: ``batch_size`` outside ``1..max_batch``.
            WorkspaceLockedError: the workspace is locked and the step needs more.
        """
        b = _pos_int("batch_size", batch_size)
        if b > self.max_batch:
            raise ValueError(f"batch_size {b} exceeds the static buffers ({self.max_batch} rows)")
        nw = self.num_warmups if num_warmups is None else _pos_int("num_warmups", num_warmups, 0)
        ws = self.workspace
        backend = self.runner.backend
        self.static.pad(0, b)
        views = self.static.views(b)

        def step() -> torch.Tensor:
            return self.runner.decode_forward(*views)

        n0 = len(ws.events)
        if self.mode == "cuda":
            cur = torch.cuda.current_stream(self.stream.device)
            self.stream.wait_stream(cur)
            with torch.cuda.stream(self.stream):
                for _ in range(nw):
                    step()
            cur.wait_stream(self.stream)
            torch.cuda.synchronize(self.stream.device)
        else:
            for _ in range(nw):
                step()
        n1 = len(ws.events)
        rec = _RecordingWorkspace(ws)
        backend.workspace = rec
        try:
            if self.mode == "cuda":
                graph = torch.cuda.CUDAGraph()
                with no_gc_during_capture(), torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    out = step()
            else:
                out = step()
                graph = SimulatedGraph(backend, step, rec.calls, out.clone())
                out = graph.output
        finally:
            backend.workspace = ws
        n2 = len(ws.events)
        slots = sorted(rec.slots) or [current_ubatch_id()]
        snap = snapshot_workspace(ws, slots)
        kept = {s: ws.buffer(s) for s in slots if ws.buffer(s) is not None} if self.keep_captured_buffers else {}
        resize = lambda evs: sum(1 for e in evs if e.kind == "resize")  # noqa: E731
        cap = CapturedBucket(
            bucket=b, graph=graph, output=out, snapshot=snap, view_ptrs=list(rec.ptrs),
            requests=[sig for sig, _ in rec.calls],
            resizes_in_warmup=resize(ws.events[n0:n1]), resizes_in_capture=resize(ws.events[n1:n2]),
            kept_buffers=kept,
        )
        if self.mode == "cuda":
            rec.calls.clear()  # a real graph holds no reference to the views
        self.graphs[b] = cap
        if b not in self._sizes:
            bisect.insort(self._sizes, b)
        record = CaptureRecord(b, ws.data_ptrs(), ws.sizes_bytes(), graph=graph)
        self.records[b] = record
        return record

    # -- replay ------------------------------------------------------------- #
    def _guard(self, bucket: int) -> None:
        if self.guard:
            self.stats["guard_checks"] += 1
            try:
                check_workspace(self.workspace, self.graphs[bucket].snapshot, bucket)
            except StalePointerError:
                self.stats["guard_trips"] += 1
                raise

    def run(self, input_ids, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        """One pure-decode step: logits ``(B, vocab)`` float32.

        Picks the smallest captured bucket >= B, checks the guard, copies the
        batch into the static buffers (padding lanes ``[B, bucket)``) and
        replays. A batch larger than every bucket runs eagerly (counted in
        ``stats['eager_fallbacks']``). The returned tensor is a view of the
        graph's static output: valid until the next replay of that bucket.

        Raises:
            StalePointerError: the guard found a moved workspace buffer (nothing was written).
            ValueError: malformed inputs (see :meth:`StaticDecodeInputs.fill`).
        """
        n = int(input_ids.shape[0])
        bucket = select_bucket(n, self._sizes) if self._sizes else None
        if bucket is None:
            self.stats["eager_fallbacks"] += 1
            if not self._warned_fallback:
                self._warned_fallback = True
                logger.warning("decode batch of %d rows exceeds the captured buckets %s: running eagerly", n, self._sizes)
            return self.runner.decode_forward(input_ids, slot_mapping, block_tables, seq_lens)
        self._guard(bucket)
        self.static.fill((input_ids, slot_mapping, block_tables, seq_lens), bucket)
        cap = self.graphs[bucket]
        cap.graph.replay()
        self.stats["replays"] += 1
        return cap.output[:n]

    def replay(self, bucket: int) -> torch.Tensor:
        """Replay ``bucket``'s graph on the static inputs as they are (guard included); returns its full output."""
        if bucket not in self.graphs:
            raise ValueError(f"bucket {bucket} was not captured (captured: {self._sizes})")
        self._guard(bucket)
        self.graphs[bucket].graph.replay()
        self.stats["replays"] += 1
        return self.graphs[bucket].output

    def eager(self, bucket: int) -> torch.Tensor:
        """The same step run eagerly on the static inputs of ``bucket`` (the reference for a replay)."""
        fmt = self.runner.backend.cache_format
        static = getattr(fmt, "static_width", None)
        if static is not None:
            fmt.static_width = True  # same arithmetic as the captured graph
        try:
            return self.runner.decode_forward(*self.static.views(bucket))
        finally:
            if static is not None:
                fmt.static_width = static


def install_decode_runner(engine, **kwargs) -> CUDAGraphDecodeRunner:
    """Put a :class:`CUDAGraphDecodeRunner` (``kwargs`` go to it) on ``engine.runner`` and return it."""
    dr = CUDAGraphDecodeRunner(engine.runner, **kwargs)
    engine.runner.decode_runner = dr
    return dr


# --------------------------------------------------------------------------- #
# Reservation over buckets, and a non-monotonic consumer                      #
# --------------------------------------------------------------------------- #


def decode_shapes_for(backend) -> Callable[[int], tuple]:
    """``batch -> workspace request`` of ``backend``'s decode step (its ``decode_shapes`` if it has one)."""
    fn = getattr(backend, "decode_shapes", None)
    if fn is not None:
        return fn
    c = backend.config
    return lambda b: decode_workspace_shapes(b, c.num_heads_per_rank, c.head_dim, c.tq_max_kv_splits_for_cuda_graph, c.dtype)


def bucket_workspace_bytes(shapes_for: Callable[[int], tuple], sizes: Sequence[int]) -> dict[int, int]:
    """Workspace bytes each bucket's decode step asks for (``{bucket: bytes}``, 256-byte aligned views)."""
    return {b: compute_layout(shapes_for(b)).total_bytes for b in sorted(sizes)}


def reserve_for_buckets(manager: WorkspaceManager, shapes_for: Callable[[int], tuple], sizes: Sequence[int]) -> int:
    """Grow every ubatch slot to the largest need over *all* buckets before capture. Returns that bucket.

    The need of a bucket is not always largest at the largest batch (see
    :class:`BatchDependentSplitsBackend`), so "capture largest first" alone is
    not enough; reserving the maximum over all buckets is.
    """
    need = bucket_workspace_bytes(shapes_for, sizes)
    worst = max(need, key=lambda b: (need[b], b))
    for slot in range(manager.num_ubatches):
        with ubatch_context(slot):
            manager.get_simultaneous(*shapes_for(worst))
    return worst


class BatchDependentSplitsBackend(TurboQuantAttentionBackend):
    """A decode consumer whose workspace need is *not* monotonic in the batch size.

    Split-KV kernels pick how many KV splits to use by batch size: a small
    batch has too few (request, head) pairs to fill the GPU, so it splits the
    context more. Here batches of at most ``small_batch_max`` rows use
    ``small_batch_splits`` splits (default 4x ``tq_max_kv_splits_for_cuda_graph``),
    larger ones the usual number. The ``(B, Hq, S, D+1)`` float32 partials then
    need more bytes at B = ``small_batch_max`` than at a larger bucket.
    """

    def __init__(self, config: EngineConfig, workspace, cache_format=None, *, small_batch_max: int = 2,
                 small_batch_splits: int | None = None):
        super().__init__(config, workspace, cache_format)
        self.small_batch_max = _pos_int("small_batch_max", small_batch_max)
        self.small_batch_splits = (
            4 * self.num_kv_splits if small_batch_splits is None else _pos_int("small_batch_splits", small_batch_splits)
        )

    def num_kv_splits_for(self, batch: int) -> int:
        return self.small_batch_splits if batch <= self.small_batch_max else self.num_kv_splits

    def decode_shapes(self, batch: int) -> tuple:
        return decode_workspace_shapes(batch, self.num_heads, self.head_dim, self.num_kv_splits_for(batch), self.config.dtype)

    def _decode_attention(self, query, cache, block_tables, seq_lens) -> torch.Tensor:
        mid_out, output, lse = self.workspace.get_simultaneous(*self.decode_shapes(query.shape[0]))
        self.cache_format.decode(query, cache, block_tables, seq_lens, self.scale, mid_out, output, lse)
        return output


# --------------------------------------------------------------------------- #
# Engines and batches for the demonstrations                                  #
# --------------------------------------------------------------------------- #


def make_demo_config(**overrides) -> EngineConfig:
    """The seed model's rank shard (``nemotron-3-super-120b-a12b`` preset: TP 8, so 4 query heads,
    1 KV head, head_dim 128, 8 layers, ``max_num_seqs`` 4, ``turboquant_3bit_nc``) with a short
    ``max_model_len`` (512) and ``max_num_batched_tokens`` (256) so every demonstration runs in
    seconds on a CPU. ``overrides`` replace fields."""
    kw = dict(max_model_len=512, max_num_batched_tokens=256)
    kw.update(overrides)
    return EngineConfig.from_preset("nemotron-3-super-120b-a12b", **kw)


def make_engine(config: EngineConfig, device: str | torch.device = "cpu", *, fix: bool = True,
                capture: bool = True, order: str | Sequence[int] = "largest_first", reserve: str | None = None,
                backend_factory: Callable | None = None, lock: bool = True, kv_cache_tokens: int | None = None,
                **runner_kwargs):
    """An engine with a :class:`CUDAGraphDecodeRunner` whose capture this function drives.

    The engine is built with ``enforce_eager=True`` (so its own start-up captures
    nothing; it locks), then the workspace is unlocked, the runner installed
    (``runner_kwargs``: mode, guard, keep_captured_buffers, ...), optionally the
    backend swapped (``backend_factory(config, workspace, cache_format)``),
    optionally reserved (``reserve``: ``None``, ``"max_num_seqs"`` = PR #44053's
    decode reservation, ``"all_buckets"`` = :func:`reserve_for_buckets`), the
    buckets captured in ``order`` (``"largest_first"``, ``"smallest_first"`` or
    an explicit list) and the workspace locked again if ``lock``.

    Returns ``(engine, decode_runner)``.
    """
    from .engine import LLMEngine
    from .reservation import reserve_workspace

    eng = LLMEngine(config.replace(enforce_eager=True), fix=fix, device=device, kv_cache_tokens=kv_cache_tokens)
    eng.workspace.unlock()
    if backend_factory is not None:
        nb = backend_factory(eng.config, eng.workspace, eng.backend.cache_format)
        eng.backend = eng.runner.backend = nb
    dr = install_decode_runner(eng, **runner_kwargs)
    sizes = eng.config.capture_sizes()
    if reserve == "max_num_seqs":
        reserve_workspace(eng.config, eng.workspace)
    elif reserve == "all_buckets":
        reserve_for_buckets(eng.workspace, decode_shapes_for(eng.runner.backend), sizes)
    elif reserve is not None:
        raise ValueError(f"reserve must be None, 'max_num_seqs' or 'all_buckets', got {reserve!r}")
    if capture:
        capture_buckets(dr, sizes, order)
    if lock:
        eng.workspace.lock()
    return eng, dr


def capture_buckets(dr: CUDAGraphDecodeRunner, sizes: Sequence[int], order: str | Sequence[int] = "largest_first") -> list[int]:
    """Capture ``sizes`` in ``order`` (``"largest_first"`` as vLLM, ``"smallest_first"``, or a list). Returns the order used."""
    if order == "largest_first":
        seq = sorted(sizes, reverse=True)
    elif order == "smallest_first":
        seq = sorted(sizes)
    elif isinstance(order, str):
        raise ValueError(f"order must be 'largest_first', 'smallest_first' or a list of sizes, got {order!r}")
    else:
        seq = list(order)
    for b in seq:
        dr.capture(b)
    return seq


def prepare_decode_batch(runner, batch: int, context_len: int, *, seed: int = 0) -> DecodeBatch:
    """Fill the KV cache with ``context_len - 1`` random tokens for each of ``batch`` requests; return their decode step.

    Request ``i`` owns blocks ``1 + i*n .. (i+1)*n`` (``n = ceil(context_len / block_size)``);
    its new token goes to position ``context_len - 1``. Every layer's cache gets
    the same random K/V (seeded), through the backend's store.

    Raises ``ValueError`` if the cache has too few blocks or ``context_len`` exceeds ``max_model_len``.
    """
    b = _pos_int("batch", batch)
    ctx = _pos_int("context_len", context_len, 2)
    cfg, dev = runner.config, runner.device
    if ctx > cfg.max_model_len:
        raise ValueError(f"context_len {ctx} exceeds max_model_len {cfg.max_model_len}")
    bs = cfg.block_size
    nper = -(-ctx // bs)
    num_blocks = runner.kv_caches[0].shape[0]
    if 1 + b * nper > num_blocks:
        raise ValueError(f"{b} requests of {ctx} tokens need {1 + b * nper} KV-cache blocks, the cache has {num_blocks}")
    blocks = torch.arange(1, 1 + b * nper, dtype=torch.long).view(b, nper)
    bt = torch.zeros((b, runner.max_blocks_per_seq), dtype=torch.int32)
    bt[:, :nper] = blocks.to(torch.int32)
    pos = torch.arange(ctx - 1)
    hist = (blocks[:, pos // bs] * bs + pos % bs).reshape(-1)
    new = blocks[:, (ctx - 1) // bs] * bs + (ctx - 1) % bs
    hk, d = cfg.num_kv_heads_per_rank, cfg.head_dim
    g = torch.Generator(device=dev).manual_seed(seed)
    k = torch.randn((hist.numel(), hk, d), generator=g, device=dev)
    v = torch.randn((hist.numel(), hk, d), generator=g, device=dev)
    dt = runner.model.compute_dtype
    k, v, hist_d = k.to(dt), v.to(dt), hist.to(dev)
    for cache in runner.kv_caches:
        runner.backend.do_kv_cache_update(cache, k, v, hist_d)
    ids = torch.randint(0, runner.model.vocab_size, (b,), generator=g, device=dev)
    return DecodeBatch(ids, new.to(dev), bt.to(dev), torch.full((b,), ctx, dtype=torch.int32, device=dev))


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    fin = torch.isfinite(a) & torch.isfinite(b)
    d = (a - b).abs()
    return {
        "bitwise_equal": bool(torch.equal(a, b)),
        "max_abs_diff": float(d[fin].max()) if bool(fin.any()) else float("nan"),
        "nonfinite": int((~torch.isfinite(a)).sum()),
        "argmax_mismatch": int((a.argmax(-1) != b.argmax(-1)).sum()),
        "rows": int(a.shape[0]),
    }


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# --------------------------------------------------------------------------- #
# Demonstration: warm-up before capture                                       #
# --------------------------------------------------------------------------- #


def warmup_demo(config: EngineConfig, device: str | torch.device = "cpu") -> dict:
    """Capture the largest bucket on an empty workspace, with and without eager warm-up.

    Without reservation (``fix=False``) the workspace is empty at capture time.
    With warm-up the eager run grows it and the capture allocates nothing; without
    warm-up the growth happens *inside* the capture (on CUDA: from the graph's
    private pool). Returns, per variant, resize events during warm-up and during
    capture, the workspace size and whether the capture raised (and what).
    """
    out = {}
    b = max(config.capture_sizes())
    for name, nw in (("with_warmup", 2), ("without_warmup", 0)):
        eng, dr = make_engine(config, device, fix=False, capture=False, lock=False)
        row = {"bucket": b, "num_warmups": nw, "workspace_bytes_before": eng.workspace.size_bytes(0)}
        try:
            dr.capture(b, num_warmups=nw)
            cap = dr.graphs[b]
            row.update(ok=True, resizes_in_warmup=cap.resizes_in_warmup, resizes_in_capture=cap.resizes_in_capture,
                       error=None)
        except Exception as e:  # a failed capture is a result here, not a crash
            row.update(ok=False, resizes_in_warmup=None, resizes_in_capture=None, error=f"{type(e).__name__}: {e}"[:400])
        row["workspace_bytes_after"] = eng.workspace.size_bytes(0)
        out[name] = row
        del eng, dr
    return out


# --------------------------------------------------------------------------- #
# Demonstration: pointer stability and replay == eager                        #
# --------------------------------------------------------------------------- #


def pointer_stability_demo(config: EngineConfig, device: str | torch.device = "cpu", *, batch: int | None = None,
                           steps: int = 3, context_len: int = 64) -> dict:
    """Capture every bucket (reserved, warmed up, largest first, locked), then replay and compare.

    Each step replays the decode of ``batch`` rows (default ``max_num_seqs - 1``,
    so one lane is padding), compares the logits with the eager step on the same
    inputs, and reads the workspace views' ``data_ptr()`` again; between steps an
    eager continuation-prefill request uses the same workspace bytes. Returns the
    pointers at capture and at each step, and the comparison.
    """
    eng, dr = make_engine(config, device, fix=True, kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    n = batch if batch is not None else max(1, config.max_num_seqs - 1)
    bucket = select_bucket(n, dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    ws = eng.workspace
    cap = dr.graphs[bucket]
    shapes = decode_shapes_for(eng.runner.backend)(bucket)
    rows = []
    for step in range(steps):
        dr.static.fill(db, bucket)
        ref = dr.eager(bucket)[:n].clone()
        got = dr.run(*db.astuple()).clone()
        _sync(eng.device)
        views_now = ws.get_simultaneous(*shapes)
        rows.append({
            "step": step,
            "buffer_ptr": ws.data_ptrs()[0],
            "view_ptrs": [v.data_ptr() for v in views_now],
            "same_as_capture": [v.data_ptr() for v in views_now] == list(cap.view_ptrs[0]),
            **_diff(got, ref),
        })
        # An eager continuation prefill in between uses the same buffer (offset 0 again).
        cont = eng.backend.forward_prefill
        c = eng.config
        cached = min(c.max_model_len // 2, 200)
        q = torch.zeros((c.max_num_batched_tokens, c.num_heads_per_rank, c.head_dim), dtype=eng.runner.model.compute_dtype, device=eng.device)
        kv = torch.zeros((q.shape[0], c.num_kv_heads_per_rank, c.head_dim), dtype=q.dtype, device=eng.device)
        cont(q, kv, kv, eng.runner.kv_caches[0], db.block_tables[0], cached_len=cached)
    return {
        "device": str(eng.device),
        "mode": dr.mode,
        "batch": n,
        "bucket": bucket,
        "buckets": dr.captured_sizes,
        "workspace_bytes": ws.size_bytes(0),
        "capture_buffer_ptr": cap.snapshot.ptrs[0],
        "capture_view_ptrs": list(cap.view_ptrs[0]),
        "num_workspace_requests_in_graph": len(cap.view_ptrs),
        "distinct_view_ptr_sets_in_graph": len(set(cap.view_ptrs)),
        "resizes_in_capture": {b: dr.graphs[b].resizes_in_capture for b in dr.captured_sizes},
        "steps": rows,
        "stats": dict(dr.stats),
    }


# --------------------------------------------------------------------------- #
# Demonstration: the stale-pointer hazard                                     #
# --------------------------------------------------------------------------- #


def _fill_bytes(buf: torch.Tensor, value: int) -> None:
    buf.fill_(value)


def _owner_divergence(dr: CUDAGraphDecodeRunner, bucket: int, old_buf: torch.Tensor, ref: torch.Tensor, n: int,
                      trials: int = 5, fills: int = 2000) -> list[dict]:
    """CUDA only: while the stale graph replays, a second stream (the freed block's "new owner") keeps writing NaN
    into the old buffer. Returns the logits comparison of each trial."""
    dev = old_buf.device
    victim = old_buf.view(torch.float32)
    owner = torch.cuda.Stream(device=dev)
    # The owner's work as one graph of many fills, so it runs for milliseconds from one launch.
    og = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(dev)
    with no_gc_during_capture(), torch.cuda.graph(og, stream=owner):
        for _ in range(fills):
            victim.fill_(float("nan"))
    torch.cuda.synchronize(dev)
    res = []
    cap = dr.graphs[bucket]
    main = torch.cuda.current_stream(dev)
    for _ in range(trials):
        torch.cuda.synchronize(dev)
        owner.wait_stream(main)
        with torch.cuda.stream(owner):
            og.replay()
        cap.graph.replay()  # no guard: this is the hazard
        torch.cuda.synchronize(dev)
        res.append(_diff(cap.output[:n], ref))
    del og
    return res


def stale_replay_demo(config: EngineConfig, device: str | torch.device = "cpu", *, context_len: int = 64,
                      concurrent_owner: bool | None = None) -> dict:
    """Unlock, grow the workspace, and replay a captured graph: without guard, with the lock, with the guard.

    1. ``lock``: the growth request after the lock is refused
       (:class:`~tqlab.workspace.WorkspaceLockedError`); pointers unchanged;
       replay still equals eager.
    2. ``no_guard``: unlock, grow (the manager frees the captured buffer; the
       runner keeps a reference, so the memory stays ours), replay without the
       guard. Shown: the graph's views still point into the old buffer; a
       sentinel written into the old buffer is overwritten by the replay while
       the new buffer is untouched; a "new owner" pattern in the old buffer is
       destroyed; and (CUDA, ``concurrent_owner``) with the new owner writing
       on another stream during the replay, the logits diverge from eager.
    3. ``guard``: the same replay with the guard on raises
       :class:`StalePointerError`, naming the moved slot, before anything runs.
    """
    dev = torch.device(device)
    if concurrent_owner is None:
        concurrent_owner = dev.type == "cuda"
    eng, dr = make_engine(config, dev, fix=True, guard=False, keep_captured_buffers=True,
                          kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    ws = eng.workspace
    n = config.max_num_seqs
    bucket = select_bucket(n, dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    dr.static.fill(db, bucket)
    ref = dr.eager(bucket)[:n].clone()
    cap = dr.graphs[bucket]
    grow = ws.size_bytes(0) * 2 + (1 << 20)
    result: dict[str, Any] = {"device": str(dev), "mode": dr.mode, "bucket": bucket, "batch": n,
                              "captured_buffer_ptr": cap.snapshot.ptrs[0], "captured_bytes": cap.snapshot.sizes[0],
                              "grow_request_bytes": grow}
    # 1. with the lock
    try:
        ws.get_simultaneous(((grow,), torch.uint8))
        result["lock"] = {"refused": False}
    except WorkspaceLockedError as e:
        got = dr.run(*db.astuple()).clone()
        result["lock"] = {"refused": True, "error": str(e), "buffer_ptr_after": ws.data_ptrs()[0],
                          "pointer_unchanged": ws.data_ptrs()[0] == cap.snapshot.ptrs[0], **_diff(got, ref)}
    # 2. unlock, grow, replay without the guard
    ws.unlock()
    ws.get_simultaneous(((grow,), torch.uint8))
    ws.lock()
    old = cap.kept_buffers[0]
    new = ws.buffer(0)
    nd: dict[str, Any] = {
        "old_buffer_ptr": old.data_ptr(), "new_buffer_ptr": new.data_ptr(), "new_bytes": new.numel(),
        "graph_view_ptrs": list(cap.view_ptrs[0]),
        "graph_views_inside_old_buffer": all(old.data_ptr() <= p < old.data_ptr() + old.numel() for p in cap.view_ptrs[0]),
        "graph_views_inside_new_buffer": all(new.data_ptr() <= p < new.data_ptr() + new.numel() for p in cap.view_ptrs[0]),
        "stale_buckets": dr.stale_buckets(),
    }
    _fill_bytes(old, 0xAB)
    _fill_bytes(new, 0xCD)
    _sync(dev)
    got = dr.run(*db.astuple()).clone()
    _sync(dev)
    nd["old_buffer_bytes_overwritten"] = int((old != 0xAB).sum())
    nd["new_buffer_bytes_touched"] = int((new != 0xCD).sum())
    nd["exclusive_old_buffer"] = _diff(got, ref)
    # The old block handed to a new owner, who stored its data there before the replay.
    pattern = torch.arange(old.numel(), device=dev, dtype=torch.int64).remainder(251).to(torch.uint8)
    old.copy_(pattern)
    dr.run(*db.astuple())
    _sync(dev)
    nd["new_owner_bytes_corrupted"] = int((old != pattern).sum())
    nd["new_owner_bytes"] = old.numel()
    if concurrent_owner and dev.type == "cuda":
        nd["concurrent_owner_trials"] = _owner_divergence(dr, bucket, old, ref, n)
        t = nd["concurrent_owner_trials"]
        nd["concurrent_owner_diverged"] = sum(1 for r in t if not r["bitwise_equal"])
    result["no_guard"] = nd
    # 3. the guard
    dr.guard = True
    try:
        dr.run(*db.astuple())
        result["guard"] = {"raised": False}
    except StalePointerError as e:
        result["guard"] = {"raised": True, "error": str(e), "slot": e.slot, "bucket": e.bucket}
    result["stats"] = dict(dr.stats)
    return result


# --------------------------------------------------------------------------- #
# Cases from public reports                                                   #
# --------------------------------------------------------------------------- #


def _replay_all(eng, dr: CUDAGraphDecodeRunner, context_len: int) -> dict[int, dict]:
    """Run a full batch through every bucket with the guard on; per bucket: ok, or the guard's error."""
    n = max(dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    out = {}
    for b in dr.captured_sizes:
        try:
            dr.run(*db.rows(b).astuple())
            out[b] = {"ok": True}
        except StalePointerError as e:
            out[b] = {"ok": False, "slot": e.slot, "error": str(e)}
    return out


def _capture_table(dr: CUDAGraphDecodeRunner) -> list[dict]:
    return [{"bucket": b, "buffer_ptr": dr.graphs[b].snapshot.ptrs[0], "bytes": dr.graphs[b].snapshot.sizes[0],
             "resizes_in_warmup": dr.graphs[b].resizes_in_warmup, "resizes_in_capture": dr.graphs[b].resizes_in_capture}
            for b in dr.captured_sizes]


def capture_order_demo(config: EngineConfig, device: str | torch.device = "cpu", *, order: str = "smallest_first",
                       reserve: str | None = None, context_len: int = 32) -> dict:
    """Case (a): capture buckets in ``order`` with or without a reservation, then replay every bucket guarded.

    Without reservation (``fix=False``) and small-to-large, each warm-up grows
    the workspace and frees the buffer the previous graphs baked in: those
    graphs are stale (vLLM: an illegal memory access on the first decode). The
    guard refuses them; reserve-then-capture (``reserve="max_num_seqs"``) or
    largest first avoids the growth.
    """
    eng, dr = make_engine(config, device, fix=False, order=order, reserve=reserve, guard=True,
                          keep_captured_buffers=True,
                          kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    return {"order": order, "reserve": reserve, "captures": _capture_table(dr), "final_ptr": eng.workspace.data_ptrs()[0],
            "final_bytes": eng.workspace.size_bytes(0), "stale_buckets": dr.stale_buckets(),
            "replay": _replay_all(eng, dr, context_len)}


def nonmonotonic_demo(config: EngineConfig, device: str | torch.device = "cpu", *, reserve: str = "max_num_seqs",
                      small_batch_max: int = 2, context_len: int = 32) -> dict:
    """Case (b): a consumer that needs more workspace at a smaller batch; capture largest first.

    With PR #44053's reservation (decode at ``max_num_seqs``) the capture of the
    small bucket still grows the workspace, after the larger buckets were
    captured: they are stale, and the lock (taken later) cannot notice. Only
    ``reserve="all_buckets"`` (the maximum over every bucket) is safe.
    """
    factory = lambda c, w, f: BatchDependentSplitsBackend(c, w, f, small_batch_max=small_batch_max)  # noqa: E731
    eng, dr = make_engine(config, device, fix=True, reserve=reserve, backend_factory=factory, guard=True,
                          keep_captured_buffers=True,
                          kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    need = bucket_workspace_bytes(decode_shapes_for(eng.runner.backend), dr.captured_sizes)
    return {"reserve": reserve, "need_bytes": need, "argmax_need": max(need, key=lambda b: (need[b], b)),
            "captures": _capture_table(dr), "final_bytes": eng.workspace.size_bytes(0),
            "stale_buckets": dr.stale_buckets(), "replay": _replay_all(eng, dr, context_len)}


def late_warmup_demo(config: EngineConfig, device: str | torch.device = "cpu", *, context_len: int = 32) -> dict:
    """Case (c): a warm-up that runs *after* capture and grows the workspace.

    ``before_lock``: it runs between capture and lock (e.g. an extra dummy run
    added to start-up), so the lock cannot catch it: the guard must, at the
    first replay. ``after_lock``: the lock refuses the growth. The warm-up is a
    decode dummy run of ``2 * max_num_seqs`` rows (more than was reserved).
    """
    res = {}
    rows = 2 * config.max_num_seqs
    for when in ("before_lock", "after_lock"):
        eng, dr = make_engine(config, device, fix=True, guard=True, keep_captured_buffers=True, lock=(when == "after_lock"),
                              kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
        before = eng.workspace.data_ptrs()[0]
        row: dict[str, Any] = {"warmup_rows": rows, "bytes_before": eng.workspace.size_bytes(0)}
        try:
            eng.runner.dummy_decode(rows)
            row["warmup_refused"] = None
        except WorkspaceLockedError as e:
            row["warmup_refused"] = str(e)
        if not eng.workspace.is_locked():
            eng.workspace.lock()
        row.update(bytes_after=eng.workspace.size_bytes(0), moved=eng.workspace.data_ptrs()[0] != before,
                   stale_buckets=dr.stale_buckets(), replay=_replay_all(eng, dr, context_len))
        res[when] = row
    return res


# --------------------------------------------------------------------------- #
# Latency                                                                     #
# --------------------------------------------------------------------------- #


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _time_cuda(fn: Callable[[], Any], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000.0)  # microseconds
    return out


def _kernel_time_us(fn: Callable[[], Any], reps: int) -> tuple[float | None, int | None, list[dict]]:
    """Summed device time (kernels, memcpy, memset) per call of ``fn`` under torch.profiler, events per call,
    and the five most expensive kernel names with microseconds per call."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        try:
            evs = [(e.name(), e.duration_ns()) for e in prof.profiler.kineto_results.events()
                   if e.device_type() == DeviceType.CUDA]
        except Exception:
            evs = [(e.name, int(e.time_range.elapsed_us() * 1000)) for e in prof.events()
                   if getattr(e, "device_type", None) == DeviceType.CUDA]
        if not evs:
            return None, 0, []
        by: dict[str, int] = {}
        for name, ns in evs:
            by[name] = by.get(name, 0) + ns
        top = sorted(by.items(), key=lambda kv: -kv[1])[:5]
        return (sum(ns for _, ns in evs) / 1000.0 / reps, len(evs) // reps,
                [{"kernel": k[:120], "us_per_call": v / 1000.0 / reps} for k, v in top])
    except Exception as e:  # profiler unavailable: report, do not fail the run
        logger.warning("torch.profiler failed: %s", e)
        return None, None, []


def measure_decode_latency(config: EngineConfig, device: str | torch.device = "cuda", *,
                           batch_sizes: Sequence[int] | None = None, context_len: int = 512, iters: int = 30,
                           warmup: int = 5, profile_reps: int = 5, label: str | None = None) -> dict:
    """Eager vs CUDA-graph replay per decode step, CUDA events, medians (microseconds).

    Builds ``LLMEngine(config, device="cuda")`` (the engine installs
    :class:`CUDAGraphDecodeRunner`, captures every bucket largest first, locks),
    fills ``max(batch_sizes)`` requests of ``context_len`` tokens, then per batch:

    * ``eager_us``: ``runner.decode_forward`` on the batch (what runs without graphs);
    * ``replay_us``: ``graph.replay()`` of the bucket on already-filled static inputs;
    * ``run_us``: the runner's full step: guard + copy into static inputs + padding + replay;
    * ``kernel_sum_replay_us`` / ``kernel_sum_eager_us``: summed device time under torch.profiler
      (measured after every timing; ``profile_reps=0`` skips it), with the top kernels of a replay;
    * ``max_abs_diff``: replay vs eager logits.

    Raises ``ValueError`` without CUDA.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError("measure_decode_latency needs a CUDA device")
    from .engine import LLMEngine

    sizes = list(batch_sizes) if batch_sizes is not None else list(config.capture_sizes())
    nmax = max(sizes)
    t0 = time.perf_counter()
    eng = LLMEngine(config, device=dev, kv_cache_tokens=nmax * context_len + 8 * config.block_size)
    build_s = time.perf_counter() - t0
    dr = eng.runner.decode_runner
    if not isinstance(dr, CUDAGraphDecodeRunner):
        raise RuntimeError(f"the engine did not install the CUDA graph runner (got {type(dr).__name__})")
    capture_s = next((p.seconds for p in eng.phases if p.name == "capture"), None)
    db = prepare_decode_batch(eng.runner, nmax, context_len)
    rows, fns = [], {}
    # All timings first: a torch.profiler session leaves overhead on later kernel launches in the
    # process (seen on the H200: eager steps measured after profiling were slower), so profiling
    # comes last.
    for n in sizes:
        sub = db.rows(n)
        bucket = select_bucket(n, dr.captured_sizes)
        eager = lambda sub=sub: eng.runner.decode_forward(*sub.astuple())  # noqa: E731
        dr.static.fill(sub, bucket)
        ref = eager()[:n].clone()
        rep = lambda bucket=bucket: dr.replay(bucket)  # noqa: E731
        got = rep()[:n].clone()
        run = lambda sub=sub: dr.run(*sub.astuple())  # noqa: E731
        te = _time_cuda(eager, iters, warmup)
        tr = _time_cuda(rep, iters, warmup)
        tu = _time_cuda(run, iters, warmup)
        d = _diff(got, ref)
        rows.append({"batch": n, "bucket": bucket, "eager_us": _median(te), "replay_us": _median(tr),
                     "run_us": _median(tu), "speedup": _median(te) / _median(tr),
                     "max_abs_diff": d["max_abs_diff"], "bitwise_equal": d["bitwise_equal"],
                     "argmax_mismatch": d["argmax_mismatch"]})
        fns[n] = (sub, bucket, eager, rep)
    for row in rows:
        sub, bucket, eager, rep = fns[row["batch"]]
        dr.static.fill(sub, bucket)
        kr, nkr, topr = _kernel_time_us(rep, profile_reps) if profile_reps else (None, None, [])
        ke, nke, _ = _kernel_time_us(eager, profile_reps) if profile_reps else (None, None, [])
        row.update(kernel_sum_replay_us=kr, kernels_per_replay=nkr, kernel_sum_eager_us=ke, kernels_per_eager=nke,
                   replay_over_kernel_sum=(row["replay_us"] / kr) if kr else None, top_kernels_replay=topr)
    res = {"label": label or config.preset, "preset": config.preset, "num_hidden_layers": config.num_hidden_layers,
           "num_heads_per_rank": config.num_heads_per_rank, "num_kv_heads_per_rank": config.num_kv_heads_per_rank,
           "head_dim": config.head_dim, "kv_cache_dtype": config.kv_cache_dtype, "max_num_seqs": config.max_num_seqs,
           "max_model_len": config.max_model_len, "context_len": context_len, "iters": iters, "warmup": warmup,
           "buckets": dr.captured_sizes, "engine_build_s": build_s, "capture_s": capture_s,
           "workspace_bytes": eng.workspace.size_bytes(0), "rows": rows}
    del eng, dr, db
    torch.cuda.empty_cache()
    return res


# --------------------------------------------------------------------------- #
# Notebook support: live-cell log, recorded data, provenance                  #
# --------------------------------------------------------------------------- #


class LiveCells:
    """Which GPU-live cells of a notebook ran, so that a GPU run cannot "pass" while skipping one.

    ``expected``: names of the cells that must run live on CUDA. Each such
    cell calls :meth:`ran` when it computed live, or :meth:`recorded` when it
    showed recorded data instead. :meth:`finish` raises ``AssertionError`` on
    CUDA if any expected cell did not run live, and writes the log as JSON if
    given a path.
    """

    def __init__(self, device: str | torch.device, expected: Sequence[str]):
        self.device = str(device)
        self.expected = list(expected)
        if len(set(self.expected)) != len(self.expected):
            raise ValueError(f"duplicate live-cell names in {self.expected}")
        self.live: list[str] = []
        self.from_recorded: list[str] = []

    def _check(self, name: str) -> None:
        if name not in self.expected:
            raise ValueError(f"unknown live cell {name!r}; expected one of {self.expected}")

    def ran(self, name: str) -> None:
        self._check(name)
        if name not in self.live:
            self.live.append(name)

    def recorded(self, name: str) -> None:
        self._check(name)
        if name not in self.from_recorded:
            self.from_recorded.append(name)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def missing(self) -> list[str]:
        return [n for n in self.expected if n not in self.live]

    def summary(self) -> dict:
        return {"device": self.device, "expected": self.expected, "ran": self.live, "recorded": self.from_recorded,
                "missing": self.missing()}

    def finish(self, path: str | os.PathLike | None = None) -> dict:
        s = self.summary()
        if path:
            Path(path).write_text(json.dumps(s, indent=2))
        if self.on_cuda and s["missing"]:
            raise AssertionError(f"DEVICE={self.device} but these GPU-live cells did not run live: {s['missing']}")
        return s


def _git_commit() -> str:
    env = os.environ.get("TQLAB_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:
        return "unknown"


def provenance(command: str) -> dict:
    """``{device, date, commit, command, torch, cuda, python, host}`` for a recorded result."""
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    return {
        "device": dev,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git_commit(),
        "command": command,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def load_recorded(name: str) -> dict | None:
    """``data/cuda_graphs_<name>.json`` as a dict (with its ``provenance``), or None if absent."""
    path = DATA_DIR / f"cuda_graphs_{name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def recorded_banner(data: dict | None) -> str:
    """A one-line banner naming device, date, commit and torch of recorded data (or saying there is none)."""
    if not data:
        return "RECORDED GPU DATA: none recorded yet under data/ (run the GPU command of benchmarks/bench_cuda_graphs.py)"
    p = data.get("provenance", {})
    return (f"RECORDED GPU DATA (not computed on this machine): device {p.get('device', '?')}, date {p.get('date', '?')}, "
            f"commit {str(p.get('commit', '?'))[:12]}, torch {p.get('torch', '?')}")


def jsonable(obj):
    """``obj`` with dict keys turned into strings and floats NaN/inf into strings, for ``json.dumps``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def format_table(rows: Sequence[dict], columns: Sequence[str], *, hex_cols: Sequence[str] = ()) -> str:
    """Plain-text table of ``rows`` (dicts) for notebook output; ``hex_cols`` are printed as ``0x...``."""

    def fmt(col, v):
        if v is None:
            return "-"
        if col in hex_cols and isinstance(v, int):
            return f"0x{v:x}"
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(col, x) for x in v) + "]"
        return str(v)

    cells = [[fmt(c, r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(list(columns)), line(["-" * w for w in widths])] + [line(r) for r in cells])


def plot_latency(results: dict, *, title: str = "", ax=None):
    """Eager vs replay vs summed kernel time (microseconds, log scale) against batch, one line set per model.

    ``results``: ``{label: measure_decode_latency(...) result}``. Returns the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5.5 * max(1, len(results)), 3.8), squeeze=False)
        axes = list(axes[0])
    else:
        fig, axes = ax.figure, [ax] * len(results)
    for a, (label, res) in zip(axes, results.items()):
        rows = res["rows"]
        xs = [r["batch"] for r in rows]
        a.plot(xs, [r["eager_us"] for r in rows], "o-", label="eager step")
        a.plot(xs, [r["replay_us"] for r in rows], "s-", label="graph replay")
        a.plot(xs, [r["run_us"] for r in rows], "^--", label="runner step (copy+pad+guard+replay)")
        ks = [r["kernel_sum_replay_us"] for r in rows]
        if any(k for k in ks):
            a.plot(xs, ks, "k:", label="summed kernel time (profiler)")
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("decode batch (requests)")
        a.set_ylabel("microseconds per decode step")
        a.set_title(f"{label}: {res['num_hidden_layers']} layers, {res['kv_cache_dtype']}")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
