"""``tqlab`` command line: ``repro``, ``plan``, ``presets``, ``inspect-vllm`` (and ``python -m tqlab``).

Every :class:`~tqlab.config.EngineConfig` field is an override flag
(``--max-num-seqs 2``, ``--kv-cache-dtype auto``, ``--no-enable-chunked-prefill``),
as vLLM's CLI takes every engine argument, so any reported deployment can be
replayed without writing a preset.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .config import KV_CACHE_DTYPES, EngineConfig, list_presets, load_preset
from .workspace import MiB, compute_layout, format_mb

console = Console(highlight=False, soft_wrap=True)

_SKIP = {"preset"}


def _override_options(f):
    """Decorate a command with one ``--field-name`` option per EngineConfig field."""
    for fld in reversed(dataclasses.fields(EngineConfig)):
        if fld.name in _SKIP:
            continue
        flag = "--" + fld.name.replace("_", "-")
        if fld.type in ("bool", bool):
            opt = click.option(f"{flag}/--no-{fld.name.replace('_', '-')}", fld.name, default=None,
                               help=f"EngineConfig.{fld.name}")
        elif fld.name == "kv_cache_dtype":
            opt = click.option(flag, fld.name, type=click.Choice(KV_CACHE_DTYPES), default=None, help="KV-cache format")
        elif fld.name == "dtype":
            opt = click.option(flag, fld.name, type=str, default=None, help="model dtype: bfloat16, float16, float32")
        elif fld.name == "cudagraph_capture_sizes":
            opt = click.option(flag, fld.name, type=str, default=None, help="comma-separated decode batch sizes")
        else:
            opt = click.option(flag, fld.name, type=int, default=None, help=f"EngineConfig.{fld.name}")
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
        raise click.UsageError(str(e)) from None


def _config_line(c: EngineConfig) -> str:
    return (
        f"{c.preset or 'custom'}: per rank Hq={c.num_heads_per_rank} Hk={c.num_kv_heads_per_rank} D={c.head_dim} "
        f"layers={c.num_hidden_layers} (TP {c.tensor_parallel_size}), max_model_len={c.max_model_len}, "
        f"max_num_seqs={c.max_num_seqs}, max_num_batched_tokens={c.max_num_batched_tokens}, "
        f"chunked_prefill={c.enable_chunked_prefill}, block_size={c.block_size}, "
        f"dtype={str(c.dtype).removeprefix('torch.')}, kv_cache_dtype={c.kv_cache_dtype}"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def app() -> None:
    """tqlab: vLLM's workspace, the TurboQuant locked-workspace crash, and its fix."""


@app.command()
def presets() -> None:
    """List the presets in data/presets/ with their sources."""
    t = Table("preset", "title")
    for name in list_presets():
        t.add_row(name, load_preset(name)["title"])
    console.print(t)


def _predicted_locked_bytes(config: EngineConfig, fix: bool) -> int:
    from .reservation import plan_bytes, reservation_plan
    from .analysis import unfixed_locked_bytes

    return max(unfixed_locked_bytes(config), plan_bytes(reservation_plan(config)) if fix else 0)


@app.command()
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="prompt length (default: the preset's, e.g. 8192)")
@click.option("--max-tokens", type=click.IntRange(min=1), default=1, show_default=True, help="tokens to generate")
@click.option("--fix/--no-fix", default=False, show_default=True,
              help="reserve the worst case before capture (vLLM PR #44053)")
