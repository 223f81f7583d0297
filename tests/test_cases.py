"""The §8 cases of issue 2: abstracted from public vLLM reports of the locked-workspace failure class.

Each case is pinned to the exact numbers in the issue, and each *kind* of failure is
also checked where it arises in the engine, not only in the manager.
"""

from __future__ import annotations

import pytest
import torch

from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.core.reservation import (
    chunk_workspace_request,
    continuation_workspace_shapes,
    decode_workspace_shapes,
    plan_bytes,
    reservation_plan,
    reserve_workspace,
)
from tqlab.core.workspace import (
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    init_workspace_manager,
    lock_workspace,
    reset_workspace_manager,
    rewarm_workspace,
    ubatch_context,
)

u8 = torch.uint8
PR_TEST = "pr-44053-unit-test"
NEMOTRON = "nemotron-3-super-120b-a12b"


@pytest.fixture(autouse=True)
def _fresh_workspace_singleton():
    reset_workspace_manager()
    yield
    reset_workspace_manager()


# --------------------------------------------------------------------------- #
# Locked empty                                                                #
# --------------------------------------------------------------------------- #


def test_locked_empty_first_decode_needs_802048_bytes():
    # 1 sequence, 24 query heads, 32 KV splits, head_dim 256, bf16
    shapes = decode_workspace_shapes(1, 24, 256, 32, torch.bfloat16)
    assert shapes == (((1, 24, 32, 257), torch.float32), ((1, 24, 256), torch.bfloat16), ((1, 24), torch.float32))
    lay = compute_layout(shapes)
    assert lay.nbytes == (789_504, 12_288, 96)
    assert lay.offsets == (0, 789_504, 801_792)
    assert lay.total_bytes == 802_048
    ws = WorkspaceManager("cpu")
    ws.lock()
    with pytest.raises(WorkspaceLockedError) as ei:
        ws.get_simultaneous(*shapes)
    assert (ei.value.required_bytes, ei.value.current_bytes) == (802_048, 0)
    assert "requires 0.76 MB, current size is 0.00 MB" in str(ei.value)
    assert ws.sizes_bytes() == [0] and ws.buffer(0) is None and ws.is_locked()


MTP_LIKE = dict(num_attention_heads=24, num_key_value_heads=8, head_dim=256, max_num_seqs=1,
                max_model_len=1024, max_num_batched_tokens=1024,
                turboquant_backend_on_unquantized=True)  # TurboQuant's consumers on an auto cache (teaching variant)


def test_locked_empty_kind_in_the_engine_lock_on_eager_variant():
    # vLLM 0.33 never locks an eager start-up; the named lock-on-eager variant does, and
    # then nothing has grown the workspace before the lock.
    c = EngineConfig(**MTP_LIKE, enforce_eager=True, lock_workspace_when_eager=True)
    engine = LLMEngine(c, fix=False, device="meta")
    assert engine.locked_bytes == 0 and engine.workspace.is_locked()
    with pytest.raises(WorkspaceLockedError) as ei:
        engine.generate(8, max_tokens=2)  # prefill needs nothing, the first decode needs 802,048 bytes
    assert (ei.value.required_bytes, ei.value.current_bytes) == (802_048, 0)
    assert "requires 0.76 MB, current size is 0.00 MB" in str(ei.value)
    fixed = LLMEngine(c, fix=True, device="meta")
    assert fixed.locked_bytes >= 802_048
    assert fixed.generate(8, max_tokens=2).finished
    # vLLM 0.33 itself: eager never locks, the same request completes
    assert LLMEngine(c.replace(lock_workspace_when_eager=False), fix=False, device="meta").generate(8, 2).finished


