"""Notebook hygiene, and the headless runner behind ``make run``.

The notebooks themselves are *executed* by nbmake (``--nbmake`` in
pyproject's pytest options collects every ``notebooks/*.ipynb``); this file
checks how they are stored, and that ``tools/run_notebooks.py`` reports
errors, tagged expected exceptions, filters and outputs correctly, on
throwaway notebooks written into ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from tools import run_notebooks as rn

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = rn.find_notebooks(ROOT / "notebooks")


# --------------------------------------------------------------------------- the repository's notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_opens_with_the_tqlab_kernel(path):
    assert rn.kernelspec_problems(path) == []
    assert nbformat.read(str(path), as_version=4).metadata["kernelspec"]["display_name"] == "Python (tqlab)"


def test_kernelspec_check_names_the_generic_kernel_in_both_files(tmp_path):
    path = _write_pair(tmp_path, "01_generic", "# %%\npass\n")
    assert rn.kernelspec_problems(path) == []
    generic = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["kernelspec"] = generic  # what a fresh Jupyter save writes
    nbformat.write(nb, str(path))
    assert rn.kernelspec_problems(path) == [
        f"01_generic.ipynb: metadata kernelspec is {generic!r}, expected {rn.KERNELSPEC!r}"]
    assert rn.main(["--dir", str(tmp_path), "check"]) == 1
    nb.metadata["kernelspec"] = dict(rn.KERNELSPEC)
    nbformat.write(nb, str(path))
    twin = path.with_suffix(".py")
    twin.write_text(twin.read_text().replace("name: tqlab", "name: python3"))
    assert rn.kernelspec_problems(path) == [
        "01_generic.py: jupytext header kernelspec is {'display_name': 'Python (tqlab)', 'language': 'python', "
        f"'name': 'python3'}}, expected {rn.KERNELSPEC!r}"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_clean(path):
    assert rn.clean_problems(path) == [], "run `make sync` (it strips outputs)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_paired_with_an_identical_py_percent_script(path):
    assert rn.pairing_problems(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_named_and_opens_as_the_convention_says(path):
    assert re.fullmatch(r"\d{2}_[a-z0-9_]+", path.stem), f"{path.name}: expected NN_snake_case.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells and nb.cells[0].cell_type == "markdown", "first cell: the header (markdown)"
    params = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one code cell tagged `parameters` (papermill convention)"
    for name in ("DEVICE", "USE_RECORDED"):
        assert re.search(rf"^{name}\s*=", params[0].source, re.M), f"parameters cell must set {name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_reads_like_a_lecture(path):
    """A header (what you learn, what you need, the run time) and at least three "predict, then run"
    cells, each followed by a code cell that checks the prediction with an ``assert``."""
    nb = nbformat.read(str(path), as_version=4)
    head = nb.cells[0].source
    for what, pattern in (("what you learn", r"you will learn"), ("what you need", r"what you need|hardware"),
                          ("the run time", r"run time")):
        assert re.search(pattern, head, re.I), f"{path.name}: the header does not say {what}"
    checked = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and re.search(r"predict, then run", cell.source, re.I):
            code = next((c for c in nb.cells[i + 1:] if c.cell_type == "code"), None)
            checked += code is not None and re.search(r"^\s*assert\b", code.source, re.M) is not None
    assert checked >= 3, f"{path.name}: {checked} predict-then-run cells followed by an assert (want >= 3)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_predict_question_stands_before_its_answer(path):
    assert rn.predict_problems(path) == []


def test_predict_rule_finds_a_question_after_its_answer_and_one_without_an_answer_cell(tmp_path):
    path = _write_pair(tmp_path, "01_predict", """
    # %% [markdown]
    # # Title
    #
    # the **predict, then run** check: a mention, not a question

    # %%
    setup = 1

    # %% [markdown]
    # ## 1 · Good
    #
    # **Predict, then run.** How much?

    # %%
    assert setup == 1

    # %% [markdown]
    # **Predict, then run.** A second question of the section, after the first one's answer.

    # %%
    assert True

    # %% [markdown]
    # ## 2 · Confirm, then read

    # %%
    print("the answer")

    # %% [markdown]
    # **Predict, then run.** What did it print?

    # %%
    assert True

    # %% [markdown]
    # ## 3 · No answer cell
    #
    # **Predict, then run.** Then what?

    # %% [markdown]
    # Some prose.
    """)
    assert rn.predict_problems(path) == [
        "01_predict.ipynb: cell 8 (Predict question in section '2 · Confirm, then read'): code cell(s) [7] of its "
        "section run before the question, so their output may already show the answer; ask the question before them "
        "(or start a new section)",
        "01_predict.ipynb: cell 10 (Predict question in section '3 · No answer cell'): is followed by a markdown cell, "
        "not by the code cell that answers it",
    ]
    assert rn.main(["--dir", str(tmp_path), "check"]) == 1


def test_no_orphan_scripts_in_notebooks_folder():
    assert rn.orphan_scripts(ROOT / "notebooks") == []


# --------------------------------------------------------------------------- helpers for throwaway notebooks
def _write_pair(directory: Path, stem: str, py_percent: str) -> Path:
    """Write <stem>.py (py:percent) and the paired, clean <stem>.ipynb; return the .ipynb."""
    import jupytext

    py = directory / f"{stem}.py"
    py.write_text(textwrap.dedent(py_percent).lstrip(), encoding="utf-8")
    nb = jupytext.read(str(py), fmt="py:percent")
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    nb.metadata["kernelspec"] = dict(rn.KERNELSPEC)
    jupytext.write(nb, str(py), fmt="py:percent")  # the header names the kernel too
    path = directory / f"{stem}.ipynb"
    nbformat.write(nb, str(path))
    return path


OK_NB = """
# %% [markdown]
# # A throwaway notebook

