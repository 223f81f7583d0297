"""GPU targets: what vLLM 0.33 reads from the device when it sizes workspace consumers.

vLLM asks the running GPU for its SM count (``current_platform.num_compute_units()``, e.g.
Triton MLA's split count in ``vllm/v1/attention/backends/mla/triton_mla.py``
``_compute_num_kv_splits``), its compute capability (backend priority lists in
``vllm/platforms/cuda.py`` ``_get_backend_priorities``; SM100-only paths such as TRT-LLM ragged MLA
prefill, ``mla/prefill/trtllm_ragged.py`` ``is_supported``) and its total memory and name (the
default ``max_num_seqs`` / ``max_num_batched_tokens``: ``vllm/engine/arg_utils.py``
``EngineArgs.get_batch_defaults``, used by ``_set_default_max_num_seqs_and_batched_tokens_args``;
:func:`batch_defaults`).
tqlab runs without the GPU, so the target is named (``--gpu``, H200 by default) and read from
:data:`GPUS`. SM counts and memory are NVIDIA's data-sheet values as ``torch.cuda`` reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_GPU", "GPUS", "GpuTarget", "batch_defaults", "gpu_target"]

_GiB = 1024**3


@dataclass(frozen=True)
class GpuTarget:
    """One GPU model: ``name``, ``sm_count`` (SMs), ``capability`` ((major, minor)), ``memory_gib`` (GiB)."""

    name: str
    sm_count: int
    capability: tuple[int, int]
    memory_gib: float

    @property
    def is_sm100(self) -> bool:
        """vLLM's ``device_capability.major == 10`` (Blackwell B200/B300)."""
        return self.capability[0] == 10

    def default_max_num_seqs(self, usage: str = "serve") -> int:
        """vLLM 0.33's default ``max_num_seqs`` on this GPU (:func:`batch_defaults`)."""
        return batch_defaults(self.memory_gib, self.name, self.capability, usage)[1]

    def default_max_num_batched_tokens(self, usage: str = "serve") -> int:
        """vLLM 0.33's default ``max_num_batched_tokens`` on this GPU, chunked prefill on (:func:`batch_defaults`)."""
        return batch_defaults(self.memory_gib, self.name, self.capability, usage)[0]


def batch_defaults(memory_gib: float, name: str = "", capability: tuple[int, int] | None = None,
                   usage: str = "serve") -> tuple[int, int, str]:
    """vLLM 0.33's default ``(max_num_batched_tokens, max_num_seqs, tier)`` for a CUDA GPU, chunked prefill on.

    ``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults`` (used by
    ``_set_default_max_num_seqs_and_batched_tokens_args``): ``device_memory >= 160 GiB`` -> 16384 tokens
    (``LLM`` class and ``vllm serve``), 1024 seqs; ``>= 70 GiB`` and the device name without "a100" and not
    a GB10 (capability 12.1) -> 16384 (``LLM``) / 8192 (``vllm serve``) tokens, 1024 seqs; else 8192 / 2048
    tokens, 256 seqs. ``memory_gib``: total memory in GiB (``get_device_total_memory() / 2**30``);
    ``usage``: ``"serve"`` or ``"llm"``. ``tier``: the rule that applied, in words.
    Raises ``ValueError`` for another ``usage``.
    """
    if usage not in ("serve", "llm"):
        raise ValueError(f"usage must be 'serve' or 'llm', got {usage!r}")
    serve = usage == "serve"
    if memory_gib >= 160:
        return 16384, 1024, ">= 160 GiB"
    if memory_gib >= 70 and "a100" not in name.lower() and capability != (12, 1):
        return (8192 if serve else 16384), 1024, ">= 70 GiB"
    why = "under 70 GiB" if memory_gib < 70 else "A100 / GB10: vLLM keeps it on the small tier"
    return (2048 if serve else 8192), 256, why


GPUS: dict[str, GpuTarget] = {
    g.name: g
    for g in (
        GpuTarget("A4000", 48, (8, 6), 15.7),
        GpuTarget("L40S", 142, (8, 9), 44.4),
        GpuTarget("A100", 108, (8, 0), 79.2),
        GpuTarget("H100", 132, (9, 0), 79.1),
        GpuTarget("H200", 132, (9, 0), 139.8),
        GpuTarget("B200", 148, (10, 0), 178.4),
        GpuTarget("B300", 148, (10, 3), 268.0),
    )
}
"""Known targets by name (case-insensitive lookup through :func:`gpu_target`)."""

DEFAULT_GPU = "H200"


def gpu_target(name: str | None) -> GpuTarget:
    """The :class:`GpuTarget` called ``name`` (``None``: H200). Raises ``ValueError`` listing the known names."""
    key = DEFAULT_GPU if name is None else str(name)
    for g in GPUS.values():
        if g.name.lower() == key.lower():
            return g
    raise ValueError(f"unknown GPU {name!r} (--gpu); known: {', '.join(GPUS)}")
