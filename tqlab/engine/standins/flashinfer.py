"""Stand-in of ``vllm/v1/attention/backends/mla/prefill/flashinfer.py`` (vLLM 0.33): the FlashInfer MLA prefill workspace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.mla_prefill import FLASHINFER_WORKSPACE_BUFFER_SIZE, flashinfer_workspace_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["FlashInferPrefillBackend"]


class FlashInferPrefillBackend:
    """``FlashInferPrefillBackend``: ``__init__`` (built by ``MLAAttention.__init__`` at model load) reserves
    ``((VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE,), uint8)`` without keeping a view; ``prepare_metadata`` asks the
    same view in every step with prefill rows (:func:`tqlab.core.consumers.mla_prefill.flashinfer_workspace_call`)."""

    def __init__(self, workspace: "WorkspaceClient", nbytes: int = FLASHINFER_WORKSPACE_BUFFER_SIZE):
        self.workspace = workspace
        self._workspace_spec = flashinfer_workspace_call(nbytes)
        self.workspace.get_simultaneous(*self._workspace_spec)

    def prepare_metadata(self) -> None:
        """A step with prefill rows."""
        self.workspace.get_simultaneous(*self._workspace_spec)
