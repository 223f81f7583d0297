"""A ``vllm serve`` line's flags -> :class:`~tqlab.core.config.EngineConfig` fields, as vLLM 0.33 reads them.

Split out of :mod:`tqlab.vllm.deployment` (which re-exports :func:`parse_engine_args` and imports the
rest): the line (a string, argv or a dict) is parsed by :mod:`tqlab.vllm.flags`; :func:`_map_flags`
records on a new :class:`~tqlab.vllm.draft.DeploymentDraft` each field a flag sets, with its source
(``"flag --max-model-len"``), applying the range checks of vLLM's pydantic config classes, the
``--compilation-config`` keys and the ``-O`` level's ``cudagraph_mode``. Nothing here reads config.json.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tqlab.core.config import CUDAGRAPH_MODES, EngineConfig
from tqlab.core.notes import Note, NoteKind
from tqlab.vllm.draft import DeploymentDraft
from tqlab.vllm.flags import ENV_KEY, ENV_SIZES, VllmArgsError, lax_int, parse_serve_args, vllm_flags
from tqlab.core.consumers.backends import BACKENDS
from tqlab.vllm.validation import backend_flag

__all__ = ["CUDAGRAPH_MODES", "parse_engine_args"]

_LEVEL_MODE = {"0": "NONE", "1": "PIECEWISE", "2": "FULL_AND_PIECEWISE", "3": "FULL_AND_PIECEWISE"}
"""``vllm/config/vllm.py`` ``OPTIMIZATION_LEVEL_0x`` ``cudagraph_mode`` defaults."""


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
    "enable_expert_parallel": "enable_expert_parallel",
}
_READ = set(_DIRECT) | {"model_tag", "model", "compilation_config", "attention_config", "speculative_config",
                        "cudagraph_capture_sizes", "optimization_level", "kv_cache_dtype_skip_layers",
                        "long_prefill_token_threshold", "max_num_scheduled_tokens", "kv_transfer_config", ENV_KEY,
                        "all2all_backend", "attention_backend", "prefill_context_parallel_size", "disable_sliding_window"}
"""Flags tqlab reads (the others get an IGNORED note); ``-pcp`` and ``--disable-sliding-window`` feed vLLM's start-up
validation (:mod:`tqlab.vllm.validation`)."""


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


_ATTENTION_CONFIG_READ = frozenset({"tq_max_kv_splits_for_cuda_graph", "mla_prefill_backend", "backend"})
"""``--attention-config`` keys tqlab reads; any other key set gets a NOT_MODELLED note (never dropped silently)."""


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
    _map_env_sizes(g.get(ENV_KEY) or {}, d)
    backend, where, refusal = backend_flag(g)  # --attention-config.backend acts as --attention-backend (vLLM)
    if backend is not None:
        d.set("attention_backend", backend, f"flag {where}")
        if backend not in BACKENDS:
            d.note(NoteKind.NOT_MODELLED, f"{where} {backend}: tqlab does not model this backend (not in a CUDA "
                   "priority list of vLLM 0.33): its start-up validation and workspace requests are not sized",
                   "attention_backend")
    elif refusal is not None and where is not None:  # a name outside vLLM 0.33's AttentionBackendEnum
        d.note(NoteKind.NOT_MODELLED, f"{where} {refusal.reason.split(': ')[1].split('.')[0]} is not a vLLM 0.33 "
               "backend (a fork's?): stock vLLM 0.33 refuses to start, and tqlab cannot size a fork's backend")
    if att.get("mla_prefill_backend") is not None:
        d.set("mla_prefill_backend", str(att["mla_prefill_backend"]), "flag --attention-config mla_prefill_backend")
    for key in sorted(k for k, v in att.items() if v is not None and k not in _ATTENTION_CONFIG_READ):
        d.note(NoteKind.NOT_MODELLED, f"--attention-config {key} = {att[key]!r} is not read by tqlab: workspace sizes "
               "use vLLM's default for it (e.g. sparse_mla_prefill_workspace_factor sizes FlashMLA sparse's prefill "
               "workspace and the sparse indexer's K-gather rows)")
    d.ignored = sorted(_flag(k) for k in g if k not in _READ)
    return d


def _map_env_sizes(env: Mapping[str, str], d: DeploymentDraft) -> None:
    """``vllm/envs.py``'s integer variables that size a workspace consumer (:data:`~tqlab.vllm.flags.ENV_SIZES`):
    the line's ``NAME=value`` word, else this process's environment (as :func:`~tqlab.vllm.flags.env_flag`), read
    with ``int()`` as ``envs.py`` does. Raises :class:`VllmArgsError` for a value ``int()`` refuses or below 1."""
    import os

    for name, (fld, _what) in ENV_SIZES.items():
        raw = env.get(name, os.environ.get(name))
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise VllmArgsError(f"environment {name}={raw!r}: vLLM 0.33 reads it with int() (vllm/envs.py) and "
                                "fails to start") from None
        if value < 1:
            raise VllmArgsError(f"environment {name}={raw!r}: a workspace request of {value} bytes; give at least 1")
        d.set(fld, value, f"environment {name}" + ("" if name in env else " (this process)"))


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
