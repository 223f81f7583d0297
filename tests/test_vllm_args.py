"""tqlab.vllm.deployment: `vllm serve` lines read as vLLM 0.33 reads them (issue 11 sections 4-5, issue 14).

Expected values of the serve-line cases were taken from vLLM 0.33's own parser
(``vllm serve``'s ``FlexibleArgumentParser``); ``parity/test_vllm_flags_parity.py``
re-checks that both parsers agree, in the parity environment.
"""

from __future__ import annotations

import json

import pytest

from tqlab.core.notes import NoteKind
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tqlab.predict.analysis import first_failing_prompt
from tqlab.cli import app
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.vllm.deployment import (
    VllmArgsError,
    deployment_from_preset,
    deployment_from_vllm,
    engine_config_from_vllm,
    engine_config_kwargs_from_vllm,
    human_readable_int,
    parse_engine_args,
    parse_serve_args,
    vllm_default_limits,
    vllm_flags,
)

MODEL = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
         "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}

# Qwen3.6-27B as in the public report vllm-project/vllm#43357 (Qwen3_5ForConditionalGeneration, full-attention
# layers 3, 7, ..., 63, "attention_block_size: 2080"); the attention/GDN fields of the Qwen3.5/3.6 27B config.json.
QWEN36_27B = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {
    "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "hidden_size": 5120, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}}
REPORT_43357 = ("vllm serve unsloth/Qwen3.6-27B-NVFP4 --kv-cache-dtype turboquant_k8v4 --max-model-len 114688 "
                "--max-num-seqs 1 --max-num-batched-tokens 2080 --enable-prefix-caching --enable-chunked-prefill")


def test_flag_table_is_vllm_0_33s():
    t = vllm_flags()
    assert t["vllm_version"] == "0.33.0" and t["allow_abbrev"] is True
    by = {f["dest"]: f for f in t["flags"]}
    assert by["tensor_parallel_size"]["options"] == ["--tensor-parallel-size", "-tp"]
    assert by["enable_chunked_prefill"]["negative_options"] == ["--disable-chunked-prefill", "--no-enable-chunked-prefill"]
    assert (by["max_model_len"]["type"], by["max_num_batched_tokens"]["type"]) == ("human_readable_int_or_auto", "human_readable_int")
    assert (by["cudagraph_capture_sizes"]["nargs"], by["cudagraph_capture_sizes"]["type"]) == ("+", "int")
    assert {d for d, f in by.items() if f["type"] == "json"} >= {"compilation_config", "speculative_config", "attention_config"}
    assert by["compilation_config"]["options"] == ["--compilation-config", "-cc"]


@pytest.mark.parametrize("line, expected", [
    ("vllm serve M --enable-lora -tp 8", {"model_tag": "M", "enable_lora": True, "tensor_parallel_size": 8}),
    ("vllm serve M --max-model-len 128k", {"model_tag": "M", "max_model_len": 128000}),
    ("vllm serve M --max-model-len=128K", {"model_tag": "M", "max_model_len": 131072}),
    ("vllm serve M --max-model-len 25.6k", {"model_tag": "M", "max_model_len": 25600}),
    ("vllm serve M --max-model-len auto", {"model_tag": "M", "max_model_len": -1}),
    ("vllm serve M --max-model-len ' 1_000 '", {"model_tag": "M", "max_model_len": 1000}),
    ("vllm serve M --max_num_seqs=4 -tp=2", {"model_tag": "M", "max_num_seqs": 4, "tensor_parallel_size": 2}),
    ("vllm serve M --max-num-batched-tokens 2k", {"model_tag": "M", "max_num_batched_tokens": 2000}),
    ("vllm serve M --no-enable-chunked-prefill", {"model_tag": "M", "enable_chunked_prefill": False}),
    ("vllm serve M --disable-chunked-prefill", {"model_tag": "M", "enable_chunked_prefill": False}),
    ("vllm serve M --cudagraph-capture-sizes 1 2 4", {"model_tag": "M", "cudagraph_capture_sizes": [1, 2, 4]}),
    ("""vllm serve M --compilation-config '{"cudagraph_capture_sizes":[1,2]}'""",
     {"model_tag": "M", "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}),
    ("vllm serve M -cc.cudagraph_capture_sizes '[1,2]' -cc.cudagraph_mode FULL_DECODE_ONLY",
     {"model_tag": "M", "compilation_config": {"cudagraph_capture_sizes": [1, 2], "cudagraph_mode": "FULL_DECODE_ONLY"}}),
    ("""vllm serve M --speculative-config '{"method":"mtp","num_speculative_tokens":3}'""",
     {"model_tag": "M", "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}),
    ("vllm serve M --attention-config.tq_max_kv_splits_for_cuda_graph 8",
     {"model_tag": "M", "attention_config": {"tq_max_kv_splits_for_cuda_graph": 8}}),
    ("vllm serve M -O3", {"model_tag": "M", "optimization_level": "3"}),
    ("vllm serve M -O 0", {"model_tag": "M", "optimization_level": "0"}),
    ("vllm serve M --max-model-len 3k --max-model-len 5", {"model_tag": "M", "max_model_len": 5}),
    ("vllm serve M --max-model-len -5", {"model_tag": "M", "max_model_len": -5}),  # the parser takes it; ModelConfig refuses
    # vLLM's parser allows unique prefixes (argparse allow_abbrev): this IS --max-num-seqs 4 in vLLM 0.33
    ("vllm serve M --max-num-seq 4", {"model_tag": "M", "max_num_seqs": 4}),
    ("vllm serve M --tensor-parallel 2", {"model_tag": "M", "tensor_parallel_size": 2}),
    # with no model before it, vLLM takes the word after a boolean flag as the model
    ("vllm serve --enable-chunked-prefill false", {"model_tag": "false", "enable_chunked_prefill": True}),
])
def test_serve_lines_parse_as_vllm(line, expected):
    assert parse_serve_args(line)[0] == expected


def test_notes_for_prefixes_and_a_boolean_word_as_model():
    assert parse_serve_args("vllm serve M --max-num-seq 4")[1] == [
        "--max-num-seq read as --max-num-seqs: vLLM's parser accepts unique prefixes (argparse allow_abbrev)"]
    assert parse_serve_args("vllm serve --enable-chunked-prefill false")[1] == [
        "model 'false': vLLM reads a word after a boolean flag as the model name (booleans take no value)"]


@pytest.mark.parametrize("line, msg", [
    ("vllm serve M --max-num-sqs 4", "vllm serve: unknown flag --max-num-sqs (not a vLLM 0.33.0 flag); did you mean "
                                     "--max-num-seqs or --max-num-active-seqs or --max-num-queued-reqs?"),
    ("vllm serve M --bogus-flag", "vllm serve: unknown flag --bogus-flag (not a vLLM 0.33.0 flag)"),
    ("vllm serve M --max-num 4", "vllm serve: ambiguous option: --max-num could match --max-num-active-seqs, "
                                 "--max-num-batched-tokens, --max-num-queued-reqs, --max-num-queued-tokens, "
                                 "--max-num-scheduled-tokens, --max-num-seqs"),
    ("vllm serve M --enable-chunked-prefill false", "vllm serve: unrecognized arguments: false (a boolean flag such "
                                                    "as --enable-chunked-prefill takes no value; use its --no-/--disable- form)"),
    ("vllm serve M --max-model-len infk", "vllm serve: argument --max-model-len: invalid human_readable_int_or_auto value: 'infk'"),
    ("vllm serve M --max-model-len 1e30k", "vllm serve: argument --max-model-len: invalid human_readable_int_or_auto value: '1e30k'"),
    ("vllm serve M --max-model-len 1.5K", "vllm serve: argument --max-model-len: Decimals are not allowed with binary "
                                          "suffixes like K. Did you mean to use 1.5k instead?"),
    ("vllm serve M --max-num-seqs 4k", "vllm serve: argument --max-num-seqs: invalid int value: '4k'"),
    ("vllm serve M --cudagraph-capture-sizes 1,2,4", "vllm serve: argument --cudagraph-capture-sizes: invalid int value: '1,2,4'"),
    ("vllm serve M --attention-config 5", "vllm serve: argument --attention-config/-ac: must be a JSON object such as "
                                          "'{\"key\": 1}', got '5'"),
    ("vllm serve M --enable-lora=false", "vllm serve: argument --disable-lora/--enable-lora/--no-enable-lora: "
                                         "ignored explicit argument 'false'"),
    ("vllm serve M --max-model-len", "vllm serve: argument --max-model-len: expected one argument"),
    ("vllm serve M 'open", "vllm serve line: No closing quotation (shell quoting)"),
])
def test_bad_serve_lines_are_one_line_errors(line, msg):
    with pytest.raises(VllmArgsError) as e:
        parse_serve_args(line)
    assert str(e.value) == msg and "\n" not in msg


def test_human_readable_int_is_vllms():
    assert [human_readable_int(s) for s in ("1k", "1K", "2M", "1m", "1g", "1T", "7")] == [
        1000, 1024, 2 * 2**20, 10**6, 10**9, 2**40, 7]
    for bad in ("infk", "1e30k", "nan", "1e3", "0x10", ""):
        with pytest.raises(ValueError):
            human_readable_int(bad)


# --------------------------------------------------------------------------- #
# Flags -> EngineConfig kwargs, with sources                                  #
# --------------------------------------------------------------------------- #


def test_kwargs_and_sources_from_flags_config_and_defaults():
    kw, notes, src = engine_config_kwargs_from_vllm("vllm serve M -tp 2 --max-model-len 128k --enable-lora", MODEL)
    assert (kw["tensor_parallel_size"], kw["max_model_len"], kw["num_hidden_layers"]) == (2, 128000, 32)
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"]) == (256, 2048)
    assert src["tensor_parallel_size"] == "flag --tensor-parallel-size"
    assert src["max_model_len"] == "flag --max-model-len"
    assert src["num_key_value_heads"] == "config.json num_key_value_heads"
    assert src["max_num_seqs"] == "vLLM default (`vllm serve` on a GPU under 70 GiB; GPU size assumed, pass --gpu-memory-gib)"
    assert src["kv_cache_dtype"] == src["block_size"] == "vLLM default"
    assert set(src) == set(kw) | ({"cudagraph_capture_sizes", "enable_chunked_prefill", "enable_dbo", "enforce_eager",
                                   "kv_cache_dtype", "block_size", "tq_max_kv_splits_for_cuda_graph",
                                   "cudagraph_mode", "num_speculative_tokens", "max_cudagraph_capture_size",
                                   "lock_workspace_when_eager", "mamba_block_aligned_split", "enable_prefix_caching",
                                   "max_num_scheduled_tokens", "mla", "indexer", "moe", "decode_context_parallel_size",
                                   "data_parallel_size", "enable_expert_parallel", "attention_backend",
                                   "mla_prefill_backend", "gpu", "turboquant_backend_on_unquantized",
                                   "flashinfer_workspace_buffer_size"}
                                  - set(kw))
    assert src["cudagraph_mode"] == "vLLM default (-O2: FULL_AND_PIECEWISE)" and "cudagraph_mode" not in kw
    assert "vLLM flags with no effect on the workspace: --enable-lora" in notes
    EngineConfig(**kw)


def test_max_model_len_auto_and_absent_come_from_config_json():
    for line, how in (("vllm serve M --max-model-len auto", "--max-model-len auto"), ("vllm serve M", "no --max-model-len"),
                      ("vllm serve M --max-model-len -1", "--max-model-len auto")):
        kw, _, src = engine_config_kwargs_from_vllm(line, MODEL)
        assert kw["max_model_len"] == 131072
        assert src["max_model_len"] == f"config.json max_position_embeddings ({how})"
    kw, _, src = engine_config_kwargs_from_vllm("vllm serve M --max-model-len auto", {**MODEL, "seq_length": 4096})
    assert (kw["max_model_len"], src["max_model_len"]) == (4096, "config.json seq_length (--max-model-len auto)")
    for bad in ("-5", "0"):
        with pytest.raises(VllmArgsError, match=f"--max-model-len must be a positive integer or auto/-1, got {bad}"):
            engine_config_kwargs_from_vllm(f"vllm serve M --max-model-len {bad}", MODEL)


def test_cudagraph_speculative_and_attention_config_at_dict_level():
    kw, _, src = engine_config_kwargs_from_vllm(
        """vllm serve M --speculative-config '{"method":"mtp","num_speculative_tokens":3}' """
        """-cc.cudagraph_capture_sizes '[1,2]' -cc.cudagraph_mode full_decode_only -ac.tq_max_kv_splits_for_cuda_graph 16""",
        MODEL)
    assert kw["cudagraph_capture_sizes"] == (1, 2) and kw["tq_max_kv_splits_for_cuda_graph"] == 16
    assert src["cudagraph_capture_sizes"] == "flag --compilation-config cudagraph_capture_sizes"
    # the fields the other engineer adds to EngineConfig: mapped when present, named in the notes until then
    from tqlab.vllm.deployment import _given, _map_flags

    def mapped(line):  # (values, sources) the flags alone record on a draft
        d = _map_flags(_given(line)[0])
        return {k: d.get(k) for k in d.fields if k in d}, {k: d.source(k) for k in d.fields}

    full, fsrc = mapped("""vllm serve M --speculative-config '{"num_speculative_tokens":3}' -cc.cudagraph_mode FULL_DECODE_ONLY""")
    assert (full["num_speculative_tokens"], full["cudagraph_mode"]) == (3, "FULL_DECODE_ONLY")
    assert fsrc["num_speculative_tokens"] == "flag --speculative-config num_speculative_tokens"
    eager_kw, eager_src = mapped("vllm serve M --enforce-eager -O3")
    assert "cudagraph_mode" not in eager_kw and eager_src["cudagraph_mode"].startswith("derived: --enforce-eager")
    assert mapped("vllm serve M -O1") == ({"cudagraph_mode": "PIECEWISE"}, {"cudagraph_mode": "flag -O1"})
    assert mapped("vllm serve M")[1] == {"cudagraph_mode": "vLLM default (-O2: FULL_AND_PIECEWISE)"}
    assert mapped("vllm serve M --max-cudagraph-capture-size 64")[0]["max_cudagraph_capture_size"] == 64


@pytest.mark.parametrize("line, msg", [
    ("vllm serve M --cudagraph-capture-sizes 4 -cc.cudagraph_capture_sizes '[1]'",
     "--cudagraph-capture-sizes and --compilation-config (-cc) cudagraph_capture_sizes are mutually exclusive (vLLM)"),
    ("vllm serve M -cc.cudagraph_capture_sizes '[0]'",
     "--compilation-config (-cc) cudagraph_capture_sizes[0] must be a positive integer, got 0 (in [0])"),
    ("vllm serve M -cc.cudagraph_capture_sizes '[]'",
     "--compilation-config (-cc) cudagraph_capture_sizes must be a non-empty list of positive integers, got []"),
    # review finding: the flag and the bad element, not only the key
    ("""vllm serve M -cc '{"cudagraph_capture_sizes": [1, 2.5, 4]}'""",
     "--compilation-config (-cc) cudagraph_capture_sizes[1] must be an integer, got 2.5 (in [1, 2.5, 4])"),
    ("""vllm serve M --compilation-config '{"max_cudagraph_capture_size": 2.5}'""",
     "--compilation-config (-cc) max_cudagraph_capture_size must be an integer, got 2.5"),
    ("vllm serve M --cudagraph-capture-sizes 1 0", "--cudagraph-capture-sizes[1] must be a positive integer, got 0 (in [1, 0])"),
    ("vllm serve M -cc.cudagraph_mode SOMETIMES", "--compilation-config (-cc) cudagraph_mode must be one of NONE, PIECEWISE, "
                                                  "FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE, got 'SOMETIMES'"),
    ("vllm serve M -O7", "--optimization-level (-O) must be 0, 1, 2 or 3, got '7'"),
    ("""vllm serve M --speculative-config '{"num_speculative_tokens":-1}'""",
     "--speculative-config num_speculative_tokens must be an integer >= 1 (vLLM SpeculativeConfig: gt=0), got -1"),
    ("""vllm serve M --speculative-config '{"num_speculative_tokens":0}'""",
     "--speculative-config num_speculative_tokens must be an integer >= 1 (vLLM SpeculativeConfig: gt=0), got 0"),
    ("""vllm serve M --speculative-config '{"num_speculative_tokens":2.5}'""",
     "--speculative-config num_speculative_tokens must be an integer, got 2.5"),
    ("vllm serve M -ac.tq_max_kv_splits_for_cuda_graph x",
     "--attention-config tq_max_kv_splits_for_cuda_graph must be an integer, got 'x'"),
])
def test_bad_config_values_are_one_line_errors(line, msg):
    with pytest.raises(VllmArgsError) as e:
        engine_config_kwargs_from_vllm(line, MODEL)
    assert str(e.value) == msg


def test_parse_engine_args_keeps_predicts_preset_path():
    kw, ignored = parse_engine_args("vllm serve M --max-model-len auto --dtype auto -tp 8 --enforce-eager --port 8000")
    assert kw == {"tensor_parallel_size": 8, "enforce_eager": True}  # auto: left to the preset/config
    assert ignored == ["--port"]
    with pytest.raises(VllmArgsError, match="--enable-dbo must be true or false, got 'maybe'"):
        parse_engine_args({"enable_dbo": "maybe"})
    assert parse_engine_args({"enable-dbo": "true", "max_num_seqs": 4}) == ({"enable_dbo": True, "max_num_seqs": 4}, [])


def test_gpu_memory_gib_must_be_finite_and_positive():
    assert vllm_default_limits("serve", 80)[:2] == (8192, 1024)
    for bad in (float("nan"), -5, 0, float("inf")):
        with pytest.raises(ValueError, match="gpu_memory_gib must be a finite number > 0"):
            vllm_default_limits("serve", bad)


# --------------------------------------------------------------------------- #
# Hybrid: the public report's deployment (issue 11 section 4)                 #
# --------------------------------------------------------------------------- #


def test_report_43357_block_size_2080_and_the_455_mb_reservation():
    d = deployment_from_vllm(REPORT_43357, QWEN36_27B)
    c = d.config
    assert (c.num_hidden_layers, c.block_size, c.num_key_value_heads, c.head_dim) == (16, 2080, 4, 256)
    # 3 x 10240 bf16 conv + 48 x 128 x 128 fp32 SSM = 3,207,168 B; TurboQuant k8v4 slot at D=256: 388 B x 4 heads
    assert d.sources["block_size"] == (
        "derived: attention page >= gdn state page (vLLM _align_hybrid_block_size): 3,207,168 B state / "
        "(388 B turboquant_k8v4 slot x 4 KV heads = 1552 B per token), in multiples of 16 -> 2080")
    assert d.sources["num_hidden_layers"] == "config.json text_config.full_attention_interval: 16 attention layers of 64"
    # PR #44053's continuation reservation: 2 x (1, 4, round_up(114687, 2080) = 116480, 256) fp16 = 455.00 MiB
    assert plan_bytes(reservation_plan(c)) == 477_102_080 == 455 * 2**20
    # the per-token KV figure counts the 16 attention layers only (64 would be 4x)
    assert c.kv_bytes_per_token_per_rank() == 2 * 4 * 256 * 16 * 2 == 65536
    # --enable-prefix-caching is read for a hybrid: it turns on the Mamba block-aligned split (block 2080 <= 2080 tokens)
    assert c.mamba_block_aligned_split is True and not any("no effect on the workspace" in n for n in d.notes)


def test_hybrid_block_size_follows_tp_dtypes_and_user_block():
    c = deployment_from_vllm(REPORT_43357 + " --mamba-ssm-cache-dtype bfloat16", QWEN36_27B).config
    assert c.block_size == 1056  # 1,634,304 B state / 24,832 B per 16 tokens -> 66 x 16
    c = deployment_from_vllm(REPORT_43357 + " --block-size 4096", QWEN36_27B).config
    assert c.block_size == 4096  # already >= the Mamba page: vLLM keeps it
    d = deployment_from_vllm(REPORT_43357 + " --block-size 32", QWEN36_27B)
    assert d.config.block_size == 2080 and "--block-size 32 raised to 2080 as vLLM does for hybrid models" in d.notes
    c = deployment_from_vllm(REPORT_43357.replace("--max-num-seqs 1", "--max-num-seqs 1 -tp 2"), QWEN36_27B).config
    assert c.block_size == 2080  # both pages halve with TP 2


def test_hybrid_without_mamba_fields_says_to_pass_block_size():
    cfg = {**MODEL, "num_hidden_layers": 8, "hybrid_override_pattern": "M*M-M*M-"}
    d = deployment_from_vllm("vllm serve M", cfg)
    assert (d.config.num_hidden_layers, d.config.block_size) == (2, 16)
    assert any("pass --block-size" in n for n in d.notes)


def test_engine_config_from_vllm_keeps_its_two_tuple():
    cfg, notes = engine_config_from_vllm(REPORT_43357, QWEN36_27B)
    assert isinstance(cfg, EngineConfig) and cfg.block_size == 2080 and isinstance(notes, list)


# --------------------------------------------------------------------------- #
# Hybrid: the Mamba block-aligned prefill split (mamba_cache_mode "align")    #
# --------------------------------------------------------------------------- #

# A Nemotron-H-like config.json: the nemotron preset's attention dims (32 query / 2 KV heads, D 128, 8 attention
# layers) in a Mamba2 stack (vLLM NemotronHForCausalLM's fields, as parity/test_vllm_flags_parity.py's MAMBA2).
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "num_attention_heads": 32, "num_key_value_heads": 2,
              "head_dim": 128, "num_hidden_layers": 24, "hybrid_override_pattern": "M*E" * 8, "mamba_num_heads": 128,
              "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
              "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
NEMOTRON_LINE = ("vllm serve M -tp 8 --max-num-seqs 4 --max-model-len 131072 --kv-cache-dtype turboquant_3bit_nc "
                 "--max-num-batched-tokens 4096")
SPLIT_SRC = ("derived: {how} -> mamba_cache_mode \"align\" (vLLM MambaModelConfig.verify_and_update_config): "
             "Scheduler._mamba_block_aligned_split ends every prefill chunk but a prompt's last on a block boundary")
DEFAULT_ON = "prefix caching on by default for a generative hybrid model"


@pytest.mark.parametrize("flag, how", [("", DEFAULT_ON), (" --enable-prefix-caching", "flag --enable-prefix-caching")])
def test_hybrid_with_prefix_caching_on_splits_on_block_boundaries(flag, how):
    line = REPORT_43357.replace(" --enable-prefix-caching", "") + flag
    d = deployment_from_vllm(line, QWEN36_27B)
    assert (d.config.mamba_block_aligned_split, d.config.block_size, d.config.max_num_batched_tokens) == (True, 2080, 2080)
    assert d.sources["mamba_block_aligned_split"] == SPLIT_SRC.format(how=how)
    assert d.notes[-1] == (f"mamba_block_aligned_split ({how}): vLLM 0.33 ends every prefill chunk but a prompt's last "
                           "on a multiple of block_size 2080 (Scheduler._mamba_block_aligned_split); modelled as with "
                           "FlashInfer's GDN prefill, which saves the state inside the last chunk (with the Triton GDN "
                           "prefill vLLM also stops the last chunk at the prompt's last block boundary); with "
                           "FlashInfer vLLM also rounds the block to a multiple of its 64-token checkpoint alignment "
                           "(Platform._align_hybrid_block_size in \"align\" mode), not modelled: pass --block-size with "
                           "the size vLLM logs")
    assert not any("no effect on the workspace" in n for n in d.notes)
    d = deployment_from_vllm(NEMOTRON_LINE.replace("4096", "8192") + " --block-size 8192", NEMOTRON_H)
    assert (d.config.block_size, d.config.mamba_block_aligned_split) == (8192, True)  # Mamba2: no GDN caveat
    assert d.notes[-1] == (f"mamba_block_aligned_split ({DEFAULT_ON}): vLLM 0.33 ends every prefill chunk but a "
                           "prompt's last on a multiple of block_size 8192 (Scheduler._mamba_block_aligned_split)")


@pytest.mark.parametrize("flag", ["--no-enable-prefix-caching", "--disable-prefix-caching",
                                  "--no-enable-prefix-caching --mamba-cache-mode align"])
def test_hybrid_with_prefix_caching_off_does_not_split(flag):
    d = deployment_from_vllm(REPORT_43357.replace("--enable-prefix-caching", flag), QWEN36_27B)
    assert d.config.mamba_block_aligned_split is False
    assert d.sources["mamba_block_aligned_split"] == ("flag --no-enable-prefix-caching: mamba_cache_mode \"none\" "
                                                      "(vLLM MambaModelConfig.verify_and_update_config), no block-aligned split")
    assert not any("no effect on the workspace" in n for n in d.notes)


@pytest.mark.parametrize("mode", ["none", "align"])
def test_mamba_cache_mode_is_read_but_ignored_as_vllm_0_33_does(mode):
    # vLLM 0.33: --mamba-cache-mode (choices align/none) is deprecated and never reaches CacheConfig; the mode
    # follows --enable-prefix-caching, so "none" with prefix caching on still splits.
    d = deployment_from_vllm(f"{REPORT_43357} --mamba-cache-mode {mode}", QWEN36_27B)
    assert d.config.mamba_block_aligned_split is True
    assert (f"--mamba-cache-mode {mode}: deprecated in vLLM 0.33 and ignored (EngineArgs.create_engine_config does not "
            "pass it on); the Mamba cache mode follows --enable-prefix-caching") in d.notes
    assert not any("no effect on the workspace" in n for n in d.notes)


def test_mamba_cache_mode_all_is_refused_as_vllm_0_33s_parser_does():
    with pytest.raises(VllmArgsError, match=r"--mamba-cache-mode: invalid choice: 'all' \(choose from 'align', 'none'\)"):
        deployment_from_vllm(f"{REPORT_43357} --mamba-cache-mode all", QWEN36_27B)


def test_dense_model_never_splits_and_reads_prefix_caching_as_a_field():
    kw, notes, src = engine_config_kwargs_from_vllm("vllm serve M --enable-prefix-caching --mamba-cache-mode align", MODEL)
    assert "mamba_block_aligned_split" not in kw and src["mamba_block_aligned_split"] == "vLLM default"
    assert (kw["enable_prefix_caching"], src["enable_prefix_caching"]) == (True, "flag --enable-prefix-caching")
    assert EngineConfig(**kw).mamba_block_aligned_split is False
    assert "vLLM flags with no effect on the workspace: --mamba-cache-mode" in notes
    kw, _, src = engine_config_kwargs_from_vllm("vllm serve M --no-enable-prefix-caching", MODEL)
    assert (kw["enable_prefix_caching"], src["enable_prefix_caching"]) == (False, "flag --enable-prefix-caching")


def test_hybrid_block_above_max_num_batched_tokens_leaves_the_split_off_with_a_note():
    # Mamba2 page at TP 8: 3 x 1280 bf16 conv + 16 x 64 x 128 fp32 SSM = 531,968 B over 102 B per token -> 5216 > 4096
    d = deployment_from_vllm(NEMOTRON_LINE, NEMOTRON_H)
    assert (d.config.block_size, d.config.max_num_batched_tokens, d.config.mamba_block_aligned_split) == (5216, 4096, False)
    assert d.sources["mamba_block_aligned_split"] == ("derived: off in tqlab: block_size 5216 > max_num_batched_tokens "
                                                      "4096, vLLM's sub-block prefill chunks are not modelled")
    assert d.notes[-1] == (f"{DEFAULT_ON}: vLLM 0.33 splits prefills on Mamba block boundaries (mamba_cache_mode "
                           "\"align\", Scheduler._mamba_block_aligned_split), but with block_size 5216 > "
                           "max_num_batched_tokens 4096 it advances the prefill in sub-block chunks, which tqlab does not "
                           "model (mamba_block_aligned_split left off): the first failing prompt may differ")
    d = deployment_from_vllm(REPORT_43357 + " --block-size 4096", QWEN36_27B)  # the user's block, above 2080 tokens
    assert (d.config.block_size, d.config.mamba_block_aligned_split) == (4096, False)
    assert "with block_size 4096 > max_num_batched_tokens 2080 it advances the prefill in sub-block chunks" in d.notes[-1]


def test_hybrid_prefix_caching_without_chunked_prefill_is_refused_as_vllm_asserts():
    line = REPORT_43357.replace("--enable-chunked-prefill", "--no-enable-chunked-prefill").replace("114688", "2080")
    with pytest.raises(VllmArgsError, match="vLLM 0.33 asserts 'Chunked prefill is required for Mamba prefix caching'"):
        deployment_from_vllm(line, QWEN36_27B)
    d = deployment_from_vllm(line.replace("--enable-prefix-caching", "--no-enable-prefix-caching"), QWEN36_27B)
    assert (d.config.enable_chunked_prefill, d.config.mamba_block_aligned_split) == (False, False)


def test_hybrid_preset_takes_the_lines_prefix_caching_flags():
    assert deployment_from_preset("vllm serve M", "nemotron-3-super-120b-a12b").config.mamba_block_aligned_split is True
    d = deployment_from_preset("vllm serve M --no-enable-prefix-caching", "nemotron-3-super-120b-a12b")
    assert d.config.mamba_block_aligned_split is False and d.notes == ["preset nemotron-3-super-120b-a12b"]
    d = deployment_from_preset("vllm serve M --block-size 8192", "nemotron-3-super-120b-a12b")
    assert (d.config.block_size, d.config.mamba_block_aligned_split) == (8192, False)
    assert "tqlab does not model (mamba_block_aligned_split left off)" in d.notes[-1]
    d = deployment_from_preset("vllm serve M --no-enable-prefix-caching", "qwen3-32b")  # dense preset: the field only
    assert (d.config.mamba_block_aligned_split, d.config.enable_prefix_caching) == (False, False)
    assert d.notes[0] == "preset qwen3-32b" and d.sources["enable_prefix_caching"] == "flag --enable-prefix-caching"
    # the rest: the server limits the line leaves out are vLLM's defaults for the GPU, not the preset's (issue 30)
    assert [n.kind for n in d.notes[1:]] == [NoteKind.DEFAULTED, NoteKind.DEFAULTED]
    assert (d.config.max_num_seqs, d.config.max_num_batched_tokens) == (1024, 8192)


@pytest.mark.parametrize("deploy, heads_bytes", [
    # the nemotron preset's shape (TP 8: 2 KV heads -> 1 per rank, D 128) on 2080-token blocks
    (lambda extra: deployment_from_preset("vllm serve M --block-size 2080" + extra, "nemotron-3-super-120b-a12b"),
     1 * 128),
    # Qwen3.6-27B (4 KV heads, D 256; its block is 2080) with a 4096-token batch
    (lambda extra: deployment_from_vllm(REPORT_43357.replace("batched-tokens 2080", "batched-tokens 4096")
                                        .replace(" --enable-prefix-caching", extra), QWEN36_27B), 4 * 256),
])
def test_block_aligned_split_moves_the_first_failing_prompt_from_4225_to_4097(deploy, heads_bytes):
    from tqlab.predict import analysis as A

    on, off = deploy("").config, deploy(" --no-enable-prefix-caching").config
    assert (on.mamba_block_aligned_split, off.mamba_block_aligned_split) == (True, False)
    assert (on.block_size, on.max_num_batched_tokens) == (off.block_size, off.max_num_batched_tokens) == (2080, 4096)
    locked = A.locked_bytes(on, fix=False)
    assert locked == A.locked_bytes(off, fix=False)
    # By hand: a continuation chunk after c > 0 cached tokens dequantizes round_up(c, 2080) >= 2080 tokens of K and V
    # in fp16 per KV head on the rank: >= 2080 x heads x D x 2 x 2 B, above the locked size; so a prompt fails at its
    # first chunk with cached > 0 and more than 128 new tokens (vLLM's decode-kernel threshold).
    assert A.continuation_bytes(on, 1) == 2080 * heads_bytes * 2 * 2 > locked
    # Off: chunks of 4096 -> the first such chunk is (4096, 129): 4096 + 129 = 4225 tokens.
    # On: a prompt over 4096 tokens gets 4096 // 2080 * 2080 = 2080 first, then (2080, n - 2080) with n - 2080 >= 2017
    # new tokens: 4097 already fails; 4096 tokens are one chunk (no cached tokens).
    assert A.prefill_chunks(off, 4097) == [(0, 4096), (4096, 1)] and A.prefill_chunks(on, 4097) == [(0, 2080), (2080, 2017)]
    assert A.prefill_chunks(on, 4096) == [(0, 4096)]
    assert (A.first_failing_prompt(on, locked), A.first_failing_prompt(off, locked)) == (4097, 4225)


# --------------------------------------------------------------------------- #
# inspect-vllm (tqlab.cli.inspect_vllm_cmd)                                   #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("extra, msg", [
    (["--gpu-memory-gib", "nan"], "Invalid value for --gpu-memory-gib: must be a finite number of GiB > 0, got nan"),
    (["--gpu-memory-gib", "-5"], "Invalid value for --gpu-memory-gib: must be a finite number of GiB > 0, got -5.0"),
    (["--json", "/missing/dir/x.json"], "Invalid value for --json: /missing/dir/x.json: folder /missing/dir does not exist"),
    (["--args", "vllm serve M --max-num-sqs 4"], "Error: vllm serve: unknown flag --max-num-sqs"),
    (["--args", "vllm serve M --attention-config 5"], "must be a JSON object"),
])
def test_inspect_vllm_bad_input_is_a_one_line_usage_error(extra, msg):
    r = CliRunner().invoke(app, ["inspect-vllm", "--preset", "pr-44053-unit-test", *extra])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert msg in r.output and "Traceback" not in r.output


def test_inspect_vllm_reads_a_hybrid_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN36_27B))
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["inspect-vllm", "--config", str(tmp_path), "--args", REPORT_43357, "--tokens", "8000",
                                 "--json", str(out)])
    assert r.exit_code == 3, r.output  # crash: the exit status follows the verdict
    rep = json.loads(out.read_text())
    c = rep["prediction"]["config"]
    assert (c["block_size"], c["num_hidden_layers"], c["max_model_len"], c["kv_cache_dtype"]) == (2080, 16, 114688, "turboquant_k8v4")
    assert "hybrid model (full_attention_interval): 16 attention layers of 64 (3, 7, 11, 15, ...)" in r.output


