"""The ways out vLLM offers a deployment that crashes on a locked workspace, each checked by the predictor first.

A crash verdict without the fix leaves a user four moves, all vLLM's own: a vLLM release that carries PR #44053
(``TurboQuantMetadataBuilder._reserve_workspace``), a ``--max-model-len`` no prompt overflows, prefill chunks of at
most 128 tokens (``--max-num-batched-tokens``, so every continuation chunk takes the decode kernel, which asks no
workspace), and ``--enforce-eager`` (vLLM never locks the workspace without CUDA graphs). :func:`ways_out`
offers each only when :func:`tqlab.predict.analysis.predict` -- the one predictor -- gives the changed deployment
``ok`` or ``never_locked``; what it costs is said with it.

Which releases carry the fix (:data:`FIX_FIRST_RELEASE`), from the wheels themselves: ``pip download --no-deps
vllm==X`` and ``grep 'def _reserve_workspace' vllm/v1/attention/backends/turboquant_attn.py`` in each: absent in
0.21.0, 0.22.0 and 0.23.0; present in 0.24.0, 0.25.0, 0.28.0 and 0.33.0 (and 0.34.0's source). PR #44053
("[Bugfix][V1][TurboQuant] Reserve workspace before CUDA graph capture", opened 2026-05-30, merged) superseded
#40798; the crash reports (#41565: v0.20.0) are on releases before it. 0.22.1 was not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqlab.core.notes import NoteKind
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD
from tqlab.predict.analysis import predict

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["FIX_FIRST_RELEASE", "FIX_RELEASES_CHECKED", "WayOut", "way_out_lines", "ways_out"]

FIX_FIRST_RELEASE = "0.24.0"
"""The first vLLM release whose ``turboquant_attn.py`` has ``TurboQuantMetadataBuilder._reserve_workspace``."""

FIX_RELEASES_CHECKED = {"0.21.0": False, "0.22.0": False, "0.23.0": False, "0.24.0": True, "0.25.0": True,
                        "0.28.0": True, "0.33.0": True}
"""Wheel by wheel, whether ``_reserve_workspace`` is in it (see the module docstring for how it was checked)."""

_SAFE = ("ok", "never_locked")


@dataclass(frozen=True)
class WayOut:
    """One change vLLM offers, checked: ``what`` (in words), ``flag`` (the serve flag(s), or None for an upgrade),
    ``verdict`` (the predictor's, for the changed deployment: ``ok`` or ``never_locked``), ``partial`` (that
    verdict covers only the sized consumers), ``cost`` (what the change costs)."""

    what: str
    flag: str | None
    verdict: str
    partial: bool
    cost: str

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "flag": self.flag, "verdict": self.verdict, "partial": self.partial,
                "cost": self.cost}


def _checked(config: "EngineConfig", changes: dict[str, Any] | None = None, *, fix: bool = False,
             locked_bytes: int | None = None, max_tokens: int):
    """The predictor's :class:`~tqlab.predict.analysis.Prediction` for ``config`` with ``changes`` when it is safe,
    else None (also when EngineConfig refuses the changed combination).

    Safe: verdict ``ok`` / ``never_locked``, every ``max_model_len`` prompt safe under any chunking
    (``safe_max_model_len_any_schedule``), and no busy-server decode batch that overflows the lock (the
    predictor's ``reservation_gap`` note on ``max_num_seqs``, :func:`tqlab.predict.analysis._eager_decode_note`)."""
    try:
        config = config.replace(**(changes or {}))  # validated as EngineConfig validates
        pred = predict(config, fix=fix, locked_bytes=locked_bytes, max_tokens=max_tokens)
    except ValueError:  # the changed setting is one vLLM (or EngineConfig) refuses
        return None
    if pred.verdict not in _SAFE:
        return None
    if pred.verdict == "ok" and pred.safe_max_model_len_any_schedule != config.max_model_len:
        return None
    busy = any(n.kind is NoteKind.RESERVATION_GAP and n.field == "max_num_seqs" for n in pred.notes)
    return None if busy else pred


def _shorter(config: "EngineConfig", base, locked_bytes: int | None, max_tokens: int):
    """``(changed config, prediction)`` of the longest safe ``--max-model-len`` (with ``--max-num-seqs`` at the
    largest captured decode batch when a busy server's eager decode batch would overflow), or None."""
    for seqs in (config.max_num_seqs, max(1, base.decode_rows_at_lock)):
        try:
            c = config.replace(max_num_seqs=seqs)
            n = predict(c, locked_bytes=locked_bytes, max_tokens=max_tokens).safe_max_model_len_any_schedule
        except ValueError:
            continue
        if n is None or not 2 <= n < config.max_model_len:
            continue
        p = _checked(c, {"max_model_len": n}, locked_bytes=locked_bytes, max_tokens=max_tokens)
        if p is not None:
            return c.replace(max_model_len=n), p
    return None


def ways_out(config: "EngineConfig", *, locked_bytes: int | None = None, max_tokens: int = 16) -> list[WayOut]:
    """The ways out of a crash without the fix, each verified with :func:`~tqlab.predict.analysis.predict`.

    ``config``: the deployment; ``locked_bytes``: a measured lock size without the fix (kept for the changed
    deployments); ``max_tokens``: tokens per request, as asked. Returns ``[]`` when the deployment is safe as it is
    (the same test as for a way out: an ``ok`` that also holds under any chunking and for a busy server's decode
    batch, or ``never_locked``); an ``ok`` that does not hold there gets its ways out too. Order: the upgrade,
    ``--max-model-len``, ``--max-num-batched-tokens`` (with ``--max-num-seqs`` capped at 128, vLLM's
    ``max_num_batched_tokens >= max_num_seqs``), ``--enforce-eager``.
    """
    base = predict(config, locked_bytes=locked_bytes, max_tokens=max_tokens)
    if _checked(config, locked_bytes=locked_bytes, max_tokens=max_tokens) is not None:
        return []  # safe as it is: no prompt, chunking or busy decode batch overflows the lock
    out = []
    up = _checked(config, fix=True, locked_bytes=locked_bytes, max_tokens=max_tokens)
    if up is not None:
        out.append(WayOut(f"run vLLM >= {FIX_FIRST_RELEASE} (carries PR #44053's reservation)", None, up.verdict,
                          up.partial, f"the workspace reserves {up.locked_bytes or 0:,} bytes per ubatch slot at "
                          "start-up instead of growing on demand"))
    shorter = _shorter(config, base, locked_bytes, max_tokens)
    if shorter is not None:
        c, p = shorter
        seqs = f" --max-num-seqs {c.max_num_seqs}" if c.max_num_seqs != config.max_num_seqs else ""
        out.append(WayOut(f"serve at most {c.max_model_len:,} tokens per request", f"--max-model-len {c.max_model_len}"
                          + seqs, p.verdict, p.partial, "longer prompts are refused (safe under any chunking, busy "
                          "server included)" + (f"; at most {c.max_num_seqs} requests per step" if seqs else "")))
    chunk = CONTINUATION_DECODE_THRESHOLD
    seqs = min(config.max_num_seqs, chunk)
    if config.max_num_batched_tokens > chunk:
        p = _checked(config, {"max_num_batched_tokens": chunk, "max_num_seqs": seqs, "max_num_scheduled_tokens": None},
                     locked_bytes=locked_bytes, max_tokens=max_tokens)
        if p is not None:
            flag = f"--max-num-batched-tokens {chunk}" + (f" --max-num-seqs {seqs}" if seqs < config.max_num_seqs else "")
            out.append(WayOut(f"prefill in chunks of {chunk} tokens (each continuation chunk then takes the decode "
                              "kernel, which asks no workspace)", flag, p.verdict, p.partial,
                              f"a long prompt takes one engine step per {chunk} tokens (slower time to first token)"
                              + (f"; at most {seqs} requests per step" if seqs < config.max_num_seqs else "")))
    if not config.enforce_eager:
        p = _checked(config, {"enforce_eager": True}, locked_bytes=locked_bytes, max_tokens=max_tokens)
        if p is not None:
            out.append(WayOut("run without CUDA graphs (vLLM locks the workspace only at the end of graph "
                              "capture)", "--enforce-eager", p.verdict, p.partial,
                              "every decode step launches its kernels one by one: slower decode, most at small batches"))
    return out


def way_out_lines(ways: list[WayOut], *, crashed: bool) -> list[str]:
    """The text of :func:`ways_out`: a heading and one line per way; no ways and ``crashed`` (the deployment's
    verdict is a crash): one line saying the predictor found none among vLLM's; else nothing. No rich markup."""
    if not ways and not crashed:
        return []
    if not ways:
        return ["ways out: none of vLLM's (a release with PR #44053, a shorter --max-model-len, 128-token chunks, "
                "--enforce-eager) gives this deployment an ok verdict"]
    out = ["ways out (each checked by the predictor on the changed deployment):" if crashed else
           "the verdict does not hold for every schedule vLLM can make (the any-chunking bound or a busy server's "
           "decode batch, see the notes); ways out (each checked by the predictor on the changed deployment):"]
    for w in ways:
        how = f"{w.flag}: " if w.flag else ""
        ok = w.verdict.replace("_", " ") + (" over the sized consumers (partial)" if w.partial else "")
        out.append(f"  - {how}{w.what} -> {ok}; cost: {w.cost}")
    return out
