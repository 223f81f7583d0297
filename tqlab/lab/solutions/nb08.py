"""Reference answers of notebook 08's exercises (a layout's total, its padding, the planner's crash bound)."""

from __future__ import annotations

import torch

from tqlab.core.config import EngineConfig
from tqlab.core.workspace import compute_layout
from tqlab.lab.widgets.planner import plan_summary

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


def layout_total(views: tuple[tuple[tuple[int, ...], str], ...]) -> int:
    """Bytes of one ``get_simultaneous`` call: each view rounded up to 256 bytes (views as (shape, dtype name))."""
    return compute_layout([(shape, _DTYPES[dt]) for shape, dt in views]).total_bytes


def padding_after(nbytes: int) -> int:
    """Padding bytes after a view of ``nbytes`` bytes, up to the next 256-byte boundary."""
    return compute_layout([((nbytes,), torch.uint8)]).total_bytes - nbytes


def shortest_crashing_prompt(preset: str, max_num_seqs: int) -> int | None:
    """The planner's shortest prompt that crashes without the fix (None: none up to max_model_len)."""
    return plan_summary(EngineConfig.from_preset(preset, max_num_seqs=max_num_seqs)).first_failing_unfixed


CASES = {
    "layout_total": [((((16, 8, 4, 129), "float32"), ((16, 8, 128), "float16"), ((16, 8), "float32")),),
                     ((((5, 7), "float16"),),), ((((3,), "uint8"), ((300,), "uint8")),)],
    "padding_after": [(0,), (1,), (256,), (257,), (70,)],
    "shortest_crashing_prompt": [("pr-44053-unit-test", 16), ("pr-44053-unit-test", 4),
                                 ("nemotron-3-super-120b-a12b", 4)],
}
