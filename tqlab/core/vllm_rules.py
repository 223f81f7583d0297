"""vLLM 0.33's start-up and scheduling rules, as functions of an :class:`~tqlab.core.config.EngineConfig`.

The engine (the simulator, :mod:`tqlab.engine`) and the predictor (:mod:`tqlab.predict`) both call
these, side by side; neither imports the other. Each function mirrors one piece of vLLM 0.33 and
names it:

* :func:`cudagraph_mode` -- ``VllmConfig`` optimization-level defaults and
  ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` (``vllm/config/vllm.py``,
  ``vllm/config/compilation.py``);
* :func:`capture_sizes` -- ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/vllm.py``) then
  ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` (``vllm/config/compilation.py``);
* :func:`decode_capture_sizes` -- ``CudagraphDispatcher.initialize_cudagraph_keys``
  (``vllm/v1/cudagraph_dispatcher.py``); :func:`decode_rows` / :func:`decode_capture_rows` /
  :func:`decode_rows_at_lock` -- ``GPUModelRunner._dummy_run(uniform_decode=True)``
  (``vllm/v1/worker/gpu_model_runner.py``);
* :func:`locks_workspace` -- ``lock_workspace()`` at the end of ``GPUModelRunner.capture_model``,
  skipped under ``enforce_eager`` by ``GPUWorker.compile_or_warm_up_model`` (``vllm/v1/worker/gpu_worker.py``);
* :func:`step_token_budget` -- ``Scheduler.schedule``'s ``token_budget`` (``vllm/v1/core/sched/scheduler.py``);
* :func:`mamba_block_aligned_split` -- ``Scheduler._mamba_block_aligned_split`` (same file).

Validation happens where a value enters (:class:`EngineConfig`, the CLI, config.json); these
functions trust their config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.config import step_token_budget
from tqlab.core.workspace_layout import cdiv, round_up

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = [
    "DEFAULT_MAX_GRAPH_SIZE",
    "FULL_DECODE_MODES",
    "capture_sizes",
    "cudagraph_mode",
    "decode_capture_rows",
    "decode_capture_sizes",
    "decode_rows",
    "decode_rows_at_lock",
    "locks_workspace",
    "mamba_block_aligned_split",
    "step_token_budget",
]

DEFAULT_MAX_GRAPH_SIZE = 512
"""vLLM's default capture ceiling (1024 on data-centre Blackwell, not modelled)."""
_MAX_CAPTURE_SIZES = 4096  # refuse to list more graphs than this (vLLM would capture each one)
FULL_DECODE_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


# --------------------------------------------------------------------------- #
# Capture                                                                     #
# --------------------------------------------------------------------------- #


def cudagraph_mode(config: "EngineConfig") -> str:
    """The CUDA graph mode vLLM 0.33 runs with: ``NONE`` under ``enforce_eager``, else the configured one.

    Default ``FULL_AND_PIECEWISE`` (``vllm/config/vllm.py`` optimization-level defaults).
    ``FULL`` is resolved as ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` does for
    TurboQuant (``AttentionCGSupport.UNIFORM_BATCH``, attention in the splitting ops):
    ``FULL_AND_PIECEWISE``.
    """
    if config.enforce_eager:
        return "NONE"
    mode = config.cudagraph_mode or "FULL_AND_PIECEWISE"
    return "FULL_AND_PIECEWISE" if mode == "FULL" else mode


def _grid(ceiling: int, first: tuple[int, ...] = (1, 2, 4)) -> list[int]:
    """1, 2, 4, multiples of 8 below 256, multiples of 16 from 256, up to ``ceiling`` (<= a few hundred)."""
    sizes = [i for i in first if i <= ceiling]
    if ceiling >= 8:
        sizes += range(8, min(ceiling + 1, 256), 8)
    if ceiling >= 256:
        sizes += range(256, ceiling + 1, 16)
    return sizes


