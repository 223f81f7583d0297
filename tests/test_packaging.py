"""Packaging contract: pyproject.toml, environment.yml, Makefile and .ci/run agree.

- environment.yml (conda) lists exactly the dependencies of pyproject.toml
  (core + ``notebooks`` + ``test`` extras): same names, same version specifiers.
- the console script is ``tqlab = tqlab.cli:app`` and ``python -m tqlab`` works.
- importing tqlab (every module of it) never imports vllm and works without CUDA.
- the Makefile installs a pinned torch before the editable install, and its
  ``test`` target fails when pytest collects no test (pytest exit status 5).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the `test` extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("notebooks", "test")
# conda-forge package name -> PyPI distribution name, where they differ
CONDA_TO_PYPI = {"pytorch": "torch"}
CONDA_ONLY = {"python", "pip"}
# Modules under tqlab/ that hold GPU kernels may import these at module level;
# `import tqlab` itself and every other module must import without them.
OPTIONAL_GPU_DEPS = {"triton"}


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def _environment() -> dict:
    with open(ROOT / "environment.yml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _spec(text: str) -> str:
    """Canonical text of a specifier set (sorted, no spaces)."""
    return ",".join(sorted(str(s) for s in SpecifierSet(text)))


def pyproject_requirements() -> dict[str, str]:
    project = _pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    out: dict[str, str] = {}
    for line in reqs:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in out, f"{req.name} listed twice in pyproject.toml"
        out[name] = _spec(str(req.specifier))
    return out


_CONDA_SPEC = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*((?:[<>=!~].*)?)$")


def conda_requirements() -> tuple[dict[str, str], list[str]]:
    """(name -> specifier, pip section) of environment.yml."""
    out: dict[str, str] = {}
    pip_section: list[str] = []
    for dep in _environment()["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"unexpected mapping in environment.yml: {dep}"
            pip_section = list(dep["pip"])
            continue
        match = _CONDA_SPEC.match(str(dep))
        assert match, f"environment.yml entry {dep!r} is not 'name' or 'name<op><version>'"
        name, spec = match.groups()
        assert not re.match(r"^=[^=]", spec), f"{dep!r}: use PEP 440 operators (conda '=' is fuzzy)"
        name = canonicalize_name(CONDA_TO_PYPI.get(name, name))
        assert name not in out, f"{name} listed twice in environment.yml"
        out[name] = _spec(spec)
    return out, pip_section


def test_environment_yml_lists_exactly_the_pyproject_dependencies():
    pip_side = pyproject_requirements()
    conda, _ = conda_requirements()
    conda_side = {k: v for k, v in conda.items() if k not in CONDA_ONLY}
    only_pip = {k: v for k, v in pip_side.items() if k not in conda_side}
    only_conda = {k: v for k, v in conda_side.items() if k not in pip_side}
    differ = {k: (pip_side[k], conda_side[k]) for k in pip_side.keys() & conda_side.keys()
              if pip_side[k] != conda_side[k]}
    assert not only_pip, f"in pyproject.toml only: {only_pip}"
    assert not only_conda, f"in environment.yml only: {only_conda}"
    assert not differ, f"specifiers differ (pyproject, environment.yml): {differ}"
    assert pip_side == conda_side


def test_python_requirement_is_the_same_everywhere_and_holds_here():
    requires = _pyproject()["project"]["requires-python"]
    conda, _ = conda_requirements()
    assert _spec(requires) == conda["python"] == ">=3.10"
    assert SpecifierSet(requires).contains(".".join(map(str, sys.version_info[:3])))


def test_conda_env_installs_this_checkout_and_nothing_else_through_pip():
    _, pip_section = conda_requirements()
    assert pip_section == ["-e ."]


def test_torch_requirement_and_makefile_pin_agree():
    reqs = pyproject_requirements()
    assert reqs["torch"] == ">=2.6"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pin = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", makefile, re.M)
    assert pin, "Makefile must pin torch with `TORCH_SPEC ?= torch==X.Y.Z`"
    assert SpecifierSet(reqs["torch"]).contains(pin.group(1))
    # torch first, explicitly, then the editable install (which then finds torch satisfied)
    torch_line = makefile.index("install --progress-bar off $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'")
    editable_line = makefile.index("install --progress-bar off -e '.[notebooks,test]'")
    assert torch_line < editable_line


def test_console_script_is_declared():
    assert _pyproject()["project"]["scripts"] == {"tqlab": "tqlab.cli:app"}


def test_installed_metadata_matches_the_source_tree():
    import tqlab

    try:
        dist = importlib.metadata.distribution("tqlab")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("tqlab is not installed: run `make setup` (or `pip install -e .`)")
    assert dist.version == tqlab.__version__
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"tqlab": "tqlab.cli:app"}
    requires = {canonicalize_name(Requirement(r).name) for r in dist.requires or []}
    assert set(pyproject_requirements()) <= requires
    # the editable install points at this checkout, not at a copy
    assert Path(tqlab.__file__).resolve().parent == ROOT / "tqlab"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(extra)
    return env


def test_importing_every_tqlab_module_never_imports_vllm_and_needs_no_cuda():
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import tqlab
        names = ["tqlab"]
        for info in pkgutil.walk_packages(tqlab.__path__, "tqlab."):
            if info.name.split(".")[-1] == "__main__":
                continue  # running the CLI is not importing the package
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as exc:
                # a GPU-only kernel module may need its GPU toolchain; nothing else may be missing
                if exc.name not in OPTIONAL_GPU_DEPS:
                    raise
                print(f"{info.name}: needs {exc.name} (GPU-only, optional)")
                continue
            names.append(info.name)
        leaked = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
        assert not leaked, f"vllm imported: {leaked}"
        if "torch" in sys.modules:
            import torch
            assert not torch.cuda.is_initialized(), "importing tqlab initialised CUDA"
        print(len(names), "modules imported")
        """
    )
    script = f"OPTIONAL_GPU_DEPS = {sorted(OPTIONAL_GPU_DEPS)!r}\n" + script
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_clean_env(CUDA_VISIBLE_DEVICES=""),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "modules imported" in proc.stdout