@click.option("--device", type=click.Choice(["cpu", "cuda", "meta"]), default="cpu", show_default=True)
@_override_options
def repro(preset, prompt_tokens, max_tokens, fix, device, **overrides) -> None:
    """Walk the engine lifecycle and send one prompt: crash without the fix, success with it.

    Exit status 0 when the run behaves as predicted from the flags
    (``--no-fix``: the locked-workspace assertion if the prompt is long enough;
    ``--fix``: the request completes), 1 otherwise.
    """
    from .engine import EngineDeadError, LLMEngine
    from .analysis import first_failing_prompt

    config = _build_config(preset, overrides)
    if prompt_tokens is None:
        prompt_tokens = load_preset(preset).get("default_prompt_tokens", 8192) if preset else 8192
    if prompt_tokens + max_tokens > config.max_model_len:
        raise click.UsageError(
            f"--prompt-tokens {prompt_tokens} + --max-tokens {max_tokens} = {prompt_tokens + max_tokens} exceeds "
            f"max_model_len {config.max_model_len} (vLLM rejects such a request before it reaches the workspace)"
        )
    console.print(f"[bold]config[/] {_config_line(config)}")
    first_bad = first_failing_prompt(config, _predicted_locked_bytes(config, fix))
    expect_crash = first_bad is not None and first_bad <= prompt_tokens
    console.print(
        f"[bold]prediction[/] prompt of {prompt_tokens} tokens, fix={'on' if fix else 'off'}: "
        + ("locked-workspace assertion" if expect_crash else "completes")
        + (f" (shortest failing prompt: {first_bad} tokens)" if first_bad is not None else " (no prompt up to max_model_len fails)")
    )

    def show(p) -> None:
        sizes = ", ".join(f"{format_mb(b)} MB" for b in p.workspace_bytes)
        console.print(f"  {p.name:<15} workspace [{sizes}]  {p.seconds * 1000:8.1f} ms  {p.note}")

    console.print(f"[bold]lifecycle[/] on {device}")
    try:
        engine = LLMEngine(config, fix=fix, device=device, on_phase=show)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except (MemoryError, RuntimeError) as e:  # e.g. the reservation does not fit in this machine's memory
        console.print(f"[red]start-up failed:[/] {type(e).__name__}: {e}")
        console.print("try --device meta (shapes only) or a smaller --max-model-len")
        sys.exit(1)
    console.print(f"[bold]request[/] {prompt_tokens}-token prompt, max_tokens={max_tokens}")
    crashed = False
    try:
        engine.add_request(prompt_tokens, max_tokens=max_tokens)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    try:
        while engine.has_unfinished_requests():
            engine.step()
        out = engine.outputs[max(engine.outputs)]
        console.print(
            f"[green]completed[/] request {out.request_id}: {len(out.output_token_ids)} token(s) generated; "
            f"workspace {format_mb(engine.workspace.size_bytes())} MB (locked: {engine.workspace.is_locked()}); "
            f"paths used: {engine.backend.path_counts}"
        )
    except AssertionError as e:
        crashed = True
        console.print(f"[red]AssertionError:[/] {e}")
        try:
            engine.generate(16)
        except EngineDeadError as dead:
            console.print(f"[red]next request:[/] EngineDeadError: {dead}")
    ok = crashed == expect_crash
    console.print(f"[bold]{'as predicted' if ok else 'NOT as predicted'}[/]")
    sys.exit(0 if ok else 1)


@app.command()
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@_override_options
def plan(preset, **overrides) -> None:
    """The fix's reservation per consumer per rank, its share of the KV cache, and the unfixed limit."""
    from .attention import kv_cache_bytes_per_token
    from .reservation import plan_bytes, reservation_plan
    from .analysis import first_failing_prompt

    config = _build_config(preset, overrides)
    console.print(f"[bold]config[/] {_config_line(config)}")
    calls = reservation_plan(config)
    names = ["split-KV decode scratch (max_num_seqs rows)", "continuation-prefill dequant buffers (max_model_len - 1 cached)"]
    t = Table("consumer", "views (shape dtype)", "bytes", "MiB")
    for name, call in zip(names, calls):
        views = "\n".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in call)
        b = compute_layout(call).total_bytes
        t.add_row(name, views, f"{b:,}", f"{b / MiB:.2f}")
    console.print(t)
    reserved = plan_bytes(calls)
    slots = config.num_ubatches
    # Denominator: a KV cache that holds max_num_seqs requests of max_model_len tokens on this
    # rank (vLLM sizes the real one from --gpu-memory-utilization, unknown here).
    kv = kv_cache_bytes_per_token(config) * config.max_model_len * config.max_num_seqs
    console.print(
        f"workspace per rank after the reservation: {reserved:,} bytes = {reserved / MiB:.2f} MiB per ubatch slot "
        f"x {slots} slot(s) (one buffer serves the largest call)"
    )
    console.print(
        f"KV cache that would hold max_num_seqs x max_model_len tokens on this rank (vLLM sizes the real one from "
        f"--gpu-memory-utilization; {config.kv_cache_dtype}, "
        f"{kv_cache_bytes_per_token(config)} B/token over {config.num_hidden_layers} layers): {kv / MiB:,.1f} MiB; "
        f"workspace share: {100 * reserved * slots / kv:.3f}%"
    )
    locked = _predicted_locked_bytes(config, fix=False)
    if not config.enforce_eager and max(config.capture_sizes()) < config.max_num_seqs:
        console.print(
            f"[yellow]note[/] the largest captured decode batch ({max(config.capture_sizes())}) is below max_num_seqs "
            f"({config.max_num_seqs}): without the fix, an eager decode of more requests than that also overflows the lock"
        )
    bad = first_failing_prompt(config, locked)
    console.print(
        f"without the fix the workspace locks at {locked:,} bytes ({format_mb(locked)} MB, decode capture at "
        f"{max(config.capture_sizes())} rows): "
        + (f"longest prompt that survives: {bad - 1} tokens (a {bad}-token prompt crashes)" if bad is not None
           else "every prompt up to max_model_len survives")
    )


