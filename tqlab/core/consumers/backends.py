"""Which attention and MLA-prefill backend a deployment gets: vLLM 0.33's selector on CUDA, and why it refuses one.

vLLM picks a backend per attention layer (``vllm/v1/attention/selector.py`` ``get_attn_backend``): the layer's
:class:`SelectorConfig` (vLLM's ``AttentionSelectorConfig``) goes to ``CudaPlatformBase.get_attn_backend_cls``
(``vllm/platforms/cuda.py``). A pinned backend (``--attention-backend`` / ``--attention-config.backend``) is
validated alone and a failure is fatal ("Selected backend ... is not valid for this configuration. Reason: [...]");
otherwise every backend of ``_get_backend_priorities`` is validated and the first valid one wins; none valid is
fatal too ("No valid attention backend found for ..."). Validation is ``AttentionBackend.validate_configuration``
(``vllm/v1/attention/backend.py``): one reason string per failed check, in its order, plus the backend's
``supports_combination``. :data:`BACKENDS` holds, per backend in a CUDA priority list, what those checks read
(supported dtypes, cache dtypes, kernel block sizes, head sizes, MLA / sparse, sinks, sliding window, DCP, PCP,
batch invariance, compute capability), copied from each backend's class in ``vllm/v1/attention/backends/``.
tqlab assumes a standard CUDA build with every kernel package installed (FlashAttention 3 on SM90, FlashInfer,
FlashMLA): reasons that come from a missing package are not modelled. ``parity/test_validation_parity.py``
holds :func:`validate_configuration` against vLLM's own on random selector configs.

``--attention-config.mla_prefill_backend`` pins the MLA prefill backend (:func:`mla_prefill_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["ATTENTION_BACKEND_NAMES", "BACKENDS", "BackendSpec", "DS_MLA_CACHE_FORMATS", "NoValidBackend",
           "SM100_MLA_PREFILL", "SelectorConfig", "attention_backend", "backend_priorities", "config_selector",
           "is_quantized_kv_cache", "mla_prefill_backend", "mla_prefill_refusal", "select_backend", "unmodelled_backend",
           "validate_configuration"]

DS_MLA_CACHE_FORMATS = frozenset({"fp8_ds_mla", "nvfp4_ds_mla"})
"""vLLM's ``QUANTIZED_DS_MLA_CACHE_FORMATS`` (``mla/flashmla_sparse.py``)."""

ATTENTION_BACKEND_NAMES = (
    "FLASH_ATTN", "FLASH_ATTN_DIFFKV", "TRITON_ATTN", "TRITON_ATTN_DIFFKV", "TRITON_FLASH_ATTN", "ROCM_ATTN",
    "ROCM_SEGMENTED_ATTN", "ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "ROCM_AITER_FA", "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE", "TORCH_SDPA", "FLASHINFER", "TRITON_FLASHINFER", "FLASHINFER_MLA", "TOKENSPEED_MLA",
    "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120", "FLASHINFER_MLA_SPARSE_SM90", "TRITON_MLA", "CUTLASS_MLA",
    "FLASHMLA", "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4", "ROCM_FLASHMLA_SPARSE_DSV4",
    "FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41", "ROCM_FLASHMLA_SPARSE_DSV41", "FLASHMLA_MEGA_ATTN_DSV41",
    "B12X", "FLASH_ATTN_MLA", "FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "MINIMAX_M3_SPARSE", "CUTLASS_MSA",
    "TRITON_MSA", "STEP5_DSA", "NO_ATTENTION", "FLEX_ATTENTION", "HPC_ATTN", "ROCM_AITER_UNIFIED_ATTN", "CPU_ATTN",
    "CPU_MLA", "AMX_MLA", "TURBOQUANT", "ROCM_OCTAVE", "ULTRAQUANT", "CUSTOM",
)
"""vLLM 0.33's ``AttentionBackendEnum`` members, in its order (``vllm/v1/attention/backends/registry.py``);
``parity/test_validation_parity.py`` checks the list against the enum."""

_UNQUANTIZED = ("auto", "float16", "bfloat16")


