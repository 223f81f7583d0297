"""``tqlab plan``: the fix's reservation per consumer per rank, its share of the KV cache, the split count that
fills the GPU, and the verdict without the fix."""

from __future__ import annotations


import click

from tqlab.core.config import EngineConfig

from tqlab.cli.outputs import check_json_path, force_option
from tqlab.cli.options import (
    EXIT_HELP,
    MiB,
    _build_config,
    _config_line,
    _console,
    _override_options,
    _predict,
    _sources,
    _write_json,
    exit_by_verdict,
    request_max_tokens,
    request_options,
    version_line,
    vllm_option,
    ways_out_report,
)

@click.command(epilog=EXIT_HELP)
@click.option("--preset", type=str, default=None, help="a name from `tqlab presets`")
@request_options()
@click.option("--json", "json_path", type=str, default=None,
              help="write the prediction as JSON to FILE ('-': stdout, which then holds only the JSON)")
@force_option
@vllm_option
@_override_options
def plan(preset, prompt_tokens, max_tokens, json_path, force, **overrides) -> None:
    """The fix's reservation per consumer per rank, its share of the KV cache, and the unfixed limit.

    With --preset, max_num_seqs and max_num_batched_tokens no flag gives are
    vLLM's defaults for --gpu (as for a config.json), unless the preset
    records a real deployment. --json never writes under data/ or over a
    trace record, nor over an existing file without --force.
    """
    check_json_path(json_path, force=force)
    config = _build_config(preset, overrides)
    capped, asked_max_tokens = None, max_tokens
    if prompt_tokens is not None:
        max_tokens, capped = request_max_tokens(config, prompt_tokens, max_tokens)
    pred = _predict(config, prompt_tokens=prompt_tokens, max_tokens=max_tokens, sources=_sources(preset, overrides))
    if pred.verdict == "refused":  # vLLM will not start it: its reason first, nothing to size, no way out to check
        _print_refusal(pred, config, json_path)
    try:
        lines = _plan_lines(config, pred, _first_decode_refusal(config, asked_max_tokens))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    # The top level always describes the deployment (as inspect-vllm's does); a --prompt-tokens
    # prediction goes under "prompt". The exit status follows the deployment's verdict.
    obj = (pred if prompt_tokens is None
           else _predict(config, max_tokens=asked_max_tokens, sources=pred.sources)).to_json()
    if prompt_tokens is not None:
        obj["prompt"] = {k: v for k, v in pred.to_json().items() if k != "sources"}
    obj["ways_out"], way_lines = ways_out_report(config, crashed=obj["verdict"] == "crash", max_tokens=asked_max_tokens)
    lines += way_lines
    if json_path is not None:
        _write_json(obj, json_path)
    if json_path != "-":
        console = _console()
        for line in [version_line(), *lines] + ([f"[yellow]note[/] {capped}"] if capped else []):
            console.print(line)
    exit_by_verdict(obj)


def _print_refusal(pred, config: EngineConfig, json_path) -> None:
    """A deployment vLLM refuses to start: the JSON (``ways_out`` empty), then vLLM's reason as the first line,
    printed without rich markup (vLLM's reasons hold ``[...]`` lists); exits 5."""
    from tqlab.predict.consumer_text import refusal_line

    obj = dict(pred.to_json(), ways_out=[])
    if json_path is not None:
        _write_json(obj, json_path)
    if json_path != "-":
        console = _console()
        console.print(refusal_line(pred), markup=False, highlight=False)
        console.print(version_line(), markup=False, highlight=False)
        console.print(f"config {_config_line(config)}", markup=False, highlight=False)
    exit_by_verdict(obj)


