"""Which kernel serves a Triton-backend ``ops.decode_attention`` call: the routing rule in one place.

* vLLM's tensor (``"vllm"`` layout): the Gluon decode that reads it (``_gluon_vllm_decode``, issue 34) for 3- and
  4-bit MSE keys and values (3bit_nc, k3v4_nc, 4bit_nc) with ``head_dim`` 128, a GQA group of at most 8, blocks of
  16k tokens on an sm_80+ GPU with Gluon (:func:`gluon_available`) -- measured 2.4-3.4x faster than the fast kernel
  on the H200 (``benchmarks/NOTES_turboquant.md``, issue 34 round 2) --; else the fast kernel (``_triton_fast``)
  for the rotated presets on CUDA, else the portable one (``_triton_kernels``, also the interpreter's and fp8
  keys').
* block-SoA (``cache_layout="block_soa"``) with 16-byte aligned fields (``_triton_soa.use_soa``): the Gluon decode
  (``_gluon_decode``, issue 20 round 5) where ``_gluon_decode.use_gluon`` holds -- a rotated preset (3bit_nc,
  k3v4_nc, 4bit_nc), ``head_dim`` 128, a GQA group of at most 8, an sm_80+ GPU -- and Triton >= 3.6 ships Gluon
  (:func:`gluon_available`); else the Triton block-SoA decode (``_triton_soa``, every preset, k8v4 always).
  Nibble-plane fields off that alignment: the portable decode.

:func:`decode_kernel_name` reports the choice (benchmarks record it next to their timings).
"""

from __future__ import annotations

import importlib.util
import re

import torch

from tqlab.turboquant.spec import TurboQuantSpec

__all__ = ["decode_kernels", "decode_kernel_name", "gluon_available"]

KERNEL_NAMES = {"_triton_kernels": "portable", "_triton_fast": "fast", "_triton_soa": "block_soa",
                "_gluon_decode": "gluon", "_gluon_vllm_decode": "gluon_vllm"}


MIN_GLUON_TRITON = (3, 6)  # the H200's Triton, the only one the Gluon decode was measured and tested with


def gluon_available() -> bool:
    """Whether this Triton is >= :data:`MIN_GLUON_TRITON` and ships the Gluon dialect (``triton.experimental.gluon``;
    the kernel was measured and tested with Triton 3.6 only, earlier releases' Gluon is not tried).  Without it the
    Triton block-SoA decode serves every block-SoA call; any other import error of tqlab's Gluon module is raised."""
    import triton

    if tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) < MIN_GLUON_TRITON:
        return False
    try:
        return importlib.util.find_spec("triton.experimental.gluon") is not None
    except ModuleNotFoundError:  # no triton.experimental at all
        return False


def decode_kernels(spec: TurboQuantSpec, dev: torch.device, query: torch.Tensor, cache: torch.Tensor):
    """The kernel module (``decode_attention(query, cache, block_tables, seq_lens, spec, scale, mid_out, output,
    lse)``) that serves a Triton-backend decode of ``query`` ``(B, Hq, D)`` on ``cache`` (module docstring)."""
    from tqlab.turboquant import _triton_fast as tf
    from tqlab.turboquant import _triton_kernels as tk

    kernels = tf if tf.use_fast(spec, dev) else tk  # fast kernels for rotated keys on CUDA (issue 20)
    if spec.cache_layout == "vllm" and kernels is tf and gluon_available():
        from tqlab.turboquant import _gluon_vllm_decode as gv

        if gv.use_gluon_vllm(spec, cache, query.shape[-1], query.shape[1] // cache.shape[1]):
            kernels = gv  # 4-bit keys and values on vLLM's tensor (issue 34)
    if spec.cache_layout == "block_soa":
        from tqlab.turboquant import _triton_soa as ts

        if ts.use_soa(spec, cache, query.shape[-1]):
            kernels = ts
            if gluon_available():
                from tqlab.turboquant import _gluon_decode as gd

                if gd.use_gluon(spec, cache, query.shape[-1], query.shape[1] // cache.shape[1]):
                    kernels = gd
        elif any(tk._planes_flags(spec, query.shape[-1], cache.shape[2]).values()):
            kernels = tk  # nibble-plane fields off the SoA decode's alignment: the portable decode reads them
    return kernels


def decode_kernel_name(query: torch.Tensor, cache: torch.Tensor, spec: TurboQuantSpec) -> str:
    """``"portable"``, ``"fast"``, ``"gluon_vllm"``, ``"block_soa"`` or ``"gluon"``: the kernel :func:`decode_kernels` picks (the
    Triton side of :func:`tqlab.turboquant.ops.decode_kernel_name`, with its argument order)."""
    return KERNEL_NAMES[decode_kernels(spec, query.device, query, cache).__name__.rsplit(".", 1)[-1]]
