"""config.json as vLLM 0.33 sees it: per-family config classes, and ``--hf-overrides`` applied first.

vLLM never reads config.json as a plain dict: it builds a Hugging Face config
class (``transformers`` or vLLM's own, ``vllm/transformers_utils/configs/``),
whose ``attribute_map`` aliases and defaults decide what
``ModelArchConfigConvertorBase`` (``vllm/transformers_utils/model_arch_config_convertor.py``)
reads. :func:`family_view` gives the dict that class would expose, for the
families tqlab models:

* ChatGLM (``model_type`` ``chatglm``; vLLM ``ChatGLMConfig``):
  ``num_hidden_layers`` is ``num_layers`` (default 28), ``n_head_kv`` is
  ``multi_query_group_num`` (default 1), ``max_position_embeddings`` is
  ``seq_length`` (default 2048).
* Falcon (``falcon``; transformers ``FalconConfig``): ``num_kv_heads`` defaults
  to ``num_attention_heads``, ``multi_query`` to True,
  ``new_decoder_architecture`` to False, ``max_position_embeddings`` to 2048.
* Falcon's older ``RefinedWeb`` / ``RefinedWebModel`` (vLLM ``RWConfig``):
  ``n_layer`` / ``n_head`` / ``n_head_kv`` (defaults 2 / 8 / 1) are the layers,
  heads and KV heads; ``hidden_size`` 8192 sets ``new_decoder_architecture``.
* GPT-2 (``gpt2``; transformers ``GPT2Config``) and GPTBigCode (``gpt_bigcode``;
  ``GPTBigCodeConfig``): ``attribute_map`` ``num_attention_heads`` -> ``n_head`` (default 12),
  ``hidden_size`` -> ``n_embd`` (768), ``num_hidden_layers`` -> ``n_layer`` (12),
  ``max_position_embeddings`` -> ``n_positions`` (1024). GPTBigCode's ``__post_init__`` sets
  ``num_key_value_heads = 1 if multi_query else n_head`` (``multi_query`` defaults to True); a
  ``num_key_value_heads`` in config.json wins (``PreTrainedConfig.__post_init__`` sets the extra
  keys after the subclass's ``__post_init__``; transformers 5.20, checked in parity).
* DBRX (``dbrx``; ``DbrxConfig``) and MPT (``mpt``; ``MptConfig``): ``num_attention_heads`` ->
  ``n_heads`` (16), ``hidden_size`` -> ``d_model`` (2048), ``num_hidden_layers`` -> ``n_layers``
  (24); DBRX also ``max_position_embeddings`` -> ``max_seq_len`` (2048; MPT reads
  ``max_seq_len``, default 2048, under its own name). DBRX's KV heads are
  ``attn_config.kv_n_heads`` (``DbrxAttentionConfig`` default 1), read by vLLM's
  ``DbrxModelArchConfigConvertor.get_total_num_kv_heads`` (:func:`tqlab.vllm.hf_config._kv_heads`);
  MPT has no KV-head key: the base convertor's default, the query heads.

:func:`apply_hf_overrides` mirrors ``ModelConfig.__post_init__``
(``vllm/config/model.py``): non-dict values go through ``PreTrainedConfig.update``
(top level, through the class's ``attribute_map``) inside ``get_config``; dict
values then go through ``ModelConfig._apply_dict_overrides``: merged key by key
into a nested config (``text_config``...), set whole on any other key
(``rope_scaling``, ``quantization_config``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["ATTRIBUTE_MAPS", "FALCON_TYPES", "apply_hf_overrides", "family_view"]

FALCON_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})
"""``model_type`` values vLLM reads with ``FalconModelArchConfigConvertor`` (``MODEL_ARCH_CONFIG_CONVERTORS``)."""

_GPT2_MAP = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
             "num_hidden_layers": "n_layer"}
_DBRX_MAP = {"num_attention_heads": "n_heads", "hidden_size": "d_model", "num_hidden_layers": "n_layers"}

ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "chatglm": {"num_hidden_layers": "num_layers", "n_head_kv": "multi_query_group_num"},
    "gpt2": _GPT2_MAP,
    "gpt_bigcode": _GPT2_MAP,
    "dbrx": {**_DBRX_MAP, "max_position_embeddings": "max_seq_len"},
    "mpt": _DBRX_MAP,
    "RefinedWeb": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "num_kv_heads": "n_head_kv"},
    "RefinedWebModel": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "num_kv_heads": "n_head_kv"},
}
"""The config classes' ``attribute_map``: reading (or overriding) the key reads (or sets) the value."""

_NOT_NESTED = frozenset({"quantization_config", "compression_config"})