def is_quantized_kv_cache(kv_cache_dtype: str | None) -> bool:
    """vLLM's ``is_quantized_kv_cache`` (``vllm/v1/kv_cache_interface.py``): any cache dtype but auto/float16/bfloat16."""
    return kv_cache_dtype is not None and kv_cache_dtype not in _UNQUANTIZED


@dataclass(frozen=True)
class SelectorConfig:
    """One attention layer as vLLM's selector sees it (``AttentionSelectorConfig``, ``vllm/v1/attention/selector.py``).

    ``head_size`` (elements; the MLA head size for MLA), ``dtype`` (model dtype name: ``float16``, ``bfloat16``,
    ``float32``), ``kv_cache_dtype`` (the layer's: ``auto`` on TurboQuant's boundary layers), ``block_size``
    (``--block-size`` when the user gave it, else None: vLLM then picks a size the backend supports),
    ``use_mla``, ``use_sparse`` (a sparse indexer), ``has_sink`` (attention sinks), ``has_sliding_window``,
    ``use_dcp`` / ``use_pcp`` (decode / prefill context parallel size > 1), ``use_batch_invariant``
    (``VLLM_BATCH_INVARIANT``)."""

    head_size: int
    dtype: str
    kv_cache_dtype: str | None
    block_size: int | None = None
    use_mla: bool = False
    has_sink: bool = False
    use_sparse: bool = False
    has_sliding_window: bool = False
    use_batch_invariant: bool = False
    use_pcp: bool = False
    use_dcp: bool = False
    attn_type: str = "decoder"
    """``AttentionType``'s value: ``decoder``, or ``encoder_only`` for ``EncoderOnlyAttention`` (BERT-style poolers)."""
    flash_attn_version: int | None = None
    """Not vLLM's selector field: ``attention_config.flash_attn_version`` (2 when a TurboQuant cache forces it,
    ``EngineArgs.create_engine_config``), which FlashAttention's sink support reads (FA3 and up)."""

    def __repr__(self) -> str:
        """``AttentionSelectorConfig.__repr__``'s text (vLLM's refusal quotes it), fields tqlab does not model at
        their defaults."""
        return (f"AttentionSelectorConfig(head_size={self.head_size}, dtype=torch.{self.dtype}, "
                f"kv_cache_dtype={self.kv_cache_dtype}, block_size={self.block_size}, use_mla={self.use_mla}, "
                f"has_sink={self.has_sink}, use_sparse={self.use_sparse}, use_mm_prefix=False, "
                f"use_per_head_quant_scales=False, attn_type=AttentionType.{self.attn_type.upper()}, "
                f"has_sliding_window={self.has_sliding_window}, "
                f"use_non_causal=False, use_batch_invariant={self.use_batch_invariant}, use_kv_connector=False, "
                f"use_adaptive_verification=False, use_pcp={self.use_pcp}, use_dcp={self.use_dcp}, use_rswa=False)")


Capability = tuple[int, int]


@dataclass(frozen=True)
class BackendSpec:
    """What ``validate_configuration`` reads of one backend class (see the module docstring). ``block_sizes``: its
    ``get_supported_kernel_block_sizes`` bases (a block size that is a multiple of one is supported); ``head_ok``:
    ``supports_head_size``; ``kv_ok``: ``supports_kv_cache_dtype`` where the class overrides it; ``combination``:
    its ``supports_combination`` reasons that do not depend on installed packages."""

    name: str
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    kv_cache_dtypes: tuple[str, ...] = _UNQUANTIZED
    block_sizes: tuple[int, ...] = (1,)
    head_ok: Callable[[int, Capability], bool] = lambda h, cc: True
    mla: bool = False
    sparse: bool = False
    sink: Callable[[Capability], bool] = lambda cc: False
    sliding_window: bool = False
    dcp: bool = False
    pcp: bool = False
    batch_invariant: bool = False
    capability: Callable[[Capability], bool] = lambda cc: True
    kv_ok: Callable[[str | None], bool] | None = None
    nvfp4: bool = False
    """FlashInfer's ``supports_kv_cache_dtype``: ``nvfp4`` on SM80/SM90/SM120 (its FA2 path), both NVFP4 layouts on
    SM100 (TRT-LLM)."""
    combination: Callable[[SelectorConfig, Capability], str | None] = lambda s, cc: None
    attn_types: tuple[str, ...] = ("decoder",)
    """``supports_attn_type``: the base class's is ``DECODER`` alone (TurboQuant, FlashInfer, every MLA backend)."""


