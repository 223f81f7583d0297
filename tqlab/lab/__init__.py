"""Notebook support, the top layer: nothing else in ``tqlab`` imports it.

* :mod:`.recorded` — the one recorded-data API (pick the device, load/save ``data/*.json``, the banner);
* :mod:`.display` — ``fmt_bytes``, the Markdown/text tables, ``show_md``, ``show_error``, ``progress``;
* :mod:`.plots_workspace` — byte maps, lifecycle timelines, phases, bars, need curves (matplotlib, lazily);
* :mod:`.strategy_tables` — notebook 06's comparison table and the ``data/strategies_<tag>.json`` payload;
* :mod:`.widgets` — the three interactive explorers (ipywidgets, lazily).
* :mod:`.environment` — the environment check at the top of every notebook (torch, CUDA, vLLM's parity env);
* :mod:`.plots_startup` — vLLM 0.33's start-up steps x workspace consumers (notebook 03 §3, the one start-up figure);
* :mod:`.exercises`, :mod:`.solutions` — the code-checked exercises and their references.

Import the submodule you need (``from tqlab.lab import display, plots_workspace``);
this package imports none of them itself, so ``import tqlab.lab`` stays cheap.
"""
