"""``tqlab`` command line: ``repro``, ``plan``, ``presets``, ``inspect-vllm``, ``trace-report`` (and ``python -m tqlab``).

Every :class:`~tqlab.core.config.EngineConfig` field is an override flag
(``--max-num-seqs 2``, ``--kv-cache-dtype auto``, ``--no-enable-chunked-prefill``),
as vLLM's CLI takes every engine argument, so any reported deployment can be
replayed without writing a preset.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from tqlab.core.config import CUDAGRAPH_MODES, KV_CACHE_DTYPES, EngineConfig, field_help, list_presets, load_preset

MiB = 1 << 20
_SKIP = {"preset", "mla", "indexer", "moe"}  # the model-field groups come from config.json (inspect-vllm)
_CPU_BYTES_LIMIT = 4 << 30  # a CPU run that would build more than this goes to meta
_CPU_SECONDS_LIMIT = 30.0
_CPU_FLOPS = 1e11  # assumed float32 throughput of one shared CPU core set (FLOP/s), for the estimate only
# Fixed cost of one layer in one CPU engine step (dispatch, not arithmetic), for the estimate only: the bug report's
# deployment (8 layers) took 198 s for 1 prompt token + 8191 decode steps on the 2-core box (issue 22) = 3.0 ms.
_CPU_LAYER_STEP_SECONDS = 3.0e-3


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
        elif fld.name in ("attention_backend", "mla_prefill_backend"):
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def app() -> None:
    """tqlab: vLLM's workspace, the TurboQuant locked-workspace crash, and its fix."""


@app.command()
def presets() -> None:
    """List the presets in data/presets/ with their sources."""
    from rich.table import Table

    names = list_presets()
    t = Table(show_lines=True)
    t.add_column("preset", no_wrap=True, min_width=max(map(len, names), default=6))  # a name is copied whole
    t.add_column("title")
    t.add_column("source of its numbers")
    for name in names:
        data = load_preset(name)
        t.add_row(name, data["title"], data["source"])
    _console().print(t)


def cpu_run_estimate(config: EngineConfig, prompt_tokens: int, fix: bool, max_tokens: int = 1) -> tuple[int, float]:
    """Rough ``(bytes, seconds)`` a CPU ``repro`` would build and take: KV cache + weights + workspace; matmuls +
    attention of the prefill, the profile run, capture and every decode step, plus a fixed cost per layer and step."""
    from tqlab.attention import kv_cache_bytes_per_token
    from tqlab.core.vllm_rules import decode_capture_sizes, decode_rows
    from tqlab.predict.analysis import locked_bytes

    hidden = config.num_heads_per_rank * config.head_dim
    layers = config.num_hidden_layers + (1 if config.num_speculative_tokens else 0)
    kv = kv_cache_bytes_per_token(config) * (prompt_tokens + max_tokens + 1)
    weights = layers * 4 * hidden * hidden * 4
    ws = max(locked_bytes(config.replace(lock_workspace_when_eager=True), fix=fix) or 0, _consumers_peak_bytes(config))
    ws *= config.num_ubatches
    rows = sum(decode_rows(config, s) * config.uniform_decode_query_len for s in decode_capture_sizes(config))
    decodes = max_tokens - 1  # the prefill's last step samples the first token
    tokens = prompt_tokens + min(config.max_num_batched_tokens, config.max_model_len) + 2 * rows + decodes
    attention = prompt_tokens ** 2 + decodes * (prompt_tokens + max_tokens / 2)  # query x key pairs
    flops = layers * tokens * hidden * hidden * 8 + layers * attention * hidden * 2
    return kv + weights + ws, flops / _CPU_FLOPS + _steps(config, prompt_tokens, max_tokens) * layers * _CPU_LAYER_STEP_SECONDS


def _consumers_peak_bytes(config: EngineConfig) -> int:
    """The largest request of any active consumer, before the lock or at serve time (bytes): what the engine's
    stand-ins (``tqlab.engine.consumer_standins``) make a CPU run allocate, e.g. 512 MiB of fused-MoE scratch."""
    from tqlab.core.consumers.base import StartUp
    from tqlab.core.consumers.registry import consumer_table

    rows = consumer_table(config, StartUp()).rows
    return max((max(r.reserved_bytes, r.max_runtime_bytes) for r in rows), default=0)


