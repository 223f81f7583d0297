"""Reference answers of notebook 09's exercises (chunks, surviving alone, the largest call)."""

from __future__ import annotations

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD
from tqlab.predict import analysis


def chunks(preset: str, prompt_tokens: int) -> list[tuple[int, int]]:
    """``(cached, new)`` per prefill chunk of a prompt served alone."""
    return [tuple(c) for c in analysis.prefill_chunks(EngineConfig.from_preset(preset), prompt_tokens)]


def survives_alone(preset: str, prompt_tokens: int) -> bool:
    """Whether a prompt served alone survives without the fix."""
    cfg = EngineConfig.from_preset(preset)
    bad = analysis.first_failing_prompt(cfg, analysis.unfixed_locked_bytes(cfg))
    return bad is None or prompt_tokens < bad


def largest_call_bytes(preset: str) -> int:
    """The largest dequant call a prompt can make: 129 new tokens ending at ``max_model_len - 1``."""
    cfg = EngineConfig.from_preset(preset)
    return analysis.continuation_bytes(cfg, cfg.max_model_len - 1 - (CONTINUATION_DECODE_THRESHOLD + 1))


CASES = {
    "chunks": [("nemotron-3-super-120b-a12b", 4096), ("nemotron-3-super-120b-a12b", 8192),
               ("nemotron-3-super-120b-a12b", 10000), ("pr-44053-unit-test", 5000)],
    "survives_alone": [("nemotron-3-super-120b-a12b", 4224), ("nemotron-3-super-120b-a12b", 4225),
                       ("pr-44053-unit-test", 100), ("llama-3.1-8b", 50000)],
    "largest_call_bytes": [("nemotron-3-super-120b-a12b",), ("llama-3.1-8b",), ("pr-44053-unit-test",)],
}
