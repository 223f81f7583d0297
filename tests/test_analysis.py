"""tqlab.predict.analysis: vLLM 0.33's capture sizes and lock, closed-form prompt analyses, predict() and its JSON.

Expected values are vLLM 0.33's (``vllm/config/vllm.py`` ``_set_cudagraph_sizes``,
``vllm/v1/worker/gpu_model_runner.py`` ``capture_model`` / ``_dummy_run``); the capture
sizes are also compared with vLLM's own code in ``parity/test_capture_sizes_parity.py``.
"""

from __future__ import annotations

import time

import pytest

from tqlab.core.notes import NoteKind

from tqlab.predict import analysis as A
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.core.workspace import format_mb

HEADS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             turboquant_backend_on_unquantized=True)  # TurboQuant's consumers on an auto cache (teaching variant)
NEMOTRON = "nemotron-3-super-120b-a12b"
PR_TEST = "pr-44053-unit-test"


# --------------------------------------------------------------------------- #
# Capture sizes                                                               #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seqs, expected", [
    (1, (1, 2)),  # ceiling min(1 * 1 * 2, 512) = 2
    (4, (1, 2, 4, 8)),  # ceiling 8
    (16, (1, 2, 4, 8, 16, 24, 32)),
    (20, (1, 2, 4, 8, 16, 20, 24, 32, 40)),  # max_num_seqs 20 appended (uniform decode size)
])
def test_default_capture_sizes(seqs, expected):
    assert A.capture_sizes(EngineConfig(**HEADS, max_num_seqs=seqs)) == expected


def test_default_ceiling_is_512_and_max_num_batched_tokens_caps_and_is_appended():
    sizes = A.capture_sizes(EngineConfig(**HEADS, max_num_seqs=1024))
    assert sizes[-1] == 512 and len(sizes) == 3 + 31 + 17
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512)
    assert A.capture_sizes(EngineConfig(**HEADS, max_num_seqs=64, max_num_batched_tokens=100)) == (
        1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100)


def test_explicit_sizes_are_filtered_by_max_num_batched_tokens_not_max_num_seqs():
    c = EngineConfig.from_preset(NEMOTRON, cudagraph_capture_sizes=(1, 2, 4, 8, 12))
    assert c.max_num_seqs == 4
    assert A.capture_sizes(c) == (1, 2, 4, 8, 12)  # vLLM keeps 8 and 12 (PIECEWISE graphs)
    assert A.decode_capture_sizes(c) == (1, 2, 4)  # FULL decode graphs: at most max_num_seqs tokens
    assert A.decode_rows_at_lock(c) == 4
    c2 = EngineConfig(**HEADS, max_num_seqs=4, max_num_batched_tokens=8, cudagraph_capture_sizes=(2, 8, 16))
    assert A.capture_sizes(c2) == (2, 8)


def test_no_capture_when_eager_or_none():
    c = EngineConfig.from_preset(NEMOTRON)
    for cc in (c.replace(enforce_eager=True), c.replace(cudagraph_mode="NONE")):
        assert A.capture_sizes(cc) == () and A.decode_rows_at_lock(cc) == 0
        assert A.locked_bytes(cc, fix=False) is None and A.locked_bytes(cc, fix=True) is None
    lock_on_eager = c.replace(enforce_eager=True, lock_workspace_when_eager=True)
    assert A.locked_bytes(lock_on_eager, fix=False) == 0
    assert A.locked_bytes(lock_on_eager, fix=True) == 64 << 20


def test_piecewise_captures_without_attention_and_locks_empty():
    c = EngineConfig.from_preset(NEMOTRON, cudagraph_mode="PIECEWISE")
    assert A.capture_sizes(c) == (1, 2, 4, 8)
    assert A.decode_capture_sizes(c) == () and A.decode_rows_at_lock(c) == 0
    assert A.locked_bytes(c, fix=False) == 0
    # FULL resolves to FULL_AND_PIECEWISE for TurboQuant (UNIFORM_BATCH)
    assert A.cudagraph_mode(c.replace(cudagraph_mode="FULL")) == "FULL_AND_PIECEWISE"
    assert A.locked_bytes(c.replace(cudagraph_mode="FULL_DECODE_ONLY"), fix=False) == 268_544


