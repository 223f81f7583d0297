"""The nibble-plane prototype of issue 20 (``benchmarks/dev_turboquant_planes.py``, not integrated):
its byte order round-trips every 3-bit code, its ``prmt`` asm gives the exact fp16 centroid / integer of
every code (checked by the PTX emulator of ``test_turboquant_triton``), and its cache conversion folds the
key norm as vLLM's SoA store does (``||k|| / ||c||``) while keeping every other byte."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # before anything imports triton (the benchmark module below does)
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

import dev_turboquant_planes as planes  # noqa: E402
from test_turboquant_triton import _ptx_emulate  # noqa: E402

from tqlab.turboquant import TQ_PRESETS, get_spec  # noqa: E402
from tqlab.turboquant.codebook import lloyd_max  # noqa: E402
from tqlab.turboquant.quant import to_cache_layout, unpack_indices  # noqa: E402


def test_planes_round_trip_and_word_layout():
    codes = torch.tensor(np.random.default_rng(1).integers(0, 8, (64, 128)), dtype=torch.uint8)
    by = planes.planes_from_codes(codes)
    assert by.shape == (64, 48)
    assert torch.equal(planes.codes_from_planes(by, 128), codes)
    one = torch.zeros(1, 32, dtype=torch.uint8)
    one[0, 9] = 0b101  # code 9 = 8*1 + 1: low bits at 4*1 + 2 of L0, high bit at 4*1 + 1 of H
    w = planes.planes_from_codes(one).view(torch.int32)[0].tolist()
    assert w == [0b01 << 6, 0, 1 << 5]


@pytest.mark.parametrize("table", ["keys", "values"])
def test_planes_asm_is_exact(table):
    spec = TQ_PRESETS["turboquant_3bit_nc"]
    if table == "keys":
        want = np.asarray(lloyd_max(3, 128).centroids, dtype=np.float16).view(np.uint16)
        asm = planes.planes_asm(planes.key_table(spec, 128))
    else:
        want = np.arange(8, dtype=np.float16).view(np.uint16)
        asm = planes.planes_asm(None)
    codes = torch.tensor(np.random.default_rng(2).integers(0, 8, (40, 32)), dtype=torch.uint8)
    words = planes.planes_from_codes(codes).view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    for t in range(40):
        l0, l1, h = (int(x) for x in words[t])
        a = _ptx_emulate(asm, {"$16": l0, "$17": (h << 2) & 0xFFFFFFFF})
        b = _ptx_emulate(asm, {"$16": l1, "$17": h})
        got = [a[f"${i}"] for i in range(16)] + [b[f"${i}"] for i in range(16)]
        assert got == want[codes[t].numpy()].tolist()


def test_to_planes_folds_the_norm_and_keeps_the_rest():
    from tqlab.turboquant import kv_cache_shape, store_kv

    spec = TQ_PRESETS["turboquant_3bit_nc"]
    soa = get_spec(spec, "block_soa")
    g = torch.Generator().manual_seed(3)
    cache = torch.zeros(kv_cache_shape(2, 1, 16, 128, spec), dtype=torch.uint8)
    k, v = torch.randn(32, 1, 128, generator=g), torch.randn(32, 1, 128, generator=g)
    store_kv(cache, k, v, torch.arange(32), spec, backend="torch")
    blocks = to_cache_layout(cache, soa, 128)
    out = planes.to_planes(blocks, spec, 128)
    fa = soa.field_addresses(128, 16)
    flat_in, flat_out = blocks.reshape(2, 1, -1), out.reshape(2, 1, -1)
    for kind in ("val_scale", "val_zero"):
        off, _, n = fa[kind]
        assert torch.equal(flat_in[..., off:off + 16 * n], flat_out[..., off:off + 16 * n])
    for kind in ("key_idx", "val_idx"):
        off, _, n = fa[kind]
        before = unpack_indices(flat_in[..., off:off + 16 * n].reshape(2, 1, 16, n), 3, 128)
        after = planes.codes_from_planes(flat_out[..., off:off + 16 * n].reshape(2, 1, 16, n), 128)
        assert torch.equal(before, after)
    off, _, _ = fa["key_norm"]
    norm = flat_in[..., off:off + 32].reshape(2, 1, 16, 2).contiguous().view(torch.float16)[..., 0].float()
    folded = flat_out[..., off:off + 32].reshape(2, 1, 16, 2).contiguous().view(torch.float16)[..., 0]
    koff, _, kn = fa["key_idx"]
    codes = unpack_indices(flat_in[..., koff:koff + 16 * kn].reshape(2, 1, 16, kn), 3, 128).long()
    cent = torch.tensor(list(lloyd_max(3, 128).centroids), dtype=torch.float32)
    want = (norm / cent[codes].pow(2).sum(-1).sqrt()).to(torch.float16)
    assert torch.equal(folded, want)