# %%
from pathlib import Path
print(Path("data.txt").read_text().strip())  # relative to the notebook's folder

# %% tags=["raises-exception"]
raise AssertionError("Workspace is locked (expected here)")

# %%
answer = 6 * 7
answer
"""

ERROR_NB = """
# %%
x = 1

# %%
1 / 0

# %%
never_reached = True
"""

QUIET_NB = """
# %% tags=["raises-exception"]
"this was supposed to fail"
"""


@pytest.fixture(scope="module")
def kernel() -> str:
    return rn.resolve_kernel("python3")[0]


@pytest.fixture(scope="module")
def executed(tmp_path_factory, kernel):
    """One `run` over three throwaway notebooks: ok, error, missing-raise."""
    src = tmp_path_factory.mktemp("nbs")
    out = tmp_path_factory.mktemp("build")
    (src / "data.txt").write_text("hello from data.txt\n", encoding="utf-8")
    _write_pair(src, "01_ok", OK_NB)
    _write_pair(src, "02_error", ERROR_NB)
    _write_pair(src, "03_quiet", QUIET_NB)
    rc = rn.main(["--dir", str(src), "run", "--out", str(out), "--kernel", kernel])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    by_name = {r["notebook"]: r for r in summary["results"]}
    return src, out, rc, by_name


# --------------------------------------------------------------------------- runner behaviour
def test_run_exits_1_when_any_notebook_fails(executed):
    _, _, rc, by_name = executed
    assert rc == 1
    assert [by_name[n]["status"] for n in ("01_ok.ipynb", "02_error.ipynb", "03_quiet.ipynb")] == [
        "ok", "error", "missing-raise",
    ]


def test_tagged_exception_is_allowed_and_outputs_are_written(executed):
    src, out, _, by_name = executed
    r = by_name["01_ok.ipynb"]
    assert (r["code_cells"], r["executed_cells"], r["expected_raises"]) == (3, 3, 1)
    nb = nbformat.read(str(out / "01_ok.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"] == "hello from data.txt\n"  # cwd = the notebook's folder
    assert code[1].outputs[0]["output_type"] == "error"
    assert code[1].outputs[0]["ename"] == "AssertionError"
    assert code[2].outputs[0]["data"]["text/plain"] == "42"
    html = (out / "01_ok.html").read_text(encoding="utf-8")
    assert "<html" in html and "hello from data.txt" in html
    # the stored source notebook is untouched
    assert rn.clean_problems(src / "01_ok.ipynb") == []


def test_error_names_the_cell_and_exception_and_keeps_partial_output(executed):
    _, out, _, by_name = executed
    r = by_name["02_error.ipynb"]
    assert r["detail"] == "cell 1: ZeroDivisionError: division by zero"
    assert (r["code_cells"], r["executed_cells"]) == (3, 2)
    assert (out / "02_error.ipynb").exists() and (out / "02_error.html").exists()


def test_tagged_cell_that_does_not_raise_is_a_failure(executed):
    _, _, _, by_name = executed
    assert by_name["03_quiet.ipynb"]["detail"] == "cell(s) [0] tagged 'raises-exception' did not raise"


def test_only_filter_and_no_match(tmp_path, capsys, kernel):
    for stem in ("01_alpha", "02_beta", "03_gamma"):
        _write_pair(tmp_path, stem, "# %%\npass\n")
    names = lambda only: [p.stem for p in rn.find_notebooks(tmp_path, only)]  # noqa: E731
    assert names(None) == ["01_alpha", "02_beta", "03_gamma"]
    assert names("01") == ["01_alpha"]
    assert names("01,03") == ["01_alpha", "03_gamma"]
    assert names("beta") == ["02_beta"]
    assert names(" , ") == ["01_alpha", "02_beta", "03_gamma"]
    assert rn.main(["--dir", str(tmp_path), "run", "--only", "99", "--out", ""]) == 2
    assert "no notebooks matching '99'" in capsys.readouterr().err
    out = tmp_path / "out"
    out.mkdir()
    # a partial run writes its own summary: the full run's summary.json is left alone
    (out / "summary.json").write_text("full run", encoding="utf-8")
    assert rn.main(["--dir", str(tmp_path), "run", "--only", "02", "--out", str(out),
                    "--kernel", kernel, "--no-html"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["02_beta.ipynb", "summary-02.json", "summary.json"]
    assert (out / "summary.json").read_text(encoding="utf-8") == "full run"
    assert [r["notebook"] for r in json.loads((out / "summary-02.json").read_text())["results"]] == ["02_beta.ipynb"]


def test_summary_name_per_selection():
    assert rn.summary_name(None) == rn.summary_name("") == rn.summary_name(" , ") == "summary.json"
    assert rn.summary_name("02") == "summary-02.json"
    assert rn.summary_name("01,03") == "summary-01_03.json"
    assert rn.summary_name(None, ["notebooks/04_x.ipynb"]) == "summary-04_x.json"
    assert rn.summary_name("a/b") == "summary-a-b.json"


@pytest.mark.parametrize("out", ["notebooks", "notebooks/", ".", "notebooks/.."])
def test_run_refuses_an_out_folder_that_is_or_holds_the_stored_notebooks(out, capsys, monkeypatch):
    """``make run NB=07 BUILD=notebooks`` overwrote the stored notebook (issue 22); now nothing runs."""
    monkeypatch.chdir(rn.REPO_ROOT)
    stored = {p: p.read_bytes() for p in rn.NOTEBOOK_DIR.iterdir()}
    assert rn.main(["run", "--only", "07", "--out", out, "--kernel", "no-such-kernel-xyz"]) == 2
    err = capsys.readouterr().err
    how = "is" if Path(out).resolve() == rn.NOTEBOOK_DIR else "holds"
    assert err == (f"error: --out {out} {how} the folder of the stored notebooks ({rn.NOTEBOOK_DIR}): executed "
                   "copies would overwrite them or litter the checkout; use a folder outside it, e.g. --out build\n")
    assert {p: p.read_bytes() for p in rn.NOTEBOOK_DIR.iterdir()} == stored


def test_execute_notebook_never_writes_over_the_stored_file(tmp_path, kernel):
    _write_pair(tmp_path, "01_alpha", "# %%\npass\n")
    nb = tmp_path / "01_alpha.ipynb"
    with pytest.raises(ValueError, match="refusing to write the executed notebook over the stored one"):
        rn.execute_notebook(nb, tmp_path, kernel, 60, html=False)


def test_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="'no-such-kernel-xyz' is not registered"):
        rn.resolve_kernel("no-such-kernel-xyz")


def test_kernel_running_another_interpreter_is_refused(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "elsewhere"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["/opt/some/other/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "elsewhere", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    with pytest.raises(ValueError, match="runs /opt/some/other/python, not this interpreter"):
        rn.resolve_kernel("elsewhere")
    # our prefix was put first, the caller's path kept after it
    assert os.environ["JUPYTER_PATH"].split(os.pathsep) == [
        str(Path(sys.prefix) / "share" / "jupyter"), str(tmp_path)]


def test_kernel_of_this_venv_reached_through_a_linked_folder_is_accepted(tmp_path, monkeypatch):
    """A worktree whose ``.venv`` links to another checkout's venv runs the same interpreter."""
    (tmp_path / "venvlink").symlink_to(Path(sys.executable).absolute().parent, target_is_directory=True)
    spec = tmp_path / "kernels" / "linked"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(tmp_path / "venvlink" / Path(sys.executable).name), "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": "linked", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert rn.resolve_kernel("linked")[0] == "linked"