def test_inconsistent_max_cudagraph_capture_size_raises_as_vllm():
    c = EngineConfig(**HEADS, cudagraph_capture_sizes=(1, 2, 4), max_cudagraph_capture_size=8)
    with pytest.raises(ValueError, match=r"max_cudagraph_capture_size\(=8\).*cudagraph_capture_sizes\(=4\)"):
        A.capture_sizes(c)
    assert A.capture_sizes(EngineConfig(**HEADS, max_cudagraph_capture_size=20)) == (1, 2, 4, 8, 16)


def test_huge_max_num_seqs_is_capped_at_512_without_building_a_huge_list():
    t = time.perf_counter()
    c = EngineConfig(**HEADS, max_num_seqs=2**40, max_num_batched_tokens=2**40)
    assert A.capture_sizes(c)[-1] == 512 and A.decode_rows_at_lock(c) == 512
    with pytest.raises(ValueError, match="CUDA graphs"):
        A.capture_sizes(c.replace(max_cudagraph_capture_size=2**40))
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("k, sizes, rows", [
    (0, (1, 2, 4, 8), 4),
    (1, (2, 4, 8, 16), 4),  # rounded to multiples of 1 + k (adjust_cudagraph_sizes_for_spec_decode)
    (3, (4, 8, 16, 24, 32), 4),
])
def test_speculative_decoding_capture_sizes_and_rows(k, sizes, rows):
    c = EngineConfig.from_preset(NEMOTRON, num_speculative_tokens=k)
    assert A.capture_sizes(c) == sizes
    assert A.decode_rows_at_lock(c) == rows
    # k > 0: the capture's (1+k)-token rows take TurboQuant's first-chunk prefill path: nothing locked
    assert A.locked_bytes(c, fix=False) == (268_544 if k == 0 else 0)
    assert A.locked_bytes(c, fix=True) == 64 << 20


# --------------------------------------------------------------------------- #
# The deployments                                                     #
# --------------------------------------------------------------------------- #


def test_196_55_mb_when_vllm_captures_up_to_512():
    c = EngineConfig(num_attention_heads=48, num_key_value_heads=8, head_dim=128, tensor_parallel_size=2,
                     max_model_len=196_608, max_num_seqs=1024, max_num_batched_tokens=8192,
                     kv_cache_dtype="turboquant_4bit_nc")
    assert A.capture_sizes(c)[-1] == 512 and A.decode_rows_at_lock(c) == 512
    assert A.locked_bytes(c, fix=False) == 206_094_336
    assert format_mb(A.locked_bytes(c, fix=False)) == "196.55"  # not 393.09 (1024 rows)


def test_capture_sizes_1_2_with_384_token_chunks():
    c = EngineConfig.from_preset(NEMOTRON, cudagraph_capture_sizes=(1, 2), max_num_batched_tokens=384)
    assert A.locked_bytes(c, fix=False) == 134_400
    assert A.first_failing_prompt(c, 134_400) == 384 + 129
    p = A.predict(c, 768, max_tokens=1)
    assert p.verdict == "crash"
    assert p.first_refused_call == {"caller": "_continuation_prefill", "required_bytes": 196_608,
                                    "current_bytes": 134_400, "cached_len": 384, "q_len": 384}
    assert (format_mb(196_608), format_mb(134_400)) == ("0.19", "0.13")


def test_bug_report_deployment_crashes_at_4225_tokens_only_with_graphs():
    c = EngineConfig.from_preset(NEMOTRON)
    assert A.locked_bytes(c, fix=False) == 268_544
    assert A.first_failing_prompt(c, 268_544) == 4225
    assert A.predict(c, 4224).verdict == "ok" and A.predict(c, 4225).verdict == "crash"
    assert A.predict(c, 8192, max_tokens=1, fix=True).verdict == "ok"
    eager = A.predict(c.replace(enforce_eager=True), 8192)
    assert (eager.verdict, eager.locked_bytes, eager.first_failing_prompt_tokens) == ("never_locked", None, None)


