"""An on-disk cache of ``tqlab inspect-vllm`` answers, so that asking again does not pay for ``import torch``.

``inspect-vllm`` is pure arithmetic on a config.json and a command line, but the modules it runs
(:mod:`tqlab.core.reservation`, :mod:`tqlab.core.workspace`) describe shapes with torch dtypes, and
``import torch`` is about 2 of its 2.5 s on a 2-core CPU box. A repeated question (the same flags, the
same config.json bytes, the same tqlab sources and data, the same ``VLLM_*`` / ``TQLAB_*`` environment,
the same installed vLLM) gets the stored report back in a few milliseconds without importing torch.

The key covers every input the report reads: the command's parameters, the bytes of each named file,
a fingerprint of tqlab's own package and ``data/`` files (path, size, mtime), the environment variables
whose name starts with ``VLLM_`` or ``TQLAB_``, the Python version and vLLM's installed version. Anything
unreadable disables the cache for that call (the answer is computed). ``TQLAB_NO_CACHE=1`` turns it off;
``TQLAB_CACHE_DIR`` moves it (default ``$XDG_CACHE_HOME/tqlab`` or ``~/.cache/tqlab``). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

__all__ = ["cache_dir", "key", "load", "store"]

_ROOT = Path(__file__).resolve().parent
_DATA = _ROOT.parent / "data"
_SOURCE_SUFFIXES = (".py", ".json")


def cache_dir() -> Path | None:
    """Where answers are stored, or None when ``TQLAB_NO_CACHE`` is set (to anything but ``0`` or empty)."""
    if os.environ.get("TQLAB_NO_CACHE", "") not in ("", "0"):
        return None
    base = os.environ.get("TQLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tqlab")
    return Path(base) / "inspect-vllm"


def _fingerprint(h: "hashlib._Hash") -> None:
    """Every tqlab source/data file's (relative path, size, mtime): a change anywhere makes a new key."""
    for top in (_ROOT, _DATA / "presets"):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(_SOURCE_SUFFIXES):
                    st = os.stat(os.path.join(dirpath, name))
                    h.update(f"{os.path.relpath(os.path.join(dirpath, name), top)}|{st.st_size}|{st.st_mtime_ns}\n"
                             .encode())


def _file_bytes(path: str) -> bytes:
    p = Path(path)
    return (p / "config.json").read_bytes() if p.is_dir() else p.read_bytes()


def key(command: str, params: dict[str, Any], files: Iterable[str | None] = ()) -> str | None:
    """The cache key of one call (a hex digest), or None when caching is off or an input cannot be read."""
    if cache_dir() is None:
        return None
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            vllm = version("vllm")
        except PackageNotFoundError:
            vllm = None
        h = hashlib.sha256()
        env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "TQLAB_")) and k != "TQLAB_CACHE_DIR"}
        h.update(json.dumps([command, params, env, sys.version, vllm], sort_keys=True, default=str).encode())
        for f in files:
            if f is not None:
                h.update(hashlib.sha256(_file_bytes(f)).digest())
        _fingerprint(h)
        return h.hexdigest()
    except (OSError, ValueError):
        return None


def load(k: str | None) -> dict[str, Any] | None:
    """The stored answer for key ``k``, or None (no key, not stored, unreadable)."""
    d = cache_dir()
    if k is None or d is None:
        return None
    try:
        obj = json.loads((d / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def store(k: str | None, answer: dict[str, Any]) -> None:
    """Store ``answer`` (JSON types) under key ``k``; errors are ignored (the cache is only a shortcut)."""
    d = cache_dir()
    if k is None or d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(answer, default=str))
        os.replace(tmp, d / f"{k}.json")
    except (OSError, TypeError, ValueError):
        return
