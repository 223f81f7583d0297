"""WorkspaceManager (tqlab/core/workspace.py, mirrors vllm/v1/worker/workspace.py): exact behaviour.

Layout and offsets, views sharing one buffer, zero-size requests, free-then-allocate
growth (measured through the event log), the lock and its exact error text, state
preservation after a violation, caller attribution, DBO slot isolation across
threads, bad inputs, TQLAB_DEBUG_WORKSPACE logging, the module helpers and the
exception-safe re-warm context manager, plus a hypothesis property test.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tqlab.core.workspace as wsmod
from tqlab.core.workspace import (
    ALIGNMENT,
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    current_ubatch_id,
    current_workspace_manager,
    format_mb,
    init_workspace_manager,
    is_workspace_manager_initialized,
    lock_workspace,
    reset_workspace_manager,
    rewarm_workspace,
    round_up,
    ubatch_context,
    unlock_workspace,
)

u8, i8, f16, bf16, f32, f64, i32, i64 = (
    torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64,
)
THIS_FILE = "test_workspace.py"


def _next_line() -> int:
    """Line number of the line after the caller's current line."""
    return sys._getframe(1).f_lineno + 1


def _snapshot(ws: WorkspaceManager) -> dict:
    """Everything a failed call must leave untouched (contents cloned)."""
    bufs = [ws.buffer(i) for i in range(ws.num_ubatches)]
    return dict(
        buffers=[id(b) for b in bufs],
        ptrs=ws.data_ptrs(),
        sizes=ws.sizes_bytes(),
        contents=[None if b is None or b.device.type == "meta" else b.clone() for b in bufs],
        locked=ws.is_locked(),
        n_events=len(ws.events),
    )


def _assert_unchanged(ws: WorkspaceManager, snap: dict, *, extra_events: int = 0) -> None:
    now = _snapshot(ws)
    assert now["buffers"] == snap["buffers"]
    assert now["ptrs"] == snap["ptrs"]
    assert now["sizes"] == snap["sizes"]
    assert now["locked"] == snap["locked"]
    assert now["n_events"] == snap["n_events"] + extra_events
    for a, b in zip(now["contents"], snap["contents"]):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


@pytest.fixture
def fresh_global():
    """Module-level manager reset before and after the test."""
    reset_workspace_manager()
    yield
    reset_workspace_manager()


# --------------------------------------------------------------------------- #
# Small helpers                                                               #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "x, m, expected", [(0, 256, 0), (1, 256, 256), (255, 256, 256), (256, 256, 256), (257, 256, 512), (2081, 2080, 4160)]
)
def test_round_up(x, m, expected):
    assert round_up(x, m) == expected


