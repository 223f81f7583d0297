"""Workspace consumers' shapes, and the reservation that sizes them up front.

The lesson of the bug in code: each workspace buffer's shape formula lives in
exactly one function below. The TurboQuant attention backend
(``tqlab/attention/turboquant_attn.py``) calls these functions when it asks the workspace for
memory, and the reservation (vLLM PR #44053, ``_reserve_workspace`` in
``TurboQuantMetadataBuilder``, ``vllm/v1/attention/backends/turboquant_attn.py``)
calls the very same functions with worst-case arguments. A consumer whose
formula changes cannot drift away from its reservation.

Consumers (per attention layer call, on one tensor-parallel rank):

* split-KV decode — :func:`decode_workspace_shapes`:
  ``(B, Hq, S, D+1) float32`` partial outputs + log-sum-exp per split,
  ``(B, Hq, D) model dtype`` output, ``(B, Hq) float32`` final log-sum-exp.
* continuation prefill (a chunk with cached tokens and more than
  ``CONTINUATION_DECODE_THRESHOLD`` new tokens) — :func:`continuation_workspace_shapes`:
  two ``(1, Hk, round_up(cached_len, block_size), D) float16`` buffers that
  receive the dequantized cached K and V.

A continuation chunk of at most 128 new tokens takes the decode kernel instead,
one synthetic decode row per new token (``B = q_len``). In vLLM 0.33 that call
passes no workspace buffers (the kernel allocates its own scratch), so it asks
the workspace for nothing; tqlab does the same (checked against vLLM's own
backend by ``parity/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqlab.core import dtypes
from tqlab.core.dtypes import DType
from tqlab.core.hardware import gpu_target
from tqlab.core.workspace_layout import compute_layout, positive_int, round_up

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.core.workspace import WorkspaceManager

__all__ = [
    "CONTINUATION_DECODE_THRESHOLD",
    "ChunkRequest",
    "Shapes",
    "chunk_workspace_request",
    "continuation_workspace_shapes",
    "KvSplitsAdvice",
    "decode_workspace_shapes",
    "deployment_decode_shapes",
    "filling_kv_splits",
    "gpu_filling_kv_splits",
    "kv_splits_advice",
    "plan_bytes",
    "reservation_plan",
    "reserve_workspace",
]

CONTINUATION_DECODE_THRESHOLD = 128
"""vLLM's ``_CONTINUATION_DECODE_THRESHOLD``: continuation chunks of at most this
many new tokens use the split-KV decode kernel; longer ones dequantize the cache."""

Shapes = tuple[tuple[tuple[int, ...], DType], ...]
"""One ``get_simultaneous`` call: a tuple of ``(shape, dtype)`` pairs. The dtypes are torch-free stand-ins
(:mod:`tqlab.core.dtypes`, equal to the torch dtype of the same name): these shapes are counted by the
predictor without torch, and the workspace manager turns them into torch's dtypes when it makes the views."""


def decode_workspace_shapes(
    batch_size: int,
    num_heads: int,
    head_dim: int,
    num_kv_splits: int,
    output_dtype: Any,
) -> Shapes:
    """Workspace views of one split-KV decode call.

    Args:
        batch_size: decode rows ``B`` (requests, or new tokens of a short
            continuation chunk).
        num_heads: query heads on this rank ``Hq``.
        head_dim: ``D``.
        num_kv_splits: ``S``, vLLM's ``tq_max_kv_splits_for_cuda_graph``.
        output_dtype: the model dtype (a ``torch.dtype`` or its :mod:`tqlab.core.dtypes` stand-in).

    Returns:
        ``(((B, Hq, S, D + 1), float32), ((B, Hq, D), output_dtype), ((B, Hq), float32))``:
        per-split partial outputs with their log-sum-exp in the last column,
        the reduced output, and the final log-sum-exp; every dtype a :class:`~tqlab.core.dtypes.DType`.
        Raises ``ValueError`` for a non-positive size, ``TypeError`` for an ``output_dtype`` that is no dtype.
    """
    b = positive_int("batch_size", batch_size, 0)
    h = positive_int("num_heads", num_heads)
    d = positive_int("head_dim", head_dim)
    s = positive_int("num_kv_splits", num_kv_splits)
    if not dtypes.is_dtype(output_dtype):
        raise TypeError(f"output_dtype must be a torch.dtype (or a tqlab.core.dtypes.DType), got {output_dtype!r}")
    return (
        ((b, h, s, d + 1), dtypes.float32),
        ((b, h, d), dtypes.standin(output_dtype)),
        ((b, h), dtypes.float32),
    )


