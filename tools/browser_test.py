#!/usr/bin/env python3
"""End-to-end test of the notebooks in a real browser (the engine behind ``make browser-test``).

What it does, bounded by timeouts at every step:

1. Lays out a throw-away Jupyter root: copies of ``notebooks/*.ipynb`` (so nothing
   the browser does can write into the repository's notebooks) next to symlinks
   of the repository's other top-level entries (``data/``, ``tqlab/`` ...), plus
   private Jupyter config/runtime/settings dirs (autosave off, no news fetch,
   no notebook windowing).
2. Starts JupyterLab on ``127.0.0.1`` with a random token (in its own process
   group; it is always killed at the end, with its kernels).
3. Drives Debian's Chromium (``/usr/bin/chromium``: headless, no sandbox,
   background networking off; never a downloaded browser) with Playwright.
   For each notebook: open it, ``notebook:run-all-cells``, wait until every
   code cell ran and the kernel is idle, then assert:

   * no error output, except in cells tagged ``raises-exception``;
   * every widget-view output rendered as a live widget (no "Error displaying
     widget", no leftover "Loading widget...");
   * if the notebook has a slider: moving the first one (keyboard, one step
     right) changes what its widget shows (text or image) within the timeout.

4. Saves screenshots to ``build/screenshots/`` (the page after the run, each
   widget view, the slider's widget after the move) and a ``summary.json``,
   prints a table and the closing line ``N passed, M failed``.

With ``--site DIR`` it checks the static site built by ``make site`` instead (a page, its
figures, its widgets' saved state rendered offline: tools/browser_site.py).

Usage::

    python tools/browser_test.py --site build/site/html [--out build/screenshots/site]
    python tools/browser_test.py [--only 08] [--out build/screenshots]
        [--chromium /usr/bin/chromium] [--notebook-timeout 300] [--keep-root]

Exit status: 0 all passed, 1 a notebook failed, 2 nothing to test or set-up failed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
RAISES_TAG = "raises-exception"
SKIP_LINK = {".git", ".venv", "build", "notebooks", ".pytest_cache", ".hypothesis"}

# Lab settings for the private settings dir: no autosave (nothing written back),
# every cell in the DOM (no windowing), no news/update fetches (no network).
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


@dataclass
class NotebookReport:
    notebook: str
    status: str = "fail"  # pass | fail
    seconds: float = 0.0
    code_cells: int = 0
    executed_cells: int = 0
    widget_views: int = 0
    slider: str = "none"  # none | moved | no-response
    problems: list[str] = field(default_factory=list)
    screenshots: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_root(tmp: Path, notebooks: list[Path]) -> Path:
    """The Jupyter root: notebook copies + symlinks of the repository's other top-level entries."""
    root = tmp / "root"
    (root / "notebooks").mkdir(parents=True)
    for nb in notebooks:
        shutil.copy2(nb, root / "notebooks" / nb.name)
    for entry in REPO_ROOT.iterdir():
        if entry.name not in SKIP_LINK:
            (root / entry.name).symlink_to(entry)
    return root


