"""The one validated reader of a model's ``config.json`` (Hugging Face format), as vLLM 0.33 reads it.

:func:`read_hf_config` checks the type and range of every field tqlab uses and
names the file in every error (:class:`HFConfigError`, a ``ValueError``). What
it mirrors in vLLM 0.33:

* ``text_config`` nesting (multimodal checkpoints): ``vllm/transformers_utils/config.py``
  ``get_hf_text_config``.
* ``head_dim`` or ``hidden_size // num_attention_heads``:
  ``ModelArchConfigConvertorBase.get_head_size``.
* The longest context: the smallest of ``max_position_embeddings``,
  ``n_positions``, ``max_seq_len``, ``seq_length``, ``model_max_length``,
  ``max_target_positions``, ``max_sequence_length``, ``max_seq_length``,
  ``seq_len`` (``vllm/transformers_utils/model_arch_config_convertor.py``
  ``derive_max_model_len_and_key``), times a RoPE ``factor`` unless the RoPE
  type is su/longrope/llama3/yarn/deepseek_yarn/deepseek_llama_scaling
  (``vllm/config/model.py`` ``_get_and_verify_max_len``); 2048 when no key is
  present.
* Attention layers of hybrid models (``vllm/config/model.py``
  ``ModelConfig.get_num_layers_by_block_type``): ``layers_block_type``
  (``"attention"``; Zamba2: ``"hybrid"``), ``attn_type_list`` (``1``),
  ``layer_types`` (``full_attention``, ``indexed_attention``,
  ``deepseek_sparse_attention``, ``qwen_sparse_attention``:
  ``_ATTENTION_LAYER_TYPES``); ``full_attention_interval`` is how Qwen3-Next /
  Qwen3.5 configs fill ``layer_types`` (layer ``i`` is full attention when
  ``(i + 1) % interval == 0``: 64 layers, interval 4 -> layers 3, 7, ..., 63);
  Nemotron-H's ``hybrid_override_pattern`` (``*`` attention, ``M`` Mamba,
  ``-``/``E`` MLP/MoE: ``vllm/model_executor/models/nemotron_h.py``); Jamba's
  ``attn_layer_period``/``attn_layer_offset``; explicit
  ``attn_layer_indices``/``attention_layer_indices``.
* The Mamba state page of a hybrid model, for the attention block size
  (``tqlab.vllm.deployment.hybrid_attention_block_size``): Gated
  DeltaNet (Qwen3-Next/Qwen3.5: ``linear_*`` keys,
  ``MambaStateShapeCalculator.gated_delta_net_state_shape``) and Mamba2
  (Nemotron-H: ``mamba_num_heads``..., ``mamba2_state_shape``).
* MLA, the sparse indexer and MoE (issue 19, :func:`_consumer_fields`): a model whose ``model_type`` is in
  vLLM's ``is_deepseek_mla`` list (``model_arch_config_convertor.py``) and has ``kv_lora_rank`` uses MLA: its head
  size is ``kv_lora_rank + qk_rope_head_dim`` (``get_head_size``; 576 for DeepSeek-V3) and it has one KV head
  (``ModelConfig.get_num_kv_heads``: "during decode it becomes MQA"); ``index_topk``/``index_head_dim``/
  ``index_n_heads`` give the sparse indexer; the expert count the model class reads (``n_routed_experts``,
  ``num_experts`` or ``num_local_experts``: :func:`tqlab.core.consumers.arch_table.expert_count_keys`, e.g.
  ``mixtral.py`` ``MixtralDecoderLayer`` reads ``num_local_experts``) (> 1) with ``num_experts_per_tok`` and
  ``moe_intermediate_size`` (else ``intermediate_size``) give a MoE block.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqlab.core.consumers.arch_table import arch_row, expert_count_keys
from tqlab.core.model_arch import IndexerFields, MLAFields, MoEFields
from tqlab.vllm.hf_families import ATTRIBUTE_MAPS, FALCON_TYPES, apply_hf_overrides, family_view

__all__ = ["KV_HEAD_KEYS", "NEMOTRON_H_ARCHITECTURES", "HFConfigError", "MambaState", "ModelShape", "read_hf_config"]

MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)
"""vLLM 0.33 ``derive_max_model_len_and_key``'s keys, in its order; the smallest present wins."""
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "indexed_attention", "deepseek_sparse_attention", "qwen_sparse_attention"})
"""``layer_types`` values vLLM 0.33 counts as attention in a hybrid model (``_ATTENTION_LAYER_TYPES``)."""
_ALL_ATTENTION_TYPES = ATTENTION_LAYER_TYPES | {"attention", "sliding_attention", "chunked_attention"}
_ALLOWED_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "reference_sliding_attention", "linear_attention", "sparse", "dense"})
"""transformers' ``ALLOWED_LAYER_TYPES``: a ``rope_parameters`` keyed only by these is one dict per layer type."""
_ROPE_NO_FACTOR = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
DEFAULT_MAX_LEN = 2048
"""vLLM's fallback when config.json has none of :data:`MAX_LEN_KEYS`."""
MAX_LAYERS = 1_000_000
"""The most ``num_hidden_layers`` :func:`read_hf_config` reads: it lists the attention layers one by one."""


