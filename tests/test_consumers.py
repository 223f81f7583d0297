"""The consumer registry (tqlab/core/consumers): exact bytes on fixed configs, the lock as a maximum, coverage.

Expected bytes are worked out by hand from vLLM 0.33's formulas (cited in each consumer module); the parity
suite (parity/test_consumers_parity.py) checks the same formulas against vLLM's own code on random configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tqlab.core.config import EngineConfig
from tqlab.core.consumers.base import StartUp, call_bytes
from tqlab.core.consumers.flash_attn_dcp import dcp_context_out_shapes
from tqlab.core.consumers.flashmla_sparse import flashmla_sparse_workspace_specs, sparse_mla_prefill_workspace_factor
from tqlab.core.consumers.fused_moe import moe_allocate_buffers_call
from tqlab.core.consumers.registry import CONSUMERS, UNMODELLED, consumer_table
from tqlab.core.consumers.sparse_indexer import indexer_profile_call, max_prefill_buffer_size
from tqlab.core.consumers.triton_mla import attn_logits_call, num_kv_splits
from tqlab.core.hardware import gpu_target
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.vllm.hf_config import read_hf_config

DSV3_MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536)
QWEN3_30B_MOE = dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, hidden_size=2048)
MiB = 1024 * 1024


def _mla(**kw) -> EngineConfig:
    base = dict(num_attention_heads=128, num_key_value_heads=1, head_dim=576, tensor_parallel_size=8, mla=DSV3_MLA)
    return EngineConfig(**{**base, **kw})


def test_flashmla_sparse_specs_deepseek_v32_tp8():
    specs = flashmla_sparse_workspace_specs(16, 512, 64, "fp8_ds_mla", 8192, 163840)
    assert [s for s, _ in specs] == [(8192, 16, 576), (819200, 576), (8192, 64, 576), (8192, 64, 512), (8192, 16, 512)]
    assert call_bytes(specs) == 150_994_944 + 943_718_400 + 603_979_776 + 536_870_912 + 134_217_728
    bf16 = flashmla_sparse_workspace_specs(16, 512, 64, "auto", 8192, 163840)
    assert [s for s, _ in bf16] == [(8192, 64, 576)]  # heads padded to 64, no prefill workspace


def test_sparse_mla_factor_is_5_up_to_256k_then_2():
    assert sparse_mla_prefill_workspace_factor(256 * 1024) == 5
    assert sparse_mla_prefill_workspace_factor(256 * 1024 + 1) == 2


def test_dcp_context_out_llama70b_tp8_dcp2():
    call = dcp_context_out_shapes(8192, 8, 2, 128, torch.bfloat16)
    assert call == (((8192, 16, 128), torch.bfloat16),)
    assert call_bytes(call) == 33_554_432


def test_fused_moe_triton_qwen3_30b_a3b():
    call = moe_allocate_buffers_call(8192, 1536, 2048, 8, torch.bfloat16)
    assert call == (((8192 * 8 * 2048,), torch.bfloat16), ((8192, 8, 2048), torch.bfloat16))
    assert call_bytes(call) == 536_870_912


def test_triton_mla_splits_follow_the_sm_count():
    assert num_kv_splits(163840, gpu_target("A4000").sm_count) == 96  # min(512, 2 * 48)
    assert num_kv_splits(163840, gpu_target("H200").sm_count) == 264  # min(512, 2 * 132)
    assert num_kv_splits(1000, 132) == 1
    assert call_bytes(attn_logits_call(256, 16, 512, 163840, 48)) == 256 * 16 * 96 * 513 * 4


def test_sparse_indexer_profile_reservation():
    rows = max_prefill_buffer_size(163840)
    assert rows == 163840 * 8 * 5
    assert call_bytes(indexer_profile_call(rows, 128)) == 838_860_800 + 26_214_400 + 1_048_576


def test_kimi_k26_tp4_trtllm_ragged_on_b200_reports_394_mib():
    cfg = _mla(num_attention_heads=64, tensor_parallel_size=4, gpu="B200", mla_prefill_backend="TRTLLM_RAGGED",
               max_model_len=262144)
    table = consumer_table(cfg, StartUp())
    assert [r.name for r in table.rows] == ["mla_prefill_trtllm_ragged"]
    assert table.locked_bytes == 394 * MiB == 413_138_944
    with pytest.raises(ValueError, match=r"^--attention-config.mla_prefill_backend TRTLLM_RAGGED on --gpu H200: vLLM "
                       r"0.33 refuses to start .*compute capability 9.0 not supported"):  # SM100 only, no fallback
        consumer_table(cfg.replace(gpu="H200"), StartUp())


def test_turboquant_consumers_wrap_the_reservation():
    cfg = EngineConfig.from_preset("pr-44053-unit-test")
    table = consumer_table(cfg, StartUp())
    assert [r.name for r in table.rows] == ["turboquant_decode", "turboquant_continuation"]
    assert table.locked_bytes == plan_bytes(reservation_plan(cfg))
    assert all(r.covered for r in table.rows)


def test_turboquant_without_chunked_prefill_but_prefix_caching_is_not_covered():
    cfg = EngineConfig.from_preset("pr-44053-unit-test").replace(enable_chunked_prefill=False, max_num_batched_tokens=8192,
                                                                 max_model_len=8192)
    cont = {r.name: r for r in consumer_table(cfg, StartUp()).rows}["turboquant_continuation"]
    assert cont.phase == "none" and cont.reserved_bytes == 0
    assert cont.max_runtime_bytes > 0 and not cont.covered  # latent crash 1
    off = cfg.replace(enable_prefix_caching=False)
    assert {r.name: r for r in consumer_table(off, StartUp()).rows}["turboquant_continuation"].max_runtime_bytes == 0


def test_moe_scratch_sets_the_lock_over_turboquant():
    cfg = EngineConfig(num_attention_heads=32, num_key_value_heads=4, head_dim=128, kv_cache_dtype="turboquant_k8v4",
                       moe=QWEN3_30B_MOE)
    table = consumer_table(cfg, StartUp())
    by = {r.name: r for r in table.rows}
    assert table.locked_bytes == by["fused_moe"].reserved_bytes == 536_870_912
    assert by["fused_moe"].reserved_bytes > by["turboquant_decode"].reserved_bytes
    assert by["fused_moe"].phase == "profile_run"


def test_moe_data_parallel_without_ep_gathers_rows_and_flattens_tp():
    """-dp 2 without --enable-expert-parallel: vLLM 0.33 all-gathers every DP rank's tokens before the experts
    (fused_moe/all2all_utils.py maybe_make_prepare_finalize -> AgRsAll2AllManager.dispatch, all_gatherv over the DP
    group: M = dp x max_num_batched_tokens in the profile run) and shards the experts over tp x dp
    (FusedMoEParallelConfig.make, flatten_tp_across_dp_and_pcp): Qwen3-30B-A3B tp 2 dp 2 at 8192 tokens asks
    M = 16384, N = 2 * 768 / 4 = 384, K = 2048 -> 1 GiB, not the 512 MiB of one rank's rows."""
    cfg = EngineConfig(num_attention_heads=32, num_key_value_heads=4, head_dim=128, tensor_parallel_size=2,
                       data_parallel_size=2, max_num_batched_tokens=8192, moe=QWEN3_30B_MOE)
    row = {r.name: r for r in consumer_table(cfg, StartUp()).rows}["fused_moe"]
    assert row.reserved_bytes == row.max_runtime_bytes == call_bytes(
        moe_allocate_buffers_call(16384, 384, 2048, 8, torch.bfloat16)) == 1_073_741_824
    odd = cfg.replace(moe=dict(QWEN3_30B_MOE, moe_intermediate_size=770))  # 770 % 2 == 0, 770 % 4 == 2
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(770\).*tensor_parallel_size x data_parallel_size \(4\)"):
        consumer_table(odd, StartUp())


