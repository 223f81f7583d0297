"""``tqlab trace-report DIR``: the per-process records of the vLLM plugin, merged, and held against the prediction.

Each file ``DIR/<host>-<pid>.json`` is one process's record (:mod:`tqlab.vllm.trace_record`).
This module reads them (a truncated or foreign file, a FIFO, a device, a file above
:data:`~tqlab.predict.trace_checks.MAX_RECORD_BYTES` is skipped with a one-line warning),
makes one row per rank (lock size per slot, largest request per consumer, refusals),
says whether the ranks agree and whether the records describe one deployment (vLLM
version, config, rank set: :mod:`tqlab.predict.trace_checks`), and -- given the deployment
-- compares every number with :mod:`tqlab.predict.analysis` (the predictor ``plan`` and
``inspect-vllm`` use), every consumer it sizes included, and names each disagreement.
Sizes in bytes; "MiB" in text is 2**20 bytes (vLLM's messages call it "MB").
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from rich.markup import escape as _markup_escape

from tqlab.core import vllm_versions
from tqlab.core.config import EngineConfig
from tqlab.core.consumers.registry import TURBOQUANT, turboquant_active
from tqlab.core.reservation import plan_bytes, reservation_plan
from tqlab.core.workspace_layout import format_mb
from tqlab.predict import analysis
from tqlab.predict import trace_checks
from tqlab.predict.report import DECODE, DEQUANT_CHUNK
from tqlab.vllm.trace_record import RECORD_FORMAT
from tqlab.vllm.trace_types import REFUSAL_KINDS

RESERVATION = "reservation (PR #44053)"
# vLLM 0.33 vllm/v1/attention/backends/turboquant_attn.py: the function that asks the workspace -> consumer
CONSUMER_OF_FUNCTION = {
    "_decode_attention": DECODE,
    "_continuation_prefill": DEQUANT_CHUNK,
    "_reserve_workspace": RESERVATION,
}
_REQUIRED = ("rank", "consumers", "locks", "refused", "pid", "host")
# bounds no vLLM process reaches (a handful of consumers, 2 ubatches x a few lanes, a lock per start-up or
# elastic-EP rescale): a record beyond them is not read as one
MAX_CONSUMERS, MAX_LOCKS, MAX_SLOTS = 1024, 4096, 64
MAX_COLUMNS = 16  # consumer columns the text table shows (the largest; --json has all)


def consumer_name(caller: str) -> str:
    """The consumer a caller ``'file.py:line:function'`` is: TurboQuant's (:data:`CONSUMER_OF_FUNCTION`), else
    ``'file.py:function'`` -- the call-site name the consumer registry gives every other consumer
    (``ConsumerRow.consumer``, e.g. ``'modular_kernel.py:_allocate_buffers'`` for the fused MoE)."""
    parts = caller.split(":")
    func = parts[-1]
    if func in CONSUMER_OF_FUNCTION:
        return CONSUMER_OF_FUNCTION[func]
    return f"{parts[0]}:{func}" if len(parts) >= 3 else caller


def load_trace_dir(trace_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """``(records, warnings)``: every ``*.json`` record in ``trace_dir``, sorted by rank then pid.

    A file that is not JSON (e.g. cut short by a killed process), not an object, or not a
    record of :data:`~tqlab.vllm.trace_record.RECORD_FORMAT` is skipped, with one line in
    ``warnings`` naming it; so is anything :func:`~tqlab.predict.trace_checks.read_record_file` will not
    read (not a regular file, too large). Raises ``ValueError`` when ``trace_dir`` is not a folder.
    """
    d = Path(trace_dir)
    if not d.is_dir():
        raise ValueError(f"trace folder {str(trace_dir)!r} does not exist or is not a folder")
    records, warnings = [], []
    for path in sorted(d.glob("*.json")):
        rec, why = trace_checks.read_record_file(path)
        if why is not None:
            warnings.append(f"skipped {path.name}: {why}")
            continue
        if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
            fmt = rec.get("format") if isinstance(rec, dict) else type(rec).__name__
            warnings.append(f"skipped {path.name}: not a tqlab trace record (format {fmt!r}, want {RECORD_FORMAT!r})")
            continue
        missing = [k for k in _REQUIRED if k not in rec]
        if missing:
            warnings.append(f"skipped {path.name}: record lacks {', '.join(missing)}")
            continue
        rec["file"] = path.name
        problem = _malformed(rec)
        if problem is not None:
            warnings.append(f"skipped {path.name}: malformed record ({problem})")
            continue
        records.append(rec)
    records.sort(key=lambda r: (_rank_key(r), r.get("host", ""), r.get("pid", 0)))
    return records, warnings


def _malformed(rec: Mapping[str, Any]) -> str | None:
    """Why ``rec`` (with :data:`_REQUIRED`'s keys) cannot be read as a record -- a field of the wrong type or
    missing inside it -- else None; the checks are what :func:`rank_row`, :func:`rank_label` and the sort use."""
    try:
        for key, cap in (("consumers", MAX_CONSUMERS), ("locks", MAX_LOCKS), ("refused", MAX_LOCKS)):
            if len(rec[key]) > cap:
                return f"{len(rec[key]):,} entries in {key}, more than a vLLM process makes ({cap:,})"
        row = rank_row(rec)
        rank_label(rec)
        if len(row.lock_bytes or ()) > MAX_SLOTS:
            return f"{len(row.lock_bytes):,} workspace slots (vLLM has ubatches x lanes, at most {MAX_SLOTS} here)"
        nums = [*_rank_key(rec), rec["pid"], *(row.lock_bytes or ()), *(c["bytes"] for c in row.consumers.values()),
                *(r[k] for r in row.refused for k in ("current_bytes", "slot")),
                *(r["required_bytes"] for r in row.refused if r["kind"] == "scratch" or r["required_bytes"] is not None)]
        if any(r["kind"] not in REFUSAL_KINDS for r in row.refused):
            return f"refusal kind {next(r['kind'] for r in row.refused if r['kind'] not in REFUSAL_KINDS)!r}"
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        return f"{type(e).__name__}: {e}"
    bad = [n for n in nums if isinstance(n, bool) or not isinstance(n, int) or n < 0]
    if bad:
        return f"{bad[0]!r} where a whole number >= 0 is expected"
    if not isinstance(rec["host"], str):
        return f"host {rec['host']!r} is not a string"
    return trace_checks.field_problem(rec)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal acts on instead of printing (C0/C1 controls: ``ESC [2J`` clears the screen; bidirectional
overrides reorder a line): a record's text shows them as ``\\x1b``-style escapes."""


def escape(text: str) -> str:
    """``text`` as it is printed: control and bidirectional characters written as Python escapes (``\\x1b``), then
    rich markup escaped (``rich.markup.escape``), so a record can neither drive the terminal nor raise
    ``MarkupError``."""
    return _markup_escape(_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text))


