"""Workspace bytes: 256-byte aligned layouts of ``(shape, dtype)`` requests, the allocator's limits, and the
errors and events that report sizes.

Split out of :mod:`tqlab.core.workspace` (which re-exports every public name here);
mirrors the size computation of ``WorkspaceManager.get_simultaneous`` in
``vllm/v1/worker/workspace.py``: ``actual = prod(shape) * dtype.itemsize``,
``aligned = round_up(actual, 256)``, offsets are the running sum of ``aligned``.
Pure Python on ints: allocates nothing. :func:`allocator_headroom` reads how much
the device's allocator can still give, so growth can be refused before a buffer is freed.
:class:`WorkspaceLockedError`, :class:`WorkspaceMovedError` and :class:`WorkspaceEvent` are the
manager's errors and event records (split out of :mod:`tqlab.core.workspace`, which re-exports them).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from tqlab.core.dtypes import is_dtype

if TYPE_CHECKING:  # pragma: no cover - torch only where a real tensor is made (tqlab.core.dtypes)
    import torch

__all__ = [
    "ALIGNMENT", "MAX_BYTES", "MiB", "WorkspaceEvent", "WorkspaceLayout", "WorkspaceLockedError",
    "WorkspaceMovedError", "allocator_headroom", "compute_layout", "format_mb", "cdiv", "is_exact_signature",
    "positive_int", "round_up",
]

ALIGNMENT = 256
"""Every view starts at a multiple of this many bytes (as vLLM)."""

MiB = 1 << 20
"""vLLM's messages say "MB" but divide by 2**20; so do we."""

MAX_BYTES = (1 << 63) - 1
"""Largest byte count a buffer can have: ``torch.empty`` takes an int64 size."""


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else ``ValueError`` naming ``name``.

    The one argument check of batch sizes, head counts, buckets and lengths across the package.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def cdiv(a: int, b: int) -> int:
    """Ceiling division of ints, ``ceil(a / b)`` without floats (vLLM's ``cdiv``, ``vllm/utils/math_utils.py``).

    The one ceiling division of the package. ``b`` must be > 0 (``ValueError`` otherwise).
    """
    if b <= 0:
        raise ValueError(f"cdiv: divisor must be > 0, got {b}")
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``x`` (both ints; ``ValueError`` unless multiple > 0)."""
    if multiple <= 0:
        raise ValueError(f"round_up: multiple must be > 0, got {multiple}")
    return cdiv(x, multiple) * multiple


def format_mb(nbytes: int) -> str:
    """``nbytes`` as vLLM prints it: bytes / 2**20 with two decimals, e.g. ``'2.00'``."""
    return f"{nbytes / MiB:.2f}"


# --------------------------------------------------------------------------- #
# Layout: pure arithmetic, validated, cached per request signature            #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class WorkspaceLayout:
    """Where each requested view lives inside the flat buffer.

    Attributes:
        shapes: the validated shapes, as tuples of ints.
        dtypes: the requested dtype of each view, as given (a ``torch.dtype`` or its torch-free
            stand-in :class:`tqlab.core.dtypes.DType`; the bytes are the same for both).
        nbytes: bytes each view really uses (``numel * itemsize``).
        offsets: byte offset of each view; every offset is a multiple of 256.
        total_bytes: bytes the call needs, ``sum(round_up(nbytes_i, 256))``.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    nbytes: tuple[int, ...]
    offsets: tuple[int, ...]
    total_bytes: int

    @property
    def padding(self) -> tuple[int, ...]:
        """Alignment padding after each view, in bytes."""
        return tuple(round_up(n, ALIGNMENT) - n for n in self.nbytes)


def _validate_shape(index: int, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):  # torch.Size is a tuple
        raise TypeError(
            f"request {index}: shape must be a tuple or list of ints, got "
            f"{type(shape).__name__} {shape!r}"
        )
    dims = []
    for d in shape:
        if isinstance(d, bool):
            raise TypeError(f"request {index}: dimension {d!r} in shape {tuple(shape)!r} is a bool, not an int")
        try:
            v = operator.index(d)
        except TypeError:
            raise TypeError(
                f"request {index}: dimension {d!r} in shape {tuple(shape)!r} is not an integer"
            ) from None
        if v < 0:
            raise ValueError(f"request {index}: dimension {v} in shape {tuple(shape)!r} is negative")
        if v > MAX_BYTES:  # even next to a 0 dimension: torch sizes are int64
            raise ValueError(
                f"request {index}: dimension {v} in shape {tuple(shape)!r} exceeds 2**63 - 1, the int64 limit of torch sizes"
            )
        dims.append(v)
    running = 1
    for v in dims:  # torch multiplies the sizes left to right in uint64 (c10 safe_multiply_u64)
        running *= v
        if running >= 1 << 64:
            raise ValueError(
                f"request {index}: shape {tuple(dims)!r}: the product of its dimensions up to {v} is {running}, "
                f"which overflows torch's 64-bit size computation (even if a later dimension is 0)"
            )
    stride = 1
    for v in reversed(dims[1:]):  # contiguous strides, as torch computes them (a 0 size counts as 1)
        stride *= max(v, 1)
        if stride > MAX_BYTES:
            raise ValueError(
                f"request {index}: shape {tuple(dims)!r}: a contiguous stride of {stride} elements exceeds "
                f"2**63 - 1, which torch's int64 strides cannot hold (even if a dimension is 0)"
            )
    return tuple(dims)


