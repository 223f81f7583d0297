"""vLLM 0.33's start-up validation vs tqlab's model of it (tqlab.core.consumers.backends, tqlab.vllm.validation).

On random selector configs (a seeded generator: the same draws every run), each backend's own
``validate_configuration`` (vLLM's class, on this CPU) gives the same configuration reasons as
:func:`tqlab.core.consumers.backends.validate_configuration`; ``_get_backend_priorities`` gives tqlab's
:func:`backend_priorities`; ``AttentionBackendEnum`` is :data:`ATTENTION_BACKEND_NAMES`; ``EngineArgs``
refuses the attention-backend flags tqlab refuses, with the same words.

Compared: the reasons ``AttentionBackend.validate_configuration`` itself writes (:data:`CONFIG_REASONS`).
Reasons that come from kernel packages this CPU box lacks (FlashAttention 3/4, FlashInfer, FlashMLA, TokenSpeed)
are not: tqlab models a CUDA build that has them. For the same reason draws that only such a package decides
are skipped per backend (:data:`ENV_DECIDED`), and backends whose class does not import here are left out.
"""

from __future__ import annotations

import random

import pytest

from tqlab.core.consumers.backends import (
    ATTENTION_BACKEND_NAMES,
    BACKENDS,
    SelectorConfig,
    backend_priorities,
    validate_configuration,
)
from tqlab.vllm.validation import backend_flag

CONFIG_REASONS = frozenset({
    "head_size not supported", "dtype not supported", "kv_cache_dtype not supported", "block_size not supported",
    "MLA not supported", "non-MLA not supported", "attention sinks not supported", "sparse not supported",
    "non-sparse not supported", "compute capability not supported", "sliding window not supported",
    "batch invariance not supported", "PCP not supported", "DCP not supported",
})
"""The reasons of ``AttentionBackend.validate_configuration`` (``vllm/v1/attention/backend.py``) tqlab models."""

ENV_DECIDED = {
    # FlashAttention: sinks need FA3 (flash_attn_supports_sinks), head sizes above 256 FA4, FP8 caches FA3/FA4.
    "FLASH_ATTN": lambda s, cc: s.has_sink or s.head_size > 256 or s.kv_cache_dtype in ("fp8", "fp8_e4m3"),
}
"""Per backend: draws whose answer an installed kernel package decides (skipped for that backend)."""

CAPABILITIES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)]
KV = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "nvfp4_ds_mla", "turboquant_4bit_nc",
      "turboquant_k8v4", "int8_per_token_head", "fp8_inc", None]


def _draw(rng: random.Random) -> SelectorConfig:
    return SelectorConfig(
        head_size=rng.choice([16, 24, 32, 64, 80, 96, 100, 128, 192, 256, 320, 512, 576]),
        dtype=rng.choice(["float16", "bfloat16", "float32"]),
        kv_cache_dtype=rng.choice(KV),
        block_size=rng.choice([None, None, 1, 7, 8, 16, 32, 48, 64, 128, 256]),
        use_mla=rng.random() < 0.4, has_sink=rng.random() < 0.2, use_sparse=rng.random() < 0.3,
        has_sliding_window=rng.random() < 0.3, use_batch_invariant=rng.random() < 0.15,
        use_pcp=rng.random() < 0.2, use_dcp=rng.random() < 0.2,
    )


def _vllm_reasons(cls, s: SelectorConfig, cc) -> list[str]:
    import torch
    from vllm.platforms.interface import DeviceCapability

    return cls.validate_configuration(
        head_size=s.head_size, dtype=getattr(torch, s.dtype), kv_cache_dtype=s.kv_cache_dtype, block_size=s.block_size,
        use_mla=s.use_mla, has_sink=s.has_sink, use_sparse=s.use_sparse, use_mm_prefix=False,
        use_per_head_quant_scales=False, device_capability=DeviceCapability(*cc), attn_type="decoder",
        has_sliding_window=s.has_sliding_window, use_batch_invariant=s.use_batch_invariant, use_pcp=s.use_pcp,
        use_dcp=s.use_dcp)


def _importable() -> dict[str, type]:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    out = {}
    for name in BACKENDS:
        try:
            cls = AttentionBackendEnum[name].get_class()
            _vllm_reasons(cls, SelectorConfig(576, "bfloat16", "auto", use_mla=True, use_sparse=True), (9, 0))
        except Exception:  # a kernel package or the GPU is missing here: vLLM's class cannot be asked
            continue
        out[name] = cls
    return out


def test_backend_names_are_vllms_enum(record):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert list(ATTENTION_BACKEND_NAMES) == [m.name for m in AttentionBackendEnum]
    record("enum_members", len(ATTENTION_BACKEND_NAMES))


