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
