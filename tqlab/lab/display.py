"""Text and HTML for the notebooks: byte counts, tables, Markdown, caught errors, progress, debug logs.

One of each: :func:`fmt_bytes` (one unit rule, :func:`byte_unit`), :func:`markdown_table` and
:func:`text_table` (the same cell rule, two renderings), :func:`show_md`,
:func:`show_error`, :func:`progress` (a live bar in a live notebook, a text
line in headless runs), :func:`debug_workspace_log` (collect the
``TQLAB_DEBUG_WORKSPACE=1`` lines of ``tqlab.core.workspace``), :func:`recording_label` (the name a reader sees
for a recording's internal shape key).
Nothing here imports matplotlib or ipywidgets.
"""

from __future__ import annotations

import contextlib
import html
import logging
import math
import os
import sys
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "BYTE_UNITS",
    "byte_unit",
    "debug_workspace_log",
    "fmt_bytes",
    "in_notebook",
    "live_frontend",
    "markdown_table",
    "progress",
    "recording_label",
    "show_error",
    "show_md",
    "text_table",
]


# --------------------------------------------------------------------------- #
# Numbers and tables                                                          #
# --------------------------------------------------------------------------- #


BYTE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
"""Binary units (powers of 2; vLLM's messages call MiB "MB")."""


def byte_unit(nbytes: int) -> tuple[str, int]:
    """The largest binary unit that keeps ``nbytes`` >= 1, as ``(name, bytes per unit)``: 1536 -> ``("KiB", 1024)``.

    The one unit rule, used by :func:`fmt_bytes` and by the figures' axes.
    """
    for name in ("GiB", "MiB", "KiB"):
        if nbytes >= BYTE_UNITS[name]:
            return name, BYTE_UNITS[name]
    return "B", 1


def fmt_bytes(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1: ``'256 B'``, ``'1.50 KiB'``, ``'2.00 MiB'``.

    Units as :func:`byte_unit`, two decimals above bytes. Raises ``ValueError``
    for a negative count, ``TypeError`` for a non-integer.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    unit, div = byte_unit(nbytes)
    return f"{nbytes} B" if div == 1 else f"{nbytes / div:.2f} {unit}"


def _cell(value: Any, as_hex: bool = False) -> str:
    """One table cell: None -> ``-``, ints in hex columns -> ``0x..``, floats -> 4 significant
    digits (thousands separators from 10,000 on, never ``1.495e+04``), anything else ``str()``."""
    if value is None:
        return "-"
    if as_hex and isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:x}"
    if as_hex and isinstance(value, (list, tuple)):
        return "[" + ", ".join(_cell(v, True) for v in value) + "]"
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) >= 1e4:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


