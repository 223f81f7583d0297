"""parity/check_entry_point.py, the check parity/install.sh and the plugin parity test use (issue 33: the
old check passed only because the repository root, with its tqlab.egg-info, was on ``sys.path``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parent.parent / "parity" / "check_entry_point.py"
OLD_CHECK = ("import sys; from importlib.metadata import entry_points as e; "
             "sys.exit(not [p for p in e(group='vllm.general_plugins') if p.name == 'tqlab_trace'])")


def test_an_egg_info_in_the_working_folder_does_not_pass_for_an_install(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    repo = tmp_path / "repo"
    egg = repo / "tqlab.egg-info"  # what an editable install into another venv leaves in the repository root
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tqlab\nVersion: 0.1.0\n")
    (egg / "entry_points.txt").write_text("[vllm.general_plugins]\ntqlab_trace = tqlab.vllm_plugin:register\n")
    fooled = subprocess.run([py, "-c", OLD_CHECK], cwd=repo, timeout=60)
    assert fooled.returncode == 0  # the old check, run from the repository root, finds the entry point
    away = tmp_path / "away"
    away.mkdir()
    out = subprocess.run([py, "-I", str(CHECK)], cwd=away, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (
        1, f"tqlab's vllm.general_plugins entry point 'tqlab_trace' is not installed in {venv}")
    out = subprocess.run([py, "-I", str(CHECK)], cwd=repo, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1  # isolated: the working folder is not on sys.path, wherever it is


def test_the_check_refuses_to_run_unisolated(tmp_path):
    out = subprocess.run([sys.executable, str(CHECK)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "python -I" in out.stdout
