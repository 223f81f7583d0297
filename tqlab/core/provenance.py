"""Recorded results on disk: ``data/<name>.json`` files that carry their provenance.

Some numbers only exist on a GPU (CUDA graph replay latency,
``torch.cuda.max_memory_allocated``); they are measured once and stored as::

    {"provenance": {"device": "NVIDIA H200", "date": "2026-11-29T07:30:00+00:00",
                    "commit": "<git sha>", "command": "python benchmarks/...",
                    "torch": "2.11.0+cu130"},
     ...the results...}

This core module reads, validates and writes those files (no display code), so
the lower layers (``tqlab.vllm``, ``benchmarks/``) can load recordings;
the notebooks use :mod:`tqlab.lab.recorded`, which adds the banner and
``pick_device`` on top. Nothing here imports CUDA-only code; :func:`has_cuda`
never raises.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "DATA_DIR",
    "PROVENANCE_KEYS",
    "RecordedResult",
    "git_commit",
    "has_cuda",
    "has_recorded",
    "jsonable",
    "list_recorded",
    "load_recorded",
    "make_provenance",
    "recorded_path",
    "save_recorded",
    "short_sha",
    "validate_provenance",
]

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
"""Where recorded results live (``data/*.json``; presets are in ``data/presets/``)."""

PROVENANCE_KEYS = ("device", "date", "commit", "command", "torch")
"""Every recording names the device, date, git commit, command and torch version it came from."""


# --------------------------------------------------------------------------- #
# Environment                                                                 #
# --------------------------------------------------------------------------- #


def has_cuda() -> bool:
    """True when torch is importable and ``torch.cuda.is_available()``; never raises."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, broken driver, ...: no CUDA
        return False


# --------------------------------------------------------------------------- #
# Provenance                                                                  #
# --------------------------------------------------------------------------- #


def validate_provenance(provenance: object) -> dict[str, str]:
    """Check a provenance object and return it as a ``dict`` of strings.

    Raises:
        TypeError: ``provenance`` is not a mapping.
        ValueError: a key of :data:`PROVENANCE_KEYS` is missing or empty
            (the message lists every such key).
    """
    if not isinstance(provenance, Mapping):
        raise TypeError(f"provenance must be a mapping with keys {PROVENANCE_KEYS}, got {type(provenance).__name__}")
    missing = [k for k in PROVENANCE_KEYS if k not in provenance]
    empty = [k for k in PROVENANCE_KEYS if k in provenance and str(provenance[k]).strip() == ""]
    if missing or empty:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if empty:
            parts.append(f"empty {', '.join(empty)}")
        raise ValueError(f"provenance is incomplete ({'; '.join(parts)}); it needs {', '.join(PROVENANCE_KEYS)}")
    out = {k: str(v) for k, v in provenance.items()}
    return out


def git_commit(repo: Path | str | None = None) -> str:
    """``git rev-parse HEAD`` of ``repo`` (default: this checkout), or ``"unknown"`` outside git; never raises."""
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo or DATA_DIR.parent, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = res.stdout.strip()
    return sha if res.returncode == 0 and sha else "unknown"


def _device_name(device: str | None) -> str:
    if device is not None:
        return device
    if has_cuda():
        import torch

        return torch.cuda.get_device_name(torch.cuda.current_device())
    return f"CPU ({platform.processor() or platform.machine() or 'unknown'})"


def make_provenance(
    command: str, *, device: str | None = None, commit: str | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """A provenance object for a result measured right now by ``command``.

    ``device`` defaults to the CUDA device name (or ``"CPU (<arch>)"``),
    ``commit`` to ``git rev-parse HEAD`` of this checkout (``"unknown"`` outside
    git), the date is the current UTC time in ISO 8601, ``torch`` is
    ``torch.__version__``; ``extra`` adds keys (e.g. ``cuda``, ``python``), which
    :func:`validate_provenance` keeps. Raises ``ValueError`` for an empty command.
    """
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"command must be the non-empty command line that produced the result, got {command!r}")
    import torch

    return {
        "device": _device_name(device),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "commit": commit if commit is not None else (os.environ.get("TQLAB_COMMIT") or git_commit()),
        "command": command,
        "torch": torch.__version__,
        **{str(k): str(v) for k, v in (extra or {}).items()},
    }


# --------------------------------------------------------------------------- #
# Files                                                                       #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class RecordedResult:
    """One recorded result file.

    Attributes:
        name: file stem (``data/<name>.json``).
        path: the file.
        provenance: the validated provenance (device, date, commit, command, torch).
        data: the whole JSON object (``data["provenance"]`` included).
    """

    name: str
    path: Path
    provenance: dict[str, str]
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"recorded result name must be a plain file stem such as 'growth_peak_cuda', got {name!r}")
    return name.removesuffix(".json")


def recorded_path(name: str, data_dir: Path | str | None = None) -> Path:
    """``<data_dir>/<name>.json`` (``data_dir`` defaults to :data:`DATA_DIR`)."""
    return Path(data_dir or DATA_DIR) / f"{_check_name(name)}.json"


def list_recorded(data_dir: Path | str | None = None) -> list[str]:
    """Names of the recorded results (``*.json`` directly in ``data_dir``, presets excluded), sorted."""
    d = Path(data_dir or DATA_DIR)
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if p.is_file())


def has_recorded(name: str, data_dir: Path | str | None = None) -> bool:
    """True when ``data/<name>.json`` exists."""
    return recorded_path(name, data_dir).is_file()


def load_recorded(name: str, data_dir: Path | str | None = None) -> RecordedResult:
    """Load ``data/<name>.json`` and validate its ``provenance`` object.

    Raises:
        FileNotFoundError: no such file (the message lists the recordings there are).
        ValueError: the file is not a JSON object, or has no complete provenance.
    """
    path = recorded_path(name, data_dir)
    if not path.is_file():
        known = ", ".join(list_recorded(data_dir)) or "none"
        raise FileNotFoundError(f"no recorded result {path.name!r} in {path.parent} (recorded results: {known})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object with a 'provenance' key, got {type(data).__name__}")
    if "provenance" not in data:
        raise ValueError(f"{path} has no 'provenance' object (it needs {', '.join(PROVENANCE_KEYS)})")
    try:
        prov = validate_provenance(data["provenance"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return RecordedResult(path.stem, path, prov, data)


def save_recorded(
    name: str, results: Mapping[str, Any], provenance: Mapping[str, Any], data_dir: Path | str | None = None
) -> Path:
    """Write ``{"provenance": provenance, **results}`` to ``data/<name>.json`` and return the path.

    ``provenance`` is validated first (see :func:`make_provenance`); ``results``
    must not have its own ``provenance`` key. Raises ``ValueError``/``TypeError``
    before writing anything.
    """
    prov = validate_provenance(provenance)
    if not isinstance(results, Mapping):
        raise TypeError(f"results must be a mapping, got {type(results).__name__}")
    if "provenance" in results:
        raise ValueError("results must not contain a 'provenance' key; pass it as provenance=")
    payload = {"provenance": prov, **results}
    text = json.dumps(payload, indent=2, sort_keys=False) + "\n"  # fails before touching the file
    path = recorded_path(name, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def jsonable(obj: Any) -> Any:
    """``obj`` with dict keys turned into strings and floats NaN/inf into strings, for ``json.dumps``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def short_sha(commit: str) -> str:
    """A 40-hex commit shortened to its first 12 characters; anything else unchanged."""
    c = commit.strip()
    if len(c) == 40 and all(ch in "0123456789abcdefABCDEF" for ch in c):
        return c[:12]
    return c
