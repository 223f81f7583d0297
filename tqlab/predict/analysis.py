"""The one analysis of a deployment, as vLLM 0.33 runs it: capture sizes, the lock, the first failing prompt.

Every answer here is computed from an :class:`~tqlab.core.config.EngineConfig` and the
consumers' shape functions in :mod:`tqlab.core.reservation`; the engine, ``tqlab repro``,
``tqlab plan``, ``tqlab inspect-vllm``, the planner widget and the notebooks call
these functions, so their answers cannot drift apart. Bytes everywhere; every size
question is answered in closed form or by bisection (O(log n) in ``max_model_len``
and ``max_num_seqs``).

vLLM 0.33 facts mirrored here:

* capture sizes: ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/vllm.py``), then
  ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` (``vllm/config/compilation.py``)
  when decode graphs are FULL and ``1 + k > 1``;
* which start-ups lock: ``lock_workspace()`` is called only at the end of
  ``GPUModelRunner.capture_model`` (``vllm/v1/worker/gpu_model_runner.py``), which returns
  early for ``cudagraph_mode`` NONE and is skipped by ``GPUWorker.compile_or_warm_up_model``
  (``vllm/v1/worker/gpu_worker.py``) under ``enforce_eager``;
* what capture asks of the workspace: only FULL uniform-decode captures build attention
  metadata (``_dummy_run``); a dummy batch has ``min(max_num_seqs, cdiv(num_tokens, 1 + k))``
  requests of ``1 + k`` tokens with ``seq_lens = 1 + k``. With ``k = 0`` TurboQuant runs
  ``_decode_attention`` (workspace: decode views at that many rows); with ``k > 0`` the
  query length exceeds the builder's ``reorder_batch_threshold`` of 1, so the batch goes
  to ``_prefill_attention`` as first chunks (``q_len == seq_len``): no workspace call.
  PIECEWISE captures and the profile run pass no attention metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from tqlab.core.consumers import registry as consumer_registry
from tqlab.core.consumers.base import StartUp
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    check_config,
    chunk_workspace_request,
    continuation_workspace_shapes,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
)
from tqlab.core.workspace import compute_layout, positive_int, round_up

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = [
    "DEFAULT_MAX_GRAPH_SIZE",
    "Prediction",
    "capture_sizes",
    "continuation_bytes",
    "cudagraph_mode",
    "decode_bytes",
    "decode_capture_rows",
    "decode_capture_sizes",
    "decode_rows_at_lock",
    "decode_uses_workspace",
    "first_failing_prompt",
    "first_refused_call",
    "locked_bytes",
    "locks_workspace",
    "mamba_block_aligned_split",
    "predict",
    "prefill_chunks",
    "prompt_chunks",
    "prompt_workspace_chunks",
    "safe_max_model_len",
    "unfixed_locked_bytes",
    "workspace_bytes_for_prompt",
]

DEFAULT_MAX_GRAPH_SIZE = 512
"""vLLM's default capture ceiling (1024 on data-centre Blackwell, not modelled)."""
_MAX_CAPTURE_SIZES = 4096  # refuse to list more graphs than this (vLLM would capture each one)
_FULL_DECODE_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


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
    check_config(config)
    sizes = _set_cudagraph_sizes(config)
    q = config.uniform_decode_query_len
    if sizes and q > 1 and cudagraph_mode(config) in _FULL_DECODE_MODES:
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
    if cudagraph_mode(config) not in _FULL_DECODE_MODES:
        return ()
    q = config.uniform_decode_query_len
    return tuple(s for s in capture_sizes(config) if q <= s <= q * config.max_num_seqs)