def _steps(config: EngineConfig, prompt_tokens: int, max_tokens: int) -> int:
    """Engine steps of one request: prefill chunks, then one per further output token."""
    return -(-prompt_tokens // max(1, config.chunk_budget)) + max_tokens - 1


def _pick_device(device: str, config: EngineConfig, prompt_tokens: int, max_tokens: int, fix: bool, console) -> str:
    if device != "auto":
        return device
    nbytes, seconds = cpu_run_estimate(config, prompt_tokens, fix, max_tokens)
    if nbytes > _CPU_BYTES_LIMIT or seconds > _CPU_SECONDS_LIMIT:
        console.print(f"[yellow]device[/] meta (shapes only): a CPU run would build about {nbytes / 2**30:.1f} GiB and "
                      f"take about {seconds:.0f} s ({_steps(config, prompt_tokens, max_tokens)} engine steps); "
                      "--device cpu forces it")
        return "meta"
    return "cpu"


def _describe(pred) -> str:
    from tqlab.core.workspace import format_mb

    if pred.verdict == "never_locked":
        return "completes: the workspace is never locked (vLLM 0.33 locks only at the end of CUDA graph capture)"
    # vLLM's own message, quoted: its "MB" is 2**20 bytes (MiB, the unit of tqlab's other lines)
    what = (f"locked-workspace assertion: {pred.first_refused_call['caller']} requires "
            f"{format_mb(pred.first_refused_call['required_bytes'])} MB, current size is "
            f"{format_mb(pred.first_refused_call['current_bytes'])} MB") if pred.verdict == "crash" else "completes"
    first = pred.first_failing_prompt_tokens
    return what + (f" (shortest failing prompt: {first} tokens)" if first is not None
                   else " (no prompt up to max_model_len fails in prefill)")


@app.command()
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@request_options()
@click.option("--fix/--no-fix", default=False, show_default=True,
              help="reserve the worst case before capture (vLLM PR #44053)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "meta"]), default="auto", show_default=True,
              help="auto: cpu, or meta (shapes only) when a CPU run would exceed ~4 GiB or ~30 s")
@_override_options
def repro(preset, prompt_tokens, max_tokens, fix, device, **overrides) -> None:
    """Walk the engine lifecycle and send one prompt; check the run against tqlab.predict.analysis.predict.

    Exit status 0 when the run behaves as predicted (crash, completes, or never locked), 1 otherwise.
    """
    from tqlab.engine import LLMEngine
    from tqlab.core.workspace import format_mb

    console = _console()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter("no CUDA device is available here; use cpu, meta (shapes only) or auto",
                                     param_hint="--device")
    config = _build_config(preset, overrides)
    if prompt_tokens is None:
        prompt_tokens = load_preset(preset).get("default_prompt_tokens", 8192) if preset else 8192
    max_tokens, capped = request_max_tokens(config, prompt_tokens, max_tokens)
    console.print(f"[bold]config[/] {_config_line(config)}")
    if capped:
        console.print(f"[yellow]note[/] {capped}")
    pred = _predict(config, prompt_tokens=prompt_tokens, max_tokens=max_tokens, fix=fix)
    console.print(f"[bold]prediction[/] prompt of {prompt_tokens} tokens, fix={'on' if fix else 'off'}: {_describe(pred)}")
    device = _pick_device(device, config, prompt_tokens, max_tokens, fix, console)

    def show(p) -> None:
        sizes = ", ".join(f"{format_mb(b)} MiB" for b in p.workspace_bytes)
        console.print(f"  {p.name:<15} workspace [{sizes}]  {p.seconds * 1000:8.1f} ms  {p.note}")

    console.print(f"[bold]lifecycle[/] on {device}")
    try:
        # The KV cache holds the one request (a bigger default would only cost memory and time).
        engine = LLMEngine(config, fix=fix, device=device, on_phase=show,
                           kv_cache_tokens=prompt_tokens + max_tokens)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except (MemoryError, RuntimeError) as e:  # e.g. the reservation does not fit in this machine's memory
        try_ = "" if device == "meta" else "; try --device meta (shapes only) or a smaller --max-model-len"
        console.print(f"[red]start-up failed:[/] {_failure_text(e)}{try_}")
        sys.exit(1)
    ok = _serve_one(engine, prompt_tokens, max_tokens, console) == (pred.verdict == "crash")
    ok = ok and engine.locked_bytes == pred.locked_bytes
    console.print(f"[bold]{'as predicted' if ok else 'NOT as predicted'}[/]")
    sys.exit(0 if ok else 1)


def _allocation_bytes(e: BaseException) -> int | None:
    """Bytes an allocator failed to give (0 when it did not say), or None if ``e`` is no allocation failure.

    Recognises ``MemoryError``, ``torch.OutOfMemoryError`` and the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory: you tried to
    allocate N bytes").
    """
    import re

    text = str(e)
    oom = isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text
    if not oom and "out of memory" not in text.lower():
        return None
    m = re.search(r"allocate (\d+) bytes", text) or re.search(r"to (\d+) bytes", text)
    if m:
        return int(m.group(1))
    m = re.search(r"[Tt]ried to allocate ([\d.]+) (KiB|MiB|GiB|TiB)", text)
    return int(float(m.group(1)) * 1024 ** ("KMGT".index(m.group(2)[0]) + 1)) if m else 0


def _failure_text(e: BaseException) -> str:
    """One line for a failure: 'out of memory: could not allocate 3.73 GiB (RuntimeError: ...)' or 'Type: message'."""
    text = " ".join(str(e).split()) or "out of memory"
    nbytes = _allocation_bytes(e)
    if nbytes is None:
        return f"{type(e).__name__}: {text}"
    if "DefaultCPUAllocator" in text:  # drop the "[enforce fail at alloc_cpu.cpp:127] err == 0." prefix
        text = text[text.index("DefaultCPUAllocator"):]
    how_much = f"could not allocate {nbytes / 2**30:.2f} GiB" if nbytes else "an allocation failed"
    return f"out of memory: {how_much} ({type(e).__name__}: {text})"


def _serve_one(engine, prompt_tokens: int, max_tokens: int, console) -> bool:
    """Send the one request and step until done; print the outcome. Returns whether it crashed."""
    from tqlab.engine import EngineDeadError
    from tqlab.core.workspace import format_mb

    console.print(f"[bold]request[/] {prompt_tokens}-token prompt, max_tokens={max_tokens}")
    try:
        engine.add_request(prompt_tokens, max_tokens=max_tokens)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        while engine.has_unfinished_requests():
            try:
                engine.step()
            except (MemoryError, RuntimeError) as e:
                if _allocation_bytes(e) is None:
                    raise
                console.print(f"[red]serving failed:[/] the {prompt_tokens}-token request on {engine.device.type}: "
                              f"{_failure_text(e)}; try --device meta (shapes only), a shorter --prompt-tokens or "
                              "a smaller --max-num-batched-tokens (smaller prefill chunks)")
                sys.exit(1)
    except AssertionError as e:
        console.print(f"[red]AssertionError:[/] {e}")
        try:
            engine.generate(16)
        except EngineDeadError as dead:
            console.print(f"[red]next request:[/] EngineDeadError: {dead}")
        return True
    out = engine.outputs[max(engine.outputs)]
    console.print(
        f"[green]completed[/] request {out.request_id}: {len(out.output_token_ids)} token(s) generated; "
        f"workspace {format_mb(engine.workspace.size_bytes())} MiB (locked: {engine.workspace.is_locked()}); "
        f"paths used: {engine.backend.path_counts}"
    )
    return False


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


@app.command()
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@request_options()
@click.option("--json", "json_path", type=str, default=None,
              help="write the prediction as JSON to FILE ('-': stdout, which then holds only the JSON)")
@_override_options
def plan(preset, prompt_tokens, max_tokens, json_path, **overrides) -> None:
    """The fix's reservation per consumer per rank, its share of the KV cache, and the unfixed limit."""
    _check_json_path(json_path)
    config = _build_config(preset, overrides)
    capped = None
    if prompt_tokens is not None:
        max_tokens, capped = request_max_tokens(config, prompt_tokens, max_tokens)
    pred = _predict(config, prompt_tokens=prompt_tokens, max_tokens=max_tokens, sources=_sources(preset, overrides))
    try:
        lines = _plan_lines(config, pred)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if json_path is not None:
        # The top level always describes the deployment (as inspect-vllm's does); a --prompt-tokens
        # prediction goes under "prompt".
        obj = pred.to_json() if prompt_tokens is None else _predict(config, sources=pred.sources).to_json()
        if prompt_tokens is not None:
            obj["prompt"] = {k: v for k, v in pred.to_json().items() if k != "sources"}
        _write_json(obj, json_path)
        if json_path == "-":
            return
    console = _console()
    for line in lines + ([f"[yellow]note[/] {capped}"] if capped else []):
        console.print(line)


def _plan_lines(config: EngineConfig, pred) -> list:
    """What ``tqlab plan`` prints: config, the reservation table, the KV share and the verdict without the fix."""
    from rich.table import Table

    from tqlab.attention import kv_cache_bytes_per_token
    from tqlab.core.reservation import plan_bytes, reservation_plan
    from tqlab.core.workspace import compute_layout, format_mb

    calls = reservation_plan(config)
    names = ["split-KV decode scratch (max_num_seqs rows)", "continuation-prefill dequant buffers (max_model_len - 1 cached)"]
    t = Table("consumer", "views (shape dtype)", "bytes", "MiB")
    for name, call in zip(names, calls):
        views = "\n".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in call)
        b = compute_layout(call).total_bytes
        t.add_row(name, views, f"{b:,}", f"{b / MiB:.2f}")
    reserved, slots = plan_bytes(calls), config.num_ubatches
    # Denominator: a KV cache that holds max_num_seqs requests of max_model_len tokens on this rank.
    kv = kv_cache_bytes_per_token(config) * config.max_model_len * config.max_num_seqs
    out = [f"[bold]config[/] {_config_line(config)}", t,
           f"workspace per rank after the reservation: {reserved:,} bytes = {reserved / MiB:.2f} MiB per ubatch slot "
           f"x {slots} slot(s) (one buffer serves the largest call)",
           f"KV cache that would hold max_num_seqs x max_model_len tokens on this rank ({config.kv_cache_dtype}, "
           f"{kv_cache_bytes_per_token(config)} B/token over {config.num_hidden_layers} layers): {kv / MiB:,.1f} MiB; "
           f"workspace share: {100 * reserved * slots / kv:.3f}%",
           f"capture sizes ({pred.cudagraph_mode}): {list(pred.capture_sizes)}; decode rows at the lock: "
           f"{pred.decode_rows_at_lock}"]
    if config.has_turboquant_consumers:
        from tqlab.core.reservation import kv_splits_advice

        adv = kv_splits_advice(config)
        fills = (f"already fills the {adv.gpu}'s {adv.sm_count} SMs for a 1-row batch"
                 if adv.filling_splits == adv.configured_splits else
                 f"S = {adv.filling_splits} would fill the {adv.gpu}'s {adv.sm_count} SMs for a 1-row batch and "
                 f"reserve {adv.filling_bytes:,} bytes at max_num_seqs rows ({adv.flag}; a graph replays the S it "
                 "was captured with)")
        out.append(f"split-KV decode: S = {adv.configured_splits} ({adv.configured_bytes:,} bytes of decode scratch at "
                   f"max_num_seqs rows); {fills}")
    from tqlab.predict.consumer_text import consumer_lines, verdict_line

    out += consumer_lines(pred)
    if pred.locked_bytes is None:
        out.append("without the fix: the workspace is never locked (vLLM 0.33 locks only at the end of CUDA graph "
                   "capture), so no prompt hits the locked-workspace assertion")
        return out + [verdict_line(pred)]
    bad = pred.first_failing_prompt_tokens
    survives = ("every prompt crashes: another consumer overflows the lock (see the verdict)" if bad == 1 else
                f"longest prompt that survives: {bad - 1} tokens (a {bad}-token prompt crashes)" if bad is not None
                else "every prompt up to max_model_len survives its prefill")
    out.append(
        f"without the fix the workspace locks at {pred.locked_bytes:,} bytes ({format_mb(pred.locked_bytes)} MiB): "
        + survives + f"; verdict: {pred.verdict}" + (" (PARTIAL: unmodelled consumers)" if pred.partial else "")
    )
    return out + [verdict_line(pred)]