@app.command("inspect-vllm")
@click.option("--args", "engine_args", type=str, default=None,
              help='the `vllm serve ...` command line, e.g. "vllm serve M --tensor-parallel-size 8 --max-model-len 131072"')
@click.option("--config", "model_config", type=click.Path(exists=True), default=None,
              help="the model's config.json (or its folder)")
@click.option("--preset", type=str, default=None, help="a tqlab preset instead of --config")
@click.option("--tokens", "prompt_tokens", type=click.IntRange(min=1), multiple=True,
              help="prompt length to check (repeatable; default max_model_len)")
@click.option("--locked-bytes", type=click.IntRange(min=0), default=None,
              help="workspace size measured at lock without the fix (bytes)")
@click.option("--gpu-memory-gib", type=float, default=None, help="GPU memory, for vLLM's default batch limits")
@click.option("--demo", is_flag=True, help="also run the crashing chunk through vLLM's own classes on CPU (needs vLLM)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="also write the report as JSON ('-': standard output, then only the JSON)")
def inspect_vllm_cmd(engine_args, model_config, preset, prompt_tokens, locked_bytes, gpu_memory_gib, demo, json_path) -> None:
    """Predict, per workspace consumer, whether a vLLM deployment hits the locked-workspace crash.

    Reads engine args + the model's config.json; prints the workspace each
    prompt needs, whether it overflows the locked size with and without the
    fix, and the safe max_model_len. vLLM itself is only needed for --demo.
    ``--json -`` writes the report to standard output, and nothing else. Bad
    input (a flag vLLM 0.33 does not know, a bad value, a bad config.json
    field, --gpu-memory-gib that is not a finite number > 0, a --json path in
    a missing folder) is a one-line usage error (exit 2).
    """
    import math
    from pathlib import Path

    from .vllm_trace import inspect_vllm

    if gpu_memory_gib is not None and not (math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0):
        raise click.BadParameter(f"must be a finite number of GiB > 0, got {gpu_memory_gib}", param_hint="--gpu-memory-gib")
    to_stdout = json_path == "-"
    if json_path is not None and not to_stdout:
        parent = Path(json_path).resolve().parent
        if not parent.is_dir():
            raise click.BadParameter(f"{json_path}: folder {parent} does not exist", param_hint="--json")
    try:
        report = inspect_vllm(engine_args, model_config, preset=preset, prompt_tokens=prompt_tokens,
                              locked_bytes=locked_bytes, gpu_memory_gib=gpu_memory_gib, demo=demo,
                              json_path=None if to_stdout else json_path, quiet=to_stdout)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except OSError as e:
        raise click.UsageError(f"{e.filename or json_path}: {e.strerror}") from None
    if to_stdout:  # --json -: standard output holds only the JSON
        import json

        click.echo(json.dumps(report, indent=2, default=str))


def main() -> None:  # pragma: no cover
    app()
