"""The one predictor of a deployment, as vLLM runs it: the lock, the verdict, the first failing prompt.

The release is the run's (:func:`tqlab.core.vllm_versions.current`); where releases differ the rules say so.

Every answer is computed from an :class:`~tqlab.core.config.EngineConfig`, the release's rules in
:mod:`tqlab.core.vllm_rules` (capture sizes, the lock, the Mamba split: the same functions the
engine calls, side by side with it) and the consumers' shape functions in
:mod:`tqlab.core.reservation`. ``tqlab repro``, ``tqlab plan``, ``tqlab inspect-vllm``, the planner
widget and the notebooks all read one :class:`Prediction` from :func:`predict`; its
:meth:`Prediction.to_json` is the one JSON builder. Bytes everywhere.

vLLM facts mirrored here (the rules themselves are in :mod:`tqlab.core.vllm_rules`):

* what capture asks of the workspace: only FULL uniform-decode captures build attention
  metadata (``GPUModelRunner._dummy_run``, ``vllm/v1/worker/gpu_model_runner.py``); a dummy batch has
  :func:`~tqlab.core.vllm_rules.decode_rows` requests of ``1 + k`` tokens with ``seq_lens = 1 + k``.
  With ``k = 0`` TurboQuant runs ``_decode_attention`` (workspace: decode views at that many rows);
  with ``k > 0`` the query length exceeds the builder's ``reorder_batch_threshold`` of 1, so the
  batch goes to ``_prefill_attention`` as first chunks (``q_len == seq_len``): no workspace call.
  PIECEWISE captures and the profile run pass no attention metadata;
* only TurboQuant's backend (``vllm/v1/attention/backends/turboquant_attn.py``) has these workspace
  consumers and PR #44053's reservation: for any other ``kv_cache_dtype`` vLLM selects another
  backend, so the lock (if any) finds 0 bytes of theirs and no prompt can overflow it
  (:func:`~tqlab.core.consumers.registry.turboquant_active`).

Prompt-level closed forms live in :mod:`tqlab.predict.prompts`; every name is re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from tqlab.core import vllm_versions
from tqlab.core.consumers import registry as consumer_registry
from tqlab.core.consumers.base import StartUp
from tqlab.core.notes import Note, NoteKind
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, plan_bytes, reservation_plan
from tqlab.core.vllm_rules import (
    DEFAULT_MAX_GRAPH_SIZE,
    capture_sizes,
    cudagraph_mode,
    decode_capture_rows,
    decode_capture_sizes,
    decode_rows_at_lock,
    locks_workspace,
    mamba_block_aligned_split,
    one_token_rows_before_lock,
)
from tqlab.core.workspace_layout import positive_int
from tqlab.vllm.validation import facts_from_sources, startup_refusal
from tqlab.predict.prompts import (
    any_schedule_cached_len,
    continuation_bytes,
    decode_bytes,
    decode_step_refused,
    decode_uses_workspace,
    first_failing_prompt,
    first_refused_call,
    prefill_chunks,
    prompt_chunks,
    prompt_workspace_chunks,
    safe_max_model_len,
    workspace_bytes_for_prompt,
)

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = [
    "DEFAULT_MAX_GRAPH_SIZE",
    "LOCKED_SOURCES",
    "Prediction",
    "capture_sizes",
    "continuation_bytes",
    "cudagraph_mode",
    "decode_bytes",
    "decode_capture_rows",
    "decode_capture_sizes",
    "decode_rows_at_lock",
    "decode_step_refused",
    "decode_uses_workspace",
    "first_failing_prompt",
    "first_refused_call",
    "lock_set_by",
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


# --------------------------------------------------------------------------- #
# The lock                                                                    #
# --------------------------------------------------------------------------- #


def locked_bytes(config: "EngineConfig", *, fix: bool) -> int | None:
    """Workspace bytes of slot (ubatch 0, lane 0) at the lock; ``None`` when start-up never locks.

    The maximum over the deployment's active consumers (a slot is as large as the largest single
    request made before ``lock_workspace()``; separate ``get_simultaneous`` calls alias the same bytes):
    TurboQuant's, and every other consumer's ``reserved_bytes`` (:func:`consumer_table`).
    TurboQuant without the fix: decode views at :func:`decode_rows_at_lock` rows when ``k = 0``
    (the FULL decode capture runs ``_decode_attention``), else 0 (no capture asks the workspace
    for anything); where V2's JIT warm-up runs first (vLLM 0.34), at least its decode rows
    (:func:`~tqlab.core.vllm_rules.one_token_rows_before_lock`). With the fix (PR #44053): at least the largest call of
    :func:`tqlab.core.reservation.reservation_plan`. ``None`` for an eager or ``cudagraph_mode``
    NONE start-up (unless ``lock_workspace_when_eager``).

    Slot (ubatch 0, lane 0): vLLM 0.33 keys a slot by ``dbo_current_ubatch_id() * num_lanes + lane``
    (``vllm/v1/worker/workspace.py`` ``WorkspaceManager._get_workspace_id``); a builder's or impl's
    ``__init__`` runs outside any DBO ubatch thread (``vllm/v1/worker/ubatching.py``
    ``dbo_current_ubatch_id`` returns 0) and in the default lane (``workspace.py`` ``_workspace_lane``,
    a ``ContextVar`` defaulting to 0), so init reservations land in that slot only; the profile run and
    captures reach it too. Raises ``ValueError`` (one line) for a config a consumer cannot size.
    """
    if not locks_workspace(config):
        return None
    others = max((r.reserved_bytes for r in _other_rows(config)), default=0)
    if not consumer_registry.turboquant_active(config):  # vLLM runs another backend: no TurboQuant call, no reservation
        return others
    rows = one_token_rows_before_lock(config)  # FULL decode captures (k = 0) and V2's JIT warm-up
    unfixed = decode_bytes(config, rows) if rows else 0
    return max(others, max(unfixed, plan_bytes(reservation_plan(config))) if fix else unfixed)


def _other_rows(config: "EngineConfig") -> tuple[consumer_registry.ConsumerRow, ...]:
    """:func:`consumer_table` rows of every active consumer but TurboQuant's (whose requests depend on the prompt)."""
    return tuple(r for r in consumer_table(config).rows if r.name not in consumer_registry.TURBOQUANT)


def unfixed_locked_bytes(config: "EngineConfig") -> int:
    """:func:`locked_bytes` without the fix, with 0 for a start-up that never locks (kept for callers)."""
    return locked_bytes(config, fix=False) or 0


# --------------------------------------------------------------------------- #
# The prediction                                                              #
# --------------------------------------------------------------------------- #

LOCKED_SOURCES = ("capture", "measured", "never_locked")
"""Where :attr:`Prediction.locked_bytes` comes from: computed at the end of CUDA graph capture, measured
(passed in), or nothing locks (an eager or ``cudagraph_mode`` NONE start-up)."""


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` finds for a deployment (and optionally one prompt). Bytes and tokens.

    ``locked_bytes``: the size of slot (ubatch 0, lane 0) at the lock as configured (with or without
    the fix, per ``fix``; a measured size when one was passed in), the **maximum over every active
    consumer** (:func:`locked_bytes`): TurboQuant's lock (its decode capture; with the fix its
    reservation) and every other consumer's ``reserved_bytes``; ``locked_bytes_with_fix`` always
    with TurboQuant's fix; both None when nothing locks. ``lock_set_by``: the call site whose request
    sets it (:func:`lock_set_by`; None when measured or 0). ``verdict``: ``"never_locked"``,
    ``"crash"``, ``"partial"`` or ``"ok"``: crash when any sized consumer's request exceeds the lock --
    TurboQuant's per prompt (continuation chunks, decode) and, for the deployment (no ``prompt_tokens``), under
    any schedule a busy server produces (:func:`_busy_server_refusal`), another consumer's at its serve-time
    maximum (``max_runtime_bytes``); else partial when ``unsized`` is not empty; ok only when every consumer the
    deployment reaches is sized and none is refused. ``unsized``: ``({"consumer", "reason"}, ...)``, the consumers
    it reaches that tqlab cannot size (:func:`tqlab.core.consumers.registry.unmodelled`). ``verdict_covers``:
    which schedule the verdict speaks for (:data:`ANY_SCHEDULE`, or one prompt alone). ``first_refused_call``:
    ``{caller, required_bytes, current_bytes, cached_len, q_len}`` (and ``schedule`` for a busy server's call) of
    the first such call in serving order, or None; ``caller`` is
    ``_continuation_prefill`` / ``_decode_attention`` for TurboQuant (the method, as before) and the
    call site as vLLM's assertion names it (``file.py:function``) for any other consumer.
    ``first_failing_prompt_tokens``: TurboQuant's shortest prompt whose prefill overflows, or 1 when
    another consumer overflows (every request reaches it) or when every request's first decode step does
    (:func:`decode_step_refused`: the requests make ``max_tokens - 1`` decode steps; ``max_tokens`` 1 asks the
    prefill alone). ``safe_max_model_len_alone`` / ``_any_schedule``: the largest ``max_model_len`` (capped at the
    configured one) whose requests all fit ``locked_bytes``, prefilled alone / under any chunking
    (:func:`safe_max_model_len`), then decoded; None when no length is safe -- in particular when another consumer
    overflows the lock at every length (a note says so) or every request's first decode step does;
    ``fixed_safe_any_schedule``: the same against ``locked_bytes_with_fix``.
    ``locked_source``: one of :data:`LOCKED_SOURCES`. ``turboquant_consumers``:
    :func:`~tqlab.core.consumers.registry.turboquant_active`. ``notes``:
    :class:`~tqlab.core.notes.Note` s (each with a kind) about the prediction, a ``not_modelled`` one
    ("partial answer") when the deployment uses consumers tqlab does not size. ``consumers``:
    :func:`consumer_table`'s JSON (``consumers``, ``consumers_locked_bytes`` = the largest reservation
    before the lock with the fix as shipped, ``unmodelled``). ``gpu``: the GPU target
    (:func:`tqlab.core.hardware.gpu_target`). ``partial`` (property, and a JSON key): ``unmodelled`` is not
    empty, so ``"ok"`` means "ok as far as the modelled consumers go". ``vllm_version``: the release whose rules
    made it (``"0.33"``; :func:`tqlab.core.vllm_versions.current` when built).
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
    safe_max_model_len_alone: int | None = None
    safe_max_model_len_any_schedule: int | None = None
    fixed_safe_any_schedule: int | None = None
    locked_source: str = "capture"
    turboquant_consumers: bool = True
    notes: tuple[Note, ...] = ()
    consumers: Mapping[str, Any] = field(default_factory=dict)
    lock_set_by: str | None = None
    gpu: str = "H200"
    unsized: tuple[dict[str, str], ...] = ()
    verdict_covers: str = ""
    refusal: Mapping[str, str] | None = None
    vllm_version: str = field(default_factory=lambda: vllm_versions.current().name)

    @property
    def partial(self) -> bool:
        """The deployment reaches consumers tqlab does not size (``unsized`` is not empty): the verdict is
        ``partial`` unless a sized consumer crashes (``crash`` wins) or nothing locks (``never_locked``)."""
        return bool(self.unsized)

    def to_json(self) -> dict[str, Any]:
        """The documented, stable object of ``tqlab plan --json`` / ``inspect-vllm --json`` (JSON types only).

        Keys: those of the fields above; ``notes`` as ``{"kind", "field", "text"}`` objects.
        """
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
            "safe_max_model_len_alone": self.safe_max_model_len_alone,
            "safe_max_model_len_any_schedule": self.safe_max_model_len_any_schedule,
            "fixed_safe_any_schedule": self.fixed_safe_any_schedule,
            "locked_source": self.locked_source,
            "turboquant_consumers": self.turboquant_consumers,
            "notes": [n.to_dict() for n in self.notes],
            **{k: v for k, v in self.consumers.items()},  # consumers, consumers_locked_bytes, unmodelled
            "lock_set_by": self.lock_set_by,
            "gpu": self.gpu,
            "partial": self.partial,
            "unsized": [dict(u) for u in self.unsized],
            "verdict_covers": self.verdict_covers,
            "refusal": None if self.refusal is None else dict(self.refusal),
            "vllm_version": self.vllm_version,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _prediction_notes(config: "EngineConfig") -> tuple[Note, ...]:
    """What the numbers do not show: no consumer at all, or where PR #44053's reservation leaves a gap."""
    if not consumer_registry.turboquant_active(config):
        return (Note(NoteKind.NO_CONSUMER, f"kv_cache_dtype={config.kv_cache_dtype!r}: no TurboQuant workspace "
                     "consumer (vLLM runs TurboQuant's backend only for a turboquant_* cache)", "kv_cache_dtype"),)
    notes = []
    if not config.enable_chunked_prefill or config.max_num_batched_tokens <= CONTINUATION_DECODE_THRESHOLD:
        notes.append(Note(NoteKind.RESERVATION_GAP,
            "PR #44053 reserves continuation buffers only with chunked prefill on and max_num_batched_tokens > 128; "
            + ("a prefix-cache hit still makes continuation chunks (see the any-chunking bound)"
               if config.enable_prefix_caching else
               "with prefix caching off too, the any-chunking bound counts none; a KV connector's external hit, "
               "a multimodal encoder budget or a streaming-input session can still make one (not modelled)")))
    if config.num_ubatches > 1:
        notes.append(Note(NoteKind.RESERVATION_GAP, "DBO: vLLM's _reserve_workspace sizes only the slot it runs in "
                          "(slot 0); slot 1 can still overflow", "enable_dbo"))
    return tuple(notes)


def _eager_decode_note(config: "EngineConfig", locked: int | None) -> list[Note]:
    """A note when a decode batch larger than any captured one overflows ``locked`` (the verdict is per request).

    vLLM captures decode batches up to :func:`decode_rows_at_lock` requests; a batch of more (up to
    ``max_num_seqs``) runs eagerly after the lock, and ``turboquant_attn.py`` ``_decode_attention`` asks
    ``(B, Hq, S, D + 1)`` at ``B`` rows. Without PR #44053 nothing reserved ``max_num_seqs`` rows. Only for
    ``num_speculative_tokens == 0`` (with ``k`` tokens the rows and the drafter's passes differ)."""
    lo = _eager_decode_rows(config, locked)
    if lo is None:
        return []
    top = config.max_num_seqs
    return [Note(NoteKind.RESERVATION_GAP,
                 f"busy server: a decode batch of {lo} or more requests (up to max_num_seqs {top}; captured decode "
                 f"batches stop at {decode_rows_at_lock(config)}, larger ones run eagerly after the lock) asks "
                 f"turboquant_attn.py:_decode_attention for {decode_bytes(config, lo):,} bytes or more > {locked:,} "
                 "locked: it crashes even though each request alone is ok (PR #44053 reserves max_num_seqs rows)",
                 "max_num_seqs")]


def _decode_step_note(config: "EngineConfig", locked: int | None, max_tokens: int) -> list[Note]:
    """A note when every request's first decode step overflows ``locked`` (:func:`decode_step_refused`): then no
    prompt is short enough and no ``max_model_len`` is safe; ``--max-tokens 1`` asks the prefill alone."""
    if not decode_step_refused(config, locked, max_tokens):
        return []
    who = "_decode_attention" + (" (drafter)" if config.num_speculative_tokens else "")
    return [Note(NoteKind.RESERVATION_GAP,
                 f"every request's first decode step asks turboquant_attn.py:{who} for {decode_bytes(config, 1):,} "
                 f"bytes (one row) > {locked:,} locked: every prompt crashes there, whatever its length, so no "
                 "max_model_len is safe (--max-tokens 1 asks about the prefill alone)")]


def _eager_decode_rows(config: "EngineConfig", locked: int | None) -> int | None:
    """The smallest decode batch (rows, up to ``max_num_seqs``) whose ``_decode_attention`` call overflows
    ``locked``, or None (none does, nothing locks, speculative decoding, decode asks no workspace, or
    ``max_model_len`` 1, where vLLM accepts no prompt: see :func:`_busy_server_refusal`)."""
    if locked is None or config.num_speculative_tokens or not decode_uses_workspace(config) or config.max_model_len < 2:
        return None
    top = config.max_num_seqs
    if decode_bytes(config, top) <= locked:
        return None
    lo, hi = 1, top  # decode_bytes grows with the rows: the first batch size that overflows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decode_bytes(config, mid) > locked else (mid + 1, hi)
    return lo


def _locked(config: "EngineConfig", fix: bool, measured: int | None) -> tuple[int | None, int | None, str]:
    """``(locked as configured, locked with the fix, LOCKED_SOURCES entry)``; ``measured``: the size without the fix."""
    if measured is None:
        locked = locked_bytes(config, fix=fix)
        return locked, locked_bytes(config, fix=True), "capture" if locked is not None else "never_locked"
    positive_int("locked_bytes", measured, 0)
    if not locks_workspace(config):  # eager / cudagraph_mode NONE: vLLM never locks, whatever was measured
        return None, None, "never_locked"
    fixed = max(measured, locked_bytes(config.replace(lock_workspace_when_eager=True), fix=True))
    return (fixed if fix else measured), fixed, "measured"


def _uncovered(rows, locked: int | None) -> list[consumer_registry.ConsumerRow]:
    """The rows (other consumers than TurboQuant) whose serve-time request exceeds ``locked`` (none if unlocked)."""
    return [] if locked is None else [r for r in rows if r.max_runtime_bytes > locked]


def _safe(config: "EngineConfig", locked: int | None, schedule: str, rows, max_tokens: int) -> int | None:
    """:func:`safe_max_model_len` against ``locked``; None when another consumer overflows it at any length, or when
    every request's first decode step does (:func:`decode_step_refused`; ``max_tokens`` 1, no decode step, asks the
    prefill-only bound)."""
    if locked is None:
        return config.max_model_len
    if _uncovered(rows, locked) or decode_step_refused(config, locked, max_tokens):
        return None
    return safe_max_model_len(config, locked, schedule=schedule)


def _other_refusal(config: "EngineConfig", row, n: int, max_tokens: int) -> tuple[int, dict[str, Any]] | None:
    """``(step, first refused call)`` of an uncovered other consumer for a prompt of ``n`` alone, or None when the
    request never reaches it. Step = the index of the request's engine step (prefill chunks, then decodes);
    the call asks the consumer's serve-time maximum (``max_runtime_bytes``: a full batch, the request vLLM
    can make under load; the profile run or the reservation sized it before the lock)."""
    chunks = prefill_chunks(config, n)
    decode = (len(chunks), (n, 1)) if max_tokens >= 2 else None
    reached = consumer_registry.consumer_named(row.name).reached
    if reached == "prefill":
        at = (0, chunks[0])
    elif reached == "context":  # cached context: the second prefill chunk, else the first decode
        at = (1, chunks[1]) if len(chunks) > 1 else decode
    else:
        at = decode
    if at is None:
        return None
    step, (cached, q) = at
    return step, {"caller": row.consumer, "required_bytes": row.max_runtime_bytes, "current_bytes": None,
                  "cached_len": cached, "q_len": q}


def _first_refused(config: "EngineConfig", n: int, locked: int | None, max_tokens: int, rows):
    """The first refused call of a prompt of ``n`` alone (then decoded), from any consumer, in serving order.

    TurboQuant's (:func:`first_refused_call`, per prompt) and every uncovered other consumer's
    (:func:`_other_refusal`); at the same step TurboQuant's attention call comes first (attention runs
    before the layer's MoE, and TurboQuant is never active beside the MLA or DCP consumers)."""
    if locked is None:
        return None
    events = []
    tq = first_refused_call(config, n, locked, max_tokens=max_tokens)
    if tq is not None:
        chunks = prefill_chunks(config, n)
        at = [i for i, (c, _) in enumerate(chunks) if c == tq["cached_len"]]
        step = at[0] if tq["caller"] == "_continuation_prefill" and at else len(chunks)
        events.append((step, 0, tq))
    for i, row in enumerate(_uncovered(rows, locked)):
        hit = _other_refusal(config, row, n, max_tokens)
        if hit is not None:
            events.append((hit[0], 1 + i, {**hit[1], "current_bytes": locked}))
    return min(events, key=lambda e: e[:2])[2] if events else None


def _first_failing(config: "EngineConfig", locked: int | None, rows, max_tokens: int) -> int | None:
    """Shortest failing prompt: TurboQuant's (:func:`first_failing_prompt`, its prefill alone), or 1 when another
    consumer overflows ``locked`` (every request reaches it: in its first step, or its first decode) or when every
    request's first decode step does (:func:`decode_step_refused`, ``max_tokens >= 2``)."""
    if locked is None:
        return None
    if _uncovered(rows, locked) or decode_step_refused(config, locked, max_tokens):
        return 1
    return first_failing_prompt(config, locked)


def _other_notes(config: "EngineConfig", table, locked: int | None) -> list[Note]:
    """Who sets the lock when another consumer does, which consumer overflows it, and what is not modelled."""
    notes = []
    rows = [r for r in table.rows if r.name not in consumer_registry.TURBOQUANT]
    for r in _uncovered(rows, locked):
        notes.append(Note(NoteKind.RESERVATION_GAP,
                          f"{r.consumer} asks {r.max_runtime_bytes:,} bytes at serve time but the slot locks at "
                          f"{locked:,} (phase before the lock: {r.phase}): it crashes at any max_model_len"))
    init = [r.consumer for r in rows if r.phase == "init"]
    if config.num_ubatches > 1 and init:  # vllm/v1/worker/workspace.py _get_workspace_id: ubatch * lanes + lane
        notes.append(Note(NoteKind.NOT_MODELLED, "DBO: " + ", ".join(init) + " reserve in __init__, which lands in "
                          "slot (ubatch 0, lane 0) only; slot (ubatch 1, lane 0) is sized by what the profile run and "
                          "captures ask in ubatch 1, which tqlab does not model per slot", "enable_dbo"))
    if table.unmodelled:
        notes.append(Note(NoteKind.NOT_MODELLED, "partial answer: consumers this deployment would use that tqlab "
                          "does not size: " + "; ".join(f"{u['consumer']} ({u['reason']})" for u in table.unmodelled)))
    return notes


def _refused(config: "EngineConfig", refusal, prompt_tokens, fix: bool, sources) -> Prediction:
    """The :class:`Prediction` of a deployment vLLM 0.33 does not start (:mod:`tqlab.vllm.validation`): verdict
    ``refused`` with vLLM's reason; nothing locks, no prompt runs."""
    return Prediction(capture_sizes=(), decode_rows_at_lock=0, locked_bytes=None, verdict="refused",
                      first_failing_prompt_tokens=None, first_refused_call=None, locked_bytes_with_fix=None,
                      cudagraph_mode=cudagraph_mode(config), fix=fix, prompt_tokens=prompt_tokens,
                      sources=dict(sources or {}), locked_source="never_locked",
                      turboquant_consumers=consumer_registry.turboquant_active(config), gpu=config.gpu,
                      notes=(Note(NoteKind.NOT_MODELLED, f"vLLM 0.33 refuses to start: {refusal.reason} "
                                  f"({refusal.source})"),), refusal=refusal.to_dict())


def predict(config: "EngineConfig", prompt_tokens: int | None = None, *, max_tokens: int = 2, fix: bool = False,
            sources: Mapping[str, str] | None = None, locked_bytes: int | None = None, startup=None) -> Prediction:
    """Verdict and sizes for ``config`` (without the fix unless ``fix``), for one prompt or for the deployment.

    With ``prompt_tokens``: that prompt alone, then ``max_tokens - 1`` decode steps (the
    engine's ``generate``). Without: the shortest failing prompt, or a decode step of one row.
    The lock is the maximum over every active consumer (:func:`locked_bytes`); the refused call can come
    from any of them (:func:`_first_refused`).
    ``sources`` (where each input came from) is passed through to :meth:`Prediction.to_json`.
    ``locked_bytes``: a measured workspace size at the lock without the fix (e.g.
    ``WorkspaceTracer.size_at_lock``), used instead of the computed one. ``startup``: the deployment's
    :class:`~tqlab.vllm.validation.StartupFacts` (None: read from ``config`` and ``sources``); a deployment vLLM
    does not start is verdict ``refused`` with vLLM's reason (:func:`~tqlab.vllm.validation.startup_refusal`).
    Raises ``ValueError`` for a prompt outside ``[1, max_model_len - max_tokens]``, a bad ``locked_bytes`` or a
    config a consumer cannot size.
    """
    positive_int("max_tokens", max_tokens)
    refusal = startup_refusal(config, facts_from_sources(config, sources) if startup is None else startup)
    if refusal is not None:
        return _refused(config, refusal, prompt_tokens, fix, sources)
    locked, with_fix, source = _locked(config, fix, locked_bytes)
    if prompt_tokens is not None:
        positive_int("prompt_tokens", prompt_tokens)
        if prompt_tokens + max_tokens > config.max_model_len:
            raise ValueError(f"prompt_tokens {prompt_tokens} + max_tokens {max_tokens} exceeds "
                             f"max_model_len {config.max_model_len} (vLLM rejects the request)")
    table = consumer_table(config)
    rows = tuple(r for r in table.rows if r.name not in consumer_registry.TURBOQUANT)
    first_bad = _first_failing(config, locked, rows, max_tokens)
    n = prompt_tokens if prompt_tokens is not None else (first_bad or 1)
    refused = _first_refused(config, n, locked, max_tokens, rows)
    if refused is None and prompt_tokens is None:  # the deployment's verdict covers any schedule vLLM can produce
        refused = _busy_server_refusal(config, locked, _safe(config, locked, "any", rows, max_tokens))
    unsized = tuple(table.unmodelled)
    verdict = "never_locked" if locked is None else ("crash" if refused else ("partial" if unsized else "ok"))
    return Prediction(
        capture_sizes=capture_sizes(config), decode_rows_at_lock=decode_rows_at_lock(config), locked_bytes=locked,
        verdict=verdict, first_failing_prompt_tokens=first_bad, first_refused_call=refused,
        locked_bytes_with_fix=with_fix, cudagraph_mode=cudagraph_mode(config), fix=fix,
        prompt_tokens=prompt_tokens, sources=dict(sources or {}),
        safe_max_model_len_alone=_safe(config, locked, "alone", rows, max_tokens),
        safe_max_model_len_any_schedule=_safe(config, locked, "any", rows, max_tokens),
        fixed_safe_any_schedule=_safe(config, with_fix, "any", rows, max_tokens), locked_source=source,
        turboquant_consumers=consumer_registry.turboquant_active(config),
        notes=_prediction_notes(config) + tuple(_other_notes(config, table, locked) + _eager_decode_note(config, locked)
                                                + _decode_step_note(config, locked, max_tokens)),
        consumers=table.to_dict(), gpu=config.gpu,
        lock_set_by=None if source == "measured" else lock_set_by(config, locked, fix=fix, table=table),
        unsized=unsized,
        verdict_covers=(f"a prompt of {prompt_tokens} tokens alone, then {max_tokens - 1} decode step(s)"
                        if prompt_tokens is not None else ANY_SCHEDULE),
    )


ANY_SCHEDULE = ("any schedule vLLM can produce: each request alone, any chunking (busy server, prefix-cache hits) "
                "and decode batches up to max_num_seqs")
"""What a deployment's verdict (:func:`predict` without ``prompt_tokens``) covers."""


def _busy_server_refusal(config: "EngineConfig", locked: int | None, safe_any: int | None) -> dict[str, Any] | None:
    """The first refused call of a schedule a busy server produces that no request alone makes, or None.

    A continuation chunk with more cached tokens than any request alone reaches (:func:`safe_max_model_len`
    ``schedule="any"`` below ``max_model_len``: a request of ``safe_any + 1`` tokens whose last chunk starts
    :func:`~tqlab.predict.prompts.any_schedule_cached_len` tokens in), else a decode batch larger than any captured
    one (``turboquant_attn.py`` ``_decode_attention`` at ``B`` rows, :func:`_eager_decode_note`). The call gets a
    ``schedule`` key saying which. Only TurboQuant's requests depend on the schedule; another consumer's
    serve-time maximum already covers a full batch (:func:`_other_refusal`).

    vLLM 0.33 accepts a prompt of 1 to ``max_model_len - 1`` tokens (``v1/engine/input_processor.py``
    ``_validate_prompt_len``: a generate prompt as long as ``max_model_len`` is rejected) and stops a request at
    ``max_model_len`` tokens (``v1/core/sched/utils.py`` ``check_stop``): ``max_model_len`` 1 serves no request
    (:func:`_eager_decode_rows` is None); at 2 every prompt is 1 token and its prefill is the batch (``turboquant_attn.py``
    ``TurboQuantMetadataBuilder.build``: ``is_prefill = max_query_len > 1``, so a batch of one-token prompts takes
    ``_decode_attention``), with no decode step after it.
    """
    if locked is None or not consumer_registry.turboquant_active(config):
        return None
    if safe_any is not None and safe_any < config.max_model_len:
        cached = any_schedule_cached_len(config, safe_any + 1)
        if cached:
            return {"caller": "_continuation_prefill", "required_bytes": continuation_bytes(config, cached),
                    "current_bytes": locked, "cached_len": cached, "q_len": CONTINUATION_DECODE_THRESHOLD + 1,
                    "schedule": f"busy server: a request of {safe_any + 1} tokens whose last chunk starts after "
                                f"{cached} cached tokens (any chunking; the bound is {safe_any})"}
    rows = _eager_decode_rows(config, locked)
    if rows is None:
        return None
    return {"caller": "_decode_attention", "required_bytes": decode_bytes(config, rows), "current_bytes": locked,
            "cached_len": None, "q_len": 1,
            "schedule": (f"busy server: {rows} one-token prompts in one step (their prefill takes _decode_attention; "
                         "max_model_len 2 leaves no decode step)" if config.max_model_len == 2 else
                         f"busy server: a decode batch of {rows} requests") + " (larger than any captured one, run eagerly)"}


def lock_set_by(config: "EngineConfig", locked: int | None, *, fix: bool, table=None) -> str | None:
    """The call site (``file.py:function``, as vLLM's assertion names it) whose request before the lock is
    ``locked`` bytes: TurboQuant's decode capture (without the fix), its reserved calls (with it), or another
    active consumer's largest reservation. None when nothing locks, nothing asks before the lock, or
    ``locked`` is a measured size no modelled request equals."""
    if not locked:
        return None
    table = consumer_table(config) if table is None else table
    candidates = []
    if consumer_registry.turboquant_active(config):
        rows = one_token_rows_before_lock(config)
        if rows:
            candidates.append((decode_bytes(config, rows), "turboquant_attn.py:_decode_attention"))
        if fix:
            candidates += [(r.reserved_bytes, r.consumer) for r in table.rows if r.name in consumer_registry.TURBOQUANT]
    candidates += [(r.reserved_bytes, r.consumer) for r in table.rows if r.name not in consumer_registry.TURBOQUANT]
    return next((who for nbytes, who in candidates if nbytes == locked), None)


def consumer_table(config: "EngineConfig") -> consumer_registry.ConsumerTable:
    """Every active workspace consumer of ``config`` (:mod:`tqlab.core.consumers`), with start-up as resolved here
    (:func:`cudagraph_mode`, :func:`locks_workspace`): ``consumers`` rows (``consumer``, ``phase``,
    ``reserved_bytes``, ``max_runtime_bytes``, ``covered``), ``locked_bytes`` = the largest reservation before the
    lock (vLLM as shipped, PR #44053 included), ``unmodelled``."""
    startup = StartUp(cudagraph_mode(config), locks_workspace(config))
    return consumer_registry.consumer_table(config, startup)
