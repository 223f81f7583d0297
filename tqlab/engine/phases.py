"""The engine's lifecycle log: one :class:`PhaseRecord` per phase, written by :class:`PhaseContext`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["PhaseContext", "PhaseRecord"]


@dataclass(frozen=True)
class PhaseRecord:
    """One lifecycle phase: name, workspace bytes per ubatch slot after it, seconds it took, a note."""

    name: str
    workspace_bytes: tuple[int, ...]
    seconds: float
    note: str = ""


class PhaseContext:
    """``with PhaseContext(engine, name, note) as ctx:`` times the body, then appends a :class:`PhaseRecord` to
    ``engine.phases``, ``(name, len(engine.workspace.events))`` to ``engine._phase_marks`` (which phase each
    workspace event belongs to) and calls ``engine._on_phase(record)`` if set. Exceptions pass through."""

    def __init__(self, engine: Any, name: str, note: str = ""):
        self.engine, self.name, self.note = engine, name, note

    def __enter__(self) -> "PhaseContext":
        self.t = time.perf_counter()
        return self

    def add(self, text: str) -> None:
        """Append ``text`` (what the phase's consumer stand-ins did) to the note; ``""`` adds nothing."""
        if text:
            self.note = f"{self.note}; {text}" if self.note else text

    def __exit__(self, *exc: object) -> bool:
        e = self.engine
        ws = getattr(e, "workspace", None)
        rec = PhaseRecord(self.name, tuple(ws.sizes_bytes()) if ws else (0,), time.perf_counter() - self.t, self.note)
        e._phase_marks.append((self.name, len(ws.events) if ws else 0))
        e.phases.append(rec)
        if e._on_phase:
            e._on_phase(rec)
        return False
