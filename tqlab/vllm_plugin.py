"""tqlab's vLLM general plugin: trace every rank's workspace when ``TQLAB_VLLM_TRACE=DIR`` is set.

Registered in ``pyproject.toml`` under the entry-point group ``vllm.general_plugins``
(name ``tqlab_trace``). vLLM 0.33 imports this module and calls :func:`register` in every
process it starts (``vllm/plugins/__init__.py`` ``load_general_plugins``: the front end,
the engine core, each worker). Without ``TQLAB_VLLM_TRACE`` the call returns at once:
this module imports only :mod:`os`, and nothing of vLLM or torch is touched or patched.
With it, :func:`tqlab.vllm.trace_record.start_tracing` writes ``DIR/<host>-<pid>.json``
for each process that creates a ``WorkspaceManager``; read them with
``tqlab trace-report DIR``.
"""

from __future__ import annotations

import os

TRACE_ENV = "TQLAB_VLLM_TRACE"  # tqlab.vllm.trace_record.TRACE_ENV (a test holds them equal; this module imports only os)


def register() -> None:
    """vLLM's plugin hook: start tracing into ``$TQLAB_VLLM_TRACE`` if set, else do nothing."""
    trace_dir = os.environ.get(TRACE_ENV, "")
    if not trace_dir:
        return
    from tqlab.vllm.trace_record import start_tracing

    start_tracing(trace_dir)