def jupyter_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    settings = tmp / "lab-settings"
    for rel, value in LAB_SETTINGS.items():
        p = settings / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(value))
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("IPYTHONDIR", "ipython")):
        (tmp / sub).mkdir(exist_ok=True)
        env[var] = str(tmp / sub)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    # the venv's kernelspecs first (as the Makefile does)
    mine = str(Path(sys.prefix) / "share" / "jupyter")
    parts = [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != mine]
    env["JUPYTER_PATH"] = os.pathsep.join([mine] + parts)
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def start_server(root: Path, env: dict[str, str], port: int, token: str, log_path: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.open_browser=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI runs as root
    log = open(log_path, "wb")
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def api(base: str, token: str, path: str, method: str = "GET", timeout: float = 10.0):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def wait_for_server(proc: subprocess.Popen, base: str, token: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with status {proc.returncode}:\n{tail(log_path)}")
        try:
            api(base, token, "/api/status", timeout=3)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer on {base} within {timeout:.0f} s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (server + kernels), SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- browser
JS_READY = """() => {
  const app = window.jupyterapp;
  if (!app) return 'no-app';
  const w = app.shell.currentWidget;
  if (!w || !w.content || !w.content.model || !w.sessionContext) return 'no-notebook';
  const s = w.sessionContext.session;
  if (!s || !s.kernel) return 'no-kernel';
  return s.kernel.status;
}"""

JS_RUN_ALL = """async (ms) => {
  const app = window.jupyterapp;
  const run = app.commands.execute('notebook:run-all-cells').then(r => 'done:' + r, e => 'error:' + e);
  return await Promise.race([run, new Promise(r => setTimeout(() => r('timeout'), ms))]);
}"""

JS_CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = w.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) out.push(cells.get(i).toJSON());
  return {cells: out, kernel: w.sessionContext.session ? w.sessionContext.session.kernel.status : 'none'};
}"""

# A fingerprint of what the kernel made one widget view show: the text of its HTML
# panels and its images (not the controls: a slider's readout changes in the browser alone).
JS_FINGERPRINT = """(el) => {
  const html = Array.from(el.querySelectorAll('.widget-html-content')).map(e => e.innerText);
  const imgs = Array.from(el.querySelectorAll('img')).map(i => i.src.length + ':' + i.src.slice(-96));
  return html.join('|') + '||' + imgs.join(',');
}"""


def dismiss_dialogs(page) -> None:
    """Accept any modal dialog (e.g. kernel selection) so nothing waits for a click."""
    for _ in range(3):
        btn = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
        if btn.count() == 0:
            return
        btn.first.click(timeout=5000)
        page.wait_for_timeout(500)


def wait_until(page, fn, timeout_s: float, step_ms: int = 500):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        page.wait_for_timeout(step_ms)
    return last


def check_notebook(page, base: str, token: str, nb: Path, out: Path, timeout_s: float) -> NotebookReport:
    rep = NotebookReport(nb.name)
    t0 = time.monotonic()
    stem = nb.stem
    # a workspace of its own per notebook: Lab must not reopen (and start kernels for) earlier notebooks
    url = f"{base}/lab/workspaces/{stem.replace('_', '-')}/tree/notebooks/{nb.name}?token={token}&reset"
    page.goto(url, wait_until="domcontentloaded", timeout=90_000)
    state = wait_until(page, lambda: (dismiss_dialogs(page), page.evaluate(JS_READY))[1] == "idle" or None, 120)
    if not state:
        rep.problems.append(f"notebook/kernel not ready within 120 s (state {page.evaluate(JS_READY)!r})")
        return _finish(rep, t0, page, out, stem)

    result = page.evaluate(JS_RUN_ALL, int(timeout_s * 1000))
    if result == "timeout":
        rep.problems.append(f"run-all did not finish within {timeout_s:.0f} s")

    def all_ran():
        d = page.evaluate(JS_CELLS)
        code = [c for c in d["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        done = d["kernel"] == "idle" and all(c.get("execution_count") is not None for c in code)
        return d if done else None

    data = wait_until(page, all_ran, 30 if result != "timeout" else 1) or page.evaluate(JS_CELLS)
    code = [c for c in data["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    rep.code_cells = len(code)
    rep.executed_cells = sum(c.get("execution_count") is not None for c in code)
    if rep.executed_cells < rep.code_cells:
        rep.problems.append(f"only {rep.executed_cells}/{rep.code_cells} code cells ran")
    for i, c in enumerate(code):
        tags = c.get("metadata", {}).get("tags", []) or []
        for o in c.get("outputs", []):
            if o.get("output_type") == "error" and RAISES_TAG not in tags:
                rep.problems.append(f"code cell {i}: {o.get('ename')}: {o.get('evalue')}"[:400])
            if WIDGET_MIME in o.get("data", {}):
                rep.widget_views += 1

    page.screenshot(path=str(out / f"{stem}.png"), full_page=True)
    rep.screenshots.append(f"{stem}.png")

    if rep.widget_views:
        _check_widgets(page, rep, out, stem)
    return _finish(rep, t0, page, out, stem)


def _check_widgets(page, rep: NotebookReport, out: Path, stem: str) -> None:
    # JupyterLab puts a widget view straight into its output node (no data-mime-type attribute);
    # a failed one shows "Error displaying widget" there instead, a pending one "Loading widget..."
    views = page.locator(".jp-OutputArea-output:has(> .jupyter-widgets)")
    outputs = page.locator(".jp-OutputArea-output")

    def rendered():
        if outputs.filter(has_text="Loading widget").count():
            return None
        n = views.count()
        return n if n >= rep.widget_views else None

    n = wait_until(page, rendered, 60)
    broken = outputs.filter(has_text="Error displaying widget").count()
    if broken:
        rep.problems.append(f"{broken} widget view(s) show 'Error displaying widget'")
    if not n:
        rep.problems.append(f"{views.count()} widget view(s) rendered in the page, {rep.widget_views} in the "
                            "outputs (or still 'Loading widget...' after 60 s)")
        return
    for k in range(n):
        v = views.nth(k)
        v.scroll_into_view_if_needed(timeout=10_000)
        page.wait_for_timeout(300)
        v.screenshot(path=str(out / f"{stem}_widget{k}.png"), timeout=20_000)
        rep.screenshots.append(f"{stem}_widget{k}.png")

    # the first slider: one step right, and the widget around it must change what it shows
    for k in range(n):
        v = views.nth(k)
        handles = v.locator(".widget-slider .noUi-handle")
        if handles.count() == 0:
            continue
        before = v.evaluate(JS_FINGERPRINT)
        readout = v.locator(".widget-slider .widget-readout").first
        old_value = readout.inner_text(timeout=5000) if readout.count() else "?"
        h = handles.first
        h.scroll_into_view_if_needed(timeout=10_000)
        h.focus(timeout=5000)
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
        if readout.count() and readout.inner_text(timeout=5000) == old_value:  # already at its maximum
            page.keyboard.press("ArrowLeft")
        changed = wait_until(page, lambda: v.evaluate(JS_FINGERPRINT) != before, 60)
        if not changed:  # fall back to a mouse drag of the handle
            box = h.bounding_box()
            if box:
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.mouse.down()
                page.mouse.move(box["x"] + 60, box["y"] + box["height"] / 2, steps=8)
                page.mouse.up()
                changed = wait_until(page, lambda: v.evaluate(JS_FINGERPRINT) != before, 60)
        new_value = readout.inner_text(timeout=5000) if readout.count() else "?"
        page.wait_for_timeout(500)
        v.screenshot(path=str(out / f"{stem}_widget{k}_after_slider.png"), timeout=20_000)
        rep.screenshots.append(f"{stem}_widget{k}_after_slider.png")
        if changed:
            rep.slider = f"moved ({old_value} -> {new_value}, widget {k})"
        else:
            rep.slider = "no-response"
            rep.problems.append(f"widget {k}: slider moved ({old_value} -> {new_value}) but its view did not change "
                                "within 60 s")
        return


def _finish(rep: NotebookReport, t0: float, page, out: Path, stem: str) -> NotebookReport:
    if not rep.screenshots:
        try:
            page.screenshot(path=str(out / f"{stem}.png"), full_page=True)
            rep.screenshots.append(f"{stem}.png")
        except Exception:
            pass
    rep.seconds = round(time.monotonic() - t0, 1)
    rep.status = "pass" if not rep.problems else "fail"
    return rep


def shutdown_kernels(base: str, token: str) -> None:
    try:
        for s in api(base, token, "/api/sessions") or []:
            api(base, token, f"/api/sessions/{s['id']}", method="DELETE")
    except (urllib.error.URLError, OSError, ValueError):
        pass


# --------------------------------------------------------------------------- main
def find_notebooks(only: str | None) -> list[Path]:
    found = sorted(p for p in NOTEBOOK_DIR.glob("*.ipynb") if p.is_file())
    if only:
        tokens = [t.strip() for t in only.split(",") if t.strip()]
        found = [p for p in found if any(p.stem.startswith(t) or t in p.stem for t in tokens)]
    return found


def _check_site(args) -> int:
    """``--site DIR``: the built static site's page, figures and widgets (tools/browser_site.py)."""
    if not Path(args.chromium).exists():
        print(f"browser-test: {args.chromium} not found; install Debian's chromium "
              "(apt-get update && apt-get install -y chromium)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_site import run_site

    return run_site(Path(args.site), Path(args.out), args.chromium, CHROMIUM_ARGS, args.only, 60.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated notebook name prefixes/substrings")
    ap.add_argument("--out", default=str(REPO_ROOT / "build" / "screenshots"))
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM", DEFAULT_CHROMIUM))
    ap.add_argument("--notebook-timeout", type=float, default=300.0, help="seconds for one notebook's run-all")
    ap.add_argument("--server-timeout", type=float, default=120.0)
    ap.add_argument("--keep-root", action="store_true", help="keep the throw-away Jupyter root (debugging)")
    ap.add_argument("--site", default=None, help="check the static site in this folder (make site's build/site/html) "
                    "instead of running the notebooks in JupyterLab (tools/browser_site.py)")
    args = ap.parse_args(argv)
    if args.site:
        return _check_site(args)

    t_start = time.monotonic()
    notebooks = find_notebooks(args.only)
    if not notebooks:
        print(f"browser-test: no notebooks in {NOTEBOOK_DIR} match {args.only!r}", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"browser-test: {args.chromium} not found; install Debian's chromium "
              "(apt-get update && apt-get install -y chromium)", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("browser-test: the Python package `playwright` is missing (pip install playwright; "
              "never `playwright install`: the system chromium is used)", file=sys.stderr)
        return 2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    tmp = Path(tempfile.mkdtemp(prefix="tqlab-browser-"))
    token = secrets.token_hex(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = out / "jupyterlab.log"
    reports: list[NotebookReport] = []
    proc = None
    try:
        root = make_root(tmp, notebooks)
        proc = start_server(root, jupyter_env(tmp), port, token, log_path)
        wait_for_server(proc, base, token, args.server_timeout, log_path)
        print(f"browser-test: JupyterLab on {base} (pid {proc.pid}); chromium {args.chromium}", flush=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True,
                                        timeout=60_000)
            try:
                context = browser.new_context(viewport={"width": 1400, "height": 1800})
                for nb in notebooks:
                    page = context.new_page()
                    page.set_default_timeout(30_000)
                    console_errors: list[str] = []
                    page.on("pageerror", lambda e, sink=console_errors: sink.append(str(e)))
                    try:
                        rep = check_notebook(page, base, token, nb, out, args.notebook_timeout)
                    except Exception as e:
                        rep = NotebookReport(nb.name, problems=[f"{type(e).__name__}: {e}"[:500]])
                        try:
                            page.screenshot(path=str(out / f"{nb.stem}.png"), full_page=True)
                            rep.screenshots.append(f"{nb.stem}.png")
                        except Exception:
                            pass
                    if console_errors:
                        rep.problems.append(f"page errors: {console_errors[:3]}")
                        rep.status = "fail"
                    reports.append(rep)
                    print(f"  {rep.notebook}: {rep.status} in {rep.seconds:.1f} s, {rep.executed_cells}/"
                          f"{rep.code_cells} cells, {rep.widget_views} widget view(s), slider {rep.slider}"
                          + "".join(f"\n    - {pr}" for pr in rep.problems), flush=True)
                    shutdown_kernels(base, token)
                    page.close()
            finally:
                browser.close()
    except Exception as e:
        print(f"browser-test: set-up failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            stop_server(proc)
        if args.keep_root:
            print(f"browser-test: root kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    wall = time.monotonic() - t_start
    passed = sum(r.status == "pass" for r in reports)
    failed = len(reports) - passed
    (out / "summary.json").write_text(json.dumps(
        {"wall_seconds": round(wall, 1), "passed": passed, "failed": failed,
         "notebooks": [asdict(r) for r in reports]}, indent=2))
    print(f"browser-test: wall time {wall:.1f} s; screenshots in {out}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