def test_dcp_with_piecewise_only_graphs_is_not_covered():
    cfg = EngineConfig(num_attention_heads=64, num_key_value_heads=8, head_dim=128, tensor_parallel_size=8,
                       decode_context_parallel_size=2)
    full = consumer_table(cfg, StartUp("FULL_AND_PIECEWISE", True)).rows[0]
    assert (full.phase, full.reserved_bytes, full.covered) == ("capture", 33_554_432, True)
    pw = consumer_table(cfg, StartUp("PIECEWISE", True))
    assert (pw.rows[0].phase, pw.rows[0].reserved_bytes, pw.rows[0].covered) == ("none", 0, False)
    assert pw.locked_bytes == 0
    eager = consumer_table(cfg, StartUp("NONE", False))
    assert eager.locked_bytes is None and eager.rows[0].covered  # vLLM 0.33 never locks an eager start-up


def test_quantized_moe_is_listed_unmodelled_never_silently_zero():
    cfg = _mla(moe=dict(QWEN3_30B_MOE, quantization="fp8"))
    table = consumer_table(cfg, StartUp())
    assert "fused_moe" not in [r.name for r in table.rows]
    names = [u["consumer"] for u in table.unmodelled]
    assert any(n.startswith("modular_kernel.py") for n in names) and any(n.startswith("deep_gemm") for n in names)
    assert json.loads(json.dumps(table.to_dict()))["unmodelled"]