@pytest.mark.parametrize("k, crashes", [(0, False), (1, False), (2, True), (3, True)])
def test_locked_empty_kind_with_speculative_decoding_in_the_drafter(k, crashes):
    # The public report's kind (TurboQuant 4bit_nc + MTP drafter): "requires 0.76 MB, current size is
    # 0.00 MB" in the drafter's decode. With k > 0 vLLM 0.33's FULL decode capture has 1+k-token rows,
    # which TurboQuant routes to _prefill_attention as first chunks (seq_lens = max_query_len in
    # _dummy_run): no workspace call, so it locks at 0 bytes. The drafter's passes 2..k are one-token
    # decodes through _decode_attention (k = 1 has none).
    from tqlab.predict.analysis import predict

    c = EngineConfig(**MTP_LIKE, kv_cache_dtype="turboquant_4bit_nc", num_speculative_tokens=k)
    engine = LLMEngine(c, fix=False, device="meta")
    assert engine.locked_bytes == (802_048 if k == 0 else 0) == predict(c, 8, max_tokens=2).locked_bytes
    assert predict(c, 8, max_tokens=2).verdict == ("crash" if crashes else "ok")
    if crashes:
        with pytest.raises(WorkspaceLockedError) as ei:
            engine.generate(8, max_tokens=2)
        assert "_decode_attention' requires 0.76 MB, current size is 0.00 MB" in str(ei.value)
        assert predict(c, 8, max_tokens=2).first_refused_call == {
            "caller": "_decode_attention (drafter)", "required_bytes": 802_048, "current_bytes": 0,
            "cached_len": 8, "q_len": 1}
    else:
        assert engine.generate(8, max_tokens=2).finished
    # PR #44053's reservation covers the drafter's decode (max_num_seqs rows)
    assert LLMEngine(c, fix=True, device="meta").generate(8, max_tokens=2).finished


# --------------------------------------------------------------------------- #
# Sibling slot                                                                #
# --------------------------------------------------------------------------- #


def test_sibling_slot_is_refused_and_compared_by_bytes():
    ws = WorkspaceManager("cpu", 2)
    ws.get_simultaneous(((4096,), u8))  # slot 0
    ws.lock()
    with ubatch_context(1), pytest.raises(WorkspaceLockedError) as ei:
        ws.get_simultaneous(((512,), u8))
    err = ei.value
    # the text cannot tell 512 bytes from 0 bytes ...
    assert "requires 0.00 MB, current size is 0.00 MB" in str(err)
    # ... the bytes can
    assert (err.required_bytes, err.current_bytes, err.ubatch) == (512, 0, 1)
    assert ws.sizes_bytes() == [4096, 0]


def test_slot_0_growth_never_reallocates_slot_1():
    ws = WorkspaceManager("cpu", 2)
    with ubatch_context(1):
        (held,) = ws.get_simultaneous(((512,), u8))
    held.fill_(7)
    ptr = held.data_ptr()
    for n in (4096, 64 * 1024, 1 << 20):
        ws.get_simultaneous(((n,), u8))  # slot 0 grows three times
    assert ws.sizes_bytes() == [1 << 20, 512]
    assert held.data_ptr() == ptr == ws.data_ptrs()[1]
    assert torch.all(held == 7)
    assert {e.ubatch for e in ws.events if e.kind == "resize" and e.old_bytes > 0} == {0}


def test_reservation_sizes_the_slot_it_runs_in():
    """As vLLM 0.33's builder: the reservation lands in slot 0; slot 1 is sized only by a call made in ubatch 1."""
    c = EngineConfig.from_preset(PR_TEST, enable_dbo=True)
    ws = WorkspaceManager("meta", c.num_ubatches)
    reserve_workspace(c, ws)
    ws.lock()
    assert ws.sizes_bytes() == [16 * MiB, 0]
    for call in reservation_plan(c):
        ws.get_simultaneous(*call)
    with ubatch_context(1), pytest.raises(WorkspaceLockedError) as ei:
        ws.get_simultaneous(((512,), u8))  # the case's request, in ubatch 1
    assert (ei.value.ubatch, ei.value.current_bytes) == (1, 0)
    # and in the engine: DBO + fix sizes slot 0 at build_backend
    engine = LLMEngine(c.replace(max_model_len=2048), fix=True, device="meta")
    expected = plan_bytes(reservation_plan(engine.config))
    assert {p.name: p for p in engine.phases}["build_backend"].workspace_bytes == (expected, 0)


# --------------------------------------------------------------------------- #
# Growth peak                                                                 #
# --------------------------------------------------------------------------- #


def test_growth_peak_64_to_128_mib_is_128_not_192():
    ws = WorkspaceManager("meta")
    ws.get_simultaneous(((64 * MiB,), u8))
    ws.get_simultaneous(((128 * MiB,), u8))
    grow = ws.events[-1]
    assert (grow.kind, grow.old_bytes, grow.new_bytes) == ("resize", 64 * MiB, 128 * MiB)
    assert grow.peak_bytes == 128 * MiB and grow.live_bytes == 128 * MiB
    assert ws.peak_live_bytes == 128 * MiB
    # the policy it replaces (allocate, then free) would peak at 192
    naive = WorkspaceManager("meta", growth_policy="allocate_then_free")
    naive.get_simultaneous(((64 * MiB,), u8))
    naive.get_simultaneous(((128 * MiB,), u8))
    assert naive.events[-1].peak_bytes == 192 * MiB


