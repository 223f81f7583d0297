"""issue 33's hostile findings on the plugin's records and ``tqlab trace-report``, replayed (no vLLM needed).

The recorder: persistent-resource refusals ("... was not allocated during warmup", a persistent key
asked with another shape) are recorded and flushed before they propagate; a relative trace folder
survives a ``chdir``; the vLLM version is the imported one. trace-report: records that disagree with
each other or with ``--args``, a duplicated or missing rank, the fused-MoE consumer compared, DBO
slot 1 at 0, FIFOs / devices / huge files skipped with one line, record text printed escaped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.provenance import load_recorded
from tqlab.core.workspace import WorkspaceManager
from tqlab.predict.trace_report import trace_report
from tqlab.vllm.trace_record import TraceRecorder
from tqlab.vllm.tracer import WorkspaceTracer, vllm_version

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "data" / "trace_two_ranks"
META = load_recorded("trace_two_ranks").data
DEPLOY = ["--preset", META["preset"], "--args", META["engine_args"]]
LOCKED = 1073408


@pytest.fixture
def trace_dir(tmp_path):
    d = tmp_path / "tq-trace"
    shutil.copytree(RECORDED, d)
    return d


def _recs(d):
    return [(p, json.loads(p.read_text())) for p in sorted(d.glob("*.json"))]


def _run_cli(*args, timeout=60):
    """The CLI in a subprocess (a hang is a timeout, not a stuck test run)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "tqlab", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


# --------------------------------------------------------------------------- #
# the recorder                                                                #
# --------------------------------------------------------------------------- #


def _traced(tmp_path):
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    rec = TraceRecorder(tmp_path, tracer)
    events = []
    tracer.on_event = lambda ev: (rec.flush(ev), events.append(json.loads(rec.path.read_text())))
    rec.on_attach(m)
    return m, rec, events


def marlin_locks(m, stream="s0", n=64):
    return m.get_persistent(("marlin_locks", stream), (n,), torch.int, zero_init=True)


def test_persistent_refusal_after_lock_is_recorded_before_it_propagates(tmp_path):
    m, rec, events = _traced(tmp_path)
    marlin_locks(m)
    m.get_persistent_resource(("MoEPermuteScratch", 8, 8), lambda: object())
    m.lock()
    marlin_locks(m)  # cached before the lock: fine
    with pytest.raises(AssertionError, match="was not allocated during warmup") as err:
        marlin_locks(m, "s1")
    assert events[-1]["event"] == "refused"  # the file said so while the error was still inside the manager
    (v,) = events[-1]["refused"]
    assert v == {"caller": v["caller"], "required_bytes": 256, "current_bytes": 0, "slot": 0, "message": str(err.value),
                 "kind": "persistent", "key": "(<class 'torch.Tensor'>, ('marlin_locks', 's1'))"}
    assert v["caller"].endswith(":marlin_locks")
    with pytest.raises(AssertionError, match="was not allocated during warmup"):
        m.get_persistent_resource(("MoEPermuteScratch", 16, 16), lambda: object())
    last = json.loads(rec.path.read_text())
    assert [(r["kind"], r["required_bytes"]) for r in last["refused"]] == [("persistent", 256), ("persistent", None)]
    pers = {(p["key"], p["created"], p["refused"], p["requests"]) for p in last["persistent"]}
    assert ("(<class 'torch.Tensor'>, ('marlin_locks', 's0'))", 1, 0, 2) in pers
    assert ("('MoEPermuteScratch', 8, 8)", 1, 0, 1) in pers


def test_persistent_shape_refusal_is_recorded_once(tmp_path):
    m, rec, events = _traced(tmp_path)
    marlin_locks(m)
    with pytest.raises(ValueError, match="Persistent workspace"):
        marlin_locks(m, n=32)
    (v,) = json.loads(rec.path.read_text())["refused"]
    assert (v["kind"], v["required_bytes"], events[-1]["event"]) == ("persistent_shape", 128, "refused")
    (p,) = json.loads(rec.path.read_text())["persistent"]
    assert (p["requests"], p["created"], p["refused"]) == (2, 1, 1)


