"""The ``inspect-vllm`` report: per workspace consumer, what a request of N tokens needs against the locked size.

Every number comes from :mod:`tqlab.predict.analysis` (the one predictor, vLLM 0.33's semantics);
this module only arranges it per consumer and formats it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO


from tqlab.predict import analysis
from tqlab.core.config import EngineConfig
from tqlab.core.notes import NoteKind
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    decode_workspace_shapes,
)
from tqlab.core.workspace import compute_layout, format_mb
from tqlab.vllm.cpu_harness import run_vllm_seed_scenario
from tqlab.vllm.tracer import vllm_available, vllm_version
from tqlab.vllm.deployment import deployment_from_preset, deployment_from_vllm

# --------------------------------------------------------------------------- #
# The predictor                                                               #
# --------------------------------------------------------------------------- #


SHORT_CHUNK = "short continuation (decode kernel)"
DEQUANT_CHUNK = "continuation prefill (dequant)"
DECODE = "split-KV decode"


def chunk_shapes(config: EngineConfig, cached_len: int, q_len: int):
    """``(consumer, shapes or None)``: the workspace call one prefill chunk makes.

    The path is :func:`tqlab.core.reservation.chunk_workspace_request`'s (vLLM 0.33's
    ``_prefill_attention``): ``"prefill"`` for a first chunk, :data:`SHORT_CHUNK` (decode
    kernel with its own scratch, no workspace) for ``q_len <= 128``, :data:`DEQUANT_CHUNK`
    with the dequant buffers above.
    """
    req = chunk_workspace_request(config, cached_len, q_len)
    return {"prefill": "prefill", "decode_kernel": SHORT_CHUNK, "continuation": DEQUANT_CHUNK}[req.path], req.shapes


def _bytes(shapes) -> int:
    return 0 if shapes is None else compute_layout(shapes).total_bytes


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
    """A prompt of ``prompt_tokens`` prefilled alone (chunks of the config's ``chunk_budget``), then decoded.

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
    locked_unfixed: int | None
    locked_fixed: int | None
    locked_source: str
    requests: list[RequestPrediction]
    first_failing_prompt: int | None
    safe_max_model_len_alone: int | None
    safe_max_model_len_any_schedule: int | None
    fixed_safe_any_schedule: int | None
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
            (f"workspace at lock: {format_mb(self.locked_unfixed)} MB without PR #44053 ({self.locked_source}), "
             f"{format_mb(self.locked_fixed)} MB with it" if self.locked_unfixed is not None else
             f"workspace never locked ({self.locked_source}): no request can hit the locked-workspace assertion"),
        ]
        out.append(f"chunks of {c.chunk_budget} tokens (max_num_batched_tokens {c.max_num_batched_tokens}: "
                   f"{self.max_num_batched_tokens_source}"
                   + (f"; max_num_scheduled_tokens {c.max_num_scheduled_tokens})" if c.chunk_budget < c.max_num_batched_tokens
                      else ")"))
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
                if first is not None and locked is not None:
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
    """Workspace bytes at lock before PR #44053, 0 when nothing locks or the cache is not TurboQuant.

    :func:`tqlab.predict.analysis.unfixed_locked_bytes` (vLLM 0.33: decode at the largest captured
    decode batch; an eager start-up never locks). Kept for callers of ``tqlab.vllm``.
    """
    return analysis.unfixed_locked_bytes(config) if config.is_turboquant else 0


def safe_max_model_len(config: EngineConfig, locked_bytes: int, *, schedule: str = "any",
                       limit: int | None = None) -> int | None:
    """:func:`tqlab.predict.analysis.safe_max_model_len`, with the configured ``max_model_len`` for a non-TurboQuant cache."""
    if not config.is_turboquant:
        return config.max_model_len if limit is None else limit
    return analysis.safe_max_model_len(config, locked_bytes, schedule=schedule, limit=limit)


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


