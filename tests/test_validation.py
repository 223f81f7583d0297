"""Deployments vLLM 0.33 refuses to start (verdict ``refused``), the backend selector, and the environment variables
that size a consumer (issue 33 "Deployments vLLM will not start", issue 30's bf16 sparse-MLA and unknown-backend
bullets). Each finding replayed gives vLLM's answer, as its code in vllm/platforms/cuda.py and
vllm/v1/attention/backend.py gives it, or a one-line error; never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.config import EngineConfig
from tqlab.core.consumers.backends import (
    SelectorConfig,
    attention_backend,
    backend_priorities,
    select_backend,
    validate_configuration,
)
from tqlab.predict import analysis
from tqlab.predict.report import inspect_vllm
from tqlab.vllm.deployment import deployment_from_preset, deployment_from_vllm
from tqlab.vllm.validation import StartupFacts, backend_flag, startup_refusal

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"],
          "model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 256, "num_hidden_layers": 42, "max_position_embeddings": 8192, "sliding_window": 4096,
          "torch_dtype": "float32"}
GPT_OSS = {"architectures": ["GptOssForCausalLM"],
           "model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "num_hidden_layers": 24, "max_position_embeddings": 131072, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 12, "torch_dtype": "bfloat16"}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
        "num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "max_position_embeddings": 163840, "torch_dtype": "bfloat16"}
TQ = "--kv-cache-dtype turboquant_4bit_nc"
NO_BACKEND = "No valid attention backend found for cuda with AttentionSelectorConfig("


def _turboquant_reasons(report: dict) -> str:
    """The ``TURBOQUANT: [...]`` part of a "No valid attention backend" refusal (of the first layer vLLM refuses:
    layer 0 is a boundary layer at the model dtype, where TURBOQUANT also says "kv_cache_dtype not supported")."""
    reason = report["refusal"]["reason"]
    return reason[reason.index("TURBOQUANT: ["):].split("]")[0]


def _report(line: str, cfg=LLAMA, **kw) -> dict:
    return inspect_vllm(f"vllm serve M {line}", cfg, quiet=True, **kw)


@pytest.mark.parametrize("line, turboquant_reason", [
    (f"{TQ} -tp 16 -dcp 2", "DCP not supported"),  # 16 ranks > 8 KV heads: ModelConfig lets DCP through
    (f"{TQ} --prefill-context-parallel-size 2", "PCP not supported"),
    (f"{TQ} --dtype float32", "dtype not supported"),
    (f"{TQ} --block-size 1", "block_size not supported"),
    (f"{TQ} --block-size 7", "block_size not supported"),
    (f"{TQ} --block-size 8", "block_size not supported"),
    (f"VLLM_BATCH_INVARIANT=1 vllm serve M {TQ}", "batch invariance not supported"),
])
def test_turboquant_deployments_vllm_refuses(line, turboquant_reason):
    r = inspect_vllm(line if line.startswith("VLLM_") else f"vllm serve M {line}", LLAMA, quiet=True)
    assert r["verdict"] == "refused" and r["locked_bytes"] is None and r["first_refused_call"] is None
    assert r["refusal"]["source"] == "vllm/platforms/cuda.py:CudaPlatformBase.get_attn_backend_cls"
    assert r["refusal"]["reason"].startswith(NO_BACKEND)
    assert turboquant_reason in _turboquant_reasons(r)
    assert r["text"].splitlines()[0].startswith("REFUSED: vLLM 0.33 does not start this deployment: No valid")


@pytest.mark.parametrize("line, reason", [
    ("-tp 2 -dcp 2", "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (2) to be greater "
                     "than the model's total number of KV heads (8). Increase `--tensor-parallel-size` or set "
                     "`--decode-context-parallel-size 1`."),
    ("-tp 16 -dcp 4", "`--decode-context-parallel-size` (4) exceeds the maximum supported value (2) for "
                      "`--tensor-parallel-size` (16) and 8 model KV heads."),
])
def test_decode_context_parallel_on_gqa_vllm_refuses(line, reason):
    """``ModelConfig.verify_with_parallel_config`` (vllm/config/model.py), before any backend is chosen."""
    r = _report(line)
    assert (r["verdict"], r["refusal"]["reason"]) == ("refused", reason)
    assert r["refusal"]["source"] == "vllm/config/model.py:ModelConfig.verify_with_parallel_config"
    assert _report("-tp 16 -dcp 2")["verdict"] == "ok"  # FLASH_ATTN's DCP consumer, sized


@pytest.mark.parametrize("block", [16, 32, 48, 128, 256])
def test_turboquant_block_sizes_vllm_accepts(block):
    """``get_supported_kernel_block_sizes`` = [16, 32, 64, 128]; any multiple of one is supported (hybrid blocks)."""
    assert _report(f"{TQ} --block-size {block}")["verdict"] != "refused"


def test_sliding_window_layers_refuse_turboquant_unless_skipped():
    r = _report(TQ, GEMMA2)
    assert r["verdict"] == "refused" and "sliding window not supported" in _turboquant_reasons(r)
    assert "has_sliding_window=True" in r["refusal"]["reason"]
    # --kv-cache-dtype-skip-layers sliding_window keeps those layers unquantized (Attention.__init__): FLASH_ATTN
    assert _report(f"{TQ} --kv-cache-dtype-skip-layers sliding_window", GEMMA2)["verdict"] in ("ok", "crash")
    assert _report("", GEMMA2)["verdict"] == "ok"  # no TurboQuant: FLASH_ATTN supports sliding windows


def test_gemma_2_9b_preset_is_refused_with_its_turboquant_cache():
    """The preset's model (``model``: gemma2, sliding_window 4096) is what vLLM refuses: not a CRASH at 48 MB."""
    dep = deployment_from_preset(None, "gemma-2-9b")
    assert dep.startup.sliding_window == "some"
    r = inspect_vllm(None, preset="gemma-2-9b", quiet=True)
    assert r["verdict"] == "refused" and "sliding window not supported" in _turboquant_reasons(r)
    plan = CliRunner().invoke(app, ["plan", "--preset", "gemma-2-9b", "--json", "-"])
    assert json.loads(plan.output)["verdict"] == "refused", plan.output
    assert analysis.predict(EngineConfig.from_preset("gemma-2-9b", kv_cache_dtype="auto")).verdict == "ok"


