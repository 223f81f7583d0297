"""Reservation (tqlab/core/reservation.py, mirrors PR #44053 ``_reserve_workspace``): exact shapes and bytes.

One formula per buffer: the consumers' shapes, the plan for pr-44053-unit-test exactly
as in the issue, the conditions for the continuation reservation, reserve_workspace on
every ubatch slot, the per-prompt predictions and first_failing_prompt, checked by
brute force.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tqlab.core.reservation as res
from tqlab.core import dtypes
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
    reserve_workspace,
)
from tqlab.predict.analysis import first_failing_prompt, prompt_chunks, workspace_bytes_for_prompt
from tqlab.core.workspace import (
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    init_workspace_manager,
    is_workspace_manager_initialized,
    reset_workspace_manager,
    ubatch_context,
)

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
NEMOTRON = "nemotron-3-super-120b-a12b"
PR_TEST = "pr-44053-unit-test"

# The nemotron deployment without the fix locks after decode capture at max_num_seqs=4, per rank
# (Hq=4, D=128, S=32, bf16): (4,4,32,129) f32 = 264,192 B + (4,4,128) bf16 = 4,096 B + (4,4) f32 = 64 -> 256 B.
NEMOTRON_LOCKED = 264_192 + 4_096 + 256  # 268,544 B = "0.26 MB"
# pr-44053-unit-test without the fix: (16,8,4,129) f32 = 264,192 + (16,8,128) f16 = 32,768 + (16,8) f32 = 512.
PR_LOCKED = 264_192 + 32_768 + 512  # 297,472 B


def _types(plan):
    return [[(type(s), tuple(type(d) for d in s), type(dt)) for s, dt in call] for call in plan]


# --------------------------------------------------------------------------- #
# Consumers                                                                   #
# --------------------------------------------------------------------------- #


def test_decode_workspace_shapes():
    assert decode_workspace_shapes(16, 8, 128, 4, f16) == (
        ((16, 8, 4, 129), f32),
        ((16, 8, 128), f16),
        ((16, 8), f32),
    )
    assert decode_workspace_shapes(0, 24, 256, 32, bf16) == (((0, 24, 32, 257), f32), ((0, 24, 256), bf16), ((0, 24), f32))


def test_continuation_workspace_shapes_round_up_to_block():
    assert continuation_workspace_shapes(8191, 4, 128, 32) == (((1, 4, 8192, 128), f16), ((1, 4, 8192, 128), f16))
    assert continuation_workspace_shapes(4096, 1, 128, 16) == (((1, 1, 4096, 128), f16),) * 2
    assert continuation_workspace_shapes(4097, 1, 128, 16)[0][0] == (1, 1, 4112, 128)
    assert continuation_workspace_shapes(0, 2, 64, 16)[0][0] == (1, 2, 0, 64)


@pytest.mark.parametrize("cached, expected", [(1, 2080), (2079, 2080), (2080, 2080), (2081, 4160), (4160, 4160), (4161, 6240)])
def test_continuation_rounds_to_a_hybrid_page_of_2080(cached, expected):
    (k, kd), (v, vd) = continuation_workspace_shapes(cached, 2, 128, 2080)
    assert k == v == (1, 2, expected, 128) and kd == vd == f16


@pytest.mark.parametrize(
    "call, exc, pattern",
    [
        (lambda: decode_workspace_shapes(-1, 8, 128, 4, f16), ValueError, r"batch_size.*-1"),
        (lambda: decode_workspace_shapes(1, 0, 128, 4, f16), ValueError, r"num_heads.*0"),
        (lambda: decode_workspace_shapes(1, 8, 128.0, 4, f16), ValueError, r"head_dim.*128\.0"),
        (lambda: decode_workspace_shapes(1, 8, 128, True, f16), ValueError, r"num_kv_splits.*True"),
        (lambda: decode_workspace_shapes(1, 8, 128, 4, "fp16"), TypeError, r"output_dtype.*'fp16'"),
        (lambda: continuation_workspace_shapes(-5, 4, 128, 16), ValueError, r"cached_len.*-5"),
        (lambda: continuation_workspace_shapes(5, 4, 128, 0), ValueError, r"block_size.*0"),
        (lambda: continuation_workspace_shapes(5, "4", 128, 16), ValueError, r"num_kv_heads.*'4'"),
    ],
)
def test_consumer_bad_arguments(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_chunk_paths_follow_the_threshold():
    c = EngineConfig.from_preset(NEMOTRON)
    assert CONTINUATION_DECODE_THRESHOLD == 128
    first = chunk_workspace_request(c, 0, 4096)
    assert (first.path, first.shapes, first.nbytes) == ("prefill", None, 0)
    # vLLM 0.33: a continuation chunk of <= 128 new tokens runs the decode kernel with its
    # own scratch and asks the workspace for nothing (checked against vLLM by parity/)
    for q in (1, 5, 17, 127, 128):
        short = chunk_workspace_request(c, 4096, q)
        assert (short.cached_len, short.q_len) == (4096, q)
        assert (short.path, short.shapes, short.nbytes) == ("decode_kernel", None, 0)
    assert chunk_workspace_request(c, 131071 - 128, 128).nbytes == 0  # whatever the cached length
    long = chunk_workspace_request(c, 4096, 129)
    assert long.path == "continuation"
    assert long.shapes == continuation_workspace_shapes(4096, 1, 128, 16)
    assert long.nbytes == 2 * 4096 * 128 * 2 == 2 * MiB


def test_consumers_and_reservation_share_one_formula(monkeypatch):
    """Change a consumer formula and the reservation follows: they call the same function."""
    c = EngineConfig.from_preset(PR_TEST)

    def doubled(cached_len, num_kv_heads, head_dim, block_size):
        shape = (2, num_kv_heads, cached_len + 1, head_dim)
        return ((shape, f16), (shape, f16))

    monkeypatch.setattr(res, "continuation_workspace_shapes", doubled)
    assert reservation_plan(c)[1] == doubled(8191, 4, 128, 32)
    assert chunk_workspace_request(c, 100, 200).shapes == doubled(100, 4, 128, 32)


# --------------------------------------------------------------------------- #
# The plan                                                                    #
# --------------------------------------------------------------------------- #


def test_plan_for_pr_44053_unit_test_is_exactly_the_issues():
    plan = reservation_plan(EngineConfig.from_preset(PR_TEST))
    assert plan == [
        (((16, 8, 4, 129), f32), ((16, 8, 128), f16), ((16, 8), f32)),
        (((1, 4, 8192, 128), f16), ((1, 4, 8192, 128), f16)),
    ]
    # shapes are tuples of plain ints, dtypes the torch-free stand-ins (issue 30: the predictor never imports torch)
    D = dtypes.DType
    assert _types(plan) == [
        [(tuple, (int,) * 4, D), (tuple, (int,) * 3, D), (tuple, (int,) * 2, D)],
        [(tuple, (int,) * 4, D)] * 2,
    ]
    assert [compute_layout(call).total_bytes for call in plan] == [PR_LOCKED, 16 * MiB]
    assert plan_bytes(plan) == 16 * MiB


def test_plan_for_nemotron_per_rank():
    c = EngineConfig.from_preset(NEMOTRON)
    plan = reservation_plan(c)
    assert plan == [
        (((4, 4, 32, 129), f32), ((4, 4, 128), bf16), ((4, 4), f32)),
        (((1, 1, 131072, 128), f16), ((1, 1, 131072, 128), f16)),
    ]
    assert [compute_layout(call).total_bytes for call in plan] == [NEMOTRON_LOCKED, 64 * MiB]
    assert plan_bytes(plan) == 64 * MiB


@pytest.mark.parametrize(
    "overrides, has_continuation",
    [
        (dict(), True),
        (dict(max_num_batched_tokens=129), True),
        (dict(max_num_batched_tokens=128), False),
        (dict(max_num_batched_tokens=16), False),
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=8192), False),
    ],
)
def test_continuation_is_reserved_only_with_chunked_prefill_above_128_tokens(overrides, has_continuation):
    plan = reservation_plan(EngineConfig.from_preset(PR_TEST, **overrides))
    assert len(plan) == (2 if has_continuation else 1)
    assert plan[0] == decode_workspace_shapes(16, 8, 128, 4, f16)


def test_plan_rounds_max_model_len_minus_one_to_the_block_in_use():
    base = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_num_seqs=1, max_num_batched_tokens=4096,
                kv_cache_dtype="turboquant_4bit_nc")
    for mml, expected in [(4161, 4160), (4162, 6240), (2081, 2080), (2082, 4160)]:
        c = EngineConfig(**base, block_size=2080, max_model_len=mml)
        assert reservation_plan(c)[1][0][0] == (1, 2, expected, 64)


def test_decode_batch_override():
    c = EngineConfig.from_preset(NEMOTRON)
    plan = reservation_plan(c, decode_batch=128)
    assert plan[0] == decode_workspace_shapes(128, 4, 128, 32, bf16)
    with pytest.raises(ValueError, match="decode_batch"):
        reservation_plan(c, decode_batch=0)


def test_plan_bytes_of_empty_plan_is_zero():
    assert plan_bytes([]) == 0


# --------------------------------------------------------------------------- #
# reserve_workspace                                                           #
# --------------------------------------------------------------------------- #


def test_reserve_workspace_makes_the_plan_calls_in_the_current_slot_only():
    """vLLM 0.33's builder reserves from its constructor, in slot 0: slot 1 stays empty (review finding 5)."""
    c = EngineConfig.from_preset(PR_TEST, enable_dbo=True)
    ws = WorkspaceManager("meta", c.num_ubatches)
    plan = reserve_workspace(c, ws)
    assert plan == reservation_plan(c)
    assert ws.sizes_bytes() == [16 * MiB, 0]
    assert [(e.kind, e.ubatch, e.old_bytes, e.new_bytes) for e in ws.events] == [
        ("resize", 0, 0, PR_LOCKED), ("resize", 0, PR_LOCKED, 16 * MiB),
    ]
    assert all(e.caller.startswith("reservation.py:") and e.caller.endswith(":reserve_workspace") for e in ws.events)
    with ubatch_context(1):  # a caller inside ubatch 1 reserves slot 1
        reserve_workspace(c, ws)
    assert ws.sizes_bytes() == [16 * MiB, 16 * MiB]
    ws.lock()
    for slot in (0, 1):
        with ubatch_context(slot):
            for call in plan:
                ws.get_simultaneous(*call)
    assert [e.kind for e in ws.events][-1] == "lock"