def _rank_key(rec: Mapping[str, Any]) -> tuple:
    rank = rec.get("rank") or {}
    return tuple(rank.get(k, {}).get("rank", 1 << 30) for k in ("dp", "pp", "tp"))


def rank_label(rec: Mapping[str, Any]) -> str:
    """``"DP 0 PP 0 TP 1/2"``-style label from the record's vLLM ranks, or ``"<host>-<pid>"`` when vLLM knew none."""
    rank = rec.get("rank") or {}
    parts = [f"{k.upper()} {rank[k]['rank']}/{rank[k]['size']}" for k in ("dp", "pp", "tp")
             if k in rank and rank[k]["size"] > 1]
    if not parts and "tp" in rank:
        parts = [f"TP {rank['tp']['rank']}/{rank['tp']['size']}"]
    return " ".join(parts) if parts else f"{rec.get('host')}-{rec.get('pid')}"


@dataclass
class RankRow:
    """One process: lock sizes per slot (last lock), largest request and its phase per consumer, refusals."""

    rank: str
    file: str
    event: str
    lock_bytes: list[int] | None
    consumers: dict[str, dict[str, Any]]
    refused: list[dict[str, Any]]

    def key(self) -> tuple:
        """What must be equal on every tensor-parallel rank."""
        cons = tuple(sorted((k, v["bytes"], v["phase"]) for k, v in self.consumers.items()))
        refs = tuple((r["kind"], r["consumer"], r["required_bytes"], r["current_bytes"], r["slot"]) for r in self.refused)
        return (tuple(self.lock_bytes or ()), cons, refs)


