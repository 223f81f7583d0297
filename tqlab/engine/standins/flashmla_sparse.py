"""Stand-in of ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` (vLLM 0.33): ``workspace_specs``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.flashmla_sparse import step_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["FlashMLASparseImpl"]


class FlashMLASparseImpl:
    """``FlashMLASparseImpl``: ``__init__`` (model construction, ``load_model``) reserves ``workspace_specs``
    (:func:`tqlab.core.consumers.flashmla_sparse.step_call`); ``forward_mqa`` asks them again every pass."""

    def __init__(self, config: "EngineConfig", workspace: "WorkspaceClient"):
        self.config, self.workspace = config, workspace
        self.workspace_specs = step_call(config)
        self.workspace.get_simultaneous(*self.workspace_specs)

    def forward_mqa(self) -> None:
        """A forward pass with attention metadata (prefill or decode rows)."""
        self.workspace.get_simultaneous(*self.workspace_specs)
