"""A preset describes a model; the server's batch limits come from vLLM's rules for the GPU, as for a config.json.

``tqlab plan --preset NAME`` and ``inspect-vllm --preset NAME`` answer for the same ``vllm serve`` line as
``inspect-vllm --config config.json`` does: ``max_num_seqs`` and ``max_num_batched_tokens`` that no flag gives
take vLLM 0.33's defaults for ``--gpu`` (:func:`tqlab.vllm.defaults._scheduler_defaults`, which mirrors
``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` and ``EngineArgs.get_batch_defaults`` in
``vllm/engine/arg_utils.py``), each with that source, not the number written in the preset's ``config``.

The exception is a preset that records a real deployment (a bug report's serve line, a vLLM unit test): its
JSON's ``"deployment"`` object names each server field whose value that source gives, and why
(``{"max_num_seqs": "the bug report's --max-num-seqs 4", ...}``); those keep the preset's value, with the
source ``preset NAME``. :meth:`tqlab.core.config.EngineConfig.from_preset` is unchanged: ``tqlab repro``,
the notebooks and the widgets still build the preset's whole ``config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqlab.core.config import EngineConfig, load_preset
from tqlab.core.hardware import DEFAULT_GPU
from tqlab.core.notes import Note
from tqlab.vllm.defaults import _scheduler_defaults
from tqlab.vllm.draft import DeploymentDraft

__all__ = ["SERVER_FIELDS", "preset_deployment_fields", "preset_server_limits"]

SERVER_FIELDS = ("max_num_seqs", "max_num_batched_tokens")
"""The scheduler limits vLLM derives from the GPU when a serve line leaves them out."""


def preset_deployment_fields(preset: str) -> dict[str, str]:
    """``{server field: why its value is the recorded deployment's}`` from the preset's ``"deployment"`` object
    (empty for a preset that describes only a model). Raises ``ValueError`` for an unknown preset, or for a
    ``"deployment"`` that is not an object of :data:`SERVER_FIELDS` present in the preset's ``config``."""
    data = load_preset(preset)
    kept = data.get("deployment", {})
    if not isinstance(kept, Mapping) or any(k not in SERVER_FIELDS or k not in data["config"] for k in kept):
        raise ValueError(f"preset {preset}: 'deployment' must map some of {', '.join(SERVER_FIELDS)} (each in its "
                         f"config) to where the value comes from, got {kept!r}")
    return dict(kept)


def preset_server_limits(preset: str, given: Mapping[str, Any], *, gpu: str | None = None,
                         performance_mode: str | None = None,
                         all2all_backend: str | None = None) -> tuple[dict[str, Any], dict[str, str], list[Note]]:
    """``(values, sources, notes)`` of the :data:`SERVER_FIELDS` a preset deployment takes from vLLM's defaults.

    ``given``: the EngineConfig fields the command line sets (flags; they win); ``gpu``: the ``--gpu`` target
    (None: the preset's, else :data:`~tqlab.core.hardware.DEFAULT_GPU`); ``performance_mode`` /
    ``all2all_backend``: the serve line's ``--performance-mode`` / ``--all2all-backend``, which vLLM's rule reads.
    Only fields neither given nor kept by :func:`preset_deployment_fields` are returned, each with vLLM's
    default for the ``vllm serve`` usage on that GPU and its source ("vLLM default (`vllm serve` on --gpu H200,
    139.8 GiB: >= 70 GiB)"), capped as vLLM caps them (``max_num_seqs * max_model_len``; with chunked prefill
    off the batch is at least ``max_model_len``). ``notes``: the ``defaulted`` notes saying so.
    Raises ``ValueError`` for an unknown preset or GPU.
    """
    base = {f: getattr(EngineConfig, f) for f in ("max_model_len", "enable_chunked_prefill", "gpu")}
    base.update(load_preset(preset)["config"])
    kept = preset_deployment_fields(preset)
    d = DeploymentDraft()
    for name in ("max_model_len", "enable_chunked_prefill", "enable_expert_parallel", "data_parallel_size"):
        if name in given or name in base:
            d.set(name, given.get(name, base.get(name)), "")
    for name in SERVER_FIELDS:
        if name in given:
            d.set(name, given[name], "flag")
        elif name in kept:
            d.set(name, base[name], f"preset {preset}")
    _scheduler_defaults(d, "serve", None, performance_mode, gpu or base.get("gpu") or DEFAULT_GPU, all2all_backend)
    todo = [n for n in SERVER_FIELDS if n not in given and n not in kept]
    notes = [n for n in d.notes if n.field in todo]
    return {n: d.get(n) for n in todo}, {n: d.source(n) for n in todo}, notes