def test_hybrid_block_size_2080_reservation_is_455_mb():
    # A hybrid model's attention layers only (16 of 64 with full_attention_interval 4), per rank Hk 4, D 256,
    # on the large page vLLM uses for them (2,080 tokens); the layer count is read by tqlab.vllm.
    c = EngineConfig(num_attention_heads=32, num_key_value_heads=4, head_dim=256, num_hidden_layers=16,
                     max_model_len=114_688, kv_cache_dtype="turboquant_4bit_nc", block_size=2080)
    assert reservation_plan(c)[1][0][0] == (1, 4, 116_480, 256)  # round_up(114_687, 2080)
    assert format_mb(plan_bytes(reservation_plan(c))) == "455.00"
    assert format_mb(plan_bytes(reservation_plan(c.replace(block_size=16)))) == "448.00"
    assert c.replace(num_hidden_layers=64).kv_bytes_per_token_per_rank() == 4 * c.kv_bytes_per_token_per_rank()


# --------------------------------------------------------------------------- #
# Closed forms                                                                #
# --------------------------------------------------------------------------- #


def _brute_first_failing(c: EngineConfig, locked: int) -> int | None:
    for n in range(1, c.max_model_len):
        if A.workspace_bytes_for_prompt(c, n) > locked:
            return n
    return None


def _brute_bytes(c: EngineConfig, n: int) -> int:
    budget = c.max_num_batched_tokens if c.enable_chunked_prefill else n
    from tqlab.core.reservation import chunk_workspace_request

    return max(chunk_workspace_request(c, cc, q).nbytes for cc, q in A.prompt_chunks(n, budget))


@pytest.mark.parametrize("m, bs, locked", [(130, 16, 0), (200, 16, 70_000), (384, 32, 134_400), (129, 1, 10**9),
                                           (1000, 16, 300_000), (128, 16, 0)])
def test_closed_forms_equal_brute_force(m, bs, locked):
    c = EngineConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=64, turboquant_backend_on_unquantized=True,
                     max_model_len=1500,
                     max_num_seqs=1, max_num_batched_tokens=m, block_size=bs)
    for n in range(1, 1500, 7):
        assert A.workspace_bytes_for_prompt(c, n) == _brute_bytes(c, n), n
    assert A.first_failing_prompt(c, locked) == _brute_first_failing(c, locked)


def _simulated_chunks(c: EngineConfig, n: int, first_budget: int | None = None) -> list[tuple[int, int]]:
    """Chunks of a prompt of n tokens, step by step as the scheduler draws them (first step's budget optional)."""
    out, done, step = [], 0, 0
    while done < n:
        budget = first_budget if step == 0 and first_budget is not None else c.chunk_budget
        q = A.mamba_block_aligned_split(c, done, min(budget, n - done), n)
        assert q > 0 or budget < c.chunk_budget  # 0: nothing this step (vLLM: `break`)
        if q:
            out.append((done, q))
        done, step = done + q, step + 1
    return out


@pytest.mark.parametrize("m, bs, locked, split, sched", [
    (130, 16, 0, True, None), (200, 16, 70_000, True, None), (384, 32, 134_400, True, None),
    (1000, 16, 300_000, True, None), (4100, 16, 0, True, None), (500, 208, 100_000, True, None),
    (300, 160, 0, True, None), (1000, 16, 100_000, True, 300), (1000, 16, 100_000, False, 300),
    (4096, 1, 0, False, 129), (4096, 1, 0, False, 128)])
def test_block_aligned_closed_forms_equal_the_step_by_step_schedule(m, bs, locked, split, sched):
    from tqlab.core.reservation import chunk_workspace_request

    c = EngineConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=64, turboquant_backend_on_unquantized=True,
                     max_model_len=3000, max_num_seqs=1,
                     max_num_batched_tokens=m, block_size=bs, mamba_block_aligned_split=split,
                     max_num_scheduled_tokens=sched)
    first = None
    for n in range(1, 3000):
        chunks = _simulated_chunks(c, n)
        assert A.prefill_chunks(c, n) == chunks, n
        need = max(chunk_workspace_request(c, cc, q).nbytes for cc, q in chunks)
        assert A.workspace_bytes_for_prompt(c, n) == need, n
        if first is None and need > locked:
            first = n
    assert A.first_failing_prompt(c, locked) == first