def test_detach_restores_the_persistent_methods():
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    assert {"get_persistent_resource", "get_persistent"} <= set(vars(m))
    tracer.detach()
    assert not {"get_persistent_resource", "get_persistent"} & set(vars(m))
    marlin_locks(m)
    assert tracer.persistent == {}


def test_relative_trace_folder_survives_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    rec = TraceRecorder("rel/trace", tracer)
    (tmp_path / "rel" / "trace").mkdir(parents=True)
    tracer.on_event = rec.flush
    rec.on_attach(m)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # vLLM or a model's code may chdir between start and the lock
    m.lock()
    assert rec.write_errors == 0 and rec.path.is_absolute()
    assert json.loads((tmp_path / "rel" / "trace" / rec.path.name).read_text())["event"] == "lock"
    assert not (elsewhere / "rel").exists()


def test_vllm_version_is_the_imported_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.99.0.dev1+gabc"))
    assert vllm_version() == "0.99.0.dev1+gabc"


# --------------------------------------------------------------------------- #
# trace-report questions its records                                          #
# --------------------------------------------------------------------------- #


def _edit(path, **changes):
    rec = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "config":
            rec["config"].update(value)
        else:
            rec[key] = value
    path.write_text(json.dumps(rec))


def test_mixed_vllm_versions_are_named(trace_dir):
    p = sorted(trace_dir.glob("*.json"))[1]
    _edit(p, vllm_version="0.34.0")
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert rep["record_problems"] == [f"records ran different vLLM versions: 0.33.0 ({sorted(trace_dir.glob('*.json'))[0].name}); "
                                      f"0.34.0 ({p.name})"]
    assert "records ran vLLM 0.34.0; the prediction models vLLM 0.33.0" in rep["prediction"]["disagreements"]
    assert rep["verdict"] == "2 disagreement(s) with the prediction"


def test_config_contradicting_args_is_named(trace_dir):
    rep = trace_report(trace_dir, META["engine_args"] + " --max-model-len 8192", preset=META["preset"])
    lines = [d for d in rep["prediction"]["disagreements"] if "ran a different deployment" in d]
    assert len(lines) == 2 and "max_model_len 131072 (--args: 8192)" in lines[0]
    rep = trace_report(trace_dir, META["engine_args"].replace("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B", "other/M"),
                       preset=META["preset"])
    assert any("model 'nvidia/NVIDIA-Nemotron-3-Super-120B-A12B' (--args: 'other/M')" in d
               for d in rep["prediction"]["disagreements"])
    assert rep["verdict"] != "as predicted"


def test_records_disagreeing_in_config_are_named(trace_dir):
    a, b = sorted(trace_dir.glob("*.json"))
    _edit(b, config={"max_num_seqs": 8})
    rep = trace_report(trace_dir)
    assert rep["record_problems"] == [f"{b.name}'s config differs from {a.name}'s in max_num_seqs (8 vs 4)"]
    assert "records disagree" in CliRunner().invoke(app, ["trace-report", str(trace_dir)]).output


def test_duplicated_and_missing_ranks_are_named(trace_dir):
    a, b = sorted(trace_dir.glob("*.json"))
    rank0 = json.loads(a.read_text())["rank"]
    _edit(b, rank=rank0)  # two records claim TP 0: rank 1 has none
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert rep["record_problems"] == [f"rank DP 0/1 PP 0/1 TP 0/2 recorded 2 times ({a.name}, {b.name})",
                                      "1 of 2 ranks have no record: DP 0/1 PP 0/1 TP 1/2"]
    assert rep["verdict"] != "as predicted"
    b.unlink()  # one rank only
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert rep["record_problems"] == ["1 of 2 ranks have no record: DP 0/1 PP 0/1 TP 1/2"]
    assert rep["verdict"] == "1 disagreement(s) with the prediction"


