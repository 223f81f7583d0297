"""Deployments read as vLLM 0.33 reads them (issue 22): pasted command lines, vLLM's value coercion,
human-readable sizes, config readers per model family, --hf-overrides."""

from __future__ import annotations

import json

import pytest

from tqlab.vllm.deployment import _given, _map_flags, deployment_from_vllm
from tqlab.vllm.flags import ENV_KEY, VllmArgsError, lax_int, parse_serve_args, split_serve_line

DENSE = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 8,
         "max_position_embeddings": 8192}


# --------------------------------------------------------------------------- #
# Pastes: continuations and NAME=value prefixes                               #
# --------------------------------------------------------------------------- #

MULTI = """vllm serve meta-llama/Llama-3.1-8B-Instruct \\
    --max-model-len 8k \\
    --kv-cache-dtype turboquant_4bit_nc \\
    -tp 2
"""


def test_multi_line_paste_with_backslash_continuations():
    given, _ = parse_serve_args(MULTI)
    assert given == {"model_tag": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 8000,
                     "kv_cache_dtype": "turboquant_4bit_nc", "tensor_parallel_size": 2}
    assert parse_serve_args(MULTI.replace("\n", "\r\n"))[0] == given  # a paste from Windows


def test_env_prefix_allow_long_max_model_len_applies_as_in_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    line = "vllm serve M --max-model-len 16384"
    with pytest.raises(VllmArgsError, match="greater than the derived max_model_len"):
        deployment_from_vllm(line, DENSE)
    d = deployment_from_vllm("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " + line, DENSE)
    assert d.config.max_model_len == 16384
    assert any(n.startswith("environment VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: applied") for n in d.notes)
    # vllm/envs.py: "true" in any case counts, "0" does not; the line's prefix beats the process environment
    assert deployment_from_vllm("env VLLM_ALLOW_LONG_MAX_MODEL_LEN=True " + line, DENSE).config.max_model_len == 16384
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with pytest.raises(VllmArgsError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        deployment_from_vllm("VLLM_ALLOW_LONG_MAX_MODEL_LEN=0 " + line, DENSE)


def test_cuda_visible_devices_is_noted_not_refused():
    given, notes = parse_serve_args("CUDA_VISIBLE_DEVICES=0,1 HF_HOME=/x vllm serve M -tp 2")
    assert given == {"model_tag": "M", "tensor_parallel_size": 2, ENV_KEY: {"CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": "/x"}}
    assert notes[0].startswith("environment CUDA_VISIBLE_DEVICES=0,1: which GPUs the process sees")
    assert notes[1] == "environment HF_HOME=/x: not read by tqlab; no effect on the workspace in tqlab's model"
    d = deployment_from_vllm("CUDA_VISIBLE_DEVICES=0,1 vllm serve M -tp 2", DENSE)
    assert d.config.tensor_parallel_size == 2 and not any("--env" in n for n in d.notes)


def test_split_serve_line_keeps_quoted_json_and_refuses_bad_quotes():
    argv, env, _ = split_serve_line("A=1 vllm serve M \\\n --hf-overrides '{\"a\": \"x=1\"}'")
    assert (argv, env) == (["vllm", "serve", "M", "--hf-overrides", '{"a": "x=1"}'], {"A": "1"})
    with pytest.raises(VllmArgsError, match="No closing quotation"):
        split_serve_line("vllm serve M --hf-overrides '{")


# --------------------------------------------------------------------------- #
# vLLM's config classes coerce values (pydantic lax mode)                     #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("value, want", [(3, 3), (3.0, 3), ("3", 3), (" 3 ", 3), ("+3", 3), ("1_000", 1000),
                                         ("3.0", 3), (True, 1), (-2, -2)])
def test_lax_int_accepts_what_pydantic_accepts(value, want):
    assert lax_int(value, "x") == want


@pytest.mark.parametrize("value", [2.5, "3.5", "x", "1k", "1e3", "0x10", "", float("inf"), None, [1], "1__0"])
def test_lax_int_refuses_what_pydantic_refuses(value):
    with pytest.raises(VllmArgsError, match=r"^x must be an integer, got "):
        lax_int(value, "x")


@pytest.mark.parametrize("line", [
    "vllm serve M -cc.cudagraph_capture_sizes+ 1,2,4",
    "vllm serve M -cc.cudagraph_capture_sizes '[1, 2.0, 4]'",
    """vllm serve M -cc '{"cudagraph_capture_sizes": ["1", "2", "4"]}'""",
    "vllm serve M -cc.cudagraph_capture_sizes+=1,2 -cc.cudagraph_capture_sizes+ 4",  # appended (recursive_dict_update)
])
def test_capture_size_lists_are_coerced_as_vllm_does(line):
    kw = _map_flags(_given(line)[0])[0]
    assert kw["cudagraph_capture_sizes"] == (1, 2, 4)


def test_two_spellings_of_one_dict_flag_are_two_flags_the_last_wins():
    # FlexibleArgumentParser collects dotted args per spelling ("--compilation-config", "-cc") and appends
    # each as its own flag; argparse keeps the last
    kw = _map_flags(_given("vllm serve M --compilation-config.cudagraph_capture_sizes+=1,2 -cc.cudagraph_capture_sizes+ 4")[0])[0]
    assert kw["cudagraph_capture_sizes"] == (4,)


def test_speculative_tokens_as_a_string_and_bad_list_entries():
    kw = _map_flags(_given("""vllm serve M --speculative-config '{"num_speculative_tokens": "3"}'""")[0])[0]
    assert kw["num_speculative_tokens"] == 3
    with pytest.raises(VllmArgsError, match=r"^cudagraph_capture_sizes\[1\] must be an integer, got 2.5$"):
        _map_flags(_given("vllm serve M -cc.cudagraph_capture_sizes '[1, 2.5]'")[0])
    with pytest.raises(VllmArgsError, match=r"^cudagraph_capture_sizes\[0\] must be an integer, got 'x'$"):
        _map_flags(_given("vllm serve M -cc.cudagraph_capture_sizes+ x,2")[0])


# --------------------------------------------------------------------------- #
# config.json: nesting, Nemotron-H spelled two ways                           #
# --------------------------------------------------------------------------- #

NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 2,
              "head_dim": 128, "num_hidden_layers": 24, "hybrid_override_pattern": "M*E" * 8, "mamba_num_heads": 128,
              "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
              "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
NEMOTRON_LINE = "vllm serve M -tp 8 --max-num-seqs 4 --max-model-len 131072 --kv-cache-dtype turboquant_3bit_nc"


def test_config_nested_100000_levels_is_one_line(tmp_path):
    from tqlab.vllm.hf_config import HFConfigError, read_hf_config

    p = tmp_path / "config.json"
    p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(HFConfigError, match=r"config.json: nested too deeply to read \(more than about \d+ levels"):
        read_hf_config(p)


def test_deep_json_in_a_flag_is_one_line():
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    with pytest.raises(VllmArgsError, match=r"^vllm serve: argument --hf-overrides: JSON nested too deeply to read: "):
        parse_serve_args(["vllm", "serve", "M", "--hf-overrides", deep])
    with pytest.raises(VllmArgsError, match=r"^vllm serve: argument -cc.x: JSON nested too deeply to read: "):
        parse_serve_args(["vllm", "serve", "M", "-cc.x", deep])


def _layers_block_type(cfg):
    kinds = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
    out = {k: v for k, v in cfg.items() if k != "hybrid_override_pattern"}
    return {**out, "layers_block_type": [kinds[c] for c in cfg["hybrid_override_pattern"]]}


def test_nemotron_h_block_does_not_depend_on_how_the_pattern_is_spelled():
    # Mamba2 page at TP 8: 3 x 1280 bf16 conv + 16 x 64 x 128 fp32 SSM = 531,968 B over 102 B per token -> 5216
    a = deployment_from_vllm(NEMOTRON_LINE, NEMOTRON_H)
    b = deployment_from_vllm(NEMOTRON_LINE, _layers_block_type(NEMOTRON_H))
    assert a.config.block_size == b.config.block_size == 5216
    assert a.model.mamba == b.model.mamba and a.model.mamba.ssm_dtype == "float32"
    assert a.model.attention_layers == b.model.attention_layers == tuple(range(1, 24, 3))


def test_float32_ssm_default_is_keyed_on_the_architecture():
    # vLLM's MODELS_CONFIG_MAP: only Nemotron-H architectures get the float32 default; another Mamba2 hybrid
    # keeps the model dtype: 3 x 1280 bf16 conv + 16 x 64 x 128 bf16 SSM = 269,824 B -> 2656
    other = {**NEMOTRON_H, "architectures": ["SomeMamba2Hybrid"]}
    assert deployment_from_vllm(NEMOTRON_LINE, other).config.block_size == 2656
    assert deployment_from_vllm(NEMOTRON_LINE, _layers_block_type(other)).config.block_size == 2656
    fp16 = {**_layers_block_type(NEMOTRON_H), "mamba_ssm_cache_dtype": "float16"}
    assert deployment_from_vllm(NEMOTRON_LINE, fp16).model.mamba.ssm_dtype == "float16"
