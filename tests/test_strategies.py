"""The four candidate fixes (tqlab.strategies): who survives, who stays graph-safe, and the exact bytes.

One tiny deployment runs every strategy for real on CPU (real arithmetic, a
few seconds in all). Its numbers, per tensor-parallel rank:
Hq=2, Hk=1, D=16, float32, 4 KV splits, block 16, max_num_seqs 2,
max_num_batched_tokens 256, max_model_len 1024.

* unfixed lock = decode views at 2 rows: (2,2,4,17) f32 1088 B -> 1280,
  (2,2,16) f32 256 B, (2,2) f32 16 B -> 256: 1792 bytes.
* continuation at cached_len c: 2 x (1,1,c,16) f16 = 64*c bytes.
* PR #44053's reservation: max(decode at 2 rows, continuation at 1023 -> 1024)
  = 65536 bytes.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

from tqlab import strategies as S
from tqlab.predict.analysis import first_failing_prompt, unfixed_locked_bytes, workspace_bytes_for_prompt
from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.lab.display import markdown_table
from tqlab.lab.strategy_tables import strategy_table
from tqlab.core.workspace import WorkspaceLockedError, format_mb, rewarm_workspace, ubatch_context

TINY = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_hidden_layers=1, max_model_len=1024,
            max_num_seqs=2, max_num_batched_tokens=256, block_size=16, dtype="float32",
            tq_max_kv_splits_for_cuda_graph=4, turboquant_backend_on_unquantized=True)  # consumers on an auto cache
SEED_PROMPT, LONG_PROMPT, DECODE_STEPS = 512, 1015, 8  # 512 = 2 chunks (the seed's 8K prompt, scaled); 1015+9 = 1024


@pytest.fixture(scope="module")
def tiny() -> EngineConfig:
    return EngineConfig(**TINY)


@pytest.fixture(scope="module")
def nemotron() -> EngineConfig:
    return EngineConfig.from_preset("nemotron-3-super-120b-a12b")


@pytest.fixture(scope="module")
def results(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", S.WorkspaceFallbackWarning)
        return {s: S.run_strategy(tiny, s, device="cpu", prompts=(SEED_PROMPT, LONG_PROMPT), decode_steps=DECODE_STEPS)
                for s in S.ALL_STRATEGIES}


def _tokens(config, strategy, prompt, max_tokens=3):
    e = S.make_strategy_engine(config, strategy, device="cpu")
    return e, e.generate(prompt, max_tokens=max_tokens).output_token_ids


# --------------------------------------------------------------------------- names and factory
def test_strategy_names():
    assert S.STRATEGIES == ("none", "dummy_run", "reserve", "replay_aware", "fallback")
    assert S.ALL_STRATEGIES == S.STRATEGIES + ("grow_no_recapture",)
    assert [S.STRATEGY_INFO[s]["seed_fix"] for s in S.STRATEGIES] == ["-", "1", "2", "3", "4"]


def test_make_engine_refuses_bad_arguments(tiny):
    with pytest.raises(ValueError, match="unknown strategy 'reserved'"):
        S.make_strategy_engine(tiny, "reserved")
    with pytest.raises(ValueError, match="fix= is chosen by the strategy"):
        S.make_strategy_engine(tiny, "none", fix=True)
    with pytest.raises(ValueError, match="after_profile= is chosen by the strategy"):
        S.make_strategy_engine(tiny, "none", after_profile=lambda e: None)
    with pytest.raises(TypeError, match="get_simultaneous"):
        S.FallbackWorkspace(object())
    e = S.make_strategy_engine(tiny, "none")
    with pytest.raises(ValueError, match="growth_factor must be a number >= 1.0, got 0.5"):
        S.ReplayAwareWorkspace(e, growth_factor=0.5)


def test_make_engine_wires_each_strategy(tiny):
    kinds = {}
    for s in S.ALL_STRATEGIES:
        e = S.make_strategy_engine(tiny, s)
        assert e.strategy == s and e.workspace.is_locked()
        kinds[s] = type(e.strategy_state).__name__
        assert e.backend.workspace is (e.workspace if e.strategy_state is None else e.strategy_state)
        assert e.runner.workspace is e.workspace  # captures keep recording the manager's pointers
        assert [n for n, _ in e.phase_marks][0] == "start"
    assert kinds == {"none": "NoneType", "dummy_run": "NoneType", "reserve": "NoneType",
                     "replay_aware": "ReplayAwareWorkspace", "fallback": "FallbackWorkspace",
                     "grow_no_recapture": "ReplayAwareWorkspace"}
    assert S.make_strategy_engine(tiny, "grow_no_recapture").strategy_state.recapture is False


# --------------------------------------------------------------------------- exact bytes
def test_unfixed_lock_size_is_what_the_unfixed_engine_locks(tiny, nemotron):
    assert unfixed_locked_bytes(tiny) == 1792
    assert LLMEngine(tiny, fix=False, device="cpu").locked_bytes == 1792
    assert unfixed_locked_bytes(tiny.replace(enforce_eager=True)) == 0
    # the bug report's "current size is 0.26 MB"
    assert unfixed_locked_bytes(nemotron) == 268544
    assert format_mb(unfixed_locked_bytes(nemotron)) == "0.26"


def test_dummy_run_chunks(tiny, nemotron):
    # short continuation chunks (<= 128 tokens) run the decode kernel without the workspace (vLLM 0.33)
    assert S.dummy_run_chunks(nemotron) == [(130942, 129)]
    assert S.dummy_run_chunks(tiny) == [(894, 129)]
    no_chunking = tiny.replace(enable_chunked_prefill=False, max_num_batched_tokens=1024)
    assert S.dummy_run_chunks(no_chunking) == []


def test_dummy_run_grows_before_capture(tiny):
    e = S.make_strategy_engine(tiny, "dummy_run")
    names = [p.name for p in e.phases]
    assert names == ["init_workspace", "load_model", "profile_run", "build_backend", "after_profile", "capture", "lock"]
    after = dict((p.name, p.workspace_bytes) for p in e.phases)
    # continuation at cached 894 -> round_up(894, 16) = 896: 2 x (1,1,896,16) f16 = 64 * 896
    assert after["profile_run"] == (0,) and after["after_profile"] == (57344,) == after["lock"]
    assert S.captured_graphs_valid(e)
    # start-up calls are counted apart from serving (LLMEngine.startup_path_counts)
    assert e.startup_path_counts["continuation"] == 1 and e.startup_path_counts["decode_kernel"] == 0
    assert set(e.backend.path_counts.values()) == {0}


def test_workspace_vs_max_model_len_seed_deployment(nemotron):
    (row,) = S.workspace_vs_max_model_len(nemotron, [131072])
    # 2 x (1, 1, 131072, 128) f16; KV: 102-byte turboquant_3bit_nc slot x 1 KV head x 8 layers x 131072
    assert row == dict(max_model_len=131072, reserved_bytes=67108864, unfixed_bytes=268544,
                       kv_bytes=102 * 8 * 131072, share=67108864 / (102 * 8 * 131072))


def test_workspace_vs_max_model_len_dbo_reserves_slot_0_only(nemotron):
    one = S.workspace_vs_max_model_len(nemotron, [8192])[0]
    two = S.workspace_vs_max_model_len(nemotron.replace(enable_dbo=True), [8192])[0]
    assert one["reserved_bytes"] == 2 * 1 * 8192 * 128 * 2 == 4194304
    assert two["reserved_bytes"] == one["reserved_bytes"]  # vLLM's builder reserves the slot it runs in
    assert two["unfixed_bytes"] == 2 * 268544


# --------------------------------------------------------------------------- threshold sweep
def _brute_force_longest(config):
    lb = unfixed_locked_bytes(config)
    n = 0
    while n + 1 < config.max_model_len and workspace_bytes_for_prompt(config, n + 1) <= lb:
        n += 1
    return n


@pytest.mark.parametrize("budget", [128, 256, 512])
def test_threshold_sweep_matches_brute_force(tiny, budget):
    (row,) = S.threshold_sweep(tiny, "max_num_batched_tokens", [budget], progress=False)
    assert row["longest_prompt"] == _brute_force_longest(tiny.replace(max_num_batched_tokens=budget))


def test_threshold_sweep_seed_deployment(nemotron):
    # 4224 tokens survive: the 2nd chunk of a 4225-token prompt has 129 new tokens after 4096 cached ones,
    # so it dequantizes them: 2 x (1,1,4096,128) f16 = 2 MiB > 0.26 MB. (Up to 128 new tokens it runs the
    # decode kernel, which asks the workspace for nothing.)
    assert S.longest_surviving_prompt(nemotron) == 4224
    rows = S.threshold_sweep(nemotron, "tensor_parallel_size", [1, 2, 3, 4, 8], progress=False)
    assert [r["tensor_parallel_size"] for r in rows] == [1, 2, 4, 8]  # TP 3 does not divide 32 heads: skipped
    rows = S.threshold_sweep(nemotron, "max_num_seqs", [4, 8192], progress=False)
    assert [r["max_num_seqs"] for r in rows] == [4]  # 8192 > max_num_batched_tokens: invalid, skipped
    with pytest.raises(ValueError, match="param must be"):
        S.threshold_sweep(nemotron, "block_size", [16], progress=False)


# --------------------------------------------------------------------------- the comparison on CPU
def test_survival_and_graph_safety(results):
    survived = {s: [p.survived for p in r.prompts] for s, r in results.items()}
    assert survived == {
        "none": [False, False],
        "dummy_run": [True, True],
        "reserve": [True, True],
        "replay_aware": [True, True],
        "fallback": [True, True],
        "grow_no_recapture": [True, True],
    }
    assert {s: r.survives_max_model_len for s, r in results.items()} == {
        "none": False, "dummy_run": True, "reserve": True, "replay_aware": True, "fallback": True,
        "grow_no_recapture": True}
    assert {s: r.graph_safe for s, r in results.items()} == {
        "none": True, "dummy_run": True, "reserve": True, "replay_aware": True, "fallback": True,
        "grow_no_recapture": False}


def test_comparison_bytes_are_exact(results):
    got = {s: (r.reserved_bytes, r.final_workspace_bytes, r.computed_peak_bytes) for s, r in results.items()}
    # 1015 tokens: chunks at cached 0, 256, 512, 768; the largest continuation is 64 * 768 = 49152 bytes
    assert got == {
        "none": (1792, 1792, 1792),
        "dummy_run": (57344, 57344, 57344),
        "reserve": (65536, 65536, 65536),
        "replay_aware": (1792, 49152, 49152),
        "fallback": (1792, 1792, 1792 + 49152),
        "grow_no_recapture": (1792, 49152, 49152),
    }
    assert all(r.peak_source == "computed" and r.peak_bytes == r.computed_peak_bytes for r in results.values())


def test_unfixed_engine_dies_like_the_bug_report(results):
    none = results["none"]
    assert none.engines_built == 2  # the second prompt got a fresh engine, and died too
    err = none.prompts[0].error
    assert err.startswith("WorkspaceLockedError: Workspace is locked but allocation from 'turboquant_attn.py:")
    assert "_continuation_prefill' requires 0.02 MB, current size is 0.00 MB." in err  # 16384 vs 1792 bytes
    assert none.prompts[0].ttft_s is None and none.prompts[1].engine_rebuilt


def test_counters(results):
    assert results["fallback"].fallback_calls == 1 + 3  # 1 continuation chunk, then 3
    assert [p.fallback_calls for p in results["fallback"].prompts] == [1, 3]
    assert [p.recaptures for p in results["replay_aware"].prompts] == [1, 2]  # 16384 -> 32768 -> 49152
    assert results["replay_aware"].recaptures == 3
    assert results["grow_no_recapture"].recaptures == 0
    assert all(p.decode_steps_timed == DECODE_STEPS for r in results.values() for p in r.prompts if p.survived)


def test_table_rows(results):
    rows = strategy_table([results[s] for s in S.STRATEGIES])
    assert [r["strategy"] for r in rows] == list(S.STRATEGIES)
    assert rows[0]["TTFT 512-token"] == "dies" and rows[0]["survives max_model_len"] == "no"
    assert rows[2]["reserved"] == "64.00 KiB" and rows[2]["graph-safe"] == "yes"
    assert rows[3]["notes"] == "3 re-captures" and rows[4]["notes"] == "4 fallback calls"
    md = markdown_table(None, rows)
    assert md.splitlines()[0].startswith("| strategy | bug report's fix | start-up | reserved | peak (computed) |")
    quiet = strategy_table([results[s] for s in S.STRATEGIES], timings=False)  # bytes and survival only
    assert list(quiet[0])[:4] == ["strategy", "bug report's fix", "reserved", "peak (computed)"]
    assert not any("TTFT" in k or "start-up" in k or "decode step" in k for k in quiet[0])
    assert quiet[0]["512-token prompt"] == "dies" and quiet[2]["512-token prompt"] == "served"
    assert S.StrategyResult.from_dict(results["reserve"].to_dict()) == results["reserve"]


# --------------------------------------------------------------------------- each fix in detail
def test_reserve_and_dummy_run_cover_every_prompt(tiny):
    # alone, a request's chunks start at multiples of 256: its largest continuation is at cached 768
    # (64 * 768 = 49152 bytes); the dummy run sizes for 894 cached tokens (57344 bytes), which a chunk
    # sharing its step with other requests can reach; reserve sizes for 1023 -> 1024 (65536 bytes)
    assert first_failing_prompt(tiny, 49152) is None
    assert first_failing_prompt(tiny, 49151) == 768 + 129
    assert first_failing_prompt(tiny, 57344) is None and first_failing_prompt(tiny, 65536) is None
    # a prompt ending in a short continuation chunk (97 tokens after 256) takes the decode kernel:
    # no workspace call, so even the unfixed engine serves it
    n = 256 + 97
    assert workspace_bytes_for_prompt(tiny, n) == 0
    assert S.make_strategy_engine(tiny, "none").generate(n, max_tokens=1).finished


def test_fallback_warns_once_completes_and_matches_reserve(tiny):
    _, want = _tokens(tiny, "reserve", LONG_PROMPT)
    e = S.make_strategy_engine(tiny, "fallback")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = e.generate(LONG_PROMPT, max_tokens=3).output_token_ids
        e.generate(SEED_PROMPT, max_tokens=2)
    fb = [w for w in caught if issubclass(w.category, S.WorkspaceFallbackWarning)]
    assert len(fb) == 1
    msg = str(fb[0].message)
    assert msg.startswith("workspace fallback: 'turboquant_attn.py:") and "_continuation_prefill' needs 0.02 MiB" in msg
    assert "but the locked workspace holds 0.00 MiB" in msg
    # the manager's log names the consumer, not the wrapper
    assert {ev.caller.split(":")[-1] for ev in e.workspace.events if ev.kind == "violation"} == {"_continuation_prefill"}
    assert got == want
    st = e.strategy_state
    assert (st.fallback_calls, st.fallback_bytes_max, st.fallback_bytes_total) == (4, 49152, 16384 + 32768 + 49152 + 16384)
    assert e.workspace.is_locked() and e.workspace.sizes_bytes() == [1792]  # the manager is untouched
    assert Counter(ev.kind for ev in e.workspace.events)["violation"] == 4


def test_replay_aware_relocks_recaptures_and_matches_reserve(tiny):
    _, want = _tokens(tiny, "reserve", LONG_PROMPT)
    e = S.make_strategy_engine(tiny, "replay_aware")
    captured = []
    real_capture = e.runner.decode_runner.capture
    e.runner.decode_runner.capture = lambda b, *a, **k: captured.append(b) or real_capture(b, *a, **k)
    got = e.generate(LONG_PROMPT, max_tokens=3).output_token_ids
    assert got == want
    st = e.strategy_state
    assert [g["new_bytes"] for g in st.regrowths] == [16384, 32768, 49152]
    assert (st.recaptures, st.recaptured_graphs) == (3, 6)
    assert captured == [2, 1] * 3  # every bucket, largest first, after every growth
    assert e.workspace.is_locked() and e.workspace.sizes_bytes() == [49152]
    assert [r.workspace_bytes for r in e.captures] == [[49152], [49152]]
    assert S.captured_graphs_valid(e)
    serve = [(r["kind"], r["caller"].split(":")[0]) for r in S.workspace_timeline(e) if r["phase"] == "serve"]
    assert serve == [("violation", "turboquant_attn.py"), ("unlock", "fixes.py"), ("resize", "turboquant_attn.py"),
                     ("lock", "fixes.py")] * 3
    assert {g["caller"].split(":")[-1] for g in st.regrowths} == {"_continuation_prefill"}


def test_replay_aware_growth_factor(tiny):
    e = S.make_strategy_engine(tiny, "replay_aware")
    e.strategy_state.growth_factor = 4.0
    e.generate(LONG_PROMPT, max_tokens=1)
    # 1792 -> max(16384, 7168) = 16384 -> max(32768, 65536) = 65536: one growth covers the 49152 need
    assert [g["new_bytes"] for g in e.strategy_state.regrowths] == [16384, 65536]


def test_grow_without_recapture_leaves_stale_graphs(tiny):
    e = S.make_strategy_engine(tiny, "grow_no_recapture")
    ptrs_at_capture = [r.workspace_ptrs for r in e.captures]
    e.generate(SEED_PROMPT, max_tokens=1)
    assert [r.workspace_bytes for r in e.captures] == [[1792], [1792]]
    assert e.workspace.sizes_bytes() == [16384]
    assert [r.workspace_ptrs for r in e.captures] == ptrs_at_capture
    assert not S.captured_graphs_valid(e)


def test_timeline_phases_for_the_unfixed_engine(tiny):
    e = S.make_strategy_engine(tiny, "none")
    with pytest.raises(WorkspaceLockedError):
        e.generate(SEED_PROMPT, max_tokens=1)
    rows = S.workspace_timeline(e)
    assert [(r["phase"], r["kind"], r["new_bytes"]) for r in rows] == [
        ("capture", "resize", 1792), ("lock", "lock", 1792), ("serve", "violation", 16384)]
    with pytest.raises(ValueError, match="make_strategy_engine"):
        S.workspace_timeline(LLMEngine(tiny, fix=True))


# --------------------------------------------------------------------------- chart helpers
def test_growth_peak_computed_on_cpu():
    sizes = [1 << 20, 2 << 20, 4 << 20]
    got = {m: S.growth_peak(sizes, m) for m in ("resize_", "free_then_allocate", "allocate_then_free")}
    assert {m: (g["final_bytes"], g["peak_bytes"]) for m, g in got.items()} == {
        "resize_": (4 << 20, 6 << 20), "free_then_allocate": (4 << 20, 4 << 20),
        "allocate_then_free": (4 << 20, 6 << 20)}
    with pytest.raises(ValueError, match="increasing"):
        S.growth_peak([4, 2], "resize_")
    with pytest.raises(ValueError, match="method must be"):
        S.growth_peak([4], "realloc")


def test_dbo_slot_policies(tiny):
    all_slots = S.dbo_memory_held(tiny, LONG_PROMPT, grow_all_slots=True)
    requesting = S.dbo_memory_held(tiny, LONG_PROMPT, grow_all_slots=False)
    # 1 decode row next to chunks of 255: continuation up to cached 765 -> 64 * 768 = 49152
    assert all_slots["slot_bytes"] == [49152, 49152]
    assert requesting["slot_bytes"] == [49152, 1280]  # slot 1 holds 1 decode row: 768 + 256 + 256
    assert all_slots["final_bytes"] - requesting["final_bytes"] == 49152 - 1280


def test_trace_and_replay(tiny):
    trace = S.long_request_trace(tiny, LONG_PROMPT, decode_steps=2)
    assert Counter(c.kind for c in trace) == {"continuation": 3, "decode": 2}
    assert [c.step for c in trace] == [1, 2, 3, 4, 5]
    for mode in ("workspace", "torch_empty"):
        r = S.replay_trace(tiny, trace, mode)
        assert len(r["per_call_us"]) == len(trace) and r["kinds"] == [c.kind for c in trace]
    with pytest.raises(ValueError, match="mode must be"):
        S.replay_trace(tiny, trace, "pool")
    with pytest.raises(ValueError, match="must fit in max_model_len"):
        S.long_request_trace(tiny, 1024, decode_steps=2)


def test_captured_graphs_valid_ignores_slots_empty_at_capture(tiny):
    e = S.make_strategy_engine(tiny.replace(enable_dbo=True), "none")
    assert [r.workspace_bytes for r in e.captures] == [[1792, 0], [1792, 0]]
    with rewarm_workspace(e.workspace), ubatch_context(1):
        e.workspace.get_simultaneous(((4096,), torch.uint8))
    assert S.captured_graphs_valid(e)  # slot 1 was never captured


def test_replay_aware_recaptures_through_the_graph_decode_runner(tiny):
    """The CUDA-graph decode runner (simulated graphs on CPU), with its pointer guard on every replay."""
    from tqlab.engine.cuda_graph import install_decode_runner
    from tqlab.engine.replay_guard import StalePointerError

    out = {}
    for strategy in ("reserve", "replay_aware", "grow_no_recapture"):
        e = S.make_strategy_engine(tiny, strategy)
        dr = install_decode_runner(e, mode="simulated")
        e.captures = e.runner.capture_model(tuple(r.batch_size for r in e.captures))
        # the capture's recorder sat in front of the strategy's client and is gone again
        assert e.backend.workspace is (e.workspace if e.strategy_state is None else e.strategy_state)
        try:
            out[strategy] = (e.generate(LONG_PROMPT, max_tokens=4).output_token_ids, dict(dr.stats))
        except StalePointerError as err:
            assert e.dead is err
            out[strategy] = ("stale", dict(dr.stats))
        if strategy == "replay_aware":  # it re-captured through the graph runner and is still in place
            assert e.strategy_state.recaptures == 3 and e.backend.workspace is e.strategy_state
            assert dr.stale_buckets() == [] and sorted(dr.records) == [1, 2]
    assert out["replay_aware"][0] == out["reserve"][0]
    assert out["replay_aware"][1] == out["reserve"][1] == {
        "replays": 3, "eager_fallbacks": 0, "guard_checks": 3, "guard_trips": 0}
    assert out["grow_no_recapture"] == ("stale", {"replays": 0, "eager_fallbacks": 0, "guard_checks": 1,
                                                  "guard_trips": 1})
