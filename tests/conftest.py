"""Shared pytest set-up for tqlab.

- Hypothesis profiles without deadlines: tests assert behaviour, never speed,
  and the 2-core CI box must not turn a slow example into a failure.
  ``ci`` (used when ``CI`` is set) is derandomized so CI runs are repeatable.
- ``@pytest.mark.gpu`` tests are skipped, with a reason, when CUDA is absent.
- Notebooks collected by nbmake run in a kernel that is *this* interpreter:
  the venv's ``tqlab`` kernel when it is registered here, else ``python3``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("dev", deadline=None)
    settings.register_profile(
        "ci",
        deadline=None,
        derandomize=True,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
except ImportError:  # hypothesis is in the `test` extra; tests that need it import it themselves
    pass


def _notebook_kernel() -> str:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tools.run_notebooks import resolve_kernel

    errors = []
    for name in ("tqlab", "python3"):
        try:
            return resolve_kernel(name)[0]
        except ValueError as exc:
            errors.append(str(exc))
    raise pytest.UsageError("no Jupyter kernel runs this interpreter:\n  " + "\n  ".join(errors))


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "nbmake", False) and not getattr(config.option, "nbmake_kernel", None):
        config.option.nbmake_kernel = _notebook_kernel()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    try:
        import torch

        lines.append(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    except ImportError:
        lines.append("torch: not importable")
    if getattr(config.option, "nbmake", False):
        lines.append(f"notebook kernel: {config.option.nbmake_kernel}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]  # not item.keywords: it holds folder names
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
