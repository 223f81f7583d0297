"""tqlab.lab.plots_startup: vLLM 0.33's start-up steps x consumers (notebook 03's figure), exact values."""

import matplotlib

matplotlib.use("Agg")

import pytest

from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.lab import plots_startup as ps
from tqlab.lab.report_gaps import moe_hidden_to_hold
from tqlab.predict import analysis

REPORT = "nemotron-3-super-120b-a12b"
PROFILING_BUILDERS = "cudagraph profiling:\nminimal KV cache"
PROFILING_CAPTURE = "cudagraph profiling:\n2 largest graphs/mode"


def _grows(c, fix):
    steps = ps.startup_steps(c)
    sizes = ps.slot_after_steps(ps.startup_requests(c, fix), steps)
    return [(s.name, after) for s, before, after in zip(steps, [0] + sizes, sizes) if after > before]


def test_steps_in_vllm_order_and_eager_drops_graph_steps():
    c = EngineConfig.from_preset(REPORT)
    names = [s.name for s in ps.startup_steps(c)]
    assert names == ["init_device", "load_model", "profile_run", PROFILING_BUILDERS, PROFILING_CAPTURE,
                     "initialize_kv_cache", "kernel warm-up", "capture_model"]
    eager = [s.name for s in ps.startup_steps(c.replace(enforce_eager=True))]
    assert eager == ["init_device", "load_model", "profile_run", "initialize_kv_cache", "kernel warm-up"]
    assert ps.startup_requests(c.replace(enforce_eager=True)) == {}  # never locks: nothing frozen


def test_report_grows_in_cudagraph_profiling():
    c = EngineConfig.from_preset(REPORT)
    assert _grows(c, False) == [(PROFILING_CAPTURE, 268_544)]  # the decode scratch, first in the profiling capture
    assert _grows(c, True) == [(PROFILING_BUILDERS, 64 * 2**20)]  # _reserve_workspace, first in the minimal KV cache
    req = ps.startup_requests(c, True)
    assert req["turboquant_continuation"] == {PROFILING_BUILDERS: 64 * 2**20, "initialize_kv_cache": 64 * 2**20}
    assert "profile_run" not in req["turboquant_decode"]


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", REPORT, "deepseek-v3.2"])
@pytest.mark.parametrize("fix", [False, True])
def test_final_slot_is_the_engines_lock(preset, fix):
    c = EngineConfig.from_preset(preset)
    final = ps.slot_after_steps(ps.startup_requests(c, fix), ps.startup_steps(c))[-1]
    assert final == analysis.locked_bytes(c, fix=fix)
    if preset != "deepseek-v3.2":  # keep the test quick: the engine on meta for the two TurboQuant presets
        assert final == LLMEngine(c, fix=fix, device="meta").locked_bytes


def test_moe_sets_slot_first_on_qwen():
    c = EngineConfig.from_preset("qwen3-30b-a3b")
    assert _grows(c, True)[0] == ("profile_run", 512 * 2**20)


def test_plot_draws_one_row_per_consumer_plus_slot():
    ax = ps.plot_startup_consumers(EngineConfig.from_preset(REPORT), True)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["turboquant_decode", "turboquant_continuation", "slot 0 after the step"]
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "lock_workspace"


def test_moe_hidden_to_hold():
    c = EngineConfig.from_preset(REPORT)  # M = 4096, bf16: 8192 bytes per hidden unit
    assert moe_hidden_to_hold(c, 2 * 2**20) == 256
    assert moe_hidden_to_hold(c, 2 * 2**20 + 1) == 257
    assert moe_hidden_to_hold(c, 64 * 2**20) == 8192
    with pytest.raises(ValueError, match="nbytes must be >= 1, got 0"):
        moe_hidden_to_hold(c, 0)
