"""tqlab.lab.plots_consumers and tqlab.lab.consumer_cases: notebook 10's picture and helpers, value by value."""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from tqlab.core.config import EngineConfig
from tqlab.core.consumers.registry import ConsumerTable
from tqlab.core.workspace import MiB
from tqlab.lab import consumer_cases
from tqlab.lab import plots_consumers as pc
from tqlab.predict import analysis

PRESETS = ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3.2", "nemotron-3-super-120b-a12b")


@pytest.fixture(scope="module")
def tables():
    return {p: analysis.consumer_table(EngineConfig.from_preset(p)) for p in PRESETS}


def test_bars_carry_the_registrys_bytes_in_order(tables):
    bars = pc.consumer_bars(tables)
    expected = [(p, r.name, r.consumer, r.phase, r.reserved_bytes, r.max_runtime_bytes, r.covered)
                for p, t in tables.items() for r in t.rows]
    assert [tuple(b)[:7] for b in bars] == expected
    qwen = {b.name: b for b in bars if b.model == "qwen3-30b-a3b"}
    # Qwen3-30B-A3B's config.json: M = 8192 tokens, top-8, hidden 2048 > moe_intermediate 768 -> two (M, 8, 2048) bf16
    assert qwen["fused_moe"].reserved_bytes == 2 * 8192 * 8 * 2048 * 2 == 512 * MiB
    # TurboQuant continuation: 2 x (1, Hk=4, round_up(40959, 16)=40960, 128) fp16
    assert qwen["turboquant_continuation"].reserved_bytes == 2 * 4 * 40960 * 128 * 2 == 80 * MiB


def test_the_lock_setter_is_the_maximum_and_the_sum_is_larger(tables):
    bars = pc.consumer_bars(tables)
    assert pc.lock_setters(bars, "deepseek-v3.2") == ["flashmla_sparse"]
    assert pc.lock_setters(bars, "qwen3-30b-a3b") == ["turboquant_decode"]
    assert pc.lock_setters(bars, "llama-3.1-8b") == ["turboquant_continuation"]
    assert pc.lock_setters(bars, "nemotron-3-super-120b-a12b") == ["turboquant_continuation"]
    for p, t in tables.items():
        setters = [b for b in bars if b.model == p and b.sets_lock]
        assert [b.reserved_bytes for b in setters] == [t.locked_bytes]
        assert pc.sum_of_reservations(bars, p) == sum(r.reserved_bytes for r in t.rows) > t.locked_bytes


def test_no_lock_setter_when_start_up_never_locks_or_the_slot_stays_empty():
    eager = analysis.consumer_table(EngineConfig.from_preset("qwen3-30b-a3b", enforce_eager=True))
    assert eager.locked_bytes is None
    piecewise_dcp = analysis.consumer_table(EngineConfig.from_preset(
        "llama-3.1-8b", kv_cache_dtype="auto", tensor_parallel_size=2, decode_context_parallel_size=2,
        cudagraph_mode="PIECEWISE"))
    assert piecewise_dcp.locked_bytes == 0
    bars = pc.consumer_bars({"eager": eager, "dcp": piecewise_dcp})
    assert bars and not any(b.sets_lock for b in bars)
    assert [b.covered for b in bars if b.model == "dcp"] == [False]


def test_plot_bar_widths_lock_and_sum_lines_equal_the_registry(tables):
    fig = pc.plot_consumer_bytes(tables, title="t")
    try:
        assert len(fig.axes) == len(PRESETS)
        for ax, (p, t) in zip(fig.axes, tables.items()):
            reserved, runtime = ax.containers[0], ax.containers[1]
            assert [r.get_width() for r in reserved] == [r.reserved_bytes / MiB for r in t.rows]
            assert [r.get_width() for r in runtime] == [r.max_runtime_bytes / MiB for r in t.rows]
            assert [r.get_facecolor() == matplotlib.colors.to_rgba(pc.LOCK_SETTER_COLOR) for r in reserved] == [
                r.reserved_bytes == t.locked_bytes for r in t.rows]
            xs = sorted(line.get_xdata()[0] for line in ax.get_lines())
            assert xs == sorted([t.locked_bytes / MiB, sum(r.reserved_bytes for r in t.rows) / MiB])
            assert ax.get_title(loc="left").startswith(p)
        assert "modular_kernel.py" in fig.axes[2].get_title(loc="left")  # DeepSeek-V3.2's FP8 MoE: unmodelled, said
    finally:
        plt.close(fig)


