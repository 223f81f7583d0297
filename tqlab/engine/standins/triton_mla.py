"""Stand-in of ``vllm/v1/attention/backends/mla/triton_mla.py`` (vLLM 0.33): the split-KV decode logits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.triton_mla import reservation_call, step_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["TritonMLAImpl", "_reserve_attn_logits_workspace"]


def _reserve_attn_logits_workspace(config: "EngineConfig", workspace: "WorkspaceClient") -> None:
    """The worst-case reservation (:func:`tqlab.core.consumers.triton_mla.reservation_call`), called by
    ``TritonMLAImpl.reserve_workspace`` in the profile run and by ``TritonMLAMetadataBuilder.__init__``."""
    workspace.get_simultaneous(*reservation_call(config))


class TritonMLAImpl:
    """``TritonMLAImpl``: ``reserve_workspace`` (``MLAAttention.forward`` with ``attn_metadata is None``, i.e. the
    profile run) and ``forward_mqa`` (decode rows)."""

    def __init__(self, config: "EngineConfig", workspace: "WorkspaceClient"):
        self.config, self.workspace = config, workspace

    def reserve_workspace(self) -> None:
        _reserve_attn_logits_workspace(self.config, self.workspace)

    def forward_mqa(self, num_decode_tokens: int, max_seq_len: int) -> None:
        """A pass with ``num_decode_tokens`` decode rows, the longest ``max_seq_len`` tokens
        (:func:`tqlab.core.consumers.triton_mla.step_call`)."""
        self.workspace.get_simultaneous(*step_call(self.config, num_decode_tokens, max_seq_len))
