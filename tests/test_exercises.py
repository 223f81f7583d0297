"""tqlab.lab.exercises: the code-checked exercises at the end of each notebook."""

import pytest

from tqlab.lab.exercises import check, same


def _ref(a, b):
    return a * b


def test_unsolved_exercise_is_not_attempted(capsys):
    def student(a, b):
        raise NotImplementedError

    r = check("mul", student, _ref, [(2, 3)])
    assert (r.attempted, r.passed, r.failures) == (False, False, [])
    assert "not attempted yet" in capsys.readouterr().out


def test_correct_and_wrong_answers():
    assert check("mul", lambda a, b: b * a, _ref, [(2, 3), (0, 5)], verbose=False).passed
    r = check("mul", lambda a, b: a + b, _ref, [(2, 2), (2, 3), (1, 1)], verbose=False)
    assert r.attempted and not r.passed
    assert r.failures == [((2, 3), 5, 6), ((1, 1), 2, 1)]


def test_student_exception_is_an_answer():
    r = check("mul", lambda a, b: a / 0, _ref, [(1, 1)], verbose=False)
    assert r.failures == [((1, 1), "ZeroDivisionError: division by zero", 1)]


def test_float_tolerance():
    assert same(1.0, 1.0 + 1e-12, rel_tol=1e-9) and not same(1.0, 1.1, rel_tol=1e-9)
    assert not same(1.0, 1.0 + 1e-12)  # exact by default
    assert same([1, (2.0, 3)], (1, [2.0, 3])) and not same([1, 2], [1, 2, 3])


def test_malformed_exercise_raises():
    with pytest.raises(TypeError, match="at least one case"):
        check("x", _ref, _ref, [])
    with pytest.raises(TypeError, match="callables"):
        check("x", 3, _ref, [(1, 2)])