@pytest.fixture
def no_model_config(monkeypatch):
    """vLLM's ``get_current_vllm_config`` answers a config without a model (a few ``supports_combination`` read the
    model's config.json fields, which a selector config does not carry; tqlab does not model those reasons)."""
    from types import SimpleNamespace

    import vllm.config

    fake = SimpleNamespace(model_config=None, parallel_config=SimpleNamespace(
        decode_context_parallel_size=1, prefill_context_parallel_size=1))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: fake)
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)


def test_validate_configuration_matches_vllm_on_random_configs(record, no_model_config):
    classes = _importable()
    assert {"TURBOQUANT", "TRITON_ATTN", "FLEX_ATTENTION", "TRITON_MLA", "FLASHMLA_SPARSE"} <= set(classes)
    rng = random.Random(20260433)
    compared = 0
    for _ in range(400):
        s, cc = _draw(rng), rng.choice(CAPABILITIES)
        for name, cls in classes.items():
            if name in ENV_DECIDED and ENV_DECIDED[name](s, cc):
                continue
            theirs = [r for r in _vllm_reasons(cls, s, cc) if r in CONFIG_REASONS]
            ours = [r for r in validate_configuration(name, s, cc) if r in CONFIG_REASONS]
            assert ours == theirs, (name, s, cc)
            compared += 1
    record("backends_compared", sorted(classes))
    record("validations_compared", compared)


def _vllm_function(module: str, name: str):
    """A module-level function of vLLM, compiled from its own source file: ``vllm.platforms.cuda`` loads the CUDA
    driver on import, which this CPU box has not, so its pure functions are compiled on their own here."""
    import ast
    import functools
    import importlib.util
    from pathlib import Path

    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    path = Path(importlib.util.find_spec(module).origin)
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"cache": functools.cache, "AttentionBackendEnum": AttentionBackendEnum,
                 "DeviceCapability": DeviceCapability, "CacheDType": str}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)  # vLLM's own code, compiled as written
    return namespace[name]


def test_backend_priorities_match_vllm(record):
    from vllm.platforms.interface import DeviceCapability

    _get_backend_priorities = _vllm_function("vllm.platforms.cuda", "_get_backend_priorities")

    rng = random.Random(33)
    for _ in range(200):
        s, cc = _draw(rng), rng.choice(CAPABILITIES)
        heads = rng.choice([None, 8, 16, 32, 128])
        theirs = _get_backend_priorities(use_mla=s.use_mla, device_capability=DeviceCapability(*cc), num_heads=heads,
                                         kv_cache_dtype=s.kv_cache_dtype, head_size=s.head_size)
        assert backend_priorities(s, cc, heads) == [b.name for b in theirs], (s, cc, heads)


@pytest.mark.parametrize("given", [
    {"attention_backend": "FLASH_ATTN", "attention_config": {"backend": "TRITON_ATTN"}},
    {"attention_backend": "BOGUS"},
    {"attention_backend": "B12X_MLA_SPARSE"},
    {"attention_config": {"backend": "bogus"}},
    {"attention_backend": "FLASH_ATTN", "attention_config": {"backend": "auto"}},
    {"attention_backend": "triton_mla"},
    {"attention_backend": "auto"},
    {"attention_config": {"backend": "TRITON_MLA"}},
])
def test_backend_flags_refused_as_vllm_refuses_them(given):
    """``EngineArgs.create_engine_config``'s attention-config step (and ``AttentionConfig``'s validator), run on
    vLLM's own classes: the same refusal text, or the same backend."""
    import copy

    from vllm.config.attention import AttentionConfig

    def vllm_backend():
        conf = AttentionConfig(**given.get("attention_config", {}))
        attention_config = copy.deepcopy(conf)
        if given.get("attention_backend") is not None:
            if attention_config.backend is not None:
                raise ValueError("attention_backend and attention_config.backend are mutually exclusive")
            attention_config.backend = AttentionConfig.validate_backend_before(given["attention_backend"])
        return None if attention_config.backend is None else attention_config.backend.name

    import inspect

    from vllm.engine.arg_utils import EngineArgs

    src = inspect.getsource(EngineArgs.create_engine_config)  # the step mirrored above, as vLLM 0.33 writes it
    assert "if attention_config.backend is not None:" in src and '"are mutually exclusive"' in src
    name, _, refusal = backend_flag(given)
    try:
        theirs = vllm_backend()
    except Exception as e:  # pydantic wraps the enum's ValueError: its text is inside
        assert refusal is not None and refusal.reason in str(e), (refusal, e)
        return
    assert refusal is None and name == theirs
