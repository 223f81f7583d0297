"""What tqlab knows about each vLLM version it models: one :class:`VllmVersion` per release, chosen once per run.

A version is one place. Its generated data (``parity/`` scripts write them, with provenance) and the few
rules that differ between releases live here under one name; the rest of the package asks
:func:`current` (or :func:`get`) instead of naming a version. Read from the unpacked wheels of vLLM
0.33.0 and 0.34.0 (``diff -r``; parity/README.md, section "vLLM 0.34", has the citations):

* **Model runner.** 0.33 ships two runners: ``vllm/v1/worker/gpu_model_runner.py`` (V1) and
  ``vllm/v1/worker/gpu/model_runner.py`` (Model Runner V2, chosen by ``VllmConfig.use_v2_model_runner``:
  ``VLLM_USE_V2_MODEL_RUNNER``, else V2 unless a feature it lacks is on). 0.34 ships only V2:
  ``gpu_worker.py`` imports ``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` and
  ``VLLM_USE_V2_MODEL_RUNNER`` left ``envs.py``. In both, ``GPUModelRunner.capture_model`` ends in
  ``lock_workspace()`` and ``Worker._compile_or_warm_up_model`` skips it under ``enforce_eager``: an eager
  server never locks. V2's JIT warm-up (``warmup_kernels``, ``vllm/v1/worker/gpu/warmup.py``, on by default
  through ``KernelConfig.enable_jit_warmup``) runs a real prefill and decode step before capture: in 0.33
  only when V2 runs, in 0.34 always.
* **Manager API.** 0.34's ``WorkspaceManager`` (``vllm/v1/worker/workspace.py``) adds ``get_retained(key,
  shape, dtype) -> (view, intact)`` and names the view alignment ``_VIEW_ALIGNMENT = 256``; 0.33 has no
  ``get_retained``. :class:`tqlab.core.workspace.WorkspaceManager` follows the version it is built for.
* **Consumers.** The census (``data/vllm_<v>_workspace_consumers.json``) lists every call site per version;
  the sparse indexer's rows are the same rule in both (``get_max_prefill_buffer_size``:
  ``max_model_len * 8 * factor``, factor 5 up to 256 Ki tokens, else 2).

* **Capture sizes.** 0.33 rounds every capture size up to a multiple of ``1 + k`` for the V1 runner
  (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``); 0.34's ``VllmConfig._split_cudagraph_capture_sizes``
  keeps prefill graphs in tokens and decode graphs in requests (:attr:`VllmVersion.decode_graphs_in_requests`;
  the rules: :mod:`tqlab.core.vllm_rules`).

Chosen once per run: :func:`select` (the CLI's ``--vllm``), else ``$TQLAB_VLLM_VERSION``, else
:data:`DEFAULT`: the newest version whose start-up rules tqlab models (:attr:`VllmVersion.startup_rules_modelled`);
:data:`NEWEST` may be newer, and a run that selects it gets ``partial`` answers where the rules are missing.
Pure Python; imports nothing from tqlab (the lowest layer of ``tqlab.core``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

__all__ = [
    "BUG_REPORT", "DEFAULT", "ENV", "NEWEST", "SUPPORTED", "VERSIONS", "VllmVersion", "current", "describe", "get", "reset", "select",
    "using",
]

ENV = "TQLAB_VLLM_VERSION"
"""Environment variable naming the run's version when nothing called :func:`select`."""

_ROOT = Path(__file__).resolve().parents[2]  # the repository (data/ lives here)
_PACKAGE = Path(__file__).resolve().parents[1]  # tqlab/


