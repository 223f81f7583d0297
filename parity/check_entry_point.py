"""Exit 0 when tqlab's ``vllm.general_plugins`` entry point is installed in this interpreter's environment.

Run it isolated and from outside the repository, as ``parity/install.sh`` does::

    (cd "$(mktemp -d)" && .venv-parity/bin/python -I parity/check_entry_point.py)

``-I`` keeps the working directory, the script's folder and ``PYTHONPATH`` off ``sys.path``:
a ``tqlab.egg-info`` in the repository root (left by an editable install into another venv)
must not stand in for an install into this one (issue 33: the old check passed only because
the repository root was on ``sys.path``). vLLM 0.33 finds plugins the same way:
``vllm/plugins/__init__.py`` ``load_plugins_by_group`` -> ``importlib.metadata.entry_points``.
Prints one line: where the entry point and ``tqlab`` come from, or why it is missing (exit 1).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

GROUP, NAME = "vllm.general_plugins", "tqlab_trace"


def main() -> int:
    here = os.getcwd()
    if not sys.flags.isolated or "" in sys.path or here in sys.path:
        print(f"check_entry_point: run it with python -I from outside the repository (now in {here})")
        return 2
    eps = [e for e in entry_points(group=GROUP) if e.name == NAME]
    if not eps:
        print(f"tqlab's {GROUP} entry point {NAME!r} is not installed in {sys.prefix}")
        return 1
    try:
        register = eps[0].load()  # imports tqlab.vllm_plugin: it imports only os
    except Exception as e:  # a stale editable install pointing at a removed checkout
        print(f"{NAME} = {eps[0].value} is installed in {sys.prefix} but does not load: {type(e).__name__}: {e}")
        return 1
    mod = sys.modules[register.__module__]
    print(f"{NAME} = {eps[0].value} -> {mod.__file__} (installed in {sys.prefix})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
