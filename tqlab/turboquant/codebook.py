"""Rotation and scalar codebook used by TurboQuant keys.

Two fixed ingredients turn a key vector into a handful of small integers:

* ``hadamard(D)`` -- the orthonormal Sylvester Hadamard matrix ``H`` (D x D, entries
  ``+-1/sqrt(D)``, ``H @ H == I`` because it is symmetric and orthogonal).  Rotating a unit
  vector by ``H`` spreads its energy over all coordinates, so each rotated coordinate looks
  like a draw from ``N(0, 1/D)`` whatever the original vector was.
* ``lloyd_max(bits, D)`` -- the Lloyd-Max (minimum mean squared error) scalar quantizer for
  ``N(0, 1/D)`` with ``2**bits`` levels: sorted centroids and the ``2**bits - 1`` decision
  boundaries (midpoints between neighbouring centroids), as vLLM 0.33 computes them (a numerical
  solve whose centroids sit up to 7.4e-4 relative off the exact ones; the bytes of a cache depend
  on it).  ``lloyd_max_standard(bits)`` is the exact ``N(0, 1)`` solution (pure Python/numpy, no
  scipy), for the theory.

Mirrors the key path of vLLM's TurboQuant KV cache (``vllm/v1/attention/backends/turboquant_attn.py``
and its quantization helpers); written from the description, except that :func:`lloyd_max` repeats the steps of
vLLM 0.33's numerical solve (``solve_lloyd_max``, cited there) so that its floats, and so the cache bytes, are vLLM's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "LloydMaxCodebook",
    "lloyd_max",
    "lloyd_max_standard",
    "hadamard",
    "hadamard_sign_matrix",
    "is_power_of_two",
]

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ...; False for 0, negatives and non-integers."""
    return isinstance(n, int) and n > 0 and (n & (n - 1)) == 0


def _pdf(x: np.ndarray) -> np.ndarray:
    return _INV_SQRT_2PI * np.exp(-0.5 * x * x)