@dataclass(frozen=True)
class VllmVersion:
    """Everything tqlab knows about one vLLM release.

    Attributes:
        name: ``"0.33"``, ``"0.34"`` (what ``--vllm`` takes and reports print).
        release: the wheel's version, ``"0.33.0"`` (``VLLM_VERSION`` of ``parity/install.sh``).
        runners: the GPU model runners the wheel ships, as paths under ``vllm/``; the first is the one whose
            start-up rules tqlab models (``"v1/worker/gpu_model_runner.py"`` = V1, ``"v1/worker/gpu/model_runner.py"``
            = Model Runner V2).
        jit_warmup_always: V2's ``warmup_kernels`` runs before capture on every deployment with
            ``enable_jit_warmup`` (0.34: V2 is the only runner); False when it depends on which runner runs (0.33).
        manager_methods: the public request methods of vLLM's ``WorkspaceManager`` in this release.
        view_alignment: bytes every workspace view starts at (256 in both; named ``_VIEW_ALIGNMENT`` in 0.34).
        added_consumers / removed_consumers: CUDA workspace call sites (``path:function`` under ``vllm/``) new
            in this release / gone since the previous one (from the two censuses).
        decode_graphs_in_requests: ``VllmConfig._set_cudagraph_sizes`` ends in ``_split_cudagraph_capture_sizes``
            (``vllm/config/vllm.py``, 0.34): prefill graphs at token counts, FULL decode graphs at request counts
            (``decode_cudagraph_capture_request_sizes``), no ``adjust_cudagraph_sizes_for_spec_decode``; every
            capture (PIECEWISE too) builds attention metadata (``CudaGraphManager.capture``,
            ``vllm/v1/worker/gpu/cudagraph_utils.py``). False: 0.33's V1 rules (sizes rounded to ``1 + k``;
            ``vllm/v1/worker/gpu_model_runner.py`` ``_dummy_run``).
        gpu_memory_utilization: what ``--gpu-memory-utilization`` resolves to when not given. 0.33: 0.92
            (``CacheConfig``, ``vllm/config/cache.py``). 0.34: the flag defaults to None and
            ``CacheConfig.resolved_gpu_memory_utilization`` gives 1.0 with the extensible KV cache, which
            ``VllmConfig`` turns on by default on CUDA when nothing it lists rules it out (a KV connector's legacy IPC
            or custom pool, elastic EP, ...), else 0.92: tqlab takes the plain deployment's 1.0.
        startup_validation_modelled: whether tqlab models the release's start-up validation (the attention
            backend names, each backend's ``validate_configuration``, the selector's priorities:
            :mod:`tqlab.vllm.validation`). 0.33: yes. 0.34: no (its backend enum and ``TRITON_MLA``'s checks differ),
            so under 0.34 tqlab answers no ``refused`` and the verdict is ``partial``.
        startup_rules_modelled: everything tqlab answers about start-up (capture sizes, the workspace each capture
            and warm-up step asks of every consumer, the lock) is this release's. False for 0.34: its capture sizes
            and decode rows are modelled (:mod:`tqlab.core.vllm_rules`), and so are TurboQuant's one-token rows in V2's
            JIT warm-up and PIECEWISE captures (``one_token_rows_before_lock``), but the other consumers' requests
            there are not replayed, so a 0.34 answer is ``partial``
            (:func:`tqlab.core.consumers.registry.unmodelled` names it).
    """

    name: str
    release: str
    runners: tuple[str, ...]
    jit_warmup_always: bool
    manager_methods: tuple[str, ...]
    view_alignment: int = 256
    added_consumers: tuple[str, ...] = ()
    removed_consumers: tuple[str, ...] = ()
    decode_graphs_in_requests: bool = False
    gpu_memory_utilization: float = 0.92
    startup_rules_modelled: bool = True
    startup_validation_modelled: bool = True

    @property
    def slug(self) -> str:
        """``"0_34"``: the part of every generated file's name that names the version."""
        return self.name.replace(".", "_")

    @property
    def has_get_retained(self) -> bool:
        """vLLM's manager has ``get_retained`` (0.34 on)."""
        return "get_retained" in self.manager_methods

    @property
    def flags_file(self) -> Path:
        """``tqlab/vllm/vllm_<v>_flags.json``: ``vllm serve``'s flags (``parity/gen_vllm_flags.py``)."""
        return _PACKAGE / "vllm" / f"vllm_{self.slug}_flags.json"

    @property
    def census_file(self) -> Path:
        """``data/vllm_<v>_workspace_consumers.json``: every workspace call site (``parity/gen_consumer_census.py``)."""
        return _ROOT / "data" / f"vllm_{self.slug}_workspace_consumers.json"

    @property
    def architectures_file(self) -> Path:
        """``data/vllm_<v>_arch_consumers.json``: architecture -> model class -> reachable consumers (issue 30)."""
        return _ROOT / "data" / f"vllm_{self.slug}_arch_consumers.json"

    @property
    def latent_crashes_file(self) -> Path:
        """``data/vllm_<v>_latent_crashes.json``: the latent-crash checks (``parity/latent_crashes.py``)."""
        return _ROOT / "data" / f"vllm_{self.slug}_latent_crashes.json"

    @property
    def model_runner(self) -> str:
        """The runner tqlab's start-up rules mirror, as a path under ``vllm/``."""
        return self.runners[0]

    def __str__(self) -> str:
        return f"vLLM {self.name}"


_MANAGER_0_33 = ("get_simultaneous", "get_persistent", "get_persistent_resource")

