"""A deployment from a ``vllm serve`` line (or argv, or a dict) and the model's ``config.json``, as vLLM 0.33 reads them.

The line is parsed by :mod:`tqlab.vllm.flags` (vLLM's own flags, as data); config.json is read
by :mod:`tqlab.vllm.hf_config`. The readers here record, on one
:class:`~tqlab.vllm.draft.DeploymentDraft`, each :class:`~tqlab.core.config.EngineConfig` field's
value, where it came from and the notes about it (each a :class:`~tqlab.core.notes.Note` with a
kind); hybrid models get vLLM's block size and Mamba block-aligned split (:mod:`tqlab.vllm.hybrid`).
The result is a :class:`VllmDeployment`, built once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tqlab.core.hardware import batch_defaults, gpu_target
from tqlab.core.config import EngineConfig, check_kv_cache_dtype, is_turboquant, load_preset, parse_dtype, step_token_budget
from tqlab.core.notes import Note, NoteKind
from tqlab.vllm.draft import DeploymentDraft, FieldRecord
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
from tqlab.vllm.hf_config import ModelShape, read_hf_config
from tqlab.vllm.hybrid import SPLIT, SPLIT_FLAGS, apply_hybrid_block, apply_mamba_split, hybrid_attention_block_size

__all__ = [
    "FLAGS_FILE", "DeploymentDraft", "FieldRecord", "VllmArgsError", "VllmDeployment", "deployment_from_preset",
    "deployment_from_vllm", "engine_config_from_vllm", "engine_config_kwargs_from_vllm", "human_readable_int",
    "human_readable_int_or_auto", "hybrid_attention_block_size", "parse_engine_args", "parse_serve_args",
    "vllm_default_limits", "vllm_flags",
]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_LEVEL_MODE = {"0": "NONE", "1": "PIECEWISE", "2": "FULL_AND_PIECEWISE", "3": "FULL_AND_PIECEWISE"}
"""``vllm/config/vllm.py`` ``OPTIMIZATION_LEVEL_0x`` ``cudagraph_mode`` defaults."""


@dataclass(frozen=True)
class VllmDeployment:
    """A deployment read from a ``vllm serve`` line + config.json (or a preset and a line).

    ``config``: the validated :class:`EngineConfig`; ``notes``: what was assumed, read
    differently or ignored, each a :class:`~tqlab.core.notes.Note` (a ``str`` with a ``kind``
    and, where it is about one field, its ``field``); ``sources``: for every EngineConfig
    field, where it came from (``"flag --max-model-len"``, ``"config.json max_position_embeddings"``,
    ``"vLLM default ..."``, ``"derived: ..."``, ``"preset NAME"``); ``model``: the validated
    :class:`ModelShape` (None for a preset); ``fields``: per field its :class:`FieldRecord`
    (value, source, the notes about it).
    """

    config: EngineConfig
    notes: list[Note] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    model: ModelShape | None = None
    fields: dict[str, FieldRecord] = field(default_factory=dict, compare=False, repr=False)

    def notes_of(self, kind: NoteKind) -> list[Note]:
        """The notes of one kind, in order."""
        return [n for n in self.notes if n.kind is kind]


def _field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(EngineConfig)} - {"preset"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _read_flags(engine_args) -> tuple[DeploymentDraft, dict[str, Any]]:
    """The line's flags on a new draft (parser notes included) and the parsed ``{dest: value}``."""
    given, parser_notes = _given(engine_args)
    d = _map_flags(given)
    d.notes[:0] = [Note.of(n, NoteKind.INFO) for n in parser_notes]
    return d, given


def _flag_draft(engine_args) -> tuple[DeploymentDraft, dict[str, Any]]:
    """:func:`_read_flags` without config.json: ``auto`` values (that need it) and fields EngineConfig lacks dropped."""
    d, given = _read_flags(engine_args)
    if d.get("max_model_len") == -1:
        d.drop("max_model_len")
    if d.get("dtype") == "auto":
        d.drop("dtype")
    for k in [k for k in d.fields if k not in d]:  # sources without a value (cudagraph_mode's): config.json decides
        d.drop(k)
    for k in d.unknown(_field_names()):
        from_flag = d.source(k).startswith("flag")
        v = d.drop(k)
        if from_flag:
            d.ignored.append(f"{k}={v!r} (not modelled by this EngineConfig)")
    return d, given


