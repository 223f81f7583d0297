"""Hostile-pass findings (issue 33, helper hostile2): each answer checked against vLLM 0.33's code."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tqlab.cli import app

LLAMA = "llama-3.1-8b"
TQ = ("--kv-cache-dtype", "turboquant_4bit_nc")


def _plan(*args):
    r = CliRunner().invoke(app, ["plan", "--json", "-", *args])
    return r.exit_code, json.loads(r.output)


# --------------------------------------------------------------------------- max_model_len 1 and 2


def test_max_model_len_1_serves_no_request_so_no_busy_server_crash():
    # v1/engine/input_processor.py _validate_prompt_len rejects a generate prompt of max_model_len tokens: at 1
    # every prompt (>= 1 token) is rejected, so no batch ever runs after the lock
    code, j = _plan("--preset", LLAMA, *TQ, "--max-model-len", "1")
    assert (code, j["verdict"], j["first_refused_call"]) == (0, "ok", None)
    assert j["locked_bytes"] == 274_792_448


def test_max_model_len_2_crashes_on_513_one_token_prompts_not_on_a_decode_step():
    # every prompt is 1 token; turboquant_attn.py builds is_prefill = max_query_len > 1, so a step of 513 one-token
    # prompts (max_num_seqs 1024, captures stop at 512) takes _decode_attention eagerly at 513 rows
    code, j = _plan("--preset", LLAMA, *TQ, "--max-model-len", "2")
    call = j["first_refused_call"]
    assert (code, j["verdict"], call["caller"], call["required_bytes"]) == (3, "crash", "_decode_attention",
                                                                          275_329_280)
    assert call["schedule"].startswith("busy server: 513 one-token prompts in one step")


# --------------------------------------------------------------------------- attention-free class, TurboQuant cache


def test_turboquant_cache_on_an_attention_free_class_has_no_turboquant_consumer():
    # MambaForCausalLM (IsAttentionFree) builds no Attention layer, so the selector never picks TurboQuant's backend;
    # create_engine_config accepts the dtype (get_boundary_skip_layers refuses only a hybrid without attention)
    from tqlab.core.config import EngineConfig
    from tqlab.core.consumers.registry import turboquant_active

    base = EngineConfig.from_preset(LLAMA, kv_cache_dtype="turboquant_4bit_nc")
    assert turboquant_active(base) and turboquant_active(base.replace(architecture="LlamaForCausalLM"))
    assert not turboquant_active(base.replace(architecture="MambaForCausalLM"))
    code, j = _plan("--preset", LLAMA, *TQ, "--architecture", "MambaForCausalLM")
    assert (code, j["verdict"], j["locked_bytes"], j["turboquant_consumers"], j["first_refused_call"]) == (
        0, "ok", 0, False, None)


# --------------------------------------------------------------------------- encoder-only class, TurboQuant cache


def test_turboquant_cache_on_an_encoder_only_class_is_refused_by_the_selector():
    # bert.py builds EncoderOnlyAttention: get_attn_backend(attn_type=ENCODER_ONLY); TurboQuantAttentionBackend's
    # supports_attn_type is DECODER only and every other backend refuses the TurboQuant cache dtype
    code, j = _plan("--preset", LLAMA, *TQ, "--architecture", "BertModel")
    assert (code, j["verdict"], j["refusal"]["source"]) == (5, "refused",
                                                           "vllm/platforms/cuda.py:CudaPlatformBase.get_attn_backend_cls")
    assert j["refusal"]["reason"].endswith(
        "FLEX_ATTENTION: [kv_cache_dtype not supported], "
        "TURBOQUANT: [attention type AttentionType.ENCODER_ONLY not supported]}.")
    assert "attn_type=AttentionType.ENCODER_ONLY" in j["refusal"]["reason"]
    code, j = _plan("--preset", LLAMA, "--kv-cache-dtype", "auto", "--architecture", "BertModel")
    assert (code, j["verdict"], j["refusal"]) == (0, "ok", None)  # FLASH_ATTN supports ENCODER_ONLY


def test_flashinfer_pinned_on_an_encoder_only_class_is_refused():
    from tqlab.core.consumers.backends import SelectorConfig, validate_configuration

    s = SelectorConfig(128, "bfloat16", "auto", attn_type="encoder_only")
    assert validate_configuration("FLASHINFER", s, (9, 0)) == ["attention type AttentionType.ENCODER_ONLY not supported"]
    assert validate_configuration("FLASH_ATTN", s, (9, 0)) == []
    assert validate_configuration("FLEX_ATTENTION", s, (9, 0)) == []


# --------------------------------------------------------------------------- architectures vLLM dropped


def test_previously_supported_architecture_is_refused_with_vllms_message():
    from tqlab.core.consumers.arch_table import previously_supported

    assert previously_supported("MPTForCausalLM") == "0.28.0" and previously_supported("LlamaForCausalLM") is None
    code, j = _plan("--preset", LLAMA, *TQ, "--architecture", "MPTForCausalLM")
    assert (code, j["verdict"], j["refusal"]) == (5, "refused", {
        "reason": "Model architecture MPTForCausalLM was supported in vLLM until v0.28.0, and is not supported anymore. "
                  "Please use an older version of vLLM if you want to use this model architecture.",
        "source": "vllm/model_executor/models/registry.py:_ModelRegistry._raise_for_unsupported"})


def test_previously_supported_architecture_with_custom_code_is_not_refused_by_name():
    # _try_resolve_transformers loads an auto_map AutoModel class before _raise_for_unsupported is reached
    from tqlab.vllm.validation import startup_facts

    assert startup_facts({}, {"auto_map": {"AutoModelForCausalLM": "modeling_mpt.MPTForCausalLM"}}).auto_model
    assert not startup_facts({}, {"model_type": "mpt"}).auto_model
    from tqlab.core.config import EngineConfig
    from tqlab.vllm.validation import StartupFacts, startup_refusal

    mpt = EngineConfig.from_preset(LLAMA, architecture="MPTForCausalLM")
    assert startup_refusal(mpt, StartupFacts(auto_model=True)) is None
    assert startup_refusal(mpt, StartupFacts()).reason.startswith("Model architecture MPTForCausalLM was supported")


# --------------------------------------------------------------------------- keys the config classes do not take


def test_unknown_config_keys_and_speculative_method_are_a_one_line_usage_error():
    # EngineArgs builds CompilationConfig(**d) / AttentionConfig(**d) / SpeculativeConfig(**d): pydantic raises
    # "Unexpected keyword argument", and a method outside SpeculativeConfig.method's Literal a literal_error
    import pytest

    from tqlab.vllm.flags import VllmArgsError, parse_serve_args

    with pytest.raises(VllmArgsError) as e:
        parse_serve_args("vllm serve M -cc '{\"bogus_key\": 1}'")
    assert str(e.value) == ("vllm serve: --compilation-config: 'bogus_key' is not a field of CompilationConfig "
                            "(vLLM 0.33.0: Unexpected keyword argument)")
    with pytest.raises(VllmArgsError) as e:
        parse_serve_args("vllm serve M --attention-config.backnd FLASH_ATTN")
    assert str(e.value) == ("vllm serve: --attention-config: 'backnd' is not a field of AttentionConfig "
                            "(vLLM 0.33.0: Unexpected keyword argument); did you mean 'backend'?")
    with pytest.raises(VllmArgsError) as e:
        parse_serve_args("vllm serve M --speculative-config '{\"method\": \"bogus\", \"num_speculative_tokens\": 2}'")
    assert str(e.value).startswith("vllm serve: --speculative-config: method 'bogus' is not one of vLLM 0.33.0's: "
                                   "ngram, draft_model, suffix, custom_class, eagle, eagle3, ")
    given, _ = parse_serve_args("vllm serve M -cc '{\"cudagraph_mode\": \"FULL\"}' --attention-config.backend "
                                "FLASH_ATTN --speculative-config '{\"method\": \"eagle\", \"model\": \"d\", "
                                "\"num_speculative_tokens\": 2}'")
    assert (given["compilation_config"], given["attention_config"], given["speculative_config"]["method"]) == (
        {"cudagraph_mode": "FULL"}, {"backend": "FLASH_ATTN"}, "eagle")


def test_plan_on_an_attention_free_class_prints_no_kv_share():
    """A TurboQuant cache dtype on MambaForCausalLM has no layer to apply to: plan says so instead of a KV-pool share
    of TurboQuant layers the class never builds (the verdict is ok at a 0-byte lock)."""
    from click.testing import CliRunner

    from tqlab.cli import app

    r = CliRunner().invoke(app, ["plan", "--num-attention-heads", "32", "--num-key-value-heads", "8", "--head-dim", "128",
                                 "--architecture", "MambaForCausalLM", "--kv-cache-dtype", "turboquant_4bit_nc"])
    assert r.exit_code == 0, r.output
    assert ("workspace share of the KV cache: none (this model class builds no attention layer, so the TurboQuant "
            "cache dtype has no layer to apply to)") in " ".join(r.output.split())
    assert "verdict without the fix: ok" in r.output
