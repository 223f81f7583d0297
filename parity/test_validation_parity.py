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
import vllm

from tqlab.core import vllm_versions
from tqlab.core.consumers.backends import (
    ATTENTION_BACKEND_NAMES,
    BACKENDS,
    SelectorConfig,
    backend_priorities,
    validate_configuration,
)
from tqlab.vllm.validation import backend_flag

pytestmark = pytest.mark.skipif(
    not vllm_versions.get(".".join(vllm.__version__.split(".")[:2])).startup_validation_modelled,
    reason=f"tqlab models vLLM 0.33's start-up validation only; the installed vLLM is {vllm.__version__} "
           "(tqlab.core.vllm_versions: startup_validation_modelled; under that release tqlab answers partial, "
           "never refused)")

CONFIG_REASONS = frozenset({
    "head_size not supported", "dtype not supported", "kv_cache_dtype not supported", "block_size not supported",
    "MLA not supported", "non-MLA not supported", "attention sinks not supported", "sparse not supported",
    "non-sparse not supported", "compute capability not supported", "sliding window not supported",
    "attention type AttentionType.ENCODER_ONLY not supported",
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


@pytest.fixture(autouse=True)
def _cpu_platform():
    """vLLM's CPU platform, as ``vllm`` main() sets it (``gen_vllm_flags.generate``), before this file's first vLLM
    call: vLLM caches what it derives from the platform (``get_kwargs``), and the lazy one is ``unspecified`` here."""
    import gen_vllm_flags

    gen_vllm_flags.generate()


def _draw(rng: random.Random) -> SelectorConfig:
    return SelectorConfig(
        head_size=rng.choice([16, 24, 32, 64, 80, 96, 100, 128, 192, 256, 320, 512, 576]),
        dtype=rng.choice(["float16", "bfloat16", "float32"]),
        kv_cache_dtype=rng.choice(KV),
        block_size=rng.choice([None, None, 1, 7, 8, 16, 32, 48, 64, 128, 256]),
        use_mla=rng.random() < 0.4, has_sink=rng.random() < 0.2, use_sparse=rng.random() < 0.3,
        has_sliding_window=rng.random() < 0.3, use_batch_invariant=rng.random() < 0.15,
        use_pcp=rng.random() < 0.2, use_dcp=rng.random() < 0.2,
        attn_type="encoder_only" if rng.random() < 0.2 else "decoder",
    )


def _vllm_reasons(cls, s: SelectorConfig, cc) -> list[str]:
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import AttentionType

    return cls.validate_configuration(
        head_size=s.head_size, dtype=getattr(torch, s.dtype), kv_cache_dtype=s.kv_cache_dtype, block_size=s.block_size,
        use_mla=s.use_mla, has_sink=s.has_sink, use_sparse=s.use_sparse, use_mm_prefix=False,
        use_per_head_quant_scales=False, device_capability=DeviceCapability(*cc), attn_type=AttentionType(s.attn_type),
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


# --------------------------------------------------------------------------- #
# Random serve lines: vLLM's create_engine_config + each layer's selection    #
# --------------------------------------------------------------------------- #

MODELS = {  # config.json, and which layers slide / carry sinks in vLLM's model class
    "llama": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
               "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 8, "max_position_embeddings": 8192, "vocab_size": 128256,
               "torch_dtype": "bfloat16"}, lambda i: False, False),
    "gemma2": ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584,
                "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                "num_hidden_layers": 8, "max_position_embeddings": 8192, "sliding_window": 4096,
                "vocab_size": 256000, "torch_dtype": "bfloat16"},
               lambda i: i % 2 == 0, False),  # transformers' Gemma2Config layer_types; gemma2.py per layer
    "gpt_oss": ({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
                 "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                 "num_hidden_layers": 8, "num_local_experts": 32, "num_experts_per_tok": 4,
                 "max_position_embeddings": 8192, "sliding_window": 128, "vocab_size": 201088,
                 "layer_types": ["sliding_attention", "full_attention"] * 4, "torch_dtype": "bfloat16"},
                lambda i: i % 2 == 0, True),  # gpt_oss.py: sliding_window if layer_idx % 2 == 0, sinks always
}


def _draw_line(rng: random.Random) -> tuple[str, list[str]]:
    model = rng.choice(sorted(MODELS))
    argv = ["--kv-cache-dtype", rng.choice(["turboquant_4bit_nc", "turboquant_k8v4", "auto", "auto"])]
    tp, dcp = rng.choice([(1, 1), (1, 1), (2, 1), (2, 2), (16, 2), (16, 4)])
    argv += ["-tp", str(tp)] + (["-dcp", str(dcp)] if dcp > 1 else [])
    if rng.random() < 0.1:
        argv += ["-pcp", "2"]
    if rng.random() < 0.3:
        argv += ["--dtype", rng.choice(["bfloat16", "float16", "float32"])]
    if rng.random() < 0.3:
        argv += ["--block-size", str(rng.choice([1, 8, 16, 32, 64]))]
    pinned = rng.choice([None] * 6 + ["FLASH_ATTN", "TURBOQUANT", "TRITON_ATTN", "BOGUS", "auto", "TRITON_MLA"])
    if MODELS[model][2] and argv[1] == "auto" and (pinned == "FLASH_ATTN" or dcp > 1 or "-pcp" in argv):
        # sinks on FLASH_ATTN need FlashAttention 3 (ENV_DECIDED), which this box lacks: without TurboQuant (which
        # forces FA2) an H200 serves them where this CPU finds no backend
        return _draw_line(rng)
    if pinned is not None:
        argv += ["--attention-backend", pinned]
    if rng.random() < 0.1:
        argv += ["--attention-config.backend", rng.choice(["TRITON_ATTN", "auto"])]
    if rng.random() < 0.3:
        argv += ["--kv-cache-dtype-skip-layers", "sliding_window"]
    return model, argv