VERSIONS: dict[str, VllmVersion] = {
    "0.33": VllmVersion(
        name="0.33", release="0.33.0",
        runners=("v1/worker/gpu_model_runner.py", "v1/worker/gpu/model_runner.py"),
        jit_warmup_always=False,
        manager_methods=_MANAGER_0_33,
    ),
    "0.34": VllmVersion(
        name="0.34", release="0.34.0",
        runners=("v1/worker/gpu/model_runner.py",),
        jit_warmup_always=True,
        manager_methods=(*_MANAGER_0_33, "get_retained"),
        decode_graphs_in_requests=True,
        gpu_memory_utilization=1.0,
        startup_rules_modelled=False,
        startup_validation_modelled=False,
        added_consumers=(
            "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:QwenGatedDeltaNetAttention._forward_flashinfer_prefill",
            "models/kimi_k3/nvidia/kda.py:KimiK3DeltaAttention.__init__",
            "models/kimi_k3/nvidia/kv_balanced_mla/decode.py:KvBalancedDecode._buffers",
            "models/minimax_m3/nvidia/indexer_nvfp4.py:MiniMaxM3IndexerNvfp4Impl.reserve_workspace",
            "models/minimax_m3/nvidia/indexer_nvfp4.py:MiniMaxM3IndexerNvfp4Impl._prefill",
        ),
        removed_consumers=(
            "model_executor/layers/fused_moe/experts/fused_humming_moe.py:HummingExpertsBase.make_workspaces",
            "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:QwenGatedDeltaNetAttention._forward_core",
        ),
    ),
}
"""Every supported version by name, oldest first."""

SUPPORTED: tuple[str, ...] = tuple(VERSIONS)
"""``("0.33", "0.34")``."""

NEWEST = SUPPORTED[-1]
"""The newest supported version (``--vllm``'s choices end with it)."""

DEFAULT = [name for name, v in VERSIONS.items() if v.startup_rules_modelled][-1]
"""What a run uses unless told otherwise: the newest version whose start-up rules tqlab models (0.34's are not yet:
:attr:`VllmVersion.startup_rules_modelled`), so an unchosen run never gets an answer built on missing rules."""

BUG_REPORT = "0.33"
"""The release the bug-report path is modelled on: ``repro`` / ``LLMEngine(fix=False)`` under it is "vLLM 0.33 without
PR #44053", the behaviour of the v0.20 report (under another release, that release with the reservation removed)."""

_selected: VllmVersion | None = None


def get(version: "str | VllmVersion | None" = None) -> VllmVersion:
    """The :class:`VllmVersion` for ``version``: ``"0.34"``, ``"0.34.0"``, ``"v0.34"``, a :class:`VllmVersion`, or
    ``None`` for :func:`current`. ``ValueError`` naming the value and the supported versions otherwise."""
    if version is None:
        return current()
    if isinstance(version, VllmVersion):
        return version
    if not isinstance(version, str):
        raise ValueError(f"vLLM version must be a string such as '{DEFAULT}', got {version!r}")
    text = version.strip().lstrip("vV")
    parts = text.split(".")
    name = ".".join(parts[:2])
    if name in VERSIONS and (len(parts) == 2 or VERSIONS[name].release == text):
        return VERSIONS[name]
    raise ValueError(f"unsupported vLLM version {version!r}: tqlab models {', '.join(SUPPORTED)}")


def current() -> VllmVersion:
    """The run's version: the last :func:`select`, else ``$TQLAB_VLLM_VERSION``, else :data:`DEFAULT`."""
    if _selected is not None:
        return _selected
    env = os.environ.get(ENV, "").strip()
    if env:
        try:
            return get(env)
        except ValueError as e:
            raise ValueError(f"${ENV}: {e}") from None
    return VERSIONS[DEFAULT]


def select(version: "str | VllmVersion | None") -> VllmVersion:
    """Choose the run's version once (the CLI's ``--vllm``) and return it; ``None`` keeps :func:`current`'s rule.
    Bad input raises ``ValueError`` and leaves the choice as it was."""
    global _selected
    chosen = get(version) if version is not None else None
    _selected = chosen
    return current()


def reset() -> None:
    """Forget :func:`select`'s choice (tests and notebooks)."""
    global _selected
    _selected = None


def describe(version: "str | VllmVersion | None" = None) -> str:
    """One line naming the release an answer models and what that means for its verdict (every report's first
    lines: ``plan``, ``inspect-vllm``, ``repro``, ``trace-report``). ``version`` None: :func:`current`."""
    v = get(version)
    if v.startup_rules_modelled:
        newer = "" if v.name == NEWEST else (
            f"; --vllm {NEWEST} models vLLM {NEWEST}, whose start-up is partly modelled")
        return f"vLLM {v.name} ({v.release}) rules{newer}"
    return (f"vLLM {v.name} ({v.release}) rules: start-up partly modelled (Model Runner V2's JIT warm-up and PIECEWISE "
            "captures, consumer by consumer), so a verdict is at best partial")


@contextmanager
def using(version: "str | VllmVersion | None") -> Iterator[VllmVersion]:
    """Run a block under ``version`` (None: the current choice) and restore the previous choice after it, also on
    error (``trace-report`` checks records against the release they recorded). ``ValueError`` as :func:`get`."""
    global _selected
    chosen, before = get(version), _selected
    _selected = chosen
    try:
        yield chosen
    finally:
        _selected = before
