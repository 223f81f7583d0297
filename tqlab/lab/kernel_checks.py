"""Notebook 11's CPU check of a Triton kernel: tqlab's store kernel under Triton's interpreter, in a subprocess.

``TRITON_INTERPRET=1`` must be set before Triton is imported, so a notebook kernel that imported Triton without it
cannot switch the interpreter on. :func:`interpreter_store_check` runs the check in a fresh Python with the variable
set: the Triton store kernel (``tqlab/turboquant/_triton_kernels.py``, ``store_kv(..., backend="triton")``) and the
torch reference write the same ``tokens`` random keys and values into a small cache, and the bytes are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["interpreter_store_check"]

_REPO = Path(__file__).resolve().parents[2]
_SCRIPT = (
    "import json, torch\n"
    "from tqlab.turboquant import get_spec, kv_cache_shape, store_kv\n"
    "spec = get_spec({preset!r}, {layout!r})\n"
    "g = torch.Generator().manual_seed(0)\n"
    "cache = torch.zeros(kv_cache_shape(-(-{tokens} // 16), 1, 16, {head_dim}, spec), dtype=torch.uint8)\n"
    "k, v = torch.randn({tokens}, 1, {head_dim}, generator=g), torch.randn({tokens}, 1, {head_dim}, generator=g)\n"
    "ref, tri = cache.clone(), cache.clone()\n"
    "store_kv(ref, k, v, torch.arange({tokens}), spec, backend='torch')\n"
    "store_kv(tri, k, v, torch.arange({tokens}), spec, backend='triton')\n"
    "print('STORE_CHECK ' + json.dumps({{'identical': torch.equal(ref, tri), 'bytes': ref.numel(),"
    " 'differing': int((ref != tri).sum())}}))\n"
)


def interpreter_store_check(preset: str = "turboquant_3bit_nc", *, layout: str = "vllm", tokens: int = 32,
                            head_dim: int = 64, timeout_s: float = 120.0) -> dict:
    """Store ``tokens`` random K/V of one KV head with the Triton kernel under ``TRITON_INTERPRET=1`` and with the
    torch reference; returns ``{"identical": bool, "bytes": int, "differing": int, "seconds": float}``.

    Raises ``RuntimeError`` (one line: exit status and the last stderr line) when the subprocess fails or runs past
    ``timeout_s`` seconds (e.g. Triton is not installed).
    """
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(_REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    code = _SCRIPT.format(preset=preset, layout=layout, tokens=int(tokens), head_dim=int(head_dim))
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the Triton interpreter check ran past {timeout_s:g} s") from None
    line = next((x for x in proc.stdout.splitlines() if x.startswith("STORE_CHECK ")), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the Triton interpreter check failed (exit {proc.returncode}): {last}")
    return dict(json.loads(line.removeprefix("STORE_CHECK ")), seconds=time.perf_counter() - t)
