"""Deployments vLLM 0.33 refuses to start: its start-up validation, replayed, with vLLM's own reason.

The one place tqlab decides that vLLM would not start a deployment (verdict ``"refused"``,
:func:`tqlab.predict.analysis.predict`). In vLLM's order:

1. the configs ``vllm/engine/arg_utils.py`` ``EngineArgs.create_engine_config`` builds, in its order: float16 on
   a model type that refuses it (``vllm/config/model.py`` ``_check_valid_dtype``); PCP with DCP
   (``vllm/config/parallel.py`` ``ParallelConfig._validate_parallel_config``); the attention-backend flags:
   ``--attention-backend`` and ``--attention-config.backend`` together are "mutually exclusive" (unless the
   latter is ``auto``), a name outside ``AttentionBackendEnum`` is "Unknown attention backend: 'NAME'. Valid
   options are: ..." (``vllm/v1/attention/backends/registry.py`` ``_AttentionBackendEnumMeta.__getitem__``,
   reached through ``AttentionConfig.validate_backend_before``), ``auto`` means automatic selection; decode
   context parallelism on a model without MLA (``ModelConfig.verify_with_parallel_config``: more TP ranks than
   KV heads, at most ``tp // kv_heads``);
2. the backend of every kind of attention layer (``vllm/v1/attention/selector.py`` ``get_attn_backend`` ->
   ``vllm/platforms/cuda.py`` ``CudaPlatformBase.get_attn_backend_cls``, each backend's
   ``validate_configuration``: :func:`tqlab.core.consumers.backends.select_backend`). Layer kinds differ by
   their cache dtype (a TurboQuant cache keeps the first and last two layers of a dense model at the model
   dtype: ``TurboQuantConfig.get_boundary_skip_layers``; ``--kv-cache-dtype-skip-layers sliding_window`` keeps
   sliding-window layers unquantized: ``Attention.__init__``), a sliding window and attention sinks;
3. a pinned MLA prefill backend (``vllm/v1/attention/backends/mla/prefill/selector.py``
   ``get_mla_prefill_backend``).

What a deployment brings beyond :class:`~tqlab.core.config.EngineConfig` (the line's flags, config.json's
sliding window and sinks) is a :class:`StartupFacts`, read once by :func:`startup_facts`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from tqlab.core import vllm_versions
from tqlab.core.consumers.arch_table import previously_supported, reachable_families
from tqlab.core.consumers.backends import (
    ATTENTION_BACKEND_NAMES,
    BACKENDS,
    NoValidBackend,
    config_selector,
    mla_prefill_refusal,
    select_backend,
)
from tqlab.core.hardware import gpu_target

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["FLOAT16_NOT_SUPPORTED", "MSA_ALIASES", "Refusal", "StartupFacts", "backend_flag", "facts_from_sources", "preset_model",
           "startup_facts",
           "startup_refusal"]

MSA_ALIASES = frozenset({"CUTLASS_MSA", "TRITON_MSA"})
"""``AttentionConfig.__post_init__``: these names select MiniMax-M3's sparse decode kernel and leave ``backend``
None (automatic selection for every other layer)."""

FLOAT16_NOT_SUPPORTED = {t: "Numerical instability. Please use bfloat16 or float32 instead."
                         for t in ("gemma2", "gemma3", "gemma3_text", "glm4")}
"""``vllm/config/model.py`` ``_FLOAT16_NOT_SUPPORTED_MODELS``: model types vLLM 0.33 refuses in float16."""

_SELECTOR_SOURCE = "vllm/platforms/cuda.py:CudaPlatformBase.get_attn_backend_cls"
_ARGS_SOURCE = "vllm/engine/arg_utils.py:EngineArgs.create_engine_config"
_ENUM_SOURCE = "vllm/v1/attention/backends/registry.py:_AttentionBackendEnumMeta.__getitem__"
_SINK_MODEL_TYPES = frozenset({"gpt_oss"})
"""``model_type`` s whose attention layers carry sinks (``vllm/model_executor/models/gpt_oss.py`` ``sinks=``)."""
_INTERLEAVED_SLIDING = frozenset({"gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss"})
"""Models whose classes give every other layer a sliding window when config.json has no ``layer_types``
(e.g. ``gpt_oss.py``: ``sliding_window if layer_idx % 2 == 0``; transformers' Gemma-2 config fills ``layer_types``)."""


@dataclass(frozen=True)
class Refusal:
    """vLLM 0.33 does not start the deployment: ``reason`` (vLLM's words), ``source`` (``vllm file:function``)."""

    reason: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "source": self.source}


