"""Every modelled workspace consumer (tqlab/core/consumers) vs what vLLM 0.33's own code asks for.

Each test runs vLLM's own function or class on this CPU with a recording workspace manager patched into the
module that calls ``current_workspace_manager()`` (the pattern of vLLM's unit tests), on seeded random
configs, and compares the recorded ``get_simultaneous`` call with tqlab's formula:

* TurboQuant: ``TurboQuantMetadataBuilder._reserve_workspace`` (through ``tqlab.vllm.vllm_reservation_calls``);
* FlashAttention DCP: a real ``FlashAttentionImpl`` (``__init__`` and ``forward`` up to the kernel);
* fused MoE: ``FusedMoEKernelModularImpl._allocate_buffers`` with ``TritonExperts`` (``is_cpu`` patched to
  False: on the CPU platform vLLM skips the manager);
* FlashMLA sparse: ``FlashMLASparseImpl.__init__`` (its parent's ``__init__`` replaced by a stand-in that
  sets the MLA attributes it reads);
* MLA prefill: ``TrtllmRaggedPrefillBackend`` / ``FlashInferPrefillBackend`` ``__init__``;
* Triton MLA: ``_reserve_attn_logits_workspace`` and ``TritonMLAMetadataBuilder.__init__``;
* sparse indexer: ``sparse_attn_indexer``'s profile-run branch and ``get_max_prefill_buffer_size``.
"""

from __future__ import annotations

import inspect
import random
import types
from unittest import mock

import pytest
from tqlab.core.dtypes import as_torch
import torch

from tqlab.core.config import EngineConfig
from tqlab.core.consumers.base import StartUp
from tqlab.core.consumers.flash_attn_dcp import FlashAttentionDCP, dcp_context_out_shapes
from tqlab.core.consumers.flashmla_sparse import flashmla_sparse_workspace_specs, sparse_mla_prefill_workspace_factor
from tqlab.core.consumers.fused_moe import FusedMoE
from tqlab.core.consumers.mla_prefill import FLASHINFER_WORKSPACE_BUFFER_SIZE, flashinfer_workspace_call
from tqlab.core.consumers.sparse_indexer import indexer_profile_call, max_prefill_buffer_size
from tqlab.core.consumers.triton_mla import TritonMLALogits, attn_logits_call
from tqlab.core.consumers.turboquant import TurboQuantContinuation, TurboQuantDecode
from tqlab.core.hardware import GPUS, gpu_target

N_RANDOM = 40
_COUNTS: dict[str, int] = {}


class _Stop(Exception):
    """Raised by the recorder to stop vLLM's forward right after its workspace request (before any kernel)."""


class Recorder:
    """A stand-in ``WorkspaceManager``: records each ``get_simultaneous`` call; ``stop`` raises after recording."""

    def __init__(self, stop: bool = False) -> None:
        self.calls: list[tuple] = []
        self.stop = stop

    def get_simultaneous(self, *specs):
        self.calls.append(tuple((tuple(s), d) for s, d in specs))
        if self.stop:
            raise _Stop
        return [torch.empty(s, dtype=as_torch(d), device="meta") for s, d in specs]


def _count(name: str) -> None:
    _COUNTS[name] = _COUNTS.get(name, 0) + 1


def _ns(**kw) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


# --------------------------------------------------------------------------- #
# TurboQuant / UltraQuant                                                     #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_turboquant_consumers_equal_vllms_builder(seed):
    from tqlab.vllm import vllm_reservation_calls

    rng = random.Random(seed)
    hk = rng.choice([1, 2, 4, 8])
    chunked = rng.random() < 0.7
    mml, seqs = rng.choice([256, 4096, 32768, 131072]), rng.choice([1, 64, 256])
    mnbt = max(mml, 256) if not chunked else max(seqs, rng.choice([128, 129, 2048, 8192]))
    cfg = EngineConfig(num_attention_heads=hk * rng.choice([1, 2, 4, 8]), num_key_value_heads=hk,
                       head_dim=rng.choice([64, 128, 256]), max_model_len=mml, max_num_seqs=seqs,
                       max_num_batched_tokens=mnbt,
                       enable_chunked_prefill=chunked, block_size=rng.choice([16, 32, 528]),
                       kv_cache_dtype=rng.choice(["turboquant_k8v4", "turboquant_4bit_nc"]),
                       tq_max_kv_splits_for_cuda_graph=rng.choice([8, 32]))
    theirs = vllm_reservation_calls(cfg)
    ours = TurboQuantDecode().sizes(cfg, StartUp()).reserved + TurboQuantContinuation().sizes(cfg, StartUp()).reserved
    assert [tuple(c) for c in ours] == [tuple(c) for c in theirs]
    _count("turboquant")


