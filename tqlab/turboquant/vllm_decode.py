"""tqlab's TurboQuant decode behind vLLM 0.33's own call signature, so it can replace vLLM's function in place.

:func:`triton_turboquant_decode_attention` takes exactly the arguments of vLLM 0.33's
``triton_turboquant_decode_attention`` (``vllm/v1/attention/ops/triton_turboquant_decode.py``), reads vLLM's own
cache tensor ``kv_cache`` ``(num_blocks, block_size, Hk, slot_size_aligned)`` uint8 (the backend's
``kv_cache.transpose(1, 2)`` of its LBNHC allocation, ``TurboQuantAttentionImpl.forward`` in
``vllm/v1/attention/backends/turboquant_attn.py``), takes and fills the same split buffers (``mid_o_buf`` ``(B, Hq, S,
D+1)`` f32, ``output_buf`` ``(B, Hq, D)`` in the query dtype, ``lse_buf`` ``(B, Hq)`` f32, sliced ``[:B]`` as vLLM
slices them, or allocated and parked on ``buf_holder`` as ``_tq_mid_o_buf`` / ``_tq_output_buf`` / ``_tq_lse_buf``
when missing or too small) and returns ``(B, Hq, D)`` in the query dtype.  The work is
:func:`tqlab.turboquant.ops.decode_attention` on that tensor (the ``"vllm"`` layout; the kernel: ``routing``).

``Pi`` / ``PiT`` / ``centroids`` are not read by the kernels: tqlab's decode rotates with its own Sylvester Hadamard
matrix and Lloyd-Max centroids, which are vLLM 0.33's (``_build_hadamard`` and ``get_centroids`` in
``turboquant_attn.py``'s ``_ensure_on_device``; :func:`tqlab.turboquant.codebook.lloyd_max` recomputes vLLM's float32
table exactly).  The first call per (device, D, bits, tensors) checks that the
given ones are those (one host sync; skipped while a CUDA graph is being captured, when vLLM's warm-up has already
made that call) and raises ``ValueError`` otherwise: a decode that silently used other matrices would be wrong.
"""

from __future__ import annotations

from typing import Any

import torch

from tqlab.turboquant.codebook import hadamard, lloyd_max
from tqlab.turboquant.ops import decode_attention
from tqlab.turboquant.spec import TQ_PRESETS, TurboQuantSpec

__all__ = ["triton_turboquant_decode_attention", "spec_from_vllm_args"]

# checked (device, D, bits, tensor addresses) -> the tensors themselves, held so that no other tensor can take
# those addresses while the entry says "checked" (vLLM's are long-lived layer buffers: a handful of entries)
_CHECKED: dict = {}


def spec_from_vllm_args(mse_bits: int, value_quant_bits: int, key_fp8: bool, norm_correction: bool) -> TurboQuantSpec:
    """The :class:`TurboQuantSpec` (``"vllm"`` layout) of vLLM's decode arguments: ``key_fp8`` -> 8-bit fp8 keys
    (vLLM passes ``mse_bits = 0`` then, ``TurboQuantConfig.key_mse_bits``), else ``mse_bits``-bit rotated keys;
    a preset's name when one matches.

    Raises:
        ValueError: bit widths tqlab does not support (:class:`TurboQuantSpec`)."""
    key_bits = 8 if key_fp8 else int(mse_bits)
    for spec in TQ_PRESETS.values():
        if (spec.key_bits, spec.value_bits, spec.norm_correction) == (key_bits, int(value_quant_bits),
                                                                      bool(norm_correction)):
            return spec
    return TurboQuantSpec(f"turboquant_k{key_bits}v{value_quant_bits}{'_nc' if norm_correction else ''}",
                          key_bits=key_bits, value_bits=int(value_quant_bits), norm_correction=bool(norm_correction))


