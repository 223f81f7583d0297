"""Parity harness: vLLM's own classes vs tqlab's, on this CPU box.

Runs only with vLLM importable (the separate venv made by parity/install.sh).
Without vLLM the whole folder is skipped with a message, unless
PARITY_REQUIRE_VLLM=1 (set by parity/run.sh), which turns that into an error.

For the whole session, ``tqlab.vllm.vllm_cpu_patches()`` is active:
``torch.accelerator.empty_cache`` is a no-op (vLLM 0.33's WorkspaceManager
calls it on every growth and a CPU-only torch raises) and, without Triton,
``turboquant_attn.triton`` gains a ``next_power_of_2``. Nothing else of vLLM is
changed, and tqlab itself never patches anything outside this harness.

``--parity-record PATH`` writes every test's outcome plus the values tests
passed to the ``record`` fixture to PATH as JSON, with provenance
(see parity/README.md and data/parity_results.json).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE = os.environ.get("PARITY_REQUIRE_VLLM", "0") not in ("", "0")

if not HAVE_VLLM:
    if REQUIRE:
        raise pytest.UsageError(
            "PARITY_REQUIRE_VLLM=1 but vllm is not importable: run `bash parity/install.sh` "
            "and use .venv-parity/bin/python"
        )
    collect_ignore_glob = ["test_*.py"]

try:  # hypothesis profile: reproducible in CI
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "parity",
        derandomize=True,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    settings.load_profile(os.environ.get("PARITY_HYPOTHESIS_PROFILE", "parity"))
except ImportError:  # pragma: no cover
    pass


def pytest_addoption(parser):
    parser.addoption("--parity-record", default=None, help="write outcomes + recorded values to this JSON file")


_RECORDS: dict[str, object] = {}
_OUTCOMES: dict[str, str] = {}


@pytest.fixture(scope="session", autouse=True)
def _vllm_on_cpu():
    """vLLM's modules on a CPU-only torch, for the whole session (see module docstring)."""
    if not HAVE_VLLM:
        yield
        return
    from tqlab.vllm import vllm_cpu_patches

    with vllm_cpu_patches():
        yield


@pytest.fixture
def record(request):
    """``record(key, value)``: keep a JSON-able value for data/parity_results.json."""

    def _record(key: str, value: object) -> None:
        _RECORDS[f"{request.node.name}:{key}" if ":" not in key else key] = value

    return _record


@pytest.fixture
def vws():
    """vLLM's workspace module, with its global manager reset before and after."""
    import vllm.v1.worker.workspace as ws

    ws.reset_workspace_manager()
    yield ws
    ws.reset_workspace_manager()


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _OUTCOMES[report.nodeid] = report.outcome


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--parity-record")
    if not path or not HAVE_VLLM:
        return
    import torch

    from tqlab.vllm import vllm_version

    counts: dict[str, int] = {}
    for outcome in _OUTCOMES.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    # the code the results depend on: this folder and the tqlab modules it compares
    dirty = _git(
        "status", "--porcelain", "--", "parity", "tqlab/core/workspace.py", "tqlab/core/workspace_slots.py",
        "tqlab/core/workspace_layout.py", "tqlab/core/reservation.py",
        "tqlab/core/config.py", "tqlab/predict/analysis.py", "tqlab/vllm", "tqlab/attention", "data/presets",
    )
    data = {
        # the keys of tqlab.core.provenance.PROVENANCE_KEYS (device, date, commit, command, torch) + vLLM's
        "provenance": {
            "device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
            "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "commit": _git("rev-parse", "HEAD") or "unknown",
            "command": os.environ.get("PARITY_COMMAND", "pytest " + " ".join(sys.argv[1:])),
            "torch": torch.__version__,
            "vllm": vllm_version() or "unknown",
            "python": platform.python_version(),
            "tree_dirty": "yes" if dirty else "no",
            "install_seconds": os.environ.get("PARITY_INSTALL_SECONDS", "unknown"),
        },
        "summary": counts,
        "exitstatus": int(exitstatus),
        "tests": dict(sorted(_OUTCOMES.items())),
        "records": dict(sorted(_RECORDS.items())),
    }
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
