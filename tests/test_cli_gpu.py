"""``--gpu`` on plan / inspect-vllm / repro, vLLM's batch defaults per GPU, the consumer table in the text
reports, and the review findings of issue 19's predictor half (flag names in errors, ``--max-tokens``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.hardware import GPUS, batch_defaults, gpu_target
from tqlab.predict.consumers import DECODE, consumer_report
from tqlab.predict.report import inspect_vllm
from tqlab.vllm.deployment import vllm_default_limits

KIMI_K26 = dict(model_type="kimi_k2", hidden_size=7168, num_attention_heads=64, num_hidden_layers=61, kv_lora_rank=512,
                qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536,
                max_position_embeddings=262144, n_routed_experts=384, num_experts_per_tok=8,
                moe_intermediate_size=2048, n_shared_experts=1, torch_dtype="bfloat16")
RAGGED = "vllm serve K -tp 4 --attention-config.mla_prefill_backend TRTLLM_RAGGED"


@pytest.fixture
def kimi(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KIMI_K26))
    return str(path)


def _run(*args):
    return CliRunner().invoke(app, list(args))


def test_kimi_k26_tp4_trtllm_ragged_on_b200_reports_the_394_mb_prefill_buffer(kimi):
    r = _run("inspect-vllm", "--config", kimi, "--args", RAGGED, "--gpu", "B200")
    assert r.exit_code == 4, r.output  # partial: the SM100 bf16 experts are reached and not sized
    assert "gpu: B200 (SM 10.0, 148 SMs" in r.output
    assert "lock without the fix: 413,138,944 bytes (394.00 MiB), set by trtllm_ragged.py:prepare_metadata" in r.output
    assert "verdict without the fix: PARTIAL" in r.output  # SM100 bf16 MoE experts are not sized
    obj = json.loads(_run("inspect-vllm", "--config", kimi, "--args", RAGGED, "--gpu", "b200", "--json", "-").output)
    assert obj["gpu"] == "B200" and obj["prediction"]["config"]["gpu"] == "B200"
    assert obj["locked_bytes"] == obj["locked_bytes_with_fix"] == 394 << 20
    assert obj["lock_set_by"] == "trtllm_ragged.py:prepare_metadata" and obj["partial"] is True
    assert [(c["consumer"], c["phase"], c["reserved_bytes"]) for c in obj["consumers"]] == [
        ("trtllm_ragged.py:prepare_metadata", "init", 413_138_944)]
    # B200 (178.4 GiB): vLLM's largest tier, 16384 tokens and 1024 sequences for `vllm serve`
    assert (obj["prediction"]["config"]["max_num_batched_tokens"], obj["prediction"]["config"]["max_num_seqs"]) == (
        16384, 1024)


def test_trtllm_ragged_on_h200_is_refused_as_vllm_refuses_to_start(kimi):
    r = _run("inspect-vllm", "--config", kimi, "--args", RAGGED)  # --gpu H200 by default
    # verdict "refused" (issue 33), no longer a usage error: vLLM's own words first
    first = r.output.strip().splitlines()[0]
    assert first == ("REFUSED: vLLM 0.33 does not start this deployment: Selected MLA prefill backend TRTLLM_RAGGED is "
                     "not valid for this configuration. Reason: ['compute capability 9.0 not supported'] "
                     "(vllm/v1/attention/backends/mla/prefill/selector.py:get_mla_prefill_backend)")


@pytest.mark.parametrize("cmd", [["plan", "--preset", "llama-3.1-8b"], ["inspect-vllm", "--preset", "llama-3.1-8b"],
                                 ["repro", "--preset", "llama-3.1-8b"]])
def test_unknown_gpu_is_one_usage_line_listing_the_targets(cmd):
    r = _run(*cmd, "--gpu", "H300")
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        f"Error: Invalid value for '--gpu': 'H300' is not a known GPU; known: {', '.join(GPUS)}")


def test_plan_states_the_gpu_in_text_and_json():
    r = _run("plan", "--preset", "llama-3.1-8b", "--gpu", "h100")
    assert r.exit_code == 3, r.output  # crash: H100's default max_num_seqs 1024 locks at 262.06 MiB
    assert "gpu: H100 (SM 9.0, 132 SMs, 79.1 GiB" in r.output
    assert json.loads(_run("plan", "--preset", "llama-3.1-8b", "--gpu", "a4000", "--json", "-").output)["gpu"] == "A4000"
    assert json.loads(_run("plan", "--preset", "llama-3.1-8b", "--json", "-").output)["gpu"] == "H200"


@pytest.mark.parametrize("gpu, limits", [("H200", (8192, 1024)), ("H100", (8192, 1024)), ("B200", (16384, 1024)),
                                         ("A100", (2048, 256)), ("A4000", (2048, 256)), ("L40S", (2048, 256))])
def test_inspect_vllm_batch_defaults_follow_the_gpu(kimi, gpu, limits):
    obj = inspect_vllm("vllm serve K -tp 4", kimi, gpu=gpu, quiet=True)
    cfg = obj["prediction"]["config"]
    assert (cfg["max_num_batched_tokens"], cfg["max_num_seqs"]) == limits
    assert obj["sources"]["max_num_seqs"].startswith(f"vLLM default (`vllm serve` on --gpu {gpu}")
    assert gpu_target(gpu).default_max_num_seqs() == limits[1]


def test_gpu_memory_gib_wins_over_the_gpu(kimi):
    obj = inspect_vllm("vllm serve K -tp 4", kimi, gpu="B200", gpu_memory_gib=40, quiet=True)
    assert obj["prediction"]["config"]["max_num_batched_tokens"] == 2048 and obj["gpu"] == "B200"


def test_batch_defaults_are_vllm_get_batch_defaults():
    assert batch_defaults(178.4, "B200") == (16384, 1024, ">= 160 GiB")
    assert batch_defaults(139.8, "H200", usage="llm")[:2] == (16384, 1024)
    assert batch_defaults(79.2, "NVIDIA A100-SXM4-80GB")[:2] == (2048, 256)  # name check, PR #17885
    assert batch_defaults(119.7, "GB10", (12, 1))[:2] == (2048, 256)  # DGX Spark stays on the small tier
    assert vllm_default_limits("serve", gpu="h200")[:2] == (8192, 1024)
    assert vllm_default_limits("serve")[:2] == (2048, 256)  # no GPU named: the small tier (the library's default)
    with pytest.raises(ValueError, match="unknown GPU 'Z'"):
        vllm_default_limits("serve", gpu="Z")


def test_plan_flag_errors_name_the_flag():
    r = _run("plan", "--preset", "llama-3.1-8b", "--max-model-len", "0")
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1] == "Error: --max-model-len must be >= 1, got 0"
    r = _run("plan", "--preset", "llama-3.1-8b", "--max-num-batched-tokens", "4", "--max-num-seqs", "8")
    assert "--max-num-batched-tokens (4) must be >= --max-num-seqs" in r.output
    # vLLM caps a defaulted max_num_seqs at the batch (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args)
    r = _run("plan", "--preset", "llama-3.1-8b", "--max-num-batched-tokens", "4")
    assert r.exit_code == 0 and "max_num_seqs=4, max_num_batched_tokens=4" in r.output, r.output


MTP_LIKE = dict(num_attention_heads=24, num_key_value_heads=8, head_dim=256, max_num_seqs=1, max_model_len=1024,
                max_num_batched_tokens=1024, kv_cache_dtype="turboquant_4bit_nc", num_speculative_tokens=2)


def test_max_tokens_one_makes_no_decode_call_and_inspect_vllm_passes_it_on():
    """vLLM finishes a max_tokens=1 request after its prefill (check_stop): the drafter's decode that crashes a
    0-byte lock (MTP, k = 2) is never made."""
    from tqlab.core.config import EngineConfig

    c = EngineConfig(**MTP_LIKE)
    two = consumer_report(c, [8], max_tokens=2).requests[0]
    one = consumer_report(c, [8], max_tokens=1).requests[0]
    assert two.crashes_unfixed and two.first_refused_unfixed.consumer == DECODE
    assert not one.crashes_unfixed and [n.consumer for n in one.consumers] == []
    args = ["inspect-vllm", "--preset", "pr-44053-unit-test", "--args",
            "vllm serve M --speculative-config.num_speculative_tokens 2 --speculative-config.method mtp", "--tokens", "8", "--json", "-"]
    reqs = {k: json.loads(_run(*args, "--max-tokens", k).output)["prediction"]["requests"][0] for k in ("1", "2")}
    assert [c["consumer"] for c in reqs["1"]["consumers"]] == []
    assert [c["consumer"] for c in reqs["2"]["consumers"]] == [DECODE]


def test_inspect_vllm_tokens_report_other_consumers_per_prompt():
    """Review finding: ``--tokens`` on a deployment without TurboQuant's consumers printed no per-prompt rows at
    all (silently). FlashAttention + DCP with PIECEWISE-only graphs locks at 0 bytes: a 100-token prompt alone
    never has DCP context (no crash with --max-tokens 1; its first decode crashes with 2); a 10000-token prompt's
    second 8192-token chunk (cached 8192, q 1808) asks _forward_with_dcp's 32 MiB and crashes."""
    from tqlab.core.config import EngineConfig

    # 4 KV heads < TP 8: vLLM 0.33 refuses DCP when TP <= the KV heads (ModelConfig.verify_with_parallel_config)
    c = EngineConfig(num_attention_heads=64, num_key_value_heads=4, head_dim=128, tensor_parallel_size=8,
                     decode_context_parallel_size=2, max_num_batched_tokens=8192, max_model_len=131072,
                     cudagraph_mode="PIECEWISE")
    short, long_ = consumer_report(c, [100, 10000], max_tokens=1).requests
    assert (short.crashes_unfixed, short.crashes_fixed) == (False, False)
    first = long_.first_refused_unfixed
    assert long_.crashes_unfixed and long_.crashes_fixed
    assert (first.consumer, first.cached_len, first.q_len, first.nbytes) == (
        "flash_attn.py:_forward_with_dcp", 8192, 1808, 33_554_432)
    decoded = consumer_report(c, [100], max_tokens=2).requests[0]
    assert decoded.crashes_unfixed and (decoded.first_refused_unfixed.cached_len, decoded.first_refused_unfixed.q_len) == (100, 1)
    text = consumer_report(c, [10000], max_tokens=1).format()
    assert "first refused call without the fix (vLLM dies here): flash_attn.py:_forward_with_dcp, cached 8192 q 1808" in text