# --------------------------------------------------------------------------- #
# FlashAttention + DCP                                                        #
# --------------------------------------------------------------------------- #


def _flash_attn_impl(fa, ps, heads: int, head_size: int, dcp: int, mnbt: int, dtype):
    cfg = _ns(parallel_config=_ns(decode_context_parallel_size=dcp, dcp_comm_backend="ag_rs"),
              model_config=_ns(dtype=dtype), scheduler_config=_ns(max_num_batched_tokens=mnbt))
    with mock.patch.object(ps, "get_dcp_world_size_and_rank", lambda *a, **k: (dcp, 0)), \
         mock.patch.object(fa, "get_current_vllm_config_or_none", lambda: cfg), \
         mock.patch.object(fa, "get_flash_attn_version", lambda **k: 3):
        return fa.FlashAttentionImpl(heads, head_size, 0.1, max(1, heads // 4), None, None, "auto")


def _dcp_forward(fa, impl, heads: int, head_size: int, dcp: int, n: int, context: int) -> Recorder:
    rec = Recorder(stop=True)
    q = torch.zeros(n, heads, head_size)
    kv = torch.zeros(n, impl.num_kv_heads, head_size)
    md = _ns(num_actual_tokens=n, query_start_loc=torch.tensor([0, n]), seq_lens=torch.tensor([n + context]),
             max_query_len=n, max_seq_len=n + context, block_table=torch.zeros(1, 4, dtype=torch.int32),
             scheduler_metadata=None, max_dcp_context_kv_len=context, num_decode_reqs=0, num_prefill_reqs=1,
             num_decode_tokens=0, num_prefill_tokens=n, causal=True, max_num_splits=0,
             dcp_context_kv_lens=torch.tensor([context]))
    layer = _ns(_q_scale=torch.ones(1), _k_scale=torch.ones(1), _v_scale=torch.ones(1),
                _q_scale_float=1.0, _k_scale_float=1.0, _v_scale_float=1.0)  # the floats: vLLM 0.34 reads them
    group = _ns(all_gather=lambda x, dim: torch.cat([x] * dcp, dim=dim))
    with mock.patch.object(fa, "get_dcp_group", lambda: group), mock.patch.object(fa, "current_workspace_manager", lambda: rec):
        try:
            impl.forward(layer, q, kv, kv, torch.zeros(2, impl.num_kv_heads, 16, 2 * head_size), md,
                         torch.zeros(n, heads * head_size))
        except _Stop:
            pass
    return rec


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_flash_attn_dcp_equals_vllms_forward(seed):
    import vllm.distributed.parallel_state as ps
    import vllm.v1.attention.backends.flash_attn as fa

    rng = random.Random(seed)
    tp, dcp = rng.choice([(2, 2), (4, 2), (4, 4), (8, 2), (8, 8)])
    hq = tp * rng.choice([1, 2, 4, 8])
    d, mnbt = rng.choice([64, 128, 256]), rng.choice([256, 2048, 8192, 16384])
    dtype = rng.choice([torch.bfloat16, torch.float16])
    cfg = EngineConfig(num_attention_heads=hq, num_key_value_heads=tp, head_dim=d, tensor_parallel_size=tp,
                       decode_context_parallel_size=dcp, max_num_batched_tokens=mnbt, dtype=dtype)
    impl = _flash_attn_impl(fa, ps, cfg.num_heads_per_rank, d, dcp, mnbt, dtype)
    rec = _dcp_forward(fa, impl, cfg.num_heads_per_rank, d, dcp, n=rng.choice([1, 5, 64]), context=rng.choice([1, 100]))
    sized = FlashAttentionDCP().sizes(cfg, StartUp("FULL_AND_PIECEWISE", True))
    assert rec.calls == [tuple(sized.runtime[0])] == [tuple(sized.reserved[0])]
    assert rec.calls[0] == dcp_context_out_shapes(mnbt, cfg.num_heads_per_rank, dcp, d, dtype)
    _count("flash_attn_dcp")


def test_flash_attn_dcp_asks_nothing_in_the_profile_run_or_without_context():
    import vllm.distributed.parallel_state as ps
    import vllm.v1.attention.backends.flash_attn as fa

    impl = _flash_attn_impl(fa, ps, 8, 128, 2, 4096, torch.bfloat16)
    rec = Recorder()
    with mock.patch.object(fa, "current_workspace_manager", lambda: rec):
        impl.forward(None, torch.zeros(4, 8, 128), torch.zeros(4, 2, 128), torch.zeros(4, 2, 128),
                     torch.zeros(2, 2, 16, 256), None, torch.zeros(4, 8 * 128))  # profile run: no metadata
    assert rec.calls == []
    kernel = mock.Mock(return_value=None)  # context 0: _forward_with_dcp runs the plain varlen kernel, no workspace
    with mock.patch.object(fa, "flash_attn_varlen_func", kernel, create=True):
        assert _dcp_forward(fa, impl, 8, 128, 2, n=4, context=0).calls == []
    assert kernel.call_count == 1


# --------------------------------------------------------------------------- #
# Fused MoE (TritonExperts)                                                   #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_fused_moe_equals_vllms_allocate_buffers(seed):
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    rng = random.Random(seed)
    tp = rng.choice([1, 2, 4, 8])
    ep = rng.random() < 0.3
    act = rng.choice([MoEActivation.SILU, MoEActivation.GELU, MoEActivation.SILU_NO_MUL, MoEActivation.RELU2_NO_MUL])
    inter, hidden = tp * rng.choice([96, 192, 256, 768]), rng.choice([1024, 2048, 4096, 7168])
    e, topk = rng.choice([8, 64, 128]), rng.choice([1, 2, 8])
    mnbt, dtype = rng.choice([256, 2048, 8192, 16384]), rng.choice([torch.bfloat16, torch.float16])
    cfg = EngineConfig(num_attention_heads=32, num_key_value_heads=8, head_dim=128, tensor_parallel_size=tp,
                       max_num_batched_tokens=mnbt, dtype=dtype, enable_expert_parallel=ep,
                       moe=dict(num_experts=e, num_experts_per_tok=topk, moe_intermediate_size=inter,
                                hidden_size=hidden, activation=act.value))
    n = (2 if act.is_gated else 1) * inter // (1 if ep else tp)  # w1's width on this rank
    impl = object.__new__(mk.FusedMoEKernelModularImpl)
    impl.fused_experts = object.__new__(TritonExperts)
    impl.prepare_finalize = _ns(allocate_fused_expert_output=lambda *a: None)
    rec = Recorder()
    with mock.patch.object(mk, "current_workspace_manager", lambda: rec), \
         mock.patch.object(mk.current_platform, "is_cpu", lambda: False):
        impl._allocate_buffers(dtype, torch.device("meta"), mnbt, mnbt, n, hidden, topk, e, e, None, act)
    assert rec.calls == [tuple(FusedMoE().sizes(cfg, StartUp()).reserved[0])]
    _count("fused_moe")


# --------------------------------------------------------------------------- #
# FlashMLA sparse                                                             #
# --------------------------------------------------------------------------- #


def _flashmla_sparse_specs(num_heads, kv_lora_rank, rope, kv_dtype, mnbt, mml, factor):
    import vllm.v1.attention.backends.mla.flashmla_sparse as fms
    from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl

    def parent_init(self, num_heads, head_size, *a, **kw):  # the attributes FlashMLASparseImpl.__init__ reads
        self.num_heads, self.kv_lora_rank, self.qk_rope_head_dim = num_heads, kv_lora_rank, rope
        self.need_to_return_lse_for_decode, self.dcp_world_size, self.pcp_world_size = False, 1, 1
        self.supports_dense_mha_prefill = True
        self.use_shardq = False  # vLLM 0.34 (SparseMLACommonImpl sets it from the parallel config)

    cfg = _ns(scheduler_config=_ns(max_num_batched_tokens=mnbt), model_config=_ns(max_model_len=mml),
              attention_config=_ns(sparse_mla_prefill_workspace_factor=factor),
              parallel_config=_ns(prefill_context_parallel_size=1, decode_context_parallel_size=1, tensor_parallel_size=1))
    rec = Recorder()
    with mock.patch.object(SparseMLACommonImpl, "__init__", parent_init), \
         mock.patch.object(fms, "get_current_vllm_config", lambda: cfg), \
         mock.patch.object(fms, "current_workspace_manager", lambda: rec), \
         mock.patch.object(torch.accelerator, "current_device_index", lambda: 0), \
         mock.patch.object(fms, "num_compute_units", lambda _: 132, create=not hasattr(fms, "num_compute_units")):
        fms.FlashMLASparseImpl(num_heads, kv_lora_rank + rope, 0.1, 1, None, None, kv_dtype, None, "decoder", None)
    return rec.calls


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_flashmla_sparse_equals_vllms_workspace_specs(seed):
    rng = random.Random(seed)
    heads, rope = rng.choice([4, 8, 16, 32, 64, 128]), rng.choice([64, 64, 0])
    kv = rng.choice(["fp8_ds_mla", "nvfp4_ds_mla", "auto"])
    if kv != "fp8_ds_mla" and rope == 0:
        rope = 64
    mnbt, mml, factor = rng.choice([256, 2048, 8192]), rng.choice([4096, 163840, 1048576]), rng.choice([2, 3, 5])
    theirs = _flashmla_sparse_specs(heads, 512, rope, kv, mnbt, mml, factor)
    assert theirs == [flashmla_sparse_workspace_specs(heads, 512, rope, kv, mnbt, mml, factor)]
    _count("flashmla_sparse")


def test_sparse_mla_default_factor_is_vllms_rule():
    """vLLM resolves the factor inside ``VllmConfig.__post_init__`` (not callable alone): the source states the rule."""
    from vllm.config.vllm import VllmConfig

    src = inspect.getsource(VllmConfig.__post_init__)
    assert "5 if self.model_config.max_model_len <= 256 * 1024 else 2" in src
    assert [sparse_mla_prefill_workspace_factor(n) for n in (163840, 262144, 262145)] == [5, 5, 2]


# --------------------------------------------------------------------------- #
# MLA prefill (TRT-LLM ragged, FlashInfer), Triton MLA, sparse indexer         #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("module, cls", [("trtllm_ragged", "TrtllmRaggedPrefillBackend"), ("flashinfer", "FlashInferPrefillBackend")])
def test_mla_prefill_reservation_equals_vllms(module, cls):
    import importlib

    import vllm.envs as envs
    from vllm.platforms.interface import DeviceCapability

    mod = importlib.import_module(f"vllm.v1.attention.backends.mla.prefill.{module}")
    rec = Recorder()
    cfg = _ns(attention_config=_ns(trtllm_ragged_backend="auto"))
    with mock.patch.object(mod, "current_workspace_manager", lambda: rec):
        getattr(mod, cls)(16, 0.1, 512, 128, 64, 128, cfg)
    assert envs.VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE == FLASHINFER_WORKSPACE_BUFFER_SIZE == 394 * 1024 * 1024
    assert rec.calls == [flashinfer_workspace_call()]
    if module == "trtllm_ragged":  # SM100 only, as tqlab's GPU table says
        b = getattr(mod, cls)
        for g in GPUS.values():
            assert b.supports_compute_capability(DeviceCapability(*g.capability)) == g.is_sm100
    _count("mla_prefill")


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_triton_mla_reservation_equals_vllms(seed):
    import vllm.v1.attention.backends.mla.triton_mla as tm
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    rng = random.Random(seed)
    gpu = gpu_target(rng.choice(list(GPUS)))
    tp = rng.choice([1, 2, 4, 8])
    dcp = rng.choice([d for d in (1, 2, 4) if tp % d == 0])
    cfg = EngineConfig(num_attention_heads=tp * rng.choice([2, 8, 16]), num_key_value_heads=1, head_dim=576,
                       tensor_parallel_size=tp, decode_context_parallel_size=dcp,
                       max_num_seqs=rng.choice([1, 128, 256, 1024]), max_model_len=rng.choice([300, 4096, 163840]),
                       max_num_batched_tokens=2048, gpu=gpu.name, attention_backend="TRITON_MLA",
                       mla=dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128))
    vcfg = _ns(model_config=_ns(max_model_len=cfg.max_model_len), scheduler_config=_ns(max_num_seqs=cfg.max_num_seqs))

    def parent_init(self, kv_cache_spec, layer_names, vllm_config, device):
        self.reorder_batch_threshold, self.num_heads, self.dcp_world_size = 1, cfg.num_heads_per_rank, dcp
        self.mla_dims = _ns(kv_lora_rank=512, qk_rope_head_dim=64)

    rec = Recorder()
    with mock.patch.object(MLACommonMetadataBuilder, "__init__", parent_init), \
         mock.patch.object(tm, "is_workspace_manager_initialized", lambda: True), \
         mock.patch.object(tm, "current_workspace_manager", lambda: rec), \
         mock.patch.object(tm.current_platform, "num_compute_units", lambda *a: gpu.sm_count), \
         mock.patch.object(tm, "triton", _ns(next_power_of_2=lambda n: 1 if n <= 1 else 1 << (n - 1).bit_length())):
        # Triton is absent on this CPU: triton.next_power_of_2 (the smallest power of 2 >= n) stands in
        tm.TritonMLAMetadataBuilder(None, [], vcfg, torch.device("cpu"))
    ours = TritonMLALogits().sizes(cfg, StartUp())
    assert rec.calls == [tuple(ours.reserved[0])]
    assert rec.calls[0] == attn_logits_call(cfg.max_num_seqs, cfg.num_heads_per_rank * dcp, 512, cfg.max_model_len, gpu.sm_count)
    _count("triton_mla_logits")


@pytest.mark.parametrize("seed", range(N_RANDOM // 2))
def test_sparse_indexer_profile_reservation_equals_vllms(seed):
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    from vllm.v1.attention.backends.mla.indexer import get_max_prefill_buffer_size

    rng = random.Random(seed)
    mml, factor, head_dim = rng.choice([4096, 163840, 1048576]), rng.choice([2, 5]), rng.choice([64, 128])
    rows = get_max_prefill_buffer_size(_ns(model_config=_ns(max_model_len=mml),
                                           attention_config=_ns(sparse_mla_prefill_workspace_factor=factor)))
    assert rows == max_prefill_buffer_size(mml, factor)
    rec = Recorder(stop=True)
    with mock.patch.object(sai, "get_forward_context", lambda: _ns(attn_metadata=None)), \
         mock.patch.object(sai, "current_workspace_manager", lambda: rec):
        with pytest.raises(_Stop):
            # q_quant (4 tokens, 16 heads, head_dim): vLLM 0.34 reads its shape before the profile branch
            sai.sparse_attn_indexer(torch.zeros(4, 16), "layer.0", None, torch.zeros(4, 16, head_dim), None, None, None,
                                    128, None, 2048,
                                    head_dim, mml, rows, torch.zeros(4, 2048, dtype=torch.int32), False, False, False,
                                    "layer.0")
    assert rec.calls == [indexer_profile_call(rows, head_dim)]
    _count("sparse_indexer")


def test_zz_record_consumer_parity_counts(record):
    """How many random configs each consumer was compared on (data/parity_results.json)."""
    assert _COUNTS, "run the whole module"
    for name, n in sorted(_COUNTS.items()):
        record(f"consumer_parity:{name}", n)


def test_census_is_up_to_date_with_the_installed_vllm(record):
    """The installed release's census (data/vllm_<x>_<y>_workspace_consumers.json) matches its source
    (parity/gen_consumer_census.py)."""
    import importlib.util
    import json
    from pathlib import Path

    import vllm

    spec = importlib.util.spec_from_file_location("gen_consumer_census", Path(__file__).with_name("gen_consumer_census.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    fresh = gen.census(Path(vllm.__file__).parent)
    recorded = json.loads(gen.out_path(fresh["vllm_version"]).read_text())
    assert fresh["counts"] == recorded["counts"] and fresh["call_sites"] == recorded["call_sites"]
    assert fresh["unlock_sites"] == recorded["unlock_sites"]  # seed 002's Elastic EP row (tqlab.vllm.source_scan)
    unlock_line, counts, platforms = {"0.33.0": (707, (85, 81, 4), (54, 29, 2)),
                                      "0.34.0": (730, (96, 89, 6), (62, 32, 2))}[fresh["vllm_version"]]
    assert [u["site"] for u in fresh["unlock_sites"]] == [f"distributed/elastic_ep/elastic_execute.py:{unlock_line}"]
    assert (fresh["counts"]["call_sites"], fresh["counts"]["get_simultaneous"], fresh["counts"]["persistent"]) == counts
    assert (fresh["counts"]["cuda"], fresh["counts"]["rocm"], fresh["counts"]["xpu"]) == platforms
    record("census_counts", fresh["counts"])
