"""Engine configuration: one flat dataclass, like vLLM's ``EngineArgs``.

Only the fields that decide workspace sizes are here. Per-rank head counts
follow vLLM's tensor-parallel rule (``ModelConfig.get_num_attention_heads`` /
``get_num_kv_heads``): query heads are split evenly across ranks; KV heads are
split too, and when there are fewer KV heads than ranks each rank keeps one
replicated KV head.

Presets live in ``data/presets/*.json``; each cites where its numbers come from.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tqlab.core import dtypes

__all__ = [
    "CUDAGRAPH_MODES",
    "EngineConfig",
    "KV_CACHE_DTYPES",
    "MLA_ONLY_KV_CACHE_DTYPES",
    "NOT_MODELLED_KV_CACHE_DTYPES",
    "TURBOQUANT_KV_CACHE_DTYPES",
    "VLLM_CACHE_DTYPES",
    "check_kv_cache_dtype",
    "is_turboquant",
    "PRESET_DIR",
    "field_help",
    "list_presets",
    "load_preset",
    "parse_dtype",
    "step_token_budget",
]

PRESET_DIR = Path(__file__).resolve().parents[2] / "data" / "presets"

VLLM_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)
"""Every ``--kv-cache-dtype`` vLLM 0.33 accepts: its ``CacheDType`` literal (``vllm/config/cache.py``), in its order."""

TURBOQUANT_KV_CACHE_DTYPES = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
"""vLLM 0.33's TurboQuant presets: the only caches whose backend (``TurboQuantAttentionBackend``) makes the
split-KV decode and continuation-prefill workspace calls tqlab models."""

MLA_ONLY_KV_CACHE_DTYPES = ("fp8_ds_mla", "nvfp4_ds_mla")
"""Layouts for MLA models only ("The ds_mla layouts are MLA-only by construction",
``VllmConfig.validate_nvfp4_kv_cache_with_mla``, ``vllm/config/vllm.py``); tqlab models dense and hybrid attention."""

NOT_MODELLED_KV_CACHE_DTYPES = {
    "ultraquant_4bit": "vLLM 0.33's ROCm UltraQuant backend subclasses TurboQuant's backend and metadata builder "
                       "(vllm/v1/attention/backends/ultraquant_attn.py), so it has workspace consumers of its own "
                       "that tqlab does not model",
}
"""vLLM dtypes tqlab refuses, with the reason (``EngineConfig`` names it in its error)."""

KV_CACHE_DTYPES = tuple(d for d in VLLM_CACHE_DTYPES
                        if d not in MLA_ONLY_KV_CACHE_DTYPES and d not in NOT_MODELLED_KV_CACHE_DTYPES)
"""The ``kv_cache_dtype`` values tqlab accepts: vLLM 0.33's for a dense model, less the unmodelled ones.
``auto`` = an unquantized cache in the model dtype; only :data:`TURBOQUANT_KV_CACHE_DTYPES` have TurboQuant's
workspace consumers (:func:`is_turboquant`). The one list: the CLI, the deployment reader, the widget and the
tests all take it from here."""


def is_turboquant(kv_cache_dtype: str) -> bool:
    """Whether ``kv_cache_dtype`` selects vLLM 0.33's TurboQuant backend (one of :data:`TURBOQUANT_KV_CACHE_DTYPES`)."""
    return kv_cache_dtype in TURBOQUANT_KV_CACHE_DTYPES


def check_kv_cache_dtype(kv_cache_dtype: Any, where: str = "kv_cache_dtype", *, mla: bool = False) -> str:
    """``kv_cache_dtype`` if tqlab models it (the MLA-only layouts only for a model with MLA, ``mla``), else
    ``ValueError`` naming it, ``where`` it came from, and why."""
    if kv_cache_dtype in KV_CACHE_DTYPES or (mla and kv_cache_dtype in MLA_ONLY_KV_CACHE_DTYPES):
        return kv_cache_dtype
    if kv_cache_dtype in MLA_ONLY_KV_CACHE_DTYPES:
        raise ValueError(f"{where} {kv_cache_dtype!r} is refused by vLLM 0.33 for this model: an MLA-only layout "
                         "(ds_mla layouts are MLA-only) and this model has no MLA")
    if kv_cache_dtype in NOT_MODELLED_KV_CACHE_DTYPES:
        raise ValueError(f"{where} {kv_cache_dtype!r} is not modelled: {NOT_MODELLED_KV_CACHE_DTYPES[kv_cache_dtype]}")
    raise ValueError(f"{where} {kv_cache_dtype!r} is not a cache dtype vLLM 0.33 accepts: {', '.join(VLLM_CACHE_DTYPES)}")


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
"""vLLM 0.33's ``CUDAGraphMode`` names (``vllm/config/compilation.py``)."""

