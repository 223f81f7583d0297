"""The engine's consumer stand-ins (tqlab/engine/consumer_standins.py, tqlab/engine/standins/): issue 19.

Every modelled consumer asks the engine's workspace in vLLM 0.33's phase, so the engine's lock is the maximum
over consumers and a refused call can come from any of them, with vLLM's caller name. Expected bytes come
from the consumer modules' own functions (tqlab/core/consumers: the one source of truth) and, for the
headline cases, as numbers worked out by hand. Meta device (shapes only) unless a test says CPU.
"""

from __future__ import annotations

import re

import pytest
import torch

from tqlab.core.config import EngineConfig
from tqlab.core.consumers import fused_moe, flash_attn_dcp, flashmla_sparse, sparse_indexer
from tqlab.core.consumers.base import StartUp, call_bytes
from tqlab.core.consumers.registry import consumer_table
from tqlab.core.reservation import decode_workspace_shapes, plan_bytes, reservation_plan
from tqlab.core.vllm_rules import cudagraph_mode, decode_rows_at_lock, locks_workspace
from tqlab.core.workspace import (
    WorkspaceLockedError,
    current_workspace_manager,
    init_workspace_manager,
    reset_workspace_manager,
)
from tqlab.engine import EngineDeadError, LLMEngine
from tqlab.engine.consumer_standins import ConsumerStandIns, StepShape, consumer_of

MiB = 1024 * 1024
DCP = dict(num_attention_heads=64, num_key_value_heads=8, head_dim=128, tensor_parallel_size=8,
           decode_context_parallel_size=2)


@pytest.fixture(autouse=True)
def _fresh_workspace_singleton():
    reset_workspace_manager()
    yield
    reset_workspace_manager()


def _qwen3_moe(**kw) -> EngineConfig:
    # One layer and 16 sequences: the workspace calls do not depend on the layer count, and capture stays fast.
    return EngineConfig.from_preset("qwen3-30b-a3b", num_hidden_layers=1, **kw)


def test_qwen3_30b_a3b_moe_scratch_sets_the_lock_in_the_profile_run():
    cfg = _qwen3_moe()
    engine = LLMEngine(cfg, fix=False, device="meta")
    moe = call_bytes(fused_moe.step_call(cfg, cfg.max_num_batched_tokens))
    assert moe == 536_870_912  # (8192*8*2048 + 8192*8*2048) bf16 elements: 512 MiB
    after = {p.name: p.workspace_bytes for p in engine.phases}
    assert after["load_model"] == (0,) and after["profile_run"] == (moe,) == after["lock"]
    assert engine.locked_bytes == moe
    s = engine.slot_sizer
    assert (s.consumer, s.phase, s.nbytes) == ("fused_moe", "profile_run", moe)
    assert re.fullmatch(r"modular_kernel\.py:\d+:_allocate_buffers", s.caller)
    note = {p.name: p.note for p in engine.phases}
    assert "fused MoE _allocate_buffers at M = max_num_batched_tokens = 8192" in note["profile_run"]
    assert "set by fused_moe (modular_kernel.py:" in note["lock"]
    # TurboQuant's unfixed lock (its capture at 512 decode rows) is smaller: 274.79 MB, hidden by the MoE scratch.
    tq = call_bytes(decode_workspace_shapes(decode_rows_at_lock(cfg), 32, 128, 32, torch.bfloat16))
    assert tq == 274_792_448 < moe
    out = engine.generate(8192)  # the default prompt: its continuation never needs more than the 512 MiB
    assert out.finished and engine.workspace.size_bytes() == moe


def test_qwen3_30b_a3b_with_the_fix_turboquant_reservation_is_larger_than_moe():
    cfg = _qwen3_moe()
    engine = LLMEngine(cfg, fix=True, device="meta")
    tq = plan_bytes(reservation_plan(cfg))  # (1024, 32, 32, 129) f32 + (1024, 32, 128) bf16 + (1024, 32) f32 decode views
    assert tq == 549_584_896 > call_bytes(fused_moe.step_call(cfg, 8192))
    assert engine.locked_bytes == tq
    s = engine.slot_sizer
    assert s.phase == "build_backend" and s.consumer.startswith("turboquant")


def test_small_moe_sets_the_lock_live_on_cpu():
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "hidden_size": 128}
    cfg = EngineConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_model_len=512, max_num_seqs=4,
                       max_num_batched_tokens=256, kv_cache_dtype="turboquant_4bit_nc", moe=moe)
    engine = LLMEngine(cfg, fix=True, device="cpu")
    moe_bytes = call_bytes(fused_moe.step_call(cfg, 256))
    assert moe_bytes == 2 * 256 * 2 * 128 * 2 == 262_144  # (256*2*max(64, 128),) and (256, 2, 128) bf16
    assert moe_bytes > plan_bytes(reservation_plan(cfg))
    assert engine.locked_bytes == moe_bytes and engine.slot_sizer.consumer == "fused_moe"
    assert engine.workspace.buffer(0).device.type == "cpu"
    assert len(engine.generate(300, max_tokens=2).output_token_ids) == 2