def test_max_model_len_above_the_model_is_refused_as_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(VllmArgsError) as e:
        engine_config_kwargs_from_vllm("vllm serve M --max-model-len 262144", MODEL)
    assert str(e.value) == ("--max-model-len 262144 is greater than the derived max_model_len (max_position_embeddings=131072 "
                            "or model_max_length=None in config dict); vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    kw, _, _ = engine_config_kwargs_from_vllm("vllm serve M --max-model-len 262144", {**MODEL, "model_max_length": 300000})
    assert kw["max_model_len"] == 262144  # model_max_length lets it through, as in vLLM
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    kw, notes, _ = engine_config_kwargs_from_vllm("vllm serve M --max-model-len 262144", MODEL)
    assert kw["max_model_len"] == 262144 and notes[0].endswith(": allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    # no length key at all: vLLM takes the flag as given
    no_key = {k: v for k, v in MODEL.items() if k != "max_position_embeddings"}
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    assert engine_config_kwargs_from_vllm("vllm serve M --max-model-len 1M", no_key)[0]["max_model_len"] == 2**20


def test_speculative_tokens_lengthen_the_conv_state_and_the_block():
    spec = """ --speculative-config '{"method":"mtp","num_speculative_tokens":3}'"""
    d = deployment_from_vllm(REPORT_43357 + spec, QWEN36_27B)
    # conv state (3 + 3) x 10240 x 2 B = 122,880 B + 3,145,728 B SSM = 3,268,608 B -> cdiv(., 16 x 1552) = 132 -> 2112
    assert d.config.block_size == 2112
    assert "3,268,608 B state" in d.sources["block_size"]


def test_config_yaml_is_expanded_as_vllm_and_the_line_wins(tmp_path):
    y = tmp_path / "serve.yaml"
    y.write_text("tensor-parallel-size: 4\nmax_model_len: 64k\nenforce-eager: true\nenable-chunked-prefill: false\n"
                 "compilation-config:\n  cudagraph_capture_sizes: [1, 2]\ncudagraph-capture-sizes: []\n")
    got, notes = parse_serve_args(f"vllm serve M --config {y} -tp 2")
    assert got == {"model_tag": "M", "tensor_parallel_size": 2, "max_model_len": 64000, "enforce_eager": True,
                   "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}
    # vLLM 0.33 drops a false boolean from the file (checked against vLLM in parity/test_vllm_flags_parity.py)
    assert notes == [f"enable-chunked-prefill: false in {y} has no effect in vLLM 0.33 (the root `vllm` parser that "
                     "reads --config knows no --no-enable-chunked-prefill); the default stays"]
    (tmp_path / "bad.yaml").write_text("- 1\n")
    for arg, msg in ((str(tmp_path / "x.json"), "must be a .yaml/.yml file, as vLLM requires"),
                     (str(tmp_path / "missing.yaml"), "cannot be read"),
                     (str(tmp_path / "bad.yaml"), "the top level must be a mapping of flag: value, got [1]")):
        with pytest.raises(VllmArgsError, match=msg.replace("[", "\\[").replace("]", "\\]").replace(".", "\\.")):
            parse_serve_args(f"vllm serve M --config {arg}")


def test_fields_being_added_to_engine_config_are_passed_once_they_exist(monkeypatch):
    """After the merge EngineConfig gains num_speculative_tokens, cudagraph_mode, max_cudagraph_capture_size and
    lock_workspace_when_eager: the kwargs carry them with their sources (simulated here on the field list)."""
    import tqlab.vllm.deployment as va

    new = {"num_speculative_tokens", "cudagraph_mode", "max_cudagraph_capture_size", "lock_workspace_when_eager"}
    base = va._field_names()
    monkeypatch.setattr(va, "_field_names", lambda: base | new)
    kw, notes, src = engine_config_kwargs_from_vllm(
        """vllm serve M --speculative-config '{"method":"mtp","num_speculative_tokens":3}' -O1 """
        "--max-cudagraph-capture-size 64", MODEL)
    assert (kw["num_speculative_tokens"], kw["cudagraph_mode"], kw["max_cudagraph_capture_size"]) == (3, "PIECEWISE", 64)
    assert "lock_workspace_when_eager" not in kw
    assert src["cudagraph_mode"] == "flag -O1" and src["max_cudagraph_capture_size"] == "flag --max-cudagraph-capture-size"
    assert src["lock_workspace_when_eager"].startswith("tqlab variant, off")
    assert not any(n.startswith("read but not modelled") for n in notes)
    kw, _, src = engine_config_kwargs_from_vllm("vllm serve M --enforce-eager", MODEL)
    # the field stays None: tqlab.predict.analysis.cudagraph_mode derives NONE from enforce_eager, as VllmConfig.__post_init__ does
    assert "cudagraph_mode" not in kw and kw["enforce_eager"] is True
    assert src["cudagraph_mode"] == "derived: --enforce-eager sets cudagraph_mode NONE (vLLM)"


def test_inspect_vllm_json_dash_prints_only_the_json():
    r = CliRunner().invoke(app, ["inspect-vllm", "--preset", "pr-44053-unit-test", "--tokens", "100", "--json", "-"])
    assert r.exit_code == 3, r.output  # crash: the unit test's deployment without the fix
    rep = json.loads(r.output)
    assert rep["prediction"]["config"]["preset"] == "pr-44053-unit-test"


# --------------------------------------------------------------------------- #
# Properties: any argv / any config.json -> a result or a one-line ValueError  #
# --------------------------------------------------------------------------- #


_OPTS = sorted(o for f in vllm_flags()["flags"] for o in f["options"])
_token = st.one_of(st.sampled_from(_OPTS), st.sampled_from(["-O", "-O3", "-O=x", "--", "-", "-cc.mode", "--x.y+",
                                                             "--config", "auto", "1k", "{", "[1]", "true", "-5"]),
                   st.text(max_size=8), st.integers(-10, 10**6).map(str),
                   st.sampled_from(_OPTS).flatmap(lambda o: st.text(max_size=5).map(lambda v: f"{o}={v}")))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(argv=st.lists(_token, max_size=8))
def test_any_argv_parses_or_is_a_one_line_error(argv):
    try:
        given_, notes = parse_serve_args(["vllm", "serve", *argv])
    except VllmArgsError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(given_, dict) and all(isinstance(n, str) for n in notes)


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 2**65), st.floats(), st.text(max_size=4)),
                     lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                     max_leaves=6)