def test_unread_attention_config_keys_are_noted_not_silently_dropped(tmp_path):
    """Review finding: --attention-config.sparse_mla_prefill_workspace_factor 3 changes FlashMLA sparse's prefill
    workspace and the indexer's K-gather rows in vLLM 0.33 (vllm/config/vllm.py resolves the default 5/2 only when
    it is None; flashmla_sparse.py get_prefill_workspace_size), but tqlab sizes with the default: it must say so."""
    cfg = dict(KIMI_K26, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", index_topk=2048,
               index_head_dim=128, index_n_heads=64,
               max_position_embeddings=163840)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    line = "vllm serve D -tp 8 --kv-cache-dtype fp8_ds_mla --attention-config.sparse_mla_prefill_workspace_factor 3"
    r = _run("inspect-vllm", "--config", str(path), "--args", line, "--json", "-")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)["prediction"]  # the deployment's notes (the text report prints the same)
    kinds = [k for n, k in zip(rep["notes"], rep["note_kinds"]) if "sparse_mla_prefill_workspace_factor" in n]
    assert kinds == ["not_modelled"]
    assert "note: --attention-config sparse_mla_prefill_workspace_factor = 3 is not read by tqlab" in _run(
        "inspect-vllm", "--config", str(path), "--args", line).output


