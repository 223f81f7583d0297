"""Notebook 06's comparison table: one row of display strings per strategy, and the recording that stores it.

:func:`strategy_table` turns :class:`tqlab.strategies.StrategyResult` objects
into rows (bytes in binary units, :func:`tqlab.lab.display.fmt_bytes`; show them with
``markdown_table(None, rows)``); :func:`results_payload` is the object saved as
``data/strategies_<tag>.json`` (inputs, results and that table, read back with
:func:`tqlab.strategies.results_from_payload`). A recording's ``table`` is shown
as stored.
"""

from __future__ import annotations

from typing import Any, Sequence

from tqlab.core.config import EngineConfig
from tqlab.strategies import STRATEGY_INFO, StrategyResult
from tqlab.lab.display import fmt_bytes

__all__ = ["results_payload", "strategy_table"]


def _fmt_s(x: float | None) -> str:
    """Seconds for the table: ``'dies'`` for None, milliseconds below one second."""
    if x is None:
        return "dies"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def strategy_table(results: Sequence[StrategyResult], *, timings: bool = True) -> list[dict[str, str]]:
    """One row per strategy with the columns of the comparison table, as display strings.

    Prompt columns are named after the first two prompts' token counts. ``timings=False`` leaves out the
    start-up, time-to-first-token and decode-step columns (bytes and survival only).
    """
    rows = []
    for r in results:
        row = {
            "strategy": r.strategy,
            "bug report's fix": STRATEGY_INFO[r.strategy]["seed_fix"],
            "reserved": fmt_bytes(r.reserved_bytes),
            ("peak (cuda max allocated)" if r.peak_source != "computed" else "peak (computed)"): fmt_bytes(r.peak_bytes),
        }
        if timings:
            row = {**{k: row[k] for k in ("strategy", "bug report's fix")}, "start-up": _fmt_s(r.startup_s),
                   **{k: v for k, v in row.items() if k not in ("strategy", "bug report's fix")}}
        for p in r.prompts[:2]:
            tag = f"{p.prompt_tokens}-token"
            if timings:
                row[f"TTFT {tag}"] = _fmt_s(p.ttft_s) if p.ttft_s is not None else "dies"
                row[f"decode step {tag}"] = _fmt_s(p.decode_step_s) if p.survived else "dies"
            else:
                row[f"{tag} prompt"] = "served" if p.survived else "dies"
        row["survives max_model_len"] = "yes" if r.survives_max_model_len else "no"
        row["graph-safe"] = "yes" if r.graph_safe else "no"
        extra = []
        if r.recaptures:
            extra.append(f"{r.recaptures} re-captures")
        if r.fallback_calls:
            extra.append(f"{r.fallback_calls} fallback calls")
        if r.engines_built > 1:
            extra.append(f"{r.engines_built} engines built")
        row["notes"] = ", ".join(extra)
        rows.append(row)
    return rows


def results_payload(config: EngineConfig, results: Sequence[StrategyResult], *, prompts: Sequence[int],
                    decode_steps: int, preset: str | None = None, overrides: dict | None = None) -> dict[str, Any]:
    """The JSON object stored as ``data/strategies_<tag>.json`` (without provenance): inputs, results, table."""
    return dict(
        preset=preset or config.preset,
        overrides=dict(overrides or {}),
        config=config.to_dict(),
        prompts=list(prompts),
        decode_steps=decode_steps,
        strategies=[r.to_dict() for r in results],
        table=strategy_table(results),
    )
