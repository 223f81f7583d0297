"""Which presets the TurboQuant lessons (notebooks 02-09) can use: TurboQuant-only, and started by vLLM.

A preset can ask for TurboQuant and still never start: vLLM's start-up validation refuses it (gemma-2-9b's
sliding-window layers: the TurboQuant backend reports "sliding window not supported" in
``vllm/platforms/cuda.py`` ``CudaPlatformBase.get_attn_backend_cls``, and no other backend takes a TurboQuant
cache). :func:`turboquant_presets` splits the TurboQuant-only presets into those that start and those refused,
with vLLM's reason, through :func:`tqlab.predict.analysis.predict` (verdict ``refused``), so that a lesson
never draws a number for a deployment vLLM would not run.
"""

from __future__ import annotations

import re

__all__ = ["refusal_summary", "turboquant_presets"]


def turboquant_presets() -> tuple[list[str], dict[str, str]]:
    """``(started, refused)``: the names of the TurboQuant-only presets
    (:func:`tqlab.core.consumers.registry.turboquant_only`) vLLM starts, in :func:`~tqlab.core.config.list_presets`
    order, and ``{name: "reason (vLLM file:function)"}`` for those its start-up validation refuses."""
    from tqlab.core.config import EngineConfig, list_presets
    from tqlab.core.consumers.registry import turboquant_only
    from tqlab.predict.analysis import predict

    started, refused = [], {}
    for name in list_presets():
        config = EngineConfig.from_preset(name)
        if not turboquant_only(config):
            continue
        pred = predict(config)
        if pred.verdict == "refused":
            refused[name] = f"{pred.refusal['reason']} ({pred.refusal['source']})"
        else:
            started.append(name)
    return started, refused


def refusal_summary(reason: str) -> str:
    """One short line of a refusal from :func:`turboquant_presets`: the TurboQuant backend's own entry of vLLM's
    backend-selector message (``TURBOQUANT: [sliding window not supported]`` -> ``"the TurboQuant backend:
    sliding window not supported"``) plus the source, else the reason's first sentence."""
    source = reason[reason.rfind(" ("):] if reason.endswith(")") else ""
    hit = re.search(r"TURBOQUANT: \[([^\]]*)\]", reason)
    if hit:
        return f"the TurboQuant backend: {hit.group(1)}{source}"
    return reason.split(". ")[0]
