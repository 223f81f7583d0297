"""tqlab's vLLM general plugin, loaded by vLLM 0.33's own plugin loader, on two spawned "ranks".

Needs the project installed in this venv (its ``vllm.general_plugins`` entry point):
``parity/install.sh`` does it. vLLM 0.33: ``vllm/plugins/__init__.py``
(``load_plugins_by_group``, ``load_general_plugins``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trace_ranks

ROOT = Path(__file__).resolve().parent.parent
VLLM_RELEASE = importlib.metadata.version("vllm")
# vLLM 0.34's turboquant_attn.py lost one line above _continuation_prefill's request (self._n_centroids)
SEED_LINE = {"0.33.0": 942, "0.34.0": 941}[VLLM_RELEASE]
SEED_REFUSAL = (f"Workspace is locked but allocation from 'turboquant_attn.py:{SEED_LINE}:_continuation_prefill' requires "
                "2.00 MB, current size is 1.02 MB. Workspace growth is not allowed after locking.")


@pytest.fixture(scope="module", autouse=True)
def _project_installed(tmp_path_factory):
    """The entry point as vLLM finds it anywhere: checked isolated (``python -I``) from a folder outside the
    repository (``parity/check_entry_point.py``), so a ``tqlab.egg-info`` in the repository root on
    ``sys.path`` cannot pass for an install into this venv (issue 33)."""
    away = tmp_path_factory.mktemp("outside-the-repo")
    out = subprocess.run([sys.executable, "-I", str(ROOT / "parity" / "check_entry_point.py")], cwd=away,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.fail(f"{out.stdout.strip()}: run `bash parity/install.sh` (it installs the project, editable, "
                    "--no-deps)")


def test_vllm_plugin_loader_finds_the_entry_point():
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    import tqlab.vllm_plugin

    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins["tqlab_trace"] is tqlab.vllm_plugin.register


_UNTOUCHED = r"""
import json, os, sys, time
assert "TQLAB_VLLM_TRACE" not in os.environ
import vllm.v1.worker.workspace as ws
import vllm.plugins
before = {k: id(v) for k, v in vars(ws.WorkspaceManager).items()}
mods = set(sys.modules)
t0 = time.perf_counter()
vllm.plugins.load_general_plugins()   # vLLM's loader: imports tqlab.vllm_plugin and calls register()
dt = time.perf_counter() - t0
after = {k: id(v) for k, v in vars(ws.WorkspaceManager).items()}
print(json.dumps({"same_class": before == after, "new_modules": sorted(set(sys.modules) - mods),
                  "load_general_plugins_ms": dt * 1e3}))
"""


def test_plugin_without_trace_env_patches_nothing(record):
    env = {k: v for k, v in os.environ.items() if k != "TQLAB_VLLM_TRACE"}
    out = subprocess.run([sys.executable, "-c", _UNTOUCHED], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["same_class"]
    tq = [m for m in res["new_modules"] if m.startswith("tqlab")]
    assert tq == ["tqlab", "tqlab.vllm_plugin"]  # nothing of the tracer, nothing patched
    record("load_general_plugins_ms_untraced", round(res["load_general_plugins_ms"], 1))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("tq-trace")
    return d, trace_ranks.run_two_ranks(d)


def test_two_ranks_each_load_the_plugin_and_hit_the_refusal(two_ranks):
    _, outcome = two_ranks
    assert sorted(outcome) == [0, 1]
    for rank, (loaded, error, code) in outcome.items():
        assert loaded, f"rank {rank}: vLLM's load_general_plugins() did not start tqlab's tracer"
        assert error == SEED_REFUSAL
    assert (outcome[0][2], outcome[1][2]) == (0, 3)  # rank 1 died with os._exit: no atexit


def test_both_records_on_disk_with_vllm_ranks(two_ranks, record):
    d, _ = two_ranks
    recs = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]
    assert len(recs) == 2 and not list(d.glob(".*.tmp"))
    by_rank = {r["rank"]["tp"]["rank"]: r for r in recs}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0]["event"] == "exit" and by_rank[1]["event"] == "refused"  # flushed before the assertion left
    for r in recs:
        assert r["rank"]["tp"]["size"] == 2 and r["rank"]["world"]["size"] == 2
        assert r["vllm_version"] == VLLM_RELEASE and r["config"]["tensor_parallel_size"] == 2
        assert r["size_at_lock_bytes"] == [1073408]
        (v,) = r["refused"]
        assert (v["required_bytes"], v["current_bytes"], v["slot"], v["message"]) == (2 << 20, 1073408, 0, SEED_REFUSAL)
        cons = {c["caller"].rsplit(":", 1)[1]: c for c in r["consumers"]}
        assert cons["_decode_attention"]["high_water_bytes"] == 1073408
        assert cons["_decode_attention"]["high_water_phase"] == "before lock"
        assert cons["_continuation_prefill"]["high_water_phase"] == "after lock"
    record("records", {k: {"event": v["event"], "flushes": v["flushes"]} for k, v in by_rank.items()})


def test_trace_report_finds_the_refusal_and_agrees_with_the_prediction(two_ranks, record):
    from click.testing import CliRunner

    from tqlab.cli import app
    from tqlab.predict.trace_report import trace_report

    d, _ = two_ranks
    rep = trace_report(d, trace_ranks.ENGINE_ARGS, preset=trace_ranks.PRESET)
    assert rep["ranks_agree"] and rep["verdict"] == "as predicted" and rep["warnings"] == []
    assert [row["rank"] for row in rep["rows"]] == ["TP 0/2", "TP 1/2"]
    assert all(len(row["refused"]) == 1 for row in rep["rows"])
    assert rep["prediction"]["locked_bytes"] == 1073408
    res = CliRunner().invoke(app, ["trace-report", str(d), "--preset", trace_ranks.PRESET,
                                   "--args", trace_ranks.ENGINE_ARGS])
    assert res.exit_code == 0, res.output
    assert "as predicted" in res.output and res.output.count("refused continuation prefill") == 2
    record("verdict", rep["verdict"])


_PERSISTENT = r"""
import os, sys, torch
os.environ["TQLAB_VLLM_TRACE"] = "rel/trace"          # relative, resolved when tracing starts
from tqlab.vllm import vllm_cpu_patches
with vllm_cpu_patches():
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    import vllm.v1.worker.workspace as ws
    from vllm.model_executor.layers.fused_moe.moe_permute_unpermute import get_moe_permute_scratch
    ws.init_workspace_manager(torch.device("cpu"))
    m = ws.current_workspace_manager()
    m.get_simultaneous(((1 << 20,), torch.uint8))
    m.get_persistent(("marlin_locks", 0), (64,), torch.int, zero_init=True)   # vLLM marlin_utils' key and dtype
    get_moe_permute_scratch(num_experts=8, num_local_experts=8, device=torch.device("cpu"))
    ws.lock_workspace()
    os.chdir(sys.argv[1])                                                        # the engine moves away
    try:
        get_moe_permute_scratch(num_experts=16, num_local_experts=16, device=torch.device("cpu"))
    except AssertionError as e:
        print(str(e))
        sys.stdout.flush()
        os._exit(3)                                                              # a dead engine runs no atexit