@dataclass(frozen=True)
class StartupFacts:
    """What vLLM's start-up validation reads beyond :class:`~tqlab.core.config.EngineConfig`.

    ``block_size``: ``--block-size`` when given (vLLM passes it to the selector only then,
    ``CacheConfig.user_specified_block_size``), else None; ``prefill_context_parallel_size`` (``-pcp``);
    ``sliding_window``: ``"none"``, ``"some"`` (interleaved) or ``"all"`` layers; ``attention_sinks``;
    ``skip_sliding_window``: ``--kv-cache-dtype-skip-layers`` names ``sliding_window``; ``dense_boundary``:
    a TurboQuant cache keeps the boundary layers unquantized (not on a hybrid model); ``batch_invariant``:
    ``VLLM_BATCH_INVARIANT``; ``flag_refusal``: a refusal of the flags themselves (item 1 of the module
    docstring); ``num_layers``: the model's attention layers, boundary layers included (config.json; None: the
    config's ``num_hidden_layers``, which for a deployment read from config.json counts TurboQuant's layers only);
    ``model_type``: config.json's (None: unknown)."""

    block_size: int | None = None
    prefill_context_parallel_size: int = 1
    sliding_window: str = "none"
    attention_sinks: bool = False
    skip_sliding_window: bool = False
    dense_boundary: bool = True
    batch_invariant: bool = False
    flag_refusal: Refusal | None = None
    num_layers: int | None = None
    model_type: str | None = None
    auto_model: bool = False
    """config.json's ``auto_map`` names an ``AutoModel*`` class (custom code vLLM may load through the Transformers
    backend, ``_ModelRegistry._try_resolve_transformers``)."""


def backend_flag(given: Mapping[str, Any]) -> tuple[str | None, str | None, Refusal | None]:
    """``(backend name, the flag it came from, refusal)`` of the line's ``--attention-backend`` and
    ``--attention-config.backend`` as ``EngineArgs.create_engine_config`` resolves them: ``auto`` and the MSA
    aliases mean None; both flags set is refused; a name outside ``AttentionBackendEnum`` is refused."""
    flag = given.get("attention_backend")
    conf = (given.get("attention_config") or {}).get("backend")
    conf = None if conf is None or str(conf).strip().lower() == "auto" else str(conf).strip()
    if flag is not None and conf is not None:
        return None, None, Refusal("attention_backend and attention_config.backend are mutually exclusive", _ARGS_SOURCE)
    value, where = (flag, "--attention-backend") if flag is not None else (conf, "--attention-config.backend")
    if value is None or str(value).strip().lower() == "auto":
        return None, None, None
    name = str(value).strip().upper()
    if name not in ATTENTION_BACKEND_NAMES:
        return None, where, Refusal(f"Unknown attention backend: '{name}'. Valid options are: "
                                    + ", ".join(ATTENTION_BACKEND_NAMES), _ENUM_SOURCE)
    return (None if name in MSA_ALIASES else name), where, None


def _text_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = raw.get("text_config")
    return inner if isinstance(inner, Mapping) else raw


def _sliding_window(raw: Mapping[str, Any], disabled: bool) -> str:
    """Which layers get a sliding window in vLLM 0.33 (``EngineArgs.create_engine_config``: the model-level
    window only when every layer slides; interleaved models set it per layer)."""
    window = raw.get("sliding_window")
    # ModelConfig.__post_init__: "Some checkpoints set sliding_window to 0 to indicate that sliding window is
    # disabled" -> None (vllm/config/model.py)
    if disabled or window is None or window == 0 or raw.get("use_sliding_window") is False:
        return "none"
    types = raw.get("layer_types")
    if isinstance(types, list) and types:
        sliding = [t == "sliding_attention" for t in types]
        return "all" if all(sliding) else ("some" if any(sliding) else "none")
    return "some" if raw.get("model_type") in _INTERLEAVED_SLIDING else "all"


