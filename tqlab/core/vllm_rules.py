"""vLLM's start-up and scheduling rules, per release, as functions of an :class:`~tqlab.core.config.EngineConfig`.

The engine (the simulator, :mod:`tqlab.engine`) and the predictor (:mod:`tqlab.predict`) both call
these, side by side; neither imports the other. Each function mirrors one piece of vLLM and names it;
where releases differ, a function takes ``vllm`` (a release; ``None``: the run's,
:func:`tqlab.core.vllm_versions.current`) and branches on the release's facts in the version home
(:mod:`tqlab.core.vllm_versions`), never on its name:

* :func:`cudagraph_mode` -- ``VllmConfig`` optimization-level defaults and
  ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` (``vllm/config/vllm.py``,
  ``vllm/config/compilation.py``; the same in every release modelled);
* :func:`capture_sizes` -- ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/vllm.py``) then
  ``adjust_cudagraph_sizes_for_spec_decode`` (V1) or ``_split_cudagraph_capture_sizes`` (decode graphs in
  requests);
* :func:`decode_capture_sizes` / :func:`decode_rows` / :func:`decode_capture_rows` / :func:`decode_rows_at_lock`
  -- the FULL uniform-decode graphs and their dummy batches (V1: ``CudagraphDispatcher.initialize_cudagraph_keys``
  and ``GPUModelRunner._dummy_run(uniform_decode=True)``; V2: ``CudaGraphManager._init_candidates`` and
  ``_dummy_run``);
* :func:`jit_warmup_decode_rows` -- Model Runner V2's ``warmup_kernels`` before capture;
  :func:`one_token_rows_before_lock` -- the widest one-token batch of capture and warm-up together;
* :func:`locks_workspace` -- ``lock_workspace()`` at the end of ``GPUModelRunner.capture_model``,
  skipped under ``enforce_eager`` by ``Worker.compile_or_warm_up_model`` (``vllm/v1/worker/gpu_worker.py``);
* :func:`step_token_budget` -- ``Scheduler.schedule``'s ``token_budget`` (``vllm/v1/core/sched/scheduler.py``);
* :func:`mamba_block_aligned_split` -- ``Scheduler._mamba_block_aligned_split`` (same file).

Validation happens where a value enters (:class:`EngineConfig`, the CLI, config.json); these
functions trust their config.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from tqlab.core import vllm_versions
from tqlab.core.config import step_token_budget
from tqlab.core.workspace_layout import cdiv, round_up

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.core.vllm_versions import VllmVersion

__all__ = [
    "DEFAULT_MAX_GRAPH_SIZE",
    "FULL_DECODE_MODES",
    "capture_sizes",
    "cudagraph_mode",
    "decode_capture_rows",
    "decode_capture_sizes",
    "decode_rows",
    "decode_rows_at_lock",
    "jit_warmup_decode_rows",
    "locks_workspace",
    "one_token_rows_before_lock",
    "piecewise_capture_one_token_rows",
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
    """The CUDA graph mode vLLM runs with: ``NONE`` under ``enforce_eager``, else the configured one.

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
    """``VllmConfig._set_cudagraph_sizes`` (the grid every modelled release shares), before the release's own step."""
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
            f"with the max value of cudagraph_capture_sizes(={valid_max}) (vLLM raises the same)"
        )
    return sizes


def _version(vllm: "str | VllmVersion | None") -> "VllmVersion":
    """The release whose rules apply: ``vllm`` or the run's (:func:`tqlab.core.vllm_versions.current`)."""
    return vllm_versions.get(vllm)


def _mixed_mode(config: "EngineConfig") -> str:
    """``CUDAGraphMode.mixed_mode()`` of :func:`cudagraph_mode`: the mode of non-uniform (prefill) batches."""
    mode = cudagraph_mode(config)
    return {"FULL_AND_PIECEWISE": "PIECEWISE", "FULL_DECODE_ONLY": "NONE"}.get(mode, mode)


