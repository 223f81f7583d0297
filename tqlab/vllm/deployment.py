"""A deployment from a ``vllm serve`` line (or argv, or a dict) and the model's ``config.json``, as vLLM 0.33 reads them.

The line is parsed by :mod:`tqlab.vllm.flags` (vLLM's own flags, as
data); config.json is read by :mod:`tqlab.vllm.hf_config`. This module
maps both onto :class:`~tqlab.core.config.EngineConfig` fields, saying for each
where it came from (:class:`VllmDeployment` ``sources``), and sizes the
attention block of hybrid models as vLLM does (:func:`hybrid_attention_block_size`)
and, from the prefix-caching flags, their Mamba block-aligned prefill split.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tqlab.core.config import EngineConfig, load_preset, parse_dtype, step_token_budget
from tqlab.turboquant.spec import get_spec
from tqlab.vllm.hf_config import ModelShape, read_hf_config
from tqlab.vllm.flags import (
    ENV_KEY,
    FLAGS_FILE,
    VllmArgsError,
    env_flag,
    human_readable_int,
    lax_int,
    human_readable_int_or_auto,
    parse_serve_args,
    vllm_flags,
)

__all__ = [
    "FLAGS_FILE", "VllmArgsError", "VllmDeployment", "deployment_from_preset", "deployment_from_vllm", "engine_config_from_vllm",
    "engine_config_kwargs_from_vllm", "human_readable_int", "human_readable_int_or_auto",
    "hybrid_attention_block_size", "parse_engine_args", "parse_serve_args", "vllm_default_limits", "vllm_flags",
]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_LEVEL_MODE = {"0": "NONE", "1": "PIECEWISE", "2": "FULL_AND_PIECEWISE", "3": "FULL_AND_PIECEWISE"}
"""``vllm/config/vllm.py`` ``OPTIMIZATION_LEVEL_0x`` ``cudagraph_mode`` defaults."""
TQ_KERNEL_BLOCK = 16
"""min of ``TurboQuantAttentionBackend.get_supported_kernel_block_sizes()`` = [16, 32, 64, 128]."""


def _flag_kwargs(engine_args) -> tuple[dict[str, Any], dict[str, str], list[str], list[str], dict[str, Any]]:
    """``(EngineConfig kwargs, their sources, notes, ignored, the parsed flags)`` from the flags alone (no config.json)."""
    given, notes = _given(engine_args)
    kw, src, more, ignored = _map_flags(given)
    if kw.get("max_model_len") == -1:
        kw.pop("max_model_len")
    if kw.get("dtype") == "auto":
        kw.pop("dtype")
    known = _field_names()
    for k in sorted(set(kw) - known):
        v = kw.pop(k)
        if src.get(k, "").startswith("flag"):
            ignored.append(f"{k}={v!r} (not modelled by this EngineConfig)")
    return kw, {k: v for k, v in src.items() if k in kw}, notes + more, ignored, given


def parse_engine_args(engine_args: str | Sequence[str] | Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """vLLM engine arguments -> ``({EngineConfig field: value}, [real vLLM flags with no effect on the workspace])``.

    A string/argv is parsed by :func:`parse_serve_args`; a dict maps flag
    names (``-``/``_``, with or without ``--``; short aliases such as ``tp``)
    to values (booleans: True/False or their words). Fields that need the
    model's config.json (``--max-model-len auto``) are left out; see
    :func:`engine_config_kwargs_from_vllm`. Raises :class:`VllmArgsError`.
    """
    kw, _src, _notes, ignored, _given_flags = _flag_kwargs(engine_args)
    return kw, ignored


def _given(engine_args) -> tuple[dict[str, Any], list[str]]:
    if isinstance(engine_args, Mapping):
        argv: list[str] = []
        bools = {o for f in vllm_flags()["flags"] if f["kind"] != "value" for o in f["options"]}
        for k, v in engine_args.items():
            name = str(k).lstrip("-").replace("_", "-")
            flag = "-" + name if "--" + name not in bools and f"-{name}" in _short_options() else "--" + name
            if flag in bools and not isinstance(v, bool):
                s = str(v).strip().lower()
                if s not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise VllmArgsError(f"{flag} must be true or false, got {v!r}")
                v = s in ("true", "1", "yes", "on")
            if v is True:
                argv.append(flag)
            elif v is False:
                neg = {o for f in vllm_flags()["flags"] if flag in f["options"] for o in f["negative_options"]}
                argv += sorted(neg)[:1]  # a store_true flag has no negative form: False is its default
            elif isinstance(v, (dict, list)):
                argv += [flag] + ([str(x) for x in v] if isinstance(v, list) else [json.dumps(v)])
            else:
                argv += [flag, str(v)]
        return parse_serve_args(argv)
    return parse_serve_args(engine_args)


def _short_options() -> set[str]:
    return {o for f in vllm_flags()["flags"] for o in f["options"] if not o.startswith("--")}


# --------------------------------------------------------------------------- #
# Flags -> EngineConfig fields                                                #
# --------------------------------------------------------------------------- #

_DIRECT = {  # flag dest -> EngineConfig field, taken as is (EngineConfig validates the range)
    "tensor_parallel_size": "tensor_parallel_size", "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens", "block_size": "block_size",
    "enable_chunked_prefill": "enable_chunked_prefill", "enable_dbo": "enable_dbo",
    "enforce_eager": "enforce_eager", "kv_cache_dtype": "kv_cache_dtype", "dtype": "dtype",
    "max_model_len": "max_model_len", "max_cudagraph_capture_size": "max_cudagraph_capture_size",
    "enable_prefix_caching": "enable_prefix_caching", "max_num_scheduled_tokens": "max_num_scheduled_tokens",
    # workspace consumers beyond TurboQuant (issue 19)
    "decode_context_parallel_size": "decode_context_parallel_size", "data_parallel_size": "data_parallel_size",
    "enable_expert_parallel": "enable_expert_parallel", "attention_backend": "attention_backend",
}
_READ = set(_DIRECT) | {"model_tag", "model", "compilation_config", "attention_config", "speculative_config",
                        "cudagraph_capture_sizes", "optimization_level", "kv_cache_dtype_skip_layers",
                        "long_prefill_token_threshold", "max_num_scheduled_tokens", "kv_transfer_config", ENV_KEY}


def _field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(EngineConfig)}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _positive_ints(name: str, v: Any) -> tuple[int, ...]:
    """A list of sizes, each coerced as vLLM's pydantic config classes do (:func:`~tqlab.vllm.flags.lax_int`:
    ``["1", "2", "4"]`` from ``-cc.cudagraph_capture_sizes+ 1,2,4``, ``[1, 2.0, 4]``); each must be >= 1."""
    if not isinstance(v, list) or not v:
        raise VllmArgsError(f"{name} must be a non-empty list of positive integers, got {v!r}")
    out = tuple(lax_int(s, f"{name}[{i}]") for i, s in enumerate(v))
    if any(s < 1 for s in out):
        raise VllmArgsError(f"{name} must be a non-empty list of positive integers, got {v!r}")
    return out


def _map_flags(g: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str], list[str]]:
    """Given flags -> ``(kwargs, sources, notes, ignored)``; vLLM 0.33's rules, cited inline."""
    kw: dict[str, Any] = {}
    src: dict[str, str] = {}
    notes: list[str] = []
    for dest, fld in _DIRECT.items():
        if dest in g and g[dest] is not None:
            kw[fld], src[fld] = g[dest], f"flag {_flag(dest)}"
    mml = kw.get("max_model_len")
    if mml is not None and mml != -1 and mml < 1:  # ModelConfig.max_model_len: Field(ge=-1), then >= 1
        raise VllmArgsError(f"--max-model-len must be a positive integer or auto/-1, got {mml}")
    cc = g.get("compilation_config") or {}
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        if key in cc and key in g:  # EngineArgs.create_engine_config
            raise VllmArgsError(f"{key} and compilation_config.{key} are mutually exclusive (vLLM)")
    sizes = g.get("cudagraph_capture_sizes", cc.get("cudagraph_capture_sizes"))
    if sizes is not None:
        kw["cudagraph_capture_sizes"] = _positive_ints("cudagraph_capture_sizes", sizes)
        src["cudagraph_capture_sizes"] = ("flag --cudagraph-capture-sizes" if "cudagraph_capture_sizes" in g
                                          else "flag --compilation-config cudagraph_capture_sizes")
    if "max_cudagraph_capture_size" in cc and cc["max_cudagraph_capture_size"] is not None:
        v = lax_int(cc["max_cudagraph_capture_size"], "compilation_config.max_cudagraph_capture_size")
        if v < 1:
            raise VllmArgsError(f"compilation_config.max_cudagraph_capture_size must be a positive integer, got {v!r}")
        kw["max_cudagraph_capture_size"] = v
        src["max_cudagraph_capture_size"] = "flag --compilation-config max_cudagraph_capture_size"
    _map_cudagraph_mode(g, cc, kw, src)
    spec = g.get("speculative_config")
    if spec is not None:
        where = "--speculative-config num_speculative_tokens"
        k = spec.get("num_speculative_tokens")
        k = None if k is None else lax_int(k, where)  # pydantic lax int: "3" is 3 (SpeculativeConfig)
        if k is not None and k < 1:  # SpeculativeConfig.num_speculative_tokens: Field(gt=0)
            raise VllmArgsError(f"{where} must be an integer >= 1 (vLLM SpeculativeConfig: gt=0), got {k!r}")
        if k is not None:
            kw["num_speculative_tokens"], src["num_speculative_tokens"] = k, "flag --speculative-config num_speculative_tokens"
    att = g.get("attention_config") or {}
    if "tq_max_kv_splits_for_cuda_graph" in att:
        v = lax_int(att["tq_max_kv_splits_for_cuda_graph"], "--attention-config tq_max_kv_splits_for_cuda_graph")
        kw["tq_max_kv_splits_for_cuda_graph"] = v
        src["tq_max_kv_splits_for_cuda_graph"] = "flag --attention-config tq_max_kv_splits_for_cuda_graph"
    if att.get("mla_prefill_backend") is not None:
        kw["mla_prefill_backend"] = str(att["mla_prefill_backend"])
        src["mla_prefill_backend"] = "flag --attention-config mla_prefill_backend"
    ignored = sorted(_flag(d) for d in g if d not in _READ)
    return kw, src, notes, ignored


