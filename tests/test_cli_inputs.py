"""The three entry points read sizes and requests alike (issue 22): vLLM's human-readable integers on every
size flag, one request-options decorator, vLLM's request-length rules, --json checked before any work."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tqlab.cli import HumanInt, app

LLAMA = "llama-3.1-8b"


def _cli(*args):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("text, want", [("128k", 128_000), ("1K", 1024), ("25.6k", 25_600), ("8K", 8192),
                                        (" 12 ", 12), ("1_000", 1000), ("2M", 2 * 2**20), ("1g", 10**9)])
def test_human_int_is_vllms_human_readable_int(text, want):
    assert HumanInt().convert(text, None, None) == want


@pytest.mark.parametrize("text, msg", [
    ("1.5K", "Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k instead?"),
    ("1e3", "'1e3': not an integer (sizes as vLLM writes them: 8k = 8000, 8K = 8192)"),
    ("0", "'0' is below the minimum of 1"),
])
def test_human_int_refusals_are_one_line(text, msg):
    with pytest.raises(click.BadParameter, match=msg.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        HumanInt(1).convert(text, None, None)


def test_plan_and_repro_take_human_readable_sizes():
    r = _cli("plan", "--preset", LLAMA, "--max-model-len", "32k", "--max-num-batched-tokens", "4K", "--max-num-seqs", "256")
    assert r.exit_code == 0, r.output
    assert "max_model_len=32000" in r.output and "max_num_batched_tokens=4096" in r.output
    r = _cli("repro", "--preset", LLAMA, "--device", "meta", "--prompt-tokens", "8k", "--num-hidden-layers", "1")
    assert r.exit_code == 0, r.output
    assert "request 8000-token prompt, max_tokens=16" in r.output  # vLLM's SamplingParams default (was 1)
    r = _cli("inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M --max-model-len 16K --max-num-seqs 256", "--tokens", "8k")
    assert r.exit_code == 0, r.output
    assert "request of 8000 prompt tokens" in r.output


def test_plan_serves_a_prompt_one_short_of_max_model_len_as_vllm_does():
    # vLLM 0.33: a prompt of max_model_len - 1 tokens is served (max_tokens 1); plan used to add 2 and refuse it
    r = _cli("plan", "--preset", LLAMA, "--max-model-len", "8192", "--prompt-tokens", "8191", "--max-num-seqs", "256")
    assert r.exit_code == 0, r.output
    r = _cli("plan", "--preset", LLAMA, "--max-model-len", "8192", "--prompt-tokens", "8191", "--max-tokens", "5",
             "--max-num-seqs", "256")
    assert r.exit_code == 0 and "--max-tokens 5 capped at max_model_len - prompt = 1, as vLLM's get_max_tokens does" in r.output
    for cmd in (["plan"], ["repro", "--device", "meta"]):
        r = _cli(*cmd, "--preset", LLAMA, "--max-model-len", "8192", "--prompt-tokens", "8192")
        assert r.exit_code == 2
        assert "--prompt-tokens 8192: vLLM refuses a prompt of max_model_len (8192) tokens or more" in r.output
    r = _cli("inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M --max-model-len 8192", "--tokens", "8191",
             "--tokens", "8192")
    assert "request of 8191 prompt tokens (alone)" in r.output
    assert "request of 8192 prompt tokens: rejected: prompt plus one output token exceeds max_model_len (8192)" in r.output


@pytest.mark.parametrize("cmd", ["repro", "plan", "inspect-vllm"])
def test_the_three_entry_points_share_the_request_options(cmd):
    params = {p.name: p for p in app.commands[cmd].params}
    assert isinstance(params["prompt_tokens"].type, HumanInt) and isinstance(params["max_tokens"].type, HumanInt)
    assert params["max_tokens"].default == 16  # vLLM 0.33's SamplingParams.max_tokens: the first decode step is asked
    assert params["prompt_tokens"].multiple == (cmd == "inspect-vllm")


def test_plan_json_in_a_missing_folder_fails_before_any_work():
    r = _cli("plan", "--preset", LLAMA, "--json", "/nonexistent/dir/out.json")
    assert r.exit_code == 2
    assert "Invalid value for --json: /nonexistent/dir/out.json: folder /nonexistent/dir does not exist" in r.output
    assert "config" not in r.output


def test_eager_with_a_measured_lock_size_is_never_locked_throughout_the_report():
    from tqlab.predict.report import inspect_vllm

    rep = inspect_vllm("vllm serve M --enforce-eager", preset=LLAMA, locked_bytes=0, prompt_tokens=[8192], quiet=True)
    req = rep["prediction"]["requests"][0]
    assert rep["verdict"] == "never_locked"
    assert rep["prediction"]["locked_unfixed_bytes"] is None and rep["prediction"]["locked_fixed_bytes"] is None
    assert (req["verdict"], req["crashes_unfixed"], req["first_refused_unfixed"]) == ("ok without the fix, ok with it",
                                                                                      False, None)
    assert "CRASH" not in rep["text"] and "the measured 0 bytes are never locked" in rep["text"]


def test_first_refused_call_says_whether_it_fits_with_the_fix():
    from tqlab.predict.report import inspect_vllm

    rep = inspect_vllm("vllm serve M", preset=LLAMA, locked_bytes=100_000, prompt_tokens=[8192], quiet=True)
    req = rep["prediction"]["requests"][0]
    first = req["first_refused_unfixed"]
    assert (req["crashes_unfixed"], req["crashes_fixed"]) == (True, False)
    assert (first["consumer"], first["nbytes"], first["fits_unfixed"], first["fits_fixed"]) == (
        "split-KV decode", 536_832, False, True)  # 536,832 B > 100,000 B at lock, <= 536,870,912 B reserved


def test_a_measured_lock_size_is_the_top_level_lock_too():
    """``--locked-bytes`` drives the whole report: the top-level verdict and first failing prompt are the same
    as the per-consumer prediction's (before, the top level kept the computed 137,396,224 B and said 41,089)."""
    from tqlab.predict.report import inspect_vllm

    rep = inspect_vllm("vllm serve M", preset=LLAMA, locked_bytes=200_000_000, quiet=True)
    pred = rep["prediction"]
    assert (rep["locked_bytes"], rep["locked_source"]) == (200_000_000, "measured")
    assert pred["locked_unfixed_bytes"] == 200_000_000
    assert rep["first_failing_prompt_tokens"] == pred["first_failing_prompt"] == 49_281
    assert rep["safe_max_model_len_alone"] == pred["safe_max_model_len_alone"]
    assert rep["first_refused_call"]["current_bytes"] == 200_000_000


def test_messages_validate_first_and_name_flags():
    import torch

    if not torch.cuda.is_available():
        r = _cli("repro", "--preset", LLAMA, "--device", "cuda")
        assert r.exit_code == 2 and "Invalid value for --device: no CUDA device is available here" in r.output
        assert "config" not in r.output.split("Error:")[0] and "lifecycle" not in r.output
    r = _cli("inspect-vllm", "--args", "vllm serve M")
    assert r.exit_code == 2 and "give the model as --config FILE" in r.output and "model_config" not in r.output
    r = _cli("presets")
    assert "│ nemotron-3-super-120b-a12b " in r.output  # the whole name on one line, at 80 columns too
    r = _cli("inspect-vllm", "--help")
    assert "``" not in r.output
