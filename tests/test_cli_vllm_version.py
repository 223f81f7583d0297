"""``--vllm 0.33 | 0.34`` on plan, inspect-vllm, repro and trace-report: chosen once per run, stated by every report,
and the answers differ exactly where the two releases differ (each difference read from that release's code;
``parity/test_capture_sizes_parity.py`` compares the capture sizes with each release's own code)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core import vllm_versions
from tqlab.predict.kv_pool import kv_pool
from tqlab.core.config import EngineConfig
from tqlab.core.provenance import load_recorded

ROOT = Path(__file__).resolve().parent.parent
SPEC = ["--preset", "qwen3-32b", "--num-speculative-tokens", "3", "--max-num-seqs", "4"]
ARGS = "vllm serve Qwen/Qwen3-32B --tensor-parallel-size 2 --kv-cache-dtype turboquant_k3v4_nc"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(vllm_versions.ENV, raising=False)
    vllm_versions.reset()
    yield
    vllm_versions.reset()


def _run(*args):
    return CliRunner().invoke(app, list(args))


def _json(*args) -> dict:
    r = _run(*args, "--json", "-")
    assert r.exit_code in (0, 1, 3, 4, 5), r.output
    return json.loads(r.output)


def test_plan_states_the_release_first_and_in_json():
    r = _run("plan", *SPEC)
    assert r.output.splitlines()[0].startswith("vLLM 0.33 (0.33.0) rules; --vllm 0.34 models vLLM 0.34")
    r = _run("plan", *SPEC, "--vllm", "0.34")
    assert r.output.splitlines()[0].startswith("vLLM 0.34 (0.34.0) rules: start-up partly modelled")
    assert _json("plan", *SPEC)["vllm_version"] == "0.33"
    assert _json("plan", *SPEC, "--vllm", "0.34")["vllm_version"] == "0.34"
    assert vllm_versions.current().name == "0.34"  # chosen for the run (the fixture resets it)


def test_a_run_without_vllm_goes_back_to_the_default():
    _run("plan", *SPEC, "--vllm", "0.34")
    assert _json("plan", *SPEC)["vllm_version"] == vllm_versions.DEFAULT == "0.33"


def test_unknown_release_is_a_usage_error():
    r = _run("plan", *SPEC, "--vllm", "0.35")
    assert r.exit_code == 2 and "'0.35' is not one of '0.33', '0.34'" in r.output


def test_spec_decode_capture_sizes_differ_as_the_releases_do():
    """k = 3, max_num_seqs 4: 0.33 rounds to 1 + k (V1), 0.34 keeps the token grid (decode graphs in requests)."""
    old = _json("inspect-vllm", "--preset", "qwen3-32b", "--args", ARGS + " --max-num-seqs 4 "
                "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'", "--vllm", "0.33")
    new = _json("inspect-vllm", "--preset", "qwen3-32b", "--args", ARGS + " --max-num-seqs 4 "
                "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'", "--vllm", "0.34")
    assert (old["vllm_version"], new["vllm_version"]) == ("0.33", "0.34")
    assert old["capture_sizes"] == [4, 8, 16, 24, 32] and new["capture_sizes"] == [1, 2, 4, 8, 16, 24, 32]
    assert any(u["consumer"].startswith("start-up (vLLM 0.34") for u in new["unsized"])
    assert not any(u["consumer"].startswith("start-up") for u in old["unsized"])


def test_a_034_only_flag_is_accepted_only_with_vllm_034():
    r = _run("inspect-vllm", "--preset", "qwen3-32b", "--args", ARGS + " --enable-extensible-kv-cache")
    assert r.exit_code == 2
    assert "unknown flag --enable-extensible-kv-cache (not a vLLM 0.33.0 flag)" in r.output
    r = _run("inspect-vllm", "--preset", "qwen3-32b", "--args", ARGS + " --enable-extensible-kv-cache", "--vllm", "0.34")
    assert r.exit_code != 2, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("verdict without the fix:")  # the verdict (and its indented lines) first, then the release
    assert next(line for line in lines[1:] if not line.startswith("  ")).startswith("vLLM 0.34 (0.34.0) rules")


def test_gpu_memory_utilization_default_follows_the_release():
    """0.33: 0.92; 0.34: None, resolved to 1.0 with the extensible KV cache (on by default on CUDA)."""
    cfg = EngineConfig.from_preset("qwen3-32b")
    with vllm_versions.using("0.33"):
        old = kv_pool(cfg)
    with vllm_versions.using("0.34"):
        new = kv_pool(cfg)
    assert old == kv_pool(cfg, utilization=0.92) and new == kv_pool(cfg, utilization=1.0)
    assert new.tokens > old.tokens


def test_jit_warmup_sets_the_unfixed_lock_of_a_piecewise_deployment_on_034():
    """PIECEWISE only, k = 0: 0.33's V1 captures ask TurboQuant nothing (lock 0 bytes); 0.34's JIT warm-up decodes
    min(max_num_seqs, max_num_batched_tokens // 2) one-token rows before capture, and the lock holds them."""
    base = ["--preset", "qwen3-32b", "--cudagraph-mode", "PIECEWISE", "--max-num-seqs", "64"]
    old, new = _json("plan", *base, "--vllm", "0.33"), _json("plan", *base, "--vllm", "0.34")
    assert old["locked_bytes"] == 0 and old["lock_set_by"] is None
    assert new["locked_bytes"] > 0 and new["lock_set_by"] == "turboquant_attn.py:_decode_attention"


def test_repro_states_the_release_and_agrees_with_the_prediction_on_both(tmp_path):
    for v in ("0.33", "0.34"):
        r = _run("repro", "--preset", "qwen3-32b", "--max-num-seqs", "4", "--max-model-len", "2048",
                 "--prompt-tokens", "600", "--device", "meta", "--vllm", v)
        assert f"vLLM {v} ({v}.0) rules" in r.output.splitlines()[0]
        assert "as predicted" in r.output and r.exit_code == 0, r.output


def test_trace_report_checks_against_the_recorded_release(tmp_path):
    meta = load_recorded("trace_two_ranks").data
    d = tmp_path / "t"
    shutil.copytree(ROOT / "data" / "trace_two_ranks", d)
    rep = _json("trace-report", str(d))
    assert rep["vllm_version"] == "0.33" and rep["vllm_versions"] == ["0.33.0"]
    vllm_versions.select("0.34")  # a run's choice does not override what the records say
    assert _json("trace-report", str(d))["vllm_version"] == "0.33"
    rep = _json("trace-report", str(d), "--vllm", "0.34")
    assert rep["vllm_version"] == "0.34"
    first = _run("trace-report", str(d), "--vllm", "0.34").output.splitlines()[0]
    assert first.startswith("checked against vLLM 0.34 (0.34.0) rules")
    rep = _json("trace-report", str(d), "--preset", meta["preset"], "--args", meta["engine_args"], "--vllm", "0.34")
    assert "records ran vLLM 0.33.0; the prediction models vLLM 0.34.0" in rep["prediction"]["disagreements"]
