"""``tqlab repro`` on a deployment vLLM refuses to start (issue 33): vLLM's reason, no engine run, exit 5.

Gemma-2's sliding-window layers under a TurboQuant cache: ``TurboQuantAttentionBackend.validate_configuration``
says "sliding window not supported" and no other CUDA backend takes the cache, so vLLM 0.33 raises "No valid
attention backend found" (``vllm/platforms/cuda.py`` ``CudaPlatformBase.get_attn_backend_cls``) before any
workspace exists. ``repro`` used to run tqlab's engine anyway and print "NOT as predicted" (exit 1).
"""

from __future__ import annotations

from click.testing import CliRunner

import tqlab.engine
from tqlab.cli import app
from tqlab.cli.options import EXIT_CODES
from tqlab.core.config import EngineConfig
from tqlab.predict.analysis import predict
from tqlab.predict.consumer_text import refusal_line


def test_repro_prints_vllms_refusal_and_runs_no_engine(monkeypatch):
    def no_engine(*a, **k):
        raise AssertionError("repro built an engine for a deployment vLLM refuses")

    monkeypatch.setattr(tqlab.engine, "LLMEngine", no_engine)
    r = CliRunner().invoke(app, ["repro", "--preset", "gemma-2-9b"])
    assert r.exit_code == EXIT_CODES["refused"] == 5, r.output
    cfg = EngineConfig.from_preset("gemma-2-9b")
    want = refusal_line(predict(cfg, prompt_tokens=4096, max_tokens=16))
    assert want.startswith("REFUSED: vLLM 0.33 does not start this deployment: No valid attention backend found")
    assert "TURBOQUANT: [sliding window not supported]" in want
    lines = [" ".join(line.split()) for line in r.output.splitlines()]
    assert " ".join(want.split()) in " ".join(lines)  # printed whole: its "[...]" lists are not read as rich markup
    assert not any(w in r.output for w in ("lifecycle", "as predicted", "prediction"))


def test_repro_of_a_deployment_vllm_starts_still_runs(monkeypatch):
    """The refusal check does not stop a deployment vLLM accepts: the same preset with an unquantized cache gets
    to the engine (stopped here at its construction)."""
    built = []

    def engine(*a, **k):
        built.append(k.get("device"))
        raise ValueError("stop here")

    monkeypatch.setattr(tqlab.engine, "LLMEngine", engine)
    r = CliRunner().invoke(app, ["repro", "--preset", "gemma-2-9b", "--kv-cache-dtype", "auto", "--device", "meta"])
    assert built == ["meta"] and r.exit_code == 2 and "stop here" in r.output