@pytest.mark.parametrize("bs", [16, 32, 64])
def test_block_aligned_busy_bound_is_reached_by_a_shared_first_step(bs):
    """The "any schedule" bound: the shortest prompt some first-step share breaks is safe_max_model_len + 1."""
    from tqlab.core.reservation import chunk_workspace_request

    c = EngineConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=64, turboquant_backend_on_unquantized=True,
                     max_model_len=1200, max_num_seqs=1,
                     max_num_batched_tokens=1024, block_size=bs, mamba_block_aligned_split=True)
    locked = A.continuation_bytes(c, 300)  # holds 300 cached tokens (rounded up to a block), not more
    broken = next(n for n in range(2, 1200) if any(
        chunk_workspace_request(c, cc, q).nbytes > locked
        for b in range(1, min(n, 1024) + 1) for cc, q in _simulated_chunks(c, n, b)))
    assert A.safe_max_model_len(c, locked, schedule="any") == broken - 1
    # buffers are sized in whole blocks, so `locked` holds round_up(300, bs) cached tokens; the next block
    # boundary is the first cached length a step can leave that overflows, then 129 new tokens dequantize
    assert broken == (-(-300 // bs) + 1) * bs + 129


def test_huge_max_model_len_answers_at_once():
    c = EngineConfig.from_preset(NEMOTRON, max_model_len=10**12)
    t = time.perf_counter()
    assert A.first_failing_prompt(c, 268_544) == 4225
    # the preset splits on 16-token blocks (hybrid, prefix caching on): a busy step can leave a
    # prompt 512 or 528 cached tokens, never 513..527; 528 cached + 129 new = 657 tokens overflows
    assert A.safe_max_model_len(c, 268_544, schedule="any") == 656
    assert A.safe_max_model_len(c.replace(mamba_block_aligned_split=False), 268_544, schedule="any") == 641
    assert A.safe_max_model_len(c, 268_544, schedule="alone") == 4225
    assert A.predict(c, fix=True).verdict == "ok"
    assert A.workspace_bytes_for_prompt(c, 10**12 - 1) > 0
    assert time.perf_counter() - t < 1.0


def test_bad_inputs_name_the_value():
    c = EngineConfig(**HEADS)
    with pytest.raises(ValueError, match="locked_bytes must be an int >= 0, got -1"):
        A.first_failing_prompt(c, -1)
    with pytest.raises(ValueError, match="schedule must be 'alone' or 'any', got 'x'"):
        A.safe_max_model_len(c, 0, schedule="x")
    with pytest.raises(ValueError, match="exceeds max_model_len 8192"):
        A.predict(c, 8192)
    # a config is validated where it enters (EngineConfig), not again by every analysis function
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        c.replace(max_num_seqs=0)


# --------------------------------------------------------------------------- #
# JSON                                                                        #
# --------------------------------------------------------------------------- #


def test_prediction_json_is_the_documented_object():
    import json

    c = EngineConfig.from_preset(NEMOTRON)
    obj = A.predict(c, sources={"max_num_seqs": "flag"}).to_json()
    assert json.loads(json.dumps(obj)) == obj
    consumers = {k: obj.pop(k) for k in ("consumers", "consumers_locked_bytes", "unmodelled")}  # tqlab.core.consumers
    assert consumers["consumers_locked_bytes"] == 64 << 20 and consumers["unmodelled"] == []
    assert [(r["consumer"], r["phase"], r["reserved_bytes"], r["max_runtime_bytes"], r["covered"])
            for r in consumers["consumers"]] == [
        ("turboquant_attn.py:_decode_attention", "init", 268_544, 268_544, True),
        ("turboquant_attn.py:_continuation_prefill", "init", 64 << 20, 2 * 130_944 * 128 * 2, True)]
    assert obj == {
        "capture_sizes": [1, 2, 4, 8], "decode_rows_at_lock": 4, "locked_bytes": 268_544, "verdict": "crash",
        "first_failing_prompt_tokens": 4225,
        "first_refused_call": {"caller": "_continuation_prefill", "required_bytes": 2 << 20,
                               "current_bytes": 268_544, "cached_len": 4096, "q_len": 129},
        "locked_bytes_with_fix": 64 << 20, "cudagraph_mode": "FULL_AND_PIECEWISE", "fix": False,
        "prompt_tokens": None, "sources": {"max_num_seqs": "flag"},
        "safe_max_model_len_alone": 4225, "safe_max_model_len_any_schedule": 656, "fixed_safe_any_schedule": 131072,
        "locked_source": "capture", "turboquant_consumers": True, "notes": [],
        "lock_set_by": "turboquant_attn.py:_decode_attention", "gpu": "H200", "partial": False,
        "unsized": [], "verdict_covers": A.ANY_SCHEDULE, "refusal": None, "vllm_version": "0.33",
    }


def test_decode_capture_rows_per_captured_decode_batch():
    c = EngineConfig.from_preset(NEMOTRON)
    assert A.decode_capture_rows(c) == (1, 2, 4)
    assert A.decode_capture_rows(c.replace(num_speculative_tokens=3)) == (1, 2, 4)  # sizes 4, 8, 16 tokens / 4
    assert A.decode_capture_rows(c.replace(enforce_eager=True)) == ()
    assert A.decode_capture_rows(EngineConfig(**HEADS, max_num_seqs=1024))[-1] == 512


# --------------------------------------------------------------------------- #
# The lock is the maximum over every active consumer (issue 19)              #
# --------------------------------------------------------------------------- #


def test_qwen3_moe_scratch_sets_the_lock_over_turboquants_capture():
    c = EngineConfig.from_preset("qwen3-30b-a3b")
    tq_unfixed = A.decode_bytes(c, A.decode_rows_at_lock(c))
    assert tq_unfixed == 274_792_448  # TurboQuant's decode capture at 512 rows
    p = A.predict(c)
    # TritonExperts at M = 8192, N = 1536, K = 2048, topk 8, bf16: max(8192*8*2048, 8192*2048) + 8192*8*2048 = 512 MiB
    assert p.locked_bytes == 512 << 20 == 536_870_912 > tq_unfixed
    assert p.lock_set_by == "modular_kernel.py:_allocate_buffers"
    # every prompt alone fits; the deployment's verdict covers a busy server too: a decode batch of 1001 requests
    # (max_num_seqs 1024, captures stop at 512) asks _decode_attention for more than the 512 MiB lock
    assert p.first_failing_prompt_tokens is None and p.verdict == "crash"
    assert p.first_refused_call["caller"] == "_decode_attention" and "decode batch of 1001" in p.first_refused_call["schedule"]
    assert (p.safe_max_model_len_alone, p.safe_max_model_len_any_schedule) == (40960, 40960)
    fixed = A.predict(c, fix=True)
    assert fixed.locked_bytes == p.locked_bytes_with_fix == 549_584_896  # the fix's decode reservation is larger
    assert fixed.lock_set_by == "turboquant_attn.py:_decode_attention"
    assert not p.partial and p.to_json()["gpu"] == "H200"


def test_moe_lock_turns_turboquants_false_crash_into_ok():
    """max_num_seqs 4: TurboQuant's capture alone locks 2.1 MB and its continuation (83.6 MB) would crash;
    the MoE scratch sized by the profile run (512 MiB) covers it."""
    c = EngineConfig.from_preset("qwen3-30b-a3b").replace(max_num_seqs=4)
    alone = A.decode_bytes(c, A.decode_rows_at_lock(c))
    assert alone == 2_146_816 and A.first_failing_prompt(c, alone) == 8192 + 129
    p = A.predict(c)
    assert (p.locked_bytes, p.lock_set_by, p.verdict) == (536_870_912, "modular_kernel.py:_allocate_buffers", "ok")
    assert p.first_failing_prompt_tokens is None and p.safe_max_model_len_any_schedule == 40960
    small = c.replace(max_num_batched_tokens=256)  # M = 256: 16 MiB of MoE scratch; 3 continuation views overflow it
    q = A.predict(small)
    assert q.locked_bytes == 16 << 20 and q.verdict == "crash"
    assert q.first_refused_call["caller"] == "_continuation_prefill" and q.first_refused_call["current_bytes"] == 16 << 20


def test_deepseek_v32_flashmla_sparse_sets_the_lock_and_the_answer_is_partial():
    c = EngineConfig.from_preset("deepseek-v3.2")
    p = A.predict(c)
    assert not c.has_turboquant_consumers
    assert p.locked_bytes == p.locked_bytes_with_fix == 2_369_781_760
    assert p.lock_set_by == "flashmla_sparse.py:__init__"
    assert [r["name"] for r in p.consumers["consumers"]] == ["flashmla_sparse", "sparse_indexer"]
    assert p.consumers["consumers"][1]["reserved_bytes"] == 866_123_776  # the indexer's profile run, below the lock
    assert p.verdict == "partial" and p.partial  # FP8 MoE experts (DeepGEMM) are not sized: the answer is partial
    assert any(n.kind is NoteKind.NOT_MODELLED and n.startswith("partial answer") for n in p.notes)
    assert p.safe_max_model_len_any_schedule == 163840


def test_uncovered_other_consumer_crashes_at_any_length():
    """FlashAttention + DCP with PIECEWISE graphs (latent crash 2): nothing sizes _forward_with_dcp before the
    lock, so the first step with DCP context (a 1-token prompt's first decode) asks a 0-byte slot."""
    # TP 16 > the 8 KV heads: vLLM refuses DCP on GQA otherwise (ModelConfig.verify_with_parallel_config)
    c = EngineConfig.from_preset("llama-3.1-8b").replace(kv_cache_dtype="auto", decode_context_parallel_size=2,
                                                          tensor_parallel_size=16, cudagraph_mode="PIECEWISE")
    p = A.predict(c)
    need = 2 * c.max_num_batched_tokens * c.num_heads_per_rank * c.head_dim * 2
    assert (p.locked_bytes, p.verdict, p.first_failing_prompt_tokens) == (0, "crash", 1)
    assert p.first_refused_call == {"caller": "flash_attn.py:_forward_with_dcp", "required_bytes": need,
                                    "current_bytes": 0, "cached_len": 1, "q_len": 1}
    assert p.safe_max_model_len_alone is p.safe_max_model_len_any_schedule is p.fixed_safe_any_schedule is None
    assert any("crashes at any max_model_len" in n for n in p.notes)
    chunked = A.predict(c, prompt_tokens=c.max_num_batched_tokens + 5, max_tokens=1)  # its 2nd chunk has context
    assert chunked.first_refused_call["cached_len"] == c.max_num_batched_tokens
    assert A.predict(c, prompt_tokens=7, max_tokens=1).verdict == "ok"  # one chunk, no decode: never reached
    full = A.predict(c.replace(cudagraph_mode="FULL_AND_PIECEWISE"))
    assert (full.locked_bytes, full.verdict, full.lock_set_by) == (need, "ok", "flash_attn.py:_forward_with_dcp")


def test_dbo_says_init_reservations_size_slot_0_only():
    c = EngineConfig.from_preset("deepseek-v3.2")
    assert not any(n.startswith("DBO:") for n in A.predict(c).notes)
    dbo = A.predict(c.replace(enable_dbo=True))
    assert dbo.locked_bytes == 2_369_781_760  # slot (ubatch 0, lane 0)
    assert [n.field for n in dbo.notes if n.startswith("DBO: flashmla_sparse.py:__init__ reserve in __init__")] == [
        "enable_dbo"]


def test_eager_decode_batches_above_the_largest_capture_are_noted():
    """Review finding: vLLM 0.33 captures decode batches up to 512 rows, but with max_num_seqs 1024 (its H200
    default) a decode batch of 513..1024 requests runs eagerly after the lock and TurboQuant's _decode_attention
    asks (B, Hq, S, D+1) at B rows (turboquant_attn.py _decode_attention): without PR #44053 the slot is the
    512-row capture, so the busy server dies while every prompt alone is "ok". Qwen3-30B-A3B's MoE scratch
    (512 MiB) sets the lock; the first refused batch is 1001 decode rows."""
    import json
    from pathlib import Path

    from tqlab.core.config import EngineConfig
    from tqlab.predict.analysis import predict
    from tqlab.predict.prompts import decode_bytes

    preset = json.loads((Path(__file__).parents[1] / "data/presets/qwen3-30b-a3b.json").read_text())["config"]
    cfg = EngineConfig(**preset)
    p = predict(cfg)
    assert p.verdict == "crash" and p.locked_bytes == 536_870_912  # the busy server's batch: not a silent ok
    assert p.first_refused_call["required_bytes"] == decode_bytes(cfg, 1001)
    assert decode_bytes(cfg, 1000) <= p.locked_bytes < decode_bytes(cfg, 1001)
    busy = [str(n) for n in p.notes if "decode batch" in n]
    assert len(busy) == 1 and "1001" in busy[0] and "_decode_attention" in busy[0]
    assert not [n for n in predict(cfg, fix=True).notes if "decode batch" in n]  # reserved at max_num_seqs
    tq_only = predict(cfg.replace(moe=None))  # lock = the 512-row capture: batch 513 is the first refused
    assert [n for n in tq_only.notes if "decode batch" in n and "513 " in n]
    assert not [n for n in predict(cfg.replace(max_num_seqs=512)).notes if "decode batch" in n]
