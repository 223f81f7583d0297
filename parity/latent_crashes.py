"""Issue 19's latent-crash candidates, each checked with the installed vLLM's own classes on this CPU (0.33, 0.34).

Each ``check_*`` returns ``{"candidate", "verdict", "evidence": {...}, "limits"}`` with ``verdict`` one of
``confirmed``, ``refuted``, ``not run``. ``parity/test_latent_crashes.py`` asserts the verdicts;
``python parity/latent_crashes.py`` (a parity venv) writes them to ``data/vllm_<x>_<y>_latent_crashes.json``
(``VllmVersion.latent_crashes_file``) with provenance. Run inside ``tqlab.vllm.vllm_cpu_patches()`` (the parity
conftest does; ``main`` does too).

1. TurboQuant, chunked prefill off + prefix caching: the fix reserves no continuation buffers, a prefix hit
   followed by > 128 new tokens runs ``_continuation_prefill`` (``tqlab.vllm.cpu_harness.run_vllm_seed_scenario``).
2. FlashAttention + DCP with PIECEWISE-only graphs: nothing reaches ``_forward_with_dcp`` with DCP context before
   the lock (profile run and PIECEWISE capture pass no attention metadata), so the first decode asks an empty slot.
3. Elastic EP: ``ElasticEPScalingExecutor.warm_and_capture`` unlocks, re-runs the profile run and
   ``compile_or_warm_up_model``, then calls ``lock_workspace()`` unconditionally, also for an eager deployment.
4. Dots3-Note: ``Dots3NoteMLAMetadataBuilder._reserve_attn_logits_workspace`` (a method) is never called; the
   parent ``TritonMLAMetadataBuilder.__init__`` calls ``triton_mla``'s module function of the same name.
"""

from __future__ import annotations

import ast
import inspect
import types
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch

MiB = 1024 * 1024


def _ns(**kw) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


def check_turboquant_prefix_hit_without_chunked_prefill() -> dict:
    from tqlab.core.config import EngineConfig
    from tqlab.vllm.cpu_harness import run_vllm_seed_scenario

    # the bug report's attention shapes (parity/test_seed_parity.py test_fix_leaves_prefix_hits_uncovered_without_chunked_prefill)
    cfg = EngineConfig.from_preset("nemotron-3-super-120b-a12b", enable_chunked_prefill=False,
                                   max_num_batched_tokens=131072, mamba_block_aligned_split=False)
    res = run_vllm_seed_scenario(cfg, cached_len=4096, q_len=200, fixed=True)
    ok = res.error is not None and "_continuation_prefill" in res.error
    return {"candidate": 1, "name": "TurboQuant: --no-enable-chunked-prefill + prefix caching",
            "verdict": "confirmed" if ok else "refuted",
            "evidence": {"vllm_error": res.error, "size_at_lock_bytes": list(res.size_at_lock),
                         "scenario": "PR #44053 builder reservation, decode warm-up, lock, then a 200-token chunk after "
                                     "4096 cached tokens (a prefix-cache hit) through TurboQuantAttentionImpl"},
            "limits": "vLLM's classes on CPU up to the kernel; not run end-to-end on a GPU"}