def test_dbo_slot_one_at_zero_is_the_rule_not_a_disagreement(trace_dir):
    for p, rec in _recs(trace_dir):
        for lk in rec["locks"]:
            lk["sizes_bytes"] = [LOCKED, 0]
        rec["config"]["enable_dbo"] = True
        p.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, META["engine_args"] + " --enable-dbo", preset=META["preset"])
    assert rep["verdict"] == "as predicted", rep["prediction"]["disagreements"]
    assert any("slot 1 locked at 0.00 MiB: tqlab sizes slot (ubatch 0, lane 0) only" in a
               for a in rep["prediction"]["agreements"])
    big = 128 << 20  # larger than slot 0 could ever be: named
    for p, rec in _recs(trace_dir):
        rec["locks"][-1]["sizes_bytes"] = [LOCKED, big]
        p.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, META["engine_args"] + " --enable-dbo", preset=META["preset"])
    assert any("slot 1 locked at 128.00 MiB" in d for d in rep["prediction"]["disagreements"])


def test_the_fused_moe_request_is_compared(trace_dir):
    """qwen3-30b-a3b: inspect-vllm predicts modular_kernel.py:_allocate_buffers at 512 MiB."""
    moe = 536870912
    for p, rec in _recs(trace_dir):
        rec["consumers"].append({"caller": "modular_kernel.py:420:_allocate_buffers", "requests": 1,
                                 "high_water_bytes": moe, "high_water_phase": "before lock"})
        p.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, "vllm serve Qwen/Qwen3-30B-A3B", preset="qwen3-30b-a3b")
    assert rep["prediction"]["largest_request_bytes"]["modular_kernel.py:_allocate_buffers"] == moe
    assert any("modular_kernel.py:_allocate_buffers asked for at most 512.00 MiB" in a
               for a in rep["prediction"]["agreements"])
    assert not any("not a consumer tqlab predicts" in a for a in rep["prediction"]["agreements"])
    # a consumer the prediction has no row for is a disagreement, never a silent "not compared"
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert any("modular_kernel.py:_allocate_buffers (modular_kernel.py:420:_allocate_buffers) asked for 512.00 MiB; "
               "the prediction has no such consumer" in d for d in rep["prediction"]["disagreements"])


def test_persistent_refusal_row_is_a_disagreement(trace_dir):
    p = sorted(trace_dir.glob("*.json"))[1]
    rec = json.loads(p.read_text())
    msg = "Workspace is locked but ('k', 1) was not allocated during warmup for the current ubatch and lane."
    rec["refused"].append({"caller": "moe_permute_unpermute.py:142:get_moe_permute_scratch", "required_bytes": None,
                           "current_bytes": LOCKED, "slot": 0, "message": msg, "kind": "persistent", "key": "('k', 1)"})
    p.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert rep["warnings"] == []
    assert (f"TP 1/2: vLLM refused moe_permute_unpermute.py:get_moe_permute_scratch (persistent): {msg}; "
            "the prediction does not foresee this refusal") in rep["prediction"]["disagreements"]
    res = CliRunner().invoke(app, ["trace-report", str(trace_dir), *DEPLOY])
    assert res.exit_code == 0 and "(persistent)" in res.output


def test_markup_in_a_record_prints_escaped(trace_dir):
    for p, rec in _recs(trace_dir):
        rec["consumers"].append({"caller": "x.py:1:[/]", "requests": 1, "high_water_bytes": 256,
                                 "high_water_phase": "[bold]before lock"})
        rec["host"] = "[red]h"
        p.write_text(json.dumps(rec))
    (trace_dir / "[b]bad.json").write_text("{")
    res = CliRunner().invoke(app, ["trace-report", str(trace_dir), *DEPLOY])
    assert res.exception is None and res.exit_code == 0, res.output
    assert "x.py:[/]" in res.output and "skipped [b]bad.json" in res.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_device_folder_and_huge_files_are_skipped_with_one_line(trace_dir):
    os.mkfifo(trace_dir / "fifo.json")
    (trace_dir / "zero.json").symlink_to("/dev/zero")
    (trace_dir / "dir.json").mkdir()
    with open(trace_dir / "huge.json", "wb") as f:  # sparse: 1.5 GB on paper, nothing on disk
        f.truncate(1_500_000_000)
    res = _run_cli("trace-report", str(trace_dir), *DEPLOY)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    warns = [ln for ln in res.stdout.splitlines() if ln.startswith("warning: skipped")]
    assert warns == ["warning: skipped dir.json: not a regular file (a folder)",
                     "warning: skipped fifo.json: not a regular file (a FIFO)",
                     "warning: skipped huge.json: 1,500,000,000 bytes, more than a record can be (16,777,216)",
                     "warning: skipped zero.json: not a regular file (a character device)"]
    assert res.stdout.rstrip().endswith("as predicted")


