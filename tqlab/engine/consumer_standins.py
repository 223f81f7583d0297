"""The engine's stand-ins for vLLM 0.33's other workspace consumers, run in the phase where vLLM makes each call.

TurboQuant's two consumers are the engine's own attention backend (:mod:`tqlab.attention`). Every other
active consumer of :func:`tqlab.core.consumers.registry.active_consumers` gets a stand-in from
:mod:`tqlab.engine.standins` (vLLM's file and function names, so a refused call names the same caller as
vLLM's assertion) that asks the engine's workspace for the shapes of its consumer module, in vLLM's phases:

==================== ======================================================================================
engine phase         calls (vLLM 0.33 source)
==================== ======================================================================================
``load_model``       ``FlashMLASparseImpl.__init__`` reserves ``workspace_specs``; the MLA prefill backend's
                     ``__init__`` (TRT-LLM ragged / FlashInfer) reserves its 394 MiB (both built by the model's
                     layers in ``GPUModelRunner.load_model``: ``MLAAttention.__init__``,
                     ``model_executor/layers/attention/mla_attention.py``)
``profile_run``      ``GPUModelRunner.profile_run`` → ``_dummy_run(max_num_tokens = max_num_batched_tokens,
                     is_profile=True)``: no attention metadata, so ``sparse_attn_indexer`` reserves (``attn_metadata``
                     not a dict), ``MLAAttention.forward`` calls ``TritonMLAImpl.reserve_workspace``, and every MoE
                     layer's ``FusedMoEKernelModularImpl._fused_experts`` → ``_allocate_buffers`` at
                     ``M = max_num_batched_tokens``
``build_backend``    ``TritonMLAMetadataBuilder.__init__`` → ``_reserve_attn_logits_workspace``
                     (``initialize_kv_cache`` → ``initialize_metadata_builders``, after the profile run)
``capture``          ``capture_model`` → ``_capture_cudagraphs``: every captured size runs the MoE layers
                     (``_allocate_buffers`` at ``M`` = the size); FULL uniform-decode graphs also build attention
                     metadata (``_dummy_run``: ``cudagraph_runtime_mode == FULL``), with a DCP dummy context
                     (``v1/worker/cp_utils.py`` ``get_dcp_dummy_context_len``), so ``_forward_with_dcp`` asks;
                     PIECEWISE graphs pass no attention metadata. Then ``lock_workspace()``
serving              each step, attention first (``forward_mqa``; ``prepare_metadata`` and the indexer's K-gather
                     with prefill rows; ``_forward_with_dcp`` when a row has cached context,
                     ``flash_attn.py`` ``FlashAttentionMetadataBuilder.build`` / ``cp_utils.py``
                     ``should_skip_dcp_context_attention``), then the MoE layers at ``M`` = the step's tokens
==================== ======================================================================================

Simplifications (each call's bytes are unchanged by them): one MoE layer and one attention layer stand for
all (every layer asks the same shapes); all calls go to ubatch 0, lane 0 (the slot whose size
:attr:`LLMEngine.locked_bytes` reports; DBO's split of the profile run is not replayed); serving steps
are not padded to a capture size (``M`` never exceeds ``max_num_batched_tokens`` either way); kernel
warm-up and Model Runner V2's JIT warm-up are not replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tqlab.core.consumers.base import StartUp
from tqlab.core.consumers.registry import CONSUMERS, active_consumers
from tqlab.core.workspace import format_mb
from tqlab.engine.standins.flash_attn import FlashAttentionImpl
from tqlab.engine.standins.flashinfer import FlashInferPrefillBackend
from tqlab.engine.standins.flashmla_sparse import FlashMLASparseImpl
from tqlab.engine.standins.modular_kernel import FusedMoEKernelModularImpl
from tqlab.engine.standins.sparse_attn_indexer import sparse_attn_indexer
from tqlab.engine.standins.triton_mla import TritonMLAImpl, _reserve_attn_logits_workspace
from tqlab.engine.standins.trtllm_ragged import TrtllmRaggedPrefillBackend

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.engine.scheduler import SchedulerOutput
    from tqlab.engine.workspace_client import WorkspaceClient

__all__ = ["STANDIN_CONSUMERS", "ConsumerStandIns", "SlotSizer", "StepShape", "consumer_of", "slot_sizer"]

STANDIN_CONSUMERS = ("fused_moe", "flash_attn_dcp", "flashmla_sparse", "mla_prefill_trtllm_ragged",
                     "mla_prefill_flashinfer", "triton_mla_logits", "sparse_indexer")
"""Registry names (:data:`tqlab.core.consumers.registry.CONSUMERS`) the engine runs a stand-in for; TurboQuant's
two are its attention backend."""


@dataclass(frozen=True)
class StepShape:
    """What one forward pass shows the consumers: ``num_tokens`` (the MoE layers' ``M``), ``num_decode_tokens``
    (decode rows), ``has_prefill`` (prefill rows), ``has_context`` (a row attends cached tokens: DCP context),
    ``max_seq_len`` (longest decode row, tokens), ``attention`` (attention metadata built: False for the profile
    run and PIECEWISE captures)."""

    num_tokens: int
    num_decode_tokens: int = 0
    has_prefill: bool = False
    has_context: bool = False
    max_seq_len: int = 0
    attention: bool = True

    @classmethod
    def of(cls, sched: "SchedulerOutput") -> "StepShape":
        """The shape of a scheduled step (``decodes`` carry cached tokens; a prefill chunk after ``c > 0`` cached)."""
        return cls(num_tokens=sched.num_tokens, num_decode_tokens=len(sched.decodes), has_prefill=bool(sched.prefills),
                   has_context=bool(sched.decodes) or any(c > 0 for _, c, _ in sched.prefills),
                   max_seq_len=max((r.num_tokens for r in sched.decodes), default=0))


class ConsumerStandIns:
    """The stand-ins of ``config``'s active consumers (other than TurboQuant's), on ``workspace``.

    Built in the ``load_model`` phase: construction makes the ``__init__`` reservations of the impls and
    prefill backends vLLM builds with the model. The engine then calls :meth:`profile_run`,
    :meth:`build_backend`, :meth:`capture` and, every step, :meth:`forward`. Each returns a short text of
    the calls it made (for the phase's note; ``""`` when none). A refused call raises
    :class:`~tqlab.core.workspace.WorkspaceLockedError` naming vLLM's caller; a consumer that cannot size
    ``config`` raises ``ValueError`` (one line) before any call.
    """

    @staticmethod
    def check(config: "EngineConfig") -> tuple[str, ...]:
        """The registry names of ``config``'s stand-ins; ``ValueError`` (one line, naming the field) when a consumer
        cannot size ``config`` — the engine calls this before it builds anything."""
        consumers = [c for c in active_consumers(config) if c.name in STANDIN_CONSUMERS]
        for c in consumers:
            c.sizes(config, StartUp())
        return tuple(c.name for c in consumers)

    def __init__(self, config: "EngineConfig", workspace: "WorkspaceClient"):
        self.config, self.workspace = config, workspace
        self.names = self.check(config)
        has = self.names.__contains__
        self.moe = FusedMoEKernelModularImpl(config, workspace) if has("fused_moe") else None
        self.dcp = FlashAttentionImpl(config, workspace) if has("flash_attn_dcp") else None
        self.triton_mla = TritonMLAImpl(config, workspace) if has("triton_mla_logits") else None
        self.indexer = has("sparse_indexer")
        made = []
        self.flashmla = FlashMLASparseImpl(config, workspace) if has("flashmla_sparse") else None
        if self.flashmla is not None:
            made.append("FlashMLASparseImpl.__init__ workspace_specs")
        self.mla_prefill = None
        if has("mla_prefill_trtllm_ragged"):
            self.mla_prefill = TrtllmRaggedPrefillBackend(workspace, config.flashinfer_workspace_buffer_size)
            made.append(f"TrtllmRaggedPrefillBackend.__init__ {config.flashinfer_workspace_buffer_size / 2**20:g} MiB")
        elif has("mla_prefill_flashinfer"):
            self.mla_prefill = FlashInferPrefillBackend(workspace, config.flashinfer_workspace_buffer_size)
            made.append(f"FlashInferPrefillBackend.__init__ {config.flashinfer_workspace_buffer_size / 2**20:g} MiB")
        self.init_note = ", ".join(made)

    def profile_run(self) -> str:
        """``_dummy_run(max_num_batched_tokens, is_profile=True)``: attention without metadata, then the MoE layers."""
        made = []
        if self.indexer:
            sparse_attn_indexer(self.config, self.workspace, profile=True)
            made.append("sparse_attn_indexer reservation")
        if self.triton_mla is not None:
            self.triton_mla.reserve_workspace()
            made.append("TritonMLAImpl.reserve_workspace")
        if self.moe is not None:
            self.moe._allocate_buffers(self.config.max_num_batched_tokens)
            made.append(f"fused MoE _allocate_buffers at M = max_num_batched_tokens = {self.config.max_num_batched_tokens}")
        return ", ".join(made)

    def build_backend(self) -> str:
        """The metadata builders' ``__init__`` reservations (Triton MLA's)."""
        if self.triton_mla is None:
            return ""
        _reserve_attn_logits_workspace(self.config, self.workspace)
        return "TritonMLAMetadataBuilder.__init__ reservation"

    def capture(self, piecewise_sizes: tuple[int, ...], decode_sizes: tuple[int, ...]) -> str:
        """PIECEWISE graphs at ``piecewise_sizes`` (no attention metadata) and FULL uniform-decode graphs at
        ``decode_sizes`` (tokens; metadata with a DCP dummy context), each largest first."""
        q = self.config.uniform_decode_query_len
        for size in sorted(piecewise_sizes, reverse=True):
            self.forward(StepShape(size, attention=False))
        for size in sorted(decode_sizes, reverse=True):
            self.forward(StepShape(size, num_decode_tokens=size, has_context=True, max_seq_len=q))
        made = []
        if self.dcp is not None and decode_sizes:
            made.append(f"_forward_with_dcp in {len(decode_sizes)} FULL decode graph(s)")
        if self.moe is not None and (piecewise_sizes or decode_sizes):
            made.append(f"fused MoE _allocate_buffers at {len(set(piecewise_sizes) | set(decode_sizes))} size(s)")
        return ", ".join(made)

    def forward(self, step: StepShape) -> None:
        """One forward pass: the attention consumers (with metadata only), then the MoE layers at ``M = num_tokens``."""
        if step.attention:
            if self.indexer and step.has_prefill:
                sparse_attn_indexer(self.config, self.workspace, profile=False)
            if self.flashmla is not None:
                self.flashmla.forward_mqa()
            if self.mla_prefill is not None and step.has_prefill:
                self.mla_prefill.prepare_metadata()
            if self.triton_mla is not None and step.num_decode_tokens:
                self.triton_mla.forward_mqa(step.num_decode_tokens, step.max_seq_len)
            if self.dcp is not None and step.has_context:
                self.dcp._forward_with_dcp(step.num_tokens)
        if self.moe is not None:
            self.moe._allocate_buffers(step.num_tokens)


_TQLAB_CALLERS = {"reservation.py": "turboquant PR #44053 reservation"}
"""tqlab files that make a consumer's calls under another name than vLLM's
(``reservation.py``: ``TurboQuantMetadataBuilder._reserve_workspace``)."""


def consumer_of(caller: str) -> str:
    """The registry name of the consumer that made a call named ``caller`` (``'file.py:LINE:function'``, as
    the workspace's events and vLLM's assertion name it): matched on file and function, else on the file;
    ``caller`` itself when no modelled consumer has that file."""
    parts = caller.split(":")
    file, func = parts[0], parts[-1]
    for exact in (True, False):
        for c in CONSUMERS:
            c_file, _, c_func = c.consumer.partition(":")
            if c_file == file and (c_func == func or not exact):
                return c.name
    return _TQLAB_CALLERS.get(file, caller)


@dataclass(frozen=True)
class SlotSizer:
    """The call that last grew workspace slot (ubatch 0, lane 0) before the lock: ``caller``
    (``'file.py:LINE:function'``), ``consumer`` (:func:`consumer_of`), ``phase`` (the engine phase it ran in),
    ``nbytes`` (the slot's size after it)."""

    caller: str
    consumer: str
    phase: str
    nbytes: int

    def describe(self) -> str:
        return f"slot 0 = {format_mb(self.nbytes)} MiB, set by {self.consumer} ({self.caller}) in {self.phase}"


def slot_sizer(events: list, phase_marks: list[tuple[str, int]]) -> SlotSizer | None:
    """Who sized slot (ubatch 0, lane 0): its last ``resize`` in ``events`` (a manager's ``events``), with the phase
    from ``phase_marks`` (``(phase name, len(events) at the phase's end)``, in order); ``None`` if it never grew."""
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if e.kind == "resize" and e.ubatch == 0 and e.lane == 0:
            phase = next((name for name, end in phase_marks if i < end), "?")
            return SlotSizer(e.caller, consumer_of(e.caller), phase, e.new_bytes)
    return None