def _grid(headers: Sequence[str] | None, rows: Sequence[Any], hex_cols: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and cell strings. Rows are sequences (one cell per header) or mappings (looked up by header;
    ``headers=None`` takes the union of their keys, in order). Raises ``ValueError`` for a ragged row."""
    if headers is None:
        cols: list[str] = []
        for r in rows:
            if not isinstance(r, Mapping):
                raise ValueError("headers=None needs rows that are mappings")
            cols += [str(k) for k in r if str(k) not in cols]
        headers = cols
    heads = [str(h) for h in headers]
    cells = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            vals = [row.get(h) for h in headers]
        else:
            vals = list(row)
            if len(vals) != len(heads):
                raise ValueError(f"row {i} has {len(vals)} cells, the header has {len(heads)}")
        cells.append([_cell(v, h in hex_cols) for h, v in zip(heads, vals)])
    return heads, cells


def markdown_table(headers: Sequence[str] | None, rows: Sequence[Any], *, hex_cols: Sequence[str] = ()) -> str:
    """A GitHub-flavoured Markdown table; ``|`` is escaped, newlines become spaces.

    ``rows``: sequences of cells, or mappings looked up by header
    (``headers=None``: the union of the mappings' keys). Cells as in
    :func:`text_table`. Raises ``ValueError`` if a sequence row's length differs
    from the header's.
    """
    def esc(v: str) -> str:
        return v.replace("|", "\\|").replace("\n", " ")

    heads, cells = _grid(headers, rows, hex_cols)
    lines = ["| " + " | ".join(esc(h) for h in heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells]
    return "\n".join(lines)


def text_table(headers: Sequence[str] | None, rows: Sequence[Any], *, hex_cols: Sequence[str] = ()) -> str:
    """A plain-text table (right-aligned columns, a dashed rule under the header) for ``print``.

    Same arguments and cell rule as :func:`markdown_table`: ``None`` is ``-``,
    ints in ``hex_cols`` print as ``0x...``, floats with 4 significant digits
    (``14,950`` rather than ``1.495e+04``).
    """
    heads, cells = _grid(headers, rows, hex_cols)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) for v, w in zip(vals, widths))

    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(r) for r in cells])


# --------------------------------------------------------------------------- #
# Showing things                                                              #
# --------------------------------------------------------------------------- #


def in_notebook() -> bool:
    """True inside a Jupyter kernel (live or executed headless by nbclient/nbmake); never raises."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def live_frontend() -> bool:
    """True in a kernel that a Jupyter server started for a person (JupyterLab, Notebook).

    Jupyter Server sets ``JPY_SESSION_NAME`` in the kernels it starts;
    nbclient, nbmake and ``jupyter nbconvert --execute`` do not, and there a
    widget would be saved as a frozen placeholder. ``TQLAB_HEADLESS=1`` forces False.
    """
    if os.environ.get("TQLAB_HEADLESS", "") not in ("", "0"):
        return False
    return in_notebook() and bool(os.environ.get("JPY_SESSION_NAME"))


def progress(iterable: Iterable[Any], *, desc: str | None = None, total: int | None = None, **kwargs: Any):
    """``iterable`` with a progress bar: the tqdm widget in a live notebook, a text line on stdout otherwise.

    Executed notebooks keep the text line (a saved tqdm widget shows a frozen
    "0%" and nothing in HTML). ``kwargs`` go to tqdm.
    """
    if live_frontend():
        from tqdm.auto import tqdm as bar  # the widget bar (plain text if ipywidgets is missing)

        return bar(iterable, desc=desc, total=total, **kwargs)
    from tqdm.std import tqdm as bar

    kwargs.setdefault("file", sys.stdout)
    kwargs.setdefault("mininterval", 1.0)
    kwargs.setdefault("ascii", True)
    return bar(iterable, desc=desc, total=total, **kwargs)


def _display(obj_html: str | None, md: str | None, text: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import HTML, Markdown, display
    except ImportError:
        print(text)
        return
    if get_ipython() is None:
        print(text)
    elif obj_html is not None:
        display(HTML(obj_html))
    else:
        display(Markdown(md))


def show_md(text: str) -> None:
    """Render Markdown in a notebook (``IPython.display.Markdown``); print it elsewhere."""
    _display(None, text, text)


def show_error(exc: BaseException, title: str | None = None) -> None:
    """Show a caught exception as a red box: ``'Type: message'`` under ``title`` (printed outside notebooks).

    For the notebooks' *expected* failures: the cell catches the exception and
    shows it, so the executed notebook has no error cells.
    """
    text = f"{type(exc).__name__}: {exc}"
    head = title or "Caught, as expected"
    box = (
        '<div style="border:2px solid #c53030;background:#fff5f5;color:#742a2a;padding:8px 12px;'
        'margin:6px 0;border-radius:4px">'
        f"<b>{html.escape(head)}</b>"
        f'<pre style="white-space:pre-wrap;margin:4px 0 0 0;background:transparent">{html.escape(text)}</pre></div>'
    )
    _display(box, None, f"{head}\n{text}")


# --------------------------------------------------------------------------- #
# Debug logging                                                               #
# --------------------------------------------------------------------------- #


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(level=logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


@contextlib.contextmanager
def debug_workspace_log(echo: bool = True) -> Iterator[list[str]]:
    """Turn on ``TQLAB_DEBUG_WORKSPACE=1`` for the body and collect the workspace log lines.

    Yields the list that receives each message; with ``echo`` every line is
    also printed to stdout (not stderr, so notebooks show it as normal output).
    The variable, the logger's handlers, level and propagation are restored on
    exit, even if the body raises.
    """
    lines: list[str] = []
    log = logging.getLogger("tqlab.core.workspace")
    old_env = os.environ.get("TQLAB_DEBUG_WORKSPACE")
    old_level, old_prop = log.level, log.propagate
    handler = _ListHandler(lines)
    printer = None
    if echo:
        printer = logging.StreamHandler(sys.stdout)
        printer.setLevel(logging.INFO)
        printer.setFormatter(logging.Formatter("%(message)s"))
    os.environ["TQLAB_DEBUG_WORKSPACE"] = "1"
    log.addHandler(handler)
    if printer is not None:
        log.addHandler(printer)
    log.propagate = False
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        if printer is not None:
            log.removeHandler(printer)
        log.setLevel(old_level)
        log.propagate = old_prop
        if old_env is None:
            os.environ.pop("TQLAB_DEBUG_WORKSPACE", None)
        else:
            os.environ["TQLAB_DEBUG_WORKSPACE"] = old_env


RECORDING_LABELS: dict[str, str] = {
    "seed": "bug report's rank",
    "seed_per_rank": "bug report's rank",
    "seed_tp8_rank": "bug report's rank",
    "llama3.1-8b": "llama-3.1-8b",
}
"""The recordings' internal shape keys (``data/turboquant_*.json``, ``data/cuda_graphs_latency.json``: the bug
report's deployment, one tensor-parallel rank of 8) and the names the notebooks show for them."""


def recording_label(key: str) -> str:
    """The name a reader sees for a recording's shape key (:data:`RECORDING_LABELS`), else ``key`` unchanged."""
    return RECORDING_LABELS.get(key, key)
