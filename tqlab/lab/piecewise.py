"""Piecewise vs full CUDA graphs, and the split count fixed at capture: small simulations for notebook 05.

Mirrors three pieces of vLLM 0.33 (names kept):

* ``CUDAGraphMode`` and its ``decode_mode``/``mixed_mode`` (``vllm/config/compilation.py``);
* the downgrade rules of ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` for an attention backend's
  ``AttentionCGSupport`` (``vllm/v1/attention/backend.py``); TurboQuant declares ``UNIFORM_BATCH``
  (``vllm/v1/attention/backends/turboquant_attn.py``, ``TurboQuantMetadataBuilder._cudagraph_support``);
* which ops of a forward pass run inside captured pieces and which run eagerly between them: piecewise
  compilation splits the FX graph at the attention ops (``CompilationConfig._attention_ops``).

``PiecewiseForward`` runs a toy decoder (linear → attention → linear per layer) whose attention asks a
:class:`tqlab.core.workspace.WorkspaceManager` for its decode scratch, under a simulated graph: a captured op is
recorded once and replayed without Python; an eager op runs (and calls the workspace) every step.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from tqlab.core.workspace_layout import cdiv
from tqlab.core.reservation import decode_workspace_shapes


class CUDAGraphMode(enum.Enum):
    """vLLM 0.33's ``CUDAGraphMode``: a tuple value is (decode mode, mixed prefill-decode mode)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    def decode_mode(self) -> "CUDAGraphMode":
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> "CUDAGraphMode":
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self


class AttentionCGSupport(enum.Enum):
    """vLLM 0.33's ``AttentionCGSupport`` (``vllm/v1/attention/backend.py``)."""

    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


TURBOQUANT_CG_SUPPORT = AttentionCGSupport.UNIFORM_BATCH


def resolve_cudagraph_mode(mode: CUDAGraphMode, support: AttentionCGSupport, *,
                           splitting_ops_contain_attention: bool = True,
                           uniform_decode_query_len: int = 1) -> tuple[CUDAGraphMode, str]:
    """The mode vLLM 0.33 runs with, and why (the first three checks of ``resolve_cudagraph_mode_and_sizes``).

    Raises ``ValueError`` where vLLM raises (full graphs for mixed batches with a backend that supports none).
    """
    if mode == CUDAGraphMode.NONE:
        return mode, "no capture"
    why = "kept"
    if mode.mixed_mode() == CUDAGraphMode.FULL and support != AttentionCGSupport.ALWAYS:
        if support == AttentionCGSupport.NEVER:
            raise ValueError(f"CUDAGraphMode.{mode.name} is not supported with support {support.name}")
        mode = (CUDAGraphMode.FULL_AND_PIECEWISE if splitting_ops_contain_attention
                else CUDAGraphMode.FULL_DECODE_ONLY)
        why = f"mixed batches cannot be FULL with {support.name}: downgraded to {mode.name}"
    if mode.decode_mode() == CUDAGraphMode.FULL and support == AttentionCGSupport.NEVER:
        mode = CUDAGraphMode.PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.NONE
        why = f"no full graphs with NEVER: {mode.name}"
    if (mode.decode_mode() == CUDAGraphMode.FULL and uniform_decode_query_len > 1
            and support.value < AttentionCGSupport.UNIFORM_BATCH.value):
        mode = CUDAGraphMode.PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.NONE
        why = f"spec-decode needs UNIFORM_BATCH: {mode.name}"
    return mode, why


def runtime_mode(mode: CUDAGraphMode, uniform_decode: bool) -> CUDAGraphMode:
    """What a batch runs under: uniform decode batches take ``decode_mode()``, all others ``mixed_mode()``."""
    return mode.decode_mode() if uniform_decode else mode.mixed_mode()


OPS_PER_LAYER = ("qkv_proj", "attention", "o_proj_mlp")


def forward_plan(num_layers: int, mode: CUDAGraphMode) -> list[tuple[str, str]]:
    """``(op, where)`` for every op of the forward; ``where`` is ``"graph"`` (inside a captured piece) or ``"eager"``.

    FULL: one graph holds everything. PIECEWISE: attention runs eagerly, the ops between two attentions form
    one captured piece. NONE: everything eager.
    """
    if mode not in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
        raise ValueError(f"a runtime mode is NONE, PIECEWISE or FULL, got {mode.name}")
    plan = []
    for layer in range(num_layers):
        for op in OPS_PER_LAYER:
            eager = mode == CUDAGraphMode.NONE or (mode == CUDAGraphMode.PIECEWISE and op == "attention")
            plan.append((f"layer {layer}.{op}", "eager" if eager else "graph"))
    return plan


