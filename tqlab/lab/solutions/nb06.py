"""Reference answers of notebook 06's exercises (boundary layers, the share of the KV cache, the crash point)."""

from __future__ import annotations

from tqlab.core.config import EngineConfig
from tqlab.predict import kv_pool as kp
from tqlab.strategies import longest_surviving_prompt as _longest


def boundary_layers(num_layers: int, hybrid: bool) -> int:
    """Layers vLLM 0.33 keeps in the model dtype on a TurboQuant cache (dense: first and last two; hybrid: none)."""
    return kp.boundary_layers(num_layers, hybrid=hybrid)


def kv_share(preset: str, gpu: str) -> float:
    """The fix's workspace over the KV pool one ``gpu`` of ``preset``'s rank holds (vLLM 0.33's defaults)."""
    return kp.kv_pool(EngineConfig.from_preset(preset), gpu=gpu).share


def longest_surviving_prompt(preset: str, max_num_batched_tokens: int) -> int:
    """Longest prompt that survives alone without the fix, with ``preset``'s chunk size changed."""
    return _longest(EngineConfig.from_preset(preset, max_num_batched_tokens=max_num_batched_tokens))


CASES = {
    "boundary_layers": [(32, False), (3, False), (2, False), (1, False), (8, True)],
    "kv_share": [("llama-3.1-8b", "H200"), ("qwen3-32b", "H100"), ("nemotron-3-super-120b-a12b", "A4000")],
    "longest_surviving_prompt": [("nemotron-3-super-120b-a12b", 4096), ("nemotron-3-super-120b-a12b", 1024),
                                 ("llama-3.1-8b", 8192)],
}