# --------------------------------------------------------------------------- storage checks
def test_clean_check_finds_outputs_and_strip_removes_them(tmp_path):
    path = _write_pair(tmp_path, "01_dirty", "# %%\nprint(1)\n\n# %%\nx = 2\n")
    assert rn.clean_problems(path) == []
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[0].execution_count = 1
    nb.cells[1].metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    nbformat.write(nb, str(path))
    assert rn.clean_problems(path) == [
        "01_dirty.ipynb: cell 0 has 1 stored output(s)",
        "01_dirty.ipynb: cell 0 has execution_count 1",
        "01_dirty.ipynb: cell 1 has execution timing metadata",
        "01_dirty.ipynb: notebook metadata holds saved widget state",
    ]
    assert rn.main(["--dir", str(tmp_path), "check"]) == 1
    assert rn.strip_notebook(path) is True
    assert rn.strip_notebook(path) is False
    assert rn.clean_problems(path) == []
    assert rn.main(["--dir", str(tmp_path), "check"]) == 0


def test_pairing_check_finds_every_kind_of_drift(tmp_path):
    path = _write_pair(tmp_path, "01_pair", "# %% [markdown]\n# Title\n\n# %%\nx = 1\n")
    assert rn.pairing_problems(path) == []
    twin = path.with_suffix(".py")
    good = twin.read_text(encoding="utf-8")

    twin.write_text(good.replace("x = 1", "x = 2"), encoding="utf-8")
    assert rn.pairing_problems(path) == [
        "01_pair.ipynb: cell 1 source differs from 01_pair.py (run `make sync`)"]

    twin.write_text(good.replace("# %%\nx = 1", '# %% tags=["raises-exception"]\nx = 1'), encoding="utf-8")
    assert rn.pairing_problems(path) == [
        "01_pair.ipynb: cell 1 tags differs from 01_pair.py (run `make sync`)"]

    twin.write_text(good + "\n# %%\ny = 2\n", encoding="utf-8")
    assert rn.pairing_problems(path) == [
        "01_pair.ipynb: 2 cells but 01_pair.py has 3 (run `make sync`)"]

    twin.write_text(good, encoding="utf-8")
    nb = nbformat.read(str(path), as_version=4)
    del nb.metadata["jupytext"]
    nbformat.write(nb, str(path))
    assert rn.pairing_problems(path) == [
        "01_pair.ipynb: metadata jupytext.formats is '', expected 'ipynb,py:percent'"]

    twin.unlink()
    assert rn.pairing_problems(path) == [
        "01_pair.ipynb: paired file 01_pair.py is missing (run `make sync`)"]
    (tmp_path / "02_lonely.py").write_text("# %%\npass\n", encoding="utf-8")
    assert rn.orphan_scripts(tmp_path) == ["02_lonely.py: no paired 02_lonely.ipynb (run `make sync`)"]