def parse_engine_args(engine_args: str | Sequence[str] | Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """vLLM engine arguments -> ``({EngineConfig field: value}, [real vLLM flags with no effect on the workspace])``.

    A string/argv is parsed by :func:`parse_serve_args`; a dict maps flag
    names (``-``/``_``, with or without ``--``; short aliases such as ``tp``)
    to values (booleans: True/False or their words). Fields that need the
    model's config.json (``--max-model-len auto``) are left out; see
    :func:`engine_config_kwargs_from_vllm`. Raises :class:`VllmArgsError`.
    """
    d, _given_flags = _flag_draft(engine_args)
    return d.kwargs(_field_names()), d.ignored


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


_CC = "--compilation-config (-cc)"
"""How errors name the flag a ``compilation_config`` key came from (``-cc`` is its short form)."""


def _positive_ints(where: str, v: Any) -> tuple[int, ...]:
    """A list of sizes, each coerced as vLLM's pydantic config classes do (:func:`~tqlab.vllm.flags.lax_int`:
    ``["1", "2", "4"]`` from ``-cc.cudagraph_capture_sizes+ 1,2,4``, ``[1, 2.0, 4]``); each must be >= 1.

    ``where``: the flag and key the list came from (``"--compilation-config (-cc) cudagraph_capture_sizes"``).
    Raises :class:`VllmArgsError` naming ``where``, the bad element and the whole list."""
    if not isinstance(v, list) or not v:
        raise VllmArgsError(f"{where} must be a non-empty list of positive integers, got {v!r}")
    out = []
    for i, s in enumerate(v):
        try:
            n = lax_int(s, f"{where}[{i}]")
        except VllmArgsError as e:
            raise VllmArgsError(f"{e} (in {v!r})") from None
        if n < 1:
            raise VllmArgsError(f"{where}[{i}] must be a positive integer, got {s!r} (in {v!r})")
        out.append(n)
    return tuple(out)


_MINIMUM = {"max_num_batched_tokens": (1, "SchedulerConfig: Field(ge=1)"), "max_num_seqs": (1, "SchedulerConfig: Field(ge=1)"),
            "block_size": (1, "CacheConfig: Field(gt=0)"), "tensor_parallel_size": (1, "ParallelConfig: Field(ge=1)")}
"""Flags vLLM 0.33's pydantic config classes refuse below a minimum, with the field that says so."""


def _blame(message: str, shape: ModelShape, d: DeploymentDraft) -> str:
    """An :class:`EngineConfig` error with where each field it names came from (a flag, config.json, a default);
    the file's path leads only when a field came from it."""
    names = sorted(n for n in _field_names() if re.search(rf"\b{n}\b", message) and d.source(n))
    where = "; ".join(f"{n}: {d.source(n)}" for n in names)
    lead = f"{shape.path}: " if any(d.source(n).startswith("config.json") for n in names) or not names else ""
    return f"{lead}{message}" + (f" ({where})" if where else "")


def _map_flags(g: Mapping[str, Any]) -> DeploymentDraft:
    """Given flags -> a draft with their fields and sources, and ``ignored``; vLLM 0.33's rules, cited inline."""
    d = DeploymentDraft()
    for dest, fld in _DIRECT.items():
        if dest in g and g[dest] is not None:
            if dest in _MINIMUM and g[dest] < _MINIMUM[dest][0]:
                minimum, where = _MINIMUM[dest]
                raise VllmArgsError(f"{_flag(dest)} must be >= {minimum} (vLLM {where}), got {g[dest]}")
            d.set(fld, g[dest], f"flag {_flag(dest)}")
    mml = d.get("max_model_len")
    if mml is not None and mml != -1 and mml < 1:  # ModelConfig.max_model_len: Field(ge=-1), then >= 1
        raise VllmArgsError(f"--max-model-len must be a positive integer or auto/-1, got {mml}")
    _map_capture_sizes(g, d)
    _map_cudagraph_mode(g, g.get("compilation_config") or {}, d)
    spec = g.get("speculative_config")
    if spec is not None and spec.get("num_speculative_tokens") is not None:
        where = "--speculative-config num_speculative_tokens"
        k = lax_int(spec["num_speculative_tokens"], where)  # pydantic lax int: "3" is 3 (SpeculativeConfig)
        if k < 1:  # SpeculativeConfig.num_speculative_tokens: Field(gt=0)
            raise VllmArgsError(f"{where} must be an integer >= 1 (vLLM SpeculativeConfig: gt=0), got {k!r}")
        d.set("num_speculative_tokens", k, "flag --speculative-config num_speculative_tokens")
    att = g.get("attention_config") or {}
    if "tq_max_kv_splits_for_cuda_graph" in att:
        v = lax_int(att["tq_max_kv_splits_for_cuda_graph"], "--attention-config tq_max_kv_splits_for_cuda_graph")
        d.set("tq_max_kv_splits_for_cuda_graph", v, "flag --attention-config tq_max_kv_splits_for_cuda_graph")
    if att.get("mla_prefill_backend") is not None:
        d.set("mla_prefill_backend", str(att["mla_prefill_backend"]), "flag --attention-config mla_prefill_backend")
    d.ignored = sorted(_flag(k) for k in g if k not in _READ)
    return d


def _map_capture_sizes(g: Mapping[str, Any], d: DeploymentDraft) -> None:
    """``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size``: a flag or ``--compilation-config``, not both
    (``EngineArgs.create_engine_config``)."""
    cc = g.get("compilation_config") or {}
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        if key in cc and key in g:
            raise VllmArgsError(f"{_flag(key)} and {_CC} {key} are mutually exclusive (vLLM)")
    sizes = g.get("cudagraph_capture_sizes", cc.get("cudagraph_capture_sizes"))
    if sizes is not None:
        flag = "--cudagraph-capture-sizes" if "cudagraph_capture_sizes" in g else f"{_CC} cudagraph_capture_sizes"
        d.set("cudagraph_capture_sizes", _positive_ints(flag, sizes), f"flag {flag.replace(' (-cc)', '')}")
    if cc.get("max_cudagraph_capture_size") is not None:
        v = lax_int(cc["max_cudagraph_capture_size"], f"{_CC} max_cudagraph_capture_size")
        if v < 1:
            raise VllmArgsError(f"{_CC} max_cudagraph_capture_size must be a positive integer, got {v!r}")
        d.set("max_cudagraph_capture_size", v, "flag --compilation-config max_cudagraph_capture_size")


def _map_cudagraph_mode(g, cc, d: DeploymentDraft) -> None:
    """``cudagraph_mode``: NONE with ``--enforce-eager`` (``VllmConfig.__post_init__``), else
    ``compilation_config.cudagraph_mode``, else the ``-O`` level's default (O0 NONE, O1 PIECEWISE,
    O2/O3 FULL_AND_PIECEWISE; vLLM's default level is 2). vLLM may still lower it for a backend
    without full-graph support (``VllmConfig._normalize_piecewise_cudagraph_mode`` and after)."""
    level = str(g.get("optimization_level", "2")).strip().upper().removeprefix("O")
    if level not in _LEVEL_MODE:
        raise VllmArgsError(f"--optimization-level (-O) must be 0, 1, 2 or 3, got {g.get('optimization_level')!r}")
    mode = cc.get("cudagraph_mode")
    if mode is not None and (not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES):
        raise VllmArgsError(f"{_CC} cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {mode!r}")
    # Only a flag that names the mode sets the field; otherwise it stays None and
    # tqlab.core.vllm_rules.cudagraph_mode resolves it (enforce_eager -> NONE, else vLLM's -O2 default).
    if g.get("enforce_eager"):
        d.set_source("cudagraph_mode", "derived: --enforce-eager sets cudagraph_mode NONE (vLLM)")
    elif mode is not None:
        d.set("cudagraph_mode", mode.upper(), "flag --compilation-config cudagraph_mode")
    elif "optimization_level" in g:
        d.set("cudagraph_mode", _LEVEL_MODE[level], f"flag -O{level}")
    else:
        d.set_source("cudagraph_mode", "vLLM default (-O2: FULL_AND_PIECEWISE)")


def vllm_default_limits(usage: str = "serve", gpu_memory_gib: float | None = None,
                        gpu: str | None = None) -> tuple[int, int, str]:
    """vLLM 0.33's default ``(max_num_batched_tokens, max_num_seqs, why)`` with chunked prefill on.

    ``usage``: ``"serve"`` (``vllm serve``) or ``"llm"`` (the ``LLM`` class);
    ``gpu_memory_gib``: the GPU's memory in GiB, which wins over ``gpu``; ``gpu``: a GPU target
    (:func:`tqlab.core.hardware.gpu_target`: its memory, name and capability); neither: assumed
    under 70 GiB. The rule is :func:`tqlab.core.hardware.batch_defaults` (``EngineArgs.get_batch_defaults``;
    by memory alone vLLM's A100 / GB10 exception cannot apply).
    Raises ``ValueError`` for another ``usage``, a GPU size that is not a finite number > 0 or an unknown ``gpu``.
    """
    if usage not in ("serve", "llm"):
        raise ValueError(f"usage must be 'serve' or 'llm', got {usage!r}")
    if gpu_memory_gib is not None and (isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, (int, float))
                                       or not math.isfinite(gpu_memory_gib) or gpu_memory_gib <= 0):
        raise ValueError(f"gpu_memory_gib must be a finite number > 0, got {gpu_memory_gib!r}")
    cmd = "`vllm serve`" if usage == "serve" else "the `LLM` class"
    if gpu_memory_gib is None and gpu is not None:
        g = gpu_target(gpu)
        mbt, seqs, tier = batch_defaults(g.memory_gib, g.name, g.capability, usage)
        return mbt, seqs, f"{cmd} on --gpu {g.name}, {g.memory_gib} GiB: {tier}"
    mbt, seqs, tier = batch_defaults(0.0 if gpu_memory_gib is None else float(gpu_memory_gib), usage=usage)
    assumed = "" if gpu_memory_gib is not None else "; GPU size assumed, pass --gpu-memory-gib"
    return mbt, seqs, f"{cmd} on a GPU {'of ' if tier.startswith('>') else ''}{tier}{assumed}"


