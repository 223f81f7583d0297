"""tqlab.core.vllm_rules per release: the capture rules that differ between vLLM 0.33 and 0.34.

Values read from (and, in ``make parity``, compared against) each release's own ``VllmConfig._set_cudagraph_sizes``
(``parity/test_capture_sizes_parity.py``); here the cases where the releases part, and the run's choice.
"""

from __future__ import annotations

import pytest

from tqlab.core import vllm_versions
from tqlab.core.config import EngineConfig
from tqlab.core.vllm_rules import (
    capture_sizes,
    decode_capture_rows,
    decode_capture_sizes,
    decode_rows,
    decode_rows_at_lock,
    jit_warmup_decode_rows,
    locks_workspace,
)


def _cfg(**kw) -> EngineConfig:
    return EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, **kw)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(vllm_versions.ENV, raising=False)
    vllm_versions.reset()
    yield
    vllm_versions.reset()


def test_spec_decode_sizes_part():
    """k = 3, max_num_seqs 4: 0.33 rounds to multiples of 4; 0.34 keeps the prefill grid and counts decode graphs
    in requests."""
    cfg = _cfg(max_num_seqs=4, max_num_batched_tokens=4096, num_speculative_tokens=3)
    assert capture_sizes(cfg, "0.33") == (4, 8, 16, 24, 32)
    assert decode_capture_sizes(cfg, "0.33") == (4, 8, 16)
    assert capture_sizes(cfg, "0.34") == (1, 2, 4, 8, 16, 24, 32)
    assert decode_capture_sizes(cfg, "0.34") == (4, 8, 16) and decode_capture_rows(cfg, "0.34") == (1, 2, 4)
    assert decode_rows_at_lock(cfg, "0.33") == decode_rows_at_lock(cfg, "0.34") == 4


def test_full_decode_only_records_only_decode_sizes_on_0_34():
    cfg = _cfg(max_num_seqs=1, max_num_batched_tokens=8, cudagraph_mode="FULL_DECODE_ONLY")
    assert (capture_sizes(cfg, "0.33"), capture_sizes(cfg, "0.34")) == ((1, 2), (1,))
    explicit = _cfg(max_num_seqs=1, max_num_batched_tokens=8, cudagraph_mode="FULL_DECODE_ONLY",
                    cudagraph_capture_sizes=(1, 2, 4))
    assert capture_sizes(explicit, "0.34") == (1, 2, 4)  # the deprecated explicit sizes keep the prefill sizes


def test_no_spec_decode_sizes_agree():
    cfg = _cfg(max_num_seqs=1024, max_num_batched_tokens=8192)
    assert capture_sizes(cfg, "0.33") == capture_sizes(cfg, "0.34")
    assert decode_capture_rows(cfg, "0.33") == decode_capture_rows(cfg, "0.34")
    assert decode_rows_at_lock(cfg, "0.34") == 512


def test_v2_decode_rows_divide_evenly():
    cfg = _cfg(max_num_seqs=4, max_num_batched_tokens=4096, num_speculative_tokens=3)
    assert decode_rows(cfg, 32, "0.34") == 8 and decode_rows(cfg, 32, "0.33") == 4  # V1 caps at max_num_seqs
    with pytest.raises(ValueError, match="a uniform decode batch of 30 tokens is not a multiple of 1 \\+ k = 4"):
        decode_rows(cfg, 30, "0.34")
    assert decode_rows(cfg, 30, "0.33") == 4


def test_jit_warmup_runs_only_where_v2_always_runs():
    cfg = _cfg(max_num_seqs=1024, max_num_batched_tokens=8192)
    assert jit_warmup_decode_rows(cfg, "0.33") == 0
    assert jit_warmup_decode_rows(cfg, "0.34") == 1024  # min(1024, 8192 // 2), wider than any decode graph (512)
    assert jit_warmup_decode_rows(_cfg(max_num_seqs=256, max_num_batched_tokens=300, num_speculative_tokens=2),
                                  "0.34") == 75  # 300 // (2 + 2)


def test_nothing_left_to_capture_does_not_lock_on_0_34():
    """Explicit sizes all above max_num_batched_tokens: 0.34 sets cudagraph_mode NONE and ``capture_model`` returns
    before ``lock_workspace()``; 0.33's V1 runner still locks (empty capture)."""
    cfg = _cfg(max_num_seqs=4, max_num_batched_tokens=256, cudagraph_capture_sizes=(512,))
    assert capture_sizes(cfg, "0.34") == () and not locks_workspace(cfg, "0.34")
    assert locks_workspace(cfg, "0.33")
    fdo = _cfg(max_num_seqs=4, max_num_batched_tokens=256, num_speculative_tokens=3,
               cudagraph_mode="FULL_DECODE_ONLY", cudagraph_capture_sizes=(1, 2, 3))
    assert capture_sizes(fdo, "0.34") == (1, 2, 3) and decode_capture_rows(fdo, "0.34") == ()
    assert not locks_workspace(fdo, "0.34")  # no decode graph, and FULL_DECODE_ONLY captures no prefill graph
    eager = _cfg(max_num_seqs=4, max_num_batched_tokens=256, enforce_eager=True)
    assert not locks_workspace(eager, "0.33") and not locks_workspace(eager, "0.34")


def test_rules_follow_the_runs_version():
    cfg = _cfg(max_num_seqs=4, max_num_batched_tokens=4096, num_speculative_tokens=3)
    assert capture_sizes(cfg) == (4, 8, 16, 24, 32)  # the default, 0.33
    vllm_versions.select("0.34")
    assert capture_sizes(cfg) == (1, 2, 4, 8, 16, 24, 32)


def test_v2_piecewise_captures_carry_one_token_rows():
    """V2 builds attention metadata for PIECEWISE dummies: T tokens over min(T, max_num_seqs) requests."""
    from tqlab.core.vllm_rules import one_token_rows_before_lock, piecewise_capture_one_token_rows

    cfg = _cfg(max_num_seqs=256, max_num_batched_tokens=256, cudagraph_mode="PIECEWISE")
    assert piecewise_capture_one_token_rows(cfg, "0.33") == 0  # V1: no attention metadata in PIECEWISE captures
    assert piecewise_capture_one_token_rows(cfg, "0.34") == 256  # T = 256: 256 one-token requests
    assert jit_warmup_decode_rows(cfg, "0.34") == 128 and one_token_rows_before_lock(cfg, "0.34") == 256
    assert one_token_rows_before_lock(cfg, "0.33") == 0  # PIECEWISE only: no FULL decode capture either
    wide = _cfg(max_num_seqs=4, max_num_batched_tokens=4096, num_speculative_tokens=3)
    assert piecewise_capture_one_token_rows(wide, "0.34") == 4  # T = 4 (4 x 1) beats T = 8 (4 x 2: none)
    fdo = _cfg(max_num_seqs=256, max_num_batched_tokens=256, cudagraph_mode="FULL_DECODE_ONLY")
    assert piecewise_capture_one_token_rows(fdo, "0.34") == 0  # no prefill graph is captured
