"""How much accuracy each TurboQuant preset gives up (measured, never typed in).

* :func:`key_mse` -- squared error of unit keys after the round trip, next to the Lloyd-Max
  distortion the bit width promises (``D * distortion(N(0,1/D)) = distortion(N(0,1))``).
* :func:`value_rel_mse` -- relative squared error of values.
* :func:`attention_error` -- split-KV decode over the packed cache against fp32
  ``scaled_dot_product_attention`` on the unquantized K/V: cosine similarity and relative error
  of the attention output.
* :func:`accuracy_table` -- all of it per preset (plus compression ratio), as plain dicts.

All inputs are seeded random Gaussians; ``peak`` multiplies the queries to make attention less
flat (random data is the hard case for values: the output is an average, so value noise stays).
"""

from __future__ import annotations

import math

import torch

from tqlab.core.workspace_layout import cdiv
from tqlab.turboquant.codebook import lloyd_max_standard
from tqlab.turboquant.ops import decode_attention, store_kv
from tqlab.turboquant.quant import decode_keys, decode_values, encode_keys, encode_values
from tqlab.turboquant.spec import TQ_PRESETS, TurboQuantSpec, fp16_slot_bytes, get_spec, kv_cache_shape

__all__ = ["key_mse", "value_rel_mse", "attention_error", "accuracy_table", "sdpa_reference"]


def key_mse(spec: TurboQuantSpec | str, head_dim: int = 128, n: int = 4096, seed: int = 0) -> dict:
    """Mean ``||u - u_hat||**2`` over ``n`` random unit keys (Gaussian directions).

    Returns ``{"mse", "lloyd_max"}``: ``lloyd_max`` is the ``N(0,1)`` Lloyd-Max distortion for
    ``key_bits`` (None for fp8 keys) -- what the rotated-coordinate model predicts without norm
    correction.
    """
    spec = get_spec(spec)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, head_dim, generator=g)
    u = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    uh = decode_keys(encode_keys(u, spec), spec, head_dim)
    mse = float(((u - uh) ** 2).sum(-1).mean())
    return {"mse": mse, "lloyd_max": None if spec.key_fp8 else lloyd_max_standard(spec.key_bits).distortion}


def value_rel_mse(spec: TurboQuantSpec | str, head_dim: int = 128, n: int = 4096, seed: int = 0) -> float:
    """``sum ||v - v_hat||**2 / sum ||v||**2`` over ``n`` standard-normal value vectors."""
    spec = get_spec(spec)
    g = torch.Generator().manual_seed(seed + 1)
    v = torch.randn(n, head_dim, generator=g)
    vh = decode_values(encode_values(v, spec), spec, head_dim)
    return float(((v - vh) ** 2).sum() / (v**2).sum())


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 attention of one query per head: q ``(Hq, D)``, k/v ``(Hk, n, D)`` -> ``(Hq, D)``."""
    hq, hk = q.shape[0], k.shape[0]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float()[:, None, :].unsqueeze(0),
        k.float().repeat_interleave(hq // hk, 0).unsqueeze(0),
        v.float().repeat_interleave(hq // hk, 0).unsqueeze(0),
        scale=scale,
    )
    return out[0, :, 0]


def attention_error(
    spec: TurboQuantSpec | str,
    head_dim: int = 128,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    context: int = 1024,
    batch: int = 2,
    num_splits: int = 4,
    block_size: int = 16,
    peak: float = 1.0,
    seed: int = 0,
    device: str = "cpu",
    backend: str = "auto",
) -> dict:
    """Decode attention over the packed cache vs fp32 SDPA on the original K/V.

    Returns ``{"cos_min", "cos_mean", "rel_err", "lse_abs_err"}`` over all (request, head) pairs:
    cosine similarity of output vectors (min, mean), ``||out - ref|| / ||ref||`` over everything,
    max |lse - lse_ref|.
    """
    spec = get_spec(spec)
    g = torch.Generator().manual_seed(seed)
    d, hq, hk = head_dim, num_q_heads, num_kv_heads
    blocks_per = cdiv(context, block_size)
    nb = batch * blocks_per
    q = torch.randn(batch, hq, d, generator=g) * peak
    k = torch.randn(batch, context, hk, d, generator=g)
    v = torch.randn(batch, context, hk, d, generator=g)
    perm = torch.randperm(nb, generator=g)
    bt = perm.view(batch, blocks_per).to(torch.int32)
    pos = torch.arange(context)
    slots = torch.stack([bt[i, pos // block_size].long() * block_size + pos % block_size for i in range(batch)])
    cache = torch.zeros(kv_cache_shape(nb, hk, block_size, d, spec), dtype=torch.uint8, device=device)
    store_kv(cache, k.reshape(-1, hk, d).to(device), v.reshape(-1, hk, d).to(device), slots.reshape(-1).to(device),
             spec, backend=backend)
    scale = 1.0 / math.sqrt(d)
    mid = torch.empty(batch, hq, num_splits, d + 1, device=device)
    out = torch.empty(batch, hq, d, device=device)
    lse = torch.empty(batch, hq, device=device)
    decode_attention(q.to(device), cache, bt.to(device), torch.full((batch,), context, device=device), spec, scale,
                     mid, out, lse, backend=backend)
    out, lse = out.cpu(), lse.cpu()
    ref = torch.stack([sdpa_reference(q[i], k[i].transpose(0, 1), v[i].transpose(0, 1), scale) for i in range(batch)])
    kk = k.transpose(1, 2).repeat_interleave(hq // hk, 1)  # (B, Hq, n, D)
    lse_ref = torch.logsumexp(torch.einsum("bhd,bhnd->bhn", q, kk) * scale, -1)
    cos = torch.nn.functional.cosine_similarity(out.reshape(-1, d), ref.reshape(-1, d), dim=-1)
    return {
        "cos_min": float(cos.min()),
        "cos_mean": float(cos.mean()),
        "rel_err": float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)),
        "lse_abs_err": float((lse - lse_ref).abs().max()),
    }


def accuracy_table(head_dim: int = 128, context: int = 1024, peak: float = 1.0, presets=None, **kw) -> list[dict]:
    """One row per preset: name, bits, slot bytes, compression vs fp16, key MSE (+ Lloyd-Max),
    value relative MSE, and the decode attention errors of :func:`attention_error`."""
    rows = []
    for name in presets or TQ_PRESETS:
        spec = get_spec(name)
        km = key_mse(spec, head_dim)
        att = attention_error(spec, head_dim=head_dim, context=context, peak=peak, **kw)
        rows.append({
            "preset": name,
            "key_bits": spec.key_bits,
            "value_bits": spec.value_bits,
            "norm_correction": spec.norm_correction,
            "slot_bytes": spec.slot_bytes(head_dim),
            "fp16_bytes": fp16_slot_bytes(head_dim),
            "compression": spec.compression_ratio(head_dim),
            "key_mse": km["mse"],
            "key_mse_lloyd_max": km["lloyd_max"],
            "value_rel_mse": value_rel_mse(spec, head_dim),
            **att,
        })
    return rows