def _cdf(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * (1.0 + erf(x / _SQRT2))


@dataclass(frozen=True)
class LloydMaxCodebook:
    """A scalar quantizer for ``N(0, sigma**2)``.

    Attributes:
        bits: index width; ``2**bits`` levels.
        sigma: standard deviation the codebook is built for (``1/sqrt(D)`` for keys).
        centroids: ``(2**bits,)`` float64, sorted ascending (reconstruction values).
        boundaries: ``(2**bits - 1,)`` float64, midpoints; index of ``x`` is
            ``sum(x > boundaries)``.
        distortion: expected squared error per coordinate, ``E[(x - Q(x))**2]``, already
            scaled to this ``sigma`` (so ``sigma**2`` times the ``N(0,1)`` value).
        iterations: Lloyd iterations the solver took.
    """

    bits: int
    sigma: float
    centroids: np.ndarray
    boundaries: np.ndarray
    distortion: float
    iterations: int

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Indices (uint8, same shape as ``x``) of the nearest centroid for every element."""
        b = torch.as_tensor(self.boundaries, dtype=torch.float32, device=x.device)
        return torch.bucketize(x.float(), b, right=True).to(torch.uint8)

    def dequantize(self, idx: torch.Tensor) -> torch.Tensor:
        """Centroid values (float32) for uint8/integer indices ``idx``."""
        c = torch.as_tensor(self.centroids, dtype=torch.float32, device=idx.device)
        return c[idx.long()]


def _distortion_standard(c: np.ndarray, b: np.ndarray) -> float:
    """E[(X - Q(X))^2] for X ~ N(0,1), closed form per cell."""
    edges = np.concatenate([[-np.inf], b, [np.inf]])
    lo, hi = edges[:-1], edges[1:]
    p = _cdf(hi) - _cdf(lo)
    # E[X 1{lo<X<hi}] = pdf(lo) - pdf(hi);  E[X^2 1{..}] = p + lo*pdf(lo) - hi*pdf(hi)
    pdf_lo = np.where(np.isinf(lo), 0.0, _pdf(np.where(np.isinf(lo), 0.0, lo)))
    pdf_hi = np.where(np.isinf(hi), 0.0, _pdf(np.where(np.isinf(hi), 0.0, hi)))
    lo_pdf = np.where(np.isinf(lo), 0.0, np.where(np.isinf(lo), 0.0, lo) * pdf_lo)
    hi_pdf = np.where(np.isinf(hi), 0.0, np.where(np.isinf(hi), 0.0, hi) * pdf_hi)
    m1 = pdf_lo - pdf_hi
    m2 = p + lo_pdf - hi_pdf
    return float(np.sum(m2 - 2.0 * c * m1 + c * c * p))


@functools.lru_cache(maxsize=None)
def lloyd_max_standard(bits: int, tol: float = 1e-12, max_iter: int = 10_000) -> LloydMaxCodebook:
    """Lloyd-Max quantizer for ``N(0, 1)`` with ``2**bits`` levels, solved by Lloyd iteration.

    Alternates the two optimality conditions until the centroids move less than ``tol``:
    boundaries = midpoints of neighbouring centroids; centroid = conditional mean of the cell,
    ``(pdf(lo) - pdf(hi)) / (cdf(hi) - cdf(lo))``.  Cached per ``bits``.

    Raises:
        ValueError: ``bits`` not an int in 1..6 (more levels converge too slowly to be
            worth it here; 8-bit keys use fp8 instead).
    """
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 6:
        raise ValueError(f"bits must be an int in 1..6, got {bits!r}")
    n = 1 << bits
    # start from uniform quantiles-ish spacing
    c = np.linspace(-2.5, 2.5, n) if n > 1 else np.zeros(1)
    it = 0
    for it in range(1, max_iter + 1):
        b = 0.5 * (c[1:] + c[:-1])
        edges = np.concatenate([[-np.inf], b, [np.inf]])
        lo, hi = edges[:-1], edges[1:]
        p = _cdf(hi) - _cdf(lo)
        pdf_lo = np.where(np.isinf(lo), 0.0, _pdf(np.where(np.isinf(lo), 0.0, lo)))
        pdf_hi = np.where(np.isinf(hi), 0.0, _pdf(np.where(np.isinf(hi), 0.0, hi)))
        new_c = (pdf_lo - pdf_hi) / np.maximum(p, 1e-300)
        moved = float(np.max(np.abs(new_c - c)))
        c = new_c
        if moved < tol:
            break
    b = 0.5 * (c[1:] + c[:-1])
    c.setflags(write=False)
    b.setflags(write=False)
    return LloydMaxCodebook(bits, 1.0, c, b, _distortion_standard(c, b), it)


@functools.lru_cache(maxsize=None)
def lloyd_max(bits: int, head_dim: int) -> LloydMaxCodebook:
    """Lloyd-Max codebook for ``N(0, 1/head_dim)`` (rotated unit-vector coordinates), **the table vLLM 0.33 uses**.

    vLLM's keys are quantized against ``get_centroids(D, bits)`` (``solve_lloyd_max`` in
    ``vllm/model_executor/layers/quantization/turboquant/centroids.py``), which solves the Lloyd conditions for
    ``N(0, 1/D)`` numerically: centroids started evenly over ``+-3.5 sigma``, cells cut at ``+-10.5 sigma``, each
    conditional mean by a 200-point trapezoid rule in Python floats, at most 200 rounds, stopping (and keeping the
    previous round's centroids) once no centroid moves by 1e-10; then float32.  Its centroids are up to 7.4e-4
    (relative) off the exact solution (:func:`lloyd_max_standard` scaled by ``1/sqrt(D)``), so a store that used the
    exact one would put some coordinates in other cells than vLLM's store: this reproduces vLLM's computation step
    by step (same operations in the same order, so the same floats).  ``centroids``: those float32 values (as
    float64); ``boundaries``: vLLM's midpoints ``(c[i] + c[i+1]) / 2`` computed in float32
    (``TurboQuantAttentionImpl._ensure_on_device``, ``_tq_midpoints``); ``distortion``: this table's exact
    per-coordinate error for ``N(0, 1/D)``; ``iterations``: vLLM's rounds.

    Raises:
        ValueError: bad ``bits`` (see :func:`lloyd_max_standard`) or ``head_dim < 1``.
    """
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    lloyd_max_standard(bits)  # validates bits
    table, it = _vllm_solve(head_dim, bits)
    c = np.asarray(table, dtype=np.float32)
    b = ((c[:-1] + c[1:]) / np.float32(2.0)).astype(np.float32)
    s = 1.0 / math.sqrt(head_dim)
    c64, b64 = c.astype(np.float64), b.astype(np.float64)
    c64.setflags(write=False)
    b64.setflags(write=False)
    return LloydMaxCodebook(bits, s, c64, b64, _distortion_standard(c64 / s, b64 / s) * s * s, it)


def _vllm_solve(d: int, bits: int) -> tuple[list[float], int]:
    """vLLM 0.33's ``solve_lloyd_max(d, bits)`` recomputed (see :func:`lloyd_max`): Python floats, ``math.exp``, the
    trapezoid sums accumulated left to right, so every float matches.  Returns (centroids, rounds)."""
    n, sigma2 = 1 << bits, 1.0 / d
    sigma = math.sqrt(sigma2)

    def pdf(x: float) -> float:
        return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))

    def trapz(f, a: float, b: float, m: int = 200) -> float:
        h = (b - a) / m
        acc = 0.5 * (f(a) + f(b))
        for i in range(1, m):
            acc += f(a + i * h)
        return acc * h

    lo, hi = -3.5 * sigma, 3.5 * sigma
    cent = [lo + (hi - lo) * (i + 0.5) / n for i in range(n)]
    rounds = 0
    for rounds in range(1, 201):
        bnd = [(cent[i] + cent[i + 1]) / 2.0 for i in range(n - 1)]
        edges = [lo * 3] + bnd + [hi * 3]
        new = []
        for i in range(n):
            a, b = edges[i], edges[i + 1]
            num = trapz(lambda x: x * pdf(x), a, b)
            den = trapz(pdf, a, b)
            new.append(num / den if den > 1e-15 else cent[i])
        if max(abs(new[i] - cent[i]) for i in range(n)) < 1e-10:
            break
        cent = new
    return cent, rounds


def _sylvester(d: int) -> np.ndarray:
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    h.setflags(write=False)
    return h


def hadamard_sign_matrix(head_dim: int) -> np.ndarray:
    """The unnormalized Sylvester Hadamard matrix (int8 entries +-1), ``(head_dim, head_dim)``.

    Raises:
        ValueError: ``head_dim`` not a power of two.
    """
    if not is_power_of_two(head_dim):
        raise ValueError(f"Hadamard rotation needs a power-of-two head_dim, got {head_dim!r}")
    return _sylvester(head_dim)


def hadamard(head_dim: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix ``H`` (symmetric, ``H @ H = I``), shape (D, D).

    Raises:
        ValueError: ``head_dim`` not a power of two.
    """
    h = torch.from_numpy(hadamard_sign_matrix(head_dim).astype(np.float64)) / math.sqrt(head_dim)
    return h.to(dtype=dtype, device=device)
