"""Where a workspace request lands: DBO ubatch / lane context, caller attribution, and the slot table.

Split out of :mod:`tqlab.core.workspace` (which re-exports every public name here), mirroring
``vllm/v1/worker/workspace.py``:

* :func:`ubatch_context` / :func:`use_workspace_lane` set the calling thread's (ubatch, lane); a
  manager with ``num_ubatches * num_lanes`` slots serves slot ``ubatch * num_lanes + lane``
  (vLLM's ``_get_workspace_id``).
* :func:`workspace_wrapper` and ``_caller_info`` name the first caller outside the manager's
  modules (``workspace.py`` and this file) in errors and events, as vLLM skips frames whose
  qualname starts with ``WorkspaceManager.``.
* :class:`WorkspaceSlots` is the base of :class:`~tqlab.core.workspace.WorkspaceManager`: slot
  indexing and sizes, growth of one slot's buffer (free-then-allocate) with its event record and
  ``TQLAB_DEBUG_WORKSPACE`` log (logger ``tqlab.core.workspace``), and the persistent resources
  of vLLM 0.33. It holds no state of its own: ``WorkspaceManager.__init__`` sets every attribute.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import time
from typing import Iterable, Iterator, Sequence

import torch

from tqlab.core.dtypes import DType, as_torch
from tqlab.core.workspace_layout import WorkspaceEvent, WorkspaceLockedError, format_mb

__all__ = [
    "WorkspaceSlots", "current_ubatch_id", "current_workspace_lane", "ubatch_context", "use_workspace_lane",
    "workspace_wrapper",
]

# The manager's records and debug log keep the name of the module users know.
logger = logging.getLogger("tqlab.core.workspace")

# --------------------------------------------------------------------------- #
# DBO ubatch slots                                                            #
# --------------------------------------------------------------------------- #

_UBATCH: contextvars.ContextVar[int] = contextvars.ContextVar("tqlab_ubatch_id", default=0)


_LANE: contextvars.ContextVar[int] = contextvars.ContextVar("tqlab_workspace_lane", default=0)


@contextlib.contextmanager
def use_workspace_lane(lane: int) -> Iterator[None]:
    """Run the body in workspace lane ``lane`` (this thread/task only): an independent owner of scratch and
    persistent resources inside each ubatch slot.

    Mirrors ``use_workspace_lane`` in ``vllm/v1/worker/workspace.py`` (vLLM 0.33; lane 1 is
    Model Runner V2's DSpark drafter). Raises ``ValueError("Workspace lane must be
    non-negative, got -1.")`` as vLLM does; the manager refuses a lane it was not built
    with when it is asked for memory (``RuntimeError``).
    """
    if lane < 0:
        raise ValueError(f"Workspace lane must be non-negative, got {lane}.")
    token = _LANE.set(lane)
    try:
        yield
    finally:
        _LANE.reset(token)


def current_workspace_lane() -> int:
    """The workspace lane the calling thread/task works in (0 unless :func:`use_workspace_lane`)."""
    return _LANE.get()


def current_ubatch_id() -> int:
    """The ubatch slot the calling thread/task works in (0 outside DBO).

    Mirrors ``dbo_current_ubatch_id()`` in ``vllm/v1/worker/ubatching.py``,
    which maps thread ids to slots; we use a ``contextvars`` variable, so every
    thread starts in slot 0 and :func:`ubatch_context` changes only its own.
    """
    return _UBATCH.get()


@contextlib.contextmanager
def ubatch_context(ubatch_id: int) -> Iterator[int]:
    """Run the body with ``ubatch_id`` as the current DBO slot (this thread only).

    Raises ``TypeError``/``ValueError`` for a non-int or negative id; the
    manager checks the upper bound when it is asked for memory.
    """
    if isinstance(ubatch_id, bool) or not isinstance(ubatch_id, int):
        raise TypeError(f"ubatch id must be an int, got {ubatch_id!r}")
    if ubatch_id < 0:
        raise ValueError(f"ubatch id must be >= 0, got {ubatch_id}")
    token = _UBATCH.set(ubatch_id)
    try:
        yield ubatch_id
    finally:
        _UBATCH.reset(token)


_HERE = os.path.dirname(os.path.abspath(__file__))
# The manager's own modules: their frames are never "the caller".
_MANAGER_FILES = frozenset(os.path.normcase(os.path.join(_HERE, n)) for n in ("workspace.py", "workspace_slots.py"))
_WRAPPER_CODES: dict = {}  # code object -> the calls ("request", "lock") it passes through


def workspace_wrapper(fn=None, *, wraps: tuple[str, ...] = ("request",)):
    """Mark ``fn`` as a layer between callers and the manager (a tracer, a fallback).

    For the calls it passes through — ``"request"`` (``get_simultaneous``)
    and/or ``"lock"`` (``lock``/``unlock``) — the manager skips its frames when
    it names a caller, as it skips its own, so errors and events name whoever
    really asked (vLLM skips frames whose qualname starts with
    ``WorkspaceManager.``). A request wrapper that itself locks or unlocks is
    still named for those. Returns ``fn``; usable as ``@workspace_wrapper``.
    """
    bad = set(wraps) - {"request", "lock"}
    if bad:
        raise ValueError(f"wraps must name 'request' and/or 'lock', got {sorted(bad)}")

    def mark(f):
        _WRAPPER_CODES[f.__code__] = frozenset(wraps)
        return f

    return mark if fn is None else mark(fn)


def _caller_info(op: str = "request") -> str:
    """``'file.py:line:function'`` of the first frame outside the manager's modules and wrappers of ``op``."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = os.path.normcase(os.path.abspath(frame.f_code.co_filename))
        if (fname not in _MANAGER_FILES and op not in _WRAPPER_CODES.get(frame.f_code, ())
                and not fname.endswith(os.path.normcase("contextlib.py"))):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


def _debug_enabled() -> bool:
    return os.environ.get("TQLAB_DEBUG_WORKSPACE", "0") not in ("", "0", "false", "False")


# --------------------------------------------------------------------------- #
# The slot table: the base of WorkspaceManager                                #
# --------------------------------------------------------------------------- #


class WorkspaceSlots:
    """Slots, sizes, growth and persistent resources of :class:`~tqlab.core.workspace.WorkspaceManager`.

    Not used on its own: it reads the attributes ``WorkspaceManager.__init__`` sets (``_device``,
    ``_num_ubatches``, ``_num_lanes``, ``_buffers``, ``_persistent``, ``_locked``, ``_mutex``,
    ``_views``, ``_retained``, ``_alloc_context``, ``grow_all_slots``, ``growth_policy``, ``events``,
    ``peak_live_bytes``) and calls its ``_preflight``.
    """

    # -- introspection ------------------------------------------------------ #
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def num_ubatches(self) -> int:
        return self._num_ubatches

    @property
    def num_lanes(self) -> int:
        return self._num_lanes

    def is_locked(self) -> bool:
        return self._locked

    def _check_slot(self, ubatch: int, lane: int = 0) -> int:
        """The slot index of ``(ubatch, lane)``; ``TypeError``/``ValueError`` when out of range."""
        if isinstance(ubatch, bool) or not isinstance(ubatch, int):
            raise TypeError(f"ubatch slot must be an int, got {ubatch!r}")
        if not 0 <= ubatch < self._num_ubatches:
            raise ValueError(
                f"ubatch slot {ubatch} is out of range: this workspace has "
                f"{self._num_ubatches} slot(s) (0..{self._num_ubatches - 1})"
            )
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < self._num_lanes:
            raise ValueError(f"lane {lane!r} is out of range: this workspace has {self._num_lanes} lane(s)")
        return ubatch * self._num_lanes + lane

    def _current_slot(self) -> int:
        """The slot of the calling context (vLLM ``_get_workspace_id``): ``ubatch * num_lanes + lane``."""
        ub, lane = _UBATCH.get(), _LANE.get()
        if ub >= self._num_ubatches:
            self._check_slot(ub)
        if lane >= self._num_lanes:
            raise RuntimeError(f"Workspace lane {lane} is not configured; manager has {self._num_lanes} lane(s).")
        return ub * self._num_lanes + lane

    def _slot_bytes(self, i: int) -> int:
        buf = self._buffers[i]
        return 0 if buf is None else buf.numel()

    def size_bytes(self, ubatch: int = 0, lane: int = 0) -> int:
        """Current size of slot ``(ubatch, lane)``'s buffer in bytes (0 if never grown)."""
        return self._slot_bytes(self._check_slot(ubatch, lane))

    def sizes_bytes(self) -> list[int]:
        """Sizes of every slot in bytes, slot ``ubatch * num_lanes + lane`` (one per ubatch with one lane)."""
        return [0 if b is None else b.numel() for b in self._buffers]

    def live_bytes(self) -> int:
        """Bytes held by all slots together right now."""
        return sum(self.sizes_bytes())

    def buffer(self, ubatch: int = 0, lane: int = 0) -> torch.Tensor | None:
        """The raw ``uint8`` buffer of slot ``(ubatch, lane)`` (None before its first growth)."""
        return self._buffers[self._check_slot(ubatch, lane)]

    def data_ptrs(self) -> list[int]:
        """``data_ptr()`` of each slot's buffer (0 for an empty slot)."""
        return [0 if b is None else b.data_ptr() for b in self._buffers]

    def moved_slots(self, ptrs: Sequence[int], slots: Iterable[int] | None = None) -> list[int]:
        """The slots among ``slots`` (default all, as indices into :meth:`data_ptrs`) whose buffer's
        ``data_ptr()`` is no longer ``ptrs[slot]`` (0 stands for an empty slot).

        The one pointer check of the package: the manager's own check while locked (pointers recorded
        at :meth:`lock`) and the engine's replay guard (``tqlab/engine/replay_guard.py``, pointers
        recorded at CUDA graph capture) both call it. ``IndexError`` for a slot out of range.
        """
        idx = range(len(self._buffers)) if slots is None else slots
        return [s for s in idx if self._moved(s, ptrs[s])]

    def _moved(self, slot: int, ptr: int) -> bool:
        """True if slot ``slot``'s buffer no longer has ``data_ptr()`` ``ptr`` (the check :meth:`moved_slots` makes)."""
        buf = self._buffers[slot]
        return (0 if buf is None else buf.data_ptr()) != ptr


    # -- growth --------------------------------------------------------------- #
    def _record(self, kind: str, caller: str, old: int, new: int, slot: int, peak: int | None = None) -> None:
        live = self.live_bytes()
        peak = live if peak is None else peak
        self.peak_live_bytes = max(self.peak_live_bytes, peak)
        ub, lane = divmod(slot, self._num_lanes)
        ev = WorkspaceEvent(kind, caller, old, new, ub, live, peak, time.monotonic(), lane)
        self.events.append(ev)
        if _debug_enabled():
            if not logger.handlers and not logging.getLogger().handlers:
                logging.basicConfig(level=logging.INFO)
            logger.setLevel(logging.INFO)
            sizes = ", ".join(format_mb(s) for s in self.sizes_bytes())
            if kind == "resize":
                logger.info(
                    "[WORKSPACE DEBUG] Resized workspace from '%s': %s MB -> %s MB "
                    "(slot %d of %d, total memory %s MB)",
                    caller, format_mb(old), format_mb(new), slot, len(self._buffers), format_mb(live),
                )
            elif kind in ("lock", "unlock"):
                logger.info("[WORKSPACE DEBUG] Workspace %sed. Current sizes: [%s]", kind, sizes)
            else:
                logger.info(
                    "[WORKSPACE DEBUG] %s from '%s' (slot %d): %s MB requested, %s MB held",
                    kind, caller, slot, format_mb(new), format_mb(old),
                )

    def _grow(self, slot: int, required: int) -> torch.Tensor:
        # Check, allocate and publish under the manager's mutex: once lock() has
        # returned in any thread, no thread can be half-way through a growth.
        caller = _caller_info()
        with self._mutex:
            current = self._slot_bytes(slot)
            if current >= required:  # another thread grew this slot meanwhile
                return self._buffers[slot]
            if self._locked:
                self._record("violation", caller, current, required, slot)
                raise WorkspaceLockedError(caller, required, current, slot // self._num_lanes)
            targets = [slot]
            if self.grow_all_slots:
                targets = [i for i in range(len(self._buffers)) if self._slot_bytes(i) < required]
            capturing = self._device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if not capturing:  # no cudaMemGetInfo inside a capture; the graph pool allocates then
                self._preflight(targets, required, caller)
            # Cached views pin the old buffers: forget them so the memory can go.
            self._views.clear()
            for i in targets:
                self._grow_slot(i, required, caller, capturing)
            return self._buffers[slot]

    def _grow_slot(self, i: int, required: int, caller: str, capturing: bool) -> None:
        self._retained[i] = None  # vLLM 0.34: a reallocated slot's tail span holds nothing any more
        old = self._buffers[i]
        old_size = 0 if old is None else old.numel()
        live_before = self.live_bytes()
        try:
            if self.growth_policy == "free_then_allocate":
                # Drop every reference first, so the allocator can reuse the
                # block: peak = live - old + new.
                self._buffers[i] = None
                del old
                if self._device.type == "cuda" and not capturing:
                    torch.cuda.empty_cache()
                peak = live_before - old_size + required
                with self._alloc_context():
                    self._buffers[i] = torch.empty((required,), dtype=torch.uint8, device=self._device)
            else:
                peak = live_before + required
                with self._alloc_context():
                    new = torch.empty((required,), dtype=torch.uint8, device=self._device)
                self._buffers[i] = new
                del old, new
        except BaseException:
            # The preflight passed but the allocator still failed (fragmentation, another
            # process). With free-then-allocate the old block is gone; put a buffer of the
            # old size back (its contents are lost) so the slot keeps the size it had.
            if self._buffers[i] is None and old_size:
                try:
                    self._buffers[i] = torch.empty((old_size,), dtype=torch.uint8, device=self._device)
                except BaseException:
                    pass
            self._record("alloc_failed", caller, old_size, required, i)
            raise
        self._record("resize", caller, old_size, required, i, peak=peak)

    # -- persistent resources (vLLM 0.33) -------------------------------------- #
    def get_persistent_resource(self, key, factory):
        """The resource cached for ``key`` in the current (ubatch, lane) slot; ``factory()`` makes it the first time.

        Mirrors ``WorkspaceManager.get_persistent_resource`` in ``vllm/v1/worker/workspace.py``
        (vLLM 0.33): kept for the manager's lifetime, one cache per slot, created lazily;
        after :meth:`lock` a key the slot has never seen raises ``AssertionError("Workspace
        is locked but <key!r> was not allocated during warmup for the current ubatch and
        lane.")``. vLLM uses it for Marlin's locks keyed by CUDA stream and MoE permute scratch.
        """
        slot = self._current_slot()
        resources = self._persistent[slot]
        if key in resources:
            return resources[key]
        with self._mutex:
            if key not in resources:
                if self._locked:
                    raise AssertionError(
                        f"Workspace is locked but {key!r} was not allocated during warmup for the current ubatch and lane."
                    )
                resources[key] = factory()
            return resources[key]

    def get_persistent(self, key, shape: tuple[int, ...], dtype: torch.dtype, *, zero_init: bool = False) -> torch.Tensor:
        """A fixed-shape tensor kept for ``key`` in the current slot, zeroed on first allocation only if ``zero_init``.

        Mirrors vLLM 0.33's ``WorkspaceManager.get_persistent``: stored under
        ``(torch.Tensor, key)``; a later request with another shape or dtype raises
        ``ValueError("Persistent workspace <key!r> has shape=..., dtype=...; requested
        shape=..., dtype=...")``; refused after the lock like :meth:`get_persistent_resource`.
        """
        factory = torch.zeros if zero_init else torch.empty
        dt = as_torch(dtype) if isinstance(dtype, DType) else dtype  # a torch-free stand-in becomes torch's dtype
        t = self.get_persistent_resource((torch.Tensor, key), lambda: factory(shape, dtype=dt, device=self._device))
        if t.shape != shape or t.dtype != dtype:
            raise ValueError(
                f"Persistent workspace {key!r} has shape={t.shape}, dtype={t.dtype}; requested shape={shape}, dtype={dtype}."
            )
        return t

    def persistent_keys(self, ubatch: int = 0, lane: int = 0) -> list:
        """Keys held by slot ``(ubatch, lane)``, in creation order."""
        return list(self._persistent[self._check_slot(ubatch, lane)])