def test_sync_pairs_a_new_script_then_follows_edits(tmp_path):
    py = tmp_path / "01_new.py"
    py.write_text("# %% [markdown]\n# New\n\n# %%\nvalue = 1\n", encoding="utf-8")
    assert rn.main(["--dir", str(tmp_path), "sync"]) == 0
    path = tmp_path / "01_new.ipynb"
    assert path.exists()
    assert rn.clean_problems(path) == [] and rn.pairing_problems(path) == []
    # edit the script, make it the newer file, sync again: the notebook follows
    py.write_text(py.read_text(encoding="utf-8").replace("value = 1", "value = 2"), encoding="utf-8")
    stamp = path.stat().st_mtime + 10
    os.utime(py, (stamp, stamp))
    assert rn.main(["--dir", str(tmp_path), "sync"]) == 0
    nb = nbformat.read(str(path), as_version=4)
    assert nb.cells[-1].source == "value = 2"
    assert rn.pairing_problems(path) == [] and rn.clean_problems(path) == []


def test_timeout_and_dead_kernel_are_failures_not_hangs(tmp_path, kernel):
    _write_pair(tmp_path, "01_sleepy", "# %%\nimport time\ntime.sleep(60)\n")
    _write_pair(tmp_path, "02_dies", "# %%\nimport os\nos._exit(3)\n")
    out = tmp_path / "out"
    rc = rn.main(["--dir", str(tmp_path), "run", "--out", str(out), "--kernel", kernel,
                  "--timeout", "2", "--no-html"])
    assert rc == 1
    results = json.loads((out / "summary.json").read_text(encoding="utf-8"))["results"]
    assert [(r["notebook"], r["status"]) for r in results] == [
        ("01_sleepy.ipynb", "timeout"), ("02_dies.ipynb", "crash")]
    assert results[1]["detail"].startswith("kernel died")