"""


def test_persistent_refusal_after_a_chdir_is_in_the_record(tmp_path, record):
    """issue 33: vLLM's MoE permute scratch refused after the lock ("... was not allocated during warmup",
    ``moe_permute_unpermute.py`` ``get_moe_permute_scratch`` -> ``WorkspaceManager.get_persistent_resource``)
    ends the record as ``refused`` with vLLM's message, although the process left the folder that the
    relative ``TQLAB_VLLM_TRACE`` named; the record states the vLLM that ran."""
    import vllm

    away = tmp_path / "away"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _PERSISTENT, str(away)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 3, out.stderr[-2000:]
    message = out.stdout.strip().splitlines()[-1]
    assert "was not allocated during warmup" in message
    (path,) = (tmp_path / "rel" / "trace").glob("*.json")
    assert not list(away.rglob("*.json"))
    rec = json.loads(path.read_text())
    assert rec["event"] == "refused" and rec["vllm_version"] == vllm.__version__
    (v,) = rec["refused"]
    assert (v["kind"], v["message"], v["required_bytes"], v["current_bytes"]) == ("persistent", message, None, 1 << 20)
    assert v["caller"].endswith(":get_moe_permute_scratch") and v["caller"].startswith("moe_permute_unpermute.py:")
    created = {p["key"]: p for p in rec["persistent"] if p["created"]}
    assert any("marlin_locks" in k and p["nbytes"] == 256 for k, p in created.items())
    record("persistent_refusal", {"kind": v["kind"], "caller": v["caller"]})


def test_tracer_records_vllms_shape_and_lane_refusals():
    """vLLM 0.33 ``workspace.py``: ``get_persistent`` of a cached key with another shape raises ``ValueError``;
    a lane the manager was not built with raises ``RuntimeError`` (``_get_workspace_id``). Each is recorded
    with vLLM's own message before it propagates, and vLLM's error is what the caller sees."""
    import torch
    from vllm.v1.worker.workspace import WorkspaceManager, use_workspace_lane

    from tqlab.vllm import vllm_cpu_patches
    from tqlab.vllm.tracer import WorkspaceTracer

    with vllm_cpu_patches():
        m = WorkspaceManager(torch.device("cpu"))
        tracer = WorkspaceTracer(m)
        events = []
        tracer.on_event = events.append
        m.get_persistent(("marlin_locks", 0), (64,), torch.int)
        with pytest.raises(ValueError, match="Persistent workspace") as shape:
            m.get_persistent(("marlin_locks", 0), (32,), torch.int)
        with use_workspace_lane(1), pytest.raises(RuntimeError, match="Workspace lane 1 is not configured") as lane:
            m.get_simultaneous(((256,), torch.uint8))
    assert events == ["refused", "refused"]
    a, b = tracer.violations
    assert (a.kind, a.required_bytes, a.message) == ("persistent_shape", 128, str(shape.value))
    assert (b.kind, b.required_bytes, b.slot, b.message) == ("lane", 256, 1, str(lane.value))
    assert a.caller.startswith("test_plugin_parity.py:") and b.caller.startswith("test_plugin_parity.py:")
