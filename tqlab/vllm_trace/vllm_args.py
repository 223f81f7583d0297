"""A deployment from vLLM engine arguments (a ``vllm serve`` line, argv or dict) and the model's ``config.json``."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..config import EngineConfig, parse_dtype

# --------------------------------------------------------------------------- #
# Deployment config: vLLM engine args + the model's config.json              #
# --------------------------------------------------------------------------- #

# engine-arg name (underscored) -> EngineConfig field
_INT_ARGS = {
    "tensor_parallel_size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "block_size": "block_size",
}
_BOOL_ARGS = {"enable_chunked_prefill", "enable_dbo", "enforce_eager"}
_FLAG_ONLY = {
    "trust_remote_code", "enable_expert_parallel", "enable_prefix_caching", "no_enable_prefix_caching",
    "enforce_eager", "enable_dbo", "enable_chunked_prefill", "no_enable_chunked_prefill", "disable_log_requests",
    "disable_log_stats", "enable_auto_tool_choice", "async_scheduling", "no_async_scheduling",
}


def _human_int(name: str, value: Any) -> int:
    """vLLM's integer syntax: ``131072``, ``128k`` (x1000), ``128K`` (x1024)."""
    if isinstance(value, bool):
        raise ValueError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    s = str(value).strip()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    try:
        if s and s[-1] in mult:
            num = s[:-1]
            if s[-1].isupper():
                return int(num) * mult[s[-1]]
            return int(float(num) * mult[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer (e.g. 131072 or 128k), got {value!r}") from None


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"--{name.replace('_', '-')} must be true or false, got {value!r}")


def parse_engine_args(engine_args: str | Sequence[str] | Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """vLLM engine arguments -> ``({EngineConfig field: value}, [ignored args])``.

    Accepts a ``vllm serve MODEL --flag value ...`` command line (a string,
    shell-quoted), the same as an argv list, or a dict (keys with ``-`` or
    ``_``, with or without leading ``--``). Understood: ``--tensor-parallel-size``
    / ``-tp``, ``--max-model-len`` (``128k`` syntax too), ``--max-num-seqs``,
    ``--max-num-batched-tokens``, ``--block-size``, ``--dtype``,
    ``--kv-cache-dtype``, ``--[no-]enable-chunked-prefill``, ``--enable-dbo``,
    ``--enforce-eager``, ``--attention-config`` (JSON with
    ``tq_max_kv_splits_for_cuda_graph``). Other arguments are returned as
    ignored. Raises ``ValueError`` naming a bad value.
    """
    if engine_args is None:
        return {}, []
    items: list[tuple[str, Any]] = []
    ignored: list[str] = []
    if isinstance(engine_args, Mapping):
        items = [(str(k).lstrip("-").replace("-", "_"), v) for k, v in engine_args.items()]
    else:
        argv = shlex.split(engine_args) if isinstance(engine_args, str) else [str(a) for a in engine_args]
        i = 0
        while i < len(argv):
            tok = argv[i]
            if not tok.startswith("-"):
                if tok not in ("vllm", "serve", "python", "-m", "vllm.entrypoints.openai.api_server"):
                    items.append(("model", tok))
                i += 1
                continue
            name = tok.lstrip("-").replace("-", "_")
            if "=" in name:
                name, value = name.split("=", 1)
                items.append((name, value))
                i += 1
                continue
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--") and name not in _FLAG_ONLY
            if has_value:
                items.append((name, argv[i + 1]))
                i += 2
            else:
                items.append((name, True))
                i += 1
    out: dict[str, Any] = {}
    for name, value in items:
        if name in _INT_ARGS:
            out[_INT_ARGS[name]] = _human_int(name, value)
        elif name == "no_enable_chunked_prefill":
            out["enable_chunked_prefill"] = not _as_bool(name, value)
        elif name in _BOOL_ARGS:
            out[name] = _as_bool(name, value)
        elif name == "dtype":
            out["dtype"] = str(value)
        elif name == "kv_cache_dtype":
            out["kv_cache_dtype"] = str(value)
        elif name == "attention_config":
            cfg = json.loads(value) if isinstance(value, str) else dict(value)
            if "tq_max_kv_splits_for_cuda_graph" in cfg:
                out["tq_max_kv_splits_for_cuda_graph"] = _human_int(
                    "tq_max_kv_splits_for_cuda_graph", cfg["tq_max_kv_splits_for_cuda_graph"]
                )
        elif name == "model":
            out["model"] = str(value)
        else:
            ignored.append(name if value is True else f"{name}={value}")
    return out, ignored


def _load_model_config(model_config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(model_config, Mapping):
        return dict(model_config)
    p = Path(model_config)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model config {str(model_config)!r}: no such file (expected a config.json or its folder)")
    return json.loads(p.read_text())


def _count_attention_layers(cfg: Mapping[str, Any]) -> int | None:
    """Attention layers of a hybrid model, from the usual config.json hints, else None."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*")
    for key in ("layer_types", "layers_block_type"):
        types = cfg.get(key)
        if isinstance(types, list) and types:
            return sum(1 for t in types if str(t) in ("full_attention", "attention", "sliding_attention"))
    return None


def vllm_default_limits(usage: str = "serve", gpu_memory_gib: float | None = None) -> tuple[int, int, str]:
    """vLLM 0.33's default ``(max_num_batched_tokens, max_num_seqs, why)`` with chunked prefill on.

    ``usage``: ``"serve"`` (``vllm serve``) or ``"llm"`` (the ``LLM`` class);
    ``gpu_memory_gib``: the GPU's memory in GiB (None: assumed under 70 GiB).
    Under 70 GiB: 2048/8192 tokens, 256 seqs; >= 70 GiB: 8192/16384, 1024;
    >= 160 GiB: 16384, 1024. ``why`` says which case applied, in words.
    Raises ``ValueError`` for another ``usage``.
    """
    if usage not in ("serve", "llm"):
        raise ValueError(f"usage must be 'serve' or 'llm', got {usage!r}")
    mem = 0.0 if gpu_memory_gib is None else float(gpu_memory_gib)
    cmd = "`vllm serve`" if usage == "serve" else "the `LLM` class"
    if mem >= 160:
        return 16384, 1024, f"{cmd} on a GPU of >= 160 GiB"
    if mem >= 70:
        return (8192 if usage == "serve" else 16384), 1024, f"{cmd} on a GPU of >= 70 GiB"
    gpu = "" if gpu_memory_gib is not None else "; GPU size assumed, pass --gpu-memory-gib"
    return (2048 if usage == "serve" else 8192), 256, f"{cmd} on a GPU under 70 GiB{gpu}"


def engine_config_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[EngineConfig, list[str]]:
    """Build an :class:`EngineConfig` from vLLM engine args + a HF ``config.json``.

    Model fields come from ``config.json`` (or its ``text_config``):
    ``num_attention_heads``, ``num_key_value_heads`` (default: the query
    heads), ``head_dim`` (default ``hidden_size // num_attention_heads``),
    attention layers (hybrid hints, else ``num_hidden_layers``), the dtype
    (``torch_dtype``/``dtype``; ``--dtype auto`` keeps it, fp32 checkpoints are
    served in bf16) and ``max_position_embeddings`` (default ``max_model_len``).
    Unset scheduler limits take vLLM 0.33's defaults for ``usage`` (``serve``
    or ``llm``) and a GPU of ``gpu_memory_gib`` (None: under 70 GiB):
    ``max_num_batched_tokens`` 2048/8192 (>= 70 GiB: 8192/16384; >= 160 GiB:
    16384), ``max_num_seqs`` 256 (>= 70 GiB: 1024). ``block_size`` defaults to
    16; hybrid (Mamba) models get larger attention pages in vLLM, so pass
    ``--block-size`` for them. Returns ``(config, notes)``, notes saying what
    was assumed or ignored. Raises ``ValueError`` for missing/invalid fields.
    """
    args, ignored = parse_engine_args(engine_args)
    raw = _load_model_config(model_config)
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), Mapping) else raw
    notes: list[str] = []
    if ignored:
        notes.append("ignored engine args (no effect on the workspace): " + ", ".join(ignored))
    if "num_attention_heads" not in cfg:
        raise ValueError("model config has no num_attention_heads")
    hq = int(cfg["num_attention_heads"])
    hk = int(cfg.get("num_key_value_heads") or hq)
    if cfg.get("head_dim"):
        d = int(cfg["head_dim"])
    elif cfg.get("hidden_size"):
        d = int(cfg["hidden_size"]) // hq
        notes.append(f"head_dim = hidden_size // num_attention_heads = {d}")
    else:
        raise ValueError("model config has neither head_dim nor hidden_size")
    layers = _count_attention_layers(cfg) or int(cfg.get("num_hidden_layers", 1))
    cfg_dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    want = str(args.pop("dtype", "auto"))
    if want == "auto":
        if str(cfg_dtype) in ("float32", "torch.float32"):
            dtype = torch.bfloat16
            notes.append("--dtype auto: the fp32 checkpoint is served in bfloat16")
        else:
            dtype = parse_dtype(str(cfg_dtype))
    else:
        dtype = parse_dtype(want)
    args.pop("model", None)
    mbt, seqs, why = vllm_default_limits(usage, gpu_memory_gib)
    if "max_num_seqs" not in args:
        args["max_num_seqs"] = seqs
        notes.append(f"max_num_seqs not given: vLLM default {seqs} ({why})")
    if "max_model_len" not in args:
        mpe = cfg.get("max_position_embeddings")
        if not mpe:
            raise ValueError("no --max-model-len and no max_position_embeddings in the model config")
        args["max_model_len"] = int(mpe)
        notes.append(f"max_model_len not given: max_position_embeddings = {mpe}")
    if "max_num_batched_tokens" not in args:
        chunked = args.get("enable_chunked_prefill", True)
        args["max_num_batched_tokens"] = max(mbt, args["max_num_seqs"]) if chunked else max(args["max_model_len"], args["max_num_seqs"])
        notes.append(f"max_num_batched_tokens not given: vLLM default {args['max_num_batched_tokens']} "
                     f"({why if chunked else 'chunked prefill off: max(max_model_len, max_num_seqs)'})")
    if "block_size" not in args and _count_attention_layers(cfg) is not None:
        notes.append("hybrid model: vLLM enlarges the attention block size to match the Mamba page; pass --block-size")
    config = EngineConfig(
        num_attention_heads=hq,
        num_key_value_heads=hk,
        head_dim=d,
        num_hidden_layers=layers,
        dtype=dtype,
        **args,
    )
    return config, notes
