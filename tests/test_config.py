"""EngineConfig (tqlab/core/config.py) and the presets in data/presets/: defaults, validation, TP rule, facts."""

from __future__ import annotations

import json

import pytest
import torch

from tqlab.core import dtypes
from tqlab.core.config import KV_CACHE_DTYPES, PRESET_DIR, EngineConfig, list_presets, load_preset, parse_dtype

NEMOTRON = "nemotron-3-super-120b-a12b"
PR_TEST = "pr-44053-unit-test"
HEADS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)


# --------------------------------------------------------------------------- #
# Defaults and validation                                                     #
# --------------------------------------------------------------------------- #


def test_defaults_match_the_issue_and_vllm():
    c = EngineConfig(**HEADS)
    assert (c.num_hidden_layers, c.tensor_parallel_size) == (1, 1)
    assert (c.max_model_len, c.max_num_seqs, c.max_num_batched_tokens) == (8192, 256, 8192)
    assert c.enable_chunked_prefill is True
    assert c.block_size == 16
    assert c.dtype is dtypes.bfloat16 and c.torch_dtype is torch.bfloat16
    assert c.kv_cache_dtype == "auto"
    assert c.tq_max_kv_splits_for_cuda_graph == 32
    assert c.enable_dbo is False and c.num_ubatches == 1
    assert c.enforce_eager is False
    assert EngineConfig(**HEADS, enable_dbo=True).num_ubatches == 2


@pytest.mark.parametrize("missing", ["num_attention_heads", "num_key_value_heads", "head_dim"])
def test_the_three_head_numbers_are_required(missing):
    kw = {k: v for k, v in HEADS.items() if k != missing}
    with pytest.raises(TypeError, match=missing):
        EngineConfig(**kw)


def test_kv_cache_dtypes():
    """vLLM 0.33's CacheDType less the MLA-only layouts and ultraquant_4bit; only the TurboQuant four are TurboQuant."""
    from tqlab.core.config import TURBOQUANT_KV_CACHE_DTYPES, VLLM_CACHE_DTYPES

    assert len(VLLM_CACHE_DTYPES) == 22 and set(VLLM_CACHE_DTYPES) - set(KV_CACHE_DTYPES) == {
        "fp8_ds_mla", "nvfp4_ds_mla", "ultraquant_4bit"}
    assert KV_CACHE_DTYPES[:6] == ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
    assert TURBOQUANT_KV_CACHE_DTYPES == (
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
    for kv in KV_CACHE_DTYPES:
        c = EngineConfig(**HEADS, kv_cache_dtype=kv)
        assert c.is_turboquant == c.has_turboquant_consumers == kv.startswith("turboquant_")
    teach = EngineConfig(**HEADS, turboquant_backend_on_unquantized=True)
    assert (teach.is_turboquant, teach.has_turboquant_consumers) == (False, True)
    with pytest.raises(ValueError, match="turboquant_backend_on_unquantized .* needs kv_cache_dtype 'auto', got 'fp8'"):
        EngineConfig(**HEADS, kv_cache_dtype="fp8", turboquant_backend_on_unquantized=True)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
        ("float16", torch.float16), ("fp16", torch.float16), ("half", torch.float16), ("FLOAT16", torch.float16),
        ("float32", torch.float32), ("fp32", torch.float32), ("float", torch.float32),
        (torch.float16, torch.float16), (torch.float32, torch.float32),
    ],
)
def test_dtype_names_are_accepted(name, expected):
    # the torch-free stand-in (issue 30: plan and inspect-vllm never import torch), equal to torch's dtype
    assert parse_dtype(name) is dtypes.standin(expected) and parse_dtype(name) == expected
    c = EngineConfig(**HEADS, dtype=name)
    assert type(c.dtype) is dtypes.DType and c.dtype == expected and c.torch_dtype is expected


@pytest.mark.parametrize("bad", ["int8", torch.int8, torch.float64, None, 16, "float8"])
def test_bad_dtype_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(**HEADS, dtype=bad)


INT_FIELDS = [
    "num_hidden_layers", "tensor_parallel_size", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "block_size", "tq_max_kv_splits_for_cuda_graph",
]


