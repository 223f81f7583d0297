"""tqlab's decode behind vLLM 0.33's signature (``tqlab.turboquant.vllm_decode``), on vLLM's own cache tensor.

CPU: the function equals :func:`tqlab.turboquant.decode_attention` on the same cache, picks and fills the split buffers
as vLLM's function does, and refuses another rotation or a wrong ``key_packed_size``.  GPU (``@pytest.mark.gpu``, with
``TQLAB_VLLM_ANCHORS`` pointing at a copy of ``anchors/vllm_tq``): vLLM's own store and decode kernels beside tqlab's
on the same inputs; the comparison is written to ``$TQLAB_GPU_RECORD`` when set."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tqlab.turboquant import TQ_PRESETS, decode_attention, hadamard, kv_cache_shape, lloyd_max, store_kv
from tqlab.turboquant.vllm_decode import spec_from_vllm_args, triton_turboquant_decode_attention

PRESETS = sorted(TQ_PRESETS)


def _args(spec, d):
    return dict(scale=d ** -0.5, mse_bits=0 if spec.key_fp8 else spec.key_bits, key_packed_size=spec.key_packed_bytes(d),
                value_quant_bits=spec.value_bits, key_fp8=spec.key_fp8, norm_correction=spec.norm_correction)


def _setup(spec, d=64, hk=2, bs=16, nb=6, b=3, hq=8, dev="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device=dev)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(dev), torch.randn(n, hk, d, generator=g).to(dev),
             torch.randperm(n, generator=g).to(dev), spec)
    bt = torch.stack([torch.randperm(nb, generator=g) for _ in range(b)]).to(torch.int32).to(dev)
    sl = torch.tensor([1, 37, n][:b], dtype=torch.int32, device=dev)
    q = torch.randn(b, hq, d, generator=g).to(dev, torch.float16)
    cent = torch.tensor(lloyd_max(4 if spec.key_fp8 else spec.key_bits, d).centroids, dtype=torch.float32, device=dev)
    return cache, bt, sl, q, hadamard(d, device=dev), cent


@pytest.mark.parametrize("name", PRESETS)
def test_spec_from_vllm_args_names_the_preset(name):
    spec = TQ_PRESETS[name]
    assert spec_from_vllm_args(0 if spec.key_fp8 else spec.key_bits, spec.value_bits, spec.key_fp8,
                               spec.norm_correction) is spec


@pytest.mark.parametrize("name", PRESETS)
def test_equals_tqlab_decode_and_fills_vllms_buffers(name):
    spec, d, s = TQ_PRESETS[name], 64, 4
    cache, bt, sl, q, h, cent = _setup(spec)
    mid, out, lse = torch.empty(3, 8, s, d + 1), torch.empty(3, 8, d, dtype=torch.float16), torch.empty(3, 8)
    decode_attention(q, cache, bt, sl, spec, d ** -0.5, mid, out, lse)

    class Holder:
        pass

    holder = Holder()  # no buffers: allocated and parked on buf_holder, as vLLM's function does
    got = triton_turboquant_decode_attention(q, cache, bt, sl, h, cent, **_args(spec, d), PiT=h, buf_holder=holder,
                                             max_num_kv_splits=s)
    assert torch.equal(got, out) and got is holder._tq_output_buf
    assert torch.equal(holder._tq_mid_o_buf, mid) and torch.equal(holder._tq_lse_buf, lse)
    # larger workspace buffers (B 5, S 8): sliced [:B, :Hq, :S]; the output is a view of output_buf
    mid_b, out_b, lse_b = torch.full((5, 8, 8, d + 1), 7.0), torch.full((5, 8, d), 7.0, dtype=torch.float16), torch.full((5, 8), 7.0)
    got = triton_turboquant_decode_attention(q, cache, bt, sl, h, cent, **_args(spec, d), mid_o_buf=mid_b,
                                             output_buf=out_b, lse_buf=lse_b, max_num_kv_splits=s)
    assert got.data_ptr() == out_b.data_ptr() and torch.equal(got, out) and torch.equal(lse_b[:3], lse)
    assert torch.equal(mid_b[:3, :, :s], mid) and (mid_b[:3, :, s:] == 7).all() and (out_b[3:] == 7).all()


def test_refuses_other_rotation_centroids_and_sizes():
    spec, d = TQ_PRESETS["turboquant_3bit_nc"], 64
    cache, bt, sl, q, h, cent = _setup(spec)
    with pytest.raises(ValueError, match="Sylvester Hadamard"):
        triton_turboquant_decode_attention(q, cache, bt, sl, -h, cent, **_args(spec, d))
    with pytest.raises(ValueError, match="Lloyd-Max centroids"):
        triton_turboquant_decode_attention(q, cache, bt, sl, h, cent * 1.01, **_args(spec, d))
    with pytest.raises(ValueError, match="key_packed_size 99"):
        triton_turboquant_decode_attention(q, cache, bt, sl, h, cent, **{**_args(spec, d), "key_packed_size": 99})


@pytest.mark.gpu
@pytest.mark.parametrize("name", PRESETS)
def test_gpu_beside_vllms_own_kernels(name):
    """vLLM's store and decode (the anchor's vendored 0.33.0 kernels) beside tqlab's on the GPU, Llama shard
    shape (Hq 32, Hk 8, D 128), block 16, S 32: the same cache tensor byte for byte (counted per field), and
    tqlab's decode through vLLM's signature on vLLM's cache agrees with vLLM's decode."""
    anchors = os.environ.get("TQLAB_VLLM_ANCHORS")
    if not anchors:
        pytest.skip("TQLAB_VLLM_ANCHORS (a copy of anchors/vllm_tq) not set")
    sys.path.insert(0, anchors)
    import vllm_tq_kernels as vk

    spec, d, hk, hq, bs, b, ctx = TQ_PRESETS[name], 128, 8, 32, 16, 4, 2048
    cfg = vk.TurboQuantConfig.from_cache_dtype(name, d)
    consts = vk.layer_constants(cfg, "cuda")
    g = torch.Generator().manual_seed(7)
    nb = b * ctx // bs
    k = torch.randn(nb * bs, hk, d, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(nb * bs, hk, d, generator=g).to("cuda", torch.bfloat16)
    slots = torch.randperm(nb * bs, generator=g).to("cuda", torch.int32)
    vc = torch.zeros(nb, bs, hk, cfg.slot_size_aligned, dtype=torch.uint8, device="cuda")
    vk.triton_turboquant_store(k, v, vc, slots, consts["PiT"], consts["midpoints"], mse_bits=cfg.key_mse_bits,
                               key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.value_quant_bits,
                               key_fp8=cfg.key_fp8)
    tc = torch.zeros(kv_cache_shape(nb, hk, bs, d, spec), dtype=torch.uint8, device="cuda")
    store_kv(tc, k, v, slots.long(), spec)
    assert tc.shape == vc.shape
    differ = {f.kind: int((vc[..., f.offset:f.offset + f.nbytes] != tc[..., f.offset:f.offset + f.nbytes]).sum())
              for f in spec.layout(d)}
    bt = torch.randperm(nb, generator=g).view(b, -1).to("cuda", torch.int32)
    sl = torch.tensor([ctx, 1, 1500, 64], dtype=torch.int32, device="cuda")
    q = torch.randn(b, hq, d, generator=g).to("cuda", torch.bfloat16)
    args = dict(scale=d ** -0.5, mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                value_quant_bits=cfg.value_quant_bits, key_fp8=cfg.key_fp8, norm_correction=cfg.norm_correction,
                PiT=consts["PiT"], max_num_kv_splits=32)
    ov = vk.triton_turboquant_decode_attention(q, vc, bt, sl, consts["Pi"], consts["centroids"], **args).float()
    ot = triton_turboquant_decode_attention(q, vc, bt, sl, consts["Pi"], consts["centroids"], **args).float()
    rel = float((ov - ot).norm() / ov.norm())
    rec = {"preset": name, "cache_shape": list(vc.shape), "bytes": vc.numel(), "differ_by_field": differ,
           "field_bytes": {f.kind: vc[..., f.offset:f.offset + f.nbytes].numel() for f in spec.layout(d)},
           "decode_rel_err_vs_vllm": rel, "max_abs_diff": float((ov - ot).abs().max())}
    if os.environ.get("TQLAB_GPU_RECORD"):
        with open(os.environ["TQLAB_GPU_RECORD"], "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    assert all(n == 0 for n in differ.values()), rec  # whole caches byte for byte (vLLM's centroids and arithmetic)
    assert rel < 2e-3, rec  # bf16 outputs of two kernels summing in other orders; measured values recorded


def test_recorded_side_by_side_on_vllms_tensor():
    """``data/turboquant_vllm_tensor_h200.json`` (``benchmarks/record_vllm_tensor.sh`` folded by
    ``benchmarks/_vllm_tensor_record.py``): one H200 call, every decode row on vLLM's own tensor with the kernel that
    served it, the speed-ups consistent with the times, and vLLM's own store beside tqlab's writing the same bytes."""
    from tqlab.core.provenance import load_recorded

    rec = load_recorded("turboquant_vllm_tensor_h200")
    assert rec.provenance["device"] == "NVIDIA H200" and "record_vllm_tensor.sh" in rec.provenance["command"]
    rows = rec.data["decode"]
    assert {(r["shape"], r["ctx"], r["preset"]) for r in rows} == {
        (s, c, p) for s in ("llama3.1-8b", "seed_tp8_rank") for c in (8192, 32768, 131072)
        for p in ("turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc", "turboquant_k8v4")}
    for r in rows:  # the rotated presets on vLLM's tensor: the Gluon decode that reads it (issue 34)
        assert r["splits"] == 32 and r["tqlab_kernel"] == ("portable" if r["preset"] == "turboquant_k8v4" else "gluon_vllm")
        assert r["block_soa_kernel"] == ("block_soa" if r["preset"] == "turboquant_k8v4" else "gluon")
        assert r["tqlab_x_sdpa"] == r["sdpa_ms"] / r["tqlab_ms"] and r["block_soa_x_sdpa"] == r["sdpa_ms"] / r["block_soa_ms"]
        assert 0 < r["tqlab_frac_of_byte_limit"] < 1 and 0 < r["block_soa_frac_of_byte_limit"] < 1
    checks = {c["preset"]: c for c in rec.data["vllm_checks"]}
    assert sorted(checks) == PRESETS
    for c in checks.values():
        assert c["cache_shape"][1:3] == [16, 8] and all(n == 0 for n in c["differ_by_field"].values())
        assert c["decode_rel_err_vs_vllm"] < 2e-3
