"""What every ``tqlab`` command shares: the option types (:class:`HumanInt`, :class:`GpuName`), the request and
override options, building the :class:`~tqlab.core.config.EngineConfig` from them, the prediction, the config
line and the ``--json`` output."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from tqlab.core import vllm_versions
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


DEFAULT_MAX_TOKENS = 16
"""``--max-tokens``' default: vLLM 0.33's own default output length for a request that does not say,
``SamplingParams.max_tokens = 16`` (``vllm/sampling_params.py``; the ``LLM`` class and ``/v1/completions``,
``vllm/entrypoints/openai/completion/protocol.py`` ``max_tokens: int | None = 16``). ``/v1/chat/completions``
defaults to ``None``, which ``get_max_tokens`` (``vllm/entrypoints/serve/utils/api_utils.py``) turns into
``max_model_len - prompt``: longer, but every decode step after the first makes the same workspace call, so
16 asks the same question. Either way the first decode step is asked; ``--max-tokens 1`` asks the prefill alone
(vLLM samples the first token in the prefill's last step and stops there: ``vllm/v1/core/sched/utils.py``
``check_stop``)."""


def request_options(*, several: bool = False):
    """The request options every entry point takes (``repro``, ``plan``, ``inspect-vllm``), one decorator.

    ``--prompt-tokens N`` (``inspect-vllm``: repeatable, alias ``--tokens``) and ``--max-tokens N``
    (default :data:`DEFAULT_MAX_TOKENS` = 16, vLLM's: the prefill, its output token and the decode steps after it;
    vLLM serves ``prompt + max_tokens <= max_model_len``), both :class:`HumanInt`.
    """
    def deco(f):
        names = ("--prompt-tokens", "--tokens") if several else ("--prompt-tokens",)
        hlp = ("prompt length to check (repeatable; default max_model_len - 1)" if several
               else "prompt length in tokens (repro: default the preset's, e.g. 8192; plan: also predict this prompt)")
        mt_help = ("tokens to generate; default 16, vLLM's SamplingParams default (so the first decode step is "
                   "asked); 1 = the prefill alone; capped at max_model_len - prompt as vLLM caps it")
        if several:  # inspect-vllm: each later decode step makes the same split-KV call as the first
            mt_help += "; every decode step makes the same call, so any value >= 2 gives the same verdict"
        f = click.option("--max-tokens", type=HumanInt(1), default=DEFAULT_MAX_TOKENS, show_default=True,
                         help=mt_help)(f)
        return click.option(*names, "prompt_tokens", type=HumanInt(1), multiple=several,
                            default=() if several else None, help=hlp)(f)
    return deco


EXIT_CODES = {"ok": 0, "never_locked": 0, "crash": 3, "partial": 4, "refused": 5}
"""Exit status of ``plan`` and ``inspect-vllm`` by the deployment's verdict (the JSON's top-level ``verdict``):
0 ok or never locked (the locked-workspace assertion cannot fire), 3 crash, 4 partial (a consumer the
deployment reaches is not sized: tqlab does not know), 5 refused (vLLM will not start the deployment).
A usage error is 2 (click's). ``repro`` keeps its own rule (0 when the run did what the predictor said)."""

EXIT_HELP = ("Exit status by the deployment's verdict: 0 ok or never locked, 3 crash, 4 partial (a consumer it "
             "reaches is not sized), 5 refused (vLLM will not start it), 2 bad usage.")


def verdict_exit_code(report: dict[str, Any]) -> int:
    """The exit status for a ``--json`` report (:data:`EXIT_CODES`): its ``verdict``, read as ``partial`` when it
    says ``ok`` but ``partial`` is true (an ok over the modelled consumers only is no ok). A verdict outside the
    five (a newer predictor's) exits 4, as partial: an answer this CLI cannot read is never an ok."""
    verdict = report.get("verdict")
    if verdict == "ok" and report.get("partial"):
        verdict = "partial"
    return EXIT_CODES.get(verdict, EXIT_CODES["partial"])


def exit_by_verdict(report: dict[str, Any]) -> None:
    """End the command with :func:`verdict_exit_code` of ``report`` (returns normally for 0)."""
    code = verdict_exit_code(report)
    if code:
        raise click.exceptions.Exit(code)


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


def ways_out_report(config: EngineConfig, *, crashed: bool, locked_bytes: int | None = None,
                    max_tokens: int = DEFAULT_MAX_TOKENS) -> tuple[list[dict[str, Any]], list[str]]:
    """``(--json's "ways_out" list, text lines)``: :func:`tqlab.predict.ways_out.ways_out` of the deployment, each
    way checked by the predictor; ``crashed``: the deployment's verdict is a crash (then "none" is said too)."""
    from tqlab.predict.ways_out import way_out_lines, ways_out

    ways = ways_out(config, locked_bytes=locked_bytes, max_tokens=max_tokens)
    return [w.to_json() for w in ways], way_out_lines(ways, crashed=crashed)


def _select_vllm(ctx, param, value):
    """``--vllm``'s callback: choose the run's release once, before any other option is read (the flag table,
    the rules and the data all follow it); no ``--vllm`` goes back to ``$TQLAB_VLLM_VERSION`` / the default."""
    try:
        return vllm_versions.select(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--vllm") from None


def vllm_option(f=None, *, recorded: bool = False):
    """``--vllm 0.33|0.34`` (:func:`tqlab.core.vllm_versions.select`), shared by ``plan``, ``inspect-vllm``, ``repro``
    and ``trace-report``. ``recorded`` (``trace-report``): the value is passed to the command (None when not given:
    the release the records name) instead of being selected for the run."""
    help_ = (f"the vLLM release to model ({', '.join(vllm_versions.SUPPORTED)}; default "
             + ("the release the records ran, " if recorded else "")
             + f"${vllm_versions.ENV}, else {vllm_versions.DEFAULT}, the newest whose start-up rules tqlab models; "
             f"{vllm_versions.NEWEST}'s verdicts are partial)")
    kw = dict(expose_value=True) if recorded else dict(is_eager=True, expose_value=False, callback=_select_vllm)
    deco = click.option("--vllm", "vllm", type=click.Choice(vllm_versions.SUPPORTED), default=None,
                        metavar="VERSION", help=help_, **kw)
    return deco if f is None else deco(f)


def version_line() -> str:
    """The first line of every report: the release modelled (:func:`tqlab.core.vllm_versions.describe`)."""
    return vllm_versions.describe()


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
        elif fld.name == "kv_cache_dtype":  # the choices go in the help text, which wraps (80 columns)
            opt = click.option(flag, fld.name, type=click.Choice(KV_CACHE_DTYPES), default=None, metavar="DTYPE",
                               help=f"{hlp}; one of: {', '.join(KV_CACHE_DTYPES)}")
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


def _server_defaults(preset: str, ov: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(values, sources)`` of the server limits a ``--preset`` deployment takes from vLLM's defaults for ``--gpu``
    (:func:`tqlab.vllm.preset_server.preset_server_limits`); a bad preset file is one usage line."""
    from tqlab.vllm.preset_server import preset_server_limits

    try:
        values, sources, _ = preset_server_limits(preset, ov, gpu=ov.get("gpu"))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    return values, sources


def _build_config(preset: str | None, overrides: dict[str, Any], *, server_defaults: bool = True) -> EngineConfig:
    """The :class:`EngineConfig` of a command's flags, on ``preset`` if given. ``server_defaults``: a preset's
    ``max_num_seqs`` / ``max_num_batched_tokens`` that no flag gives take vLLM's defaults for ``--gpu``
    (``plan``, as ``inspect-vllm``); False keeps the preset's numbers (``repro``, whose runs and notebooks
    rely on them). Raises ``click.UsageError`` (one line) for bad input."""
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
            from tqlab.vllm.deployment import preset_max_len_check

            _check_preset(preset)
            preset_max_len_check(preset, ov.get("max_model_len"))  # as inspect-vllm: vLLM's derived maximum
            extra = _server_defaults(preset, ov)[0] if server_defaults else {}
            return EngineConfig.from_preset(preset, **ov, **extra)
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


def _sources(preset: str | None, overrides: dict[str, Any], *, server_defaults: bool = True) -> dict[str, str]:
    """Where each input came from: ``flag``, ``preset NAME``, vLLM's default for ``--gpu`` (a preset's server
    limits, as :func:`_build_config` sets them) or ``tqlab default``."""
    ov = {k: v for k, v in overrides.items() if v is not None}
    from_preset = set(load_preset(preset)["config"]) if preset else set()
    vllm = _server_defaults(preset, ov)[1] if preset and server_defaults else {}
    out = {}
    for fld in dataclasses.fields(EngineConfig):
        if fld.name in _SKIP:
            continue
        out[fld.name] = ("flag" if fld.name in ov else vllm.get(fld.name) or
                         (f"preset {preset}" if fld.name in from_preset else "tqlab default"))
    return out


def preset_problem(preset: str) -> str | None:
    """Why ``data/presets/<preset>.json`` is not a usable preset (one line naming the file), or None. An unknown
    name is not this function's: :func:`tqlab.core.config.load_preset` lists the known ones."""
    from tqlab.core.config import PRESET_DIR

    path = PRESET_DIR / f"{preset}.json"
    restore = f"; restore it, e.g. `git checkout -- data/presets/{preset}.json`"
    try:
        data = load_preset(preset)
    except json.JSONDecodeError as e:
        return f"preset {preset}: {path} is not JSON ({e.msg}, line {e.lineno})" + restore
    except (OSError, UnicodeDecodeError) as e:
        return f"preset {preset}: {path} cannot be read ({e})" + restore
    if not isinstance(data, dict):
        return f"preset {preset}: {path} is not a tqlab preset (a JSON {type(data).__name__}, not an object)" + restore
    missing = [k for k in ("title", "source", "config") if k not in data]
    if missing or not isinstance(data["config"], dict):
        what = f"no {', '.join(missing)}" if missing else "its config is not an object"
        return f"preset {preset}: {path} is not a tqlab preset ({what})" + restore
    return None


def _check_preset(preset: str) -> None:
    """An unknown preset (listing the known ones) or a broken preset file (:func:`preset_problem`) as one usage
    line, before any work."""
    from tqlab.core.config import list_presets

    if preset not in list_presets():
        raise click.UsageError(f"unknown preset {preset!r}; known presets: {', '.join(list_presets())}")
    problem = preset_problem(preset)
    if problem is not None:
        raise click.UsageError(problem)


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