@pytest.mark.parametrize("field", INT_FIELDS + ["num_attention_heads", "num_key_value_heads", "head_dim"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8", None])
def test_int_fields_reject_non_positive_and_non_int(field, bad):
    kw = dict(HEADS, max_num_seqs=1, max_num_batched_tokens=8192)
    kw[field] = bad
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kw)


@pytest.mark.parametrize("field", ["enable_chunked_prefill", "enable_dbo", "enforce_eager"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_bool_fields_reject_non_bools(field, bad):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**HEADS, **{field: bad})


@pytest.mark.parametrize("bad", ["fp8_ds_mla", "ultraquant_4bit", "turboquant", "TURBOQUANT_K8V4", None])
def test_bad_kv_cache_dtype(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(**HEADS, kv_cache_dtype=bad)


@pytest.mark.parametrize(
    "hq, hk, tp, pattern",
    [
        (32, 8, 3, r"num_attention_heads \(32\) must be divisible by tensor_parallel_size \(3\)"),
        (32, 5, 1, r"num_attention_heads \(32\) must be a multiple of num_key_value_heads \(5\)"),
        (24, 6, 4, r"num_key_value_heads \(6\) must be divisible by tensor_parallel_size \(4\)"),
        (12, 3, 4, r"tensor_parallel_size \(4\) must be a multiple of num_key_value_heads \(3\)"),
    ],
)
def test_tensor_parallel_rule_violations(hq, hk, tp, pattern):
    with pytest.raises(ValueError, match=pattern):
        EngineConfig(num_attention_heads=hq, num_key_value_heads=hk, head_dim=64, tensor_parallel_size=tp)


def test_scheduler_limits_are_validated():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8\) must be >= max_num_seqs \(16\)"):
        EngineConfig(**HEADS, max_num_seqs=16, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match=r"without chunked prefill.*4096.*8192"):
        EngineConfig(**HEADS, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    c = EngineConfig(**HEADS, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    assert c.enable_chunked_prefill is False


def test_mamba_block_aligned_split_is_validated():
    with pytest.raises(ValueError, match=r"needs enable_chunked_prefill: vLLM 0.33 asserts 'Chunked prefill is required"):
        EngineConfig(**HEADS, enable_chunked_prefill=False, max_num_batched_tokens=8192, mamba_block_aligned_split=True)
    with pytest.raises(ValueError, match=r"block_size \(2080\) > the prefill chunk \(2048 tokens per step\)"):
        EngineConfig(**HEADS, block_size=2080, max_num_batched_tokens=2048, mamba_block_aligned_split=True)
    with pytest.raises(ValueError, match=r"block_size \(2080\) > the prefill chunk \(1024 tokens per step\)"):
        EngineConfig(**HEADS, block_size=2080, max_num_scheduled_tokens=1024, mamba_block_aligned_split=True)
    with pytest.raises(ValueError, match="max_num_scheduled_tokens must be None or an int >= 1, got 0"):
        EngineConfig(**HEADS, max_num_scheduled_tokens=0)
    assert EngineConfig(**HEADS, max_num_scheduled_tokens=10**6).chunk_budget == 8192  # capped by the batch
    with pytest.raises(ValueError, match=r"max_num_scheduled_tokens \(512\) < max_model_len \(8192\)"):
        EngineConfig(**HEADS, enable_chunked_prefill=False, max_num_scheduled_tokens=512)
    with pytest.raises(ValueError, match="mamba_block_aligned_split must be True or False, got 1"):
        EngineConfig(**HEADS, mamba_block_aligned_split=1)
    assert EngineConfig.from_preset("nemotron-3-super-120b-a12b").mamba_block_aligned_split is True
    assert EngineConfig.from_preset("llama-3.1-8b").mamba_block_aligned_split is False


@pytest.mark.parametrize("bad", [(), (0, 4), (1, 2.0), (True,), [-8]])
def test_bad_cudagraph_capture_sizes(bad):
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        EngineConfig(**HEADS, cudagraph_capture_sizes=bad)


def test_scalar_cudagraph_capture_sizes_names_the_field():
    with pytest.raises((ValueError, TypeError), match="cudagraph_capture_sizes"):
        EngineConfig(**HEADS, cudagraph_capture_sizes=5)


def test_capture_sizes_moved_to_analysis():
    # vLLM 0.33's capture sizes live in tqlab.predict.analysis.capture_sizes (tests/test_analysis.py); they are not
    # capped at max_num_seqs: the old EngineConfig.capture_sizes() dropped explicit 8 and 32 here, vLLM keeps them.
    from tqlab.predict.analysis import capture_sizes

    assert not hasattr(EngineConfig, "capture_sizes")
    c = EngineConfig(**HEADS, max_num_seqs=8, cudagraph_capture_sizes=[8, 2, 2, 32])
    assert c.cudagraph_capture_sizes == (2, 8, 32)
    assert capture_sizes(c) == (2, 8, 32)


def test_frozen_after_validation():
    import dataclasses

    c = EngineConfig(**HEADS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_num_seqs = 0  # type: ignore[misc]
    assert c.max_num_seqs == 256
    assert c.replace(max_num_seqs=8).max_num_seqs == 8
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        c.replace(max_num_seqs=0)


def test_vllm_033_capture_fields():
    c = EngineConfig(**HEADS)
    assert (c.num_speculative_tokens, c.cudagraph_mode, c.max_cudagraph_capture_size, c.lock_workspace_when_eager) == (
        0, None, None, False)
    assert c.uniform_decode_query_len == 1
    assert c.replace(num_speculative_tokens=3).uniform_decode_query_len == 4
    assert c.replace(cudagraph_mode="full_decode_only").cudagraph_mode == "FULL_DECODE_ONLY"


@pytest.mark.parametrize("kw, match", [
    (dict(num_speculative_tokens=-1), "num_speculative_tokens must be an int in \\[0, 127\\], got -1"),
    (dict(num_speculative_tokens=True), "num_speculative_tokens"),
    (dict(cudagraph_mode="FAST"), "cudagraph_mode must be None or one of .* got 'FAST'"),
    (dict(max_cudagraph_capture_size=0), "max_cudagraph_capture_size must be None or an int >= 1, got 0"),
    (dict(lock_workspace_when_eager="yes"), "lock_workspace_when_eager must be True or False, got 'yes'"),
])
def test_bad_vllm_033_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**HEADS, **kw)


def test_field_help_gives_meaning_and_unit():
    from tqlab.core.config import field_help

    assert "(tokens)" in field_help("max_num_batched_tokens")
    assert "1 + k" in field_help("num_speculative_tokens")
    assert "lock-on-eager" in field_help("lock_workspace_when_eager")


# --------------------------------------------------------------------------- #
# Per-rank heads: vLLM's TP rule                                              #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "hq, hk, tp, per_q, per_kv",
    [
        (32, 8, 1, 32, 8),
        (32, 8, 2, 16, 4),
        (32, 8, 8, 4, 1),
        (32, 8, 16, 2, 1),  # 8 KV heads on 16 ranks: each rank keeps 1 replicated head
        (32, 2, 8, 4, 1),  # the bug report: 2 KV heads on 8 ranks
        (32, 2, 2, 16, 1),
        (64, 8, 2, 32, 4),
        (64, 8, 8, 8, 1),
        (8, 8, 8, 1, 1),
        (32, 32, 4, 8, 8),  # MHA
    ],
)
def test_per_rank_heads(hq, hk, tp, per_q, per_kv):
    c = EngineConfig(num_attention_heads=hq, num_key_value_heads=hk, head_dim=128, tensor_parallel_size=tp)
    assert (c.num_heads_per_rank, c.num_kv_heads_per_rank) == (per_q, per_kv)


def test_kv_bytes_per_token_per_rank():
    c = EngineConfig(num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=32)
    assert c.kv_bytes_per_token_per_rank() == 2 * 8 * 128 * 32 * 2 == 131072  # Llama-3.1-8B: 128 KiB/token
    assert c.replace(tensor_parallel_size=2).kv_bytes_per_token_per_rank() == 65536
    assert c.replace(dtype="float32").kv_bytes_per_token_per_rank() == 262144


# --------------------------------------------------------------------------- #
# Presets                                                                     #
# --------------------------------------------------------------------------- #


def test_required_presets_exist_with_at_least_four_real_models():
    names = list_presets()
    assert NEMOTRON in names and PR_TEST in names
    others = [n for n in names if n not in (NEMOTRON, PR_TEST)]
    assert len(others) >= 4
    assert any(EngineConfig.from_preset(n).head_dim == 256 for n in others)


def _preset_params():
    for name in list_presets():
        yield pytest.param(name, id=name)


@pytest.mark.parametrize("name", list(_preset_params()))
def test_every_preset_is_valid_and_cites_its_source(name):
    raw = json.loads((PRESET_DIR / f"{name}.json").read_text())
    assert raw == load_preset(name)
    assert raw["name"] == name
    assert isinstance(raw["source"], str) and len(raw["source"]) > 20
    assert raw["title"]
    assert isinstance(raw["default_prompt_tokens"], int) and raw["default_prompt_tokens"] >= 1
    c = EngineConfig.from_preset(name)
    assert c.preset == name
    as_dict = c.to_dict()
    for k, v in raw["config"].items():
        got = as_dict[k] if k in ("mla", "indexer", "moe") else getattr(c, k)
        if isinstance(v, dict):  # only the fields the preset gives; the rest are the dataclass defaults
            got = {f: got[f] for f in v}
        assert (str(got).removeprefix("torch.") if k == "dtype" else got) == v
    # the default prompt plus one output token must be servable
    assert raw["default_prompt_tokens"] + 1 <= c.max_model_len


def test_nemotron_preset_is_the_bug_report_deployment():
    c = EngineConfig.from_preset(NEMOTRON)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_hidden_layers) == (32, 2, 128, 8)
    assert c.tensor_parallel_size == 8
    assert (c.max_num_seqs, c.max_model_len, c.max_num_batched_tokens) == (4, 131072, 4096)
    assert c.enable_chunked_prefill is True
    assert c.kv_cache_dtype == "turboquant_3bit_nc"
    assert c.dtype is dtypes.bfloat16 and c.torch_dtype is torch.bfloat16
    assert c.block_size == 16
    assert c.tq_max_kv_splits_for_cuda_graph == 32
    assert load_preset(NEMOTRON)["default_prompt_tokens"] == 8192
    # per rank: 32/8 = 4 query heads, 2 KV heads on 8 ranks -> 1 replicated
    assert (c.num_heads_per_rank, c.num_kv_heads_per_rank) == (4, 1)
    # 2 KV heads x 128 x 8 layers x 2 (K,V) x 2 bytes = the published 8 KiB/token (whole model, TP 1)
    assert EngineConfig.from_preset(NEMOTRON, tensor_parallel_size=1).kv_bytes_per_token_per_rank() == 8 * 1024
    # at TP 8 every rank holds one (replicated) KV head: 4 KiB/token per rank
    assert c.kv_bytes_per_token_per_rank() == 4 * 1024


def test_pr_44053_preset_is_the_fix_prs_unit_test():
    c = EngineConfig.from_preset(PR_TEST)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (8, 4, 128)
    assert c.tensor_parallel_size == 1
    assert (c.num_heads_per_rank, c.num_kv_heads_per_rank) == (8, 4)
    assert (c.max_num_seqs, c.block_size, c.max_model_len, c.max_num_batched_tokens) == (16, 32, 8192, 4096)
    assert c.tq_max_kv_splits_for_cuda_graph == 4
    assert c.dtype is dtypes.float16 and c.torch_dtype is torch.float16
    assert c.enable_chunked_prefill is True


@pytest.mark.parametrize(
    "name, hq, hk, d, layers",
    [
        ("llama-3.1-8b", 32, 8, 128, 32),
        ("qwen3-32b", 64, 8, 128, 64),
        ("mistral-nemo-12b", 32, 8, 128, 40),
        ("gemma-2-9b", 16, 8, 256, 42),
    ],
)
def test_popular_model_presets_match_their_config_json(name, hq, hk, d, layers):
    c = EngineConfig.from_preset(name)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_hidden_layers) == (hq, hk, d, layers)


def test_from_preset_overrides_apply_and_validate():
    base = EngineConfig.from_preset(NEMOTRON)
    c = EngineConfig.from_preset(NEMOTRON, max_model_len=8192, num_hidden_layers=2, dtype="fp16", enable_dbo=True)
    assert (c.max_model_len, c.num_hidden_layers, c.dtype, c.num_ubatches) == (8192, 2, torch.float16, 2)
    for f in ("num_attention_heads", "num_key_value_heads", "head_dim", "tensor_parallel_size", "max_num_seqs",
              "max_num_batched_tokens", "block_size", "kv_cache_dtype"):
        assert getattr(c, f) == getattr(base, f)
    assert c.preset == NEMOTRON
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(3\)"):
        EngineConfig.from_preset(NEMOTRON, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig.from_preset(NEMOTRON, max_num_seqs=0)


def test_from_preset_unknown_override_field_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="max_seq_len"):
        EngineConfig.from_preset(NEMOTRON, max_seq_len=4096)
    with pytest.raises(TypeError, match="bogus, max_seq_len"):
        EngineConfig.from_preset(NEMOTRON, max_seq_len=1, bogus=2)


@pytest.mark.parametrize("bad", ["nemotron", "llama-3.1-70b", "", None, 3])
def test_from_preset_unknown_name_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match=r"unknown preset .*known presets: .*" + NEMOTRON):
        EngineConfig.from_preset(bad)


def test_from_preset_rejects_names_with_paths():
    with pytest.raises(ValueError, match="unknown preset"):
        EngineConfig.from_preset(f"../presets/{NEMOTRON}")


def test_replace_and_to_dict_round_trip():
    c = EngineConfig.from_preset(PR_TEST)
    d = c.to_dict()
    assert d["dtype"] == "float16" and d["preset"] == PR_TEST
    assert EngineConfig(**d) == c
    r = c.replace(max_model_len=2048)
    assert r.max_model_len == 2048 and c.max_model_len == 8192
    with pytest.raises(TypeError, match="nope"):
        c.replace(nope=1)
    with pytest.raises(ValueError, match="block_size"):
        c.replace(block_size=0)