def compute_layout(shapes_and_dtypes: Sequence[tuple[Sequence[int], Any]]) -> WorkspaceLayout:
    """Validate ``(shape, dtype)`` requests and compute their byte layout.

    Pure function: allocates nothing. Raises ``TypeError`` for a request that
    is not a ``(shape, dtype)`` pair, a shape that is not a tuple/list, a
    non-integer dimension or a dtype that is neither a ``torch.dtype`` nor a
    :class:`tqlab.core.dtypes.DType` (the two give the same bytes; torch is not imported);
    ``ValueError`` for a negative dimension or one above 2**63 - 1, a shape
    whose sizes' running product reaches 2**64 or whose contiguous strides
    exceed 2**63 - 1 (even with a zero dimension: torch's size and stride
    arithmetic is 64-bit), or when the call's total *after*
    rounding each view up to 256 bytes exceeds :data:`MAX_BYTES` (2**63 - 1,
    the int64 limit of ``torch.empty``): ``((2**63 - 1,), torch.uint8)`` rounds
    to exactly 2**63 and is refused here, before any buffer is touched. The
    message names the request index and the bad value.
    """
    shapes, dtypes, nbytes, offsets = [], [], [], []
    offset = 0
    for i, req in enumerate(shapes_and_dtypes):
        if not isinstance(req, (tuple, list)) or len(req) != 2:
            raise TypeError(f"request {i}: expected a (shape, dtype) pair, got {req!r}")
        shape, dtype = req
        if not is_dtype(dtype):
            raise TypeError(f"request {i}: dtype must be a torch.dtype (or a tqlab.core.dtypes.DType), got {dtype!r}")
        dims = _validate_shape(i, shape)
        numel = 1
        for d in dims:
            numel *= d
        n = numel * dtype.itemsize
        if offset + round_up(n, ALIGNMENT) > MAX_BYTES:
            raise ValueError(
                f"request {i}: shape {dims} of {dtype} needs {n} bytes ({round_up(n, ALIGNMENT)} rounded up to "
                f"{ALIGNMENT}); with the {offset} bytes of the views before it the call would need "
                f"{offset + round_up(n, ALIGNMENT)} bytes: 2**63 bytes or more, beyond the int64 size torch.empty takes"
            )
        shapes.append(dims)
        dtypes.append(dtype)
        nbytes.append(n)
        offsets.append(offset)
        offset += round_up(n, ALIGNMENT)
    return WorkspaceLayout(tuple(shapes), tuple(dtypes), tuple(nbytes), tuple(offsets), offset)


def is_exact_signature(reqs: tuple) -> bool:
    for req in reqs:
        if type(req) is not tuple or len(req) != 2 or type(req[0]) is not tuple:
            return False
        for d in req[0]:
            if type(d) is not int:
                return False
    return True


def _meminfo_bytes(*fields: str) -> dict[str, int] | None:
    try:
        with open("/proc/meminfo") as f:
            rows = dict(line.split(":", 1) for line in f if ":" in line)
        return {k: int(rows[k].split()[0]) * 1024 for k in fields}
    except (OSError, KeyError, ValueError, IndexError):
        return None


