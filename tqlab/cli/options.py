"""What every ``tqlab`` command shares: the option types (:class:`HumanInt`, :class:`GpuName`), the request and
override options, building the :class:`~tqlab.core.config.EngineConfig` from them, the prediction, the config
line and the ``--json`` output."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from tqlab.core.config import CUDAGRAPH_MODES, KV_CACHE_DTYPES, EngineConfig, field_help, load_preset

MiB = 1 << 20
_SKIP = {"preset", "mla", "indexer", "moe"}  # the model-field groups come from config.json (inspect-vllm)


class HumanInt(click.ParamType):
    """A click type for every size and count flag: vLLM's ``human_readable_int`` (``8k`` = 8,000,
    ``8K`` = 8,192, ``25.6k`` = 25,600; ``vllm/utils/argparse_utils.py``), the one parser
    ``--args`` uses too (:func:`tqlab.vllm.flags.human_readable_int`); ``minimum``: the smallest value allowed."""

    name = "integer"

    def __init__(self, minimum: int | None = None) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            import argparse

            from tqlab.vllm.flags import human_readable_int  # lazy: `tqlab --help` must not pay for torch

            try:
                n = human_readable_int(str(value))
            except (ValueError, argparse.ArgumentTypeError) as e:
                why = str(e) if isinstance(e, argparse.ArgumentTypeError) else "not an integer"
                self.fail(f"{value!r}: {why} (sizes as vLLM writes them: 8k = 8000, 8K = 8192)", param, ctx)
        if self.minimum is not None and n < self.minimum:
            self.fail(f"{value!r} is below the minimum of {self.minimum}", param, ctx)
        return n


class GpuName(click.ParamType):
    """A click type for ``--gpu``: a GPU target of :data:`tqlab.core.hardware.GPUS` (case-insensitive), returned
    as its canonical name; anything else fails with one line listing the known ones."""

    name = "gpu"

    def convert(self, value, param, ctx):
        from tqlab.core.hardware import GPUS, gpu_target

        try:
            return gpu_target(value).name
        except ValueError:
            self.fail(f"{value!r} is not a known GPU; known: {', '.join(GPUS)}", param, ctx)


GPU_HELP = ("GPU target vLLM would run on (SM count, compute capability, default batch limits): "
            "H100, H200, B200, A4000, ... (default H200; case-insensitive)")


def request_options(*, several: bool = False):
    """The request options every entry point takes (``repro``, ``plan``, ``inspect-vllm``), one decorator.

    ``--prompt-tokens N`` (``inspect-vllm``: repeatable, alias ``--tokens``) and ``--max-tokens N``
    (default 1: the prompt's prefill and its one output token; vLLM serves ``prompt + max_tokens <=
    max_model_len``), both :class:`HumanInt`.
    """
    def deco(f):
        names = ("--prompt-tokens", "--tokens") if several else ("--prompt-tokens",)
        hlp = ("prompt length to check (repeatable; default max_model_len - 1)" if several
               else "prompt length in tokens (repro: default the preset's, e.g. 8192; plan: also predict this prompt)")
        mt_help = "tokens to generate (vLLM caps it at max_model_len - prompt)"
        if several:  # inspect-vllm: each later decode step makes the same split-KV call as the first
            mt_help += "; the decode call does not grow with length, so the verdict depends on the prompt alone"
        f = click.option("--max-tokens", type=HumanInt(1), default=1, show_default=True, help=mt_help)(f)
        return click.option(*names, "prompt_tokens", type=HumanInt(1), multiple=several,
                            default=() if several else None, help=hlp)(f)
    return deco


def request_max_tokens(config: EngineConfig, prompt_tokens: int, max_tokens: int) -> tuple[int, str | None]:
    """vLLM 0.33's length rules for one request -> ``(max_tokens served, note or None)``; the one check
    ``repro`` and ``plan`` make (``inspect-vllm``'s report rejects the same prompts).

    A generation prompt of ``max_model_len`` tokens or more is refused (``vllm/v1/engine/input_processor.py``
    ``InputProcessor._validate_model_input``: no room for the first output token): ``click.UsageError``;
    ``max_tokens`` is capped at ``max_model_len - prompt_tokens`` (``vllm/entrypoints/serve/utils/api_utils.py``
    ``get_max_tokens``; the engine stops a request at ``max_model_len`` too), with a note.
    """
    room = config.max_model_len - prompt_tokens
    if room < 1:
        raise click.UsageError(
            f"--prompt-tokens {prompt_tokens}: vLLM refuses a prompt of max_model_len ({config.max_model_len}) tokens "
            "or more (no room for the first output token; InputProcessor._validate_model_input)")
    if max_tokens <= room:
        return max_tokens, None
    return room, (f"--max-tokens {max_tokens} capped at max_model_len - prompt = {room}, as vLLM's get_max_tokens does")


def _console():
    from rich.console import Console  # lazy: `tqlab --help` must not pay for rich/torch

    return Console(highlight=False, soft_wrap=True)


def _override_options(f):
    """Decorate a command with one ``--field-name`` option per EngineConfig field; help = the field's meaning and unit."""
    for fld in reversed(dataclasses.fields(EngineConfig)):
        if fld.name in _SKIP:
            continue
        flag = "--" + fld.name.replace("_", "-")
        hlp = field_help(fld.name)
        if fld.type in ("bool", bool):
            opt = click.option(f"{flag}/--no-{fld.name.replace('_', '-')}", fld.name, default=None, help=hlp)
        elif fld.name == "kv_cache_dtype":
            opt = click.option(flag, fld.name, type=click.Choice(KV_CACHE_DTYPES), default=None, help=hlp)
        elif fld.name == "cudagraph_mode":
            opt = click.option(flag, fld.name, type=click.Choice(CUDAGRAPH_MODES, case_sensitive=False), default=None,
                               help=hlp)
        elif fld.name == "gpu":
            opt = click.option(flag, fld.name, type=GpuName(), default=None, help=GPU_HELP)
        elif fld.name in ("attention_backend", "mla_prefill_backend", "architecture"):
            opt = click.option(flag, fld.name, type=str, default=None, help=hlp)
        elif fld.name in ("dtype", "cudagraph_capture_sizes"):
            opt = click.option(flag, fld.name, type=str, default=None,
                               help=hlp + (", comma-separated" if fld.name == "cudagraph_capture_sizes" else ""))
        else:
            opt = click.option(flag, fld.name, type=HumanInt(), default=None, help=hlp)
        f = opt(f)
    return f


def _build_config(preset: str | None, overrides: dict[str, Any]) -> EngineConfig:
    ov = {k: v for k, v in overrides.items() if v is not None}
    if "cudagraph_capture_sizes" in ov:
        try:
            ov["cudagraph_capture_sizes"] = tuple(int(s) for s in ov["cudagraph_capture_sizes"].split(","))
        except ValueError:
            raise click.BadParameter(f"not a comma-separated list of ints: {ov['cudagraph_capture_sizes']!r}",
                                     param_hint="--cudagraph-capture-sizes") from None
    given = dict(ov)  # the flags the user gave (error messages name them as flags)
    if ov.get("enable_prefix_caching") is False:  # vLLM: mamba_cache_mode "none" then, no block-aligned split
        ov.setdefault("mamba_block_aligned_split", False)
    try:
        if preset:
            return EngineConfig.from_preset(preset, **ov)
        missing = [n for n in ("num_attention_heads", "num_key_value_heads", "head_dim") if n not in ov]
        if missing:
            raise click.UsageError(
                "give --preset NAME or all of --num-attention-heads, --num-key-value-heads, --head-dim "
                f"(missing: {', '.join('--' + m.replace('_', '-') for m in missing)})"
            )
        return EngineConfig(**ov)
    except (ValueError, TypeError) as e:
        raise click.UsageError(_name_flags(str(e), given)) from None


def _name_flags(message: str, given: dict[str, Any]) -> str:
    """``message`` with every EngineConfig field that came from a flag named as that flag
    (``max_model_len must be >= 1`` -> ``--max-model-len must be >= 1``); preset fields keep their names."""
    import re

    for name in sorted(given, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}(?!\w)", "--" + name.replace("_", "-"), message)
    return message


def _sources(preset: str | None, overrides: dict[str, Any]) -> dict[str, str]:
    """Where each input came from: ``flag``, ``preset NAME`` or ``tqlab default``."""
    given = {k for k, v in overrides.items() if v is not None}
    from_preset = set(load_preset(preset)["config"]) if preset else set()
    out = {}
    for fld in dataclasses.fields(EngineConfig):
        if fld.name in _SKIP:
            continue
        out[fld.name] = "flag" if fld.name in given else (f"preset {preset}" if fld.name in from_preset else "tqlab default")
    return out


def _predict(config: EngineConfig, **kw):
    from tqlab.predict.analysis import predict

    try:
        return predict(config, **kw)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _config_line(c: EngineConfig) -> str:
    return (
        f"{c.preset or 'custom'}: per rank Hq={c.num_heads_per_rank} Hk={c.num_kv_heads_per_rank} D={c.head_dim} "
        f"layers={c.num_hidden_layers} (TP {c.tensor_parallel_size}), max_model_len={c.max_model_len}, "
        f"max_num_seqs={c.max_num_seqs}, max_num_batched_tokens={c.max_num_batched_tokens}, "
        f"chunked_prefill={c.enable_chunked_prefill}, block_size={c.block_size}, "
        f"dtype={str(c.dtype).removeprefix('torch.')}, kv_cache_dtype={c.kv_cache_dtype}, "
        f"enforce_eager={c.enforce_eager}, cudagraph_mode={c.cudagraph_mode or 'default'}, "
        f"num_speculative_tokens={c.num_speculative_tokens}, gpu={c.gpu}"
    )




def _check_json_path(json_path: str | None) -> None:
    """Refuse a ``--json FILE`` in a missing folder before any work (``-`` is standard output)."""
    from pathlib import Path

    if json_path is None or json_path == "-":
        return
    parent = Path(json_path).resolve().parent
    if not parent.is_dir():
        raise click.BadParameter(f"{json_path}: folder {parent} does not exist", param_hint="--json")
    if Path(json_path).is_dir():
        raise click.BadParameter(f"{json_path} is a folder; give a file name", param_hint="--json")


def _write_json(obj: dict, json_path: str) -> None:
    text = json.dumps(obj, indent=2)
    if json_path == "-":
        click.echo(text)
        return
    try:
        with open(json_path, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        raise click.UsageError(f"cannot write --json {json_path!r}: {e.strerror}") from None


