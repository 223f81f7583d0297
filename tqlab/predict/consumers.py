"""inspect-vllm's per-consumer view of one :class:`~tqlab.predict.analysis.Prediction`: what each prompt's
calls need, consumer by consumer, against the locked size without and with PR #44053.

The deployment's numbers (locks, first failing prompt, safe lengths, verdict) are the one
:class:`~tqlab.predict.analysis.Prediction`'s. Per prompt it does compute: each TurboQuant consumer's largest
call (:func:`request_prediction`: the chunk and decode shapes of :mod:`tqlab.core.reservation`, their bytes, and
whether they fit each lock), and the first refused call as a :class:`ConsumerNeed`
(:func:`tqlab.predict.analysis.first_refused_call`, the one rule, shown by :func:`_tq_need`; another consumer's, from
:func:`tqlab.predict.analysis.predict` per prompt: :func:`other_request_prediction`). It arranges that per
consumer (:class:`ConsumerReport`) and formats it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tqlab.core.config import EngineConfig
from tqlab.core.consumers import registry as consumer_registry
from tqlab.core.consumers.base import StartUp
from tqlab.core.notes import Note
from tqlab.core.reservation import chunk_workspace_request, decode_workspace_shapes
from tqlab.core.workspace_layout import compute_layout, format_mb
from tqlab.predict import analysis
from tqlab.predict.analysis import Prediction
from tqlab.predict.consumer_text import consumer_lines, safe_len_line, verdict_head, verdict_line

__all__ = ["DECODE", "DEQUANT_CHUNK", "SHORT_CHUNK", "ConsumerNeed", "ConsumerReport", "RequestPrediction",
           "chunk_shapes", "consumer_report", "other_request_prediction", "request_prediction"]

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
class ConsumerReport:
    """inspect-vllm's report: the one :class:`Prediction` (``prediction``, without the fix) and, per
    prompt, each consumer's calls (``requests``). Sizes in bytes, lengths in tokens.

    ``locked_unfixed`` / ``locked_fixed``: the workspace at the lock without / with PR #44053
    (``prediction.locked_bytes`` / ``locked_bytes_with_fix``). ``first_failing_prompt``: shortest
    prompt that overflows ``locked_unfixed`` when prefilled alone. ``safe_max_model_len_alone`` /
    ``_any_schedule`` / ``fixed_safe_any_schedule``: the prediction's bounds.
    ``max_num_batched_tokens_source``: where the chunk size came from (given, vLLM's default, a
    preset); it decides which chunk is refused first. ``notes``: the deployment's, the
    prediction's and the report's :class:`~tqlab.core.notes.Note` s.
    """

    config: EngineConfig
    prediction: Prediction
    requests: list[RequestPrediction]
    notes: list[Note] = field(default_factory=list)
    max_num_batched_tokens_source: str = "EngineConfig"
    measured_locked_bytes: int | None = None

    @property
    def locked_unfixed(self) -> int | None:
        return self.prediction.locked_bytes

    @property
    def locked_fixed(self) -> int | None:
        return self.prediction.locked_bytes_with_fix

    @property
    def first_failing_prompt(self) -> int | None:
        return self.prediction.first_failing_prompt_tokens

    @property
    def safe_max_model_len_alone(self) -> int | None:
        return self.prediction.safe_max_model_len_alone

    @property
    def safe_max_model_len_any_schedule(self) -> int | None:
        return self.prediction.safe_max_model_len_any_schedule

    @property
    def fixed_safe_any_schedule(self) -> int | None:
        return self.prediction.fixed_safe_any_schedule

    @property
    def locked_source(self) -> str:
        """The lock's origin in words (:data:`tqlab.predict.analysis.LOCKED_SOURCES` spelled out)."""
        src, k = self.prediction.locked_source, self.config.num_speculative_tokens
        if src == "measured":
            return "measured"
        if src == "never_locked" and self.measured_locked_bytes is not None:
            return (f"vLLM locks only at the end of CUDA graph capture, which this deployment (enforce_eager / "
                    f"cudagraph_mode NONE) never runs: the measured {self.measured_locked_bytes:,} bytes are never locked")
        if src == "never_locked":
            return "vLLM locks only at the end of CUDA graph capture: enforce_eager / cudagraph_mode NONE"
        who = self.prediction.lock_set_by
        if who is not None and who != "turboquant_attn.py:_decode_attention":
            return f"the largest request before the lock: {who}"
        if who is None and not consumer_registry.turboquant_active(self.config):
            return "no modelled consumer asks the workspace before the lock"
        if k > 0:
            return (f"decode at the largest captured batch; with {k} speculative tokens its {1 + k}-token rows "
                    "take the prefill path as first chunks and ask the workspace for nothing (vLLM 0.33 "
                    "turboquant_attn: reorder_batch_threshold 1)")
        return "decode at the largest captured batch"

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
            "note_kinds": [n.kind.value if isinstance(n, Note) else "info" for n in self.notes],
        }

    def format(self) -> str:
        """Plain text: the per-rank shape, locked sizes, one block per request, the verdicts."""
        c = self.config
        out = verdict_head(self.prediction) + [
            f"per rank: Hq {c.num_heads_per_rank}, Hk {c.num_kv_heads_per_rank}, D {c.head_dim}, "
            f"{str(c.dtype).removeprefix('torch.')}, {c.tq_max_kv_splits_for_cuda_graph} KV splits, block {c.block_size}; "
            f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
            f"chunked prefill {'on' if c.enable_chunked_prefill else 'off'}, max_model_len {c.max_model_len}, "
            f"kv_cache_dtype {c.kv_cache_dtype}",
            (f"workspace at lock: {format_mb(self.locked_unfixed)} MiB without PR #44053 ({self.locked_source}), "
             f"{format_mb(self.locked_fixed)} MiB with it" if self.locked_unfixed is not None else
             f"workspace never locked ({self.locked_source}): no request can hit the locked-workspace assertion"),
        ]
        out.append(f"chunks of {c.chunk_budget} tokens (max_num_batched_tokens {c.max_num_batched_tokens}: "
                   f"{self.max_num_batched_tokens_source}"
                   + (f"; max_num_scheduled_tokens {c.max_num_scheduled_tokens})" if c.chunk_budget < c.max_num_batched_tokens
                      else ")"))
        out += consumer_lines(self.prediction)
        for r in self.requests:
            if r.rejected is not None:
                out.append(f"request of {r.prompt_tokens} prompt tokens: rejected: {r.rejected} "
                           "(vLLM refuses it before it reaches the workspace)")
                continue
            out.append(f"request of {r.prompt_tokens} prompt tokens (alone), largest call per consumer:")
            for n in r.consumers:
                size = "no workspace" if n.shapes is None else f"{format_mb(n.nbytes):>7} MiB"
                out.append(
                    f"  {n.consumer:<35} cached {n.cached_len:>7} q {n.q_len:>6}: {size:>12}  "
                    f"{'fits' if n.fits_unfixed else 'OVERFLOWS'} without the fix, {'fits' if n.fits_fixed else 'OVERFLOWS'} with it"
                )
            for label, first, locked in (("without", r.first_refused_unfixed, self.locked_unfixed),
                                         ("with", r.first_refused_fixed, self.locked_fixed)):
                if first is not None and locked is not None:
                    out.append(
                        f"  first refused call {label} the fix (vLLM dies here): {first.consumer}, cached {first.cached_len} "
                        f"q {first.q_len}: {format_mb(first.nbytes)} MiB > {format_mb(locked)} MiB at lock"
                    )
            out.append(f"  -> {r.verdict}" + (" (sized consumers only: the verdict is partial, see the first lines)"
                                               if self.prediction.unsized and not r.crashes_unfixed else ""))
        if self.first_failing_prompt is not None:
            out.append(f"shortest prompt that crashes without the fix (alone): {self.first_failing_prompt} tokens")
        out.append(safe_len_line(self.prediction))
        out.append(verdict_line(self.prediction))
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)



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


