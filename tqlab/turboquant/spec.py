"""TurboQuant presets and the byte layout of one cache slot.

A *slot* holds one (position, kv-head) pair: ``[key_packed | value_packed | pad]``.

* ``key_packed``: MSE keys (2..4 bits): ``ceil(D*key_bits/8)`` bytes of bit-packed Lloyd-Max
  indices followed by the key's L2 norm as fp16 (2 bytes). fp8 keys (``key_bits == 8``):
  ``D`` bytes of float8_e4m3fn, no norm.
* ``value_packed``: ``ceil(D*value_bits/8)`` bytes of bit-packed uniform codes, then the
  per-vector fp16 scale and fp16 zero point (4 bytes).
* The slot is rounded up to an even number of bytes.

The cache of one layer is a contiguous uint8 tensor (:func:`kv_cache_shape`,
``TurboQuantSpec.cache_layout``, same bytes per token, same quantizer):

* ``"vllm"`` (default): vLLM 0.33's own cache tensor, ``(num_blocks, block_size, num_kv_heads,
  slot_bytes)`` -- token-major inside a block, each slot as above, ``slot_bytes`` =
  ``TurboQuantConfig.slot_size_aligned``.  vLLM allocates the layer as ``KVCacheLayout.LBNHC``
  (``TurboQuantAttentionBackend.supported_kv_cache_layouts``; ``vllm/v1/kv_cache_layout.py``: physical
  order ``[L, B, N, H, C]``, N the position in the block) and its backend hands the kernels
  ``kv_cache.transpose(1, 2)`` (``TurboQuantAttentionImpl.do_kv_cache_update`` / ``forward`` in
  ``vllm/v1/attention/backends/turboquant_attn.py``), a contiguous ``(num_blocks, block_size, Hk, slot)``
  tensor read with the strides ``stride_cache_block/pos/head``.  Parity with vLLM 0.33 pins these bytes
  (whole caches, ``parity/test_turboquant_cache_parity.py``).
* ``"block_soa"`` (opt-in, issue 20): ``(num_blocks, num_kv_heads, block_size, slot_bytes)``, one
  (block, KV head) region of ``block_size * slot_bytes`` bytes per head, in the order below.
  Inside a region every field of the block's tokens is stored contiguously --
  all key codes, then all value codes, then the key norms, value scales and value zeros as fp16
  arrays (then the pad bytes); 4-bit code fields keep vLLM's LSB-first bit stream.  With
  ``block_size % 16 == 0`` every field starts 16-byte aligned, so the fast decode reads a chunk of
  32 codes with one wide load (``benchmarks/NOTES_turboquant.md``).  For the norm-corrected
  presets the key norm field holds ``fp16(||k|| / ||c_hat||)`` instead of ``fp16(||k||)``
  (``TurboQuantSpec.norm_folded``, as vLLM 0.33's own SoA layout stores it), so these bytes are
  vLLM's permuted except that field and the bit order below.  Each token's 3-bit code fields (key codes of 3bit_nc and
  k3v4_nc, value codes of 3bit_nc; ``head_dim % 32 == 0``) are stored in *nibble-plane* bit order
  instead of vLLM's LSB-first stream (:meth:`TurboQuantSpec.code_order`): per chunk of 32
  consecutive codes three little-endian 32-bit words ``L0, L1, H`` -- ``L0`` holds the low 2 bits
  of codes 0-7 at bits ``4j .. 4j+1`` and of codes 8-15 at ``4j+2 .. 4j+3`` (code ``8r + j``),
  ``L1`` the same for codes 16-31, ``H`` the high bit of code ``8r + j`` at bit ``4j + r``.  Same
  12 bytes per 32 codes; a ``prmt`` nibble selector of 8 codes is then ``(L & 0x33333333) | ((H <<
  s) & 0x44444444)`` (3 ops instead of ~22, ``benchmarks/NOTES_turboquant.md``).  The words of a block's
  planes field are stored plane by plane (:meth:`TurboQuantSpec.plane_stride`): all ``L0`` words of the
  block (token-major, chunk-minor), then all ``L1``, then all ``H``, so the 4 lanes that read a token's 4
  chunks and the 8 tokens of a warp read 128 contiguous bytes per load (issue 20, round 4).

The four presets are vLLM's ``--kv-cache-dtype`` TurboQuant choices (PR #38479 lineage,
``vllm/v1/attention/backends/turboquant_attn.py``); ``_nc`` means norm correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = [
    "kv_cache_bytes_per_token",
    "CACHE_LAYOUTS",
    "CODE_ORDERS",
    "TurboQuantSpec",
    "SlotField",
    "TQ_PRESETS",
    "get_spec",
    "kv_cache_shape",
    "fp16_slot_bytes",
]

_MSE_KEY_BITS = (2, 3, 4)
_FP8_KEY_BITS = 8
_VALUE_BITS = (2, 3, 4, 8)
CACHE_LAYOUTS = ("vllm", "block_soa")
# bit order of a code field: vLLM's LSB-first stream, or the block-SoA 3-bit fields' nibble planes
CODE_ORDERS = ("stream", "planes")
# field kinds in block_soa order (a kind the spec lacks is skipped)
_SOA_ORDER = ("key_idx", "key_fp8", "val_idx", "key_norm", "val_scale", "val_zero", "pad")


def fp16_slot_bytes(head_dim: int) -> int:
    """Bytes an unquantized fp16 K+V pair costs per (position, kv-head): ``4 * head_dim``."""
    return 4 * int(head_dim)


@dataclass(frozen=True)
class SlotField:
    """One field of a slot: ``name``, byte ``offset`` inside the slot, ``nbytes``, ``kind``
    (``"key_idx" | "key_fp8" | "key_norm" | "val_idx" | "val_scale" | "val_zero" | "pad"``)."""

    name: str
    offset: int
    nbytes: int
    kind: str


@dataclass(frozen=True)
class TurboQuantSpec:
    """A TurboQuant KV-cache format.

    Attributes:
        name: the ``kv_cache_dtype`` string, e.g. ``"turboquant_3bit_nc"``.
        key_bits: 2, 3 or 4 = Hadamard-rotated Lloyd-Max keys with an fp16 norm;
            8 = float8_e4m3fn keys (no rotation, no norm).
        value_bits: 2, 3, 4 or 8; per-vector asymmetric uniform quantization.
        norm_correction: renormalize the dequantized rotated key to unit length before the
            inverse rotation (only meaningful for MSE keys); on the block-SoA layout folded into
            the stored norm at store time (:attr:`norm_folded`).
        cache_layout: byte order inside a (block, KV head) region, one of :data:`CACHE_LAYOUTS`:
            ``"vllm"`` (default, vLLM's slot order) or ``"block_soa"`` (fields contiguous per
            block, see the module docstring and :meth:`field_addresses`).

    Raises:
        ValueError: unsupported bit widths, norm correction asked for fp8 keys, unknown layout.
    """

    name: str
    key_bits: int
    value_bits: int
    norm_correction: bool
    cache_layout: str = "vllm"

    def __post_init__(self) -> None:
        if self.key_bits not in _MSE_KEY_BITS + (_FP8_KEY_BITS,):
            raise ValueError(
                f"{self.name}: key_bits must be one of {_MSE_KEY_BITS + (_FP8_KEY_BITS,)}, "
                f"got {self.key_bits!r}"
            )
        if self.value_bits not in _VALUE_BITS:
            raise ValueError(f"{self.name}: value_bits must be one of {_VALUE_BITS}, got {self.value_bits!r}")
        if self.key_fp8 and self.norm_correction:
            raise ValueError(f"{self.name}: norm_correction needs MSE (rotated) keys, not fp8 keys")
        if self.cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"{self.name}: cache_layout must be one of {CACHE_LAYOUTS}, got {self.cache_layout!r}")

    # ----- derived facts -------------------------------------------------------------
    @property
    def key_fp8(self) -> bool:
        """True when keys are stored as float8_e4m3fn (``key_bits == 8``)."""
        return self.key_bits == _FP8_KEY_BITS

    @property
    def norm_folded(self) -> bool:
        """True when the stored key norm field holds ``fp16(||k|| / ||c_hat||)`` instead of
        ``fp16(||k||)``: the norm-corrected presets on the ``"block_soa"`` layout.

        ``c_hat`` is the token's fp32 centroid vector, ``lloyd_max(key_bits, D).centroids[idx]`` as
        fp32 -- the table the torch reference divides by today (the portable kernels' polynomial
        meets the same values to fp32 rounding, the fast kernels' fp16 centroids to fp16
        rounding); the store divides in fp32 and rounds to fp16 once.  Readers then multiply by
        the stored scalar only (:attr:`norm_correction_on_read` is False): no per-token
        ``sum(c_hat**2)``, sqrt and divide in the decode loop.

        vLLM 0.33 does both: its default (AoS) store keeps ``||k||`` and its decode renormalizes
        (``vllm/v1/attention/ops/triton_turboquant_store.py`` step 3 "STORE vec_norm",
        ``triton_turboquant_decode.py`` ``_tq_decode_stage1``'s ``NORM_CORRECTION`` branch) --
        vLLM's slot order here keeps that; its SoA layout (``TurboQuantAttentionImpl._store_kv``
        in ``vllm/v1/attention/backends/turboquant_attn.py`` when FlyDSL is available) folds the
        ratio at store time ("Opt#1": ``vllm/v1/attention/ops/turboquant_soa/
        triton_turboquant_store.py``, ``triton_turboquant_store`` docstring and
        ``_tq_fused_store_mse`` step 3) and its SoA readers multiply only (same package:
        ``triton_turboquant_decode.py`` ``_tq_decode_stage1`` / ``_tq_full_dequant_kv``,
        ``triton_turboquant_unified_attention.py`` ``_tq_load_k_tile``; and
        ``vllm/v1/attention/ops/flydsl_turboquant_decode.py``: "norm_correction is honored
        IMPLICITLY") -- tqlab's block-SoA order does the same.  The one question every store and
        reader asks."""
        return self.norm_correction and self.cache_layout == "block_soa"

    @property
    def norm_correction_on_read(self) -> bool:
        """True when a reader must divide the stored norm by ``||c_hat||`` itself: norm correction
        asked for and not already folded into the stored norm (:attr:`norm_folded`).  The flag
        every decode and dequant (torch reference and kernels) passes as its ``NORM_CORR``."""
        return self.norm_correction and not self.norm_folded

    def code_order(self, kind: str, head_dim: int) -> str:
        """Bit order of one token's code field ``kind`` (``"key_idx"`` or ``"val_idx"``, the kinds of
        :meth:`layout`): ``"planes"`` (nibble planes, module docstring) for a 3-bit field of the
        ``"block_soa"`` layout with ``head_dim % 32 == 0`` (whole 32-code chunks), else ``"stream"``
        (vLLM's LSB-first bit stream, :func:`tqlab.turboquant.quant.pack_indices`).  vLLM's slot
        order is always ``"stream"`` (parity with vLLM 0.33 pins those bytes).  A ``"planes"`` field is also
        laid out plane-major across the block (:meth:`plane_stride`).  The one rule every store, reader and
        conversion asks.

        Raises:
            ValueError: ``kind`` is not a code field kind, bad ``head_dim``.
        """
        d = self._check_dim(head_dim)
        if kind not in ("key_idx", "val_idx"):
            raise ValueError(f"code_order: kind must be 'key_idx' or 'val_idx', got {kind!r}")
        bits = self.value_bits if kind == "val_idx" else self.key_bits
        return "planes" if self.cache_layout == "block_soa" and bits == 3 and d % 32 == 0 else "stream"

    def plane_stride(self, head_dim: int, block_size: int) -> int:
        """Bytes between the planes ``L0``, ``L1``, ``H`` of a block's nibble-plane field
        (:meth:`code_order` ``"planes"``): ``block_size * head_dim / 8``.  32-bit word ``w`` of chunk ``c``
        of token ``o`` sits at field byte ``w * plane_stride + 4 * (o * head_dim / 32 + c)``: plane-major,
        so a warp's load of one plane word for 8 tokens x 4 chunks is 128 contiguous bytes (issue 20,
        round 4: the token-major order, 12 bytes per chunk, made each such load span 384 bytes).  The one
        definition the store, every reader and :func:`tqlab.turboquant.quant.to_cache_layout` use.

        Raises:
            ValueError: bad ``head_dim``; ``block_size`` not a positive int.
        """
        d = self._check_dim(head_dim)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        return block_size * d // 8

    @staticmethod
    def _check_dim(head_dim: int) -> int:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 8 or head_dim % 8:
            raise ValueError(f"head_dim must be a positive multiple of 8, got {head_dim!r}")
        return head_dim

    def key_index_bytes(self, head_dim: int) -> int:
        """Bytes of packed key indices (MSE) or of fp8 key elements (fp8)."""
        d = self._check_dim(head_dim)
        return d if self.key_fp8 else math.ceil(d * self.key_bits / 8)

    def value_index_bytes(self, head_dim: int) -> int:
        """Bytes of packed value codes: ``ceil(D * value_bits / 8)``."""
        d = self._check_dim(head_dim)
        return math.ceil(d * self.value_bits / 8)

    def key_packed_bytes(self, head_dim: int) -> int:
        """Key part of a slot: ``ceil(D*key_bits/8) + 2`` (fp16 norm), or ``D`` for fp8 keys."""
        return self.key_index_bytes(head_dim) + (0 if self.key_fp8 else 2)

    def value_packed_bytes(self, head_dim: int) -> int:
        """Value part of a slot: ``ceil(D*value_bits/8) + 4`` (fp16 scale + fp16 zero)."""
        return self.value_index_bytes(head_dim) + 4

    def slot_bytes(self, head_dim: int) -> int:
        """Whole slot (bytes) = key_packed + value_packed, rounded up to even."""
        n = self.key_packed_bytes(head_dim) + self.value_packed_bytes(head_dim)
        return n + (n & 1)

    def compression_ratio(self, head_dim: int) -> float:
        """fp16 K+V bytes (``4*D``) over ``slot_bytes(D)``; e.g. 512/102 = 5.02 for 3bit_nc, D=128."""
        return fp16_slot_bytes(head_dim) / self.slot_bytes(head_dim)

    def layout(self, head_dim: int) -> list[SlotField]:
        """The slot's fields in byte order (offsets in bytes; they tile ``[0, slot_bytes)``)."""
        d = self._check_dim(head_dim)
        out: list[SlotField] = []
        off = 0
        if self.key_fp8:
            out.append(SlotField("key fp8[D]", off, d, "key_fp8"))
            off += d
        else:
            kb = self.key_index_bytes(d)
            out.append(SlotField(f"key idx {self.key_bits}b x D", off, kb, "key_idx"))
            off += kb
            out.append(SlotField("key norm fp16", off, 2, "key_norm"))
            off += 2
        vb = self.value_index_bytes(d)
        out.append(SlotField(f"value code {self.value_bits}b x D", off, vb, "val_idx"))
        off += vb
        out.append(SlotField("value scale fp16", off, 2, "val_scale"))
        off += 2
        out.append(SlotField("value zero fp16", off, 2, "val_zero"))
        off += 2
        if off < self.slot_bytes(d):
            out.append(SlotField("pad", off, self.slot_bytes(d) - off, "pad"))
        return out

    def offsets(self, head_dim: int) -> dict[str, int]:
        """Byte offsets used by the kernels: key_idx, key_norm (-1 for fp8), val_idx,
        val_scale, val_zero, slot."""
        d = self._check_dim(head_dim)
        kp = self.key_packed_bytes(d)
        vi = self.value_index_bytes(d)
        return {
            "key_idx": 0,
            "key_norm": -1 if self.key_fp8 else self.key_index_bytes(d),
            "val_idx": kp,
            "val_scale": kp + vi,
            "val_zero": kp + vi + 2,
            "slot": self.slot_bytes(d),
        }


    def field_addresses(self, head_dim: int, block_size: int) -> dict[str, tuple[int, int, int]]:
        """Where each field of token ``o`` of a block lives inside its (block, KV head) region of
        ``block_size * slot_bytes`` bytes: ``kind -> (offset, stride, nbytes)``, the field's bytes
        are ``[offset + o * stride, ... + nbytes)``.  Kinds as :meth:`layout` (a kind the spec lacks
        is absent).  ``"vllm"``: ``(slot offset, slot_bytes, nbytes)``; ``"block_soa"``: fields in
        the order key codes, value codes, key norm, value scale, value zero, pad, each
        ``block_size * nbytes`` long, stride ``nbytes`` (all in bytes; with ``block_size % 16 == 0``
        every block-SoA field starts 16-byte aligned).  Byte ranges only: the bit order inside a
        3-bit code field is :meth:`code_order`'s, and for a ``"planes"`` field only the whole field
        ``[offset, offset + block_size * nbytes)`` holds: its words are placed plane-major across the
        block's tokens (:meth:`plane_stride`).  The one place both layouts are defined: kernels,
        the torch reference's conversion and the tests read it.  ``"vllm"`` is the order vLLM 0.33's store
        writes (``_tq_fused_store_mse`` / ``_tq_fused_store_fp8`` in
        ``vllm/v1/attention/ops/triton_turboquant_store.py``).

        Raises:
            ValueError: bad ``head_dim``; ``block_size`` not a positive int.
        """
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        fields = {f.kind: f for f in self.layout(head_dim)}
        if self.cache_layout == "vllm":
            sb = self.slot_bytes(head_dim)
            return {k: (f.offset, sb, f.nbytes) for k, f in fields.items()}
        out, off = {}, 0
        for kind in _SOA_ORDER:
            if kind in fields:
                n = fields[kind].nbytes
                out[kind] = (off, n, n)
                off += block_size * n
        return out


