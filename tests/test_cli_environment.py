"""The plugin recipe (README): ``pip install --no-deps`` of tqlab into vLLM's environment. vLLM 0.33 requires
torch, numpy and tqdm itself; click and rich come through fastapi[standard] / uvicorn / huggingface_hub, and
matplotlib not at all. These run tqlab in a fresh interpreter where a module is made unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_RUN = """
import importlib.abc, runpy, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["tqlab", *sys.argv[2:]]
runpy.run_module("tqlab", run_name="__main__")
"""


def _tqlab(blocked: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RUN, blocked, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.parametrize("blocked, named", [("click", "click"), ("rich", "rich"), ("click,rich", "click and rich")])
def test_without_click_or_rich_tqlab_says_what_to_add_in_one_line(blocked, named):
    r = _tqlab(blocked, "--help")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (f"tqlab's command line needs {named}, which this environment lacks: pip install "
                                "'click>=8.1' 'rich>=13.0' (pure Python; they leave torch and vLLM as they are)")


@pytest.mark.parametrize("args, code", [
    (["--help"], 0),
    (["presets"], 0),
    (["plan", "--preset", "nemotron-3-super-120b-a12b"], 3),
    (["trace-report", "data/trace_two_ranks", "--preset", "nemotron-3-super-120b-a12b", "--args",
      "vllm serve nvidia/NVIDIA-Nemotron-3-Super-120B-A12B --tensor-parallel-size 2"], 0),
])
def test_the_command_line_needs_no_matplotlib(args, code):
    """vLLM 0.33 does not require matplotlib: the commands a traced deployment needs run without it."""
    r = _tqlab("matplotlib", *args)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr


def test_the_plugin_and_the_recorder_need_only_what_vllm_requires():
    code = ("import importlib.abc, sys\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('click', 'rich', 'matplotlib'):\n"
            "            raise ModuleNotFoundError(name, name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import tqlab.vllm_plugin as p, tqlab.vllm.trace_record\n"
            "p.register()\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr
