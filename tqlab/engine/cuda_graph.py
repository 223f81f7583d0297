"""CUDA graphs for the decode step: the runner that captures one graph per batch-size bucket and replays it.

As nano-vllm's ``ModelRunner.capture_cudagraph`` and vLLM's
``vllm/v1/worker/gpu_model_runner.py`` (``capture_model``): static input buffers
sized for the largest bucket, one shared graph pool, eager warm-up before each
capture, buckets captured largest first (by ``ModelRunner.capture_model``).
``torch.cuda.CUDAGraph`` on CUDA; :class:`SimulatedGraph` elsewhere replays the
step with the workspace views recorded at capture (the frozen pointers).
Before each replay the guard of :mod:`tqlab.engine.replay_guard` checks them.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from tqlab.core.vllm_rules import decode_capture_rows
from tqlab.attention import Fp16KVCache, TurboQuantKVCache, split_kv_decode_reference
from tqlab.core.workspace import WorkspaceManager, current_ubatch_id, positive_int
from tqlab.engine.model_runner import CaptureRecord
from tqlab.engine.replay_guard import StalePointerError, WorkspaceSnapshot, check_workspace, snapshot_workspace, stale_slots
from tqlab.engine.workspace_client import CaptureRecorder, FrozenWorkspace, set_workspace

__all__ = [
    "NULL_BLOCK",
    "PAD_SLOT",
    "CUDAGraphDecodeRunner",
    "CapturedBucket",
    "DecodeBatch",
    "GraphSafeKVCache",
    "SimulatedGraph",
    "StaticDecodeInputs",
    "install_decode_runner",
    "make_graph_safe",
    "no_gc_during_capture",
    "select_bucket",
]

logger = logging.getLogger(__name__)

NULL_BLOCK = 0
"""Block id padded lanes point at (the scheduler never hands out block 0)."""

PAD_SLOT = -1
"""Slot id of a padded lane: the cache store skips it (vLLM's ``PAD_SLOT_ID``)."""


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
    b = positive_int("batch_size", batch_size)
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
        self.max_batch = positive_int("max_batch", max_batch)
        self.max_blocks_per_seq = positive_int("max_blocks_per_seq", max_blocks_per_seq)
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
        b = positive_int("bucket", bucket)
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


class SimulatedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph`` where there is no CUDA.

    :meth:`replay` runs the step again, reading the static inputs as they are
    *now*, but every workspace request is answered with the view recorded at
    capture (:class:`FrozenWorkspace`): the workspace pointers are frozen, as
    in a real graph. The output goes into a static tensor, as a graph's does.
    Unlike a real graph, the recorded views keep their buffer alive, so a stale
    replay writes into memory this object owns (it cannot crash).
    """

    def __init__(self, backend, fn: Callable[[], torch.Tensor], calls, output: torch.Tensor):
        self._backend = backend
        self._fn = fn
        self.calls = calls
        self.output = output

    def replay(self) -> None:
        with set_workspace(self._backend, FrozenWorkspace(self.calls)) as frozen:
            out = self._fn()
        if frozen.served != len(self.calls):
            raise RuntimeError(
                f"simulated replay asked the workspace {frozen.served} times; the capture asked {len(self.calls)}")
        self.output.copy_(out)


# --------------------------------------------------------------------------- #
# Capture hygiene: the garbage collector and host syncs                       #
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


class GraphSafeKVCache:
    """A KV-cache format (the :class:`~tqlab.attention.KVCacheFormat` methods) whose decode reads nothing on the host.

    Store, dequant and allocation are the wrapped format's (both of tqlab's
    formats store without a host sync: padded lanes are skipped by the kernel
    or rewrite the null block with its own value). The unquantized decode
    normally reads ``max(seq_lens)`` on the host; here, while a stream captures
    or with ``static_width`` set, it covers the whole block-table width instead.
    """

    graph_safe = True

    def __init__(self, inner: Fp16KVCache | TurboQuantKVCache):
        self.inner = inner
        self.name = inner.name
        self.num_kv_heads = inner.num_kv_heads
        self.head_dim = inner.head_dim
        self.block_size = inner.block_size
        self.static_width = False
        self._full_width_decode = isinstance(inner, Fp16KVCache)

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(num_blocks, device)

    def bytes_per_token(self) -> int:
        return self.inner.bytes_per_token()

    def store(self, cache, key, value, slot_mapping) -> None:
        self.inner.store(cache, key, value, slot_mapping)

    def dequant(self, cache, block_table_row, cached_len, k_out, v_out) -> None:
        self.inner.dequant(cache, block_table_row, cached_len, k_out, v_out)

    def decode(self, query, cache, block_tables, seq_lens, scale, mid_out, output, lse):
        full = self._full_width_decode and (self.static_width or _is_capturing(query))
        if cache.device.type == "meta" or not full:
            return self.inner.decode(query, cache, block_tables, seq_lens, scale, mid_out, output, lse)
        # (num_blocks, 2*Hk, bs, D) gathered over every block-table column: (B, 2*Hk, W*bs, D)
        blocks = cache.flatten(1, 2)[block_tables.long()]
        b, w, hk2, bs, d = blocks.shape
        kv = blocks.permute(0, 2, 1, 3, 4).reshape(b, hk2, w * bs, d).float()
        hk = self.num_kv_heads
        return split_kv_decode_reference(query, kv[:, :hk], kv[:, hk:], seq_lens, scale, mid_out, output, lse)


def make_graph_safe(fmt):
    """A capturable version of a cache format (TurboQuant or fp16); other formats are returned unchanged."""
    if getattr(fmt, "graph_safe", False) or not isinstance(fmt, (Fp16KVCache, TurboQuantKVCache)):
        return fmt
    return GraphSafeKVCache(fmt)


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
        runner: the :class:`~tqlab.engine.model_runner.ModelRunner`; its
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
        positive_int("num_warmups", num_warmups, 0)
        self.runner = runner
        self.mode = mode
        self.kind = "cuda_graph" if mode == "cuda" else "simulated_graph"
        self.guard = bool(guard)
        self.num_warmups = num_warmups
        self.keep_captured_buffers = bool(keep_captured_buffers) or mode == "simulated"
        cfg = runner.config
        largest = max((*decode_capture_rows(cfg), cfg.max_num_seqs))
        self.max_batch = largest if max_batch is None else positive_int("max_batch", max_batch)
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
        dummy run: null block, ``seq_len`` 1, nothing stored). Re-capturing a
        bucket replaces its graph. Returns the engine's
        :class:`~tqlab.engine.model_runner.CaptureRecord` (pointers and sizes after capture).

        Raises:
            ValueError: ``batch_size`` outside ``1..max_batch``.
            WorkspaceLockedError: the workspace is locked and the step needs more.
        """
        b = positive_int("batch_size", batch_size)
        if b > self.max_batch:
            raise ValueError(f"batch_size {b} exceeds the static buffers ({self.max_batch} rows)")
        nw = self.num_warmups if num_warmups is None else positive_int("num_warmups", num_warmups, 0)
        ws = self.workspace
        self.static.pad(0, b)
        views = self.static.views(b)

        def step() -> torch.Tensor:
            return self.runner.decode_forward(*views)

        n0 = len(ws.events)
        self._warm_up(step, nw)
        n1 = len(ws.events)
        graph, out, rec = self._record(step)
        n2 = len(ws.events)
        slots = sorted(rec.slots) or [current_ubatch_id()]
        kept = {s: ws.buffer(s) for s in slots if ws.buffer(s) is not None} if self.keep_captured_buffers else {}
        resize = lambda evs: sum(1 for e in evs if e.kind == "resize")  # noqa: E731
        self.graphs[b] = CapturedBucket(
            bucket=b, graph=graph, output=out, snapshot=snapshot_workspace(ws, slots), view_ptrs=list(rec.ptrs),
            requests=[sig for sig, _ in rec.calls],
            resizes_in_warmup=resize(ws.events[n0:n1]), resizes_in_capture=resize(ws.events[n1:n2]),
            kept_buffers=kept,
        )
        if self.mode == "cuda":
            rec.calls.clear()  # a real graph holds no reference to the views
        if b not in self._sizes:
            bisect.insort(self._sizes, b)
        record = CaptureRecord(b, ws.data_ptrs(), ws.sizes_bytes(), graph=graph)
        self.records[b] = record
        return record

    def _warm_up(self, step: Callable[[], torch.Tensor], num_warmups: int) -> None:
        """Eager runs before capture, on the capture stream on CUDA: they grow the workspace, so capture need not."""
        if self.mode != "cuda":
            for _ in range(num_warmups):
                step()
            return
        cur = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            for _ in range(num_warmups):
                step()
        cur.wait_stream(self.stream)
        torch.cuda.synchronize(self.stream.device)

    def _record(self, step: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor, CaptureRecorder]:
        """Capture ``step`` with a :class:`CaptureRecorder` in front of the backend's workspace client.

        Returns the graph (``torch.cuda.CUDAGraph`` in the shared pool, or a
        :class:`SimulatedGraph`), its static output and the recorder.
        """
        backend = self.runner.backend
        with set_workspace(backend, CaptureRecorder(backend.workspace)) as rec:
            if self.mode == "cuda":
                graph = torch.cuda.CUDAGraph()
                with no_gc_during_capture(), torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    out = step()
                return graph, out, rec
            out = step()
        graph = SimulatedGraph(backend, step, rec.calls, out.clone())
        return graph, graph.output, rec

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