_FIELD_HELP = {
    "num_attention_heads": "query heads of the whole model (before tensor parallelism)",
    "num_key_value_heads": "KV heads of the whole model (before tensor parallelism)",
    "head_dim": "attention head size D (elements)",
    "num_hidden_layers": "attention layers that use this backend (count)",
    "tensor_parallel_size": "tensor-parallel ranks; heads are split across them (count)",
    "max_model_len": "longest request, prompt + output (tokens)",
    "max_num_seqs": "most requests running in one step (count)",
    "max_num_batched_tokens": "token budget of one scheduler step (tokens); the prefill chunk unless max_num_scheduled_tokens is smaller",
    "enable_chunked_prefill": "split long prompts into chunks of one step's token budget",
    "block_size": "tokens per KV-cache block (page)",
    "dtype": "model dtype: bfloat16, float16 or float32",
    "kv_cache_dtype": "KV-cache format as vLLM names it: auto, float16, fp8, ... or a TurboQuant preset",
    "tq_max_kv_splits_for_cuda_graph": "split-KV decode splits S, vLLM's attention_config field (count)",
    "enable_dbo": "dual-batch overlap: 2 workspace ubatch slots instead of 1",
    "enforce_eager": "no CUDA graph capture; vLLM then never locks the workspace",
    "cudagraph_capture_sizes": "explicit capture sizes (tokens per captured batch); replace vLLM's default list",
    "num_speculative_tokens": "draft tokens k per step (--speculative-config); uniform decode query length is 1 + k",
    "cudagraph_mode": "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE (default: vLLM's, FULL_AND_PIECEWISE)",
    "max_cudagraph_capture_size": "largest capture size (tokens); default min(2 * max_num_seqs * (1 + k), 512)",
    "lock_workspace_when_eager": "variant 'lock-on-eager' (a proposed upstream change, unreleased): lock after an eager start-up too",
    "max_num_scheduled_tokens": "tokens the scheduler issues per step, the prefill chunk size (default: max_num_batched_tokens)",
    "enable_prefix_caching": "prefix caching (vLLM's default on): a cache hit starts a prompt with whole blocks cached",
    "mamba_block_aligned_split": "hybrid model with prefix caching on: prefill chunks that are not a prompt's last end on a block boundary",
    "mla": "MLA fields (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank) or none",
    "indexer": "sparse attention indexer fields (index_topk, index_head_dim, index_n_heads) or none",
    "moe": "MoE fields (num_experts, num_experts_per_tok, moe_intermediate_size, hidden_size, ...) or none",
    "decode_context_parallel_size": "decode context parallelism -dcp: KV cache sharded across this many TP ranks (count)",
    "data_parallel_size": "data-parallel replicas -dp (count)",
    "enable_expert_parallel": "--enable-expert-parallel: experts sharded across TP x DP ranks instead of tensor-parallel",
    "attention_backend": "--attention-backend (vLLM's AttentionBackendEnum name); none: vLLM's default for the GPU",
    "mla_prefill_backend": "--attention-config.mla_prefill_backend (FLASH_ATTN, TRTLLM_RAGGED, FLASHINFER, ...); none: default",
    "gpu": "GPU target vLLM would read SM count, compute capability and defaults from (H100, H200, B200, A4000, ...)",
    "architecture": "config.json architectures[0], the vLLM model class: picks the workspace consumers its layers "
                    "reach; none: from these fields only",
    "flashinfer_workspace_buffer_size": "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE: the MLA prefill (FlashInfer / TRT-LLM "
                                        "ragged) workspace request (bytes; vLLM's default 394 MiB)",
    "turboquant_backend_on_unquantized": "teaching variant, not a vLLM deployment: TurboQuant's backend and its workspace "
                                         "consumers on an unquantized (kv_cache_dtype auto) cache",
}