def test_plot_draws_no_sum_line_for_a_single_reserving_consumer():
    dcp = analysis.consumer_table(EngineConfig.from_preset(
        "llama-3.1-8b", kv_cache_dtype="auto", tensor_parallel_size=2, decode_context_parallel_size=2))
    fig = pc.plot_consumer_bytes({"dcp": dcp})
    try:
        assert [line.get_xdata()[0] for line in fig.axes[0].get_lines()] == [dcp.locked_bytes / MiB]
        assert dcp.locked_bytes == 8192 * (32 // 2) * 2 * 128 * 2  # (mnbt, Hq per rank x dcp, D) bf16
    finally:
        plt.close(fig)


def test_plot_refuses_nothing_to_draw():
    with pytest.raises(ValueError, match=r"^plot_consumer_bytes: no models given$"):
        pc.plot_consumer_bytes({})
    with pytest.raises(ValueError, match=r"^plot_consumer_bytes: no active consumer for empty$"):
        pc.plot_consumer_bytes({"empty": ConsumerTable((), 0, ())})


def test_lock_without_fix_is_turboquants_capture_scratch_next_to_the_moe():
    cfg = EngineConfig.from_preset("qwen3-30b-a3b", max_num_seqs=4)
    parts = consumer_cases.lock_without_fix(cfg)
    # TurboQuant: decode views at 4 rows, (4, 32, 32 splits, 129) f32 + (4, 32, 128) bf16 + (4, 32) f32, 256-aligned
    assert parts == {"turboquant": 4 * 32 * 32 * 129 * 4 + 4 * 32 * 128 * 2 + 4 * 32 * 4, "fused_moe": 512 * MiB}
    assert max(parts.values()) == 512 * MiB > parts["turboquant"]  # the MoE's profile run sets the slot
    assert consumer_cases.lock_without_fix(EngineConfig.from_preset("nemotron-3-super-120b-a12b")) == {
        "turboquant": 268_544}  # the bug report's "current size is 0.26 MB"
    assert consumer_cases.lock_without_fix(cfg.replace(enforce_eager=True)) == {}
    ds = consumer_cases.lock_without_fix(EngineConfig.from_preset("deepseek-v3.2"))
    assert ds == {r.name: r.reserved_bytes for r in analysis.consumer_table(EngineConfig.from_preset("deepseek-v3.2")).rows}


def test_parity_python_finds_the_venvs_interpreter(tmp_path):
    pkg = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm"
    pkg.mkdir(parents=True)
    assert consumer_cases.parity_python(pkg) is None  # no bin/python yet
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir()
    py.write_text("")
    assert consumer_cases.parity_python(pkg) == py.resolve()
    assert consumer_cases.parity_python(None) is None


def test_latent_crash_checks_without_vllm_fail_in_one_line():
    # this interpreter has no vLLM: the subprocess cannot import vllm_cpu_patches' targets
    with pytest.raises(RuntimeError) as err:
        consumer_cases.run_latent_crash_checks(sys.executable)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{sys.executable} parity/latent_crashes.py checks failed (exit 1): ")


def test_latent_crash_checks_past_the_timeout_fail_in_one_line():
    with pytest.raises(RuntimeError, match=r"^.* parity/latent_crashes\.py checks ran past 0\.01 s$"):
        consumer_cases.run_latent_crash_checks(sys.executable, timeout_s=0.01)
