"""Reference answers of notebook 10's exercises (a slot is a maximum, the lock over consumers, the MoE's cover)."""

from __future__ import annotations

import torch

from tqlab.core.config import EngineConfig
from tqlab.core.workspace import WorkspaceManager
from tqlab.predict import analysis


def slot_after(call_bytes: tuple[int, ...]) -> int:
    """Bytes of one ubatch slot after one-view calls of ``call_bytes`` bytes each, one after the other."""
    m = WorkspaceManager("meta")
    for n in call_bytes:
        m.get_simultaneous(((n,), torch.uint8))
    return m.size_bytes()


def lock_without_fix(preset: str) -> int | None:
    """The workspace at the lock without the fix, over every consumer of ``preset`` (None: never locked)."""
    return analysis.predict(EngineConfig.from_preset(preset)).locked_bytes


def crashes_without_fix(preset: str, max_num_batched_tokens: int, max_num_seqs: int) -> bool:
    """Whether any prompt crashes without the fix (a MoE's profile-run scratch may hide the bug)."""
    cfg = EngineConfig.from_preset(preset, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    return analysis.predict(cfg).first_failing_prompt_tokens is not None


CASES = {
    "slot_after": [((1000, 300),), ((300, 1000),), ((256, 256, 257),), ((1,),)],
    "lock_without_fix": [("qwen3-30b-a3b",), ("llama-3.1-8b",), ("nemotron-3-super-120b-a12b",)],
    "crashes_without_fix": [("qwen3-30b-a3b", 8192, 4), ("qwen3-30b-a3b", 256, 4), ("llama-3.1-8b", 8192, 256)],
}
