"""Watch a vLLM workspace manager, and predict the locked-workspace crash from a deployment's config.

Two tools for engineers who run vLLM (issue 6):

* :class:`WorkspaceTracer` attaches to a live workspace manager — vLLM's
  ``vllm.v1.worker.workspace.WorkspaceManager`` or tqlab's
  :class:`tqlab.workspace.WorkspaceManager` — by wrapping its growth path on
  the instance (vLLM: ``_ensure_workspace_size``, which every
  ``get_simultaneous`` call goes through with the call's total bytes; tqlab:
  ``get_simultaneous``) and ``lock``/``unlock``. No vLLM file is edited. It
  records, per caller (``'file.py:line:function'``, vLLM's format), the number
  of requests and the high-water mark in bytes, the size of every slot at each
  lock, and every violation (a request that did not fit a locked workspace)
  with its caller and message. The wrapper frames are named like vLLM's own
  ``WorkspaceManager.*`` frames, so the manager's error text still names the
  real caller. :func:`install_vllm_hook` does the same for every vLLM manager
  a process creates (call it in the worker process, e.g. from a
  ``vllm.general_plugins`` entry point) and can write the trace to JSON at exit.

* :func:`predict` reads a deployment — vLLM engine arguments (a ``vllm serve``
  command line, an argv list or a dict) plus the model's ``config.json`` — and
  says, per workspace consumer of the TurboQuant backend, how many bytes a
  request of N prompt tokens needs, whether that overflows the locked size
  (with and without vLLM PR #44053's reservation), the first call vLLM would
  refuse (the one it dies on), which ``max_num_batched_tokens`` was assumed and
  why, and the largest safe ``max_model_len``. A prompt vLLM rejects for its
  length is reported as rejected, not as a crash. The shape formulas are tqlab's
  (:mod:`tqlab.reservation`), checked against vLLM's own classes by
  ``parity/``. :func:`inspect_vllm` is the ``tqlab inspect-vllm`` command.

vLLM is imported lazily, only by the functions whose names say ``vllm``;
``import tqlab.vllm_trace`` works without it. Units: bytes everywhere, "MB"
in text means 2**20 bytes as in vLLM's messages.

CPU demos of vLLM's own code (:func:`run_vllm_seed_scenario`,
:func:`vllm_reservation_calls`) need :func:`vllm_cpu_patches`: vLLM 0.33's
manager calls ``torch.accelerator.empty_cache()`` on growth, which raises on a
CPU-only torch, and the TurboQuant backend reads ``triton.next_power_of_2``,
which vLLM's no-Triton placeholder lacks. Both are patched for the duration of
the context only, and only when no accelerator / no Triton is present.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO

import torch

from .config import EngineConfig, parse_dtype
from .reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    continuation_workspace_shapes,
    decode_workspace_shapes,
    plan_bytes,
    prompt_chunks,
    reservation_plan,
)
from .workspace import compute_layout, format_mb

__all__ = [
    "BUG_REPORT_LOCKED_MB",
    "BUG_REPORT_REQUIRED_MB",
    "CallerStats",
    "ConsumerNeed",
    "LockRecord",
    "Prediction",
    "RequestPrediction",
    "ScenarioResult",
    "Violation",
    "WorkspaceTracer",
    "bug_report_max_num_batched_tokens",
    "engine_config_from_vllm",
    "format_trace_report",
    "load_parity_results",
    "fake_vllm_configs",
    "inspect_vllm",
    "install_vllm_hook",
    "locked_bytes_without_fix",
    "parse_engine_args",
    "chunk_shapes",
    "compare_managers",
    "compare_reservations",
    "demo_steps",
    "show_parity_banner",
    "predict",
    "run_seed_scenario",
    "run_vllm_seed_scenario",
    "safe_max_model_len",
    "uninstall_vllm_hook",
    "vllm_available",
    "vllm_cpu_patches",
    "vllm_default_limits",
    "vllm_prefill_chunk_requests",
    "vllm_reservation_calls",
    "vllm_version",
]

VLLM_WORKSPACE_MODULE = "vllm.v1.worker.workspace"
VLLM_TURBOQUANT_MODULE = "vllm.v1.attention.backends.turboquant_attn"


def vllm_available() -> bool:
    """True if ``vllm`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_version() -> str | None:
    """The installed vLLM version string, or None (read from package metadata, no import)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- #
# Trace records                                                               #
# --------------------------------------------------------------------------- #


@dataclass
class CallerStats:
    """Everything one caller asked of the workspace.

    ``high_water_bytes`` is the largest single request (a ``get_simultaneous``
    call's total, 256-byte aligned per view, in bytes); ``growths`` counts the
    requests that made the workspace grow; ``violations`` those refused by a
    locked workspace; ``slots`` the ubatch slots (vLLM: workspace ids) used.
    """

    caller: str
    requests: int = 0
    high_water_bytes: int = 0
    last_bytes: int = 0
    growths: int = 0
    violations: int = 0
    slots: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Violation:
    """A request refused by a locked workspace: who, how much, and the manager's own message."""

    caller: str
    required_bytes: int
    current_bytes: int
    slot: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LockRecord:
    """One ``lock()`` or ``unlock()``: ``sizes_bytes`` of every slot right after it."""

    kind: str
    sizes_bytes: tuple[int, ...]
    caller: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sizes_bytes": list(self.sizes_bytes), "caller": self.caller}


def _caller(skip_frames: int = 1) -> str:
    """``'file.py:line:function'`` of the first frame outside any workspace manager.

    Skips tqlab's workspace module, ``contextlib`` and every frame whose
    qualified name starts with ``WorkspaceManager.`` (vLLM's own rule); the
    tracer's wrappers carry such names (:func:`_disguise`), so the caller it
    records is the one the manager itself would name.
    """
    frame = sys._getframe(skip_frames)
    tq_ws = os.path.normcase(os.path.abspath(sys.modules["tqlab.workspace"].__file__))
    while frame is not None:
        code = frame.f_code
        fname = os.path.normcase(os.path.abspath(code.co_filename))
        qual = getattr(code, "co_qualname", code.co_name)
        if (
            fname == tq_ws
            or fname.endswith(os.path.normcase("contextlib.py"))
            or qual.startswith("WorkspaceManager.")
        ):
            frame = frame.f_back
            continue
        return f"{os.path.basename(code.co_filename)}:{frame.f_lineno}:{code.co_name}"
    return "unknown"


def _disguise(fn: Callable, qualname: str, filename: str | None = None) -> Callable:
    """Rename ``fn``'s code so workspace managers skip its frame when they name a caller.

    vLLM skips frames whose ``co_qualname`` starts with ``WorkspaceManager.``;
    tqlab skips frames whose file is ``tqlab/workspace.py``. Without this the
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
    from . import workspace as tq_ws

    if isinstance(manager, tq_ws.WorkspaceManager):
        return "tqlab"
    if hasattr(manager, "_ensure_workspace_size") and hasattr(manager, "_current_workspaces"):
        return "vllm"
    raise TypeError(
        f"cannot trace {type(manager).__module__}.{type(manager).__qualname__}: expected vLLM's "
        "vllm.v1.worker.workspace.WorkspaceManager or tqlab.workspace.WorkspaceManager"
    )


def _vllm_sizes(manager: Any) -> tuple[int, ...]:
    return tuple(0 if ws is None else ws.numel() * ws.element_size() for ws in manager._current_workspaces)


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

    Attributes:
        callers: ``{caller: CallerStats}``.
        violations: list of :class:`Violation` in order.
        locks: list of :class:`LockRecord` (locks and unlocks) in order.
    """

    def __init__(self, manager: Any = None):
        self.callers: dict[str, CallerStats] = {}
        self.violations: list[Violation] = []
        self.locks: list[LockRecord] = []
        self._attached: list[tuple[Any, dict[str, Any]]] = []
        self._mutex = threading.Lock()
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
        saved = {name: manager.__dict__.get(name, _MISSING) for name in ("_ensure_workspace_size", "get_simultaneous", "lock", "unlock")}
        if flavor == "vllm":
            self._wrap_vllm(manager)
        else:
            self._wrap_tqlab(manager)
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

    def __enter__(self) -> "WorkspaceTracer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- recording ------------------------------------------------------------ #
    def _record_request(self, caller: str, nbytes: int, slot: int, grew: bool) -> None:
        with self._mutex:
            st = self.callers.get(caller)
            if st is None:
                st = self.callers[caller] = CallerStats(caller)
            st.requests += 1
            st.last_bytes = nbytes
            st.high_water_bytes = max(st.high_water_bytes, nbytes)
            st.growths += int(grew)
            if slot not in st.slots:
                st.slots.append(slot)

    def _record_violation(self, caller: str, nbytes: int, current: int, slot: int, message: str) -> None:
        with self._mutex:
            st = self.callers.get(caller)
            if st is None:
                st = self.callers[caller] = CallerStats(caller)
            st.requests += 1
            st.violations += 1
            st.last_bytes = nbytes
            st.high_water_bytes = max(st.high_water_bytes, nbytes)
            if slot not in st.slots:
                st.slots.append(slot)
            self.violations.append(Violation(caller, nbytes, current, slot, message))

    def _wrap_vllm(self, manager: Any) -> None:
        tracer = self
        ensure = manager._ensure_workspace_size  # bound method of the class
        lock, unlock = manager.lock, manager.unlock

        def _ensure_workspace_size(required_bytes: int):
            caller = _caller(2)
            slot = _vllm_slot(manager)
            current = _vllm_sizes(manager)[slot]
            try:
                out = ensure(required_bytes)
            except AssertionError as e:
                if manager.is_locked() and current < required_bytes:
                    tracer._record_violation(caller, required_bytes, current, slot, str(e))
                raise
            tracer._record_request(caller, required_bytes, slot, current < required_bytes)
            return out

        def _lock(*a, **k):
            out = lock(*a, **k)
            tracer.locks.append(LockRecord("lock", _vllm_sizes(manager), _caller(2)))
            return out

        def _unlock(*a, **k):
            out = unlock(*a, **k)
            tracer.locks.append(LockRecord("unlock", _vllm_sizes(manager), _caller(2)))
            return out

        manager._ensure_workspace_size = _disguise(_ensure_workspace_size, "WorkspaceManager._ensure_workspace_size")
        manager.lock = _disguise(_lock, "WorkspaceManager.lock")
        manager.unlock = _disguise(_unlock, "WorkspaceManager.unlock")

    def _wrap_tqlab(self, manager: Any) -> None:
        from . import workspace as tq_ws

        tracer = self
        get = manager.get_simultaneous
        lock, unlock = manager.lock, manager.unlock

        def get_simultaneous(*shapes_and_dtypes):
            caller = _caller(2)
            slot = tq_ws.current_ubatch_id()
            try:
                need = compute_layout(shapes_and_dtypes).total_bytes
                current = manager.size_bytes(slot)
            except (TypeError, ValueError):
                return get(*shapes_and_dtypes)  # let the manager raise its own error
            try:
                out = get(*shapes_and_dtypes)
            except tq_ws.WorkspaceLockedError as e:
                tracer._record_violation(caller, need, current, slot, str(e))
                raise
            tracer._record_request(caller, need, slot, current < need)
            return out

        def _lock(*a, **k):
            out = lock(*a, **k)
            tracer.locks.append(LockRecord("lock", tuple(manager.sizes_bytes()), _caller(2)))
            return out

        def _unlock(*a, **k):
            out = unlock(*a, **k)
            tracer.locks.append(LockRecord("unlock", tuple(manager.sizes_bytes()), _caller(2)))
            return out

        # tqlab names the first frame outside tqlab/workspace.py: file the wrappers there.
        # tqlab's manager skips frames marked as wrappers when it names a caller
        manager.get_simultaneous = tq_ws.workspace_wrapper(get_simultaneous)
        manager.lock = tq_ws.workspace_wrapper(_lock, wraps=("lock",))
        manager.unlock = tq_ws.workspace_wrapper(_unlock, wraps=("lock",))

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
        }

    def format(self) -> str:
        """A plain-text table of the report (sizes in MB = 2**20 bytes); see :func:`format_trace_report`."""
        return format_trace_report(self.report())


def format_trace_report(report: Mapping[str, Any]) -> str:
    """Text table of a :meth:`WorkspaceTracer.report` (live or loaded from JSON): one line per
    caller (requests, high-water MB, growths, refusals), the size at lock, every violation."""
    lines = [f"{'caller':<52} {'requests':>8} {'high-water MB':>13} {'growths':>7} {'refused':>7}"]
    for c in report["callers"]:
        lines.append(
            f"{c['caller']:<52} {c['requests']:>8} {format_mb(c['high_water_bytes']):>13} {c['growths']:>7} {c['violations']:>7}"
        )
    lock = report.get("size_at_lock_bytes")
    lines.append(
        "size at lock: "
        + ("never locked" if lock is None else ", ".join(f"slot {i}: {format_mb(b)} MB" for i, b in enumerate(lock)))
    )
    for v in report["violations"]:
        lines.append(
            f"VIOLATION slot {v['slot']}: {v['caller']} needs {format_mb(v['required_bytes'])} MB, "
            f"locked at {format_mb(v['current_bytes'])} MB"
        )
    return "\n".join(lines)


PARITY_RESULTS = "parity_results"
"""``data/parity_results.json``: written by ``bash parity/run.sh --record``."""


def load_parity_results() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(provenance, records)`` of the recorded parity run (``data/parity_results.json``).

    ``records`` maps ``'<test name>:<key>'`` to what that test recorded, plus
    ``'summary'`` (outcome counts) and ``'tests'`` (outcome per test).
    Raises ``FileNotFoundError``/``ValueError`` like :func:`tqlab.recorded.load_recorded`.
    """
    from .recorded import load_recorded

    res = load_recorded(PARITY_RESULTS)
    records = dict(res.data.get("records", {}))
    records["summary"] = res.data.get("summary", {})
    records["tests"] = res.data.get("tests", {})
    return dict(res.data["provenance"]), records


_MISSING = object()

# --------------------------------------------------------------------------- #
# A process-wide hook for real vLLM deployments                               #
# --------------------------------------------------------------------------- #

_HOOK: dict[str, Any] = {}


def install_vllm_hook(json_path: str | os.PathLike | None = None) -> WorkspaceTracer:
    """Trace every vLLM workspace manager this process creates (and the current one).

    Wraps ``vllm.v1.worker.workspace.WorkspaceManager.__init__`` so each new
    manager gets the returned tracer attached; if a manager already exists it
    is attached now. Run this in the process that owns the GPU (vLLM's worker
    / EngineCore process), e.g. from a ``vllm.general_plugins`` entry point.
    With ``json_path`` (default: env ``TQLAB_VLLM_TRACE``) the report is
    written there as JSON when the process exits. Idempotent: a second call
    returns the same tracer. Imports vLLM; raises ``ImportError`` without it.
    """
    if "tracer" in _HOOK:
        return _HOOK["tracer"]
    import importlib

    ws = importlib.import_module(VLLM_WORKSPACE_MODULE)
    tracer = WorkspaceTracer()
    cls = ws.WorkspaceManager
    orig_init = cls.__init__

    def __init__(self, *a, **k):
        orig_init(self, *a, **k)
        tracer.attach(self)

    cls.__init__ = _disguise(__init__, "WorkspaceManager.__init__")
    if ws.is_workspace_manager_initialized():
        tracer.attach(ws.current_workspace_manager())
    path = json_path if json_path is not None else os.environ.get("TQLAB_VLLM_TRACE")
    if path:
        def _dump(p=Path(path)) -> None:
            report = tracer.report()
            report["pid"] = os.getpid()
            p.write_text(json.dumps(report, indent=2))

        atexit.register(_dump)
        _HOOK["atexit"] = _dump
    _HOOK.update(tracer=tracer, cls=cls, init=orig_init)
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


# --------------------------------------------------------------------------- #
# vLLM's own classes on CPU (harness pieces shared by parity/ and notebook 07) #
# --------------------------------------------------------------------------- #


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@contextlib.contextmanager
def vllm_cpu_patches() -> Iterator[None]:
    """Let vLLM's workspace and TurboQuant modules run on a CPU-only torch, for this block only.

    * ``torch.accelerator.empty_cache`` becomes a no-op when no accelerator is
      available (vLLM 0.33's manager calls it on every growth; CPU torch raises
      ``RuntimeError: Cannot access accelerator device when none is available``).
    * If Triton is absent, ``turboquant_attn.triton`` gets a ``next_power_of_2``
      (vLLM's Triton placeholder has none; ``_continuation_prefill`` reads it
      before it asks the workspace for its buffers). Kernels still cannot run.

    Both are restored on exit. Nothing is patched on a machine with a GPU.
    Imports vLLM.
    """
    import importlib

    saved_empty = None
    if not torch.accelerator.is_available():
        saved_empty = torch.accelerator.empty_cache
        torch.accelerator.empty_cache = lambda: None
    tq = None
    saved_triton = None
    try:
        tq = importlib.import_module(VLLM_TURBOQUANT_MODULE)
        if not hasattr(tq.triton, "next_power_of_2"):
            saved_triton = tq.triton
            tq.triton = SimpleNamespace(next_power_of_2=_next_power_of_2, placeholder=saved_triton)
        yield
    finally:
        if saved_triton is not None and tq is not None:
            tq.triton = saved_triton
        if saved_empty is not None:
            torch.accelerator.empty_cache = saved_empty


def fake_vllm_configs(config: EngineConfig) -> tuple[Any, Any]:
    """``(vllm_config, kv_cache_spec)`` stand-ins for vLLM's ``TurboQuantMetadataBuilder``.

    The pattern of vLLM's own unit test (PR #44053,
    ``tests/quantization/test_turboquant.py``): ``SimpleNamespace`` configs
    carrying only the fields the builder reads. Per-rank head counts come from
    vLLM's real ``ModelConfig.get_num_attention_heads`` / ``get_num_kv_heads``
    (called on a stand-in model config), and the KV cache spec is vLLM's real
    ``FullAttentionSpec`` with the TurboQuant ``kv_quant_mode``, as
    ``Attention.get_kv_cache_spec`` builds it. Imports vLLM.
    """
    from vllm.config.model import ModelConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    parallel = SimpleNamespace(tensor_parallel_size=config.tensor_parallel_size, decode_context_parallel_size=1)
    model = SimpleNamespace(
        max_model_len=config.max_model_len,
        dtype=config.dtype,
        use_mla=False,
        model_arch_config=SimpleNamespace(
            total_num_attention_heads=config.num_attention_heads,
            total_num_kv_heads=config.num_key_value_heads,
        ),
    )
    model.get_num_attention_heads = lambda pc, arch_config=None: ModelConfig.get_num_attention_heads(model, pc, arch_config)
    model.get_num_kv_heads = lambda pc, arch_config=None: ModelConfig.get_num_kv_heads(model, pc, arch_config)
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
        ),
        model_config=model,
        parallel_config=parallel,
        attention_config=SimpleNamespace(tq_max_kv_splits_for_cuda_graph=config.tq_max_kv_splits_for_cuda_graph),
        speculative_config=None,
    )
    quant = KVQuantMode[config.kv_cache_dtype.upper()] if config.is_turboquant else KVQuantMode.NONE
    spec = FullAttentionSpec(
        block_size=config.block_size,
        num_kv_heads=model.get_num_kv_heads(parallel),
        head_size=config.head_dim,
        head_size_v=config.head_dim,
        dtype=torch.uint8,
        kv_quant_mode=quant,
    )
    return vllm_config, spec


def vllm_reservation_calls(config: EngineConfig) -> list[tuple]:
    """The ``get_simultaneous`` calls vLLM's ``TurboQuantMetadataBuilder.__init__`` makes for ``config``.

    Builds the real builder with :func:`fake_vllm_configs` and a stand-in
    workspace manager that records calls (vLLM's unit-test pattern), patched
    into ``turboquant_attn`` for the duration of the call. Returns a list of
    calls, each a tuple of ``(shape, dtype)`` pairs. Imports vLLM.
    """
    import importlib

    tq = importlib.import_module(VLLM_TURBOQUANT_MODULE)
    calls: list[tuple] = []

    class _Recorder:
        def get_simultaneous(self, *shapes_and_dtypes):
            calls.append(tuple((tuple(s), d) for s, d in shapes_and_dtypes))
            return []

    vllm_config, spec = fake_vllm_configs(config)
    saved = tq.current_workspace_manager, tq.is_workspace_manager_initialized
    tq.current_workspace_manager = lambda: _Recorder()
    tq.is_workspace_manager_initialized = lambda: True
    try:
        tq.TurboQuantMetadataBuilder(
            kv_cache_spec=spec,
            layer_names=["model.layers.0.self_attn.attn"],
            vllm_config=vllm_config,
            device=torch.device("cpu"),
        )
    finally:
        tq.current_workspace_manager, tq.is_workspace_manager_initialized = saved
    return calls


@dataclass
class ScenarioResult:
    """Outcome of the seed scenario (decode warm-up, lock, one long continuation chunk).

    ``error`` is the manager's message if the continuation was refused (the
    bug), else None. ``reached_kernel`` is True when the consumer got its
    buffers and then stopped at the kernel launch (vLLM on CPU: Triton
    kernels cannot run), ``kernel_error`` says how. ``trace`` is the tracer's
    report; ``size_at_lock`` the slot sizes at lock (bytes).
    """

    backend: str
    fixed: bool
    cached_len: int
    error: str | None
    size_at_lock: tuple[int, ...] | None
    trace: dict[str, Any]
    reached_kernel: bool = False
    kernel_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["size_at_lock"] = None if self.size_at_lock is None else list(self.size_at_lock)
        return d


def _run_until_kernel(tracer: WorkspaceTracer, fn: Callable[[], Any]) -> tuple[bool, str | None]:
    """Run a vLLM attention method until its first Triton kernel stops it (CPU).

    Returns ``(stopped_at_kernel, how)``. A workspace violation recorded by
    ``tracer`` is re-raised (AssertionError): that is the bug, not the kernel.
    """
    refused_before = len(tracer.violations)
    try:
        fn()
    except AssertionError:
        if len(tracer.violations) > refused_before:
            raise
        return True, "AssertionError outside the workspace"
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run here
        return True, f"{type(e).__name__}: {e}"
    return False, None


def _bare_vllm_impl(tq: Any, config: EngineConfig) -> Any:
    """A ``TurboQuantAttentionImpl`` with only the attributes its prefill/decode paths read
    before their workspace calls (vLLM 0.33). Quantization fields are placeholders."""
    impl = object.__new__(tq.TurboQuantAttentionImpl)
    impl.head_size = config.head_dim
    impl.num_heads = config.num_heads_per_rank
    impl.num_kv_heads = config.num_kv_heads_per_rank
    impl.max_num_kv_splits = config.tq_max_kv_splits_for_cuda_graph
    impl._mse_bytes = impl._val_data_bytes = 1
    impl._soa_store = False
    impl.scale = 1.0
    impl.sinks = impl.sliding_window = None
    impl.tq_config = SimpleNamespace(
        key_mse_bits=3, key_packed_size=1, effective_value_quant_bits=3, value_packed_size=1,
        key_fp8=False, norm_correction=False,
    )
    return impl


def _vllm_prefill_chunk(impl: Any, config: EngineConfig, cached_len: int, q_len: int) -> Any:
    """One request's chunk through vLLM's ``_prefill_attention`` (its real path choice by ``q_len``)."""
    seq = cached_len + q_len
    loc = torch.tensor([0, q_len], dtype=torch.int32)
    lens = torch.tensor([seq], dtype=torch.int32)
    md = SimpleNamespace(
        max_query_len=q_len, max_seq_len=seq, query_start_loc=loc, query_start_loc_cpu=loc,
        seq_lens=lens, seq_lens_cpu=lens,
        block_table=torch.zeros(1, -(-seq // config.block_size), dtype=torch.int32),
    )
    q = torch.zeros(q_len, config.num_heads_per_rank, config.head_dim, dtype=config.dtype)
    kv = torch.zeros(q_len, config.num_kv_heads_per_rank, config.head_dim, dtype=config.dtype)
    kv_cache = torch.empty(1, config.block_size, config.num_kv_heads_per_rank, 1, dtype=torch.uint8)
    return impl._prefill_attention(q, kv, kv, kv_cache, md, None, None)


def run_vllm_seed_scenario(
    config: EngineConfig | None = None, *, cached_len: int = 4096, q_len: int | None = None, fixed: bool = False
) -> ScenarioResult:
    """The bug report's crash, raised by vLLM's own code on CPU.

    With vLLM's real manager (``vllm.v1.worker.workspace``) on CPU and a
    :class:`WorkspaceTracer` attached: (fixed only) build vLLM's
    ``TurboQuantMetadataBuilder`` so PR #44053's ``_reserve_workspace`` runs;
    warm up vLLM's split-KV decode consumer (``TurboQuantAttentionImpl._decode_attention``)
    at ``max_num_seqs`` rows, as CUDA graph capture does; lock; then send one
    request's chunk of ``q_len`` new tokens (default 129, just over the
    128-token threshold) after ``cached_len`` cached ones through
    ``TurboQuantAttentionImpl._prefill_attention``, which picks the path
    (``_continuation_prefill`` for ``q_len > 128``).

    Without the fix this raises vLLM's assertion (returned in ``error``); for
    the seed (nemotron per rank: Hq 4, Hk 1, D 128, 4 seqs, 32 splits, bf16,
    cached_len 4096) the text ends "requires 2.00 MB, current size is 0.26 MB.
    Workspace growth is not allowed after locking.". The methods run on a bare
    ``TurboQuantAttentionImpl`` with only the attributes they read before
    their workspace call; the Triton kernels after it cannot run on CPU
    (``reached_kernel``/``kernel_error``). Uses vLLM 0.33's private methods;
    imports vLLM. The global vLLM workspace manager is reset before and after.
    """
    import importlib

    config = EngineConfig.from_preset("nemotron-3-super-120b-a12b") if config is None else config
    q_len = CONTINUATION_DECODE_THRESHOLD + 1 if q_len is None else q_len
    if cached_len < 1 or q_len < 1:
        raise ValueError(f"cached_len and q_len must be >= 1, got {cached_len}, {q_len}")
    ws = importlib.import_module(VLLM_WORKSPACE_MODULE)
    with vllm_cpu_patches():
        tq = importlib.import_module(VLLM_TURBOQUANT_MODULE)
        ws.reset_workspace_manager()
        ws.init_workspace_manager(torch.device("cpu"), config.num_ubatches)
        tracer = WorkspaceTracer(ws.current_workspace_manager())
        try:
            if fixed:
                vllm_config, spec = fake_vllm_configs(config)
                tq.TurboQuantMetadataBuilder(spec, ["model.layers.0.self_attn.attn"], vllm_config, torch.device("cpu"))
            impl = _bare_vllm_impl(tq, config)
            query = torch.zeros(config.max_num_seqs, config.num_heads_per_rank, config.head_dim, dtype=config.dtype)
            before = tracer.total_requests
            _run_until_kernel(tracer, lambda: impl._decode_attention(query, None, None, None, None))
            if tracer.total_requests == before:
                raise RuntimeError("vLLM's _decode_attention made no workspace request: the harness no longer matches vLLM")
            ws.lock_workspace()
            error, reached, kerr = None, False, None
            try:
                reached, kerr = _run_until_kernel(tracer, lambda: _vllm_prefill_chunk(impl, config, cached_len, q_len))
            except AssertionError as e:
                error = str(e)
            return ScenarioResult("vllm", fixed, cached_len, error, tracer.size_at_lock(), tracer.report(), reached, kerr)
        finally:
            tracer.detach()
            ws.reset_workspace_manager()


def vllm_prefill_chunk_requests(config: EngineConfig, cached_len: int, q_len: int) -> list[tuple[str, int]]:
    """Workspace requests vLLM's TurboQuant prefill path makes for one chunk, as ``[(caller, bytes)]``.

    Sends one request's chunk (``q_len`` new tokens after ``cached_len``
    cached ones) through ``TurboQuantAttentionImpl._prefill_attention`` with
    vLLM's real (unlocked) manager and a tracer, and returns what the tracer
    saw before the first Triton kernel stopped the run. vLLM 0.33: a chunk of
    at most 128 new tokens takes the decode kernel *without* workspace buffers
    (``triton_turboquant_decode_attention`` allocates its own), so the list is
    empty; a longer one asks for the two dequant buffers in
    ``_continuation_prefill``. Imports vLLM; CPU only.
    """
    import importlib

    if cached_len < 1 or q_len < 1:
        raise ValueError(f"cached_len and q_len must be >= 1, got {cached_len}, {q_len}")
    ws = importlib.import_module(VLLM_WORKSPACE_MODULE)
    with vllm_cpu_patches():
        tq = importlib.import_module(VLLM_TURBOQUANT_MODULE)
        ws.reset_workspace_manager()
        ws.init_workspace_manager(torch.device("cpu"))
        tracer = WorkspaceTracer(ws.current_workspace_manager())
        try:
            _run_until_kernel(tracer, lambda: _vllm_prefill_chunk(_bare_vllm_impl(tq, config), config, cached_len, q_len))
            return [(c.caller, c.last_bytes) for c in tracer.callers.values()]
        finally:
            tracer.detach()
            ws.reset_workspace_manager()


def _request(manager: Any, reqs: tuple) -> list[torch.Tensor]:
    """The one call site :func:`compare_managers` drives both managers through (their named caller)."""
    return manager.get_simultaneous(*reqs)


def demo_steps(config: EngineConfig | None = None, cached_len: int | None = None) -> list[tuple]:
    """A short call sequence for :func:`compare_managers`: the seed's calls plus DBO, empty views, unlock.

    Steps are ``("get", slot, reqs)``, ``("lock",)`` or ``("unlock",)``. The
    continuation request is for ``cached_len`` cached tokens (default
    ``max_num_batched_tokens``: the first continuation chunk of a long prompt;
    4096 for the seed preset). Raises ``ValueError`` for ``cached_len < 1``.
    """
    c = EngineConfig.from_preset("nemotron-3-super-120b-a12b") if config is None else config
    cached = c.max_num_batched_tokens if cached_len is None else cached_len
    if isinstance(cached, bool) or not isinstance(cached, int) or cached < 1:
        raise ValueError(f"cached_len must be an int >= 1, got {cached_len!r}")
    dec = decode_workspace_shapes(c.max_num_seqs, c.num_heads_per_rank, c.head_dim, c.tq_max_kv_splits_for_cuda_graph, c.dtype)
    small = decode_workspace_shapes(1, c.num_heads_per_rank, c.head_dim, c.tq_max_kv_splits_for_cuda_graph, c.dtype)
    cont = continuation_workspace_shapes(cached, c.num_kv_heads_per_rank, c.head_dim, c.block_size)
    return [
        ("get", 0, dec),
        ("get", 1, small),
        ("get", 0, (((0, c.head_dim), torch.float32), ((3,), torch.float16))),
        ("lock",),
        ("get", 0, small),
        ("get", 0, cont),
        ("get", 1, dec),
        ("unlock",),
        ("get", 0, cont),
    ]


def _describe(manager: Any, slot: int, fn: Callable[[], list[torch.Tensor]], sizes: Callable[[], list[int]]) -> str:
    try:
        views = fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the comparison
        kind = "AssertionError" if isinstance(e, AssertionError) else type(e).__name__
        return f"{kind}: {e}"
    offs = [v.storage_offset() * v.element_size() for v in views]
    return f"views at byte offsets {offs}; slot sizes {sizes()}"


def compare_managers(steps: Sequence[tuple] | None = None, num_ubatches: int = 2) -> list[dict[str, Any]]:
    """Run ``steps`` through vLLM's ``WorkspaceManager`` and tqlab's, side by side (CPU).

    Both are driven through the same call site, so their refusal messages
    (caller included) can be compared verbatim. Returns one row per step:
    ``{"step", "op", "vllm", "tqlab", "same"}``, outcomes as text (byte
    offsets of the views and each slot's size, or the error). Imports vLLM.
    """
    import importlib
    import threading

    ws = importlib.import_module(VLLM_WORKSPACE_MODULE)
    ub = importlib.import_module("vllm.v1.worker.ubatching")
    from .workspace import WorkspaceManager, ubatch_context

    steps = demo_steps() if steps is None else steps
    rows = []
    with vllm_cpu_patches():
        v = ws.WorkspaceManager(torch.device("cpu"), num_ubatches)
        t = WorkspaceManager("cpu", num_ubatches)
        v_sizes = lambda: [0 if b is None else b.numel() for b in v._current_workspaces]  # noqa: E731
        tid = threading.get_ident()
        for i, step in enumerate(steps):
            if step[0] in ("lock", "unlock"):
                getattr(v, step[0])()
                getattr(t, step[0])()
                a, b = f"locked={v.is_locked()}", f"locked={t.is_locked()}"
                op = step[0]
            else:
                _, slot, reqs = step
                op = f"slot {slot}: " + ", ".join(f"{tuple(sh)} {str(dt).removeprefix('torch.')}" for sh, dt in reqs)
                ub._THREAD_ID_TO_CONTEXT[tid] = slot
                try:
                    a = _describe(v, slot, lambda: _request(v, reqs), v_sizes)
                finally:
                    ub._THREAD_ID_TO_CONTEXT.pop(tid, None)
                with ubatch_context(slot):
                    b = _describe(t, slot, lambda: _request(t, reqs), t.sizes_bytes)
            rows.append({"step": i, "op": op, "vllm": a, "tqlab": b, "same": a == b})
    return rows


def compare_reservations(presets: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """vLLM's ``TurboQuantMetadataBuilder`` reservation calls vs :func:`tqlab.reservation.reservation_plan`, per preset.

    Rows: ``{"preset", "vllm_calls", "tqlab_calls", "reserved_bytes", "same"}``,
    calls as text. Imports vLLM.
    """
    from .config import list_presets

    def fmt(calls):
        return " | ".join(
            ", ".join(f"{tuple(sh)} {str(dt).removeprefix('torch.')}" for sh, dt in call) for call in calls
        )

    rows = []
    with vllm_cpu_patches():
        for name in presets or list_presets():
            cfg = EngineConfig.from_preset(name)
            theirs = vllm_reservation_calls(cfg) if cfg.is_turboquant else []
            ours = [tuple(c) for c in reservation_plan(cfg)]
            rows.append(
                {
                    "preset": name,
                    "vllm_calls": fmt(theirs),
                    "tqlab_calls": fmt(ours),
                    "reserved_bytes": plan_bytes(reservation_plan(cfg)),
                    "same": theirs == ours,
                }
            )
    return rows


def show_parity_banner(provenance: Mapping[str, Any]) -> str:
    """Display a banner over recorded parity results (vLLM not importable here) and return its text.

    Validates the provenance like :func:`tqlab.recorded.validate_provenance`
    (device, date, commit, command, torch) and adds the vLLM version. In a
    Jupyter kernel it is an amber HTML box; elsewhere printed between rules.
    """
    import html as _html

    from .recorded import _in_notebook, validate_provenance

    p = validate_provenance(provenance)
    sha = p["commit"][:12] if len(p["commit"]) == 40 else p["commit"]
    first = (
        f"Recorded parity results: vLLM {p.get('vllm', '?')} on {p['device']}, {p['date']}, commit {sha} "
        "— vLLM is not importable here"
    )
    second = f"command: {p['command']} (torch {p['torch']})"
    if _in_notebook():
        from IPython.display import HTML, display

        display(
            HTML(
                '<div style="border:2px solid #b7791f;background:#fffbeb;color:#744210;'
                'padding:8px 12px;margin:6px 0;border-radius:4px;font-family:sans-serif">'
                f"<b>&#9888; {_html.escape(first)}</b><br><code>{_html.escape(second)}</code></div>"
            )
        )
    else:
        rule = "=" * min(100, max(len(first), len(second)))
        print(f"{rule}\n{first}\n{second}\n{rule}")
    return f"{first}\n{second}"


def _decode_attention(manager: Any, config: EngineConfig, batch: int) -> list[torch.Tensor]:
    """tqlab stand-in for vLLM's split-KV decode consumer (same call, same caller name)."""
    return manager.get_simultaneous(
        *decode_workspace_shapes(batch, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    )


def _continuation_prefill(manager: Any, config: EngineConfig, cached_len: int) -> list[torch.Tensor]:
    """tqlab stand-in for vLLM's continuation-prefill consumer (same call, same caller name)."""
    return manager.get_simultaneous(
        *continuation_workspace_shapes(cached_len, config.num_kv_heads_per_rank, config.head_dim, config.block_size)
    )


def run_seed_scenario(
    config: EngineConfig | None = None, *, cached_len: int = 4096, fixed: bool = False, backend: str = "tqlab"
) -> ScenarioResult:
    """The seed scenario on ``backend="tqlab"`` (our manager, no vLLM needed) or ``"vllm"``.

    tqlab: our :class:`~tqlab.workspace.WorkspaceManager` on CPU with a tracer;
    (fixed) :func:`tqlab.reservation.reserve_workspace`; decode call at
    ``max_num_seqs`` rows; lock; continuation call for ``cached_len``. The
    caller in the message is ``vllm_trace.py:<line>:_continuation_prefill``.
    ``"vllm"`` delegates to :func:`run_vllm_seed_scenario`.
    """
    if backend == "vllm":
        return run_vllm_seed_scenario(config, cached_len=cached_len, fixed=fixed)
    if backend != "tqlab":
        raise ValueError(f"backend must be 'tqlab' or 'vllm', got {backend!r}")
    from .reservation import reserve_workspace
    from .workspace import WorkspaceLockedError, WorkspaceManager, ubatch_context

    config = EngineConfig.from_preset("nemotron-3-super-120b-a12b") if config is None else config
    manager = WorkspaceManager("cpu", config.num_ubatches)
    with WorkspaceTracer(manager) as tracer:
        if fixed:
            reserve_workspace(config, manager)
        for slot in range(config.num_ubatches):
            with ubatch_context(slot):
                _decode_attention(manager, config, config.max_num_seqs)
        manager.lock()
        error = None
        try:
            _continuation_prefill(manager, config, cached_len)
        except WorkspaceLockedError as e:
            error = str(e)
        return ScenarioResult("tqlab", fixed, cached_len, error, tracer.size_at_lock(), tracer.report(), error is None)


# --------------------------------------------------------------------------- #
# Deployment config: vLLM engine args + the model's config.json              #
# --------------------------------------------------------------------------- #

# engine-arg name (underscored) -> EngineConfig field
_INT_ARGS = {
    "tensor_parallel_size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "block_size": "block_size",
}
_BOOL_ARGS = {"enable_chunked_prefill", "enable_dbo", "enforce_eager"}
_FLAG_ONLY = {
    "trust_remote_code", "enable_expert_parallel", "enable_prefix_caching", "no_enable_prefix_caching",
    "enforce_eager", "enable_dbo", "enable_chunked_prefill", "no_enable_chunked_prefill", "disable_log_requests",
    "disable_log_stats", "enable_auto_tool_choice", "async_scheduling", "no_async_scheduling",
}


def _human_int(name: str, value: Any) -> int:
    """vLLM's integer syntax: ``131072``, ``128k`` (x1000), ``128K`` (x1024)."""
    if isinstance(value, bool):
        raise ValueError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    s = str(value).strip()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    try:
        if s and s[-1] in mult:
            num = s[:-1]
            if s[-1].isupper():
                return int(num) * mult[s[-1]]
            return int(float(num) * mult[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer (e.g. 131072 or 128k), got {value!r}") from None


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"--{name.replace('_', '-')} must be true or false, got {value!r}")


def parse_engine_args(engine_args: str | Sequence[str] | Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """vLLM engine arguments -> ``({EngineConfig field: value}, [ignored args])``.

    Accepts a ``vllm serve MODEL --flag value ...`` command line (a string,
    shell-quoted), the same as an argv list, or a dict (keys with ``-`` or
    ``_``, with or without leading ``--``). Understood: ``--tensor-parallel-size``
    / ``-tp``, ``--max-model-len`` (``128k`` syntax too), ``--max-num-seqs``,
    ``--max-num-batched-tokens``, ``--block-size``, ``--dtype``,
    ``--kv-cache-dtype``, ``--[no-]enable-chunked-prefill``, ``--enable-dbo``,
    ``--enforce-eager``, ``--attention-config`` (JSON with
    ``tq_max_kv_splits_for_cuda_graph``). Other arguments are returned as
    ignored. Raises ``ValueError`` naming a bad value.
    """
    if engine_args is None:
        return {}, []
    items: list[tuple[str, Any]] = []
    ignored: list[str] = []
    if isinstance(engine_args, Mapping):
        items = [(str(k).lstrip("-").replace("-", "_"), v) for k, v in engine_args.items()]
    else:
        argv = shlex.split(engine_args) if isinstance(engine_args, str) else [str(a) for a in engine_args]
        i = 0
        while i < len(argv):
            tok = argv[i]
            if not tok.startswith("-"):
                if tok not in ("vllm", "serve", "python", "-m", "vllm.entrypoints.openai.api_server"):
                    items.append(("model", tok))
                i += 1
                continue
            name = tok.lstrip("-").replace("-", "_")
            if "=" in name:
                name, value = name.split("=", 1)
                items.append((name, value))
                i += 1
                continue
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--") and name not in _FLAG_ONLY
            if has_value:
                items.append((name, argv[i + 1]))
                i += 2
            else:
                items.append((name, True))
                i += 1
    out: dict[str, Any] = {}
    for name, value in items:
        if name in _INT_ARGS:
            out[_INT_ARGS[name]] = _human_int(name, value)
        elif name == "no_enable_chunked_prefill":
            out["enable_chunked_prefill"] = not _as_bool(name, value)
        elif name in _BOOL_ARGS:
            out[name] = _as_bool(name, value)
        elif name == "dtype":
            out["dtype"] = str(value)
        elif name == "kv_cache_dtype":
            out["kv_cache_dtype"] = str(value)
        elif name == "attention_config":
            cfg = json.loads(value) if isinstance(value, str) else dict(value)
            if "tq_max_kv_splits_for_cuda_graph" in cfg:
                out["tq_max_kv_splits_for_cuda_graph"] = _human_int(
                    "tq_max_kv_splits_for_cuda_graph", cfg["tq_max_kv_splits_for_cuda_graph"]
                )
        elif name == "model":
            out["model"] = str(value)
        else:
            ignored.append(name if value is True else f"{name}={value}")
    return out, ignored


def _load_model_config(model_config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(model_config, Mapping):
        return dict(model_config)
    p = Path(model_config)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model config {str(model_config)!r}: no such file (expected a config.json or its folder)")
    return json.loads(p.read_text())


def _count_attention_layers(cfg: Mapping[str, Any]) -> int | None:
    """Attention layers of a hybrid model, from the usual config.json hints, else None."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern.count("*")
    for key in ("layer_types", "layers_block_type"):
        types = cfg.get(key)
        if isinstance(types, list) and types:
            return sum(1 for t in types if str(t) in ("full_attention", "attention", "sliding_attention"))
    return None


def vllm_default_limits(usage: str = "serve", gpu_memory_gib: float | None = None) -> tuple[int, int, str]:
    """vLLM 0.33's default ``(max_num_batched_tokens, max_num_seqs, why)`` with chunked prefill on.

    ``usage``: ``"serve"`` (``vllm serve``) or ``"llm"`` (the ``LLM`` class);
    ``gpu_memory_gib``: the GPU's memory in GiB (None: assumed under 70 GiB).
    Under 70 GiB: 2048/8192 tokens, 256 seqs; >= 70 GiB: 8192/16384, 1024;
    >= 160 GiB: 16384, 1024. ``why`` says which case applied, in words.
    Raises ``ValueError`` for another ``usage``.
    """
    if usage not in ("serve", "llm"):
        raise ValueError(f"usage must be 'serve' or 'llm', got {usage!r}")
    mem = 0.0 if gpu_memory_gib is None else float(gpu_memory_gib)
    cmd = "`vllm serve`" if usage == "serve" else "the `LLM` class"
    if mem >= 160:
        return 16384, 1024, f"{cmd} on a GPU of >= 160 GiB"
    if mem >= 70:
        return (8192 if usage == "serve" else 16384), 1024, f"{cmd} on a GPU of >= 70 GiB"
    gpu = "" if gpu_memory_gib is not None else "; GPU size assumed, pass --gpu-memory-gib"
    return (2048 if usage == "serve" else 8192), 256, f"{cmd} on a GPU under 70 GiB{gpu}"


def engine_config_from_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None,
    model_config: str | os.PathLike | Mapping[str, Any],
    *,
    gpu_memory_gib: float | None = None,
    usage: str = "serve",
) -> tuple[EngineConfig, list[str]]:
    """Build an :class:`EngineConfig` from vLLM engine args + a HF ``config.json``.

    Model fields come from ``config.json`` (or its ``text_config``):
    ``num_attention_heads``, ``num_key_value_heads`` (default: the query
    heads), ``head_dim`` (default ``hidden_size // num_attention_heads``),
    attention layers (hybrid hints, else ``num_hidden_layers``), the dtype
    (``torch_dtype``/``dtype``; ``--dtype auto`` keeps it, fp32 checkpoints are
    served in bf16) and ``max_position_embeddings`` (default ``max_model_len``).
    Unset scheduler limits take vLLM 0.33's defaults for ``usage`` (``serve``
    or ``llm``) and a GPU of ``gpu_memory_gib`` (None: under 70 GiB):
    ``max_num_batched_tokens`` 2048/8192 (>= 70 GiB: 8192/16384; >= 160 GiB:
    16384), ``max_num_seqs`` 256 (>= 70 GiB: 1024). ``block_size`` defaults to
    16; hybrid (Mamba) models get larger attention pages in vLLM, so pass
    ``--block-size`` for them. Returns ``(config, notes)``, notes saying what
    was assumed or ignored. Raises ``ValueError`` for missing/invalid fields.
    """
    args, ignored = parse_engine_args(engine_args)
    raw = _load_model_config(model_config)
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), Mapping) else raw
    notes: list[str] = []
    if ignored:
        notes.append("ignored engine args (no effect on the workspace): " + ", ".join(ignored))
    if "num_attention_heads" not in cfg:
        raise ValueError("model config has no num_attention_heads")
    hq = int(cfg["num_attention_heads"])
    hk = int(cfg.get("num_key_value_heads") or hq)
    if cfg.get("head_dim"):
        d = int(cfg["head_dim"])
    elif cfg.get("hidden_size"):
        d = int(cfg["hidden_size"]) // hq
        notes.append(f"head_dim = hidden_size // num_attention_heads = {d}")
    else:
        raise ValueError("model config has neither head_dim nor hidden_size")
    layers = _count_attention_layers(cfg) or int(cfg.get("num_hidden_layers", 1))
    cfg_dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    want = str(args.pop("dtype", "auto"))
    if want == "auto":
        if str(cfg_dtype) in ("float32", "torch.float32"):
            dtype = torch.bfloat16
            notes.append("--dtype auto: the fp32 checkpoint is served in bfloat16")
        else:
            dtype = parse_dtype(str(cfg_dtype))
    else:
        dtype = parse_dtype(want)
    args.pop("model", None)
    mbt, seqs, why = vllm_default_limits(usage, gpu_memory_gib)
    if "max_num_seqs" not in args:
        args["max_num_seqs"] = seqs
        notes.append(f"max_num_seqs not given: vLLM default {seqs} ({why})")
    if "max_model_len" not in args:
        mpe = cfg.get("max_position_embeddings")
        if not mpe:
            raise ValueError("no --max-model-len and no max_position_embeddings in the model config")
        args["max_model_len"] = int(mpe)
        notes.append(f"max_model_len not given: max_position_embeddings = {mpe}")
    if "max_num_batched_tokens" not in args:
        chunked = args.get("enable_chunked_prefill", True)
        args["max_num_batched_tokens"] = max(mbt, args["max_num_seqs"]) if chunked else max(args["max_model_len"], args["max_num_seqs"])
        notes.append(f"max_num_batched_tokens not given: vLLM default {args['max_num_batched_tokens']} "
                     f"({why if chunked else 'chunked prefill off: max(max_model_len, max_num_seqs)'})")
    if "block_size" not in args and _count_attention_layers(cfg) is not None:
        notes.append("hybrid model: vLLM enlarges the attention block size to match the Mamba page; pass --block-size")
    config = EngineConfig(
        num_attention_heads=hq,
        num_key_value_heads=hk,
        head_dim=d,
        num_hidden_layers=layers,
        dtype=dtype,
        **args,
    )
    return config, notes


# --------------------------------------------------------------------------- #
# The predictor                                                               #
# --------------------------------------------------------------------------- #


SHORT_CHUNK = "short continuation (decode kernel)"
DEQUANT_CHUNK = "continuation prefill (dequant)"
DECODE = "split-KV decode"


def chunk_shapes(config: EngineConfig, cached_len: int, q_len: int, *, short_chunks_use_workspace: bool = False):
    """``(consumer, shapes or None)``: the workspace call one prefill chunk makes.

    ``cached_len == 0``: a first chunk, no workspace. ``q_len > 128`` (vLLM's
    ``_CONTINUATION_DECODE_THRESHOLD``): the dequant buffers,
    :func:`tqlab.reservation.continuation_workspace_shapes`. ``q_len <= 128``:
    the decode kernel, which in vLLM 0.33 allocates its own buffers (no
    workspace call; checked by ``parity/``, and tqlab's engine does the same);
    ``short_chunks_use_workspace=True`` models a backend whose short chunks take
    decode views with ``q_len`` rows from the workspace
    (:func:`tqlab.reservation.decode_workspace_shapes`), the variant that needs
    ``max(max_num_seqs, 128)`` decode rows reserved.
    """
    if cached_len == 0:
        return "prefill", None
    if q_len <= CONTINUATION_DECODE_THRESHOLD:
        if short_chunks_use_workspace:
            return SHORT_CHUNK, decode_workspace_shapes(
                q_len, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype
            )
        return SHORT_CHUNK, None
    return DEQUANT_CHUNK, continuation_workspace_shapes(
        cached_len, config.num_kv_heads_per_rank, config.head_dim, config.block_size
    )


def _bytes(shapes) -> int:
    return 0 if shapes is None else compute_layout(shapes).total_bytes


def _chunk_bytes(config: EngineConfig, cached_len: int, q_len: int, short: bool) -> int:
    return _bytes(chunk_shapes(config, cached_len, q_len, short_chunks_use_workspace=short)[1])


@dataclass(frozen=True)
class ConsumerNeed:
    """One workspace consumer's biggest call for a request: shapes, bytes, and whether it fits.

    ``consumer``: ``"split-KV decode"``, ``"short continuation (decode kernel)"``
    or ``"continuation prefill (dequant)"``; ``cached_len``/``q_len`` of the
    chunk that makes the call (decode: ``q_len`` 1, ``cached_len`` the prompt).
    ``shapes`` is None when the consumer makes no workspace call.
    """

    consumer: str
    cached_len: int
    q_len: int
    shapes: tuple | None
    nbytes: int
    fits_unfixed: bool
    fits_fixed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "cached_len": self.cached_len,
            "q_len": self.q_len,
            "shapes": None if self.shapes is None else [[list(s), str(dt).removeprefix("torch.")] for s, dt in self.shapes],
            "nbytes": self.nbytes,
            "fits_unfixed": self.fits_unfixed,
            "fits_fixed": self.fits_fixed,
        }


@dataclass(frozen=True)
class RequestPrediction:
    """A prompt of ``prompt_tokens`` prefilled alone (chunks of ``max_num_batched_tokens``), then decoded.

    ``consumers``: each consumer's *largest* call. ``first_refused_unfixed`` /
    ``first_refused_fixed``: the *first* call, in serving order (chunks in
    order, then decode), that does not fit the locked workspace without / with
    PR #44053 -- the call vLLM dies on (None: every call fits). ``rejected``:
    why vLLM refuses the prompt before it reaches the workspace (vLLM 0.33's
    input processor: a prompt longer than ``max_model_len``, or equal to it,
    leaving no room for one output token), else None; a rejected request has
    no consumers and never crashes.
    """

    prompt_tokens: int
    consumers: tuple[ConsumerNeed, ...]
    need_bytes: int
    crashes_unfixed: bool
    crashes_fixed: bool
    first_refused_unfixed: ConsumerNeed | None = None
    first_refused_fixed: ConsumerNeed | None = None
    rejected: str | None = None

    @property
    def verdict(self) -> str:
        """One line: ``"rejected: exceeds max_model_len (N)"`` or ``"CRASH without the fix, ok with it"`` etc."""
        if self.rejected is not None:
            return f"rejected: {self.rejected}"
        return (
            f"{'CRASH' if self.crashes_unfixed else 'ok'} without the fix, {'CRASH' if self.crashes_fixed else 'ok'} with it"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "verdict": self.verdict,
            "rejected": self.rejected,
            "need_bytes": self.need_bytes,
            "crashes_unfixed": self.crashes_unfixed,
            "crashes_fixed": self.crashes_fixed,
            "first_refused_unfixed": None if self.first_refused_unfixed is None else self.first_refused_unfixed.to_dict(),
            "first_refused_fixed": None if self.first_refused_fixed is None else self.first_refused_fixed.to_dict(),
            "consumers": [c.to_dict() for c in self.consumers],
        }


@dataclass
class Prediction:
    """What :func:`predict` found. Sizes in bytes, lengths in tokens.

    ``locked_unfixed``: the workspace at lock without PR #44053 (decode at the
    largest captured batch, or the measured size passed in). ``locked_fixed``:
    with the reservation. ``first_failing_prompt``: shortest prompt that
    overflows ``locked_unfixed`` when prefilled alone (None: none up to
    ``max_model_len``). ``safe_max_model_len_alone`` / ``_any_schedule``: the
    largest ``max_model_len`` (capped at the configured one) for which no
    request overflows ``locked_unfixed``, for a request alone / for any
    chunking a busy scheduler or a prefix-cache hit can produce.
    ``fixed_safe_any_schedule``: the same bound against ``locked_fixed``.
    ``max_num_batched_tokens_source``: where the chunk size came from
    (given, vLLM's default, a preset); it decides which chunk is refused first.
    """

    config: EngineConfig
    locked_unfixed: int
    locked_fixed: int
    locked_source: str
    requests: list[RequestPrediction]
    first_failing_prompt: int | None
    safe_max_model_len_alone: int | None
    safe_max_model_len_any_schedule: int | None
    fixed_safe_any_schedule: int | None
    short_chunks_use_workspace: bool = False
    notes: list[str] = field(default_factory=list)
    max_num_batched_tokens_source: str = "EngineConfig"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "max_num_batched_tokens_source": self.max_num_batched_tokens_source,
            "locked_unfixed_bytes": self.locked_unfixed,
            "locked_fixed_bytes": self.locked_fixed,
            "locked_source": self.locked_source,
            "short_chunks_use_workspace": self.short_chunks_use_workspace,
            "first_failing_prompt": self.first_failing_prompt,
            "safe_max_model_len_alone": self.safe_max_model_len_alone,
            "safe_max_model_len_any_schedule": self.safe_max_model_len_any_schedule,
            "fixed_safe_any_schedule": self.fixed_safe_any_schedule,
            "requests": [r.to_dict() for r in self.requests],
            "notes": list(self.notes),
        }

    def format(self) -> str:
        """Plain text: the per-rank shape, locked sizes, one block per request, the verdicts."""
        c = self.config
        out = [
            f"per rank: Hq {c.num_heads_per_rank}, Hk {c.num_kv_heads_per_rank}, D {c.head_dim}, "
            f"{str(c.dtype).removeprefix('torch.')}, {c.tq_max_kv_splits_for_cuda_graph} KV splits, block {c.block_size}; "
            f"max_num_seqs {c.max_num_seqs}, max_num_batched_tokens {c.max_num_batched_tokens}, "
            f"chunked prefill {'on' if c.enable_chunked_prefill else 'off'}, max_model_len {c.max_model_len}, "
            f"kv_cache_dtype {c.kv_cache_dtype}",
            f"workspace at lock: {format_mb(self.locked_unfixed)} MB without PR #44053 ({self.locked_source}), "
            f"{format_mb(self.locked_fixed)} MB with it",
        ]
        out.append(f"chunks of max_num_batched_tokens {c.max_num_batched_tokens}: {self.max_num_batched_tokens_source}")
        for r in self.requests:
            if r.rejected is not None:
                out.append(f"request of {r.prompt_tokens} prompt tokens: rejected: {r.rejected} "
                           "(vLLM refuses it before it reaches the workspace)")
                continue
            out.append(f"request of {r.prompt_tokens} prompt tokens (alone), largest call per consumer:")
            for n in r.consumers:
                size = "no workspace" if n.shapes is None else f"{format_mb(n.nbytes):>7} MB"
                out.append(
                    f"  {n.consumer:<35} cached {n.cached_len:>7} q {n.q_len:>6}: {size:>12}  "
                    f"{'fits' if n.fits_unfixed else 'OVERFLOWS'} without the fix, {'fits' if n.fits_fixed else 'OVERFLOWS'} with it"
                )
            for label, first, locked in (("without", r.first_refused_unfixed, self.locked_unfixed),
                                         ("with", r.first_refused_fixed, self.locked_fixed)):
                if first is not None:
                    out.append(
                        f"  first refused call {label} the fix (vLLM dies here): {first.consumer}, cached {first.cached_len} "
                        f"q {first.q_len}: {format_mb(first.nbytes)} MB > {format_mb(locked)} MB at lock"
                    )
            out.append(f"  -> {r.verdict}")
        if self.first_failing_prompt is not None:
            out.append(f"shortest prompt that crashes without the fix (alone): {self.first_failing_prompt} tokens")
        out.append(
            f"safe max_model_len without the fix: {self.safe_max_model_len_alone} (requests alone), "
            f"{self.safe_max_model_len_any_schedule} (any chunking); with the fix: {self.fixed_safe_any_schedule} (any chunking)"
        )
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def locked_bytes_without_fix(config: EngineConfig) -> int:
    """Workspace bytes at lock before PR #44053: the split-KV decode call at the largest captured batch.

    The profile run is one prefill with no cached tokens (no TurboQuant
    workspace call); CUDA graph capture runs decode at each capture size, the
    largest being ``max_num_seqs`` (:meth:`EngineConfig.capture_sizes`); with
    ``enforce_eager`` the warm-up still runs decode at ``max_num_seqs``.
    0 for a non-TurboQuant cache. Checked against vLLM's ``_decode_attention`` by ``parity/``.
    """
    if not config.is_turboquant:
        return 0
    batch = config.max_num_seqs if config.enforce_eager else max(config.capture_sizes())
    return _bytes(
        decode_workspace_shapes(batch, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    )


def _need_any_schedule(config: EngineConfig, length: int, short: bool) -> int:
    """Largest call any chunk of a request of ``length`` tokens can make, under any chunking.

    A continuation chunk has ``cached_len >= 1`` and ``q_len <= max_num_batched_tokens``;
    a busy scheduler can cut ``q_len`` anywhere and a prefix-cache hit can set
    ``cached_len`` (also with chunked prefill off, where the step budget is
    ``max_num_batched_tokens >= max_model_len``). Dequant buffers grow with
    ``cached_len <= length - 129``; short chunks' decode rows (if they use the
    workspace) with ``q_len <= 128``.
    """
    if length < 2 or not config.is_turboquant:
        return 0
    m = config.max_num_batched_tokens
    need = 0
    if short:
        need = _chunk_bytes(config, 1, min(CONTINUATION_DECODE_THRESHOLD, length - 1, m), True)
    c_max = length - (CONTINUATION_DECODE_THRESHOLD + 1)
    if c_max >= 1 and m > CONTINUATION_DECODE_THRESHOLD:
        need = max(need, _chunk_bytes(config, c_max, CONTINUATION_DECODE_THRESHOLD + 1, short))
    return need


def _first_failing_alone(config: EngineConfig, locked: int, limit: int, short: bool) -> int | None:
    """Shortest prompt (<= ``limit``) whose chunks, prefilled alone, overflow ``locked``."""
    if not config.is_turboquant or not config.enable_chunked_prefill:
        return None  # one chunk, no cached tokens
    m = config.max_num_batched_tokens
    if short:
        # Region k holds prompts k*m+1 .. (k+1)*m; its last chunk has cached k*m.
        # The short-chunk need grows with q up to 128; above it the dequant need is flat.
        for start in range(m, limit, m):
            top = min(m, limit - start)
            hi = min(top, CONTINUATION_DECODE_THRESHOLD)
            if _chunk_bytes(config, start, hi, True) > locked:
                lo = 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if _chunk_bytes(config, start, mid, True) > locked:
                        hi = mid
                    else:
                        lo = mid + 1
                return start + lo
            if top > CONTINUATION_DECODE_THRESHOLD and _chunk_bytes(config, start, CONTINUATION_DECODE_THRESHOLD + 1, True) > locked:
                return start + CONTINUATION_DECODE_THRESHOLD + 1
        return None
    if m <= CONTINUATION_DECODE_THRESHOLD:
        return None  # every chunk is short: no workspace in vLLM
    # Chunk k (k >= 1) starts at cached = k*m; it takes the dequant path once q > 128.
    k_max = (limit - CONTINUATION_DECODE_THRESHOLD - 1) // m
    if k_max < 1 or _chunk_bytes(config, k_max * m, m, False) <= locked:
        return None
    lo, hi = 1, k_max  # smallest k whose dequant call overflows
    while lo < hi:
        mid = (lo + hi) // 2
        if _chunk_bytes(config, mid * m, m, False) > locked:
            hi = mid
        else:
            lo = mid + 1
    return lo * m + CONTINUATION_DECODE_THRESHOLD + 1


def safe_max_model_len(
    config: EngineConfig,
    locked_bytes: int,
    *,
    schedule: str = "any",
    limit: int | None = None,
    short_chunks_use_workspace: bool = False,
) -> int | None:
    """Largest ``max_model_len`` (<= ``limit``, default ``config.max_model_len``) whose requests all fit ``locked_bytes``.

    ``schedule="alone"``: each request prefilled alone in chunks of
    ``max_num_batched_tokens``. ``"any"``: any chunking (busy scheduler,
    prefix-cache hits; see :func:`_need_any_schedule`), the bound to trust on
    a real server. Returns None if even a 2-token prompt can overflow.
    Raises ``ValueError`` for a bad ``schedule`` or ``locked_bytes``.
    """
    if schedule not in ("alone", "any"):
        raise ValueError(f"schedule must be 'alone' or 'any', got {schedule!r}")
    if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
        raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
    top = config.max_model_len if limit is None else limit
    if not config.is_turboquant:
        return top
    short = short_chunks_use_workspace
    if schedule == "alone":
        first = _first_failing_alone(config, locked_bytes, top, short)
        if first is None:
            return top
        return None if first <= 2 else first - 1
    if _need_any_schedule(config, 2, short) > locked_bytes:
        return None
    if _need_any_schedule(config, top, short) <= locked_bytes:
        return top
    lo, hi = 2, top  # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _need_any_schedule(config, mid, short) <= locked_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def _rejection(config: EngineConfig, n: int) -> str | None:
    """Why vLLM 0.33's input processor refuses a prompt of ``n`` tokens, or None.

    ``InputProcessor`` rejects a decoder prompt longer than ``max_model_len``,
    and (for generation) one of exactly ``max_model_len`` tokens, which leaves
    no room for the first output token. Either way the request never reaches
    the scheduler, so it makes no workspace call.
    """
    if n > config.max_model_len:
        return f"exceeds max_model_len ({config.max_model_len})"
    if n == config.max_model_len:
        return f"prompt plus one output token exceeds max_model_len ({config.max_model_len})"
    return None


def _serving_calls(config: EngineConfig, n: int, short: bool) -> list[tuple[str, int, int, Any]]:
    """The workspace calls a prompt of ``n`` tokens makes, in serving order: ``[(consumer, cached, q, shapes)]``.

    Its prefill chunks (chunks of ``max_num_batched_tokens`` with chunked
    prefill on, else one chunk), each one that asks the workspace for
    something, then its first decode step (one row, ``cached_len = n``).
    """
    budget = config.max_num_batched_tokens if config.enable_chunked_prefill else n
    calls = []
    for cached, q in prompt_chunks(n, budget):
        consumer, shapes = chunk_shapes(config, cached, q, short_chunks_use_workspace=short)
        if consumer != "prefill":
            calls.append((consumer, cached, q, shapes))
    dec = decode_workspace_shapes(1, config.num_heads_per_rank, config.head_dim, config.tq_max_kv_splits_for_cuda_graph, config.dtype)
    calls.append((DECODE, n, 1, dec))
    return calls


def _request_prediction(config: EngineConfig, n: int, locked_unfixed: int, locked_fixed: int, short: bool) -> RequestPrediction:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"prompt_tokens must be ints >= 1, got {n!r}")
    rejected = _rejection(config, n)
    if rejected is not None:
        return RequestPrediction(n, (), 0, False, False, rejected=rejected)
    best: dict[str, ConsumerNeed] = {}
    first: dict[int, ConsumerNeed] = {}
    for consumer, cached, q, shapes in _serving_calls(config, n, short):
        b = _bytes(shapes)
        need = ConsumerNeed(consumer, cached, q, shapes, b, b <= locked_unfixed, b <= locked_fixed)
        if consumer not in best or b > best[consumer].nbytes:
            best[consumer] = need
        for locked in (locked_unfixed, locked_fixed):
            if shapes is not None and b > locked and locked not in first:
                first[locked] = need
    needs = tuple(best[k] for k in (DECODE, SHORT_CHUNK, DEQUANT_CHUNK) if k in best)
    top = max(x.nbytes for x in needs)
    return RequestPrediction(
        n, needs, top, top > locked_unfixed, top > locked_fixed,
        first_refused_unfixed=first.get(locked_unfixed), first_refused_fixed=first.get(locked_fixed),
    )


BUG_REPORT_REQUIRED_MB = "2.00"
"""The size the bug report (seed 003, vLLM 0.20) quotes for the refused ``_continuation_prefill`` call, as printed."""
BUG_REPORT_LOCKED_MB = "0.26"
"""The workspace size at lock the bug report quotes, as printed (``current size is 0.26 MB``)."""


def bug_report_max_num_batched_tokens(config: EngineConfig) -> int | None:
    """The ``max_num_batched_tokens`` the bug report's "requires 2.00 MB" implies for this deployment, or None.

    The report gives no ``--max-num-batched-tokens``. For a request alone,
    the first call vLLM refuses is the first continuation chunk that takes
    the dequant path, at ``cached_len = max_num_batched_tokens`` (when that
    already overflows); its two fp16 buffers of ``(1, Hk, round_up(cached_len,
    block_size), D)`` take ``2 * Hk * cached * D * 2`` bytes. This returns the
    smallest block-aligned chunk size whose first refused call prints as
    ``BUG_REPORT_REQUIRED_MB`` MB (nemotron per rank: Hk 1, D 128 -> 4096,
    two ``(1, 1, 4096, 128)`` buffers = 2 MiB). None unless this deployment
    locks at the report's ``BUG_REPORT_LOCKED_MB`` MB, is TurboQuant with
    chunked prefill, or if no chunk size fits.
    """
    if not config.is_turboquant or not config.enable_chunked_prefill:
        return None
    locked = locked_bytes_without_fix(config)
    if format_mb(locked) != BUG_REPORT_LOCKED_MB:
        return None
    blk = config.block_size
    per_block = _bytes(continuation_workspace_shapes(blk, config.num_kv_heads_per_rank, config.head_dim, blk))
    target = float(BUG_REPORT_REQUIRED_MB) * (1 << 20)
    guess = max(1, round(target / per_block))
    for blocks in range(max(1, guess - 2), guess + 3):
        m = blocks * blk
        if m <= CONTINUATION_DECODE_THRESHOLD:
            continue
        if m < config.max_num_seqs:
            continue
        cfg = config.replace(max_num_batched_tokens=m, max_model_len=max(config.max_model_len, 2 * m + 1))
        first = _request_prediction(cfg, 2 * m, locked, locked, False).first_refused_unfixed
        if first is not None and format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            return m
    return None


def _bug_report_note(pred: Prediction) -> str | None:
    """A note when a request's first refused call differs from the report's 2.00 MB only by ``max_num_batched_tokens``."""
    c = pred.config
    if pred.locked_source != "decode at the largest captured batch":
        return None
    m = bug_report_max_num_batched_tokens(c)
    if m is None or m == c.max_num_batched_tokens:
        return None
    if m < c.max_num_seqs:
        return None
    other = c.replace(max_num_batched_tokens=m)
    for r in pred.requests:
        first = r.first_refused_unfixed
        if first is None or format_mb(first.nbytes) == BUG_REPORT_REQUIRED_MB:
            continue
        theirs = _request_prediction(other, r.prompt_tokens, pred.locked_unfixed, pred.locked_unfixed, pred.short_chunks_use_workspace)
        t = theirs.first_refused_unfixed
        if t is None or format_mb(t.nbytes) != BUG_REPORT_REQUIRED_MB:
            continue
        hk, d = c.num_kv_heads_per_rank, c.head_dim
        alloc = t.shapes[0][0][2]
        return (
            f"the bug report's '{BUG_REPORT_REQUIRED_MB} MB' is the first refused call with max_num_batched_tokens {m}: "
            f"cached {t.cached_len}, two fp16 (1, {hk}, {alloc}, {d}) buffers = 2 x {hk} x {alloc} x {d} x 2 bytes = "
            f"{t.nbytes:,} bytes. The report does not give max_num_batched_tokens; {m} is inferred from its "
            f"{BUG_REPORT_REQUIRED_MB} MB. This prediction assumes {c.max_num_batched_tokens} "
            f"({pred.max_num_batched_tokens_source}), so a prompt of {r.prompt_tokens} tokens is refused earlier, at cached "
            f"{first.cached_len} with {format_mb(first.nbytes)} MB: the only difference is max_num_batched_tokens"
        )
    return None


def predict(
    config: EngineConfig,
    prompt_tokens: Sequence[int] = (),
    *,
    locked_bytes: int | None = None,
    short_chunks_use_workspace: bool = False,
    max_num_batched_tokens_source: str = "EngineConfig",
) -> Prediction:
    """Per consumer, the workspace each prompt needs, whether it overflows, and the safe ``max_model_len``.

    Args:
        config: the deployment (see :func:`engine_config_from_vllm`).
        prompt_tokens: prompt lengths to check (default: ``max_model_len - 1``,
            the longest prompt vLLM accepts). Longer ones are reported as
            rejected (:attr:`RequestPrediction.rejected`), not as crashes.
        locked_bytes: the workspace size at lock without the fix, if measured
            (e.g. :meth:`WorkspaceTracer.size_at_lock` or vLLM's
            ``VLLM_DEBUG_WORKSPACE=1`` log); default :func:`locked_bytes_without_fix`.
        max_num_batched_tokens_source: where ``config.max_num_batched_tokens``
            came from, for the report (e.g. "given", "vLLM default ...").
        short_chunks_use_workspace: False models vLLM 0.33 (chunks of <= 128
            new tokens make no workspace call); True models tqlab's engine.

    The size with the fix is ``max(locked_unfixed, largest reservation call)``
    (:func:`tqlab.reservation.reservation_plan`, checked against vLLM's
    ``TurboQuantMetadataBuilder`` by ``parity/``). Raises ``ValueError`` for a
    bad length or size. Not TurboQuant (``kv_cache_dtype="auto"``): no consumer.
    """
    if locked_bytes is None:
        locked_unfixed, source = locked_bytes_without_fix(config), "decode at the largest captured batch"
    else:
        if isinstance(locked_bytes, bool) or not isinstance(locked_bytes, int) or locked_bytes < 0:
            raise ValueError(f"locked_bytes must be an int >= 0, got {locked_bytes!r}")
        locked_unfixed, source = locked_bytes, "measured"
    locked_fixed = max(locked_unfixed, plan_bytes(reservation_plan(config)))
    short = short_chunks_use_workspace
    tokens = list(prompt_tokens) or [max(1, config.max_model_len - 1)]
    notes: list[str] = []
    if not config.is_turboquant:
        notes.append(f"kv_cache_dtype={config.kv_cache_dtype!r}: no TurboQuant workspace consumer")
        reqs: list[RequestPrediction] = []
    else:
        reqs = [_request_prediction(config, n, locked_unfixed, locked_fixed, short) for n in tokens]
        if not config.enable_chunked_prefill or config.max_num_batched_tokens <= CONTINUATION_DECODE_THRESHOLD:
            notes.append(
                "PR #44053 reserves continuation buffers only with chunked prefill on and max_num_batched_tokens > 128; "
                "a prefix-cache hit still makes continuation chunks (see the any-chunking bound)"
            )
    if config.num_ubatches > 1:
        notes.append("DBO: vLLM's _reserve_workspace sizes only the slot it runs in (slot 0); slot 1 can still overflow")
    top = config.max_model_len
    pred = Prediction(
        config=config,
        locked_unfixed=locked_unfixed,
        locked_fixed=locked_fixed,
        locked_source=source,
        requests=reqs,
        first_failing_prompt=_first_failing_alone(config, locked_unfixed, top, short) if config.is_turboquant else None,
        safe_max_model_len_alone=safe_max_model_len(config, locked_unfixed, schedule="alone", short_chunks_use_workspace=short),
        safe_max_model_len_any_schedule=safe_max_model_len(config, locked_unfixed, schedule="any", short_chunks_use_workspace=short),
        fixed_safe_any_schedule=safe_max_model_len(config, locked_fixed, schedule="any", short_chunks_use_workspace=short),
        short_chunks_use_workspace=short,
        notes=notes,
        max_num_batched_tokens_source=max_num_batched_tokens_source,
    )
    if config.is_turboquant:
        note = _bug_report_note(pred)
        if note is not None:
            pred.notes.append(note)
    return pred


def inspect_vllm(
    engine_args: str | Sequence[str] | Mapping[str, Any] | None = None,
    model_config: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    preset: str | None = None,
    prompt_tokens: Sequence[int] = (),
    locked_bytes: int | None = None,
    gpu_memory_gib: float | None = None,
    demo: bool = False,
    json_path: str | os.PathLike | None = None,
    out: TextIO | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """``tqlab inspect-vllm``: predict the locked-workspace crash for a vLLM deployment.

    Args:
        engine_args: the ``vllm serve ...`` command line (string or argv) or a dict.
        model_config: path to the model's ``config.json`` (or its folder) or the dict.
        preset: instead of ``model_config``, a tqlab preset (``data/presets``);
            ``engine_args`` then override its fields.
        prompt_tokens: prompt lengths to check (default ``max_model_len``).
        locked_bytes: measured workspace size at lock without the fix (bytes).
        gpu_memory_gib: GPU memory, for vLLM's default batch limits.
        demo: also send the first crashing chunk through vLLM's own classes
            on CPU, without and with the fix (:func:`run_vllm_seed_scenario`;
            needs vLLM, else skipped with a note; the fixed run is skipped when
            its reservation would exceed 1 GiB of host memory).
        json_path: also write the report there (JSON).
        out: where the text goes (default ``sys.stdout``).
        quiet: print nothing.

    Returns the report dict: ``prediction`` (:meth:`Prediction.to_dict`, its
    ``notes`` included; per request ``verdict``, ``rejected``,
    ``first_refused_unfixed``/``_fixed``; ``max_num_batched_tokens`` and
    ``max_num_batched_tokens_source``: "given: ...", "not given: vLLM's
    default for ..." or "preset ..."), ``vllm_version`` (None without vLLM), ``text`` (what
    was printed) and ``demo`` (list of :meth:`ScenarioResult.to_dict`, or None)
    when asked. Raises ``ValueError`` when not exactly one of
    ``model_config``/``preset`` is given, or for bad arguments.

    CLI (wired by ``tqlab.cli``)::

        tqlab inspect-vllm --config config.json \\
            --args "vllm serve M --tensor-parallel-size 8 --max-model-len 131072 ..." --tokens 8192 --demo
    """
    if (model_config is None) == (preset is None):
        raise ValueError("give exactly one of model_config (a config.json) or preset")
    if preset is not None:
        overrides, ignored = parse_engine_args(engine_args)
        overrides.pop("model", None)
        if "dtype" in overrides:
            overrides["dtype"] = parse_dtype(overrides["dtype"])
        config = EngineConfig.from_preset(preset, **overrides)
        notes = [f"preset {preset}"] + (["ignored engine args: " + ", ".join(ignored)] if ignored else [])
        if "max_num_batched_tokens" in overrides:
            source = "given: --max-num-batched-tokens"
        else:
            source = f"preset {preset}"
            if bug_report_max_num_batched_tokens(config) == config.max_num_batched_tokens:
                source += (f": inferred from the bug report's {BUG_REPORT_REQUIRED_MB} MB; the report does not give "
                           "max_num_batched_tokens")
    else:
        config, notes = engine_config_from_vllm(engine_args, model_config, gpu_memory_gib=gpu_memory_gib)
        if "max_num_batched_tokens" in parse_engine_args(engine_args)[0]:
            source = "given: --max-num-batched-tokens"
        elif config.enable_chunked_prefill:
            source = f"not given: vLLM's default for {vllm_default_limits('serve', gpu_memory_gib)[2]}"
        else:
            source = "not given: vLLM's default with chunked prefill off, max(max_model_len, max_num_seqs)"
        notes = [n for n in notes if not n.startswith("max_num_batched_tokens not given")]  # said by the source line
    pred = predict(config, prompt_tokens, locked_bytes=locked_bytes, max_num_batched_tokens_source=source)
    pred.notes[:0] = notes
    report: dict[str, Any] = {"prediction": pred.to_dict(), "vllm_version": vllm_version()}
    text = [pred.format()]
    if demo:
        if not vllm_available():
            report["demo"] = None
            text.append("demo skipped: vLLM is not importable here (bash parity/install.sh, then use .venv-parity/bin/python)")
        elif pred.first_failing_prompt is None:
            report["demo"] = None
            text.append("demo skipped: no prompt up to max_model_len overflows without the fix")
        else:
            cached, q = prompt_chunks(pred.first_failing_prompt, config.max_num_batched_tokens)[-1]
            runs = [False] + ([True] if pred.locked_fixed <= 1 << 30 else [])
            res = [run_vllm_seed_scenario(config, cached_len=cached, q_len=q, fixed=f) for f in runs]
            if len(runs) == 1:
                text.append("fixed demo skipped: its reservation would take more than 1 GiB of host memory")
            report["demo"] = [r.to_dict() for r in res]
            text.append(
                f"vLLM {vllm_version()}'s own classes on CPU, the crashing chunk ({q} new tokens after {cached} cached):"
            )
            for r in res:
                text.append(f"  {'with' if r.fixed else 'without'} PR #44053: " + (r.error or "buffers granted (" + str(r.kernel_error) + " at the kernel launch, as expected on CPU)"))
    report["text"] = "\n".join(text)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report, indent=2, default=str))
    if not quiet:
        print(report["text"], file=sys.stdout if out is None else out)
    return report
