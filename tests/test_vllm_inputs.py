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


def test_env_prefix_read_as_off_by_vllm_is_not_noted_as_applied(monkeypatch):
    """vllm/envs.py reads ``yes`` (or ``0``) as off: the note says so (before: "applied" while nothing was)."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    for value in ("yes", "0", "on"):
        _, _, notes = split_serve_line(f"VLLM_ALLOW_LONG_MAX_MODEL_LEN={value} vllm serve M")
        assert notes == [f"environment VLLM_ALLOW_LONG_MAX_MODEL_LEN={value}: off (vllm/envs.py reads only 1 or "
                         "true, any case, as on)"]
    with pytest.raises(VllmArgsError, match="greater than the derived max_model_len"):
        deployment_from_vllm("VLLM_ALLOW_LONG_MAX_MODEL_LEN=yes vllm serve M --max-model-len 16384", DENSE)


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



@pytest.mark.parametrize("prompt", ["$", "#", "%", ">"])
def test_a_pasted_shell_prompt_is_dropped_with_a_note(prompt):
    given, notes = parse_serve_args(f"{prompt} vllm serve M --max-model-len 100")
    assert given == {"model_tag": "M", "max_model_len": 100}
    assert notes == [f"leading shell prompt {prompt!r} dropped"]
    argv, env, _ = split_serve_line(f"{prompt} A=1 vllm serve M")
    assert (argv, env) == (["vllm", "serve", "M"], {"A": "1"})


def test_words_before_the_launcher_get_the_launcher_hint_not_the_boolean_one():
    with pytest.raises(VllmArgsError) as e:
        parse_serve_args("sudo vllm serve M --max-model-len 100")
    assert str(e.value) == ("vllm serve: unrecognized arguments: vllm serve M (the line must start with 'vllm serve' "
                            "or the model; remove what comes before the launcher)")

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
    assert _map_flags(_given(line)[0]).get("cudagraph_capture_sizes") == (1, 2, 4)


def test_two_spellings_of_one_dict_flag_are_two_flags_the_last_wins():
    # FlexibleArgumentParser collects dotted args per spelling ("--compilation-config", "-cc") and appends
    # each as its own flag; argparse keeps the last
    d = _map_flags(_given("vllm serve M --compilation-config.cudagraph_capture_sizes+=1,2 -cc.cudagraph_capture_sizes+ 4")[0])
    assert d.get("cudagraph_capture_sizes") == (4,)


def test_speculative_tokens_as_a_string_and_bad_list_entries():
    d = _map_flags(_given("""vllm serve M --speculative-config '{"num_speculative_tokens": "3"}'""")[0])
    assert d.get("num_speculative_tokens") == 3
    cc = r"^--compilation-config \(-cc\) cudagraph_capture_sizes"
    with pytest.raises(VllmArgsError, match=cc + r"\[1\] must be an integer, got 2.5 \(in \[1, 2.5\]\)$"):
        _map_flags(_given("vllm serve M -cc.cudagraph_capture_sizes '[1, 2.5]'")[0])
    with pytest.raises(VllmArgsError, match=cc + r"\[0\] must be an integer, got 'x' \(in \['x', '2'\]\)$"):
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


# --------------------------------------------------------------------------- #
# Config readers per family (numbers checked against vLLM's own functions in   #
# parity/test_config_readers_parity.py)                                       #
# --------------------------------------------------------------------------- #

from tqlab.vllm.hf_config import HFConfigError, read_hf_config  # noqa: E402

FAMILIES = {  # name: (config.json, (KV heads, layers, head_dim, default max_model_len, longest --max-model-len))
    "chatglm3-6b": ({"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": 28, "hidden_size": 4096,
                     "num_attention_heads": 32, "multi_query_attention": True, "multi_query_group_num": 2,
                     "seq_length": 32768, "kv_channels": 128, "padded_vocab_size": 65024},
                    (2, 28, 128, 32768, 32768)),
    "falcon-7b": ({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544,
                   "num_attention_heads": 71, "num_hidden_layers": 32, "multi_query": True,
                   "new_decoder_architecture": False}, (1, 32, 64, 2048, 2048)),
    "falcon-40b": ({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 8192,
                    "num_attention_heads": 128, "num_hidden_layers": 60, "num_kv_heads": 8,
                    "new_decoder_architecture": True}, (8, 60, 64, 2048, 2048)),
    "falcon-40b-n_head_kv": ({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 8192,
                              "num_attention_heads": 128, "num_hidden_layers": 60, "n_head_kv": 8,
                              "new_decoder_architecture": True}, (8, 60, 64, 2048, 2048)),
    "refinedweb-40b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb", "hidden_size": 8192,
                        "n_head": 128, "n_head_kv": 8, "n_layer": 60}, (8, 60, 64, 2048, 2048)),
    "refinedweb-7b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel", "hidden_size": 4544,
                       "n_head": 71, "n_layer": 32, "multi_query": True}, (1, 32, 64, 2048, 2048)),
    "command-r": ({"architectures": ["CohereForCausalLM"], "model_type": "cohere", "hidden_size": 8192,
                   "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 40,
                   "max_position_embeddings": 8192, "model_max_length": 131072}, (64, 40, 128, 131072, 131072)),
    "phi-3-128k": ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
                    "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                    "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}},
                   (32, 32, 96, 4096, 131072)),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_readers_give_vllms_numbers(name):
    cfg, want = FAMILIES[name]
    s = read_hf_config(cfg)
    assert (s.num_key_value_heads, s.num_hidden_layers, s.head_dim, s.max_len, s.longest_max_model_len) == want


def test_family_sources_say_which_key_vllm_read():
    s = read_hf_config(FAMILIES["chatglm3-6b"][0])
    assert s.sources["num_key_value_heads"] == ("config.json multi_query_group_num (ChatGLM, vLLM ChatGLMConfig: "
                                                "n_head_kv is multi_query_group_num)")
    assert s.sources["num_hidden_layers"] == "config.json num_layers (ChatGLM, vLLM ChatGLMConfig: num_hidden_layers is num_layers)"
    s = read_hf_config(FAMILIES["falcon-7b"][0])
    assert s.sources["num_key_value_heads"].startswith("derived: Falcon multi_query without new_decoder_architecture")
    d = deployment_from_vllm("vllm serve M", FAMILIES["chatglm3-6b"][0])  # review finding: seq_length, not max_position_embeddings
    src = "config.json seq_length (ChatGLM, vLLM ChatGLMConfig: max_position_embeddings is seq_length)"
    assert d.sources["max_model_len"] == f"{src} (no --max-model-len)"
    assert d.notes[0] == f"max_model_len = 32768 from {src} (no --max-model-len)"
    assert deployment_from_vllm("vllm serve M", FAMILIES["falcon-7b"][0]).sources["max_model_len"] == (
        "Falcon, transformers FalconConfig default 2048 (max_position_embeddings not in config.json) (no --max-model-len)")
    chatglm_no_groups = {k: v for k, v in FAMILIES["chatglm3-6b"][0].items() if k != "multi_query_group_num"}
    assert read_hf_config(chatglm_no_groups).num_key_value_heads == 1  # ChatGLMConfig's default


def test_longrope_explicit_max_model_len_131072_is_accepted():
    cfg = FAMILIES["phi-3-128k"][0]
    assert deployment_from_vllm("vllm serve M", cfg).config.max_model_len == 4096
    assert deployment_from_vllm("vllm serve M --max-model-len 131072", cfg).config.max_model_len == 131072
    with pytest.raises(VllmArgsError, match=r"--max-model-len 131073 is greater than the derived max_model_len "
                                            r"\(max_position_embeddings=131072 or model_max_length=None"):
        deployment_from_vllm("vllm serve M --max-model-len 131073", cfg)


def test_command_r_model_max_length_is_the_derived_length():
    d = deployment_from_vllm("vllm serve M", FAMILIES["command-r"][0])
    assert d.config.max_model_len == 131072
    assert d.sources["max_model_len"] == "config.json model_max_length (no --max-model-len)"


# --------------------------------------------------------------------------- #
# --hf-overrides                                                              #
# --------------------------------------------------------------------------- #

LONG = {**DENSE, "max_position_embeddings": 131072}


def _continuation_bytes(config):
    from tqlab.core.reservation import reservation_plan
    from tqlab.core.workspace import compute_layout

    return compute_layout(reservation_plan(config)[1]).total_bytes


@pytest.mark.parametrize("flag", ["""--hf-overrides '{"num_key_value_heads": 4}'""", "--hf-overrides.num_key_value_heads 4"])
def test_hf_overrides_kv_heads_halve_the_continuation_buffers(flag):
    line = "vllm serve M --kv-cache-dtype turboquant_4bit_nc --max-model-len 8192"
    base, over = deployment_from_vllm(line, DENSE), deployment_from_vllm(f"{line} {flag}", DENSE)
    assert (base.config.num_key_value_heads, over.config.num_key_value_heads) == (8, 4)
    assert _continuation_bytes(base.config) == 2 * _continuation_bytes(over.config)
    assert over.sources["num_key_value_heads"] == "flag --hf-overrides num_key_value_heads"
    assert "--hf-overrides" not in " ".join(n for n in over.notes if n.startswith("vLLM flags with no effect"))


def test_hf_overrides_max_position_embeddings_is_the_derived_max_model_len():
    d = deployment_from_vllm("""vllm serve M --hf-overrides '{"max_position_embeddings": 8192}'""", LONG)
    assert d.config.max_model_len == 8192
    # dotted values take vLLM's human-readable numbers: 8k = 8000
    with pytest.raises(VllmArgsError, match=r"--max-model-len 16000 is greater than the derived max_model_len "
                                            r"\(max_position_embeddings=8000 "):
        deployment_from_vllm("""vllm serve M --max-model-len 16k --hf-overrides.max_position_embeddings 8k""", LONG)


def test_hf_overrides_nested_text_config_and_the_top_level_note():
    mm = {"architectures": ["X"], "text_config": DENSE, "vision_config": {"hidden_size": 1}}
    d = deployment_from_vllm("vllm serve M --hf-overrides.text_config.num_key_value_heads 2", mm)
    assert d.config.num_key_value_heads == 2
    d = deployment_from_vllm("""vllm serve M --hf-overrides '{"num_key_value_heads": 2}'""", mm)
    assert d.config.num_key_value_heads == 8  # vLLM sets it on the top level, which the text model does not read
    assert any("set on the top-level config as vLLM does" in n for n in d.notes)


def test_hf_overrides_attribute_map_and_bad_values_name_the_flag():
    glm = FAMILIES["chatglm3-6b"][0]
    assert read_hf_config(glm, hf_overrides={"num_hidden_layers": 4}).num_hidden_layers == 4  # -> num_layers
    with pytest.raises(HFConfigError, match=r"^--hf-overrides num_key_value_heads must be >= 1, got 0$"):
        read_hf_config(DENSE, hf_overrides={"num_key_value_heads": 0})
    with pytest.raises(ValueError, match=r"^--hf-overrides must be a JSON object"):
        deployment_from_vllm("vllm serve M --hf-overrides abc", DENSE)


# --------------------------------------------------------------------------- #
# Errors name the flag or file the value came from                            #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"])
def test_vllm_kv_cache_dtypes_are_read_not_refused(dtype):
    d = deployment_from_vllm(f"vllm serve M --kv-cache-dtype {dtype}", DENSE)
    assert d.config.kv_cache_dtype == dtype and d.sources["kv_cache_dtype"] == "flag --kv-cache-dtype"


@pytest.mark.parametrize("flag, msg", [
    ("--max-num-batched-tokens 0", "--max-num-batched-tokens must be >= 1 (vLLM SchedulerConfig: Field(ge=1)), got 0"),
    ("--max-num-seqs 0", "--max-num-seqs must be >= 1 (vLLM SchedulerConfig: Field(ge=1)), got 0"),
    ("--block-size 0", "--block-size must be >= 1 (vLLM CacheConfig: Field(gt=0)), got 0"),
    ("-tp 0", "--tensor-parallel-size must be >= 1 (vLLM ParallelConfig: Field(ge=1)), got 0"),
])
def test_flag_below_vllms_minimum_names_the_flag(flag, msg):
    with pytest.raises(VllmArgsError) as e:
        deployment_from_vllm(f"vllm serve M {flag}", DENSE)
    assert str(e.value) == msg


def test_engine_config_errors_name_each_fields_source(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(DENSE))
    with pytest.raises(ValueError) as e:
        deployment_from_vllm("vllm serve M -tp 3", p)
    assert str(e.value) == (f"{p}: num_attention_heads (32) must be divisible by tensor_parallel_size (3) "
                            "(num_attention_heads: config.json num_attention_heads; "
                            "tensor_parallel_size: flag --tensor-parallel-size)")
    with pytest.raises(ValueError) as e:
        deployment_from_vllm("vllm serve M --max-num-batched-tokens 100 --max-num-seqs 200", p)
    assert str(e.value) == ("max_num_batched_tokens (100) must be >= max_num_seqs (200) "
                            "(max_num_batched_tokens: flag --max-num-batched-tokens; max_num_seqs: flag --max-num-seqs)")


def test_hf_overrides_on_a_preset_set_its_model_fields():
    from tqlab.vllm.deployment import deployment_from_preset

    d = deployment_from_preset("""vllm serve M --hf-overrides '{"num_key_value_heads": 4, "max_position_embeddings": 8192}'""",
                               "llama-3.1-8b")
    assert (d.config.num_key_value_heads, d.sources["num_key_value_heads"]) == (4, "flag --hf-overrides num_key_value_heads")
    assert any(n.startswith("--hf-overrides max_position_embeddings: a preset has no config.json") for n in d.notes)
    assert not any("no effect on the workspace" in n and "--hf-overrides" in n for n in d.notes)
    with pytest.raises(VllmArgsError, match=r"^--hf-overrides num_key_value_heads must be an integer >= 1, got '4'$"):
        deployment_from_preset("vllm serve M --hf-overrides.num_key_value_heads '\"4\"'", "llama-3.1-8b")
