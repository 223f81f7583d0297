"""``tqlab inspect-vllm``: a vLLM deployment's locked-workspace crash, per consumer, as one report.

The top level of the JSON is the one :class:`~tqlab.predict.analysis.Prediction`'s
:meth:`~tqlab.predict.analysis.Prediction.to_json` (the same object as ``tqlab plan --json``);
``prediction`` holds the per-consumer view (:mod:`tqlab.predict.consumers`). Every number comes
from :mod:`tqlab.predict.analysis`; this module reads the deployment, arranges and prints.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from tqlab.core import vllm_versions
from tqlab.core.config import EngineConfig
from tqlab.core.notes import NoteKind
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD
from tqlab.predict import analysis
from tqlab.predict.consumer_text import refusal_line
from tqlab.predict.bug_report import (
    BUG_REPORT_LOCKED_MB,
    BUG_REPORT_REQUIRED_MB,
    bug_report_max_num_batched_tokens,
    bug_report_note,
)
from tqlab.predict.consumers import (
    DECODE,
    DEQUANT_CHUNK,
    SHORT_CHUNK,
    ConsumerNeed,
    ConsumerReport,
    RequestPrediction,
    chunk_shapes,
    consumer_report,
)
from tqlab.vllm.deployment import deployment_from_preset, deployment_from_vllm
from tqlab.vllm.tracer import vllm_available, vllm_version

__all__ = [
    "BUG_REPORT_LOCKED_MB", "BUG_REPORT_REQUIRED_MB", "CONTINUATION_DECODE_THRESHOLD", "DECODE", "DEQUANT_CHUNK",
    "SHORT_CHUNK", "ConsumerNeed", "ConsumerReport", "RequestPrediction", "bug_report_max_num_batched_tokens",
    "chunk_shapes", "consumer_report", "inspect_vllm",
]


def _demo(config: EngineConfig, pred: ConsumerReport, report: dict[str, Any], text: list[str]) -> None:
    """``inspect-vllm --demo``: the first crashing chunk through vLLM's own classes on CPU, without and with the fix."""
    if not vllm_available():
        report["demo"] = None
        text.append("demo skipped: vLLM is not importable here (bash parity/install.sh, then use .venv-parity/bin/python)")
    elif pred.first_failing_prompt is None:
        report["demo"] = None
        text.append("demo skipped: no prompt up to max_model_len overflows without the fix")
    elif "continuation" not in analysis.prompt_workspace_chunks(config, pred.first_failing_prompt):
        report["demo"] = None
        text.append("demo skipped: the first failing prompt crashes in a decode step, not in a continuation chunk "
                    "(the demo replays a continuation prefill)")
    else:
        from tqlab.vllm.cpu_harness import run_vllm_seed_scenario  # torch: only --demo runs vLLM's classes

        cached, q = analysis.prompt_workspace_chunks(config, pred.first_failing_prompt)["continuation"]
        runs = [False] + ([True] if pred.locked_fixed <= 1 << 30 else [])
        res = [run_vllm_seed_scenario(config, cached_len=cached, q_len=q, fixed=f) for f in runs]
        if len(runs) == 1:
            text.append("fixed demo skipped: its reservation would take more than 1 GiB of host memory")
        report["demo"] = [r.to_dict() for r in res]
        text.append(
            f"vLLM {vllm_version()}'s own classes on CPU, the crashing chunk ({q} new tokens after {cached} cached):"
        )
        for r in res:
            granted = f"buffers granted ({r.kernel_error} at the kernel launch, as expected on CPU)"
            text.append(f"  {'with' if r.fixed else 'without'} PR #44053: " + (r.error or granted))