def _decode_shapes(requests: list[int], limit: int) -> list[int]:
    """Request counts of the uniform decode graphs: ``decode_cudagraph_capture_shapes`` (``vllm/config/compilation.py``,
    0.34) for one query length: the sizes up to and including the first at or above ``limit``, each capped at it."""
    if limit < 1:
        return []
    reachable = requests[:bisect.bisect_left(requests, limit) + 1]
    return sorted({min(n, limit) for n in reachable})


def _split_capture_sizes(config: "EngineConfig") -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(token sizes, decode request counts, prefill token sizes)`` as vLLM 0.34's ``VllmConfig._split_cudagraph_capture_sizes``
    (``vllm/config/vllm.py``) leaves them after :func:`_set_cudagraph_sizes` (whose grid 0.34 keeps unchanged).

    Modelled case (the only one ``EngineConfig`` can express): none of the split fields
    (``prefill_cudagraph_capture_token_sizes``, ``max_prefill_cudagraph_capture_tokens``,
    ``decode_cudagraph_capture_request_sizes``, ``max_decode_cudagraph_capture_requests``) set, not SM100
    (no wide defaults), no dynamic speculative decoding (one query length ``1 + k`` up to ``max_num_seqs``
    requests), no adaptive verification, and no draft-model decode graphs
    (``get_draft_decode_cudagraph_request_sizes``: EAGLE/MTP/draft models with ``k >= 2`` add one-token graphs
    of the drafter; tqlab's config names no speculative method). Prefill graphs keep the shared token sizes;
    decode graphs take ``min(cdiv(s, 1 + k), max_num_seqs)`` requests for each shared size ``s`` whose rounded
    ``cdiv(s, 1 + k) * (1 + k)`` stays within the largest, capped by
    ``decode_cudagraph_capture_shapes`` at ``min(max_num_seqs, max_num_batched_tokens // (1 + k))``. The
    recorded token sizes are the union of both, only the decode ones under ``FULL_DECODE_ONLY`` unless the
    (deprecated) ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` were set.
    """
    shared = _set_cudagraph_sizes(config)
    if cudagraph_mode(config) == "NONE":
        return (), (), ()
    q, seqs = config.uniform_decode_query_len, config.max_num_seqs
    top = shared[-1] if shared else 0
    requests = sorted({min(cdiv(s, q), seqs) for s in shared if cdiv(s, q) * q <= top})
    decode = _decode_shapes(requests, min(seqs, config.max_num_batched_tokens // q))
    tokens = {n * q for n in decode}
    legacy = config.cudagraph_capture_sizes is not None or config.max_cudagraph_capture_size is not None
    if legacy or _mixed_mode(config) != "NONE":
        tokens |= set(shared)
    return tuple(sorted(tokens)), tuple(decode), tuple(shared)


def capture_sizes(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> tuple[int, ...]:
    """The token counts the release captures CUDA graphs for, ascending; ``()`` when nothing is captured.

    ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/vllm.py``, the same grid in 0.33 and 0.34): default
    ceiling ``min(max_num_seqs * (1 + k) * 2, 512)``, capped by ``max_num_batched_tokens``; the list
    is 1, 2, 4, multiples of 8 below 256 and of 16 from 256 up to it, plus
    ``max_num_batched_tokens`` and the uniform-decode sizes when they fit. Explicit
    ``cudagraph_capture_sizes`` replace it, filtered by ``max_num_batched_tokens`` only
    (not by ``max_num_seqs``: ``1,2,4,8,12`` with ``max_num_seqs=4`` keeps all five).
    ``cudagraph_mode`` NONE or ``enforce_eager``: ``()``. Then, per release
    (:attr:`~tqlab.core.vllm_versions.VllmVersion.decode_graphs_in_requests`):

    * 0.33 (V1 runner): with FULL decode graphs and ``k > 0``, ``adjust_cudagraph_sizes_for_spec_decode``
      (``vllm/config/compilation.py``) rounds each size up to a multiple of ``1 + k`` (dropping those above the
      largest);
    * 0.34: :func:`_split_capture_sizes`: prefill sizes stay in tokens, decode graphs are counted in requests
      (:func:`decode_capture_rows`), and the recorded sizes are both kinds' token counts.

    ``vllm``: a release (:func:`tqlab.core.vllm_versions.get`); ``None`` takes the run's.
    Raises ``ValueError`` where vLLM raises (inconsistent explicit sizes and
    ``max_cudagraph_capture_size``; in 0.33 no size left after the spec-decode rounding).
    """
    if _version(vllm).decode_graphs_in_requests:
        return _split_capture_sizes(config)[0]
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


def decode_capture_sizes(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> tuple[int, ...]:
    """Token counts of the FULL uniform-decode graphs, ascending; ``()`` for PIECEWISE or NONE.

    0.33 (``CudagraphDispatcher.initialize_cudagraph_keys``, ``vllm/v1/cudagraph_dispatcher.py``): the
    :func:`capture_sizes` ``s`` with ``1 + k <= s <= (1 + k) * max_num_seqs``. 0.34
    (``CudaGraphManager._init_candidates``, ``vllm/v1/worker/gpu/cudagraph_utils.py``): ``n * (1 + k)`` for each
    request count ``n`` of :func:`decode_capture_rows`.
    """
    if cudagraph_mode(config) not in FULL_DECODE_MODES:
        return ()
    q = config.uniform_decode_query_len
    if _version(vllm).decode_graphs_in_requests:
        return tuple(n * q for n in _split_capture_sizes(config)[1])
    return tuple(s for s in capture_sizes(config, vllm) if q <= s <= q * config.max_num_seqs)


def decode_rows(config: "EngineConfig", num_tokens: int, vllm: "str | VllmVersion | None" = None) -> int:
    """Requests in a uniform-decode dummy batch of ``num_tokens`` tokens.

    0.33's V1 runner (``GPUModelRunner._dummy_run(uniform_decode=True)``, ``vllm/v1/worker/gpu_model_runner.py``):
    ``min(max_num_seqs, cdiv(num_tokens, 1 + k))``. 0.34's V2 runner (``_dummy_run``,
    ``vllm/v1/worker/gpu/model_runner.py``): ``num_tokens // (1 + k)``, which vLLM asserts divides evenly;
    tqlab raises ``ValueError`` naming the count where vLLM's assertion fails.
    """
    q = config.uniform_decode_query_len
    if _version(vllm).decode_graphs_in_requests:
        if num_tokens % q:
            raise ValueError(f"a uniform decode batch of {num_tokens} tokens is not a multiple of 1 + k = {q} "
                             "(vLLM 0.34's _dummy_run asserts num_tokens % decode_query_len == 0)")
        return num_tokens // q
    return min(config.max_num_seqs, cdiv(num_tokens, q))


def decode_capture_rows(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> tuple[int, ...]:
    """Requests in each captured dummy decode batch, ascending and distinct: :func:`decode_rows` of each
    :func:`decode_capture_sizes` entry (0.34: ``decode_cudagraph_capture_request_sizes`` as the graphs take them)."""
    return tuple(sorted({decode_rows(config, s, vllm) for s in decode_capture_sizes(config, vllm)}))


def decode_rows_at_lock(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> int:
    """Requests in the largest captured dummy decode batch (:func:`decode_capture_rows`); 0 when no decode graph is
    captured."""
    rows = decode_capture_rows(config, vllm)
    return rows[-1] if rows else 0


def jit_warmup_decode_rows(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> int:
    """Requests in the widest decode step of Model Runner V2's JIT warm-up before capture; 0 where it does not run.

    ``Worker._compile_or_warm_up_model`` (``vllm/v1/worker/gpu_worker.py``) runs ``warmup_kernels``
    (``vllm/v1/worker/gpu/warmup.py``) when ``KernelConfig.enable_jit_warmup`` (default True), before
    ``capture_model``: prompts of ``2 + k`` tokens for ``min(max_num_seqs, max_num_batched_tokens // (2 + k))``
    requests (``_cap_num_warmup_reqs``; the drafter's extra slots and a KV cache too small for them not modelled),
    then decode steps over all of them. Only where the release always runs V2
    (:attr:`~tqlab.core.vllm_versions.VllmVersion.jit_warmup_always`, 0.34); 0.33's modelled V1 runner has none.
    """
    if not _version(vllm).jit_warmup_always:
        return 0
    return min(config.max_num_seqs, config.max_num_batched_tokens // (config.uniform_decode_query_len + 1))


def piecewise_capture_one_token_rows(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> int:
    """One-token requests in the widest PIECEWISE capture dummy that carries attention metadata; 0 where none does.

    V2 (releases with :attr:`~tqlab.core.vllm_versions.VllmVersion.decode_graphs_in_requests`) builds attention
    metadata for every capture (``CudaGraphManager.capture`` -> ``prepare_inputs_to_capture``,
    ``vllm/v1/worker/gpu/cudagraph_utils.py``) and runs each PIECEWISE graph once eagerly first; its dummy of ``T``
    tokens has ``min(T, max_num_seqs)`` requests, ``T // n`` tokens each and one more for the last ``T % n``
    (``InputBatch.make_dummy``, ``seq_lens`` = query lengths), so with ``T // n == 1`` the first ``n - T % n``
    are one-token requests. 0.33's V1 PIECEWISE captures pass no attention metadata: 0.
    """
    if not _version(vllm).decode_graphs_in_requests or _mixed_mode(config) == "NONE":
        return 0
    best, seqs = 0, config.max_num_seqs
    for t in _split_capture_sizes(config)[2]:
        n = min(t, seqs)
        if t // n == 1:
            best = max(best, n - t % n)
    return best


def one_token_rows_before_lock(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> int:
    """Rows of the widest batch of one-token requests with context that start-up runs before the lock (an attention
    backend's decode path, e.g. TurboQuant's ``_decode_attention``); 0 when none.

    The FULL decode captures when ``k = 0`` (:func:`decode_rows_at_lock`; with ``k > 0`` their rows hold ``1 + k``
    tokens); V2's PIECEWISE captures (:func:`piecewise_capture_one_token_rows`); and V2's JIT warm-up
    (:func:`jit_warmup_decode_rows`): its decode steps over all its requests when ``k = 0``, and with ``k > 0``
    its steps without draft tokens over at most 2 of them (``_warmup_kernels``' ``decode_steps``,
    ``vllm/v1/worker/gpu/warmup.py``).
    """
    k = config.num_speculative_tokens
    warm = jit_warmup_decode_rows(config, vllm)
    return max(decode_rows_at_lock(config, vllm) if k == 0 else 0, warm if k == 0 else min(2, warm),
               piecewise_capture_one_token_rows(config, vllm))


def locks_workspace(config: "EngineConfig", vllm: "str | VllmVersion | None" = None) -> bool:
    """Whether start-up ends with ``lock_workspace()`` (end of ``GPUModelRunner.capture_model``; an eager start-up
    never captures: ``Worker.compile_or_warm_up_model``, ``vllm/v1/worker/gpu_worker.py``), or the named
    lock-on-eager variant. 0.33: capture runs whenever the mode is not NONE. 0.34: V2's ``capture_model`` returns
    before the lock when it has no graph to capture (``CudaGraphManager.needs_capture``): no size left, or
    ``FULL_DECODE_ONLY`` without a decode graph.
    """
    if config.lock_workspace_when_eager:
        return True
    mode = cudagraph_mode(config)
    if mode == "NONE":
        return False
    if not _version(vllm).decode_graphs_in_requests:
        return True
    tokens, decode, prefill = _split_capture_sizes(config)
    decode_graphs = mode in FULL_DECODE_MODES and bool(decode)
    prefill_graphs = _mixed_mode(config) != "NONE" and bool(prefill)
    return bool(tokens) and (decode_graphs or prefill_graphs)  # no size left: vLLM sets cudagraph_mode NONE


# --------------------------------------------------------------------------- #
# Scheduling                                                                  #
# --------------------------------------------------------------------------- #


def mamba_block_aligned_split(config: "EngineConfig", num_computed_tokens: int, num_new_tokens: int,
                              prompt_len: int) -> int:
    """New tokens the scheduler gives a prefilling request after vLLM's Mamba block alignment.

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
