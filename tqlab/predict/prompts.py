"""Which workspace calls a prompt makes, and which prompts overflow a locked workspace (closed forms).

Part of the one predictor (:mod:`tqlab.predict.analysis` re-exports every name here). A request
alone is chunked as the engine's scheduler chunks it (:func:`prefill_chunks`); every size question
is answered in closed form or by bisection (O(log n) in ``max_model_len``), because the dequant
buffers of a continuation chunk grow with ``cached_len``. A config without TurboQuant's consumers
(:func:`~tqlab.core.consumers.registry.turboquant_active` False) makes no such call: every
prompt fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tqlab.core.consumers.registry import turboquant_active
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    decode_workspace_shapes,
)
from tqlab.core.workspace_layout import compute_layout, positive_int
from tqlab.core.workspace_layout import cdiv

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = [
    "any_schedule_cached_len",
    "continuation_bytes",
    "decode_bytes",
    "decode_step_refused",
    "decode_uses_workspace",
    "first_failing_prompt",
    "first_refused_call",
    "prefill_chunks",
    "prompt_chunks",
    "prompt_workspace_chunks",
    "safe_max_model_len",
    "workspace_bytes_for_prompt",
]


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
    return turboquant_active(config) and config.num_speculative_tokens != 1


def decode_step_refused(config: "EngineConfig", locked: int | None, max_tokens: int) -> bool:
    """Whether every request's first decode step is refused at ``locked`` bytes: it makes one
    (``max_tokens >= 2``: vLLM finishes a request of ``max_tokens`` 1 after its prefill), that step asks the workspace
    (:func:`decode_uses_workspace`), and one row of split-KV decode scratch (:func:`decode_bytes`, independent of the
    prompt's length) exceeds the lock. Then no prompt length is safe."""
    return (locked is not None and max_tokens >= 2 and decode_uses_workspace(config)
            and decode_bytes(config, 1) > locked)


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


def _chunk_step(config: "EngineConfig") -> int:
    """Tokens in each prefill chunk of a request alone that is not its last one."""
    m = config.chunk_budget
    return m // config.block_size * config.block_size if config.mamba_block_aligned_split else m


def _last_chunk_index(config: "EngineConfig", n: int) -> int:
    """Index of the last prefill chunk of a prompt of ``n`` tokens alone (chunk ``j`` starts at ``j * step``)."""
    m, step = config.chunk_budget, _chunk_step(config)
    return 0 if n <= m else cdiv(n - m, step)


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
    if not turboquant_active(config) or not config.enable_chunked_prefill or n <= config.chunk_budget:
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
    if not turboquant_active(config) or not config.enable_chunked_prefill or m <= t:
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
    if not turboquant_active(config) or not config.enable_chunked_prefill or n <= config.chunk_budget:
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
    positive_int("locked_bytes", locked_bytes, 0)
    return _first_failing_alone(config, locked_bytes, config.max_model_len - 1)


def any_schedule_cached_len(config: "EngineConfig", length: int) -> int:
    """The most cached tokens a continuation chunk of a request of ``length`` tokens can have under any chunking
    (busy scheduler, prefix-cache hits): ``length - 129`` (the chunk must exceed the 128-token decode-kernel
    threshold), whole blocks of it for a prefix-cache hit or the block-aligned split; 0 when no continuation
    chunk can reach the workspace.

    Modelled: text-only requests without a KV connector or a streaming-input session (those can leave
    any number of tokens cached in vLLM 0.33, whatever the chunking and prefix-caching settings).
    """
    c_max = length - (CONTINUATION_DECODE_THRESHOLD + 1)
    if not turboquant_active(config):
        return 0
    if not config.enable_chunked_prefill:  # one step per prompt: only a prefix-cache hit leaves tokens cached
        if not config.enable_prefix_caching:
            return 0
        c_max = c_max // config.block_size * config.block_size  # a hit is whole blocks (get_computed_blocks)
    elif config.mamba_block_aligned_split:  # every chunk but a prompt's last ends on a block boundary
        c_max = c_max // config.block_size * config.block_size
    if c_max < 1 or config.chunk_budget <= CONTINUATION_DECODE_THRESHOLD:
        return 0
    return c_max


def _need_any_schedule(config: "EngineConfig", length: int) -> int:
    """Largest call any chunking of a request of ``length`` tokens can make (:func:`any_schedule_cached_len`)."""
    c_max = any_schedule_cached_len(config, length)
    return continuation_bytes(config, c_max) if c_max else 0


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
    if decode_step_refused(config, locked, max_tokens):
        caller = "_decode_attention" + (" (drafter)" if config.num_speculative_tokens else "")
        return {"caller": caller, "required_bytes": decode_bytes(config, 1), "current_bytes": locked,
                "cached_len": prompt_tokens, "q_len": 1}
    return None