def test_moe_serving_steps_ask_at_the_steps_tokens():
    cfg = _qwen3_moe(max_model_len=4096)
    engine = LLMEngine(cfg, fix=False, device="meta")
    seen = []
    real = engine.workspace.get_simultaneous

    def spy(*reqs):
        seen.append(call_bytes(reqs))
        return real(*reqs)

    engine.workspace.get_simultaneous = spy
    engine.add_request(1000, max_tokens=2)
    engine.step()  # prefill: M = 1000
    engine.step()  # decode: M = 1
    assert call_bytes(fused_moe.step_call(cfg, 1000)) in seen and call_bytes(fused_moe.step_call(cfg, 1)) in seen
    assert call_bytes(fused_moe.step_call(cfg, 1)) == 2 * 8 * 2048 * 2  # (1*8*2048,) and (1, 8, 2048) bf16


@pytest.mark.parametrize("preset", ["qwen3-32b", "pr-44053-unit-test"])
@pytest.mark.parametrize("fix", [False, True])
def test_turboquant_only_presets_lock_as_before(preset, fix):
    cfg = EngineConfig.from_preset(preset, num_hidden_layers=1)
    engine = LLMEngine(cfg, fix=fix, device="meta")
    assert engine.standins.names == ()  # no stand-in: TurboQuant's calls are the backend's own
    if fix:
        assert engine.locked_bytes == plan_bytes(reservation_plan(cfg))
        assert engine.slot_sizer.phase == "build_backend"
    else:
        rows = decode_rows_at_lock(cfg)
        shapes = decode_workspace_shapes(rows, cfg.num_heads_per_rank, cfg.head_dim, cfg.tq_max_kv_splits_for_cuda_graph,
                                         cfg.dtype)
        assert engine.locked_bytes == call_bytes(shapes)
        assert (engine.slot_sizer.consumer, engine.slot_sizer.phase) == ("turboquant_decode", "capture")


def test_qwen3_32b_unfixed_lock_is_131_mib():
    engine = LLMEngine(EngineConfig.from_preset("qwen3-32b", num_hidden_layers=1), fix=False, device="meta")
    assert engine.locked_bytes == 137_396_224  # (256, 32, 32, 129) f32 + (256, 32, 128) bf16 + (256, 32) f32


def _dcp(**kw) -> EngineConfig:
    return EngineConfig(**DCP, num_hidden_layers=1, max_model_len=512, max_num_batched_tokens=256, max_num_seqs=4, **kw)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_dcp_piecewise_only_first_decode_is_refused_live(device):
    """Latent crash 2: nothing reaches _forward_with_dcp before the lock, so the first decode asks a 0-byte slot."""
    cfg = _dcp(cudagraph_mode="PIECEWISE")
    engine = LLMEngine(cfg, device=device)
    assert engine.standins.names == ("flash_attn_dcp",)
    assert engine.locked_bytes == 0 and engine.slot_sizer is None
    need = call_bytes(flash_attn_dcp.step_call(cfg, 1))
    assert need == 256 * 16 * 128 * 2 == 1_048_576  # (max_num_batched_tokens, Hq/TP * dcp, D) bf16
    rid = engine.add_request(100, max_tokens=2)
    engine.step()  # first chunk: no cached context, so no DCP context call
    assert len(engine.outputs[rid].output_token_ids) == 1
    with pytest.raises(WorkspaceLockedError) as err:
        engine.step()  # first decode: the row attends 100 cached tokens
    e = err.value
    assert re.fullmatch(r"flash_attn\.py:\d+:_forward_with_dcp", e.caller)
    assert (e.required_bytes, e.current_bytes) == (need, 0)
    assert re.match(r"Workspace is locked but allocation from 'flash_attn\.py:\d+:_forward_with_dcp' requires 1\.00 MB, "
                    r"current size is 0\.00 MB\. Workspace growth is not allowed after locking\.$", str(e))
    assert engine.workspace.size_bytes() == 0
    with pytest.raises(EngineDeadError):
        engine.step()


def test_dcp_full_and_piecewise_capture_sizes_it_and_the_decode_fits():
    cfg = _dcp()
    engine = LLMEngine(cfg, device="meta")
    need = call_bytes(flash_attn_dcp.step_call(cfg, 1))
    assert engine.locked_bytes == need
    assert (engine.slot_sizer.consumer, engine.slot_sizer.phase) == ("flash_attn_dcp", "capture")
    assert engine.generate(100, max_tokens=3).finished


def test_dcp_eager_never_locks_and_grows_at_the_first_decode():
    engine = LLMEngine(_dcp(enforce_eager=True), device="meta")
    assert engine.locked_bytes is None and engine.workspace.size_bytes() == 0
    assert engine.generate(100, max_tokens=2).finished and engine.workspace.size_bytes() == 1_048_576


def _deepseek(**kw) -> EngineConfig:
    return EngineConfig.from_preset("deepseek-v3.2", num_hidden_layers=1, max_num_seqs=8, **kw)


