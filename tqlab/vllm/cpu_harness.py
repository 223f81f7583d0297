"""vLLM 0.33's own workspace and TurboQuant classes run on a CPU, side by side with tqlab's.

:func:`vllm_cpu_patches` patches what a CPU-only torch lacks; fake configs build vLLM's
``TurboQuantMetadataBuilder``; the seed scenario is replayed through both managers.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Sequence

import torch

from tqlab.core.workspace_layout import cdiv
from tqlab.core.config import EngineConfig
from tqlab.core.dtypes import torch_call
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    continuation_workspace_shapes,
    deployment_decode_shapes,
    plan_bytes,
    reservation_plan,
)
from tqlab.vllm.tracer import VLLM_TURBOQUANT_MODULE, VLLM_WORKSPACE_MODULE, WorkspaceTracer

PARITY_RESULTS = "parity_results"
"""``data/parity_results.json``: written by ``bash parity/run.sh --record``."""


def load_parity_results() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(provenance, records)`` of the recorded parity run (``data/parity_results.json``).

    ``records`` maps ``'<test name>:<key>'`` to what that test recorded, plus
    ``'summary'`` (outcome counts) and ``'tests'`` (outcome per test).
    Raises ``FileNotFoundError``/``ValueError`` like :func:`tqlab.core.provenance.load_recorded`.
    """
    from tqlab.core.provenance import load_recorded

    res = load_recorded(PARITY_RESULTS)
    records = dict(res.data.get("records", {}))
    records["summary"] = res.data.get("summary", {})
    records["tests"] = res.data.get("tests", {})
    return dict(res.data["provenance"]), records


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
        dtype=config.torch_dtype,
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
    except Exception as e:
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
        block_table=torch.zeros(1, cdiv(seq, config.block_size), dtype=torch.int32),
    )
    q = torch.zeros(q_len, config.num_heads_per_rank, config.head_dim, dtype=config.torch_dtype)
    kv = torch.zeros(q_len, config.num_kv_heads_per_rank, config.head_dim, dtype=config.torch_dtype)
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
            query = torch.zeros(config.max_num_seqs, config.num_heads_per_rank, config.head_dim, dtype=config.torch_dtype)
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
    """The one call site :func:`compare_managers` drives both managers through (their named caller); the dtypes
    as torch's, which vLLM's manager needs (tqlab's takes either)."""
    return manager.get_simultaneous(*torch_call(reqs))


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
    dec = deployment_decode_shapes(c, c.max_num_seqs)
    small = deployment_decode_shapes(c, 1)
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
    except Exception as e:
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
    from tqlab.core.workspace import WorkspaceManager, ubatch_context

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
    """vLLM's ``TurboQuantMetadataBuilder`` reservation calls vs :func:`tqlab.core.reservation.reservation_plan`, per preset.

    Rows: ``{"preset", "vllm_calls", "tqlab_calls", "reserved_bytes", "same"}``,
    calls as text. Imports vLLM.
    """
    from tqlab.core.config import list_presets

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


def _decode_attention(manager: Any, config: EngineConfig, batch: int) -> list[torch.Tensor]:
    """tqlab stand-in for vLLM's split-KV decode consumer (same call, same caller name)."""
    return manager.get_simultaneous(
        *deployment_decode_shapes(config, batch)
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

    tqlab: our :class:`~tqlab.core.workspace.WorkspaceManager` on CPU with a tracer;
    (fixed) :func:`tqlab.core.reservation.reserve_workspace`; decode call at
    ``max_num_seqs`` rows; lock; continuation call for ``cached_len``. The
    caller in the message is ``vllm_trace.py:<line>:_continuation_prefill``.
    ``"vllm"`` delegates to :func:`run_vllm_seed_scenario`.
    """
    if backend == "vllm":
        return run_vllm_seed_scenario(config, cached_len=cached_len, fixed=fixed)
    if backend != "tqlab":
        raise ValueError(f"backend must be 'tqlab' or 'vllm', got {backend!r}")
    from tqlab.core.reservation import reserve_workspace
    from tqlab.core.workspace import WorkspaceLockedError, WorkspaceManager, ubatch_context

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