def rank_row(rec: Mapping[str, Any]) -> RankRow:
    """A :class:`RankRow` from one record (consumers named by :func:`consumer_name`)."""
    cons: dict[str, dict[str, Any]] = {}
    for c in rec["consumers"]:
        name = consumer_name(c["caller"])
        if name not in cons or c["high_water_bytes"] > cons[name]["bytes"]:
            cons[name] = {"bytes": c["high_water_bytes"], "phase": c.get("high_water_phase", "?"), "caller": c["caller"]}
    refused = [{"consumer": consumer_name(v["caller"]), "kind": v.get("kind", "scratch"),
                **{k: v[k] for k in ("required_bytes", "current_bytes", "slot")},
                **({} if v.get("kind", "scratch") == "scratch" else {"message": str(v.get("message", ""))})}
               for v in rec["refused"]]
    locks = [lk["sizes_bytes"] for lk in rec["locks"] if lk.get("kind") == "lock"]
    return RankRow(rank_label(rec), rec["file"], str(rec.get("event", "?")), locks[-1] if locks else None, cons, refused)


def rank_differences(rows: Sequence[RankRow]) -> list[str]:
    """One line per rank whose lock sizes, largest requests or refusals differ from the first rank's ([] = agree)."""
    out = []
    for r in rows[1:]:
        a, b = rows[0].key(), r.key()
        what = [name for name, x, y in zip(("lock sizes", "largest requests", "refusals"), a, b) if x != y]
        if what:
            out.append(f"{r.rank} differs from {rows[0].rank} in {', '.join(what)}")
    return out


@dataclass
class Comparison:
    """The records held against the prediction: ``disagreements`` (each one line), ``agreements`` (the checks that held)."""

    locked_unfixed: int | None
    locked_fixed: int | None
    bounds: dict[str, int]
    disagreements: list[str] = field(default_factory=list)
    agreements: list[str] = field(default_factory=list)
    slots: int = 1
    crash_predicted: bool = True

    @property
    def verdict(self) -> str:
        return "as predicted" if not self.disagreements else f"{len(self.disagreements)} disagreement(s) with the prediction"


def consumer_bounds(config: EngineConfig) -> dict[str, int]:
    """The largest request each consumer can make (bytes), per :mod:`tqlab.predict.analysis`.

    Split-KV decode: ``max_num_seqs`` rows; continuation prefill: ``max_model_len - 1``
    cached tokens; the PR #44053 reservation: its largest call (``plan_bytes``); every other
    consumer the predictor sizes (:func:`tqlab.predict.analysis.consumer_table`, e.g. the fused
    MoE's ``modular_kernel.py:_allocate_buffers``): the larger of its reservation before the lock
    and its serve-time request, keyed by its call site (:func:`consumer_name`).
    """
    bounds = {}
    if turboquant_active(config):  # a TurboQuant cache on a class that builds Attention layers
        bounds = {DECODE: analysis.decode_bytes(config, config.max_num_seqs),
                  DEQUANT_CHUNK: analysis.continuation_bytes(config, max(1, config.max_model_len - 1)),
                  RESERVATION: plan_bytes(reservation_plan(config))}
    for row in analysis.consumer_table(config).rows:
        if row.name not in TURBOQUANT:
            bounds[row.consumer] = max(bounds.get(row.consumer, 0), row.reserved_bytes, row.max_runtime_bytes)
    return bounds


