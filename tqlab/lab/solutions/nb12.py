"""Reference answers of notebook 12's exercises (what changed from vLLM 0.33 to 0.34); each calls the package.

* :func:`new_call_sites` — the call sites a newer census has and an older one lacks (``version_diff.site_diff``);
* :func:`retained_start` — where vLLM 0.34's ``get_retained`` span starts (``WorkspaceManager`` in 0.34 mode);
* :func:`jit_warmup_before_capture` — whether Model Runner V2's JIT warm-up runs before capture
  (``VllmVersion.jit_warmup_always``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from tqlab.core import vllm_versions
from tqlab.core.workspace import WorkspaceManager
from tqlab.lab.version_diff import site_diff

__all__ = ["jit_warmup_before_capture", "new_call_sites", "retained_start"]


def _census(sites: Sequence[str]) -> dict:
    return {"call_sites": [dict(zip(("path", "function"), s.split(":", 1)), platform="cuda") for s in sites]}


def new_call_sites(old_sites: Sequence[str], new_sites: Sequence[str]) -> list[str]:
    """Sorted ``"path:function"`` sites in ``new_sites`` and not in ``old_sites``."""
    return site_diff(_census(old_sites), _census(new_sites))["added"]


def retained_start(buffer_bytes: int, nbytes: int) -> int:
    """Byte offset where ``get_retained`` of ``nbytes`` (uint8) starts on a slot that holds ``buffer_bytes``
    (grown first by one uint8 scratch request; the span grows the slot to ``nbytes`` when it is larger)."""
    m = WorkspaceManager("meta", vllm_version="0.34")
    m.get_simultaneous(((buffer_bytes,), torch.uint8))
    m.get_retained("k", (nbytes,), torch.uint8)
    return m.retained_span()[1]


def jit_warmup_before_capture(version: str, v2_runner: bool) -> bool:
    """Whether ``warmup_kernels`` (a real prefill and decode step) runs before capture on ``version`` when Model
    Runner V2 is (``v2_runner``) or is not the runner (0.33 ships both; 0.34 only V2)."""
    return vllm_versions.get(version).jit_warmup_always or v2_runner
