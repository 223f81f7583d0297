"""The registry of vLLM 0.33's workspace consumers on CUDA: the modelled ones, and the rest with why not.

A slot of vLLM's ``WorkspaceManager`` is as large as the largest single request made before
``lock_workspace()``; separate ``get_simultaneous`` calls alias the same bytes. So a deployment's lock size
is the **maximum** over its active consumers' reservations (:func:`consumer_table`), and a refused call can
come from any consumer whose serve-time request exceeds it. The census of call sites is
``data/vllm_0_33_workspace_consumers.json`` (``parity/gen_consumer_census.py``); bytes are checked against
vLLM's own code by ``parity/test_consumers_parity.py``.

Modelled (:data:`CONSUMERS`; the modules cite vLLM's file and function):

======================== ============================================ ============ ===============================
registry name            vLLM call site (assertion name)              phase        shape
======================== ============================================ ============ ===============================
turboquant_decode        turboquant_attn.py:_decode_attention         init         (B,Hq,S,D+1) f32,(B,Hq,D),(B,Hq) f32
turboquant_continuation  turboquant_attn.py:_continuation_prefill     init / none  2 x (1,Hk,round_up(c,bs),D) f16
flash_attn_dcp           flash_attn.py:_forward_with_dcp              capture/none (mnbt, Hq*dcp, D) model dtype
fused_moe                modular_kernel.py:_allocate_buffers          profile_run  TritonExperts at M = mnbt
flashmla_sparse          flashmla_sparse.py:__init__                  init         workspace_specs
mla_prefill_trtllm_ragged trtllm_ragged.py:prepare_metadata           init         394 MiB uint8 (SM100)
mla_prefill_flashinfer   flashinfer.py:prepare_metadata               init         394 MiB uint8
triton_mla_logits        triton_mla.py:forward_mqa                    init         (rows,Hq*dcp,splits,kv_lora+1) f32
sparse_indexer           sparse_attn_indexer.py:sparse_attn_indexer   profile_run  (T,128) fp8,(T,4) u8, 1 MiB
======================== ============================================ ============ ===============================

Not modelled: :data:`UNMODELLED` (each with the reason); :func:`unmodelled` says which a deployment would use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from tqlab.core.consumers.arch_table import FAMILY, reachable_families
from tqlab.core.consumers.arch_table import unsized as arch_unsized
from tqlab.core import vllm_versions
from tqlab.core.consumers.backends import attention_backend, unmodelled_backend
from tqlab.core.consumers.base import Consumer, StartUp
from tqlab.core.consumers.flash_attn_dcp import FlashAttentionDCP
from tqlab.core.consumers.flashmla_sparse import FlashMLASparse
from tqlab.core.consumers.fused_moe import FusedMoE, unmodelled_reason
from tqlab.core.consumers.mla_prefill import MLAPrefillFlashInfer, MLAPrefillTrtllmRagged
from tqlab.core.consumers.sparse_indexer import SparseIndexer
from tqlab.core.consumers.triton_mla import TritonMLALogits
from tqlab.core.consumers.turboquant import TurboQuantContinuation, TurboQuantDecode

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["CONSUMERS", "TURBOQUANT", "UNMODELLED", "ConsumerRow", "ConsumerTable", "Unmodelled", "active_consumers", "turboquant_active",
           "turboquant_only", "consumer_named", "consumer_table", "unmodelled"]

CONSUMERS: tuple[Consumer, ...] = (
    TurboQuantDecode(), TurboQuantContinuation(), FlashAttentionDCP(), FusedMoE(), FlashMLASparse(),
    MLAPrefillTrtllmRagged(), MLAPrefillFlashInfer(), TritonMLALogits(), SparseIndexer(),
)

TURBOQUANT = frozenset({TurboQuantDecode.name, TurboQuantContinuation.name})
"""Registry names of TurboQuant's consumers: the predictor sizes them per prompt with the closed forms of
:mod:`tqlab.predict.prompts` (their requests depend on the prompt), every other consumer by its table row."""


def consumer_named(name: str) -> Consumer:
    """The registry entry called ``name``. Raises ``KeyError`` for an unknown name."""
    for c in CONSUMERS:
        if c.name == name:
            return c
    raise KeyError(f"no modelled workspace consumer named {name!r}")


@dataclass(frozen=True)
class Unmodelled:
    """A consumer tqlab does not size: ``consumer`` (vLLM call site), ``reason``, ``applies`` (whether a deployment uses it,
    when tqlab's fields can tell; ``None``: a model or platform tqlab's config cannot describe)."""

    consumer: str
    reason: str
    applies: Callable[["EngineConfig"], bool] | None = None


def _backend_is(*names: str) -> Callable[["EngineConfig"], bool]:
    return lambda c: attention_backend(c) in names


UNMODELLED: tuple[Unmodelled, ...] = (
    Unmodelled("modular_kernel.py:_allocate_buffers (non-Triton experts)",
               "quantized, FlashInfer, batched or DP+EP MoE: other experts classes' workspace_shapes",
               lambda c: unmodelled_reason(c) is not None),
    Unmodelled("deep_gemm_warmup.py:_warmup", "DeepGEMM grouped FP8 warm-up at MAX_M rows (kernel warm-up of FP8 MoE)",
               lambda c: c.moe is not None and (c.moe.quantization or "").startswith("fp8")),
    Unmodelled("moe_permute_unpermute.py:get_moe_permute_scratch",
               "persistent resource keyed by (num_experts, local experts, device): bytes are not a workspace slot"),
    Unmodelled("marlin_utils.py:get_marlin_workspace", "persistent locks keyed by CUDA stream (Marlin quantized GEMMs)"),
    Unmodelled("fused_humming_moe.py:make_workspaces", "Humming quantized MoE experts"),
    Unmodelled("b12x.py:__init__", "scratch bytes come from compiled kernel plans, not a closed form",
               _backend_is("B12X")),
    Unmodelled("tokenspeed_mla.py:_get_workspace", "bound uses the tokenspeed_mla package's SM query",
               _backend_is("TOKENSPEED_MLA")),
    Unmodelled("qwen_gdn_linear_attn.py:_warmup_prefill_kernels", "Qwen GDN state checkpoints (model-specific spec)"),
    Unmodelled("deepseek_v4/nvidia/flashmla.py, deepseek_v41/*", "DeepSeek-V4/V4.1 attention: compressed-KV gather sizes"),
    Unmodelled("dots3_note/nvidia/attention.py:_forward_swa_mqa",
               "Dots3-Note SWA gather; its own reservation method is never called (latent crash 4)"),
    Unmodelled("glm5next/*, kimi_k3/*, hy_v4/*", "GLM-5-Next FlashKDA / k-pool indexer, Kimi-K3 KDA and DSpark drafter "
               "(lane 1), HY-V4 sparse MLA: model-specific"),
    Unmodelled("sparse_mqa_indexer.py, sparse indexer MXFP4 / PCP+DCP", "MXFP4 indexer cache and context-parallel gathers"),
    Unmodelled("turboquant_attn.py:_ensure_on_device, ultraquant_attn.py:_ensure_on_device",
               "pre-warm only on the ROCm FlyDSL path"),
    Unmodelled("29 ROCm-only and 2 XPU call sites", "not CUDA"),
)


@dataclass(frozen=True)
class ConsumerRow:
    """One active consumer of a deployment: the fields of ``plan --json`` / ``inspect-vllm --json`` ``consumers``."""

    consumer: str
    name: str
    phase: str
    slot: str
    reserved_bytes: int
    max_runtime_bytes: int
    covered: bool

    def to_dict(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "name": self.name, "phase": self.phase, "slot": self.slot,
                "reserved_bytes": self.reserved_bytes, "max_runtime_bytes": self.max_runtime_bytes,
                "covered": self.covered}


@dataclass(frozen=True)
class ConsumerTable:
    """All active consumers of a deployment: ``rows``, ``locked_bytes`` (max ``reserved_bytes``: the slot size at the
    lock, or ``None`` when start-up never locks) and ``unmodelled`` (consumers it would use that tqlab does not size)."""

    rows: tuple[ConsumerRow, ...]
    locked_bytes: int | None
    unmodelled: tuple[dict[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        """``{"consumers": [...], "consumers_locked_bytes": ..., "unmodelled": [...]}`` (``plan --json`` keys)."""
        return {"consumers": [r.to_dict() for r in self.rows], "consumers_locked_bytes": self.locked_bytes,
                "unmodelled": list(self.unmodelled)}


def active_consumers(config: "EngineConfig") -> list[Consumer]:
    """The modelled consumers ``config`` uses, in registry order: those whose rule (fields, the backend vLLM's
    selector picks) holds, among the layer families ``config.architecture``'s model class builds
    (:func:`tqlab.core.consumers.arch_table.reachable_families`; every family when the table cannot tell)."""
    families = reachable_families(config)
    return [c for c in CONSUMERS if (families is None or FAMILY[c.name] in families) and c.active(config)]


def turboquant_active(config: "EngineConfig") -> bool:
    """Whether TurboQuant's workspace consumers run: :attr:`~tqlab.core.config.EngineConfig.has_turboquant_consumers`
    (a TurboQuant cache, or the teaching variant) and ``config.architecture``'s model class builds vLLM's
    ``Attention`` layer (:func:`tqlab.core.consumers.arch_table.reachable_families`; unknown: assumed).

    vLLM 0.33 picks TurboQuant's backend only for an ``Attention`` layer (``attention/attention.py``
    ``Attention.__init__`` -> the selector); an attention-free class (``MambaForCausalLM``: ``IsAttentionFree``)
    builds none, and ``engine/arg_utils.py`` ``create_engine_config`` accepts the cache dtype anyway
    (``TurboQuantConfig.get_boundary_skip_layers`` refuses only a hybrid without full-attention layers): the
    dtype has no effect, so no ``_decode_attention`` / ``_continuation_prefill`` call and no reservation."""
    if not config.has_turboquant_consumers:
        return False
    families = reachable_families(config)
    return families is None or FAMILY[TurboQuantDecode.name] in families


def turboquant_only(config: "EngineConfig") -> bool:
    """True when TurboQuant's consumers are the deployment's only workspace consumers (modelled or not): the
    deployments notebooks 02-09 and the TurboQuant closed forms are about. False for a non-TurboQuant cache."""
    active = {c.name for c in active_consumers(config)}
    return bool(active) and active <= TURBOQUANT and not unmodelled(config)


def unmodelled(config: "EngineConfig") -> list[dict[str, str]]:
    """``[{"consumer", "reason"}]`` of the consumers ``config`` would use that tqlab does not size: the start-up of a
    release whose start-up rules are only partly modelled
    (:attr:`~tqlab.core.vllm_versions.VllmVersion.startup_rules_modelled`), those vLLM's model
    code reaches for ``config.architecture`` and no registry entry sizes (:func:`tqlab.core.consumers.arch_table.unsized`:
    an architecture outside vLLM's registry, an unread field, a model-specific call site), then a pinned
    ``--attention-backend`` of vLLM's enum that tqlab does not model
    (:func:`tqlab.core.consumers.backends.unmodelled_backend`: its validation and its workspace requests are not
    replayed), then those :data:`UNMODELLED` applies to as far as the fields tell (the experts class, a backend
    tqlab does not size)."""
    out = arch_unsized(config)
    version = vllm_versions.current()
    if not version.startup_rules_modelled:  # never a silent ok on a release whose start-up is only partly modelled
        out.append({"consumer": f"start-up ({version}, {version.model_runner})", "reason": (
            "its capture sizes and decode rows are modelled, but not every consumer's requests in Model Runner V2's "
            "JIT warm-up steps (warmup_kernels, before capture) and PIECEWISE captures (which build attention "
            "metadata): the lock may be larger than tqlab says (tqlab.core.vllm_versions)"
            + ("" if version.startup_validation_modelled else "; nor its start-up validation, so a deployment this "
               "release refuses to start is not named as refused"))})
    backend = unmodelled_backend(config)
    if backend is not None:  # a real vLLM backend tqlab does not model (ROCm, CPU, DeepSeek-V4's, B12X...): never ok
        out.append({"consumer": f"attention backend {config.attention_backend}", "reason": backend})
    for u in UNMODELLED:
        if u.applies is not None and u.applies(config):
            reason = unmodelled_reason(config) if u.consumer.startswith("modular_kernel") else u.reason
            out.append({"consumer": u.consumer, "reason": reason or u.reason})
    return out


def consumer_table(config: "EngineConfig", startup: StartUp) -> ConsumerTable:
    """Every active consumer's bytes for ``config`` under ``startup``.

    ``covered`` is True when the consumer's largest serve-time request fits the locked slot (or start-up never
    locks). Raises ``ValueError`` (one line, naming the field) for a config a consumer cannot size.
    """
    sized = [(c, c.sizes(config, startup)) for c in active_consumers(config)]
    locked = max((s.reserved_bytes for _, s in sized), default=0) if startup.locks else None
    rows = tuple(
        ConsumerRow(c.consumer, c.name, s.phase, s.slot, s.reserved_bytes, s.max_runtime_bytes,
                    locked is None or s.max_runtime_bytes <= locked)
        for c, s in sized
    )
    return ConsumerTable(rows, locked, tuple(unmodelled(config)))
