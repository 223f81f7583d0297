"""The architecture -> consumers table against the installed vLLM, and the fused-MoE rows of the families that
name their experts ``num_local_experts`` against vLLM's own experts class (issue 30).

* ``data/vllm_0_33_arch_consumers.json`` equals a fresh ``parity/gen_arch_consumers.py`` run over the installed
  ``vllm`` package (provenance aside);
* Mixtral and openai/privacy-filter (gpt-oss's ``MLPBlock``) configs: the row tqlab predicts from the config.json
  equals the ``get_simultaneous`` call of ``FusedMoEKernelModularImpl._allocate_buffers`` with ``TritonExperts`` (the
  class vLLM 0.33's unquantized oracle picks on SM90, ``fused_moe/oracle/unquantized.py``) at
  ``M = max_num_batched_tokens``, with the expert count, top-k, sizes and activation read the way the vLLM
  model class reads them (``mixtral.py`` ``MixtralDecoderLayer``; ``gpt_oss.py`` ``MLPBlock``: ``swigluoai``).
"""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path
from unittest import mock

import pytest
from tqlab.core.dtypes import as_torch
import torch

from tqlab.core.consumers.arch_table import DATA_DIR
from tqlab.vllm.deployment import deployment_from_vllm

ROOT = Path(__file__).resolve().parents[1]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def get_simultaneous(self, *specs):
        self.calls.append(tuple((tuple(s), d) for s, d in specs))
        return [torch.empty(s, dtype=as_torch(d), device="meta") for s, d in specs]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_arch_consumers", ROOT / "parity" / "gen_arch_consumers.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_arch_table_is_up_to_date_with_the_installed_vllm(record):
    import vllm

    gen = _gen()
    root = Path(vllm.__file__).parent
    fresh = gen.generate(root)
    committed = json.loads(gen.out_path(fresh["vllm_version"]).read_text(encoding="utf-8"))
    assert gen.out_path(fresh["vllm_version"]).parent == DATA_DIR
    for key, value in fresh.items():
        assert committed[key] == value, f"{key} differs: re-run python parity/gen_arch_consumers.py"
    record("arch_table_architectures", len(fresh["architectures"]))


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4,
           "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
PRIVACY_FILTER = {"architectures": ["OpenAIPrivacyFilterForTokenClassification"], "model_type": "openai_privacy_filter",
                  "hidden_size": 640, "intermediate_size": 640, "head_dim": 64, "num_attention_heads": 14,
                  "num_key_value_heads": 2, "num_hidden_layers": 8, "num_local_experts": 128, "num_experts_per_tok": 4,
                  "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("cfg, activation, args", [
    (MIXTRAL, "SILU", "vllm serve m"),
    (MIXTRAL, "SILU", "vllm serve m --max-num-batched-tokens 2048 -tp 2"),
    (PRIVACY_FILTER, "SWIGLUOAI", "vllm serve m"),
    (PRIVACY_FILTER, "SWIGLUOAI", "vllm serve m --max-num-batched-tokens 512"),
])
def test_num_local_experts_configs_get_vllms_triton_experts_bytes(cfg, activation, args):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    engine = deployment_from_vllm(args, cfg, gpu="H200").config
    (row,) = [r for r in engine_rows(engine) if r.name == "fused_moe"]
    hf = types.SimpleNamespace(**cfg)  # the attributes the model class reads (FusedMoEFactory's arguments)
    act = MoEActivation[activation]
    tp, m = engine.tensor_parallel_size, engine.max_num_batched_tokens
    n = (2 if act.is_gated else 1) * hf.intermediate_size // tp
    impl = object.__new__(mk.FusedMoEKernelModularImpl)
    impl.fused_experts = object.__new__(TritonExperts)
    impl.prepare_finalize = types.SimpleNamespace(allocate_fused_expert_output=lambda *a: None)
    rec = _Recorder()
    with mock.patch.object(mk, "current_workspace_manager", lambda: rec), \
         mock.patch.object(mk.current_platform, "is_cpu", lambda: False):
        impl._allocate_buffers(torch.bfloat16, torch.device("meta"), m, m, n, hf.hidden_size, hf.num_experts_per_tok,
                               hf.num_local_experts, hf.num_local_experts // tp, None, act)
    from tqlab.core.consumers.base import call_bytes

    (call,) = rec.calls
    assert row.reserved_bytes == call_bytes(call) and row.phase == "profile_run"


def engine_rows(engine):
    from tqlab.predict.analysis import consumer_table

    return consumer_table(engine).rows
