"""Reference answers of notebook 05's exercises (CUDA graphs: buckets, the frozen decode scratch, the memory budget).

Each reference calls the function of tqlab the notebook teaches; ``CASES`` holds the argument tuples the
notebook's exercise cell checks with :func:`tqlab.lab.exercises.check`.
"""

from __future__ import annotations

import torch

from tqlab.core.reservation import decode_workspace_shapes
from tqlab.core.workspace import compute_layout
from tqlab.engine.cuda_graph import select_bucket
from tqlab.lab.memory_budget import memory_budget

GiB = 2**30
SIZES = (1, 2, 4, 8, 16, 24, 32)


def bucket_for(batch: int, sizes: tuple[int, ...]) -> int | None:
    """The captured batch size a decode batch of ``batch`` rows replays in (None: larger than every bucket)."""
    return select_bucket(batch, sizes)


def decode_scratch_bytes(rows: int, heads: int, head_dim: int, splits: int) -> int:
    """Bytes of the split-KV decode scratch a graph captures at ``rows`` rows (bfloat16 model, 256-byte views)."""
    return compute_layout(decode_workspace_shapes(rows, heads, head_dim, splits, torch.bfloat16)).total_bytes


def kv_cache_bytes(total: int, util: float, weights: int, activations: int) -> int:
    """What the KV cache gets at start-up: ``util x total`` minus what the profile run measured."""
    return memory_budget(total=total, util=util, weights=weights, activation_peak=activations, after_profile=0,
                         workspace_startup=0, workspace_need=0, reserved=True).segments["KV cache"]


CASES = {
    "bucket_for": [(1, SIZES), (3, SIZES), (5, SIZES), (17, SIZES), (32, SIZES), (33, SIZES)],
    "decode_scratch_bytes": [(1, 4, 128, 32), (4, 4, 128, 32), (16, 8, 128, 4), (3, 7, 64, 5)],
    "kv_cache_bytes": [(24 * GiB, 0.905, 17_500_000_000, GiB), (80 * GiB, 0.92, 16 * GiB, 2 * GiB)],
}
