"""Exercises checked by code: the student writes a function, :func:`check` runs it beside a reference.

Each notebook ends with a few exercises. An exercise is a function the student fills in (its body raises
``NotImplementedError`` until then), a reference implementation that lives in ``tqlab`` (so the solution is
not printed in the notebook; a collapsed ``<details>`` cell shows it for whoever wants it), and a list of
cases. :func:`check` calls both on every case and reports, per case, whether the student's answer matches
the reference (exactly, or within ``rel_tol`` for floats).

The notebooks run headless in CI with the exercises *unsolved*: :func:`check` then reports "not attempted
yet" and returns an :class:`ExerciseResult` with ``attempted=False``; it never raises for a wrong answer
(a lecture must run to the end), but it raises ``TypeError`` for a malformed exercise (no cases, a reference
that is not callable), which is the author's bug, not the student's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["ExerciseResult", "check", "same"]


@dataclass(frozen=True)
class ExerciseResult:
    """What :func:`check` found: ``attempted`` (False while the student's function raises
    ``NotImplementedError``), ``passed`` (every case matched), ``failures`` (``(case, got, expected)`` for each
    case that did not match, at most the first three)."""

    name: str
    attempted: bool
    passed: bool
    failures: list = field(default_factory=list)

    def _ipython_display_(self) -> None:
        """Shown as the last line of a cell: nothing more, :func:`check` already printed the result."""

    def __str__(self) -> str:
        if not self.attempted:
            return f"{self.name}: not attempted yet (the function still raises NotImplementedError)"
        if self.passed:
            return f"{self.name}: correct on every case"
        lines = [f"{self.name}: {len(self.failures)} case(s) differ from the reference"]
        lines += [f"  {case!r}: you returned {got!r}, expected {exp!r}" for case, got, exp in self.failures]
        return "\n".join(lines)


def same(got: Any, expected: Any, rel_tol: float = 0.0) -> bool:
    """Whether ``got`` equals ``expected``: floats within ``rel_tol`` (relative), sequences element by
    element, everything else by ``==``."""
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(expected), rel_tol=rel_tol)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(same(g, e, rel_tol) for g, e in zip(got, expected))
    return got == expected


def check(name: str, student: Callable[..., Any], reference: Callable[..., Any], cases: Sequence[tuple],
          rel_tol: float = 0.0, verbose: bool = True) -> ExerciseResult:
    """Run ``student(*case)`` and ``reference(*case)`` on every case in ``cases``; print and return the result.

    ``cases``: a non-empty sequence of argument tuples. ``rel_tol``: relative tolerance for float answers
    (0 = exact). An exception raised by the student's function on a case counts as a wrong answer (shown as
    the exception), except ``NotImplementedError``, which means "not attempted". Raises ``TypeError`` when
    ``cases`` is empty or ``student`` / ``reference`` is not callable.
    """
    if not callable(student) or not callable(reference):
        raise TypeError(f"check({name!r}): student and reference must be callables, got "
                        f"{type(student).__name__} and {type(reference).__name__}")
    if not cases:
        raise TypeError(f"check({name!r}): needs at least one case")
    failures = []
    for case in cases:
        expected = reference(*case)
        try:
            got = student(*case)
        except NotImplementedError:
            result = ExerciseResult(name, attempted=False, passed=False)
            break
        except Exception as e:  # the student's bug is an answer, shown as such
            got = f"{type(e).__name__}: {e}"
        if not same(got, expected, rel_tol):
            failures.append((case, got, expected))
    else:
        result = ExerciseResult(name, attempted=True, passed=not failures, failures=failures[:3])
    if verbose:
        print(result)
    return result
