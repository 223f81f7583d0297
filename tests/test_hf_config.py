"""tqlab.vllm.hf_config: the one validated reader of a model's config.json (issue 14, issue 11 section 4)."""

from __future__ import annotations

import json

import pytest

from tqlab.vllm.hf_config import HFConfigError, read_hf_config

BASE = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 4,
        "max_position_embeddings": 8192}


def _write(tmp_path, text: str):
    p = tmp_path / "config.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, msg", [
    ("", "not valid JSON (Expecting value at line 1 column 1)"),
    ('{"num_attention_heads": 32, ', "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 29)"),
    ("null", "the top level must be a JSON object, got NoneType None"),
    ("[1, 2]", "the top level must be a JSON object, got list [1, 2]"),
    ('"config"', "the top level must be a JSON object, got str 'config'"),
])
def test_unreadable_files_name_the_file(tmp_path, text, msg):
    p = _write(tmp_path, text)
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == f"{p}: {msg}"


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(HFConfigError, match="no such file"):
        read_hf_config(tmp_path / "nope.json")
    _write(tmp_path, json.dumps(BASE))
    assert read_hf_config(tmp_path).num_attention_heads == 32  # a folder means its config.json


@pytest.mark.parametrize("change, msg", [
    ({"num_attention_heads": None}, "num_attention_heads is null"),
    ({"num_attention_heads": 0}, "num_attention_heads must be >= 1, got 0"),
    ({"num_attention_heads": 32.7}, "num_attention_heads must be an integer, got 32.7"),
    ({"num_attention_heads": "32"}, "num_attention_heads must be an integer, got '32'"),
    ({"num_attention_heads": True}, "num_attention_heads must be an integer, got True"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be >= 1, got 0"),
    ({"head_dim": -128}, "head_dim must be >= 1, got -128"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers must be an integer, got 2.5"),
])
def test_bad_fields_are_errors_not_repairs(tmp_path, change, msg):
    p = _write(tmp_path, json.dumps({**BASE, **change}))
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == f"{p}: {msg}"


def test_max_position_embeddings_1e400_is_inf_and_an_error(tmp_path):
    p = _write(tmp_path, json.dumps(BASE).replace("8192", "1e400"))
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == f"{p}: max_position_embeddings must be a finite positive integer, got inf"


def test_missing_heads_and_zero_heads_with_hidden_size():
    with pytest.raises(HFConfigError, match="num_attention_heads is missing or null"):
        read_hf_config({"hidden_size": 10})
    # heads 0 with hidden_size: an error before any division (was ZeroDivisionError)
    with pytest.raises(HFConfigError, match="num_attention_heads must be >= 1, got 0"):
        read_hf_config({"num_attention_heads": 0, "hidden_size": 4096})
    with pytest.raises(HFConfigError, match="hidden_size \\(4000\\) is not divisible by num_attention_heads \\(48\\)"):
        read_hf_config({"num_attention_heads": 48, "hidden_size": 4000})
    with pytest.raises(HFConfigError, match="has neither head_dim nor hidden_size"):
        read_hf_config({"num_attention_heads": 8})


def test_defaults_and_derivations_with_sources():
    s = read_hf_config({"num_attention_heads": 16, "hidden_size": 2048, "seq_length": 4096, "max_position_embeddings": 32768})
    assert (s.num_key_value_heads, s.head_dim, s.max_len, s.max_len_key) == (16, 128, 4096, "seq_length")
    assert s.sources["head_dim"] == "derived: hidden_size // num_attention_heads = 2048 // 16 = 128"
    assert s.sources["num_key_value_heads"].startswith("derived: no num_key_value_heads")
    assert read_hf_config({"num_attention_heads": 4, "head_dim": 64}).max_len == 2048  # vLLM's fallback


def test_rope_scaling_factor_as_vllm():
    s = read_hf_config({**BASE, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})
    assert (s.max_len, s.max_len_key) == (32768, "max_position_embeddings x rope factor 4.0")
    assert read_hf_config({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}).max_len == 8192
    s = read_hf_config({**BASE, "rope_scaling": {"type": "longrope"}, "original_max_position_embeddings": 4096})
    assert (s.max_len, s.max_len_key) == (4096, "original_max_position_embeddings")


def test_text_config_nesting():
    s = read_hf_config({"architectures": ["X"], "text_config": {**BASE, "num_key_value_heads": 4}, "vision_config": {}})
    assert (s.num_key_value_heads, s.sources["num_key_value_heads"]) == (4, "config.json text_config.num_key_value_heads")
    with pytest.raises(HFConfigError, match="text_config.num_attention_heads must be an integer, got 32.7"):
        read_hf_config({"text_config": {**BASE, "num_attention_heads": 32.7}})
    with pytest.raises(HFConfigError, match="text_config must be an object, got 3"):
        read_hf_config({"text_config": 3})


# --------------------------------------------------------------------------- #
# Hybrid models (issue 11 section 4)                                          #
# --------------------------------------------------------------------------- #


def test_full_attention_interval_64_layers_interval_4():
    s = read_hf_config({"text_config": {**BASE, "num_hidden_layers": 64, "full_attention_interval": 4}})
    assert s.attention_layers == tuple(range(3, 64, 4)) and s.num_attention_layers == 16
    assert s.attention_layers[:3] == (3, 7, 11) and s.attention_layers[-1] == 63
    assert s.hybrid == "full_attention_interval"


def test_layer_types_counts_vllm_attention_types():
    types = ["linear_attention"] * 3 + ["full_attention"]
    s = read_hf_config({**BASE, "num_hidden_layers": 8, "layer_types": types * 2})
    assert (s.attention_layers, s.hybrid) == ((3, 7), "layer_types")
    # all attention (Gemma's sliding/full mix): not hybrid, every layer has a KV cache
    s = read_hf_config({**BASE, "layer_types": ["sliding_attention", "full_attention"] * 2})
    assert (s.num_attention_layers, s.hybrid) == (4, None)


def test_layer_types_without_attention_is_an_error_not_all_layers():
    with pytest.raises(HFConfigError, match="layer_types marks no attention layer: no TurboQuant workspace consumer"):
        read_hf_config({**BASE, "layer_types": ["linear_attention"] * 4})
    with pytest.raises(HFConfigError, match="layer_types has 3 entries but num_hidden_layers is 4"):
        read_hf_config({**BASE, "layer_types": ["full_attention"] * 3})
    with pytest.raises(HFConfigError, match="layer_types must be a list of strings"):
        read_hf_config({**BASE, "layer_types": "full_attention"})


def test_nemotron_h_pattern_jamba_period_and_explicit_indices():
    s = read_hf_config({**BASE, "num_hidden_layers": 9, "hybrid_override_pattern": "M-M*EM*-M"})
    assert (s.attention_layers, s.hybrid) == ((3, 6), "hybrid_override_pattern")
    with pytest.raises(HFConfigError, match="hybrid_override_pattern must be a string of"):
        read_hf_config({**BASE, "hybrid_override_pattern": "MX*"})
    s = read_hf_config({**BASE, "num_hidden_layers": 16, "attn_layer_period": 8, "attn_layer_offset": 4})
    assert s.attention_layers == (4, 12)
    assert read_hf_config({**BASE, "attn_layer_indices": [2, 0]}).attention_layers == (0, 2)
    with pytest.raises(HFConfigError, match="attention_layer_indices must be a list of layer indices in \\[0, 4\\)"):
        read_hf_config({**BASE, "attention_layer_indices": [4]})
    s = read_hf_config({**BASE, "layers_block_type": ["mamba", "attention", "mamba", "mamba"]})
    assert s.attention_layers == (1,)


def test_a_bad_mla_field_names_the_file_once(tmp_path):
    from tqlab.vllm.hf_config import HFConfigError

    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(model_type="deepseek_v3", hidden_size=7168, num_attention_heads=128,
                                 kv_lora_rank="x", qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)))
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == f"{p}: kv_lora_rank must be an integer, got 'x'"


