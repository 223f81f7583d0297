"""Every benchmark writes under build/ unless ``--record`` (issue 22, "Lost recordings").

Each script in ``benchmarks/`` exposes ``build_parser()`` and ``output_paths(args)``
(the files a run with those arguments writes); these tests import the scripts
without running them and check, for every mode a script has, that the default
destination is under ``build/`` (git-ignored), that ``--record`` moves it to
``data/``, and that every command line in a script's usage text parses.
"""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))
# Per script, the argument lists that select each mode with its own output file(s).
MODES = {
    "bench_cuda_graphs": [[]],
    "bench_inspect_vllm": [[]],
    "bench_strategies": [[], ["--memory"], ["--memory-only"], ["--device", "meta"]],
    "bench_trace_overhead": [[]],
    "bench_turboquant": [[], ["--vs-vllm"]],
    "bench_workspace_overhead": [[], ["--device", "cuda", "--tag", "h200"]],
    "dev_turboquant_dequant": [[]],
    "dev_turboquant_fast": [[], ["--sections", "check"]],
    "dev_turboquant_frag": [[]],
    "dev_turboquant_soa": [[]],
    "dev_turboquant_variants": [[], ["--quick"]],
}


@pytest.fixture(scope="module")
def scripts():
    sys.path[:0] = [str(BENCH), str(ROOT)]
    try:
        yield {name: importlib.import_module(name) for name in SCRIPTS}
    finally:
        for p in (str(BENCH), str(ROOT)):
            sys.path.remove(p)


def test_every_benchmark_script_is_covered():
    assert SCRIPTS == sorted(MODES)


def _under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


@pytest.mark.parametrize("name", SCRIPTS)
def test_default_output_is_under_build_and_record_goes_to_data(scripts, name):
    mod = scripts[name]
    for argv in MODES[name]:
        plain = mod.output_paths(mod.build_parser().parse_args(argv))
        recorded = mod.output_paths(mod.build_parser().parse_args(argv + ["--record"]))
        assert plain and all(_under(p, ROOT / "build") for p in plain), (name, argv, plain)
        assert [p.name for p in recorded] == [p.name for p in plain]
        assert all(_under(p, ROOT / "data") for p in recorded), (name, argv, recorded)


def test_turboquant_modes_name_their_files(scripts):
    tq, dev = scripts["bench_turboquant"], scripts["dev_turboquant_variants"]
    parse = lambda m, *a: m.output_paths(m.build_parser().parse_args(list(a)))  # noqa: E731
    assert parse(tq) == [ROOT / "build" / "turboquant_bench.json"]
    assert parse(tq, "--vs-vllm", "--record") == [ROOT / "data" / "turboquant_vs_vllm_h200.json"]
    assert parse(tq, "--out", "/tmp/x.json") == [Path("/tmp/x.json")]
    assert parse(dev, "--quick") == [ROOT / "build" / "turboquant_variants.json"]
    assert parse(dev, "--one", "llama_3bit_32k") == []


def _usage_lines(name: str) -> list[list[str]]:
    """Argument lists of the ``python benchmarks/<name>.py ...`` lines in a script's docstring."""
    doc = importlib.import_module(name).__doc__
    doc = re.sub(r"\\\n\s*", " ", doc)
    out = []
    for m in re.finditer(rf"python3? benchmarks/{name}\.py([^\n]*)", doc):
        line = re.sub(r"\$\([^)]*\)|\$\w+", "X", m.group(1).split("#")[0]).replace("[", " ").replace("]", " ")
        out.append(shlex.split(line))
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_usage_line_in_a_benchmarks_docstring_parses(scripts, name):
    lines = _usage_lines(name)
    for argv in lines:
        scripts[name].build_parser().parse_args(argv)  # SystemExit(2) if an option is refused
    assert lines
    if name == "dev_turboquant_variants":
        assert ["--out", "X/variants.json", "--quick"] in lines


def test_benchmark_runs_without_record_leave_git_status_clean(scripts):
    """Runs without --record on this CPU box write under build/ only (the CUDA ones refuse before writing)."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    status = lambda: subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],  # noqa: E731
                                    capture_output=True, text=True, check=True).stdout
    before = status()
    runs = {"bench_workspace_overhead": ["--number", "2", "--repeats", "1"],
            "bench_strategies": ["--device", "meta", "--strategies", "none", "--decode-steps", "1", "--prompts", "8192"],
            "bench_turboquant": ["--quick", "--no-sweep", "--sections", "copy,store"],
            "dev_turboquant_variants": ["--quick"], "bench_cuda_graphs": ["--iters", "1"],
            "dev_turboquant_fast": ["--sections", "check"], "dev_turboquant_soa": ["--contexts", "8192"],
            "dev_turboquant_frag": ["--contexts", "32768"],
            "dev_turboquant_dequant": ["--contexts", "8192"],
            "bench_trace_overhead": ["--number", "2", "--repeats", "1"], "bench_inspect_vllm": ["--repeats", "1"]}
    assert sorted(runs) == SCRIPTS
    # bench_trace_overhead: 0 or 1 (its 2x target judged on 2 calls, noise); the CUDA ones refuse with 2
    want = {"bench_workspace_overhead": {0}, "bench_strategies": {0}, "bench_trace_overhead": {0, 1},
            "bench_inspect_vllm": {0, 1}}  # 1: its 0.4 s target missed on a loaded box
    for name, argv in runs.items():
        rc = scripts[name].main(argv)
        assert rc in want.get(name, {2}), name
        assert status() == before, name
    assert (ROOT / "build" / "workspace_overhead_cpu.json").is_file()


def test_progress_log_and_json_saver(scripts, tmp_path, capsys):
    """The scripts' one progress line and incremental JSON write (``_tq_bench``): floats to 4 digits
    after the elapsed seconds; ``save()`` writes the dict as it is now, with ``wall_s``."""
    import json
    import time

    tb = importlib.import_module("_tq_bench")
    t0 = time.time()
    tb.progress_log(t0)({"preset": "turboquant_3bit_nc", "ms": 0.123456, "splits": 32})
    assert re.fullmatch(r"\[ +\d+\.\ds\] preset=turboquant_3bit_nc, ms=0\.1235, splits=32\n", capsys.readouterr().out)
    res, out = {"rows": []}, tmp_path / "r.json"
    save = tb.json_saver(res, out, t0)
    res["rows"].append({"ms": 1.0})
    save()
    got = json.loads(out.read_text())
    assert got["rows"] == [{"ms": 1.0}] and set(got) == {"rows", "wall_s"} and got["wall_s"] >= 0