def _map_cudagraph_mode(g, cc, kw, src) -> None:
    """``cudagraph_mode``: NONE with ``--enforce-eager`` (``VllmConfig.__post_init__``), else
    ``compilation_config.cudagraph_mode``, else the ``-O`` level's default (O0 NONE, O1 PIECEWISE,
    O2/O3 FULL_AND_PIECEWISE; vLLM's default level is 2). vLLM may still lower it for a backend
    without full-graph support (``VllmConfig._normalize_piecewise_cudagraph_mode`` and after)."""
    level = str(g.get("optimization_level", "2")).strip().upper().removeprefix("O")
    if level not in _LEVEL_MODE:
        raise VllmArgsError(f"--optimization-level (-O) must be 0, 1, 2 or 3, got {g.get('optimization_level')!r}")
    mode = cc.get("cudagraph_mode")
    if mode is not None and (not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES):
        raise VllmArgsError(f"compilation_config.cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {mode!r}")
    # Only a flag that names the mode sets the field; otherwise it stays None and
    # tqlab.predict.analysis.cudagraph_mode resolves it (enforce_eager -> NONE, else vLLM's -O2 default).
    if g.get("enforce_eager"):
        src["cudagraph_mode"] = "derived: --enforce-eager sets cudagraph_mode NONE (vLLM)"
    elif mode is not None:
        kw["cudagraph_mode"], src["cudagraph_mode"] = mode.upper(), "flag --compilation-config cudagraph_mode"
    elif "optimization_level" in g:
        kw["cudagraph_mode"], src["cudagraph_mode"] = _LEVEL_MODE[level], f"flag -O{level}"
    else:
        src["cudagraph_mode"] = "vLLM default (-O2: FULL_AND_PIECEWISE)"


