"""The KV-cache pool one GPU really holds, and the workspace's share of it (the one "share of the KV cache").

vLLM sizes the KV cache from what the profile run leaves (``Worker.determine_available_memory``,
``vllm/v1/worker/gpu_worker.py``): ``gpu_memory_utilization × total memory − (weights + activation peak +
non-torch memory)``; ``gpu_memory_utilization`` defaults to the release's
(:attr:`tqlab.core.vllm_versions.VllmVersion.gpu_memory_utilization`: 0.92 in 0.33; 1.0 in 0.34, whose extensible
KV cache is sized from measured memory, which this arithmetic approximates).
Its layers are not all TurboQuant: for a dense model ``EngineArgs.create_engine_config``
(``vllm/engine/arg_utils.py``) adds ``TurboQuantConfig.get_boundary_skip_layers``
(``vllm/model_executor/layers/quantization/turboquant/config.py``: the first and last ``min(2, L // 2)``
layers; none for a hybrid model) to ``kv_cache_dtype_skip_layers``, and ``Attention.__init__``
(``vllm/model_executor/layers/attention/attention.py``) gives those layers the model dtype's cache.

:func:`kv_pool` is the one home of that arithmetic: notebook 06 §2, the reservation planner
(``tqlab.lab.widgets.planner``) and ``tqlab plan`` call it. The weights come from the preset's ``weights``
block (``data/presets/*.json``: parameters × bytes per parameter / tensor-parallel ranks); the activation
peak is an assumption, :data:`ASSUMED_ACTIVATION_BYTES`, unless given (vLLM's start-up log prints it:
"PyTorch activation peak memory takes ... GiB").
"""

from __future__ import annotations

from dataclasses import dataclass

from tqlab.core.config import EngineConfig, load_preset
from tqlab.core import vllm_versions
from tqlab.core.hardware import gpu_target
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.turboquant.spec import kv_cache_bytes_per_token

__all__ = ["ASSUMED_ACTIVATION_BYTES", "DEFAULT_GPU_MEMORY_UTILIZATION", "KvPool", "boundary_layers", "kv_bytes_per_token",
           "kv_pool", "preset_weight_bytes"]

GiB = 2**30
#: The default release's ``--gpu-memory-utilization`` default (:attr:`tqlab.core.vllm_versions.VllmVersion.gpu_memory_utilization`;
#: :func:`kv_pool` takes the run's release's).
DEFAULT_GPU_MEMORY_UTILIZATION = vllm_versions.get(vllm_versions.DEFAULT).gpu_memory_utilization
#: The profile run's activation peak when none is given (an assumption; ~1.2 GiB for an 8B model at 8,192 tokens).
ASSUMED_ACTIVATION_BYTES = 1 * GiB


