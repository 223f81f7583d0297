"""config.json readers: vLLM 0.33's own functions vs ``tqlab.vllm.hf_config.read_hf_config`` (issue 22).

For each config.json (written to a temporary folder), vLLM's side is what ``ModelConfig.__post_init__``
does on CPU without a tokenizer: ``get_config`` (vLLM's config classes: ``ChatGLMConfig``,
``RWConfig``, transformers' ``FalconConfig``...; flat ``--hf-overrides`` through
``PreTrainedConfig.update``), ``ModelConfig._apply_dict_overrides`` for dict overrides,
``get_hf_text_config``, the model type's ``ModelArchConfigConvertor`` (``get_total_num_kv_heads``,
``get_num_hidden_layers``, ``get_head_size``, ``derive_max_model_len_and_key``; what
``ModelConfig.get_total_num_kv_heads`` / ``get_num_layers`` return) and ``_get_and_verify_max_len``
(the default ``max_model_len``, and whether an explicit one is accepted). Also: Nemotron-H's float32
SSM-state default (``MODELS_CONFIG_MAP`` -> ``NemotronHForCausalLMConfig``) and pydantic's lax int
vs ``tqlab.vllm.flags.lax_int``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tqlab.vllm.flags import VllmArgsError, lax_int
from tqlab.vllm.hf_config import read_hf_config

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072, "vocab_size": 128256}
CHATGLM = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": 28, "hidden_size": 4096,
           "num_attention_heads": 32, "multi_query_attention": True, "multi_query_group_num": 2, "seq_length": 32768,
           "kv_channels": 128, "padded_vocab_size": 65024}
FALCON = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
          "num_hidden_layers": 32, "multi_query": True, "new_decoder_architecture": False}
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "vocab_size": 32064,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}

CASES = {  # name: (config.json, hf_overrides or None)
    "llama": (LLAMA, None),
    "chatglm": (CHATGLM, None),
    "chatglm-no-groups": ({k: v for k, v in CHATGLM.items() if k != "multi_query_group_num"}, None),
    "chatglm-override-layers": (CHATGLM, {"num_hidden_layers": 4}),
    "falcon-7b": (FALCON, None),
    "falcon-40b": ({**FALCON, "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                    "num_kv_heads": 8, "new_decoder_architecture": True}, None),
    "falcon-n_head_kv": ({**FALCON, "hidden_size": 8192, "num_attention_heads": 128, "n_head_kv": 8,
                          "new_decoder_architecture": True}, None),
    "falcon-no-multi-query": ({**FALCON, "multi_query": False}, None),
    "refinedweb-40b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb", "hidden_size": 8192,
                        "n_head": 128, "n_head_kv": 8, "n_layer": 60}, None),
    "refinedweb-7b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel", "hidden_size": 4544,
                       "n_head": 71, "n_layer": 32, "multi_query": True}, None),
    "command-r": ({"architectures": ["CohereForCausalLM"], "model_type": "cohere", "hidden_size": 8192,
                   "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 40,
                   "max_position_embeddings": 8192, "model_max_length": 131072, "vocab_size": 256000}, None),
    "phi-3-128k-longrope": (PHI3, None),
    "rope-dynamic-x4": ({**LLAMA, "max_position_embeddings": 8192,
                         "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, None),
    "rope-yarn-x4": ({**LLAMA, "max_position_embeddings": 32768,
                      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}},
                     None),
    "rope-llama3": ({**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
                    None),
    "override-kv-heads": (LLAMA, {"num_key_value_heads": 4}),
    "override-max-position": (LLAMA, {"max_position_embeddings": 8192}),
    "override-rope-dict": ({**LLAMA, "max_position_embeddings": 8192},
                           {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
}
LENGTHS = (2048, 4096, 8192, 16384, 32768, 131072, 131073, 262144)


def _write(tmp_path, cfg) -> str:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def vllm_reads(path: str, overrides: dict | None) -> dict:
    """What vLLM 0.33 derives from the config.json in ``path`` (with ``--hf-overrides`` ``overrides``)."""
    import vllm.config  # noqa: F401  (vLLM's own import order: config before transformers_utils)
    from vllm.config.model import ModelConfig, _get_and_verify_max_len
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    overrides = overrides or {}
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in overrides.items() if isinstance(v, dict)}
    hf = get_config(path, trust_remote_code=False, hf_overrides_kw=flat or None)
    if nested:  # ModelConfig._apply_dict_overrides on a stand-in self (it only calls _update_nested)
        me = SimpleNamespace()
        me._update_nested = lambda target, upd: ModelConfig._update_nested(me, target, upd)
        ModelConfig._apply_dict_overrides(me, hf, nested)
    text = get_hf_text_config(hf)
    arch = MODEL_ARCH_CONFIG_CONVERTORS.get(hf.model_type, ModelArchConfigConvertorBase)(hf, text).convert()

    def accepted(n: int) -> bool:
        try:
            _get_and_verify_max_len(text, arch, None, n, False, None)
        except ValueError:
            return False
        return True

    return {"kv_heads": arch.total_num_kv_heads, "layers": arch.total_num_hidden_layers, "head_dim": arch.head_size,
            "default_max_model_len": _get_and_verify_max_len(text, arch, None, None, False, None),
            "accepted": [n for n in LENGTHS if accepted(n)]}


def tqlab_reads(path: str, overrides: dict | None) -> dict:
    s = read_hf_config(path, hf_overrides=overrides)
    ok = [n for n in LENGTHS if s.max_len_key is None or n <= s.longest_max_model_len
          or (s.model_max_length is not None and n <= s.model_max_length)]
    return {"kv_heads": s.num_key_value_heads, "layers": s.num_hidden_layers, "head_dim": s.head_dim,
            "default_max_model_len": s.max_len, "accepted": ok}


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_readers_equal_vllms(name, tmp_path, monkeypatch, record):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    cfg, overrides = CASES[name]
    path = _write(tmp_path, cfg)
    theirs, ours = vllm_reads(path, overrides), tqlab_reads(path, overrides)
    record("vllm", theirs)
    assert ours == theirs


def test_nemotron_h_float32_ssm_default_is_keyed_on_the_architecture():
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, NemotronHForCausalLMConfig

    base = {"num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 6,
            "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4}
    kinds = {"M": "mamba", "*": "attention", "E": "moe"}
    for arch in ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "SomeMamba2Hybrid"):
        for spelling in ({"hybrid_override_pattern": "M*EM*E"}, {"layers_block_type": [kinds[c] for c in "M*EM*E"]}):
            cfg = {"architectures": [arch], **base, **spelling}
            cache = SimpleNamespace(mamba_ssm_cache_dtype="auto")
            if MODELS_CONFIG_MAP.get(arch) is NemotronHForCausalLMConfig:
                NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache,
                                                                        hf_config=SimpleNamespace(**cfg))
            want = None if cache.mamba_ssm_cache_dtype == "auto" else cache.mamba_ssm_cache_dtype
            assert read_hf_config(cfg).mamba.ssm_dtype == want, (arch, spelling)


LAX = [3, 3.0, "3", " 3 ", "+3", "-3", "1_000", "3.0", True, False, 2.5, "3.5", "x", "1k", "1e3", "0x10", "", None,
       [1], float("inf"), float("nan"), "1__0", "_1", "1_", "٣", 2**70]


def test_lax_int_equals_pydantics_lax_int():
    from pydantic import TypeAdapter, ValidationError

    ta = TypeAdapter(int)
    for v in LAX:
        try:
            want = ta.validate_python(v)
        except ValidationError:
            want = "error"
        try:
            got = lax_int(v, "x")
        except VllmArgsError:
            got = "error"
        assert got == want, v
