"""CUDA graph capture sizes: vLLM 0.33's own ``VllmConfig._set_cudagraph_sizes`` vs ``tqlab.predict.analysis.capture_sizes``.

vLLM's method runs on a minimal stand-in ``self`` (the pattern of vLLM's own unit tests:
``SimpleNamespace`` configs) holding vLLM's real ``CompilationConfig``; then, as
``CompilationConfig.resolve_cudagraph_mode_and_sizes`` does for the V1 model runner when decode
graphs are FULL and ``1 + k > 1``, vLLM's ``adjust_cudagraph_sizes_for_spec_decode``. Random
configs on CPU; both sides must give the same list or both raise ``ValueError``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tqlab.predict.analysis import capture_sizes
from tqlab.core.config import EngineConfig

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def vllm_capture_sizes(cfg: EngineConfig) -> list[int]:
    """vLLM 0.33's final capture sizes for ``cfg`` (raises what vLLM raises)."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    kw = {"cudagraph_mode": CUDAGraphMode[cfg.cudagraph_mode or "FULL_AND_PIECEWISE"]}
    if cfg.cudagraph_capture_sizes is not None:
        kw["cudagraph_capture_sizes"] = list(cfg.cudagraph_capture_sizes)
    if cfg.max_cudagraph_capture_size is not None:
        kw["max_cudagraph_capture_size"] = cfg.max_cudagraph_capture_size
    cc = CompilationConfig(**kw)
    q = 1 + cfg.num_speculative_tokens
    fake = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=cfg.enforce_eager), compilation_config=cc,
        uniform_decode_query_len=q, num_speculative_tokens=cfg.num_speculative_tokens,
        scheduler_config=SimpleNamespace(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens),
        speculative_config=None, performance_mode="balanced",
    )
    VllmConfig._set_cudagraph_sizes(fake)
    mode = CUDAGraphMode.NONE if cfg.enforce_eager else cc.cudagraph_mode
    if mode != CUDAGraphMode.NONE and mode.decode_mode() == CUDAGraphMode.FULL and q > 1:
        cc.adjust_cudagraph_sizes_for_spec_decode(q)
    return list(cc.cudagraph_capture_sizes)


@st.composite
def configs(draw):
    seqs = draw(st.one_of(st.integers(1, 40), st.integers(41, 2048)))
    mbt = max(seqs, draw(st.sampled_from([1, 8, 100, 256, 384, 1000, 2048, 8192, 65536])))
    explicit = draw(st.one_of(st.none(), st.lists(st.integers(1, 1100), min_size=1, max_size=8)))
    max_size = draw(st.one_of(st.none(), st.integers(1, 1024)))
    if explicit is not None and max_size is not None and draw(st.booleans()):
        filtered = [s for s in explicit if s <= mbt]
        max_size = max(filtered) if filtered else max_size  # the consistent case too
    return EngineConfig(
        num_attention_heads=8, num_key_value_heads=8, head_dim=128, max_num_seqs=seqs, max_num_batched_tokens=mbt,
        max_model_len=max(mbt, 4096), num_speculative_tokens=draw(st.sampled_from([0, 0, 1, 2, 3, 7])),
        cudagraph_mode=draw(st.one_of(st.none(), st.sampled_from(MODES))), enforce_eager=draw(st.booleans()),
        cudagraph_capture_sizes=None if explicit is None else tuple(explicit), max_cudagraph_capture_size=max_size,
    )


def _outcome(fn, cfg):
    try:
        return list(fn(cfg))
    except (ValueError, AssertionError) as e:  # vLLM asserts a ceiling >= 1; tqlab raises ValueError
        return type(e).__name__ if isinstance(e, ValueError) else "ValueError"


@settings(max_examples=400)
@given(configs())
def test_capture_sizes_equal_vllms(cfg):
    assert _outcome(capture_sizes, cfg) == _outcome(vllm_capture_sizes, cfg)


@pytest.mark.parametrize("kw, expected", [
    (dict(max_num_seqs=4, max_num_batched_tokens=4096), [1, 2, 4, 8]),
    (dict(max_num_seqs=1024, max_num_batched_tokens=8192), [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))),
    (dict(max_num_seqs=4, max_num_batched_tokens=4096, cudagraph_capture_sizes=(1, 2, 4, 8, 12)), [1, 2, 4, 8, 12]),
    (dict(max_num_seqs=4, max_num_batched_tokens=384, cudagraph_capture_sizes=(1, 2)), [1, 2]),
    (dict(max_num_seqs=4, max_num_batched_tokens=4096, num_speculative_tokens=3), [4, 8, 16, 24, 32]),
    (dict(max_num_seqs=4, max_num_batched_tokens=4096, enforce_eager=True), []),
    (dict(max_num_seqs=4, max_num_batched_tokens=4096, cudagraph_mode="NONE"), []),
])
def test_the_issue_cases_equal_vllms(kw, expected):
    cfg = EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, **kw)
    assert vllm_capture_sizes(cfg) == expected == list(capture_sizes(cfg))