_keys = st.sampled_from(["num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "num_hidden_layers",
                         "max_position_embeddings", "layer_types", "full_attention_interval", "hybrid_override_pattern",
                         "attn_layer_indices", "attn_layer_period", "rope_scaling", "torch_dtype", "text_config",
                         "linear_num_value_heads", "mamba_num_heads", "model_max_length", "seq_length"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cfg=st.dictionaries(_keys, _json, max_size=8), line=st.sampled_from(
    ["vllm serve M", "vllm serve M -tp 2 --kv-cache-dtype turboquant_4bit_nc", "vllm serve M --max-model-len auto"]))
def test_any_config_json_builds_or_is_a_one_line_error(cfg, line):
    try:
        d = deployment_from_vllm(line, {"num_attention_heads": 8, "head_dim": 128, **cfg})
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(d.config, EngineConfig) and set(d.sources) >= {"num_attention_heads", "max_model_len", "block_size"}


def test_dict_engine_args_take_dests_aliases_and_false_booleans():
    kw, ignored = parse_engine_args({"enable_chunked_prefill": False, "headless": False, "enforce_eager": "no",
                                     "tp": 2, "--max-num-seqs": 4, "compilation_config": {"cudagraph_capture_sizes": [1, 2]}})
    assert kw == {"enable_chunked_prefill": False, "enforce_eager": False, "tensor_parallel_size": 2, "max_num_seqs": 4,
                  "cudagraph_capture_sizes": (1, 2)}
    assert ignored == []


def test_deployment_from_preset_says_which_fields_the_line_set():
    from tqlab.vllm.deployment import deployment_from_preset

    d = deployment_from_preset("vllm serve M --enable-lora -tp 8 --max-num-seq 4 --dtype float16", "nemotron-3-super-120b-a12b")
    assert (d.config.tensor_parallel_size, d.config.max_num_seqs, d.config.dtype) == (8, 4, torch.float16)
    assert d.sources["tensor_parallel_size"] == "flag --tensor-parallel-size"
    assert d.sources["max_model_len"] == "preset nemotron-3-super-120b-a12b"
    assert d.notes == ["preset nemotron-3-super-120b-a12b",
                       "--max-num-seq read as --max-num-seqs: vLLM's parser accepts unique prefixes (argparse allow_abbrev)",
                       "vLLM flags with no effect on the workspace: --enable-lora"]
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        deployment_from_preset("vllm serve M", "nope")


@pytest.mark.parametrize("line, seqs, mbt", [
    ("vllm serve M --max-model-len 100000 --no-enable-chunked-prefill", 256, 100000),  # max(max_model_len, 2048)
    ("vllm serve M --max-model-len 1000 --no-enable-chunked-prefill", 256, 2048),
    ("vllm serve M --max-model-len 4 --max-num-seqs 2", 2, 8),  # min(max_num_seqs x max_model_len, 2048)
    ("vllm serve M --max-num-batched-tokens 100", 100, 100),  # a defaulted max_num_seqs is capped by the batch
    ("vllm serve M --performance-mode throughput", 512, 4096),  # doubled defaults
    # batched DP MoE (ParallelConfig.use_batched_dp_moe: deepep_low_latency / nixl_ep, -dp > 1, expert parallel):
    # SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP = 256, then max_num_seqs = min(256, 256)
    ("vllm serve M -dp 2 --enable-expert-parallel --all2all-backend deepep_low_latency", 256, 256),
    ("vllm serve M -dp 2 --enable-expert-parallel --all2all-backend nixl_ep --performance-mode throughput", 512, 512),
    ("vllm serve M -dp 2 --all2all-backend deepep_low_latency", 256, 2048),  # no expert parallelism: not batched
])
def test_scheduler_defaults_as_vllm(line, seqs, mbt):
    kw, _, src = engine_config_kwargs_from_vllm(line, MODEL)
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"]) == (seqs, mbt)
    EngineConfig(**kw)


def test_max_num_seqs_above_the_default_batch_is_refused_as_vllm():
    # vLLM keeps the default batch of 2048 and SchedulerConfig.verify_max_model_len refuses it
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(2048\) must be >= max_num_seqs \(4096\)"):
        deployment_from_vllm("vllm serve M --max-num-seqs 4096", MODEL)


@pytest.mark.parametrize("layers, extra, expected", [
    (32, "", 28),  # vLLM keeps layers 0, 1, 30, 31 in bf16 (TurboQuantConfig.get_boundary_skip_layers)
    (32, " --kv-cache-dtype-skip-layers 5 30", 27),
    (3, "", 1),  # n = min(2, 3 // 2) = 1 at each end: layers 0 and 2 off, layer 1 on TurboQuant
])
def test_dense_turboquant_layers_exclude_vllms_boundary_layers(layers, extra, expected):
    cfg = {**MODEL, "num_hidden_layers": layers}
    kw, notes, src = engine_config_kwargs_from_vllm("vllm serve M --kv-cache-dtype turboquant_4bit_nc" + extra, cfg)
    assert kw["num_hidden_layers"] == expected
    assert src["num_hidden_layers"].startswith(f"derived: {layers} attention layers - {layers - expected} kept off TurboQuant")
    assert engine_config_kwargs_from_vllm("vllm serve M", cfg)[0]["num_hidden_layers"] == layers  # not TurboQuant


def test_a_model_with_every_layer_off_turboquant_is_an_error():
    with pytest.raises(VllmArgsError, match="every attention layer is kept off TurboQuant .*no TurboQuant workspace consumer"):
        engine_config_kwargs_from_vllm("vllm serve M --kv-cache-dtype turboquant_4bit_nc", {**MODEL, "num_hidden_layers": 2})


def test_flags_that_move_chunk_boundaries_are_modelled_or_named():
    d = deployment_from_preset("vllm serve M --long-prefill-token-threshold 8 --max-num-scheduled-tokens 1000",
                               "nemotron-3-super-120b-a12b")
    assert not any("no effect on the workspace" in n for n in d.notes)
    lpt = next(n for n in d.notes if n.startswith("--long-prefill-token-threshold 8:"))
    assert "alone it is not capped, so the first failing prompt is unchanged" in lpt
    assert "below block_size 16 those chunks end mid-block" in lpt  # the split is on for this hybrid preset
    # --max-num-scheduled-tokens is the step's token budget (Scheduler.__init__): the prefill chunk
    assert (d.config.max_num_scheduled_tokens, d.config.chunk_budget) == (1000, 1000)
    assert d.sources["max_num_scheduled_tokens"] == "flag --max-num-scheduled-tokens"
    # the split cuts 1000-token steps back to 992 (62 blocks): 992 + 129 new tokens is the first refused prompt
    assert first_failing_prompt(d.config, 268_544) == 992 + 129
    dense = deployment_from_preset("vllm serve M --long-prefill-token-threshold 8 --max-num-scheduled-tokens 8192",
                                   "llama-3.1-8b")
    lpt = next(n for n in dense.notes if n.startswith("--long-prefill-token-threshold 8:"))
    assert "mid-block" not in lpt  # no block-aligned split on a dense model
    assert dense.config.chunk_budget == 8192


def test_a_kv_connector_is_named_where_the_any_chunking_bound_stops():
    d = deployment_from_preset("vllm serve M --no-enable-prefix-caching --kv-transfer-config "
                               "'{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\"}'", "llama-3.1-8b")
    assert not any("no effect on the workspace" in n for n in d.notes)
    assert any(n.startswith("--kv-transfer-config: a KV connector's external hit") and n.endswith("may be too high")
               for n in d.notes)


def test_a_deployment_records_value_source_and_kind_tagged_notes_per_field():
    from tqlab.core.notes import Note, NoteKind

    d = deployment_from_vllm("vllm serve M --enable-lora", MODEL)
    rec = d.fields["max_num_batched_tokens"]
    assert (rec.value, rec.source) == (2048, d.sources["max_num_batched_tokens"]) == (
        2048, "vLLM default (`vllm serve` on a GPU under 70 GiB; GPU size assumed, pass --gpu-memory-gib)")
    (defaulted,) = rec.notes
    assert isinstance(defaulted, Note) and (defaulted.kind, defaulted.field) == (NoteKind.DEFAULTED, "max_num_batched_tokens")
    assert defaulted.to_dict()["kind"] == "defaulted" and str(defaulted).startswith("max_num_batched_tokens not given")
    assert [str(n) for n in d.notes_of(NoteKind.IGNORED)] == ["vLLM flags with no effect on the workspace: --enable-lora"]
    assert all(isinstance(n, Note) for n in d.notes)
    assert set(d.fields) == set(d.sources) and all(r.value == getattr(d.config, k) for k, r in d.fields.items())
    assert (d.fields["tensor_parallel_size"].value, d.fields["tensor_parallel_size"].source) == (1, "vLLM default")


@pytest.mark.parametrize("dtype", ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head",
                                   "nvfp4", "turboquant_4bit_nc"])
def test_every_modelled_kv_cache_dtype_is_read(dtype):
    from tqlab.core.config import is_turboquant

    d = deployment_from_vllm(f"vllm serve M --kv-cache-dtype {dtype}", MODEL)
    assert d.config.kv_cache_dtype == dtype and d.sources["kv_cache_dtype"] == "flag --kv-cache-dtype"
    assert d.config.has_turboquant_consumers is is_turboquant(dtype)
    assert d.config.num_hidden_layers == (28 if is_turboquant(dtype) else 32)  # boundary layers: TurboQuant only


@pytest.mark.parametrize("dtype, why", [
    ("fp8_ds_mla", "is refused by vLLM 0.33 for this model: an MLA-only layout"),
    ("ultraquant_4bit", "is not modelled: .*subclasses TurboQuant"),
    ("fp9", "is not a cache dtype vLLM 0.33 accepts: auto, float16")])
def test_an_unmodelled_kv_cache_dtype_is_one_line_naming_the_flag(dtype, why):
    with pytest.raises(VllmArgsError, match=f"--kv-cache-dtype '{dtype}' {why}"):
        deployment_from_vllm(f"vllm serve M --kv-cache-dtype {dtype}", MODEL)