def check_flash_attn_dcp_piecewise() -> dict:
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None:  # vLLM 0.34: Model Runner V2 only
        return _check_flash_attn_dcp_jit_warmup()
    import vllm.distributed.parallel_state as ps
    import vllm.v1.attention.backends.flash_attn as fa
    import vllm.v1.worker.workspace as ws
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.cp_utils import get_dcp_dummy_context_len

    from test_consumers_parity import _flash_attn_impl

    src = inspect.getsource(gpu_model_runner.GPUModelRunner._dummy_run)
    metadata_rule = "if force_attention or cudagraph_runtime_mode == CUDAGraphMode.FULL:" in src
    capture_rule = "force_attention = cudagraph_runtime_mode == CUDAGraphMode.FULL" in inspect.getsource(gpu_model_runner)
    piecewise_ctx = get_dcp_dummy_context_len(2, 1, True, False, True, False)
    full_ctx = get_dcp_dummy_context_len(2, 1, True, False, True, True)
    impl = _flash_attn_impl(fa, ps, 8, 128, 2, 8192, torch.bfloat16)
    ws.reset_workspace_manager()
    ws.init_workspace_manager(torch.device("cpu"))
    try:
        with mock.patch.object(fa, "current_workspace_manager", ws.current_workspace_manager):
            impl.forward(None, torch.zeros(4, 8, 128), torch.zeros(4, 2, 128), torch.zeros(4, 2, 128),
                         torch.zeros(2, 2, 16, 256), None, torch.zeros(4, 8 * 128))  # profile run / PIECEWISE capture
            size_at_lock, error = _lock_then_decode(ws, fa, impl)
    finally:
        ws.reset_workspace_manager()
    ok = metadata_rule and capture_rule and piecewise_ctx == 0 and size_at_lock == 0 and error is not None
    return {"candidate": 2, "name": "FlashAttention + DCP, PIECEWISE-only CUDA graphs",
            "verdict": "confirmed" if ok else "refuted",
            "evidence": {"dummy_run_builds_metadata_only_if": "force_attention or cudagraph_runtime_mode == FULL"
                         if metadata_rule else "changed", "capture_forces_attention_only_for_FULL": capture_rule,
                         "dcp_dummy_context_len": {"PIECEWISE capture (not uniform decode)": piecewise_ctx,
                                                   "FULL uniform-decode capture": full_ctx},
                         "slot_bytes_at_lock": size_at_lock, "first_dcp_decode_after_lock": error},
            "limits": "V1 runner; Model Runner V2's JIT warm-up (on by default) runs a real decode before the lock and "
                      "would size it; another consumer (e.g. MoE) sizing the slot larger hides it"}


def _check_flash_attn_dcp_jit_warmup() -> dict:
    """Candidate 2 where the V1 runner is gone (vLLM 0.34): V2's JIT warm-up runs a real DCP decode before capture.

    ``Worker._compile_or_warm_up_model`` (``gpu_worker.py``) calls ``warmup_kernels`` when
    ``KernelConfig.enable_jit_warmup`` (default True), for every cudagraph mode, before ``capture_model``;
    ``_warmup_kernels`` (``v1/worker/gpu/warmup.py``) runs decode steps whose requests have context, so
    ``FlashAttentionImpl._forward_with_dcp`` makes its request before the lock. Shown here: that request (one DCP
    decode with context through vLLM's ``forward``) before the lock, then the same decode after it.
    """
    import vllm.distributed.parallel_state as ps
    import vllm.v1.attention.backends.flash_attn as fa
    import vllm.v1.worker.workspace as ws
    from vllm.config.kernel import KernelConfig
    from vllm.v1.worker import gpu_worker
    from vllm.v1.worker.gpu import warmup

    from test_consumers_parity import _flash_attn_impl

    worker_src = inspect.getsource(gpu_worker.Worker._compile_or_warm_up_model)
    jit_default = KernelConfig.__dataclass_fields__["enable_jit_warmup"].default
    warmup_before_capture = ("warmup_kernels(" in worker_src and "enable_jit_warmup" in worker_src
                             and worker_src.index("warmup_kernels(") < worker_src.index("capture_model()"))
    decode_steps = "num_decode_steps" in inspect.getsource(warmup._warmup_kernels)
    impl = _flash_attn_impl(fa, ps, 8, 128, 2, 8192, torch.bfloat16)
    class _KernelReached(Exception):
        pass

    def kernel(*a, **k):
        raise _KernelReached

    ws.reset_workspace_manager()
    ws.init_workspace_manager(torch.device("cpu"))
    try:
        with mock.patch.object(fa, "current_workspace_manager", ws.current_workspace_manager), \
             mock.patch.object(fa, "flash_attn_varlen_func", kernel, create=True):
            try:  # the JIT warm-up's decode step (context > 0): its workspace request, then the kernel (stopped)
                _decode_on_real_manager(fa, impl)
            except _KernelReached:
                pass
            size_at_lock, error = _lock_then_decode(ws, fa, impl, passed=_KernelReached)
    finally:
        ws.reset_workspace_manager()
    reached = jit_default is True and warmup_before_capture and decode_steps and size_at_lock > 0 and error is None
    return {"candidate": 2, "name": "FlashAttention + DCP, PIECEWISE-only CUDA graphs",
            "verdict": "refuted" if reached else "confirmed",
            "evidence": {"v1_runner": "absent (vllm/v1/worker/gpu_model_runner.py)",
                         "enable_jit_warmup_default": jit_default,
                         "warmup_kernels_before_capture_model": warmup_before_capture,
                         "jit_warmup_runs_decode_steps": decode_steps,
                         "slot_bytes_at_lock": size_at_lock, "first_dcp_decode_after_lock": error},
            "limits": "with the defaults only: with --kernel-config enable_jit_warmup=false V2's PIECEWISE capture path "
                      "is not checked; the warm-up's decode is vLLM's forward on CPU, not the whole warmup_kernels"}


