"""What the bug report's preset leaves out, computed: the AWQ MoE of ``Nemotron-3-Super-120B-AWQ-4bit``.

The preset ``nemotron-3-super-120b-a12b`` models the report's attention only (``moe`` is ``None``): on the report's
vLLM 0.20 its MoE asked the workspace nothing before the lock (the report's 0.26 MB is TurboQuant's decode scratch
to the byte). On vLLM 0.33 an AWQ MoE runs Marlin experts through the modular kernel's ``_allocate_buffers``
(``vllm/model_executor/layers/quantization/auto_awq.py`` ``AutoAWQMoEMethod`` -> ``make_wna16_moe_kernel``;
``fused_moe/experts/marlin_moe.py`` ``MarlinExperts.workspace_shapes``), which asks in the profile run at
``M = max_num_batched_tokens`` rows, before the lock. tqlab does not size quantized experts; :func:`moe_hidden_to_hold`
gives the lower bound notebooks 02 and 03 use: the MoE's output view ``(M, hidden_size)`` alone, in the model dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["moe_hidden_to_hold"]


def moe_hidden_to_hold(config: "EngineConfig", nbytes: int) -> int:
    """Smallest ``hidden_size`` whose MoE output ``(max_num_batched_tokens, hidden_size)`` in ``config.dtype`` is at
    least ``nbytes`` bytes: a MoE that asks that much in the profile run locks a slot that holds an ``nbytes``
    request. Raises ``ValueError`` for ``nbytes`` < 1."""
    if nbytes < 1:
        raise ValueError(f"moe_hidden_to_hold: nbytes must be >= 1, got {nbytes}")
    per_unit = config.max_num_batched_tokens * config.dtype.itemsize
    return -(-nbytes // per_unit)