class HFConfigError(ValueError):
    """A config.json that cannot be read or has a field of the wrong type or range (the message names the file)."""


@dataclass(frozen=True)
class MambaState:
    """Per-layer Mamba-style state of a hybrid model, before tensor parallelism.

    ``kind``: ``"gdn"`` (Gated DeltaNet) or ``"mamba2"``. ``conv_dim`` and
    ``conv_len`` give the conv state ``(conv_len, conv_dim / TP)``;
    ``temporal``: ``(heads, d1, d2)`` with ``heads / TP`` per rank;
    ``ssm_dtype``: the config's ``mamba_ssm_dtype`` (Qwen3.5) or None;
    ``groups``/``state_size``: Mamba2 groups (replicated when not divisible by TP).
    """

    kind: str
    conv_dim_base: int
    conv_len: int
    temporal: tuple[int, int, int]
    groups: int = 0
    state_size: int = 0
    ssm_dtype: str | None = None

    def page_bytes(self, tp: int, conv_itemsize: int, ssm_itemsize: int, num_spec: int = 0) -> int:
        """Bytes of one sequence's state on one rank (vLLM ``MambaSpec.page_size_bytes``); ValueError if TP does not divide.

        ``num_spec``: speculative tokens; the conv state keeps ``conv_len + num_spec`` steps (``*_state_shape(num_spec=)``).
        """
        extra = 0
        if self.kind == "mamba2" and self.groups % tp:
            extra = tp - self.groups  # extra_groups_for_head_shards
        conv_dim = self.conv_dim_base + 2 * (self.groups + extra) * self.state_size
        heads = self.temporal[0]
        if conv_dim % tp or heads % tp:
            raise ValueError(f"tensor_parallel_size {tp} does not divide the Mamba state ({conv_dim} conv, {heads} heads)")
        conv = (self.conv_len + num_spec) * (conv_dim // tp) * conv_itemsize
        return conv + (heads // tp) * self.temporal[1] * self.temporal[2] * ssm_itemsize


@dataclass(frozen=True)
class ModelShape:
    """What tqlab takes from config.json (the text model's part), validated.

    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (elements),
    ``num_hidden_layers`` (all layers), ``attention_layers`` (indices of the
    layers with an attention KV cache: all of them unless hybrid),
    ``hybrid`` (the marker that said so, or None), ``max_len``/``max_len_key``
    (vLLM's default ``max_model_len`` and the key it came from, None: default
    2048), ``max_len_limit``/``max_len_limit_key`` (the derived length a ``--max-model-len`` may
    reach and its key: above ``max_len`` only with longrope), ``model_max_length`` (that key alone: vLLM lets a longer
    ``--max-model-len`` through up to it), ``dtype`` (``torch_dtype``/``dtype`` string or None), ``mamba``
    (:class:`MambaState` or None), ``sources`` (field -> where it came from), ``notes`` (what
    ``--hf-overrides`` did that a reader should know), ``hf_overrides`` (the keys it set, dotted).
    """

    path: str
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    attention_layers: tuple[int, ...]
    hybrid: str | None
    max_len: int
    max_len_key: str | None
    dtype: str | None
    architecture: str | None
    mamba: MambaState | None = None
    model_max_length: int | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    max_len_limit: int | None = None
    max_len_limit_key: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)
    hf_overrides: tuple[str, ...] = ()

    @property
    def longest_max_model_len(self) -> int:
        """The longest ``--max-model-len`` vLLM accepts without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``
        (``max_len`` unless longrope made ``max_len`` only the default)."""
        return self.max_len if self.max_len_limit is None else self.max_len_limit
    mla: MLAFields | None = None
    indexer: IndexerFields | None = None
    moe: MoEFields | None = None

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layers)


