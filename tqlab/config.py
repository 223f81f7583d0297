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

import torch

__all__ = ["EngineConfig", "KV_CACHE_DTYPES", "PRESET_DIR", "list_presets", "load_preset", "parse_dtype"]

PRESET_DIR = Path(__file__).resolve().parent.parent / "data" / "presets"

KV_CACHE_DTYPES = (
    "auto",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
)
"""``auto`` = an unquantized cache in the model dtype; the rest are vLLM's TurboQuant presets."""

_DTYPE_NAMES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def parse_dtype(value: Any) -> torch.dtype:
    """A model dtype from a ``torch.dtype`` or a name (``'bfloat16'``, ``'fp16'``, ...).

    Raises ``ValueError`` naming the value if it is not bf16, fp16 or fp32.
    """
    if isinstance(value, torch.dtype):
        dt = value
    elif isinstance(value, str) and value.lower().removeprefix("torch.") in _DTYPE_NAMES:
        dt = _DTYPE_NAMES[value.lower().removeprefix("torch.")]
    else:
        raise ValueError(f"dtype must be bfloat16, float16 or float32 (a torch.dtype or its name), got {value!r}")
    if dt not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dt}")
    return dt


@dataclass
class EngineConfig:
    """Everything that sizes the workspace, as vLLM's engine arguments name it.

    Model shape (whole model, before tensor parallelism):
        num_attention_heads, num_key_value_heads, head_dim: required.
        num_hidden_layers: layers that use this attention backend (1).
        dtype: model dtype, ``torch.dtype`` or name (``bfloat16``).
    Parallelism:
        tensor_parallel_size (1); enable_dbo (False: 1 ubatch slot, True: 2).
    Scheduler (vLLM defaults):
        max_model_len (8192 tokens), max_num_seqs (256),
        max_num_batched_tokens (8192 tokens per step), enable_chunked_prefill (True).
    Cache:
        block_size (16 tokens per KV-cache block), kv_cache_dtype (``auto`` or a
        TurboQuant preset), tq_max_kv_splits_for_cuda_graph (32: the fixed
        number of split-KV decode splits, vLLM's ``attention_config`` field).
    Capture:
        enforce_eager (False: capture decode CUDA graphs; True: eager only —
        the workspace is still locked before serving).
        cudagraph_capture_sizes (None: vLLM-style buckets up to and including
        ``max_num_seqs``).

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
    dtype: Any = torch.bfloat16
    kv_cache_dtype: str = "auto"
    tq_max_kv_splits_for_cuda_graph: int = 32
    enable_dbo: bool = False
    enforce_eager: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    preset: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
            "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
            "block_size", "tq_max_kv_splits_for_cuda_graph",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an int, got {v!r}")
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name in ("enable_chunked_prefill", "enable_dbo", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self.dtype = parse_dtype(self.dtype)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        d = self.head_dim
        if self.kv_cache_dtype.startswith("turboquant_") and (d < 16 or d > 512 or d & (d - 1)):
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
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), as in vLLM"
            )
        if self.cudagraph_capture_sizes is not None:
            if not isinstance(self.cudagraph_capture_sizes, (tuple, list)):
                raise ValueError(
                    f"cudagraph_capture_sizes must be a tuple/list of positive ints, got {self.cudagraph_capture_sizes!r}"
                )
            sizes = tuple(self.cudagraph_capture_sizes)
            if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
                raise ValueError(f"cudagraph_capture_sizes must be positive ints, got {self.cudagraph_capture_sizes!r}")
            self.cudagraph_capture_sizes = tuple(sorted(set(sizes)))

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
    def num_ubatches(self) -> int:
        """Workspace slots: 2 with DBO, else 1 (vLLM ``GPUWorker.init_device``)."""
        return 2 if self.enable_dbo else 1

    @property
    def is_turboquant(self) -> bool:
        return self.kv_cache_dtype.startswith("turboquant_")

    def kv_bytes_per_token_per_rank(self) -> int:
        """Unquantized (model dtype) K+V bytes per token on one rank, all layers."""
        return 2 * self.num_kv_heads_per_rank * self.head_dim * self.num_hidden_layers * self.dtype.itemsize

    def capture_sizes(self) -> tuple[int, ...]:
        """Decode batch sizes to capture, ascending.

        Default: 1, 2, 4, then multiples of 8 (16 past 256), ending at
        ``max_num_seqs``. With ``cudagraph_capture_sizes`` given: those sizes up
        to ``max_num_seqs`` (larger ones are dropped, as vLLM filters them); if
        the largest is below ``max_num_seqs``, bigger decode batches run eagerly.
        """
        if self.cudagraph_capture_sizes is not None:
            return tuple(s for s in self.cudagraph_capture_sizes if s <= self.max_num_seqs) or (self.max_num_seqs,)
        sizes = [s for s in (1, 2, 4) if s < self.max_num_seqs]
        sizes += list(range(8, self.max_num_seqs, 8 if self.max_num_seqs <= 256 else 16))
        sizes.append(self.max_num_seqs)
        return tuple(sorted(set(sizes)))

    def replace(self, **changes: Any) -> "EngineConfig":
        """A copy with ``changes`` applied (validated like the constructor)."""
        _check_field_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["dtype"] = str(self.dtype).removeprefix("torch.")
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
