"""Bad input and failure paths found by a cold review: clear errors, state unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tqlab import workspace as ws
from tqlab.cli import app
from tqlab.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.reservation import chunk_workspace_request, reservation_plan
from tqlab.analysis import first_failing_prompt, workspace_bytes_for_prompt
from tqlab.workspace import WorkspaceLockedError, WorkspaceManager

NEMOTRON = "nemotron-3-super-120b-a12b"


@pytest.fixture
def nemo1():
    return EngineConfig.from_preset(NEMOTRON, num_hidden_layers=1)


def test_engine_locks_its_own_manager_even_if_a_hook_installs_another(nemo1):
    other = []
    eng = LLMEngine(nemo1, fix=False, device="meta",
                    before_lock=lambda e: other.append(LLMEngine(nemo1, fix=False, device="meta")))
    assert eng.workspace.is_locked() and ws.current_workspace_manager() is other[0].workspace
    with pytest.raises(WorkspaceLockedError) as ei:
        eng.generate(8192)
    assert (ei.value.required_bytes, ei.value.current_bytes) == (2 * 1024 * 1024, 268544)


def test_failed_start_up_restores_the_previous_manager(nemo1):
    good = LLMEngine(nemo1, fix=True, device="meta")
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        LLMEngine(nemo1, device="meta", kv_cache_tokens=0)

    def boom(engine):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        LLMEngine(nemo1, device="meta", before_lock=boom)
    assert ws.current_workspace_manager() is good.workspace and good.workspace.is_locked()


@pytest.mark.parametrize("bad, match", [
    ([1.7, 2.2], "token 0 of the prompt is 1.7"),
    ([True, False], "token 0 of the prompt is True"),
    (torch.tensor([1.5, 2.5]), "1-D integer token ids"),
    (torch.zeros(2, 2, dtype=torch.long), r"shape \(2, 2\)"),
    (1.5, "got float 1.5"),
    (None, "got NoneType None"),
    ("hello", "got str 'hello'"),
    ([3, 600], "token id 600"),
    (0, "at least 1 token"),
])
def test_add_request_rejects_bad_prompts_and_stays_usable(bad, match):
    cfg = EngineConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_model_len=256,
                       max_num_seqs=2, max_num_batched_tokens=64)
    eng = LLMEngine(cfg, device="cpu")
    with pytest.raises(ValueError, match=match):
        eng.add_request(bad)
    assert not eng.has_unfinished_requests()
    assert len(eng.generate(np.int64(5), max_tokens=2).output_token_ids) == 2


def test_workspace_refuses_impossible_sizes_and_keeps_its_buffer():
    m = WorkspaceManager("cpu")
    (v,) = m.get_simultaneous(((64,), torch.float32))
    ptr = m.buffer(0).data_ptr()
    with pytest.raises(ValueError, match=r"2\*\*63 bytes"):
        m.get_simultaneous(((2**62,), torch.float32))
    assert (m.size_bytes(0), m.buffer(0).data_ptr(), len(m.events)) == (256, ptr, 1)


def test_workspace_keeps_the_slot_size_when_allocation_fails(monkeypatch):
    m = WorkspaceManager("cpu")
    m.get_simultaneous(((1024,), torch.uint8))
    real_empty = torch.empty

    def failing_empty(shape, *a, **k):
        if shape == (4096,):
            raise torch.OutOfMemoryError("simulated out of memory")
        return real_empty(shape, *a, **k)

    monkeypatch.setattr(torch, "empty", failing_empty)
    with pytest.raises(torch.OutOfMemoryError):
        m.get_simultaneous(((4096,), torch.uint8))
    monkeypatch.undo()
    assert m.size_bytes(0) == 1024 and m.events[-1].kind == "alloc_failed"
    assert (m.events[-1].old_bytes, m.events[-1].new_bytes) == (1024, 4096)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_workspace_on_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="torch.cuda.is_available"):
        WorkspaceManager("cuda")


def test_turboquant_head_dim_is_checked_by_the_config():
    with pytest.raises(ValueError, match="head_dim=100"):
        EngineConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=100, kv_cache_dtype="turboquant_3bit_nc")
    assert EngineConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=100).head_dim == 100  # auto: fine


def test_reservation_helpers_validate_their_inputs(nemo1):
    with pytest.raises(ValueError, match="locked_bytes"):
        first_failing_prompt(nemo1, -1)
    with pytest.raises(ValueError, match="locked_bytes"):
        first_failing_prompt(nemo1, "x")
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        workspace_bytes_for_prompt(nemo1, 10**6)
    with pytest.raises(ValueError, match="q_len"):
        chunk_workspace_request(nemo1, 100, 0)
    with pytest.raises(TypeError, match="EngineConfig"):
        reservation_plan({"max_num_seqs": 4})
    with pytest.raises(ValueError, match="multiple must be > 0"):
        ws.round_up(5, 0)


def test_repro_rejects_a_prompt_longer_than_max_model_len_up_front():
    r = CliRunner().invoke(app, ["repro", "--preset", NEMOTRON, "--device", "meta", "--prompt-tokens", "131072"])
    assert r.exit_code == 2
    assert "131073 exceeds max_model_len 131072" in r.output and "lifecycle" not in r.output


def test_repro_counts_serving_paths_only():
    r = CliRunner().invoke(app, ["repro", "--preset", NEMOTRON, "--device", "meta", "--fix", "--num-hidden-layers", "1"])
    assert r.exit_code == 0, r.output
    assert "paths used: {'prefill': 1, 'decode': 0, 'decode_kernel': 0, 'continuation': 1}" in r.output


def test_marked_wrappers_are_skipped_when_naming_the_caller():
    m = WorkspaceManager("cpu")
    m.lock()

    @ws.workspace_wrapper
    def passthrough(*req):
        return m.get_simultaneous(*req)

    def consumer():
        return passthrough(((16,), torch.float32))

    with pytest.raises(WorkspaceLockedError) as ei:
        consumer()
    assert ei.value.caller.endswith(":consumer") and m.events[-1].caller == ei.value.caller
    with pytest.raises(ValueError, match="wraps"):
        ws.workspace_wrapper(consumer, wraps=("grow",))