def test_attention_sinks_refuse_turboquant():
    r = _report(TQ, GPT_OSS)
    assert r["verdict"] == "refused" and "attention sinks not supported" in _turboquant_reasons(r)
    r = _report("", GPT_OSS)  # FLASH_ATTN (FA3 on SM90) serves sinks: started, not refused; partial because the
    assert (r["verdict"], r["refusal"]) == ("partial", None)  # fixture gives GptOss's fused MoE no expert count
    assert [u["consumer"] for u in r["unsized"]] == ["modular_kernel.py:_allocate_buffers"]


@pytest.mark.parametrize("line, reason", [
    ("--attention-backend TRITON_MLA", "Selected backend AttentionBackendEnum.TRITON_MLA is not valid for this "
                                       "configuration. Reason: ['non-MLA not supported']"),
    # a TurboQuant cache forces FlashAttention 2, which reads no quantized cache (fa_utils.py)
    (f"--attention-backend FLASH_ATTN {TQ}", "Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this "
                                             "configuration. Reason: ['kv_cache_dtype not supported', 'FP8 KV cache "
                                             "requires FA3 on SM90, FA4 with head_size=512 on SM90, or FA4 on SM100']"),
    # the boundary layers keep the model dtype (TurboQuantConfig.get_boundary_skip_layers): TURBOQUANT refuses "auto"
    (f"--attention-backend TURBOQUANT {TQ}", "Selected backend AttentionBackendEnum.TURBOQUANT is not valid for this "
                                             "configuration. Reason: ['kv_cache_dtype not supported']"),
    ("--attention-backend FLASH_ATTN --attention-config.backend TRITON_ATTN",
     "attention_backend and attention_config.backend are mutually exclusive"),
])
def test_pinned_backends_vllm_refuses(line, reason):
    r = _report(line)
    assert (r["verdict"], r["refusal"]["reason"]) == ("refused", reason)


@pytest.mark.parametrize("name", ["BOGUS", "B12X_MLA_SPARSE", "bogus"])
def test_unknown_backend_names_are_refused_as_vllm_refuses_them(name):
    r = _report(f"--attention-backend {name}")
    assert r["verdict"] == "refused"
    assert r["refusal"]["reason"].startswith(f"Unknown attention backend: '{name.upper()}'. Valid options are: FLASH_ATTN,")
    assert r["refusal"]["source"].endswith("registry.py:_AttentionBackendEnumMeta.__getitem__")
    assert any("tqlab cannot size a fork's backend" in line for line in r["text"].splitlines())


@pytest.mark.parametrize("line, backend", [
    ("--attention-backend auto", "FLASH_ATTN"),
    ("--attention-backend FLASH_ATTN --attention-config.backend auto", "FLASH_ATTN"),
    ("--attention-config.backend TRITON_ATTN", "TRITON_ATTN"),
    ("--attention-config.backend CUTLASS_MSA", "FLASH_ATTN"),  # MiniMax-M3's alias: backend stays automatic
])
def test_backend_flags_vllm_accepts(line, backend):
    dep = deployment_from_vllm(f"vllm serve M {line}", LLAMA)
    assert attention_backend(dep.config) == backend
    assert analysis.predict(dep.config, startup=dep.startup).verdict == "ok"