def _consumer_needs(config: EngineConfig, n: int, locked_unfixed, locked_fixed) -> dict[str, ConsumerNeed]:
    """Each consumer's largest call for a prompt of ``n`` alone, then one decode step (O(1))."""
    def need(consumer, cached, q, shapes):
        b = _bytes(shapes)
        fits = [locked is None or shapes is None or b <= locked for locked in (locked_unfixed, locked_fixed)]
        return ConsumerNeed(consumer, cached, q, shapes, b, *fits)

    out = {}
    chunks = analysis.prompt_workspace_chunks(config, n)
    if "continuation" in chunks:
        out[DEQUANT_CHUNK] = need(DEQUANT_CHUNK, *chunks["continuation"], chunk_shapes(config, *chunks["continuation"])[1])
    if "decode_kernel" in chunks:
        out[SHORT_CHUNK] = need(SHORT_CHUNK, *chunks["decode_kernel"], None)
    if analysis.decode_uses_workspace(config):
        shapes = decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim,
                                         config.tq_max_kv_splits_for_cuda_graph, config.dtype)
        out[DECODE] = need(DECODE, n, 1, shapes)
    return out


def _first_refused(config: EngineConfig, n: int, locked, locked_unfixed, locked_fixed) -> ConsumerNeed | None:
    """The first call refused at ``locked`` bytes, or None; its ``fits_unfixed``/``fits_fixed`` say whether
    it fits each locked size (a call refused without the fix may fit with it)."""
    call = analysis.first_refused_call(config, n, locked)
    if call is None:
        return None
    b = call["required_bytes"]
    fits = [size is None or b <= size for size in (locked_unfixed, locked_fixed)]
    if call["caller"] == "_continuation_prefill":
        cached, q = call["cached_len"], call["q_len"]
        return ConsumerNeed(DEQUANT_CHUNK, cached, q, chunk_shapes(config, cached, q)[1], b, *fits)
    shapes = decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim,
                                     config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    return ConsumerNeed(DECODE, n, 1, shapes, b, *fits)


def _request_prediction(config: EngineConfig, n: int, locked_unfixed, locked_fixed) -> RequestPrediction:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prompt_tokens must be ints >= 1, got {n!r}")
    rejected = _rejection(config, n)
    if rejected is not None:
        return RequestPrediction(n, (), 0, False, False, rejected=rejected)
    best = _consumer_needs(config, n, locked_unfixed, locked_fixed)
    needs = tuple(best[k] for k in (DECODE, SHORT_CHUNK, DEQUANT_CHUNK) if k in best)
    first_u = _first_refused(config, n, locked_unfixed, locked_unfixed, locked_fixed)
    first_f = _first_refused(config, n, locked_fixed, locked_unfixed, locked_fixed)
    return RequestPrediction(
        n, needs, max((x.nbytes for x in needs), default=0), first_u is not None, first_f is not None,
        first_refused_unfixed=first_u, first_refused_fixed=first_f,
    )


BUG_REPORT_REQUIRED_MB = "2.00"
"""The size the bug report (vLLM 0.20) quotes for the refused ``_continuation_prefill`` call, as printed."""
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
        first = _request_prediction(cfg, 2 * m, locked, locked).first_refused_unfixed
        if first is not None and format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            return m
    return None


def _bug_report_note(pred: Prediction) -> str | None:
    """A note when a request's first refused call differs from the report's 2.00 MB only by ``max_num_batched_tokens``."""
    c = pred.config
    if not pred.locked_source.startswith("decode at the largest captured batch"):
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
        theirs = _request_prediction(other, r.prompt_tokens, pred.locked_unfixed, pred.locked_unfixed)
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


def _safe(config: EngineConfig, locked: int | None, schedule: str) -> int | None:
    return config.max_model_len if locked is None else safe_max_model_len(config, locked, schedule=schedule)


