"""Never a silent "ok" (issue 30): the consumers a deployment reaches come from vLLM 0.33's model code
(``data/vllm_0_33_arch_consumers.json``, ``parity/gen_arch_consumers.py``), and the verdict is ``ok`` only when
every one of them is sized."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.consumers import arch_table as AT
from tqlab.predict import analysis
from tqlab.vllm.deployment import deployment_from_vllm

TABLE = AT.arch_table("0.33")
TEXT_GENERATION = sorted(a for a, r in TABLE["architectures"].items() if "_TEXT_GENERATION_MODELS" in r["tables"])
MINIMAL = {"model_type": "minimal", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 4, "max_position_embeddings": 4096, "vocab_size": 32000, "torch_dtype": "bfloat16"}
UNKNOWN = {"architectures": ["NoSuchModelForCausalLM"], "model_type": "no_such_model", "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
           "vocab_size": 32000, "torch_dtype": "bfloat16"}
MIXTRAL = {**MINIMAL, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "intermediate_size": 14336,
           "num_local_experts": 8, "num_experts_per_tok": 2}  # mistralai/Mixtral-8x7B: MixtralDecoderLayer reads these
PRIVACY_FILTER = {"architectures": ["OpenAIPrivacyFilterForTokenClassification"], "model_type": "openai_privacy_filter",
                  "hidden_size": 640, "intermediate_size": 640, "head_dim": 64, "num_attention_heads": 14,
                  "num_key_value_heads": 2, "num_hidden_layers": 8, "num_local_experts": 128, "num_experts_per_tok": 4,
                  "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}  # gpt_oss.py MLPBlock's fields
DSV4 = {**MINIMAL, "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "n_routed_experts": 256,
        "num_experts_per_tok": 8, "moe_intermediate_size": 2048}


def _predict(cfg: dict, args: str = "vllm serve m") -> analysis.Prediction:
    return analysis.predict(deployment_from_vllm(args, cfg, gpu="H200").config)


def _unsized_by_the_table(row: dict) -> list[str]:
    """What the table says the minimal config reaches and tqlab cannot size (written apart from arch_table.unsized):
    fused MoE without expert fields, any call site no registry entry models, a language model chosen at run time."""
    if row.get("markers") is None:
        return ["layers unknown"]
    out = ["fused_moe"] if "fused_moe" in row["markers"] else []
    out += ["dynamic"] if "dynamic_submodel" in row["markers"] else []
    modelled = {"modular_kernel.py:_allocate_buffers", "sparse_attn_indexer.py:sparse_attn_indexer",
                "indexer_topk.py:forward", "marlin_utils.py:get_marlin_workspace"}  # Marlin: only a quantized MoE
    return out + [s["consumer"] for s in row["call_sites"] if s["consumer"] not in modelled]


def test_the_table_covers_the_registry_and_names_its_provenance():
    assert TABLE["vllm_version"] == "0.33.0" and TABLE["tables"][0] == "_TEXT_GENERATION_MODELS"
    assert TABLE["architectures"]["Qwen2ForCausalLM"]["tables"] == ["_TEXT_GENERATION_MODELS", "_EMBEDDING_MODELS"]
    assert TABLE["vllm_version"] == "0.33.0" and TABLE["provenance"]["command"].startswith("python parity/gen_arch_consumers.py")
    assert len(TEXT_GENERATION) == 124 and len(TABLE["architectures"]) == 415
    mixtral = TABLE["architectures"]["MixtralForCausalLM"]
    assert (mixtral["module"], mixtral["class"], mixtral["markers"]) == (
        "vllm.model_executor.models.mixtral", "MixtralForCausalLM", ["attention", "fused_moe"])
    assert "num_local_experts" in mixtral["config_fields"]["fused_moe"]
    v4 = {s["consumer"] for s in TABLE["architectures"]["DeepseekV4ForCausalLM"]["call_sites"]}
    assert {"flashmla.py:_forward_prefill", "flashmla.py:forward_mqa"} <= v4
    # llama.py builds EncoderOnlyAttention for its bidirectional (pooling) variant, Attention otherwise; bert.py only the former
    assert TABLE["architectures"]["LlamaForCausalLM"]["markers"] == ["attention", "encoder_only_attention"]
    assert TABLE["architectures"]["BertModel"]["markers"] == ["encoder_only_attention"]


def test_one_loader_per_version_refuses_an_unknown_one():
    assert AT.arch_table() == AT.arch_table("0.33")
    assert AT.arch_table("0.34")["vllm_version"].startswith("0.34")  # each version's own table
    assert "MistralLarge4ForCausalLM" in AT.arch_table("0.34")["architectures"]
    assert "MistralLarge4ForCausalLM" not in AT.arch_table("0.33")["architectures"]
    with pytest.raises(ValueError, match=r"unsupported vLLM version '9.99': tqlab models 0.33, 0.34"):
        AT.arch_table("9.99")
    with pytest.raises(ValueError, match="vLLM version must be a string"):
        AT.arch_table(0.33)


def test_the_default_table_follows_the_runs_version():
    from tqlab.core import vllm_versions

    try:
        vllm_versions.select("0.34")
        assert AT.arch_table() is AT.arch_table("0.34") and "MistralLarge4ForCausalLM" in AT.arch_table()["architectures"]
    finally:
        vllm_versions.reset()
    assert AT.arch_table() is AT.arch_table(vllm_versions.DEFAULT)


@pytest.mark.parametrize("arch", TEXT_GENERATION)
def test_no_text_generation_architecture_is_ok_while_it_reaches_an_unsized_consumer(arch):
    row = TABLE["architectures"][arch]
    pred = _predict({**MINIMAL, "architectures": [arch]})
    unsized = _unsized_by_the_table(row)
    assert pred.verdict == ("partial" if unsized else "ok"), (arch, unsized, pred.unsized)
    assert bool(pred.unsized) is bool(unsized) and pred.to_json()["unsized"] == [dict(u) for u in pred.unsized]


def test_an_architecture_outside_vllms_registry_is_partial_with_one_line_saying_so():
    pred = _predict(UNKNOWN)
    assert pred.verdict == "partial" and len(pred.unsized) == 1
    assert "NoSuchModelForCausalLM is not in vLLM 0.33's model registry" in pred.unsized[0]["reason"]


def test_the_cli_answers_partial_for_an_unknown_architecture(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(UNKNOWN))
    r = CliRunner().invoke(app, ["inspect-vllm", "--config", str(path), "--args", "vllm serve m", "--json", "-"])
    obj = json.loads(r.output[r.output.index("{"):])
    assert obj["verdict"] == "partial" and [u["consumer"] for u in obj["unsized"]] == ["model class of NoSuchModelForCausalLM"]
    text = CliRunner().invoke(app, ["inspect-vllm", "--config", str(path), "--args", "vllm serve m"]).output.splitlines()
    assert text[0].startswith("verdict without the fix: PARTIAL")
    assert text[2].startswith("  unsized: model class of NoSuchModelForCausalLM: NoSuchModelForCausalLM is not in")
    (request,) = [line for line in text if line.startswith("  -> ")]
    assert request == "  -> ok without the fix, ok with it (sized consumers only: the verdict is partial, see the first lines)"


def test_a_config_without_architectures_is_partial():
    pred = _predict({k: v for k, v in UNKNOWN.items() if k != "architectures"})
    assert pred.verdict == "partial" and "names no architectures" in pred.unsized[0]["reason"]


def test_mixtral_gets_its_fused_moe_row_from_num_local_experts():
    """TritonExperts at M = 8192 (H200 default max_num_batched_tokens), N = 2 * 14336, K = 4096, top-2, bf16:
    max(8192*2*14336, 8192*4096) * 2 B + 8192*2*28672 * 2 B = 469,762,048 + 939,524,096 bytes."""
    pred = _predict(MIXTRAL)
    (row,) = pred.consumers["consumers"]
    assert (row["name"], row["phase"], row["reserved_bytes"]) == ("fused_moe", "profile_run", 1_409_286_144)
    assert pred.verdict == "ok" and pred.unsized == () and pred.locked_bytes == 1_409_286_144


def test_privacy_filter_gets_its_fused_moe_row():
    """M = 8192, N = 2 * 640, K = 640, top-4, bf16: max(8192*4*640, 8192*640) * 2 B + 8192*4*1280 * 2 B
    = 41,943,040 + 83,886,080 bytes."""
    pred = _predict(PRIVACY_FILTER)
    (row,) = pred.consumers["consumers"]
    assert (row["name"], row["reserved_bytes"]) == ("fused_moe", 125_829_120)


def test_gpt_oss_mxfp4_experts_are_listed_unsized():
    cfg = {**PRIVACY_FILTER, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
           "quantization_config": {"quant_method": "mxfp4"}}
    pred = _predict(cfg)
    assert pred.verdict == "partial" and pred.consumers["consumers"] == []
    assert [u["consumer"] for u in pred.unsized] == ["modular_kernel.py:_allocate_buffers (non-Triton experts)"]
    assert "mxfp4" in pred.unsized[0]["reason"]


@pytest.mark.parametrize("index", [False, True])
def test_deepseek_v4_is_partial_never_ok_with_or_without_the_index_fields(index):
    cfg = {**DSV4, **({"index_topk": 512, "index_head_dim": 128, "index_n_heads": 64} if index else {})}
    pred = _predict(cfg)
    assert pred.verdict == "partial"
    names = [u["consumer"] for u in pred.unsized]
    assert names == ["flashmla.py:_forward_prefill", "flashmla.py:forward_mqa"]
    assert "21.80 MB" in pred.unsized[0]["reason"]


def test_an_moe_architecture_without_its_expert_field_names_the_fields_it_reads():
    pred = _predict({**MINIMAL, "architectures": ["MiniMaxM2ForCausalLM"]})
    (u,) = pred.unsized
    assert u["consumer"] == "modular_kernel.py:_allocate_buffers" and "(num_local_experts)" in u["reason"]


def test_no_ok_while_the_busy_server_bound_is_below_max_model_len():
    """llama-3.1-8b at --max-model-len 41089: each request alone fits, but the any-chunking bound is 33,665."""
    from tqlab.core.config import EngineConfig

    cfg = EngineConfig.from_preset("llama-3.1-8b", max_model_len=41089)
    pred = analysis.predict(cfg)
    assert pred.first_failing_prompt_tokens is None and pred.safe_max_model_len_any_schedule == 33665
    assert pred.verdict == "crash" and pred.first_refused_call["cached_len"] == 33537
    assert "a request of 33666 tokens" in pred.first_refused_call["schedule"]
    assert analysis.predict(cfg.replace(max_model_len=33665)).verdict == "ok"
    assert analysis.predict(cfg, 8192).verdict == "ok" and "alone" in analysis.predict(cfg, 8192).verdict_covers


def test_the_model_class_not_the_config_keys_decides_which_consumers_run():
    """Expert keys in a Llama config build no MoE (vLLM's LlamaForCausalLM has no FusedMoEFactory); a TurboQuant
    cache on DeepSeek-V4 (its own attention, no vLLM Attention layer) runs no TurboQuant consumer."""
    llama = _predict({**MIXTRAL, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    assert llama.consumers["consumers"] == [] and llama.verdict == "ok"
    assert AT.reachable_families(deployment_from_vllm("vllm serve m", MIXTRAL, gpu="H200").config) == {
        "attention", "fused_moe"}
    v4 = _predict({**DSV4, "num_hidden_layers": 32}, "vllm serve m --kv-cache-dtype turboquant_4bit_nc")
    assert v4.consumers["consumers"][0]["name"] == "fused_moe" and len(v4.consumers["consumers"]) == 1
    assert v4.verdict == "partial"
