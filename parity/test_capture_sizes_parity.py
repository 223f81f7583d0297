"""CUDA graph capture sizes: the installed vLLM's own ``VllmConfig._set_cudagraph_sizes`` vs tqlab's rule for that release.

vLLM's method runs on a minimal stand-in ``self`` (the pattern of vLLM's own unit tests:
``SimpleNamespace`` configs) holding vLLM's real ``CompilationConfig``. vLLM 0.33: then, as
``CompilationConfig.resolve_cudagraph_mode_and_sizes`` does for the V1 model runner when decode
graphs are FULL and ``1 + k > 1``, vLLM's ``adjust_cudagraph_sizes_for_spec_decode``. vLLM 0.34: the method
ends in ``_split_cudagraph_capture_sizes`` (token sizes and decode request counts), and the decode graphs' request
counts are vLLM's ``decode_cudagraph_capture_shapes`` of them, as ``CudaGraphManager._init_candidates`` takes them.
Random configs on CPU; both sides must give the same lists or both raise ``ValueError``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vllm

from tqlab.core import vllm_versions
from tqlab.core.config import EngineConfig
from tqlab.core.vllm_rules import FULL_DECODE_MODES, cudagraph_mode, decode_capture_rows
from tqlab.predict.analysis import capture_sizes

VERSION = vllm_versions.get(".".join(vllm.__version__.split(".")[:2]))

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def vllm_capture_sizes(cfg: EngineConfig, with_decode_rows: bool = False):
    """The installed vLLM's final capture sizes for ``cfg`` (raises what vLLM raises); with ``with_decode_rows`` (0.34)
    also the request counts of its FULL uniform-decode graphs (``()`` when the resolved mode has none)."""
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
    if (hasattr(cc, "adjust_cudagraph_sizes_for_spec_decode") and mode != CUDAGraphMode.NONE
            and mode.decode_mode() == CUDAGraphMode.FULL and q > 1):
        cc.adjust_cudagraph_sizes_for_spec_decode(q)  # vLLM 0.33 (0.34 has no such step: SPLIT_DECODE below)
    if not with_decode_rows:
        return list(cc.cudagraph_capture_sizes)
    from vllm.config.compilation import decode_cudagraph_capture_max_tokens, decode_cudagraph_capture_shapes

    rows = ()
    if cudagraph_mode(cfg) in FULL_DECODE_MODES and cc.cudagraph_mode != CUDAGraphMode.NONE:
        shapes = decode_cudagraph_capture_shapes(cc.decode_cudagraph_capture_request_sizes or [],
                                                 {q: cfg.max_num_seqs}, decode_cudagraph_capture_max_tokens(cc))
        rows = tuple(n for n, _ in shapes)
    return list(cc.cudagraph_capture_sizes), rows


SPLIT_DECODE = not hasattr(__import__("vllm.config", fromlist=["CompilationConfig"]).CompilationConfig,
                           "adjust_cudagraph_sizes_for_spec_decode")
"""vLLM 0.34: ``VllmConfig._split_cudagraph_capture_sizes`` keeps token sizes for prefill graphs and request counts
(``decode_cudagraph_capture_request_sizes``) for decode graphs; with speculative decoding the token sizes are no
longer multiples of ``1 + k``. tqlab's rule follows the release (``VllmVersion.decode_graphs_in_requests``)."""
assert SPLIT_DECODE == VERSION.decode_graphs_in_requests, "the version home disagrees with the installed vLLM"


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
    if not SPLIT_DECODE:
        assert _outcome(lambda c: capture_sizes(c, VERSION), cfg) == _outcome(vllm_capture_sizes, cfg)
        return
    ours = _outcome(lambda c: (list(capture_sizes(c, VERSION)), decode_capture_rows(c, VERSION)), cfg)
    theirs = _outcome(lambda c: vllm_capture_sizes(c, with_decode_rows=True), cfg)
    assert ours == theirs


@pytest.mark.skipif(not SPLIT_DECODE, reason="vLLM 0.33 rounds capture sizes to 1 + k (compared above)")
def test_spec_decode_capture_sizes_differ_on_0_34():
    """max_num_seqs 4, k = 3: vLLM 0.33 (and tqlab's 0.33 rule) capture [4, 8, 16, 24, 32] tokens; 0.34 (and tqlab's
    0.34 rule) captures prefill graphs at [1, 2, 4, 8, 16, 24, 32] tokens and decode graphs at [1, 2, 4] requests."""
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
    assert list(capture_sizes(cfg, "0.33")) == [4, 8, 16, 24, 32]
    assert (list(capture_sizes(cfg, "0.34")), decode_capture_rows(cfg, "0.34")) == ([1, 2, 4, 8, 16, 24, 32], (1, 2, 4))


@pytest.mark.skipif(not SPLIT_DECODE, reason="vLLM 0.33: compared by test_capture_sizes_equal_vllms")
@pytest.mark.parametrize("mode, vllm_tokens, vllm_requests, tqlab", [
    ("FULL_DECODE_ONLY", [1], [1], [1, 2]),  # 0.34 captures no prefill graphs in FULL_DECODE_ONLY
    ("FULL_AND_PIECEWISE", [1, 2], [1], [1, 2]),
])
def test_one_seq_capture_sizes_on_0_34(mode, vllm_tokens, vllm_requests, tqlab):
    """max_num_seqs 1, max_num_batched_tokens 8: where 0.34's split rule and the 0.33 rule part (``tqlab``: 0.33's)."""
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
    assert list(capture_sizes(cfg, "0.33")) == tqlab and list(capture_sizes(cfg, "0.34")) == vllm_tokens


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
        expected = [1, 2, 4, 8, 16, 24, 32]  # vLLM 0.34 keeps the token grid (decode graphs counted in requests)
    cfg = EngineConfig(num_attention_heads=8, num_key_value_heads=8, head_dim=128, **kw)
    assert vllm_capture_sizes(cfg) == expected == list(capture_sizes(cfg, VERSION))
