"""Every public entry point gives the same answer for the same deployment (the lesson of the bug).

``tqlab repro``'s and ``tqlab plan --json``'s prediction, ``tqlab inspect-vllm``'s report (from a
preset or from a ``vllm serve`` line and config.json) and the reservation planner widget all read
the one :class:`~tqlab.predict.analysis.Prediction`; the engine on ``meta`` (what it locks, whether
the prompt crashes) stands beside it on vLLM's rules (:mod:`tqlab.core.vllm_rules`) and must do what
it says. On random deployments of the bug report's model, and for every ``kv_cache_dtype`` vLLM 0.33
accepts for a dense model, their numbers must be identical.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqlab.predict import analysis
from tqlab.cli import app
from tqlab.cli.options import verdict_exit_code
from tqlab.core.config import (
    KV_CACHE_DTYPES,
    MLA_ONLY_KV_CACHE_DTYPES,
    VLLM_CACHE_DTYPES,
    EngineConfig,
    is_turboquant,
)
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
        kv_cache_dtype=draw(st.sampled_from(KV_CACHE_DTYPES)),
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
    plan_obj = json.loads(plan.output)
    assert plan.exit_code == verdict_exit_code(plan_obj), plan.output
    report = inspect_vllm(engine_args=d, preset=PRESET, quiet=True)
    for key in KEYS:
        assert plan_obj[key] == report[key] == pred[key], key

    assert pred["turboquant_consumers"] is is_turboquant(d["kv_cache_dtype"])
    if d["kv_cache_dtype"] in CUDA_REFUSED:  # vLLM 0.33 does not start it: no lock, no engine run to compare with
        assert pred["verdict"] == "refused" and pred["locked_bytes"] is None
        return
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


DENSE = "llama-3.1-8b"
LLAMA_CONFIG_JSON = {"architectures": ["LlamaForCausalLM"],
                     "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "num_hidden_layers": 32,
                     "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}  # meta-llama/Llama-3.1-8B-Instruct
DENSE_DTYPES = [d for d in VLLM_CACHE_DTYPES if d not in MLA_ONLY_KV_CACHE_DTYPES]
"""Every ``--kv-cache-dtype`` vLLM 0.33 accepts for a dense model: its CacheDType literal less the MLA-only layouts."""
SMALL = {"max_model_len": 4096, "max_num_batched_tokens": 1024, "max_num_seqs": 256}
"""Given as flags: a preset's own max_num_seqs is no longer used by plan / inspect-vllm (vLLM's default for the
GPU is), and a config.json read without --gpu gets vLLM's small tier: 256 names the one deployment for all."""
CUDA_REFUSED = {"fp8_inc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "nvfp4_4over6"}
"""Cache dtypes no CUDA backend of vLLM 0.33 accepts on an H200 (``supported_kv_cache_dtypes`` of FLASH_ATTN,
FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, TURBOQUANT; FlashInfer takes ``nvfp4`` alone below SM100): vLLM refuses them
("No valid attention backend found"), where earlier tqlab said "ok"."""


@pytest.mark.parametrize("kv", DENSE_DTYPES)
def test_every_kv_cache_dtype_of_a_dense_model_gets_one_answer(kv):
    flags = [f"--{k.replace('_', '-')}" if i == 0 else str(v) for k, v in {"kv_cache_dtype": kv, **SMALL}.items()
             for i in range(2)]
    line = f"vllm serve meta-llama/Llama-3.1-8B-Instruct {' '.join(flags)}"
    plan = CliRunner().invoke(app, ["plan", "--preset", DENSE, *flags, "--json", "-"])
    if kv not in KV_CACHE_DTYPES:  # not modelled (ultraquant_4bit): every entry point refuses it, naming it
        assert plan.exit_code == 2 and f"'{kv}' is not one of" in plan.output
        for call in (lambda: inspect_vllm(line, LLAMA_CONFIG_JSON, quiet=True),
                     lambda: inspect_vllm({"kv_cache_dtype": kv}, preset=DENSE, quiet=True),
                     lambda: EngineConfig.from_preset(DENSE, kv_cache_dtype=kv)):
            with pytest.raises(ValueError, match=f"'{kv}' is not modelled"):
                call()
        return
    assert plan.exit_code == verdict_exit_code(json.loads(plan.output)), plan.output
    cfg = EngineConfig.from_preset(DENSE, kv_cache_dtype=kv, **SMALL)
    pred = analysis.predict(cfg).to_json()
    from_preset = inspect_vllm({"kv_cache_dtype": kv, **SMALL}, preset=DENSE, quiet=True)
    from_line = inspect_vllm(line, LLAMA_CONFIG_JSON, quiet=True)
    for key in (*KEYS, "turboquant_consumers", "safe_max_model_len_any_schedule"):
        assert json.loads(plan.output)[key] == from_preset[key] == from_line[key] == pred[key], key
    assert pred["turboquant_consumers"] is is_turboquant(kv)
    if kv in CUDA_REFUSED:  # vLLM 0.33's selector finds no CUDA backend for it: refused, in vLLM's words
        assert pred["verdict"] == "refused" and pred["locked_bytes"] is None
        assert pred["refusal"]["reason"].startswith("No valid attention backend found for cuda")
        assert from_line["text"].startswith("REFUSED: vLLM 0.33 does not start this deployment: No valid attention")
        return
    if not is_turboquant(kv):  # vLLM runs another backend: nothing of TurboQuant's is locked or refused
        assert (pred["verdict"], pred["locked_bytes"], pred["first_failing_prompt_tokens"]) == ("ok", 0, None)
        assert [n["kind"] for n in pred["notes"]] == ["no_consumer"]
        assert [r["verdict"] for r in from_line["prediction"]["requests"]] == ["ok without the fix, ok with it"]
    planner = plan_summary(cfg)
    assert (planner.unfixed_locked_bytes, planner.first_failing_unfixed) == (
        pred["locked_bytes"], pred["first_failing_prompt_tokens"])
    engine = LLMEngine(cfg.replace(num_hidden_layers=1), fix=False, device="meta", kv_cache_tokens=cfg.max_model_len)
    assert engine.locked_bytes == pred["locked_bytes"]
    n = pred["first_failing_prompt_tokens"] or cfg.max_model_len - 2
    try:
        engine.generate(n, max_tokens=1)
        raised = None
    except WorkspaceLockedError as e:
        raised = (e.required_bytes, e.current_bytes)
    call = pred["first_refused_call"]
    assert raised == (None if call is None else (call["required_bytes"], call["current_bytes"]))


def test_plan_inspect_and_repro_agree_on_llama_with_an_auto_cache():
    """The issue's case: vLLM has no TurboQuant consumer for ``--kv-cache-dtype auto``; nobody says crash."""
    plan = CliRunner().invoke(app, ["plan", "--preset", DENSE, "--kv-cache-dtype", "auto", "--json", "-"])
    report = inspect_vllm("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-batched-tokens 8192",
                          LLAMA_CONFIG_JSON, quiet=True)
    got = json.loads(plan.output)
    assert (got["verdict"], got["locked_bytes"]) == (report["verdict"], report["locked_bytes"]) == ("ok", 0)
    repro = CliRunner().invoke(app, ["repro", "--preset", DENSE, "--kv-cache-dtype", "auto", "--device", "meta",
                                     "--prompt-tokens", "50000", "--num-hidden-layers", "1"])
    assert repro.exit_code == 0 and "as predicted" in repro.output and "AssertionError" not in repro.output, repro.output