def test_site_uses_an_executed_copy_only_when_it_is_present_current_and_ok(tmp_path):
    """tools/build_site.py renders build/'s executed notebooks: a missing, stale or failed copy is refused by name."""
    from tools import build_site

    stored = _write_pair(tmp_path, "01_site", "# %% [markdown]\n# # T\n\n# %%\nx = 1\n")
    executed = tmp_path / "build" / stored.name
    assert build_site.notebook_problem(stored, executed) == "missing"
    executed.parent.mkdir()
    nb = nbformat.read(str(stored), as_version=4)
    nbformat.write(nb, str(executed))
    assert build_site.notebook_problem(stored, executed) == "not fully executed"
    nb.cells[1].execution_count = 1
    nbformat.write(nb, str(executed))
    assert build_site.notebook_problem(stored, executed) is None
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])]
    nbformat.write(nb, str(executed))
    assert build_site.notebook_problem(stored, executed) == "failed at cell 1: ValueError: bad"
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, str(executed))
    assert build_site.notebook_problem(stored, executed) == "stale (the stored notebook changed after it was executed)"


def test_site_refuses_a_widget_bundle_whose_hash_is_not_the_pinned_one(tmp_path):
    """The html-manager tarball is checked against the registry's sha512 before any file of it is served."""
    import io
    import tarfile

    from tools import build_site

    tgz = tmp_path / "html-manager-1.0.15.tgz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"not the real embed.js"
        info = tarfile.TarInfo("package/dist/embed.js")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tgz.write_bytes(buf.getvalue())
    with pytest.raises(RuntimeError, match="sha512 .* is not the pinned"):
        build_site.fetch_html_manager(tmp_path)
    assert not tgz.exists() and not (tmp_path / "embed.js").exists()
