"""config.json readers: vLLM 0.33's own functions vs ``tqlab.vllm.hf_config.read_hf_config`` (issue 22).

For each config.json (written to a temporary folder), vLLM's side is what ``ModelConfig.__post_init__``
does on CPU without a tokenizer: ``get_config`` (vLLM's config classes: ``ChatGLMConfig``,
``RWConfig``, transformers' ``FalconConfig``...; flat ``--hf-overrides`` through
``PreTrainedConfig.update``), ``ModelConfig._apply_dict_overrides`` for dict overrides,
``get_hf_text_config``, the model type's ``ModelArchConfigConvertor`` (``get_total_num_kv_heads``,
``get_num_hidden_layers``, ``get_head_size``, ``derive_max_model_len_and_key``; what
``ModelConfig.get_total_num_kv_heads`` / ``get_num_layers`` return) and ``_get_and_verify_max_len``
(the default ``max_model_len``, and whether an explicit one is accepted). Also: Nemotron-H's float32
SSM-state default (``MODELS_CONFIG_MAP`` -> ``NemotronHForCausalLMConfig``) and pydantic's lax int
vs ``tqlab.vllm.flags.lax_int``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tqlab.vllm.flags import VllmArgsError, lax_int
from tqlab.vllm.hf_config import read_hf_config

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072, "vocab_size": 128256}
CHATGLM = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": 28, "hidden_size": 4096,
           "num_attention_heads": 32, "multi_query_attention": True, "multi_query_group_num": 2, "seq_length": 32768,
           "kv_channels": 128, "padded_vocab_size": 65024}
FALCON = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
          "num_hidden_layers": 32, "multi_query": True, "new_decoder_architecture": False}
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "vocab_size": 32064,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}

DBRX = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
        "max_seq_len": 32768, "vocab_size": 100352, "tie_word_embeddings": False,
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}}
MPT = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
       "max_seq_len": 2048, "vocab_size": 50432}
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48,
        "n_positions": 1024, "vocab_size": 50257}
BIGCODE = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48,
           "n_layer": 40, "n_positions": 8192, "multi_query": True, "vocab_size": 49152}

CASES = {  # name: (config.json, hf_overrides or None)
    "llama": (LLAMA, None),
    "chatglm": (CHATGLM, None),
    "chatglm-no-groups": ({k: v for k, v in CHATGLM.items() if k != "multi_query_group_num"}, None),
    "chatglm-override-layers": (CHATGLM, {"num_hidden_layers": 4}),
    "falcon-7b": (FALCON, None),
    "falcon-40b": ({**FALCON, "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                    "num_kv_heads": 8, "new_decoder_architecture": True}, None),
    "falcon-n_head_kv": ({**FALCON, "hidden_size": 8192, "num_attention_heads": 128, "n_head_kv": 8,
                          "new_decoder_architecture": True}, None),
    "falcon-no-multi-query": ({**FALCON, "multi_query": False}, None),
    "refinedweb-40b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWeb", "hidden_size": 8192,
                        "n_head": 128, "n_head_kv": 8, "n_layer": 60}, None),
    "refinedweb-7b": ({"architectures": ["RWForCausalLM"], "model_type": "RefinedWebModel", "hidden_size": 4544,
                       "n_head": 71, "n_layer": 32, "multi_query": True}, None),
    "command-r": ({"architectures": ["CohereForCausalLM"], "model_type": "cohere", "hidden_size": 8192,
                   "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 40,
                   "max_position_embeddings": 8192, "model_max_length": 131072, "vocab_size": 256000}, None),
    "phi-3-128k-longrope": (PHI3, None),
    "rope-dynamic-x4": ({**LLAMA, "max_position_embeddings": 8192,
                         "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, None),
    "rope-yarn-x4": ({**LLAMA, "max_position_embeddings": 32768,
                      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}},
                     None),
    "rope-llama3": ({**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
                    None),
    "override-kv-heads": (LLAMA, {"num_key_value_heads": 4}),
    "override-max-position": (LLAMA, {"max_position_embeddings": 8192}),
    "override-rope-dict": ({**LLAMA, "max_position_embeddings": 8192},
                           {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    # issue 33: families read through transformers' attribute_map (and DBRX's convertor)
    "dbrx": (DBRX, None),
    "dbrx-no-kv_n_heads": ({**DBRX, "attn_config": {"clip_qkv": 8}}, None),
    "dbrx-no-attn_config": ({k: v for k, v in DBRX.items() if k != "attn_config"}, None),
    "dbrx-override-heads": (DBRX, {"num_attention_heads": 64}),
    "mpt-7b": (MPT, None),
    "mpt-defaults": ({"architectures": ["MPTForCausalLM"], "model_type": "mpt"}, None),
    "gpt2": (GPT2, None),
    "gpt2-defaults": ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, None),
    "gpt2-override-positions": (GPT2, {"max_position_embeddings": 512}),
    "gpt_bigcode": (BIGCODE, None),
    "gpt_bigcode-multi-head": ({**BIGCODE, "multi_query": False}, None),
    "gpt_bigcode-no-multi_query-key": ({k: v for k, v in BIGCODE.items() if k != "multi_query"}, None),
    "gpt_bigcode-kv-key-ignored": ({**BIGCODE, "num_key_value_heads": 8}, None),
}
LENGTHS = (2048, 4096, 8192, 16384, 32768, 131072, 131073, 262144)


def _write(tmp_path, cfg) -> str:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def vllm_reads(path: str, overrides: dict | None) -> dict:
    """What vLLM 0.33 derives from the config.json in ``path`` (with ``--hf-overrides`` ``overrides``)."""
    import vllm.config  # noqa: F401  (vLLM's own import order: config before transformers_utils)
    from vllm.config.model import ModelConfig, _get_and_verify_max_len
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    overrides = overrides or {}
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in overrides.items() if isinstance(v, dict)}
    hf = get_config(path, trust_remote_code=False, hf_overrides_kw=flat or None)
    if nested:  # ModelConfig._apply_dict_overrides on a stand-in self (it only calls _update_nested)
        me = SimpleNamespace()
        me._update_nested = lambda target, upd: ModelConfig._update_nested(me, target, upd)
        ModelConfig._apply_dict_overrides(me, hf, nested)
    text = get_hf_text_config(hf)
    arch = MODEL_ARCH_CONFIG_CONVERTORS.get(hf.model_type, ModelArchConfigConvertorBase)(hf, text).convert()

    def accepted(n: int) -> bool:
        try:
            _get_and_verify_max_len(text, arch, None, n, False, None)
        except ValueError:
            return False
        return True

    return {"kv_heads": arch.total_num_kv_heads, "layers": arch.total_num_hidden_layers, "head_dim": arch.head_size,
            "default_max_model_len": _get_and_verify_max_len(text, arch, None, None, False, None),
            "accepted": [n for n in LENGTHS if accepted(n)]}


def tqlab_reads(path: str, overrides: dict | None) -> dict:
    s = read_hf_config(path, hf_overrides=overrides)
    ok = [n for n in LENGTHS if s.max_len_key is None or n <= s.longest_max_model_len
          or (s.model_max_length is not None and n <= s.model_max_length)]
    return {"kv_heads": s.num_key_value_heads, "layers": s.num_hidden_layers, "head_dim": s.head_dim,
            "default_max_model_len": s.max_len, "accepted": ok}


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_readers_equal_vllms(name, tmp_path, monkeypatch, record):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    cfg, overrides = CASES[name]
    path = _write(tmp_path, cfg)
    theirs, ours = vllm_reads(path, overrides), tqlab_reads(path, overrides)
    record("vllm", theirs)
    assert ours == theirs


def test_nemotron_h_float32_ssm_default_is_keyed_on_the_architecture():
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, NemotronHForCausalLMConfig

    base = {"num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 6,
            "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4}
    kinds = {"M": "mamba", "*": "attention", "E": "moe"}
    for arch in ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "SomeMamba2Hybrid"):
        for spelling in ({"hybrid_override_pattern": "M*EM*E"}, {"layers_block_type": [kinds[c] for c in "M*EM*E"]}):
            cfg = {"architectures": [arch], **base, **spelling}
            cache = SimpleNamespace(mamba_ssm_cache_dtype="auto")
            if MODELS_CONFIG_MAP.get(arch) is NemotronHForCausalLMConfig:
                NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache,
                                                                        hf_config=SimpleNamespace(**cfg))
            want = None if cache.mamba_ssm_cache_dtype == "auto" else cache.mamba_ssm_cache_dtype
            assert read_hf_config(cfg).mamba.ssm_dtype == want, (arch, spelling)


LAX = [3, 3.0, "3", " 3 ", "+3", "-3", "1_000", "3.0", True, False, 2.5, "3.5", "x", "1k", "1e3", "0x10", "", None,
       [1], float("inf"), float("nan"), "1__0", "_1", "1_", "٣", 2**70]


def test_lax_int_equals_pydantics_lax_int():
    from pydantic import TypeAdapter, ValidationError

    ta = TypeAdapter(int)
    for v in LAX:
        try:
            want = ta.validate_python(v)
        except ValidationError:
            want = "error"
        try:
            got = lax_int(v, "x")
        except VllmArgsError:
            got = "error"
        assert got == want, v


NAS_BLOCKS = [  # Llama-3.3-Nemotron-Super-49B style: a no_op attention block first, then grouped attention
    {"attention": {"no_op": True, "replace_with_linear": False, "n_heads_in_group": None}, "ffn": {"no_op": False}},
    {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 8}, "ffn": {"no_op": False}},
    {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 16}, "ffn": {"no_op": False}},
]


@pytest.mark.parametrize("blocks", [NAS_BLOCKS, NAS_BLOCKS[1:], NAS_BLOCKS[:1]], ids=["no_op-first", "grouped", "all-no_op"])
def test_nemotron_nas_kv_heads_equal_vllms_convertor(blocks):
    """vLLM 0.33 ``NemotronNasModelArchConfigConvertor.get_total_num_kv_heads`` on the block objects the
    remote-code ``DeciLMConfig`` makes (attribute access: stand-ins), vs tqlab on the same config.json."""
    from vllm.transformers_utils.model_arch_config_convertor import NemotronNasModelArchConfigConvertor

    from tqlab.vllm.hf_config import HFConfigError

    cfg = {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 8192,
           "num_attention_heads": 64, "num_hidden_layers": len(blocks), "max_position_embeddings": 131072,
           "block_configs": blocks}
    ns = SimpleNamespace(num_attention_heads=64, architectures=cfg["architectures"], block_configs=[
        SimpleNamespace(attention=SimpleNamespace(**b["attention"]), ffn=SimpleNamespace(**b["ffn"])) for b in blocks])
    try:
        want = NemotronNasModelArchConfigConvertor(ns, ns).get_total_num_kv_heads()
    except RuntimeError as e:
        assert "Could not determine the number of key-value attention heads" in str(e)
        with pytest.raises(HFConfigError, match="has no attention block"):
            read_hf_config(cfg)
        return
    assert read_hf_config(cfg).num_key_value_heads == want == 8
