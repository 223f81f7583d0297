"""``tqlab`` command line: ``repro``, ``plan``, ``presets``, ``inspect-vllm``, ``trace-report`` (and ``python -m tqlab``).

Every :class:`~tqlab.core.config.EngineConfig` field is an override flag
(``--max-num-seqs 2``, ``--kv-cache-dtype auto``, ``--no-enable-chunked-prefill``),
as vLLM's CLI takes every engine argument, so any reported deployment can be
replayed without writing a preset.

The commands live one per module: :mod:`tqlab.cli.repro`, :mod:`tqlab.cli.plan`, :mod:`tqlab.cli.inspect`
(``inspect-vllm``, ``trace-report``); what they share (option types, building the config, the prediction,
``--json``) in :mod:`tqlab.cli.options`.
"""

from __future__ import annotations

from tqlab.cli import _needs  # noqa: F401  (first: click and rich present, else one line saying what to add)

import click

from tqlab.cli.inspect import inspect_vllm_cmd, trace_report_cmd
from tqlab.cli.options import HumanInt, _console, preset_problem, request_max_tokens
from tqlab.cli.plan import plan
from tqlab.cli.repro import _pick_device, cpu_run_estimate, repro
from tqlab.core.config import list_presets, load_preset

__all__ = ["HumanInt", "_pick_device", "app", "cpu_run_estimate", "main", "request_max_tokens"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def app() -> None:
    """tqlab: vLLM's workspace, the TurboQuant locked-workspace crash, and its fix."""


@app.command()
def presets() -> None:
    """List the presets in data/presets/ with their sources (a broken preset file: one line naming it)."""
    from rich.table import Table

    problems = {n: preset_problem(n) for n in list_presets()}
    names = [n for n, p in problems.items() if p is None]
    t = Table(show_lines=True)
    t.add_column("preset", no_wrap=True, min_width=max(map(len, names), default=6))  # a name is copied whole
    t.add_column("title")
    t.add_column("source of its numbers")
    for name in names:
        data = load_preset(name)
        t.add_row(name, data["title"], data["source"])
    console = _console()
    console.print(t)
    from rich.markup import escape

    for problem in filter(None, problems.values()):
        console.print(f"[yellow]skipped[/] {escape(problem)}")



for _command in (repro, plan, inspect_vllm_cmd, trace_report_cmd):
    app.add_command(_command)


def main() -> None:  # pragma: no cover
    app()