TQ_PRESETS: dict[str, TurboQuantSpec] = {
    s.name: s
    for s in (
        TurboQuantSpec("turboquant_k8v4", key_bits=8, value_bits=4, norm_correction=False),
        TurboQuantSpec("turboquant_4bit_nc", key_bits=4, value_bits=4, norm_correction=True),
        TurboQuantSpec("turboquant_k3v4_nc", key_bits=3, value_bits=4, norm_correction=True),
        TurboQuantSpec("turboquant_3bit_nc", key_bits=3, value_bits=3, norm_correction=True),
    )
}


def get_spec(kv_cache_dtype: str | TurboQuantSpec, cache_layout: str | None = None) -> TurboQuantSpec:
    """The preset for a ``kv_cache_dtype`` string (a spec passes through unchanged).

    ``cache_layout``: None keeps the spec's (presets: ``"vllm"``); ``"block_soa"`` opts in to the
    in-block structure-of-arrays order (same shape and bytes per token).

    Raises:
        ValueError: unknown name (``"auto"`` included: that is the fp16 cache, not TurboQuant) or
            unknown layout.
    """
    if isinstance(kv_cache_dtype, TurboQuantSpec):
        spec = kv_cache_dtype
    else:
        try:
            spec = TQ_PRESETS[kv_cache_dtype]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown TurboQuant kv_cache_dtype {kv_cache_dtype!r}; expected one of {sorted(TQ_PRESETS)}"
            ) from None
    if cache_layout is None or cache_layout == spec.cache_layout:
        return spec
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache_layout must be one of {CACHE_LAYOUTS}, got {cache_layout!r}")
    return replace(spec, cache_layout=cache_layout)