def predict(
    config: EngineConfig,
    prompt_tokens: Sequence[int] = (),
    *,
    locked_bytes: int | None = None,
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
            ``VLLM_DEBUG_WORKSPACE=1`` log); default :func:`tqlab.predict.analysis.locked_bytes`
            (None, "never locked", for an eager or ``cudagraph_mode`` NONE start-up).
        max_num_batched_tokens_source: where ``config.max_num_batched_tokens``
            came from, for the report (e.g. "given", "vLLM default ...").

    Every size is :mod:`tqlab.predict.analysis`'s. Raises ``ValueError`` for a bad length or
    size. Not TurboQuant (``kv_cache_dtype="auto"``): no consumer.
    """
    if locked_bytes is None:
        locked_unfixed = analysis.locked_bytes(config, fix=False)
        locked_fixed = analysis.locked_bytes(config, fix=True)
        source = ("decode at the largest captured batch" if locked_unfixed is not None else
                  "vLLM 0.33 locks only at the end of CUDA graph capture: enforce_eager / cudagraph_mode NONE")
        if locked_unfixed is not None and config.num_speculative_tokens > 0:
            k = config.num_speculative_tokens
            source = (f"decode at the largest captured batch; with {k} speculative tokens its {1 + k}-token rows "
                      "take the prefill path as first chunks and ask the workspace for nothing (vLLM 0.33 "
                      "turboquant_attn: reorder_batch_threshold 1)")
        if not config.is_turboquant and locked_unfixed is not None:
            locked_unfixed = locked_fixed = 0
    elif analysis.locked_bytes(config, fix=False) is None:  # eager / cudagraph_mode NONE: vLLM never locks
        if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
            raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
        locked_unfixed = locked_fixed = None
        source = (f"vLLM 0.33 locks only at the end of CUDA graph capture, which this deployment (enforce_eager / "
                  f"cudagraph_mode NONE) never runs: the measured {locked_bytes:,} bytes are never locked")
    else:
        if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
            raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
        locked_unfixed, source = locked_bytes, "measured"
        fixed = analysis.locked_bytes(config.replace(lock_workspace_when_eager=True), fix=True)
        locked_fixed = max(locked_bytes, fixed if config.is_turboquant else 0)
    tokens = list(prompt_tokens) or [max(1, config.max_model_len - 1)]
    notes: list[str] = []
    if not config.is_turboquant:
        notes.append(f"kv_cache_dtype={config.kv_cache_dtype!r}: no TurboQuant workspace consumer")
        reqs: list[RequestPrediction] = []
    else:
        reqs = [_request_prediction(config, n, locked_unfixed, locked_fixed) for n in tokens]
        if not config.enable_chunked_prefill or config.max_num_batched_tokens <= CONTINUATION_DECODE_THRESHOLD:
            notes.append(
                "PR #44053 reserves continuation buffers only with chunked prefill on and max_num_batched_tokens > 128; "
                + ("a prefix-cache hit still makes continuation chunks (see the any-chunking bound)"
                   if config.enable_prefix_caching else
                   "with prefix caching off too, the any-chunking bound counts none; a KV connector's external hit, "
                   "a multimodal encoder budget or a streaming-input session can still make one (not modelled)")
            )
    if config.num_ubatches > 1:
        notes.append("DBO: vLLM's _reserve_workspace sizes only the slot it runs in (slot 0); slot 1 can still overflow")
    tq = config.is_turboquant
    pred = Prediction(
        config=config,
        locked_unfixed=locked_unfixed,
        locked_fixed=locked_fixed,
        locked_source=source,
        requests=reqs,
        first_failing_prompt=(analysis.first_failing_prompt(config, locked_unfixed)
                              if tq and locked_unfixed is not None else None),
        safe_max_model_len_alone=_safe(config, locked_unfixed, "alone"),
        safe_max_model_len_any_schedule=_safe(config, locked_unfixed, "any"),
        fixed_safe_any_schedule=_safe(config, locked_fixed, "any"),
        notes=notes,
        max_num_batched_tokens_source=max_num_batched_tokens_source,
    )
    if tq and locked_unfixed is not None:
        note = _bug_report_note(pred)
        if note is not None:
            pred.notes.append(note)
    return pred


def _demo(config: EngineConfig, pred: Prediction, report: dict[str, Any], text: list[str]) -> None:
    """``inspect-vllm --demo``: the first crashing chunk through vLLM's own classes on CPU, without and with the fix."""
    if not vllm_available():
        report["demo"] = None
        text.append("demo skipped: vLLM is not importable here (bash parity/install.sh, then use .venv-parity/bin/python)")
    elif pred.first_failing_prompt is None:
        report["demo"] = None
        text.append("demo skipped: no prompt up to max_model_len overflows without the fix")
    else:
        cached, q = analysis.prompt_workspace_chunks(config, pred.first_failing_prompt)["continuation"]
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


