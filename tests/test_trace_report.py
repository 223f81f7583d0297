"""``tqlab trace-report`` on the recorded two-rank run (data/trace_two_ranks/), the plugin's no-op path,
and the per-process recorder on tqlab's own manager. No vLLM needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.provenance import load_recorded
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes
from tqlab.core.workspace import WorkspaceLockedError, WorkspaceManager
from tqlab.predict.trace_report import load_trace_dir, trace_report
from tqlab.vllm.trace_record import RECORD_FORMAT, TRACE_ENV, TraceRecorder
from tqlab.vllm.tracer import WorkspaceTracer

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "data" / "trace_two_ranks"
META = load_recorded("trace_two_ranks").data
DEPLOY = ["--preset", META["preset"], "--args", META["engine_args"]]
LOCKED = 1073408  # nemotron at TP 2: decode scratch (4, 16, 32, 129) f32 + (4, 16, 128) bf16 + (4, 16) f32, aligned


@pytest.fixture
def trace_dir(tmp_path):
    d = tmp_path / "tq-trace"
    shutil.copytree(RECORDED, d)
    return d


def test_recorded_run_is_two_ranks_that_both_refused():
    recs, warnings = load_trace_dir(RECORDED)
    assert warnings == [] and sorted(META["records"]) == sorted(r["file"] for r in recs)
    assert [r["rank"]["tp"] for r in recs] == [{"rank": 0, "size": 2}, {"rank": 1, "size": 2}]
    assert [r["event"] for r in recs] == ["exit", "refused"]  # rank 1 died at the refusal (os._exit)
    assert {o["exit_code"] for o in META["outcome"].values()} == {0, 3}


def test_report_on_recorded_run_is_as_predicted():
    rep = trace_report(RECORDED, META["engine_args"], preset=META["preset"])
    assert rep["ranks_agree"] and rep["verdict"] == "as predicted"
    assert rep["prediction"]["locked_bytes"] == LOCKED and rep["prediction"]["disagreements"] == []
    for row in rep["rows"]:
        assert row["lock_bytes"] == [LOCKED]
        assert row["refused"] == [{"consumer": "continuation prefill (dequant)", "kind": "scratch",
                                   "required_bytes": 2 << 20, "current_bytes": LOCKED, "slot": 0}]
        assert row["consumers"]["split-KV decode"]["phase"] == "before lock"
    json.dumps(rep)


def test_cli_prints_refusal_on_both_ranks_and_as_predicted(tmp_path):
    res = CliRunner().invoke(app, ["trace-report", str(RECORDED), *DEPLOY, "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert res.output.count("refused continuation prefill (dequant), 2.00 MiB > 1.02 MiB") == 2
    assert "TP 0/2" in res.output and "TP 1/2" in res.output and "ranks: all 2 agree" in res.output
    assert res.output.rstrip().endswith("as predicted")
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "as predicted"


def test_without_deployment_only_merges():
    res = CliRunner().invoke(app, ["trace-report", str(RECORDED)])
    assert res.exit_code == 0 and "not compared with the prediction" in res.output and "as predicted" not in res.output


def test_truncated_and_foreign_json_are_skipped_with_one_line(trace_dir):
    first = sorted(trace_dir.glob("*.json"))[0]
    (trace_dir / "cut.json").write_text(first.read_text()[:300])
    (trace_dir / "other.json").write_text(json.dumps({"hello": 1}))
    (trace_dir / "list.json").write_text("[1, 2]")
    res = CliRunner().invoke(app, ["trace-report", str(trace_dir), *DEPLOY])
    assert res.exit_code == 0 and "Traceback" not in res.output
    warns = [ln for ln in res.output.splitlines() if ln.startswith("warning: skipped")]
    assert [w.split()[2] for w in warns] == ["cut.json:", "list.json:", "other.json:"]
    assert "as predicted" in res.output


def test_deep_or_mistyped_records_are_skipped_with_one_line(trace_dir):
    """A record of the right format with a field of the wrong type, or JSON nested too deeply to read, is a
    one-line warning like a truncated file (before: AttributeError / RecursionError tracebacks)."""
    first = sorted(trace_dir.glob("*.json"))[0]
    rec = json.loads(first.read_text())
    (trace_dir / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (trace_dir / "rank.json").write_text(json.dumps({**rec, "rank": "zero"}))
    (trace_dir / "locks.json").write_text(json.dumps({**rec, "locks": [{"kind": "lock", "sizes_bytes": ["1 MB"]}]}))
    (trace_dir / "refused.json").write_text(json.dumps({**rec, "refused": [{"caller": "x.py:1:f"}]}))
    res = CliRunner().invoke(app, ["trace-report", str(trace_dir), *DEPLOY])
    assert res.exit_code == 0 and res.exception is None, res.output
    warns = [ln for ln in res.output.splitlines() if ln.startswith("warning: skipped")]
    assert [w.split()[2] for w in warns] == ["deep.json:", "locks.json:", "rank.json:", "refused.json:"]
    assert warns[0].startswith("warning: skipped deep.json: not readable JSON")
    assert warns[1] == "warning: skipped locks.json: malformed record ('1 MB' where a whole number >= 0 is expected)"
    assert "as predicted" in res.output and res.output.count("refused continuation prefill (dequant)") == 2


def test_a_different_lock_size_is_named(trace_dir):
    path = sorted(trace_dir.glob("*.json"))[1]
    rec = json.loads(path.read_text())
    for lk in rec["locks"]:
        lk["sizes_bytes"] = [LOCKED + 256]
    path.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert not rep["ranks_agree"] and rep["rank_differences"] == ["TP 1/2 differs from TP 0/2 in lock sizes"]
    assert rep["verdict"] == "2 disagreement(s) with the prediction"
    assert rep["prediction"]["disagreements"][0].startswith("TP 1/2: slot 0 locked at 1.02 MiB (1,073,664 bytes)")
    assert "the lock recorded" in rep["prediction"]["disagreements"][1]


def test_bad_inputs_are_one_line_usage_errors(tmp_path):
    r = CliRunner().invoke(app, ["trace-report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = CliRunner().invoke(app, ["trace-report", str(tmp_path)])
    assert r.exit_code == 2 and "no tqlab trace record" in r.output
    r = CliRunner().invoke(app, ["trace-report", str(RECORDED), "--args", "vllm serve m"])
    assert r.exit_code == 2 and "--args needs --config" in r.output


# --------------------------------------------------------------------------- #
# the plugin and the recorder                                                 #
# --------------------------------------------------------------------------- #


def test_plugin_env_name_is_the_recorders():
    import tqlab.vllm_plugin as plugin

    assert plugin.TRACE_ENV == TRACE_ENV == "TQLAB_VLLM_TRACE"


def test_plugin_without_env_imports_and_patches_nothing():
    code = ("import sys; before = set(sys.modules); import tqlab.vllm_plugin as p; p.register(); "
            "print(sorted(m for m in set(sys.modules) - before if not m.startswith('_')))")
    env = {k: v for k, v in os.environ.items() if k != TRACE_ENV}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['tqlab', 'tqlab.vllm_plugin']"


def _requests(m):
    m.get_simultaneous(*decode_workspace_shapes(4, 4, 128, 32, torch.bfloat16))
    m.lock()
    m.get_simultaneous(*continuation_workspace_shapes(4096, 1, 128, 16))


def test_recorder_flushes_the_refusal_before_it_propagates(tmp_path):
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    rec = TraceRecorder(tmp_path, tracer)
    seen = []
    tracer.on_event = lambda ev: (rec.flush(ev), seen.append(json.loads(rec.path.read_text())["event"]))
    rec.on_attach(m)
    with pytest.raises(WorkspaceLockedError):
        _requests(m)
    assert seen == ["lock", "refused"]  # the file said "refused" while the error was still inside the manager
    data = json.loads(rec.path.read_text())
    assert data["format"] == RECORD_FORMAT and data["size_at_lock_bytes"] == [268544]
    assert data["refused"][0]["required_bytes"] == 2 << 20 and rec.flushes == 3
    assert list(tmp_path.iterdir()) == [rec.path]  # no temp file left


def test_recorder_write_failure_never_raises(tmp_path, capsys):
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    rec = TraceRecorder(tmp_path / "missing-dir", tracer)
    tracer.on_event = rec.flush
    rec.on_attach(m)
    with pytest.raises(WorkspaceLockedError):  # the manager's own error, not the trace's
        _requests(m)
    assert rec.write_errors == 3 and capsys.readouterr().err.count("tqlab trace: cannot write") == 1


def test_recorder_writes_nothing_without_a_manager(tmp_path):
    rec = TraceRecorder(tmp_path, WorkspaceTracer())
    rec.flush("exit")
    assert list(tmp_path.iterdir()) == []