class _FakeCuda:
    """vLLM's ``CudaPlatformBase.get_attn_backend_cls`` / ``get_valid_backends`` (compiled from vllm/platforms/cuda.py,
    which needs libcuda to import) on an H200's compute capability; anything else from this box's platform."""

    device_name = "cuda"

    def __init__(self, base):
        import ast
        import importlib.util
        from pathlib import Path

        from vllm.logger import init_logger
        from vllm.platforms.interface import DeviceCapability
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        self._base = base
        path = Path(importlib.util.find_spec("vllm.platforms.cuda").origin)
        tree = ast.parse(path.read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CudaPlatformBase")
        wanted = {"get_valid_backends", "get_attn_backend_cls"}
        funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                 and n.name in {"_get_attn_backend_class", "_backend_cls_path", "_BackendCandidate"}]
        methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
        for m in methods:
            m.decorator_list = []
        ns = {"AttentionBackendEnum": AttentionBackendEnum, "DeviceCapability": DeviceCapability,
              "logger": init_logger("vllm.platforms.cuda"), "NamedTuple": __import__("typing").NamedTuple,
              "AttentionBackend": object, "AttentionSelectorConfig": object}
        exec(compile(ast.Module(funcs + methods, []), str(path), "exec"), ns)  # vLLM's own code, as written
        self._ns = ns
        self._ns["_get_backend_priorities"] = _vllm_function("vllm.platforms.cuda", "_get_backend_priorities")

    def get_device_capability(self, device_id: int = 0):
        from vllm.platforms.interface import DeviceCapability

        return DeviceCapability(9, 0)

    def get_valid_backends(self, **kw):
        return self._ns["get_valid_backends"](self, **kw)

    def get_attn_backend_cls(self, selected_backend, attn_selector_config, num_heads=None):
        return self._ns["get_attn_backend_cls"](self, selected_backend, attn_selector_config, num_heads)

    def __getattr__(self, name):
        return getattr(self._base, name)


def _vllm_outcome(model: str, argv: list[str], model_dir) -> str | None:
    """vLLM's refusal of the line (None: it starts): ``EngineArgs.create_engine_config`` on this CPU (Model Runner V2,
    vLLM's CUDA default), then each attention layer as ``Attention.__init__`` builds it (its cache dtype after the
    skip layers, its sliding window, sinks) through ``get_attn_backend`` on an H200."""
    import vllm.platforms
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention import selector

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        vc = EngineArgs.from_cli_args(parser.parse_args(["--model", str(model_dir), "--skip-tokenizer-init",
                                                          *argv])).create_engine_config()
    except Exception as e:
        return str(e)
    cfg, sliding, sinks = MODELS[model]
    cache = vc.cache_config
    base = vllm.platforms.current_platform  # an attribute once set (gen_vllm_flags), else the lazy __getattr__
    vllm.platforms.current_platform = _FakeCuda(base)
    selector._cached_get_attn_backend.cache_clear()
    try:
        with set_current_vllm_config(vc):
            for i in range(cfg["num_hidden_layers"]):
                window = sliding(i)
                skip = str(i) in cache.kv_cache_dtype_skip_layers or (
                    window and "sliding_window" in cache.kv_cache_dtype_skip_layers)
                selector.get_attn_backend(vc.model_config.get_head_size(), vc.model_config.dtype,
                                          "auto" if skip else cache.cache_dtype, has_sink=sinks,
                                          has_sliding_window=window)
    except ValueError as e:
        return str(e)
    finally:
        vllm.platforms.current_platform = base
        selector._cached_get_attn_backend.cache_clear()
    return None


def test_random_serve_lines_are_refused_as_vllm_refuses_them(tmp_path, monkeypatch, record):
    import json

    import gen_vllm_flags

    from tqlab.predict import analysis
    from tqlab.vllm.deployment import deployment_from_vllm

    gen_vllm_flags.generate()  # the CPU platform, as `vllm` main() sets it
    _importable()  # backend modules bind this box's platform at import, before the H200 stand-in takes its place
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # CUDA's default (VllmConfig.use_v2_model_runner)
    dirs = {}
    for name, (cfg, _, _) in MODELS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        dirs[name] = tmp_path / name
    rng = random.Random(3333)
    outcomes = {"refused": 0, "starts": 0}
    for _ in range(80):
        model, argv = _draw_line(rng)
        theirs = _vllm_outcome(model, argv, dirs[model])
        dep = deployment_from_vllm(["vllm", "serve", "M", *argv], MODELS[model][0], gpu="H200")
        pred = analysis.predict(dep.config, startup=dep.startup)
        ours = None if pred.refusal is None else pred.refusal["reason"]
        where = (model, argv, theirs, ours)
        assert (ours is None) == (theirs is None), where
        if ours is None:
            outcomes["starts"] += 1
            continue
        outcomes["refused"] += 1
        if "No valid attention backend" in ours:  # the other backends' reasons name this box's missing packages
            assert "No valid attention backend" in theirs, where
            tq = ours[ours.find("TURBOQUANT: ["):].split("]")[0]
            assert tq in theirs, where
        else:
            assert ours.split(". Valid options")[0] in theirs, where
    assert outcomes["refused"] >= 20 and outcomes["starts"] >= 20, outcomes
    record("serve_lines", outcomes)
