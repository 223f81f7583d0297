"""Building blocks of notebook 05's CUDA-graph demonstrations (:mod:`tqlab.lab.graph_demos`).

Reservation over capture buckets, a decode consumer whose need is not monotonic in the batch
(:class:`BatchDependentSplitsBackend`, a constructed example), the demo deployment, an engine with its
CUDA-graph decode runner, capture in a chosen order, a decode batch and a logits comparison.
:mod:`tqlab.lab.graph_demos` re-exports every public name here.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from tqlab.attention import TurboQuantAttentionBackend
from tqlab.core.config import EngineConfig
from tqlab.core.reservation import deployment_decode_shapes, reserve_workspace
from tqlab.core.workspace import WorkspaceManager, compute_layout, positive_int, ubatch_context
from tqlab.core.workspace_layout import cdiv
from tqlab.engine import LLMEngine
from tqlab.predict.analysis import decode_capture_rows
from tqlab.engine.cuda_graph import (
    CUDAGraphDecodeRunner,
    DecodeBatch,
    install_decode_runner,
)

__all__ = [
    "BatchDependentSplitsBackend",
    "bucket_workspace_bytes",
    "capture_buckets",
    "compare_logits",
    "decode_shapes_for",
    "make_demo_config",
    "make_engine_and_runner",
    "prepare_decode_batch",
    "reserve_for_buckets",
]


# --------------------------------------------------------------------------- #
# Reservation over buckets, and a non-monotonic consumer                      #
# --------------------------------------------------------------------------- #


def decode_shapes_for(backend) -> Callable[[int], tuple]:
    """``batch -> workspace request`` of ``backend``'s decode step (its ``decode_shapes`` if it has one)."""
    fn = getattr(backend, "decode_shapes", None)
    if fn is not None:
        return fn
    c = backend.config
    return lambda b: deployment_decode_shapes(c, b)


def bucket_workspace_bytes(shapes_for: Callable[[int], tuple], sizes: Sequence[int]) -> dict[int, int]:
    """Workspace bytes each bucket's decode step asks for (``{bucket: bytes}``, 256-byte aligned views)."""
    return {b: compute_layout(shapes_for(b)).total_bytes for b in sorted(sizes)}


def reserve_for_buckets(manager: WorkspaceManager, shapes_for: Callable[[int], tuple], sizes: Sequence[int]) -> int:
    """Grow every ubatch slot to the largest need over *all* buckets before capture. Returns that bucket.

    The need of a bucket is not always largest at the largest batch (see
    :class:`BatchDependentSplitsBackend`), so "capture largest first" alone is
    not enough; reserving the maximum over all buckets is.
    """
    need = bucket_workspace_bytes(shapes_for, sizes)
    worst = max(need, key=lambda b: (need[b], b))
    for slot in range(manager.num_ubatches):
        with ubatch_context(slot):
            manager.get_simultaneous(*shapes_for(worst))
    return worst


class BatchDependentSplitsBackend(TurboQuantAttentionBackend):
    """A decode consumer whose workspace need is *not* monotonic in the batch size.

    Split-KV kernels pick how many KV splits to use by batch size: a small
    batch has too few (request, head) pairs to fill the GPU, so it splits the
    context more. Here batches of at most ``small_batch_max`` rows use
    ``small_batch_splits`` splits (default 4x ``tq_max_kv_splits_for_cuda_graph``),
    larger ones the usual number. The ``(B, Hq, S, D+1)`` float32 partials then
    need more bytes at B = ``small_batch_max`` than at a larger bucket.
    """

    def __init__(self, config: EngineConfig, workspace, cache_format=None, *, small_batch_max: int = 2,
                 small_batch_splits: int | None = None):
        super().__init__(config, workspace, cache_format)
        self.small_batch_max = positive_int("small_batch_max", small_batch_max)
        self.small_batch_splits = (
            4 * self.num_kv_splits if small_batch_splits is None else positive_int("small_batch_splits", small_batch_splits)
        )

    def num_kv_splits_for(self, batch: int) -> int:
        return self.small_batch_splits if batch <= self.small_batch_max else self.num_kv_splits

    def decode_shapes(self, batch: int) -> tuple:
        return deployment_decode_shapes(self.config, batch, self.num_kv_splits_for(batch))

    def _decode_attention(self, query, cache, block_tables, seq_lens) -> torch.Tensor:
        mid_out, output, lse = self.workspace.get_simultaneous(*self.decode_shapes(query.shape[0]))
        self.cache_format.decode(query, cache, block_tables, seq_lens, self.scale, mid_out, output, lse)
        return output


# --------------------------------------------------------------------------- #
# Engines and batches for the demonstrations                                  #
# --------------------------------------------------------------------------- #


def make_demo_config(**overrides) -> EngineConfig:
    """The bug report's model, one rank's shard (``nemotron-3-super-120b-a12b`` preset: TP 8, so 4 query heads,
    1 KV head, head_dim 128, 8 layers, ``max_num_seqs`` 4, ``turboquant_3bit_nc``) with a short
    ``max_model_len`` (512) and ``max_num_batched_tokens`` (256) so every demonstration runs in
    seconds on a CPU. ``overrides`` replace fields."""
    kw = dict(max_model_len=512, max_num_batched_tokens=256)
    kw.update(overrides)
    return EngineConfig.from_preset("nemotron-3-super-120b-a12b", **kw)