def test_growth_peak_two_slots_192_not_256_and_slot_1_untouched():
    ws = WorkspaceManager("meta", 2)
    for slot in (0, 1):
        with ubatch_context(slot):
            ws.get_simultaneous(((64 * MiB,), u8))
    slot1 = ws.buffer(1)
    assert ws.live_bytes() == 128 * MiB
    ws.get_simultaneous(((128 * MiB,), u8))  # slot 0 grows
    grow = ws.events[-1]
    assert (grow.ubatch, grow.old_bytes, grow.new_bytes) == (0, 64 * MiB, 128 * MiB)
    assert grow.peak_bytes == 192 * MiB and grow.live_bytes == 192 * MiB
    assert ws.peak_live_bytes == 192 * MiB
    assert ws.sizes_bytes() == [128 * MiB, 64 * MiB]
    assert ws.buffer(1) is slot1
    assert sum(1 for e in ws.events if e.ubatch == 1) == 1  # only its own first growth


# --------------------------------------------------------------------------- #
# Which start-ups lock (vLLM 0.33: only capture_model locks)                 #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("mode", ["capture", "lock-on-eager", "piecewise"])
@pytest.mark.parametrize("fix", [False, True], ids=["no-fix", "fix"])
@pytest.mark.parametrize("dbo", [False, True], ids=["1-slot", "dbo"])
def test_every_locking_startup_locks_once_before_serving(mode, fix, dbo):
    extra = {"capture": {}, "lock-on-eager": dict(enforce_eager=True, lock_workspace_when_eager=True),
             "piecewise": dict(cudagraph_mode="PIECEWISE")}[mode]
    c = EngineConfig.from_preset(PR_TEST, max_model_len=1024, max_num_batched_tokens=512, max_num_seqs=4,
                                 enable_dbo=dbo, **extra)
    engine = LLMEngine(c, fix=fix, device="meta")
    assert engine.phases[-1].name == "lock"
    assert engine.workspace.is_locked()
    locks = [i for i, e in enumerate(engine.workspace.events) if e.kind in ("lock", "unlock")]
    assert [engine.workspace.events[i].kind for i in locks] == ["lock"]
    # nothing grows after the lock: growth is now an error
    assert all(e.kind == "resize" for e in engine.workspace.events[: locks[0]])
    assert engine.workspace.events[locks[0]:][1:] == []
    with pytest.raises(WorkspaceLockedError):
        engine.workspace.get_simultaneous(((engine.locked_bytes + 1,), u8))


@pytest.mark.parametrize("extra", [dict(enforce_eager=True), dict(cudagraph_mode="NONE")], ids=["eager", "none"])
@pytest.mark.parametrize("fix", [False, True], ids=["no-fix", "fix"])
def test_eager_and_none_startups_never_lock(extra, fix):
    # vLLM 0.33: gpu_worker.py compile_or_warm_up_model skips capture_model under enforce_eager, and
    # capture_model returns before lock_workspace() when cudagraph_mode is NONE. (This test used to
    # assert that every start-up path locks, which vLLM 0.33 contradicts.)
    c = EngineConfig.from_preset(PR_TEST, max_model_len=1024, max_num_batched_tokens=512, max_num_seqs=4, **extra)
    engine = LLMEngine(c, fix=fix, device="meta")
    assert engine.phases[-1].name == "lock" and engine.phases[-1].note.startswith("skipped")
    assert not engine.workspace.is_locked() and engine.locked_bytes is None
    assert engine.generate(1000, max_tokens=2).finished


# --------------------------------------------------------------------------- #
# Re-lock is exception-safe                                                   #
# --------------------------------------------------------------------------- #


