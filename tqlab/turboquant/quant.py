"""Torch reference: one K/V vector <-> the bytes of one slot.

Everything here works on any device (cpu, cuda) and any leading shape ``(..., D)``; the cache
operations in :mod:`tqlab.turboquant.ops` are built from these functions.

Bit packing is an LSB-first bit stream: index ``j`` of width ``b`` occupies stream bits
``[j*b, j*b + b)``; stream bit ``i`` is bit ``i % 8`` of byte ``i // 8``.  Eight indices fill
exactly ``b`` bytes, which is how :func:`pack_indices` does it (one little-endian word per group
of eight).

Key path (MSE presets), for ``k`` of length ``D``:

1. ``norm = ||k||`` (stored fp16, clamped to the fp16 range), ``u = k / norm``;
2. ``y = H u`` with the orthonormal Sylvester Hadamard ``H`` -- coordinates ~ ``N(0, 1/D)``;
3. ``idx_j = #{boundaries < y_j}`` -- Lloyd-Max for ``N(0, 1/D)`` with ``2**key_bits`` levels;
4. bit-pack ``idx``.

Back: ``y_hat = centroids[idx]``; with norm correction ``y_hat /= ||y_hat||``; ``k_hat = norm * H y_hat``.

Folded norm (``TurboQuantSpec.norm_folded``: the ``_nc`` presets on the block-SoA layout, as vLLM
0.33's SoA store does): step 1 stores ``fp16(||k|| / ||c_hat||)`` with ``c_hat = centroids[idx]``
(fp32 table, ratio in fp32), and the way back skips the correction: ``k_hat = stored * H y_hat``.

fp8 keys: ``k`` clamped to +-448 and cast to float8_e4m3fn, its bytes stored as they are.

Value path: ``zero = min(v)``, ``scale = (max(v) - min(v)) / (2**value_bits - 1)``, both rounded to fp16
first; ``code = clamp(floor((v - zero)/scale + 0.5), 0, 2**value_bits - 1)``; back: ``zero + scale*code``.
"""

from __future__ import annotations

import torch

from tqlab.turboquant.codebook import hadamard, lloyd_max
from tqlab.turboquant.spec import TurboQuantSpec, get_spec

__all__ = [
    "pack_indices",
    "unpack_indices",
    "fp16_to_bytes",
    "bytes_to_fp16",
    "encode_keys",
    "decode_keys",
    "encode_values",
    "decode_values",
    "encode_slots",
    "decode_slots",
    "key_journey",
    "planes_from_codes",
    "codes_from_planes",
    "to_cache_layout",
    "to_slot_order",
    "FP16_MAX",
    "FP8_E4M3_MAX",
]

FP16_MAX = 65504.0
FP8_E4M3_MAX = 448.0

_CONST_CACHE: dict = {}


def _rotation(d: int, device: torch.device) -> torch.Tensor:
    key = ("H", d, str(device))
    if key not in _CONST_CACHE:
        _CONST_CACHE[key] = hadamard(d, torch.float32, device)
    return _CONST_CACHE[key]


