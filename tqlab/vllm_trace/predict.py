"""The crash predictor: per workspace consumer, what a request of N tokens needs against the locked size."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO


from ..config import EngineConfig, parse_dtype
from ..reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    continuation_workspace_shapes,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
)
from ..analysis import prompt_chunks
from ..workspace import compute_layout, format_mb
from .cpu_harness import run_vllm_seed_scenario
from .tracer import vllm_available, vllm_version
from .vllm_args import engine_config_from_vllm, parse_engine_args, vllm_default_limits

# --------------------------------------------------------------------------- #
# The predictor                                                               #
# --------------------------------------------------------------------------- #


SHORT_CHUNK = "short continuation (decode kernel)"
DEQUANT_CHUNK = "continuation prefill (dequant)"
DECODE = "split-KV decode"


def chunk_shapes(config: EngineConfig, cached_len: int, q_len: int, *, short_chunks_use_workspace: bool = False):
    """``(consumer, shapes or None)``: the workspace call one prefill chunk makes.

    ``cached_len == 0``: a first chunk, no workspace. ``q_len > 128`` (vLLM's
    ``_CONTINUATION_DECODE_THRESHOLD``): the dequant buffers,
    :func:`tqlab.reservation.continuation_workspace_shapes`. ``q_len <= 128``:
    the decode kernel, which in vLLM 0.33 allocates its own buffers (no
    workspace call; checked by ``parity/``, and tqlab's engine does the same);
    ``short_chunks_use_workspace=True`` models a backend whose short chunks take
    decode views with ``q_len`` rows from the workspace
    (:func:`tqlab.reservation.decode_workspace_shapes`), the variant that needs
    ``max(max_num_seqs, 128)`` decode rows reserved.
    """
    if cached_len == 0:
        return "prefill", None
    if q_len <= CONTINUATION_DECODE_THRESHOLD:
        if short_chunks_use_workspace:
            return SHORT_CHUNK, decode_workspace_shapes(
                q_len, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype
            )
        return SHORT_CHUNK, None
    return DEQUANT_CHUNK, continuation_workspace_shapes(
        cached_len, config.num_kv_heads_per_rank, config.head_dim, config.block_size
    )


def _bytes(shapes) -> int:
    return 0 if shapes is None else compute_layout(shapes).total_bytes


def _chunk_bytes(config: EngineConfig, cached_len: int, q_len: int, short: bool) -> int:
    return _bytes(chunk_shapes(config, cached_len, q_len, short_chunks_use_workspace=short)[1])


@dataclass(frozen=True)
class ConsumerNeed:
    """One workspace consumer's biggest call for a request: shapes, bytes, and whether it fits.

    ``consumer``: ``"split-KV decode"``, ``"short continuation (decode kernel)"``
    or ``"continuation prefill (dequant)"``; ``cached_len``/``q_len`` of the
    chunk that makes the call (decode: ``q_len`` 1, ``cached_len`` the prompt).
    ``shapes`` is None when the consumer makes no workspace call.
    """

    consumer: str
    cached_len: int
    q_len: int
    shapes: tuple | None
    nbytes: int
    fits_unfixed: bool
    fits_fixed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "cached_len": self.cached_len,
            "q_len": self.q_len,
            "shapes": None if self.shapes is None else [[list(s), str(dt).removeprefix("torch.")] for s, dt in self.shapes],
            "nbytes": self.nbytes,
            "fits_unfixed": self.fits_unfixed,
            "fits_fixed": self.fits_fixed,
        }


@dataclass(frozen=True)
class RequestPrediction:
    """A prompt of ``prompt_tokens`` prefilled alone (chunks of ``max_num_batched_tokens``), then decoded.

    ``consumers``: each consumer's *largest* call. ``first_refused_unfixed`` /
    ``first_refused_fixed``: the *first* call, in serving order (chunks in
    order, then decode), that does not fit the locked workspace without / with
    PR #44053 -- the call vLLM dies on (None: every call fits). ``rejected``:
    why vLLM refuses the prompt before it reaches the workspace (vLLM 0.33's
    input processor: a prompt longer than ``max_model_len``, or equal to it,
    leaving no room for one output token), else None; a rejected request has
    no consumers and never crashes.
    """

    prompt_tokens: int
    consumers: tuple[ConsumerNeed, ...]
    need_bytes: int
    crashes_unfixed: bool
    crashes_fixed: bool
    first_refused_unfixed: ConsumerNeed | None = None
    first_refused_fixed: ConsumerNeed | None = None
    rejected: str | None = None

    @property
    def verdict(self) -> str:
        """One line: ``"rejected: exceeds max_model_len (N)"`` or ``"CRASH without the fix, ok with it"`` etc."""
        if self.rejected is not None:
            return f"rejected: {self.rejected}"
        return (
            f"{'CRASH' if self.crashes_unfixed else 'ok'} without the fix, {'CRASH' if self.crashes_fixed else 'ok'} with it"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "verdict": self.verdict,
            "rejected": self.rejected,
            "need_bytes": self.need_bytes,
            "crashes_unfixed": self.crashes_unfixed,
            "crashes_fixed": self.crashes_fixed,
            "first_refused_unfixed": None if self.first_refused_unfixed is None else self.first_refused_unfixed.to_dict(),
            "first_refused_fixed": None if self.first_refused_fixed is None else self.first_refused_fixed.to_dict(),
            "consumers": [c.to_dict() for c in self.consumers],
        }


@dataclass
class Prediction:
    """What :func:`predict` found. Sizes in bytes, lengths in tokens.

    ``locked_unfixed``: the workspace at lock without PR #44053 (decode at the
    largest captured batch, or the measured size passed in). ``locked_fixed``:
    with the reservation. ``first_failing_prompt``: shortest prompt that
    overflows ``locked_unfixed`` when prefilled alone (None: none up to
    ``max_model_len``). ``safe_max_model_len_alone`` / ``_any_schedule``: the
    largest ``max_model_len`` (capped at the configured one) for which no
    request overflows ``locked_unfixed``, for a request alone / for any
    chunking a busy scheduler or a prefix-cache hit can produce.
    ``fixed_safe_any_schedule``: the same bound against ``locked_fixed``.
    ``max_num_batched_tokens_source``: where the chunk size came from
    (given, vLLM's default, a preset); it decides which chunk is refused first.
    """

    config: EngineConfig
    locked_unfixed: int
    locked_fixed: int
    locked_source: str
    requests: list[RequestPrediction]
    first_failing_prompt: int | None
    safe_max_model_len_alone: int | None
    safe_max_model_len_any_schedule: int | None
    fixed_safe_any_schedule: int | None
    short_chunks_use_workspace: bool = False
    notes: list[str] = field(default_factory=list)
    max_num_batched_tokens_source: str = "EngineConfig"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "max_num_batched_tokens_source": self.max_num_batched_tokens_source,
            "locked_unfixed_bytes": self.locked_unfixed,
            "locked_fixed_bytes": self.locked_fixed,
            "locked_source": self.locked_source,
            "short_chunks_use_workspace": self.short_chunks_use_workspace,
            "first_failing_prompt": self.first_failing_prompt,
            "safe_max_model_len_alone": self.safe_max_model_len_alone,
            "safe_max_model_len_any_schedule": self.safe_max_model_len_any_schedule,
            "fixed_safe_any_schedule": self.fixed_safe_any_schedule,
            "requests": [r.to_dict() for r in self.requests],
            "notes": list(self.notes),
        }

    def format(self) -> str:
        """Plain text: the per-rank shape, locked sizes, one block per request, the verdicts."""
        c = self.config
        out = [
            f"per rank: Hq {c.num_heads_per_rank}, Hk {c.num_kv_heads_per_rank}, D {c.head_dim}, "
            f"{str(c.dtype).removeprefix('torch.')}, {c.tq_max_kv_splits_for_cuda_graph} KV splits, block {c.block_size}; "
            f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
            f"chunked prefill {'on' if c.enable_chunked_prefill else 'off'}, max_model_len {c.max_model_len}, "
            f"kv_cache_dtype {c.kv_cache_dtype}",
            f"workspace at lock: {format_mb(self.locked_unfixed)} MB without PR #44053 ({self.locked_source}), "
            f"{format_mb(self.locked_fixed)} MB with it",
        ]
        out.append(f"chunks of max_num_batched_tokens {c.max_num_batched_tokens}: {self.max_num_batched_tokens_source}")
        for r in self.requests:
            if r.rejected is not None:
                out.append(f"request of {r.prompt_tokens} prompt tokens: rejected: {r.rejected} "
                           "(vLLM refuses it before it reaches the workspace)")
                continue
            out.append(f"request of {r.prompt_tokens} prompt tokens (alone), largest call per consumer:")
            for n in r.consumers:
                size = "no workspace" if n.shapes is None else f"{format_mb(n.nbytes):>7} MB"
                out.append(
                    f"  {n.consumer:<35} cached {n.cached_len:>7} q {n.q_len:>6}: {size:>12}  "
                    f"{'fits' if n.fits_unfixed else 'OVERFLOWS'} without the fix, {'fits' if n.fits_fixed else 'OVERFLOWS'} with it"
                )
            for label, first, locked in (("without", r.first_refused_unfixed, self.locked_unfixed),
                                         ("with", r.first_refused_fixed, self.locked_fixed)):
                if first is not None:
                    out.append(
                        f"  first refused call {label} the fix (vLLM dies here): {first.consumer}, cached {first.cached_len} "
                        f"q {first.q_len}: {format_mb(first.nbytes)} MB > {format_mb(locked)} MB at lock"
                    )
            out.append(f"  -> {r.verdict}")
        if self.first_failing_prompt is not None:
            out.append(f"shortest prompt that crashes without the fix (alone): {self.first_failing_prompt} tokens")
        out.append(
            f"safe max_model_len without the fix: {self.safe_max_model_len_alone} (requests alone), "
            f"{self.safe_max_model_len_any_schedule} (any chunking); with the fix: {self.fixed_safe_any_schedule} (any chunking)"
        )
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def locked_bytes_without_fix(config: EngineConfig) -> int:
    """Workspace bytes at lock before PR #44053: the split-KV decode call at the largest captured batch.

    The profile run is one prefill with no cached tokens (no TurboQuant
    workspace call); CUDA graph capture runs decode at each capture size, the
    largest being ``max_num_seqs`` (:meth:`EngineConfig.capture_sizes`); with
    ``enforce_eager`` the warm-up still runs decode at ``max_num_seqs``.
    0 for a non-TurboQuant cache. Checked against vLLM's ``_decode_attention`` by ``parity/``.
    """
    if not config.is_turboquant:
        return 0
    batch = config.max_num_seqs if config.enforce_eager else max(config.capture_sizes())
    return _bytes(
        decode_workspace_shapes(batch, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    )


def _need_any_schedule(config: EngineConfig, length: int, short: bool) -> int:
    """Largest call any chunk of a request of ``length`` tokens can make, under any chunking.

    A continuation chunk has ``cached_len >= 1`` and ``q_len <= max_num_batched_tokens``;
    a busy scheduler can cut ``q_len`` anywhere and a prefix-cache hit can set
    ``cached_len`` (also with chunked prefill off, where the step budget is
    ``max_num_batched_tokens >= max_model_len``). Dequant buffers grow with
    ``cached_len <= length - 129``; short chunks' decode rows (if they use the
    workspace) with ``q_len <= 128``.
    """
    if length < 2 or not config.is_turboquant:
        return 0
    m = config.max_num_batched_tokens
    need = 0
    if short:
        need = _chunk_bytes(config, 1, min(CONTINUATION_DECODE_THRESHOLD, length - 1, m), True)
    c_max = length - (CONTINUATION_DECODE_THRESHOLD + 1)
    if c_max >= 1 and m > CONTINUATION_DECODE_THRESHOLD:
        need = max(need, _chunk_bytes(config, c_max, CONTINUATION_DECODE_THRESHOLD + 1, short))
    return need


def _first_failing_alone(config: EngineConfig, locked: int, limit: int, short: bool) -> int | None:
    """Shortest prompt (<= ``limit``) whose chunks, prefilled alone, overflow ``locked``."""
    if not config.is_turboquant or not config.enable_chunked_prefill:
        return None  # one chunk, no cached tokens
    m = config.max_num_batched_tokens
    if short:
        # Region k holds prompts k*m+1 .. (k+1)*m; its last chunk has cached k*m.
        # The short-chunk need grows with q up to 128; above it the dequant need is flat.
        for start in range(m, limit, m):
            top = min(m, limit - start)
            hi = min(top, CONTINUATION_DECODE_THRESHOLD)
            if _chunk_bytes(config, start, hi, True) > locked:
                lo = 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if _chunk_bytes(config, start, mid, True) > locked:
                        hi = mid
                    else:
                        lo = mid + 1
                return start + lo
            if top > CONTINUATION_DECODE_THRESHOLD and _chunk_bytes(config, start, CONTINUATION_DECODE_THRESHOLD + 1, True) > locked:
                return start + CONTINUATION_DECODE_THRESHOLD + 1
        return None
    if m <= CONTINUATION_DECODE_THRESHOLD:
        return None  # every chunk is short: no workspace in vLLM
    # Chunk k (k >= 1) starts at cached = k*m; it takes the dequant path once q > 128.
    k_max = (limit - CONTINUATION_DECODE_THRESHOLD - 1) // m
    if k_max < 1 or _chunk_bytes(config, k_max * m, m, False) <= locked:
        return None
    lo, hi = 1, k_max  # smallest k whose dequant call overflows
    while lo < hi:
        mid = (lo + hi) // 2
        if _chunk_bytes(config, mid * m, m, False) > locked:
            hi = mid
        else:
            lo = mid + 1
    return lo * m + CONTINUATION_DECODE_THRESHOLD + 1


def safe_max_model_len(
    config: EngineConfig,
    locked_bytes: int,
    *,
    schedule: str = "any",
    limit: int | None = None,
    short_chunks_use_workspace: bool = False,
) -> int | None:
    """Largest ``max_model_len`` (<= ``limit``, default ``config.max_model_len``) whose requests all fit ``locked_bytes``.

    ``schedule="alone"``: each request prefilled alone in chunks of
    ``max_num_batched_tokens``. ``"any"``: any chunking (busy scheduler,
    prefix-cache hits; see :func:`_need_any_schedule`), the bound to trust on
    a real server. Returns None if even a 2-token prompt can overflow.
    Raises ``ValueError`` for a bad ``schedule`` or ``locked_bytes``.
    """
    if schedule not in ("alone", "any"):
        raise ValueError(f"schedule must be 'alone' or 'any', got {schedule!r}")
    if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
        raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
    top = config.max_model_len if limit is None else limit
    if not config.is_turboquant:
        return top
    short = short_chunks_use_workspace
    if schedule == "alone":
        first = _first_failing_alone(config, locked_bytes, top, short)
        if first is None:
            return top
        return None if first <= 2 else first - 1
    if _need_any_schedule(config, 2, short) > locked_bytes:
        return None
    if _need_any_schedule(config, top, short) <= locked_bytes:
        return top
    lo, hi = 2, top  # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _need_any_schedule(config, mid, short) <= locked_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def _rejection(config: EngineConfig, n: int) -> str | None:
    """Why vLLM 0.33's input processor refuses a prompt of ``n`` tokens, or None.

    ``InputProcessor`` rejects a decoder prompt longer than ``max_model_len``,
    and (for generation) one of exactly ``max_model_len`` tokens, which leaves
    no room for the first output token. Either way the request never reaches
    the scheduler, so it makes no workspace call.
    """
    if n > config.max_model_len:
        return f"exceeds max_model_len ({config.max_model_len})"
    if n == config.max_model_len:
        return f"prompt plus one output token exceeds max_model_len ({config.max_model_len})"
    return None


def _serving_calls(config: EngineConfig, n: int, short: bool) -> list[tuple[str, int, int, Any]]:
    """The workspace calls a prompt of ``n`` tokens makes, in serving order: ``[(consumer, cached, q, shapes)]``.

    Its prefill chunks (chunks of ``max_num_batched_tokens`` with chunked
    prefill on, else one chunk), each one that asks the workspace for
    something, then its first decode step (one row, ``cached_len = n``).
    """
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else n
    calls = []
    for cached, q in prompt_chunks(n, budget):
        consumer, shapes = chunk_shapes(config, cached, q, short_chunks_use_workspace=short)
        if consumer != "prefill":
            calls.append((consumer, cached, q, shapes))
    dec = decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    calls.append((DECODE, n, 1, dec))
    return calls


def _request_prediction(config: EngineConfig, n: int, locked_unfixed: int, locked_fixed: int, short: bool) -> RequestPrediction:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prompt_tokens must be ints >= 1, got {n!r}")
    rejected = _rejection(config, n)
    if rejected is not None:
        return RequestPrediction(n, (), 0, False, False, rejected=rejected)
    best: dict[str, ConsumerNeed] = {}
    first: dict[int, ConsumerNeed] = {}
    for consumer, cached, q, shapes in _serving_calls(config, n, short):
        b = _bytes(shapes)
        need = ConsumerNeed(consumer, cached, q, shapes, b, b <= locked_unfixed, b <= locked_fixed)
        if consumer not in best or b > best[consumer].nbytes:
            best[consumer] = need
        for locked in (locked_unfixed, locked_fixed):
            if shapes is not None and b > locked and locked not in first:
                first[locked] = need
    needs = tuple(best[k] for k in (DECODE, SHORT_CHUNK, DEQUANT_CHUNK) if k in best)
    top = max(x.nbytes for x in needs)
    return RequestPrediction(
        n, needs, top, top > locked_unfixed, top > locked_fixed,
        first_refused_unfixed=first.get(locked_unfixed), first_refused_fixed=first.get(locked_fixed),
    )


BUG_REPORT_REQUIRED_MB = "2.00"
"""The size the bug report (seed 003, vLLM 0.20) quotes for the refused ``_continuation_prefill`` call, as printed."""
BUG_REPORT_LOCKED_MB = "0.26"
"""The workspace size at lock the bug report quotes, as printed (``current size is 0.26 MB``)."""


def bug_report_max_num_batched_tokens(config: EngineConfig) -> int | None:
    """The ``max_num_batched_tokens`` the bug report's "requires 2.00 MB" implies for this deployment, or None.

    The report gives no ``--max-num-batched-tokens``. For a request alone,
    the first call vLLM refuses is the first continuation chunk that takes
    the dequant path, at ``cached_len = max_num_batched_tokens`` (when that
    already overflows); its two fp16 buffers of ``(1, Hk, round_up(cached_len,
    block_size), D)`` take ``2 * Hk * cached * D * 2`` bytes. This returns the
    smallest block-aligned chunk size whose first refused call prints as
    ``BUG_REPORT_REQUIRED_MB`` MB (nemotron per rank: Hk 1, D 128 -> 4096,
    two ``(1, 1, 4096, 128)`` buffers = 2 MiB). None unless this deployment
    locks at the report's ``BUG_REPORT_LOCKED_MB`` MB, is TurboQuant with
    chunked prefill, or if no chunk size fits.
    """
    if not config.is_turboquant or not config.enable_chunked_prefill:
        return None
    locked = locked_bytes_without_fix(config)
    if format_mb(locked) != BUG_REPORT_LOCKED_MB:
        return None
    blk = config.block_size
    per_block = _bytes(continuation_workspace_shapes(blk, config.num_kv_heads_per_rank, config.head_dim, blk))
    target = float(BUG_REPORT_REQUIRED_MB) * (1 << 20)
    guess = max(1, round(target / per_block))
    for blocks in range(max(1, guess - 2), guess + 3):
        m = blocks * blk
        if m <= CONTINUATION_DECODE_THRESHOLD:
            continue
        if m < config.max_num_seqs:
            continue
        cfg = config.replace(max_num_batched_tokens=m, max_model_len=max(config.max_model_len, 2 * m + 1))
        first = _request_prediction(cfg, 2 * m, locked, locked, False).first_refused_unfixed
        if first is not None and format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            return m
    return None


def _bug_report_note(pred: Prediction) -> str | None:
    """A note when a request's first refused call differs from the report's 2.00 MB only by ``max_num_batched_tokens``."""
    c = pred.config
    if pred.locked_source != "decode at the largest captured batch":
        return None
    m = bug_report_max_num_batched_tokens(c)
    if m is None or m == c.max_num_batched_tokens:
        return None
    if m < c.max_num_seqs:
        return None
    other = c.replace(max_num_batched_tokens=m)
    for r in pred.requests:
        first = r.first_refused_unfixed
        if first is None or format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            continue
        theirs = _request_prediction(other, r.prompt_tokens, pred.locked_unfixed, pred.locked_unfixed, pred.short_chunks_use_workspace)
        t = theirs.first_refused_unfixed
        if t is None or format_mb(t.nbytes) != BUG_REPORT_REQUIRED_MB:
            continue
        hk, d = c.num_kv_heads_per_rank, c.head_dim
        alloc = t.shapes[0][0][2]
        return (
            f"the bug report's '{BUG_REPORT_REQUIRED_MB} MB' is the first refused call with max_num_batched_tokens {m}: "
            f"cached {t.cached_len}, two fp16 (1, {hk}, {alloc}, {d}) buffers = 2 x {hk} x {alloc} x {d} x 2 bytes = "
            f"{t.nbytes:,} bytes. The report does not give max_num_batched_tokens; {m} is inferred from its "
            f"{BUG_REPORT_REQUIRED_MB} MB. This prediction assumes {c.max_num_batched_tokens} "
            f"({pred.max_num_batched_tokens_source}), so a prompt of {r.prompt_tokens} tokens is refused earlier, at cached "
            f"{first.cached_len} with {format_mb(first.nbytes)} MB: the only difference is max_num_batched_tokens"
        )
    return None


def predict(
    config: EngineConfig,
    prompt_tokens: Sequence[int] = (),
    *,
    locked_bytes: int | None = None,
    short_chunks_use_workspace: bool = False,
    max_num_batched_tokens_source: str = "EngineConfig",
) -> Prediction:
    """Per consumer, the workspace each prompt needs, whether it overflows, and the safe ``max_model_len``.

    Args:
        config: the deployment (see :func:`engine_config_from_vllm`).
        prompt_tokens: prompt lengths to check (default: ``max_model_len - 1``,
            the longest prompt vLLM accepts). Longer ones are reported as
            rejected (:attr:`RequestPrediction.rejected`), not as crashes.
        locked_bytes: the workspace size at lock without the fix, if measured
            (e.g. :meth:`WorkspaceTracer.size_at_lock` or vLLM's
            ``VLLM_DEBUG_WORKSPACE=1`` log); default :func:`locked_bytes_without_fix`.
        max_num_batched_tokens_source: where ``config.max_num_batched_tokens``
            came from, for the report (e.g. "given", "vLLM default ...").
        short_chunks_use_workspace: False models vLLM 0.33 (chunks of <= 128
            new tokens make no workspace call); True models tqlab's engine.

    The size with the fix is ``max(locked_unfixed, largest reservation call)``
    (:func:`tqlab.reservation.reservation_plan`, checked against vLLM's
    ``TurboQuantMetadataBuilder`` by ``parity/``). Raises ``ValueError`` for a
    bad length or size. Not TurboQuant (``kv_cache_dtype="auto"``): no consumer.
    """
    if locked_bytes is None:
        locked_unfixed, source = locked_bytes_without_fix(config), "decode at the largest captured batch"
    else:
        if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
            raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
        locked_unfixed, source = locked_bytes, "measured"
    locked_fixed = max(locked_unfixed, plan_bytes(reservation_plan(config)))
    short = short_chunks_use_workspace
    tokens = list(prompt_tokens) or [max(1, config.max_model_len - 1)]
    notes: list[str] = []
    if not config.is_turboquant:
        notes.append(f"kv_cache_dtype={config.kv_cache_dtype!r}: no TurboQuant workspace consumer")
        reqs: list[RequestPrediction] = []
    else:
        reqs = [_request_prediction(config, n, locked_unfixed, locked_fixed, short) for n in tokens]
        if not config.enable_chunked_prefill or config.max_num_batched_tokens <= CONTINUATION_DECODE_THRESHOLD:
            notes.append(
                "PR #44053 reserves continuation buffers only with chunked prefill on and max_num_batched_tokens > 128; "
                "a prefix-cache hit still makes continuation chunks (see the any-chunking bound)"
            )
    if config.num_ubatches > 1:
        notes.append("DBO: vLLM's _reserve_workspace sizes only the slot it runs in (slot 0); slot 1 can still overflow")
    top = config.max_model_len
    pred = Prediction(
        config=config,
        locked_unfixed=locked_unfixed,
        locked_fixed=locked_fixed,
        locked_source=source,
        requests=reqs,
        first_failing_prompt=_first_failing_alone(config, locked_unfixed, top, short) if config.is_turboquant else None,
        safe_max_model_len_alone=safe_max_model_len(config, locked_unfixed, schedule="alone", short_chunks_use_workspace=short),
        safe_max_model_len_any_schedule=safe_max_model_len(config, locked_unfixed, schedule="any", short_chunks_use_workspace=short),
        fixed_safe_any_schedule=safe_max_model_len(config, locked_fixed, schedule="any", short_chunks_use_workspace=short),
        short_chunks_use_workspace=short,
        notes=notes,
        max_num_batched_tokens_source=max_num_batched_tokens_source,
    )
    if config.is_turboquant:
        note = _bug_report_note(pred)
        if note is not None:
            pred.notes.append(note)
    return pred


def inspect_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None = None,
    model_config: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    preset: str | None = None,
    prompt_tokens: Sequence[int] = (),
    locked_bytes: int | None = None,
    gpu_memory_gib: float | None = None,
    demo: bool = False,
    json_path: str | os.PathLike | None = None,
    out: TextIO | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """``tqlab inspect-vllm``: predict the locked-workspace crash for a vLLM deployment.

    Args:
        engine_args: the ``vllm serve ...`` command line (string or argv) or a dict.
        model_config: path to the model's ``config.json`` (or its folder) or the dict.
        preset: instead of ``model_config``, a tqlab preset (``data/presets``);
            ``engine_args`` then override its fields.
        prompt_tokens: prompt lengths to check (default ``max_model_len``).
        locked_bytes: measured workspace size at lock without the fix (bytes).
        gpu_memory_gib: GPU memory, for vLLM's default batch limits.
        demo: also send the first crashing chunk through vLLM's own classes
            on CPU, without and with the fix (:func:`run_vllm_seed_scenario`;
            needs vLLM, else skipped with a note; the fixed run is skipped when
            its reservation would exceed 1 GiB of host memory).
        json_path: also write the report there (JSON).
        out: where the text goes (default ``sys.stdout``).
        quiet: print nothing.

    Returns the report dict: ``prediction`` (:meth:`Prediction.to_dict`, its
    ``notes`` included; per request ``verdict``, ``rejected``,
    ``first_refused_unfixed``/``_fixed``; ``max_num_batched_tokens`` and
    ``max_num_batched_tokens_source``: "given: ...", "not given: vLLM's
    default for ..." or "preset ..."), ``vllm_version`` (None without vLLM), ``text`` (what
    was printed) and ``demo`` (list of :meth:`ScenarioResult.to_dict`, or None)
    when asked. Raises ``ValueError`` when not exactly one of
    ``model_config``/``preset`` is given, or for bad arguments.

    CLI (wired by ``tqlab.cli``)::

        tqlab inspect-vllm --config config.json \\
            --args "vllm serve M --tensor-parallel-size 8 --max-model-len 131072 ..." --tokens 8192 --demo
    """
    if (model_config is None) == (preset is None):
        raise ValueError("give exactly one of model_config (a config.json) or preset")
    if preset is not None:
        overrides, ignored = parse_engine_args(engine_args)
        overrides.pop("model", None)
        if "dtype" in overrides:
            overrides["dtype"] = parse_dtype(overrides["dtype"])
        config = EngineConfig.from_preset(preset, **overrides)
        notes = [f"preset {preset}"] + (["ignored engine args: " + ", ".join(ignored)] if ignored else [])
        if "max_num_batched_tokens" in overrides:
            source = "given: --max-num-batched-tokens"
        else:
            source = f"preset {preset}"
            if bug_report_max_num_batched_tokens(config) == config.max_num_batched_tokens:
                source += (f": inferred from the bug report's {BUG_REPORT_REQUIRED_MB} MB; the report does not give "
                           "max_num_batched_tokens")
    else:
        config, notes = engine_config_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib)
        if "max_num_batched_tokens" in parse_engine_args(engine_args)[0]:
            source = "given: --max-num-batched-tokens"
        elif config.enable_chunked_prefill:
            source = f"not given: vLLM's default for {vllm_default_limits('serve', gpu_memory_gib)[2]}"
        else:
            source = "not given: vLLM's default with chunked prefill off, max(max_model_len, max_num_seqs)"
        notes = [n for n in notes if not n.startswith("max_num_batched_tokens not given")]  # said by the source line
    pred = predict(config, prompt_tokens, locked_bytes=locked_bytes, max_num_batched_tokens_source=source)
    pred.notes[:0] = notes
    report: dict[str, Any] = {"prediction": pred.to_dict(), "vllm_version": vllm_version()}
    text = [pred.format()]
    if demo:
        if not vllm_available():
            report["demo"] = None
            text.append("demo skipped: vLLM is not importable here (bash parity/install.sh, then use .venv-parity/bin/python)")
        elif pred.first_failing_prompt is None:
            report["demo"] = None
            text.append("demo skipped: no prompt up to max_model_len overflows without the fix")
        else:
            cached, q = prompt_chunks(pred.first_failing_prompt, config.max_num_batched_tokens)[-1]
            runs = [False] + ([True] if pred.locked_fixed <= 1 << 30 else [])
            res = [run_vllm_seed_scenario(config, cached_len=cached, q_len=q, fixed=f) for f in runs]
            if len(runs) == 1:
                text.append("fixed demo skipped: its reservation would take more than 1 GiB of host memory")
            report["demo"] = [r.to_dict() for r in res]
            text.append(
                f"vLLM {vllm_version()}'s own classes on CPU, the crashing chunk ({q} new tokens after {cached} cached):"
            )
            for r in res:
                text.append(f"  {'with' if r.fixed else 'without'} PR #44053: " + (r.error or "buffers granted (" + str(r.kernel_error) + " at the kernel launch, as expected on CPU)"))
    report["text"] = "\n".join(text)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report, indent=2, default=str))
    if not quiet:
        print(report["text"], file=sys.stdout if out is None else out)
    return report