@pytest.mark.parametrize("config", [
    pytest.param(lambda: _deepseek(), id="deepseek-v3.2 FlashMLA sparse + indexer"),
    pytest.param(lambda: _deepseek(max_model_len=300_000), id="deepseek-v3.2 factor 2"),
    pytest.param(lambda: _deepseek(kv_cache_dtype="auto", indexer=None, gpu="A100"), id="MLA Triton on A100"),
    pytest.param(lambda: _deepseek(kv_cache_dtype="auto", indexer=None, gpu="B200",
                                           mla_prefill_backend="TRTLLM_RAGGED"), id="MLA TRT-LLM ragged prefill"),
    pytest.param(lambda: _qwen3_moe(cudagraph_mode="PIECEWISE"), id="qwen3 MoE piecewise"),
    pytest.param(lambda: _dcp(cudagraph_mode="FULL_DECODE_ONLY"), id="DCP full decode only"),
])
def test_engine_lock_equals_the_registry_maximum(config):
    cfg = config()
    engine = LLMEngine(cfg, fix=True, device="meta")
    table = consumer_table(cfg, StartUp(cudagraph_mode(cfg), locks_workspace(cfg)))
    assert engine.standins.names and engine.locked_bytes == table.locked_bytes
    top, got = max(table.rows, key=lambda r: r.reserved_bytes).name, engine.slot_sizer.consumer
    # TurboQuant's reservation (reservation.py) is one builder method for both of its consumers
    assert got == top or (top.startswith("turboquant") and got.startswith("turboquant"))


def test_deepseek_v32_flashmla_sparse_reserves_at_model_load():
    cfg = _deepseek()
    engine = LLMEngine(cfg, device="meta")
    specs = call_bytes(flashmla_sparse.step_call(cfg))
    assert specs == 2_369_781_760  # test_consumers.py: the five workspace_specs of TP 8, fp8_ds_mla
    indexer = call_bytes(sparse_indexer.profile_call(cfg))
    assert indexer < specs
    after = {p.name: p.workspace_bytes for p in engine.phases}
    assert after["load_model"] == (specs,) == after["lock"]
    assert (engine.slot_sizer.consumer, engine.slot_sizer.phase) == ("flashmla_sparse", "load_model")
    assert engine.generate(2000, max_tokens=2).finished


def test_a_config_a_consumer_cannot_size_is_refused_before_anything_is_built():
    before = init_workspace_manager("meta")
    bad = _qwen3_moe(tensor_parallel_size=2, moe={"num_experts": 128, "num_experts_per_tok": 8,
                                                  "moe_intermediate_size": 769, "hidden_size": 2048})
    with pytest.raises(ValueError, match=r"^moe_intermediate_size \(769\) must be divisible by tensor_parallel_size \(2\)"):
        LLMEngine(bad, device="meta")
    assert current_workspace_manager() is before and before.size_bytes() == 0 and not before.is_locked()
    assert before.events == []


def test_bad_moe_rows_are_one_line_errors():
    cfg = _qwen3_moe()
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="fused MoE rows M must be an int >= 1"):
            fused_moe.step_call(cfg, bad)


def test_a_refused_moe_step_leaves_the_slot_as_locked():
    cfg = _qwen3_moe(max_model_len=4096)
    ws = init_workspace_manager("meta")
    standins = ConsumerStandIns(cfg, ws)
    standins.forward(StepShape(64))
    ws.lock()
    size, ptr = ws.size_bytes(), ws.data_ptrs()
    with pytest.raises(WorkspaceLockedError, match=r"'modular_kernel\.py:\d+:_allocate_buffers' requires 64\.00 MB, "
                                                   r"current size is 4\.00 MB"):
        standins.forward(StepShape(1024))
    assert ws.size_bytes() == size == 4 * MiB and ws.data_ptrs() == ptr


def test_consumer_of_names_registry_entries_from_callers():
    assert consumer_of("modular_kernel.py:26:_allocate_buffers") == "fused_moe"
    assert consumer_of("turboquant_attn.py:413:_continuation_prefill") == "turboquant_continuation"
    assert consumer_of("trtllm_ragged.py:20:__init__") == "mla_prefill_trtllm_ragged"
    assert consumer_of("somewhere.py:1:f") == "somewhere.py:1:f"


def test_repro_lifecycle_shows_the_moe_request_setting_the_lock():
    from click.testing import CliRunner

    from tqlab.cli import app

    r = CliRunner().invoke(app, ["repro", "--preset", "qwen3-30b-a3b", "--num-hidden-layers", "1", "--device", "meta"])
    lines = {line.split()[0]: line for line in r.output.splitlines() if line.startswith("  ")}
    assert "workspace [512.00 MiB]" in lines["profile_run"] and "fused MoE _allocate_buffers" in lines["profile_run"]
    assert "workspace [0.00 MiB]" in lines["load_model"]
    assert re.search(r"slot 0 = 512\.00 MiB, set by fused_moe \(modular_kernel\.py:\d+:_allocate_buffers\) in profile_run$",
                     lines["lock"])