def step_token_budget(max_num_batched_tokens: int, max_num_scheduled_tokens: int | None) -> int:
    """Tokens one scheduler step issues (:attr:`EngineConfig.chunk_budget`, for callers without a config yet)."""
    st = max_num_scheduled_tokens
    return max_num_batched_tokens if st is None else min(st, max_num_batched_tokens)


def field_help(name: str) -> str:
    """One line of meaning and unit for an :class:`EngineConfig` field (the CLI's ``--help`` shows it)."""
    return _FIELD_HELP.get(name, f"EngineConfig.{name}")

_DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def parse_dtype(value: Any) -> dtypes.DType:
    """A model dtype from a ``torch.dtype``, its stand-in or a name (``'bfloat16'``, ``'fp16'``, ...), as the
    torch-free stand-in :class:`tqlab.core.dtypes.DType` (equal to the torch dtype of the same name; convert
    with :func:`tqlab.core.dtypes.as_torch` where a tensor is made). Never imports torch.

    Raises ``ValueError`` naming the value if it is not bf16, fp16 or fp32.
    """
    if dtypes.is_dtype(value):
        dt = dtypes.standin(value)
    elif isinstance(value, str) and value.lower().removeprefix("torch.") in _DTYPE_NAMES:
        dt = dtypes.by_name(_DTYPE_NAMES[value.lower().removeprefix("torch.")])
    else:
        raise ValueError(f"dtype must be bfloat16, float16 or float32 (a torch.dtype or its name), got {value!r}")
    if dt not in (dtypes.bfloat16, dtypes.float16, dtypes.float32):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dt}")
    return dt


