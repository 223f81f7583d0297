"""Stand-in of ``vllm/model_executor/layers/sparse_attn_indexer.py`` (vLLM 0.33): the indexer's K-gather buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.sparse_indexer import prefill_call, profile_call

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["sparse_attn_indexer"]


def sparse_attn_indexer(config: "EngineConfig", workspace: "WorkspaceClient", *, profile: bool) -> None:
    """``sparse_attn_indexer``: in the profile run (``attn_metadata`` not a dict) one call of
    :func:`tqlab.core.consumers.sparse_indexer.profile_call` (K values, scales, the 1 MiB radix top-k
    scratch); in a step with prefill rows the two K-gather views (:func:`~tqlab.core.consumers.sparse_indexer.prefill_call`).
    The decode top-k's 1 MiB call (``indexer_topk.py`` ``forward``, cooperative/persistent backends only) always
    fits the profile reservation and is not replayed."""
    workspace.get_simultaneous(*(profile_call(config) if profile else prefill_call(config)))