def stable_json(config: EngineConfig, sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The documented top-level object of ``inspect-vllm --json`` (the same as ``tqlab plan --json``).

    :meth:`tqlab.predict.analysis.Prediction.to_json` for the deployment as configured, without the fix.
    A non-TurboQuant cache makes none of these workspace calls in vLLM: verdict ``ok``, 0 bytes.
    """
    obj = analysis.predict(config, sources=sources).to_json()
    if not config.is_turboquant and obj["locked_bytes"] is not None:
        obj.update(locked_bytes=0, locked_bytes_with_fix=0, verdict="ok", first_failing_prompt_tokens=None,
                   first_refused_call=None)
    return obj


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
        json_path: also write the report there (JSON); ``"-"``: print only the JSON, to ``out``.
        out: where the text goes (default ``sys.stdout``).
        quiet: print nothing.

    Returns the report dict: ``prediction`` (:meth:`Prediction.to_dict`, its
    ``notes`` included; per request ``verdict``, ``rejected``,
    ``first_refused_unfixed``/``_fixed``; ``max_num_batched_tokens`` and
    ``max_num_batched_tokens_source``: where it came from, as in ``sources`` ("flag --...",
    "vLLM default ...", "preset ..."), ``sources`` (every field's origin), ``vllm_version`` (None without vLLM), ``text`` (what
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
        dep = deployment_from_preset(engine_args, preset)
    else:
        dep = deployment_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib)
    config, notes, sources = dep.config, list(dep.notes), dict(dep.sources)
    source = sources.get("max_num_batched_tokens", "vLLM default")
    if preset is not None and source == f"preset {preset}" and (
        bug_report_max_num_batched_tokens(config) == config.max_num_batched_tokens
    ):
        source += (f": inferred from the bug report's {BUG_REPORT_REQUIRED_MB} MB; the report does not give "
                   "max_num_batched_tokens")
    notes = [n for n in notes  # the defaulted chunk size is said by the source line
             if not (n.kind is NoteKind.DEFAULTED and n.field == "max_num_batched_tokens")]
    pred = predict(config, prompt_tokens, locked_bytes=locked_bytes, max_num_batched_tokens_source=source)
    pred.notes[:0] = notes
    report: dict[str, Any] = stable_json(config, {**sources, "max_num_batched_tokens": source})
    report.update({"prediction": pred.to_dict(), "vllm_version": vllm_version()})
    text = [pred.format()]
    if demo:
        _demo(config, pred, report, text)
    report["text"] = "\n".join(text)
    if json_path is not None and str(json_path) == "-":  # stdout holds only the JSON
        print(json.dumps(report, indent=2, default=str), file=sys.stdout if out is None else out)
        return report
    if json_path is not None:
        try:
            Path(json_path).write_text(json.dumps(report, indent=2, default=str))
        except OSError as e:
            raise ValueError(f"cannot write the JSON report to {str(json_path)!r}: {e.strerror}") from None
    if not quiet:
        print(report["text"], file=sys.stdout if out is None else out)
    return report
