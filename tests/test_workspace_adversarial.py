"""WorkspaceManager under hostile input and threads (issue 14, state part).

* Lost bytes: the issue's exact case — ``((2**63 - 1,), torch.uint8)`` rounds to
  exactly 2**63 bytes and is refused with ``ValueError`` before anything is freed;
  the 1000 floats written before are still there, at the same pointer.
* Every refused call (``TypeError``, ``ValueError``, ``torch.OutOfMemoryError``
  from the pre-free allocator check, ``WorkspaceLockedError``) leaves every
  slot's size, pointer and bytes unchanged — a hypothesis test over adversarial
  sizes (0, negative, non-int, bool, 2**62..2**64, many views, 1-3 DBO slots),
  checked against an independent oracle of vLLM's size rules
  (``vllm/v1/worker/workspace.py``: ``round_up(prod(shape) * itemsize, 256)``,
  only the requesting slot grows, to exactly the call's total).
* The lock race: after ``lock()`` returns in one thread no other thread grows
  or moves a buffer (events: lock, then only violations).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tqlab.core.workspace as wsmod
from tqlab.core.workspace import (
    ALIGNMENT,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    ubatch_context,
)

u8, f32 = torch.uint8, torch.float32


def _state(ws: WorkspaceManager) -> tuple:
    """Sizes, pointers and cloned bytes of every slot."""
    bufs = [ws.buffer(i) for i in range(ws.num_ubatches)]
    return (ws.sizes_bytes(), ws.data_ptrs(), [None if b is None else b.clone() for b in bufs], ws.is_locked())


def _same_state(a: tuple, b: tuple) -> bool:
    if a[0] != b[0] or a[1] != b[1] or a[3] != b[3]:
        return False
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a[2], b[2]))


# --------------------------------------------------------------------------- #
# The cases, exact values                                              #
# --------------------------------------------------------------------------- #


def test_lost_bytes_case_is_a_value_error_and_keeps_data_and_pointer():
    m = WorkspaceManager("cpu")
    (a,) = m.get_simultaneous(((1000,), f32))
    a.copy_(torch.arange(1000.0))
    ptr, n_events = m.data_ptrs()[0], len(m.events)
    with pytest.raises(ValueError) as ei:
        m.get_simultaneous(((2**63 - 1,), u8))
    assert str(ei.value) == (
        "request 0: shape (9223372036854775807,) of torch.uint8 needs 9223372036854775807 bytes "
        "(9223372036854775808 rounded up to 256); with the 0 bytes of the views before it the call would need "
        "9223372036854775808 bytes: 2**63 bytes or more, beyond the int64 size torch.empty takes"
    )
    (b,) = m.get_simultaneous(((1000,), f32))
    assert (m.size_bytes(0), m.data_ptrs()[0], len(m.events)) == (4096, ptr, n_events)
    assert torch.equal(b, torch.arange(1000.0))


@pytest.mark.parametrize(
    "call, total",
    [
        ((((2**63 - 256,), u8),), 2**63 - 256),  # the largest call there is
        ((((256,), u8), ((2**63 - 512,), u8)), 2**63 - 256),
        ((((2**61 - 64,), f32),), 2**63 - 256),
        ((((0, 2**63 - 1), f32),), 0),  # a zero dimension makes any other dimension legal up to int64
    ],
)
def test_largest_legal_calls_are_laid_out_exactly(call, total):
    assert compute_layout(call).total_bytes == total
    m = WorkspaceManager("meta")  # meta allocates no memory: the exact size is really taken
    views = m.get_simultaneous(*call)
    assert m.size_bytes(0) == total
    assert [tuple(v.shape) for v in views] == [tuple(s) for s, _ in call]


@pytest.mark.parametrize(
    "call, needed",
    [
        ((((2**63 - 255,), u8),), 2**63),
        ((((2**63 - 1,), u8),), 2**63),
        ((((257,), u8), ((2**63 - 512,), u8)), 2**63),
        ((((2**61,), f32),), 2**63),
        ((((2**62,), u8), ((2**62,), u8)), 2**63),
        ((((2**32, 2**31), f32),), 2**65),
    ],
)
def test_calls_that_round_to_2_pow_63_or_more_are_refused_before_touching_the_buffer(call, needed):
    m = WorkspaceManager("cpu")
    (v,) = m.get_simultaneous(((64,), u8))
    v.copy_(torch.arange(64, dtype=u8))
    before, n_events = _state(m), len(m.events)
    with pytest.raises(ValueError, match=rf"call would need {needed} bytes: 2\*\*63 bytes or more"):
        m.get_simultaneous(*call)
    assert _same_state(before, _state(m)) and len(m.events) == n_events


@pytest.mark.parametrize("dim", [2**63, 2**64])
def test_a_dimension_beyond_int64_is_refused_even_next_to_zero(dim):
    with pytest.raises(ValueError, match=rf"dimension {dim} in shape \(0, {dim}\) exceeds 2\*\*63 - 1"):
        compute_layout((((0, dim), f32),))


def test_zero_size_shapes_follow_torchs_left_to_right_size_product():
    # torch accepts (2**62, 2, 0) and (3, 2**62, 0) (running product < 2**64) but not (4, 2**62, 0)
    m = WorkspaceManager("cpu")
    views = m.get_simultaneous(((2**62, 2, 0), u8), ((3, 2**62, 0), f32))
    assert [tuple(v.shape) for v in views] == [(2**62, 2, 0), (3, 2**62, 0)] and m.size_bytes(0) == 0
    with pytest.raises(ValueError, match=r"up to 4611686018427387904 is 18446744073709551616, which overflows"):
        m.get_simultaneous(((4, 2**62, 0), u8))
    # strides: (0, 2, 2**62) needs a stride of 2**63 elements for dimension 0; torch raises
    # "Stride calculation overflowed" (and silently wraps (0, 4, 2**62) to a stride of 0): both refused
    for shape, stride in (((0, 2, 2**62), 2**63), ((0, 4, 2**62), 2**64)):
        with pytest.raises(ValueError, match=rf"a contiguous stride of {stride} elements exceeds 2\*\*63 - 1"):
            m.get_simultaneous((shape, u8))
    assert m.size_bytes(0) == 0 and m.events == []


def test_growth_the_allocator_cannot_give_is_refused_before_the_old_buffer_is_freed():
    m = WorkspaceManager("cpu")
    (a,) = m.get_simultaneous(((1000,), f32))
    a.copy_(torch.arange(1000.0))
    before = _state(m)
    limit = (8192, True, "a test limit")
    with mock.patch.object(wsmod, "allocator_headroom", return_value=limit):
        with pytest.raises(torch.OutOfMemoryError) as ei:
            m.get_simultaneous(((8193,), u8))
        assert _same_state(before, _state(m))
        (b,) = m.get_simultaneous(((1000,), f32))
        assert torch.equal(b, torch.arange(1000.0))
        m.get_simultaneous(((8192,), u8))  # exactly the limit: accepted
    assert str(ei.value).endswith(
        "to 8448 bytes (0.01 MB) in slot(s) [0] refused before freeing anything: a test limit allows 8192 bytes "
        "(0.01 MB); the buffer, its pointer and its bytes are unchanged"
    )
    assert [(e.kind, e.old_bytes, e.new_bytes) for e in m.events] == [
        ("resize", 0, 4096), ("alloc_failed", 4096, 8448), ("resize", 4096, 8192),
    ]
    assert m.size_bytes(0) == 8192


@pytest.mark.skipif(wsmod.allocator_headroom(torch.device("cpu")) is None, reason="no readable CPU allocator limit")
def test_a_petabyte_on_cpu_is_refused_by_the_real_limit_and_keeps_the_bytes():
    m = WorkspaceManager("cpu")
    (a,) = m.get_simultaneous(((1000,), f32))
    a.copy_(torch.arange(1000.0))
    before = _state(m)
    with pytest.raises(torch.OutOfMemoryError, match=r"1125899906842624 bytes .* refused before freeing anything"):
        m.get_simultaneous(((2**50,), u8))
    assert _same_state(before, _state(m))
    (b,) = m.get_simultaneous(((1000,), f32))
    assert torch.equal(b, torch.arange(1000.0)) and m.data_ptrs() == before[1]


def test_grow_all_slots_preflight_counts_every_slot_against_a_total_limit():
    m = WorkspaceManager("cpu", 2, grow_all_slots=True)
    m.get_simultaneous(((1024,), u8))  # both slots: 1024
    before = _state(m)
    # a total limit: 2 * 4096 needed, 3000 free + the 2 * 1024 freed = 5048 < 8192
    with mock.patch.object(wsmod, "allocator_headroom", return_value=(3000, False, "a test pool")):
        with pytest.raises(torch.OutOfMemoryError, match=r"a test pool allows 5048 bytes"):
            m.get_simultaneous(((4096,), u8))
    assert _same_state(before, _state(m))


def test_locked_refusal_keeps_size_pointer_bytes_and_lock():
    m = WorkspaceManager("cpu")
    (a,) = m.get_simultaneous(((1000,), f32))
    a.copy_(torch.arange(1000.0))
    m.lock()
    before = _state(m)
    with pytest.raises(WorkspaceLockedError, match=r"requires 0\.00 MB, current size is 0\.00 MB"):
        m.get_simultaneous(((1025,), f32))  # 4100 bytes, rounded 4352
    assert _same_state(before, _state(m)) and m.events[-1].kind == "violation"
    assert (m.events[-1].old_bytes, m.events[-1].new_bytes) == (4096, 4352)


# --------------------------------------------------------------------------- #
# The lock race                                                                #
# --------------------------------------------------------------------------- #


def test_lock_waits_for_a_growth_in_progress_deterministic():
    """A slow allocation in one thread; lock() called while it is inside torch.empty."""
    m = WorkspaceManager("cpu")
    m.get_simultaneous(((256,), u8))
    allocating, real_empty = threading.Event(), torch.empty

    def slow_empty(*a, **k):
        allocating.set()
        time.sleep(0.05)  # the window between the lock check and the publish
        return real_empty(*a, **k)

    def grower():
        m.get_simultaneous(((4096,), u8))

    with mock.patch.object(torch, "empty", slow_empty):
        t = threading.Thread(target=grower)
        t.start()
        assert allocating.wait(10)
        m.lock()
        at_lock = (m.size_bytes(0), m.data_ptrs()[0])
        t.join(10)
    assert [e.kind for e in m.events] == ["resize", "resize", "lock"]
    assert at_lock == (4096, m.data_ptrs()[0]) and m.size_bytes(0) == 4096
    with pytest.raises(WorkspaceLockedError):
        m.get_simultaneous(((4097,), u8))


def _race_trial() -> tuple[list[str], bool]:
    m = WorkspaceManager("cpu")
    go = threading.Barrier(2, timeout=10)

    def grower():
        go.wait()
        for k in range(1, 400):
            try:
                m.get_simultaneous(((k * 256,), u8))
            except WorkspaceLockedError:
                return

    t = threading.Thread(target=grower)
    t.start()
    go.wait()
    m.lock()
    at_lock = (m.sizes_bytes(), m.data_ptrs())
    t.join(10)
    kinds = [e.kind for e in m.events]
    return kinds[kinds.index("lock"):], at_lock == (m.sizes_bytes(), m.data_ptrs())


def test_lock_race_300_trials_never_grow_after_lock_returns():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        results = [_race_trial() for _ in range(300)]
    finally:
        sys.setswitchinterval(old)
    after = [k for kinds, _ in results for k in kinds[1:]]
    assert set(after) <= {"violation"}
    assert all(kinds[0] == "lock" for kinds, _ in results)
    assert all(unchanged for _, unchanged in results)


# --------------------------------------------------------------------------- #
# Hypothesis: adversarial sizes against an independent oracle                  #
# --------------------------------------------------------------------------- #

LIMIT = 1 << 20  # allocator limit patched in for the property test (per allocation)
GOOD_DTYPES = [torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.int64,
               torch.complex128, torch.float8_e4m3fn]
BAD_DTYPES = ["float32", float, None, 4, torch.Tensor]
BOUNDARY = [0, 1, 255, 256, 257, 1000, 4096, LIMIT // 4, LIMIT, LIMIT + 1,
            2**31, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 256, 2**63 - 1, 2**63, 2**64]
BAD_DIMS = [-1, -(2**63), 1.0, 4.5, True, False, "3", None, float("nan"), b"1"]

small_st = st.integers(0, 64)
good_dim_st = st.one_of(small_st, small_st, st.sampled_from(BOUNDARY))
bad_dim_st = st.one_of(st.sampled_from(BAD_DIMS), st.integers(-(2**65), -1), st.integers(2**63, 2**65))
good_request_st = st.tuples(
    st.one_of(st.lists(good_dim_st, max_size=3).map(tuple), st.lists(small_st, max_size=3)),
    st.sampled_from(GOOD_DTYPES),
)
bad_request_st = st.one_of(
    st.tuples(st.lists(good_dim_st, max_size=2).flatmap(
        lambda dims: bad_dim_st.map(lambda bad: tuple(dims) + (bad,))), st.sampled_from(GOOD_DTYPES)),
    st.tuples(st.lists(small_st, max_size=3).map(tuple), st.sampled_from(BAD_DTYPES)),
    st.tuples(st.sampled_from([5, None, "ab", 2.0]), st.sampled_from(GOOD_DTYPES)),
    st.sampled_from([(), ((4,),), ((4,), f32, 1), 7, None]),
)
clean_call_st = st.lists(good_request_st, max_size=12)
dirty_call_st = st.tuples(clean_call_st, bad_request_st, st.integers(0, 12)).map(
    lambda t: t[0][: t[2]] + [t[1]] + t[0][t[2]:])
op_st = st.one_of(
    st.tuples(st.just("call"), st.integers(0, 2), st.one_of(clean_call_st, clean_call_st, dirty_call_st)),
    st.tuples(st.just("lock"), st.just(0), st.just([])),
    st.tuples(st.just("unlock"), st.just(0), st.just([])),
)


def _oracle_total(call) -> int | type:
    """vLLM's byte count for a call, or the exception class tqlab must raise (checked in request order)."""
    total = 0
    for req in call:
        if not isinstance(req, (tuple, list)) or len(req) != 2:
            return TypeError
        shape, dtype = req
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, (tuple, list)):
            return TypeError
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, int):
                return TypeError
            if d < 0 or d > 2**63 - 1:
                return ValueError
        if any(math.prod(shape[: k + 1]) >= 2**64 for k in range(len(shape))):
            return ValueError  # torch's uint64 running product of the sizes overflows
        if any(math.prod(max(d, 1) for d in shape[k + 1:]) > 2**63 - 1 for k in range(len(shape))):
            return ValueError  # a contiguous stride does not fit int64
        aligned = -(-math.prod(shape) * dtype.itemsize // 256) * 256
        total += aligned
        if total > 2**63 - 1:
            return ValueError
    return total


def _check_accepted(m, slot, call, views, total, before):
    sizes0, ptrs0 = before[0], before[1]
    grew = total > sizes0[slot]
    assert m.size_bytes(slot) == (total if grew else sizes0[slot])
    if not grew:
        assert m.data_ptrs()[slot] == ptrs0[slot]
    for i in range(m.num_ubatches):  # other slots never change
        if i != slot:
            assert (m.sizes_bytes()[i], m.data_ptrs()[i]) == (sizes0[i], ptrs0[i])
    base, offset = m.data_ptrs()[slot], 0
    for v, (shape, dtype) in zip(views, call):
        n = math.prod(shape) * dtype.itemsize
        assert tuple(v.shape) == tuple(shape) and v.dtype == dtype
        assert offset % ALIGNMENT == 0
        if n:
            assert v.data_ptr() - base == offset and offset + n <= m.size_bytes(slot)
        offset += -(-n // 256) * 256
    assert offset == total


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op_st, min_size=1, max_size=12), slots=st.integers(1, 3))
def test_adversarial_calls_refuse_cleanly_or_follow_vllms_layout(ops, slots):
    m = WorkspaceManager("cpu", slots)
    with mock.patch.object(wsmod, "allocator_headroom", return_value=(LIMIT, True, "test limit")):
        for kind, slot, call in ops:
            if kind != "call":
                getattr(m, kind)()
                continue
            slot %= slots
            before, n_events = _state(m), len(m.events)
            expected = _oracle_total(call)
            if isinstance(expected, int) and expected > before[0][slot]:
                if m.is_locked():
                    expected = WorkspaceLockedError
                elif expected > LIMIT:
                    expected = torch.OutOfMemoryError
            event(f"outcome: {expected.__name__ if isinstance(expected, type) else 'accepted'}")
            with ubatch_context(slot):
                if isinstance(expected, type):
                    with pytest.raises(expected):
                        m.get_simultaneous(*call)
                    assert _same_state(before, _state(m)), (call, expected)
                    assert len(m.events) == n_events + (expected in (WorkspaceLockedError, torch.OutOfMemoryError))
                    continue
                views = m.get_simultaneous(*call)
            _check_accepted(m, slot, call, views, expected, before)
            for i, v in enumerate(views):  # fill, so a later refusal has bytes to lose
                if v.numel():
                    v.view(-1).view(u8).fill_(i + 1)