def _uniform_decode_sizes(config: "EngineConfig", ceiling: int) -> list[int]:
    """Decode sizes ``_set_cudagraph_sizes`` appends when it computes the default ceiling itself."""
    q, seqs = config.uniform_decode_query_len, config.max_num_seqs
    if q > 1:
        reqs = min(seqs, DEFAULT_MAX_GRAPH_SIZE)  # request_counts(): at most the platform default
        counts = sorted(set([n for n in (1, 2, 4) if n <= reqs] + list(range(8, min(reqs + 1, 256), 8))
                            + list(range(256, reqs + 1, 16)) + [reqs]))
        return sorted({n * q for n in counts if n * q <= ceiling})
    return [seqs] if seqs <= ceiling else []


def _set_cudagraph_sizes(config: "EngineConfig") -> list[int]:
    """``VllmConfig._set_cudagraph_sizes`` of vLLM 0.33, before the spec-decode rounding."""
    if cudagraph_mode(config) == "NONE":
        return []
    mnt = config.max_num_batched_tokens
    ceiling, uniform = config.max_cudagraph_capture_size, []
    if ceiling is None:
        ceiling = min(config.max_num_seqs * config.uniform_decode_query_len * 2, DEFAULT_MAX_GRAPH_SIZE)
        uniform = _uniform_decode_sizes(config, ceiling)
    ceiling = min(mnt, ceiling)
    if config.cudagraph_capture_sizes is not None:
        sizes = sorted(s for s in set(config.cudagraph_capture_sizes) if s <= mnt)
    else:
        if ceiling > _MAX_CAPTURE_SIZES * 16:
            raise ValueError(
                f"max_cudagraph_capture_size {config.max_cudagraph_capture_size} would make vLLM capture "
                f"about {ceiling // 16:,} CUDA graphs; tqlab lists at most {_MAX_CAPTURE_SIZES}"
            )
        sizes = _grid(ceiling)
        if mnt <= ceiling and mnt not in sizes:
            sizes.append(mnt)
        sizes = sorted(set(sizes + [s for s in uniform if s <= mnt]))
    valid_max = sizes[-1] if sizes else 0
    if (config.max_cudagraph_capture_size is not None and config.cudagraph_capture_sizes is not None
            and config.max_cudagraph_capture_size != valid_max):
        raise ValueError(
            f"customized max_cudagraph_capture_size(={config.max_cudagraph_capture_size}) should be consistent "
            f"with the max value of cudagraph_capture_sizes(={valid_max}) (vLLM 0.33 raises the same)"
        )
    return sizes


def capture_sizes(config: "EngineConfig") -> tuple[int, ...]:
    """The token counts vLLM 0.33 captures CUDA graphs for, ascending; ``()`` when nothing is captured.

    ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/vllm.py``): default ceiling
    ``min(max_num_seqs * (1 + k) * 2, 512)``, capped by ``max_num_batched_tokens``; the list
    is 1, 2, 4, multiples of 8 below 256 and of 16 from 256 up to it, plus
    ``max_num_batched_tokens`` and the uniform-decode sizes when they fit. Explicit
    ``cudagraph_capture_sizes`` replace it, filtered by ``max_num_batched_tokens`` only
    (not by ``max_num_seqs``: ``1,2,4,8,12`` with ``max_num_seqs=4`` keeps all five).
    With FULL decode graphs and ``k > 0``, ``adjust_cudagraph_sizes_for_spec_decode``
    rounds each size up to a multiple of ``1 + k`` (dropping those above the largest).
    ``cudagraph_mode`` NONE or ``enforce_eager``: ``()``.

    Raises ``ValueError`` where vLLM 0.33 raises (inconsistent explicit sizes and
    ``max_cudagraph_capture_size``; no size left after the spec-decode rounding).
    """
    sizes = _set_cudagraph_sizes(config)
    q = config.uniform_decode_query_len
    if sizes and q > 1 and cudagraph_mode(config) in FULL_DECODE_MODES:
        top = sizes[-1]
        sizes = sorted({round_up(s, q) for s in sizes if round_up(s, q) <= top})
        if not sizes and q <= top:
            sizes = [q]
        if not sizes:
            raise ValueError(
                f"No valid cudagraph sizes after rounding to multiple of {q} (num_speculative_tokens + 1) "
                f"please adjust num_speculative_tokens ({q - 1}) or max_cudagraph_capture_size ({top})"
            )
    return tuple(sizes)


