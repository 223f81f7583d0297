"""Reference answers of notebook 07's exercises (vLLM's refusal, the continuation call, the first refused chunk)."""

from __future__ import annotations

import torch

from tqlab.core.config import EngineConfig, load_preset
from tqlab.core.reservation import continuation_workspace_shapes
from tqlab.core.workspace import WorkspaceLockedError, WorkspaceManager, compute_layout
from tqlab.predict import report as rp


def refusal_tail(required_bytes: int, current_bytes: int) -> str:
    """The end of vLLM's refusal message, from ``requires``: what tqlab's manager (worded as vLLM's) says."""
    m = WorkspaceManager("meta")
    m.get_simultaneous(((current_bytes,), torch.uint8))
    m.lock()
    try:
        m.get_simultaneous(((required_bytes,), torch.uint8))
    except WorkspaceLockedError as exc:
        return "requires" + str(exc).split(" requires", 1)[1]
    return ""


def continuation_call_bytes(cached_len: int, kv_heads: int, head_dim: int, block_size: int) -> int:
    """Bytes of the continuation prefill's two fp16 dequant buffers after ``cached_len`` cached tokens."""
    return compute_layout(continuation_workspace_shapes(cached_len, kv_heads, head_dim, block_size)).total_bytes


def first_refused_cached_len(preset: str) -> int | None:
    """Cached tokens of the first chunk vLLM refuses for ``preset``'s default prompt without the fix (None: none)."""
    cfg = EngineConfig.from_preset(preset)
    first = rp.consumer_report(cfg, [load_preset(preset)["default_prompt_tokens"]]).requests[0].first_refused_unfixed
    return None if first is None else first.cached_len


CASES = {
    "refusal_tail": [(2 * 2**20, 268544), (69435392, 1073408)],
    "continuation_call_bytes": [(4096, 1, 128, 16), (4100, 1, 128, 16), (8192, 4, 128, 16), (1000, 2, 64, 32)],
    "first_refused_cached_len": [("nemotron-3-super-120b-a12b",), ("pr-44053-unit-test",), ("llama-3.1-8b",)],
}