def _check_lock(row: RankRow, cmp: Comparison) -> None:
    """Slot 0 (ubatch 0, lane 0) against the prediction; other slots by the predictor's slot rule.

    The predictor sizes slot (ubatch 0, lane 0) only (:func:`tqlab.predict.analysis.locked_bytes`): init
    reservations, PR #44053's included, land there (vLLM 0.33 ``vllm/v1/worker/workspace.py``
    ``WorkspaceManager._get_workspace_id``: ``dbo_current_ubatch_id() * num_lanes + lane``, 0 outside a DBO
    ubatch thread). Another slot holds what the profile run and captures asked in it: from 0 (nothing
    ran there, as tqlab's ``repro --enable-dbo`` gives) up to slot 0's size; only more is a disagreement.
    """
    pu, pf = cmp.locked_unfixed, cmp.locked_fixed
    if row.lock_bytes is None:
        if pu is not None:
            cmp.disagreements.append(f"{row.rank}: never locked (record ends at '{row.event}'); predicted a lock at "
                                     f"{format_mb(pu)} MiB without PR #44053, {format_mb(pf)} MiB with it")
        return
    if pu is None:
        cmp.disagreements.append(f"{row.rank}: locked, but the deployment is predicted never to lock (eager)")
        return
    if len(row.lock_bytes) < cmp.slots:
        cmp.disagreements.append(f"{row.rank}: {len(row.lock_bytes)} workspace slot(s); the deployment has "
                                 f"{cmp.slots} ubatch slots (DBO)")
    for slot, size in enumerate(row.lock_bytes):
        if slot > 0:
            top = max(pu, pf)
            if size > top:
                cmp.disagreements.append(f"{row.rank}: slot {slot} locked at {format_mb(size)} MiB ({size:,} bytes), "
                                         f"more than slot 0's predicted {format_mb(top)} MiB")
            else:
                cmp.agreements.append(f"{row.rank}: slot {slot} locked at {format_mb(size)} MiB: tqlab sizes slot "
                                      f"(ubatch 0, lane 0) only; any size up to its {format_mb(top)} MiB fits the rule")
            continue
        which = "without PR #44053" if size == pu else "with PR #44053" if size == pf else None
        if which is None:
            cmp.disagreements.append(f"{row.rank}: slot {slot} locked at {format_mb(size)} MiB ({size:,} bytes); predicted "
                                     f"{format_mb(pu)} MiB ({pu:,}) without PR #44053, {format_mb(pf)} MiB ({pf:,}) with it")
        else:
            cmp.agreements.append(f"{row.rank}: slot {slot} locked at {format_mb(size)} MiB, as predicted {which}")


def _check_consumers(row: RankRow, cmp: Comparison) -> None:
    for name, c in sorted(row.consumers.items()):
        bound = cmp.bounds.get(name)
        if bound is None:
            cmp.disagreements.append(f"{row.rank}: {name} ({c['caller']}) asked for {format_mb(c['bytes'])} MiB; "
                                     "the prediction has no such consumer for this deployment")
        elif c["bytes"] > bound:
            cmp.disagreements.append(f"{row.rank}: {name} asked for {format_mb(c['bytes'])} MiB, more than the predicted "
                                     f"largest {format_mb(bound)} MiB")
        elif name == RESERVATION and c["bytes"] != bound:
            cmp.disagreements.append(f"{row.rank}: the reservation asked for {format_mb(c['bytes'])} MiB; predicted "
                                     f"{format_mb(bound)} MiB")
        else:
            cmp.agreements.append(f"{row.rank}: {name} asked for at most {format_mb(c['bytes'])} MiB "
                                  f"({c['phase']}), within the predicted largest {format_mb(bound)} MiB")


def _check_refusals(row: RankRow, cmp: Comparison) -> None:
    for r in row.refused:
        req, cur = r["required_bytes"], r["current_bytes"]
        if r["kind"] != "scratch":  # the predictor sizes scratch only: a persistent/lane refusal is never predicted
            cmp.disagreements.append(f"{row.rank}: vLLM refused {r['consumer']} ({r['kind']}): {r['message']}; "
                                     "the prediction does not foresee this refusal")
            continue
        locked = row.lock_bytes[r["slot"]] if row.lock_bytes and 0 <= r["slot"] < len(row.lock_bytes) else None
        if locked is not None and cur != locked:
            cmp.disagreements.append(f"{row.rank}: refusal says slot {r['slot']} holds {format_mb(cur)} MiB, "
                                     f"the lock recorded {format_mb(locked)} MiB")
        elif cmp.locked_unfixed is not None and cur == cmp.locked_fixed and cur != cmp.locked_unfixed:
            cmp.disagreements.append(f"{row.rank}: {r['consumer']} refused {format_mb(req)} MiB with PR #44053's "
                                     f"{format_mb(cur)} MiB reserved; predicted: every request fits")
        elif cmp.locked_unfixed is not None and req > cur and not cmp.crash_predicted:
            cmp.disagreements.append(f"{row.rank}: {r['consumer']} refused {format_mb(req)} MiB > {format_mb(cur)} MiB; "
                                     "predicted: every request of this deployment fits, even without PR #44053")
        elif cmp.locked_unfixed is not None and req > cur:
            cmp.agreements.append(f"{row.rank}: refused {r['consumer']}, {format_mb(req)} MiB > {format_mb(cur)} MiB at "
                                  "lock, as predicted without PR #44053")


