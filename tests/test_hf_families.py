"""issue 33: config families vLLM 0.33 reads through transformers' attribute maps (DBRX, MPT, GPT-2, GPTBigCode)
and vLLM's convertors (DBRX attn_config.kv_n_heads, Nemotron-NAS block_configs), replayed. Before: each was
refused as "num_attention_heads missing" (Nemotron-NAS: 64 KV heads instead of 8). The same configs are checked
against vLLM's and transformers' own readers in parity/test_config_readers_parity.py."""

from __future__ import annotations

import json

import pytest

from tqlab.vllm.hf_config import HFConfigError, read_hf_config

DBRX = {"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
        "attn_config": {"kv_n_heads": 8}}
NAS = {"model_type": "nemotron-nas", "hidden_size": 8192, "num_attention_heads": 64, "num_hidden_layers": 2,
       "max_position_embeddings": 131072,
       "block_configs": [{"attention": {"no_op": True}}, {"attention": {"no_op": False, "n_heads_in_group": 8}}]}


def _shape(cfg):
    s = read_hf_config(cfg)
    return s.num_attention_heads, s.num_key_value_heads, s.head_dim, s.num_hidden_layers, s.max_len


@pytest.mark.parametrize("cfg, want", [
    (DBRX, (48, 8, 128, 40, 32768)),
    ({**DBRX, "attn_config": {}}, (48, 1, 128, 40, 32768)),  # DbrxAttentionConfig: kv_n_heads defaults to 1
    ({"model_type": "dbrx"}, (16, 1, 128, 24, 2048)),  # DbrxConfig defaults
    ({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "max_seq_len": 2048}, (32, 32, 128, 32, 2048)),
    ({"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024}, (25, 25, 64, 48, 1024)),
    ({"model_type": "gpt2"}, (12, 12, 64, 12, 1024)),  # GPT2Config defaults
    ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "n_positions": 8192},
     (48, 1, 128, 40, 8192)),  # multi_query defaults to True: one KV head
    ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "multi_query": False},
     (48, 48, 128, 40, 1024)),
    ({"model_type": "gpt_bigcode", "n_head": 48, "n_embd": 6144, "num_key_value_heads": 8}, (48, 8, 128, 12, 1024)),
    (NAS, (64, 8, 128, 2, 131072)),
], ids=["dbrx", "dbrx-kv-default", "dbrx-defaults", "mpt", "gpt2", "gpt2-defaults", "bigcode-mq", "bigcode-mha",
        "bigcode-kv-key", "nemotron-nas"])
def test_family_is_read_as_vllm_reads_it(cfg, want):
    assert _shape(cfg) == want


def test_sources_name_the_family_key():
    s = read_hf_config(DBRX)
    assert s.sources["num_attention_heads"] == "config.json n_heads (DBRX, transformers DbrxConfig: num_attention_heads is n_heads)"
    assert s.sources["num_key_value_heads"] == "config.json attn_config.kv_n_heads (vLLM DbrxModelArchConfigConvertor)"
    s = read_hf_config({**NAS, "block_configs": [*NAS["block_configs"], {"attention": {"n_heads_in_group": 16}}]})
    assert s.sources["num_key_value_heads"] == (
        "derived: num_attention_heads // block_configs[1].attention.n_heads_in_group = 64 // 8 (vLLM "
        "NemotronNasModelArchConfigConvertor: the first attention block); other blocks use n_heads_in_group [16], "
        "which it ignores")


def test_hf_overrides_go_through_the_attribute_map():
    s = read_hf_config(DBRX, hf_overrides={"num_attention_heads": 64})  # PreTrainedConfig.update -> n_heads
    assert (s.num_attention_heads, s.head_dim) == (64, 96)
    assert read_hf_config(DBRX, hf_overrides={"attn_config": {"kv_n_heads": 4}}).num_key_value_heads == 4


@pytest.mark.parametrize("cfg, msg", [
    ({**DBRX, "attn_config": 8}, "attn_config must be an object, got 8"),
    ({**DBRX, "attn_config": {"kv_n_heads": 0}}, "attn_config.kv_n_heads must be >= 1, got 0"),
    ({**NAS, "block_configs": "x"}, "block_configs must be a list of block objects (Nemotron-NAS), got 'x'"),
    ({**NAS, "block_configs": [{"attention": {"no_op": True}}]},
     "block_configs has no attention block (every attention is no_op): vLLM cannot determine the number of KV heads"),
    ({**NAS, "block_configs": [{"attention": {"no_op": False}}]},
     "block_configs[0].attention.n_heads_in_group is missing or null"),
    ({**NAS, "block_configs": [{"ffn": {}}]}, "block_configs[0].attention must be an object, got None"),
    ({"model_type": "gpt2", "n_head": "x"}, "n_head must be an integer, got 'x'"),  # the key the file spells
    ({"model_type": "gpt2", "num_attention_heads": 0}, "num_attention_heads must be >= 1, got 0"),
    ({"model_type": "dbrx", "n_heads": 48, "d_model": 6001}, "d_model (6001) is not divisible by num_attention_heads "
     "(48); give head_dim"),
])
def test_a_bad_family_field_is_one_line_naming_the_file(tmp_path, cfg, msg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(HFConfigError) as e:
        read_hf_config(p)
    assert str(e.value) == f"{p}: {msg}"