def startup_facts(given: Mapping[str, Any], raw_config: Mapping[str, Any] | None = None,
                  hybrid: bool = False, num_layers: int | None = None) -> StartupFacts:
    """The :class:`StartupFacts` of a parsed ``vllm serve`` line (``given``: :func:`tqlab.vllm.flags.parse_serve_args`'s
    dict) and the model's raw config.json (None for a preset: no sliding window, no sinks)."""
    from tqlab.vllm.flags import ENV_KEY, env_flag

    raw = _text_config(raw_config or {})
    skip = [str(s) for s in (given.get("kv_cache_dtype_skip_layers") or [])]
    return StartupFacts(
        block_size=given.get("block_size"),
        prefill_context_parallel_size=int(given.get("prefill_context_parallel_size") or 1),
        sliding_window=_sliding_window(raw, bool(given.get("disable_sliding_window"))),
        attention_sinks=raw.get("model_type") in _SINK_MODEL_TYPES,
        skip_sliding_window="sliding_window" in skip,
        dense_boundary=not hybrid,
        batch_invariant=env_flag(dict(given.get(ENV_KEY) or {}), "VLLM_BATCH_INVARIANT"),
        flag_refusal=backend_flag(given)[2],
        num_layers=num_layers,
        model_type=raw.get("model_type") if isinstance(raw.get("model_type"), str) else None,
        auto_model=any(str(k).startswith("AutoModel") for k in dict((raw_config or {}).get("auto_map") or {})),
    )


def facts_from_sources(config: "EngineConfig", sources: Mapping[str, str] | None) -> StartupFacts:
    """:class:`StartupFacts` of a bare config whose ``sources`` say which fields a flag set (``tqlab plan``): the
    block size counts as ``--block-size`` when its source is a flag."""
    given = str((sources or {}).get("block_size", "")).startswith("flag")
    model = preset_model(config.preset)
    return StartupFacts(block_size=config.block_size if given else None, sliding_window=_sliding_window(model, False),
                        model_type=model.get("model_type"),
                        attention_sinks=model.get("model_type") in _SINK_MODEL_TYPES,
                        dense_boundary=not config.mamba_block_aligned_split)


def preset_model(preset: str | None) -> Mapping[str, Any]:
    """A preset's ``model`` object: the config.json keys start-up validation reads (``model_type``,
    ``sliding_window``, ``layer_types``), ``{}`` when it has none (or for no preset)."""
    from tqlab.core.config import load_preset

    if preset is None:
        return {}
    model = load_preset(preset).get("model")
    return model if isinstance(model, Mapping) else {}