def _codebook(bits: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = ("cb", bits, d, str(device))
    if key not in _CONST_CACHE:
        cb = lloyd_max(bits, d)
        _CONST_CACHE[key] = (
            torch.tensor(cb.centroids, dtype=torch.float32, device=device),
            torch.tensor(cb.boundaries, dtype=torch.float32, device=device),
        )
    return _CONST_CACHE[key]


def _check_bits(bits: int) -> None:
    if bits not in (1, 2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"bits must be 1..8, got {bits!r}")


def pack_indices(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Bit-pack integer codes ``(..., D)`` (each < 2**bits) into uint8 ``(..., D*bits/8)``.

    Raises:
        ValueError: ``D`` not a multiple of 8, bad ``bits``, or a code >= 2**bits (checked on CPU).
    """
    _check_bits(bits)
    d = codes.shape[-1]
    if d % 8:
        raise ValueError(f"last dim must be a multiple of 8 to pack, got {d}")
    if codes.device.type == "cpu" and codes.numel() and int(codes.max()) >= (1 << bits):
        raise ValueError(f"code {int(codes.max())} does not fit in {bits} bits")
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], d // 8, 8)
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * bits
    word = (c << shifts).sum(-1, keepdim=True)  # (..., D/8, 1), up to 64 bits
    byte_shift = torch.arange(bits, device=codes.device, dtype=torch.int64) * 8
    out = (word >> byte_shift) & 0xFF  # (..., D/8, bits)
    return out.to(torch.uint8).reshape(*codes.shape[:-1], d * bits // 8)


def unpack_indices(packed: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`pack_indices`: uint8 ``(..., D*bits/8)`` -> uint8 codes ``(..., D)``.

    Raises:
        ValueError: wrong last-dim size for ``bits``/``head_dim``, or ``packed`` not uint8.
    """
    _check_bits(bits)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    if head_dim % 8 or packed.shape[-1] != head_dim * bits // 8:
        raise ValueError(
            f"packed last dim {packed.shape[-1]} != head_dim*bits/8 = {head_dim}*{bits}/8 (head_dim % 8 == 0 required)"
        )
    p = packed.to(torch.int64).reshape(*packed.shape[:-1], head_dim // 8, bits)
    byte_shift = torch.arange(bits, device=packed.device, dtype=torch.int64) * 8
    word = (p << byte_shift).sum(-1, keepdim=True)
    shifts = torch.arange(8, device=packed.device, dtype=torch.int64) * bits
    codes = (word >> shifts) & ((1 << bits) - 1)
    return codes.to(torch.uint8).reshape(*packed.shape[:-1], head_dim)


def fp16_to_bytes(x: torch.Tensor) -> torch.Tensor:
    """float tensor ``(...)`` -> its fp16 little-endian bytes, uint8 ``(..., 2)``."""
    return x.to(torch.float16).contiguous().reshape(*x.shape, 1).view(torch.uint8)


def bytes_to_fp16(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., 2)`` -> float16 ``(...)``."""
    if b.dtype != torch.uint8 or b.shape[-1] != 2:
        raise ValueError(f"expected uint8 (..., 2), got {b.dtype} {tuple(b.shape)}")
    return b.contiguous().view(torch.float16).squeeze(-1)


# ----------------------------------------------------------------------------- keys
def encode_keys(k: torch.Tensor, spec: TurboQuantSpec) -> torch.Tensor:
    """Keys ``(..., D)`` float -> ``key_packed`` bytes, uint8 ``(..., spec.key_packed_bytes(D))``.

    The norm field is ``fp16(||k||)``, or ``fp16(||k|| / ||c_hat||)`` when ``spec.norm_folded``
    (``c_hat = centroids[idx]`` fp32, the fp32 ratio clamped to the fp16 range; ``||c_hat|| > 0``
    always: an even Lloyd-Max codebook has no zero centroid)."""
    d = k.shape[-1]
    if spec.key_fp8:
        spec.key_index_bytes(d)  # validates D
        kf = k.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        return kf.view(torch.uint8)
    kf = k.float()
    rot = _rotation(d, k.device)
    _, bnd = _codebook(spec.key_bits, d, k.device)
    norm = torch.linalg.vector_norm(kf, dim=-1, keepdim=True)
    unit = kf / (norm + 1e-8)  # vLLM 0.33's x_hat (triton_turboquant_store, MSE path): the same floats
    y = unit @ rot
    idx = torch.bucketize(y.contiguous(), bnd, right=True).to(torch.uint8)
    if spec.norm_folded:
        cent, _ = _codebook(spec.key_bits, d, k.device)
        norm = norm / torch.linalg.vector_norm(cent[idx.long()], dim=-1, keepdim=True)
    return torch.cat(
        [pack_indices(idx, spec.key_bits), fp16_to_bytes(norm.squeeze(-1).clamp_max(FP16_MAX))], dim=-1
    )


def decode_keys(kp: torch.Tensor, spec: TurboQuantSpec, head_dim: int) -> torch.Tensor:
    """``key_packed`` bytes ``(..., key_packed_bytes)`` -> keys float32 ``(..., D)``.  Renormalizes
    ``y_hat`` only when ``spec.norm_correction_on_read`` (a folded norm already holds the ratio)."""
    d = head_dim
    if spec.key_fp8:
        return kp[..., :d].contiguous().view(torch.float8_e4m3fn).float()
    nb = spec.key_index_bytes(d)
    idx = unpack_indices(kp[..., :nb], spec.key_bits, d)
    norm = bytes_to_fp16(kp[..., nb : nb + 2]).float().unsqueeze(-1)
    cent, _ = _codebook(spec.key_bits, d, kp.device)
    yh = cent[idx.long()]
    if spec.norm_correction_on_read:
        yn = torch.linalg.vector_norm(yh, dim=-1, keepdim=True)
        yh = yh / yn.clamp_min(1e-30)
    return norm * (yh @ _rotation(d, kp.device))


# ----------------------------------------------------------------------------- values
def encode_values(v: torch.Tensor, spec: TurboQuantSpec) -> torch.Tensor:
    """Values ``(..., D)`` float -> ``value_packed`` bytes, uint8 ``(..., value_packed_bytes(D))``."""
    d = v.shape[-1]
    spec.value_index_bytes(d)  # validates D
    vf = v.float()
    levels = (1 << spec.value_bits) - 1
    vmin = vf.amin(-1, keepdim=True)
    vmax = vf.amax(-1, keepdim=True)
    # vLLM 0.33's ``_store_quantized_value`` (triton_turboquant_store.py): codes from the fp32 minimum and the fp32
    # scale clamped to >= 1e-8, ``int((v - min) / scale + 0.5)``; the fp16 roundings of scale and min are stored
    raw = (vmax - vmin) / levels
    raw = torch.where(raw > 1e-8, raw, torch.full_like(raw, 1e-8))
    q = torch.floor((vf - vmin) / raw + 0.5).clamp(0, levels).to(torch.uint8)
    scale = raw.clamp_max(FP16_MAX).to(torch.float16).float()
    zero = vmin.clamp(-FP16_MAX, FP16_MAX).to(torch.float16).float()
    return torch.cat(
        [pack_indices(q, spec.value_bits), fp16_to_bytes(scale.squeeze(-1)), fp16_to_bytes(zero.squeeze(-1))],
        dim=-1,
    )


def decode_values(vp: torch.Tensor, spec: TurboQuantSpec, head_dim: int) -> torch.Tensor:
    """``value_packed`` bytes ``(..., value_packed_bytes)`` -> values float32 ``(..., D)``."""
    nb = spec.value_index_bytes(head_dim)
    q = unpack_indices(vp[..., :nb], spec.value_bits, head_dim).float()
    scale = bytes_to_fp16(vp[..., nb : nb + 2]).float().unsqueeze(-1)
    zero = bytes_to_fp16(vp[..., nb + 2 : nb + 4]).float().unsqueeze(-1)
    return zero + scale * q


# ----------------------------------------------------------------------------- slots
def encode_slots(k: torch.Tensor, v: torch.Tensor, spec: TurboQuantSpec) -> torch.Tensor:
    """K and V ``(..., D)`` -> whole slots, uint8 ``(..., spec.slot_bytes(D))`` (pad bytes zero).

    Raises:
        ValueError: shapes of ``k`` and ``v`` differ.
    """
    if k.shape != v.shape:
        raise ValueError(f"key shape {tuple(k.shape)} != value shape {tuple(v.shape)}")
    d = k.shape[-1]
    parts = [encode_keys(k, spec), encode_values(v, spec)]
    pad = spec.slot_bytes(d) - spec.key_packed_bytes(d) - spec.value_packed_bytes(d)
    if pad:
        parts.append(torch.zeros(*k.shape[:-1], pad, dtype=torch.uint8, device=k.device))
    return torch.cat(parts, dim=-1)


def decode_slots(slots: torch.Tensor, spec: TurboQuantSpec, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots uint8 ``(..., slot_bytes)`` in vLLM's slot order -> ``(k, v)`` float32 ``(..., D)`` each.

    ``spec`` is the spec of the cache the slots came from: slots of a block-SoA cache (through
    :func:`to_slot_order`, the inverse conversion) carry its folded norm, and ``spec.norm_folded``
    tells :func:`decode_keys` so.

    Raises:
        ValueError: last dim is not ``spec.slot_bytes(head_dim)``.
    """
    if slots.shape[-1] != spec.slot_bytes(head_dim):
        raise ValueError(
            f"slot last dim {slots.shape[-1]} != {spec.name}.slot_bytes({head_dim}) = {spec.slot_bytes(head_dim)}"
        )
    kp = spec.key_packed_bytes(head_dim)
    vp = spec.value_packed_bytes(head_dim)
    return decode_keys(slots[..., :kp], spec, head_dim), decode_values(slots[..., kp : kp + vp], spec, head_dim)


# ----------------------------------------------------------------------------- in-block layouts
def _block_perm(spec: TurboQuantSpec, head_dim: int, block_size: int) -> torch.Tensor:
    """int64 ``p`` of length ``block_size * slot_bytes`` with ``region_in_layout = region_in_vllm_order[p]``
    for one (block, KV head) region, from :meth:`TurboQuantSpec.field_addresses` of both layouts."""
    key = ("perm", spec.key_bits, spec.value_bits, spec.cache_layout, head_dim, block_size)
    if key not in _CONST_CACHE:
        here = spec.field_addresses(head_dim, block_size)
        there = get_spec(spec, "vllm").field_addresses(head_dim, block_size)
        o = torch.arange(block_size)[:, None]
        p = torch.full((block_size * spec.slot_bytes(head_dim),), -1, dtype=torch.int64)
        for kind, (off, stride, n) in here.items():
            src_off, src_stride, _ = there[kind]
            j = torch.arange(n)[None, :]
            p[(off + o * stride + j).flatten()] = (src_off + o * src_stride + j).flatten()
        if bool((p < 0).any()) or not torch.equal(p.sort().values, torch.arange(p.numel())):
            raise AssertionError(f"{spec.cache_layout}: field addresses are not a permutation of the block")
        _CONST_CACHE[key] = p
    return _CONST_CACHE[key]


def planes_from_codes(codes: torch.Tensor) -> torch.Tensor:
    """3-bit codes ``(..., D)`` (any integer dtype, ``D % 32 == 0``) -> uint8 ``(..., 3 * D / 8)`` in
    nibble-plane order (:meth:`TurboQuantSpec.code_order`): per chunk of 32 codes the little-endian
    words ``L0, L1, H`` -- ``L0`` / ``L1``: the low 2 bits of code ``8r + j`` at bit ``4j + 2 (r % 2)``
    (``L0`` codes 0-15, ``L1`` codes 16-31), ``H``: its high bit at bit ``4j + r``.

    Raises:
        ValueError: ``D`` not a multiple of 32, a code outside ``0..7``.
    """
    d = codes.shape[-1]
    if d % 32:
        raise ValueError(f"nibble planes need whole chunks of 32 codes, got a last dim of {d}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 7):
        raise ValueError(f"nibble planes hold 3-bit codes 0..7, got codes in [{int(codes.min())}, {int(codes.max())}]")
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], d // 32, 4, 8)  # (..., chunk, r, j): code 8r + j
    j4 = torch.arange(8, device=codes.device, dtype=torch.int64) * 4
    lo = c & 3
    l0 = ((lo[..., 0, :] << j4) | (lo[..., 1, :] << (j4 + 2))).sum(-1)
    l1 = ((lo[..., 2, :] << j4) | (lo[..., 3, :] << (j4 + 2))).sum(-1)
    r = torch.arange(4, device=codes.device, dtype=torch.int64)[:, None]
    h = (((c >> 2) & 1) << (j4[None, :] + r)).sum((-1, -2))
    words = torch.stack([l0, l1, h], -1)  # (..., chunk, 3)
    by = (words[..., None] >> (torch.arange(4, device=codes.device) * 8)) & 0xFF
    return by.to(torch.uint8).reshape(*codes.shape[:-1], 3 * d // 8)


def codes_from_planes(planes: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`planes_from_codes`: uint8 ``(..., 3 * D / 8)`` -> uint8 codes ``(..., D)``.

    Raises:
        ValueError: ``head_dim`` not a multiple of 32 or a last dim other than ``3 * head_dim / 8``.
    """
    d = head_dim
    if d % 32 or planes.shape[-1] != 3 * d // 8:
        raise ValueError(f"nibble planes: last dim {planes.shape[-1]} != 3 * head_dim / 8 with head_dim % 32 == 0 "
                         f"(head_dim {d})")
    w = planes.to(torch.int64).reshape(*planes.shape[:-1], d // 32, 3, 4)
    w = (w << (torch.arange(4, device=planes.device) * 8)).sum(-1)  # (..., chunk, 3)
    j4 = torch.arange(8, device=planes.device, dtype=torch.int64) * 4
    out = []
    for r in range(4):
        lo = (w[..., r // 2, None] >> (j4 + 2 * (r % 2))) & 3
        hi = (w[..., 2, None] >> (j4 + r)) & 1
        out.append(lo | (hi << 2))
    return torch.stack(out, -2).reshape(*planes.shape[:-1], d).to(torch.uint8)


def _recode_planes(region: torch.Tensor, spec: TurboQuantSpec, head_dim: int, block_size: int,
                   to_planes: bool) -> torch.Tensor:
    """Re-encode in place the ``"planes"`` code fields (:meth:`TurboQuantSpec.code_order`) of uint8
    regions ``(..., block_size * slot_bytes)`` in ``spec``'s order: LSB-first stream -> planes, stored
    plane by plane (:meth:`TurboQuantSpec.plane_stride`) (``to_planes``), or back.  Returns ``region``."""
    fa = spec.field_addresses(head_dim, block_size)
    lead, nc = region.shape[:-1], head_dim // 32
    for kind in ("key_idx", "val_idx"):
        if kind in fa and spec.code_order(kind, head_dim) == "planes":
            off, _, n = fa[kind]
            # (plane, token, chunk, byte): plane w at w * plane_stride, token o's chunk c at 4 * (o * nc + c)
            assert spec.plane_stride(head_dim, block_size) == block_size * nc * 4 and n == 12 * nc
            field = region[..., off: off + block_size * n]
            if to_planes:
                tok = planes_from_codes(unpack_indices(field.reshape(*lead, block_size, n), 3, head_dim))
                new = tok.reshape(*lead, block_size, nc, 3, 4).movedim(-2, -4)  # (..., plane, token, chunk, byte)
            else:
                tok = field.reshape(*lead, 3, block_size, nc, 4).movedim(-4, -2).reshape(*lead, block_size, n)
                new = pack_indices(codes_from_planes(tok, head_dim), 3)
            region[..., off: off + block_size * n] = new.reshape(*lead, block_size * n)
    return region


def _check_blocks(blocks: torch.Tensor, spec: TurboQuantSpec, head_dim: int, where: str) -> None:
    """``blocks`` must be uint8 ``(..., block_size, spec.slot_bytes(head_dim))``; else a one-line error
    naming ``where`` and the bad value."""
    if not isinstance(blocks, torch.Tensor) or blocks.dtype != torch.uint8:
        got = blocks.dtype if isinstance(blocks, torch.Tensor) else type(blocks).__name__
        raise TypeError(f"{where}: blocks must be a uint8 tensor (packed slots), got {got}")
    sb = spec.slot_bytes(head_dim)
    if blocks.dim() < 2 or blocks.shape[-1] != sb:
        raise ValueError(f"{where}: blocks must be (..., block_size, {sb}) = {spec.name}.slot_bytes({head_dim}), "
                         f"got shape {tuple(blocks.shape)}")


def to_cache_layout(blocks: torch.Tensor, spec: TurboQuantSpec, head_dim: int) -> torch.Tensor:
    """uint8 blocks ``(..., block_size, slot_bytes)`` in vLLM's slot order -> ``spec.cache_layout``'s
    order (a new tensor of the same shape; the same tensor for ``"vllm"``): the byte permutation of
    :meth:`TurboQuantSpec.field_addresses`, then each ``"planes"`` code field
    (:meth:`TurboQuantSpec.code_order`) re-encoded from vLLM's bit stream into nibble planes.  Works for
    any ``head_dim`` :meth:`TurboQuantSpec.slot_bytes` accepts (``"planes"`` only where
    ``head_dim % 32 == 0``) and any ``block_size``.  The block-SoA order is tqlab's opt-in layout (issue 20);
    its key norm field is folded as vLLM 0.33's SoA store writes it
    (``vllm/v1/attention/ops/turboquant_soa/triton_turboquant_store.py``).

    Raises:
        TypeError: ``blocks`` not uint8.  ValueError: ``blocks.dim() < 2``, last dim not
            ``spec.slot_bytes(head_dim)`` or a bad ``head_dim``.
    """
    _check_blocks(blocks, spec, head_dim, "to_cache_layout")
    if spec.cache_layout == "vllm":
        return blocks
    *_, bs, sb = blocks.shape
    p = _block_perm(spec, head_dim, bs).to(blocks.device)
    region = blocks.reshape(*blocks.shape[:-2], bs * sb)[..., p]
    return _recode_planes(region, spec, head_dim, bs, True).reshape(blocks.shape)


def to_slot_order(blocks: torch.Tensor, spec: TurboQuantSpec, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`to_cache_layout`: blocks in ``spec.cache_layout``'s order -> vLLM's slot
    order, which :func:`decode_slots` reads: nibble-plane code fields back to vLLM's bit stream,
    then the inverse byte permutation.  The key norm field of a norm-folded cache
    (``spec.norm_folded``) stays folded, so decode the result with the same ``spec``.

    Raises:
        TypeError / ValueError: as :func:`to_cache_layout`.
    """
    _check_blocks(blocks, spec, head_dim, "to_slot_order")
    if spec.cache_layout == "vllm":
        return blocks
    *_, bs, sb = blocks.shape
    p = _block_perm(spec, head_dim, bs)
    inv = torch.empty_like(p)
    inv[p] = torch.arange(p.numel())
    region = _recode_planes(blocks.reshape(*blocks.shape[:-2], bs * sb).clone(), spec, head_dim, bs, False)
    return region[..., inv.to(blocks.device)].reshape(blocks.shape)


def key_journey(k: torch.Tensor, spec: TurboQuantSpec) -> dict[str, torch.Tensor]:
    """Every intermediate of one key vector ``(D,)`` on its way to bytes and back (for drawing).

    Returns a dict of CPU tensors: ``key``, ``norm``, ``unit``, ``rotated`` (``H u``), ``idx``,
    ``packed`` (uint8 key bytes), ``centroid`` (``centroids[idx]``), ``corrected`` (after norm
    correction, equal to ``centroid`` without it), ``unrotated`` (``H y_hat``), ``key_hat``.
    fp8 presets get ``key``, ``packed`` and ``key_hat`` only.

    Raises:
        ValueError: ``k`` is not 1-D.
    """
    if k.dim() != 1:
        raise ValueError(f"key_journey takes one vector (D,), got shape {tuple(k.shape)}")
    k = k.detach().float().cpu()
    d = k.shape[0]
    packed = encode_keys(k, spec)
    out = {"key": k, "packed": packed, "key_hat": decode_keys(packed, spec, d)}
    if spec.key_fp8:
        return out
    rot = _rotation(d, k.device)
    cent, bnd = _codebook(spec.key_bits, d, k.device)
    norm = torch.linalg.vector_norm(k)
    unit = k / norm.clamp_min(1e-30)
    y = unit @ rot
    idx = torch.bucketize(y, bnd, right=True)
    yh = cent[idx]
    corr = yh / torch.linalg.vector_norm(yh).clamp_min(1e-30) if spec.norm_correction else yh
    out.update(norm=norm, unit=unit, rotated=y, idx=idx.to(torch.uint8), centroid=yh, corrected=corr, unrotated=corr @ rot)
    return out