def family_view(cfg: Mapping[str, Any], model_type: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(the dict vLLM's config class for model_type exposes, {key: where its value came from})``.

    Only keys the class aliases or defaults are added; others are ``cfg``'s own. A ``null``
    in config.json counts as absent, as the classes' ``__init__`` defaults do.
    """
    view = dict(cfg)
    src: dict[str, str] = {}

    def alias(key: str, real: str, default: Any, why: str) -> None:
        if cfg.get(key) is not None and key != real:  # __setattr__ maps the key onto the real attribute: it wins
            view[real] = cfg[key]
        if view.get(real) is None:
            view[real], src[real] = default, f"{why} default {default} ({real} not in config.json)"
        view[key] = view[real]
        src.setdefault(key, f"config.json {real} ({why}: {key} is {real})")

    if model_type == "chatglm":
        why = "ChatGLM, vLLM ChatGLMConfig"
        alias("num_hidden_layers", "num_layers", 28, why)
        alias("n_head_kv", "multi_query_group_num", 1, why)
        if view.get("max_position_embeddings") is None:
            alias("max_position_embeddings", "seq_length", 2048, why)
    elif model_type == "falcon":
        why = "Falcon, transformers FalconConfig"
        if view.get("num_kv_heads") is None and view.get("num_attention_heads") is not None:
            view["num_kv_heads"] = view["num_attention_heads"]
            src["num_kv_heads"] = f"derived: no num_kv_heads, = num_attention_heads ({why})"
        for key, default in (("multi_query", True), ("new_decoder_architecture", False), ("max_position_embeddings", 2048)):
            if view.get(key) is None:
                view[key], src[key] = default, f"{why} default {default} ({key} not in config.json)"
    elif model_type in _ALIAS_FAMILIES:
        _alias_family(view, src, alias, model_type)
    elif model_type in ("RefinedWeb", "RefinedWebModel"):
        why = "Falcon RefinedWeb, vLLM RWConfig"
        alias("num_hidden_layers", "n_layer", 2, why)
        alias("num_attention_heads", "n_head", 8, why)
        alias("num_kv_heads", "n_head_kv", 1, why)
        if view.get("multi_query") is None:
            view["multi_query"] = True
        if view.get("hidden_size") == 8192:  # RWConfig: "Hack for falcon-40b"
            view["new_decoder_architecture"] = True
            src["new_decoder_architecture"] = f"derived: hidden_size 8192 ({why})"
    return view, src


_ALIAS_FAMILIES = {
    # model_type: (transformers class, {real key: its default})
    "gpt2": ("GPT-2, transformers GPT2Config", {"n_head": 12, "n_embd": 768, "n_layer": 12, "n_positions": 1024}),
    "gpt_bigcode": ("GPTBigCode, transformers GPTBigCodeConfig",
                    {"n_head": 12, "n_embd": 768, "n_layer": 12, "n_positions": 1024}),
    "dbrx": ("DBRX, transformers DbrxConfig", {"n_heads": 16, "d_model": 2048, "n_layers": 24, "max_seq_len": 2048}),
    "mpt": ("MPT, transformers MptConfig", {"n_heads": 16, "d_model": 2048, "n_layers": 24}),
}


def _alias_family(view: dict[str, Any], src: dict[str, str], alias: Any, model_type: str) -> None:
    """GPT-2, GPTBigCode, DBRX, MPT: the ``attribute_map`` aliases with the class defaults (module docstring)."""
    why, defaults = _ALIAS_FAMILIES[model_type]
    for key, real in ATTRIBUTE_MAPS[model_type].items():
        alias(key, real, defaults[real], why)
    if model_type == "mpt" and view.get("max_seq_len") is None:
        view["max_seq_len"], src["max_seq_len"] = 2048, f"{why} default 2048 (max_seq_len not in config.json)"
    if model_type == "gpt_bigcode" and view.get("num_key_value_heads") is None:  # a config.json value is set after
        mq = view.get("multi_query")
        mq = True if mq is None else mq
        view["num_key_value_heads"] = 1 if mq else view["n_head"]
        src["num_key_value_heads"] = (f"derived: multi_query {'true' if mq else 'false'} -> "
                                      f"{'1' if mq else 'n_head'} ({why}.__post_init__)")


def _merge(target: dict[str, Any], updates: Mapping[str, Any]) -> None:
    """``ModelConfig._update_nested``: dict values merge into dicts, anything else is set."""
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def apply_hf_overrides(raw: Mapping[str, Any], overrides: Any, where: str = "--hf-overrides") -> tuple[dict[str, Any], set[str], list[str]]:
    """config.json with vLLM's ``--hf-overrides`` applied -> ``(config, overridden keys, notes)``.

    ``overrides``: the flag's JSON object (``'{"num_key_value_heads": 4}'`` or the dotted
    ``--hf-overrides.num_key_value_heads 4``). Overridden keys come back dotted
    (``"text_config.num_key_value_heads"``) so errors can name the flag. A top-level
    key of a model whose text model is in ``text_config`` gets a note: vLLM sets it
    on the top level, where the text model does not read it. Raises ``ValueError``
    for overrides that are not a JSON object (vLLM's ``HfOverrides`` is a dict or a
    callable). ``raw`` is not modified.
    """
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where} must be a JSON object such as '{{\"max_position_embeddings\": 8192}}', got {overrides!r}")
    cfg = copy.deepcopy(dict(raw))
    amap = ATTRIBUTE_MAPS.get(str(overrides.get("model_type", cfg.get("model_type"))), {})
    keys: set[str] = set()
    notes: list[str] = []
    for key, value in overrides.items():  # get_config: config.update(flat overrides), through attribute_map
        if isinstance(value, Mapping):
            continue
        real = amap.get(key, key)
        cfg[real] = copy.deepcopy(value)
        keys.add(real)
        if isinstance(cfg.get("text_config"), dict) and key not in ("model_type", "architectures"):
            notes.append(f"{where} {key}: set on the top-level config as vLLM does; this model's text model reads "
                         f"text_config (use '{{\"text_config\": {{\"{key}\": ...}}}}')")
    for key, value in overrides.items():  # ModelConfig._apply_dict_overrides
        if not isinstance(value, Mapping):
            continue
        if key.endswith("_config") and key not in _NOT_NESTED and isinstance(cfg.get(key), dict):
            _merge(cfg[key], value)
            keys |= {f"{key}.{k}" for k in value}
        else:
            cfg[key] = copy.deepcopy(dict(value))
            keys.add(key)
    return cfg, keys, notes