def kv_cache_shape(
    num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int, spec: TurboQuantSpec | str
) -> tuple[int, int, int, int]:
    """Shape of one layer's packed cache, dtype uint8, contiguous; bytes = product of the shape.

    ``"vllm"`` layout (the presets' default): ``(num_blocks, block_size, num_kv_heads, slot_bytes)``, vLLM 0.33's
    tensor as its TurboQuant kernels receive it (module docstring).  ``"block_soa"``: ``(num_blocks,
    num_kv_heads, block_size, slot_bytes)``, a (block, KV head) region per head.  Either way
    :func:`tqlab.turboquant.ops.heads_view` gives the ``(num_blocks, num_kv_heads, block_size, slot_bytes)`` view.

    Raises:
        ValueError: non-positive sizes, bad ``head_dim`` or unknown spec name.
    """
    spec = get_spec(spec)
    for name, v in (("num_blocks", num_blocks), ("num_kv_heads", num_kv_heads), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if spec.cache_layout == "vllm":
        return (num_blocks, block_size, num_kv_heads, spec.slot_bytes(head_dim))
    return (num_blocks, num_kv_heads, block_size, spec.slot_bytes(head_dim))


def kv_cache_bytes_per_token(config: "EngineConfig") -> int:
    """KV-cache bytes one token costs on one rank, all layers, in ``config``'s cache format (torch-free).

    A TurboQuant cache (``config.is_turboquant``): ``Hk x slot_bytes(D)`` per layer (:meth:`TurboQuantSpec.slot_bytes`);
    otherwise K and V in the model dtype, ``2 x Hk x D x itemsize``; times ``num_hidden_layers``. The engine's
    cache formats (``tqlab.attention.turboquant_attn``'s ``TurboQuantKVCache`` / ``Fp16KVCache``) lay out the same
    bytes; ``tqlab.attention`` re-exports this function.
    """
    hk, d = config.num_kv_heads_per_rank, config.head_dim
    per_layer = hk * get_spec(config.kv_cache_dtype).slot_bytes(d) if config.is_turboquant else 2 * hk * d * config.dtype.itemsize
    return per_layer * config.num_hidden_layers
