"""Where a benchmark writes, and when it may replace a recording (issue 14).

* Without ``--record`` a run writes under ``build/`` (git-ignored), so a smoke
  run never touches ``data/``.
* ``--record`` writes under ``data/`` (``tqlab.core.provenance.DATA_DIR``), the
  recordings notebooks show. A destination inside ``data/`` that already holds
  a recording is replaced only by a run of at least as many iterations as the
  recording holds; ``--force`` replaces it anyway. The check runs before the
  benchmark, so a refused run costs nothing. An explicit ``--out-dir``/``--out``
  wins over both defaults; the check applies whenever the file is in ``data/``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from tqlab.core.provenance import DATA_DIR

__all__ = ["BUILD_DIR", "add_record_arguments", "default_dir", "overwrite_refusal"]

BUILD_DIR = DATA_DIR.parent / "build"
"""Scratch output of benchmark runs that are not recordings (git-ignored)."""


def add_record_arguments(ap: argparse.ArgumentParser) -> None:
    """Add ``--record`` and ``--force`` to a benchmark's parser."""
    ap.add_argument("--record", action="store_true",
                    help=f"write the recording under {DATA_DIR.name}/ (default: {BUILD_DIR.name}/)")
    ap.add_argument("--force", action="store_true",
                    help="replace a recording in data/ even if it holds more iterations than this run")


def default_dir(args: argparse.Namespace) -> Path:
    """``data/`` with ``--record``, else ``build/``."""
    return DATA_DIR if args.record else BUILD_DIR


def _in_data_dir(path: Path) -> bool:
    try:
        path.resolve().relative_to(DATA_DIR.resolve())
        return True
    except ValueError:
        return False


def overwrite_refusal(path: Path | str, planned: int, held: Callable[[dict[str, Any]], int], *,
                      force: bool, unit: str = "iterations") -> str | None:
    """Why a run of ``planned`` iterations may not replace the recording at ``path``, or None if it may.

    ``held(data)`` counts the iterations of an existing recording (its parsed
    JSON). Only files inside ``data/`` are protected; ``force`` lifts the
    check. A recording whose count cannot be read is protected too.
    """
    path = Path(path)
    if force or not path.is_file() or not _in_data_dir(path):
        return None
    try:
        count = int(held(json.loads(path.read_text(encoding="utf-8"))))
    except (ValueError, TypeError, KeyError, AttributeError, OSError) as e:
        return (f"refusing to replace {path}: cannot tell how many {unit} it holds ({type(e).__name__}: {e}); "
                f"pass --force to replace it")
    if planned < count:
        return (f"refusing to replace {path} ({count} {unit}) with a run of {planned} {unit}; "
                f"pass --force to replace it, or leave out --record to write under {BUILD_DIR.name}/")
    return None