def test_relock_is_exception_safe():
    m = init_workspace_manager("cpu")
    m.get_simultaneous(((1024,), u8))
    lock_workspace()

    class ScaleUpFailed(RuntimeError):
        pass

    with pytest.raises(ScaleUpFailed):
        with rewarm_workspace():  # elastic scaling: unlock -> regrow -> relock
            assert not m.is_locked()
            m.get_simultaneous(((4096,), u8))
            raise ScaleUpFailed("new experts failed to load")
    assert m.is_locked()
    assert m.size_bytes() == 4096  # the regrowth that happened is kept
    with pytest.raises(WorkspaceLockedError):
        m.get_simultaneous(((8192,), u8))
    assert [e.kind for e in m.events] == ["resize", "lock", "unlock", "resize", "lock", "violation"]
    # and the normal path relocks too
    with rewarm_workspace(m):
        m.get_simultaneous(((8192,), u8))
    assert m.is_locked() and m.size_bytes() == 8192


# --------------------------------------------------------------------------- #
# Rounding to the block size in use                                           #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("cached, rounded", [(2080, 2080), (2081, 4160)])
def test_continuation_rounds_to_the_2080_token_page(cached, rounded):
    (shape_k, dt_k), (shape_v, dt_v) = continuation_workspace_shapes(cached, 2, 128, 2080)
    assert shape_k == shape_v == (1, 2, rounded, 128)
    assert dt_k == dt_v == torch.float16
    c = EngineConfig(num_attention_heads=16, num_key_value_heads=2, head_dim=128, block_size=2080,
                     max_model_len=8320, max_num_seqs=1, max_num_batched_tokens=4096, turboquant_backend_on_unquantized=True)
    req = chunk_workspace_request(c, cached, 200)
    assert req.path == "continuation" and req.shapes[0][0] == (1, 2, rounded, 128)
    assert req.nbytes == 2 * rounded * 2 * 128 * 2
    # the reservation rounds max_model_len - 1 = 8319 with the same block: 4 pages of 2080
    assert reservation_plan(c)[1][0][0] == (1, 2, 8320, 128)
    assert reservation_plan(c.replace(max_model_len=8322))[1][0][0] == (1, 2, 10400, 128)  # 8321 cached


# --------------------------------------------------------------------------- #
# The CLI: repro / plan against tqlab.predict.analysis (vLLM 0.33 semantics)         #
# --------------------------------------------------------------------------- #


def _cli(*args):
    from click.testing import CliRunner

    from tqlab.cli import app

    return CliRunner().invoke(app, list(args))


def test_repro_eager_is_never_locked_and_as_predicted():
    r = _cli("repro", "--preset", PR_TEST, "--enforce-eager", "--max-tokens", "2", "--prompt-tokens", "100",
             "--device", "meta")
    assert r.exit_code == 0, r.output
    assert "completes: the workspace is never locked" in r.output
    assert "locked: False" in r.output and "as predicted" in r.output and "NOT as predicted" not in r.output


def test_repro_nemotron_eager_serves_8k_with_the_workspace_never_locked():
    r = _cli("repro", "--preset", "nemotron-3-super-120b-a12b", "--enforce-eager", "--device", "meta")
    assert r.exit_code == 0, r.output
    assert "request 8192-token prompt" in r.output and "locked: False" in r.output and "as predicted" in r.output
    crash = _cli("repro", "--preset", "nemotron-3-super-120b-a12b", "--device", "meta")
    assert crash.exit_code == 0 and "_continuation_prefill requires 2.00 MB, current size is 0.26 MB" in crash.output


def test_repro_fix_on_meta_answers_for_a_trillion_tokens():
    import time

    t = time.perf_counter()
    r = _cli("repro", "--preset", "nemotron-3-super-120b-a12b", "--fix", "--device", "meta",
             "--max-model-len", str(10**12))
    assert r.exit_code == 0, r.output
    assert "as predicted" in r.output and time.perf_counter() - t < 30


def test_repro_auto_device_picks_meta_for_a_big_model_and_says_so():
    r = _cli("repro", "--preset", "llama-3.1-8b", "--prompt-tokens", "200")
    assert r.exit_code == 0, r.output
    assert "device meta (shapes only): a CPU run would build about" in r.output and "--device cpu forces it" in r.output


