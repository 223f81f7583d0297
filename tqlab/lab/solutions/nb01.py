"""Reference answers of notebook 01's exercises (workspace buffer layouts); each calls the package's own function.

* :func:`view_offsets` — where each view of one ``get_simultaneous`` call starts (``compute_layout``);
* :func:`call_bytes` — the bytes the call needs (``compute_layout(...).total_bytes``);
* :func:`growth_peak` — the workspace peak while one slot grows, per growth policy (``WorkspaceManager`` on meta);
* :func:`dbo_slot_sizes` — the slot sizes after requests in given ubatch slots (``ubatch_context``);
* :func:`retained_flags` — the ``intact`` flags of vLLM 0.34's ``get_retained`` calls between scratch requests
  (``WorkspaceManager(vllm_version="0.34")``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from tqlab.core.workspace import WorkspaceManager, compute_layout, ubatch_context

__all__ = ["call_bytes", "dbo_slot_sizes", "growth_peak", "retained_flags", "view_offsets"]


def view_offsets(shapes_and_dtypes: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[int]:
    """Byte offset of each view of one ``get_simultaneous(*shapes_and_dtypes)`` call (256-byte aligned)."""
    return list(compute_layout(shapes_and_dtypes).offsets)


def call_bytes(shapes_and_dtypes: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes the call needs: the sum of the views' sizes, each rounded up to 256."""
    return compute_layout(shapes_and_dtypes).total_bytes


def growth_peak(old_bytes: int, new_bytes: int, policy: str) -> int:
    """Peak workspace bytes while one slot grows from ``old_bytes`` to ``new_bytes`` under ``policy``
    (``"free_then_allocate"``, vLLM's, or ``"allocate_then_free"``, what ``resize_`` does)."""
    m = WorkspaceManager("meta", growth_policy=policy)
    m.get_simultaneous(((old_bytes,), torch.uint8))
    m.get_simultaneous(((new_bytes,), torch.uint8))
    return m.events[-1].peak_bytes


def dbo_slot_sizes(requests: Sequence[tuple[int, int]], num_ubatches: int = 2) -> list[int]:
    """Slot sizes after ``(slot, nbytes)`` requests of one uint8 view each, in order (vLLM 0.33: only the
    slot that asks grows)."""
    m = WorkspaceManager("meta", num_ubatches)
    for slot, nbytes in requests:
        with ubatch_context(slot):
            m.get_simultaneous(((nbytes,), torch.uint8))
    return m.sizes_bytes()


def retained_flags(calls: Sequence[tuple], initial_bytes: int) -> list[bool]:
    """The ``intact`` flag of each ``get_retained`` in ``calls`` on one slot of vLLM 0.34's manager that first
    grew to ``initial_bytes`` (one uint8 scratch request). ``calls``: ``("scratch", nbytes)`` (a
    ``get_simultaneous`` of one uint8 view) or ``("retained", key, nbytes)`` (``get_retained(key, (nbytes,),
    torch.uint8)``), in order (vLLM 0.34 ``WorkspaceManager.get_retained``, ``vllm/v1/worker/workspace.py``)."""
    m = WorkspaceManager("meta", vllm_version="0.34")
    m.get_simultaneous(((initial_bytes,), torch.uint8))
    flags = []
    for call in calls:
        if call[0] == "scratch":
            m.get_simultaneous(((call[1],), torch.uint8))
        else:
            flags.append(m.get_retained(call[1], (call[2],), torch.uint8)[1])
    return flags
