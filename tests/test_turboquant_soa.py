"""The in-block SoA prototypes of issue 20 (``benchmarks/_tq_soa.py``): the byte permutation keeps
every byte, and both prototype decode kernels give the torch reference decode of the same cache in
vLLM's slot order (Triton's interpreter on CPU, natively with CUDA; the ``prmt`` table on the GPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tqlab.turboquant import TQ_PRESETS, decode_attention, kv_cache_shape, store_kv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _tq_soa

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROTATED = ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"]


def _cache(spec, d=64, hk=2, bs=16, nb=12, seed=5):
    g = torch.Generator().manual_seed(seed)
    n = nb * bs
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=DEV)
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV), (torch.randn(n, hk, d, generator=g) * 2 + 0.5).to(DEV),
             torch.randperm(n, generator=g).to(DEV), spec, backend="torch")
    return cache


@pytest.mark.parametrize("name", ROTATED)
def test_aos_to_soa_places_each_field_of_a_block_contiguously(name):
    spec = TQ_PRESETS[name]
    d, bs = 64, 16
    cache = _cache(spec, d=d)
    soa = _tq_soa.aos_to_soa(cache, spec, d)
    assert soa.shape == cache.shape
    region = soa.reshape(cache.shape[0], cache.shape[1], -1)
    kb, vb, off = spec.key_index_bytes(d), spec.value_index_bytes(d), spec.offsets(d)
    assert torch.equal(region[..., : bs * kb].reshape(cache.shape[:3] + (kb,)), cache[..., :kb])
    vals = region[..., bs * kb: bs * (kb + vb)].reshape(cache.shape[:3] + (vb,))
    assert torch.equal(vals, cache[..., off["val_idx"]: off["val_idx"] + vb])
    zeros = region[..., bs * (kb + vb + 4): bs * (kb + vb + 6)].reshape(cache.shape[:3] + (2,))
    assert torch.equal(zeros, cache[..., off["val_zero"]: off["val_zero"] + 2])


@pytest.mark.parametrize("x32", [False, True])
@pytest.mark.parametrize("name", ROTATED)
def test_soa_decode_matches_reference(name, x32):
    """Empty request, fewer tokens than splits, several tiles, shuffled blocks, GQA 4; every
    output element written (NaN-poisoned before)."""
    spec = TQ_PRESETS[name]
    d, hq = 64, 8
    cache = _cache(spec, d=d)
    g = torch.Generator().manual_seed(9)
    bt = torch.stack([torch.randperm(12, generator=g) for _ in range(3)]).to(torch.int32).to(DEV)
    q = torch.randn(3, hq, d, generator=g).to(DEV)
    seq_lens = torch.tensor([0, 5, 171], device=DEV)
    mid0 = torch.empty(3, hq, 4, d + 1, device=DEV)
    o0, l0 = torch.empty(3, hq, d, device=DEV), torch.empty(3, hq, device=DEV)
    decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid0, o0, l0, backend="torch")
    mid = torch.full_like(mid0, float("nan"))
    o1, l1 = torch.full_like(o0, float("nan")), torch.full_like(l0, float("nan"))
    _tq_soa.decode_soa(q, _tq_soa.aos_to_soa(cache, spec, d), bt, seq_lens, spec, d**-0.5, mid, o1, l1,
                       block_t=16, x32=x32)
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.allclose(o0, o1, atol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=2e-3)