def compare(rows: Sequence[RankRow], config: EngineConfig) -> Comparison:
    """Hold each row against the prediction for ``config``: lock sizes, largest requests, refusals."""
    cmp = Comparison(analysis.locked_bytes(config, fix=False), analysis.locked_bytes(config, fix=True),
                     consumer_bounds(config), slots=config.num_ubatches,
                     crash_predicted=analysis.predict(config).verdict == "crash")
    for row in rows:
        _check_lock(row, cmp)
        _check_consumers(row, cmp)
        _check_refusals(row, cmp)
    return cmp


def _deployment(engine_args, model_config, preset) -> EngineConfig | None:
    from tqlab.vllm.deployment import deployment_from_preset, deployment_from_vllm

    if model_config is None and preset is None:
        if engine_args:
            raise ValueError("--args needs --config (the model's config.json) or --preset")
        return None
    if model_config is not None and preset is not None:
        raise ValueError("give one of --config or --preset, not both")
    dep = deployment_from_preset(engine_args, preset) if preset else deployment_from_vllm(engine_args, model_config)
    return dep.config


def _deployment_problems(records: Sequence[Mapping[str, Any]], config: EngineConfig, engine_args) -> list[str]:
    """Records whose config or vLLM version contradicts the deployment and the vLLM tqlab models."""
    from tqlab.vllm.flags import vllm_flags

    modelled = vllm_flags()["vllm_version"]
    out = trace_checks.config_disagreements(records, config, trace_checks.model_in_args(engine_args))
    other = sorted({str(r.get("vllm_version")) for r in records} - {modelled})
    if other:
        out.append(f"records ran vLLM {', '.join(other)}; the prediction models vLLM {modelled}")
    return out


def recorded_version(records: Sequence[Mapping[str, Any]], vllm: str | None = None) -> str:
    """The release to check ``records`` against: ``vllm`` when given, else the one release every record names
    (``vllm_version``, written by the plugin: :mod:`tqlab.vllm.trace_record`) when tqlab models it, else the run's
    (:func:`tqlab.core.vllm_versions.current`; :func:`_deployment_problems` then names the records' versions)."""
    if vllm is not None:
        return vllm_versions.get(vllm).name
    named = {str(r.get("vllm_version")) for r in records}
    if len(named) == 1:
        try:
            return vllm_versions.get(named.pop()).name
        except ValueError:
            pass
    return vllm_versions.current().name


def trace_report(trace_dir: str | os.PathLike, engine_args: str | Sequence[str] | None = None,
                 model_config: str | os.PathLike | None = None, *, preset: str | None = None,
                 vllm: str | None = None) -> dict[str, Any]:
    """Merge the records in ``trace_dir``; with a deployment (``model_config`` or ``preset`` plus
    ``engine_args``, as ``inspect-vllm`` reads them) compare them with the prediction of the release the records
    ran (:func:`recorded_version`; ``vllm`` overrides it, and records of another release are then disagreements).

    Returns ``{"rows", "warnings", "ranks_agree", "rank_differences", "record_problems", "vllm_versions",
    "vllm_version", "prediction", "verdict"}`` (JSON types; ``vllm_version``: the release checked against;
    ``prediction``/``verdict`` None without a deployment).
    ``record_problems``: the records disagree with each other (:func:`trace_checks.record_problems`);
    with a deployment they, and every record field contradicting it, count as disagreements.
    Raises ``ValueError`` (one line) for a missing folder, a folder without records, or a bad deployment.
    """
    records, warnings = load_trace_dir(trace_dir)
    if not records:
        raise ValueError(f"no tqlab trace record in {str(trace_dir)!r} (set TQLAB_VLLM_TRACE={trace_dir} for vLLM)")
    with vllm_versions.using(recorded_version(records, vllm)) as version:
        out = _trace_report(records, warnings, engine_args, model_config, preset)
    out["vllm_version"] = version.name
    return out