@pytest.mark.parametrize("how", ["python -m tqlab", "console script"])
def test_cli_entry_points_answer_help(how):
    if how == "python -m tqlab":
        cmd = [sys.executable, "-m", "tqlab", "--help"]
    else:
        script = Path(sys.executable).parent / "tqlab"
        assert script.exists(), f"console script {script} missing: reinstall (`make setup`)"
        cmd = [str(script), "--help"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "repro" in proc.stdout and "plan" in proc.stdout


def test_make_test_fails_when_pytest_collects_nothing(tmp_path):
    """pytest exit status 5 (no tests) must fail `make test`, hence `.ci/run`."""
    stamp = ".venv/.tqlab-setup-done"
    proc = subprocess.run(
        [
            "make", "--no-print-directory", "-o", stamp, "test",
            f"PY={sys.executable}",
            "PYTEST_ARGS=-p no:cacheprovider -k zzz_matches_no_test tests/test_packaging.py",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_clean_env(),
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "pytest collected no tests" in out, out


def test_ci_script_runs_make_test_strictly():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert re.search(r"^make test\b", script, re.M) or re.search(r"\bmake\b.*\btest\b", script)
    syntax = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def _readme_arrows() -> set[tuple[str, str]]:
    """``(from, to)`` of every arrow in README.md's mermaid diagram (node ids: package names, ``nb``)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```mermaid", 1)[1].split("```", 1)[0]
    arrows = set()
    for line in block.splitlines():
        if "-->" not in line:
            continue
        src, dst = line.split("-->", 1)
        src_id = src.strip().split("[", 1)[0]
        for d in dst.split("&"):
            arrows.add((src_id, d.strip().split("[", 1)[0]))
    return arrows


def _real_arrows() -> set[tuple[str, str]]:
    """Package-level imports between tqlab's first-level packages, and from the notebooks (``nb``)."""
    import ast

    import grimp

    def pkg(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "tqlab"

    graph = grimp.build_graph("tqlab")
    real = {(pkg(m), pkg(i)) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)}
    real = {(a, b) for a, b in real if a != b and a != "__main__"}
    for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"):
        for node in ast.walk(ast.parse(nb.read_text())):
            names = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            real |= {("nb", pkg(n)) for n in names if n.startswith("tqlab.")}
    return real


def test_readme_diagram_names_exactly_the_real_imports():
    """Every arrow of README.md's diagram is a real import, and every real arrow is drawn (issue 18)."""
    drawn, real = _readme_arrows(), _real_arrows()
    assert drawn - real == set(), f"arrows drawn that no import makes: {sorted(drawn - real)}"
    assert real - drawn == set(), f"imports the diagram does not draw: {sorted(real - drawn)}"