def _load(source: str | os.PathLike | Mapping[str, Any]) -> tuple[str, Any]:
    if isinstance(source, Mapping):
        return "config dict", dict(source)
    p = Path(source)
    if p.is_dir():
        p = p / "config.json"
    name = str(p)
    if not p.is_file():
        raise HFConfigError(f"{name}: no such file (expected a config.json or its folder)")
    try:
        return name, json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise HFConfigError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise HFConfigError(f"{name}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise HFConfigError(f"{name}: nested too deeply to read (more than about {sys.getrecursionlimit()} levels "
                            "of objects or lists; a config.json is a few levels deep)") from None
    except OSError as e:
        raise HFConfigError(f"{name}: cannot be read ({e.strerror})") from None


class _Reader:
    """Typed access to one config dict, every error naming the file and key."""

    def __init__(self, where: str, cfg: Mapping[str, Any], prefix: str = "", overridden: set[str] | None = None,
                 names: Mapping[str, str] | None = None) -> None:
        self.where, self.cfg, self.prefix, self.overridden = where, cfg, prefix, overridden or set()
        self.names = dict(names or {})  # key read -> the key config.json spells it (a family's attribute_map)

    def fail(self, key: str, msg: str) -> HFConfigError:
        key = self.names.get(key, key)
        if key.split(".")[0] in self.overridden:
            return HFConfigError(f"--hf-overrides {self.prefix}{key} {msg}")
        return HFConfigError(f"{self.where}: {self.prefix}{key} {msg}")

    def src(self, key: str) -> str:
        """Where ``key`` came from: ``"flag --hf-overrides KEY"`` or ``"config.json KEY"``."""
        if key.split(":")[0] in self.overridden:
            return f"flag --hf-overrides {self.prefix}{key}"
        return f"config.json {self.prefix}{key}"

    def int(self, key: str, *, minimum: int = 1, required: bool = False) -> int | None:
        v = self.cfg.get(key)
        if v is None:
            if required:
                raise self.fail(key, "is missing or null" if key not in self.cfg else "is null")
            return None
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, f"must be an integer, got {v!r}")
        if v < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {v}")
        return v

    def str_list(self, key: str) -> list[str] | None:
        v = self.cfg.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
            raise self.fail(key, f"must be a list of strings, got {_short(v)}")
        return v


