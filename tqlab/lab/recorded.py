"""The one recorded-data API of the notebooks: pick the device, load or save a recording, show its banner.

The files and their provenance are :mod:`tqlab.core.provenance` (re-exported here, so
a notebook imports only this module). What this module adds is display:

* :func:`check_device` — a notebook's parameters cell refuses a ``DEVICE`` it does not run on;
* :func:`pick_device` — the notebook's ``DEVICE`` parameter, with a printed line
  when ``"cuda"`` is asked for on a machine without it;
* :func:`banner_text` / :func:`show_banner` — the one "Recorded on <device>,
  <date>, commit <sha> — no CUDA here" banner above numbers that were not
  computed on this machine (an amber HTML box in Jupyter, ruled text elsewhere);
* :func:`show_recorded` — the "show the recording, or say there is none" cell
  of every notebook as one call; :func:`record_run` — its "save this GPU run" twin.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping

from tqlab.core.provenance import (
    DATA_DIR,
    PROVENANCE_KEYS,
    RecordedResult,
    has_cuda,
    has_recorded,
    jsonable,
    list_recorded,
    load_recorded,
    make_provenance,
    recorded_path,
    save_recorded,
    short_sha,
    validate_provenance,
)
from tqlab.lab.display import in_notebook, show_md

__all__ = [
    "DATA_DIR",
    "PROVENANCE_KEYS",
    "RecordedResult",
    "banner_text",
    "has_cuda",
    "has_recorded",
    "jsonable",
    "list_recorded",
    "load_recorded",
    "make_provenance",
    "check_device",
    "pick_device",
    "record_run",
    "recorded_path",
    "save_recorded",
    "show_banner",
    "show_parity_banner",
    "show_recorded",
    "validate_provenance",
]


def check_device(requested: Any, supported: tuple[str, ...], notebook: str, why: str = "") -> None:
    """Refuse, in a notebook's parameters cell, a ``DEVICE`` the notebook does not run on.

    ``supported`` lists the values the notebook accepts (``"cuda"`` also covers
    ``"cuda:N"``); ``notebook`` names it ("05") and ``why`` says in a few words why
    the other devices are not supported. Raises ``ValueError`` with one line naming
    the value, the notebook and its devices; returns None when ``requested`` is fine
    (CUDA availability is :func:`pick_device`'s business).
    """
    name = requested.strip().lower() if isinstance(requested, str) else None
    base = "cuda" if name is not None and name.startswith("cuda:") and name[5:].isdigit() else name
    if base in supported:
        return
    devices = ", ".join(repr(d) for d in supported)
    raise ValueError(f"DEVICE={requested!r}: notebook {notebook} runs on {devices} only"
                     + (f" ({why})" if why else ""))


def pick_device(requested: str, *, quiet: bool = False) -> str:
    """The device a notebook should really use for ``requested`` (its ``DEVICE`` parameter).

    ``"cpu"`` and ``"meta"`` are returned unchanged. ``"cuda"`` (or ``"cuda:N"``)
    is returned when CUDA is available; otherwise ``"cpu"``, and a line saying so
    is printed (unless ``quiet``) — the substitution is never silent.

    Raises ``TypeError`` for a non-string, ``ValueError`` for anything else, naming the value.
    """
    if not isinstance(requested, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda' or 'meta', got {requested!r}")
    name = requested.strip().lower()
    if name in ("cpu", "meta"):
        return name
    if name == "cuda" or name.startswith("cuda:"):
        if has_cuda():
            return name
        if not quiet:
            print(f"DEVICE={requested!r} but torch.cuda.is_available() is False here: running on 'cpu' instead.")
        return "cpu"
    raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'meta', got {requested!r}")


def banner_text(
    provenance: Mapping[str, Any], *, cuda_here: bool | None = None, what: str = "Recorded", why: str | None = None
) -> str:
    """The banner's words: ``"<what> on <device>, <date>, commit <sha> — <why>"`` and a command line.

    ``why`` defaults to ``"no CUDA here"``, or, when CUDA *is* available
    (``cuda_here`` defaults to :func:`has_cuda`), to a note that the recording is
    shown instead of a live run. The parity results pass
    ``what="Recorded parity results: vLLM 0.33"``, ``why="vLLM is not importable here"``.
    A 40-hex commit is shortened to 12 characters. The second line gives the
    command and torch version. Raises like :func:`validate_provenance`.
    """
    p = validate_provenance(provenance)
    if why is None:
        here = has_cuda() if cuda_here is None else cuda_here
        why = "CUDA is available here, but this shows the recording" if here else "no CUDA here"
    return (
        f"{what} on {p['device']}, {p['date']}, commit {short_sha(p['commit'])} — {why}\n"
        f"command: {p['command']} (torch {p['torch']})"
    )


def show_banner(
    provenance: Mapping[str, Any], *, cuda_here: bool | None = None, what: str = "Recorded", why: str | None = None
) -> str:
    """Display the recorded-data banner (see :func:`banner_text`) and return its text.

    In a Jupyter kernel it is an HTML box (amber, bold first line); elsewhere
    (a terminal, a script, a test) the text is printed between rules. Raises
    like :func:`validate_provenance` when the provenance is incomplete, so
    recorded numbers can never be shown without saying where they came from.
    """
    text = banner_text(provenance, cuda_here=cuda_here, what=what, why=why)
    first, second = text.split("\n", 1)
    if in_notebook():
        from IPython.display import HTML, display

        display(
            HTML(
                '<div style="border:2px solid #b7791f;background:#fffbeb;color:#744210;'
                'padding:8px 12px;margin:6px 0;border-radius:4px;font-family:sans-serif">'
                f"<b>&#9888; {html.escape(first)}</b><br>"
                f'<span style="font-size:90%">{html.escape(second)}</span></div>'
            )
        )
    else:
        rule = "=" * min(100, max(len(first), len(second)))
        print(f"{rule}\n{first}\n{second}\n{rule}")
    return text


def show_parity_banner(provenance: Mapping[str, Any]) -> str:
    """:func:`show_banner` over ``data/parity_results.json``: names the vLLM version, says vLLM is not importable here."""
    what = f"Recorded parity results: vLLM {provenance.get('vllm', '?')}" if isinstance(provenance, Mapping) else ""
    return show_banner(provenance, what=what, why="vLLM is not importable here")


def show_recorded(name: str, *, data_dir: Path | str | None = None, **banner: Any) -> RecordedResult | None:
    """Load ``data/<name>.json`` and show its banner; or say it is missing and return None.

    The one call behind every "no CUDA here: show the GPU recording" cell.
    ``banner`` goes to :func:`show_banner` (``what=``, ``why=``, ``cuda_here=``).
    Raises like :func:`load_recorded` when the file exists but is invalid.
    """
    if not has_recorded(name, data_dir):
        known = ", ".join(list_recorded(data_dir)) or "none"
        show_md(f"*No recording `data/{name}.json` yet (recordings available: {known}).*")
        return None
    rec = load_recorded(name, data_dir)
    show_banner(rec.provenance, **banner)
    return rec


def record_run(
    name: str, results: Mapping[str, Any], command: str, *, data_dir: Path | str | None = None
) -> Path:
    """Save ``results`` measured now by ``command`` as ``data/<name>.json`` with fresh provenance; print the path.

    :func:`make_provenance` + :func:`save_recorded`; raises like them.
    """
    path = save_recorded(name, results, make_provenance(command), data_dir)
    print(f"recorded to {path}")
    return path
