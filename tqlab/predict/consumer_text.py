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
from tqlab.core.workspace_layout import format_mb

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.predict.analysis import Prediction

__all__ = ["ANY_CHUNKING", "consumer_lines", "gpu_line", "refusal_line", "safe_len_line", "verdict_head", "verdict_line"]

ANY_CHUNKING = ("any chunking: the bound for a busy server, where a prompt's chunks are cut by other requests "
                "sharing a step or start after a prefix-cache hit")
"""What "(any chunking)" means, printed beside it (:func:`tqlab.predict.prompts.safe_max_model_len`,
``schedule="any"``); "requests alone": each prompt prefilled alone in chunks of ``max_num_batched_tokens``."""

_TQ_PREFIX = "turboquant_attn.py:"


def gpu_line(pred: "Prediction") -> str:
    """``gpu: H200 (SM 9.0, 132 SMs, 139.8 GiB)``: the target vLLM's choices were read for."""
    g = gpu_target(pred.gpu)
    return (f"gpu: {g.name} (SM {g.capability[0]}.{g.capability[1]}, {g.sm_count} SMs, {g.memory_gib} GiB; "
            "--gpu names another)")


def _size(nbytes: int) -> str:
    return f"{nbytes:>13,} B {format_mb(nbytes):>9} MiB"


def consumer_lines(pred: "Prediction") -> list[str]:
    """The consumer table (consumer, phase, reserved before the lock, max at serve time, covered; two lines a
    consumer, 80 columns), the line that
    names who sets the lock, and the unmodelled consumers with their reasons. Bytes and MiB (2**20)."""
    rows = pred.consumers.get("consumers", [])
    out = [gpu_line(pred)]
    if rows:
        out.append("workspace consumers (slot ubatch 0, lane 0; a slot is as large as the largest")
        out.append("request before the lock):")
        # two lines a consumer, so the table fits 80 columns: its call site, then phase, sizes and covered
        out.append("  consumer (call site), then phase, sizes, whether the lock covers it (cov)")
        out.append(f"  {'phase':<11}  {'reserved before the lock':>29}  {'max at serve time':>29}  cov")
        for r in rows:
            out.append(f"  {r['consumer']}")
            out.append(f"  {r['phase']:<11}  {_size(r['reserved_bytes'])}  "
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
        return "lock: never (vLLM locks only at the end of CUDA graph capture)"
    fix = "with" if pred.fix else "without"
    who = pred.lock_set_by or ("measured" if pred.locked_source == "measured" else "no request before the lock")
    line = f"lock {fix} the fix: {pred.locked_bytes:,} bytes ({format_mb(pred.locked_bytes)} MiB), set by {who}"
    if not pred.fix and pred.locked_bytes_with_fix is not None:
        line += f"; with PR #44053: {pred.locked_bytes_with_fix:,} bytes ({format_mb(pred.locked_bytes_with_fix)} MiB)"
    return line


def safe_len_line(pred: "Prediction") -> str:
    """``safe max_model_len without the fix: A (requests alone), B (any chunking); with the fix: C (any chunking)``
    and what "any chunking" means (:data:`ANY_CHUNKING`); "None" is explained when no length is safe."""
    return (f"safe max_model_len without the fix: {pred.safe_max_model_len_alone} (requests alone), "
            f"{pred.safe_max_model_len_any_schedule} (any chunking); with the fix: {pred.fixed_safe_any_schedule} "
            f"(any chunking) -- {ANY_CHUNKING}"
            + ("" if pred.safe_max_model_len_any_schedule is not None else
               " (None: no length is safe -- see the notes)"))


def _which_prompt(pred: "Prediction") -> str:
    """Which prompt a crash verdict describes: the one asked about, or (for the deployment) its shortest failing
    prompt -- said, so a verdict is never read as the answer for another prompt."""
    if pred.prompt_tokens is not None:
        return f" -- for the {pred.prompt_tokens:,}-token prompt asked about"
    if (pred.first_refused_call or {}).get("schedule"):  # a busy server's schedule, named in the parentheses
        return " -- for the deployment on a busy server"
    n = pred.first_failing_prompt_tokens
    if n is None or (pred.first_refused_call or {}).get("caller", "").startswith("_decode_attention"):
        # no prefill overflows, or every prompt's first decode step does: the decode step every prompt makes
        return " -- for the deployment: the decode step every prompt makes (shown for a 1-token prompt)"
    return (" -- for every prompt: another consumer overflows the lock" if n == 1 else
            f" -- for the deployment: its shortest failing prompt ({n:,} tokens, alone), not necessarily one you asked "
            "about")
def refusal_line(pred: "Prediction") -> str:
    """``REFUSED: vLLM 0.33 does not start this deployment: <vLLM's reason> (<vllm file:function>)``: the first line of
    a report whose verdict is ``refused`` (:mod:`tqlab.vllm.validation`)."""
    r = pred.refusal or {}
    return f"REFUSED: vLLM 0.33 does not start this deployment: {r.get('reason')} ({r.get('source')})"


def verdict_line(pred: "Prediction") -> str:
    """``verdict (without the fix): crash|partial|ok|never locked ...``, with the first refused call (and the busy-
    server schedule that makes it), and, beside any verdict, how many reached consumers tqlab does not size:
    ``ok`` only when every consumer is sized (``partial`` otherwise)."""
    fix = "with" if pred.fix else "without"
    if pred.verdict == "refused":
        return refusal_line(pred)
    if pred.verdict == "never_locked":
        text = "never locked: no request can hit the locked-workspace assertion"
    elif pred.verdict == "crash":
        c = pred.first_refused_call
        where = c["schedule"] if c.get("schedule") else f"cached {c['cached_len']}, q {c['q_len']}"
        text = (f"CRASH: {c['caller']} requires {format_mb(c['required_bytes'])} MB, current size is "
                f"{format_mb(c['current_bytes'])} MB ({where})" + _which_prompt(pred))
    elif pred.verdict == "partial":
        text = "PARTIAL: no sized consumer is refused, but tqlab cannot size every consumer this deployment reaches"
    else:
        text = "ok"
    n = len(pred.unsized)
    if n and pred.verdict != "partial":
        text += (f" -- and {n} consumer(s) this deployment reaches are not sized (listed); "
                 "their requests may set the lock or crash")
    return f"verdict {fix} the fix: {text}"


def verdict_head(pred: "Prediction") -> list[str]:
    """The report's first lines: the verdict (:func:`verdict_line`), what it covers, and each unsized consumer with why."""
    out = [verdict_line(pred)]
    if pred.verdict_covers:
        out.append(f"  covers: {pred.verdict_covers}")
    out += [f"  unsized: {u['consumer']}: {u['reason']}" for u in pred.unsized]
    return out
