"""``tqlab repro``: walk the engine lifecycle on cpu, cuda or meta and send one prompt; compare the run with the
prediction from outside the engine (the engine never imports the predictor)."""

from __future__ import annotations

import sys

import click

from tqlab.core.config import EngineConfig, load_preset

from tqlab.cli.options import (
    EXIT_CODES,
    _build_config,
    _config_line,
    _console,
    _override_options,
    _predict,
    request_max_tokens,
    request_options,
    version_line,
    vllm_option,
)

_CPU_BYTES_LIMIT = 4 << 30  # a CPU run that would build more than this goes to meta
_CPU_SECONDS_LIMIT = 30.0
_CPU_FLOPS = 1e11  # assumed float32 throughput of one shared CPU core set (FLOP/s), for the estimate only
# Fixed cost of one layer in one CPU engine step (dispatch, not arithmetic), for the estimate only: the bug report's
# deployment (8 layers) took 198 s for 1 prompt token + 8191 decode steps on the 2-core box (issue 22) = 3.0 ms.
_CPU_LAYER_STEP_SECONDS = 3.0e-3

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
    from tqlab.core.workspace_layout import format_mb

    if pred.verdict == "never_locked":
        return "completes: the workspace is never locked (vLLM locks only at the end of CUDA graph capture)"
    # vLLM's own message, quoted: its "MB" is 2**20 bytes (MiB, the unit of tqlab's other lines)
    what = (f"locked-workspace assertion: {pred.first_refused_call['caller']} requires "
            f"{format_mb(pred.first_refused_call['required_bytes'])} MB, current size is "
            f"{format_mb(pred.first_refused_call['current_bytes'])} MB") if pred.verdict == "crash" else "completes"
    first = pred.first_failing_prompt_tokens
    return what + (f" (shortest failing prompt: {first} tokens)" if first is not None
                   else " (no prompt up to max_model_len fails in prefill)")


@click.command()
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@request_options()
@click.option("--fix/--no-fix", default=False, show_default=True,
              help="reserve the worst case before capture (vLLM PR #44053)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "meta"]), default="auto", show_default=True,
              help="auto: cpu, or meta (shapes only) when a CPU run would exceed ~4 GiB or ~30 s")
@vllm_option
@_override_options
def repro(preset, prompt_tokens, max_tokens, fix, device, **overrides) -> None:
    """Walk the engine lifecycle and send one prompt; check the run against tqlab.predict.analysis.predict.

    Exit status 0 when the run behaves as predicted (crash, completes, or never locked), 1 otherwise;
    5 when vLLM refuses to start the deployment (its reason is printed, the engine is not run).
    With --preset, the preset's own max_num_seqs and max_num_batched_tokens (plan and inspect-vllm take
    vLLM's defaults for --gpu instead); give them as flags to replay a server.
    """
    from tqlab.engine import LLMEngine
    from tqlab.core.workspace_layout import format_mb

    console = _console()
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter("no CUDA device is available here; use cpu, meta (shapes only) or auto",
                                     param_hint="--device")
    config = _build_config(preset, overrides, server_defaults=False)  # the preset's own limits: see _build_config
    if prompt_tokens is None:
        prompt_tokens = load_preset(preset).get("default_prompt_tokens", 8192) if preset else 8192
    max_tokens, capped = request_max_tokens(config, prompt_tokens, max_tokens)
    console.print(f"[bold]release[/] {version_line()}")
    console.print(f"[bold]config[/] {_config_line(config)}")
    if capped:
        console.print(f"[yellow]note[/] {capped}")
    pred = _predict(config, prompt_tokens=prompt_tokens, max_tokens=max_tokens, fix=fix)
    if pred.verdict == "refused":  # vLLM would not start it: there is no lifecycle to replay
        from tqlab.predict.consumer_text import refusal_line

        console.print(refusal_line(pred), markup=False, highlight=False)  # vLLM's reason holds "[...]" lists
        sys.exit(EXIT_CODES["refused"])
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
    from tqlab.core.workspace_layout import format_mb

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


