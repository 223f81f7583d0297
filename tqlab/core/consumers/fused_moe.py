"""Fused MoE: the modular kernel's shared scratch (``workspace13``/output and ``workspace2``).

vLLM 0.33 ``vllm/model_executor/layers/fused_moe/modular_kernel.py`` ``FusedMoEKernelModularImpl._allocate_buffers``
asks ``get_simultaneous(((max(prod(workspace13), prod(output)),), wdt), (workspace2, wdt))`` with the shapes from
``fused_experts.workspace_shapes(M, N, K, topk, ...)`` and ``wdt = fused_experts.workspace_dtype(act dtype)``
(skipped on the CPU platform, which allocates directly). ``_fused_experts`` calls it with
``M = M_chunk = M_full`` = the tokens reaching the layer, so the profile run ``_dummy_run(max_num_batched_tokens)``
sizes it at ``M = max_num_batched_tokens`` (phase ``profile_run``) and serving never asks for more.

Modelled experts class: ``TritonExperts`` (``fused_moe/experts/triton_moe.py`` ``workspace_shapes``:
``workspace1 = (M, topk, max(N // 2, K))`` for a gated activation, ``workspace2 = (M, topk, max(N, K))``,
``output = (M, K)``; ``workspace_dtype`` = the activation dtype). vLLM 0.33 picks it for unquantized
bf16/fp16 MoE on SM90 (``fused_moe/oracle/unquantized.py``: FlashInfer moved behind Triton on Hopper) and
as the fallback elsewhere. ``N = 2 * moe_intermediate_size / tp`` (``w1`` width per rank; with
``--enable-expert-parallel`` the experts are split instead and ``N = 2 * moe_intermediate_size``),
``K = hidden_size``. Not modelled (listed by the registry): quantized MoE (FP8 block / DeepGEMM, NVFP4,
MXFP4, Marlin, Humming), FlashInfer TRT-LLM / CUTLASS experts (SM100's first choice), batched experts
(DeepEP low-latency), and data parallelism with expert parallelism (the all-to-all changes ``M``).

Reads: ``moe`` (num_experts_per_tok, moe_intermediate_size, hidden_size, quantization, activation),
``max_num_batched_tokens``, ``tensor_parallel_size``, ``enable_expert_parallel``, ``data_parallel_size``,
``dtype``, ``gpu``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqlab.core.consumers.base import Consumer, ConsumerSizes, StartUp
from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tqlab.core.config import EngineConfig

__all__ = ["FusedMoE", "moe_allocate_buffers_call", "step_call", "triton_experts_workspace_shapes", "unmodelled_reason"]


def triton_experts_workspace_shapes(M: int, N: int, K: int, topk: int, gated: bool = True):
    """``TritonExperts.workspace_shapes``: ``((M, topk, max(N_act, K)), (M, topk, max(N, K)), (M, K))``,
    ``N_act = N // 2`` for a gated activation (``adjust_N_for_activation``), else ``N``."""
    n_act = N // 2 if gated else N
    return (M, topk, max(n_act, K)), (M, topk, max(N, K)), (M, K)


def moe_allocate_buffers_call(M: int, N: int, K: int, topk: int, dtype: "torch.dtype", gated: bool = True):
    """The ``get_simultaneous`` call of ``_allocate_buffers`` for TritonExperts at ``M`` rows."""
    ws13, ws2, out = triton_experts_workspace_shapes(M, N, K, topk, gated)
    common = max(ws13[0] * ws13[1] * ws13[2], out[0] * out[1])
    return (((common,), dtype), (ws2, dtype))


def step_call(config: "EngineConfig", num_tokens: int):
    """The ``_allocate_buffers`` call of one forward pass whose MoE layers see ``num_tokens`` rows
    (``M_chunk = M_full = num_tokens``: the profile run's ``max_num_batched_tokens``, a capture size, or a
    serving step's scheduled tokens), TritonExperts on this rank.

    ``N = 2 * moe_intermediate_size / tp`` (gated) or ``moe_intermediate_size / tp``, ``tp = 1`` with expert
    parallelism; ``K = hidden_size``; dtype the model dtype. Raises ``ValueError`` (one line) when
    ``moe_intermediate_size`` is not divisible by the tensor-parallel size or ``num_tokens < 1``
    (``_allocate_buffers`` asserts ``M_full > 0``).
    """
    moe = config.moe
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"fused MoE rows M must be an int >= 1 (_allocate_buffers asserts M_full > 0), got {num_tokens!r}")
    tp = 1 if config.enable_expert_parallel else config.tensor_parallel_size
    if moe.moe_intermediate_size % tp:
        raise ValueError(f"moe_intermediate_size ({moe.moe_intermediate_size}) must be divisible by "
                         f"tensor_parallel_size ({tp}) for tensor-parallel experts")
    gated = not moe.activation.endswith("_no_mul")  # MoEActivation.is_gated
    n = (2 if gated else 1) * moe.moe_intermediate_size // tp
    return moe_allocate_buffers_call(num_tokens, n, moe.hidden_size, moe.num_experts_per_tok, config.dtype, gated=gated)


def unmodelled_reason(config: "EngineConfig") -> str | None:
    """Why tqlab cannot size this deployment's MoE scratch, or ``None`` when TritonExperts is modelled."""
    moe = config.moe
    if moe is None:
        return None
    if moe.quantization is not None:
        return f"quantized MoE ({moe.quantization}) uses other experts classes (DeepGEMM, CUTLASS, Marlin, ...)"
    if gpu_target(config.gpu).is_sm100:
        return "SM100: vLLM prefers FlashInfer TRT-LLM/CUTLASS bf16 experts over Triton"
    if config.data_parallel_size > 1 and config.enable_expert_parallel:
        return "data + expert parallelism: the all-to-all backend decides M (DeepEP high-throughput: data-dependent)"
    return None


class FusedMoE(Consumer):
    """TritonExperts scratch of the modular fused-MoE kernel at ``M = max_num_batched_tokens``."""

    name = "fused_moe"
    consumer = "modular_kernel.py:_allocate_buffers"
    source = ("vllm/model_executor/layers/fused_moe/modular_kernel.py FusedMoEKernelModularImpl._allocate_buffers; "
              "fused_moe/experts/triton_moe.py TritonExperts.workspace_shapes")
    reads = ("moe", "max_num_batched_tokens", "tensor_parallel_size", "enable_expert_parallel", "data_parallel_size",
             "dtype", "gpu")

    def active(self, config: "EngineConfig") -> bool:
        return config.moe is not None and unmodelled_reason(config) is None

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:
        call = step_call(config, config.max_num_batched_tokens)
        return ConsumerSizes("profile_run", [call], [call], slot="each ubatch the profile run uses")
