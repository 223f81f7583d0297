"""tqlab.predict.kv_pool: the KV pool one GPU holds and the workspace's share of it (vLLM 0.33's rules)."""

from __future__ import annotations

import pytest

from tqlab.attention import kv_cache_bytes_per_token
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.predict.kv_pool import boundary_layers, kv_pool

GiB = 2**30


@pytest.mark.parametrize(("layers", "hybrid", "want"), [(32, False, 4), (3, False, 2), (2, False, 2), (1, False, 0),
                                                        (8, True, 0)])
def test_boundary_layers_follow_get_boundary_skip_layers(layers, hybrid, want):
    # TurboQuantConfig.get_boundary_skip_layers: first and last min(2, L // 2) layers, deduplicated; [] for hybrids
    assert boundary_layers(layers, hybrid=hybrid) == want


def test_llama_pool_on_one_h200_keeps_four_layers_in_bf16():
    c = EngineConfig.from_preset("llama-3.1-8b")
    k = kv_pool(c)
    weights = 8_030_261_248 * 2
    assert k.weight_bytes == weights and k.activation_bytes == GiB
    assert k.pool_bytes == int(0.92 * int(139.8 * GiB)) - weights - GiB
    assert (k.turboquant_layers, k.boundary_layers) == (28, 4)
    tq_layer = kv_cache_bytes_per_token(c.replace(num_hidden_layers=1))
    assert k.bytes_per_token == 28 * tq_layer + 4 * (2 * 8 * 128 * 2)  # K and V, 8 KV heads, bf16
    assert k.tokens == k.pool_bytes // k.bytes_per_token
    assert k.share == plan_bytes(reservation_plan(c)) / k.pool_bytes
    # the old denominator, max_num_seqs x max_model_len tokens, is far beyond one GPU
    assert kv_cache_bytes_per_token(c) * c.max_model_len * c.max_num_seqs > 1000 * GiB > k.pool_bytes


def test_hybrid_keeps_every_attention_layer_turboquant():
    k = kv_pool(EngineConfig.from_preset("nemotron-3-super-120b-a12b"), gpu="A4000")
    assert (k.turboquant_layers, k.boundary_layers) == (8, 0)
    assert k.weight_bytes == 120_000_000_000 // 2 // 8


def test_bad_inputs_are_refused_by_name():
    c = EngineConfig.from_preset("llama-3.1-8b")
    with pytest.raises(ValueError, match="utilization"):
        kv_pool(c, utilization=1.5)
    with pytest.raises(ValueError, match="no KV pool"):
        kv_pool(c, gpu="A4000")  # 16 GB of weights on a 16 GB card
    with pytest.raises(ValueError, match="no preset"):
        kv_pool(EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128))
    assert kv_pool(EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128), weight_bytes=0).assumed == (
        "activation peak assumed 1.0 GiB",)
