"""Stand-in of ``vllm/model_executor/layers/fused_moe/modular_kernel.py`` (vLLM 0.33): the fused-MoE scratch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.fused_moe import step_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["FusedMoEKernelModularImpl"]


class FusedMoEKernelModularImpl:
    """``FusedMoEKernelModularImpl``: one per MoE layer in vLLM; all layers ask the same shapes, so one stands in."""

    def __init__(self, config: "EngineConfig", workspace: "WorkspaceClient"):
        self.config, self.workspace = config, workspace

    def _allocate_buffers(self, num_tokens: int) -> None:
        """``_allocate_buffers(M_chunk = M_full = num_tokens)`` as ``_fused_experts`` calls it: one
        ``get_simultaneous((max(ws13, out),), ws2)`` of :func:`tqlab.core.consumers.fused_moe.step_call`
        (TritonExperts). Raises ``WorkspaceLockedError`` when the locked slot is smaller."""
        self.workspace.get_simultaneous(*step_call(self.config, num_tokens))
