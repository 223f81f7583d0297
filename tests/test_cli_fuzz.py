"""Fuzz the CLI itself (issue 14): random `vllm serve` flag values and config.json contents through
``tqlab inspect-vllm`` and random overrides through ``tqlab plan``, via click's ``CliRunner``.

Every call must exit 0, 1 or 2, print at most one line after ``Error:``, never a
traceback, and answer within a few seconds. Sizes are kept to what answers in
about a second today (``max_model_len`` <= 2**20); the two known slow/crashing
inputs of code outside tqlab.vllm.deployment are pinned as xfail below.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqlab.cli import app

CALL_SECONDS = 5.0
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                 st.integers(-3, 2**70), st.text(max_size=6), st.lists(st.integers(0, 3), max_size=3))
small_int = st.one_of(st.integers(-2, 64), st.sampled_from([1, 2, 4, 8, 16, 32, 128]))
tokens = st.one_of(st.integers(-2, 2**20).map(str), st.sampled_from(
    ["128k", "1K", "25.6k", "1.5K", "auto", "-1", "infk", "1e30k", "nan", "", "0x10", " 12 ", "1_000", "4k"]))
flag_values = {
    "-tp": st.one_of(small_int.map(str), st.just("x")),
    "--max-model-len": tokens,
    "--max-num-seqs": st.one_of(small_int.map(str), st.just("4k")),
    "--max-num-batched-tokens": tokens,
    "--block-size": st.sampled_from(["16", "32", "0", "2080", "-3", "b"]),
    "--kv-cache-dtype": st.sampled_from(["auto", "turboquant_4bit_nc", "turboquant_k8v4", "fp8", "bogus"]),
    "--dtype": st.sampled_from(["auto", "bfloat16", "float16", "int8"]),
    "--enable-chunked-prefill": st.sampled_from([None, "false", "true"]),
    "--no-enable-chunked-prefill": st.none(),
    "--enable-lora": st.none(),
    "--enforce-eager": st.none(),
    "--enable-dbo": st.none(),
    "--max-num-seq": small_int.map(str),  # a prefix vLLM accepts
    "--max-num-sqs": small_int.map(str),  # a typo vLLM refuses
    "--cudagraph-capture-sizes": st.lists(st.sampled_from(["1", "2", "4", "0", "x", "1,2"]), min_size=1, max_size=3).map(" ".join),
    "--compilation-config": st.one_of(junk.map(json.dumps), st.fixed_dictionaries(
        {}, optional={"cudagraph_capture_sizes": junk, "cudagraph_mode": st.sampled_from(["NONE", "FULL", "x", 3])}).map(json.dumps)),
    "--attention-config": st.one_of(junk.map(json.dumps), st.fixed_dictionaries(
        {}, optional={"tq_max_kv_splits_for_cuda_graph": junk}).map(json.dumps)),
    "--speculative-config": st.fixed_dictionaries({}, optional={"num_speculative_tokens": junk}).map(json.dumps),
    "-O": st.sampled_from(["0", "1", "2", "3", "7"]),
    # issue 22 families: --hf-overrides (JSON and dotted), vLLM's list-append syntax, coerced numbers
    "--hf-overrides": st.one_of(st.sampled_from(["x", "[1]", "{}", '{"text_config": {"num_key_value_heads": 2}}']),
                                st.fixed_dictionaries({}, optional={
                                    "num_key_value_heads": st.one_of(st.sampled_from([1, 2, 4]), junk),
                                    "max_position_embeddings": st.one_of(st.sampled_from([4096, 8192]), junk),
                                    "num_hidden_layers": st.one_of(st.sampled_from([4, 8]), junk),
                                    "rope_scaling": st.one_of(junk, st.just({"rope_type": "dynamic", "factor": 2.0})),
                                }).map(json.dumps)),
    "--hf-overrides.num_key_value_heads": st.sampled_from(["1", "4", "0", "x", "8k", "2.0"]),
    "--hf-overrides.max_position_embeddings": tokens,
    "-cc.cudagraph_capture_sizes+": st.sampled_from(["1,2,4", "x,2", "1,2.0", "0", " 8 ", "1,,2"]),
    "-cc.max_cudagraph_capture_size": st.sampled_from(["16", "16.0", '"16"', "x", "0", "1k"]),
}


ENV_PREFIXES = ["", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 ", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=0 ", "CUDA_VISIBLE_DEVICES=0,1 ",
                "env HF_HOME=/x ", "A= B=2 "]
"""Pastes people make: leading NAME=value words (issue 22)."""


@st.composite
def serve_lines(draw):
    parts = ["vllm", "serve", draw(st.sampled_from(["M", "/m/x"]))]
    for flag in draw(st.lists(st.sampled_from(sorted(flag_values)), max_size=5, unique=True)):
        value = draw(flag_values[flag])
        parts += [flag] if value is None else ([flag, value] if not draw(st.booleans()) or flag == "-O" else [f"{flag}={value}"])
    sep = draw(st.sampled_from([" ", " \\\n    ", " \\\r\n  "]))  # one line, or a multi-line paste
    return draw(st.sampled_from(ENV_PREFIXES)) + sep.join(shlex.quote(p) for p in parts)


field_value = st.one_of(st.integers(-1, 64).filter(lambda v: v != 0) | st.just(0), junk)
valid_config = st.fixed_dictionaries(  # mostly readable configs, so the predictor's paths run too
    {"num_attention_heads": st.sampled_from([8, 16, 32]), "num_key_value_heads": st.sampled_from([1, 2, 8]),
     "head_dim": st.sampled_from([64, 128, 256]), "num_hidden_layers": st.sampled_from([4, 8]),
     "max_position_embeddings": st.sampled_from([4096, 32768])},
    optional={"layer_types": st.lists(st.sampled_from(["full_attention", "linear_attention"]), min_size=4, max_size=4),
              "torch_dtype": st.sampled_from(["bfloat16", "float32"])},
).filter(lambda d: len(d.get("layer_types", [])) in (0, d["num_hidden_layers"])).map(json.dumps)
config_json = st.one_of(
    valid_config,
    st.sampled_from(["", "{", "null", "[1, 2]", '"x"', '{"num_attention_heads": 1e400}', "\x00"]),
    st.fixed_dictionaries(
        {"num_attention_heads": st.one_of(st.sampled_from([8, 16, 32]), field_value)},
        optional={
            "num_key_value_heads": st.one_of(st.sampled_from([1, 2, 8]), field_value),
            "head_dim": st.one_of(st.sampled_from([64, 128, 256]), field_value),
            "hidden_size": st.one_of(st.sampled_from([2048, 4096]), field_value),
            "num_hidden_layers": st.one_of(st.sampled_from([4, 8]), field_value),
            "max_position_embeddings": st.one_of(st.sampled_from([4096, 32768]), field_value),
            "layer_types": st.lists(st.sampled_from(["full_attention", "linear_attention", "mamba"]), max_size=8),
            "full_attention_interval": field_value,
            "hybrid_override_pattern": st.text(alphabet="*M-EX", max_size=8),
            "torch_dtype": st.sampled_from(["bfloat16", "float32", "int4", 3]),
            "rope_scaling": st.fixed_dictionaries({"rope_type": st.sampled_from(["dynamic", "yarn"]), "factor": junk}),
        },
    ).map(lambda d: json.dumps(d)),
    st.builds(lambda d: json.dumps({"text_config": d}),
              st.dictionaries(st.sampled_from(["num_attention_heads", "head_dim"]), junk, max_size=2)),
    st.builds(lambda base, extra: json.dumps({**base, **extra}),  # issue 22: each config family vLLM reads its own way
              st.sampled_from([
                  {"model_type": "chatglm", "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32,
                   "multi_query_group_num": 2, "seq_length": 32768},
                  {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 8,
                   "multi_query": True},
                  {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 8},
                  {"model_type": "cohere", "hidden_size": 8192, "num_attention_heads": 64, "num_hidden_layers": 8,
                   "max_position_embeddings": 8192, "model_max_length": 131072},
                  {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_hidden_layers": 8,
                   "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                   "rope_scaling": {"type": "longrope"}},
                  {"architectures": ["NemotronHForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 2,
                   "head_dim": 128, "num_hidden_layers": 6, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
                   "ssm_state_size": 128, "conv_kernel": 4, "layers_block_type": ["mamba", "attention", "moe"] * 2},
              ]),
              st.dictionaries(st.sampled_from(["multi_query_group_num", "num_layers", "n_head_kv", "num_kv_heads",
                                               "new_decoder_architecture", "model_max_length",
                                               "original_max_position_embeddings", "rope_scaling", "seq_length"]),
                              junk, max_size=2)),
    st.just('{"a":' * 5000 + "1" + "}" * 5000),  # nested deeper than json's recursion limit
)


def _check(result, elapsed: float) -> None:
    out = result.output
    # 0/3/4/5: a verdict (tqlab.cli.options.EXIT_CODES: ok, crash, partial, refused); 1/2: an error in one line
    assert result.exit_code in (0, 1, 2, 3, 4, 5), (result.exit_code, out, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    if result.exit_code in (3, 4, 5):
        assert "Error:" not in out and "verdict" in out, out
    elif result.exit_code:
        err = out[out.index("Error:"):].strip() if "Error:" in out else out.strip()
        assert err and "\n" not in err, out
    assert elapsed < CALL_SECONDS, f"{elapsed:.1f} s"


@pytest.fixture(scope="module", autouse=True)
def _imports_warm():
    """One call first, so the per-call time measures the call, not the first import of torch and tqlab."""
    CliRunner().invoke(app, ["inspect-vllm", "--preset", "pr-44053-unit-test", "--args", "vllm serve M"])


def _invoke(args):
    t = time.perf_counter()
    r = CliRunner().invoke(app, args)
    return r, time.perf_counter() - t


@FUZZ
@given(line=serve_lines(), text=config_json, tok=st.one_of(st.none(), st.integers(1, 2**16)))
def test_inspect_vllm_fuzz(line, text, tok):
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "config.json"
        cfg.write_text(text)
        args = ["inspect-vllm", "--config", str(cfg), "--args", line] + ([] if tok is None else ["--tokens", str(tok)])
        _check(*_invoke(args))


@FUZZ
@given(line=serve_lines(), gib=st.one_of(st.none(), st.sampled_from(["nan", "-5", "0", "inf", "80", "x"])),
       json_to=st.sampled_from([None, "/missing/dir/x.json"]))
def test_inspect_vllm_preset_fuzz(line, gib, json_to):
    args = ["inspect-vllm", "--preset", "pr-44053-unit-test", "--args", line]
    args += [] if gib is None else ["--gpu-memory-gib", gib]
    args += [] if json_to is None else ["--json", json_to]
    _check(*_invoke(args))


human = st.sampled_from(["32k", "8K", "1.5K", "1e3", "2k", "0x10", " 4k ", "1_000"])  # vLLM's human-readable integers
plan_opts = {
    "--max-model-len": st.one_of(st.integers(-1, 2**20), human), "--max-num-seqs": st.integers(-1, 2048),
    "--max-num-batched-tokens": st.one_of(st.integers(-1, 2**16), human), "--block-size": st.sampled_from([0, 16, 2080, -1]),
    "--prompt-tokens": st.one_of(st.integers(-1, 2**17), human), "--max-tokens": st.one_of(st.integers(-1, 64), human),
    "--tensor-parallel-size": st.sampled_from([0, 1, 2, 3, 8]), "--kv-cache-dtype": st.sampled_from(["auto", "turboquant_4bit_nc", "x"]),
    "--cudagraph-capture-sizes": st.sampled_from(["1,2", "0", "a", "4,1"]), "--dtype": st.sampled_from(["fp16", "int8"]),
}


@FUZZ
@given(preset=st.sampled_from(["pr-44053-unit-test", "nemotron-3-super-120b-a12b", "nope"]),
       opts=st.dictionaries(st.sampled_from(sorted(plan_opts)), st.none(), max_size=4), data=st.data())
def test_plan_fuzz(preset, opts, data):
    args = ["plan", "--preset", preset]
    for flag in opts:
        args += [flag, str(data.draw(plan_opts[flag]))]
    _check(*_invoke(args))


def test_plan_huge_max_model_len_is_a_one_line_error():
    _check(*_invoke(["plan", "--preset", "pr-44053-unit-test", "--max-model-len", str(2**62)]))


def test_inspect_vllm_huge_max_model_len_answers_in_seconds():
    _check(*_invoke(["inspect-vllm", "--preset", "nemotron-3-super-120b-a12b", "--args",
                     "vllm serve M --max-model-len 1000000000000 -tp 8"]))


def _spelled(line: str, env: str, sep: str) -> str:
    return env + sep.join(line.split(" "))


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(flags=st.lists(st.sampled_from(["--max-model-len 8k", "--max-num-batched-tokens 2K", "-tp 2", "--enforce-eager",
                                       "--kv-cache-dtype turboquant_4bit_nc", "--kv-cache-dtype fp8",
                                       "-cc.cudagraph_capture_sizes+ 1,2,4", "--hf-overrides.num_key_value_heads 4",
                                       "--max-num-seqs 8"]), max_size=4, unique=True),
       env=st.sampled_from(["CUDA_VISIBLE_DEVICES=0,1 ", "env HF_HOME=/x "]),
       sep=st.sampled_from([" \\\n  ", " \\\r\n"]))
def test_a_deployment_pasted_three_ways_gives_one_answer(flags, env, sep):
    """One line, a multi-line paste and an environment-prefixed paste: the same exit code and report
    (the environment note aside)."""
    line = " ".join(["vllm serve M", *flags])
    outs = []
    for text in (line, _spelled(line, "", sep), _spelled(line, env, " ")):
        r, elapsed = _invoke(["inspect-vllm", "--preset", "llama-3.1-8b", "--args", text, "--tokens", "4k"])
        _check(r, elapsed)
        outs.append((r.exit_code, [x for x in r.output.splitlines() if not x.startswith("note: environment")]))
    assert outs[0] == outs[1] == outs[2]