def _lock_then_decode(ws, fa, impl, passed: type[BaseException] | tuple = ()) -> tuple[int, str | None]:
    """``(slot 0's bytes at the lock, vLLM's assertion text or None)``: lock vLLM's workspace, then run one DCP
    decode on it; an exception of type ``passed`` (the kernel reached) counts as no refusal."""
    m = ws.current_workspace_manager()
    size_at_lock = m._workspace_size_bytes(m._current_workspaces[0])
    ws.lock_workspace()
    try:
        _decode_on_real_manager(fa, impl)
    except AssertionError as e:
        return size_at_lock, str(e)
    except passed:
        pass
    return size_at_lock, None


def _decode_on_real_manager(fa, impl) -> None:
    """One DCP decode through the real ``forward`` on the real (locked) manager; stops at the kernel."""
    n, dcp = 4, 2
    md = _ns(num_actual_tokens=n, query_start_loc=torch.tensor([0, 1, 2, 3, 4]), seq_lens=torch.tensor([9, 9, 9, 9]),
             max_query_len=1, max_seq_len=9, block_table=torch.zeros(4, 4, dtype=torch.int32), scheduler_metadata=None,
             max_dcp_context_kv_len=5, num_decode_reqs=4, num_prefill_reqs=0, num_decode_tokens=4,
             num_prefill_tokens=0, causal=True, max_num_splits=0, dcp_context_kv_lens=torch.tensor([5, 5, 5, 5]))
    layer = _ns(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1),
                _q_scale_float=1.0, _k_scale_float=1.0, _v_scale_float=1.0)  # the floats: vLLM 0.34 reads them
    group = _ns(all_gather=lambda x, dim: torch.cat([x] * dcp, dim=dim))
    with mock.patch.object(fa, "get_dcp_group", lambda: group):
        impl.forward(layer, torch.zeros(n, 8, 128), torch.zeros(n, 2, 128), torch.zeros(n, 2, 128),
                     torch.zeros(2, 2, 16, 256), md, torch.zeros(n, 8 * 128))