def _trace_report(records, warnings, engine_args, model_config, preset) -> dict[str, Any]:
    config = _deployment(engine_args, model_config, preset)
    rows = [rank_row(r) for r in records]
    diffs = rank_differences(rows)
    problems = trace_checks.record_problems(records)
    out: dict[str, Any] = {
        "rows": [vars(r) for r in rows], "warnings": warnings, "ranks_agree": not diffs, "rank_differences": diffs,
        "record_problems": problems,
        "vllm_versions": sorted({str(r.get("vllm_version")) for r in records}), "prediction": None, "verdict": None,
    }
    if config is not None:
        cmp = compare(rows, config)
        cmp.disagreements[:0] = problems + _deployment_problems(records, config, engine_args)
        out["prediction"] = {"locked_bytes": cmp.locked_unfixed, "locked_bytes_with_fix": cmp.locked_fixed,
                             "largest_request_bytes": cmp.bounds, "disagreements": cmp.disagreements,
                             "agreements": cmp.agreements}
        out["verdict"] = cmp.verdict
    return out


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{format_mb(nbytes)}"


SHORT = {DECODE: "decode", DEQUANT_CHUNK: "continuation", RESERVATION: "reservation"}


def _refusal_cell(x: Mapping[str, Any]) -> str:
    name = escape(SHORT.get(x["consumer"], x["consumer"]))
    if x["kind"] != "scratch":
        return f"[bold red]{name} ({x['kind']})[/]"
    return f"[bold red]{name} {_mb(x['required_bytes'])} > {_mb(x['current_bytes'])}[/]"


def render(report: Mapping[str, Any]) -> list[Any]:
    """What ``tqlab trace-report`` prints: warnings, a rich table (rows: ranks), rank agreement, the comparison.

    Every text taken from a record or a file name is escaped (``rich.markup.escape``): a caller such as
    ``x.py:1:[/]`` prints as written instead of raising rich's ``MarkupError``.
    """
    from rich.table import Table

    rows = report["rows"]
    slots = max((len(r["lock_bytes"] or ()) for r in rows), default=0)
    largest: dict[str, int] = {}
    for r in rows:
        for c, v in r["consumers"].items():
            largest[c] = max(largest.get(c, 0), v["bytes"])
    shown = sorted(largest, key=lambda c: (-largest[c], c))[:MAX_COLUMNS]
    consumers = sorted(shown)
    t = Table("rank", "last write", *[f"lock slot {i}" for i in range(slots)],
              *[f"largest {escape(SHORT.get(c, c))}" for c in consumers], "refused",
              title="workspace per rank, MiB (tqlab trace records)")
    for r in rows:
        locks = list(r["lock_bytes"] or ()) + [None] * (slots - len(r["lock_bytes"] or ()))
        cons = [f"{_mb(r['consumers'][c]['bytes'])} ({escape(str(r['consumers'][c]['phase']))})"
                if c in r["consumers"] else "-" for c in consumers]
        refused = "\n".join(_refusal_cell(x) for x in r["refused"]) or "none"
        t.add_row(escape(r["rank"]), escape(r["event"]), *[_mb(b) for b in locks], *cons, refused)
    out: list[Any] = [escape(f"checked against {vllm_versions.describe(report.get('vllm_version'))}")]
    out += [f"[yellow]warning: {escape(w)}[/]" for w in report["warnings"]]
    out.append(t)
    if len(largest) > len(consumers):
        out.append(f"{len(largest) - len(consumers)} more consumer(s) with smaller requests: see --json")
    out.append("records: " + escape(", ".join(f"{r['file']} ({r['rank']})" for r in rows)
                                    + f"; vLLM {', '.join(report['vllm_versions'])}"))
    out.append(f"ranks: all {len(rows)} agree (lock sizes, largest requests, refusals)" if report["ranks_agree"] else
               "[bold]ranks disagree[/]: " + escape("; ".join(report["rank_differences"])))
    out += [f"[bold]records disagree[/]: {escape(p)}" for p in report.get("record_problems", ())]
    pred = report["prediction"]
    if pred is None:
        out.append("no deployment given (--config/--preset and --args): not compared with the prediction")
        return out
    out.append(escape(f"prediction: lock at {_mb(pred['locked_bytes'])} MiB without PR #44053, "
               f"{_mb(pred['locked_bytes_with_fix'])} MiB with it; largest request "
               + ", ".join(f"{SHORT.get(k, k)} {_mb(v)} MiB" for k, v in pred["largest_request_bytes"].items())))
    out += [f"  [green]ok[/] {escape(a)}" for a in pred["agreements"]]
    out += [f"  [bold red]DISAGREES[/] {escape(d)}" for d in pred["disagreements"]]
    out.append(f"[bold]{escape(report['verdict'])}[/]")
    return out