def _architecture(raw: Mapping[str, Any]) -> str | None:
    """The architecture vLLM 0.33 serves from config.json's ``architectures``
    (``vllm/model_executor/models/registry.py`` ``_ModelRegistry.inspect_model_cls``): a lone string is a list of
    one; the first entry the model registry holds, else the first (the Transformers fallback tries that one);
    None when there is no string entry."""
    archs = raw.get("architectures")
    archs = [archs] if isinstance(archs, str) else archs
    if not isinstance(archs, list):
        return None
    names = [a for a in archs if isinstance(a, str)]
    if not names:
        return None
    return next((a for a in names if arch_row(a) is not None), names[0])


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def read_hf_config(source: str | os.PathLike | Mapping[str, Any], hf_overrides: Any = None) -> ModelShape:
    """Read and validate a model's ``config.json`` (a path, its folder, or the parsed dict).

    ``hf_overrides``: vLLM's ``--hf-overrides`` object, applied before anything is read
    (:func:`~tqlab.vllm.hf_families.apply_hf_overrides`); errors in a value it set name the flag.
    Families are read through their config class (:func:`~tqlab.vllm.hf_families.family_view`):
    KV heads as ``ModelArchConfigConvertorBase.get_total_num_kv_heads`` (the first of
    :data:`KV_HEAD_KEYS`, else the query heads; Falcon: 1 with ``multi_query`` unless
    ``new_decoder_architecture``, ``FalconModelArchConfigConvertor``), layers as
    ``get_num_hidden_layers`` (ChatGLM ``num_layers``), lengths as :func:`_max_len`.

    Raises :class:`HFConfigError` (a ``ValueError``) naming the file for: a
    missing, empty, truncated, non-UTF-8 or too deeply nested file; a top level that is not an
    object; ``num_attention_heads`` missing/null/not a positive integer
    (``32.7`` is an error, never truncated); a KV-head key not a
    positive integer (absent: the query heads, as in vLLM; ``0`` is an error);
    no ``head_dim`` and no ``hidden_size``; ``hidden_size`` not divisible by
    the heads; a max-length key that is not a positive integer (``1e400`` is
    ``inf`` in JSON: an error); hybrid markers of the wrong type or length; a
    hybrid model with no attention layer ("no TurboQuant workspace consumer").
    """
    where, raw = _load(source)
    if not isinstance(raw, dict):
        raise HFConfigError(f"{where}: the top level must be a JSON object, got {type(raw).__name__} {_short(raw)}")
    overridden: set[str] = set()
    notes: list[str] = []
    if hf_overrides is not None:
        try:
            raw, overridden, notes = apply_hf_overrides(raw, hf_overrides)
        except ValueError as e:
            raise HFConfigError(str(e)) from None
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise HFConfigError(f"{where}: text_config must be an object, got {_short(text)}")
    prefix = "text_config." if text is not None else ""
    model_type = (text or {}).get("model_type") or raw.get("model_type")
    cfg, family_src = family_view(text if text is not None else raw, model_type if isinstance(model_type, str) else None)
    source = text if text is not None else raw
    amap = ATTRIBUTE_MAPS.get(model_type, {}) if isinstance(model_type, str) else {}
    names = {k: real for k, real in amap.items() if source.get(k) is None and source.get(real) is not None}
    r = _Reader(where, cfg, prefix, {k[len(prefix):] for k in overridden if k.startswith(prefix)}, names)
    sources: dict[str, str] = {}
    hq = r.int("num_attention_heads", required=True)
    sources["num_attention_heads"] = family_src.get("num_attention_heads", r.src("num_attention_heads"))
    hk, sources["num_key_value_heads"] = _kv_heads(r, hq, model_type, family_src)
    d = r.int("head_dim")
    if d is not None:
        sources["head_dim"] = r.src("head_dim")
    else:
        hidden = r.int("hidden_size")
        if hidden is None:
            raise HFConfigError(f"{where}: has neither {r.prefix}head_dim nor {r.prefix}hidden_size")
        if hidden % hq:
            raise r.fail("hidden_size", f"({hidden}) is not divisible by num_attention_heads ({hq}); give head_dim")
        d = hidden // hq
        sources["head_dim"] = f"derived: hidden_size // num_attention_heads = {hidden} // {hq} = {d}"
    mla, indexer, moe = _consumer_fields(r, raw)
    if mla is not None:
        hk, d = 1, mla.head_size
        sources["num_key_value_heads"] = "derived: MLA, one latent KV head (vLLM ModelConfig.get_num_kv_heads)"
        sources["head_dim"] = (f"derived: MLA head size kv_lora_rank + qk_rope_head_dim = {mla.kv_lora_rank} + "
                               f"{mla.qk_rope_head_dim} = {d} (vLLM get_head_size)")
    n_layers = r.int("num_hidden_layers") or 1
    if n_layers > MAX_LAYERS:  # the layer list is built per layer (a MemoryError traceback at 10**12)
        raise r.fail("num_hidden_layers", f"is {n_layers:,}: more layers than tqlab reads (at most {MAX_LAYERS:,}; "
                                          "the largest public models have a few hundred)")
    attn, hybrid = _attention_layers(r, n_layers)
    if not attn:
        raise HFConfigError(f"{where}: {hybrid} marks no attention layer: no TurboQuant workspace consumer")
    layers_src = family_src.get("num_hidden_layers", r.src("num_hidden_layers"))
    sources["num_hidden_layers"] = (r.src(f"{hybrid}: {len(attn)} attention layers of {n_layers}") if hybrid else layers_src)
    max_len, limit, limit_key, key = _max_len(r, model_type)
    if key is not None and key.split(" ")[0] in family_src:
        sources["max_len"] = family_src[key.split(" ")[0]]
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or raw.get("dtype")
    arch = _architecture(raw)
    return ModelShape(
        path=where, num_attention_heads=hq, num_key_value_heads=hk, head_dim=d, num_hidden_layers=n_layers,
        attention_layers=attn, hybrid=hybrid, max_len=max_len, max_len_key=key,
        dtype=None if dtype is None else str(dtype), architecture=arch,
        mamba=_mamba_state(r, arch) if hybrid else None, model_max_length=r.int("model_max_length"), sources=sources,
        max_len_limit=limit, max_len_limit_key=limit_key, notes=tuple(notes), hf_overrides=tuple(sorted(overridden)),
        mla=mla, indexer=indexer, moe=moe,
    )


KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
"""vLLM 0.33 ``CONFIG_FIELD_ALIASES["total_num_kv_heads"]`` (``vllm/transformers_utils/config.py``), in its order."""


def _kv_heads(r: _Reader, hq: int, model_type: Any, family_src: Mapping[str, str]) -> tuple[int, str]:
    """``(KV heads, source)``: ``get_total_num_kv_heads`` of vLLM's convertor for this family
    (``vllm/transformers_utils/model_arch_config_convertor.py``: Falcon, DBRX, Nemotron-NAS override it)."""
    if model_type == "dbrx":
        return _dbrx_kv_heads(r)
    if model_type == "nemotron-nas":
        return _nemotron_nas_kv_heads(r, hq)
    if model_type in FALCON_TYPES and not r.cfg.get("new_decoder_architecture") and r.cfg.get("multi_query"):
        return 1, ("derived: Falcon multi_query without new_decoder_architecture: one KV head "
                   "(vLLM FalconModelArchConfigConvertor.get_total_num_kv_heads)")
    for key in KV_HEAD_KEYS:
        v = r.int(key)
        if v is not None:
            return v, family_src.get(key, r.src(key))
    return hq, ("derived: no num_key_value_heads (nor n_head_kv, num_kv_heads, multi_query_group_num, "
                "num_attention_groups), = num_attention_heads (vLLM)")


def _dbrx_kv_heads(r: _Reader) -> tuple[int, str]:
    """vLLM 0.33 ``DbrxModelArchConfigConvertor.get_total_num_kv_heads``: ``attn_config.kv_n_heads``
    (transformers ``DbrxAttentionConfig``: default 1 when config.json leaves it or ``attn_config`` out)."""
    attn = r.cfg.get("attn_config")
    if attn is None:
        attn = {}
    if not isinstance(attn, dict):
        raise r.fail("attn_config", f"must be an object, got {_short(attn)}")
    sub = _Reader(r.where, attn, f"{r.prefix}attn_config.",
                  {k.removeprefix("attn_config.") for k in r.overridden if k.startswith("attn_config.")})
    kv = sub.int("kv_n_heads")
    if kv is None:
        return 1, "DBRX, transformers DbrxAttentionConfig default kv_n_heads 1 (attn_config.kv_n_heads not in config.json)"
    return kv, sub.src("kv_n_heads") + " (vLLM DbrxModelArchConfigConvertor)"


def _nemotron_nas_kv_heads(r: _Reader, hq: int) -> tuple[int, str]:
    """vLLM 0.33 ``NemotronNasModelArchConfigConvertor.get_total_num_kv_heads``: ``num_attention_heads //
    n_heads_in_group`` of the first block whose attention is not ``no_op`` (``block_configs``); none such:
    vLLM's ``RuntimeError`` ("Could not determine the number of key-value attention heads")."""
    blocks = r.cfg.get("block_configs")
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
        raise r.fail("block_configs", f"must be a list of block objects (Nemotron-NAS), got {_short(blocks)}")
    groups = []
    for i, block in enumerate(blocks):
        attn = block.get("attention")
        if not isinstance(attn, dict):
            raise r.fail(f"block_configs[{i}].attention", f"must be an object, got {_short(attn)}")
        if not attn.get("no_op"):
            groups.append((i, _Reader(r.where, attn, f"{r.prefix}block_configs[{i}].attention.").int(
                "n_heads_in_group", required=True)))
    if not groups:
        raise r.fail("block_configs", "has no attention block (every attention is no_op): vLLM cannot determine "
                     "the number of KV heads")
    i, g = groups[0]
    others = sorted({x for _, x in groups} - {g})
    return hq // g, (f"derived: num_attention_heads // block_configs[{i}].attention.n_heads_in_group = {hq} // {g} "
                     "(vLLM NemotronNasModelArchConfigConvertor: the first attention block)"
                     + (f"; other blocks use n_heads_in_group {others}, which it ignores" if others else ""))


def _attention_layers(r: _Reader, n: int) -> tuple[tuple[int, ...], str | None]:
    """``(indices of attention layers, hybrid marker or None)``; see the module docstring."""
    pattern = r.cfg.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern or set(pattern) - set("*M-E"):
            raise r.fail("hybrid_override_pattern", f"must be a string of '*', 'M', '-', 'E', got {_short(pattern)}")
        return tuple(i for i, c in enumerate(pattern) if c == "*"), "hybrid_override_pattern"
    for key, is_attn in (("layers_block_type", lambda t: t in ("attention", "hybrid")), ("layer_types", None)):
        types = r.str_list(key)
        if types is None:
            continue
        if len(types) != n:
            raise r.fail(key, f"has {len(types)} entries but num_hidden_layers is {n}")
        if key == "layer_types" and all(t in _ALL_ATTENTION_TYPES for t in types):
            return tuple(range(n)), None  # e.g. Gemma's sliding/full mix: not hybrid, every layer attends
        test = is_attn or (lambda t: t in ATTENTION_LAYER_TYPES)
        return tuple(i for i, t in enumerate(types) if test(t)), key
    attn_types = r.cfg.get("attn_type_list")
    if attn_types is not None:
        if not isinstance(attn_types, list) or len(attn_types) != n:
            raise r.fail("attn_type_list", f"must be a list of {n} entries, got {_short(attn_types)}")
        return tuple(i for i, t in enumerate(attn_types) if t == 1), "attn_type_list"
    interval = r.int("full_attention_interval")
    if interval is not None:
        return tuple(i for i in range(n) if (i + 1) % interval == 0), "full_attention_interval"
    for key in ("attn_layer_indices", "attention_layer_indices"):
        idx = r.cfg.get(key)
        if idx is not None:
            if not isinstance(idx, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in idx):
                raise r.fail(key, f"must be a list of layer indices in [0, {n}), got {_short(idx)}")
            return tuple(sorted(set(idx))), key
    period = r.int("attn_layer_period")
    if period is not None:
        offset = r.int("attn_layer_offset", minimum=0) or 0
        return tuple(i for i in range(n) if i % period == offset), "attn_layer_period"
    return tuple(range(n)), None


