"""GPU targets: what vLLM 0.33 reads from the device when it sizes workspace consumers.

vLLM asks the running GPU for its SM count (``current_platform.num_compute_units()``, e.g.
Triton MLA's split count in ``vllm/v1/attention/backends/mla/triton_mla.py``
``_compute_num_kv_splits``), its compute capability (backend priority lists in
``vllm/platforms/cuda.py`` ``_get_backend_priorities``; SM100-only paths such as TRT-LLM ragged MLA
prefill, ``mla/prefill/trtllm_ragged.py`` ``is_supported``) and its total memory and name (the
default ``max_num_seqs`` / ``max_num_batched_tokens``: ``vllm/engine/arg_utils.py``
``EngineArgs._get_default_args``-tier rule, used by ``_set_default_max_num_seqs_and_batched_tokens_args``).
tqlab runs without the GPU, so the target is named (``--gpu``, H200 by default) and read from
:data:`GPUS`. SM counts and memory are NVIDIA's data-sheet values as ``torch.cuda`` reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_GPU", "GPUS", "GpuTarget", "gpu_target"]

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

    def default_max_num_seqs(self) -> int:
        """vLLM 0.33's default ``max_num_seqs`` for ``vllm serve`` on this GPU (arg_utils.py: >= 160 GiB or
        >= 70 GiB and not an A100 -> 1024, else 256)."""
        return 1024 if self._large_tier() else 256

    def default_max_num_batched_tokens(self) -> int:
        """vLLM 0.33's default ``max_num_batched_tokens`` for ``vllm serve`` (chunked prefill on):
        16384 at >= 160 GiB, 8192 on H100/H200-class, else 2048."""
        if self.memory_gib >= 160:
            return 16384
        return 8192 if self._large_tier() else 2048

    def _large_tier(self) -> bool:
        return self.memory_gib >= 160 or (self.memory_gib >= 70 and "a100" not in self.name.lower())


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
