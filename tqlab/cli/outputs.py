"""Where ``--json FILE`` may write: never over the project's data, never over a trace record, and over an existing
file only with ``--force`` (``plan``, ``inspect-vllm``, ``trace-report``).

Checked before any work, so a refused path costs nothing and changes nothing. The rules:

* a path under the repository's ``data/`` (:data:`tqlab.core.provenance.DATA_DIR`: presets, recorded runs, trace
  folders) is refused, ``--force`` or not -- a report written over ``data/presets/llama-3.1-8b.json`` made
  ``plan --preset llama-3.1-8b`` fail (issue 33);
* a ``*.json`` in a trace folder -- the folder given to ``trace-report``, or a folder holding a tqlab trace record
  (:data:`tqlab.vllm.trace_record.RECORD_FORMAT` in its first 4 KiB) -- is refused, ``--force`` or not: the report
  would be read back as a rank's record, or replace one;
* any other existing file is refused unless ``--force``; a folder, or a path in a missing folder, is refused.

Symbolic links are resolved first (a link into ``data/`` is ``data/``). ``-`` (standard output) is always allowed.
"""

from __future__ import annotations

import stat
from pathlib import Path

import click

__all__ = ["FORCE_HELP", "check_json_path", "force_option"]

FORCE_HELP = "let --json replace an existing file (never one under data/ or a trace record)"
_RECORD_MARK = b'"format": "tqlab-vllm-trace/'
_PEEK = 4096


def force_option(f):
    """The ``--force`` flag of every command that writes ``--json``."""
    return click.option("--force", is_flag=True, default=False, help=FORCE_HELP)(f)


def _is_trace_record(path: Path) -> bool:
    """Whether ``path`` is a regular file whose first 4 KiB carry a tqlab trace record's ``format`` (a FIFO, a
    device or a link to one is not read)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return False
        with open(path, "rb") as f:
            return _RECORD_MARK in f.read(_PEEK)
    except OSError:
        return False


def _in_trace_folder(target: Path, trace_dir: Path | None) -> bool:
    if trace_dir is not None and target.parent == trace_dir:
        return True
    try:
        return any(_is_trace_record(p) for p in target.parent.glob("*.json") if p != target)
    except OSError:
        return False


def check_json_path(json_path: str | None, *, force: bool, trace_dir: str | None = None) -> None:
    """Refuse a ``--json`` path by the rules above (``click.BadParameter``, one line naming the path and why).

    ``trace_dir``: ``trace-report``'s folder (its ``*.json`` are the records it reads).
    """
    from tqlab.core.provenance import DATA_DIR

    if json_path is None or json_path == "-":
        return
    if not json_path.strip():  # Path("") is the working folder: "is a folder" would name no path at all
        raise click.BadParameter(f"{json_path!r} is no file name; give a file, or '-' for standard output",
                                 param_hint="--json")
    p = Path(json_path)
    target = p.resolve()
    if p.is_dir():
        raise click.BadParameter(f"{json_path} is a folder; give a file name", param_hint="--json")
    if not target.parent.is_dir():
        raise click.BadParameter(f"{json_path}: folder {target.parent} does not exist", param_hint="--json")
    if target.is_relative_to(DATA_DIR.resolve()):
        raise click.BadParameter(f"{json_path} is under the project's data/ ({DATA_DIR}): presets and recorded "
                                 "runs are never overwritten; write the report elsewhere", param_hint="--json")
    tdir = None if trace_dir is None else Path(trace_dir).resolve()
    if target.suffix == ".json" and _in_trace_folder(target, tdir):
        raise click.BadParameter(f"{json_path} is in a trace folder ({target.parent}): the report would replace or "
                                 "join its ranks' records; write it elsewhere", param_hint="--json")
    if target.exists() and not force:
        raise click.BadParameter(f"{json_path} exists; pass --force to replace it", param_hint="--json")