def decode_capture_rows(config: "EngineConfig") -> tuple[int, ...]:
    """Requests in each captured dummy decode batch, ascending: ``min(max_num_seqs, cdiv(size, 1 + k))``
    per :func:`decode_capture_sizes` entry (``GPUModelRunner._dummy_run(uniform_decode=True)``)."""
    q = config.uniform_decode_query_len
    return tuple(sorted({min(config.max_num_seqs, -(-s // q)) for s in decode_capture_sizes(config)}))


def decode_rows_at_lock(config: "EngineConfig") -> int:
    """Requests in the largest captured dummy decode batch: ``min(max_num_seqs, cdiv(num_tokens, 1 + k))``.

    As ``GPUModelRunner._dummy_run(uniform_decode=True)``; 0 when no decode graph is captured.
    """
    sizes = decode_capture_sizes(config)
    if not sizes:
        return 0
    q = config.uniform_decode_query_len
    return min(config.max_num_seqs, -(-sizes[-1] // q))


def locks_workspace(config: "EngineConfig") -> bool:
    """Whether start-up ends with ``lock_workspace()``: capture runs (mode not NONE), or the lock-on-eager variant."""
    return cudagraph_mode(config) != "NONE" or config.lock_workspace_when_eager


# --------------------------------------------------------------------------- #
# Bytes                                                                       #
# --------------------------------------------------------------------------- #


def decode_bytes(config: "EngineConfig", rows: int) -> int:
    """Bytes of one split-KV decode workspace call at ``rows`` rows (:func:`decode_workspace_shapes`)."""
    shapes = decode_workspace_shapes(rows, config.num_heads_per_rank, config.head_dim,
                                     config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    return compute_layout(shapes).total_bytes


def continuation_bytes(config: "EngineConfig", cached_len: int) -> int:
    """Bytes of one continuation-prefill dequant call after ``cached_len`` cached tokens (monotone in it)."""
    shapes = continuation_workspace_shapes(cached_len, config.num_kv_heads_per_rank, config.head_dim, config.block_size)
    return compute_layout(shapes).total_bytes


def decode_uses_workspace(config: "EngineConfig") -> bool:
    """Whether a serving decode step makes a split-KV decode workspace call.

    ``k = 0``: the target's decode rows. ``k = 1``: no (the target's ``1 + k``-token rows
    run the decode kernel with its own scratch, and the drafter's only pass has
    ``1 + k``-token rows too). ``k >= 2``: the drafter's passes 2..k are one-token decodes
    (``SpecDecodeBaseProposer.propose``) through ``_decode_attention``.
    """
    return config.num_speculative_tokens != 1


def locked_bytes(config: "EngineConfig", *, fix: bool) -> int | None:
    """Workspace bytes per ubatch slot at the lock; ``None`` when start-up never locks.

    Without the fix: decode views at :func:`decode_rows_at_lock` rows when ``k = 0``
    (the FULL decode capture runs ``_decode_attention``), else 0 (no capture asks the
    workspace for anything). With the fix (PR #44053): at least the largest call of
    :func:`tqlab.core.reservation.reservation_plan`. ``None`` for an eager or ``cudagraph_mode``
    NONE start-up in vLLM 0.33 (unless ``lock_workspace_when_eager``).
    """
    check_config(config)
    if not locks_workspace(config):
        return None
    rows = decode_rows_at_lock(config)
    unfixed = decode_bytes(config, rows) if rows and config.num_speculative_tokens == 0 else 0
    return max(unfixed, plan_bytes(reservation_plan(config))) if fix else unfixed


def unfixed_locked_bytes(config: "EngineConfig") -> int:
    """:func:`locked_bytes` without the fix, with 0 for a start-up that never locks (kept for callers)."""
    return locked_bytes(config, fix=False) or 0


# --------------------------------------------------------------------------- #
# Prompts                                                                     #
# --------------------------------------------------------------------------- #


def prompt_chunks(prompt_tokens: int, max_num_batched_tokens: int) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` of each prefill chunk of a request running alone (a list: for small prompts).

    Token-budget chunks only; :func:`prefill_chunks` adds a hybrid model's block alignment.
    """
    n = positive_int("prompt_tokens", prompt_tokens)
    m = positive_int("max_num_batched_tokens", max_num_batched_tokens)
    return [(start, min(m, n - start)) for start in range(0, n, m)]


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
    internal = (end >= n and start % bs == 0 and -(-end // bs) - 2 > (start - 1) // bs
                and start + bs <= checkpoint < end)
    if end < n:
        aligned = end // bs * bs
        if aligned > start or bs <= (config.max_num_scheduled_tokens or config.max_num_batched_tokens):
            end = aligned
    stops = ((start // bs + 1) * bs if start % bs and not internal else 0, 0 if internal else checkpoint)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def _chunk_step(config: "EngineConfig") -> int:
    """Tokens in each prefill chunk of a request alone that is not its last one."""
    m = config.chunk_budget
    return m // config.block_size * config.block_size if config.mamba_block_aligned_split else m


def _last_chunk_index(config: "EngineConfig", n: int) -> int:
    """Index of the last prefill chunk of a prompt of ``n`` tokens alone (chunk ``j`` starts at ``j * step``)."""
    m, step = config.chunk_budget, _chunk_step(config)
    return 0 if n <= m else -(-(n - m) // step)


def prefill_chunks(config: "EngineConfig", prompt_tokens: int) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` of each prefill chunk the scheduler gives a request of ``prompt_tokens`` alone.

    Chunks of :attr:`~tqlab.core.config.EngineConfig.chunk_budget` tokens (``max_num_batched_tokens``
    unless ``max_num_scheduled_tokens`` is smaller; all at once with chunked prefill off), each but the
    last cut back to a block boundary under :func:`mamba_block_aligned_split`. The engine's
    scheduler produces exactly these.
    """
    n = positive_int("prompt_tokens", prompt_tokens)
    if not config.enable_chunked_prefill:
        return [(0, n)]
    step, last = _chunk_step(config), _last_chunk_index(config, n)
    return [(j * step, step) for j in range(last)] + [(last * step, n - last * step)]


def _first_overflowing_start(config: "EngineConfig", lo: int, hi: int, step: int, locked: int) -> int | None:
    """Smallest chunk index ``j`` in ``[lo, hi]`` whose dequant call at ``j * step`` cached tokens exceeds ``locked``.

    Bisection: the dequant buffers grow with ``cached_len``. None when even ``hi`` fits (or the range is empty).
    """
    if hi < lo or continuation_bytes(config, hi * step) <= locked:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if continuation_bytes(config, mid * step) > locked:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _first_refused_chunk(config: "EngineConfig", n: int, locked: int) -> tuple[int, int] | None:
    """``(cached_len, q_len)`` of the first chunk of a prompt of ``n`` (alone) that needs more than ``locked``.

    Closed form: only chunks with ``cached_len > 0`` and ``q_len > 128`` ask (dequant buffers
    monotone in ``cached_len``), so bisect on the chunk index.
    """
    t = CONTINUATION_DECODE_THRESHOLD
    if not config.enable_chunked_prefill or n <= config.chunk_budget:
        return None
    step, last = _chunk_step(config), _last_chunk_index(config, n)
    last_q = n - last * step
    lo = 1 if step > t else last  # chunks before the last hold `step` new tokens
    hi = last if last_q > t else last - 1
    j = _first_overflowing_start(config, lo, hi, step, locked)
    return None if j is None else (j * step, step if j < last else last_q)


def _first_failing_alone(config: "EngineConfig", locked: int, limit: int) -> int | None:
    """Shortest prompt of at most ``limit`` tokens (alone) whose prefill needs more than ``locked``; None if none.

    Chunk ``j`` starts at ``j * step``; the first overflowing start ``j`` is reached with more
    than 128 new tokens by ``max(j * step + 129, (j - 1) * step + chunk_budget + 1)``
    tokens (the second term: chunk ``j - 1`` must not be the last).
    """
    t, m = CONTINUATION_DECODE_THRESHOLD, config.chunk_budget
    if not config.enable_chunked_prefill or m <= t:
        return None
    step = _chunk_step(config)
    j = _first_overflowing_start(config, 1, (limit - t - 1) // step, step, locked)  # room for 129 new tokens
    if j is None:
        return None
    n = max(j * step + t + 1, (j - 1) * step + m + 1)
    return n if n <= limit else None


def prompt_workspace_chunks(config: "EngineConfig", prompt_tokens: int) -> dict[str, tuple[int, int]]:
    """The chunks of a prompt (alone) that reach TurboQuant's continuation paths, in O(1).

    ``{"continuation": (cached_len, q_len)}`` of its largest dequant chunk (the last chunk with
    more than 128 new tokens) and ``{"decode_kernel": (cached_len, q_len)}`` of its last short
    continuation chunk (no workspace call in vLLM 0.33); a key is absent when no chunk takes that path.
    """
    positive_int("prompt_tokens", prompt_tokens)
    t, n, out = CONTINUATION_DECODE_THRESHOLD, prompt_tokens, {}
    if not config.enable_chunked_prefill or n <= config.chunk_budget:
        return out
    step, last = _chunk_step(config), _last_chunk_index(config, n)
    last_q = n - last * step
    if last_q > t:
        out["continuation"] = (last * step, last_q)
    else:
        out["decode_kernel"] = (last * step, last_q)
        if last >= 2 and step > t:
            out["continuation"] = ((last - 1) * step, step)
    return out


def workspace_bytes_for_prompt(config: "EngineConfig", prompt_tokens: int) -> int:
    """Largest workspace call (bytes) a prompt of ``prompt_tokens`` makes while prefilling alone (O(1)).

    Raises ``ValueError`` for a prompt shorter than 1 or longer than ``max_model_len``.
    """
    check_config(config)
    positive_int("prompt_tokens", prompt_tokens)
    if prompt_tokens > config.max_model_len:
        raise ValueError(f"prompt_tokens {prompt_tokens} exceeds max_model_len {config.max_model_len}")
    top = prompt_workspace_chunks(config, prompt_tokens).get("continuation")
    return 0 if top is None else chunk_workspace_request(config, *top).nbytes


def first_failing_prompt(config: "EngineConfig", locked_bytes: int) -> int | None:
    """The shortest prompt (alone, at most ``max_model_len - 1`` tokens) whose prefill needs more than ``locked_bytes``.

    None if none does. Closed form: the first chunk index ``j >= 1`` whose dequant call at
    ``cached_len = j * m`` (``m``: the config's ``chunk_budget``) overflows, found by bisection; the prompt is
    ``j * m + 129`` tokens (its last chunk just crosses vLLM's 128-token threshold). Under
    :func:`mamba_block_aligned_split` chunks start at multiples of ``step``, ``m`` cut back to a
    whole number of blocks, and the prompt is ``max(j * step + 129, (j - 1) * step + m + 1)``.
    Raises ``ValueError`` for a negative or non-int ``locked_bytes``.
    """
    check_config(config)
    positive_int("locked_bytes", locked_bytes, 0)
    return _first_failing_alone(config, locked_bytes, config.max_model_len - 1)


def _need_any_schedule(config: "EngineConfig", length: int) -> int:
    """Largest call any chunking of a request of ``length`` tokens can make (busy scheduler, prefix-cache hits).

    Modelled: text-only requests without a KV connector or a streaming-input session (those can leave
    any number of tokens cached in vLLM 0.33, whatever the chunking and prefix-caching settings).
    """
    c_max = length - (CONTINUATION_DECODE_THRESHOLD + 1)
    if not config.enable_chunked_prefill:  # one step per prompt: only a prefix-cache hit leaves tokens cached
        if not config.enable_prefix_caching:
            return 0
        c_max = c_max // config.block_size * config.block_size  # a hit is whole blocks (get_computed_blocks)
    elif config.mamba_block_aligned_split:  # every chunk but a prompt's last ends on a block boundary
        c_max = c_max // config.block_size * config.block_size
    if c_max < 1 or config.chunk_budget <= CONTINUATION_DECODE_THRESHOLD:
        return 0
    return continuation_bytes(config, c_max)


def safe_max_model_len(config: "EngineConfig", locked_bytes: int, *, schedule: str = "any",
                       limit: int | None = None) -> int | None:
    """Largest ``max_model_len`` (<= ``limit``, default the configured one) whose prompts all fit ``locked_bytes``.

    ``schedule="alone"``: each request prefilled alone in chunks of ``chunk_budget`` tokens;
    ``"any"``: any chunking (continuation chunks with up to ``length - 129`` cached tokens;
    whole blocks of them for a prefix-cache hit with chunked prefill off, or under the
    block-aligned split; none with chunked prefill and prefix caching both off), the bound
    to trust on a busy server. O(log n). None if even a 2-token prompt can overflow.
    Raises ``ValueError`` for a bad ``schedule`` or ``locked_bytes``.
    """
    check_config(config)
    if schedule not in ("alone", "any"):
        raise ValueError(f"schedule must be 'alone' or 'any', got {schedule!r}")
    positive_int("locked_bytes", locked_bytes, 0)
    top = config.max_model_len if limit is None else positive_int("limit", limit)
    if schedule == "alone":
        first = _first_failing_alone(config, locked_bytes, max(1, top - 1))
        if first is None:
            return top
        return None if first <= 2 else first  # prompts up to first - 1 fit: max_model_len = first
    if _need_any_schedule(config, top) <= locked_bytes:
        return top
    lo, hi = 2, top  # need(lo) fits (0 bytes), need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _need_any_schedule(config, mid) <= locked_bytes:
            lo = mid
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------- #
# The prediction                                                              #
# --------------------------------------------------------------------------- #


def first_refused_call(config: "EngineConfig", prompt_tokens: int, locked: int | None, *,
                       max_tokens: int = 2) -> dict[str, Any] | None:
    """The first workspace call a prompt of ``prompt_tokens`` (alone, then ``max_tokens - 1`` decode steps) makes
    that the workspace locked at ``locked`` bytes refuses: ``{caller, required_bytes, current_bytes, cached_len, q_len}``.

    ``caller`` is the vLLM method (``_continuation_prefill`` or ``_decode_attention``). None when
    every call fits or nothing is locked.
    """
    if locked is None:
        return None
    hit = _first_refused_chunk(config, prompt_tokens, locked)
    if hit is not None:
        return {"caller": "_continuation_prefill", "required_bytes": continuation_bytes(config, hit[0]),
                "current_bytes": locked, "cached_len": hit[0], "q_len": hit[1]}
    need = decode_bytes(config, 1)
    if max_tokens >= 2 and decode_uses_workspace(config) and need > locked:
        caller = "_decode_attention" + (" (drafter)" if config.num_speculative_tokens else "")
        return {"caller": caller, "required_bytes": need, "current_bytes": locked,
                "cached_len": prompt_tokens, "q_len": 1}
    return None


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` finds for a deployment (and optionally one prompt). Bytes and tokens.

    ``locked_bytes`` is the size at the lock as configured (with or without the fix, per
    ``fix``); ``locked_bytes_with_fix`` always with it; both None when nothing locks.
    ``verdict``: ``"never_locked"``, ``"crash"`` or ``"ok"``. ``first_refused_call``:
    ``{caller, required_bytes, current_bytes, cached_len, q_len}`` or None.
    ``consumers``: :func:`consumer_table`'s JSON (``consumers``, ``consumers_locked_bytes``, ``unmodelled``),
    every active workspace consumer of vLLM 0.33 tqlab models; ``locked_bytes`` above is still TurboQuant's alone.
    """

    capture_sizes: tuple[int, ...]
    decode_rows_at_lock: int
    locked_bytes: int | None
    verdict: str
    first_failing_prompt_tokens: int | None
    first_refused_call: dict[str, Any] | None
    locked_bytes_with_fix: int | None
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    fix: bool = False
    prompt_tokens: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    consumers: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The documented, stable object of ``tqlab plan --json`` / ``inspect-vllm --json`` (JSON types only)."""
        return {
            "capture_sizes": list(self.capture_sizes),
            "decode_rows_at_lock": self.decode_rows_at_lock,
            "locked_bytes": self.locked_bytes,
            "verdict": self.verdict,
            "first_failing_prompt_tokens": self.first_failing_prompt_tokens,
            "first_refused_call": None if self.first_refused_call is None else dict(self.first_refused_call),
            "locked_bytes_with_fix": self.locked_bytes_with_fix,
            "cudagraph_mode": self.cudagraph_mode,
            "fix": self.fix,
            "prompt_tokens": self.prompt_tokens,
            "sources": dict(self.sources),
            **{k: v for k, v in self.consumers.items()},  # consumers, consumers_locked_bytes, unmodelled
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def predict(config: "EngineConfig", prompt_tokens: int | None = None, *, max_tokens: int = 2, fix: bool = False,
            sources: Mapping[str, str] | None = None) -> Prediction:
    """Verdict and sizes for ``config`` (without the fix unless ``fix``), for one prompt or for the deployment.

    With ``prompt_tokens``: that prompt alone, then ``max_tokens - 1`` decode steps (the
    engine's ``generate``). Without: the shortest failing prompt, or a decode step of one row.
    ``sources`` (where each input came from) is passed through to :meth:`Prediction.to_json`.
    Raises ``ValueError`` for a prompt outside ``[1, max_model_len - max_tokens]``.
    """
    check_config(config)
    positive_int("max_tokens", max_tokens)
    locked = locked_bytes(config, fix=fix)
    if prompt_tokens is not None:
        positive_int("prompt_tokens", prompt_tokens)
        if prompt_tokens + max_tokens > config.max_model_len:
            raise ValueError(f"prompt_tokens {prompt_tokens} + max_tokens {max_tokens} exceeds "
                             f"max_model_len {config.max_model_len} (vLLM rejects the request)")
    first_bad = None if locked is None else first_failing_prompt(config, locked)
    n = prompt_tokens if prompt_tokens is not None else (first_bad or 1)
    refused = first_refused_call(config, n, locked, max_tokens=max_tokens)
    verdict = "never_locked" if locked is None else ("crash" if refused else "ok")
    return Prediction(
        capture_sizes=capture_sizes(config), decode_rows_at_lock=decode_rows_at_lock(config), locked_bytes=locked,
        verdict=verdict, first_failing_prompt_tokens=first_bad, first_refused_call=refused,
        locked_bytes_with_fix=locked_bytes(config, fix=True), cudagraph_mode=cudagraph_mode(config), fix=fix,
        prompt_tokens=prompt_tokens, sources=dict(sources or {}), consumers=consumer_table(config).to_dict(),
    )


def consumer_table(config: "EngineConfig") -> consumer_registry.ConsumerTable:
    """Every active workspace consumer of ``config`` (:mod:`tqlab.core.consumers`), with start-up as resolved here
    (:func:`cudagraph_mode`, :func:`locks_workspace`): ``consumers`` rows (``consumer``, ``phase``,
    ``reserved_bytes``, ``max_runtime_bytes``, ``covered``), ``locked_bytes`` = the largest reservation before the
    lock (vLLM 0.33 as shipped, PR #44053 included), ``unmodelled``."""
    startup = StartUp(cudagraph_mode(config), locks_workspace(config))
    return consumer_registry.consumer_table(config, startup)