def test_plan_and_repro_print_one_unit_mib_outside_vllms_quoted_message():
    """Units: 2**20 bytes is "MiB" in tqlab's own lines; "MB" only inside vLLM's quoted assertion text."""
    import re

    plan = _cli("plan", "--preset", "nemotron-3-super-120b-a12b")
    repro = _cli("repro", "--preset", PR_TEST, "--prompt-tokens", "8190", "--device", "meta")
    for r, code in ((plan, 3), (repro, 0)):  # plan exits by its crash verdict, repro 0: as predicted
        assert r.exit_code == code, r.output
        own = re.sub(r"requires \d+\.\d\d MB, current size is \d+\.\d\d MB", "", r.output)
        assert " MB" not in own, r.output
    assert "locks at 268,544 bytes (0.26 MiB)" in plan.output and "64.00 MiB per ubatch slot" in plan.output
    assert "requires 8.00 MB, current size is 0.28 MB" in repro.output  # vLLM's wording, quoted
    builder = next(line for line in repro.output.splitlines() if line.strip().startswith("build_backend"))
    # the unfixed engine is vLLM 0.33 without PR #44053, not "vLLM 0.20" (README: the versions)
    assert "[0.00 MiB]" in builder and "vLLM 0.33 without PR #44053" in builder


def test_plan_json_to_stdout_holds_only_the_json(tmp_path):
    import json

    r = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--max-num-seqs", "4", "--json", "-")
    assert r.exit_code == 3, r.output  # the crash verdict's exit status
    obj = json.loads(r.output)
    assert (obj["capture_sizes"], obj["decode_rows_at_lock"], obj["locked_bytes"], obj["verdict"]) == (
        [1, 2, 4, 8], 4, 268_544, "crash")
    assert obj["first_failing_prompt_tokens"] == 4225 and obj["locked_bytes_with_fix"] == 64 << 20
    assert obj["first_refused_call"]["caller"] == "_continuation_prefill"
    assert obj["sources"]["max_num_seqs"] == "flag"
    assert obj["sources"]["max_model_len"] == "preset nemotron-3-super-120b-a12b"
    assert obj["sources"]["num_speculative_tokens"] == "tqlab default"
    f = tmp_path / "p.json"
    r2 = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--enforce-eager", "--json", str(f))
    assert r2.exit_code == 0 and "never locked" in r2.output
    assert json.loads(f.read_text())["verdict"] == "never_locked"
    bad = _cli("plan", "--preset", PR_TEST, "--json", str(tmp_path / "missing" / "x.json"))
    assert bad.exit_code == 2 and "missing does not exist" in bad.output and "config" not in bad.output  # checked first


def test_plan_huge_max_model_len_is_a_one_line_error():
    r = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--max-model-len", "4611686018427387904")
    assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit)
    assert "Traceback" not in r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    # one line, naming the continuation buffer's shape that torch cannot size (tqlab.core.workspace's check)
    assert len(errors) == 1 and "overflows torch's 64-bit size computation" in errors[0], r.output


def test_cli_help_imports_no_torch_and_shows_field_meaning():
    import subprocess
    import sys

    code = "import sys, tqlab.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    r = _cli("plan", "--help")
    assert "token budget of one scheduler step" in r.output and "draft tokens k per step" in r.output


def test_presets_lists_where_each_preset_s_numbers_come_from():
    from click.testing import CliRunner

    from tqlab.cli import app

    r = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["presets"])
    assert r.exit_code == 0, r.output
    assert "source of its numbers" in r.output
    assert "tests/quantization/test_turboquant.py in vLLM PR #44053" in r.output  # pr-44053-unit-test's source
    assert "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B" in r.output  # the bug report's model config


def test_plan_prefix_caching_off_turns_the_hybrid_split_off_as_vllm_does():
    import json

    r = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--no-enable-prefix-caching", "--json", "-")
    assert r.exit_code == 3, r.output  # an answer (the crash verdict), not a usage error
    obj = json.loads(r.output)
    assert (obj["verdict"], obj["first_failing_prompt_tokens"]) == ("crash", 4225)
    assert obj["sources"]["enable_prefix_caching"] == "flag"  # the preset's split went off with it
    both = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--no-enable-prefix-caching",
                "--mamba-block-aligned-split")
    assert both.exit_code == 2 and "--mamba-block-aligned-split needs --enable-prefix-caching" in both.output


def test_a_step_that_cannot_fit_a_prompt_is_refused_not_a_hang():
    r = _cli("repro", "--preset", "llama-3.1-8b", "--max-model-len", "4096", "--max-num-batched-tokens", "4096",
             "--no-enable-chunked-prefill", "--max-num-scheduled-tokens", "256", "--prompt-tokens", "1000",
             "--device", "meta")
    assert r.exit_code == 2 and "--max-num-scheduled-tokens (256) < --max-model-len (4096)" in r.output  # the flags given
