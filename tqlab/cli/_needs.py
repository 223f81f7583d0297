"""What the command line needs beyond what vLLM's environment is sure to have, checked before anything imports it.

The plugin recipe installs tqlab with ``pip install --no-deps`` into vLLM's environment. vLLM 0.33 requires
torch, numpy and tqdm directly (``vllm-0.33.0.dist-info/METADATA``), which is all the plugin and the trace
recorder import (:mod:`tqlab.vllm_plugin`, :mod:`tqlab.vllm.trace_record`). ``tqlab`` itself also needs click
and rich; vLLM 0.33 brings them only through others (``fastapi[standard]`` -> fastapi-cli -> typer -> click,
rich; uvicorn and huggingface_hub -> click), so an environment without them gets one line saying what to add
(exit 1) instead of a ``ModuleNotFoundError`` traceback. matplotlib, also a tqlab requirement, is not needed
by any command.
"""

from __future__ import annotations

import importlib.util



def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken half-installed package
        return False


MISSING = [m for m in ("click", "rich") if not _present(m)]

if MISSING:
    raise SystemExit(f"tqlab's command line needs {' and '.join(MISSING)}, which this environment lacks: "
                     "pip install 'click>=8.1' 'rich>=13.0' (pure Python; they leave torch and vLLM as they are)")