def deployment_decode_shapes(config: "EngineConfig", batch_size: int, num_kv_splits: int | None = None) -> Shapes:
    """:func:`decode_workspace_shapes` for ``config``'s rank: ``(B, Hq/TP, S, D+1)`` and the rest, in the model dtype.

    ``num_kv_splits``: ``S``; default the deployment's ``tq_max_kv_splits_for_cuda_graph`` (vLLM 0.33's
    ``attention_config`` field, 32 by default, read by ``TurboQuantMetadataBuilder._reserve_workspace`` and
    ``TurboQuantAttentionImpl``, ``vllm/v1/attention/backends/turboquant_attn.py``). Every caller that needs a
    deployment's decode request calls this, so none re-derives ``Hq``, ``D`` or ``S``.
    """
    s = config.tq_max_kv_splits_for_cuda_graph if num_kv_splits is None else num_kv_splits
    return decode_workspace_shapes(batch_size, config.num_heads_per_rank, config.head_dim, s, config.dtype)


def filling_kv_splits(batch_size: int, num_kv_heads: int, sm_count: int, *, floor: int, programs_per_sm: int = 4,
                      max_splits: int = 256) -> int:
    """The one split-count rule that fills a GPU: the power of two at or above
    ``programs_per_sm * sm_count / (batch_size * num_kv_heads)`` (one decode program per request x KV head x
    split), clamped to ``[floor, max_splits]``. Used by :func:`gpu_filling_kv_splits` (a deployment) and by
    ``tqlab.turboquant.ops.decode_num_splits``' ``"fill"`` policy (a kernel launch). Raises ``ValueError`` for a
    non-positive argument."""
    b, hk, sms = (positive_int(n, v) for n, v in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                                                  ("sm_count", sm_count)))
    pps, cap, lo = (positive_int(n, v) for n, v in (("programs_per_sm", programs_per_sm), ("max_splits", max_splits),
                                                   ("floor", floor)))
    want = -(-pps * sms // (b * hk))
    s = 1 << max(0, (want - 1).bit_length())  # next power of two >= want
    return max(lo, min(cap, s))


def gpu_filling_kv_splits(config: "EngineConfig", batch_size: int = 1, *, programs_per_sm: int = 4,
                          max_splits: int = 256) -> int:
    """The split count ``S`` that fills ``config.gpu`` for a decode batch of ``batch_size`` rows (issue 20).

    One decode program per (request, KV head on this rank, split): ``S`` is the power of two at or above
    ``programs_per_sm * sm_count / (batch_size * Hk)``, within ``[tq_max_kv_splits_for_cuda_graph, max_splits]``
    (never below the deployment's own). SM counts: :mod:`tqlab.core.hardware` (H200: 132). A CUDA graph
    replays the count it was captured with, so this is a capture-time choice: vLLM 0.33 takes it from
    ``--attention-config.tq_max_kv_splits_for_cuda_graph`` (one value for every captured size); tqlab only
    recommends it. 4 programs per SM is what tqlab's fast decode kernel's registers allow
    (``tqlab.turboquant.ops.decode_num_splits``' ``"fill"`` policy uses the same rule). Raises
    ``ValueError`` for a non-positive size or an unknown GPU.
    """
    return filling_kv_splits(batch_size, config.num_kv_heads_per_rank, gpu_target(config.gpu).sm_count,
                             floor=config.tq_max_kv_splits_for_cuda_graph, programs_per_sm=programs_per_sm,
                             max_splits=max_splits)


@dataclass(frozen=True)
class KvSplitsAdvice:
    """``gpu``, ``sm_count``; ``configured_splits``/``configured_bytes`` (the deployment's ``S`` and the decode
    workspace it reserves at ``max_num_seqs`` rows); ``filling_splits``/``filling_bytes`` (the same for
    :func:`gpu_filling_kv_splits` at one row); ``flag``: what to pass to vLLM for the latter."""

    gpu: str
    sm_count: int
    configured_splits: int
    configured_bytes: int
    filling_splits: int
    filling_bytes: int

    @property
    def flag(self) -> str:
        return f"--attention-config.tq_max_kv_splits_for_cuda_graph {self.filling_splits}"


def kv_splits_advice(config: "EngineConfig") -> KvSplitsAdvice:
    """The deployment's split count beside the one that fills its GPU for one decode row, each with the decode
    workspace bytes it makes ``_reserve_workspace`` reserve (``(max_num_seqs, Hq, S, D+1)`` and the rest:
    :func:`deployment_decode_shapes`, the one decode-shape function). Predicting vLLM keeps the configured
    ``S``; the filling one is a recommendation."""
    fill = gpu_filling_kv_splits(config)
    rows = config.max_num_seqs
    return KvSplitsAdvice(
        gpu=gpu_target(config.gpu).name, sm_count=gpu_target(config.gpu).sm_count,
        configured_splits=config.tq_max_kv_splits_for_cuda_graph,
        configured_bytes=compute_layout(deployment_decode_shapes(config, rows)).total_bytes,
        filling_splits=fill, filling_bytes=compute_layout(deployment_decode_shapes(config, rows, fill)).total_bytes,
    )


def continuation_workspace_shapes(cached_len: int, num_kv_heads: int, head_dim: int, block_size: int) -> Shapes:
    """Workspace views of one continuation-prefill dequant.

    Args:
        cached_len: tokens already in the KV cache before this chunk.
        num_kv_heads: KV heads on this rank ``Hk``.
        head_dim: ``D``.
        block_size: the attention block (page) size in use; hybrid models use
            large pages (e.g. 2080 tokens), so this is not always 16.

    Returns:
        Two ``((1, Hk, round_up(cached_len, block_size), D), float16)`` pairs:
        dequantized cached K and V.
    """
    c = positive_int("cached_len", cached_len, 0)
    hk = positive_int("num_kv_heads", num_kv_heads)
    d = positive_int("head_dim", head_dim)
    bs = positive_int("block_size", block_size)
    shape = (1, hk, round_up(c, bs), d)
    return ((shape, dtypes.float16), (shape, dtypes.float16))


@dataclass(frozen=True)
class ChunkRequest:
    """What one prefill chunk asks of the workspace.

    ``path`` is ``"prefill"`` (no cached tokens), ``"decode_kernel"`` (short
    continuation: the decode kernel with ``B = q_len`` rows and its own scratch)
    or ``"continuation"`` (dequant buffers sized by ``cached_len``). ``shapes``
    is the workspace call, or None when the path makes none.
    """

    cached_len: int
    q_len: int
    path: str
    shapes: Shapes | None

    @property
    def nbytes(self) -> int:
        return 0 if self.shapes is None else compute_layout(self.shapes).total_bytes


def chunk_workspace_request(config: "EngineConfig", cached_len: int, q_len: int) -> ChunkRequest:
    """The workspace call a prefill chunk of ``q_len`` new tokens after ``cached_len`` cached ones makes.

    The attention backend decides its path with this function, so the
    predictor and the real run cannot disagree. Raises ``ValueError`` for
    ``cached_len < 0`` or ``q_len < 1``.
    """
    positive_int("cached_len", cached_len, 0)
    positive_int("q_len", q_len, 1)
    if cached_len == 0:
        return ChunkRequest(cached_len, q_len, "prefill", None)
    if q_len <= CONTINUATION_DECODE_THRESHOLD:
        # vLLM 0.33: triton_turboquant_decode_attention without workspace buffers.
        return ChunkRequest(cached_len, q_len, "decode_kernel", None)
    shapes = continuation_workspace_shapes(cached_len, config.num_kv_heads_per_rank, config.head_dim, config.block_size)
    return ChunkRequest(cached_len, q_len, "continuation", shapes)


def reservation_plan(config: "EngineConfig", *, decode_batch: int | None = None) -> list[Shapes]:
    """The ``get_simultaneous`` calls the fix makes before CUDA graph capture.

    Mirrors ``TurboQuantMetadataBuilder._reserve_workspace`` (vLLM PR #44053):

    1. decode views at ``max_num_seqs`` rows (``decode_batch`` overrides it,
       e.g. to cover a consumer whose short continuation chunks run the decode
       kernel through the workspace with up to 128 rows; vLLM 0.33 does not);
    2. only if chunked prefill is on and ``max_num_batched_tokens > 128``:
       continuation buffers at ``cached_len = max_model_len - 1`` (rounded up
       to ``block_size`` by the consumer's own formula).

    Only TurboQuant's backend has these consumers (and this reservation): ``[]`` unless
    :attr:`~tqlab.core.config.EngineConfig.has_turboquant_consumers` (a TurboQuant cache, or the
    teaching variant ``turboquant_backend_on_unquantized``, whose ``auto`` cache copies instead of
    dequantizing). For ``pr-44053-unit-test``: ``[((16,8,4,129) f32, (16,8,128) f16, (16,8) f32),
    ((1,4,8192,128) f16, (1,4,8192,128) f16)]``.
    """
    batch = config.max_num_seqs if decode_batch is None else positive_int("decode_batch", decode_batch)
    if not config.has_turboquant_consumers:
        return []
    plan = [deployment_decode_shapes(config, batch)]
    if config.enable_chunked_prefill and config.max_num_batched_tokens > CONTINUATION_DECODE_THRESHOLD:
        plan.append(
            continuation_workspace_shapes(
                max(0, config.max_model_len - 1), config.num_kv_heads_per_rank, config.head_dim, config.block_size
            )
        )
    return plan


def plan_bytes(plan: list[Shapes]) -> int:
    """Bytes one workspace slot needs to serve every call of ``plan`` (the largest call)."""
    return max((compute_layout(call).total_bytes for call in plan), default=0)


def reserve_workspace(
    config: "EngineConfig", manager: "WorkspaceManager | None" = None, *, decode_batch: int | None = None
) -> list[Shapes]:
    """Make the reservation calls on ``manager`` (default: the current one), in the caller's ubatch slot.

    As vLLM 0.33's ``TurboQuantMetadataBuilder._reserve_workspace``
    (``vllm/v1/attention/backends/turboquant_attn.py``, PR #44053): the calls are plain
    ``get_simultaneous`` calls, so they land in the slot of ``dbo_current_ubatch_id()`` —
    slot 0 when the builder's constructor runs, outside any micro-batch. With DBO slot 1 is
    left at whatever other start-up work asked of it, and a continuation chunk run in
    ubatch 1 after the lock can still be refused (``parity/test_reservation_parity.py``
    checks the slot sizes against vLLM's own builder; notebook 06 §7 shows the refusal).

    Returns the plan. Without ``manager`` and with no process-wide manager initialized it
    returns ``[]`` at once and reserves nothing, as vLLM does
    (``if not is_workspace_manager_initialized(): return``). Raises ``WorkspaceLockedError`` if
    the manager is locked and too small (reserve before locking).
    """
    from tqlab.core.workspace import current_workspace_manager, is_workspace_manager_initialized  # torch: real views

    if manager is None and not is_workspace_manager_initialized():
        return []  # vLLM: no manager yet (e.g. a builder made outside a worker) -> no reservation
    m = current_workspace_manager() if manager is None else manager
    plan = reservation_plan(config, decode_batch=decode_batch)
    for call in plan:
        m.get_simultaneous(*call)
    return plan