def inspect_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None = None,
    model_config: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    preset: str | None = None,
    prompt_tokens: Sequence[int] = (),
    locked_bytes: int | None = None,
    gpu_memory_gib: float | None = None,
    demo: bool = False,
    max_tokens: int = 2,
    gpu: str | None = None,
    json_path: str | os.PathLike | None = None,
    out: TextIO | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """``tqlab inspect-vllm``: predict the locked-workspace crash for a vLLM deployment.

    Args:
        engine_args: the ``vllm serve ...`` command line (string or argv) or a dict.
        model_config: path to the model's ``config.json`` (or its folder) or the dict.
        preset: instead of ``model_config``, a tqlab preset (``data/presets``);
            ``engine_args`` then override its fields.
        prompt_tokens: prompt lengths to check (default ``max_model_len``).
        locked_bytes: measured workspace size at lock without the fix (bytes).
        gpu_memory_gib: GPU memory, for vLLM's default batch limits (wins over ``gpu``'s).
        max_tokens: tokens each request generates (``--max-tokens``; default 2: one decode step); 1 makes no
            decode call (vLLM finishes the request after its prefill).
        gpu: the GPU target (``--gpu``: :func:`tqlab.core.hardware.gpu_target`, case-insensitive): the config's
            ``gpu`` and, for a config.json, vLLM's default batch limits. None: the preset's / EngineConfig's
            target (H200), and for a config.json batch limits for a GPU of unknown size (vLLM's small tier);
            the CLI always passes one (default H200).
        demo: also send the first crashing chunk through vLLM's own classes
            on CPU, without and with the fix (:func:`run_vllm_seed_scenario`;
            needs vLLM, else skipped with a note; the fixed run is skipped when
            its reservation would exceed 1 GiB of host memory).
        json_path: also write the report there (JSON); ``"-"``: print only the JSON, to ``out``.
        out: where the text goes (default ``sys.stdout``).
        quiet: print nothing.

    Returns the report dict: the top level is :meth:`tqlab.predict.analysis.Prediction.to_json` of the
    deployment as configured (the same object as ``tqlab plan --json``), plus ``prediction``
    (:meth:`~tqlab.predict.consumers.ConsumerReport.to_dict`, its
    ``notes`` included; per request ``verdict``, ``rejected``,
    ``first_refused_unfixed``/``_fixed``; ``max_num_batched_tokens`` and
    ``max_num_batched_tokens_source``: where it came from, as in ``sources`` ("flag --...",
    "vLLM default ...", "preset ..."), ``sources`` (every field's origin), ``vllm_version`` (the release modelled,
    ``"0.33"``: :func:`tqlab.core.vllm_versions.current`), ``vllm_installed`` (the installed vLLM, None without), ``text`` (what
    was printed) and ``demo`` (list of :meth:`ScenarioResult.to_dict`, or None)
    when asked. Raises ``ValueError`` when not exactly one of
    ``model_config``/``preset`` is given, or for bad arguments.

    CLI (wired by ``tqlab.cli``)::

        tqlab inspect-vllm --config config.json \\
            --args "vllm serve M --tensor-parallel-size 8 --max-model-len 131072 ..." --tokens 8192 --demo
    """
    if (model_config is None) == (preset is None):
        raise ValueError("give exactly one of model_config (a config.json) or preset")
    if preset is not None:
        dep = deployment_from_preset(engine_args, preset, gpu=gpu)
    else:
        dep = deployment_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib, gpu=gpu)
    config, source = dep.config, _chunk_source(dep, preset)
    sources = {**dep.sources, "max_num_batched_tokens": source}
    first = analysis.predict(config, sources=sources, locked_bytes=locked_bytes, startup=dep.startup)
    if first.verdict == "refused":  # vLLM does not start it: its reason, first, and nothing sized
        report = {**first.to_json(), "prediction": None, "vllm_installed": vllm_version(), "demo": None}
        report["text"] = "\n".join([refusal_line(first), vllm_versions.describe(), *(f"note: {n}" for n in dep.notes)])
        _emit(report, json_path, sys.stdout if out is None else out, quiet)
        return report
    pred = consumer_report(config, prompt_tokens, locked_bytes=locked_bytes, max_num_batched_tokens_source=source,
                           max_tokens=max_tokens)
    pred.notes[:0] = [n for n in dep.notes  # the defaulted chunk size is said by the source line
                      if not (n.kind is NoteKind.DEFAULTED and n.field == "max_num_batched_tokens")]
    note = bug_report_note(pred)
    if note is not None:
        pred.notes.append(note)
    report: dict[str, Any] = first.to_json()
    report.update({"prediction": pred.to_dict(), "vllm_installed": vllm_version()})
    text = pred.format().split("\n")  # the verdict (and its indented lines) first, then the release it holds for
    at = next((i for i, line in enumerate(text) if i and not line.startswith("  ")), len(text))
    text.insert(at, vllm_versions.describe())
    if demo:
        _demo(config, pred, report, text)
    report["text"] = "\n".join(text)
    _emit(report, json_path, sys.stdout if out is None else out, quiet)
    return report


def _chunk_source(dep, preset: str | None) -> str:
    """Where ``max_num_batched_tokens`` came from, saying when a preset's value is the bug report's inferred one."""
    source = dep.sources.get("max_num_batched_tokens", "vLLM default")
    if preset is not None and source == f"preset {preset}" and (
            bug_report_max_num_batched_tokens(dep.config) == dep.config.max_num_batched_tokens):
        source += (f": inferred from the bug report's {BUG_REPORT_REQUIRED_MB} MB; the report does not give "
                   "max_num_batched_tokens")
    return source


def _emit(report: dict[str, Any], json_path, out: TextIO, quiet: bool) -> None:
    """Print the text (unless ``quiet``) and/or write the JSON (``"-"``: only the JSON, to ``out``)."""
    if json_path is not None and str(json_path) == "-":  # stdout holds only the JSON
        print(json.dumps(report, indent=2, default=str), file=out)
        return
    if json_path is not None:
        try:
            Path(json_path).write_text(json.dumps(report, indent=2, default=str))
        except OSError as e:
            raise ValueError(f"cannot write the JSON report to {str(json_path)!r}: {e.strerror}") from None
    if not quiet:
        print(report["text"], file=out)