def _heads(*sizes: int) -> Callable[[int, Capability], bool]:
    return lambda h, cc: h in sizes


_ALL_ATTN_TYPES = ("decoder", "encoder", "encoder_only", "encoder_decoder")  # FlashAttention's and Triton's supports_attn_type
_MLA_HEADS = _heads(320, 512, 576)  # MLACommonBackend.get_supported_head_sizes
_FP8 = ("fp8", "fp8_e4m3")


def _fa_combination(s: SelectorConfig, cc: Capability) -> str | None:
    """``FlashAttentionBackend.supports_combination``: sinks need SM90+ (FlashAttention 3); a quantized cache needs
    ``flash_attn_supports_kv_cache_dtype`` (``fa_utils.py``: FA3 on SM90 or FA4 on SM100, never ``fp8_e5m2``); a
    TurboQuant cache forces FlashAttention 2 on the whole deployment (``EngineArgs.create_engine_config``)."""
    if s.has_sink and cc < (9, 0):
        return "sink not supported on compute capability < 9.0"
    kv = s.kv_cache_dtype
    if is_quantized_kv_cache(kv) and (kv == "fp8_e5m2" or kv.startswith("turboquant_") or cc[0] not in (9, 10)):
        return "FP8 KV cache requires FA3 on SM90, FA4 with head_size=512 on SM90, or FA4 on SM100"
    return None


def _fa_mla_sparse_combination(s: SelectorConfig, cc: Capability) -> str | None:
    """``FlashAttnMLASparseBackend.supports_combination``: BF16/FP16 cache only, no DCP."""
    if s.kv_cache_dtype not in (None, *_UNQUANTIZED):
        return "FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache"
    return "FlashAttention MLA Sparse does not support DCP for now" if s.use_dcp else None


