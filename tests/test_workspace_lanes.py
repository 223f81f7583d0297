"""Lanes and persistent resources, as vLLM 0.33's WorkspaceManager has them (issue 19).

vLLM 0.33 ``vllm/v1/worker/workspace.py``: ``WorkspaceManager(device, num_ubatches, num_lanes,
alloc_context)``, ``use_workspace_lane``, ``get_persistent_resource``, ``get_persistent``;
slots keyed by (ubatch, lane) only. The messages below are vLLM's.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tqlab.core.workspace import WorkspaceManager, ubatch_context, use_workspace_lane

f32, u8 = torch.float32, torch.uint8


def test_lanes_are_independent_slots_keyed_by_ubatch_and_lane():
    m = WorkspaceManager("cpu", 2, 2)
    m.get_simultaneous(((1000,), u8))
    with use_workspace_lane(1):
        m.get_simultaneous(((3000,), u8))
    with ubatch_context(1), use_workspace_lane(1):
        m.get_simultaneous(((256,), u8))
    assert m.sizes_bytes() == [1024, 3072, 0, 256]
    assert (m.size_bytes(0, 1), m.size_bytes(1, 1), m.buffer(1, 0)) == (3072, 256, None)
    assert [(e.ubatch, e.lane) for e in m.events] == [(0, 0), (0, 1), (1, 1)]


def test_lane_errors_are_vllms():
    m = WorkspaceManager("cpu")
    with pytest.raises(ValueError, match=r"^Workspace lane must be non-negative, got -1\.$"):
        with use_workspace_lane(-1):
            pass
    with use_workspace_lane(1), pytest.raises(RuntimeError,
                                             match=r"^Workspace lane 1 is not configured; manager has 1 lane\(s\)\.$"):
        m.get_simultaneous(((4,), f32))
    with pytest.raises(ValueError, match=r"^num_lanes must be at least one, got 0\.$"):
        WorkspaceManager("cpu", 1, 0)


def test_persistent_resources_are_lazy_per_slot_and_kept():
    m = WorkspaceManager("cpu", 1, 2)
    calls = []
    make = lambda: calls.append(1) or object()  # noqa: E731
    a = m.get_persistent_resource("marlin_locks", make)
    assert m.get_persistent_resource("marlin_locks", make) is a and len(calls) == 1
    with use_workspace_lane(1):
        b = m.get_persistent_resource("marlin_locks", make)
    assert b is not a and len(calls) == 2
    t = m.get_persistent("scratch", (4, 8), f32, zero_init=True)
    assert t.abs().sum() == 0 and m.get_persistent("scratch", (4, 8), f32) is t
    assert m.persistent_keys(0, 0) == ["marlin_locks", (torch.Tensor, "scratch")]
    assert m.sizes_bytes() == [0, 0]  # persistent tensors are not scratch


def test_persistent_after_lock_and_changed_shape_raise_vllms_messages():
    m = WorkspaceManager("cpu")
    m.get_persistent("perm", (16,), torch.int32)
    m.lock()
    assert m.get_persistent("perm", (16,), torch.int32).shape == (16,)
    with pytest.raises(AssertionError, match=r"^Workspace is locked but 'late' was not allocated during warmup "
                                             r"for the current ubatch and lane\.$"):
        m.get_persistent_resource("late", object)
    with pytest.raises(AssertionError, match=r"^Workspace is locked but \(<class 'torch\.Tensor'>, 'late'\) was not"):
        m.get_persistent("late", (1,), f32)
    with pytest.raises(ValueError, match=r"^Persistent workspace 'perm' has shape=torch\.Size\(\[16\]\), "
                                         r"dtype=torch\.int32; requested shape=\(8,\), dtype=torch\.int32\.$"):
        m.get_persistent("perm", (8,), torch.int32)


def test_alloc_context_wraps_scratch_growth_only():
    entered = []

    @contextlib.contextmanager
    def pool():
        entered.append(1)
        yield

    m = WorkspaceManager("cpu", 1, 1, pool)
    m.get_simultaneous(((512,), u8))
    m.get_simultaneous(((256,), u8))
    m.get_persistent("p", (4,), f32)
    assert entered == [1]