# --------------------------------------------------------------------------- #
# config.json -> EngineConfig fields                                          #
# --------------------------------------------------------------------------- #


def _model_dtype(shape: ModelShape, d: DeploymentDraft) -> None:
    """``--dtype auto`` keeps the checkpoint's dtype, fp32 checkpoints served in bf16 (``_resolve_auto_dtype``)."""
    want = d.get("dtype")
    if want not in (None, "auto"):
        d.set_value("dtype", parse_dtype(want))
        return
    cfg = shape.dtype or "bfloat16"
    if cfg.removeprefix("torch.") in ("float32", "float"):
        d.set("dtype", torch.bfloat16, "derived: config.json torch_dtype float32 -> bfloat16 (vLLM --dtype auto)")
        d.note(NoteKind.DERIVED, "--dtype auto: the fp32 checkpoint is served in bfloat16", "dtype")
        return
    try:
        dt = parse_dtype(cfg)
    except ValueError:
        raise VllmArgsError(f"{shape.path}: torch_dtype {cfg!r} is not bfloat16, float16 or float32") from None
    d.set("dtype", dt, "config.json torch_dtype" if shape.dtype else "derived: no torch_dtype in config.json, bfloat16")


def _max_model_len(shape: ModelShape, d: DeploymentDraft, env: Mapping[str, str] | None = None) -> None:
    """vLLM ``_get_and_verify_max_len``: a ``--max-model-len`` above the derived length
    (:attr:`ModelShape.longest_max_model_len`: above the default only with longrope) and above
    ``model_max_length``, if given, is refused unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (in the
    line's ``NAME=value`` prefix ``env``, else in this process's environment: ``flags.env_flag``);
    ``auto`` (-1) or none: the default length (vLLM may then lower auto to fit GPU memory: not modelled)."""
    mml = d.get("max_model_len", -1)
    limit = shape.longest_max_model_len
    too_long = (mml != -1 and shape.max_len_key is not None and mml > limit
                and (shape.model_max_length is None or mml > shape.model_max_length))
    if too_long:
        key = shape.max_len_limit_key or shape.max_len_key
        msg = (f"--max-model-len {mml} is greater than the derived max_model_len ({key}={limit} "
               f"or model_max_length={shape.model_max_length} in {shape.path})")
        if not env_flag(dict(env or {}), "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
            raise VllmArgsError(msg + "; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
        d.note(NoteKind.INFO, msg + ": allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN", "max_model_len")
    if mml != -1:
        return
    key = shape.max_len_key or f"none of the length keys: vLLM assumes {shape.max_len}"
    where = f"config.json {key}"
    if shape.max_len_key and "max_len" in shape.sources:  # a family alias: the key config.json really spells
        # (ChatGLM: vLLM's key max_position_embeddings is ChatGLMConfig's copy of config.json seq_length)
        rope = shape.max_len_key.partition(" x ")[2]
        where = shape.sources["max_len"] + (f" x {rope}" if rope else "")
    how = "--max-model-len auto" if "max_model_len" in d else "no --max-model-len"
    d.set("max_model_len", shape.max_len, f"{where} ({how})")
    d.note(NoteKind.DEFAULTED, f"max_model_len = {shape.max_len} from {where} ({how})", "max_model_len")


def _scheduler_defaults(d: DeploymentDraft, usage: str, gpu_memory_gib: float | None,
                        performance_mode: str | None, gpu: str | None = None) -> None:
    """Unset ``max_num_seqs`` / ``max_num_batched_tokens`` as vLLM 0.33 sets them
    (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): the usage/GPU defaults,
    doubled with ``--performance-mode throughput``; without chunked prefill the batch is at least
    ``max_model_len``; then ``min(max_num_seqs * max_model_len, ...)``, and a defaulted
    ``max_num_seqs`` is capped by the batch. (vLLM's ``max_num_batched_tokens >= max_num_seqs``
    check then applies, in :class:`EngineConfig`.)"""
    mbt, seqs, why = vllm_default_limits(usage, gpu_memory_gib, gpu)
    if performance_mode == "throughput":
        mbt, seqs, why = 2 * mbt, 2 * seqs, why + ", doubled by --performance-mode throughput"
    seqs_given, mbt_given = "max_num_seqs" in d, "max_num_batched_tokens" in d
    if not seqs_given:
        d.set("max_num_seqs", seqs, f"vLLM default ({why})")
    if not mbt_given:
        how, mml = f"vLLM default ({why})", d.get("max_model_len")
        if not d.get("enable_chunked_prefill", True):
            mbt, how = max(mml, mbt), f"vLLM default with chunked prefill off: max(max_model_len, {mbt})"
        if d.get("max_num_seqs") * mml < mbt:
            mbt, how = d.get("max_num_seqs") * mml, "vLLM default capped at max_num_seqs x max_model_len"
        d.set("max_num_batched_tokens", mbt, how)
        d.note(NoteKind.DEFAULTED, f"max_num_batched_tokens not given: {mbt} ({how})", "max_num_batched_tokens")
    if not seqs_given:
        if d.get("max_num_batched_tokens") < d.get("max_num_seqs"):
            d.set("max_num_seqs", d.get("max_num_batched_tokens"), d.source("max_num_seqs")
                  + f", capped at max_num_batched_tokens {d.get('max_num_batched_tokens')}")
        d.note(NoteKind.DEFAULTED, f"max_num_seqs not given: {d.get('max_num_seqs')} ({d.source('max_num_seqs')})",
               "max_num_seqs")


def _skip_layers(shape: ModelShape, d: DeploymentDraft, user: list[str]) -> None:
    """Layers vLLM 0.33 keeps off TurboQuant (native dtype, another backend): ``--kv-cache-dtype-skip-layers``
    plus, for a dense model, the first and last ``min(2, L // 2)`` layers (``EngineArgs.create_engine_config``
    -> ``TurboQuantConfig.get_boundary_skip_layers``; hybrids: none). ``num_hidden_layers`` counts the rest."""
    if not is_turboquant(d.get("kv_cache_dtype", "auto")):
        return
    n_all, attn = shape.num_hidden_layers, shape.attention_layers
    n = min(2, n_all // 2) if shape.hybrid is None else 0
    skip = {i for i in range(n_all) if i < n or i >= n_all - n} | {int(t) for t in user if t.isdigit()}
    keep = [i for i in attn if i not in skip]
    if not keep:
        raise VllmArgsError(f"{shape.path}: every attention layer is kept off TurboQuant (skip layers {sorted(skip)}): "
                            "no TurboQuant workspace consumer")
    if len(keep) == len(attn):
        return
    d.set("num_hidden_layers", len(keep), f"derived: {len(attn)} attention layers - {len(attn) - len(keep)} "
          f"kept off TurboQuant (vLLM boundary layers {n} each end + --kv-cache-dtype-skip-layers)")
    d.note(NoteKind.DERIVED, f"TurboQuant layers: {len(keep)} of {len(attn)}; vLLM 0.33 keeps layers {sorted(skip)} in "
           "the model dtype, and may then raise the block size so one page fits both "
           "(Platform._align_heterogeneous_kv_block_size, backend-dependent: not modelled; "
           "pass --block-size with the size vLLM logs)", "num_hidden_layers")
    if any(not t.isdigit() for t in user):
        d.note(NoteKind.NOT_MODELLED, "--kv-cache-dtype-skip-layers " + ", ".join(t for t in user if not t.isdigit())
               + ": not modelled")


def _chunking_notes(given: Mapping[str, Any], block: int, split: bool, d: DeploymentDraft) -> None:
    """Notes for flags that move chunk boundaries or cached lengths in ways tqlab does not model."""
    if given.get("kv_transfer_config"):
        d.note(NoteKind.NOT_MODELLED, "--kv-transfer-config: a KV connector's external hit (Scheduler.schedule, "
               "num_external_computed_tokens) can start a request with tokens cached whatever the prefix "
               "caching and chunking flags; the any-chunking bound does not model it and may be too high")
    lpt = given.get("long_prefill_token_threshold") or 0
    if lpt > 0:
        d.note(NoteKind.NOT_MODELLED, f"--long-prefill-token-threshold {lpt}: vLLM caps the prefill chunk of a request "
               "that is not alone at this many tokens (Scheduler.schedule); alone it is not capped, so the first "
               "failing prompt is unchanged, and the any-chunking bound covers any chunking"
               + (f"; below block_size {block} those chunks end mid-block (Scheduler._mamba_block_aligned_split),"
                  " which the any-chunking bound, counting whole blocks, does not model: it may be too high"
                  if split and lpt < block else ""))


def _default_sources(d: DeploymentDraft) -> None:
    """Fields nobody set: vLLM's default (tqlab's variants: off, they are not vLLM)."""
    for name in sorted(_field_names() - set(d.sources(_field_names()))):
        d.set_source(name, "vLLM default")
    d.set_source("lock_workspace_when_eager", "tqlab variant, off: vLLM 0.33 never locks the workspace in eager mode")
    d.set_source("turboquant_backend_on_unquantized",
                 "tqlab teaching variant, off: a vLLM deployment runs TurboQuant's backend only for a TurboQuant cache")


def _check_kv_cache_dtype(d: DeploymentDraft, mla: bool) -> None:
    """``--kv-cache-dtype`` as tqlab models it (:func:`tqlab.core.config.check_kv_cache_dtype`; MLA-only layouts
    need a model with MLA), a one-line :class:`VllmArgsError` naming the flag otherwise."""
    if "kv_cache_dtype" in d:
        try:
            check_kv_cache_dtype(d.get("kv_cache_dtype"), "--kv-cache-dtype", mla=mla)
        except ValueError as e:
            raise VllmArgsError(str(e)) from None


def _read_shape(engine_args, model_config) -> ModelShape:
    """config.json read with the line's ``--hf-overrides`` applied first, as vLLM's ``ModelConfig`` does
    (:func:`tqlab.vllm.hf_families.apply_hf_overrides`); a :class:`ModelShape` is taken as it is."""
    if isinstance(model_config, ModelShape):
        return model_config
    given, _ = _given(engine_args)
    return read_hf_config(model_config, hf_overrides=given.get("hf_overrides"))


def _hf_overrides_notes(shape: ModelShape, given: Mapping[str, Any], d: DeploymentDraft) -> None:
    """``--hf-overrides``: read (not an ignored flag) once applied; say what it set."""
    if given.get("hf_overrides") is None:
        return
    if not shape.hf_overrides:
        d.note(NoteKind.NOT_MODELLED, "--hf-overrides not applied: the model shape was read before the line")
        return
    d.ignored = [f for f in d.ignored if f != "--hf-overrides"]
    d.note(NoteKind.INFO, "--hf-overrides applied to config.json before it is read (vLLM ModelConfig): "
           + ", ".join(shape.hf_overrides))
    for text in shape.notes:
        d.note(NoteKind.INFO, text)


def _read_model(engine_args, shape: ModelShape, *, gpu_memory_gib: float | None, usage: str,
                gpu: str | None = None) -> DeploymentDraft:
    """Every reader, in vLLM's order, on one draft: flags, config.json, defaults, skip layers, hybrid rules."""
    d, given = _read_flags(engine_args)
    _check_kv_cache_dtype(d, getattr(shape, "mla", None) is not None)
    _hf_overrides_notes(shape, given, d)
    if shape.mamba is not None:  # these size the Mamba page, hence the hybrid attention block
        d.ignored = [f for f in d.ignored if f not in ("--mamba-cache-dtype", "--mamba-ssm-cache-dtype")]
    if shape.hybrid is not None:  # these decide the Mamba block-aligned prefill split
        d.ignored = [f for f in d.ignored if f not in SPLIT_FLAGS]
    if d.ignored:
        d.note(NoteKind.IGNORED, "vLLM flags with no effect on the workspace: " + ", ".join(d.ignored))
    model = {"num_attention_heads": shape.num_attention_heads, "num_key_value_heads": shape.num_key_value_heads,
             "head_dim": shape.head_dim, "num_hidden_layers": shape.num_attention_layers}
    for name, value in model.items():
        d.set(name, value, "config.json")
    for name, how in shape.sources.items():
        d.set_source(name, how)
    for kind in ("mla", "indexer", "moe"):  # workspace consumers' model fields (issue 19)
        if getattr(shape, kind) is not None:
            d.set(kind, getattr(shape, kind), f"config.json ({kind} fields)")
    _model_dtype(shape, d)
    _max_model_len(shape, d, given.get(ENV_KEY))
    if gpu is not None:
        d.set("gpu", gpu_target(gpu).name, f"tqlab --gpu {gpu_target(gpu).name}")
    _scheduler_defaults(d, usage, gpu_memory_gib, given.get("performance_mode"), gpu)
    _skip_layers(shape, d, given.get("kv_cache_dtype_skip_layers") or [])
    apply_hybrid_block(shape, d, given)
    if shape.hybrid is not None:
        apply_mamba_split(given, d, gdn=shape.mamba is not None and shape.mamba.kind == "gdn")
    _chunking_notes(given, d.get("block_size", 16), d.get(SPLIT, False), d)
    _default_sources(d)
    dropped = d.unknown(_field_names())
    if dropped:
        d.note(NoteKind.NOT_MODELLED, "read but not modelled by this EngineConfig: "
               + ", ".join(f"{k}={d.get(k)!r}" for k in dropped))
    return d


def engine_config_kwargs_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any] | ModelShape,
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[dict[str, Any], list[Note], dict[str, str]]:
    """``(EngineConfig kwargs, notes, sources)`` for a ``vllm serve`` line and a config.json.

    Only kwargs that are fields of this tqlab's :class:`EngineConfig` are
    returned; others are named in the notes. Model fields come from :func:`read_hf_config` (attention
    layers only: ``num_hidden_layers`` = layers with this attention backend);
    ``--max-model-len auto`` (or -1) and an absent one take vLLM's derived
    length (``_get_and_verify_max_len``; auto may then be lowered by vLLM to
    fit GPU memory, which tqlab does not model); unset scheduler limits take
    :func:`vllm_default_limits`; hybrid models get
    :func:`hybrid_attention_block_size` and ``mamba_block_aligned_split``
    (:func:`tqlab.vllm.hybrid.apply_mamba_split`). Raises ``ValueError`` (one line) for
    bad flags, values or config.json fields.
    """
    shape = _read_shape(engine_args, model_config)
    d = _read_model(engine_args, shape, gpu_memory_gib=gpu_memory_gib, usage=usage)
    names = _field_names()
    return d.kwargs(names), list(d.notes), d.sources(names)


def deployment_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
    gpu: str | None = None,
) -> VllmDeployment:
    """The deployment a ``vllm serve`` line and a config.json make: the validated :class:`EngineConfig`,
    with every field's source and the notes, as a :class:`VllmDeployment`.

    ``gpu``: the GPU target (``EngineConfig.gpu``; case-insensitive, :func:`tqlab.core.hardware.gpu_target`),
    which also sets vLLM's default batch limits unless ``gpu_memory_gib`` is given
    (:func:`vllm_default_limits`); None keeps ``EngineConfig``'s default target (H200) and, for the batch
    limits, the GPU size unknown (vLLM's small tier) -- ``tqlab inspect-vllm`` always passes one (``--gpu``).

    Raises ``ValueError`` (one line) for bad flags, values, config.json
    fields or a combination EngineConfig rejects.
    """
    shape = _read_shape(engine_args, model_config)
    d = _read_model(engine_args, shape, gpu_memory_gib=gpu_memory_gib, usage=usage, gpu=gpu)
    names = _field_names()
    try:
        config = EngineConfig(**d.kwargs(names))
    except ValueError as e:  # a combination of config.json fields and flags EngineConfig rejects: name each source
        raise ValueError(_blame(str(e), shape, d)) from None
    return VllmDeployment(config, list(d.notes), d.sources(names), shape, _records(d, config))


def engine_config_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[EngineConfig, list[Note]]:
    """``(config, notes)`` of :func:`deployment_from_vllm`; use that for the ``sources`` as well."""
    dep = deployment_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib, usage=usage)
    return dep.config, dep.notes


