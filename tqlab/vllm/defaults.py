"""vLLM 0.33's defaults and limits for what a ``vllm serve`` line leaves open, read with the model's config.json.

Split out of :mod:`tqlab.vllm.deployment` (which re-exports :func:`vllm_default_limits` and calls
the rest in vLLM's order): the model dtype (``--dtype auto``), ``max_model_len`` (vLLM's
``_get_and_verify_max_len``), the scheduler's batch limits (``EngineArgs.get_batch_defaults``),
the layers TurboQuant skips, the ``--kv-cache-dtype`` check, and notes for chunking flags not modelled.
Each reader records on the :class:`~tqlab.vllm.draft.DeploymentDraft` the value, its source and notes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tqlab.core import dtypes
from tqlab.core.config import check_kv_cache_dtype, is_turboquant, parse_dtype
from tqlab.core.hardware import batch_defaults, gpu_target
from tqlab.core.notes import NoteKind
from tqlab.vllm.draft import DeploymentDraft
from tqlab.vllm.flag_map import _field_names
from tqlab.vllm.flags import VllmArgsError, env_flag
from tqlab.vllm.hf_config import ModelShape

__all__ = ["vllm_default_limits"]


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
# config.json and vLLM defaults -> EngineConfig fields                         #
# --------------------------------------------------------------------------- #


def _model_dtype(shape: ModelShape, d: DeploymentDraft) -> None:
    """``--dtype auto`` keeps the checkpoint's dtype, fp32 checkpoints served in bf16 (``_resolve_auto_dtype``)."""
    want = d.get("dtype")
    if want not in (None, "auto"):
        d.set_value("dtype", parse_dtype(want))
        return
    cfg = shape.dtype or "bfloat16"
    if cfg.removeprefix("torch.") in ("float32", "float"):
        d.set("dtype", dtypes.bfloat16, "derived: config.json torch_dtype float32 -> bfloat16 (vLLM --dtype auto)")
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


_BATCHED_DP_ALL2ALL = ("deepep_low_latency", "nixl_ep")
"""``ParallelConfig.use_batched_dp_moe``'s all2all backends (``vllm/config/parallel.py``)."""


def _scheduler_defaults(d: DeploymentDraft, usage: str, gpu_memory_gib: float | None,
                        performance_mode: str | None, gpu: str | None = None,
                        all2all_backend: str | None = None) -> None:
    """Unset ``max_num_seqs`` / ``max_num_batched_tokens`` as vLLM 0.33 sets them
    (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``): the usage/GPU defaults,
    doubled with ``--performance-mode throughput``; without chunked prefill the batch is at least
    ``max_model_len``; then ``min(max_num_seqs * max_model_len, ...)``, and a defaulted
    ``max_num_seqs`` is capped by the batch. (vLLM's ``max_num_batched_tokens >= max_num_seqs``
    check then applies, in :class:`EngineConfig`.) With batched DP MoE (``ParallelConfig.use_batched_dp_moe``:
    ``--all2all-backend`` deepep_low_latency or nixl_ep, ``-dp`` > 1, expert parallelism) the batch default is
    ``SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP`` = 256 tokens."""
    mbt, seqs, why = vllm_default_limits(usage, gpu_memory_gib, gpu)
    if (all2all_backend in _BATCHED_DP_ALL2ALL and d.get("enable_expert_parallel", False)
            and d.get("data_parallel_size", 1) > 1):
        mbt, why = 256, why + f"; batched DP MoE (--all2all-backend {all2all_backend}): 256 tokens"
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
    d.set_source("lock_workspace_when_eager", "tqlab variant, off: vLLM never locks the workspace in eager mode")
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