BACKENDS: dict[str, BackendSpec] = {b.name: b for b in (
    BackendSpec("FLASH_ATTN", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(16,),
                head_ok=lambda h, cc: h % 8 == 0 and (h <= 256 or (cc[0] == 10 and h <= 512)),
                sink=lambda cc: cc >= (9, 0), sliding_window=True, dcp=True, batch_invariant=True,
                capability=lambda cc: cc >= (8, 0), combination=_fa_combination, attn_types=_ALL_ATTN_TYPES),
    BackendSpec("FLASHINFER", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8, "fp8_e5m2"), block_sizes=(16, 32, 64),
                nvfp4=True,
                head_ok=_heads(64, 128, 256, 512), sliding_window=True, dcp=True,
                sink=lambda cc: cc[0] == 10, capability=lambda cc: (8, 0) <= cc <= (12, 1)),
    BackendSpec("TRITON_ATTN", dtypes=("float16", "bfloat16", "float32"),
                kv_cache_dtypes=(*_UNQUANTIZED, *_FP8, "fp8_e5m2", "int4_per_token_head", "int8_per_token_head",
                                 "fp8_per_token_head"),
                block_sizes=(16,), head_ok=lambda h, cc: h >= 32, sink=lambda cc: True, sliding_window=True,
                batch_invariant=True, attn_types=_ALL_ATTN_TYPES),
    BackendSpec("FLEX_ATTENTION", dtypes=("float16", "bfloat16", "float32"), block_sizes=(16,), sliding_window=True,
                batch_invariant=True, attn_types=("decoder", "encoder_only")),
    BackendSpec("TURBOQUANT", kv_cache_dtypes=("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                                               "turboquant_3bit_nc"),
                block_sizes=(16, 32, 64, 128), head_ok=lambda h, cc: h > 0,
                kv_ok=lambda kv: kv is not None and kv.startswith("turboquant_")),
    BackendSpec("FLASH_ATTN_MLA", block_sizes=(16,), head_ok=_MLA_HEADS, mla=True, dcp=True, pcp=True,
                batch_invariant=True, capability=lambda cc: cc[0] == 9),
    BackendSpec("FLASHMLA", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(64,), head_ok=_MLA_HEADS, mla=True,
                dcp=True, pcp=True, capability=lambda cc: cc[0] in (9, 10)),
    BackendSpec("FLASHINFER_MLA", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(32, 64), head_ok=_MLA_HEADS,
                mla=True, dcp=True, pcp=True, capability=lambda cc: cc[0] == 10),
    BackendSpec("TRITON_MLA", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(16,), mla=True, dcp=True, pcp=True,
                batch_invariant=True),
    BackendSpec("CUTLASS_MLA", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(128,), head_ok=_MLA_HEADS,
                mla=True, dcp=True, pcp=True, capability=lambda cc: cc[0] == 10),
    BackendSpec("TOKENSPEED_MLA", kv_cache_dtypes=_FP8, block_sizes=(32, 64), head_ok=_MLA_HEADS, mla=True, dcp=True,
                pcp=True, capability=lambda cc: cc[0] == 10),
    BackendSpec("FLASHMLA_SPARSE", dtypes=("bfloat16",),
                kv_cache_dtypes=("auto", "bfloat16", "fp8_ds_mla", "fp8", "nvfp4_ds_mla"), block_sizes=(64,),
                head_ok=_heads(576, 512), mla=True, sparse=True, dcp=True, pcp=True,
                capability=lambda cc: cc[0] in (9, 10),
                combination=lambda s, cc: ("FLASHMLA_SPARSE only supports the nvfp4_ds_mla kv-cache dtype on SM100 "
                                           "(Blackwell)") if s.kv_cache_dtype == "nvfp4_ds_mla" and cc[0] != 10 else None),
    BackendSpec("FLASH_ATTN_MLA_SPARSE", block_sizes=(64,), mla=True, sparse=True, pcp=True,
                capability=lambda cc: cc[0] == 9, combination=_fa_mla_sparse_combination),
    BackendSpec("FLASH_ATTN_MLA_SPARSE_FA4", dtypes=("bfloat16",), kv_cache_dtypes=("auto", "bfloat16"),
                block_sizes=(64,), head_ok=_heads(576), mla=True, sparse=True, dcp=True, pcp=True,
                capability=lambda cc: cc[0] == 10),
    BackendSpec("FLASHINFER_MLA_SPARSE", kv_cache_dtypes=(*_UNQUANTIZED, *_FP8), block_sizes=(32,),
                head_ok=_heads(512, 576), mla=True, sparse=True, dcp=True, pcp=True, capability=lambda cc: cc[0] == 10,
                combination=lambda s, cc: ("FLASHINFER_MLA_SPARSE SM10 does not support fp8_ds_mla kv-cache dtype"
                                           if s.kv_cache_dtype == "fp8_ds_mla" else None)),
    BackendSpec("FLASHINFER_MLA_SPARSE_SM90", dtypes=("bfloat16",), kv_cache_dtypes=("auto", "bfloat16", *_FP8),
                block_sizes=(64,), head_ok=_heads(512, 576), mla=True, sparse=True, pcp=True,
                capability=lambda cc: cc[0] == 9),
    BackendSpec("FLASHINFER_MLA_SPARSE_SM120", dtypes=("bfloat16",), kv_cache_dtypes=("auto", *_FP8, "fp8_ds_mla"),
                block_sizes=(64,), head_ok=_heads(512, 576), mla=True, sparse=True, pcp=True,
                capability=lambda cc: cc[0] == 12),
)}
"""The backends of vLLM 0.33's CUDA priority lists (``_get_backend_priorities``), as their classes declare them."""


def unmodelled_backend(config: "EngineConfig") -> str | None:
    """Why tqlab cannot size the pinned backend's consumers, or None: a name of vLLM 0.33's enum outside
    :data:`BACKENDS` (ROCm, XPU, CPU, DeepSeek-V4's, B12X, ...): tqlab neither replays its validation nor knows its
    workspace requests (a name outside the enum is vLLM's refusal, :mod:`tqlab.vllm.validation`)."""
    name = config.attention_backend
    if name is None or name in BACKENDS or name not in ATTENTION_BACKEND_NAMES:
        return None
    return (f"attention backend {name} (pinned) is not one tqlab models: neither vLLM's validation of it nor its "
            "workspace requests are replayed")


