"""Each notebook states the devices it runs on and refuses any other ``DEVICE`` in its parameters cell (issue 22).

``DEVICE=meta make run NB=05`` died in cell 9 ("a meta-device runner has no memory to
capture"); now the parameters cell says, in one line, which devices notebook 05 runs on.
The sets below were measured: every notebook ran headless with ``DEVICE = "meta"``
except 04 (``Tensor.item()`` on a meta tensor), 05 and 06 (capture and memory
measurements), and 07 runs vLLM's Python classes on the CPU only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tqlab.lab.recorded import check_device

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SUPPORTED = {
    "01": ("cpu", "cuda", "meta"), "02": ("cpu", "cuda", "meta"), "03": ("cpu", "cuda", "meta"),
    "04": ("cpu", "cuda"), "05": ("auto", "cpu", "cuda"), "06": ("auto", "cpu", "cuda"), "07": ("cpu",),
    "08": ("meta", "cpu", "cuda"), "09": ("meta", "cpu", "cuda"),
    "10": ("cpu", "cuda", "meta"), "11": ("cpu", "cuda"), "12": ("cpu", "meta"),
}


def _parameters_cell(num: str) -> str:
    text = next(NOTEBOOKS.glob(f"{num}_*.py")).read_text(encoding="utf-8")
    start = text.index('# %% tags=["parameters"]\n')
    return text[start: text.index("\n# %%", start + 5)]


def _run_with(num: str, device: str, monkeypatch) -> None:
    src = _parameters_cell(num)
    if 'os.environ.get("DEVICE"' in src:
        monkeypatch.setenv("DEVICE", device)
    else:
        src, n = re.subn(r'^DEVICE = "[^"]*"', f"DEVICE = {device!r}", src, flags=re.M)
        assert n == 1
    exec(compile(src, f"notebook {num} parameters cell", "exec"), {})


def test_every_notebook_is_listed():
    assert sorted(p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")) == sorted(SUPPORTED)


@pytest.mark.parametrize("num", sorted(SUPPORTED))
def test_parameters_cell_accepts_exactly_the_supported_devices(num, monkeypatch):
    for device in SUPPORTED[num]:
        _run_with(num, device, monkeypatch)
    for device in {"cpu", "cuda", "meta", "auto", "tpu"} - set(SUPPORTED[num]):
        with pytest.raises(ValueError) as err:
            _run_with(num, device, monkeypatch)
        msg = str(err.value)
        assert "\n" not in msg
        assert msg.startswith(f"DEVICE={device!r}: notebook {num} runs on "
                              + ", ".join(repr(d) for d in SUPPORTED[num]) + " only")


def test_notebook_05_names_why_meta_is_refused(monkeypatch):
    with pytest.raises(ValueError, match=r"^DEVICE='meta': notebook 05 runs on 'auto', 'cpu', 'cuda' only "
                                         r"\(CUDA graphs capture real memory; a meta-device runner has none\)$"):
        _run_with("05", "meta", monkeypatch)


def test_check_device_takes_cuda_n_and_refuses_non_strings():
    check_device("cuda:1", ("cpu", "cuda"), "04")
    check_device(" CPU ", ("cpu",), "07")
    for bad in ("cuda:x", "cudax", 0, None):
        with pytest.raises(ValueError, match=rf"^DEVICE={re.escape(repr(bad))}: notebook 04 runs on 'cpu', 'cuda' only$"):
            check_device(bad, ("cpu", "cuda"), "04")
