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
    for name in ("get_decode_cudagraph_query_lens", "get_draft_decode_cudagraph_request_sizes",
                 "_split_cudagraph_capture_sizes"):  # vLLM 0.34's helpers of _set_cudagraph_sizes
        if hasattr(VllmConfig, name):
            setattr(fake, name, getattr(VllmConfig, name).__get__(fake))
    VllmConfig._set_cudagraph_sizes(fake)
    mode = CUDAGraphMode.NONE if cfg.enforce_eager else cc.cudagraph_mode
    if mode != CUDAGraphMode.NONE and mode.decode_mode() == CUDAGraphMode.FULL and q > 1:
        cc.adjust_cudagraph_sizes_for_spec_decode(q)  # vLLM 0.33 (0.34 has no such step: SPLIT_DECODE below)
    return list(cc.cudagraph_capture_sizes)


SPLIT_DECODE = not hasattr(__import__("vllm.config", fromlist=["CompilationConfig"]).CompilationConfig,
                           "adjust_cudagraph_sizes_for_spec_decode")
"""vLLM 0.34: ``VllmConfig._split_cudagraph_capture_sizes`` keeps token sizes for prefill graphs and request counts
(``decode_cudagraph_capture_request_sizes``) for decode graphs; with speculative decoding the token sizes are no
longer multiples of ``1 + k``. tqlab's ``capture_sizes`` is vLLM 0.33's rule: compared on 0.34 only without
speculative decoding (``test_spec_decode_capture_sizes_differ_on_0_34`` pins the difference)."""


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
@pytest.mark.skipif(SPLIT_DECODE, reason="tqlab's capture_sizes is vLLM 0.33's rule; 0.34's split prefill/decode "
                    "capture sizes are not modelled (VllmVersion.startup_rules_modelled, parity/README.md 'vLLM 0.34')")
def test_capture_sizes_equal_vllms(cfg):
    assert _outcome(capture_sizes, cfg) == _outcome(vllm_capture_sizes, cfg)


@pytest.mark.skipif(not SPLIT_DECODE, reason="vLLM 0.33 rounds capture sizes to 1 + k (compared above)")
def test_spec_decode_capture_sizes_differ_on_0_34():
    """max_num_seqs 4, k = 3: vLLM 0.33 (and tqlab) capture [4, 8, 16, 24, 32] tokens; 0.34 captures prefill
    graphs at [1, 2, 4, 8, 16, 24, 32] tokens and decode graphs at [1, 2, 4] requests."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    cfg = EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, max_num_seqs=4,
                       max_num_batched_tokens=4096, num_speculative_tokens=3)
    cc = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
    fake = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=False), compilation_config=cc,
                           uniform_decode_query_len=4, num_speculative_tokens=3, speculative_config=None,
                           scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=4096),
                           performance_mode="balanced")
    for name in ("get_decode_cudagraph_query_lens", "get_draft_decode_cudagraph_request_sizes",
                 "_split_cudagraph_capture_sizes"):
        setattr(fake, name, getattr(VllmConfig, name).__get__(fake))
    VllmConfig._set_cudagraph_sizes(fake)
    assert (cc.cudagraph_capture_sizes, cc.decode_cudagraph_capture_request_sizes) == ([1, 2, 4, 8, 16, 24, 32], [1, 2, 4])
    assert list(capture_sizes(cfg)) == [4, 8, 16, 24, 32]


@pytest.mark.skipif(not SPLIT_DECODE, reason="vLLM 0.33: compared by test_capture_sizes_equal_vllms")
@pytest.mark.parametrize("mode, vllm_tokens, vllm_requests, tqlab", [
    ("FULL_DECODE_ONLY", [1], [1], [1, 2]),  # 0.34 captures no prefill graphs in FULL_DECODE_ONLY
    ("FULL_AND_PIECEWISE", [1, 2], [1], [1, 2]),
])
def test_one_seq_capture_sizes_on_0_34(mode, vllm_tokens, vllm_requests, tqlab):
    """max_num_seqs 1, max_num_batched_tokens 8: where 0.34's split rule and tqlab's 0.33 rule part."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    cc = CompilationConfig(cudagraph_mode=CUDAGraphMode[mode])
    fake = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=False), compilation_config=cc,
                           uniform_decode_query_len=1, num_speculative_tokens=0, speculative_config=None,
                           scheduler_config=SimpleNamespace(max_num_seqs=1, max_num_batched_tokens=8),
                           performance_mode="balanced")
    for name in ("get_decode_cudagraph_query_lens", "get_draft_decode_cudagraph_request_sizes",
                 "_split_cudagraph_capture_sizes"):
        setattr(fake, name, getattr(VllmConfig, name).__get__(fake))
    VllmConfig._set_cudagraph_sizes(fake)
    assert (cc.cudagraph_capture_sizes, cc.decode_cudagraph_capture_request_sizes) == (vllm_tokens, vllm_requests)
    cfg = EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, max_num_seqs=1,
                       max_num_batched_tokens=8, cudagraph_mode=mode)
    assert list(capture_sizes(cfg)) == tqlab


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
    if SPLIT_DECODE and kw.get("num_speculative_tokens"):
        pytest.skip("vLLM 0.34 splits decode capture sizes (test_spec_decode_capture_sizes_differ_on_0_34)")
    cfg = EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, **kw)
    assert vllm_capture_sizes(cfg) == expected == list(capture_sizes(cfg))
