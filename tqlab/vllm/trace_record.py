"""One JSON record per vLLM process: what its workspace managers did, written by the tqlab vLLM plugin.

The ``vllm.general_plugins`` entry point (:mod:`tqlab.vllm_plugin`) calls :func:`start_tracing`
when ``TQLAB_VLLM_TRACE=DIR`` is set. vLLM 0.33 calls every general plugin in each process it
starts (``vllm/plugins/__init__.py`` ``load_general_plugins``, called from ``EngineArgs``
in the front end, ``EngineCore.__init__`` and ``WorkerWrapperBase.init_worker`` in every
worker), so each worker's ``WorkspaceManager`` (``vllm/v1/worker/gpu_worker.py``
``_init_workspace_and_model_runner``) gets a :class:`~tqlab.vllm.tracer.WorkspaceTracer`.
A process that never creates a manager (API server, engine core) writes no file.

The record ``DIR/<host>-<pid>.json`` (:data:`RECORD_FORMAT`) is rewritten atomically (temp
file, then ``os.replace``) when a manager is created, at every ``lock()``/``unlock()``, at
every refused request *before* vLLM's error propagates (a dying engine may never run
``atexit``), and at exit. Refused requests are scratch growth after the lock, persistent
resources missing after the lock ("... was not allocated during warmup": Marlin locks, MoE
permute scratch), a persistent key asked with another shape, an unconfigured lane
(:data:`tqlab.vllm.tracer.REFUSAL_KINDS`). ``vllm_version`` is the version of the vLLM this
process imported. Sizes in bytes.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from tqlab.vllm.tracer import WorkspaceTracer, install_vllm_hook, vllm_version

RECORD_FORMAT = "tqlab-vllm-trace/1"
"""The ``format`` field of every record; :mod:`tqlab.predict.trace_report` skips files without it."""

TRACE_ENV = "TQLAB_VLLM_TRACE"

# vLLM 0.33 vllm/distributed/parallel_state.py: the group coordinators (rank_in_group, world_size)
_GROUPS = (("tp", "_TP"), ("pp", "_PP"), ("dp", "_DP"), ("world", "_WORLD"))
# the VllmConfig fields a record keeps: (record key, attribute path)
_CONFIG_FIELDS = (
    ("model", "model_config.model"),
    ("max_model_len", "model_config.max_model_len"),
    ("dtype", "model_config.dtype"),
    ("kv_cache_dtype", "cache_config.cache_dtype"),
    ("block_size", "cache_config.block_size"),
    ("max_num_seqs", "scheduler_config.max_num_seqs"),
    ("max_num_batched_tokens", "scheduler_config.max_num_batched_tokens"),
    ("enable_chunked_prefill", "scheduler_config.enable_chunked_prefill"),
    ("tensor_parallel_size", "parallel_config.tensor_parallel_size"),
    ("pipeline_parallel_size", "parallel_config.pipeline_parallel_size"),
    ("data_parallel_size", "parallel_config.data_parallel_size"),
    ("data_parallel_rank", "parallel_config.data_parallel_rank"),
    ("enable_dbo", "parallel_config.enable_dbo"),
    ("cudagraph_mode", "compilation_config.cudagraph_mode"),
    ("max_cudagraph_capture_size", "compilation_config.max_cudagraph_capture_size"),
)


def vllm_parallel_ranks() -> dict[str, dict[str, int]]:
    """This process's rank and size in each vLLM parallel group that exists: ``{"tp": {"rank", "size"}, ...}``.

    Read from ``vllm.distributed.parallel_state`` (``_TP``/``_PP``/``_DP``/``_WORLD``
    ``GroupCoordinator.rank_in_group`` and ``world_size``, as ``get_tensor_model_parallel_rank``
    does) only if vLLM already imported it; ``{}`` before vLLM initialises them.
    """
    ps = sys.modules.get("vllm.distributed.parallel_state")
    out: dict[str, dict[str, int]] = {}
    for key, attr in _GROUPS:
        group = getattr(ps, attr, None) if ps is not None else None
        if group is not None:
            out[key] = {"rank": int(group.rank_in_group), "size": int(group.world_size)}
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value).removeprefix("torch.")


def vllm_config_summary() -> dict[str, Any] | None:
    """The fields of :data:`_CONFIG_FIELDS` from vLLM's current ``VllmConfig``, or None when none is set.

    vLLM 0.33 ``vllm/config/vllm.py`` ``get_current_vllm_config_or_none`` (set while the
    worker builds its model runner). A field the config lacks is None; values that are
    not JSON types are written as text (``torch.bfloat16`` -> ``"bfloat16"``).
    """
    mod = sys.modules.get("vllm.config.vllm")
    getter = getattr(mod, "get_current_vllm_config_or_none", None)
    cfg = getter() if getter is not None else None
    if cfg is None:
        return None
    out = {}
    for key, path in _CONFIG_FIELDS:
        value: Any = cfg
        for part in path.split("."):
            value = getattr(value, part, None)
        out[key] = _jsonable(value)
    return out


def record_path(trace_dir: str | os.PathLike) -> Path:
    """``DIR/<host>-<pid>.json`` for this process."""
    return Path(trace_dir).absolute() / f"{socket.gethostname()}-{os.getpid()}.json"


class TraceRecorder:
    """Keeps one process's record on disk while a :class:`WorkspaceTracer` watches its managers.

    :meth:`flush` never raises (a trace must not kill the engine it watches): a failed
    write is reported once on standard error and counted in ``write_errors``.
    """

    def __init__(self, trace_dir: str | os.PathLike, tracer: WorkspaceTracer):
        self.path = record_path(trace_dir)
        self.tracer = tracer
        self.managers = 0
        self.flushes = 0
        self.write_errors = 0
        self._config: dict[str, Any] | None = None
        self._started = _now()
        self._mutex = threading.Lock()

    def on_attach(self, manager: Any) -> None:
        self.managers += 1
        self.flush("manager")

    def record(self, event: str) -> dict[str, Any]:
        """The record as written (JSON types only); ``event`` is what triggered this write."""
        self._config = vllm_config_summary() or self._config  # keep the last config seen
        rep = self.tracer.report()
        return {
            "format": RECORD_FORMAT,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "rank": vllm_parallel_ranks(),
            "vllm_version": vllm_version(),
            "config": self._config,
            "event": event,
            "flushes": self.flushes + 1,
            "started": self._started,
            "written": _now(),
            "managers": self.managers,
            "consumers": rep["callers"],
            "locks": rep["locks"],
            "size_at_lock_bytes": rep["size_at_lock_bytes"],
            "refused": rep["violations"],
            "persistent": rep["persistent"],
        }

    def flush(self, event: str) -> None:
        """Write the record atomically (``<name>.tmp`` then ``os.replace``); never raises."""
        if self.managers == 0:
            return  # this process made no workspace manager: leave no file
        with self._mutex:
            try:
                text = json.dumps(self.record(event), indent=1)
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                tmp.write_text(text)
                os.replace(tmp, self.path)
                self.flushes += 1
            except Exception as e:
                self.write_errors += 1
                if self.write_errors == 1:
                    print(f"tqlab trace: cannot write {self.path}: {e}", file=sys.stderr)


_RECORDER: dict[str, TraceRecorder] = {}


def start_tracing(trace_dir: str | os.PathLike) -> TraceRecorder | None:
    """Trace every vLLM workspace manager this process creates into ``trace_dir`` (created if missing).

    A relative ``trace_dir`` is resolved against the working directory of this call, once
    (every later write goes there, whatever the process's working directory is then).
    Idempotent (vLLM may call plugins more than once per process). Returns the
    recorder, or None with a one-line message on standard error when ``trace_dir``
    cannot be created (vLLM then runs untraced). Imports vLLM's workspace module.
    """
    if "recorder" in _RECORDER:
        return _RECORDER["recorder"]
    trace_dir = Path(trace_dir).absolute()  # once, now: vLLM or the model may chdir before the lock or a refusal
    try:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"tqlab trace: {TRACE_ENV}={trace_dir!s} cannot be created ({e.strerror}); not tracing", file=sys.stderr)
        return None
    tracer = WorkspaceTracer()
    recorder = TraceRecorder(trace_dir, tracer)
    tracer.on_event = recorder.flush
    _RECORDER["recorder"] = recorder
    hooked = install_vllm_hook(tracer=tracer, on_attach=recorder.on_attach)
    if hooked is not tracer:  # install_vllm_hook ran earlier in this process: record what its tracer sees
        recorder.tracer, hooked.on_event = hooked, recorder.flush
        recorder.managers = sum(1 for _ in hooked.managers())
        recorder.flush("manager")
    atexit.register(recorder.flush, "exit")
    return recorder


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