def _layer_kinds(config: "EngineConfig", facts: StartupFacts) -> list:
    """One :class:`~tqlab.core.consumers.backends.SelectorConfig` per kind of attention layer of ``config``, in the
    order of the first layer of each kind (vLLM builds layer 0 first: its refusal names the first failing layer).
    Interleaved sliding windows fall on even layers (``gpt_oss.py``, Gemma-2's ``layer_types``); a TurboQuant
    cache on a dense model keeps layers ``0, 1, L-2, L-1`` at the model dtype
    (``TurboQuantConfig.get_boundary_skip_layers``, ``n = min(2, L // 2)``)."""
    base = config_selector(config, block_size=facts.block_size, has_sink=facts.attention_sinks,
                           use_pcp=facts.prefill_context_parallel_size > 1, use_batch_invariant=facts.batch_invariant,
                           flash_attn_version=2 if config.is_turboquant else None)
    n_layers = config.num_hidden_layers if facts.num_layers is None else facts.num_layers
    n = min(2, n_layers // 2)
    boundary = set(range(n)) | set(range(n_layers - n, n_layers)) if config.is_turboquant and facts.dense_boundary else set()
    kinds = []
    # the kinds depend on a layer's boundary membership and parity only: the first and last 6 layers hold every
    # kind at its first layer (a loop over all layers hangs on --num-hidden-layers 10**12)
    for i in sorted(set(range(min(6, n_layers))) | set(range(max(0, n_layers - 6), n_layers))):
        sliding = facts.sliding_window == "all" or (facts.sliding_window == "some" and i % 2 == 0)
        skipped = i in boundary or (sliding and facts.skip_sliding_window and config.is_turboquant)
        kinds.append(dataclasses.replace(base, has_sliding_window=sliding,
                                         kv_cache_dtype="auto" if skipped else base.kv_cache_dtype))
    return list(dict.fromkeys(kinds))


def _pcp_refusal(config: "EngineConfig", pcp: int) -> Refusal | None:
    """``vllm/config/parallel.py`` ``ParallelConfig._validate_parallel_config``: with PCP > 1, DCP is 1, PCP or
    TP x PCP."""
    dcp, tp = config.decode_context_parallel_size, config.tensor_parallel_size
    if pcp > 1 and dcp not in (1, pcp, tp * pcp):
        return Refusal("When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. "
                       f"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are {sorted({1, pcp, tp * pcp})}.",
                       "vllm/config/parallel.py:ParallelConfig._validate_parallel_config")
    return None


def _dcp_refusal(config: "EngineConfig") -> Refusal | None:
    """``vllm/config/model.py`` ``ModelConfig.verify_with_parallel_config``: decode context parallelism on a model
    without MLA needs ``tensor_parallel_size`` > the model's KV heads, and ``dcp <= tp // kv_heads``."""
    dcp, tp, hk = config.decode_context_parallel_size, config.tensor_parallel_size, config.num_key_value_heads
    if dcp <= 1 or config.mla is not None:
        return None
    where = "vllm/config/model.py:ModelConfig.verify_with_parallel_config"
    if tp <= hk:
        return Refusal("Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` "
                       f"({tp}) to be greater than the model's total number of KV heads ({hk}). Increase "
                       "`--tensor-parallel-size` or set `--decode-context-parallel-size 1`.", where)
    if dcp > tp // hk:
        return Refusal(f"`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported value ({tp // hk}) "
                       f"for `--tensor-parallel-size` ({tp}) and {hk} model KV heads.", where)
    return None


def startup_refusal(config: "EngineConfig", facts: StartupFacts | None = None) -> Refusal | None:
    """vLLM 0.33's reason for not starting ``config`` (with ``facts``; None: a bare config, as given), or None
    when it starts as far as tqlab models its checks (see the module docstring). A backend name vLLM knows but
    tqlab's :data:`~tqlab.core.consumers.backends.BACKENDS` does not hold (ROCm, XPU, CPU, DeepSeek-V4's, ...) is
    not judged here."""
    facts = StartupFacts() if facts is None else facts
    if not vllm_versions.current().startup_validation_modelled:  # 0.34's checks are not 0.33's: never guess a refusal
        return None
    old_arch = previously_supported(config.architecture) if config.architecture and not facts.auto_model else None
    if old_arch is not None:  # ModelConfig.__post_init__ resolves the architecture before the dtype
        return Refusal(f"Model architecture {config.architecture} was supported in vLLM until v{old_arch}, and is not "
                       "supported anymore. Please use an older version of vLLM if you want to use this model "
                       "architecture.", "vllm/model_executor/models/registry.py:_ModelRegistry._raise_for_unsupported")
    # EngineArgs.create_engine_config's order: ModelConfig (dtype), ParallelConfig, the attention config, then
    # VllmConfig (ModelConfig.verify_with_parallel_config), then each layer's backend at model load
    if facts.model_type in FLOAT16_NOT_SUPPORTED and str(config.dtype) == "torch.float16":
        return Refusal(f"The model type {facts.model_type!r} does not support float16. Reason: "
                       f"{FLOAT16_NOT_SUPPORTED[facts.model_type]}", "vllm/config/model.py:_check_valid_dtype")
    for refusal in (_pcp_refusal(config, facts.prefill_context_parallel_size), facts.flag_refusal,
                    _dcp_refusal(config)):
        if refusal is not None:
            return refusal
    pinned = config.attention_backend
    if pinned is not None and pinned not in ATTENTION_BACKEND_NAMES:
        return backend_flag({"attention_backend": pinned})[2]
    if pinned is not None and pinned not in BACKENDS:
        return None
    g = gpu_target(config.gpu)
    families = reachable_families(config)
    # A model class that builds no Attention / MLAAttention layer never asks vLLM's selector (DeepSeek-V4's layers
    # carry their own DeepseekV4SparseMLABackend, models/deepseek_v4/attention.py; a Mamba-only stack has none)
    selects = families is None or bool(families & {"attention", "mla_attention", "encoder_only_attention"})
    # a class whose only attention layer is EncoderOnlyAttention (BERT-style) asks the selector with
    # attn_type ENCODER_ONLY (model_executor/layers/attention/encoder_only_attention.py), which TurboQuant refuses
    encoder_only = families is not None and "encoder_only_attention" in families and "attention" not in families
    for s in _layer_kinds(config, facts) if selects else ():
        s = dataclasses.replace(s, attn_type="encoder_only") if encoder_only else s
        try:
            select_backend(pinned, s, g.capability, config.num_heads_per_rank)
        except NoValidBackend as e:
            return Refusal(e.reason, _SELECTOR_SOURCE)
    refused = mla_prefill_refusal(config)
    if refused is not None:
        return Refusal(refused, "vllm/v1/attention/backends/mla/prefill/selector.py:get_mla_prefill_backend")
    return None