def test_attention_config_backend_acts_as_attention_backend_on_deepseek_v3():
    """``--attention-config.backend TRITON_MLA`` is ``--attention-backend TRITON_MLA`` (EngineArgs): Triton MLA's
    logits buffer, 8,875,671,552 bytes (8.9 GB) on DeepSeek-V3 TP 8, where tqlab used to say 0."""
    for line in ("--attention-backend TRITON_MLA", "--attention-config.backend TRITON_MLA",
                 "--attention-config '{\"backend\": \"triton_mla\"}'"):
        r = _report(f"-tp 8 {line}", DSV3, gpu="H200")  # vLLM's H200 defaults: max_num_seqs 1024
        assert r["verdict"] != "refused" and r["locked_bytes"] == 8_875_671_552, line
        assert r["lock_set_by"] == "triton_mla.py:forward_mqa"


@pytest.mark.parametrize("args, gpu, backend, flashmla", [
    ("-tp 8 --kv-cache-dtype auto", "H200", "FLASH_ATTN_MLA_SPARSE", False),
    ("-tp 8 --kv-cache-dtype auto -dcp 2", "H200", "FLASHMLA_SPARSE", True),  # FA MLA sparse: "DCP not supported"
    ("-tp 8", "H200", "FLASHMLA_SPARSE", True),  # fp8_ds_mla: FA MLA sparse takes FP16/BF16 only
    ("-tp 4 --kv-cache-dtype auto", "B200", "FLASHMLA_SPARSE", True),  # 32 heads per rank > 16
    ("-tp 8 --kv-cache-dtype auto", "B200", "FLASH_ATTN_MLA_SPARSE_FA4", False),  # 16 heads per rank
    ("-tp 8 --kv-cache-dtype fp8", "B200", "FLASHINFER_MLA_SPARSE", False),
    ("-tp 8", "B200", "FLASHMLA_SPARSE", True),  # FLASHINFER_MLA_SPARSE refuses fp8_ds_mla on SM100
])
def test_sparse_mla_gets_the_backend_vllms_selector_gives(args, gpu, backend, flashmla):
    """DeepSeek-V3.2: ``_get_backend_priorities`` + each backend's ``validate_configuration``; a bf16 (auto) cache
    reaches FlashMLA sparse wherever the selector picks it (FlashMLASparseBackend lists auto and bfloat16)."""
    dep = deployment_from_preset(f"vllm serve M {args}", "deepseek-v3.2", gpu=gpu)
    assert attention_backend(dep.config) == backend
    r = inspect_vllm(f"vllm serve M {args}", preset="deepseek-v3.2", gpu=gpu, quiet=True)
    assert r["verdict"] != "refused"
    assert ("flashmla_sparse" in [c["name"] for c in r["consumers"]]) is flashmla


def test_selector_priorities_and_reasons_are_vllms():
    s = SelectorConfig(head_size=128, dtype="bfloat16", kv_cache_dtype="turboquant_3bit_nc", block_size=8,
                       has_sliding_window=True, use_dcp=True)
    assert backend_priorities(s, (9, 0)) == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
    assert validate_configuration("TURBOQUANT", s, (9, 0)) == [
        "block_size not supported", "sliding window not supported", "DCP not supported"]
    dense = SelectorConfig(head_size=128, dtype="float32", kv_cache_dtype="auto")
    assert select_backend(None, dense, (9, 0)) == "TRITON_ATTN"  # FA and FlashInfer take fp16/bf16 only
    with pytest.raises(ValueError, match=r"^No valid attention backend found for cuda"):
        select_backend(None, SelectorConfig(576, "bfloat16", "auto", use_mla=True, use_sparse=True), (8, 0))


def test_bare_configs_and_plan_flags():
    """``predict`` on a bare config: the block size counts as ``--block-size`` only when ``sources`` say a flag."""
    c = EngineConfig.from_preset("llama-3.1-8b", block_size=8)
    assert analysis.predict(c).verdict != "refused"  # vLLM would pick the backend's block size itself
    pred = analysis.predict(c, sources={"block_size": "flag"})
    assert pred.verdict == "refused" and pred.to_json()["refusal"]["reason"].startswith(NO_BACKEND)
    r = CliRunner().invoke(app, ["plan", "--preset", "llama-3.1-8b", "--block-size", "8", "--json", "-"])
    assert json.loads(r.output)["verdict"] == "refused"
    assert startup_refusal(EngineConfig.from_preset("llama-3.1-8b"), StartupFacts()) is None
    assert backend_flag({"attention_backend": "Auto"}) == (None, None, None)


