"""Notebooks 05-10 end with code-checked exercises: the solution each shows (collapsed) passes its own check,
and an unsolved stub is reported as not attempted. The references live in tqlab.lab.solutions.nbNN."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from tqlab.lab.exercises import check

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {f"{n:02d}": next((ROOT / "notebooks").glob(f"{n:02d}_*.ipynb")) for n in range(5, 11)}


def _exercise_cells(path: Path):
    """The exercise code cell and the solutions cell; they must be the notebook's last two cells."""
    cells = nbformat.read(str(path), as_version=4).cells
    i = max(k for k, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    assert i + 3 == len(cells), f"{path.name}: the exercises are not the end of the notebook"
    return cells[i + 1], cells[i + 2]


@pytest.mark.parametrize("nb", sorted(NOTEBOOKS))
def test_exercises_end_the_notebook_and_the_shown_solution_passes(nb):
    code, details = _exercise_cells(NOTEBOOKS[nb])
    stubs = re.findall(r"^def (\w+)\(", code.source, re.M)
    assert 3 <= len(stubs) <= 5 and code.source.count("raise NotImplementedError") == len(stubs)
    assert details.source.startswith("<details>") and details.source.rstrip().endswith("</details>")
    (solution,) = re.findall(r"```python\n(.*?)```", details.source, re.S)
    ref = importlib.import_module(f"tqlab.lab.solutions.nb{nb}")
    assert sorted(ref.CASES) == sorted(stubs)
    env: dict = {}
    exec(compile(solution, f"notebook {nb} solution", "exec"), env)  # the notebook's own solution text
    for name in stubs:
        result = check(name, env[name], getattr(ref, name), ref.CASES[name], rel_tol=1e-9, verbose=False)
        assert result.passed, (name, result.failures)
        unsolved = check(name, lambda *a: (_ for _ in ()).throw(NotImplementedError()), getattr(ref, name),
                         ref.CASES[name], verbose=False)
        assert not unsolved.attempted


def test_a_wrong_answer_is_caught():
    from tqlab.lab.solutions import nb10

    r = check("slot_after", lambda calls: sum(calls), nb10.slot_after, nb10.CASES["slot_after"], verbose=False)
    assert r.attempted and not r.passed and r.failures[0] == (((1000, 300),), 1300, 1024)