def boundary_layers(num_layers: int, *, hybrid: bool) -> int:
    """Layers vLLM 0.33 keeps in the model dtype on a TurboQuant cache: ``2 * min(2, L // 2)`` (dense), 0 (hybrid).

    ``TurboQuantConfig.get_boundary_skip_layers`` with its default ``n = 2``. Raises ``ValueError`` for
    ``num_layers < 1``.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
    if hybrid:
        return 0
    n = min(2, num_layers // 2)
    return len(set(range(n)) | set(range(num_layers - n, num_layers)))


def kv_bytes_per_token(config: EngineConfig, *, hybrid: bool | None = None) -> tuple[int, int]:
    """``(bytes one token costs on one rank over all its layers, boundary layers)``, as vLLM 0.33 lays them out.

    TurboQuant layers in the cache format (:func:`tqlab.turboquant.spec.kv_cache_bytes_per_token` of one layer),
    :func:`boundary_layers` in the model dtype (K and V, ``num_kv_heads_per_rank x head_dim`` each); a config
    that is not TurboQuant has no boundary layers. ``hybrid`` defaults to ``config.mamba_block_aligned_split``.
    """
    layers = config.num_hidden_layers
    hybrid = config.mamba_block_aligned_split if hybrid is None else hybrid
    edge = boundary_layers(layers, hybrid=hybrid) if config.is_turboquant else 0
    per_layer = kv_cache_bytes_per_token(config.replace(num_hidden_layers=1))
    native = 2 * config.num_kv_heads_per_rank * config.head_dim * config.dtype.itemsize
    return per_layer * (layers - edge) + native * edge, edge


def preset_weight_bytes(config: EngineConfig) -> int:
    """Weight bytes on one rank of ``config``'s preset: ``parameters × bytes_per_parameter / TP``.

    Raises ``ValueError`` when ``config`` has no preset or its preset records no ``weights``.
    """
    if config.preset is None:
        raise ValueError("the config has no preset, so its weights are unknown: pass weight_bytes")
    w = load_preset(config.preset).get("weights")
    if not w:
        raise ValueError(f"preset {config.preset!r} records no weights: pass weight_bytes")
    return int(w["parameters"] * w["bytes_per_parameter"]) // config.tensor_parallel_size


@dataclass(frozen=True)
class KvPool:
    """One rank's KV-cache pool and the workspace's share of it (bytes unless named otherwise).

    ``pool_bytes`` = ``utilization × gpu_bytes − weight_bytes − activation_bytes``;
    ``turboquant_layers`` / ``boundary_layers``: layers in the TurboQuant format / in the model dtype;
    ``bytes_per_token``: one token over all layers of the rank; ``tokens``: tokens the pool holds;
    ``workspace_bytes``: the fix's reservation × ubatch slots; ``share`` = ``workspace_bytes / pool_bytes``;
    ``assumed``: the inputs that were assumptions, in words. A hybrid model's Mamba state also comes out
    of vLLM's pool; it is not modelled here (``tokens`` counts the attention layers only).
    """

    gpu: str
    gpu_bytes: int
    utilization: float
    weight_bytes: int
    activation_bytes: int
    pool_bytes: int
    turboquant_layers: int
    boundary_layers: int
    bytes_per_token: int
    tokens: int
    workspace_bytes: int
    share: float
    assumed: tuple[str, ...]


def kv_pool(config: EngineConfig, *, hybrid: bool | None = None, gpu: str | None = None,
            utilization: float | None = None, weight_bytes: int | None = None,
            activation_bytes: int | None = None) -> KvPool:
    """The KV pool of one rank of ``config`` on ``gpu`` (default ``config.gpu``) and the workspace's share of it.

    ``hybrid``: a hybrid (Mamba + attention) model, whose attention layers all stay TurboQuant; default:
    ``config.mamba_block_aligned_split`` (set for the hybrid presets). ``config.num_hidden_layers`` counts the
    attention layers. Raises ``ValueError`` for a ``utilization`` outside (0, 1], unknown weights (see
    :func:`preset_weight_bytes`), or a pool of no bytes (weights + activations over the budget).
    """
    if utilization is None:  # the run's release's default (0.33: 0.92; 0.34: 1.0, the extensible KV cache)
        utilization = vllm_versions.current().gpu_memory_utilization
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    target = gpu_target(gpu or config.gpu)
    assumed = []
    if weight_bytes is None:
        weight_bytes = preset_weight_bytes(config)
        assumed.append(f"weights from the preset: {weight_bytes / GiB:.1f} GiB per rank")
    if activation_bytes is None:
        activation_bytes = ASSUMED_ACTIVATION_BYTES
        assumed.append(f"activation peak assumed {activation_bytes / GiB:.1f} GiB")
    gpu_bytes = int(target.memory_gib * GiB)
    pool = int(utilization * gpu_bytes) - weight_bytes - activation_bytes
    if pool <= 0:
        raise ValueError(f"no KV pool: {utilization} x {target.name}'s {target.memory_gib} GiB minus weights "
                         f"{weight_bytes / GiB:.1f} GiB and activations {activation_bytes / GiB:.1f} GiB is {pool / GiB:.1f} GiB")
    layers = config.num_hidden_layers
    per_token, edge = kv_bytes_per_token(config, hybrid=hybrid)
    workspace = plan_bytes(reservation_plan(config)) * config.num_ubatches
    return KvPool(gpu=target.name, gpu_bytes=gpu_bytes, utilization=utilization, weight_bytes=weight_bytes,
                  activation_bytes=activation_bytes, pool_bytes=pool, turboquant_layers=layers - edge,
                  boundary_layers=edge, bytes_per_token=per_token, tokens=pool // per_token,
                  workspace_bytes=workspace, share=workspace / pool, assumed=tuple(assumed))