@dataclass(frozen=True)
class EngineConfig:
    """Everything that sizes the workspace, as vLLM's engine arguments name it.

    Model shape (whole model, before tensor parallelism):
        num_attention_heads, num_key_value_heads, head_dim: required.
        num_hidden_layers: layers that use this attention backend (1).
        dtype: model dtype, ``torch.dtype`` or name (``bfloat16``); stored as its torch-free stand-in
        (:class:`tqlab.core.dtypes.DType`, ``== torch.bfloat16``; :attr:`torch_dtype` is torch's own).
    Parallelism:
        tensor_parallel_size (1); enable_dbo (False: 1 ubatch slot, True: 2).
    Scheduler (vLLM defaults):
        max_model_len (8192 tokens), max_num_seqs (256),
        max_num_batched_tokens (8192 tokens per step), enable_chunked_prefill (True),
        max_num_scheduled_tokens (None: ``max_num_batched_tokens``; vLLM's
        ``SchedulerConfig.max_num_scheduled_tokens``): see :attr:`chunk_budget`.
    Cache:
        block_size (16 tokens per KV-cache block), kv_cache_dtype (``auto`` or a
        TurboQuant preset), tq_max_kv_splits_for_cuda_graph (32: the fixed
        number of split-KV decode splits, vLLM's ``attention_config`` field).
    Capture (vLLM's semantics per release, see :mod:`tqlab.core.vllm_rules`):
        enforce_eager (False). True: no capture; vLLM then never locks the
        workspace (``gpu_worker.py`` ``compile_or_warm_up_model`` skips
        ``capture_model``, the only ``lock_workspace()`` of the serving path).
        cudagraph_capture_sizes (None: vLLM's default list,
        :func:`tqlab.core.vllm_rules.capture_sizes`), in tokens per captured batch.
        cudagraph_mode (None: vLLM's default ``FULL_AND_PIECEWISE``; or
        one of :data:`CUDAGRAPH_MODES`; ``NONE`` captures nothing and never locks).
        max_cudagraph_capture_size (None: vLLM's default ceiling).
        lock_workspace_when_eager (False): the named variant "lock-on-eager", a
        proposed upstream change: lock after an eager start-up too.
    Speculative decoding:
        num_speculative_tokens (0): draft tokens ``k``; the uniform decode query
        length is ``1 + k`` (vLLM ``VllmConfig.uniform_decode_query_len``).
    Prefix caching:
        enable_prefix_caching (True, vLLM's default for generative models): a prefix-cache hit
        starts a request with whole blocks cached, i.e. with a continuation chunk, even with
        chunked prefill off (``get_computed_blocks``); tqlab's engine has no prefix cache, the
        analysis's any-chunking bound counts such hits.
    Hybrid (Mamba + attention) models:
        mamba_block_aligned_split (False): vLLM 0.33's ``Scheduler.need_mamba_block_aligned_split``,
        on for a hybrid model with prefix caching on (``mamba_cache_mode`` "align", vLLM's
        default there): a prefill chunk that is not the prompt's last ends on a multiple of
        ``block_size`` (:func:`tqlab.core.vllm_rules.mamba_block_aligned_split`). Requires
        ``block_size <= max_num_batched_tokens`` (the case tqlab models).
    Model class:
        architecture (None): config.json's ``architectures[0]`` (``""`` when it names none). It picks the
        deployment's reachable workspace consumers from vLLM's model code
        (:mod:`tqlab.core.consumers.arch_table`); None: a deployment described only by these fields
        (notebooks, the engine), whose consumers follow from the fields.
    Teaching variant (never set by a vLLM deployment reader):
        turboquant_backend_on_unquantized (False): run TurboQuant's backend and its two workspace
        consumers on an unquantized ``auto`` cache (a copy instead of a dequant), so the crash can be
        shown without a quantized cache. vLLM 0.33 has no such deployment: with a non-TurboQuant
        ``kv_cache_dtype`` it selects another backend and no TurboQuant consumer runs
        (:attr:`has_turboquant_consumers`).

    Frozen after validation (``c.max_num_seqs = 0`` raises
    ``dataclasses.FrozenInstanceError``); use :meth:`replace`.
    Raises ``ValueError`` (naming the field and value) for invalid settings.
    """

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int = 1
    tensor_parallel_size: int = 1
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    block_size: int = 16
    dtype: Any = "bfloat16"
    kv_cache_dtype: str = "auto"
    tq_max_kv_splits_for_cuda_graph: int = 32
    enable_dbo: bool = False
    enforce_eager: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    num_speculative_tokens: int = 0
    cudagraph_mode: str | None = None
    max_cudagraph_capture_size: int | None = None
    lock_workspace_when_eager: bool = False
    max_num_scheduled_tokens: int | None = None
    enable_prefix_caching: bool = True
    mamba_block_aligned_split: bool = False
    # Workspace consumers beyond TurboQuant (issue 19; tqlab.core.consumers): model fields and parallelism.
    mla: Any = None
    indexer: Any = None
    moe: Any = None
    decode_context_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    attention_backend: str | None = None
    mla_prefill_backend: str | None = None
    gpu: str = "H200"
    turboquant_backend_on_unquantized: bool = False
    architecture: str | None = None
    flashinfer_workspace_buffer_size: int = 394 * 1024 * 1024
    preset: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
            "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
            "block_size", "tq_max_kv_splits_for_cuda_graph", "flashinfer_workspace_buffer_size",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an int, got {v!r}")
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name in ("enable_chunked_prefill", "enable_dbo", "enforce_eager", "lock_workspace_when_eager",
                     "enable_prefix_caching", "mamba_block_aligned_split", "turboquant_backend_on_unquantized"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_capture_fields()
        self._check_consumer_fields()
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        check_kv_cache_dtype(self.kv_cache_dtype, mla=self.mla is not None)
        if self.turboquant_backend_on_unquantized and self.kv_cache_dtype != "auto" and not self.is_turboquant:
            raise ValueError(
                "turboquant_backend_on_unquantized (a tqlab teaching variant) runs TurboQuant's backend on an "
                f"unquantized cache: it needs kv_cache_dtype 'auto', got {self.kv_cache_dtype!r}"
            )
        d = self.head_dim
        if self.is_turboquant and (d < 16 or d > 512 or d & (d - 1)):
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} needs head_dim to be a power of two in [16, 512] "
                f"(Hadamard rotation), got head_dim={d}"
            )
        tp, hq, hk = self.tensor_parallel_size, self.num_attention_heads, self.num_key_value_heads
        if hq % tp:
            raise ValueError(
                f"num_attention_heads ({hq}) must be divisible by tensor_parallel_size ({tp})"
            )
        if hq % hk:
            raise ValueError(f"num_attention_heads ({hq}) must be a multiple of num_key_value_heads ({hk})")
        if hk >= tp and hk % tp:
            raise ValueError(f"num_key_value_heads ({hk}) must be divisible by tensor_parallel_size ({tp})")
        if hk < tp and tp % hk:
            raise ValueError(
                f"tensor_parallel_size ({tp}) must be a multiple of num_key_value_heads ({hk}) "
                "to replicate KV heads"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        self._check_mamba_split()
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), as in vLLM"
            )
        if not self.enable_chunked_prefill and self.chunk_budget < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a prompt is prefilled in one step, but max_num_scheduled_tokens "
                f"({self.max_num_scheduled_tokens}) < max_model_len ({self.max_model_len}): vLLM's scheduler would "
                "never schedule a longer prompt (Scheduler.schedule breaks when it does not fit the token budget)"
            )

    def _check_consumer_fields(self) -> None:
        """Validate (and normalise) the MLA / indexer / MoE / parallelism / GPU fields (issue 19)."""
        from tqlab.core.hardware import gpu_target
        from tqlab.core.model_arch import arch_from_dict

        for kind in ("mla", "indexer", "moe"):
            object.__setattr__(self, kind, arch_from_dict(kind, getattr(self, kind)))
        for name in ("decode_context_parallel_size", "data_parallel_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.tensor_parallel_size % self.decode_context_parallel_size:
            raise ValueError(
                f"tensor_parallel_size ({self.tensor_parallel_size}) must be divisible by decode_context_parallel_size "
                f"({self.decode_context_parallel_size}), as vLLM's ParallelConfig requires"
            )
        if not isinstance(self.enable_expert_parallel, bool):
            raise ValueError(f"enable_expert_parallel must be True or False, got {self.enable_expert_parallel!r}")
        for name in ("attention_backend", "mla_prefill_backend"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ValueError(f"{name} must be None or a backend name, got {v!r}")
            if v is not None:
                object.__setattr__(self, name, v.strip().upper())
        if self.architecture is not None and not isinstance(self.architecture, str):
            raise ValueError(f"architecture must be None or config.json's architectures[0] (a string), "
                             f"got {self.architecture!r}")
        object.__setattr__(self, "gpu", gpu_target(self.gpu).name)

    def _check_mamba_split(self) -> None:
        """``mamba_block_aligned_split`` needs what vLLM 0.33's "align" mode needs, in the case tqlab models."""
        if not self.mamba_block_aligned_split:
            return
        if not self.enable_prefix_caching:
            raise ValueError(
                "mamba_block_aligned_split needs enable_prefix_caching: vLLM 0.33 sets mamba_cache_mode 'align' only "
                "with prefix caching on (MambaModelConfig.verify_and_update_config); "
                "set mamba_block_aligned_split=False too (tqlab: --no-mamba-block-aligned-split)"
            )
        if not self.enable_chunked_prefill:
            raise ValueError(
                "mamba_block_aligned_split (a hybrid model with prefix caching on) needs enable_chunked_prefill: "
                "vLLM 0.33 asserts 'Chunked prefill is required for Mamba prefix caching' "
                "(MambaModelConfig.verify_and_update_config); for prefix caching off set mamba_block_aligned_split=False "
                "(tqlab: --no-mamba-block-aligned-split)"
            )
        if self.block_size > self.chunk_budget:
            raise ValueError(
                f"mamba_block_aligned_split with block_size ({self.block_size}) > the prefill chunk "
                f"({self.chunk_budget} tokens per step): vLLM then advances prefill by sub-block chunks, which tqlab does not model "
                "(tqlab: --no-mamba-block-aligned-split analyses token-budget chunks)"
            )

    def _check_capture_fields(self) -> None:
        """Validate (and normalise) the capture and speculative-decoding fields."""
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 127:
            raise ValueError(f"num_speculative_tokens must be an int in [0, 127], got {k!r}")
        mode = self.cudagraph_mode
        if mode is not None:
            if not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES:
                raise ValueError(f"cudagraph_mode must be None or one of {CUDAGRAPH_MODES}, got {mode!r}")
            object.__setattr__(self, "cudagraph_mode", mode.upper())
        st = self.max_num_scheduled_tokens
        if st is not None and (isinstance(st, bool) or not isinstance(st, int) or st < 1):
            raise ValueError(f"max_num_scheduled_tokens must be None or an int >= 1, got {st!r}")
        mc = self.max_cudagraph_capture_size
        if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 1):
            raise ValueError(f"max_cudagraph_capture_size must be None or an int >= 1, got {mc!r}")
        if self.cudagraph_capture_sizes is not None:
            if not isinstance(self.cudagraph_capture_sizes, (tuple, list)):
                raise ValueError(
                    f"cudagraph_capture_sizes must be a tuple/list of positive ints, got {self.cudagraph_capture_sizes!r}"
                )
            sizes = tuple(self.cudagraph_capture_sizes)
            if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError(f"cudagraph_capture_sizes must be positive ints, got {self.cudagraph_capture_sizes!r}")
            object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(set(sizes))))

    # -- per-rank view (what one GPU's attention layer sees) ------------------ #
    @property
    def num_heads_per_rank(self) -> int:
        """Query heads on one tensor-parallel rank: ``num_attention_heads // TP``."""
        return self.num_attention_heads // self.tensor_parallel_size

    @property
    def num_kv_heads_per_rank(self) -> int:
        """KV heads on one rank: ``num_key_value_heads // TP``, at least 1 (replicated)."""
        return max(1, self.num_key_value_heads // self.tensor_parallel_size)

    @property
    def chunk_budget(self) -> int:
        """Tokens one scheduler step issues, so the prefill chunk of a request alone (tokens).

        ``max_num_scheduled_tokens`` (vLLM: ``Scheduler.max_num_scheduled_tokens``, defaulting to
        ``max_num_batched_tokens``) capped by ``max_num_batched_tokens`` (``Scheduler.schedule``'s
        ``token_budget`` and ``input_budget``).
        """
        return step_token_budget(self.max_num_batched_tokens, self.max_num_scheduled_tokens)

    @property
    def num_ubatches(self) -> int:
        """Workspace slots: 2 with DBO, else 1 (vLLM ``GPUWorker.init_device``)."""
        return 2 if self.enable_dbo else 1

    @property
    def uniform_decode_query_len(self) -> int:
        """Tokens per request in a uniform decode step: ``1 + num_speculative_tokens`` (vLLM ``VllmConfig``)."""
        return 1 + self.num_speculative_tokens

    @property
    def is_turboquant(self) -> bool:
        """Whether the cache is a TurboQuant preset (:func:`is_turboquant`): vLLM then runs TurboQuant's backend."""
        return is_turboquant(self.kv_cache_dtype)

    @property
    def has_turboquant_consumers(self) -> bool:
        """Whether TurboQuant's workspace consumers run: a TurboQuant cache, or the teaching variant
        ``turboquant_backend_on_unquantized`` (never a vLLM deployment). False: no workspace call of theirs,
        no reservation (PR #44053's fix lives in TurboQuant's metadata builder), nothing to overflow."""
        return self.is_turboquant or self.turboquant_backend_on_unquantized

    @property
    def torch_dtype(self):
        """The model dtype as a ``torch.dtype`` (imports torch): for code that makes a tensor in it."""
        return dtypes.as_torch(self.dtype)

    def kv_bytes_per_token_per_rank(self) -> int:
        """Unquantized (model dtype) K+V bytes per token on one rank, all layers."""
        return 2 * self.num_kv_heads_per_rank * self.head_dim * self.num_hidden_layers * self.dtype.itemsize

    def replace(self, **changes: Any) -> "EngineConfig":
        """A copy with ``changes`` applied (validated like the constructor)."""
        _check_field_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["dtype"] = str(self.dtype).removeprefix("torch.")
        from tqlab.core.model_arch import arch_to_dict

        for kind in ("mla", "indexer", "moe"):
            d[kind] = arch_to_dict(d[kind])
        return d

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "EngineConfig":
        """Build from ``data/presets/<name>.json``, then apply ``overrides``.

        Raises ``ValueError`` for an unknown preset (listing the known ones) and
        ``TypeError`` for an override that is not an ``EngineConfig`` field.
        """
        _check_field_names(overrides)
        data = load_preset(name)
        kw = dict(data["config"])
        kw.update(overrides)
        kw["preset"] = name
        return cls(**kw)


def _check_field_names(kw: dict[str, Any]) -> None:
    known = {f.name for f in fields(EngineConfig)}
    bad = sorted(set(kw) - known)
    if bad:
        raise TypeError(f"unknown EngineConfig field(s): {', '.join(bad)}")


def list_presets() -> list[str]:
    """Names of the presets in ``data/presets/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_preset(name: str) -> dict[str, Any]:
    """The raw preset JSON: ``name``, ``title``, ``source``, ``default_prompt_tokens``, ``config``."""
    if not isinstance(name, str) or name not in list_presets():
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(list_presets())}")
    return json.loads((PRESET_DIR / f"{name}.json").read_text())