def check_elastic_ep_relocks_eager() -> dict:
    import vllm.distributed.elastic_ep.elastic_execute as ee
    import vllm.v1.worker.workspace as ws
    from vllm.v1.worker import gpu_worker

    eager_skips_capture = "if not self.model_config.enforce_eager:" in inspect.getsource(gpu_worker.Worker._compile_or_warm_up_model)
    calls: list[str] = []
    ws.reset_workspace_manager()
    ws.init_workspace_manager(torch.device("cpu"))
    try:
        m = ws.current_workspace_manager()
        m.get_simultaneous(((1 * MiB,), torch.uint8))  # start-up profile run; eager: never locked
        locked_after_startup = m.is_locked()
        runner = _ns(max_num_tokens=8192, eep_eplb_suppressed=False, preserve_serving_state=lambda: nullcontext(),
                     # read by vLLM 0.34's eplb_utils.preserve_serving_state(runner): no request, no KV zeroer
                     req_states=_ns(req_id_to_index={}), block_tables=_ns(redirect_writes_to_null_block=False),
                     kv_block_zeroer=None, _remove_request=lambda req_id: None,
                     _dummy_run=lambda n, **kw: (calls.append(f"_dummy_run({n})"),
                                                 m.get_simultaneous(((2 * MiB,), torch.uint8))))
        worker = _ns(model_runner=runner, use_v2_model_runner=False, randomize_dummy_inputs=False,
                     vllm_config=_ns(parallel_config=_ns(all2all_backend="deepep_high_throughput"),
                                     kernel_config=_ns(enable_flashinfer_autotune=False)),
                     compile_or_warm_up_model=lambda: calls.append("compile_or_warm_up_model (eager: no capture)"))
        executor = object.__new__(ee.ElasticEPScalingExecutor)
        executor.worker_ref = lambda: worker
        with mock.patch.object(ee.ElasticEPScalingExecutor, "_release_cuda_graphs", lambda self: None), \
             mock.patch.object(ee, "get_ep_all2all_manager", lambda: _ns(mask_remote_ranks=nullcontext)):
            executor.warm_and_capture()
        locked_after_scale = m.is_locked()
        error = None
        try:
            m.get_simultaneous(((3 * MiB,), torch.uint8))  # a larger MoE scratch at serve time (data-dependent M)
        except AssertionError as e:
            error = str(e)
    finally:
        ws.reset_workspace_manager()
    ok = eager_skips_capture and not locked_after_startup and locked_after_scale and error is not None
    return {"candidate": 3, "name": "Elastic EP scale event locks an eager deployment",
            "verdict": "confirmed" if ok else "refuted",
            "evidence": {"eager_start_up_skips_capture_model (the only lock)": eager_skips_capture,
                         "locked_after_eager_start_up": locked_after_startup, "warm_and_capture_ran": calls,
                         "locked_after_scale_event": locked_after_scale, "larger_request_after_scale": error},
            "limits": "warm_and_capture runs for every all2all backend but nixl_ep (can_reuse_fused_moe_kernel); the "
                      "worker, runner and all2all manager are stand-ins, the executor method and the manager are "
                      "vLLM's; that DeepEP high-throughput's M exceeds the re-profiled size is not shown here"}


