#!/usr/bin/env python3
"""Build tqlab's static site from the executed notebooks (the engine behind ``make site``).

Usage::

    python tools/build_site.py [--executed build] [--out build/site] [--execute-missing --kernel tqlab]

Steps, each failing with one clear line:

1. **Executed notebooks.** For every stored ``notebooks/NN_*.ipynb`` the executed copy
   ``<executed>/NN_*.ipynb`` written by ``make run`` must exist, hold the same cells (type and
   source: a copy executed before the notebook was edited is *stale*) and show no error output
   outside cells tagged ``raises-exception``. With ``--execute-missing`` the missing and stale ones
   are executed now (``tools/run_notebooks.py``'s :func:`execute_notebook`, same kernel rules as
   ``make run``); without it the build stops and names them.
2. **Widgets' JavaScript.** ``@jupyter-widgets/html-manager`` (the renderer ipywidgets documents
   for embedding saved widget state) is fetched once from the npm registry as the pinned tarball
   :data:`HTML_MANAGER`, its sha512 checked against the registry's integrity value, and its
   standalone ``dist/embed.js`` (plus its licence) served from the site's ``_static/``: the
   widgets render offline, with no CDN.
3. **Sphinx + MyST-NB** (the ``site`` extra of pyproject.toml): ``docs/`` (``conf.py``,
   ``index.md``), the Markdown pages of ``notebooks/`` (:data:`TEXT_PAGES`: the glossary the notebooks link)
   and the executed notebooks are copied into ``<out>/src`` and rendered to
   ``<out>/html`` with ``nb_execution_mode = "off"``: nothing is executed twice.

Exit status: 0 built, 1 the Sphinx build failed, 2 an input is missing, stale or failed.
Open ``<out>/html/index.html`` in a browser; ``make site-test`` checks it in headless chromium.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = REPO_ROOT / "docs"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_notebooks as rn  # noqa: E402  (tools/ is not an installed package)

#: The html-manager release matching ipywidgets 8 (``npm view @jupyter-widgets/html-manager@1.0.15
#: dist.tarball dist.integrity``).
HTML_MANAGER = {
    "url": "https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz",
    "sha512": "5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
    "files": {"package/dist/embed.js": "embed.js", "package/dist/embed.js.LICENSE.txt": "embed.js.LICENSE.txt"},
}


def notebook_problem(stored: Path, executed: Path) -> str | None:
    """Why ``executed`` cannot stand for ``stored`` on the site (missing, stale, failed), or None."""
    import nbformat

    if not executed.is_file():
        return "missing"
    a = nbformat.read(str(stored), as_version=4)
    b = nbformat.read(str(executed), as_version=4)
    if [(c.cell_type, c.source) for c in a.cells] != [(c.cell_type, c.source) for c in b.cells]:
        return "stale (the stored notebook changed after it was executed)"
    code = [c for c in b.cells if c.cell_type == "code"]
    if any(c.get("execution_count") is None for c in code):
        return "not fully executed"
    err = rn._first_error(b)
    if err is not None:
        return f"failed at cell {err[0]}: {err[1]}"
    return None


def check_executed(executed_dir: Path, only: str | None = None) -> dict[str, str]:
    """``{notebook name: problem}`` for every stored notebook (``--only`` picks) not usable from ``executed_dir``."""
    return {
        p.name: why
        for p in rn.find_notebooks(rn.NOTEBOOK_DIR, only)
        if (why := notebook_problem(p, executed_dir / p.name)) is not None
    }


def fetch_html_manager(cache: Path) -> dict[str, Path]:
    """The html-manager's files (``embed.js``, its licence) from the pinned tarball, cached in ``cache``.

    Raises ``RuntimeError`` when the download fails or the tarball's sha512 differs from
    :data:`HTML_MANAGER` (the cached tarball is then removed).
    """
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / Path(HTML_MANAGER["url"]).name
    if not tgz.is_file():
        try:
            with urllib.request.urlopen(HTML_MANAGER["url"], timeout=60) as resp:
                tgz.write_bytes(resp.read())
        except OSError as exc:
            raise RuntimeError(f"cannot download {HTML_MANAGER['url']} ({exc}); put the file at {tgz} by hand") from None
    digest = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
    if digest != HTML_MANAGER["sha512"]:
        tgz.unlink()
        raise RuntimeError(f"{tgz.name}: sha512 {digest} is not the pinned {HTML_MANAGER['sha512']}")
    out = {}
    with tarfile.open(tgz) as tar:
        for member, name in HTML_MANAGER["files"].items():
            target = cache / name
            if not target.is_file():
                target.write_bytes(tar.extractfile(member).read())
            out[name] = target
    return out


#: Markdown pages of notebooks/ that go on the site beside the executed notebooks (the notebooks link them).
TEXT_PAGES = ("00_glossary.md",)


def assemble(src: Path, executed_dir: Path, names: list[str], js: dict[str, Path]) -> None:
    """Lay out the Sphinx source folder ``src``: docs/, the :data:`TEXT_PAGES` of notebooks/, the executed
    notebooks, the widget JS in _static/. ``FileNotFoundError`` naming a text page that is missing."""
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(DOCS_DIR, src)
    (src / "_static").mkdir(exist_ok=True)
    for page in TEXT_PAGES:
        path = rn.NOTEBOOK_DIR / page
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a page the site lists (TEXT_PAGES) is missing")
        shutil.copy2(path, src / page)
    for name in names:
        shutil.copy2(executed_dir / name, src / name)
    for name, path in js.items():
        shutil.copy2(path, src / "_static" / name)


def sphinx_build(src: Path, html: Path) -> int:
    """``sphinx-build -b html`` of ``src`` into ``html`` (a fresh build: warnings are errors)."""
    if html.exists():
        shutil.rmtree(html)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-E", str(src), str(html)]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def execute_missing(problems: dict[str, str], executed_dir: Path, kernel: str, timeout: int) -> dict[str, str]:
    """Execute the notebooks named in ``problems`` into ``executed_dir``; return the problems left."""
    kernel, _ = rn.resolve_kernel(kernel)
    for name in sorted(problems):
        print(f"executing {name} ({problems[name]})", flush=True)
        r = rn.execute_notebook(rn.NOTEBOOK_DIR / name, executed_dir, kernel, timeout)
        print(f"      {r.status} in {r.seconds:.1f} s{': ' + r.detail if r.detail else ''}", flush=True)
    return check_executed(executed_dir, ",".join(Path(n).stem for n in problems))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--executed", default=str(REPO_ROOT / "build"), help="folder of the executed notebooks (make run's --out)")
    ap.add_argument("--out", default=str(REPO_ROOT / "build" / "site"), help="site folder: src/ and html/ are written there")
    ap.add_argument("--only", default=None, help="only these notebooks (comma-separated prefixes, as make run's NB)")
    ap.add_argument("--execute-missing", action="store_true", help="execute missing or stale notebooks first")
    ap.add_argument("--kernel", default="tqlab", help="kernel for --execute-missing")
    ap.add_argument("--timeout", type=int, default=300, help="per-cell timeout of --execute-missing, seconds")
    args = ap.parse_args(argv)
    executed_dir, out = Path(args.executed), Path(args.out)
    names = [p.name for p in rn.find_notebooks(rn.NOTEBOOK_DIR, args.only)]
    if not names:
        print(f"error: no stored notebooks match {args.only!r}", file=sys.stderr)
        return 2
    problems = check_executed(executed_dir, args.only)
    if problems and args.execute_missing:
        try:
            problems = execute_missing(problems, executed_dir, args.kernel, args.timeout)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if problems:
        for name, why in sorted(problems.items()):
            print(f"error: {executed_dir / name}: {why}", file=sys.stderr)
        print("run `make run` (or pass --execute-missing) first", file=sys.stderr)
        return 2
    try:
        js = fetch_html_manager(out / "cache")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assemble(out / "src", executed_dir, names, js)
    rc = sphinx_build(out / "src", out / "html")
    if rc == 0:
        print(f"site: {out / 'html' / 'index.html'} ({len(names)} notebook page(s))")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