@app.command("inspect-vllm")
@click.option("--args", "engine_args", type=str, default=None,
              help='the `vllm serve ...` command line, e.g. "vllm serve M --tensor-parallel-size 8 --max-model-len 131072"')
@click.option("--config", "model_config", type=click.Path(exists=True), default=None,
              help="the model's config.json (or its folder)")
@click.option("--preset", type=str, default=None, help="a tqlab preset instead of --config")
@request_options(several=True)
@click.option("--locked-bytes", type=HumanInt(0), default=None,
              help="workspace size measured at lock without the fix (bytes)")
@click.option("--gpu", type=GpuName(), default="H200", show_default=True, help=GPU_HELP)
@click.option("--gpu-memory-gib", type=float, default=None,
              help="GPU memory in GiB, for vLLM's default batch limits (wins over --gpu's)")
@click.option("--demo", is_flag=True, help="also run the crashing chunk through vLLM's own classes on CPU (needs vLLM)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="also write the report as JSON ('-': standard output, then only the JSON)")
def inspect_vllm_cmd(engine_args, model_config, preset, prompt_tokens, max_tokens, locked_bytes, gpu, gpu_memory_gib,
                     demo, json_path) -> None:
    """Predict, per workspace consumer, whether a vLLM deployment hits the locked-workspace crash.

    Reads engine args + the model's config.json; prints the workspace each
    prompt needs, whether it overflows the locked size with and without the
    fix, and the safe max_model_len. vLLM itself is only needed for --demo.
    "--json -" writes the report to standard output, and nothing else. Bad
    input (a flag vLLM 0.33 does not know, a bad value, a bad config.json
    field, --gpu-memory-gib that is not a finite number > 0, a --json path in
    a missing folder) is a one-line usage error (exit 2).
    """
    import math

    from tqlab.predict.report import inspect_vllm

    if (model_config is None) == (preset is None):
        raise click.UsageError("give the model as --config FILE (its config.json, or its folder) or --preset NAME "
                               "(`tqlab presets`), not " + ("both" if preset else "neither"))

    if gpu_memory_gib is not None and not (math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0):
        raise click.BadParameter(f"must be a finite number of GiB > 0, got {gpu_memory_gib}", param_hint="--gpu-memory-gib")
    to_stdout = json_path == "-"
    _check_json_path(json_path)
    try:
        report = inspect_vllm(engine_args, model_config, preset=preset, prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens, locked_bytes=locked_bytes, gpu=gpu,
                              gpu_memory_gib=gpu_memory_gib, demo=demo, quiet=True)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except OSError as e:
        raise click.UsageError(f"{e.filename or json_path}: {e.strerror}") from None
    text = json.dumps(report, indent=2, default=str)
    if to_stdout:  # --json -: standard output holds only the JSON
        click.echo(text)
        return
    if json_path is not None:
        try:
            with open(json_path, "w") as f:
                f.write(text)
        except OSError as e:
            raise click.UsageError(f"cannot write the JSON report to {json_path!r}: {e.strerror}") from None
    click.echo(report["text"])


@app.command("trace-report")
@click.argument("trace_dir", type=click.Path(file_okay=False))
@click.option("--config", "model_config", type=click.Path(exists=True), default=None,
              help="the model's config.json (or its folder), to compare with the prediction")
@click.option("--preset", type=str, default=None, help="a tqlab preset instead of --config")
@click.option("--args", "engine_args", type=str, default=None, help='the `vllm serve ...` command line of the deployment')
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="also write the merged report as JSON ('-': standard output, then only the JSON)")
def trace_report_cmd(trace_dir, model_config, preset, engine_args, json_path) -> None:
    """Merge the vLLM plugin's per-process records in TRACE_DIR; hold them against the prediction.

    Run vLLM with TQLAB_VLLM_TRACE=TRACE_DIR (tqlab installed in vLLM's environment):
    each process that creates a workspace manager writes TRACE_DIR/<host>-<pid>.json.
    Prints one row per rank (lock size per slot, largest request per consumer,
    refusals), whether the ranks agree and, with --config/--preset and --args,
    each disagreement with inspect-vllm's prediction, else "as predicted". A
    truncated or foreign JSON file is skipped with a one-line warning.
    """
    from tqlab.predict.trace_report import render, trace_report

    try:
        report = trace_report(trace_dir, engine_args, model_config, preset=preset)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if json_path is not None:
        _write_json(report, json_path)
        if json_path == "-":
            return
    console = _console()
    for line in render(report):
        console.print(line)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