@pytest.mark.parametrize(
    "nbytes, text",
    [(0, "0.00"), (802_048, "0.76"), (268_544, "0.26"), (2 * MiB, "2.00"), (MiB + MiB // 2, "1.50"), (5_242, "0.00")],
)
def test_format_mb_divides_by_2_pow_20_with_two_decimals(nbytes, text):
    assert format_mb(nbytes) == text


def test_constants():
    assert ALIGNMENT == 256
    assert MiB == 1_048_576


# --------------------------------------------------------------------------- #
# Layout                                                                      #
# --------------------------------------------------------------------------- #

LAYOUT_REQS = (((3,), f32), ((5, 7), f16), ((16, 16), u8), ((1,), f64), ((2, 3, 4), bf16), ((65,), f32))
LAYOUT_NBYTES = (12, 70, 256, 8, 48, 260)
LAYOUT_OFFSETS = (0, 256, 512, 768, 1024, 1280)
LAYOUT_TOTAL = 1792  # 1280 + round_up(260, 256) = 1280 + 512


def test_compute_layout_exact_offsets_and_padding():
    lay = compute_layout(LAYOUT_REQS)
    assert lay.shapes == ((3,), (5, 7), (16, 16), (1,), (2, 3, 4), (65,))
    assert lay.dtypes == (f32, f16, u8, f64, bf16, f32)
    assert lay.nbytes == LAYOUT_NBYTES
    assert lay.offsets == LAYOUT_OFFSETS
    assert lay.total_bytes == LAYOUT_TOTAL
    assert lay.padding == (244, 186, 0, 248, 208, 252)


def test_get_simultaneous_carves_views_at_the_layout_offsets():
    ws = WorkspaceManager("cpu")
    views = ws.get_simultaneous(*LAYOUT_REQS)
    buf = ws.buffer(0)
    assert buf.dtype == u8 and buf.dim() == 1 and buf.numel() == LAYOUT_TOTAL
    assert ws.size_bytes() == LAYOUT_TOTAL == ws.size_bytes(0)
    assert ws.layout(*LAYOUT_REQS) == compute_layout(LAYOUT_REQS)
    for v, (shape, dt), off in zip(views, LAYOUT_REQS, LAYOUT_OFFSETS):
        assert tuple(v.shape) == shape and v.dtype == dt
        assert v.is_contiguous()
        assert v.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        assert v.data_ptr() - buf.data_ptr() == off
        assert off % ALIGNMENT == 0


def test_exactly_256_bytes_needs_no_padding_and_257_takes_two_blocks():
    assert compute_layout((((64,), f32), ((1,), u8))).offsets == (0, 256)
    assert compute_layout((((64,), f32), ((1,), u8))).total_bytes == 512
    assert compute_layout((((257,), u8), ((1,), u8))).offsets == (0, 512)
    assert compute_layout((((257,), u8), ((1,), u8))).total_bytes == 768


def test_views_share_one_buffer_and_the_next_call_overwrites_them():
    ws = WorkspaceManager("cpu")
    (a,) = ws.get_simultaneous(((4,), f32))
    a.fill_(1.0)  # 0x3F800000, little endian bytes 00 00 80 3F
    (b,) = ws.get_simultaneous(((16,), u8))
    assert b.data_ptr() == a.data_ptr()
    assert b[:4].tolist() == [0, 0, 128, 63]
    b.zero_()
    assert a.tolist() == [0.0, 0.0, 0.0, 0.0]  # a was overwritten through b


def test_repeated_signature_returns_the_same_views_without_growth():
    ws = WorkspaceManager("cpu")
    first = ws.get_simultaneous(((8, 4), f32), ((3,), f16))
    n = len(ws.events)
    again = ws.get_simultaneous(((8, 4), f32), ((3,), f16))
    assert [t.data_ptr() for t in again] == [t.data_ptr() for t in first]
    assert [tuple(t.shape) for t in again] == [(8, 4), (3,)]
    assert len(ws.events) == n  # no resize
    # list shapes (unhashable) give equal views too
    listed = ws.get_simultaneous(([8, 4], f32), ([3], f16))
    assert [t.data_ptr() for t in listed] == [t.data_ptr() for t in first]
    assert [tuple(t.shape) for t in listed] == [(8, 4), (3,)]


def test_views_have_the_requested_shape_even_after_a_caller_reshaped_one_in_place():
    ws = WorkspaceManager("cpu")
    (a,) = ws.get_simultaneous(((4, 8), f32))
    a.t_()
    (b,) = ws.get_simultaneous(((4, 8), f32))
    assert tuple(b.shape) == (4, 8)
    (c,) = ws.get_simultaneous(((2, 3), f32))
    c.unsqueeze_(0)
    (d,) = ws.get_simultaneous(((2, 3), f32))
    assert tuple(d.shape) == (2, 3)


def test_torch_size_and_integer_like_dims_are_accepted():
    ws = WorkspaceManager("cpu")
    (v,) = ws.get_simultaneous((torch.Size([2, 3]), f32))
    assert tuple(v.shape) == (2, 3)
    import numpy as np

    (w,) = ws.get_simultaneous(((np.int64(4), 2), f16))
    assert tuple(w.shape) == (4, 2) and w.dtype == f16
    (s,) = ws.get_simultaneous(((), f64))  # 0-d tensor: 8 bytes
    assert s.shape == () and s.dtype == f64


# --------------------------------------------------------------------------- #
# Zero-size requests                                                          #
# --------------------------------------------------------------------------- #


def test_all_empty_first_request_returns_shaped_empty_views_and_allocates_nothing():
    # vLLM 0.33 crashes with a TypeError here; we must not.
    ws = WorkspaceManager("cpu")
    a, b = ws.get_simultaneous(((0,), f32), ((2, 0, 3), bf16))
    assert tuple(a.shape) == (0,) and a.dtype == f32
    assert tuple(b.shape) == (2, 0, 3) and b.dtype == bf16
    assert a.numel() == b.numel() == 0
    assert ws.size_bytes() == 0 and ws.buffer(0) is None
    assert ws.events == []
    assert ws.get_simultaneous() == []


def test_all_empty_request_on_a_locked_empty_workspace_is_not_a_violation():
    ws = WorkspaceManager("cpu", 2)
    ws.lock()
    with ubatch_context(1):
        (a,) = ws.get_simultaneous(((0, 128), f16))
    assert tuple(a.shape) == (0, 128)
    assert [e.kind for e in ws.events] == ["lock"]


def test_mixed_empty_and_nonempty_layout():
    reqs = (((0,), f32), ((3,), f32), ((0, 5), f16), ((1,), u8))
    lay = compute_layout(reqs)
    assert lay.nbytes == (0, 12, 0, 1)
    assert lay.offsets == (0, 0, 256, 256)
    assert lay.total_bytes == 512
    ws = WorkspaceManager("cpu")
    views = ws.get_simultaneous(*reqs)
    assert [tuple(v.shape) for v in views] == [(0,), (3,), (0, 5), (1,)]
    assert ws.size_bytes() == 512
    assert views[3].data_ptr() - ws.buffer(0).data_ptr() == 256


# --------------------------------------------------------------------------- #
# Growth                                                                      #
# --------------------------------------------------------------------------- #


def test_growth_events_record_free_then_allocate_peak_on_meta():
    ws = WorkspaceManager("meta")
    ws.get_simultaneous(((64 * MiB,), u8))
    ws.get_simultaneous(((128 * MiB,), u8))
    kinds = [(e.kind, e.old_bytes, e.new_bytes, e.ubatch, e.live_bytes, e.peak_bytes) for e in ws.events]
    assert kinds == [
        ("resize", 0, 64 * MiB, 0, 64 * MiB, 64 * MiB),
        ("resize", 64 * MiB, 128 * MiB, 0, 128 * MiB, 128 * MiB),
    ]
    assert ws.peak_live_bytes == 128 * MiB
    assert ws.live_bytes() == 128 * MiB
    assert ws.events[0].t <= ws.events[1].t


def test_allocate_then_free_policy_peaks_at_old_plus_new():
    ws = WorkspaceManager("meta", growth_policy="allocate_then_free")
    ws.get_simultaneous(((64 * MiB,), u8))
    ws.get_simultaneous(((128 * MiB,), u8))
    assert [e.peak_bytes for e in ws.events] == [64 * MiB, 192 * MiB]
    assert ws.peak_live_bytes == 192 * MiB
    assert ws.live_bytes() == 128 * MiB  # same end state, higher peak


@pytest.mark.parametrize(
    "policy, freed_before_alloc",
    [
        pytest.param(
            "free_then_allocate",
            True,
        ),
        ("allocate_then_free", False),
    ],
)
def test_old_buffer_is_released_before_the_new_one_is_allocated(monkeypatch, policy, freed_before_alloc):
    ws = WorkspaceManager("cpu", growth_policy=policy)
    ws.get_simultaneous(((1024,), u8))  # views discarded at once
    old = weakref.ref(ws.buffer(0))
    seen = []
    real_empty = torch.empty

    def spy(*args, **kwargs):
        seen.append(old() is None)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", spy)
    ws.get_simultaneous(((4096,), u8))
    monkeypatch.undo()
    assert seen == [freed_before_alloc]
    assert old() is None  # gone either way afterwards
    assert ws.size_bytes() == 4096


def test_smaller_request_never_shrinks_and_larger_one_grows_to_exact_need():
    ws = WorkspaceManager("cpu")
    ws.get_simultaneous(((1000,), u8))
    assert ws.size_bytes() == 1024
    buf = ws.buffer(0)
    ws.get_simultaneous(((10,), f32))
    assert ws.buffer(0) is buf and ws.size_bytes() == 1024
    ws.get_simultaneous(((300,), f32), ((1,), u8))  # 1200 -> 1280, + 256
    assert ws.size_bytes() == 1536
    assert ws.buffer(0) is not buf
    assert [e.kind for e in ws.events] == ["resize", "resize"]


def test_only_the_requesting_slot_grows():
    ws = WorkspaceManager("cpu", 2)
    with ubatch_context(1):
        (held,) = ws.get_simultaneous(((512,), u8))
    ptr1 = held.data_ptr()
    ws.get_simultaneous(((4096,), u8))  # slot 0
    ws.get_simultaneous(((8192,), u8))  # slot 0 grows again
    assert ws.sizes_bytes() == [8192, 512]
    assert ws.data_ptrs()[1] == ptr1 == held.data_ptr()
    assert [e.ubatch for e in ws.events] == [1, 0, 0]


def test_grow_all_slots_resizes_every_slot_that_is_too_small():
    ws = WorkspaceManager("meta", 3, grow_all_slots=True)
    with ubatch_context(2):
        ws.get_simultaneous(((2048,), u8))
    assert ws.sizes_bytes() == [2048, 2048, 2048]
    assert [(e.ubatch, e.new_bytes, e.live_bytes) for e in ws.events] == [(0, 2048, 2048), (1, 2048, 4096), (2, 2048, 6144)]


def test_failed_allocation_is_recorded_and_reraised(monkeypatch):
    ws = WorkspaceManager("cpu")

    def boom(*a, **k):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(torch, "empty", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        ws.get_simultaneous(((256,), u8))
    monkeypatch.undo()
    assert [(e.kind, e.old_bytes, e.new_bytes) for e in ws.events] == [("alloc_failed", 0, 256)]
    assert ws.size_bytes() == 0


# --------------------------------------------------------------------------- #
# Lock                                                                        #
# --------------------------------------------------------------------------- #


def test_lock_error_text_is_exact_and_state_is_preserved():
    ws = WorkspaceManager("cpu")
    (v,) = ws.get_simultaneous(((MiB // 4,), f32))  # 1 MiB
    v.copy_(torch.arange(MiB // 4, dtype=f32))
    ws.lock()
    assert ws.is_locked()
    snap = _snapshot(ws)
    with pytest.raises(WorkspaceLockedError) as ei:
        line = _next_line()
        ws.get_simultaneous(((MiB // 4,), f32), ((MiB // 8,), f32))  # 1.5 MiB
    err = ei.value
    assert isinstance(err, AssertionError)
    assert str(err) == (
        f"Workspace is locked but allocation from '{THIS_FILE}:{line}:"
        "test_lock_error_text_is_exact_and_state_is_preserved' requires 1.50 MB, current size is 1.00 MB. "
        "Workspace growth is not allowed after locking."
    )
    assert (err.required_bytes, err.current_bytes, err.ubatch) == (MiB + MiB // 2, MiB, 0)
    assert err.caller == f"{THIS_FILE}:{line}:test_lock_error_text_is_exact_and_state_is_preserved"
    # buffer, pointer, contents, size and lock state unchanged; one violation event
    _assert_unchanged(ws, snap, extra_events=1)
    last = ws.events[-1]
    assert (last.kind, last.caller, last.old_bytes, last.new_bytes, last.ubatch) == (
        "violation", err.caller, MiB, MiB + MiB // 2, 0,
    )
    assert v.data_ptr() == ws.buffer(0).data_ptr()
    assert torch.equal(v, torch.arange(MiB // 4, dtype=f32))
    # requests that fit still work, and return views in the same buffer
    (again,) = ws.get_simultaneous(((MiB // 4,), f32))
    assert again.data_ptr() == snap["ptrs"][0]
    small = ws.get_simultaneous(((10,), f16), ((3, 3), i64))
    assert all(ws.buffer(0).data_ptr() <= t.data_ptr() < ws.buffer(0).data_ptr() + MiB for t in small)
    assert ws.is_locked()


def test_unlock_allows_growth_again_and_events_log_lock_unlock():
    ws = WorkspaceManager("cpu")
    ws.get_simultaneous(((256,), u8))
    ws.lock()
    with pytest.raises(WorkspaceLockedError):
        ws.get_simultaneous(((512,), u8))
    ws.unlock()
    assert not ws.is_locked()
    ws.get_simultaneous(((512,), u8))
    assert ws.size_bytes() == 512
    assert [(e.kind, e.old_bytes, e.new_bytes) for e in ws.events] == [
        ("resize", 0, 256), ("lock", 256, 256), ("violation", 256, 512), ("unlock", 256, 256), ("resize", 256, 512),
    ]


def test_lock_error_in_a_dbo_slot_reports_that_slot():
    ws = WorkspaceManager("cpu", 2)
    ws.get_simultaneous(((4096,), u8))
    ws.lock()
    with ubatch_context(1), pytest.raises(WorkspaceLockedError) as ei:
        ws.get_simultaneous(((512,), u8))
    assert (ei.value.required_bytes, ei.value.current_bytes, ei.value.ubatch) == (512, 0, 1)
    assert ws.events[-1].ubatch == 1


# --------------------------------------------------------------------------- #
# Caller attribution                                                          #
# --------------------------------------------------------------------------- #


def _consumer(ws: WorkspaceManager, nbytes: int) -> list[torch.Tensor]:
    return ws.get_simultaneous(((nbytes,), u8))


_CONSUMER_LINE = _consumer.__code__.co_firstlineno + 1


def test_caller_is_the_first_frame_outside_the_manager():
    ws = WorkspaceManager("cpu")
    line = _next_line()
    ws.get_simultaneous(((300,), u8))
    assert ws.events[-1].caller == f"{THIS_FILE}:{line}:test_caller_is_the_first_frame_outside_the_manager"
    _consumer(ws, 1000)
    assert ws.events[-1].caller == f"{THIS_FILE}:{_CONSUMER_LINE}:_consumer"
    line = _next_line()
    ws.lock()
    assert ws.events[-1].caller == f"{THIS_FILE}:{line}:test_caller_is_the_first_frame_outside_the_manager"
    with pytest.raises(WorkspaceLockedError) as ei:
        _consumer(ws, 5000)
    assert ei.value.caller == f"{THIS_FILE}:{_CONSUMER_LINE}:_consumer"
    assert f"allocation from '{THIS_FILE}:{_CONSUMER_LINE}:_consumer' requires" in str(ei.value)


def test_caller_inside_ubatch_context_and_module_helpers_skips_contextlib_and_workspace(fresh_global):
    ws = init_workspace_manager("cpu", 2)
    with ubatch_context(1):
        line = _next_line()
        ws.get_simultaneous(((300,), u8))
    assert ws.events[-1].caller.startswith(f"{THIS_FILE}:{line}:")
    line = _next_line()
    lock_workspace()
    assert ws.events[-1].caller == (
        f"{THIS_FILE}:{line}:test_caller_inside_ubatch_context_and_module_helpers_skips_contextlib_and_workspace"
    )


# --------------------------------------------------------------------------- #
# DBO slots and threads                                                       #
# --------------------------------------------------------------------------- #


def test_ubatch_context_sets_and_restores_the_slot():
    assert current_ubatch_id() == 0
    with ubatch_context(1) as i:
        assert i == 1 and current_ubatch_id() == 1
        with ubatch_context(0):
            assert current_ubatch_id() == 0
        assert current_ubatch_id() == 1
    assert current_ubatch_id() == 0
    with pytest.raises(KeyError):
        with ubatch_context(1):
            raise KeyError("x")
    assert current_ubatch_id() == 0


def test_slot_isolation_across_threads():
    ws = WorkspaceManager("cpu", 2)
    sizes = {0: 1024, 1: 3072}
    inside = threading.Barrier(2, timeout=10)
    turn = [threading.Event(), threading.Event()]
    seen: dict[int, object] = {}
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        try:
            with ubatch_context(slot):
                inside.wait()  # both threads are inside their contexts now
                seen[("id", slot)] = current_ubatch_id()
                turn[slot].wait(10)
                (v,) = ws.get_simultaneous(((sizes[slot],), u8))
                v.fill_(slot + 1)
                seen[("ptr", slot)] = v.data_ptr()
                seen[("id_after", slot)] = current_ubatch_id()
                if slot == 0:
                    turn[1].set()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    assert current_ubatch_id() == 0  # the main thread is unaffected
    turn[0].set()
    for t in threads:
        t.join(20)
    assert not errors
    assert seen[("id", 0)] == 0 and seen[("id", 1)] == 1
    assert seen[("id_after", 0)] == 0 and seen[("id_after", 1)] == 1
    assert ws.sizes_bytes() == [1024, 3072]
    assert seen[("ptr", 0)] == ws.data_ptrs()[0] and seen[("ptr", 1)] == ws.data_ptrs()[1]
    assert torch.all(ws.buffer(0) == 1) and torch.all(ws.buffer(1) == 2)
    assert sorted(e.ubatch for e in ws.events) == [0, 1]


def test_concurrent_requests_in_two_slots_stay_in_their_own_buffer():
    ws = WorkspaceManager("cpu", 2)
    start = threading.Barrier(2, timeout=10)
    bad: list[str] = []

    def worker(slot: int) -> None:
        with ubatch_context(slot):
            start.wait()
            for i in range(1, 60):
                views = ws.get_simultaneous(((i * 37 + slot,), f32), ((i,), f16))
                buf = ws.buffer(slot)
                lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
                for v in views:
                    if not lo <= v.data_ptr() <= v.data_ptr() + v.numel() * v.element_size() <= hi:
                        bad.append(f"slot {slot} call {i}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert bad == []
    need = compute_layout((((59 * 37,), f32), ((59,), f16))).total_bytes
    need1 = compute_layout((((59 * 37 + 1,), f32), ((59,), f16))).total_bytes
    assert ws.sizes_bytes() == [need, need1]


# --------------------------------------------------------------------------- #
# Bad inputs                                                                  #
# --------------------------------------------------------------------------- #

BAD_REQUESTS = [
    pytest.param((((-1, 4), f32),), ValueError, r"-1", id="negative-dim"),
    pytest.param((((4.0, 2), f32),), TypeError, r"4\.0", id="float-dim"),
    pytest.param((((True, 2), f32),), TypeError, r"True", id="bool-dim"),
    pytest.param((((2, "3"), f32),), TypeError, r"'3'", id="str-dim"),
    pytest.param((((2, None), f32),), TypeError, r"None", id="none-dim"),
    pytest.param((((4,), "float32"),), TypeError, r"'float32'", id="str-dtype"),
    pytest.param((((4,), float),), TypeError, r"float", id="python-type-dtype"),
    pytest.param((((4,), None),), TypeError, r"None", id="none-dtype"),
    pytest.param(((5, f32),), TypeError, r"5", id="int-shape"),
    pytest.param((("abc", f32),), TypeError, r"'abc'", id="str-shape"),
    pytest.param(((None, f32),), TypeError, r"None", id="none-shape"),
    pytest.param((((4,),),), TypeError, r"\(shape, dtype\)", id="not-a-pair"),
    pytest.param((((4,), f32, 1),), TypeError, r"\(shape, dtype\)", id="triple"),
    # the bad item is the second one; the first alone would need growth
    pytest.param((((100_000,), u8), ((3, -2), f16)), ValueError, r"request 1.*-2", id="second-request-negative"),
]


@pytest.mark.parametrize("locked", [False, True], ids=["unlocked", "locked"])
@pytest.mark.parametrize("reqs, exc, pattern", BAD_REQUESTS)
def test_bad_input_names_the_item_and_changes_nothing(reqs, exc, pattern, locked):
    ws = WorkspaceManager("cpu")
    (v,) = ws.get_simultaneous(((64,), u8))
    v.copy_(torch.arange(64, dtype=u8))
    if locked:
        ws.lock()
    snap = _snapshot(ws)
    with pytest.raises(exc, match=pattern):
        ws.get_simultaneous(*reqs)
    with pytest.raises(exc, match=pattern):
        ws.layout(*reqs)
    with pytest.raises(exc, match=pattern):
        compute_layout(reqs)
    _assert_unchanged(ws, snap)
    assert torch.equal(v, torch.arange(64, dtype=u8))


@pytest.mark.parametrize(
    "good, bad, exc, pattern",
    [
        (((4, 2), f32), ((4.0, 2), f32), TypeError, r"4\.0"),
        (((1, 2), f32), ((True, 2), f32), TypeError, r"True"),
        (((0, 2), f32), ((False, 2), f32), TypeError, r"False"),
        (((8,), f16), ((8.0,), f16), TypeError, r"8\.0"),
    ],
    ids=["4.0-after-4", "True-after-1", "False-after-0", "8.0-after-8"],
)
def test_bad_input_after_an_equal_looking_successful_signature(good, bad, exc, pattern):
    # (4.0, 2) == (4, 2) and hash alike: a signature cache must not let it through.
    assert bad == good and hash(bad) == hash(good)
    ws = WorkspaceManager("cpu")
    ws.get_simultaneous(good)
    ws.get_simultaneous(good)  # now certainly cached
    snap = _snapshot(ws)
    with pytest.raises(exc, match=pattern):
        ws.get_simultaneous(bad)
    _assert_unchanged(ws, snap)
    ws.lock()
    snap = _snapshot(ws)
    with pytest.raises(exc, match=pattern):
        ws.get_simultaneous(bad)
    _assert_unchanged(ws, snap)


def test_out_of_range_slot_is_a_value_error_and_changes_nothing():
    ws = WorkspaceManager("cpu", 2)
    ws.get_simultaneous(((256,), u8))
    snap = _snapshot(ws)
    with ubatch_context(2):
        with pytest.raises(ValueError, match=r"slot 2 is out of range.*2 slot"):
            ws.get_simultaneous(((16,), u8))
        with pytest.raises(ValueError, match=r"slot 2"):
            ws.get_simultaneous(((0,), u8))
    _assert_unchanged(ws, snap)
    for bad, exc in [(2, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match=repr(bad) if exc is TypeError else str(bad)):
            ws.size_bytes(bad)
        with pytest.raises(exc):
            ws.buffer(bad)


@pytest.mark.parametrize(
    "bad, exc", [(-1, ValueError), ("0", TypeError), (True, TypeError), (1.0, TypeError), (None, TypeError)]
)
def test_ubatch_context_rejects_bad_ids(bad, exc):
    with pytest.raises(exc, match=repr(bad) if exc is TypeError else str(bad)):
        with ubatch_context(bad):
            pass  # pragma: no cover
    assert current_ubatch_id() == 0


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(device="cpu", num_ubatches=0), ValueError, r"num_ubatches.*0"),
        (dict(device="cpu", num_ubatches=-2), ValueError, r"-2"),
        (dict(device="cpu", num_ubatches=2.0), TypeError, r"2\.0"),
        (dict(device="cpu", num_ubatches=True), TypeError, r"True"),
        (dict(device="not-a-device"), ValueError, r"not-a-device"),
        (dict(device="cpu", growth_policy="grow_in_place"), ValueError, r"grow_in_place"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        WorkspaceManager(**kwargs)


def test_constructor_defaults():
    ws = WorkspaceManager("cpu")
    assert ws.num_ubatches == 1 and ws.device == torch.device("cpu")
    assert not ws.is_locked() and ws.sizes_bytes() == [0] and ws.live_bytes() == 0
    assert ws.data_ptrs() == [0] and ws.events == [] and ws.peak_live_bytes == 0
    assert WorkspaceManager(torch.device("meta"), 2).sizes_bytes() == [0, 0]
    assert "locked=False" in repr(ws)


# --------------------------------------------------------------------------- #
# TQLAB_DEBUG_WORKSPACE logging                                               #
# --------------------------------------------------------------------------- #


def test_debug_logging_when_enabled(monkeypatch, caplog):
    monkeypatch.setenv("TQLAB_DEBUG_WORKSPACE", "1")
    caplog.set_level(logging.INFO, logger="tqlab.core.workspace")
    ws = WorkspaceManager("meta", 2)
    line = _next_line()
    ws.get_simultaneous(((2 * MiB,), u8))
    ws.lock()
    with pytest.raises(WorkspaceLockedError):
        ws.get_simultaneous(((3 * MiB,), u8))
    ws.unlock()
    msgs = [r.getMessage() for r in caplog.records if r.name == "tqlab.core.workspace"]
    caller = f"{THIS_FILE}:{line}:test_debug_logging_when_enabled"
    assert msgs[0] == (
        f"[WORKSPACE DEBUG] Resized workspace from '{caller}': 0.00 MB -> 2.00 MB (slot 0 of 2, total memory 2.00 MB)"
    )
    assert msgs[1] == "[WORKSPACE DEBUG] Workspace locked. Current sizes: [2.00, 0.00]"
    assert msgs[2].startswith("[WORKSPACE DEBUG] violation from 'test_workspace.py:")
    assert msgs[2].endswith("(slot 0): 3.00 MB requested, 2.00 MB held")
    assert msgs[3] == "[WORKSPACE DEBUG] Workspace unlocked. Current sizes: [2.00, 0.00]"
    assert len(msgs) == 4


@pytest.mark.parametrize("value", [None, "0", ""])
def test_no_debug_logging_when_disabled(monkeypatch, caplog, value):
    if value is None:
        monkeypatch.delenv("TQLAB_DEBUG_WORKSPACE", raising=False)
    else:
        monkeypatch.setenv("TQLAB_DEBUG_WORKSPACE", value)
    caplog.set_level(logging.DEBUG)
    ws = WorkspaceManager("meta")
    ws.get_simultaneous(((MiB,), u8))
    ws.lock()
    ws.unlock()
    assert [r for r in caplog.records if r.name == "tqlab.core.workspace"] == []
    assert len(ws.events) == 3  # events are recorded regardless


# --------------------------------------------------------------------------- #
# Module helpers and re-warm                                                  #
# --------------------------------------------------------------------------- #


def test_module_helpers(fresh_global):
    assert not is_workspace_manager_initialized()
    for fn in (current_workspace_manager, lock_workspace, unlock_workspace):
        with pytest.raises(RuntimeError, match="not initialized"):
            fn()
    m = init_workspace_manager("meta", 2)
    assert is_workspace_manager_initialized()
    assert current_workspace_manager() is m
    assert m.num_ubatches == 2 and m.device.type == "meta"
    lock_workspace()
    assert m.is_locked()
    unlock_workspace()
    assert not m.is_locked()
    m2 = init_workspace_manager("cpu", growth_policy="allocate_then_free")
    assert current_workspace_manager() is m2 and m2 is not m
    assert m2.growth_policy == "allocate_then_free" and m2.num_ubatches == 1
    reset_workspace_manager()
    assert not is_workspace_manager_initialized()
    with pytest.raises(RuntimeError):
        current_workspace_manager()


def test_init_with_bad_arguments_keeps_the_previous_manager(fresh_global):
    m = init_workspace_manager("cpu")
    with pytest.raises(ValueError):
        init_workspace_manager("cpu", 0)
    assert current_workspace_manager() is m


def test_rewarm_unlocks_then_relocks():
    ws = WorkspaceManager("cpu")
    ws.get_simultaneous(((256,), u8))
    ws.lock()
    with rewarm_workspace(ws) as m:
        assert m is ws and not ws.is_locked()
        ws.get_simultaneous(((1024,), u8))
    assert ws.is_locked() and ws.size_bytes() == 1024
    assert [e.kind for e in ws.events] == ["resize", "lock", "unlock", "resize", "lock"]


def test_rewarm_relocks_even_when_the_body_raises():
    ws = WorkspaceManager("cpu")
    ws.lock()

    class WarmupFailed(Exception):
        pass

    with pytest.raises(WarmupFailed):
        with rewarm_workspace(ws):
            ws.get_simultaneous(((512,), u8))
            raise WarmupFailed("re-warm-up crashed")
    assert ws.is_locked()
    assert ws.size_bytes() == 512
    with pytest.raises(WorkspaceLockedError):
        ws.get_simultaneous(((1024,), u8))


def test_rewarm_defaults_to_the_module_manager(fresh_global):
    m = init_workspace_manager("cpu")
    lock_workspace()
    with pytest.raises(ZeroDivisionError):
        with rewarm_workspace() as got:
            assert got is m and not m.is_locked()
            1 / 0
    assert m.is_locked()


def test_public_names_are_exported():
    for name in (
        "WorkspaceManager", "WorkspaceLockedError", "ubatch_context", "init_workspace_manager",
        "current_workspace_manager", "is_workspace_manager_initialized", "lock_workspace",
        "unlock_workspace", "reset_workspace_manager", "rewarm_workspace",
    ):
        assert name in wsmod.__all__ and hasattr(wsmod, name)
    assert issubclass(WorkspaceLockedError, AssertionError)


# --------------------------------------------------------------------------- #
# Property: views are 256-aligned, in bounds and never overlap                #
# --------------------------------------------------------------------------- #

DTYPES = [u8, i8, f16, bf16, f32, i32, f64, i64, torch.bool, torch.complex64]
request_st = st.tuples(
    st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    st.sampled_from(DTYPES),
)
call_st = st.lists(request_st, min_size=0, max_size=8)


@settings(max_examples=100)
@given(calls=st.lists(call_st, min_size=1, max_size=3), slots=st.integers(1, 2))
def test_views_are_aligned_in_bounds_and_disjoint(calls, slots):
    ws = WorkspaceManager("cpu", slots)
    for k, call in enumerate(calls):
        slot = k % slots
        with ubatch_context(slot):
            views = ws.get_simultaneous(*call)
        lay = compute_layout(call)
        assert lay.total_bytes == sum(round_up(n, ALIGNMENT) for n in lay.nbytes)
        assert ws.size_bytes(slot) >= lay.total_bytes
        buf = ws.buffer(slot)
        base = 0 if buf is None else buf.data_ptr()
        size = ws.size_bytes(slot)
        spans = []
        for v, (shape, dt), off, n in zip(views, call, lay.offsets, lay.nbytes):
            assert tuple(v.shape) == shape and v.dtype == dt
            assert off % ALIGNMENT == 0
            assert v.numel() * v.element_size() == n
            if n:
                assert v.data_ptr() - base == off
                assert 0 <= off and off + n <= size
                spans.append((off, off + n))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        # physical check: write a distinct byte into every view, read all back
        for i, v in enumerate(views):
            if v.numel():
                v.reshape(-1).view(u8).fill_(i + 1)
        for i, v in enumerate(views):
            if v.numel():
                assert torch.all(v.reshape(-1).view(u8) == i + 1)


def test_clear_caches_forgets_layouts_and_views_but_keeps_buffer_size_and_lock():
    """The public way to time a cold call (strategies.allocator): same buffer, fresh layout and views."""
    m = WorkspaceManager(torch.device("cpu"))
    shapes = (((4, 8), torch.float32), ((3,), torch.float16))
    first = m.get_simultaneous(*shapes)
    m.lock()
    ptr, size = m.data_ptrs(), m.size_bytes()
    m.clear_caches()
    again = m.get_simultaneous(*shapes)
    assert again[0] is not first[0] and again[0].data_ptr() == first[0].data_ptr()
    assert (m.data_ptrs(), m.size_bytes(), m.is_locked()) == (ptr, size, True)
