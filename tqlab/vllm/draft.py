"""A deployment while it is being read: per EngineConfig field its value, its source and its notes, in one object.

The readers of :mod:`tqlab.vllm.deployment` (flags, config.json, vLLM's defaults, hybrid-model rules)
each take a :class:`DeploymentDraft` and record what they decide with :meth:`DeploymentDraft.set`
and :meth:`DeploymentDraft.note`; nobody threads parallel dicts. :meth:`DeploymentDraft.kwargs`
and :meth:`DeploymentDraft.sources` hand the result to :class:`~tqlab.core.config.EngineConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from tqlab.core.notes import Note, NoteKind

__all__ = ["DeploymentDraft", "FieldRecord"]


@dataclass
class FieldRecord:
    """One field of a deployment: ``value``, ``source`` (``"flag --max-model-len"``, ``"config.json ..."``,
    ``"vLLM default ..."``, ``"derived: ..."``, ``"preset NAME"``) and the :class:`Note` s about it."""

    value: Any
    source: str
    notes: list[Note] = field(default_factory=list)


class DeploymentDraft:
    """Fields (name -> :class:`FieldRecord`), the notes in the order they were made, and the ignored flags."""

    def __init__(self) -> None:
        self.fields: dict[str, FieldRecord] = {}
        self.notes: list[Note] = []
        self.ignored: list[str] = []

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` has a value (a field with only a source does not)."""
        rec = self.fields.get(name)
        return rec is not None and rec.value is not _UNSET

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name``, or ``default`` when it is not set."""
        rec = self.fields.get(name)
        return default if rec is None or rec.value is _UNSET else rec.value

    def source(self, name: str, default: str = "") -> str:
        rec = self.fields.get(name)
        return default if rec is None else rec.source

    def set(self, name: str, value: Any, source: str) -> None:
        """Set ``name`` to ``value`` from ``source`` (its earlier notes stay with it)."""
        rec = self.fields.get(name)
        if rec is None:
            self.fields[name] = FieldRecord(value, source)
        else:
            rec.value, rec.source = value, source

    def set_value(self, name: str, value: Any) -> None:
        """Change the value of a set field and keep its source (e.g. a cap applied later)."""
        self.fields[name].value = value

    def set_source(self, name: str, source: str) -> None:
        """Say where ``name`` comes from without giving it a value (it stays unset for EngineConfig)."""
        if name in self.fields:
            self.fields[name].source = source
        else:
            self.fields[name] = FieldRecord(_UNSET, source)

    def drop(self, name: str) -> Any:
        """Unset ``name`` (value and source); returns its value (None if unset)."""
        rec = self.fields.pop(name, None)
        return None if rec is None or rec.value is _UNSET else rec.value

    def note(self, kind: NoteKind, text: str, field: str | None = None) -> Note:
        """Record a note (and, with ``field``, attach it to that field's record)."""
        n = Note(kind, text, field)
        self.notes.append(n)
        if field is not None and field in self.fields:  # a note about an unrecorded field stays global only
            self.fields[field].notes.append(n)
        return n

    def kwargs(self, names: Iterable[str]) -> dict[str, Any]:
        """``{name: value}`` of the set fields among ``names`` (EngineConfig's keyword arguments)."""
        keep = set(names)
        return {k: r.value for k, r in self.fields.items() if k in keep and r.value is not _UNSET}

    def sources(self, names: Iterable[str]) -> dict[str, str]:
        """``{name: source}`` of the recorded fields among ``names`` (set, or only said where they come from)."""
        keep = set(names)
        return {k: r.source for k, r in self.fields.items() if k in keep}

    def unknown(self, names: Iterable[str]) -> list[str]:
        """Set fields that are not among ``names`` (read, but not modelled by EngineConfig), sorted."""
        keep = set(names)
        return sorted(k for k, r in self.fields.items() if k not in keep and r.value is not _UNSET)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()