def _import_dots3_attention(fa_utils):
    """``vllm/models/dots3_note/nvidia/attention.py`` loaded on CPU, kernels stubbed.

    Its imports need CUDA-only pieces: ``fa_utils.compile_flash_attn_varlen_func_from_specs`` (defined on CUDA,
    ``None`` on XPU/ROCm, absent on CPU: set to ``None``) and ``vllm.vllm_flash_attn`` (raises ImportError without the
    CUDA extension: a stand-in module whose ``flash_attn_varlen_func`` is ``None``). The file is loaded by path, so
    the ``dots3_note`` package ``__init__`` (audio encoder, multimodal model) does not run. No kernel is called.
    """
    import importlib.util
    import sys

    import vllm.v1.attention.backends.mla.triton_mla as tm

    name = "vllm.models.dots3_note.nvidia.attention"
    if name in sys.modules:
        return sys.modules[name]
    fa_iface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    fa_iface.flash_attn_varlen_func = None
    fa_pkg = types.ModuleType("vllm.vllm_flash_attn")
    fa_pkg.flash_attn_interface = fa_iface
    path = Path(tm.__file__).parents[4] / "models" / "dots3_note" / "nvidia" / "attention.py"
    with mock.patch.object(fa_utils, "compile_flash_attn_varlen_func_from_specs", None, create=True), \
         mock.patch.dict(sys.modules, {"vllm.vllm_flash_attn": fa_pkg, "vllm.vllm_flash_attn.flash_attn_interface": fa_iface}):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def check_dots3_reservation_never_called() -> dict:
    import vllm.v1.attention.backends.fa_utils as fa_utils
    import vllm.v1.attention.backends.mla.triton_mla as tm

    dots = _import_dots3_attention(fa_utils)
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    vllm_dir = Path(tm.__file__).parents[4]
    method_calls, function_calls = [], []  # x._reserve_attn_logits_workspace(...) vs _reserve_attn_logits_workspace(...)
    for path in vllm_dir.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "_reserve_attn_logits_workspace" not in text:  # only files naming it can call it
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(vllm_dir)}:{node.lineno}"
            if isinstance(node.func, ast.Attribute) and node.func.attr == "_reserve_attn_logits_workspace":
                method_calls.append(where)
            elif isinstance(node.func, ast.Name) and node.func.id == "_reserve_attn_logits_workspace":
                function_calls.append(where)
    seqs, heads, window, mml, sm = 256, 16, 4096, 8192, 132

    def parent_init(self, kv_cache_spec, layer_names, vllm_config, device):
        self.reorder_batch_threshold, self.num_heads, self.dcp_world_size = 1, heads, 1
        self.mla_dims = _ns(kv_lora_rank=512, qk_rope_head_dim=64)
        self.vllm_config, self.model_config = vllm_config, vllm_config.model_config

    rec: list = []
    mgr = _ns(get_simultaneous=lambda *specs: rec.append(tuple(specs)))
    vcfg = _ns(model_config=_ns(max_model_len=mml, dtype=torch.bfloat16), scheduler_config=_ns(max_num_seqs=seqs))
    with mock.patch.object(MLACommonMetadataBuilder, "__init__", parent_init), \
         mock.patch.object(tm, "is_workspace_manager_initialized", lambda: True), \
         mock.patch.object(tm, "current_workspace_manager", lambda: mgr), \
         mock.patch.object(dots, "is_workspace_manager_initialized", lambda: True), \
         mock.patch.object(dots, "current_workspace_manager", lambda: mgr), \
         mock.patch.object(tm.current_platform, "num_compute_units", lambda *a: sm), \
         mock.patch.object(tm, "triton", _ns(next_power_of_2=lambda n: 1 if n <= 1 else 1 << (n - 1).bit_length())):
        builder = dots.Dots3NoteMLAMetadataBuilder(_ns(sliding_window=window), [], vcfg, torch.device("cpu"))
        at_init = list(rec)
        builder._reserve_attn_logits_workspace()  # what the method would have reserved, had anything called it
        intended = rec[len(at_init):]
    from tqlab.core.workspace import compute_layout

    init_bytes = max(compute_layout(c).total_bytes for c in at_init)
    intended_bytes = compute_layout(intended[0]).total_bytes
    method_called = bool(method_calls) or any("dots3_note" in c for c in function_calls)
    return {"candidate": 4, "name": "Dots3-Note's own reservation method is never called",
            "verdict": "refuted" if method_called else "confirmed",
            "evidence": {"calls_of_the_method": sorted(method_calls),
                         "calls_of_triton_mla_module_function": sorted(function_calls),
                         "builder_init_requests": [[list(s), str(d)] for c in at_init for s, d in c],
                         "method_would_request": [[list(s), str(d)] for c in intended for s, d in c],
                         "example": {"max_num_seqs": seqs, "heads_per_rank": heads, "sliding_window": window,
                                     "max_model_len": mml, "sm_count": sm, "reserved_at_init_bytes": init_bytes,
                                     "swa_gather_at_max_num_seqs_bytes": intended_bytes}},
            "limits": "the SWA gather (_forward_swa_mqa) is still sized by FULL decode capture up to the largest captured "
                      "batch; a refusal needs a larger decode batch after the lock (e.g. max_num_seqs 1024 > 512 "
                      "captured) or PIECEWISE-only graphs, with the gather larger than Triton MLA's logits reservation"}


CHECKS = (check_turboquant_prefix_hit_without_chunked_prefill, check_flash_attn_dcp_piecewise,
          check_elastic_ep_relocks_eager, check_dots3_reservation_never_called)


def main() -> int:
    import json
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root), str(Path(__file__).resolve().parent)]
    from tqlab.core import vllm_versions
    from tqlab.core.provenance import make_provenance, save_recorded
    from tqlab.vllm import vllm_cpu_patches, vllm_version

    with vllm_cpu_patches():
        results = [check() for check in CHECKS]
    release = vllm_version() or "unknown"
    out = vllm_versions.get(".".join(release.split(".")[:2])).latent_crashes_file
    prov = make_provenance(f"{Path(sys.executable).parents[1].name}/bin/python parity/latent_crashes.py",
                           extra={"vllm": release})
    path = save_recorded(out.stem, {"checks": results}, prov, root / "data")
    print(path, json.dumps([(r["candidate"], r["verdict"]) for r in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
