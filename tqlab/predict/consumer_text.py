"""The plain-text lines every report prints about a deployment's workspace consumers (``tqlab plan``,
``tqlab inspect-vllm``): the GPU target, one row per active consumer, who sets the lock, the consumers
tqlab does not size, and the verdict line (which says when the answer is partial).

Every number is the one :class:`~tqlab.predict.analysis.Prediction`'s (its ``consumers`` table,
``locked_bytes``, ``lock_set_by``, ``verdict``); this module only formats. No rich markup (the
lines go to plain files and to a rich console alike): no square brackets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.hardware import gpu_target
from tqlab.core.workspace import format_mb

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.predict.analysis import Prediction

__all__ = ["consumer_lines", "gpu_line", "refusal_line", "verdict_line"]

_TQ_PREFIX = "turboquant_attn.py:"


def gpu_line(pred: "Prediction") -> str:
    """``gpu: H200 (SM 9.0, 132 SMs, 139.8 GiB)``: the target vLLM's choices were read for."""
    g = gpu_target(pred.gpu)
    return (f"gpu: {g.name} (SM {g.capability[0]}.{g.capability[1]}, {g.sm_count} SMs, {g.memory_gib} GiB; "
            "--gpu names another)")


def _size(nbytes: int) -> str:
    return f"{nbytes:>13,} B {format_mb(nbytes):>9} MiB"


def consumer_lines(pred: "Prediction") -> list[str]:
    """The consumer table (consumer, phase, reserved before the lock, max at serve time, covered), the line that
    names who sets the lock, and the unmodelled consumers with their reasons. Bytes and MiB (2**20)."""
    rows = pred.consumers.get("consumers", [])
    out = [gpu_line(pred)]
    if rows:
        out.append("workspace consumers (slot ubatch 0, lane 0; a slot is as large as the largest request before "
                   "the lock):")
        w = max(len(r["consumer"]) for r in rows)
        out.append(f"  {'consumer':<{w}}  {'phase':<11}  {'reserved before the lock':>29}  "
                   f"{'max at serve time':>29}  covered")
        for r in rows:
            out.append(f"  {r['consumer']:<{w}}  {r['phase']:<11}  {_size(r['reserved_bytes'])}  "
                       f"{_size(r['max_runtime_bytes'])}  {'yes' if r['covered'] else 'NO'}")
        if any(r["consumer"].startswith(_TQ_PREFIX) for r in rows):
            out.append("  (TurboQuant's rows: with PR #44053's reservation, and covered = fits the lock with it; without "
                       "the fix TurboQuant reserves nothing and its lock is the decode capture)")
    else:
        out.append("workspace consumers: none that tqlab models is active in this deployment")
    out.append(_lock_line(pred))
    for u in pred.consumers.get("unmodelled", []):
        out.append(f"not modelled (used by this deployment): {u['consumer']}: {u['reason']}")
    return out


def _lock_line(pred: "Prediction") -> str:
    if pred.locked_bytes is None:
        return "lock: never (vLLM 0.33 locks only at the end of CUDA graph capture)"
    fix = "with" if pred.fix else "without"
    who = pred.lock_set_by or ("measured" if pred.locked_source == "measured" else "no request before the lock")
    line = f"lock {fix} the fix: {pred.locked_bytes:,} bytes ({format_mb(pred.locked_bytes)} MiB), set by {who}"
    if not pred.fix and pred.locked_bytes_with_fix is not None:
        line += f"; with PR #44053: {pred.locked_bytes_with_fix:,} bytes ({format_mb(pred.locked_bytes_with_fix)} MiB)"
    return line


def refusal_line(pred: "Prediction") -> str:
    """``REFUSED: vLLM 0.33 does not start this deployment: <vLLM's reason> (<vllm file:function>)``: the first line of
    a report whose verdict is ``refused`` (:mod:`tqlab.vllm.validation`)."""
    r = pred.refusal or {}
    return f"REFUSED: vLLM 0.33 does not start this deployment: {r.get('reason')} ({r.get('source')})"


def verdict_line(pred: "Prediction") -> str:
    """``verdict (without the fix): crash|ok|never locked ...``, with the first refused call, and ``PARTIAL`` (and why)
    when the deployment uses consumers tqlab does not size: never a bare "ok" then."""
    fix = "with" if pred.fix else "without"
    if pred.verdict == "refused":
        return refusal_line(pred)
    if pred.verdict == "never_locked":
        text = "never locked: no request can hit the locked-workspace assertion"
    elif pred.verdict == "crash":
        c = pred.first_refused_call
        text = (f"CRASH: {c['caller']} requires {format_mb(c['required_bytes'])} MB, current size is "
                f"{format_mb(c['current_bytes'])} MB (cached {c['cached_len']}, q {c['q_len']})")
    else:
        text = "ok"
    n = len(pred.consumers.get("unmodelled", []))
    if n:
        text += (f" -- PARTIAL answer: {n} consumer(s) this deployment uses are not modelled (listed above); "
                 "their requests may set the lock or crash")
    return f"verdict {fix} the fix: {text}"
