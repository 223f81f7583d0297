"""``tqlab inspect-vllm`` (a `vllm serve` line plus config.json, consumer by consumer) and ``tqlab trace-report``
(a recorded multi-rank vLLM trace)."""

from __future__ import annotations

import json

import click


from tqlab.cli.outputs import check_json_path, force_option
from tqlab.cli.options import (
    EXIT_HELP,
    GPU_HELP,
    GpuName,
    HumanInt,
    _check_preset,
    _console,
    _write_json,
    exit_by_verdict,
    request_options,
    vllm_option,
    ways_out_report,
)

@click.command("inspect-vllm", epilog=EXIT_HELP)
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
@vllm_option
@click.option("--demo", is_flag=True, help="also run the crashing chunk through vLLM's own classes on CPU (needs vLLM)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="also write the report as JSON ('-': standard output, then only the JSON)")
@force_option
def inspect_vllm_cmd(engine_args, model_config, preset, prompt_tokens, max_tokens, locked_bytes, gpu, gpu_memory_gib,
                     demo, json_path, force) -> None:
    """Predict, per workspace consumer, whether a vLLM deployment hits the locked-workspace crash.

    Reads engine args + the model's config.json; prints the workspace each
    prompt needs, whether it overflows the locked size with and without the
    fix, and the safe max_model_len. vLLM itself is only needed for --demo.
    "--json -" writes the report to standard output, and nothing else. Bad
    input (a flag the --vllm release does not know, a bad value, a bad config.json
    field, --gpu-memory-gib that is not a finite number > 0, a --json path in
    a missing folder) is a one-line usage error (exit 2). --json never writes
    under data/ or over a trace record, nor over an existing file without
    --force.
    """
    import math

    from tqlab.predict.report import inspect_vllm

    if (model_config is None) == (preset is None):
        raise click.UsageError("give the model as --config FILE (its config.json, or its folder) or --preset NAME "
                               "(`tqlab presets`), not " + ("both" if preset else "neither"))

    if gpu_memory_gib is not None and not (math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0):
        raise click.BadParameter(f"must be a finite number of GiB > 0, got {gpu_memory_gib}", param_hint="--gpu-memory-gib")
    to_stdout = json_path == "-"
    check_json_path(json_path, force=force)
    if preset is not None:
        _check_preset(preset)
    try:
        report = inspect_vllm(engine_args, model_config, preset=preset, prompt_tokens=prompt_tokens,
                              max_tokens=max_tokens, locked_bytes=locked_bytes, gpu=gpu,
                              gpu_memory_gib=gpu_memory_gib, demo=demo, quiet=True)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except OSError as e:
        raise click.UsageError(f"{e.filename or json_path}: {e.strerror}") from None
    _add_ways_out(report, max_tokens)
    text = json.dumps(report, indent=2, default=str)
    if to_stdout:  # --json -: standard output holds only the JSON
        click.echo(text)
    elif json_path is not None:
        try:
            with open(json_path, "w") as f:
                f.write(text)
        except OSError as e:
            raise click.UsageError(f"cannot write the JSON report to {json_path!r}: {e.strerror}") from None
    if not to_stdout:
        click.echo(report["text"])
    exit_by_verdict(report)


def _add_ways_out(report: dict, max_tokens: int) -> None:
    """``report["ways_out"]`` and its lines after the text (:func:`tqlab.cli.options.ways_out_report`), for the
    deployment the report read (its ``prediction.config``) and a measured lock size if one was given."""
    from tqlab.core.config import EngineConfig

    if report["verdict"] == "refused":  # vLLM will not start it: nothing to get out of
        report["ways_out"] = []
        return
    cfg = dict(report["prediction"]["config"])
    config = EngineConfig(**cfg)
    measured = report["locked_bytes"] if report.get("locked_source") == "measured" else None
    report["ways_out"], lines = ways_out_report(config, crashed=report["verdict"] == "crash", locked_bytes=measured,
                                                max_tokens=max_tokens)
    if lines:
        report["text"] += "\n" + "\n".join(lines)


@click.command("trace-report")
@click.argument("trace_dir", type=click.Path(file_okay=False))
@click.option("--config", "model_config", type=click.Path(exists=True), default=None,
              help="the model's config.json (or its folder), to compare with the prediction")
@click.option("--preset", type=str, default=None, help="a tqlab preset instead of --config")
@click.option("--args", "engine_args", type=str, default=None, help='the `vllm serve ...` command line of the deployment')
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="also write the merged report as JSON ('-': standard output, then only the JSON)")
@force_option
@vllm_option(recorded=True)
def trace_report_cmd(trace_dir, model_config, preset, engine_args, json_path, force, vllm) -> None:
    """Merge the vLLM plugin's per-process records in TRACE_DIR; hold them against the prediction.

    Run vLLM with TQLAB_VLLM_TRACE=TRACE_DIR (tqlab installed in vLLM's environment):
    each process that creates a workspace manager writes TRACE_DIR/<host>-<pid>.json.
    Prints one row per rank (lock size per slot, largest request per consumer,
    refusals), whether the ranks agree and, with --config/--preset and --args,
    each disagreement with inspect-vllm's prediction, else "as predicted".
    Records that disagree with each other or with --args (vLLM version,
    config, a duplicated or missing rank) are named. A truncated or foreign
    JSON file, a FIFO, a device, a folder or a file over 16 MiB is skipped
    with a one-line warning. --json never writes into TRACE_DIR, under data/,
    or over an existing file without --force.
    """
    from tqlab.predict.trace_report import render, trace_report

    check_json_path(json_path, force=force, trace_dir=trace_dir)
    if preset is not None:
        _check_preset(preset)
    try:
        report = trace_report(trace_dir, engine_args, model_config, preset=preset, vllm=vllm)
    except (ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    if json_path is not None:
        _write_json(report, json_path)
        if json_path == "-":
            return
    console = _console()
    for line in render(report):
        console.print(line)