def _rope_parameters(r: _Reader) -> list[dict[str, Any]]:
    """The RoPE parameter dicts, one per layer type if nested (vLLM ``iter_rope_parameters``), with the
    legacy ``type`` key read as ``rope_type`` and ``su`` as ``longrope`` (``patch_legacy_rope_type``)."""
    rope = r.cfg.get("rope_parameters") or r.cfg.get("rope_scaling")
    if not isinstance(rope, dict) or not rope:
        return []
    nested = set(rope) <= _ALLOWED_LAYER_TYPES | {"main", "compress"}
    out = []
    for rp in (rope.values() if nested else [rope]):
        if isinstance(rp, dict) and rp:
            rtype = rp.get("rope_type", rp.get("type", "default"))
            out.append({**rp, "rope_type": "longrope" if rtype == "su" else rtype})
    return out


def _max_len(r: _Reader, model_type: Any) -> tuple[int, int, str | None, str | None]:
    """``(max_model_len by default, the longest --max-model-len allowed, its key, the default's key)``
    as vLLM 0.33 derives them.

    ``derive_max_model_len_and_key`` (``vllm/transformers_utils/model_arch_config_convertor.py``):
    the smallest of :data:`MAX_LEN_KEYS`, but a ``model_max_length`` (Command-R, Cohere2) replaces it
    outright; none: 2048. ``_get_and_verify_max_len`` (``vllm/config/model.py``): times the RoPE
    ``factor`` unless the type is su/longrope/llama3/yarn/deepseek_yarn/deepseek_llama_scaling or the
    model is Gemma 3; the default is that length, except with longrope: ``original_max_position_embeddings``
    (Phi-3-128k: 4096 by default, ``--max-model-len 131072`` accepted).
    """
    best, key = math.inf, None
    for k in MAX_LEN_KEYS:
        v = r.cfg.get(k)
        if v is None:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise r.fail(k, f"must be a finite positive integer, got {v!r}")
        v = r.int(k)
        if v < best:
            best, key = v, k
    mml = r.int("model_max_length")
    if mml:
        best, key = mml, "model_max_length"
    derived: float = DEFAULT_MAX_LEN if key is None else best
    ropes = _rope_parameters(r)
    if ropes and "gemma3" not in str(model_type or ""):
        factor: Any = 1.0
        for rp in ropes:
            if rp["rope_type"] not in _ROPE_NO_FACTOR:
                factor = rp.get("factor", factor)
        if factor is None:
            factor = 1.0
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < 2**20:
            raise r.fail("rope_scaling.factor", f"must be a positive number, got {factor!r}")
        if factor != 1.0:
            derived, key = derived * factor, f"{key or 'default 2048'} x rope factor {factor}"
    limit = int(derived)
    if any(rp["rope_type"] == "longrope" for rp in ropes):
        orig = r.int("original_max_position_embeddings")
        if orig:
            return orig, limit, key, "original_max_position_embeddings"
    return limit, limit, key, key


NEMOTRON_H_ARCHITECTURES = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Nano_VL_V2"})
"""Architectures whose SSM state defaults to the config's ``mamba_ssm_cache_dtype``, else float32: vLLM 0.33
``vllm/model_executor/models/config.py`` ``MODELS_CONFIG_MAP`` -> ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``
(``NemotronH_Nano_VL_V2`` reads its ``text_config``). Keyed on the architecture, as vLLM does, not on
how the layer pattern is spelled (``hybrid_override_pattern`` or ``layers_block_type``)."""