def test_registry_names_vllm_call_sites_in_the_census():
    census = json.loads((Path(__file__).resolve().parents[1] / "data" / "vllm_0_33_workspace_consumers.json").read_text())
    assert census["counts"]["call_sites"] == 85 and census["counts"]["cuda"] == 54
    modelled = {s["consumer"] for s in census["call_sites"] if s["consumer"]}
    assert modelled <= {c.name for c in CONSUMERS} | {"turboquant", "mla_prefill_flashinfer", "mla_prefill_trtllm_ragged"}
    names = {s["assertion_name"] for s in census["call_sites"]}
    for c in CONSUMERS:
        assert c.consumer in names, c.consumer
    assert len(UNMODELLED) >= 10


def test_deepseek_v3_config_json_reads_mla_head_sizes():
    shape = read_hf_config(dict(model_type="deepseek_v3", hidden_size=7168, num_attention_heads=128,
                                num_key_value_heads=128, num_hidden_layers=61, **DSV3_MLA,
                                n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                                n_shared_experts=1, quantization_config={"quant_method": "fp8"}))
    assert (shape.head_dim, shape.num_key_value_heads) == (576, 1)
    assert shape.mla.qk_head_dim == 192 and shape.mla.head_size == 576
    assert (shape.moe.num_experts, shape.moe.quantization, shape.moe.n_shared_experts) == (256, "fp8", 1)
    llama = read_hf_config(dict(model_type="llama", hidden_size=4096, num_attention_heads=32, kv_lora_rank=512))
    assert llama.mla is None and llama.head_dim == 128  # kv_lora_rank alone does not make MLA (model_type list)


@pytest.mark.parametrize("bad, match", [
    (dict(gpu="H300"), "unknown GPU 'H300'"),
    (dict(decode_context_parallel_size=3), "divisible by decode_context_parallel_size"),
    (dict(mla=dict(DSV3_MLA, kv_lora_rank=0)), "kv_lora_rank must be an int >= 1"),
    (dict(moe=dict(QWEN3_30B_MOE, num_experts_per_tok=200)), "num_experts_per_tok"),
    (dict(moe=dict(QWEN3_30B_MOE, experts=3)), "unknown field"),
])
def test_bad_consumer_fields_give_one_line(bad, match):
    with pytest.raises(ValueError, match=match):
        _mla(**bad)


def test_config_round_trips_the_new_fields():
    cfg = _mla(moe=QWEN3_30B_MOE, gpu="b200", attention_backend="triton_mla")
    d = cfg.to_dict()
    assert d["mla"]["kv_lora_rank"] == 512 and d["gpu"] == "B200" and d["attention_backend"] == "TRITON_MLA"
    assert EngineConfig(**{k: v for k, v in d.items() if k != "preset"}) == cfg


def test_plan_and_inspect_json_list_the_consumers(tmp_path):
    from click.testing import CliRunner

    from tqlab.cli import app

    r = CliRunner().invoke(app, ["plan", "--preset", "nemotron-3-super-120b-a12b", "--max-num-seqs", "4", "--json", "-"])
    assert r.exit_code == 3, r.output  # the bug report's crash
    obj = json.loads(r.output)
    assert [c["consumer"] for c in obj["consumers"]] == ["turboquant_attn.py:_decode_attention",
                                                         "turboquant_attn.py:_continuation_prefill"]
    assert set(obj["consumers"][0]) == {"consumer", "name", "phase", "slot", "reserved_bytes", "max_runtime_bytes", "covered"}
    assert obj["consumers_locked_bytes"] == obj["locked_bytes_with_fix"] == 64 << 20 and obj["unmodelled"] == []
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(architectures=["DeepseekV3ForCausalLM"], model_type="kimi_k2", hidden_size=7168,
                                   num_attention_heads=64, num_hidden_layers=61,
                                   max_position_embeddings=262144, **DSV3_MLA)))
    r = CliRunner().invoke(app, ["inspect-vllm", "--config", str(cfg), "--json", "-", "--args",
                                  "vllm serve K -tp 4 --attention-backend TRITON_MLA"])
    assert r.exit_code == 4, r.output  # partial: DeepseekV3ForCausalLM builds fused MoE, the config gives no expert count
    obj = json.loads(r.output)
    assert [c["name"] for c in obj["consumers"]] == ["triton_mla_logits"]
    assert obj["prediction"]["config"]["head_dim"] == 576  # MLA head size read from config.json
    assert obj["consumers"][0]["phase"] == "profile_run" and obj["consumers"][0]["covered"]