def make_engine_and_runner(config: EngineConfig, device: str | torch.device = "cpu", *, fix: bool = True,
                           capture: bool = True, order: str | Sequence[int] = "largest_first",
                           reserve: str | None = None, backend_factory: Callable | None = None, lock: bool = True,
                           kv_cache_tokens: int | None = None,
                           **runner_kwargs) -> tuple[LLMEngine, CUDAGraphDecodeRunner]:
    """An engine and the :class:`~tqlab.engine.cuda_graph.CUDAGraphDecodeRunner` whose capture this function drives.

    The engine is built with ``enforce_eager=True`` (so its own start-up captures
    nothing; it locks), then the workspace is unlocked, the runner installed
    (``runner_kwargs``: mode, guard, keep_captured_buffers, ...), optionally the
    backend swapped (``backend_factory(config, workspace, cache_format)``),
    optionally reserved (``reserve``: ``None``, ``"max_num_seqs"`` = PR #44053's
    decode reservation, ``"all_buckets"`` = :func:`reserve_for_buckets`), the
    buckets captured in ``order`` (``"largest_first"``, ``"smallest_first"`` or
    an explicit list) and the workspace locked again if ``lock``.

    Returns ``(engine, decode_runner)``.
    """
    eng = LLMEngine(config.replace(enforce_eager=True), fix=fix, device=device, kv_cache_tokens=kv_cache_tokens)
    eng.workspace.unlock()
    if backend_factory is not None:
        nb = backend_factory(eng.config, eng.workspace, eng.backend.cache_format)
        eng.backend = eng.runner.backend = nb
    dr = install_decode_runner(eng, **runner_kwargs)
    sizes = decode_capture_rows(config)  # the deployment's buckets (eng.config is its eager copy)
    if reserve == "max_num_seqs":
        reserve_workspace(eng.config, eng.workspace)
    elif reserve == "all_buckets":
        reserve_for_buckets(eng.workspace, decode_shapes_for(eng.runner.backend), sizes)
    elif reserve is not None:
        raise ValueError(f"reserve must be None, 'max_num_seqs' or 'all_buckets', got {reserve!r}")
    if capture:
        capture_buckets(dr, sizes, order)
    if lock:
        eng.workspace.lock()
    return eng, dr


def capture_buckets(dr: CUDAGraphDecodeRunner, sizes: Sequence[int], order: str | Sequence[int] = "largest_first") -> list[int]:
    """Capture ``sizes`` in ``order`` (``"largest_first"`` as vLLM, ``"smallest_first"``, or a list). Returns the order used."""
    if order == "largest_first":
        seq = sorted(sizes, reverse=True)
    elif order == "smallest_first":
        seq = sorted(sizes)
    elif isinstance(order, str):
        raise ValueError(f"order must be 'largest_first', 'smallest_first' or a list of sizes, got {order!r}")
    else:
        seq = list(order)
    for b in seq:
        dr.capture(b)
    return seq


def prepare_decode_batch(runner, batch: int, context_len: int, *, seed: int = 0) -> DecodeBatch:
    """Fill the KV cache with ``context_len - 1`` random tokens for each of ``batch`` requests; return their decode step.

    Request ``i`` owns blocks ``1 + i*n .. (i+1)*n`` (``n = ceil(context_len / block_size)``);
    its new token goes to position ``context_len - 1``. Every layer's cache gets
    the same random K/V (seeded), through the backend's store.

    Raises ``ValueError`` if the cache has too few blocks or ``context_len`` exceeds ``max_model_len``.
    """
    b = positive_int("batch", batch)
    ctx = positive_int("context_len", context_len, 2)
    cfg, dev = runner.config, runner.device
    if ctx > cfg.max_model_len:
        raise ValueError(f"context_len {ctx} exceeds max_model_len {cfg.max_model_len}")
    bs = cfg.block_size
    nper = cdiv(ctx, bs)
    num_blocks = runner.kv_caches[0].shape[0]
    if 1 + b * nper > num_blocks:
        raise ValueError(f"{b} requests of {ctx} tokens need {1 + b * nper} KV-cache blocks, the cache has {num_blocks}")
    blocks = torch.arange(1, 1 + b * nper, dtype=torch.long).view(b, nper)
    bt = torch.zeros((b, runner.max_blocks_per_seq), dtype=torch.int32)
    bt[:, :nper] = blocks.to(torch.int32)
    pos = torch.arange(ctx - 1)
    hist = (blocks[:, pos // bs] * bs + pos % bs).reshape(-1)
    new = blocks[:, (ctx - 1) // bs] * bs + (ctx - 1) % bs
    hk, d = cfg.num_kv_heads_per_rank, cfg.head_dim
    g = torch.Generator(device=dev).manual_seed(seed)
    k = torch.randn((hist.numel(), hk, d), generator=g, device=dev)
    v = torch.randn((hist.numel(), hk, d), generator=g, device=dev)
    dt = runner.model.compute_dtype
    k, v, hist_d = k.to(dt), v.to(dt), hist.to(dev)
    for cache in runner.kv_caches:
        runner.backend.do_kv_cache_update(cache, k, v, hist_d)
    ids = torch.randint(0, runner.model.vocab_size, (b,), generator=g, device=dev)
    return DecodeBatch(ids, new.to(dev), bt.to(dev), torch.full((b,), ctx, dtype=torch.int32, device=dev))


def compare_logits(a: torch.Tensor, b: torch.Tensor) -> dict:
    """``bitwise_equal``, ``max_abs_diff`` (finite entries), ``nonfinite``, ``argmax_mismatch``, ``rows`` of ``a`` vs ``b``."""
    a, b = a.float(), b.float()
    fin = torch.isfinite(a) & torch.isfinite(b)
    d = (a - b).abs()
    return {
        "bitwise_equal": bool(torch.equal(a, b)),
        "max_abs_diff": float(d[fin].max()) if bool(fin.any()) else float("nan"),
        "nonfinite": int((~torch.isfinite(a)).sum()),
        "argmax_mismatch": int((a.argmax(-1) != b.argmax(-1)).sum()),
        "rows": int(a.shape[0]),
    }