def validate_configuration(backend: str, s: SelectorConfig, capability: Capability) -> list[str]:
    """vLLM's ``AttentionBackend.validate_configuration`` for ``backend`` (a :data:`BACKENDS` name) on a GPU of
    compute ``capability``: the reasons it is invalid, in vLLM's order and words (empty: valid).
    Raises ``KeyError`` for a backend :data:`BACKENDS` does not hold."""
    b = BACKENDS[backend]
    kv = b.kv_ok(s.kv_cache_dtype) if b.kv_ok else (s.kv_cache_dtype is None or s.kv_cache_dtype in b.kv_cache_dtypes)
    if b.nvfp4 and s.kv_cache_dtype is not None and s.kv_cache_dtype.startswith("nvfp4"):
        kv = s.kv_cache_dtype == "nvfp4" if capability[0] in (8, 9, 12) else capability[0] == 10
    checks = [
        (not b.head_ok(s.head_size, capability), "head_size not supported"),
        (s.dtype not in b.dtypes, "dtype not supported"),
        (not kv, "kv_cache_dtype not supported"),
        (s.block_size is not None and all(s.block_size % m for m in b.block_sizes), "block_size not supported"),
        (s.use_mla != b.mla, "MLA not supported" if s.use_mla else "non-MLA not supported"),
        (s.has_sink and not (b.sink(capability) and not (b.name == "FLASH_ATTN" and s.flash_attn_version == 2)),
         "attention sinks not supported"),
        (s.use_sparse != b.sparse, "sparse not supported" if s.use_sparse else "non-sparse not supported"),
        (not b.capability(capability), "compute capability not supported"),
        (s.attn_type not in b.attn_types, f"attention type AttentionType.{s.attn_type.upper()} not supported"),
        (s.has_sliding_window and not b.sliding_window, "sliding window not supported"),
        (s.use_batch_invariant and not b.batch_invariant, "batch invariance not supported"),
        (s.use_pcp and not b.pcp, "PCP not supported"),
        (s.use_dcp and not b.dcp, "DCP not supported"),
    ]
    reasons = [why for failed, why in checks if failed]
    extra = b.combination(s, capability)
    return reasons + ([extra] if extra else [])


def backend_priorities(s: SelectorConfig, capability: Capability, num_heads: int | None = None) -> list[str]:
    """``vllm/platforms/cuda.py`` ``_get_backend_priorities`` for a causal decoder layer without multimodal prefix:
    the backends vLLM tries, in order. ``num_heads``: query heads per rank (SM100 sparse MLA reads it)."""
    major = capability[0]
    if s.use_mla:
        if major == 10:
            if is_quantized_kv_cache(s.kv_cache_dtype):
                sparse = ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
            elif num_heads is not None and num_heads <= 16:
                sparse = ["FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"]
            else:
                sparse = ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"]
            return ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA",
                    *sparse]
        if major == 12:
            return ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
        tail = ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"]
        tail.insert(0 if s.head_size == 512 else 2, "FLASHINFER_MLA_SPARSE_SM90")
        return ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", *tail]
    if major == 10:
        return ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
    return ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