def vllm_default_limits(usage: str = "serve", gpu_memory_gib: float | None = None) -> tuple[int, int, str]:
    """vLLM 0.33's default ``(max_num_batched_tokens, max_num_seqs, why)`` with chunked prefill on.

    ``usage``: ``"serve"`` (``vllm serve``) or ``"llm"`` (the ``LLM`` class);
    ``gpu_memory_gib``: the GPU's memory in GiB (None: assumed under 70 GiB).
    Under 70 GiB: 2048/8192 tokens, 256 seqs; >= 70 GiB: 8192/16384, 1024;
    >= 160 GiB: 16384, 1024 (``EngineArgs.get_batch_defaults``; vLLM keeps
    A100s and GB10 in the small tier by device name, which tqlab is not given).
    Raises ``ValueError`` for another ``usage`` or a GPU size that is not a finite number >= 0.
    """
    if usage not in ("serve", "llm"):
        raise ValueError(f"usage must be 'serve' or 'llm', got {usage!r}")
    if gpu_memory_gib is not None and (isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, (int, float))
                                       or not math.isfinite(gpu_memory_gib) or gpu_memory_gib <= 0):
        raise ValueError(f"gpu_memory_gib must be a finite number > 0, got {gpu_memory_gib!r}")
    mem = 0.0 if gpu_memory_gib is None else float(gpu_memory_gib)
    cmd = "`vllm serve`" if usage == "serve" else "the `LLM` class"
    if mem >= 160:
        return 16384, 1024, f"{cmd} on a GPU of >= 160 GiB"
    if mem >= 70:
        return (8192 if usage == "serve" else 16384), 1024, f"{cmd} on a GPU of >= 70 GiB"
    gpu = "" if gpu_memory_gib is not None else "; GPU size assumed, pass --gpu-memory-gib"
    return (2048 if usage == "serve" else 8192), 256, f"{cmd} on a GPU under 70 GiB{gpu}"


# --------------------------------------------------------------------------- #
# Hybrid models: the attention block size                                     #
# --------------------------------------------------------------------------- #


