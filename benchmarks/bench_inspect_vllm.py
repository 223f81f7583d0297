"""How long ``tqlab inspect-vllm`` takes to answer, in fresh processes (issue 30's target: a median of at most
0.4 s on the CPU box; issue 19's was 3 s).

The question: the Kimi-K2.6 config.json (``model_type kimi_k2``, MLA, 384 experts) with
``vllm serve K -tp 4``. Three figures, each the minimum and median over ``--repeats`` fresh
processes:

* ``python_startup``: ``python -c pass`` (the floor of any answer);
* ``import_torch``: ``python -c "import torch"`` alone (what an answer would cost if it imported torch: it does
  not, the shapes are counted in torch-free dtypes, ``tqlab.core.dtypes``);
* ``computed``: ``python -m tqlab inspect-vllm`` answering the question.

The exit status is 1 when the computed answer's median misses 0.4 s. Wall time depends on the box's load
(``load_average`` is recorded): run it on a quiet machine.

Usage::

    .venv/bin/python benchmarks/bench_inspect_vllm.py --repeats 5     # -> build/inspect_vllm_cpu.json
    .venv/bin/python benchmarks/bench_inspect_vllm.py --record        # -> data/inspect_vllm_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIMI_K26 = dict(model_type="kimi_k2", hidden_size=7168, num_attention_heads=64, num_hidden_layers=61, kv_lora_rank=512,
                qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536,
                max_position_embeddings=262144, n_routed_experts=384, num_experts_per_tok=8,
                moe_intermediate_size=2048, n_shared_experts=1, torch_dtype="bfloat16")
TARGET_S = 0.4
"""Issue 30: ``inspect-vllm`` is arithmetic on a config; its median answer within 0.4 s (``python -c pass`` ~0.05 s)."""


_ANSWERED = (0, 3, 4, 5)
"""Exit statuses of an answer: inspect-vllm exits by its verdict (tqlab.cli.options.EXIT_CODES); 1/2 are failures."""


def _time(cmd: list[str], env: dict[str, str], repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, cwd=ROOT)
        runs.append(time.perf_counter() - t)
        if done.returncode not in _ANSWERED:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return {"min_s": round(min(runs), 3), "median_s": round(statistics.median(runs), 3)}


def _positive_int(text: str) -> int:
    """``--repeats``: an integer >= 1 (a minimum and a median need one run at least), else argparse's usage error."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is below 1: at least one fresh process per figure")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=_positive_int, default=5, help="fresh processes per figure (>= 1)")
    ap.add_argument("--record", action="store_true", help="write data/inspect_vllm_cpu.json instead of build/")
    return ap


def output_paths(args: argparse.Namespace) -> list[Path]:
    return [ROOT / ("data" if args.record else "build") / "inspect_vllm_cpu.json"]


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps(KIMI_K26))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "tqlab", "inspect-vllm", "--config", str(cfg), "--args", "vllm serve K -tp 4"]
        out = {
            "python_startup": _time([sys.executable, "-c", "pass"], env, a.repeats),
            "import_torch": _time([sys.executable, "-c", "import torch"], env, a.repeats),
            "computed": _time(cmd, env, a.repeats),
        }
    out["target_median_s"] = TARGET_S
    out["load_average"] = os.getloadavg()[0]
    from tqlab.core.provenance import make_provenance

    out["provenance"] = make_provenance("python benchmarks/bench_inspect_vllm.py "
                                        + " ".join(argv if argv is not None else sys.argv[1:]))
    text = json.dumps(out, indent=2)
    print(text)
    (path,) = output_paths(a)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return 0 if out["computed"]["median_s"] < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