def test_after_the_reservation_slot_1_refuses_the_worst_chunk():
    c = EngineConfig.from_preset(PR_TEST, enable_dbo=True)
    ws = WorkspaceManager("meta", c.num_ubatches)
    reserve_workspace(c, ws)
    ws.lock()
    with ubatch_context(1), pytest.raises(WorkspaceLockedError) as ei:
        ws.get_simultaneous(*reservation_plan(c)[-1])
    assert (ei.value.ubatch, ei.value.required_bytes, ei.value.current_bytes) == (1, 16 * MiB, 0)


def test_reserve_workspace_defaults_to_the_module_manager():
    reset_workspace_manager()
    try:
        m = init_workspace_manager("meta")
        reserve_workspace(EngineConfig.from_preset(NEMOTRON))
        assert m.sizes_bytes() == [64 * MiB]
    finally:
        reset_workspace_manager()


def test_reserve_workspace_returns_early_when_no_manager_is_initialized():
    # vLLM PR #44053: `if not is_workspace_manager_initialized(): return` at the top of _reserve_workspace
    reset_workspace_manager()
    assert reserve_workspace(EngineConfig.from_preset(NEMOTRON)) == []
    assert not is_workspace_manager_initialized()  # nothing was created on the way
    m = init_workspace_manager("meta")
    try:
        assert len(reserve_workspace(EngineConfig.from_preset(NEMOTRON))) == 2 and m.sizes_bytes() == [64 * MiB]
    finally:
        reset_workspace_manager()