def decode_capture_sizes(config: "EngineConfig") -> tuple[int, ...]:
    """Capture sizes of the FULL uniform-decode graphs (``CudagraphDispatcher.initialize_cudagraph_keys``).

    Sizes ``s`` with ``1 + k <= s <= (1 + k) * max_num_seqs``; ``()`` for PIECEWISE or NONE.
    """
    if cudagraph_mode(config) not in FULL_DECODE_MODES:
        return ()
    q = config.uniform_decode_query_len
    return tuple(s for s in capture_sizes(config) if q <= s <= q * config.max_num_seqs)


def decode_rows(config: "EngineConfig", num_tokens: int) -> int:
    """Requests in a uniform-decode dummy batch of ``num_tokens`` tokens: ``min(max_num_seqs, cdiv(num_tokens, 1 + k))``
    (``GPUModelRunner._dummy_run(uniform_decode=True)``, ``vllm/v1/worker/gpu_model_runner.py``)."""
    return min(config.max_num_seqs, cdiv(num_tokens, config.uniform_decode_query_len))


def decode_capture_rows(config: "EngineConfig") -> tuple[int, ...]:
    """Requests in each captured dummy decode batch, ascending and distinct: :func:`decode_rows` of each
    :func:`decode_capture_sizes` entry."""
    return tuple(sorted({decode_rows(config, s) for s in decode_capture_sizes(config)}))


def decode_rows_at_lock(config: "EngineConfig") -> int:
    """Requests in the largest captured dummy decode batch: ``min(max_num_seqs, cdiv(num_tokens, 1 + k))``.

    As ``GPUModelRunner._dummy_run(uniform_decode=True)``; 0 when no decode graph is captured.
    """
    sizes = decode_capture_sizes(config)
    return decode_rows(config, sizes[-1]) if sizes else 0


def locks_workspace(config: "EngineConfig") -> bool:
    """Whether start-up ends with ``lock_workspace()``: capture runs (mode not NONE), or the lock-on-eager variant."""
    return cudagraph_mode(config) != "NONE" or config.lock_workspace_when_eager


# --------------------------------------------------------------------------- #
# Scheduling                                                                  #
# --------------------------------------------------------------------------- #


def mamba_block_aligned_split(config: "EngineConfig", num_computed_tokens: int, num_new_tokens: int,
                              prompt_len: int) -> int:
    """New tokens the scheduler gives a prefilling request after vLLM 0.33's Mamba block alignment.

    Mirrors ``Scheduler._mamba_block_aligned_split`` (``vllm/v1/core/sched/scheduler.py``), run
    when ``config.mamba_block_aligned_split`` (a hybrid model with prefix caching on): a chunk
    that is not the prompt's last is cut back to a multiple of ``block_size``; the last chunk
    stays whole when its layers can store the block-boundary state from inside the chunk
    (``is_mamba_prefill_checkpoint_valid`` with ``prefill_checkpoint_alignment`` 1, as
    ``MambaMixer2`` declares), else it stops at the last block boundary before the prompt's end.
    Modelled case: no prefix-cache hit, ``hash_block_size == block_size``, no EAGLE block drop.
    Returns ``num_new_tokens`` unchanged otherwise; 0 means "schedule nothing this step".
    """
    start, n = num_computed_tokens, prompt_len
    if not config.mamba_block_aligned_split or start >= n:
        return num_new_tokens
    bs, end = config.block_size, start + num_new_tokens
    checkpoint = (n - 1) // bs * bs  # get_mamba_prefill_checkpoint_position(n, block_size, False)
    internal = (end >= n and start % bs == 0 and cdiv(end, bs) - 2 > (start - 1) // bs
                and start + bs <= checkpoint < end)
    if end < n:
        aligned = end // bs * bs
        if aligned > start or bs <= (config.max_num_scheduled_tokens or config.max_num_batched_tokens):
            end = aligned
    stops = ((start // bs + 1) * bs if start % bs and not internal else 0, 0 if internal else checkpoint)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
