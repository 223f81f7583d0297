"""Shared pieces of the three explorers: colours, PNG rendering, the lazy ipywidgets import.

Figures are drawn on ``matplotlib.figure.Figure`` objects (no pyplot state, any
backend) and shown as PNG bytes in an ``ipywidgets.Image``; sizes in bytes
unless a name says MiB (2**20 bytes, which vLLM's messages call "MB").
"""

from __future__ import annotations

import html
import io

import torch

from tqlab.core.workspace import MiB

FIX_COLOR = "#1f77b4"
NOFIX_COLOR = "#ff7f0e"
CRASH_COLOR = "#d62728"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``."""
    return str(dtype).removeprefix("torch.")


def esc(value: object) -> str:
    """HTML-escape for the text panels (quotes kept readable)."""
    return html.escape(str(value), quote=False)


def mib(nbytes: int) -> float:
    """Bytes as MiB (2**20 bytes)."""
    return nbytes / MiB


def require_widgets():
    """The ``ipywidgets`` module; ``ImportError`` naming the extra to install when it is missing."""
    try:
        import ipywidgets
    except ImportError as e:  # pragma: no cover - exercised only without the notebooks extra
        raise ImportError(
            "the tqlab explorers need ipywidgets (pip install 'tqlab[notebooks]'); "
            "the static figures (layout_figure, planner_figure, lifecycle_figure) work without it"
        ) from e
    return ipywidgets


def figure_png(fig, dpi: int = 100) -> bytes:
    """PNG bytes of a matplotlib ``Figure`` (for ``ipywidgets.Image`` or ``IPython.display.Image``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def new_figure(width: float, height: float, ncols: int = 1, width_ratios=None):
    """A constrained-layout ``Figure`` (inches) with ``ncols`` axes side by side: ``(fig, axes)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, gridspec_kw={"width_ratios": width_ratios} if width_ratios else None)
    return fig, axes


def snapshot(fig):
    """``IPython.display.Image`` of a figure: the static picture a notebook cell shows before its widget."""
    from IPython.display import Image

    return Image(data=figure_png(fig), format="png")
