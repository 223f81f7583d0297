"""Reference answers of notebook 03's exercises (the fix, PR #44053); each calls the package's own function.

* :func:`reservation_bytes` — a preset's reservation per slot (``plan_bytes(reservation_plan(...))``);
* :func:`continuation_alloc_len` — the cached length the continuation reservation is sized for
  (``continuation_workspace_shapes`` at ``max_model_len - 1``);
* :func:`reserves_continuation` — whether the PR's condition makes the continuation call (``reservation_plan``);
* :func:`first_failing_prompt_no_fix` — the shortest prompt that crashes the report's deployment without the fix,
  for a chunk size (``tqlab.predict.analysis.first_failing_prompt``).
"""

from __future__ import annotations

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import continuation_workspace_shapes, plan_bytes, reservation_plan
from tqlab.predict import analysis

__all__ = ["continuation_alloc_len", "first_failing_prompt_no_fix", "reservation_bytes", "reserves_continuation"]

REPORT = "nemotron-3-super-120b-a12b"


def reservation_bytes(preset: str) -> int:
    """Bytes ``_reserve_workspace`` makes slot 0 hold for ``preset``: the larger of its calls."""
    return plan_bytes(reservation_plan(EngineConfig.from_preset(preset)))


def continuation_alloc_len(max_model_len: int, block_size: int) -> int:
    """The third dimension of the reserved continuation buffers: ``max_model_len - 1`` rounded up to the block."""
    return continuation_workspace_shapes(max_model_len - 1, 1, 128, block_size)[0][0][2]


def reserves_continuation(enable_chunked_prefill: bool, max_num_batched_tokens: int) -> bool:
    """Whether PR #44053 reserves the continuation buffers for the report's deployment with these two settings."""
    c = EngineConfig.from_preset(REPORT).replace(enable_chunked_prefill=enable_chunked_prefill,
                                                 max_num_batched_tokens=max_num_batched_tokens,
                                                 mamba_block_aligned_split=False)
    return len(reservation_plan(c)) == 2


def first_failing_prompt_no_fix(max_num_batched_tokens: int) -> int | None:
    """Shortest prompt (tokens) the report's deployment refuses without the fix, for this chunk size."""
    c = EngineConfig.from_preset(REPORT).replace(max_num_batched_tokens=max_num_batched_tokens)
    return analysis.first_failing_prompt(c, analysis.locked_bytes(c, fix=False))