def test_mla_prefill_pin_on_the_wrong_gpu_is_a_refusal():
    r = _report("-tp 8 --attention-config.mla_prefill_backend TRTLLM_RAGGED", DSV3)
    assert r["verdict"] == "refused"
    assert r["refusal"]["source"].endswith("mla/prefill/selector.py:get_mla_prefill_backend")


@pytest.mark.parametrize("args", [
    f"vllm serve M {TQ} -dcp 2 -tp 16", "vllm serve M --attention-backend BOGUS",
    "vllm serve M --attention-backend X --attention-config.backend Y",
])
def test_cli_refusal_is_the_first_line_and_no_traceback(args, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    r = CliRunner().invoke(app, ["inspect-vllm", "--config", str(cfg), "--args", args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert "Traceback" not in r.output
    assert r.output.splitlines()[0].startswith("REFUSED: vLLM 0.33 does not start this deployment: ")
    j = CliRunner().invoke(app, ["inspect-vllm", "--config", str(cfg), "--args", args, "--json", "-"])
    obj = json.loads(j.output)
    assert obj["verdict"] == "refused" and set(obj["refusal"]) == {"reason", "source"}


# --------------------------------------------------------------------------- #
# Environment variables that size a consumer                                  #
# --------------------------------------------------------------------------- #

KIMI = {"model_type": "kimi_k2", "hidden_size": 7168, "num_attention_heads": 64, "num_hidden_layers": 61,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536,
        "max_position_embeddings": 262144}
PIN = "vllm serve K -tp 4 --attention-config.mla_prefill_backend TRTLLM_RAGGED"


def test_flashinfer_workspace_buffer_size_sizes_the_mla_prefill_consumer(monkeypatch):
    monkeypatch.delenv("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE", raising=False)
    default = inspect_vllm(PIN, KIMI, gpu="B200", quiet=True)
    assert [(c["name"], c["reserved_bytes"]) for c in default["consumers"]] == [("mla_prefill_trtllm_ragged", 394 << 20)]
    r = inspect_vllm(f"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE=1048576 {PIN}", KIMI, gpu="B200", quiet=True)
    assert [(c["name"], c["reserved_bytes"]) for c in r["consumers"]] == [("mla_prefill_trtllm_ragged", 1 << 20)]
    assert r["locked_bytes"] == 1 << 20
    assert r["sources"]["flashinfer_workspace_buffer_size"] == "environment VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"
    lines = r["text"].splitlines()
    assert any("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE=1048576: applied" in t for t in lines)
    assert not any("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" in t and "no effect" in t for t in lines)
    monkeypatch.setenv("VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE", "2097152")  # the process's own, as env_flag reads
    assert inspect_vllm(PIN, KIMI, gpu="B200", quiet=True)["locked_bytes"] == 2 << 20


@pytest.mark.parametrize("value, match", [("abc", "reads it with int()"), ("0", "give at least 1")])
def test_bad_flashinfer_workspace_buffer_size_is_one_line(value, match):
    with pytest.raises(ValueError, match=match):
        inspect_vllm(f"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE={value} {PIN}", KIMI, gpu="B200", quiet=True)


@pytest.mark.parametrize("name, says", [
    ("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB=10", "not a workspace request: no effect on the workspace"),
    ("VLLM_DEEP_GEMM_WARMUP=skip", "a consumer tqlab does not size"),
    ("VLLM_SOMETHING_ELSE=1", "tqlab cannot say it has no effect"),
])
def test_other_vllm_environment_variables_say_what_they_do(name, says):
    r = inspect_vllm(f"{name} {PIN}", KIMI, gpu="B200", quiet=True)
    assert any(name in line and says in line for line in r["text"].splitlines())


def test_a_vllm_backend_tqlab_does_not_model_is_said_not_silently_sized():
    """Issue 30: a backend name tqlab does not know passes silently. A name outside vLLM 0.33's enum is refused
    (above); one inside it but outside tqlab's selector model (ROCm, CPU, DeepSeek-V4's, B12X) gets a note and
    :func:`unmodelled_backend` (for the verdict's unmodelled list)."""
    from tqlab.core.consumers.backends import unmodelled_backend

    dep = deployment_from_vllm("vllm serve M --attention-backend rocm_attn", LLAMA)
    assert dep.config.attention_backend == "ROCM_ATTN"
    assert any("ROCM_ATTN: tqlab does not model this backend" in n for n in dep.notes)
    assert unmodelled_backend(dep.config).startswith("attention backend ROCM_ATTN (pinned) is not one tqlab models")
    assert unmodelled_backend(deployment_from_vllm("vllm serve M --attention-backend TRITON_ATTN", LLAMA).config) is None