def test_impossible_ranks_and_fields_are_skipped_with_one_line(trace_dir):
    a, b = sorted(trace_dir.glob("*.json"))
    rec = json.loads(a.read_text())
    huge = {g: {"rank": 0, "size": 10**6} for g in ("dp", "pp", "tp")}  # would enumerate 10**18 ranks
    (trace_dir / "huge-ranks.json").write_text(json.dumps({**rec, "rank": huge}))
    (trace_dir / "bad-rank.json").write_text(json.dumps({**rec, "rank": {**rec["rank"], "tp": {"rank": 2, "size": 2}}}))
    (trace_dir / "bad-config.json").write_text(json.dumps({**rec, "config": [1]}))
    rep = trace_report(trace_dir, META["engine_args"], preset=META["preset"])
    assert rep["warnings"] == [
        "skipped bad-config.json: malformed record (config [1] is not an object)",
        "skipped bad-rank.json: malformed record (rank tp {'rank': 2, 'size': 2} is not {'rank': r, 'size': s} "
        "with 0 <= r < s)",
        "skipped huge-ranks.json: malformed record (rank sizes make 1,000,000,000,000,000,000 ranks (more than 65,536))"]
    assert rep["verdict"] == "as predicted"


def test_a_refusal_where_every_request_is_predicted_to_fit_is_named(trace_dir):
    """--max-model-len 512: the predictor says "ok" without PR #44053 (no prompt overflows the 1.02 MiB lock);
    a recorded refusal is then a disagreement, never "as predicted without PR #44053"."""
    for p, rec in _recs(trace_dir):
        rec["config"]["max_model_len"] = 512
        p.write_text(json.dumps(rec))
    rep = trace_report(trace_dir, META["engine_args"] + " --max-model-len 512", preset=META["preset"])
    # (512: since the verdict covers a busy server, 4096 is a predicted crash -- the any-chunking bound is 656)
    dis = rep["prediction"]["disagreements"]
    assert [d for d in dis if "refused" in d] == [
        f"TP {r}/2: continuation prefill (dequant) refused 2.00 MiB > 1.02 MiB; predicted: every request of this "
        "deployment fits, even without PR #44053" for r in (0, 1)]
    assert [d for d in dis if "refused" not in d] == [
        f"TP {r}/2: continuation prefill (dequant) asked for 2.00 MiB, more than the predicted largest 0.25 MiB"
        for r in (0, 1)]


def test_oversized_tables_are_refused_or_cut(trace_dir):
    """A record with a million lock slots or consumers is skipped; many real consumers fill at most 16 columns."""
    a, b = sorted(trace_dir.glob("*.json"))
    rec = json.loads(a.read_text())
    (trace_dir / "slots.json").write_text(json.dumps({**rec, "locks": [{"kind": "lock", "sizes_bytes": [0] * 10**5}]}))
    many = [{"caller": f"f{i}.py:1:g{i}", "requests": 1, "high_water_bytes": 256 * (i + 1)} for i in range(2000)]
    (trace_dir / "many.json").write_text(json.dumps({**rec, "consumers": many}))
    res = _run_cli("trace-report", str(trace_dir))
    assert res.returncode == 0, res.stderr
    assert ("warning: skipped many.json: malformed record (2,000 entries in consumers, more than a vLLM process "
            "makes (1,024))") in res.stdout
    assert "warning: skipped slots.json: malformed record (100,000 workspace slots" in res.stdout
    _edit(b, consumers=json.loads(b.read_text())["consumers"] + many[:40])
    rep = trace_report(trace_dir)
    from tqlab.predict.trace_report import render

    lines = [str(x) for x in render(rep) if isinstance(x, str)]
    assert "26 more consumer(s) with smaller requests: see --json" in lines