def _consumer_needs(config: EngineConfig, n: int, locked_unfixed, locked_fixed,
                    max_tokens: int = 2) -> dict[str, ConsumerNeed]:
    """Each consumer's largest call for a prompt of ``n`` alone, then (``max_tokens >= 2``) its decode steps (O(1)).

    ``max_tokens`` 1: no decode step -- vLLM 0.33 samples the first output token in the prefill's last step and
    finishes the request there (``vllm/v1/core/sched/utils.py`` ``check_stop``: ``num_output_tokens >= max_tokens``).
    """
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
    if max_tokens >= 2 and analysis.decode_uses_workspace(config):
        out[DECODE] = need(DECODE, n, 1, _decode_shapes(config))
    return out


def _decode_shapes(config: EngineConfig):
    return decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim,
                                   config.tq_max_kv_splits_for_cuda_graph, config.dtype)


def _tq_need(config: EngineConfig, n: int, call: dict[str, Any] | None, locked_unfixed,
             locked_fixed) -> ConsumerNeed | None:
    """TurboQuant's first refused call of a prompt of ``n`` tokens, ``call`` (the dict of
    :func:`tqlab.predict.analysis.first_refused_call`, the one rule; ``analysis._first_refused`` orders it among
    every consumer's), as a :class:`ConsumerNeed` with its shapes, or None; ``fits_unfixed``/``fits_fixed`` say
    whether it fits each locked size (a call refused without the fix may fit with it). No walk of its own."""
    if call is None:
        return None
    b = call["required_bytes"]
    fits = [size is None or b <= size for size in (locked_unfixed, locked_fixed)]
    if call["caller"] == "_continuation_prefill":
        cached, q = call["cached_len"], call["q_len"]
        return ConsumerNeed(DEQUANT_CHUNK, cached, q, chunk_shapes(config, cached, q)[1], b, *fits)
    return ConsumerNeed(DECODE, n, 1, _decode_shapes(config), b, *fits)