def _mamba_state(r: _Reader, arch: str | None = None) -> MambaState | None:
    """The per-layer recurrent state (GDN or Mamba2), or None if the config does not describe one.

    ``arch``: ``architectures[0]``; :data:`NEMOTRON_H_ARCHITECTURES` get vLLM's float32 SSM-state default.
    """
    c = r.cfg
    ssm = c.get("mamba_ssm_dtype") if isinstance(c.get("mamba_ssm_dtype"), str) else None
    if "linear_num_value_heads" in c:
        kh, vh = r.int("linear_num_key_heads", required=True), r.int("linear_num_value_heads", required=True)
        kd, vd = r.int("linear_key_head_dim", required=True), r.int("linear_value_head_dim", required=True)
        kernel = r.int("linear_conv_kernel_dim", required=True)
        return MambaState("gdn", kd * kh * 2 + vd * vh, kernel - 1, (vh, vd, kd), ssm_dtype=ssm)
    if "mamba_num_heads" in c:
        heads, hd = r.int("mamba_num_heads", required=True), r.int("mamba_head_dim", required=True)
        groups, state = r.int("n_groups", required=True), r.int("ssm_state_size", required=True)
        kernel = r.int("conv_kernel", required=True)
        # Nemotron-H: vLLM's NemotronHForCausalLMConfig uses the config's mamba_ssm_cache_dtype, else float32
        nem = c.get("mamba_ssm_cache_dtype") if isinstance(c.get("mamba_ssm_cache_dtype"), str) else "float32"
        ssm = ssm or (nem if arch in NEMOTRON_H_ARCHITECTURES else None)
        return MambaState("mamba2", heads * hd, kernel - 1, (heads, hd, state), groups, state, ssm_dtype=ssm)
    return None


MLA_MODEL_TYPES = frozenset({
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots3_note", "deepseek_mtp", "k3_dspark", "glm5_next",
    "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
    "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp",
    "hy_v4", "hy_v4_mtp",
})
"""vLLM 0.33 ``is_deepseek_mla``'s model types (DeepSeek-V4/V4.1, compressed-KV models, are left out: tqlab does not model them)."""


def _rope_dim(r: _Reader) -> int:
    """``qk_rope_head_dim`` (0 when the key is absent); an explicit ``null`` is refused, as vLLM's MLA arithmetic
    (``kv_lora_rank + qk_rope_head_dim``, ``deepseek_v2.py``) fails on it."""
    if "qk_rope_head_dim" in r.cfg and r.cfg["qk_rope_head_dim"] is None:
        raise r.fail("qk_rope_head_dim", "must be an integer >= 0, got null (vLLM's MLA head size needs it)")
    return r.int("qk_rope_head_dim", minimum=0) or 0


def _consumer_fields(r: _Reader, raw: Mapping[str, Any]) -> tuple[MLAFields | None, IndexerFields | None, MoEFields | None]:
    """``(mla, indexer, moe)`` read from config.json as vLLM does (see the module docstring); None where absent."""
    c = r.cfg
    model_type = c.get("model_type", raw.get("model_type"))
    mla = None
    if model_type in MLA_MODEL_TYPES and c.get("kv_lora_rank") is not None:
        try:
            mla = MLAFields(r.int("kv_lora_rank", required=True), _rope_dim(r),
                            r.int("qk_nope_head_dim", required=True), r.int("v_head_dim", required=True),
                            r.int("q_lora_rank"))
        except HFConfigError:  # already names the file and the key
            raise
        except ValueError as e:
            raise HFConfigError(f"{r.where}: {e}") from None
    indexer = None
    if c.get("index_topk") is not None:
        indexer = IndexerFields(r.int("index_topk", required=True), r.int("index_head_dim", required=True),
                                r.int("index_n_heads", required=True))
    moe = None
    arch = _architecture(raw)
    # the expert count under the key the model class reads (arch_table: n_routed_experts, num_experts, num_local_experts)
    experts = next((v for v in (r.int(k) for k in expert_count_keys(arch)) if v is not None), None)
    if experts is not None and experts > 1 and c.get("num_experts_per_tok") is not None:
        hidden = r.int("hidden_size", required=True)
        inter = r.int("moe_intermediate_size") or r.int("intermediate_size", required=True)
        qcfg = raw.get("quantization_config")
        quant = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
        try:
            moe = MoEFields(experts, r.int("num_experts_per_tok", required=True), inter, hidden,
                            r.int("n_shared_experts", minimum=0) or 0, None if quant is None else str(quant))
        except ValueError as e:
            raise HFConfigError(f"{r.where}: {e}") from None
    return mla, indexer, moe