def pieces(plan: list[tuple[str, str]]) -> list[list[str]]:
    """The captured pieces: maximal runs of consecutive ``graph`` ops."""
    out: list[list[str]] = []
    run: list[str] = []
    for op, where in plan:
        if where == "graph":
            run.append(op)
        elif run:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return out


@dataclass
class StepLog:
    """What one forward step did: the ops Python ran, and the workspace calls they made."""

    python_ops: list[str] = field(default_factory=list)
    workspace_calls: int = 0
    view_ptrs: list[int] = field(default_factory=list)


class PiecewiseForward:
    """A toy decoder whose attention takes its decode scratch from ``workspace``, run under a runtime mode.

    ``capture(batch)`` runs every op once (warm-up = capture); ``step(batch)`` replays: ops inside a captured
    piece are *not* run by Python (their workspace views were fixed at capture), eager ops run and call the
    workspace again, so the lock checks them at every step.
    """

    def __init__(self, workspace, *, num_layers: int = 2, num_heads: int = 4, head_dim: int = 128,
                 num_splits: int = 32, dtype=torch.bfloat16):
        self.ws, self.num_layers = workspace, num_layers
        self.hq, self.d, self.s, self.dtype = num_heads, head_dim, num_splits, dtype
        self.captured: dict[tuple[CUDAGraphMode, int], list[int]] = {}

    def _attention(self, batch: int, log: StepLog) -> None:
        views = self.ws.get_simultaneous(*decode_workspace_shapes(batch, self.hq, self.d, self.s, self.dtype))
        log.workspace_calls += 1
        log.view_ptrs.extend(v.data_ptr() for v in views)

    def _run(self, mode: CUDAGraphMode, batch: int, replay: bool) -> StepLog:
        log = StepLog()
        for op, where in forward_plan(self.num_layers, mode):
            if replay and where == "graph":
                continue  # replayed from the graph: no Python, no workspace call
            log.python_ops.append(op)
            if op.endswith("attention"):
                self._attention(batch, log)
        return log

    def capture(self, mode: CUDAGraphMode, batch: int) -> StepLog:
        log = self._run(mode, batch, replay=False)
        self.captured[(mode, batch)] = list(log.view_ptrs)
        return log

    def step(self, mode: CUDAGraphMode, batch: int) -> StepLog:
        if mode != CUDAGraphMode.NONE and (mode, batch) not in self.captured:
            raise KeyError(f"no {mode.name} graph captured for batch {batch}")
        return self._run(mode, batch, replay=mode != CUDAGraphMode.NONE)


# --- the split count fixed at capture -------------------------------------------------------------------

def dynamic_num_splits(context_len: int, *, min_tokens_per_split: int = 64, max_splits: int = 32) -> int:
    """A context-dependent split plan (as an eager kernel might choose): one split per ``min_tokens_per_split``
    tokens, at most ``max_splits``. vLLM 0.33's TurboQuant backend does *not* do this: it fixes the count."""
    return max(1, min(max_splits, cdiv(int(context_len), min_tokens_per_split)))


def mid_out_bytes(batch: int, num_heads: int, head_dim: int, num_splits: int) -> int:
    """Bytes of the split-KV partials ``(B, Hq, S, D+1)`` float32 that the decode kernel writes."""
    return batch * num_heads * num_splits * (head_dim + 1) * 4


def replay_writes(captured_splits: int, replay_splits: int, batch: int, num_heads: int, head_dim: int) -> dict:
    """A graph captured with ``captured_splits`` but whose kernel would write ``replay_splits`` partials.

    Returns the buffer's bytes, the bytes the kernel would write, and how many fall outside the buffer:
    on a GPU those writes are the illegal memory access.
    """
    have = mid_out_bytes(batch, num_heads, head_dim, captured_splits)
    write = mid_out_bytes(batch, num_heads, head_dim, replay_splits)
    return dict(buffer_bytes=have, write_bytes=write, out_of_bounds_bytes=max(0, write - have))
