"""A deployment from a ``vllm serve`` line (or argv, or a dict) and the model's ``config.json``, as vLLM 0.33 reads them.

The line is parsed by :mod:`tqlab.vllm.flags` (vLLM's own flags, as data); config.json is read
by :mod:`tqlab.vllm.hf_config`. The readers here record, on one
:class:`~tqlab.vllm.draft.DeploymentDraft`, each :class:`~tqlab.core.config.EngineConfig` field's
value, where it came from and the notes about it (each a :class:`~tqlab.core.notes.Note` with a
kind); hybrid models get vLLM's block size and Mamba block-aligned split (:mod:`tqlab.vllm.hybrid`).
The result is a :class:`VllmDeployment`, built once.

The readers live in two siblings, called here in vLLM's order: :mod:`tqlab.vllm.flag_map` (the
line's flags -> EngineConfig fields, :func:`parse_engine_args`) and :mod:`tqlab.vllm.defaults`
(config.json and vLLM's defaults and limits, :func:`vllm_default_limits`); both public names, and
``_given`` / ``_map_flags``, are still importable from here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqlab.core.hardware import gpu_target
from tqlab.core.config import CUDAGRAPH_MODES as CUDAGRAPH_MODES
from tqlab.core.config import EngineConfig, load_preset, parse_dtype, step_token_budget
from tqlab.core.notes import Note, NoteKind
from tqlab.vllm.defaults import (
    _check_kv_cache_dtype,
    _chunking_notes,
    _default_sources,
    _max_model_len,
    _model_dtype,
    _scheduler_defaults,
    _skip_layers,
    vllm_default_limits,
)
from tqlab.vllm.draft import DeploymentDraft, FieldRecord
from tqlab.vllm.flag_map import _field_names, _flag_draft, _given, _read_flags, parse_engine_args
from tqlab.vllm.flag_map import _map_flags as _map_flags
from tqlab.vllm.flags import (
    ENV_KEY,
    FLAGS_FILE,
    VllmArgsError,
    human_readable_int,
    human_readable_int_or_auto,
    parse_serve_args,
    vllm_flags,
)
from tqlab.vllm.hf_config import ModelShape, read_hf_config
from tqlab.vllm.hybrid import SPLIT, SPLIT_FLAGS, apply_hybrid_block, apply_mamba_split, hybrid_attention_block_size
from tqlab.vllm.validation import StartupFacts, preset_model, startup_facts

__all__ = [
    "FLAGS_FILE", "DeploymentDraft", "FieldRecord", "VllmArgsError", "VllmDeployment", "deployment_from_preset",
    "deployment_from_vllm", "engine_config_from_vllm", "engine_config_kwargs_from_vllm", "human_readable_int",
    "human_readable_int_or_auto", "hybrid_attention_block_size", "parse_engine_args", "parse_serve_args",
    "preset_max_len_check", "vllm_default_limits", "vllm_flags",
]


@dataclass(frozen=True)
class VllmDeployment:
    """A deployment read from a ``vllm serve`` line + config.json (or a preset and a line).

    ``config``: the validated :class:`EngineConfig`; ``notes``: what was assumed, read
    differently or ignored, each a :class:`~tqlab.core.notes.Note` (a ``str`` with a ``kind``
    and, where it is about one field, its ``field``); ``sources``: for every EngineConfig
    field, where it came from (``"flag --max-model-len"``, ``"config.json max_position_embeddings"``,
    ``"vLLM default ..."``, ``"derived: ..."``, ``"preset NAME"``); ``model``: the validated
    :class:`ModelShape` (None for a preset); ``fields``: per field its :class:`FieldRecord`
    (value, source, the notes about it); ``startup``: what vLLM's start-up validation reads beyond the config
    (:class:`~tqlab.vllm.validation.StartupFacts`; pass it to :func:`tqlab.predict.analysis.predict`).
    """

    config: EngineConfig
    notes: list[Note] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    model: ModelShape | None = None
    fields: dict[str, FieldRecord] = field(default_factory=dict, compare=False, repr=False)
    startup: StartupFacts = field(default_factory=StartupFacts)

    def notes_of(self, kind: NoteKind) -> list[Note]:
        """The notes of one kind, in order."""
        return [n for n in self.notes if n.kind is kind]


def _blame(message: str, shape: ModelShape, d: DeploymentDraft) -> str:
    """An :class:`EngineConfig` error with where each field it names came from (a flag, config.json, a default);
    the file's path leads only when a field came from it."""
    names = sorted(n for n in _field_names() if re.search(rf"\b{n}\b", message) and d.source(n))
    where = "; ".join(f"{n}: {d.source(n)}" for n in names)
    lead = f"{shape.path}: " if any(d.source(n).startswith("config.json") for n in names) or not names else ""
    return f"{lead}{message}" + (f" ({where})" if where else "")



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
    d.set("architecture", shape.architecture or "", "config.json architectures[0]")  # picks the consumers (issue 30)
    for kind in ("mla", "indexer", "moe"):  # workspace consumers' model fields (issue 19)
        if getattr(shape, kind) is not None:
            d.set(kind, getattr(shape, kind), f"config.json ({kind} fields)")
    _model_dtype(shape, d)
    _max_model_len(shape, d, given.get(ENV_KEY))
    if gpu is not None:
        d.set("gpu", gpu_target(gpu).name, f"tqlab --gpu {gpu_target(gpu).name}")
    _scheduler_defaults(d, usage, gpu_memory_gib, given.get("performance_mode"), gpu, given.get("all2all_backend"))
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
    facts = startup_facts(_given(engine_args)[0], _raw_config(model_config), hybrid=shape.hybrid is not None,
                          num_layers=shape.num_attention_layers)
    return VllmDeployment(config, list(d.notes), d.sources(names), shape, _records(d, config), facts)


