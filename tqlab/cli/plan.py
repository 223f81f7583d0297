"""``tqlab plan``: the fix's reservation per consumer per rank, its share of the KV cache, the split count that
fills the GPU, and the verdict without the fix."""

from __future__ import annotations


import click

from tqlab.core.config import EngineConfig

from tqlab.cli.options import (
    MiB,
    _build_config,
    _check_json_path,
    _config_line,
    _console,
    _override_options,
    _predict,
    _sources,
    _write_json,
    request_max_tokens,
    request_options,
)

@click.command()
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


def _share_line(config: EngineConfig) -> str:
    """The workspace's share of the KV pool one GPU holds (tqlab.predict.kv_pool), or why it is unknown."""
    from tqlab.predict.kv_pool import kv_pool

    try:
        k = kv_pool(config)
    except ValueError as exc:
        return f"workspace share of the KV cache: unknown ({exc})"
    return (f"KV pool of one {k.gpu} ({k.utilization} x {k.gpu_bytes / 2**30:.1f} GiB - weights {k.weight_bytes / 2**30:.1f} GiB "
            f"- activations {k.activation_bytes / 2**30:.1f} GiB; {'; '.join(k.assumed) or 'nothing assumed'}): "
            f"{k.pool_bytes / 2**30:,.1f} GiB, {k.tokens:,} tokens over {k.turboquant_layers} TurboQuant + "
            f"{k.boundary_layers} boundary layer(s) in {str(config.dtype).removeprefix('torch.')}; "
            f"workspace share: {100 * k.share:.3f}%")


def _plan_lines(config: EngineConfig, pred) -> list:
    """What ``tqlab plan`` prints: config, the reservation table, the KV share and the verdict without the fix."""
    from rich.table import Table

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
    out = [f"[bold]config[/] {_config_line(config)}", t,
           f"workspace per rank after the reservation: {reserved:,} bytes = {reserved / MiB:.2f} MiB per ubatch slot "
           f"x {slots} slot(s) (one buffer serves the largest call)",
           _share_line(config),
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