def _share_line(config: EngineConfig) -> str:
    """The workspace's share of the KV pool one GPU holds (tqlab.predict.kv_pool), or why it is unknown."""
    from tqlab.predict.kv_pool import kv_pool

    from tqlab.core.consumers.registry import turboquant_active

    if config.has_turboquant_consumers and not turboquant_active(config):  # an attention-free class (Mamba)
        return ("workspace share of the KV cache: none (this model class builds no attention layer, so the "
                "TurboQuant cache dtype has no layer to apply to)")
    try:
        k = kv_pool(config)
    except ValueError as exc:
        return f"workspace share of the KV cache: unknown ({exc})"
    return (f"KV pool of one {k.gpu} ({k.utilization} x {k.gpu_bytes / 2**30:.1f} GiB - weights {k.weight_bytes / 2**30:.1f} GiB "
            f"- activations {k.activation_bytes / 2**30:.1f} GiB; {'; '.join(k.assumed) or 'nothing assumed'}): "
            f"{k.pool_bytes / 2**30:,.1f} GiB, {k.tokens:,} tokens over {k.turboquant_layers} TurboQuant + "
            f"{k.boundary_layers} boundary layer(s) in {str(config.dtype).removeprefix('torch.')}; "
            f"workspace share: {100 * k.share:.3f}%")


def _first_decode_refusal(config: EngineConfig, max_tokens: int) -> dict | None:
    """The call a 1-token prompt's decode steps make that the lock refuses, or None: the predictor for that prompt
    (a 1-token prompt has no continuation chunk, so a refused call is its first decode step's, which every
    prompt makes alike: a speculative drafter's one-token decode at a lock of 0 bytes). None for ``max_tokens`` 1."""
    if max_tokens < 2 or config.max_model_len < 1 + max_tokens:
        return None
    return _predict(config, prompt_tokens=1, max_tokens=max_tokens).first_refused_call


def _plan_lines(config: EngineConfig, pred, decode_refusal: dict | None = None) -> list:
    """What ``tqlab plan`` prints: config, the reservation table, the KV share and the verdict without the fix;
    ``decode_refusal``: :func:`_first_decode_refusal` (then every prompt crashes at its first decode step)."""
    from rich.table import Table

    from tqlab.core.reservation import plan_bytes, reservation_plan
    from tqlab.core.workspace_layout import compute_layout, format_mb

    calls = reservation_plan(config) if pred.turboquant_consumers else []  # none on an attention-free class
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
    if pred.turboquant_consumers:
        from tqlab.core.reservation import kv_splits_advice

        adv = kv_splits_advice(config)
        fills = (f"already fills the {adv.gpu}'s {adv.sm_count} SMs for a 1-row batch"
                 if adv.filling_splits == adv.configured_splits else
                 f"S = {adv.filling_splits} would fill the {adv.gpu}'s {adv.sm_count} SMs for a 1-row batch and "
                 f"reserve {adv.filling_bytes:,} bytes at max_num_seqs rows ({adv.flag}; a graph replays the S it "
                 "was captured with)")
        out.append(f"split-KV decode: S = {adv.configured_splits} ({adv.configured_bytes:,} bytes of decode scratch at "
                   f"max_num_seqs rows); {fills}")
    from tqlab.predict.consumer_text import consumer_lines, safe_len_line, verdict_line

    out += consumer_lines(pred)
    if pred.locked_bytes is None:
        out.append("without the fix: the workspace is never locked (vLLM locks only at the end of CUDA graph "
                   "capture), so no prompt hits the locked-workspace assertion")
        return out + [verdict_line(pred)]
    bad = pred.first_failing_prompt_tokens
    if decode_refusal:  # the bounds count the decode steps: ask the prefill alone (--max-tokens 1) for the rest
        alone = _predict(config, max_tokens=1).first_failing_prompt_tokens
        survives = (f"every prompt crashes at its first decode step ({decode_refusal['caller']} asks "
                    f"{decode_refusal['required_bytes']:,} bytes); without decode steps (--max-tokens 1) "
                    + ("every prompt crashes too: another consumer overflows the lock" if alone == 1 else
                       f"the longest prompt that survives is {alone - 1 if alone else config.max_model_len - 1} tokens"))
    else:
        survives = ("every prompt crashes: another consumer overflows the lock (see the verdict)" if bad == 1 else
                    f"longest prompt that survives: {bad - 1} tokens (a {bad}-token prompt crashes)" if bad is not None
                    else "every prompt up to max_model_len survives its prefill")
    out.append(
        f"without the fix the workspace locks at {pred.locked_bytes:,} bytes ({format_mb(pred.locked_bytes)} MiB): "
        + survives + f"; verdict: {pred.verdict}" + (" (PARTIAL: unmodelled consumers)" if pred.partial else "")
    )
    return out + [safe_len_line(pred), verdict_line(pred)]