def _check_codebook(Pi, PiT, centroids, spec: TurboQuantSpec, d: int) -> None:
    """Raise unless ``Pi`` (and ``PiT``) is the orthonormal Sylvester Hadamard and, for rotated keys, ``centroids``
    the Lloyd-Max centroids tqlab's kernels use (once per device, D, bits and tensors; module docstring)."""
    key = (str(Pi.device), d, spec.key_bits, Pi.data_ptr(), None if PiT is None else PiT.data_ptr(),
           centroids.data_ptr())
    if key in _CHECKED or (Pi.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    h = hadamard(d)
    for name, m in (("Pi", Pi), ("PiT", PiT)):
        if m is not None and (tuple(m.shape) != (d, d) or not torch.allclose(m.detach().float().cpu(), h, atol=1e-6)):
            raise ValueError(f"{name} is not the orthonormal Sylvester Hadamard matrix of D={d} that vLLM 0.33 uses "
                             "and tqlab's decode hard-codes; refusing to decode with another rotation")
    if not spec.key_fp8:
        want = torch.tensor(lloyd_max(spec.key_bits, d).centroids, dtype=torch.float32)
        got = centroids.detach().float().cpu().flatten()
        if got.shape != want.shape or not torch.equal(got, want):
            raise ValueError(f"centroids {got.tolist()} are not vLLM 0.33's {spec.key_bits}-bit Lloyd-Max centroids of "
                             f"D={d} that tqlab's decode uses ({want.tolist()})")
    _CHECKED[key] = (Pi, PiT, centroids)


def _buffers(query, s: int, mid_o_buf, output_buf, lse_buf, buf_holder):
    """``mid_o``, ``output``, ``lse`` exactly as vLLM 0.33's function picks them (its buffer rules, step by step)."""
    b, hq, d = query.shape
    dev = query.device
    if mid_o_buf is not None and mid_o_buf.shape[0] >= b and mid_o_buf.shape[2] >= s:
        mid_o = mid_o_buf[:b, :hq, :s, :]
    else:
        mid_o = torch.empty(b, hq, s, d + 1, dtype=torch.float32, device=dev)
        if buf_holder is not None:
            buf_holder._tq_mid_o_buf = mid_o
    if output_buf is not None and output_buf.shape[0] >= b and output_buf.dtype == query.dtype:
        output = output_buf[:b, :hq, :d]
    else:
        output = torch.empty(b, hq, d, dtype=query.dtype, device=dev)
        if buf_holder is not None:
            buf_holder._tq_output_buf = output
    if lse_buf is not None and lse_buf.shape[0] >= b:
        lse = lse_buf[:b, :hq]
    else:
        lse = torch.empty(b, hq, dtype=torch.float32, device=dev)
        if buf_holder is not None:
            buf_holder._tq_lse_buf = lse
    return mid_o, output, lse


def triton_turboquant_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    Pi: torch.Tensor,
    centroids: torch.Tensor,
    scale: float,
    mse_bits: int,
    key_packed_size: int,
    value_quant_bits: int,
    key_fp8: bool = False,
    norm_correction: bool = False,
    PiT: torch.Tensor | None = None,
    mid_o_buf: torch.Tensor | None = None,
    output_buf: torch.Tensor | None = None,
    lse_buf: torch.Tensor | None = None,
    buf_holder: Any = None,
    max_num_kv_splits: int = 32,
) -> torch.Tensor:
    """Split-KV TurboQuant decode with vLLM 0.33's signature (module docstring): ``query`` ``(B, Hq, D)``,
    ``kv_cache`` uint8 ``(num_blocks, block_size, Hk, slot_size_aligned)`` contiguous, ``block_table`` ``(B,
    max_blocks)`` int32, ``seq_lens`` ``(B,)`` int32; ``max_num_kv_splits`` splits S.  Returns the output ``(B, Hq,
    D)`` in the query dtype (``output_buf[:B]`` when that buffer is used).

    Raises:
        ValueError: ``key_packed_size`` or the cache's slot size disagree with the bit widths, an unsupported bit
            width, ``Pi`` / ``centroids`` other than vLLM 0.33's, or any check of
            :func:`tqlab.turboquant.ops.decode_attention`.
        TypeError: as :func:`tqlab.turboquant.ops.decode_attention`."""
    spec = spec_from_vllm_args(mse_bits, value_quant_bits, key_fp8, norm_correction)
    d = query.shape[-1]
    if key_packed_size != spec.key_packed_bytes(d):
        raise ValueError(f"key_packed_size {key_packed_size} != {spec.name}.key_packed_bytes({d}) = "
                         f"{spec.key_packed_bytes(d)}")
    if isinstance(max_num_kv_splits, bool) or not isinstance(max_num_kv_splits, int) or max_num_kv_splits < 1:
        raise ValueError(f"max_num_kv_splits must be a positive int, got {max_num_kv_splits!r}")
    _check_codebook(Pi, PiT, centroids, spec, d)
    mid_o, output, lse = _buffers(query, max_num_kv_splits, mid_o_buf, output_buf, lse_buf, buf_holder)
    decode_attention(query, kv_cache, block_table, seq_lens, spec, float(scale), mid_o, output, lse)
    return output

