"""The retained tail of vLLM 0.34 (``WorkspaceManager.get_retained``) and the per-version manager API.

Every expected value below is vLLM 0.34's ``vllm/v1/worker/workspace.py`` worked by hand:
``start = round_down(size - nbytes, 256)``; ``intact`` iff the slot's remembered ``(key, start)`` equals
this call's; ``get_simultaneous`` forgets it when its 256-rounded total exceeds ``start``; a reallocation
forgets it. ``parity/test_workspace_parity.py`` drives vLLM 0.34's own manager beside this one.
"""

from __future__ import annotations

import pytest
import torch

from tqlab.core import vllm_versions
from tqlab.core.workspace import (
    WorkspaceLockedError,
    WorkspaceManager,
    init_workspace_manager,
    reset_workspace_manager,
    ubatch_context,
    use_workspace_lane,
)


def _offset(view: torch.Tensor, m: WorkspaceManager, ubatch: int = 0, lane: int = 0) -> int:
    return view.data_ptr() - m.buffer(ubatch, lane).data_ptr()


def test_first_call_grows_to_the_exact_bytes_and_is_not_intact():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    view, intact = m.get_retained("k", (10, 10), torch.float16)  # 200 bytes, unaligned growth
    assert (tuple(view.shape), view.dtype, intact) == ((10, 10), torch.float16, False)
    assert m.sizes_bytes() == [200]
    assert _offset(view, m) == 0 and m.retained_span() == ("k", 0)


def test_tail_offset_is_rounded_down_to_256():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_simultaneous(((5000,), torch.uint8))
    view, intact = m.get_retained("k", (100,), torch.float32)  # buffer 5120; 400 bytes: round_down(4720, 256)
    assert (_offset(view, m), intact, m.retained_span()) == (4608, False, ("k", 4608))
    again, intact = m.get_retained("k", (100,), torch.float32)
    assert intact is True and again.data_ptr() == view.data_ptr()


def test_contents_survive_smaller_head_requests_and_are_lost_when_one_reaches_in():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_simultaneous(((4096,), torch.uint8))
    tail, _ = m.get_retained("kv", (256,), torch.uint8)  # start 3840
    tail.fill_(7)
    (head,) = m.get_simultaneous(((3840,), torch.uint8))  # total 3840 == start: does not reach in
    head.fill_(1)
    view, intact = m.get_retained("kv", (256,), torch.uint8)
    assert intact is True and int(view.sum()) == 7 * 256
    m.get_simultaneous(((3841,), torch.uint8))  # rounds to 4096 > 3840: reaches into the span
    assert m.retained_span() is None
    _, intact = m.get_retained("kv", (256,), torch.uint8)
    assert intact is False and m.retained_span() == ("kv", 3840)


def test_another_key_takes_the_span_over():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_simultaneous(((4096,), torch.uint8))
    m.get_retained("a", (256,), torch.uint8)
    assert m.get_retained("b", (256,), torch.uint8)[1] is False
    assert m.get_retained("a", (256,), torch.uint8)[1] is False  # only the latest key is remembered
    assert m.get_retained("a", (256,), torch.uint8)[1] is True


def test_same_key_other_size_same_start_counts_as_intact_as_in_vllm():
    """vLLM compares (key, start), not the size: 100 and 200 bytes of a 4096-byte buffer both start at 3840."""
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_simultaneous(((4096,), torch.uint8))
    m.get_retained("k", (100,), torch.uint8)
    assert m.get_retained("k", (200,), torch.uint8)[1] is True
    assert m.get_retained("k", (300,), torch.uint8)[1] is False  # round_down(3796, 256) = 3584
    assert m.retained_span() == ("k", 3584)


def test_reallocation_forgets_the_span():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_retained("k", (512,), torch.uint8)
    m.get_simultaneous(((1024,), torch.uint8))  # grows the slot: a new buffer
    assert m.retained_span() is None
    view, intact = m.get_retained("k", (512,), torch.uint8)
    assert (intact, _offset(view, m), m.sizes_bytes()) == (False, 512, [1024])
    m.get_retained("k", (2048,), torch.uint8)  # grows through get_retained itself
    assert m.sizes_bytes() == [2048] and m.retained_span() == ("k", 0)


def test_locked_refusal_uses_vllms_message_and_keeps_the_span():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    m.get_retained("k", (1024,), torch.uint8)
    m.lock()
    with pytest.raises(WorkspaceLockedError) as e:
        m.get_retained("k", (2 * 1024 * 1024,), torch.uint8)
    assert str(e.value).startswith("Workspace is locked but allocation from 'test_workspace_retained.py:")
    assert "requires 2.00 MB, current size is 0.00 MB. Workspace growth is not allowed after locking." in str(e.value)
    assert m.retained_span() == ("k", 0) and m.get_retained("k", (1024,), torch.uint8)[1] is True


def test_each_ubatch_and_lane_has_its_own_span():
    m = WorkspaceManager("cpu", 2, 2, vllm_version="0.34")
    m.get_retained("k", (256,), torch.uint8)
    with ubatch_context(1), use_workspace_lane(1):
        assert m.get_retained("k", (256,), torch.uint8)[1] is False
        assert m.retained_span(1, 1) == ("k", 0)
    assert m.retained_span(0, 1) is None and m.get_retained("k", (256,), torch.uint8)[1] is True


def test_bad_input_changes_nothing():
    m = WorkspaceManager("cpu", vllm_version="0.34")
    with pytest.raises(ValueError, match="0 bytes"):
        m.get_retained("k", (0,), torch.uint8)
    with pytest.raises((TypeError, ValueError)):
        m.get_retained("k", (-1,), torch.uint8)
    assert m.sizes_bytes() == [0] and m.retained_span() is None


def test_a_033_manager_has_no_get_retained():
    m = WorkspaceManager("cpu", vllm_version="0.33")
    assert not hasattr(m, "get_retained")
    with pytest.raises(AttributeError, match="vLLM 0.33's manager has none"):
        m.get_retained("k", (1,), torch.uint8)
    assert str(m.vllm_version) == "vLLM 0.33"


def test_the_manager_takes_the_runs_version(monkeypatch):
    monkeypatch.delenv(vllm_versions.ENV, raising=False)
    try:
        assert WorkspaceManager("cpu").vllm_version.name == vllm_versions.DEFAULT == "0.33"  # 0.34's rules: partial
        vllm_versions.select("0.33")
        assert init_workspace_manager("cpu").vllm_version.name == "0.33"
        assert init_workspace_manager("cpu", vllm_version="0.34").vllm_version.name == "0.34"
    finally:
        vllm_versions.reset()
        reset_workspace_manager()


def test_unknown_version_is_refused():
    with pytest.raises(ValueError, match=r"unsupported vLLM version '0.20': tqlab models 0.33, 0.34"):
        WorkspaceManager("cpu", vllm_version="0.20")
