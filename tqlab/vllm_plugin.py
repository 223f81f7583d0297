"""tqlab's vLLM general plugin: trace every rank's workspace when ``TQLAB_VLLM_TRACE=DIR`` is set.

Registered in ``pyproject.toml`` under the entry-point group ``vllm.general_plugins``
(name ``tqlab_trace``). vLLM 0.33 imports this module and calls :func:`register` in every
process it starts (``vllm/plugins/__init__.py`` ``load_general_plugins``: the front end,
the engine core, each worker). Without ``TQLAB_VLLM_TRACE`` the call returns at once:
this module imports only :mod:`os`, and nothing of vLLM or torch is touched or patched.
With it, :func:`tqlab.vllm.trace_record.start_tracing` writes ``DIR/<host>-<pid>.json``
for each process that creates a ``WorkspaceManager``; read them with
``tqlab trace-report DIR``.

With ``TQLAB_VLLM_DECODE=1`` (off by default) :func:`serve_tqlab_decode` makes vLLM's TurboQuant backend decode
with tqlab's kernel instead of its own (same signature, same cache tensor: :mod:`tqlab.turboquant.vllm_decode`).
"""

from __future__ import annotations

import os

TRACE_ENV = "TQLAB_VLLM_TRACE"  # tqlab.vllm.trace_record.TRACE_ENV (a test holds them equal; this module imports only os)
DECODE_ENV = "TQLAB_VLLM_DECODE"  # "1": vLLM's TurboQuant backend decodes with tqlab's kernel; unset / "0": vLLM's own


def register() -> None:
    """vLLM's plugin hook: serve tqlab's decode if ``$TQLAB_VLLM_DECODE`` is 1 (:func:`serve_tqlab_decode`), start
    tracing into ``$TQLAB_VLLM_TRACE`` if set; with neither, do nothing."""
    serve_tqlab_decode()
    trace_dir = os.environ.get(TRACE_ENV, "")
    if not trace_dir:
        return
    from tqlab.vllm.trace_record import start_tracing

    start_tracing(trace_dir)


def serve_tqlab_decode() -> bool:
    """If ``$TQLAB_VLLM_DECODE`` is ``"1"``: rebind the name ``triton_turboquant_decode_attention`` in vLLM 0.33's
    ``vllm.v1.attention.backends.turboquant_attn`` (the module global that ``TurboQuantAttentionImpl._decode_attention``
    and the short-continuation branch of ``_prefill_attention`` call) to
    :func:`tqlab.turboquant.vllm_decode.triton_turboquant_decode_attention`, which takes the same arguments, reads the
    same ``(num_blocks, block_size, Hk, slot_size_aligned)`` cache and fills the same split buffers.  The FlyDSL / SoA
    paths (ROCm) and vLLM's store and continuation dequant are left as they are.  Returns whether it rebound.

    Raises:
        ValueError: ``$TQLAB_VLLM_DECODE`` set to anything but ``""``, ``"0"`` or ``"1"`` (nothing is patched)."""
    flag = os.environ.get(DECODE_ENV, "")
    if flag in ("", "0"):
        return False
    if flag != "1":
        raise ValueError(f"{DECODE_ENV} must be 1 (serve tqlab's decode) or 0 / unset (vLLM's own), got {flag!r}")
    import vllm.v1.attention.backends.turboquant_attn as tq_backend

    from tqlab.turboquant.vllm_decode import triton_turboquant_decode_attention

    tq_backend.triton_turboquant_decode_attention = triton_turboquant_decode_attention
    return True