def test_plan_reports_the_split_count_that_fills_the_gpu():
    # Seed rank (Hk 1, max_num_seqs 4): 4 programs x 132 SMs / (1 row x 1 KV head) -> 528 -> next power of two 1024,
    # capped at 256; the decode scratch (4, 4, 256, 129) f32 at max_num_seqs rows = 2,113,536 B -> 2,117,888 with the
    # 256-byte rounding of its three views.
    from tqlab.core.reservation import filling_kv_splits

    assert filling_kv_splits(1, 1, 132, floor=32) == 256 and filling_kv_splits(16, 8, 132, floor=32) == 32
    assert filling_kv_splits(1, 8, 48, floor=32) == 32  # A4000, Llama shard: 24 -> 32, the floor
    out = _run("plan", "--preset", "nemotron-3-super-120b-a12b").output
    assert ("S = 32 (268,544 bytes of decode scratch at max_num_seqs rows); S = 256 would fill the H200's 132 SMs "
            "for a 1-row batch and reserve 2,117,888 bytes") in " ".join(out.split())
    assert "--attention-config.tq_max_kv_splits_for_cuda_graph 256" in " ".join(out.split())
    out = " ".join(_run("plan", "--preset", "llama-3.1-8b", "--gpu", "A4000").output.split())
    assert "already fills the A4000's 48 SMs for a 1-row batch" in out
    assert "split-KV decode" not in " ".join(_run("plan", "--preset", "deepseek-v3.2").output.split())
