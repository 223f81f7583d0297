"""An answer a user can act on (issue 30): exit codes by verdict, the first decode step asked by default, the same
serve line giving the same answer with ``--preset`` and with the model's config.json."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.cli.options import EXIT_CODES, verdict_exit_code

LLAMA = "llama-3.1-8b"
# meta-llama/Llama-3.1-8B-Instruct's config.json, the fields the llama-3.1-8b preset cites in its "source"
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
                "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
SPEC2 = '--speculative-config \'{"method": "eagle", "model": "d", "num_speculative_tokens": 2}\''


def _cli(*args):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def llama_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA_CONFIG))
    return str(p)


# --------------------------------------------------------------------------- exit codes


def test_exit_codes_are_one_mapping_of_the_five_verdicts():
    assert EXIT_CODES == {"ok": 0, "never_locked": 0, "crash": 3, "partial": 4, "refused": 5}
    assert [verdict_exit_code({"verdict": v}) for v in ("ok", "never_locked", "crash", "partial", "refused")] == [
        0, 0, 3, 4, 5]
    assert verdict_exit_code({"verdict": "ok", "partial": True}) == 4  # ok over the modelled consumers only
    assert verdict_exit_code({"verdict": "crash", "partial": True}) == 3
    assert verdict_exit_code({"verdict": "maybe"}) == 4  # a verdict this CLI cannot read is never an ok
    assert verdict_exit_code({}) == 4


@pytest.mark.parametrize("args, code, verdict", [
    (["plan", "--preset", LLAMA], 3, "crash"),  # vLLM's 1024 seqs on an H200: the first crash at 73,857 tokens
    (["plan", "--preset", LLAMA, "--max-model-len", "32k", "--max-num-seqs", "256"], 0, "ok"),
    # 1024 seqs, captures up to 512 rows: a busy server's decode batch of 513 runs eagerly and asks for more
    (["plan", "--preset", LLAMA, "--max-model-len", "32k"], 3, "crash"),
    (["plan", "--preset", LLAMA, "--enforce-eager"], 0, "never_locked"),
    (["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M"], 3, "crash"),
    (["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M --max-model-len 32k --max-num-seqs 256"], 0, "ok"),
    (["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M --enforce-eager"], 0, "never_locked"),
])
def test_plan_and_inspect_exit_by_the_deployments_verdict(args, code, verdict):
    r = _cli(*args)
    assert r.exit_code == code, r.output
    r = _cli(*args, "--json", "-")  # the same code with the JSON alone on stdout
    assert r.exit_code == code and json.loads(r.output)["verdict"] == verdict


def test_a_partial_answer_exits_4(tmp_path):
    # Kimi-style MoE on a B200: vLLM prefers FlashInfer's bf16 experts on SM100, which tqlab does not size
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
           "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 61, "kv_lora_rank": 512,
           "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
           "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
           "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = _cli("inspect-vllm", "--config", str(tmp_path / "config.json"), "--args", "vllm serve K -tp 4", "--gpu", "B200",
             "--json", "-")
    obj = json.loads(r.output)
    assert (r.exit_code, obj["verdict"], obj["partial"]) == (4, "partial", True)


@pytest.mark.parametrize("cmd", ["plan", "inspect-vllm"])
def test_help_documents_the_exit_codes(cmd):
    out = " ".join(_cli(cmd, "--help").output.split())
    assert ("Exit status by the deployment's verdict: 0 ok or never locked, 3 crash, 4 partial (a consumer it "
            "reaches is not sized), 5 refused (vLLM will not start it), 2 bad usage.") in out


# --------------------------------------------------------------------------- the first decode step


def test_first_decode_crash_shows_with_default_flags():
    """Two speculative tokens: the drafter's second pass is a one-token decode through _decode_attention
    (SpecDecodeBaseProposer.propose), which asks 536,832 B (0.51 MiB) of a workspace locked at 0 bytes (the
    target's 3-token rows take the prefill path at capture). A 100-token prompt's prefill is fine; its first decode
    step crashes -- asked by default now (vLLM's max_tokens 16), not with --max-tokens 1."""
    r = _cli("inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M " + SPEC2, "--tokens", "100")
    assert r.exit_code == 3, r.output
    assert ("  first refused call without the fix (vLLM dies here): split-KV decode, cached 100 q 1: "
            "0.51 MiB > 0.00 MiB at lock") in r.output
    assert "request of 100 prompt tokens (alone), largest call per consumer:" in r.output
    r1 = _cli("inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M " + SPEC2, "--tokens", "100",
              "--max-tokens", "1")
    assert "first refused call without the fix" not in r1.output  # the prefill alone fits
    p = _cli("plan", "--preset", LLAMA, "--num-speculative-tokens", "2", "--prompt-tokens", "100", "--json", "-")
    call = json.loads(p.output)["prompt"]["first_refused_call"]
    assert call == {"caller": "_decode_attention (drafter)", "required_bytes": 536_832, "current_bytes": 0,
                    "cached_len": 100, "q_len": 1}
    p1 = _cli("plan", "--preset", LLAMA, "--num-speculative-tokens", "2", "--prompt-tokens", "100", "--max-tokens", "1",
              "--json", "-")
    assert json.loads(p1.output)["prompt"]["first_refused_call"] is None


# --------------------------------------------------------------------------- --preset vs config.json


def test_the_same_serve_line_gives_the_same_answer_with_preset_and_config_json(llama_json):
    line = "vllm serve meta-llama/Llama-3.1-8B-Instruct --kv-cache-dtype turboquant_4bit_nc"
    by_preset = json.loads(_cli("inspect-vllm", "--preset", LLAMA, "--args", line, "--json", "-").output)
    by_config = json.loads(_cli("inspect-vllm", "--config", llama_json, "--args", line, "--json", "-").output)
    keys = ("verdict", "locked_bytes", "locked_bytes_with_fix", "first_failing_prompt_tokens",
            "safe_max_model_len_alone", "safe_max_model_len_any_schedule", "first_refused_call")
    assert {k: by_preset[k] for k in keys} == {k: by_config[k] for k in keys}
    assert (by_preset["locked_bytes"], by_preset["first_failing_prompt_tokens"]) == (274_792_448, 73_857)  # 262.06 MiB
    for obj in (by_preset, by_config):
        cfg = obj["prediction"]["config"]
        assert (cfg["max_num_seqs"], cfg["max_num_batched_tokens"]) == (1024, 8192)
        assert obj["sources"]["max_num_seqs"] == "vLLM default (`vllm serve` on --gpu H200, 139.8 GiB: >= 70 GiB)"
    plan = json.loads(_cli("plan", "--preset", LLAMA, "--json", "-").output)
    assert {k: plan[k] for k in keys} == {k: by_preset[k] for k in keys}
    assert plan["sources"]["max_num_batched_tokens"] == "vLLM default (`vllm serve` on --gpu H200, 139.8 GiB: >= 70 GiB)"


@pytest.mark.parametrize("gpu, seqs, mbt", [("A4000", 256, 2048), ("B200", 1024, 16384)])
def test_a_presets_server_limits_follow_the_gpu(gpu, seqs, mbt):
    plan = json.loads(_cli("plan", "--preset", LLAMA, "--gpu", gpu, "--json", "-").output)
    insp = json.loads(_cli("inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M", "--gpu", gpu,
                           "--json", "-").output)
    assert (insp["prediction"]["config"]["max_num_seqs"], insp["prediction"]["config"]["max_num_batched_tokens"]) == (
        seqs, mbt)
    assert plan["locked_bytes"] == insp["locked_bytes"]
    assert plan["sources"]["max_num_seqs"].startswith(f"vLLM default (`vllm serve` on --gpu {gpu}")


def test_flags_and_recorded_deployments_keep_their_server_limits():
    r = _cli("plan", "--preset", LLAMA, "--max-num-seqs", "256", "--json", "-")
    obj = json.loads(r.output)  # the old preset numbers, given as flags: lock 131.03 MiB, first crash 41,089
    assert (obj["locked_bytes"], obj["first_failing_prompt_tokens"], obj["sources"]["max_num_seqs"]) == (
        137_396_224, 41_089, "flag")
    nemo = json.loads(_cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--json", "-").output)
    assert nemo["sources"]["max_num_seqs"] == "preset nemotron-3-super-120b-a12b"  # the bug report's --max-num-seqs 4
    assert nemo["sources"]["max_num_batched_tokens"] == "preset nemotron-3-super-120b-a12b"
    assert "max_num_seqs=4, max_num_batched_tokens=4096" in _cli("plan", "--preset", "nemotron-3-super-120b-a12b").output


def test_repro_keeps_the_presets_own_limits():
    r = _cli("repro", "--preset", LLAMA, "--device", "meta", "--prompt-tokens", "100", "--num-hidden-layers", "1",
             "--max-tokens", "1")
    assert r.exit_code == 0, r.output
    assert "max_num_seqs=256, max_num_batched_tokens=8192" in r.output


# --------------------------------------------------------------------------- ways out


def test_fix_release_is_the_first_wheel_with_reserve_workspace():
    from tqlab.predict.ways_out import FIX_FIRST_RELEASE, FIX_RELEASES_CHECKED

    assert FIX_FIRST_RELEASE == "0.24.0"
    assert min((v for v, has in FIX_RELEASES_CHECKED.items() if has), key=lambda v: tuple(map(int, v.split(".")))) == (
        FIX_FIRST_RELEASE)
    assert not any(has for v, has in FIX_RELEASES_CHECKED.items() if tuple(map(int, v.split("."))) < (0, 24))


def test_every_way_out_is_checked_by_the_predictor():
    from tqlab.core.config import EngineConfig
    from tqlab.predict.analysis import predict
    from tqlab.predict.ways_out import ways_out

    c = EngineConfig.from_preset(LLAMA, max_num_seqs=1024)  # vLLM's H200 default: crash at 73,857 tokens
    ways = ways_out(c)
    assert [w.flag for w in ways] == [None, "--max-model-len 67217 --max-num-seqs 512",
                                      "--max-num-batched-tokens 128 --max-num-seqs 128", "--enforce-eager"]
    assert [w.verdict for w in ways] == ["ok", "ok", "ok", "never_locked"]
    # each, replayed: the predictor's verdict for the changed deployment
    assert predict(c, fix=True).verdict == "ok"
    shorter = predict(c.replace(max_model_len=67217, max_num_seqs=512))
    assert (shorter.verdict, shorter.safe_max_model_len_any_schedule) == ("ok", 67217)
    assert predict(c.replace(max_model_len=67218, max_num_seqs=512)).safe_max_model_len_any_schedule == 67217
    assert predict(c.replace(max_num_batched_tokens=128, max_num_seqs=128)).verdict == "ok"
    assert predict(c.replace(enforce_eager=True)).verdict == "never_locked"
    # 67,217 at 1024 seqs is not offered: a decode batch of 513+ requests runs eagerly and overflows 262.06 MiB
    assert any(n.field == "max_num_seqs" for n in predict(c.replace(max_model_len=67217)).notes)


def test_no_ways_out_for_a_safe_deployment_and_none_invented():
    from tqlab.core.config import EngineConfig
    from tqlab.predict.ways_out import way_out_lines, ways_out

    assert ways_out(EngineConfig.from_preset(LLAMA, max_num_seqs=512, max_model_len=32000)) == []
    # an "ok" that a busy server breaks (issue 30: --max-model-len 41089 at 256 seqs, any-chunking bound 33,665)
    busy = ways_out(EngineConfig.from_preset(LLAMA, max_num_seqs=256, max_model_len=41089))
    assert [w.flag for w in busy] == [None, "--max-model-len 33665", "--max-num-batched-tokens 128 --max-num-seqs 128",
                                      "--enforce-eager"]
    assert way_out_lines(busy, crashed=False)[0].startswith("the verdict does not hold for every schedule vLLM can make")
    spec = ways_out(EngineConfig.from_preset(LLAMA, max_num_seqs=1024, num_speculative_tokens=2))
    # the drafter's one-token decode asks 536,832 B of a 0-byte lock at any length or chunk size
    assert [w.flag for w in spec] == [None, "--enforce-eager"]
    assert way_out_lines([], crashed=True) == [
        "ways out: none of vLLM's (a release with PR #44053, a shorter --max-model-len, 128-token chunks, "
        "--enforce-eager) gives this deployment an ok verdict"]
    assert way_out_lines([], crashed=False) == []


def test_plan_and_inspect_print_the_ways_out_and_the_safe_length():
    r = _cli("plan", "--preset", "nemotron-3-super-120b-a12b")
    assert r.exit_code == 3
    out = " ".join(r.output.split())
    assert ("safe max_model_len without the fix: 4225 (requests alone), 656 (any chunking); with the fix: 131072 "
            "(any chunking) -- any chunking: the bound for a busy server, where a prompt's chunks are cut by other "
            "requests sharing a step or start after a prefix-cache hit") in out
    assert ("verdict without the fix: CRASH: _continuation_prefill requires 2.00 MB, current size is 0.26 MB (cached "
            "4096, q 129) -- for the deployment: its shortest failing prompt (4,225 tokens, alone), not necessarily "
            "one you asked about") in out
    assert "- --max-model-len 656: serve at most 656 tokens per request -> ok;" in out
    assert "- run vLLM >= 0.24.0 (carries PR #44053's reservation) -> ok;" in out
    obj = json.loads(_cli("inspect-vllm", "--preset", "nemotron-3-super-120b-a12b", "--args", "vllm serve M",
                          "--json", "-").output)
    assert [w["flag"] for w in obj["ways_out"]] == [None, "--max-model-len 656", "--max-num-batched-tokens 128",
                                                    "--enforce-eager"]
    assert "  - --enforce-eager: run without CUDA graphs" in obj["text"]
    p = _cli("plan", "--preset", "nemotron-3-super-120b-a12b", "--prompt-tokens", "8192")
    assert "(cached 4096, q 4096) -- for the 8,192-token prompt asked about" in " ".join(p.output.split())


# --------------------------------------------------------------------------- outputs that overwrite


def _copy_trace(tmp_path):
    import shutil

    from tqlab.core.provenance import DATA_DIR

    d = tmp_path / "trace"
    shutil.copytree(DATA_DIR / "trace_two_ranks", d)
    return d


@pytest.mark.parametrize("cmd", [["plan", "--preset", LLAMA], ["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M"]])
def test_json_never_writes_under_data(cmd):
    from tqlab.core.config import PRESET_DIR

    target = PRESET_DIR / f"{LLAMA}.json"
    before = target.read_bytes()
    for extra in ([], ["--force"]):
        r = _cli(*cmd, "--json", str(target), *extra)
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines()[-1].startswith(
            f"Error: Invalid value for --json: {target} is under the project's data/")
        assert "config" not in r.output.splitlines()[0]  # refused before any work
    assert target.read_bytes() == before


@pytest.mark.parametrize("cmd", [["plan", "--preset", LLAMA], ["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M"]])
def test_json_replaces_an_existing_file_only_with_force(cmd, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("keep me")
    r = _cli(*cmd, "--json", str(out))
    assert r.exit_code == 2 and f"Error: Invalid value for --json: {out} exists; pass --force to replace it" in r.output
    assert out.read_text() == "keep me"
    r = _cli(*cmd, "--json", str(out), "--force")
    assert r.exit_code == 3 and json.loads(out.read_text())["verdict"] == "crash"


def test_trace_report_json_never_replaces_a_record(tmp_path):
    d = _copy_trace(tmp_path)
    rec = sorted(d.glob("*.json"))[0]
    before = rec.read_bytes()
    for target, extra in ((rec, ["--force"]), (d / "merged.json", [])):
        r = _cli("trace-report", str(d), "--json", str(target), *extra)
        assert r.exit_code == 2 and "is in a trace folder" in r.output, r.output
    assert rec.read_bytes() == before and not (d / "merged.json").exists()
    # a folder holding trace records is one for plan too
    r = _cli("plan", "--preset", LLAMA, "--json", str(d / "plan.json"))
    assert r.exit_code == 2 and "is in a trace folder" in r.output
    r = _cli("trace-report", str(d), "--json", str(tmp_path / "merged.json"))
    assert r.exit_code == 0 and json.loads((tmp_path / "merged.json").read_text())


def test_a_broken_preset_file_is_one_line_naming_it(tmp_path, monkeypatch):
    import shutil

    import tqlab.core.config as config_mod

    presets = tmp_path / "presets"
    shutil.copytree(config_mod.PRESET_DIR, presets)
    (presets / f"{LLAMA}.json").write_text(json.dumps({"verdict": "crash"}))  # a plan report written over it
    (presets / "qwen3-32b.json").write_text("{not json")
    monkeypatch.setattr(config_mod, "PRESET_DIR", presets)
    want = (f"preset {LLAMA}: {presets / (LLAMA + '.json')} is not a tqlab preset (no title, source, config); "
            f"restore it, e.g. `git checkout -- data/presets/{LLAMA}.json`")
    for cmd in (["plan"], ["inspect-vllm", "--args", "vllm serve M"], ["repro", "--device", "meta"]):
        r = _cli(*cmd, "--preset", LLAMA)
        assert r.exit_code == 2 and r.output.strip().splitlines()[-1] == f"Error: {want}", r.output
    r = _cli("presets")
    assert r.exit_code == 0, r.output
    lines = [" ".join(x.split()) for x in r.output.splitlines() if x.startswith("skipped")]
    assert lines == [f"skipped {want}", f"skipped preset qwen3-32b: {presets / 'qwen3-32b.json'} is not JSON (Expecting "
                     "property name enclosed in double quotes, line 1); restore it, e.g. `git checkout -- "
                     "data/presets/qwen3-32b.json`"]
    assert "nemotron-3-super-120b-a12b" in r.output


@pytest.mark.parametrize("value, why", [("0", "0 is below 1: at least one fresh process per figure"),
                                        ("-3", "-3 is below 1: at least one fresh process per figure"),
                                        ("x", "'x' is not an integer")])
def test_bench_inspect_vllm_repeats_below_one_is_a_usage_error(value, why, capsys):
    import importlib.util

    from tqlab.core.provenance import DATA_DIR

    spec = importlib.util.spec_from_file_location("bench_inspect_vllm", DATA_DIR.parent / "benchmarks"
                                                  / "bench_inspect_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.main(["--repeats", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f": error: argument --repeats: {why}")
    assert mod._ANSWERED == (0, *sorted(set(EXIT_CODES.values()) - {0}))  # a verdict's exit status is an answer


# --------------------------------------------------------------------------- 80 columns


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["repro", "--help"], ["inspect-vllm", "--help"],
                                  ["trace-report", "--help"], ["presets"]])
def test_help_and_tables_fit_80_columns(args, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = CliRunner().invoke(app, args, terminal_width=80)
    assert r.exit_code == 0, r.output
    assert max(map(len, r.output.splitlines())) <= 80


def test_the_consumer_table_fits_80_columns():
    from tqlab.core.config import EngineConfig
    from tqlab.predict.analysis import predict
    from tqlab.predict.consumer_text import consumer_lines

    lines = consumer_lines(predict(EngineConfig.from_preset("deepseek-v3.2")))
    at = lines.index("  phase             reserved before the lock              max at serve time  cov")
    assert lines[at + 1:at + 5] == [
        "  flashmla_sparse.py:__init__",
        "  init         2,369,781,760 B   2260.00 MiB  2,369,781,760 B   2260.00 MiB  yes",
        "  sparse_attn_indexer.py:sparse_attn_indexer",
        "  profile_run    866,123,776 B    826.00 MiB    865,075,200 B    825.00 MiB  yes"]
    assert max(len(x) for x in lines[:at + 5]) <= 80


MTP = ["--num-attention-heads", "24", "--num-key-value-heads", "8", "--head-dim", "256", "--max-num-seqs", "1",
       "--max-model-len", "1024", "--max-num-batched-tokens", "1024", "--kv-cache-dtype", "turboquant_4bit_nc",
       "--num-speculative-tokens", "2"]
"""vLLM issue #42544's layout per rank (notebook 03, section 8): an MTP drafter with 2 speculative tokens."""


def test_the_speculative_reports_first_decode_crash_shows_with_default_flags():
    """'_decode_attention' requires 0.76 MB, current size is 0.00 MB (vLLM #42544): the first decode step, which the
    old default --max-tokens 1 never asked (that run said ok, exit 0)."""
    r = _cli("plan", *MTP)
    assert r.exit_code == 3, r.output
    out = " ".join(r.output.split())
    assert ("verdict without the fix: CRASH: _decode_attention (drafter) requires 0.76 MB, current size is 0.00 MB "
            "(cached 1, q 1) -- for the deployment: the decode step every prompt makes (shown for a 1-token prompt)"
            ) in out
    assert ("every prompt crashes at its first decode step (_decode_attention (drafter) asks 802,048 bytes); without "
            "decode steps (--max-tokens 1) the longest prompt that survives is 1023 tokens; verdict: crash") in out
    assert [w["flag"] for w in json.loads(_cli("plan", *MTP, "--json", "-").output)["ways_out"]] == [
        None, "--enforce-eager"]
    r1 = _cli("plan", *MTP, "--max-tokens", "1", "--json", "-")
    # the prefill-only question: no drafter decode is asked; what is left is a busy server's continuation chunk
    # (a prefix-cache hit or a shared step), which the deployment's verdict covers too
    obj1 = json.loads(r1.output)
    assert (r1.exit_code, obj1["verdict"], obj1["first_refused_call"]["caller"]) == (3, "crash", "_continuation_prefill")


def test_every_way_out_replays_safe_on_random_deployments():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tqlab.core.config import EngineConfig
    from tqlab.predict.analysis import predict
    from tqlab.predict.ways_out import ways_out

    @settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(preset=st.sampled_from([LLAMA, "nemotron-3-super-120b-a12b", "qwen3-32b", "pr-44053-unit-test"]),
           seqs=st.sampled_from([1, 4, 64, 256, 1024]), mml=st.integers(2048, 131072),
           k=st.sampled_from([0, 0, 2]), prefix=st.booleans())
    def check(preset, seqs, mml, k, prefix):
        try:
            c = EngineConfig.from_preset(preset, max_num_seqs=seqs, max_model_len=mml, num_speculative_tokens=k,
                                         enable_prefix_caching=prefix, max_num_batched_tokens=max(seqs, 2048))
        except ValueError:
            return
        for w in ways_out(c):
            if w.flag is None:
                p, changed = predict(c, fix=True, max_tokens=16), c
            else:
                words = w.flag.split()
                changes = {words[i][2:].replace("-", "_"): int(words[i + 1]) if i + 1 < len(words) and
                           words[i + 1].isdigit() else True for i in range(len(words)) if words[i].startswith("--")}
                changed = c.replace(**changes)
                p = predict(changed, max_tokens=16)
            assert p.verdict in ("ok", "never_locked"), (w, p.verdict)
            assert p.verdict == "never_locked" or p.safe_max_model_len_any_schedule == changed.max_model_len

    check()


@pytest.mark.parametrize("cmd", [["plan", "--preset", LLAMA], ["inspect-vllm", "--preset", LLAMA, "--args", "vllm serve M"]])
def test_an_empty_json_path_is_named_as_no_file_name(cmd):
    """``--json ""`` resolved to the working folder and was refused as ``" is a folder"`` (hostile pass, wave 2)."""
    r = _cli(*cmd, "--json", "")
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: Invalid value for --json: '' is no file name; give a file, or '-' for standard output")
