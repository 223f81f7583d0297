"""The explorers of tqlab/lab/widgets/: pure numbers, figures, and callbacks driven through widget values."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from tqlab.lab import widgets as W
from tqlab.predict.analysis import unfixed_locked_bytes
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import decode_workspace_shapes
from tqlab.predict.analysis import workspace_bytes_for_prompt
from tqlab.core.workspace import compute_layout

PNG = b"\x89PNG\r\n\x1a\n"
UNIT = "pr-44053-unit-test"


# --------------------------------------------------------------------------- import hygiene
def test_importing_tqlab_and_widgets_does_not_import_ipywidgets():
    code = "import sys, tqlab, tqlab.lab.widgets; sys.exit(1 if 'ipywidgets' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --------------------------------------------------------------------------- pure functions
@pytest.mark.parametrize(
    "text, shape",
    [("16, 8, 4, 129", (16, 8, 4, 129)), ("(1,4,8192,128)", (1, 4, 8192, 128)), ("[3]", (3,)),
     ("(4,)", (4,)), ("()", ()), ("  0 , 5 ", (0, 5))],
)
def test_parse_shape(text, shape):
    assert W.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["a, b", "1.5, 2", "-1, 2", "1,,2", "1 2"])
def test_parse_shape_rejects_bad_text_naming_it(text):
    with pytest.raises(ValueError, match="bad shape"):
        W.parse_shape(text)


def test_parse_shape_rejects_non_str():
    with pytest.raises(TypeError):
        W.parse_shape((1, 2))


def test_layout_rows_of_the_pr_unit_test_decode_call():
    rows, lay = W.layout_rows(W.default_layout_requests())
    assert [r.shape for r in rows] == [(16, 8, 4, 129), (16, 8, 128), (16, 8)]
    assert [r.dtype for r in rows] == [torch.float32, torch.float16, torch.float32]
    assert [r.nbytes for r in rows] == [264192, 32768, 512]
    assert [r.offset for r in rows] == [0, 264192, 296960]
    assert [r.padding for r in rows] == [0, 0, 0]
    assert lay.total_bytes == 297472


def test_unfixed_locked_bytes_is_the_decode_scratch_at_max_num_seqs():
    for preset in ("pr-44053-unit-test", "nemotron-3-super-120b-a12b", "llama-3.1-8b"):
        cfg = EngineConfig.from_preset(preset)
        expect = compute_layout(decode_workspace_shapes(
            cfg.max_num_seqs, cfg.num_heads_per_rank, cfg.head_dim, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype
        )).total_bytes
        assert unfixed_locked_bytes(cfg) == expect
    assert unfixed_locked_bytes(EngineConfig.from_preset(UNIT)) == 297472
    assert unfixed_locked_bytes(EngineConfig.from_preset(UNIT, enforce_eager=True)) == 0


def test_plan_summary_of_the_pr_unit_test():
    r = W.plan_summary(EngineConfig.from_preset(UNIT))
    assert [b for _, _, b in r.consumers] == [297472, 16777216]  # decode scratch; 2 x (1,4,8192,128) f16
    assert r.reserved_bytes == 16777216 and r.slots == 1
    assert r.unfixed_locked_bytes == 297472
    # 4096 + 1..128: the second chunk runs the decode kernel with its own scratch (vLLM 0.33), no
    # workspace call; 4096 + 129: continuation prefill, 2 x (1,4,4096,128) f16 = 8 MiB > 0.28 MiB locked
    assert r.first_failing_unfixed == 4225 and r.longest_surviving_unfixed == 4224
    assert r.first_failing_fixed is None
    cfg = r.config
    assert workspace_bytes_for_prompt(cfg, 4224) == 0
    assert workspace_bytes_for_prompt(cfg, 4225) == 2 * 4 * 4096 * 128 * 2 == 8388608
    # The share of the KV pool one H200 holds (tqlab.predict.kv_pool: 0.92 x memory - weights - activations),
    # not of max_num_seqs x max_model_len tokens (which no GPU holds for llama-3.1-8b: 1,072 GiB).
    pool = int(0.92 * int(139.8 * 2**30)) - 0 - 2**30  # no model weights in the PR's unit test; 1 GiB activations
    assert r.kv_cache_bytes == r.kv.pool_bytes == pool
    assert r.kv_share == pytest.approx(16777216 / pool)


def test_plan_summary_rejects_non_config():
    with pytest.raises(TypeError):
        W.plan_summary({"max_model_len": 8})


def test_prompt_need_curve_matches_the_per_prompt_prediction():
    cfg = EngineConfig.from_preset(UNIT, max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16)
    lengths, need = W.need_curve(cfg, points=50)
    assert lengths == sorted(set(lengths)) and lengths[0] == 1 and lengths[-1] == 2047
    assert need == [workspace_bytes_for_prompt(cfg, p) for p in lengths]
    # every chunk boundary k*256 is sampled at +1, +128 (last length with no workspace call) and +129
    for k in range(1, 8):
        assert {k * 256 + 1, k * 256 + 128, k * 256 + 129} <= set(lengths)
    at = dict(zip(lengths, need))
    assert at[256 + 128] == 0 and at[256 + 129] == 2 * 4 * 256 * 128 * 2 == 524288  # cached 256 -> (1,4,256,128)
    assert at[512 + 128] == 524288 and at[512 + 129] == 2 * 4 * 512 * 128 * 2


def test_need_curve_samples_the_jumps_of_a_block_aligned_hybrid():
    # 2,080-token blocks, 4,096-token steps: a prompt of 4,097 tokens gets a first chunk cut back to
    # 2,080 (Scheduler._mamba_block_aligned_split), so its second chunk dequantizes 2,080 cached tokens
    cfg = EngineConfig.from_preset("nemotron-3-super-120b-a12b", block_size=2080, max_model_len=16384)
    lengths, need = W.need_curve(cfg, points=20)
    at = dict(zip(lengths, need))
    assert at[4096] == 0 and at[4097] == 2 * 1 * 2080 * 128 * 2  # (1, 2080, 128) fp16-sized K and V, 1 KV head
    # the third chunk starts at 4,160 cached tokens, but only once the second chunk cannot hold the rest:
    # one step's 4,096 tokens past the second chunk's start
    assert at[2080 + 4096 + 1] == 2 * 2 * 2080 * 128 * 2 > at[2080 + 4096] == at[4097]


def test_figures_render_to_png():
    cfg = EngineConfig.from_preset(UNIT)
    assert W.figure_png(W.layout_figure(W.default_layout_requests())).startswith(PNG)
    assert W.figure_png(W.layout_figure([((5, 7), torch.float16)], "bytes")).startswith(PNG)
    assert W.figure_png(W.planner_figure(W.plan_summary(cfg))).startswith(PNG)
    traces = [W.lifecycle_trace(cfg, 8190, fix) for fix in (False, True)]
    assert W.figure_png(W.lifecycle_figure(traces, 3)).startswith(PNG)
    with pytest.raises(ValueError, match="scale"):
        W.layout_figure(W.default_layout_requests(), "log")
    with pytest.raises(ValueError):
        W.lifecycle_figure([])


def test_lifecycle_trace_without_and_with_the_fix():
    cfg = EngineConfig.from_preset(UNIT)
    off = W.lifecycle_trace(cfg, 8190, False)
    on = W.lifecycle_trace(cfg, 8190, True)
    phases = ["init_workspace", "load_model", "profile_run", "build_backend", "capture", "lock"]
    assert [s.name for s in off.steps][:6] == phases == [s.name for s in on.steps][:6]
    # without the fix: decode capture grows the workspace, the lock freezes 0.28 MiB,
    # the second chunk (4096 cached tokens, 4094 new) asks 8 MiB and crashes
    assert [s.workspace_bytes for s in off.steps[:6]] == [(0,), (0,), (0,), (0,), (297472,), (297472,)]
    assert off.locked_bytes == 297472 and off.crashed and len(off.steps) == 8
    crash = off.steps[-1]
    assert crash.name == "chunk 4,096+4,094" and crash.need_bytes == 8388608
    assert crash.error.startswith("WorkspaceLockedError: Workspace is locked but allocation from ")
    assert "requires 8.00 MB, current size is 0.28 MB" in crash.error
    assert [e.kind for e in crash.events] == ["violation"]
    assert [e.kind for e in off.steps[4].events] == ["resize"] and [e.kind for e in off.steps[5].events] == ["lock"]
    # with the fix: the metadata builder reserves 16 MiB after the profile run (vLLM 0.33's
    # initialize_kv_cache), before capture; everything is served
    assert on.steps[2].workspace_bytes == (0,) and on.steps[3].workspace_bytes == (16777216,)
    assert [e.kind for e in on.steps[3].events] == ["resize", "resize"]
    assert on.locked_bytes == 16777216 and not on.crashed
    assert [s.name for s in on.steps[6:]] == ["chunk 0+4,096", "chunk 4,096+4,094", "decode @8,190"]
    assert all(s.workspace_bytes == (16777216,) for s in on.steps[3:])
    assert W.lifecycle_trace(cfg, 8190, True) is on  # cached


def test_lifecycle_trace_short_continuation_makes_no_workspace_call():
    """4096 + 128 survives without the fix (decode kernel, own scratch); 4096 + 129 is the first crash."""
    cfg = EngineConfig.from_preset(UNIT)
    ok = W.lifecycle_trace(cfg, 4224, False)
    assert not ok.crashed and ok.locked_bytes == 297472
    assert [s.name for s in ok.steps[6:]] == ["chunk 0+4,096", "chunk 4,096+128", "decode @4,224"]
    short = ok.steps[7]
    assert short.note == ("continuation of 128 tokens <= 128: decode kernel, 128 rows, its own scratch: "
                          "no workspace call (vLLM 0.33)")
    assert (short.need_bytes, short.events, short.workspace_bytes, short.error) == (0, (), (297472,), None)
    assert all(s.events == () for s in ok.steps[6:])  # nothing grows or violates while serving
    bad = W.lifecycle_trace(cfg, 4225, False)
    assert bad.crashed and len(bad.steps) == 8
    crash = bad.steps[-1]
    assert crash.name == "chunk 4,096+129" and crash.need_bytes == 8388608
    assert crash.note == "continuation prefill: dequantize 4,096 cached tokens"
    assert [e.kind for e in crash.events] == ["violation"]
    assert "requires 8.00 MB, current size is 0.28 MB" in crash.error
    assert W.plan_summary(cfg).first_failing_unfixed == 4225  # the planner predicts the same boundary


def test_lifecycle_trace_rejects_prompts_that_do_not_fit():
    cfg = EngineConfig.from_preset(UNIT)
    with pytest.raises(ValueError, match="max_model_len"):
        W.lifecycle_trace(cfg, 8191, True)
    with pytest.raises(ValueError, match="prompt_tokens"):
        W.lifecycle_trace(cfg, 0, True)


# --------------------------------------------------------------------------- widgets, driven by .value
# The pure functions above run everywhere; only these need ipywidgets (the notebooks extra).
needs_ipywidgets = pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is None,
                                      reason="ipywidgets is not installed (pip install '.[notebooks]')")


@needs_ipywidgets
def test_layout_explorer_add_remove_and_bad_input():
    ui = W.layout_explorer()
    assert len(ui.requests) == 3 and bytes(ui.image.value).startswith(PNG)
    assert "297,472" in ui.table.value
    first_png = ui.image.value

    ui.shape.value, ui.dtype.value = "5, 7", "float16"
    ui.add_button.click()
    assert ui.requests[-1] == ((5, 7), torch.float16)
    assert "<td>70</td><td>297,472</td><td>186</td>" in ui.table.value  # bytes, offset, padding
    assert "total 297,728 bytes" in ui.table.value
    assert ui.listing.options[-1] == "3: (5, 7) float16"
    assert ui.image.value != first_png

    ui.shape.value = "5, x"
    ui.add_button.click()
    assert "not added" in ui.status.value and "'x'" in ui.status.value and len(ui.requests) == 4

    ui.listing.value = None
    ui.remove_button.click()
    assert "select a view" in ui.status.value and len(ui.requests) == 4
    ui.listing.value = "0: (16, 8, 4, 129) float32"
    ui.remove_button.click()
    assert [r[0] for r in ui.requests] == [(16, 8, 128), (16, 8), (5, 7)]
    assert ui.listing.options[0] == "0: (16, 8, 128) float16"

    png = ui.image.value
    ui.scale.value = "bytes"
    assert ui.image.value != png


def test_layout_explorer_rejects_bad_initial_requests():
    with pytest.raises(TypeError):
        W.layout_explorer([((2, 2), "float16")])


@needs_ipywidgets
def test_reservation_planner_follows_its_sliders():
    ui = W.reservation_planner(UNIT)
    assert ui.max_num_seqs.value == 16 and ui.max_model_len.value == 8192 and ui.block_size.value == 32
    assert ui.result.first_failing_unfixed == 4225
    assert "4,224 tokens" in ui.summary.value and "16.00 MiB" in ui.summary.value

    png = ui.image.value
    ui.max_num_seqs.value = 32  # twice the decode rows: locked without fix doubles (0.57 MiB)
    cfg = EngineConfig.from_preset(UNIT, max_num_seqs=32)
    assert ui.result.config == cfg
    assert ui.result.unfixed_locked_bytes == unfixed_locked_bytes(cfg) == 2 * 297472
    # short continuation chunks use no workspace, the 8 MiB continuation call still exceeds 0.57 MiB
    assert ui.result.first_failing_unfixed == 4096 + 129
    assert ui.image.value != png

    ui.max_model_len.value = 16384  # continuation buffers double
    assert ui.result.consumers[1][2] == 2 * 16777216

    ui.tensor_parallel_size.value = 2
    assert ui.result.config.num_heads_per_rank == 4 and ui.result.consumers[0][2] == unfixed_locked_bytes(
        ui.result.config)

    ui.kv_cache_dtype.value = "auto"  # vLLM runs another backend: no TurboQuant consumer, nothing to reserve or refuse
    assert ui.result.config.kv_cache_dtype == "auto"
    assert (ui.result.consumers, ui.result.unfixed_locked_bytes, ui.result.first_failing_unfixed) == ((), 0, None)
    assert ui.result.prediction.verdict == "ok"
    ui.kv_cache_dtype.value = "turboquant_k8v4"
    ui.block_size.value = 2080
    assert ui.result.consumers[1][1][0][0] == (1, 2, 16640, 128)  # round_up(16383, 2080)

    before = ui.result
    ui.max_num_seqs.value = 1024  # > max_num_batched_tokens (4096)? no: 1024 <= 4096 is valid
    assert ui.result is not before
    ui.max_num_batched_tokens.value = 512  # < max_num_seqs 1024: invalid, state kept
    kept = ui.result
    assert "invalid configuration" in ui.status.value and "max_num_batched_tokens (512)" in ui.status.value
    assert ui.result is kept
    ui.max_num_batched_tokens.value = 4096
    assert ui.status.value == "" and ui.result.config.max_num_batched_tokens == 4096


@needs_ipywidgets
def test_reservation_planner_preset_change_loads_every_slider():
    ui = W.reservation_planner(UNIT)
    ui.max_num_seqs.value = 64
    ui.preset.value = "llama-3.1-8b"
    cfg = EngineConfig.from_preset("llama-3.1-8b")
    assert ui.result.config == cfg
    assert (ui.max_model_len.value, ui.max_num_seqs.value, ui.max_num_batched_tokens.value) == (131072, 256, 8192)
    assert ui.kv_cache_dtype.value == "turboquant_4bit_nc" and ui.block_size.value == 16
    assert ui.result.first_failing_unfixed == 41089  # 5 x 8192 + 129: first dequant chunk past 131 MiB


def test_reservation_planner_rejects_unknown_preset():
    with pytest.raises(ValueError, match="known presets"):
        W.reservation_planner("no-such-model")


@needs_ipywidgets
def test_lifecycle_stepper_steps_both_engines():
    from tqlab.core.config import load_preset

    default = W.lifecycle_stepper(UNIT)
    assert default.prompt_tokens.value == min(load_preset(UNIT)["default_prompt_tokens"], 8190)
    ui = W.lifecycle_stepper(UNIT, prompt_tokens=8190)
    assert ui.prompt_tokens.value == 8190 and ui.prompt_tokens.max == 8190
    assert [len(t.steps) for t in ui.traces] == [8, 9] and ui.step.max == 8 and ui.step.value == 0
    assert "init_workspace" in ui.detail.value
    ui.next_button.click()
    assert ui.step.value == 1 and "load_model" in ui.detail.value
    ui.step.value = 3  # the builders come after the profile run, as in vLLM 0.33
    assert "build_backend" in ui.detail.value
    assert "resize 0.00 -&gt; 0.28 MiB" in ui.detail.value  # reservation, first call (decode views)
    ui.step.value = 7
    assert "VIOLATION" in ui.detail.value and "Workspace is locked" in ui.detail.value
    ui.step.value = 8
    assert "engine dead" in ui.detail.value and "decode @8,190" in ui.detail.value
    ui.next_button.click()
    assert ui.step.value == 8  # clamped
    ui.back_button.click()
    assert ui.step.value == 7

    png = ui.image.value
    ui.prompt_tokens.value = 4000  # one chunk: both engines serve it
    assert ui.step.value == 0 and png != ui.image.value
    assert [t.crashed for t in ui.traces] == [False, False]
    assert "serves the prompt" in ui.status.value


@needs_ipywidgets
def test_lifecycle_stepper_rejects_out_of_range_prompt():
    with pytest.raises(ValueError, match="prompt_tokens"):
        W.lifecycle_stepper(UNIT, prompt_tokens=8191)


def test_planner_numbers_are_the_analysis_numbers():
    from tqlab.predict.analysis import first_failing_prompt

    for preset in ("pr-44053-unit-test", "nemotron-3-super-120b-a12b", "llama-3.1-8b"):
        cfg = EngineConfig.from_preset(preset)
        r = W.plan_summary(cfg)
        assert r.unfixed_locked_bytes == unfixed_locked_bytes(cfg)
        assert r.first_failing_unfixed == first_failing_prompt(cfg, unfixed_locked_bytes(cfg))
        lengths, need = W.need_curve(cfg, points=40)
        assert need == [workspace_bytes_for_prompt(cfg, p) for p in lengths]


def test_planner_lists_every_other_consumer_and_who_sets_the_lock():
    from tqlab.lab.widgets.planner import _planner_html, other_consumers, plan_summary, planner_figure

    qwen = plan_summary(EngineConfig.from_preset("qwen3-30b-a3b"))
    assert [(c["name"], c["reserved_bytes"]) for c in other_consumers(qwen)] == [("fused_moe", 536_870_912)]
    html = _planner_html(qwen)
    assert "locked at 512.00 MiB (the largest request before the lock: modular_kernel.py:_allocate_buffers)" in html
    ds = plan_summary(EngineConfig.from_preset("deepseek-v3.2"))
    assert [c["name"] for c in other_consumers(ds)] == ["flashmla_sparse", "sparse_indexer"]
    html = _planner_html(ds)
    assert "not modelled (the answer is partial)" in html and "PR #44053 reserves nothing here" in html
    fig = planner_figure(ds)
    assert [round(p.get_height(), 2) for p in fig.axes[0].patches] == [2260.0, 826.0]
    seed = _planner_html(plan_summary(EngineConfig.from_preset("nemotron-3-super-120b-a12b")))
    assert "TurboQuant's decode capture at 4 rows" in seed and "other workspace consumers" not in seed
