"""Every public entry point gives the same answer for the same deployment (the lesson of the bug).

The engine on ``meta`` (what it locks, whether the prompt crashes), ``tqlab repro``'s and
``tqlab plan --json``'s prediction, ``tqlab inspect-vllm``'s report and the reservation planner
widget all call :mod:`tqlab.predict.analysis`; on random deployments of the bug report's model their
numbers must be identical.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqlab.predict import analysis
from tqlab.cli import app
from tqlab.core.config import EngineConfig
from tqlab.engine import LLMEngine
from tqlab.lab.widgets.planner import plan_summary
from tqlab.predict.report import inspect_vllm
from tqlab.core.workspace import WorkspaceLockedError

PRESET = "nemotron-3-super-120b-a12b"
KEYS = ("capture_sizes", "decode_rows_at_lock", "locked_bytes", "verdict", "first_failing_prompt_tokens",
        "first_refused_call", "locked_bytes_with_fix")


@st.composite
def deployments(draw):
    seqs = draw(st.integers(1, 64))
    return dict(
        tensor_parallel_size=draw(st.sampled_from([1, 2, 4, 8])),
        max_model_len=draw(st.integers(256, 300_000)),
        max_num_seqs=seqs,
        max_num_batched_tokens=draw(st.integers(max(seqs, 64), 16384)),
        kv_cache_dtype=draw(st.sampled_from(["turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k8v4"])),
        enforce_eager=draw(st.booleans()),
    )


def _cli_flags(d: dict) -> list[str]:
    out = []
    for k, v in d.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else ([f"--no-{k.replace('_', '-')}"] if v is False else [flag, str(v)])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_engine_cli_inspect_vllm_and_planner_agree(d):
    cfg = EngineConfig.from_preset(PRESET, **d)
    pred = analysis.predict(cfg).to_json()

    plan = CliRunner().invoke(app, ["plan", "--preset", PRESET, *_cli_flags(d), "--json", "-"])
    assert plan.exit_code == 0, plan.output
    plan_obj = json.loads(plan.output)
    report = inspect_vllm(engine_args=d, preset=PRESET, quiet=True)
    for key in KEYS:
        assert plan_obj[key] == report[key] == pred[key], key

    planner = plan_summary(cfg)
    assert planner.unfixed_locked_bytes == pred["locked_bytes"]
    assert planner.first_failing_unfixed == pred["first_failing_prompt_tokens"]

    engine = LLMEngine(cfg, fix=False, device="meta", kv_cache_tokens=cfg.max_model_len)
    assert engine.locked_bytes == pred["locked_bytes"]
    n = pred["first_failing_prompt_tokens"]
    if n is not None and n < cfg.max_model_len:
        try:
            engine.generate(n, max_tokens=1)
            raised = None
        except WorkspaceLockedError as e:
            raised = (e.required_bytes, e.current_bytes)
        call = pred["first_refused_call"]
        assert raised == (call["required_bytes"], call["current_bytes"])