def _preset_split(d: DeploymentDraft, given: Mapping[str, Any], base: Mapping[str, Any]) -> None:
    """A hybrid preset with prefix caching on: the line's prefix-caching flags decide the split
    (:func:`tqlab.vllm.hybrid.apply_mamba_split` on the preset's values overridden by the line's)."""
    d.ignored = [f for f in d.ignored if f not in SPLIT_FLAGS]
    merged = DeploymentDraft()
    for k in ("block_size", "max_num_batched_tokens", "enable_chunked_prefill", "max_num_scheduled_tokens"):
        merged.set(k, d.get(k, base.get(k, EngineConfig.__dataclass_fields__[k].default)), "")
    chunk = step_token_budget(merged.get("max_num_batched_tokens"), merged.get("max_num_scheduled_tokens"))
    if ({"enable_prefix_caching", "mamba_cache_mode"} & set(given) or not merged.get("enable_chunked_prefill")
            or merged.get("block_size") > chunk):
        apply_mamba_split(given, merged)
        d.set(SPLIT, merged.get(SPLIT), merged.source(SPLIT))
        d.notes += merged.notes


_PRESET_MODEL_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim")
"""config.json keys a preset records as EngineConfig fields of the same name (``--hf-overrides`` sets them;
a preset's ``num_hidden_layers`` counts attention layers only, so config.json's is not it)."""


