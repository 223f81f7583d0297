"""The workspace: one flat byte buffer per ubatch slot, carved into typed views.

Mirrors ``vllm/v1/worker/workspace.py`` (``WorkspaceManager``, introduced by vLLM
PR #40941), written from scratch:

* ``get_simultaneous((shape, dtype), ...)`` returns views into one ``uint8``
  buffer. View *i* starts at ``offset_i = sum(round_up(nbytes_j, 256) for j < i)``
  and the call needs ``sum(round_up(nbytes_j, 256))`` bytes. Views stay valid
  until the next call, which reuses (overwrites) the same bytes.
* Growth frees the old buffer *before* allocating the new one, so the peak is
  the new size, not old + new. Only the slot that asked grows (vLLM today;
  ``grow_all_slots=True`` gives the all-slots behaviour of earlier vLLM revisions).
* ``lock()`` freezes the size: a request that does not fit raises
  :class:`WorkspaceLockedError` (an ``AssertionError``, as vLLM raises), naming
  the first caller outside this module and both sizes in MB (2**20 bytes).
* DBO: ``num_ubatches`` independent slots; the current slot comes from
  :func:`ubatch_context` (a ``contextvars`` variable, so each thread has its own).
* Every resize, lock, unlock and violation is appended to ``manager.events``
  and logged when ``TQLAB_DEBUG_WORKSPACE=1`` (vLLM: ``VLLM_DEBUG_WORKSPACE``).
* Thread safety (beyond vLLM, whose manager has no mutex): growth checks the
  lock flag, allocates and publishes the new buffer under ``threading.RLock``,
  and ``lock()``/``unlock()`` take the same lock, so after ``lock()`` returns no
  thread can grow or move a buffer. The no-growth fast path takes no lock;
  the view cache (tqlab's, vLLM carves fresh views on every call) stores an
  entry under the same lock and only while the buffer it was carved from is
  still the slot's, so a growth in another thread never leaves views of a
  freed buffer in the cache (issue 22).
* After ``lock()`` no buffer moves through the manager. ``Tensor.resize_`` on a
  handed-out view can still reallocate the shared storage (vLLM 0.33 has the
  same hole); every request while locked compares the slot's ``data_ptr()`` with
  the one recorded at ``lock()`` and raises :class:`WorkspaceMovedError`.
* vLLM 0.34's retained tail (``get_retained(key, shape, dtype) -> (view, intact)``): a view at the end of
  the slot's buffer that may outlive a request; ``intact`` says whether the span still holds what the
  previous ``get_retained`` left there (:meth:`WorkspaceManager.get_retained`). A manager built for vLLM
  0.33 (``vllm_version="0.33"``) has no ``get_retained``, as vLLM 0.33's has none.
* A refused call changes nothing: bad input (``TypeError``/``ValueError``,
  checked on the 256-rounded sizes), a locked workspace, and a growth the
  allocator cannot give (``torch.OutOfMemoryError``, checked against
  :func:`~tqlab.core.workspace_layout.allocator_headroom` *before* the old buffer is
  freed) leave every slot's size, pointer and bytes as they were.

The layout arithmetic, the errors and the events live in :mod:`tqlab.core.workspace_layout`;
the ubatch/lane context, caller attribution and the slot table (sizes, growth, persistent
resources: :class:`~tqlab.core.workspace_slots.WorkspaceSlots`, the manager's base) in
:mod:`tqlab.core.workspace_slots`. Their public names are re-exported here.

Module helpers keep vLLM's names: :func:`init_workspace_manager`,
:func:`current_workspace_manager`, :func:`is_workspace_manager_initialized`,
:func:`lock_workspace`, :func:`unlock_workspace`, :func:`reset_workspace_manager`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import torch

from tqlab.core import vllm_versions
from tqlab.core.dtypes import as_torch
from tqlab.core.workspace_layout import (
    ALIGNMENT,
    MAX_BYTES,
    MiB,
    WorkspaceEvent,
    WorkspaceLayout,
    WorkspaceLockedError,
    WorkspaceMovedError,
    is_exact_signature,
    allocator_headroom,
    compute_layout,
    format_mb,
    positive_int,
    round_up,
)
from tqlab.core.workspace_slots import (
    _LANE,
    _UBATCH,
    WorkspaceSlots,
    _caller_info,
    current_ubatch_id,
    current_workspace_lane,
    ubatch_context,
    use_workspace_lane,
    workspace_wrapper,
)

__all__ = [
    "ALIGNMENT", "MAX_BYTES", "MiB", "WorkspaceEvent", "WorkspaceLayout", "WorkspaceLockedError",
    "WorkspaceManager", "WorkspaceMovedError", "compute_layout", "current_ubatch_id", "current_workspace_lane",
    "current_workspace_manager", "format_mb", "positive_int", "init_workspace_manager",
    "is_workspace_manager_initialized", "lock_workspace", "reset_workspace_manager",
    "restore_workspace_manager_on_error", "rewarm_workspace", "round_up", "ubatch_context", "unlock_workspace",
    "use_workspace_lane", "workspace_wrapper",
]


# --------------------------------------------------------------------------- #
# The manager                                                                 #
# --------------------------------------------------------------------------- #

_GROWTH_POLICIES = ("free_then_allocate", "allocate_then_free")


class WorkspaceManager(WorkspaceSlots):
    """Flat ``uint8`` workspace buffers, one per ubatch slot, handed out as views.

    Args:
        device: where the buffers live (``"cpu"``, ``"cuda"``, ``"cuda:1"``,
            ``"meta"`` or a ``torch.device``).
        num_ubatches: DBO slots (vLLM: 2 with ``--enable-dbo``, else 1).
            ``None`` means 1.
        num_lanes: independent lanes per ubatch (vLLM 0.33; 2 only for Model
            Runner V2 with a DSpark drafter). There are ``num_ubatches * num_lanes``
            slots, slot ``ubatch * num_lanes + lane``, each with its own buffer and
            persistent resources (vLLM's ``_get_workspace_id``).
        alloc_context: a factory of the context manager a buffer growth allocates
            in (vLLM: the sleep-mode memory pool); default ``contextlib.nullcontext``.
        grow_all_slots: if True, growth resizes every slot that is too small
            (the description of vLLM's `vllm/v1/worker/workspace.py`); default False grows only the requesting
            slot (vLLM today).
        growth_policy: ``"free_then_allocate"`` (vLLM; peak = new size) or
            ``"allocate_then_free"`` (what ``resize_``/copy-growth costs:
            peak = old + new). The second exists to measure the difference.
        vllm_version: the vLLM release whose manager API this one has (``"0.33"``, ``"0.34"``; see
            :mod:`tqlab.core.vllm_versions`); ``None`` (default) takes the run's version
            (:func:`tqlab.core.vllm_versions.current`, :data:`~tqlab.core.vllm_versions.DEFAULT` unless chosen). Only 0.34 on has
            :meth:`get_retained`.

    Raises:
        TypeError/ValueError: bad device, slot count or policy.
    """

    def __init__(
        self,
        device: torch.device | str,
        num_ubatches: int | None = None,
        num_lanes: int = 1,
        alloc_context=contextlib.nullcontext,
        *,
        grow_all_slots: bool = False,
        growth_policy: str = "free_then_allocate",
        vllm_version: "str | vllm_versions.VllmVersion | None" = None,
    ):
        try:
            self._device = torch.device(device)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"bad device {device!r}: {e}") from None
        if self._device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")
            if self._device.index is not None and self._device.index >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        n = 1 if num_ubatches is None else num_ubatches
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"num_ubatches must be an int or None, got {num_ubatches!r}")
        if n < 1:
            raise ValueError(f"num_ubatches must be >= 1, got {num_ubatches}")
        if isinstance(num_lanes, bool) or not isinstance(num_lanes, int):
            raise TypeError(f"num_lanes must be an int, got {num_lanes!r}")
        if num_lanes < 1:
            raise ValueError(f"num_lanes must be at least one, got {num_lanes}.")
        version = vllm_versions.get(vllm_version)
        if growth_policy not in _GROWTH_POLICIES:
            raise ValueError(f"growth_policy must be one of {_GROWTH_POLICIES}, got {growth_policy!r}")
        self._num_ubatches = n
        self.vllm_version = version
        self._num_lanes = num_lanes
        self._alloc_context = alloc_context
        slots = n * num_lanes
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._persistent: list[dict] = [{} for _ in range(slots)]  # per slot: key -> resource
        self._locked = False
        self._locked_ptrs: list[int] = [0] * slots  # each slot's data_ptr() at lock()
        self._locked_sizes: list[int] = [0] * slots
        # Per slot, (key, start) of the tail span get_retained last handed out (vLLM 0.34 ``_retained``);
        # cleared when a get_simultaneous request reaches into it or the slot's buffer is reallocated.
        self._retained: list[tuple | None] = [None] * slots
        self.grow_all_slots = bool(grow_all_slots)
        self.growth_policy = growth_policy
        self.events: list[WorkspaceEvent] = []
        self.peak_live_bytes = 0
        # (request signature) -> layout, and (signature, slot) -> (buffer, views)
        self._layouts: dict[tuple, WorkspaceLayout] = {}
        self._views: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._empty = None  # zero-byte stand-in for an all-empty first request
        # Serialises growth, lock and unlock (never taken on the no-growth fast path).
        self._mutex = threading.RLock()

    def clear_caches(self) -> None:
        """Forget the cached layouts and views (buffers, size and lock untouched): the next call of any
        signature is computed as if never seen (the cold path an overhead measurement times)."""
        self._layouts.clear()
        self._views.clear()

    # -- the core call ------------------------------------------------------- #
    def layout(self, *shapes_and_dtypes: tuple[Sequence[int], torch.dtype]) -> WorkspaceLayout:
        """The layout ``get_simultaneous`` would use (validated; allocates nothing)."""
        return self._layout_and_key(shapes_and_dtypes)[0]

    def _layout_and_key(self, reqs: tuple) -> tuple[WorkspaceLayout, tuple | None]:
        # Fast path: a signature seen before. Only exact-int tuple signatures are
        # cached, and a hit is re-checked, because 4.0 == 4 and True == 1 hash alike.
        try:
            lay = self._layouts.get(reqs)
        except TypeError:  # unhashable, e.g. list shapes
            return compute_layout(reqs), None
        exact = is_exact_signature(reqs)
        if lay is not None and exact:
            return lay, reqs
        lay = compute_layout(reqs)
        if not exact:
            return lay, None
        if len(self._layouts) > 4096:
            self._layouts.clear()
        self._layouts[reqs] = lay
        return lay, reqs

    def get_simultaneous(self, *shapes_and_dtypes: tuple[Sequence[int], torch.dtype]) -> list[torch.Tensor]:
        """Views for several tensors that are alive at the same time.

        Args:
            *shapes_and_dtypes: ``(shape, dtype)`` pairs; shape a tuple/list of
                non-negative ints (zero-size shapes are allowed and give empty views).

        Returns:
            One tensor per request, with the requested shape and dtype, carved
            from the current ubatch slot's buffer at 256-byte aligned offsets.
            They are valid until the next ``get_simultaneous`` on this slot.
            A repeated signature on an unchanged buffer reuses cached views
            (fresh aliases each call), which keeps this call at a few microseconds.

        Raises:
            TypeError/ValueError: a malformed request, a call whose 256-rounded
                total exceeds ``MAX_BYTES`` (2**63 - 1), or an out-of-range ubatch
                slot; nothing is allocated, the state is unchanged and no event
                is recorded.
            torch.OutOfMemoryError: the growth exceeds ``allocator_headroom``
                (CUDA free + cached memory; Linux's overcommit limit on CPU):
                refused before anything is freed, state unchanged, an
                ``"alloc_failed"`` event recorded. If the allocator itself fails
                after that check (fragmentation, another process), the old block
                is already freed, as vLLM frees it: the slot gets a buffer of its
                old size back (contents and pointer lost), ``"alloc_failed"``.
            WorkspaceLockedError: the workspace is locked and the slot's buffer
                is smaller than the request; buffer, contents and lock state
                are unchanged, and a ``"violation"`` event is recorded.
        """
        slot = _UBATCH.get() if self._num_lanes == 1 and _LANE.get() == 0 else self._current_slot()
        if slot >= self._num_ubatches * self._num_lanes:
            self._current_slot()
        lay, key = self._layout_and_key(shapes_and_dtypes)
        buf = self._buffers[slot]
        if self._locked and buf is not None and self._moved(slot, self._locked_ptrs[slot]):
            self._raise_moved(slot)
        if key is not None:
            cached = self._views.get((key, slot))
            if cached is not None and cached[0] is buf:
                self._forget_retained_below(slot, lay.total_bytes)
                # Fresh aliases of private views: callers may reshape theirs in place.
                return [v.view(shape) for v, shape in zip(cached[1], lay.shapes)]
            cached = None  # must not pin an old buffer across growth
        owner = buf  # the slot buffer these views are carved from (None: the empty stand-in)
        if (0 if buf is None else buf.numel()) < lay.total_bytes:
            buf = owner = None  # drop our references too, so growth really frees first
            buf = owner = self._grow(slot, lay.total_bytes)
        elif buf is None:  # every request is empty and nothing was ever allocated
            if self._empty is None:
                self._empty = torch.empty(0, dtype=torch.uint8, device=self._device)
            buf = self._empty
        self._forget_retained_below(slot, lay.total_bytes)
        views = [
            buf[off : off + n].view(as_torch(dt)).view(shape)
            for shape, dt, n, off in zip(lay.shapes, lay.dtypes, lay.nbytes, lay.offsets)
        ]
        if key is not None:
            self._cache_views(key, slot, owner, views)
            return [v.view(shape) for v, shape in zip(views, lay.shapes)]
        return views

    # -- the retained tail (vLLM 0.34) ----------------------------------------- #
    @property
    def get_retained(self):
        """``get_retained(key, shape, dtype) -> (view, intact)``: a view at the end of the slot's buffer that can
        outlive requests (vLLM 0.34 ``WorkspaceManager.get_retained``, ``vllm/v1/worker/workspace.py``).

        ``get_simultaneous`` carves its views from the start of the buffer, so a request smaller than the buffer
        leaves its end alone. The view spans ``nbytes = prod(shape) * dtype.itemsize`` bytes from
        ``start = round_down(size - nbytes, 256)`` (``size`` = the slot's buffer after growing it to at least
        ``nbytes``, unaligned, as vLLM's ``_ensure_workspace_size(num_bytes)``). ``intact`` is True only when the
        previous ``get_retained`` on this (ubatch, lane) slot had the same ``key`` and the same ``start``, no
        ``get_simultaneous`` since needed more than ``start`` bytes (its 256-rounded total), and the buffer was
        not reallocated in between. Only the latest key is remembered; what the bytes mean is the caller's to
        track. vLLM compares ``(key, start)``, not the size: two sizes whose spans start on the same 256-byte
        boundary both count as intact (its docstring says "the same key and size").

        Raises:
            AttributeError: the manager was built for vLLM 0.33 (``vllm_version="0.33"``), which has no
                ``get_retained`` (``hasattr(manager, "get_retained")`` is False there).
            TypeError/ValueError: a malformed shape or dtype, or a zero-byte request on a slot that was never
                grown (vLLM 0.34 fails there with ``AttributeError`` on ``None.numel()``); state unchanged.
            WorkspaceLockedError: locked and the buffer is smaller than ``nbytes`` (vLLM's message, naming the
                caller of ``get_retained``); the remembered span is unchanged.
        """
        if not self.vllm_version.has_get_retained:
            raise AttributeError(
                f"'WorkspaceManager' object has no attribute 'get_retained': {self.vllm_version}'s manager has none "
                f"(added in vLLM 0.34, vllm/v1/worker/workspace.py)"
            )
        return self._get_retained

    def _get_retained(self, key, shape: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
        lay = compute_layout(((shape, dtype),))
        num_bytes = lay.nbytes[0]
        slot = self._current_slot()
        buf = self._buffers[slot]
        if self._locked and buf is not None and self._moved(slot, self._locked_ptrs[slot]):
            self._raise_moved(slot)
        if (0 if buf is None else buf.numel()) < num_bytes:
            buf = None
            buf = self._grow(slot, num_bytes)
        elif buf is None:
            raise ValueError(f"get_retained of 0 bytes (shape {tuple(shape)}) on a slot that was never grown")
        start = (buf.numel() - num_bytes) // ALIGNMENT * ALIGNMENT
        intact = self._retained[slot] == (key, start)
        self._retained[slot] = (key, start)
        return buf[start : start + num_bytes].view(as_torch(dtype)).view(lay.shapes[0]), intact

    def retained_span(self, ubatch: int = 0, lane: int = 0) -> tuple | None:
        """``(key, start)`` of the span slot ``(ubatch, lane)``'s last ``get_retained`` handed out, or None once a
        ``get_simultaneous`` reached into it, the buffer was reallocated, or none was asked (vLLM 0.34
        ``_retained``). ``start`` is the span's byte offset in the buffer."""
        return self._retained[self._check_slot(ubatch, lane)]

    def _forget_retained_below(self, slot: int, total_bytes: int) -> None:
        """A ``get_simultaneous`` of ``total_bytes`` (256-rounded) reached into the retained span: forget it."""
        kept = self._retained[slot]
        if kept is not None and total_bytes > kept[1]:
            self._retained[slot] = None

    def _cache_views(self, key: tuple, slot: int, owner: torch.Tensor | None, views: list[torch.Tensor]) -> None:
        """Cache ``views`` of ``owner`` for ``key`` only if ``owner`` is still the slot's buffer.

        Checked and stored under the mutex that growth holds while it publishes a
        new buffer and clears the cache, so a growth in another thread between
        this call's read of the buffer and its store can never leave (new buffer,
        views of the old one) in the cache (issue 22).
        """
        with self._mutex:
            if self._buffers[slot] is not owner:
                return
            if len(self._views) > 4096:
                self._views.clear()
            self._views[(key, slot)] = (owner, views)

    def _preflight(self, targets: list[int], required: int, caller: str) -> None:
        """Refuse, before any buffer is freed, a growth the allocator cannot satisfy."""
        headroom = allocator_headroom(self._device)
        if headroom is None:
            return
        limit, per_allocation, source = headroom
        freeing = 0 if per_allocation else sum(self._slot_bytes(i) for i in targets)
        need = required if per_allocation else required * len(targets)
        if need > limit + freeing:
            for i in targets:
                self._record("alloc_failed", caller, self._slot_bytes(i), required, i)
            raise torch.OutOfMemoryError(
                f"workspace growth from '{caller}' to {required} bytes ({format_mb(required)} MB) in slot(s) "
                f"{targets} refused before freeing anything: {source} allows {limit + freeing} bytes "
                f"({format_mb(limit + freeing)} MB); the buffer, its pointer and its bytes are unchanged"
            )

    # -- lock ----------------------------------------------------------------- #
    def lock(self) -> None:
        """Freeze every slot's size (vLLM: after CUDA graph capture).

        Waits for a growth in progress in another thread; once this returns, no
        thread can grow or move a buffer through the manager until :meth:`unlock`.
        Each slot's ``data_ptr()`` and size are recorded here; a request while
        locked on a slot whose storage was reallocated behind the manager's back
        (``resize_`` on a handed-out view) raises :class:`WorkspaceMovedError`.
        """
        caller = _caller_info("lock")
        with self._mutex:
            # Pointers first: a request that sees _locked True must find them set.
            self._locked_ptrs, self._locked_sizes = self.data_ptrs(), self.sizes_bytes()
            self._locked = True
            self._record("lock", caller, self.live_bytes(), self.live_bytes(), _UBATCH.get() * self._num_lanes)

    def _raise_moved(self, slot: int) -> None:
        """Record a ``"moved"`` event and raise :class:`WorkspaceMovedError` for ``slot``."""
        buf = self._buffers[slot]
        ptr, nbytes = buf.data_ptr(), buf.untyped_storage().nbytes()
        self._record("moved", _caller_info(), self._locked_sizes[slot], nbytes, slot)
        raise WorkspaceMovedError(*divmod(slot, self._num_lanes), self._locked_ptrs[slot], ptr,
                                  self._locked_sizes[slot], nbytes)

    def unlock(self) -> None:
        """Allow growth again (vLLM: only elastic EP re-warm-up does this)."""
        caller = _caller_info("lock")
        with self._mutex:
            self._locked = False
            self._record("unlock", caller, self.live_bytes(), self.live_bytes(), _UBATCH.get() * self._num_lanes)

    def __repr__(self) -> str:
        sizes = ", ".join(format_mb(s) for s in self.sizes_bytes())
        return (
            f"WorkspaceManager(device={str(self._device)!r}, slots=[{sizes}] MB, "
            f"locked={self._locked})"
        )


# --------------------------------------------------------------------------- #
# Module-level singleton, with vLLM's helper names                            #
# --------------------------------------------------------------------------- #

_manager: WorkspaceManager | None = None


def init_workspace_manager(device: torch.device | str, num_ubatches: int | None = None, num_lanes: int = 1,
                           alloc_context=contextlib.nullcontext, **kwargs) -> WorkspaceManager:
    """Create the process-wide manager (vLLM: ``GPUWorker.init_device()``) and return it.

    Replaces any previous manager. ``kwargs`` go to :class:`WorkspaceManager`.
    """
    global _manager
    _manager = WorkspaceManager(device, num_ubatches, num_lanes, alloc_context, **kwargs)
    return _manager


def current_workspace_manager() -> WorkspaceManager:
    """The process-wide manager. Raises ``RuntimeError`` if none was initialized."""
    if _manager is None:
        raise RuntimeError(
            "WorkspaceManager is not initialized: call tqlab.core.workspace.init_workspace_manager(device) first"
        )
    return _manager


def is_workspace_manager_initialized() -> bool:
    """True once :func:`init_workspace_manager` ran (and no reset since)."""
    return _manager is not None


def lock_workspace() -> None:
    """Lock the process-wide manager (vLLM: end of ``capture_model()``)."""
    current_workspace_manager().lock()


def unlock_workspace() -> None:
    """Unlock the process-wide manager (vLLM: elastic EP scaling only)."""
    current_workspace_manager().unlock()


def reset_workspace_manager() -> None:
    """Forget the process-wide manager (tests and notebooks)."""
    global _manager
    _manager = None


@contextlib.contextmanager
def restore_workspace_manager_on_error() -> Iterator[None]:
    """Put the previous process-wide manager (or none) back if the body raises.

    A failed engine start-up must not leave its half-built manager installed.
    """
    global _manager
    previous = _manager
    try:
        yield
    except BaseException:
        _manager = previous
        raise


@contextlib.contextmanager
def rewarm_workspace(manager: WorkspaceManager | None = None) -> Iterator[WorkspaceManager]:
    """Unlock for a re-warm-up, and always lock again on exit, even if the body raises.

    The elastic-EP sequence ``unlock_workspace(); warm_up(); lock_workspace()``
    leaves the workspace unlocked forever if ``warm_up()`` raises; this does not.
    """
    m = current_workspace_manager() if manager is None else manager
    m.unlock()
    try:
        yield m
    finally:
        m.lock()
