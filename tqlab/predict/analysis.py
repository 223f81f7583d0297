"""The one predictor of a deployment, as vLLM 0.33 runs it: the lock, the verdict, the first failing prompt.

Every answer is computed from an :class:`~tqlab.core.config.EngineConfig`, vLLM 0.33's rules in
:mod:`tqlab.core.vllm_rules` (capture sizes, the lock, the Mamba split: the same functions the
engine calls, side by side with it) and the consumers' shape functions in
:mod:`tqlab.core.reservation`. ``tqlab repro``, ``tqlab plan``, ``tqlab inspect-vllm``, the planner
widget and the notebooks all read one :class:`Prediction` from :func:`predict`; its
:meth:`Prediction.to_json` is the one JSON builder. Bytes everywhere.

vLLM 0.33 facts mirrored here (the rules themselves are in :mod:`tqlab.core.vllm_rules`):

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
  (:attr:`~tqlab.core.config.EngineConfig.has_turboquant_consumers`).

Prompt-level closed forms live in :mod:`tqlab.predict.prompts`; every name is re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

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
)
from tqlab.core.workspace import positive_int
from tqlab.predict.prompts import (
    continuation_bytes,
    decode_bytes,
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


# --------------------------------------------------------------------------- #
# The lock                                                                    #
# --------------------------------------------------------------------------- #


def locked_bytes(config: "EngineConfig", *, fix: bool) -> int | None:
    """Workspace bytes per ubatch slot at the lock; ``None`` when start-up never locks.

    Without the fix: decode views at :func:`decode_rows_at_lock` rows when ``k = 0``
    (the FULL decode capture runs ``_decode_attention``), else 0 (no capture asks the
    workspace for anything). With the fix (PR #44053): at least the largest call of
    :func:`tqlab.core.reservation.reservation_plan`. ``None`` for an eager or ``cudagraph_mode``
    NONE start-up in vLLM 0.33 (unless ``lock_workspace_when_eager``).
    """
    if not locks_workspace(config):
        return None
    if not config.has_turboquant_consumers:  # vLLM runs another backend: no TurboQuant call, no reservation
        return 0
    rows = decode_rows_at_lock(config)
    unfixed = decode_bytes(config, rows) if rows and config.num_speculative_tokens == 0 else 0
    return max(unfixed, plan_bytes(reservation_plan(config))) if fix else unfixed


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

    ``locked_bytes`` is the size at the lock as configured (with or without the fix, per
    ``fix``; a measured size when one was passed in); ``locked_bytes_with_fix`` always with it;
    both None when nothing locks. ``verdict``: ``"never_locked"``, ``"crash"`` or ``"ok"``.
    ``first_refused_call``: ``{caller, required_bytes, current_bytes, cached_len, q_len}`` or None.
    ``safe_max_model_len_alone`` / ``_any_schedule``: the largest ``max_model_len`` (capped at the
    configured one) whose requests all fit ``locked_bytes``, prefilled alone / under any chunking
    (:func:`safe_max_model_len`); ``fixed_safe_any_schedule``: the same against
    ``locked_bytes_with_fix``. ``locked_source``: one of :data:`LOCKED_SOURCES`.
    ``turboquant_consumers``: :attr:`~tqlab.core.config.EngineConfig.has_turboquant_consumers`.
    ``notes``: :class:`~tqlab.core.notes.Note` s (each with a kind) about the prediction.
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
    safe_max_model_len_alone: int | None = None
    safe_max_model_len_any_schedule: int | None = None
    fixed_safe_any_schedule: int | None = None
    locked_source: str = "capture"
    turboquant_consumers: bool = True
    notes: tuple[Note, ...] = ()
    consumers: Mapping[str, Any] = field(default_factory=dict)

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
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _prediction_notes(config: "EngineConfig") -> tuple[Note, ...]:
    """What the numbers do not show: no consumer at all, or where PR #44053's reservation leaves a gap."""
    if not config.has_turboquant_consumers:
        return (Note(NoteKind.NO_CONSUMER, f"kv_cache_dtype={config.kv_cache_dtype!r}: no TurboQuant workspace "
                     "consumer (vLLM 0.33 runs TurboQuant's backend only for a turboquant_* cache)", "kv_cache_dtype"),)
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


def _locked(config: "EngineConfig", fix: bool, measured: int | None) -> tuple[int | None, int | None, str]:
    """``(locked as configured, locked with the fix, LOCKED_SOURCES entry)``; ``measured``: the size without the fix."""
    if measured is None:
        locked = locked_bytes(config, fix=fix)
        return locked, locked_bytes(config, fix=True), "capture" if locked is not None else "never_locked"
    positive_int("locked_bytes", measured, 0)
    if not locks_workspace(config):  # eager / cudagraph_mode NONE: vLLM 0.33 never locks, whatever was measured
        return None, None, "never_locked"
    fixed = max(measured, locked_bytes(config.replace(lock_workspace_when_eager=True), fix=True))
    return (fixed if fix else measured), fixed, "measured"


def _safe(config: "EngineConfig", locked: int | None, schedule: str) -> int | None:
    return config.max_model_len if locked is None else safe_max_model_len(config, locked, schedule=schedule)


def predict(config: "EngineConfig", prompt_tokens: int | None = None, *, max_tokens: int = 2, fix: bool = False,
            sources: Mapping[str, str] | None = None, locked_bytes: int | None = None) -> Prediction:
    """Verdict and sizes for ``config`` (without the fix unless ``fix``), for one prompt or for the deployment.

    With ``prompt_tokens``: that prompt alone, then ``max_tokens - 1`` decode steps (the
    engine's ``generate``). Without: the shortest failing prompt, or a decode step of one row.
    ``sources`` (where each input came from) is passed through to :meth:`Prediction.to_json`.
    ``locked_bytes``: a measured workspace size at the lock without the fix (e.g.
    ``WorkspaceTracer.size_at_lock``), used instead of the computed one.
    Raises ``ValueError`` for a prompt outside ``[1, max_model_len - max_tokens]`` or a bad ``locked_bytes``.
    """
    positive_int("max_tokens", max_tokens)
    locked, with_fix, source = _locked(config, fix, locked_bytes)
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
        locked_bytes_with_fix=with_fix, cudagraph_mode=cudagraph_mode(config), fix=fix,
        prompt_tokens=prompt_tokens, sources=dict(sources or {}),
        safe_max_model_len_alone=_safe(config, locked, "alone"),
        safe_max_model_len_any_schedule=_safe(config, locked, "any"),
        fixed_safe_any_schedule=_safe(config, with_fix, "any"), locked_source=source,
        turboquant_consumers=config.has_turboquant_consumers, notes=_prediction_notes(config),
        consumers=consumer_table(config).to_dict(),
    )


def consumer_table(config: "EngineConfig") -> consumer_registry.ConsumerTable:
    """Every active workspace consumer of ``config`` (:mod:`tqlab.core.consumers`), with start-up as resolved here
    (:func:`cudagraph_mode`, :func:`locks_workspace`): ``consumers`` rows (``consumer``, ``phase``,
    ``reserved_bytes``, ``max_runtime_bytes``, ``covered``), ``locked_bytes`` = the largest reservation before the
    lock (vLLM 0.33 as shipped, PR #44053 included), ``unmodelled``."""
    startup = StartUp(cudagraph_mode(config), locks_workspace(config))
    return consumer_registry.consumer_table(config, startup)