def request_prediction(config: EngineConfig, n: int, locked_unfixed: int | None,
                       locked_fixed: int | None, max_tokens: int = 2) -> RequestPrediction:
    """A prompt of ``n`` tokens alone, then ``max_tokens - 1`` decode steps: each TurboQuant consumer's largest call
    and the first refused one (``max_tokens`` 1: no decode step, as vLLM finishes the request after its prefill).

    Raises ``ValueError`` for ``n`` that is not an int >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prompt_tokens must be ints >= 1, got {n!r}")
    rejected = _rejection(config, n)
    if rejected is not None:
        return RequestPrediction(n, (), 0, False, False, rejected=rejected)
    best = _consumer_needs(config, n, locked_unfixed, locked_fixed, max_tokens)
    needs = tuple(best[k] for k in (DECODE, SHORT_CHUNK, DEQUANT_CHUNK) if k in best)
    first_u, first_f = (_tq_need(config, n, analysis.first_refused_call(config, n, locked, max_tokens=max_tokens),
                                 locked_unfixed, locked_fixed) for locked in (locked_unfixed, locked_fixed))
    return RequestPrediction(
        n, needs, max((x.nbytes for x in needs), default=0), first_u is not None, first_f is not None,
        first_refused_unfixed=first_u, first_refused_fixed=first_f,
    )


def _other_need(config: EngineConfig, call: dict[str, Any] | None, fits_fixed: bool) -> ConsumerNeed | None:
    """A refused call of another consumer than TurboQuant (``Prediction.first_refused_call``) as a
    :class:`ConsumerNeed`: its serve-time shapes come from the registry entry named by ``call["caller"]``."""
    if call is None:
        return None
    entry = next(c for c in consumer_registry.CONSUMERS if c.consumer == call["caller"])
    startup = StartUp(analysis.cudagraph_mode(config), analysis.locks_workspace(config))
    runtime = entry.sizes(config, startup).runtime
    return ConsumerNeed(call["caller"], call["cached_len"], call["q_len"], runtime[0] if runtime else None,
                        call["required_bytes"], False, fits_fixed)


def other_request_prediction(config: EngineConfig, n: int, max_tokens: int = 2,
                             locked_bytes: int | None = None) -> RequestPrediction:
    """A prompt of ``n`` tokens alone on a deployment without TurboQuant's consumers: the first call another
    consumer makes that the locked slot refuses (:func:`tqlab.predict.analysis.predict` for that prompt, without
    and with PR #44053), or none. ``consumers`` holds only that refused call. ``max_tokens`` is capped at
    ``max_model_len - n`` as vLLM caps it. Raises ``ValueError`` for ``n`` that is not an int >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prompt_tokens must be ints >= 1, got {n!r}")
    rejected = _rejection(config, n)
    if rejected is not None:
        return RequestPrediction(n, (), 0, False, False, rejected=rejected)
    k = max(1, min(max_tokens, config.max_model_len - n))
    unfixed = analysis.predict(config, n, max_tokens=k, locked_bytes=locked_bytes).first_refused_call
    fixed = analysis.predict(config, n, max_tokens=k, fix=True, locked_bytes=locked_bytes).first_refused_call
    first_u, first_f = _other_need(config, unfixed, fixed is None), _other_need(config, fixed, False)
    needs = tuple(x for x in (first_u or first_f,) if x is not None)
    return RequestPrediction(n, needs, max((x.nbytes for x in needs), default=0), first_u is not None,
                             first_f is not None, first_refused_unfixed=first_u, first_refused_fixed=first_f)


def consumer_report(config: EngineConfig, prompt_tokens: Sequence[int] = (), *, locked_bytes: int | None = None,
                    max_num_batched_tokens_source: str = "EngineConfig", max_tokens: int = 2) -> ConsumerReport:
    """Per consumer, the workspace each prompt needs, whether it overflows, and the safe ``max_model_len``.

    Args:
        config: the deployment (see :func:`tqlab.vllm.deployment.deployment_from_vllm`).
        prompt_tokens: prompt lengths to check (default: ``max_model_len - 1``,
            the longest prompt vLLM accepts). Longer ones are reported as
            rejected (:attr:`RequestPrediction.rejected`), not as crashes.
        locked_bytes: the workspace size at lock without the fix, if measured
            (e.g. :meth:`WorkspaceTracer.size_at_lock` or vLLM's ``VLLM_DEBUG_WORKSPACE=1`` log).
        max_num_batched_tokens_source: where ``config.max_num_batched_tokens`` came from, for the report.
        max_tokens: tokens each request generates (default 2: the prefill's token and one decode step); 1 makes
            no decode call (:func:`request_prediction`).

    The prediction is :func:`tqlab.predict.analysis.predict`'s (without the fix). Raises
    ``ValueError`` for a bad length or size. A cache without TurboQuant's consumers: one row per prompt with
    the first call another consumer makes that the lock refuses (:func:`other_request_prediction`).
    """
    pred = analysis.predict(config, locked_bytes=locked_bytes)
    tokens = list(prompt_tokens) or [max(1, config.max_model_len - 1)]
    if pred.turboquant_consumers:
        reqs = [request_prediction(config, n, pred.locked_bytes, pred.locked_bytes_with_fix, max_tokens) for n in tokens]
    else:  # another consumer's refused call, per prompt (issue 19: the refused call can come from any consumer)
        reqs = [other_request_prediction(config, n, max_tokens, locked_bytes) for n in tokens]
    return ConsumerReport(config, pred, reqs, list(pred.notes), max_num_batched_tokens_source, locked_bytes)
