"""Notes that travel with a deployment or a prediction: a sentence for people, a kind for code.

A :class:`Note` is a ``str`` (its text, so it prints, compares and serialises as one) that also
carries a :class:`NoteKind` and, where it is about one :class:`~tqlab.core.config.EngineConfig`
field, that field's name. Code that must treat notes differently filters on ``kind`` (or
``field``), never on the wording: rewording a note cannot change a verdict.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

__all__ = ["Note", "NoteKind"]


class NoteKind(str, Enum):
    """What a note says, for code that filters notes (the value is what JSON carries)."""

    PRESET = "preset"
    """The deployment is a tqlab preset (the note names it)."""
    DEFAULTED = "defaulted"
    """A field the line does not give took vLLM's default (``field`` names it)."""
    DERIVED = "derived"
    """A field derived from config.json or other fields, as vLLM derives it (``field`` names it)."""
    CHANGED = "changed"
    """A given value that vLLM changes (e.g. a hybrid model's block size raised)."""
    IGNORED = "ignored"
    """Flags or fields read but with no effect on the workspace (or deprecated and ignored by vLLM)."""
    NOT_MODELLED = "not_modelled"
    """Something vLLM does that tqlab does not model; the answer may differ."""
    RESERVATION_GAP = "reservation_gap"
    """Where PR #44053's reservation leaves a call uncovered."""
    NO_CONSUMER = "no_consumer"
    """The cache format has no TurboQuant workspace consumer."""
    BUG_REPORT = "bug_report"
    """How the bug report's numbers relate to this deployment."""
    INFO = "info"
    """Anything else worth saying."""


class Note(str):
    """A note's text (``str``), with ``kind`` (:class:`NoteKind`) and ``field`` (an EngineConfig field or None)."""

    kind: NoteKind
    field: str | None

    def __new__(cls, kind: NoteKind, text: str, field: str | None = None) -> "Note":
        obj = super().__new__(cls, text)
        obj.kind = NoteKind(kind)
        obj.field = field
        return obj

    def __reduce__(self):  # pickle / copy keep the kind
        return (Note, (self.kind, str(self), self.field))

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "field", "text"}`` (JSON types only)."""
        return {"kind": self.kind.value, "field": self.field, "text": str(self)}

    @staticmethod
    def of(note: "str | Note", kind: NoteKind = NoteKind.INFO) -> "Note":
        """``note`` itself if it is a :class:`Note`, else a note of ``kind`` with its text."""
        return note if isinstance(note, Note) else Note(kind, str(note))
