"""The built static site in a real browser (``tools/browser_test.py --site DIR``, ``make site-test``).

Serves ``DIR`` (``build/site/html`` from ``make site``) on ``127.0.0.1`` with Python's
``http.server`` and opens it in Debian's chromium through Playwright, with every request
that leaves ``127.0.0.1`` blocked (the site must work offline). It checks:

* **a page**: ``index.html`` links every page found in ``DIR`` (``NN_*.html``: the notebooks and the glossary),
  and each page loads without a JavaScript error and shows its title (the glossary, :data:`TEXT_PAGES`: a title
  and a table, no figure);
* **a figure**: on each notebook page, every image of a cell output loads (``naturalWidth > 0``)
  and there is at least one;
* **a widget**: on each page that carries saved widget state, every saved widget view is rendered
  by ``@jupyter-widgets/html-manager`` (no "Error displaying widget", no placeholder left), with at
  least one slider and one image of the widget loaded.

Screenshots (each page, each widget's first view) go to ``--out``; a ``summary.json`` beside them.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

JS_FIGURES = """() => Array.from(document.querySelectorAll('.cell_output img'))
  .map(i => ({src: i.getAttribute('src').slice(0, 80), w: i.naturalWidth, inWidget: !!i.closest('.jupyter-widgets')}))"""

JS_WIDGETS = """() => ({
  saved: document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
  state: document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]').length,
  rendered: document.querySelectorAll('.cell_output .jupyter-widgets.widget-container, .cell_output .widget-box').length,
  sliders: document.querySelectorAll('.cell_output .widget-slider').length,
  errors: (document.body.innerText.match(/Error displaying widget/g) || []).length,
  loading: (document.body.innerText.match(/Loading widget/g) || []).length,
  images: Array.from(document.querySelectorAll('.cell_output .jupyter-widgets img')).map(i => i.naturalWidth),
})"""


#: Pages of the site built from Markdown, not from an executed notebook (tools/build_site.py TEXT_PAGES):
#: checked for a title and a table instead of figures.
TEXT_PAGES = ("00_glossary.html",)


@dataclass
class PageReport:
    page: str
    status: str = "fail"  # pass | fail
    figures: int = 0
    widget_views: int = 0
    sliders: int = 0
    problems: list[str] = field(default_factory=list)
    screenshots: list[str] = field(default_factory=list)


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A quiet HTTP server of ``directory`` on a free port of 127.0.0.1, in a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # silence the per-request log
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _poll(page, js: str, done, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    value = page.evaluate(js)
    while not done(value) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
        value = page.evaluate(js)
    return value


def check_index(page, base: str, pages: list[str]) -> list[str]:
    """Problems of ``index.html``: a notebook page it does not link."""
    page.goto(f"{base}/index.html", wait_until="load")
    links = set(page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href').split('#')[0])"))
    return [f"index.html does not link {p}" for p in pages if p not in links]


def check_page(page, base: str, name: str, out: Path, timeout_s: float) -> PageReport:
    """Open one notebook page and check its figures and widgets (see the module docstring)."""
    rep = PageReport(name)
    page.goto(f"{base}/{name}", wait_until="load")
    if not page.locator("h1").count():
        rep.problems.append("no title (h1)")
    if name in TEXT_PAGES:  # a Markdown page (the glossary): a title and a table, no cell outputs
        if not page.locator("table").count():
            rep.problems.append("no table on a text page")
        page.screenshot(path=str(out / f"site-{Path(name).stem}.png"), full_page=True)
        rep.screenshots.append(f"site-{Path(name).stem}.png")
        rep.status = "fail" if rep.problems else "pass"
        return rep
    figs = _poll(page, JS_FIGURES, lambda v: all(f["w"] > 0 for f in v), timeout_s)
    rep.figures = sum(1 for f in figs if not f["inWidget"])
    broken = [f["src"] for f in figs if f["w"] == 0]
    if broken:
        rep.problems.append(f"{len(broken)} image(s) did not load, e.g. {broken[0]}")
    if rep.figures == 0:
        rep.problems.append("no figure in any cell output")
    w = page.evaluate(JS_WIDGETS)
    if w["saved"]:
        w = _poll(page, JS_WIDGETS, lambda v: v["loading"] == 0 and v["errors"] == 0 and v["rendered"] > 0
                  and all(x > 0 for x in v["images"]), timeout_s)
        rep.widget_views, rep.sliders = w["saved"], w["sliders"]
        if not w["state"]:
            rep.problems.append("widget views but no saved widget state on the page")
        if w["errors"] or w["loading"] or not w["rendered"]:
            rep.problems.append(f"widgets not rendered: {w['rendered']} rendered of {w['saved']} saved, "
                                f"{w['errors']} error(s), {w['loading']} still loading")
        if not w["sliders"] or not w["images"] or not all(x > 0 for x in w["images"]):
            rep.problems.append(f"widget without a slider or a loaded image ({w['sliders']} slider(s), images {w['images']})")
        first = page.locator(".cell_output .jupyter-widgets.widget-container, .cell_output .widget-box").first
        if first.count():
            first.screenshot(path=str(out / f"site-{Path(name).stem}-widget.png"))
            rep.screenshots.append(f"site-{Path(name).stem}-widget.png")
    page.screenshot(path=str(out / f"site-{Path(name).stem}.png"), full_page=True)
    rep.screenshots.append(f"site-{Path(name).stem}.png")
    rep.status = "fail" if rep.problems else "pass"
    return rep


def run_site(site: Path, out: Path, chromium: str, chromium_args: list[str], only: str | None, timeout_s: float) -> int:
    """Check the site in ``site``; print one line per page and ``N passed, M failed``; return the exit status."""
    from playwright.sync_api import sync_playwright

    pages = sorted(p.name for p in site.glob("[0-9][0-9]_*.html"))
    if only:
        tokens = [t.strip() for t in only.split(",") if t.strip()]
        pages = [p for p in pages if any(p.startswith(t) or t in p for t in tokens)]
    if not (site / "index.html").is_file() or not pages:
        print(f"browser-test: no site in {site} (index.html and NN_*.html pages); run `make site`")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    server, base = serve(site)
    reports: list[PageReport] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=chromium_args, headless=True, timeout=60_000)
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 1800}).new_page()
                page.set_default_timeout(30_000)
                outside: list[str] = []
                errors: list[str] = []
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                           else (outside.append(route.request.url), route.abort()))
                page.on("pageerror", lambda e: errors.append(str(e)))
                index_problems = check_index(page, base, pages)
                reports.append(PageReport("index.html", "fail" if index_problems else "pass", problems=index_problems))
                for name in pages:
                    outside.clear()
                    errors.clear()
                    rep = check_page(page, base, name, out, timeout_s)
                    if errors:
                        rep.problems.append(f"page errors: {errors[:3]}")
                    if outside:
                        rep.problems.append(f"{len(outside)} request(s) outside the site, e.g. {outside[0]}")
                    rep.status = "fail" if rep.problems else "pass"
                    reports.append(rep)
            finally:
                browser.close()
    finally:
        server.shutdown()
    for r in reports:
        print(f"  {r.page}: {r.status}, {r.figures} figure(s), {r.widget_views} widget view(s), {r.sliders} slider(s)"
              + "".join(f"\n    - {pr}" for pr in r.problems), flush=True)
    passed = sum(r.status == "pass" for r in reports)
    (out / "summary.json").write_text(json.dumps({"site": str(site), "passed": passed, "failed": len(reports) - passed,
                                                  "pages": [asdict(r) for r in reports]}, indent=2))
    print(f"browser-test (site): screenshots in {out}")
    print(f"{passed} passed, {len(reports) - passed} failed")
    return 0 if passed == len(reports) else 1