class NoValidBackend(ValueError):
    """vLLM 0.33 refuses the layer: ``reason`` is its message (``CudaPlatformBase.get_attn_backend_cls``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def select_backend(pinned: str | None, s: SelectorConfig, capability: Capability, num_heads: int | None = None) -> str:
    """The backend vLLM 0.33 gives a layer ``s`` (``CudaPlatformBase.get_attn_backend_cls``): ``pinned`` validated
    alone, else the first valid one of :func:`backend_priorities`. Raises :class:`NoValidBackend` with vLLM's
    message when the pinned backend is invalid or none is valid, ``KeyError`` for a pinned backend outside
    :data:`BACKENDS`."""
    if pinned is not None:
        reasons = validate_configuration(pinned, s, capability)
        if reasons:
            raise NoValidBackend(f"Selected backend AttentionBackendEnum.{pinned} is not valid for this configuration. "
                                 f"Reason: {reasons}")
        return pinned
    invalid = {}
    for name in backend_priorities(s, capability, num_heads):
        reasons = validate_configuration(name, s, capability)
        if not reasons:
            return name
        invalid[name] = reasons
    listed = ", ".join(f"{n}: [{', '.join(r)}]" for n, r in invalid.items())
    raise NoValidBackend(f"No valid attention backend found for cuda with {s}. Reasons: {{{listed}}}.")


def config_selector(config: "EngineConfig", **overrides) -> SelectorConfig:
    """The :class:`SelectorConfig` of ``config``'s attention layers (the quantized ones for a TurboQuant cache;
    block size as given, ``overrides`` replace fields)."""
    import dataclasses

    dtype = str(config.dtype).removeprefix("torch.")
    kv = "auto" if config.turboquant_backend_on_unquantized and not config.is_turboquant else config.kv_cache_dtype
    base = SelectorConfig(head_size=config.head_dim, dtype=dtype, kv_cache_dtype=kv, block_size=None,
                          use_mla=config.mla is not None, use_sparse=config.indexer is not None,
                          use_dcp=config.decode_context_parallel_size > 1)
    return dataclasses.replace(base, **overrides)


def attention_backend(config: "EngineConfig") -> str:
    """The ``AttentionBackendEnum`` name of the deployment's attention layers (the TurboQuant-quantized ones for a
    TurboQuant cache): pinned by ``--attention-backend``, else vLLM 0.33's choice (:func:`select_backend`) on the
    ``--gpu``'s compute capability. Where vLLM would refuse (:mod:`tqlab.vllm.validation` says so), the pinned name,
    or the last one vLLM tried, is returned so that callers still get a name."""
    if config.attention_backend:
        return config.attention_backend
    if config.has_turboquant_consumers:  # a TurboQuant cache (or the teaching variant turboquant_backend_on_unquantized)
        return "TURBOQUANT"
    g = gpu_target(config.gpu)
    s = config_selector(config)
    try:
        return select_backend(None, s, g.capability, config.num_heads_per_rank)
    except NoValidBackend:
        return backend_priorities(s, g.capability, config.num_heads_per_rank)[-1]


SM100_MLA_PREFILL = frozenset({"TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"})
"""MLA prefill backends whose ``supports_compute_capability`` is ``device_capability.major == 10``
(``mla/prefill/trtllm_ragged.py``, ``flashinfer.py``, ``tokenspeed_mla.py``)."""


def mla_prefill_refusal(config: "EngineConfig") -> str | None:
    """vLLM 0.33's words when it refuses the pinned MLA prefill backend (``get_mla_prefill_backend``: a
    :data:`SM100_MLA_PREFILL` backend's ``validate_configuration`` off SM100), else None."""
    g = gpu_target(config.gpu)
    if config.mla is None or config.mla_prefill_backend not in SM100_MLA_PREFILL or g.is_sm100:
        return None
    major, minor = g.capability
    return (f"Selected MLA prefill backend {config.mla_prefill_backend} is not valid for this configuration. "
            f"Reason: ['compute capability {major}.{minor} not supported']")


def mla_prefill_backend(config: "EngineConfig") -> str | None:
    """The MLA prefill backend (``None`` for a model without MLA): pinned, else ``TRTLLM_RAGGED`` on SM100 for
    ``(qk_nope, qk_rope, v) = (192, 64, 256)`` and ``FLASH_ATTN`` otherwise (vLLM's first choice).

    A pinned SM100-only backend (:data:`SM100_MLA_PREFILL`) on another GPU target raises ``ValueError``, as vLLM
    0.33 refuses to start: ``vllm/v1/attention/backends/mla/prefill/selector.py`` ``get_mla_prefill_backend``
    validates the selected backend (``MLAPrefillBackend.validate_configuration``, ``mla/prefill/base.py``) and
    raises "Selected MLA prefill backend ... is not valid for this configuration" (no fallback).
    """
    if config.mla is None:
        return None
    if config.mla_prefill_backend:
        refused = mla_prefill_refusal(config)
        if refused is not None:
            raise ValueError(
                f"--attention-config.mla_prefill_backend {config.mla_prefill_backend} on --gpu {config.gpu}: vLLM 0.33 "
                f"refuses to start (\"{refused}\", mla/prefill/selector.py get_mla_prefill_backend); it runs on SM100 "
                "only (--gpu B200 or B300)")
        return config.mla_prefill_backend
    m = config.mla
    if gpu_target(config.gpu).is_sm100 and (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (192, 64, 256):
        return "TRTLLM_RAGGED"
    return "FLASH_ATTN"
