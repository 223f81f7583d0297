"""The engine lifecycle, phase by phase, as vLLM walks it.

``LLMEngine(config, fix=...)`` runs, in order (each phase is logged with the
workspace size after it, in ``engine.phases``):

1. ``init_workspace``  — ``init_workspace_manager(device, num_ubatches)`` (vLLM ``GPUWorker.init_device``)
2. ``load_model``      — the attention backend, scheduler and model runner (vLLM ``GPUWorker.load_model``);
   no metadata builder yet; the model's impls' ``__init__`` reservations (FlashMLA sparse, MLA prefill)
3. ``profile_run``     — a dummy prefill of ``max_num_batched_tokens`` fresh tokens
   (vLLM ``GPUWorker.determine_available_memory`` → ``GPUModelRunner.profile_run``): TurboQuant asks
   nothing here (the *undercount* of the bug report); the fused-MoE scratch at ``M = max_num_batched_tokens``
   and the sparse indexer's and Triton MLA's reservations do
4. ``build_backend``   — ``TurboQuantMetadataBuilder``; with the fix its ``_reserve_workspace()``
   grows the workspace here (vLLM PR #44053). vLLM creates the builders in
   ``GPUModelRunner.initialize_kv_cache`` → ``initialize_metadata_builders``, i.e. *after* the profile run
   (first inside ``determine_available_memory``'s ``profile_cudagraph_memory``, again in
   ``GPUWorker.initialize_from_config``)
5. ``capture``         — one FULL uniform-decode dummy batch per decode capture size,
   largest first (:func:`tqlab.core.vllm_rules.decode_capture_sizes`); skipped with
   ``enforce_eager`` or ``cudagraph_mode`` NONE; PIECEWISE captures pass no attention
   metadata, so only the MoE layers ask the workspace there
6. ``lock``            — ``lock_workspace()`` on this engine's manager, at the end of capture as in
   vLLM's ``GPUModelRunner.capture_model``: an eager (or NONE) start-up never locks
   (``GPUWorker.compile_or_warm_up_model`` skips capture), unless the named variant
   ``lock_workspace_when_eager`` is on; :attr:`LLMEngine.slot_sizer` says which call set the size
7. serving             — ``add_request`` / ``step`` / ``generate``; every step the other consumers ask at
   that step's shapes (MoE at ``M`` = the step's tokens)

Consumers other than TurboQuant are stand-ins (:mod:`tqlab.engine.consumer_standins`) that ask vLLM's
shapes with vLLM's caller names. The engine follows the run's release's rules (:mod:`tqlab.core.vllm_rules`) and
stores no prediction: the predictor (:mod:`tqlab.predict`) stands beside it on the same rules, and
``tqlab repro`` and the tests compare the two from outside.

A call that needs more workspace than was locked raises :class:`~tqlab.core.workspace.WorkspaceLockedError`
out of ``step()``; the engine is then dead, like vLLM's EngineCore, and every later call raises
:class:`EngineDeadError` that says why.
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from tqlab.core import vllm_versions
from tqlab.core.workspace_layout import cdiv
from tqlab.attention import TurboQuantAttentionBackend, TurboQuantMetadataBuilder
from tqlab.core.config import EngineConfig
from tqlab.core.vllm_rules import (
    capture_sizes,
    cudagraph_mode,
    decode_capture_sizes,
    jit_warmup_decode_rows,
    locks_workspace,
    piecewise_capture_one_token_rows,
)
from tqlab.engine.consumer_standins import ConsumerStandIns, SlotSizer, StepShape, slot_sizer
from tqlab.engine.cuda_graph import CUDAGraphDecodeRunner
from tqlab.engine.model_runner import ModelRunner
from tqlab.engine.phases import PhaseContext, PhaseRecord
from tqlab.engine.scheduler import Request, Scheduler
from tqlab.core.workspace import init_workspace_manager, restore_workspace_manager_on_error

__all__ = ["EngineDeadError", "LLMEngine", "PhaseRecord", "RequestOutput"]


class EngineDeadError(RuntimeError):
    """The engine hit a fatal error earlier; ``cause`` holds it (vLLM: "EngineCore encountered an issue")."""

    def __init__(self, cause: BaseException):
        self.cause = cause
        super().__init__(
            f"EngineCore encountered an issue and is dead; no further requests are served. "
            f"Cause: {type(cause).__name__}: {cause}"
        )


#: The start-up phases every modelled release runs, in vLLM's order, each with the vLLM call it mirrors (the V1 runner's
#: names; :func:`startup_phases` adds the release's own)
#: (``vllm/v1/engine/core.py`` ``EngineCore._initialize_kv_caches`` calls the worker's
#: ``determine_available_memory``, then ``initialize_from_config``, then ``compile_or_warm_up_model``).
#: ``parity/test_startup_order_parity.py`` checks this order against vLLM's source.
STARTUP_PHASES: tuple[tuple[str, str], ...] = (
    ("init_workspace", "vllm/v1/worker/gpu_worker.py Worker.init_device -> init_workspace_manager"),
    ("load_model", "vllm/v1/worker/gpu_worker.py Worker.load_model"),
    ("profile_run", "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory -> GPUModelRunner.profile_run"),
    ("build_backend", "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.initialize_kv_cache -> initialize_metadata_builders "
                      "-> TurboQuantMetadataBuilder.__init__ -> _reserve_workspace"),
    ("capture", "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.capture_model"),
    ("lock", "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.capture_model -> lock_workspace"),
)

#: Model Runner V2's JIT warm-up, between the builders and capture where the release always runs V2
#: (:attr:`tqlab.core.vllm_versions.VllmVersion.jit_warmup_always`).
JIT_WARMUP_PHASE = ("jit_warmup", "vllm/v1/worker/gpu_worker.py Worker._compile_or_warm_up_model -> warmup_kernels "
                                  "(vllm/v1/worker/gpu/warmup.py), before capture_model")


def startup_phases(vllm=None) -> tuple[tuple[str, str], ...]:
    """:data:`STARTUP_PHASES` of release ``vllm`` (None: the run's), with :data:`JIT_WARMUP_PHASE` before ``capture``
    where it runs; ``parity/test_startup_order_parity.py`` checks it against the installed vLLM's source."""
    if not vllm_versions.get(vllm).jit_warmup_always:
        return STARTUP_PHASES
    at = [name for name, _ in STARTUP_PHASES].index("capture")
    return (*STARTUP_PHASES[:at], JIT_WARMUP_PHASE, *STARTUP_PHASES[at:])


@dataclass
class RequestOutput:
    request_id: int
    prompt_len: int
    output_token_ids: list[int] = field(default_factory=list)
    finished: bool = False


def _default_kv_tokens(config: EngineConfig, device: torch.device) -> int:
    full = config.max_model_len * min(config.max_num_seqs, 4)
    if device.type == "meta":
        return full
    return min(full, max(config.max_model_len, 1 << 15))


class LLMEngine:
    """A one-rank serving engine that walks vLLM's start-up lifecycle.

    Args:
        config: the deployment (:class:`~tqlab.core.config.EngineConfig`).
        fix: ``True`` (default) reserves the worst case in the metadata builder
            (PR #44053); ``False`` is vLLM 0.33 without that PR, which reproduces the crash reported
            against vLLM 0.20 (same unreserved ``_continuation_prefill`` path).
        device: ``"cpu"``, ``"cuda"`` or ``"meta"`` (shape-only dry run: same
            code, no arithmetic, any length in about a second).
        kv_cache_tokens: KV-cache capacity in tokens (default: enough for the
            longest requests that fit in memory on this device).
        seed: weights seed of the tiny model.
        on_phase: optional callback ``(PhaseRecord) -> None``, e.g. to print.
        use_cuda_graphs: on CUDA, capture real CUDA graphs
            (``tqlab.engine.cuda_graph``); ignored elsewhere.
        decode_batch_reservation: decode rows the reservation covers
            (default ``max_num_seqs``, as PR #44053).
        before_lock: optional ``(engine) -> None`` run as its own phase just
            before the lock (e.g. a long-context dummy run strategy).
        after_profile: optional ``(engine) -> None`` run as its own phase after the
            profile run and the builders, before capture (where vLLM's warm-up dummy runs are;
            ``tqlab.strategies``' long-context dummy run uses it).

    The engine installs its workspace manager as the process-wide one
    (``init_workspace_manager``), as a vLLM worker does, and locks that manager;
    if start-up fails the previous process-wide manager is put back.
    ``backend.path_counts`` counts serving only (start-up calls are in
    ``startup_path_counts``).

    Raises ``ValueError`` for a device that is not available or a bad
    ``kv_cache_tokens``; whatever start-up raises (e.g. ``MemoryError``).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        fix: bool = True,
        device: str | torch.device = "cpu",
        kv_cache_tokens: int | None = None,
        seed: int = 0,
        on_phase: Callable[[PhaseRecord], None] | None = None,
        use_cuda_graphs: bool = True,
        decode_batch_reservation: int | None = None,
        before_lock: Callable[["LLMEngine"], None] | None = None,
        after_profile: Callable[["LLMEngine"], None] | None = None,
    ):
        self.config = config
        self.fix = fix
        capture_sizes(config)  # ValueError where vLLM refuses the capture sizes, before anything is built
        ConsumerStandIns.check(config)  # ValueError where a consumer cannot size this config, likewise
        try:
            self.device = torch.device(device)
        except (TypeError, RuntimeError):
            raise ValueError(f"bad device {device!r}; use 'cpu', 'cuda' or 'meta'") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
        if self.device.type not in ("cpu", "cuda", "meta"):
            raise ValueError(f"device must be cpu, cuda or meta, got {device!r}")
        self.phases: list[PhaseRecord] = []
        self._phase_marks: list[tuple[str, int]] = []  # (phase, len(workspace.events) at its end): slot_sizer's input
        self.slot_sizer: SlotSizer | None = None  # who set slot 0's size at the lock (None: never locked or never grew)
        self._on_phase = on_phase
        self.dead: BaseException | None = None
        self.outputs: dict[int, RequestOutput] = {}
        self._requests: dict[int, Request] = {}
        # One step at a time, whole (issue 22: four threads stepping one engine produced 23 tokens
        # for max_tokens=20); add_request takes it too, so a request never joins a step half-way.
        self._serving = threading.RLock()

        if kv_cache_tokens is not None and (isinstance(kv_cache_tokens, bool) or not isinstance(kv_cache_tokens, int)
                                            or kv_cache_tokens < 1):
            raise ValueError(f"kv_cache_tokens must be an int >= 1, got {kv_cache_tokens!r}")
        # vLLM installs one process-wide manager per worker; so do we, but a failed
        # start-up puts the previous one back instead of leaving a half-built one.
        with restore_workspace_manager_on_error():
            self._start_up(fix, kv_cache_tokens, seed, use_cuda_graphs, decode_batch_reservation,
                           before_lock, after_profile)
        self.startup_path_counts = dict(self.backend.path_counts)
        self.backend.path_counts = dict.fromkeys(self.backend.path_counts, 0)

    def _start_up(self, fix, kv_cache_tokens, seed, use_cuda_graphs, decode_batch_reservation,
                  before_lock, after_profile) -> None:
        config = self.config
        with self._phase("init_workspace", f"{config.num_ubatches} ubatch slot(s) on {self.device}"):
            self.workspace = init_workspace_manager(self.device, config.num_ubatches)
        with self._phase("load_model", "attention backend, scheduler, model runner (no metadata builder yet)") as ctx:
            self.backend = TurboQuantAttentionBackend(config, self.workspace)
            bs = config.block_size
            tokens = kv_cache_tokens if kv_cache_tokens is not None else _default_kv_tokens(config, self.device)
            num_blocks = cdiv(tokens, bs) + 1  # + the null block
            self.max_blocks_per_seq = cdiv(config.max_model_len, bs)
            self.scheduler = Scheduler(config, num_blocks)
            self.runner = ModelRunner(config, self.backend, self.device, num_blocks, self.max_blocks_per_seq, seed=seed)
            self.standins = ConsumerStandIns(config, self.workspace)  # impls' __init__ reservations (FlashMLA, MLA prefill)
            ctx.add(self.standins.init_note)
        profile_tokens = min(config.max_num_batched_tokens, config.max_model_len)
        with self._phase("profile_run", f"dummy prefill of {profile_tokens} fresh tokens") as ctx:
            self.runner.profile_run(profile_tokens)
            ctx.add(self.standins.profile_run())
        # vLLM: initialize_kv_cache -> initialize_metadata_builders -> builder __init__, after the profile run.
        note = ("with _reserve_workspace() (PR #44053)" if fix
                else f"no reservation: {vllm_versions.current()} without PR #44053"
                + (" (the v0.20 report's path)" if vllm_versions.current().name == vllm_versions.BUG_REPORT else ""))
        with self._phase("build_backend", note) as ctx:
            self.builder = TurboQuantMetadataBuilder(config, self.workspace, reserve=fix,
                                                     decode_batch=decode_batch_reservation)
            ctx.add(self.standins.build_backend())
            if (self.device.type == "cuda" and use_cuda_graphs and decode_capture_sizes(config)
                    and not config.num_speculative_tokens):
                self._install_cuda_graphs()
        if after_profile is not None:
            with self._phase("after_profile", getattr(after_profile, "__name__", "hook")):
                after_profile(self)
        self._jit_warmup_phase()
        self._capture_phase()
        if before_lock is not None:
            with self._phase("before_lock", getattr(before_lock, "__name__", "hook")):
                before_lock(self)
        if not locks_workspace(config):
            with self._phase("lock", "skipped: vLLM locks only at the end of capture_model; the workspace can grow"):
                pass
            return
        with self._phase("lock", "lock_workspace(): growth is now an error") as ctx:
            # This engine's own manager: another engine built in a hook may have
            # become the process-wide one meanwhile.
            self.workspace.lock()
            self.slot_sizer = slot_sizer(self.workspace.events, self._phase_marks)
            ctx.add(self.slot_sizer.describe() if self.slot_sizer else "")

    def _capture_phase(self) -> None:
        """``capture_model``: FULL uniform-decode dummy batches (PIECEWISE ones run no attention)."""
        config, mode = self.config, cudagraph_mode(self.config)
        if mode == "NONE":
            why = "enforce_eager" if config.enforce_eager else "cudagraph_mode NONE"
            with self._phase("capture", f"skipped ({why})"):
                self.captures = []
            return
        all_sizes, sizes = capture_sizes(config), decode_capture_sizes(config)
        note = (f"{mode}: {len(all_sizes)} size(s) up to {all_sizes[-1] if all_sizes else 0} tokens; "
                f"decode graphs at {len(sizes)} size(s), {1 + config.num_speculative_tokens} token(s) per row, largest first")
        with self._phase("capture", note) as ctx:
            pw_rows = piecewise_capture_one_token_rows(config)  # V2: PIECEWISE dummies carry attention metadata
            if pw_rows:
                self.runner.dummy_decode(pw_rows)
            self.captures = self.runner.capture_model(sizes)
            ctx.add(self.standins.capture(all_sizes if mode != "FULL_DECODE_ONLY" else (), sizes))

    def _jit_warmup_phase(self) -> None:
        """Model Runner V2's JIT warm-up before capture (``warmup_kernels``, ``vllm/v1/worker/gpu/warmup.py``; only
        where the release always runs V2): its decode steps of one-token rows (:func:`jit_warmup_decode_rows`; with
        ``k > 0`` the steps without draft tokens, at most 2 rows). The other consumers' requests in it are not
        replayed (the version home says so: ``VllmVersion.startup_rules_modelled``)."""
        rows = jit_warmup_decode_rows(self.config)
        if not rows:
            return
        rows = rows if self.config.num_speculative_tokens == 0 else min(2, rows)
        with self._phase("jit_warmup", f"V2 warmup_kernels: decode steps of {rows} one-token row(s)"):
            self.runner.dummy_decode(rows)

    def _install_cuda_graphs(self) -> None:
        self.runner.decode_runner = CUDAGraphDecodeRunner(self.runner)

    # -- phases ------------------------------------------------------------- #
    def _phase(self, name: str, note: str = "") -> PhaseContext:
        return PhaseContext(self, name, note)

    @property
    def locked_bytes(self) -> int | None:
        """Size of ubatch slot 0 at the lock (bytes); None when start-up did not lock (an eager vLLM)."""
        return self.workspace.size_bytes(0) if self.workspace.is_locked() else None

    # -- serving ------------------------------------------------------------ #
    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    def add_request(self, prompt: list[int] | torch.Tensor | int, max_tokens: int = 1) -> int:
        """Queue a prompt (token ids, or a length on the meta device / for synthetic ids). Returns its id.

        Thread-safe: waits for a step running in another thread (see :meth:`step`).

        Raises ``ValueError`` for an empty prompt, ``max_tokens < 1``, or a request
        longer than ``max_model_len`` or the KV cache; ``EngineDeadError`` if dead.
        """
        with self._serving:
            return self._add_request(prompt, max_tokens)

    def _add_request(self, prompt, max_tokens: int) -> int:
        self._check_alive()
        vocab = self.runner.model.vocab_size
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
                raise ValueError(
                    f"a tensor prompt must be 1-D integer token ids, got shape {tuple(prompt.shape)} dtype {prompt.dtype}"
                )
            prompt = prompt.tolist()
        if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
            n = int(prompt)
            ids = None
            if n >= 1 and self.device.type != "meta":
                g = torch.Generator().manual_seed(1234 + n)
                ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        elif isinstance(prompt, (list, tuple)):
            for i, t in enumerate(prompt):
                if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                    raise ValueError(f"token {i} of the prompt is {t!r}, not an integer token id")
                if not 0 <= t < vocab:
                    raise ValueError(f"token id {t} (position {i} of the prompt) is outside the vocabulary [0, {vocab})")
            ids = [int(t) for t in prompt]
            n = len(ids)
        else:
            raise ValueError(
                f"prompt must be a list of token ids, a 1-D integer tensor or a length (int), got {type(prompt).__name__} {prompt!r}"
            )
        if n < 1:
            raise ValueError(f"prompt must have at least 1 token, got {n}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        total = n + max_tokens
        if total > self.config.max_model_len:
            raise ValueError(
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {total} exceeds max_model_len ({self.config.max_model_len})"
            )
        blocks = cdiv(total, self.config.block_size)
        if blocks > self.scheduler.pool.num_blocks - 1:
            raise ValueError(
                f"request needs {blocks} KV-cache blocks but the cache has {self.scheduler.pool.num_blocks - 1}; "
                "pass a larger kv_cache_tokens"
            )
        rid = self.scheduler.new_request_id()
        req = Request(rid, n, max_tokens, ids)
        self._requests[rid] = req
        self.outputs[rid] = RequestOutput(rid, n)
        self.scheduler.add(req)
        return rid

    def has_unfinished_requests(self) -> bool:
        """True while requests wait or run. Raises ``EngineDeadError`` once the engine is dead.

        vLLM 0.33's ``LLMEngine.has_unfinished_requests`` (``vllm/v1/engine/llm_engine.py``)
        reads only the front end's ``OutputProcessor`` and keeps saying True after
        the engine core died; the next ``step()`` then raises ``EngineDeadError``
        (``core_client.py``, ``get_output``). We raise here already, so a
        ``while has_unfinished_requests(): step()`` loop (vLLM's ``LLM._run_engine``)
        ends with the same error, and nothing polls a dead engine as if it had work.
        """
        self._check_alive()
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Schedule and run one step. Returns the outputs that changed.

        Safe to call from several threads: an engine-wide lock runs one step at a
        time, whole (schedule, execute, record the sampled tokens), as vLLM's
        EngineCore busy loop does (``vllm/v1/engine/core.py`` ``EngineCore.step``);
        a thread that finds nothing left to do gets ``[]``. vLLM's ``LLMEngine``
        itself has no such lock and is not meant to be stepped from several threads.

        Raises ``WorkspaceLockedError`` (the engine is then dead) or ``EngineDeadError``.
        """
        with self._serving:
            return self._step()

    def _step(self) -> list[RequestOutput]:
        self._check_alive()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            if self.scheduler.has_unfinished():  # nothing runs and nothing can be admitted: waiting would never end
                waiting = self.scheduler.waiting[0]
                raise RuntimeError(f"the scheduler can schedule nothing: request {waiting.request_id} "
                                   f"({waiting.prompt_len} prompt tokens) does not fit a step of "
                                   f"{self.config.chunk_budget} tokens")
            return []
        try:
            self.standins.forward(StepShape.of(sched))  # the other consumers' calls at this step's shapes
            sampled = self.runner.execute_model(sched)
        except Exception as e:  # any failure inside a step (WorkspaceLockedError too) kills the engine core
            self.dead = e
            raise
        changed = []
        for r, c, q in sched.prefills:
            r.num_computed_tokens = c + q
        for r in sched.decodes:
            r.num_computed_tokens += 1
        for rid, tok in sampled.items():
            req = self._requests[rid]
            req.output_token_ids.append(tok)
            out = self.outputs[rid]
            out.output_token_ids.append(tok)
            if len(req.output_token_ids) >= req.max_tokens:
                self.scheduler.finish(req)
                out.finished = True
            changed.append(out)
        return changed

    def generate(self, prompt: list[int] | torch.Tensor | int, max_tokens: int = 1) -> RequestOutput:
        """Add one request and step until it finishes. Returns its output."""
        rid = self.add_request(prompt, max_tokens)
        while not self.outputs[rid].finished:
            self.step()
        return self.outputs[rid]
