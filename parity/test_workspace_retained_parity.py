"""vLLM 0.34's ``get_retained`` beside tqlab's, and each version's manager API (parity/README.md, "vLLM 0.34").

In a vLLM 0.34 environment: random sequences of ``get_simultaneous`` / ``get_retained`` / lock / unlock
over two ubatch slots drive vLLM's manager and a tqlab manager built for 0.34 in lockstep; compared after
every step: the outcome (view shape, dtype, byte offset in the slot buffer, ``intact``; or the error's type
and text, caller included), each slot's size and the remembered ``(key, start)`` span. In a vLLM 0.33
environment: neither vLLM's manager nor tqlab's 0.33 manager has ``get_retained``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_workspace_parity import _request, vllm_buffer, vllm_sizes, vllm_slot
from tqlab.core import vllm_versions
from tqlab.core.workspace import WorkspaceManager, ubatch_context

import vllm

VERSION = vllm_versions.get(".".join(vllm.__version__.split(".")[:2]))
HAS = VERSION.has_get_retained


def _retained(manager, key, shape, dtype):
    """The single call site both managers' ``get_retained`` go through (their caller in messages)."""
    return manager.get_retained(key, shape, dtype)


def _outcome(fn, base):
    try:
        out = fn()
    except Exception as e:
        return ("error", "AssertionError" if isinstance(e, AssertionError) else type(e).__name__, str(e))
    views, extra = (out, None) if isinstance(out, list) else ([out[0]], out[1])
    b = base()
    return ("ok", extra, tuple((tuple(t.shape), t.dtype, t.storage_offset() * t.element_size() if b is not None else None)
                               for t in views))


def test_the_version_has_what_tqlab_says(record):
    from vllm.v1.worker.workspace import WorkspaceManager as VManager

    v = VManager(torch.device("cpu"), 1)
    assert hasattr(v, "get_retained") == HAS
    assert hasattr(WorkspaceManager("cpu", vllm_version=VERSION), "get_retained") == HAS
    import vllm.v1.worker.workspace as vws

    assert getattr(vws, "_VIEW_ALIGNMENT", 256) == VERSION.view_alignment
    record("version", {"vllm": vllm.__version__, "get_retained": HAS})


sizes = st.one_of(st.integers(1, 300), st.integers(300, 9000))  # 0 on a fresh slot: divergence 1
op_st = st.one_of(
    st.tuples(st.just("get"), st.integers(0, 1), sizes, st.sampled_from([torch.uint8, torch.float32])),
    st.tuples(st.just("retained"), st.integers(0, 1), st.integers(1, 3000),
              st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([torch.uint8, torch.bfloat16]))),
    st.tuples(st.just("lock"), st.just(0), st.just(0), st.just(None)),
    st.tuples(st.just("unlock"), st.just(0), st.just(0), st.just(None)),
)
_STATS = {"sequences": 0, "intact": 0, "not_intact": 0, "refusals": 0, "forgotten": 0}


@pytest.mark.skipif(not HAS, reason=f"vLLM {vllm.__version__}'s manager has no get_retained")
@settings(max_examples=250)
@given(ops=st.lists(op_st, min_size=1, max_size=24))
def test_random_sequences_with_get_retained_match(ops):
    from vllm.v1.worker.workspace import WorkspaceManager as VManager

    v, t = VManager(torch.device("cpu"), 2), WorkspaceManager("cpu", 2, vllm_version=VERSION)
    _STATS["sequences"] += 1
    for kind, slot, n, arg in ops:
        if kind in ("lock", "unlock"):
            getattr(v, kind)(), getattr(t, kind)()
            continue
        before = v._retained[slot]
        if kind == "get":
            reqs = (((n,), arg),)
            with vllm_slot(slot):
                v_out = _outcome(lambda: _request(v, reqs), lambda: vllm_buffer(v, slot))
            with ubatch_context(slot):
                t_out = _outcome(lambda: _request(t, reqs), lambda: t.buffer(slot))
        else:
            key, dtype = arg
            shape = (n,) if dtype == torch.uint8 else (n, 1)
            with vllm_slot(slot):
                v_out = _outcome(lambda: _retained(v, key, shape, dtype), lambda: vllm_buffer(v, slot))
            with ubatch_context(slot):
                t_out = _outcome(lambda: _retained(t, key, shape, dtype), lambda: t.buffer(slot))
            if v_out[0] == "ok":
                _STATS["intact" if v_out[1] else "not_intact"] += 1
        assert v_out == t_out
        _STATS["refusals"] += v_out[0] == "error"
        _STATS["forgotten"] += before is not None and v._retained[slot] is None
        assert vllm_sizes(v) == t.sizes_bytes()
        assert v._retained == [t.retained_span(i) for i in range(2)]


def test_zz_record_retained_stats(record):
    if _STATS["sequences"] == 0:
        pytest.skip("the get_retained sequence test did not run in this session")
    assert all(x > 0 for x in _STATS.values()), _STATS
    record("differential_get_retained", dict(_STATS))
