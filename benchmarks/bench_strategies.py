"""The bug report's four fixes and the unfixed baseline, measured side by side; written to ``build/strategies_<tag>.json``.

With ``--record`` the file goes to ``data/`` instead, and an existing recording
there is replaced only by a run of at least as many decode steps (strategies x
prompts x ``--decode-steps``; for ``--memory``: traced calls) unless ``--force``.

For each strategy of :data:`tqlab.strategies.STRATEGIES` (``--strategies`` to
choose, ``grow_no_recapture`` available as a negative control), a fresh engine
is built and serves, one after the other, the bug report's ~8K-token prompt
and a prompt that fills ``max_model_len`` (each then decodes ``--decode-steps``
tokens). Recorded per strategy: start-up seconds (with each lifecycle phase),
reserved workspace bytes, peak memory (``torch.cuda.max_memory_allocated`` on
CUDA, computed workspace bytes elsewhere), time to first token and median decode
step per prompt, survival of the ``max_model_len`` request, graph safety,
re-captures and fallback calls. One untimed warm-up engine runs first.

The file is rewritten after every strategy, so a run stopped early keeps what
it measured. ``--memory`` also records the allocator experiments of notebook 06
(``torch.empty`` per call vs workspace views over the long request's trace, and
growth by ``resize_`` vs free-then-allocate) to ``data/strategies_memory_<tag>.json``.

Usage::

    # the seed deployment, exact bytes / survival / graph safety (seconds are Python overhead on meta)
    python benchmarks/bench_strategies.py --device meta --tag meta --record
    # real arithmetic on this CPU: one attention layer, 16K context, unquantized cache (the CPU TurboQuant path is slow)
    python benchmarks/bench_strategies.py --device cpu --tag cpu --set num_hidden_layers=1 \\
        --set max_model_len=16384 --set kv_cache_dtype=auto
    # the GPU box
    python benchmarks/bench_strategies.py --device cuda --tag h200 --memory --record
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from tqlab import strategies as S  # noqa: E402
from tqlab.core.config import EngineConfig  # noqa: E402
from tqlab.lab.display import markdown_table  # noqa: E402
from tqlab.lab.strategy_tables import results_payload, strategy_table  # noqa: E402
from tqlab.core.provenance import make_provenance, recorded_path, save_recorded  # noqa: E402

from _recording import add_record_arguments, default_dir, overwrite_refusal  # noqa: E402


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _provenance(argv: list[str]) -> dict:
    cmd = "python benchmarks/bench_strategies.py " + " ".join(argv)
    prov = make_provenance(cmd.strip(), commit=os.environ.get("TQLAB_COMMIT") or None)
    if hasattr(os, "getloadavg"):
        prov["load_average_1min"] = f"{os.getloadavg()[0]:.2f}"
    prov["cpu_count"] = str(os.cpu_count())
    return prov


def _refusal(args, out_dir: Path, tag: str, names: list[str], prompts: tuple, config: EngineConfig) -> str | None:
    """Why this run may not replace a recording in data/ (see benchmarks/_recording.py), or None."""
    if names:
        why = overwrite_refusal(recorded_path(f"strategies_{tag}", out_dir), len(names) * len(prompts) * args.decode_steps,
                                lambda d: len(d["strategies"]) * len(d["prompts"]) * d["decode_steps"],
                                force=args.force, unit="decode steps (strategies x prompts x steps)")
        if why:
            return why
    if args.memory:
        n = args.memory_prompt or config.max_model_len - 17
        return overwrite_refusal(recorded_path(f"strategies_memory_{tag}", out_dir), n, lambda d: d["prompt_tokens"],
                                 force=args.force, unit="traced prompt tokens")
    return None


def _record_memory(args, config: EngineConfig, overrides: dict, dev: torch.device, prov: dict, tag: str,
                   out_dir: Path) -> None:
    """The allocator experiments of notebook 06 -> strategies_memory_<tag>.json."""
    n = args.memory_prompt or config.max_model_len - 17
    mem = S.memory_experiments(config, n, device=dev, repeats=2, progress=False)
    path = save_recorded(f"strategies_memory_{tag}", dict(preset=args.preset, overrides=overrides,
                                                           config=config.to_dict(), **mem), prov,
                         data_dir=out_dir)
    for mode, v in mem["trace"].items():
        extra = (f", peak reserved {v['peak_reserved'] / 2**20:.1f} MiB, peak allocated "
                 f"{v['peak_allocated'] / 2**20:.1f} MiB") if "peak_reserved" in v else ""
        print(f"  trace {mode}: {len(v['per_call_us'])} calls{extra}")
    print(f"allocator experiments -> {path}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="nemotron-3-super-120b-a12b")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="EngineConfig override")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or meta")
    ap.add_argument("--tag", default=None, help="strategies_<tag>.json (default: the device)")
    ap.add_argument("--out-dir", default=None, help="output folder (default: build/, or data/ with --record)")
    ap.add_argument("--strategies", default=",".join(S.STRATEGIES))
    ap.add_argument("--prompts", default=None, help="comma-separated prompt lengths (default: 8192 and max_model_len)")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--memory", action="store_true", help="also record the allocator experiments")
    ap.add_argument("--memory-only", action="store_true", help="record only the allocator experiments")
    ap.add_argument("--memory-prompt", type=int, default=None,
                    help="request length of the allocator experiments (default: max_model_len - 17, as notebook 06)")
    add_record_arguments(ap)
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    """The files this run may write: ``strategies_<tag>.json`` (and ``strategies_memory_<tag>.json`` with
    ``--memory``/``--memory-only``) in ``--out-dir``, else ``build/`` (``data/`` with ``--record``)."""
    out_dir = Path(args.out_dir) if args.out_dir else default_dir(args)
    tag = args.tag or args.device.split(":")[0]
    names = [] if args.memory_only else [f"strategies_{tag}"]
    names += [f"strategies_memory_{tag}"] if (args.memory or args.memory_only) else []
    return [recorded_path(n, out_dir) for n in names]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda but torch.cuda.is_available() is False; nothing recorded", file=sys.stderr)
        return 2
    overrides = _parse_overrides(args.set)
    config = EngineConfig.from_preset(args.preset, **overrides)
    tag = args.tag or args.device.split(":")[0]
    prompts = (tuple(int(x) for x in args.prompts.split(",")) if args.prompts
               else S.default_prompts(config, args.decode_steps))
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    dev = torch.device(args.device)
    prov = _provenance(argv)
    if args.memory_only:
        names = []
        args.memory = True
    out_dir = Path(args.out_dir) if args.out_dir else default_dir(args)
    refusal = _refusal(args, out_dir, tag, names, prompts, config)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    print(f"{args.preset} {overrides} on {dev}: prompts {prompts}, strategies {names}", flush=True)
    t0 = time.perf_counter()
    if names:
        S.warm_up_process(config, dev, 0, prompts=prompts)  # as compare_strategies does (meta too)
    results, errors = [], {}
    for name in names:
        t = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", S.WorkspaceFallbackWarning)
                r = S.run_strategy(config, name, device=dev, prompts=prompts, decode_steps=args.decode_steps)
            results.append(r)
        except Exception:  # recorded, not hidden: the file says which strategy failed and how
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr, flush=True)
        payload = results_payload(config, results, prompts=prompts, decode_steps=args.decode_steps,
                                    preset=args.preset, overrides=overrides)
        payload["errors"] = errors
        payload["seconds_total"] = time.perf_counter() - t0
        path = save_recorded(f"strategies_{tag}", payload, prov, data_dir=out_dir)
        print(f"  {name}: {time.perf_counter() - t:.1f} s -> {path}", flush=True)
    if results:
        print(markdown_table(None, strategy_table(results)))
    if args.memory:
        _record_memory(args, config, overrides, dev, prov, tag, out_dir)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