def hybrid_attention_block_size(shape: ModelShape, *, kv_cache_dtype: str, dtype: torch.dtype, tp: int,
                                block_size: int = 16, mamba_cache_dtype: str = "auto",
                                mamba_ssm_cache_dtype: str = "auto", num_speculative_tokens: int = 0) -> tuple[int, str] | None:
    """vLLM 0.33's attention block size for a hybrid model, or None when config.json has no Mamba state.

    Mirrors ``vllm/platforms/interface.py`` ``Platform._align_hybrid_block_size``
    (with ``mamba_cache_mode`` "none"): the attention page of one token on a
    rank (TurboQuant: ``slot_bytes(D) * Hk`` per ``TurboQuantAttentionBackend.customize_spec``;
    else ``2 * Hk * D * itemsize``), the Mamba state page (:meth:`MambaState.page_bytes`:
    conv state in ``--mamba-cache-dtype`` else the model dtype, SSM state in
    ``--mamba-ssm-cache-dtype``, else config.json's ``mamba_ssm_dtype`` (Qwen3.5) /
    ``mamba_ssm_cache_dtype`` (Nemotron-H, default float32), else the conv dtype;
    the conv state keeps ``num_speculative_tokens`` more steps), ``align = max(16, block_size)``;
    ``block = align * cdiv(mamba_page, align * page_1_token)`` rounded up to 16,
    and vLLM keeps the larger of that and ``block_size``. Returns
    ``(block_size, how)``: ``how`` shows the numbers. Raises ``ValueError`` if TP
    does not divide the state.
    """
    m = shape.mamba
    if m is None:
        return None
    hk = max(1, shape.num_key_value_heads // tp)
    if kv_cache_dtype.startswith("turboquant_"):
        per_head, what = get_spec(kv_cache_dtype).slot_bytes(shape.head_dim), f"{kv_cache_dtype} slot"
    else:
        per_head, what = 2 * shape.head_dim * dtype.itemsize, "K+V"
    page1 = per_head * hk
    conv = dtype if mamba_cache_dtype == "auto" else parse_dtype(mamba_cache_dtype)
    want = mamba_ssm_cache_dtype if mamba_ssm_cache_dtype != "auto" else m.ssm_dtype
    ssm = parse_dtype(want) if want else conv
    mamba = m.page_bytes(tp, conv.itemsize, ssm.itemsize, num_speculative_tokens)
    align = max(TQ_KERNEL_BLOCK, block_size)
    block = align * -(-mamba // (align * page1))
    block = TQ_KERNEL_BLOCK * -(-block // TQ_KERNEL_BLOCK)
    out = max(block, block_size)
    how = (f"derived: attention page >= {m.kind} state page (vLLM _align_hybrid_block_size): "
           f"{mamba:,} B state / ({per_head} B {what} x {hk} KV heads = {page1} B per token), "
           f"in multiples of {align} -> {block}")
    return out, how


# --------------------------------------------------------------------------- #
# The deployment                                                              #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class VllmDeployment:
    """A deployment read from a ``vllm serve`` line + config.json.

    ``config``: the :class:`EngineConfig`; ``notes``: what was assumed, read
    differently or ignored (in words); ``sources``: for every EngineConfig
    field set, where it came from (``"flag --max-model-len"``,
    ``"config.json max_position_embeddings"``, ``"vLLM default ..."``,
    ``"derived: ..."``); ``model``: the validated :class:`ModelShape`.
    """

    config: EngineConfig
    notes: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    model: ModelShape | None = None


def _model_dtype(shape: ModelShape, want: Any, notes: list[str], src: dict[str, str]) -> torch.dtype:
    """``--dtype auto`` keeps the checkpoint's dtype, fp32 checkpoints served in bf16 (``_resolve_auto_dtype``)."""
    if want not in (None, "auto"):
        return parse_dtype(want)
    cfg = shape.dtype or "bfloat16"
    if cfg.removeprefix("torch.") in ("float32", "float"):
        notes.append("--dtype auto: the fp32 checkpoint is served in bfloat16")
        src["dtype"] = "derived: config.json torch_dtype float32 -> bfloat16 (vLLM --dtype auto)"
        return torch.bfloat16
    try:
        dt = parse_dtype(cfg)
    except ValueError:
        raise VllmArgsError(f"{shape.path}: torch_dtype {cfg!r} is not bfloat16, float16 or float32") from None
    src["dtype"] = "config.json torch_dtype" if shape.dtype else "derived: no torch_dtype in config.json, bfloat16"
    return dt


def engine_config_kwargs_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any] | ModelShape,
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """``(EngineConfig kwargs, notes, sources)`` for a ``vllm serve`` line and a config.json.

    Only kwargs that are fields of this tqlab's :class:`EngineConfig` are
    returned (speculative/cudagraph fields once they exist); others are named
    in the notes. Model fields come from :func:`read_hf_config` (attention
    layers only: ``num_hidden_layers`` = layers with this attention backend);
    ``--max-model-len auto`` (or -1) and an absent one take vLLM's derived
    length (``_get_and_verify_max_len``; auto may then be lowered by vLLM to
    fit GPU memory, which tqlab does not model); unset scheduler limits take
    :func:`vllm_default_limits`; hybrid models get
    :func:`hybrid_attention_block_size` and ``mamba_block_aligned_split``
    (:func:`_mamba_split`). Raises ``ValueError`` (one line) for
    bad flags, values or config.json fields.
    """
    given, notes = _given(engine_args)
    kw, src, more, ignored = _map_flags(given)
    notes += more
    shape = model_config if isinstance(model_config, ModelShape) else read_hf_config(model_config)
    if shape.mamba is not None:  # these size the Mamba page, hence the hybrid attention block
        ignored = [f for f in ignored if f not in ("--mamba-cache-dtype", "--mamba-ssm-cache-dtype")]
    if shape.hybrid is not None:  # these decide the Mamba block-aligned prefill split
        ignored = [f for f in ignored if f not in _SPLIT_FLAGS]
    if ignored:
        notes.append("vLLM flags with no effect on the workspace: " + ", ".join(ignored))
    kw.update(num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
              head_dim=shape.head_dim, num_hidden_layers=shape.num_attention_layers)
    src.update(shape.sources)
    for kind in ("mla", "indexer", "moe"):  # workspace consumers' model fields (issue 19)
        if getattr(shape, kind) is not None:
            kw[kind], src[kind] = getattr(shape, kind), f"config.json ({kind} fields)"
    kw["dtype"] = _model_dtype(shape, kw.get("dtype"), notes, src)
    _check_max_model_len(shape, kw.get("max_model_len", -1), notes, given.get(ENV_KEY))
    key = shape.max_len_key or f"none of the length keys: vLLM assumes {shape.max_len}"
    if kw.get("max_model_len", -1) == -1:
        how = "--max-model-len auto" if "max_model_len" in kw else "no --max-model-len"
        kw["max_model_len"], src["max_model_len"] = shape.max_len, f"config.json {key} ({how})"
        notes.append(f"max_model_len = {shape.max_len} from config.json {key} ({how})")
    _scheduler_defaults(kw, src, notes, usage, gpu_memory_gib, given.get("performance_mode"))
    _skip_layers(shape, kw, src, notes, given.get("kv_cache_dtype_skip_layers") or [])
    _hybrid_block(shape, kw, src, notes, given)
    if shape.hybrid is not None:
        _mamba_split(given, kw, src, notes, gdn=shape.mamba is not None and shape.mamba.kind == "gdn")
    _chunking_notes(given, kw.get("block_size", 16), kw.get(_SPLIT, False), notes)
    known = _field_names()
    for name in sorted(known - set(src) - {"preset"}):
        src[name] = "vLLM default"
    if "lock_workspace_when_eager" in src:
        src["lock_workspace_when_eager"] = "tqlab variant, off: vLLM 0.33 never locks the workspace in eager mode"
    dropped = sorted(set(kw) - known)
    if dropped:
        notes.append("read but not modelled by this EngineConfig: " + ", ".join(f"{k}={kw[k]!r}" for k in dropped))
    return ({k: v for k, v in kw.items() if k in known}, notes, {k: v for k, v in src.items() if k in known})


def _scheduler_defaults(kw: dict[str, Any], src: dict[str, str], notes: list[str], usage: str,
                        gpu_memory_gib: float | None, performance_mode: str | None) -> None:
    """Unset ``max_num_seqs`` / ``max_num_batched_tokens`` as vLLM 0.33 sets them
    (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): the usage/GPU defaults,
    doubled with ``--performance-mode throughput``; without chunked prefill the batch is at least
    ``max_model_len``; then ``min(max_num_seqs * max_model_len, ...)``, and a defaulted
    ``max_num_seqs`` is capped by the batch. (vLLM's ``max_num_batched_tokens >= max_num_seqs``
    check then applies, in :class:`EngineConfig`.)"""
    mbt, seqs, why = vllm_default_limits(usage, gpu_memory_gib)
    if performance_mode == "throughput":
        mbt, seqs, why = 2 * mbt, 2 * seqs, why + ", doubled by --performance-mode throughput"
    seqs_given, mbt_given = "max_num_seqs" in kw, "max_num_batched_tokens" in kw
    if not seqs_given:
        kw["max_num_seqs"], src["max_num_seqs"] = seqs, f"vLLM default ({why})"
    if not mbt_given:
        how = f"vLLM default ({why})"
        if not kw.get("enable_chunked_prefill", True):
            mbt, how = max(kw["max_model_len"], mbt), f"vLLM default with chunked prefill off: max(max_model_len, {mbt})"
        if kw["max_num_seqs"] * kw["max_model_len"] < mbt:
            mbt, how = kw["max_num_seqs"] * kw["max_model_len"], "vLLM default capped at max_num_seqs x max_model_len"
        kw["max_num_batched_tokens"], src["max_num_batched_tokens"] = mbt, how
        notes.append(f"max_num_batched_tokens not given: {mbt} ({how})")
    if not seqs_given:
        if kw["max_num_batched_tokens"] < kw["max_num_seqs"]:
            kw["max_num_seqs"] = kw["max_num_batched_tokens"]
            src["max_num_seqs"] += f", capped at max_num_batched_tokens {kw['max_num_batched_tokens']}"
        notes.append(f"max_num_seqs not given: {kw['max_num_seqs']} ({src['max_num_seqs']})")


def _skip_layers(shape: ModelShape, kw: dict[str, Any], src: dict[str, str], notes: list[str], user: list[str]) -> None:
    """Layers vLLM 0.33 keeps off TurboQuant (native dtype, another backend): ``--kv-cache-dtype-skip-layers``
    plus, for a dense model, the first and last ``min(2, L // 2)`` layers (``EngineArgs.create_engine_config``
    -> ``TurboQuantConfig.get_boundary_skip_layers``; hybrids: none). ``num_hidden_layers`` counts the rest."""
    if not kw.get("kv_cache_dtype", "auto").startswith("turboquant_"):
        return
    n_all = shape.num_hidden_layers
    n = min(2, n_all // 2) if shape.hybrid is None else 0
    skip = {i for i in range(n_all) if i < n or i >= n_all - n} | {int(t) for t in user if t.isdigit()}
    keep = [i for i in shape.attention_layers if i not in skip]
    if not keep:
        raise VllmArgsError(f"{shape.path}: every attention layer is kept off TurboQuant (skip layers {sorted(skip)}): "
                            "no TurboQuant workspace consumer")
    if len(keep) == len(shape.attention_layers):
        return
    kw["num_hidden_layers"] = len(keep)
    src["num_hidden_layers"] = (f"derived: {len(shape.attention_layers)} attention layers - {len(shape.attention_layers) - len(keep)} "
                                f"kept off TurboQuant (vLLM boundary layers {n} each end + --kv-cache-dtype-skip-layers)")
    notes.append(f"TurboQuant layers: {len(keep)} of {len(shape.attention_layers)}; vLLM 0.33 keeps layers {sorted(skip)} in the "
                 "model dtype, and may then raise the block size so one page fits both "
                 "(Platform._align_heterogeneous_kv_block_size, backend-dependent: not modelled; "
                 "pass --block-size with the size vLLM logs)")
    if any(not t.isdigit() for t in user):
        notes.append("--kv-cache-dtype-skip-layers " + ", ".join(t for t in user if not t.isdigit()) + ": not modelled")


def _check_max_model_len(shape: ModelShape, mml: int, notes: list[str], env: Mapping[str, str] | None = None) -> None:
    """vLLM ``_get_and_verify_max_len``: a ``--max-model-len`` above the derived length (and above
    ``model_max_length``, if given) is refused unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (in the
    serve line's ``NAME=value`` prefix ``env``, else in this process's environment: ``flags.env_flag``)."""
    if mml == -1 or shape.max_len_key is None or mml <= shape.max_len:
        return
    if shape.model_max_length is not None and mml <= shape.model_max_length:
        return
    msg = (f"--max-model-len {mml} is greater than the derived max_model_len ({shape.max_len_key}={shape.max_len} "
           f"or model_max_length={shape.model_max_length} in {shape.path})")
    if env_flag(dict(env or {}), "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        notes.append(msg + ": allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN")
        return
    raise VllmArgsError(msg + "; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")


def _hybrid_block(shape: ModelShape, kw: dict[str, Any], src: dict[str, str], notes: list[str],
                  given: Mapping[str, Any]) -> None:
    if shape.hybrid is None:
        return
    layers = ", ".join(map(str, shape.attention_layers[:4])) + (", ..." if len(shape.attention_layers) > 4 else "")
    notes.append(f"hybrid model ({shape.hybrid}): {shape.num_attention_layers} attention layers of "
                 f"{shape.num_hidden_layers} ({layers}); KV per token counts only those")
    user = kw.get("block_size")
    try:
        res = hybrid_attention_block_size(shape, kv_cache_dtype=kw.get("kv_cache_dtype", "auto"), dtype=kw["dtype"],
                                          tp=kw.get("tensor_parallel_size", 1), block_size=user or 16,
                                          mamba_cache_dtype=given.get("mamba_cache_dtype") or "auto",
                                          mamba_ssm_cache_dtype=given.get("mamba_ssm_cache_dtype") or "auto",
                                          num_speculative_tokens=kw.get("num_speculative_tokens", 0))
    except ValueError as e:
        raise VllmArgsError(f"{shape.path}: {e}") from None
    if res is None:
        if user is None:
            notes.append("hybrid model without a Mamba state tqlab can size: vLLM enlarges the attention block; "
                         "pass --block-size with the size vLLM logs")
        return
    block, how = res
    if user is None or block != user:
        kw["block_size"], src["block_size"] = block, how
        if user is not None:
            notes.append(f"--block-size {user} raised to {block} as vLLM does for hybrid models")


_SPLIT = "mamba_block_aligned_split"
_SPLIT_FLAGS = ("--enable-prefix-caching", "--mamba-cache-mode")
"""Flags read for a hybrid model: they decide :func:`_mamba_split` (otherwise no effect on the workspace)."""


def _mamba_split(given: Mapping[str, Any], kw: dict[str, Any], src: dict[str, str], notes: list[str], *,
                 gdn: bool = False) -> None:
    """``mamba_block_aligned_split`` of a hybrid model as vLLM 0.33 decides it (``kw`` holds the final block size,
    ``max_num_batched_tokens`` and ``enable_chunked_prefill``).

    vLLM splits when ``Scheduler.need_mamba_block_aligned_split`` (Mamba layers and
    ``cache_config.mamba_cache_mode == "align"``, ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.__init__``);
    ``MambaModelConfig.verify_and_update_config`` (``vllm/model_executor/models/config.py``, run for every
    hybrid through ``HybridAttentionMambaModelConfig`` by ``VllmConfig.try_verify_and_update_config``) sets
    "align" with prefix caching on and "none" with it off; prefix caching defaults to on for generative
    hybrids (``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``,
    ``ModelConfig.is_prefix_caching_supported``). ``--mamba-cache-mode`` (choices align/none) is deprecated
    and never reaches ``CacheConfig`` (``EngineArgs.create_engine_config``). Prefix caching with chunked
    prefill off: vLLM asserts, so :class:`VllmArgsError`. A block above ``max_num_batched_tokens``: vLLM
    advances the prefill in sub-block chunks, not modelled: left off, with a note.
    """
    mode = given.get("mamba_cache_mode")
    if mode is not None:
        notes.append(f"--mamba-cache-mode {mode}: deprecated in vLLM 0.33 and ignored (EngineArgs.create_engine_config "
                     "does not pass it on); the Mamba cache mode follows --enable-prefix-caching")
    if given.get("enable_prefix_caching") is False:
        kw[_SPLIT], src[_SPLIT] = False, ("flag --no-enable-prefix-caching: mamba_cache_mode \"none\" "
                                          "(vLLM MambaModelConfig.verify_and_update_config), no block-aligned split")
        return
    how = ("flag --enable-prefix-caching" if given.get("enable_prefix_caching")
           else "prefix caching on by default for a generative hybrid model")
    if not kw.get("enable_chunked_prefill", True):
        raise VllmArgsError("a hybrid model with prefix caching on needs chunked prefill: vLLM 0.33 asserts 'Chunked "
                            "prefill is required for Mamba prefix caching' (MambaModelConfig.verify_and_update_config); "
                            "add --no-enable-prefix-caching or drop --no-enable-chunked-prefill")
    block, mbt, st = kw.get("block_size", 16), kw["max_num_batched_tokens"], kw.get("max_num_scheduled_tokens")
    chunk = step_token_budget(mbt, st)
    what = "max_num_batched_tokens" if chunk == mbt else "max_num_scheduled_tokens"
    if block > chunk:  # 16: vLLM's default block
        kw[_SPLIT], src[_SPLIT] = False, (f"derived: off in tqlab: block_size {block} > {what} {chunk}, "
                                          "vLLM's sub-block prefill chunks are not modelled")
        notes.append(f"{how}: vLLM 0.33 splits prefills on Mamba block boundaries (mamba_cache_mode \"align\", "
                     f"Scheduler._mamba_block_aligned_split), but with block_size {block} > {what} {chunk} "
                     "it advances the prefill in sub-block chunks, which tqlab does not model "
                     "(mamba_block_aligned_split left off): the first failing prompt may differ")
        return
    kw[_SPLIT] = True
    src[_SPLIT] = (f"derived: {how} -> mamba_cache_mode \"align\" (vLLM MambaModelConfig.verify_and_update_config): "
                   "Scheduler._mamba_block_aligned_split ends every prefill chunk but a prompt's last on a block boundary")
    notes.append(f"mamba_block_aligned_split ({how}): vLLM 0.33 ends every prefill chunk but a prompt's last on a "
                 f"multiple of block_size {block} (Scheduler._mamba_block_aligned_split)"
                 + ("; modelled as with FlashInfer's GDN prefill, which saves the state inside the last chunk "
                    "(with the Triton GDN prefill vLLM also stops the last chunk at the prompt's last block boundary); "
                    "with FlashInfer vLLM also rounds the block to a multiple of its 64-token checkpoint alignment "
                    "(Platform._align_hybrid_block_size in \"align\" mode), not modelled: pass --block-size with the "
                    "size vLLM logs" if gdn else ""))


def _chunking_notes(given: Mapping[str, Any], block: int, split: bool, notes: list[str]) -> None:
    """Notes for flags that move chunk boundaries or cached lengths in ways tqlab does not model."""
    if given.get("kv_transfer_config"):
        notes.append("--kv-transfer-config: a KV connector's external hit (Scheduler.schedule, "
                     "num_external_computed_tokens) can start a request with tokens cached whatever the prefix "
                     "caching and chunking flags; the any-chunking bound does not model it and may be too high")
    lpt = given.get("long_prefill_token_threshold") or 0
    if lpt > 0:
        notes.append(f"--long-prefill-token-threshold {lpt}: vLLM caps the prefill chunk of a request that is not "
                     "alone at this many tokens (Scheduler.schedule); alone it is not capped, so the first failing "
                     "prompt is unchanged, and the any-chunking bound covers any chunking"
                     + (f"; below block_size {block} those chunks end mid-block (Scheduler._mamba_block_aligned_split),"
                        " which the any-chunking bound, counting whole blocks, does not model: it may be too high"
                        if split and lpt < block else ""))


def deployment_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> VllmDeployment:
    """:func:`engine_config_kwargs_from_vllm`, then the validated :class:`EngineConfig`, as a :class:`VllmDeployment`.

    Raises ``ValueError`` (one line) for bad flags, values, config.json
    fields or a combination EngineConfig rejects.
    """
    shape = read_hf_config(model_config)
    kw, notes, sources = engine_config_kwargs_from_vllm(engine_args, shape, gpu_memory_gib=gpu_memory_gib, usage=usage)
    try:
        config = EngineConfig(**kw)
    except ValueError as e:  # a combination of config.json fields (and flags) EngineConfig rejects: name the file
        raise ValueError(f"{shape.path}: {e}") from None
    return VllmDeployment(config, notes, sources, shape)


def engine_config_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[EngineConfig, list[str]]:
    """``(config, notes)`` of :func:`deployment_from_vllm` (the call ``predict.inspect_vllm`` makes).

    Use :func:`deployment_from_vllm` for the ``sources`` as well.
    """
    d = deployment_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib, usage=usage)
    return d.config, d.notes


def deployment_from_preset(engine_args: str | Sequence[str] | Mapping[str, Any] | None, preset: str) -> VllmDeployment:
    """A tqlab preset (``data/presets/NAME.json``) with a ``vllm serve`` line's flags applied, with ``sources``.

    Fields the line sets say ``"flag --..."``; the others ``"preset NAME"``. A preset with
    ``mamba_block_aligned_split`` (a hybrid) takes the line's prefix-caching flags (:func:`_mamba_split`).
    Raises ``ValueError`` for an unknown preset or bad flags (one line), and
    ``TypeError`` never: only EngineConfig fields are passed.
    """
    kw, src, notes, ignored, given = _flag_kwargs(engine_args)
    if kw.get("dtype") is not None:
        kw["dtype"] = parse_dtype(kw["dtype"])
    base = load_preset(preset)["config"]
    if base.get(_SPLIT):  # a hybrid preset with prefix caching on: the line's prefix-caching flags apply
        ignored = [f for f in ignored if f not in _SPLIT_FLAGS]
        merged = {k: kw.get(k, base.get(k, EngineConfig.__dataclass_fields__[k].default))
                  for k in ("block_size", "max_num_batched_tokens", "enable_chunked_prefill", "max_num_scheduled_tokens")}
        chunk = step_token_budget(merged["max_num_batched_tokens"], merged["max_num_scheduled_tokens"])
        if ({"enable_prefix_caching", "mamba_cache_mode"} & set(given) or not merged["enable_chunked_prefill"]
                or merged["block_size"] > chunk):
            _mamba_split(given, merged, src, notes)
            kw[_SPLIT] = merged[_SPLIT]
    config = EngineConfig.from_preset(preset, **kw)
    _chunking_notes(given, config.block_size, config.mamba_block_aligned_split, notes)
    sources = {name: src.get(name, f"preset {preset}") for name in _field_names() - {"preset"}}
    if ignored:
        notes.append("vLLM flags with no effect on the workspace: " + ", ".join(ignored))
    return VllmDeployment(config, [f"preset {preset}", *notes], sources, None)
