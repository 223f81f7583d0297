"""The replay guard: refuse to replay a CUDA graph whose workspace buffer has moved.

A captured graph replays the raw ``data_ptr()`` of every workspace view it was
captured with. vLLM keeps those pointers valid by locking the workspace after
capture (``vllm/v1/worker/gpu_model_runner.py`` ``capture_model``); this module
adds a check vLLM does not have: :func:`snapshot_workspace` at capture, then
:func:`check_workspace` before each replay raises :class:`StalePointerError`
instead of writing into freed memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tqlab.core.workspace import WorkspaceManager, format_mb

__all__ = ["StalePointerError", "WorkspaceSnapshot", "check_workspace", "snapshot_workspace", "stale_slots"]


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
            f"ubatch slot {slot} at 0x{captured_ptr:x} ({format_mb(captured_bytes)} MiB), but that slot now "
            f"lives at 0x{current_ptr:x} ({format_mb(current_bytes)} MiB). The workspace was reallocated after "
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
    """Guarded slots whose buffer pointer differs from the snapshot (:meth:`WorkspaceManager.moved_slots`)."""
    return manager.moved_slots(snap.ptrs, snap.slots)


def check_workspace(manager: WorkspaceManager, snap: WorkspaceSnapshot, bucket: int) -> None:
    """The replay guard: raise :class:`StalePointerError` if a guarded slot's buffer moved since ``snap``.

    A buffer that grew *in place* (same pointer) still contains every byte the
    graph baked in, so only a changed pointer is an error.
    """
    moved = stale_slots(manager, snap)
    if moved:
        s = moved[0]
        raise StalePointerError(bucket, s, snap.ptrs[s], manager.data_ptrs()[s], snap.sizes[s], manager.size_bytes(s))


