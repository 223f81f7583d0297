"""Trace a live workspace manager (vLLM's or tqlab's): who asked for how many bytes, sizes at each lock, violations.

:class:`WorkspaceTracer` wraps the manager's growth path and ``lock``/``unlock`` on the instance
(no vLLM file is edited); :func:`install_vllm_hook` does it for every vLLM manager a process creates.
"""

from __future__ import annotations

import atexit
import contextvars
import importlib.util
import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable


from tqlab.vllm.trace_types import (  # re-exported: tqlab.vllm.tracer was their home
    REFUSAL_KINDS as REFUSAL_KINDS,
    CallerStats as CallerStats,
    LockRecord as LockRecord,
    PersistentStats as PersistentStats,
    Violation as Violation,
    format_trace_report as format_trace_report,
)


VLLM_WORKSPACE_MODULE = "vllm.v1.worker.workspace"
VLLM_TURBOQUANT_MODULE = "vllm.v1.attention.backends.turboquant_attn"


def vllm_available() -> bool:
    """True if ``vllm`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_version() -> str | None:
    """The vLLM version this process runs, or None without vLLM.

    ``vllm.__version__`` when this process already imported vLLM (the code that actually
    runs: a source checkout on ``sys.path`` may differ from the installed package's
    metadata), else the installed package's metadata (no import); None when ``vllm`` cannot be imported.
    """
    mod = sys.modules.get("vllm")
    imported = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(imported, str) and imported:
        return imported
    if not vllm_available():  # nothing to run (and no ~60 ms scan of every installed package's metadata)
        return None
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


_PENDING_BYTES: contextvars.ContextVar[int | None] = contextvars.ContextVar("tqlab_persistent_bytes", default=None)


def _tensor_type() -> Any:
    import torch

    return torch.Tensor


def _caller(skip_frames: int = 1) -> str:
    """``'file.py:line:function'`` of the first frame outside any workspace manager.

    Skips tqlab's workspace module, ``contextlib`` and every frame whose
    qualified name starts with ``WorkspaceManager.`` (vLLM's own rule); the
    tracer's wrappers carry such names (:func:`_disguise`), so the caller it
    records is the one the manager itself would name.
    """
    frame = sys._getframe(skip_frames)
    while frame is not None:
        code = frame.f_code
        base = _CODE_NAME.get(code)
        if base is None:
            base = _CODE_NAME[code] = "" if _skipped(code) else os.path.basename(code.co_filename)
        if not base:
            frame = frame.f_back
            continue
        return f"{base}:{frame.f_lineno}:{code.co_name}"
    return "unknown"


_CODE_NAME: dict[Any, str] = {}  # code object -> its file's base name, "" when _caller skips it (one lookup per frame)


def _skipped(code: Any) -> bool:
    if getattr(code, "co_qualname", code.co_name).startswith("WorkspaceManager."):
        return True
    fname = os.path.normcase(os.path.abspath(code.co_filename))
    tq = {os.path.normcase(os.path.abspath(sys.modules[m].__file__))
          for m in ("tqlab.core.workspace", "tqlab.core.workspace_slots") if m in sys.modules}
    return fname in tq or fname.endswith(os.path.normcase("contextlib.py"))


def _disguise(fn: Callable, qualname: str, filename: str | None = None) -> Callable:
    """Rename ``fn``'s code so workspace managers skip its frame when they name a caller.

    vLLM skips frames whose ``co_qualname`` starts with ``WorkspaceManager.``;
    tqlab skips frames whose file is ``tqlab/core/workspace.py`` or ``workspace_slots.py``. Without this the
    tracer's wrapper would be reported as the caller in the manager's own
    error message. (``co_qualname`` exists from Python 3.11, as does vLLM.)
    """
    changes: dict[str, Any] = {}
    if hasattr(fn.__code__, "co_qualname"):
        changes["co_qualname"] = qualname
    if filename is not None:
        changes["co_filename"] = filename
    if changes:
        fn.__code__ = fn.__code__.replace(**changes)
    fn.__qualname__ = qualname
    return fn


def _flavor(manager: Any) -> str:
    """``'vllm'`` or ``'tqlab'``: which growth path to wrap. TypeError for anything else."""
    from tqlab.core import workspace as tq_ws

    if isinstance(manager, tq_ws.WorkspaceManager):
        return "tqlab"
    if hasattr(manager, "_ensure_workspace_size") and hasattr(manager, "_current_workspaces"):
        return "vllm"
    raise TypeError(
        f"cannot trace {type(manager).__module__}.{type(manager).__qualname__}: expected vLLM's "
        "vllm.v1.worker.workspace.WorkspaceManager or tqlab.core.workspace.WorkspaceManager"
    )


def _vllm_sizes(manager: Any) -> tuple[int, ...]:
    return tuple(0 if ws is None else ws.numel() * ws.element_size() for ws in manager._current_workspaces)


def _slot_ids(manager: Any, flavor: str) -> tuple[int, int]:
    """``(slot, scratch bytes of that slot)`` the manager uses now; its own ``RuntimeError`` for an
    unconfigured lane (vLLM 0.33 ``WorkspaceManager._get_workspace_id``)."""
    if flavor == "vllm":
        slot = _vllm_slot(manager)
        return slot, _vllm_sizes(manager)[slot]
    slot = manager._current_slot()
    return slot, manager.sizes_bytes()[slot]


def _intended_slot(manager: Any) -> int:
    """The slot id an unconfigured lane asks for (``ubatch * lanes + lane``), for the refusal record."""
    try:
        from vllm.v1.worker.ubatching import dbo_current_ubatch_id
        from vllm.v1.worker.workspace import _workspace_lane

        return int(dbo_current_ubatch_id()) * int(manager._num_lanes) + int(_workspace_lane.get())
    except Exception:  # the record must not fail where the engine's own error is what matters
        return -1


def _key_text(key: Any, limit: int = 200) -> str:
    text = repr(key)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _vllm_slot(manager: Any) -> int:
    """The workspace id vLLM's manager will use now (ubatch * lanes + lane)."""
    get_id = getattr(manager, "_get_workspace_id", None)
    if get_id is not None:
        return int(get_id())
    from vllm.v1.worker.ubatching import dbo_current_ubatch_id  # older vLLM: one lane

    return int(dbo_current_ubatch_id())


class WorkspaceTracer:
    """Record what every caller asks of a workspace manager, the size at lock, and violations.

    Usage::

        tracer = WorkspaceTracer().attach(manager)   # or: with WorkspaceTracer(manager) as t:
        ...                                          # run the engine
        print(tracer.format())                       # per-caller high-water marks
        tracer.detach()

    ``attach`` wraps methods on the instance only (the class and other
    managers are untouched); ``detach`` restores them. One tracer can watch
    several managers. Thread-safe: DBO ubatch threads may call concurrently.
    ``on_event``, if set, is called with ``"lock"``, ``"unlock"`` or
    ``"refused"`` right after that event is recorded -- for a refusal, before
    the manager's ``AssertionError`` propagates (the vLLM plugin flushes its
    record there, :mod:`tqlab.vllm.trace_record`).

    Attributes:
        callers: ``{caller: CallerStats}``.
        violations: list of :class:`Violation` in order.
        locks: list of :class:`LockRecord` (locks and unlocks) in order.
    """

    def __init__(self, manager: Any = None):
        self.callers: dict[str, CallerStats] = {}
        self.violations: list[Violation] = []
        self.locks: list[LockRecord] = []
        self.persistent: dict[tuple[str, str], PersistentStats] = {}
        self._attached: list[tuple[Any, dict[str, Any]]] = []
        self._mutex = threading.Lock()
        self.on_event: Callable[[str], None] | None = None
        if manager is not None:
            self.attach(manager)

    # -- attaching ----------------------------------------------------------- #
    def attach(self, manager: Any) -> "WorkspaceTracer":
        """Start recording ``manager``'s requests. Returns self.

        Raises ``TypeError`` for an object that is not a vLLM or tqlab
        workspace manager, ``ValueError`` if this tracer already watches it.
        """
        flavor = _flavor(manager)
        if any(m is manager for m, _ in self._attached):
            raise ValueError("this tracer is already attached to that manager")
        saved = {name: manager.__dict__.get(name, _MISSING) for name in (
            "_ensure_workspace_size", "get_simultaneous", "lock", "unlock", "get_persistent_resource", "get_persistent")}
        if flavor == "vllm":
            self._wrap_vllm(manager)
        else:
            self._wrap_tqlab(manager)
        if hasattr(manager, "get_persistent_resource"):
            self._wrap_persistent(manager, flavor)
        self._attached.append((manager, saved))
        return self

    def detach(self, manager: Any = None) -> None:
        """Stop recording (one manager, or all). The records are kept."""
        keep = []
        for m, saved in self._attached:
            if manager is not None and m is not manager:
                keep.append((m, saved))
                continue
            for name, old in saved.items():
                if old is _MISSING:
                    m.__dict__.pop(name, None)
                else:
                    m.__dict__[name] = old
        self._attached = keep

    @property
    def attached(self) -> bool:
        return bool(self._attached)

    def managers(self) -> list[Any]:
        """The managers this tracer watches now, in attach order."""
        return [m for m, _ in self._attached]

    def __enter__(self) -> "WorkspaceTracer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- recording ------------------------------------------------------------ #
    def _stats(self, caller: str, nbytes: int, slot: int, locked: bool) -> CallerStats:
        """The caller's stats with one more request counted (call with the mutex held)."""
        st = self.callers.get(caller)
        if st is None:
            st = self.callers[caller] = CallerStats(caller)
        st.requests += 1
        st.last_bytes = nbytes
        if nbytes > st.high_water_bytes:
            st.high_water_bytes = nbytes
        if locked:
            st.after_lock_bytes = max(st.after_lock_bytes, nbytes)
        else:
            st.before_lock_bytes = max(st.before_lock_bytes, nbytes)
        if slot not in st.slots:
            st.slots.append(slot)
        return st

    def _record_request(self, caller: str, nbytes: int, slot: int, grew: bool, locked: bool = False) -> None:
        with self._mutex:
            self._stats(caller, nbytes, slot, locked).growths += int(grew)

    def _record_violation(self, caller: str, nbytes: int | None, current: int, slot: int, message: str,
                          kind: str = "scratch", key: str | None = None) -> None:
        with self._mutex:
            if kind == "scratch":
                self._stats(caller, nbytes or 0, slot, True).violations += 1
            else:
                st = self._persistent_stats(caller, key or "?", slot, nbytes, created=False,
                                            count=kind != "persistent_shape")  # that request was counted already
                st.refused += 1
            self.violations.append(Violation(caller, nbytes, current, slot, message, kind, key))
        self._notify("refused")

    def _persistent_stats(self, caller: str, key: str, slot: int, nbytes: int | None, created: bool,
                          count: bool = True) -> "PersistentStats":
        """The (caller, key) persistent-resource stats, with one more request counted if ``count`` (mutex held)."""
        st = self.persistent.get((caller, key))
        if st is None:
            st = self.persistent[(caller, key)] = PersistentStats(caller, key)
        st.requests += int(count)
        st.created += int(created)
        if nbytes is not None:
            st.nbytes = nbytes
        if slot not in st.slots:
            st.slots.append(slot)
        return st

    def _record_lock(self, kind: str, sizes: tuple[int, ...], caller: str) -> None:
        with self._mutex:
            self.locks.append(LockRecord(kind, sizes, caller))
        self._notify(kind)

    def _notify(self, event: str) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _wrap_vllm(self, manager: Any) -> None:
        tracer = self
        ensure = manager._ensure_workspace_size  # bound method of the class
        lock, unlock = manager.lock, manager.unlock

        def _ensure_workspace_size(required_bytes: int):
            caller = _caller(2)
            try:
                slot = _vllm_slot(manager)
            except RuntimeError as e:  # a lane the manager was not built with: vLLM's own error, recorded
                tracer._record_violation(caller, required_bytes, 0, _intended_slot(manager), str(e), "lane")
                raise
            current = _vllm_sizes(manager)[slot]
            try:
                out = ensure(required_bytes)
            except AssertionError as e:
                if manager.is_locked() and current < required_bytes:
                    tracer._record_violation(caller, required_bytes, current, slot, str(e))
                raise
            tracer._record_request(caller, required_bytes, slot, current < required_bytes, manager.is_locked())
            return out

        def _lock(*a, **k):
            out = lock(*a, **k)
            tracer._record_lock("lock", _vllm_sizes(manager), _caller(2))
            return out

        def _unlock(*a, **k):
            out = unlock(*a, **k)
            tracer._record_lock("unlock", _vllm_sizes(manager), _caller(2))
            return out

        # vLLM's manager names its caller by frame qualname (it has no workspace_wrapper): hence _disguise, here only
        manager._ensure_workspace_size = _disguise(_ensure_workspace_size, "WorkspaceManager._ensure_workspace_size")
        manager.lock = _disguise(_lock, "WorkspaceManager.lock")
        manager.unlock = _disguise(_unlock, "WorkspaceManager.unlock")

    def _wrap_tqlab(self, manager: Any) -> None:
        from tqlab.core import workspace as tq_ws

        tracer = self
        get = manager.get_simultaneous
        lock, unlock = manager.lock, manager.unlock

        def get_simultaneous(*shapes_and_dtypes):
            caller = _caller(2)
            slot = tq_ws.current_ubatch_id()
            try:
                need = manager.layout(*shapes_and_dtypes).total_bytes  # the manager's cached layout
                current = manager.size_bytes(slot)
            except (TypeError, ValueError):
                return get(*shapes_and_dtypes)  # let the manager raise its own error
            try:
                out = get(*shapes_and_dtypes)
            except tq_ws.WorkspaceLockedError as e:
                tracer._record_violation(caller, need, current, slot, str(e))
                raise
            tracer._record_request(caller, need, slot, current < need, manager.is_locked())
            return out

        def _lock(*a, **k):
            out = lock(*a, **k)
            tracer._record_lock("lock", tuple(manager.sizes_bytes()), _caller(2))
            return out

        def _unlock(*a, **k):
            out = unlock(*a, **k)
            tracer._record_lock("unlock", tuple(manager.sizes_bytes()), _caller(2))
            return out

        # tqlab's manager skips frames marked with workspace_wrapper when it names a caller (no _disguise needed)
        manager.get_simultaneous = tq_ws.workspace_wrapper(get_simultaneous)
        manager.lock = tq_ws.workspace_wrapper(_lock, wraps=("lock",))
        manager.unlock = tq_ws.workspace_wrapper(_unlock, wraps=("lock",))

    def _wrap_persistent(self, manager: Any, flavor: str) -> None:
        """Record ``get_persistent_resource`` / ``get_persistent`` and every refusal they raise.

        vLLM 0.33 ``vllm/v1/worker/workspace.py``: ``get_persistent_resource`` raises
        ``AssertionError`` for a key the slot lacks once locked; ``get_persistent`` (Marlin's
        locks, ``marlin_utils.get_marlin_workspace``) raises ``ValueError`` for a cached key of
        another shape/dtype; ``_get_workspace_id`` a ``RuntimeError`` for an unknown lane. Each
        is recorded (and the plugin's record flushed) before it propagates.
        """
        tracer = self
        get_res, get_pers = manager.get_persistent_resource, manager.get_persistent
        store = "_persistent_resources" if flavor == "vllm" else "_persistent"

        def get_persistent_resource(key, factory, *args, **kwargs):  # extra arguments pass through untouched
            caller, nbytes = _caller(2), _PENDING_BYTES.get()
            try:
                slot, current = _slot_ids(manager, flavor)
            except RuntimeError as e:
                tracer._record_violation(caller, nbytes, 0, _intended_slot(manager), str(e), "lane", _key_text(key))
                raise
            missing = key not in getattr(manager, store)[slot]
            try:
                out = get_res(key, factory, *args, **kwargs)
            except AssertionError as e:
                if missing and manager.is_locked():
                    tracer._record_violation(caller, nbytes, current, slot, str(e), "persistent", _key_text(key))
                raise
            with tracer._mutex:
                tracer._persistent_stats(caller, _key_text(key), slot, nbytes, created=missing)
            return out

        def get_persistent(key, shape, dtype, *args, **kwargs):
            try:
                nbytes = math.prod(shape) * dtype.itemsize
            except (TypeError, AttributeError):
                nbytes = None
            token = _PENDING_BYTES.set(nbytes)
            try:
                return get_pers(key, shape, dtype, *args, **kwargs)
            except ValueError as e:
                if str(e).startswith("Persistent workspace"):
                    slot, current = _slot_ids(manager, flavor)
                    tracer._record_violation(_caller(2), nbytes, current, slot, str(e), "persistent_shape",
                                             _key_text((_tensor_type(), key)))
                raise
            finally:
                _PENDING_BYTES.reset(token)

        manager.get_persistent_resource = _disguise(get_persistent_resource, "WorkspaceManager.get_persistent_resource")
        manager.get_persistent = _disguise(get_persistent, "WorkspaceManager.get_persistent")

    # -- results -------------------------------------------------------------- #
    def size_at_lock(self) -> tuple[int, ...] | None:
        """Slot sizes (bytes) right after the most recent ``lock()``, or None if never locked."""
        for rec in reversed(self.locks):
            if rec.kind == "lock":
                return rec.sizes_bytes
        return None

    def high_water_bytes(self) -> int:
        """The largest single request seen from any caller (bytes)."""
        return max((s.high_water_bytes for s in self.callers.values()), default=0)

    @property
    def total_requests(self) -> int:
        return sum(s.requests for s in self.callers.values())

    def report(self) -> dict[str, Any]:
        """JSON-ready summary: callers (largest first), locks, violations."""
        callers = sorted(self.callers.values(), key=lambda s: (-s.high_water_bytes, s.caller))
        return {
            "callers": [s.to_dict() for s in callers],
            "size_at_lock_bytes": None if self.size_at_lock() is None else list(self.size_at_lock()),
            "locks": [r.to_dict() for r in self.locks],
            "violations": [v.to_dict() for v in self.violations],
            "persistent": [p.to_dict() for p in self.persistent.values()],
        }

    def format(self) -> str:
        """A plain-text table of the report (sizes in MiB = 2**20 bytes); see :func:`format_trace_report`."""
        return format_trace_report(self.report())


_MISSING = object()

# --------------------------------------------------------------------------- #
# A process-wide hook for real vLLM deployments                               #
# --------------------------------------------------------------------------- #

_HOOK: dict[str, Any] = {}


def install_vllm_hook(json_path: str | os.PathLike | None = None, *, tracer: WorkspaceTracer | None = None,
                      on_attach: Callable[[Any], None] | None = None) -> WorkspaceTracer:
    """Trace every vLLM workspace manager this process creates (and the current one).

    Wraps ``vllm.v1.worker.workspace.WorkspaceManager.__init__`` so each new
    manager gets the returned tracer attached; if a manager already exists it
    is attached now; ``on_attach(manager)`` is then called. ``tracer``: the one to
    attach (default a new :class:`WorkspaceTracer`). Run this in the
    process that owns the GPU (vLLM's worker / EngineCore process); the
    ``vllm.general_plugins`` entry point :mod:`tqlab.vllm_plugin` does, when
    ``TQLAB_VLLM_TRACE`` is set. With ``json_path`` the tracer's report is
    written there as JSON when the process exits. Idempotent: a second call
    returns the same tracer. Imports vLLM; raises ``ImportError`` without it.
    """
    if "tracer" in _HOOK:
        return _HOOK["tracer"]
    import importlib

    ws = importlib.import_module(VLLM_WORKSPACE_MODULE)
    tracer = WorkspaceTracer() if tracer is None else tracer
    cls = ws.WorkspaceManager
    orig_init = cls.__init__

    def __init__(self, *a, **k):
        orig_init(self, *a, **k)
        tracer.attach(self)
        if on_attach is not None:
            on_attach(self)

    cls.__init__ = _disguise(__init__, "WorkspaceManager.__init__")
    _HOOK.update(tracer=tracer, cls=cls, init=orig_init)
    if ws.is_workspace_manager_initialized():
        tracer.attach(ws.current_workspace_manager())
        if on_attach is not None:
            on_attach(ws.current_workspace_manager())
    if json_path is not None:
        def _dump(p=Path(json_path).absolute()) -> None:  # resolved now: the process may chdir before exit
            report = tracer.report()
            report["pid"] = os.getpid()
            p.write_text(json.dumps(report, indent=2))

        atexit.register(_dump)
        _HOOK["atexit"] = _dump
    return tracer


def uninstall_vllm_hook() -> None:
    """Undo :func:`install_vllm_hook` (class restored, tracer detached, no JSON at exit)."""
    if "tracer" not in _HOOK:
        return
    _HOOK["cls"].__init__ = _HOOK["init"]
    _HOOK["tracer"].detach()
    if "atexit" in _HOOK:
        atexit.unregister(_HOOK["atexit"])
    _HOOK.clear()
