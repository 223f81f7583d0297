"""The bug report's numbers against a deployment: which ``max_num_batched_tokens`` makes vLLM print "2.00 MB".

The report (vLLM 0.20, seeds/003) quotes a refused ``_continuation_prefill`` of 2.00 MB against a
workspace locked at 0.26 MB but gives no ``--max-num-batched-tokens``; these functions infer it and
explain the difference from a deployment's own first refused call.
"""

from __future__ import annotations

from tqlab.core.config import EngineConfig
from tqlab.core.notes import Note, NoteKind
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, continuation_workspace_shapes
from tqlab.core.workspace_layout import compute_layout, format_mb
from tqlab.predict import analysis
from tqlab.predict.consumers import ConsumerReport, request_prediction

__all__ = ["BUG_REPORT_LOCKED_MB", "BUG_REPORT_REQUIRED_MB", "bug_report_max_num_batched_tokens", "bug_report_note"]


def _bytes(shapes) -> int:
    return compute_layout(shapes).total_bytes


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
    locked = analysis.unfixed_locked_bytes(config)
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
        first = request_prediction(cfg, 2 * m, locked, locked).first_refused_unfixed
        if first is not None and format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            return m
    return None


def bug_report_note(pred: ConsumerReport) -> Note | None:
    """A note when a request's first refused call differs from the report's 2.00 MB only by ``max_num_batched_tokens``."""
    c = pred.config
    if pred.prediction.locked_source != "capture" or not c.is_turboquant:
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
        theirs = request_prediction(other, r.prompt_tokens, pred.locked_unfixed, pred.locked_unfixed)
        t = theirs.first_refused_unfixed
        if t is None or format_mb(t.nbytes) != BUG_REPORT_REQUIRED_MB:
            continue
        hk, d = c.num_kv_heads_per_rank, c.head_dim
        alloc = t.shapes[0][0][2]
        return Note(NoteKind.BUG_REPORT,
            f"the bug report's '{BUG_REPORT_REQUIRED_MB} MB' is the first refused call with max_num_batched_tokens {m}: "
            f"cached {t.cached_len}, two fp16 (1, {hk}, {alloc}, {d}) buffers = 2 x {hk} x {alloc} x {d} x 2 bytes = "
            f"{t.nbytes:,} bytes. The report does not give max_num_batched_tokens; {m} is inferred from its "
            f"{BUG_REPORT_REQUIRED_MB} MB. This prediction assumes {c.max_num_batched_tokens} "
            f"({pred.max_num_batched_tokens_source}), so a prompt of {r.prompt_tokens} tokens is refused earlier, at cached "
            f"{first.cached_len} with {format_mb(first.nbytes)} MiB: the only difference is max_num_batched_tokens",
            "max_num_batched_tokens")
    return None