def test_reserve_workspace_on_a_locked_small_manager_raises():
    ws = WorkspaceManager("meta")
    ws.lock()
    with pytest.raises(WorkspaceLockedError) as ei:
        reserve_workspace(EngineConfig.from_preset(PR_TEST), ws)
    assert (ei.value.required_bytes, ei.value.current_bytes) == (PR_LOCKED, 0)
    assert ws.sizes_bytes() == [0]


# --------------------------------------------------------------------------- #
# Per-prompt predictions                                                      #
# --------------------------------------------------------------------------- #


def test_prompt_chunks():
    assert prompt_chunks(8192, 4096) == [(0, 4096), (4096, 4096)]
    assert prompt_chunks(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert prompt_chunks(1, 4096) == [(0, 1)]
    with pytest.raises(ValueError, match="prompt_tokens"):
        prompt_chunks(0, 4)


def test_workspace_bytes_for_nemotron_prompts():
    c = EngineConfig.from_preset(NEMOTRON)
    assert workspace_bytes_for_prompt(c, 4096) == 0  # one chunk, nothing cached
    # 4096 cached + 1..128 new: the decode kernel with its own scratch, no workspace call
    for n in (4097, 4100, 4101, 4113, 4224):
        assert workspace_bytes_for_prompt(c, n) == 0
    assert workspace_bytes_for_prompt(c, 4225) == 2 * 4096 * 128 * 2 == 2 * MiB  # continuation, cached 4096
    assert workspace_bytes_for_prompt(c, 8192) == 2 * MiB  # the bug report's prompt
    assert workspace_bytes_for_prompt(c, 8320) == 2 * MiB  # 3rd chunk of 128 tokens: decode kernel, no call
    assert workspace_bytes_for_prompt(c, 8321) == 2 * 8192 * 128 * 2 == 4 * MiB  # 3rd chunk of 129: cached 8192
    assert workspace_bytes_for_prompt(c, 131072) == 2 * 126_976 * 128 * 2


def test_first_failing_prompt_for_nemotron_is_4225_by_brute_force():
    c = EngineConfig.from_preset(NEMOTRON)
    assert first_failing_prompt(c, NEMOTRON_LOCKED) == 4225
    needs = [workspace_bytes_for_prompt(c, n) for n in range(1, 8401)]
    ok = [n for n, need in enumerate(needs, start=1) if need <= NEMOTRON_LOCKED]
    assert ok == list(range(1, 4225))  # every prompt up to 4224 survives, none after
    assert set(needs[:4224]) == {0}  # short continuation chunks make no workspace call
    assert needs[4225 - 1] == needs[8192 - 1] == 2 * MiB
    # even a workspace locked at 0 bytes (no decode capture) serves every prompt up to 4224
    assert first_failing_prompt(c, 0) == 4225
    assert first_failing_prompt(c, 2 * MiB - 1) == 4225
    assert first_failing_prompt(c, 2 * MiB) == 8192 + 129  # 3rd chunk of 129 tokens: cached 8192 -> 4 MiB
    # with the fix (64 MiB locked) every prompt up to max_model_len survives
    assert first_failing_prompt(c, 64 * MiB) is None
    assert workspace_bytes_for_prompt(c, c.max_model_len) <= 64 * MiB


def test_first_failing_prompt_for_pr_44053_unit_test_by_full_brute_force():
    c = EngineConfig.from_preset(PR_TEST)
    needs = [workspace_bytes_for_prompt(c, n) for n in range(1, c.max_model_len + 1)]
    expected = next(n for n, need in enumerate(needs, start=1) if need > PR_LOCKED)
    # 4096 cached + 1..128 new tokens: decode kernel, own scratch, no workspace call;
    # 129 new: continuation dequant buffers 2 x (1,4,4096,128) f16 = 8 MiB
    assert expected == 4096 + 129 == 4225
    assert set(needs[:4224]) == {0} and needs[4225 - 1] == 2 * 4 * 4096 * 128 * 2 == 8 * MiB
    assert first_failing_prompt(c, PR_LOCKED) == expected
    assert first_failing_prompt(c, 16 * MiB) is None


def test_first_failing_prompt_without_chunked_prefill_is_none():
    c = EngineConfig.from_preset(PR_TEST, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    assert first_failing_prompt(c, 0) is None
    assert workspace_bytes_for_prompt(c, 8000) == 0


@st.composite
def _small_configs(draw):
    hk = draw(st.sampled_from([1, 2]))
    return EngineConfig(
        num_attention_heads=hk * draw(st.sampled_from([1, 2, 4])),
        num_key_value_heads=hk,
        head_dim=draw(st.sampled_from([8, 16, 64])),
        max_model_len=draw(st.integers(1, 420)),
        max_num_seqs=1,
        max_num_batched_tokens=draw(st.integers(8, 300)),
        block_size=draw(st.sampled_from([1, 16, 32, 100])),
        tq_max_kv_splits_for_cuda_graph=draw(st.sampled_from([1, 4, 32])),
        turboquant_backend_on_unquantized=True,  # head_dim 8 is no TurboQuant size: the consumers on an auto cache
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
    )


@settings(max_examples=60)
@given(c=_small_configs(), data=st.data())
def test_first_failing_prompt_matches_brute_force(c, data):
    memo: dict[tuple[int, int], int] = {}

    def need(n: int) -> int:  # independent max over the prompt's chunks
        best = 0
        for cached, q in prompt_chunks(n, c.max_num_batched_tokens):
            if (cached, q) not in memo:
                memo[(cached, q)] = chunk_workspace_request(c, cached, q).nbytes
            best = max(best, memo[(cached, q)])
        return best

    needs = [need(n) for n in range(1, c.max_model_len + 1)]
    servable = needs[:-1]  # vLLM refuses a prompt of max_model_len tokens (no room for an output token)
    candidates = sorted({0, *needs, *(x - 1 for x in needs if x), *(x + 1 for x in needs)})
    locked = data.draw(st.sampled_from(candidates), label="locked_bytes")
    expected = next((n for n, x in enumerate(servable, start=1) if x > locked), None)
    assert first_failing_prompt(c, locked) == expected
    for n in data.draw(st.lists(st.integers(1, c.max_model_len), max_size=4), label="spot checks"):
        assert workspace_bytes_for_prompt(c, n) == needs[n - 1]


# --------------------------------------------------------------------------- #
# The split count: the deployment's (vLLM's), and the one that fills the GPU   #
# --------------------------------------------------------------------------- #


def test_deployment_decode_shapes_read_the_split_count_from_the_config():
    c = EngineConfig.from_preset(NEMOTRON)
    assert res.deployment_decode_shapes(c, 4) == res.decode_workspace_shapes(4, 4, 128, 32, c.dtype)
    assert res.deployment_decode_shapes(c.replace(tq_max_kv_splits_for_cuda_graph=64), 4)[0][0] == ((4, 4, 64, 129))
    assert res.deployment_decode_shapes(c, 4, 256)[0][0] == (4, 4, 256, 129)
    assert reservation_plan(c)[0] == res.deployment_decode_shapes(c, c.max_num_seqs)


def test_gpu_filling_split_count_follows_the_sm_count_and_kv_heads():
    seed = EngineConfig.from_preset(NEMOTRON)  # TP 8: one KV head per rank
    assert seed.num_kv_heads_per_rank == 1
    assert res.gpu_filling_kv_splits(seed) == 256  # 4 * 132 = 528 programs for one row -> 1024, capped at 256
    assert res.gpu_filling_kv_splits(seed, 4) == 256  # 132 -> 256
    assert res.gpu_filling_kv_splits(seed, 8) == 128  # 66 -> 128
    assert res.gpu_filling_kv_splits(seed.replace(gpu="A4000"), 4) == 64  # 48 SMs: 48 -> 64
    assert res.gpu_filling_kv_splits(seed, 64) == 32  # 9 -> never below the deployment's 32
    assert res.gpu_filling_kv_splits(seed.replace(tq_max_kv_splits_for_cuda_graph=64), 64) == 64
    with pytest.raises(ValueError, match="batch_size"):
        res.gpu_filling_kv_splits(seed, 0)


def test_kv_splits_advice_sizes_both_counts_with_the_one_decode_shape_function():
    c = EngineConfig.from_preset(NEMOTRON)
    a = res.kv_splits_advice(c)
    b, hq, d = c.max_num_seqs, c.num_heads_per_rank, c.head_dim
    assert (a.gpu, a.sm_count, a.configured_splits, a.filling_splits) == ("H200", 132, 32, 256)
    assert a.configured_bytes == res.plan_bytes([reservation_plan(c)[0]])
    assert a.filling_bytes == compute_layout(res.decode_workspace_shapes(b, hq, d, 256, c.dtype)).total_bytes
    assert a.filling_bytes == 2_117_888  # (4,4,256,129) f32 2,113,536 + (4,4,128) bf16 + (4,4) f32, views 256-B aligned
    assert a.flag == "--attention-config.tq_max_kv_splits_for_cuda_graph 256"