def _raw_config(model_config) -> Mapping[str, Any] | None:
    """config.json as a dict, for the start-up facts (sliding window, sinks) the shape does not keep."""
    from tqlab.vllm.hf_config import _load

    if isinstance(model_config, ModelShape):
        return None
    raw = _load(model_config)[1]
    return raw if isinstance(raw, Mapping) else None


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


def _preset_server(preset: str, given: Mapping[str, Any], d: DeploymentDraft) -> None:
    """The server limits no flag sets take vLLM's defaults for the GPU, not the preset's numbers
    (:func:`tqlab.vllm.preset_server.preset_server_limits`), with their sources and notes."""
    from tqlab.vllm.preset_server import preset_server_limits

    flags = d.kwargs(_field_names())
    values, sources, notes = preset_server_limits(preset, flags, gpu=flags.get("gpu"),
                                                  performance_mode=given.get("performance_mode"),
                                                  all2all_backend=given.get("all2all_backend"))
    for name, value in values.items():
        d.set(name, value, sources[name])
    d.notes += notes


def preset_max_len_check(preset: str, max_model_len: int | None, env: Mapping[str, str] | None = None) -> None:
    """vLLM ``_get_and_verify_max_len`` for a preset, as :func:`tqlab.vllm.defaults._max_model_len` does for a
    config.json: a ``--max-model-len`` above the preset model's ``max_position_embeddings`` (its ``model`` object;
    the presets that record it take no RoPE factor: Llama-3 ``llama3``, DeepSeek ``yarn``, none) raises
    :class:`VllmArgsError` unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (``env``, else this process's
    environment). None or -1 (auto): nothing to check."""
    from tqlab.vllm.flags import env_flag

    limit = preset_model(preset).get("max_position_embeddings")
    if max_model_len in (None, -1) or not isinstance(limit, int) or max_model_len <= limit:
        return
    if not env_flag(dict(env or {}), "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        raise VllmArgsError(f"--max-model-len {max_model_len} is greater than the derived maximum length "
                            f"(max_position_embeddings={limit} of preset {preset}); vLLM refuses it unless "
                            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")


def deployment_from_preset(engine_args: str | Sequence[str] | Mapping[str, Any] | None, preset: str,
                           gpu: str | None = None) -> VllmDeployment:
    """A tqlab preset (``data/presets/NAME.json``) with a ``vllm serve`` line's flags applied, with ``sources``.

    Fields the line sets say ``"flag --..."``; ``max_num_seqs`` / ``max_num_batched_tokens`` the line leaves out
    take vLLM's defaults for ``gpu`` as for a config.json (:mod:`tqlab.vllm.preset_server`; a preset that
    records a real deployment keeps its own); the others ``"preset NAME"``. A preset with
    ``mamba_block_aligned_split`` (a hybrid) takes the line's prefix-caching flags
    (:func:`tqlab.vllm.hybrid.apply_mamba_split`). Raises ``ValueError`` for an unknown preset or bad
    flags (one line), and ``TypeError`` never: only EngineConfig fields are passed.
    """
    d, given = _flag_draft(engine_args)
    preset_max_len_check(preset, d.get("max_model_len", -1), given.get(ENV_KEY))
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
    _preset_server(preset, given, d)
    config = EngineConfig.from_preset(preset, **d.kwargs(names))
    _chunking_notes(given, config.block_size, config.mamba_block_aligned_split, d)
    for name in sorted(names - set(d.sources(names))):
        d.set_source(name, f"preset {preset}")
    if d.ignored:
        d.note(NoteKind.IGNORED, "vLLM flags with no effect on the workspace: " + ", ".join(d.ignored))
    notes = [Note(NoteKind.PRESET, f"preset {preset}"), *d.notes]
    facts = startup_facts(given, preset_model(preset), hybrid=bool(base.get(SPLIT)))
    return VllmDeployment(config, notes, d.sources(names), None, _records(d, config), facts)


def _records(d: DeploymentDraft, config: EngineConfig) -> dict[str, FieldRecord]:
    """Per EngineConfig field: the validated value, its source and the notes about it."""
    return {k: FieldRecord(getattr(config, k), rec.source, list(rec.notes))
            for k, rec in d.fields.items() if k in _field_names()}
