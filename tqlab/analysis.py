"""The one analysis of a deployment: what gets locked, and which prompt is the first to fail.

Everything here is computed from an :class:`~tqlab.config.EngineConfig` and the
consumers' shape functions in :mod:`tqlab.reservation`; the engine, ``tqlab repro``,
``tqlab plan``, ``tqlab inspect-vllm``, the planner widget and the notebooks all call
these functions, so their answers cannot drift apart. Bytes everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    _check_config,
    _pos_int,
    chunk_workspace_request,
    decode_workspace_shapes,
)
from .workspace import compute_layout

if TYPE_CHECKING:  # pragma: no cover
    from .config import EngineConfig

__all__ = ["first_failing_prompt", "prompt_chunks", "unfixed_locked_bytes", "workspace_bytes_for_prompt"]


def unfixed_locked_bytes(config: "EngineConfig") -> int:
    """Bytes per ubatch slot tqlab's engine locks *without* the fix (vLLM 0.20's start-up).

    The profile run's fresh prefill touches no workspace; CUDA graph capture runs
    split-KV decode at every bucket, the largest being ``max(config.capture_sizes())``
    rows, so the lock freezes :func:`decode_workspace_shapes` at that batch.
    0 with ``enforce_eager`` (nothing captured). The bug report's deployment:
    268,544 bytes ("0.26 MB"). (``tqlab.vllm_trace.locked_bytes_without_fix``
    models vLLM's eager warm-up, which still decodes at ``max_num_seqs``.)
    """
    if config.enforce_eager:
        return 0
    shapes = decode_workspace_shapes(
        max(config.capture_sizes()), config.num_heads_per_rank, config.head_dim,
        config.tq_max_kv_splits_for_cuda_graph, config.dtype,
    )
    return compute_layout(shapes).total_bytes




def prompt_chunks(prompt_tokens: int, max_num_batched_tokens: int) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` of each prefill chunk of a request running alone.

    With chunked prefill, each step takes at most ``max_num_batched_tokens`` tokens.
    """
    n = _pos_int("prompt_tokens", prompt_tokens)
    m = _pos_int("max_num_batched_tokens", max_num_batched_tokens)
    return [(start, min(m, n - start)) for start in range(0, n, m)]


def workspace_bytes_for_prompt(config: "EngineConfig", prompt_tokens: int) -> int:
    """Largest workspace call (bytes) a prompt of ``prompt_tokens`` makes while prefilling alone.

    Raises ``ValueError`` for a prompt shorter than 1 or longer than ``max_model_len``.
    """
    _check_config(config)
    _pos_int("prompt_tokens", prompt_tokens)
    if prompt_tokens > config.max_model_len:
        raise ValueError(f"prompt_tokens {prompt_tokens} exceeds max_model_len {config.max_model_len}")
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else prompt_tokens
    return max(
        (chunk_workspace_request(config, c, q).nbytes for c, q in prompt_chunks(prompt_tokens, budget)),
        default=0,
    )


def first_failing_prompt(config: "EngineConfig", locked_bytes: int) -> int | None:
    """The shortest prompt whose prefill needs more than ``locked_bytes``, or None if none up to ``max_model_len``.

    Every prompt shorter than the returned length survives a workspace locked at
    ``locked_bytes``. Exact, without simulating every length: within the region
    of the ``k``-th chunk the need is the larger of the earlier full chunks'
    and the last chunk's, and the last chunk's is monotone in ``q_len`` up to
    128 (no workspace call in vLLM 0.33, but kept general) and constant above
    (dequant buffers for ``cached_len``). Raises ``ValueError`` for a negative
    or non-int ``locked_bytes``.
    """
    _check_config(config)
    _pos_int("locked_bytes", locked_bytes, 0)
    if not config.enable_chunked_prefill:
        return None
    m = config.max_num_batched_tokens
    prefix_need = 0
    for start in range(m, config.max_model_len, m):
        # region: prompts of start+1 .. start+m tokens; last chunk has cached=start
        if prefix_need > locked_bytes:
            return start + 1
        top = min(m, config.max_model_len - start)
        lo, hi = 1, min(top, CONTINUATION_DECODE_THRESHOLD)
        if chunk_workspace_request(config, start, hi).nbytes > locked_bytes:
            while lo < hi:  # smallest q in [1, hi] that does not fit
                mid = (lo + hi) // 2
                if chunk_workspace_request(config, start, mid).nbytes > locked_bytes:
                    hi = mid
                else:
                    lo = mid + 1
            return start + lo
        if top > CONTINUATION_DECODE_THRESHOLD and (
            chunk_workspace_request(config, start, CONTINUATION_DECODE_THRESHOLD + 1).nbytes > locked_bytes
        ):
            return start + CONTINUATION_DECODE_THRESHOLD + 1
        prefix_need = max(prefix_need, chunk_workspace_request(config, start, m).nbytes)
    return None
