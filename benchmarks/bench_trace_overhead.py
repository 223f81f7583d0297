"""What the vLLM plugin's tracer costs: host microseconds per ``get_simultaneous`` call, traced vs untraced (CPU).

The request is the seed deployment's split-KV decode scratch (``nemotron-3-super-120b-a12b``,
one TP-8 rank, ``max_num_seqs`` 4 rows: three views), made every call on an already-grown
workspace -- a decode step's case, the call the tracer sees most. Two managers:

* ``vllm``: vLLM 0.33's own ``vllm.v1.worker.workspace.WorkspaceManager`` (when vLLM is
  importable, e.g. in ``.venv-parity``), traced as the plugin traces it (the wrapper on
  ``_ensure_workspace_size``, :class:`tqlab.vllm.tracer.WorkspaceTracer`);
* ``tqlab``: :class:`tqlab.core.workspace.WorkspaceManager` (the wrapper on ``get_simultaneous``).

It also times the plugin's no-op path: importing :mod:`tqlab.vllm_plugin` and calling
``register()`` without ``TQLAB_VLLM_TRACE``, in fresh interpreters (budget 50 ms).

Untraced and traced runs alternate; each figure is the minimum over ``--repeats`` runs of
``--number`` calls (median recorded too). Target (issue 23): traced <= 2x untraced for vLLM's
manager, the one the plugin traces in a deployment; the exit status is 1 when it is missed.

Usage::

    .venv-parity/bin/python benchmarks/bench_trace_overhead.py            # -> build/trace_overhead_cpu.json
    .venv-parity/bin/python benchmarks/bench_trace_overhead.py --record   # -> data/trace_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from tqlab.core.config import EngineConfig  # noqa: E402
from tqlab.core.provenance import make_provenance, recorded_path, save_recorded  # noqa: E402
from tqlab.core.reservation import decode_workspace_shapes  # noqa: E402
from tqlab.vllm.tracer import WorkspaceTracer, vllm_version  # noqa: E402

from _recording import add_record_arguments, default_dir, overwrite_refusal  # noqa: E402

TARGET_RATIO = 2.0
IMPORT_BUDGET_MS = 50.0


def _managers() -> dict[str, object]:
    from tqlab.core.workspace import WorkspaceManager

    out: dict[str, object] = {"tqlab": WorkspaceManager("cpu")}
    if importlib.util.find_spec("vllm") is not None:
        import vllm.v1.worker.workspace as ws

        out["vllm"] = ws.WorkspaceManager(torch.device("cpu"))
    return out


def _time(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6


def measure(manager: object, shapes, number: int, repeats: int) -> dict[str, float]:
    """``{"untraced_us", "traced_us", ..._median_us, "ratio"}`` for one manager (runs alternate)."""
    call = lambda: manager.get_simultaneous(*shapes)  # noqa: E731
    if type(manager).__module__.startswith("vllm"):
        from tqlab.vllm.cpu_harness import vllm_cpu_patches  # vLLM's growth calls torch.accelerator.empty_cache

        with vllm_cpu_patches():
            call()
    call()  # grown once, outside the timing
    plain, traced = [], []
    for _ in range(repeats):
        plain.append(_time(call, number))
        tracer = WorkspaceTracer(manager)
        traced.append(_time(call, number))
        tracer.detach()
    return {"untraced_us": min(plain), "traced_us": min(traced), "untraced_median_us": statistics.median(plain),
            "traced_median_us": statistics.median(traced), "ratio": min(traced) / min(plain)}


_IMPORT = ("import os, sys, time; os.environ.pop('TQLAB_VLLM_TRACE', None); t0 = time.perf_counter(); "
           "import tqlab.vllm_plugin as p; p.register(); print((time.perf_counter() - t0) * 1e3)")


def plugin_import_ms(runs: int = 7) -> list[float]:
    """Milliseconds to import the plugin and call ``register()`` without ``TQLAB_VLLM_TRACE``, each in a fresh
    interpreter (what vLLM's ``load_general_plugins`` pays per process for it)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [float(subprocess.run([sys.executable, "-c", _IMPORT], env=env, capture_output=True, text=True,
                                 check=True).stdout.strip()) for _ in range(runs)]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000, help="calls per timed run")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out-dir", default=None, help="output folder (default: build/, or data/ with --record)")
    add_record_arguments(ap)
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The file this run writes: ``trace_overhead_cpu.json`` in ``--out-dir``, else ``build/`` (``data/`` with ``--record``)."""
    return [recorded_path("trace_overhead_cpu", Path(args.out_dir) if args.out_dir else default_dir(args))]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.number < 1 or args.repeats < 1:
        print(f"--number and --repeats must be >= 1, got {args.number} and {args.repeats}", file=sys.stderr)
        return 2
    (path,) = output_paths(args)
    out_dir = path.parent
    refusal = overwrite_refusal(path, args.number * args.repeats,
                                lambda d: d["number"] * d["repeats"], force=args.force, unit="timed calls per case")
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    c = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
    shapes = decode_workspace_shapes(c.max_num_seqs, c.num_heads_per_rank, c.head_dim,
                                     c.tq_max_kv_splits_for_cuda_graph, c.dtype)
    rows = {}
    for name, manager in _managers().items():
        rows[name] = measure(manager, shapes, args.number, args.repeats)
        r = rows[name]
        print(f"{name:>5} manager: untraced {r['untraced_us']:.2f} us, traced {r['traced_us']:.2f} us per call "
              f"-> x{r['ratio']:.2f}")
    imports = plugin_import_ms()
    print(f"plugin import + register() without TQLAB_VLLM_TRACE: median {statistics.median(imports):.2f} ms "
          f"(min {min(imports):.2f}, max {max(imports):.2f}) over {len(imports)} fresh interpreters "
          f"(budget {IMPORT_BUDGET_MS:.0f} ms for the median; the max carries the box's load)")
    judged = rows.get("vllm", rows["tqlab"])
    ok = judged["ratio"] <= TARGET_RATIO and statistics.median(imports) < IMPORT_BUDGET_MS
    cmd = "python benchmarks/bench_trace_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    prov = make_provenance(cmd.strip(), device=f"CPU ({os.cpu_count()} cores)",
                           extra={"vllm": vllm_version() or "not installed"})
    if hasattr(os, "getloadavg"):
        prov["load_average_1min"] = f"{os.getloadavg()[0]:.2f}"
    path = save_recorded("trace_overhead_cpu", {
        "number": args.number, "repeats": args.repeats, "views": [[list(s), str(d)] for s, d in shapes],
        "statistic": "minimum over repeats of the mean per call (host microseconds); *_median_us: median over repeats",
        "rows": rows, "target_ratio": TARGET_RATIO, "judged_manager": "vllm" if "vllm" in rows else "tqlab",
        "meets_target": ok, "plugin_import_ms": imports, "plugin_import_median_ms": statistics.median(imports),
        "plugin_import_budget_ms": IMPORT_BUDGET_MS,
    }, prov, data_dir=out_dir)
    print(f"target traced <= {TARGET_RATIO}x untraced ({'vllm' if 'vllm' in rows else 'tqlab'} manager): "
          f"{'met' if ok else 'MISSED'} -> {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