def allocator_headroom(device: "torch.device") -> tuple[int, bool, str] | None:
    """How many bytes an allocation on ``device`` can get, known before freeing anything.

    Returns ``(limit_bytes, per_allocation, source)`` or None when the allocator
    has no limit we can read (``meta``; Linux ``vm.overcommit_memory=1``; not Linux).
    ``per_allocation``: the limit holds for each allocation on its own (Linux's
    overcommit heuristic refuses one mapping larger than RAM + swap); otherwise
    it is what all allocations together may take *on top of* the bytes freed.
    """
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached, False, "torch.cuda.mem_get_info() free + the caching allocator's unused blocks"
    if device.type != "cpu":
        return None
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            mode = f.read().strip()
    except OSError:
        return None
    if mode == "0":
        m = _meminfo_bytes("MemTotal", "SwapTotal")
        return None if m is None else (m["MemTotal"] + m["SwapTotal"], True,
                                       "Linux's overcommit heuristic (vm.overcommit_memory=0: RAM + swap)")
    if mode == "2":
        m = _meminfo_bytes("CommitLimit", "Committed_AS")
        return None if m is None else (max(0, m["CommitLimit"] - m["Committed_AS"]), False,
                                       "Linux's commit limit (vm.overcommit_memory=2: CommitLimit - Committed_AS)")
    return None


# --------------------------------------------------------------------------- #
# Errors and events                                                           #
# --------------------------------------------------------------------------- #


class WorkspaceLockedError(AssertionError):
    """A locked workspace was asked to grow.

    Subclasses ``AssertionError`` because vLLM raises a bare ``AssertionError``
    here (``_ensure_workspace_size`` in ``vllm/v1/worker/workspace.py``); code
    that catches vLLM's error catches ours. The text has vLLM's exact shape.

    Attributes: ``caller`` (``'file.py:line:function'``), ``required_bytes``,
    ``current_bytes``, ``ubatch``.
    """

    def __init__(self, caller: str, required_bytes: int, current_bytes: int, ubatch: int = 0):
        self.caller = caller
        self.required_bytes = required_bytes
        self.current_bytes = current_bytes
        self.ubatch = ubatch
        super().__init__(
            f"Workspace is locked but allocation from '{caller}' requires "
            f"{format_mb(required_bytes)} MB, current size is "
            f"{format_mb(current_bytes)} MB. Workspace growth is not allowed after locking."
        )


class WorkspaceMovedError(RuntimeError):
    """A locked slot's buffer no longer has the storage it had at ``lock()``.

    ``Tensor.resize_`` on a handed-out view (or on :meth:`WorkspaceManager.buffer`)
    to more bytes than the slot holds reallocates the storage
    the view shares with the slot's buffer: the buffer moves although the manager
    never grew it, and a CUDA graph captured before the lock would write into the
    freed block. vLLM 0.33 has the same hole and does not notice
    (``WorkspaceManager.lock`` in ``vllm/v1/worker/workspace.py`` only sets a flag);
    tqlab records every slot's ``data_ptr()`` at ``lock()`` and compares it on every
    request and persistent-resource call while locked.

    Attributes: ``ubatch``, ``lane``, ``locked_ptr``, ``current_ptr``,
    ``locked_bytes`` (the slot's size at lock), ``current_bytes`` (its storage now).
    """

    def __init__(self, ubatch: int, lane: int, locked_ptr: int, current_ptr: int, locked_bytes: int,
                 current_bytes: int):
        self.ubatch, self.lane = ubatch, lane
        self.locked_ptr, self.current_ptr = locked_ptr, current_ptr
        self.locked_bytes, self.current_bytes = locked_bytes, current_bytes
        super().__init__(
            f"workspace slot (ubatch {ubatch}, lane {lane}) moved while locked: it held {locked_bytes} bytes "
            f"({format_mb(locked_bytes)} MB) at 0x{locked_ptr:x} at lock(), its storage is now {current_bytes} "
            f"bytes ({format_mb(current_bytes)} MB) at 0x{current_ptr:x}. Something resized a handed-out view (or "
            "buffer()) in place: Tensor.resize_ beyond the storage reallocates the storage the view shares with "
            "the workspace. Never resize a workspace view; ask get_simultaneous for the shape you need."
        )


@dataclass(frozen=True)
class WorkspaceEvent:
    """One entry of ``WorkspaceManager.events``.

    ``kind`` is ``"resize"``, ``"lock"``, ``"unlock"``, ``"violation"``,
    ``"alloc_failed"`` or ``"moved"`` (a locked slot's storage was reallocated
    behind the manager's back: old and new storage bytes); ``old_bytes``/``new_bytes`` are the slot's size before
    and after (for a violation: current and required); ``live_bytes`` is the sum
    of all slots after the event and ``peak_bytes`` the most live workspace
    bytes that existed at once during it; ``t`` is ``time.monotonic()``.
    """

    kind: str
    caller: str
    old_bytes: int
    new_bytes: int
    ubatch: int
    live_bytes: int
    peak_bytes: int
    t: float
    lane: int = 0

