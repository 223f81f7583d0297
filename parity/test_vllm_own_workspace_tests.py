"""vLLM's own ``tests/v1/worker/test_workspace.py`` run against tqlab's manager, for the installed release.

The wheel ships no tests and this repository copies none of vLLM's. Point ``PARITY_VLLM_WORKSPACE_TESTS`` at the
file from a vLLM checkout at the installed release's tag (``git -C vllm checkout v0.34.0``;
``tests/v1/worker/test_workspace.py``); without it every test here is skipped with that reason.

The file runs unchanged. While it is loaded, ``vllm.v1.worker.workspace`` is an adapter module
(:func:`_adapter`) whose ``WorkspaceManager`` is tqlab's, built for the installed release
(``vllm_version=``, so 0.34's has ``get_retained`` and 0.33's has not), and whose ``use_workspace_lane`` is
tqlab's. The one adaptation is the ubatch context: vLLM's tests set the slot by monkeypatching the module's
``dbo_current_ubatch_id``; the adapter's manager enters ``tqlab.core.workspace.ubatch_context`` of that value
around each request. ``_current_workspaces`` reads tqlab's slot buffers. Everything else the file imports
(``vllm.config``, ``vllm.v1.worker.gpu_worker``) is vLLM's own.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import pytest

ENV = "PARITY_VLLM_WORKSPACE_TESTS"
_SOURCE = os.environ.get(ENV, "")


def _adapter() -> types.ModuleType:
    """``vllm.v1.worker.workspace`` as vLLM's tests see it, backed by tqlab's manager (see the module docstring)."""
    import vllm

    import tqlab.core.workspace as tws
    from tqlab.core import vllm_versions

    version = vllm_versions.get(".".join(vllm.__version__.split(".")[:2]))
    mod = types.ModuleType("vllm.v1.worker.workspace")
    mod.dbo_current_ubatch_id = tws.current_ubatch_id
    mod.use_workspace_lane = tws.use_workspace_lane

    def in_slot(fn):
        def call(*args, **kwargs):
            with tws.ubatch_context(mod.dbo_current_ubatch_id()):
                return fn(*args, **kwargs)
        return call

    class WorkspaceManager(tws.WorkspaceManager):
        def __init__(self, device, num_ubatches=None, num_lanes=1, alloc_context=nullcontext):
            super().__init__(device, num_ubatches, num_lanes, alloc_context, vllm_version=version)

        @property
        def _current_workspaces(self):
            return list(self._buffers)

        def __getattribute__(self, name):
            attr = super().__getattribute__(name)
            if name in ("get_simultaneous", "get_persistent", "get_persistent_resource", "get_retained"):
                return in_slot(attr)
            return attr

    mod.WorkspaceManager = WorkspaceManager
    for name in ("current_workspace_manager", "init_workspace_manager", "is_workspace_manager_initialized",
                 "lock_workspace", "unlock_workspace", "reset_workspace_manager"):
        setattr(mod, name, getattr(tws, name))
    return mod


def _load_vllm_tests(path: Path) -> dict:
    """Execute vLLM's test file with the adapter in place of ``vllm.v1.worker.workspace``; its test functions.

    Every other module the file imports is imported first, for real, so that vLLM's own modules (``gpu_worker``
    imports the workspace module too) keep vLLM's manager; only the test file sees the adapter."""
    import ast

    import vllm.v1.worker as worker_pkg

    target = "vllm.v1.worker.workspace"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            if name != target:
                importlib.import_module(name)
    adapter = _adapter()
    spec = importlib.util.spec_from_file_location("vllm_own_test_workspace", path)
    module = importlib.util.module_from_spec(spec)
    real = sys.modules[target]
    sys.modules[target] = adapter
    try:
        with mock.patch.object(worker_pkg, "workspace", adapter):
            spec.loader.exec_module(module)
    finally:
        sys.modules[target] = real
    leaked = [n for n, v in vars(module).items() if v is real or v is getattr(real, "WorkspaceManager", None)]
    assert not leaked, f"vLLM's test file kept vLLM's own manager in {leaked}: it would not test tqlab's"
    return {name: obj for name, obj in vars(module).items() if name.startswith("test_") and callable(obj)}


if _SOURCE:
    if not Path(_SOURCE).is_file():
        raise pytest.UsageError(f"{ENV}={_SOURCE!r}: no such file")
    for _name, _fn in _load_vllm_tests(Path(_SOURCE)).items():
        globals()[f"{_name}__vllm_own"] = _fn
else:
    @pytest.mark.skip(reason=f"{ENV} is not set: vLLM's own tests/v1/worker/test_workspace.py at the installed "
                             "release's tag is not in the wheel (see this module's docstring)")
    def test_vllm_own_workspace_tests():
        """Placeholder that says why vLLM's own tests did not run."""
