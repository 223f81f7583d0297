"""What a :class:`~tqlab.vllm.tracer.WorkspaceTracer` records, as JSON-ready dataclasses, and their text table.

Per caller (:class:`CallerStats`), per persistent resource (:class:`PersistentStats`), each
refusal (:class:`Violation`, of a kind in :data:`REFUSAL_KINDS`) and each ``lock()``/``unlock()``
(:class:`LockRecord`); :func:`format_trace_report` prints a report. Sizes in bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from tqlab.core.workspace_layout import format_mb


@dataclass
class CallerStats:
    """Everything one caller asked of the workspace.

    ``high_water_bytes`` is the largest single request (a ``get_simultaneous``
    call's total, 256-byte aligned per view, in bytes); ``growths`` counts the
    requests that made the workspace grow; ``violations`` those refused by a
    locked workspace; ``slots`` the ubatch slots (vLLM: workspace ids) used.
    ``before_lock_bytes`` / ``after_lock_bytes``: the largest request made while
    the workspace was unlocked / locked (0: none in that phase).
    """

    caller: str
    requests: int = 0
    high_water_bytes: int = 0
    last_bytes: int = 0
    growths: int = 0
    violations: int = 0
    slots: list[int] = field(default_factory=list)
    before_lock_bytes: int = 0
    after_lock_bytes: int = 0

    @property
    def high_water_phase(self) -> str:
        """``"after lock"`` when the largest request came while locked, else ``"before lock"``."""
        return "after lock" if self.after_lock_bytes >= self.high_water_bytes > 0 else "before lock"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "high_water_phase": self.high_water_phase}


REFUSAL_KINDS = ("scratch", "persistent", "persistent_shape", "lane")
"""What a :class:`Violation` refused (vLLM 0.33 ``vllm/v1/worker/workspace.py`` ``WorkspaceManager``):
``scratch`` -- ``_ensure_workspace_size`` growth after ``lock()`` (``get_simultaneous``);
``persistent`` -- ``get_persistent_resource`` of a key missing after ``lock()`` ("... was not
allocated during warmup": Marlin locks, MoE permute scratch, ROCm segmented attention);
``persistent_shape`` -- ``get_persistent`` of a key cached with another shape/dtype (``ValueError``);
``lane`` -- ``_get_workspace_id`` for a lane the manager was not built with (``RuntimeError``)."""


@dataclass(frozen=True)
class Violation:
    """A request the workspace manager refused: who, how much, and the manager's own message.

    ``kind``: one of :data:`REFUSAL_KINDS`. ``required_bytes`` is None for a persistent
    resource whose size tqlab cannot know (``get_persistent_resource`` with a factory);
    ``current_bytes`` is the slot's scratch size then (bytes). ``key``: the persistent
    resource's key (``repr``), else None.
    """

    caller: str
    required_bytes: int | None
    current_bytes: int
    slot: int
    message: str
    kind: str = "scratch"
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PersistentStats:
    """One caller's requests for one persistent resource (``get_persistent_resource`` key, ``repr``).

    ``created``: requests that made it (the slot lacked the key); ``refused``: requests
    refused after the lock; ``nbytes``: its size when known (``get_persistent``: shape x
    dtype size, bytes), else None; ``slots``: the slots (ubatch x lanes + lane) used.
    """

    caller: str
    key: str
    requests: int = 0
    created: int = 0
    refused: int = 0
    nbytes: int | None = None
    slots: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LockRecord:
    """One ``lock()`` or ``unlock()``: ``sizes_bytes`` of every slot right after it."""

    kind: str
    sizes_bytes: tuple[int, ...]
    caller: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sizes_bytes": list(self.sizes_bytes), "caller": self.caller}



def format_trace_report(report: Mapping[str, Any]) -> str:
    """Text table of a :meth:`WorkspaceTracer.report` (live or loaded from JSON): one line per
    caller (requests, high-water MiB, growths, refusals), the size at lock, every violation."""
    lines = [f"{'caller':<52} {'requests':>8} {'high-water MiB':>14} {'growths':>7} {'refused':>7}"]
    for c in report["callers"]:
        lines.append(
            f"{c['caller']:<52} {c['requests']:>8} {format_mb(c['high_water_bytes']):>14} {c['growths']:>7} {c['violations']:>7}"
        )
    lock = report.get("size_at_lock_bytes")
    lines.append(
        "size at lock: "
        + ("never locked" if lock is None else ", ".join(f"slot {i}: {format_mb(b)} MiB" for i, b in enumerate(lock)))
    )
    for v in report["violations"]:
        kind = v.get("kind", "scratch")
        if kind == "scratch":
            lines.append(f"VIOLATION slot {v['slot']}: {v['caller']} needs {format_mb(v['required_bytes'])} MiB, "
                         f"locked at {format_mb(v['current_bytes'])} MiB")
        else:
            lines.append(f"VIOLATION ({kind}) slot {v['slot']}: {v['caller']}: {v['message']}")
    return "\n".join(lines)
