"""``TQLAB_VLLM_DECODE=1``: after vLLM 0.33's own ``load_general_plugins()`` (``vllm/plugins/__init__.py``) its
TurboQuant backend decodes with tqlab's function (``tqlab.vllm_plugin.serve_tqlab_decode``).

Runs in a subprocess with this checkout first on ``PYTHONPATH`` and, where the project's ``vllm.general_plugins``
entry point is not installed in this venv, a throw-away ``.dist-info`` beside it declaring the same entry point as
``pyproject.toml`` (importlib.metadata finds it on ``sys.path``, as it finds an installed one), so vLLM's loader
is the one that imports ``tqlab.vllm_plugin`` and calls ``register()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_DECODE = r"""
import inspect, json
import vllm.plugins
import vllm.v1.attention.backends.turboquant_attn as tqa
from vllm.v1.attention.ops import triton_turboquant_decode as vllm_ops
vllm.plugins.load_general_plugins()   # vLLM's loader: imports tqlab.vllm_plugin and calls register()
import tqlab.turboquant.vllm_decode as tvd
fn = tqa.triton_turboquant_decode_attention
sig = lambda f: [(p.name, p.kind.name, repr(p.default)) for p in inspect.signature(f).parameters.values()]
print(json.dumps({"is_tqlab": fn is tvd.triton_turboquant_decode_attention,
                  "is_vllm": fn is vllm_ops.triton_turboquant_decode_attention, "module": fn.__module__,
                  "same_signature": sig(fn) == sig(vllm_ops.triton_turboquant_decode_attention),
                  "params": [p[0] for p in sig(fn)]}))
"""


def _entry_point_dir(tmp: Path) -> str:
    """A folder holding a ``.dist-info`` with the project's ``vllm.general_plugins`` entry points (pyproject.toml)."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    info = tmp / "tqlab_plugin_probe-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tqlab-plugin-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return str(tmp)


@pytest.mark.parametrize("flag", ["1", None])
def test_decode_env_makes_vllms_backend_call_tqlab(flag, tmp_path, record):
    """``1``: vLLM's backend's ``triton_turboquant_decode_attention`` is tqlab's, with vLLM's parameter names, kinds
    and defaults; unset: vLLM's own."""
    from importlib.metadata import entry_points

    env = {k: v for k, v in os.environ.items() if k not in ("TQLAB_VLLM_TRACE", "TQLAB_VLLM_DECODE")}
    path = [str(ROOT)]
    if not [p for p in entry_points(group="vllm.general_plugins") if p.name == "tqlab_trace"]:
        path.append(_entry_point_dir(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")])
    if flag:
        env["TQLAB_VLLM_DECODE"] = flag
    out = subprocess.run([sys.executable, "-c", _DECODE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if flag:
        assert res["is_tqlab"] and not res["is_vllm"] and res["same_signature"], res
        assert res["module"] == "tqlab.turboquant.vllm_decode"
        record("decode_params", res["params"])
    else:
        assert res["is_vllm"] and not res["is_tqlab"], res
