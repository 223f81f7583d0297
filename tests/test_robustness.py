"""Bad input and failure paths found by a cold review: clear errors, state unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tqlab.core import workspace as ws
from tqlab.cli import app
from tqlab.core.config import EngineConfig
from tqlab.engine import EngineDeadError, LLMEngine
from tqlab.engine.scheduler import BlockPool, Scheduler
from tqlab.core.reservation import chunk_workspace_request
from tqlab.predict.analysis import first_failing_prompt, workspace_bytes_for_prompt
from tqlab.core.workspace import WorkspaceLockedError, WorkspaceManager

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
    with pytest.raises(ValueError, match="multiple must be > 0"):
        ws.round_up(5, 0)


def test_repro_rejects_a_prompt_longer_than_max_model_len_up_front():
    r = CliRunner().invoke(app, ["repro", "--preset", NEMOTRON, "--device", "meta", "--prompt-tokens", "131072"])
    assert r.exit_code == 2
    assert "--prompt-tokens 131072: vLLM refuses a prompt of max_model_len (131072) tokens or more" in r.output
    assert "lifecycle" not in r.output


def test_repro_counts_serving_paths_only():
    r = CliRunner().invoke(app, ["repro", "--preset", NEMOTRON, "--device", "meta", "--fix", "--num-hidden-layers", "1"])
    assert r.exit_code == 0, r.output
    # vLLM's default max_tokens 16: the prefill samples the first token, 15 decode steps follow
    assert "paths used: {'prefill': 1, 'decode': 15, 'decode_kernel': 0, 'continuation': 1}" in r.output


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


# --------------------------------------------------------------------------- #
# Issue 14: the block pool keeps no per-block Python objects                  #
# --------------------------------------------------------------------------- #


class _ListPool:
    """The block pool as it was (one list entry per free block): the reference for the order."""

    def __init__(self, n):
        self.free_ids = list(range(n - 1, 0, -1))

    def allocate(self, n):
        if n > len(self.free_ids):
            raise RuntimeError
        return [self.free_ids.pop() for _ in range(n)]

    def free(self, ids):
        self.free_ids.extend(reversed(ids))


def test_block_pool_order_free_and_merge_exact():
    p = BlockPool(10)
    assert (p.num_free, p.num_runs) == (9, 1)
    a, b = p.allocate(3), p.allocate(2)
    assert (a, b, p.num_free) == ([1, 2, 3], [4, 5], 4)
    p.free(b)
    p.free(a)  # [1, 2, 3] ends on top, and 1..3 + 4..5 + 6..9 merge back into one run
    assert (p.num_free, p.num_runs) == (9, 1)
    assert p.allocate(4) == [1, 2, 3, 4]
    p.free([4, 1, 2])
    assert p.num_runs == 3  # [4], then [1, 2], on top of [5, 10)
    assert p.allocate(5) == [4, 1, 2, 5, 6]
    with pytest.raises(RuntimeError, match="out of KV-cache blocks: need 4, 3 free"):
        p.allocate(4)
    assert p.num_free == 3 and p.allocate(3) == [7, 8, 9]


@pytest.mark.parametrize("bad, exc, match", [
    (lambda p: p.allocate(-1), ValueError, "got -1"),
    (lambda p: p.allocate(2.0), ValueError, "got 2.0"),
    (lambda p: p.free([0]), ValueError, "cannot free block 0"),
    (lambda p: p.free([3, 10]), ValueError, "cannot free block 10: block ids run from 1 to 9"),
    (lambda p: p.free([True]), ValueError, "cannot free block True"),
])
def test_block_pool_bad_calls_change_nothing(bad, exc, match):
    p = BlockPool(10)
    p.allocate(2)
    with pytest.raises(exc, match=match):
        bad(p)
    assert (p.num_free, p.num_runs, p.allocate(2)) == (7, 1, [3, 4])


@pytest.mark.parametrize("n", [1, 0, -5, 2.5, True])
def test_block_pool_needs_two_int_blocks(n):
    with pytest.raises(ValueError, match="need at least 2|must be an int"):
        BlockPool(n)


@pytest.mark.parametrize("seed", range(40))
def test_block_pool_hands_out_the_same_ids_as_the_list_it_replaces(seed):
    import random
    rng = random.Random(seed)
    n = rng.randint(2, 80)
    new, old, held = BlockPool(n), _ListPool(n), []
    for _ in range(120):
        if held and rng.random() < 0.45:
            ids = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.3:
                rng.shuffle(ids)
            new.free(ids)
            old.free(ids)
        else:
            k = rng.randint(0, 9)
            got = [None, None]
            for i, pool in enumerate((new, old)):
                try:
                    got[i] = pool.allocate(k)
                except RuntimeError:
                    got[i] = "refused"
            assert got[0] == got[1]
            if got[0] != "refused":
                held.append(got[0])
        assert new.num_free == len(old.free_ids)


def test_a_billion_token_meta_cache_is_one_run_not_a_list():
    import tracemalloc
    cfg = EngineConfig.from_preset(NEMOTRON, max_model_len=10**9)
    num_blocks = -(-10**9 // cfg.block_size) + 1  # as LLMEngine sizes it: 62,500,001 blocks
    tracemalloc.start()
    try:
        sched = Scheduler(cfg, num_blocks)
        first = sched.pool.allocate(512)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (sched.pool.num_blocks, sched.pool.num_free, sched.pool.num_runs) == (62_500_001, 62_499_488, 1)
    assert first == list(range(1, 513))
    assert peak < 200_000  # bytes: the 512 ids handed out, not 62.5M list entries (~500 MB)


# --------------------------------------------------------------------------- #
# Issue 14: a dead engine has no unfinished requests to poll                   #
# --------------------------------------------------------------------------- #


def test_has_unfinished_requests_raises_engine_dead_after_a_locked_workspace(nemo1):
    eng = LLMEngine(nemo1, fix=False, device="meta")
    eng.add_request(8192)
    assert eng.has_unfinished_requests()
    with pytest.raises(WorkspaceLockedError) as ei:
        while eng.has_unfinished_requests():  # vLLM's LLM._run_engine loop
            eng.step()
    with pytest.raises(EngineDeadError) as dead:
        eng.has_unfinished_requests()
    assert dead.value.cause is ei.value and eng.dead is ei.value


def test_any_step_failure_kills_the_engine_and_has_unfinished_requests_says_so(nemo1, monkeypatch):
    eng = LLMEngine(nemo1, fix=True, device="meta")
    eng.add_request(16)

    def broken(sched):
        raise RuntimeError("kernel launch failed (simulated)")

    monkeypatch.setattr(eng.runner, "execute_model", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        eng.step()
    for call in (eng.has_unfinished_requests, eng.step, lambda: eng.add_request(4)):
        with pytest.raises(EngineDeadError, match=r"Cause: RuntimeError: kernel launch failed \(simulated\)"):
            call()


# --------------------------------------------------------------------------- #
# Issue 14: benchmarks write to build/ unless asked to record                  #
# --------------------------------------------------------------------------- #


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """The benchmark modules with data/ and build/ redirected to tmp_path."""
    import importlib
    import sys
    bdir = str(Path(__file__).resolve().parent.parent / "benchmarks")
    monkeypatch.syspath_prepend(bdir)
    rec = importlib.import_module("_recording")
    monkeypatch.setattr(rec, "DATA_DIR", tmp_path / "data")
    monkeypatch.setattr(rec, "BUILD_DIR", tmp_path / "build")
    mods = {}
    for name in ("bench_workspace_overhead", "bench_cuda_graphs", "bench_strategies"):
        mods[name] = sys.modules.get(name) or importlib.import_module(name)
        monkeypatch.setattr(mods[name], "default_dir", rec.default_dir)
    return tmp_path, mods


def _recording_with(path: Path, **fields) -> str:
    from tqlab.core.provenance import make_provenance, save_recorded
    save_recorded(path.stem, fields, make_provenance("test", commit="0" * 40), data_dir=path.parent)
    return path.read_text()


def test_overhead_smoke_run_goes_to_build_and_never_replaces_a_bigger_recording(bench):
    tmp, mods = bench
    main = mods["bench_workspace_overhead"].main
    rec = tmp / "data" / "workspace_overhead_cpu.json"
    before = _recording_with(rec, number=500, repeats=400)
    assert main(["--number", "2", "--repeats", "1"]) == 0
    assert (tmp / "build" / "workspace_overhead_cpu.json").is_file() and rec.read_text() == before
    assert main(["--number", "200", "--repeats", "1", "--record"]) == 2
    assert rec.read_text() == before
    assert main(["--number", "2", "--repeats", "1", "--record", "--force"]) == 0
    assert json.loads(rec.read_text())["number"] == 2


def test_overhead_recording_is_replaced_by_a_run_at_least_as_long(bench):
    tmp, mods = bench
    rec = tmp / "data" / "workspace_overhead_cpu.json"
    _recording_with(rec, number=2, repeats=2)
    assert mods["bench_workspace_overhead"].main(["--number", "4", "--repeats", "1", "--record"]) == 0
    assert json.loads(rec.read_text())["number"] * json.loads(rec.read_text())["repeats"] == 4


def test_cuda_graph_and_strategy_benchmarks_refuse_a_shorter_run_before_running(bench, capsys):
    tmp, mods = bench
    lat = tmp / "data" / "cuda_graphs_latency.json"
    before = _recording_with(lat, results={"seed": {"iters": 30, "rows": [{}] * 4}})
    assert mods["bench_cuda_graphs"].main(["--record", "--models", "seed", "--iters", "29"]) == 2
    assert "(120 timed iterations (iters x batches)) with a run of 116" in capsys.readouterr().err
    assert lat.read_text() == before
    strat = tmp / "data" / "strategies_meta.json"
    before = _recording_with(strat, strategies=[{}] * 6, prompts=[8192, 131063], decode_steps=8)
    assert mods["bench_strategies"].main(["--device", "meta", "--tag", "meta", "--strategies", "none",
                                          "--decode-steps", "1", "--record"]) == 2
    assert "(96 decode steps (strategies x prompts x steps)) with a run of 2" in capsys.readouterr().err
    assert strat.read_text() == before
