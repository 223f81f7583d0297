#!/usr/bin/env python3
"""Execute, check and tidy tqlab's notebooks (the engine behind ``make run``).

Sub-commands::

    run   [--out build] [--only 01,03] [--kernel NAME] [--timeout S] [--no-html] [NOTEBOOK ...]
          Execute every notebooks/*.ipynb headless with nbclient (working
          directory = the notebook's folder, as in JupyterLab), write the executed
          notebook and an HTML rendering into --out, print a table of status and
          seconds per notebook, write <out>/summary.json (summary-<selection>.json
          for --only / explicit notebooks).  Exit status 1 when any
          notebook failed, 2 when nothing matched or --out is or holds the
          stored notebooks' folder (checked before anything runs).
    check Notebooks stored clean (no outputs, no execution counts, no saved
          widget state or execution timestamps), each paired with a jupytext
          py:percent file whose cells (type, source, tags) are identical, and
          both opening with the "Python (tqlab)" kernel (KERNELSPEC); and every
          Predict question asked before the cell that answers it (the Predict
          rule, below). Every violation is listed, one line each.
    strip Remove outputs / execution counts / widget state in place.
    sync  ``jupytext --sync`` every pair (the newer file wins), then strip.

Failure statuses of ``run``:
    error           a cell raised (cells tagged ``raises-exception`` may raise)
    missing-raise   a cell tagged ``raises-exception`` finished without raising,
                    i.e. the failure the notebook demonstrates no longer happens
    timeout         a cell ran longer than --timeout seconds
    crash           the kernel died or could not start

The Predict rule (``predict_problems``), decided on the stored cells alone:
    A *question* is a markdown cell with a paragraph that opens with
    ``**Predict, then run.**`` (exactly that bold text at the start of a line;
    a passing mention such as "the **predict, then run** check" is not one).
    Its *section* starts at the nearest markdown cell at or above it that holds
    a heading line (``#`` ... ``######``). Then:
    1. the cell right after the question is a code cell: the one whose output
       answers it (nothing else runs between the question and its answer);
    2. no code cell of the question's section runs before the question, except
       the answer cell of an earlier question of the same section: any other
       code cell there prints its output before the student is asked, and the
       output may already show the asked-for value ("confirm, then read").
    What the rule cannot decide: whether an earlier section's output already
    shows the value, and whether the answer cell's output answers the question.

Tests import the helper functions (``find_notebooks``, ``clean_problems``,
``pairing_problems``, ``execute_notebook``, ``main``) directly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
RAISES_TAG = "raises-exception"
PAIRED_FORMAT = "py:percent"
#: The kernel every notebook opens with: the one ``make setup`` registers (Makefile
#: KERNEL_NAME / KERNEL_DISPLAY, named in the README), not the generic "Python 3 (ipykernel)".
KERNELSPEC = {"display_name": "Python (tqlab)", "language": "python", "name": "tqlab"}
FAILED_STATUSES = ("error", "missing-raise", "timeout", "crash")


# --------------------------------------------------------------------------- discovery
def find_notebooks(directory: Path = NOTEBOOK_DIR, only: str | None = None) -> list[Path]:
    """Sorted ``*.ipynb`` files of ``directory`` (not recursive, no checkpoints).

    ``only`` is a comma-separated list of tokens; a notebook is kept when its
    file stem starts with, or contains, one of them (``"01"``, ``"01,03"``,
    ``"reproduce"``).  Empty tokens are ignored; no token at all keeps every
    notebook.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = sorted(p for p in directory.glob("*.ipynb") if p.is_file())
    if only:
        tokens = [t.strip() for t in only.split(",") if t.strip()]
        if tokens:
            found = [p for p in found if any(p.stem.startswith(t) or t in p.stem for t in tokens)]
    return found


def _tags(cell) -> list[str]:
    return sorted(cell.get("metadata", {}).get("tags", []) or [])


# --------------------------------------------------------------------------- checks
def clean_problems(path: Path) -> list[str]:
    """Reasons why the stored notebook ``path`` is not clean ([] when clean).

    Clean = every code cell has no outputs and ``execution_count`` null, no
    cell carries nbclient's ``execution`` timing metadata, and the notebook
    metadata holds no saved widget state.
    """
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if cell.get("outputs"):
                problems.append(f"{path.name}: cell {i} has {len(cell.outputs)} stored output(s)")
            if cell.get("execution_count") is not None:
                problems.append(f"{path.name}: cell {i} has execution_count {cell.execution_count}")
        if "execution" in cell.get("metadata", {}):
            problems.append(f"{path.name}: cell {i} has execution timing metadata")
    if "widgets" in nb.metadata:
        problems.append(f"{path.name}: notebook metadata holds saved widget state")
    return problems


def pairing_problems(path: Path) -> list[str]:
    """Reasons why ``path`` (.ipynb) and its jupytext ``py:percent`` twin differ.

    Checks that the twin ``<stem>.py`` exists, that the notebook metadata
    declares the pairing (``jupytext.formats`` holds ``ipynb`` and
    ``py:percent``, so ``make sync`` works), and that both hold the same cells
    in the same order: same cell type, same source, same tags.
    """
    import jupytext
    import nbformat

    path = Path(path)
    twin = path.with_suffix(".py")
    if not twin.exists():
        return [f"{path.name}: paired file {twin.name} is missing (run `make sync`)"]
    nb = nbformat.read(str(path), as_version=4)
    problems = []
    formats = str(nb.metadata.get("jupytext", {}).get("formats", ""))
    declared = {f.split(":")[0] if f.startswith("ipynb") else f for f in formats.split(",") if f}
    if "ipynb" not in declared or PAIRED_FORMAT not in declared:
        problems.append(
            f"{path.name}: metadata jupytext.formats is {formats!r}, expected 'ipynb,{PAIRED_FORMAT}'"
        )
    text_nb = jupytext.read(str(twin), fmt=PAIRED_FORMAT)
    a = [(c.cell_type, c.source, _tags(c)) for c in nb.cells]
    b = [(c.cell_type, c.source, _tags(c)) for c in text_nb.cells]
    if len(a) != len(b):
        problems.append(f"{path.name}: {len(a)} cells but {twin.name} has {len(b)} (run `make sync`)")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            what = "type" if x[0] != y[0] else "source" if x[1] != y[1] else "tags"
            problems.append(f"{path.name}: cell {i} {what} differs from {twin.name} (run `make sync`)")
            break
    return problems


PREDICT_PROMPT = re.compile(r"^\*\*Predict, then run\.\*\*", re.MULTILINE)
HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)


def predict_problems(path: Path) -> list[str]:
    """Where ``path`` (.ipynb) asks a Predict question after, or apart from, its answer ([] when none).

    The rule is the module docstring's "Predict rule"; one line per violation, naming the
    question's cell, its section's heading and the offending cell (indices count every cell from 0).
    """
    import nbformat

    cells = nbformat.read(str(path), as_version=4).cells
    questions = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and PREDICT_PROMPT.search(c.source)]
    problems = []
    for i in questions:
        start = next((k for k in range(i, -1, -1) if cells[k].cell_type == "markdown" and HEADING.search(cells[k].source)), 0)
        has_heading = start or HEADING.search(cells[0].source)
        heading = HEADING.split(cells[start].source, 1)[-1].splitlines()[0].strip() if has_heading else "(no heading)"
        where = f"{path.name}: cell {i} (Predict question in section {heading!r})"
        if i + 1 >= len(cells) or cells[i + 1].cell_type != "code":
            what = "the end of the notebook" if i + 1 >= len(cells) else f"a {cells[i + 1].cell_type} cell"
            problems.append(f"{where}: is followed by {what}, not by the code cell that answers it")
        early = [k for k in range(start, i) if cells[k].cell_type == "code" and (k - 1) not in questions]
        if early:
            problems.append(f"{where}: code cell(s) {early} of its section run before the question, so their output "
                            "may already show the answer; ask the question before them (or start a new section)")
    return problems


def kernelspec_problems(path: Path) -> list[str]:
    """Reasons why ``path`` (.ipynb) or its py:percent twin's header does not name :data:`KERNELSPEC`."""
    import jupytext
    import nbformat

    path = Path(path)
    problems = []
    spec = dict(nbformat.read(str(path), as_version=4).metadata.get("kernelspec", {}))
    if spec != KERNELSPEC:
        problems.append(f"{path.name}: metadata kernelspec is {spec!r}, expected {KERNELSPEC!r}")
    twin = path.with_suffix(".py")
    if twin.exists():
        twin_spec = dict(jupytext.read(str(twin), fmt=PAIRED_FORMAT).metadata.get("kernelspec", {}))
        if twin_spec != KERNELSPEC:
            problems.append(f"{twin.name}: jupytext header kernelspec is {twin_spec!r}, expected {KERNELSPEC!r}")
    return problems


def orphan_scripts(directory: Path = NOTEBOOK_DIR) -> list[str]:
    """``*.py`` files in ``directory`` without an ``.ipynb`` twin."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [
        f"{p.name}: no paired {p.stem}.ipynb (run `make sync`)"
        for p in sorted(directory.glob("*.py"))
        if not p.with_suffix(".ipynb").exists()
    ]


# --------------------------------------------------------------------------- kernel
def use_interpreter_kernelspecs() -> None:
    """Make this interpreter's prefix the first place Jupyter looks for kernels.

    A kernel registered with ``--user`` (e.g. by another checkout) would
    otherwise shadow the one registered inside this venv with ``--sys-prefix``.
    """
    mine = str(Path(sys.prefix) / "share" / "jupyter")
    parts = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if not parts or parts[0] != mine:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([mine] + [p for p in parts if p != mine])


def _venv_interpreter(exe: str) -> Path:
    """``exe`` with its folder's symlinks resolved but not the file's own: a venv reached through a linked
    folder (``wt/.venv -> main/.venv``) is the same environment, while ``.venv/bin/python`` (itself a link
    to the system Python) stays distinct from the system interpreter."""
    path = Path(exe).absolute()
    return path.parent.resolve() / path.name


def resolve_kernel(name: str) -> tuple[str, str]:
    """Return ``(name, interpreter)`` of kernel ``name``; check it is this Python.

    Raises ``ValueError`` when the kernel is unknown or launches another
    interpreter than ``sys.executable`` (the notebook would then run without
    this environment's tqlab/torch).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    use_interpreter_kernelspecs()
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise ValueError(
            f"Jupyter kernel {name!r} is not registered for {sys.executable}; run `make setup` "
            f"or `python -m ipykernel install --sys-prefix --name {name}`"
        ) from None
    exe = spec.argv[0]
    if exe in {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}:
        exe = sys.executable  # jupyter_client substitutes the running interpreter
    if _venv_interpreter(exe) != _venv_interpreter(sys.executable):
        raise ValueError(
            f"Jupyter kernel {name!r} runs {exe}, not this interpreter {sys.executable}; "
            f"re-register it (`make setup` after removing {Path(sys.prefix) / '.tqlab-setup-done'}) "
            "or pass --kernel python3"
        )
    return name, exe


# --------------------------------------------------------------------------- execution
@dataclass
class NotebookResult:
    """Outcome of one headless execution (``seconds`` = wall time incl. kernel start)."""

    notebook: str
    status: str  # ok | error | missing-raise | timeout | crash
    seconds: float
    code_cells: int
    executed_cells: int = 0
    detail: str = ""
    executed_path: str | None = None
    html_path: str | None = None
    expected_raises: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES


def _first_error(nb) -> tuple[int, str] | None:
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or RAISES_TAG in _tags(cell):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return i, f"{out.get('ename', '?')}: {out.get('evalue', '')}".strip()
    return None


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run_cells(nb, cwd: Path, kernel_name: str, timeout: int) -> tuple[str, str]:
    """Execute ``nb`` in place; return ``(status, detail)`` (status ok/error/timeout/crash)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    # Default transport (loopback TCP). IPC sockets were tried: with them
    # nbclient misses both cell timeouts and dead kernels and hangs. The
    # kernel's own log is cut to errors (it warns about plain TCP at every start).
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            resources={"metadata": {"path": str(cwd)}},
            allow_errors=False,
            record_timing=True,
        ).execute()
    except CellTimeoutError:
        return "timeout", f"a cell ran longer than the per-cell limit of {timeout} s"
    except DeadKernelError as exc:
        return "crash", _one_line(f"kernel died: {exc}")
    except CellExecutionError:
        return "error", ""
    except Exception as exc:  # kernel start failures, nbclient internals
        return "crash", _one_line(f"{type(exc).__name__}: {exc}")
    return "ok", ""


def execute_notebook(
    path: Path,
    out_dir: Path | None = None,
    kernel_name: str = "python3",
    timeout: int = 300,
    html: bool = True,
) -> NotebookResult:
    """Execute ``path`` headless and return its :class:`NotebookResult`.

    The stored notebook is never modified.  When ``out_dir`` is given the
    executed notebook (``<out_dir>/<name>.ipynb``) and, with ``html``, its
    HTML rendering (``<name>.html``) are written there, also after a failure
    (up to the failing cell).  ``timeout`` is per cell, in seconds.
    """
    import nbformat

    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    expected = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and RAISES_TAG in _tags(c)]
    t0 = time.perf_counter()
    status, detail = _run_cells(nb, path.parent.resolve(), kernel_name, timeout)
    seconds = time.perf_counter() - t0

    executed = sum(1 for c in code if c.get("execution_count") is not None)
    err = _first_error(nb)
    if err is not None and status in ("ok", "error"):
        status, detail = "error", _one_line(f"cell {err[0]}: {err[1]}")
    elif status == "error":
        detail = "a cell raised (see the executed notebook)"
    if status == "ok":
        quiet = [
            i for i in expected
            if not any(o.get("output_type") == "error" for o in nb.cells[i].get("outputs", []))
        ]
        if quiet:
            status = "missing-raise"
            detail = f"cell(s) {quiet} tagged {RAISES_TAG!r} did not raise"

    result = NotebookResult(
        notebook=path.name,
        status=status,
        seconds=round(seconds, 2),
        code_cells=len(code),
        executed_cells=executed,
        detail=detail,
        expected_raises=len(expected),
    )
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / path.name
        if target.resolve() == path.resolve():
            raise ValueError(f"refusing to write the executed notebook over the stored one: {path}")
        nbformat.write(nb, str(target))
        result.executed_path = str(target)
        if html:
            try:
                from nbconvert import HTMLExporter

                body, _ = HTMLExporter().from_notebook_node(nb)
                html_target = target.with_suffix(".html")
                html_target.write_text(body, encoding="utf-8")
                result.html_path = str(html_target)
            except Exception as exc:  # an HTML failure is a failure too, not a silent skip
                result.notes.append(f"HTML export failed: {type(exc).__name__}: {exc}")
                if result.status == "ok":
                    result.status, result.detail = "crash", _one_line(result.notes[-1])
    return result


# --------------------------------------------------------------------------- reporting
def _print_table(results: list[NotebookResult], kernel: str, out_dir: Path | None) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain fallback, rich is a core dependency though
        for r in results:
            print(f"{r.notebook:45s} {r.status:14s} {r.seconds:8.1f}s {r.detail}")
        return
    colour = {"ok": "green"}
    table = Table(title=f"notebooks (kernel {kernel}{', into ' + str(out_dir) if out_dir else ''})")
    table.add_column("notebook")
    table.add_column("status")
    table.add_column("seconds", justify="right")
    table.add_column("cells", justify="right")
    table.add_column("detail", overflow="fold")
    for r in results:
        table.add_row(
            r.notebook,
            f"[{colour.get(r.status, 'red')}]{r.status}[/]",
            f"{r.seconds:.1f}",
            f"{r.executed_cells}/{r.code_cells}",
            r.detail,
        )
    console = Console(width=max(100, Console().width))
    console.print(table)


def out_dir_problem(out_dir: str | Path, notebooks: list[Path]) -> str | None:
    """Why ``out_dir`` must not receive executed copies of ``notebooks``, or None.

    Refused: the folder of a stored notebook itself (the executed copy would
    overwrite it, as ``make run BUILD=notebooks`` once did) and a folder that
    holds it (``--out .`` from the notebooks' parent). A folder inside it
    (``notebooks/build``, git-ignored) is allowed.
    """
    out = Path(out_dir).resolve()
    for folder in sorted({p.resolve().parent for p in notebooks} | {NOTEBOOK_DIR.resolve()}):
        if out == folder or out in folder.parents:
            how = "is" if out == folder else "holds"
            return (f"--out {out_dir} {how} the folder of the stored notebooks ({folder}): executed copies would "
                    f"overwrite them or litter the checkout; use a folder outside it, e.g. --out build")
    return None


def summary_name(only: str | None, notebooks: list[str] | None = None) -> str:
    """``summary.json`` for a full run; ``summary-<selection>.json`` for ``--only`` / explicit notebooks.

    A partial run (``make run NB=02``) must not overwrite the full run's summary.
    """
    picked = [Path(n).stem for n in notebooks or []] or [x.strip() for x in (only or "").split(",") if x.strip()]
    if not picked:
        return "summary.json"
    slug = "_".join("".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in x) for x in picked)
    return f"summary-{slug[:80]}.json"


def cmd_run(args) -> int:
    if args.notebooks:
        paths = [Path(p) for p in args.notebooks]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        paths = find_notebooks(Path(args.dir), args.only)
    if not paths:
        available = ", ".join(p.name for p in find_notebooks(Path(args.dir))) or "none"
        what = f"matching {args.only!r} " if args.only else ""
        print(f"error: no notebooks {what}in {args.dir} (available: {available})", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else None
    problem = out_dir_problem(args.out, paths) if out_dir is not None else None
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        kernel, exe = resolve_kernel(args.kernel)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"executing {len(paths)} notebook(s) with kernel {kernel!r} ({exe})", flush=True)
    results = []
    for i, p in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {p.name}", flush=True)
        r = execute_notebook(p, out_dir, kernel, args.timeout, html=not args.no_html)
        print(f"      {r.status} in {r.seconds:.1f} s{': ' + r.detail if r.detail else ''}", flush=True)
        results.append(r)
    _print_table(results, kernel, out_dir)
    failed = [r for r in results if r.failed]
    total = sum(r.seconds for r in results)
    print(f"{len(results)} notebook(s): {len(results) - len(failed)} ok, {len(failed)} failed, {total:.1f} s")
    if out_dir is not None:
        summary = {
            "kernel": kernel,
            "python": sys.version.split()[0],
            "total_seconds": round(total, 2),
            "results": [asdict(r) for r in results],
        }
        name = summary_name(args.only, args.notebooks)
        (out_dir / name).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"summary: {out_dir / name}")
    return 1 if failed else 0


def cmd_check(args) -> int:
    directory = Path(args.dir)
    paths = find_notebooks(directory)
    problems = orphan_scripts(directory)
    for p in paths:
        problems += clean_problems(p) + pairing_problems(p) + kernelspec_problems(p) + predict_problems(p)
    for line in problems:
        print(line)
    print(f"checked {len(paths)} notebook(s): {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def strip_notebook(path: Path) -> bool:
    """Clear outputs, execution counts, timing metadata and widget state in place.

    Returns True when the file changed.
    """
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    before = nbformat.writes(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    after = nbformat.writes(nb)
    if after != before:
        nbformat.write(nb, str(path))
        return True
    return False


def cmd_strip(args) -> int:
    paths = [Path(p) for p in args.notebooks] or find_notebooks(Path(args.dir))
    for p in paths:
        if strip_notebook(p):
            print(f"stripped {p.name}")
    return 0


def cmd_sync(args) -> int:
    directory = Path(args.dir)
    targets = sorted({p.with_suffix(".ipynb") if p.with_suffix(".ipynb").exists() else p
                      for p in list(directory.glob("*.ipynb")) + list(directory.glob("*.py"))})
    if not targets:
        print(f"no notebooks in {directory}")
        return 0
    jupytext = [sys.executable, "-m", "jupytext"]
    rc = 0
    for t in targets:
        if t.suffix == ".py":  # a new notebook written as a script: pair it, create the .ipynb
            cmd = jupytext + ["--set-formats", f"ipynb,{PAIRED_FORMAT}", str(t)]
        else:
            cmd = jupytext + ["--sync", str(t)]
        rc |= subprocess.call(cmd)
    for p in find_notebooks(directory):
        if strip_notebook(p):
            print(f"stripped {p.name}")
    return 1 if rc else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=str(NOTEBOOK_DIR), help="notebook folder (default: notebooks/)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute notebooks headless")
    run.add_argument("notebooks", nargs="*", help="explicit notebook paths (default: all in --dir)")
    run.add_argument("--out", default=str(REPO_ROOT / "build"), help="output folder ('' = write nothing)")
    run.add_argument("--only", default=None, help="comma-separated name prefixes/substrings, e.g. 01,03")
    run.add_argument("--kernel", default="python3", help="Jupyter kernel name (must run this interpreter)")
    run.add_argument("--timeout", type=int, default=300, help="per-cell timeout in seconds")
    run.add_argument("--no-html", action="store_true", help="skip the HTML rendering")
    run.set_defaults(func=cmd_run)
    sub.add_parser("check", help="stored clean + paired .py in sync").set_defaults(func=cmd_check)
    strip = sub.add_parser("strip", help="clear outputs in place")
    strip.add_argument("notebooks", nargs="*")
    strip.set_defaults(func=cmd_strip)
    sub.add_parser("sync", help="jupytext --sync all pairs, then strip").set_defaults(func=cmd_sync)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