def test_an_explicit_null_rope_dim_is_refused_not_read_as_zero(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(model_type="deepseek_v3", hidden_size=7168, num_attention_heads=128, kv_lora_rank=512,
                                 qk_rope_head_dim=None, qk_nope_head_dim=128, v_head_dim=128)))
    with pytest.raises(HFConfigError, match="qk_rope_head_dim must be an integer >= 0, got null"):
        read_hf_config(p)


def test_num_hidden_layers_beyond_any_model_is_one_line_not_a_memory_error(tmp_path):
    """Hostile pass (wave 2): 10**12 layers listed one by one raised ``MemoryError``; now one line naming the file."""
    p = _write(tmp_path, json.dumps({**BASE, "num_hidden_layers": 10**12}))
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == (f"{p}: num_hidden_layers is 1,000,000,000,000: more layers than tqlab reads "
                            "(at most 1,000,000; the largest public models have a few hundred)")


@pytest.mark.parametrize("archs, arch", [
    (["FooBarForCausalLM", "LlamaForCausalLM"], "LlamaForCausalLM"),  # vLLM loops: the first the registry holds
    ("LlamaForCausalLM", "LlamaForCausalLM"),  # a lone string is a list of one (inspect_model_cls)
    (["FooBarForCausalLM"], "FooBarForCausalLM"),  # none registered: the first (the Transformers fallback's)
    ([3], None),
])
def test_the_architecture_is_the_one_vllms_registry_serves(archs, arch):
    assert read_hf_config({**BASE, "architectures": archs}).architecture == arch


def test_expert_fields_on_a_class_without_fused_moe_are_not_read():
    """``LlamaForCausalLM`` builds no fused MoE: its config.json's ``num_local_experts`` neither makes MoE nor
    makes ``intermediate_size`` required (hostile pass, wave 2: "intermediate_size is missing or null")."""
    llama = {**BASE, "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_local_experts": 8,
             "num_experts_per_tok": 2}
    assert read_hf_config(llama).moe is None
    mixtral = {**llama, "architectures": ["MixtralForCausalLM"], "intermediate_size": 14336}
    assert read_hf_config(mixtral).moe.num_experts == 8
