"""Stand-in of ``vllm/v1/attention/backends/flash_attn.py`` (vLLM 0.33): the DCP context output buffer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.flash_attn_dcp import step_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["FlashAttentionImpl"]


class FlashAttentionImpl:
    """``FlashAttentionImpl`` with ``dcp_world_size > 1``: ``__init__`` reserves nothing (it only records
    ``_dcp_max_num_tokens = max_num_batched_tokens`` and the model dtype)."""

    def __init__(self, config: "EngineConfig", workspace: "WorkspaceClient"):
        self.config, self.workspace = config, workspace

    def _forward_with_dcp(self, num_tokens: int) -> None:
        """A forward pass whose batch has DCP context (``max_dcp_context_kv_len > 0``): one
        ``get_simultaneous`` of :func:`tqlab.core.consumers.flash_attn_dcp.step_call`. Raises
        ``WorkspaceLockedError`` when the locked slot is smaller (latent crash 2: PIECEWISE-only graphs)."""
        self.workspace.get_simultaneous(*step_call(self.config, num_tokens))