def _preset_hf_overrides(given: Mapping[str, Any], d: DeploymentDraft) -> None:
    """``--hf-overrides`` on a preset: the model keys the preset records take the override (as vLLM would set
    them in its config.json); other keys need the config.json itself (``--config``): a note says so."""
    over = given.get("hf_overrides")
    if over is None:
        return
    if not isinstance(over, Mapping):
        raise VllmArgsError(f"--hf-overrides must be a JSON object such as '{{\"num_key_value_heads\": 4}}', got {over!r}")
    d.ignored = [f for f in d.ignored if f != "--hf-overrides"]
    for key in _PRESET_MODEL_KEYS:
        if key in over:
            v = over[key]  # as read_hf_config reads config.json: an integer (4.0 is 4), never a string
            v = int(v) if isinstance(v, float) and v.is_integer() else v
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise VllmArgsError(f"--hf-overrides {key} must be an integer >= 1, got {over[key]!r}")
            d.set(key, v, f"flag --hf-overrides {key}")
    rest = sorted(k for k in over if k not in _PRESET_MODEL_KEYS)
    if rest:
        d.note(NoteKind.NOT_MODELLED, "--hf-overrides " + ", ".join(rest) + ": a preset has no config.json to apply "
               "them to; give the model's config.json with --config to see their effect")


def deployment_from_preset(engine_args: str | Sequence[str] | Mapping[str, Any] | None, preset: str,
                           gpu: str | None = None) -> VllmDeployment:
    """A tqlab preset (``data/presets/NAME.json``) with a ``vllm serve`` line's flags applied, with ``sources``.

    Fields the line sets say ``"flag --..."``; the others ``"preset NAME"``. A preset with
    ``mamba_block_aligned_split`` (a hybrid) takes the line's prefix-caching flags
    (:func:`tqlab.vllm.hybrid.apply_mamba_split`). Raises ``ValueError`` for an unknown preset or bad
    flags (one line), and ``TypeError`` never: only EngineConfig fields are passed.
    """
    d, given = _flag_draft(engine_args)
    if gpu is not None:  # the preset's batch limits stay (they are the preset's own)
        d.set("gpu", gpu_target(gpu).name, f"tqlab --gpu {gpu_target(gpu).name}")
    _check_kv_cache_dtype(d, load_preset(preset)["config"].get("mla") is not None)
    if "dtype" in d:
        d.set_value("dtype", parse_dtype(d.get("dtype")))
    _preset_hf_overrides(given, d)
    base = load_preset(preset)["config"]
    if base.get(SPLIT):
        _preset_split(d, given, base)
    names = _field_names()
    config = EngineConfig.from_preset(preset, **d.kwargs(names))
    _chunking_notes(given, config.block_size, config.mamba_block_aligned_split, d)
    for name in sorted(names - set(d.sources(names))):
        d.set_source(name, f"preset {preset}")
    if d.ignored:
        d.note(NoteKind.IGNORED, "vLLM flags with no effect on the workspace: " + ", ".join(d.ignored))
    notes = [Note(NoteKind.PRESET, f"preset {preset}"), *d.notes]
    return VllmDeployment(config, notes, d.sources(names), None, _records(d, config))


def _records(d: DeploymentDraft, config: EngineConfig) -> dict[str, FieldRecord]:
    """Per EngineConfig field: the validated value, its source and the notes about it."""
    return {k: FieldRecord(getattr(config, k), rec.source, list(rec.notes))
            for k, rec in d.fields.items() if k in _field_names()}
