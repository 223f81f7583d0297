"""Generate ``data/vllm_<version>_workspace_consumers.json``: every workspace call site of one vLLM release, classified.

Run with any Python (it parses vLLM's source with :mod:`ast`, it does not import vLLM)::

    .venv/bin/python parity/gen_consumer_census.py [--vllm DIR] [--check]

``DIR`` defaults to ``.venv-parity/lib/python3.11/site-packages/vllm`` (``PARITY_VENV`` overrides the
venv); the output file is named by the release found next to ``DIR`` (``vllm-<x.y.z>.dist-info``):
``vllm_0_33_...`` for 0.33.0, ``vllm_0_34_...`` for 0.34.0 (e.g. ``--vllm /work/vsrc/0.34/vllm``, an
unpacked wheel). A call site is a call ``X.get_simultaneous(...)``, ``X.get_persistent(...)``,
``X.get_persistent_resource(...)`` or (vLLM 0.34 on) ``X.get_retained(...)`` outside ``vllm/v1/worker/workspace.py`` (the manager itself:
``get_persistent`` calling ``get_persistent_resource`` is not a consumer).

Each record: ``site`` (``path:line``), ``call`` (which method), ``function`` (enclosing
``Class.method`` — vLLM's assertion names ``file.py:line:function``), ``platform`` (``cuda``,
``rocm`` or ``xpu``: by path — ``amd/``, ``rocm_``, ``segmented_attention`` (used only by
``rocm_segmented_attn``) are ROCm, ``xpu/`` is XPU, the rest CUDA), and for CUDA sites, read by hand
in vLLM's source: ``role`` (``reserve``: a call made only to size the slot; ``use``: a call whose views
are used; ``persistent``: a keyed resource), ``first_sized_by`` (the phase before the lock that first
makes this request or one that covers it: ``init`` = a builder's/impl's ``__init__``, slot (0, 0);
``profile_run`` = ``_dummy_run(max_num_batched_tokens, is_profile=True)``, no attention metadata;
``kernel_warmup``; ``capture`` (FULL capture builds attention metadata); ``none`` = nothing before the
lock; ``never_called``), ``covered_by`` (the reserving site for a ``use``) and ``note``; ``consumer``
names the tqlab registry entry (``tqlab/core/consumers``) that models it, or null. Non-CUDA sites
get a ``first_sized_by`` from the function's name only (``phase_source: "name"``).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "vllm_0_33_workspace_consumers.json"
"""The 0.33 recording (the default when no version is found); :func:`out_path` names each version's."""
CALLS = ("get_simultaneous", "get_persistent", "get_persistent_resource", "get_retained")
_PROFILE = "profile_run"

# (path suffix, function) -> role, first_sized_by, covered_by, consumer, note.  Read in vLLM 0.33's source.
_CUDA: dict[tuple[str, str], tuple[str, str, str | None, str | None, str]] = {
    ("fused_moe/experts/fused_humming_moe.py", "HummingExpertsBase.make_workspaces"):
        ("use", _PROFILE, None, None, "Humming quantized MoE experts only; sized by the MoE forward of the profile run"),
    ("fused_moe/modular_kernel.py", "FusedMoEKernelModularImpl._allocate_buffers"):
        ("use", _PROFILE, None, "fused_moe", "workspace13/output + workspace2 from fused_experts.workspace_shapes at M rows; "
         "the profile run's MoE forward has M = max_num_batched_tokens (skipped on the CPU platform)"),
    ("fused_moe/moe_permute_unpermute.py", "get_moe_permute_scratch"):
        ("persistent", _PROFILE, None, None, "keyed (MoEPermuteScratch, num_experts, num_local_experts, device): a new key after the lock raises"),
    ("layers/indexer_topk.py", "SparseIndexerTopk.forward"):
        ("use", _PROFILE, "model_executor/layers/sparse_attn_indexer.py:sparse_attn_indexer",
         None, "RADIX_TOPK_WORKSPACE_SIZE (1 MiB) uint8; the indexer's profile reservation includes it"),
    ("gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention._warmup_prefill_kernels"):
        ("reserve", _PROFILE, None, None, "Qwen GDN state checkpoints (prefix caching export); first forward warms up"),
    ("gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention._warmup_flashinfer_prefill_variants"):
        ("use", _PROFILE, None, None, "same checkpoint spec as _warmup_prefill_kernels"),
    ("gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention._forward_core"):
        ("use", _PROFILE, "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:_warmup_prefill_kernels", None, "checkpoint buffer"),
    ("utils/marlin_utils.py", "get_marlin_workspace"):
        ("persistent", _PROFILE, None, None, "keyed ('marlin_locks', current_stream()): a stream first seen after the lock raises"),
    ("layers/sparse_attn_indexer.py", "sparse_attn_indexer"):
        ("reserve+use", _PROFILE, None, "sparse_indexer", "profile branch (attn_metadata not a dict) reserves K-gather values/scales at "
         "total_seq_lens rows + 1 MiB top-k scratch; the prefill branch uses values/scales"),
    ("layers/sparse_mqa_indexer.py", "_prefill_k_workspaces"):
        ("reserve+use", _PROFILE, None, None, "MXFP4 K-gather: SparseMQAIndexer._reserve_workspaces calls it in the profile "
         "branch (attn_metadata not a dict), the prefill uses it"),
    ("warmup/deep_gemm_warmup.py", "_deepgemm_grouped_fp8_gemm_nt_contiguous_warmup._warmup"):
        ("use", "kernel_warmup", None, None, "DeepGEMM grouped FP8 warm-up at MAX_M rows"),
    ("deepseek_v4/nvidia/flashmla.py", "DeepseekV4FlashMLAAttention.forward_mqa"):
        ("reserve", _PROFILE, None, None, "DeepSeek-V4: attn_metadata None branch reserves the prefill gather workspace"),
    ("deepseek_v4/nvidia/flashmla.py", "DeepseekV4FlashMLAAttention._forward_prefill"):
        ("use", _PROFILE, "models/deepseek_v4/nvidia/flashmla.py:forward_mqa", None, "DeepSeek-V4 prefill gather"),
    ("deepseek_v41/nvidia/flash_mla_mega_attn.py", "DeepseekV4MegaAttnAttention._reserve_prefill_workspace"):
        ("reserve", _PROFILE, None, None, "DeepSeek-V4.1 mega attention, called from forward when attn_metadata is None"),
    ("deepseek_v41/nvidia/flash_mla_mega_attn.py", "DeepseekV4MegaAttnAttention._forward_prefill_mega"):
        ("use", _PROFILE, "models/deepseek_v41/nvidia/flash_mla_mega_attn.py:_reserve_prefill_workspace", None, ""),
    ("deepseek_v41/nvidia/flashmla.py", "DeepseekV4FlashMLAAttention.forward_mqa"):
        ("reserve", _PROFILE, None, None, "DeepSeek-V4.1 profile-branch reservation"),
    ("deepseek_v41/nvidia/flashmla.py", "DeepseekV4FlashMLAAttention._forward_prefill"):
        ("use", _PROFILE, "models/deepseek_v41/nvidia/flashmla.py:forward_mqa", None, ""),
    ("specialized_decode/attention/candidate_topk.py", "select_candidate_blocks_cooperative"):
        ("use", _PROFILE, "model_executor/layers/sparse_attn_indexer.py:sparse_attn_indexer", None, "1 MiB top-k scratch"),
    ("dots3_note/nvidia/attention.py", "Dots3NoteMLAMetadataBuilder._reserve_attn_logits_workspace"):
        ("reserve", "never_called", None, None, "method shadows triton_mla's module function of the same name; nothing calls the method "
         "(TritonMLAMetadataBuilder.__init__ calls the module function)"),
    ("dots3_note/nvidia/attention.py", "Dots3NoteTritonMLAImpl._forward_swa_mqa"):
        ("use", "capture", "v1/attention/backends/mla/triton_mla.py:_reserve_attn_logits_workspace", None,
         "(num_reqs, gather_len, head_size) + bool; only Triton MLA's logits reservation sizes the slot"),
    ("glm5next/common/kda.py", "Glm5NextLinearAttention._flashkda_prefill"):
        ("use", _PROFILE, None, None, "FlashKDA prefill buffers (GLM-5-Next)"),
    ("glm5next/nvidia/sparse_indexer.py", "sparse_attn_indexer_kpool"):
        ("reserve+use", _PROFILE, None, None, "GLM-5-Next k-pool indexer: profile branch + prefill"),
    ("hy_v4/nvidia/flashmla_sparse.py", "HYV4FlashMLASparseImpl._bf16_flash_mla_kernel"):
        ("use", "init", "v1/attention/backends/mla/flashmla_sparse.py:FlashMLASparseImpl.__init__", None, "HY-V4 subclass of FlashMLA sparse"),
    ("kimi_k3/nvidia/dspark_mla.py", "K3DSparkModel._precompute_fused_context_kv"):
        ("use", "jit_warmup_v2", None, None, "DSpark drafter (lane 1, Model Runner V2)"),
    ("kimi_k3/nvidia/kda.py", "KimiK3DeltaAttention._forward"):
        ("use", _PROFILE, None, None, "Kimi-K3 FlashKDA prefill buffers"),
    ("v1/attention/backends/b12x.py", "B12xPagedAttentionImpl.__init__"):
        ("reserve", "init", None, None, "b12x: scratch bytes from compiled kernel plans (not closed form)"),
    ("v1/attention/backends/b12x.py", "B12xPagedAttentionImpl._compile_paged_extend_entry"):
        ("use", "init", "v1/attention/backends/b12x.py:B12xPagedAttentionImpl.__init__", None, ""),
    ("v1/attention/backends/b12x.py", "B12xPagedAttentionImpl.forward"):
        ("use", "init", "v1/attention/backends/b12x.py:B12xPagedAttentionImpl.__init__", None, ""),
    ("v1/attention/backends/flash_attn.py", "FlashAttentionImpl._forward_with_dcp"):
        ("use", "capture", None, "flash_attn_dcp", "(max(n, max_num_batched_tokens), Hq*dcp, D) model dtype; reached only with DCP "
         "context (max_dcp_context_kv_len > 0): not in the profile run (attn_metadata None returns early), only FULL capture"),
    ("mla/flashmla_sparse.py", "FlashMLASparseImpl.__init__"):
        ("reserve", "init", None, "flashmla_sparse", "workspace_specs: q_concat + (fp8_ds_mla/nvfp4_ds_mla) prefill workspace + 3 per-token buffers"),
    ("mla/flashmla_sparse.py", "FlashMLASparseImpl._gather_prefill_chunk"):
        ("use", "init", "v1/attention/backends/mla/flashmla_sparse.py:FlashMLASparseImpl.__init__", None, ""),
    ("mla/flashmla_sparse.py", "FlashMLASparseImpl._forward_fp8_kv_separate_prefill_decode"):
        ("use", "init", "v1/attention/backends/mla/flashmla_sparse.py:FlashMLASparseImpl.__init__", None, ""),
    ("mla/flashmla_sparse.py", "FlashMLASparseImpl._bf16_flash_mla_kernel"):
        ("use", "init", "v1/attention/backends/mla/flashmla_sparse.py:FlashMLASparseImpl.__init__", None, ""),
    ("mla/flashmla_sparse.py", "FlashMLASparseImpl.forward_mqa"):
        ("use", "init", "v1/attention/backends/mla/flashmla_sparse.py:FlashMLASparseImpl.__init__", None, ""),
    ("mla/prefill/flashinfer.py", "FlashInferPrefillBackend.__init__"):
        ("reserve", "init", None, "mla_prefill_flashinfer", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE uint8"),
    ("mla/prefill/flashinfer.py", "FlashInferPrefillBackend.prepare_metadata"):
        ("use", "init", "v1/attention/backends/mla/prefill/flashinfer.py:FlashInferPrefillBackend.__init__", None, ""),
    ("mla/prefill/trtllm_ragged.py", "TrtllmRaggedPrefillBackend.__init__"):
        ("reserve", "init", None, "mla_prefill_trtllm_ragged", "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE uint8; SM100 only"),
    ("mla/prefill/trtllm_ragged.py", "TrtllmRaggedPrefillBackend.prepare_metadata"):
        ("use", "init", "v1/attention/backends/mla/prefill/trtllm_ragged.py:TrtllmRaggedPrefillBackend.__init__", None, ""),
    ("mla/tokenspeed_mla.py", "_get_workspace"):
        ("use", "capture", None, None, "TokenSpeed MLA: bound from the SM count of the tokenspeed_mla package"),
    ("mla/triton_mla.py", "_reserve_attn_logits_workspace"):
        ("reserve", "profile_run", None, "triton_mla_logits", "builder __init__ and impl.reserve_workspace() (profile run, mla_attention.py)"),
    ("mla/triton_mla.py", "TritonMLAImpl.forward_mqa"):
        ("use", "profile_run", "v1/attention/backends/mla/triton_mla.py:_reserve_attn_logits_workspace", None, ""),
    ("backends/turboquant_attn.py", "TurboQuantMetadataBuilder._reserve_workspace"):
        ("reserve", "init", None, "turboquant", "PR #44053: decode views at max_num_seqs; continuation buffers only with chunked prefill "
         "and max_num_batched_tokens > 128"),
    ("backends/turboquant_attn.py", "TurboQuantAttentionImpl._ensure_on_device"):
        ("reserve", _PROFILE, None, None, "pre-warm only when _soa_store (the ROCm FlyDSL decode path): unreachable on CUDA"),
    ("backends/turboquant_attn.py", "TurboQuantAttentionImpl._continuation_prefill"):
        ("use", "init", "v1/attention/backends/turboquant_attn.py:TurboQuantMetadataBuilder._reserve_workspace", "turboquant",
         "uncovered with chunked prefill off + a prefix-cache hit > 128 new tokens (latent crash 1)"),
    ("backends/turboquant_attn.py", "TurboQuantAttentionImpl._decode_attention"):
        ("use", "init", "v1/attention/backends/turboquant_attn.py:TurboQuantMetadataBuilder._reserve_workspace", "turboquant", ""),
    ("backends/ultraquant_attn.py", "UltraQuantAttentionImpl._ensure_on_device"):
        ("reserve", _PROFILE, None, None, "pre-warm only with _use_ultraquant_flydsl (the ROCm FlyDSL path): unreachable on CUDA"),
    ("backends/ultraquant_attn.py", "UltraQuantAttentionImpl._decode_attention"):
        ("use", "init", "v1/attention/backends/turboquant_attn.py:TurboQuantMetadataBuilder._reserve_workspace", "turboquant",
         "UltraQuant inherits TurboQuant's builder and its reservation"),
    ("backends/ultraquant_attn.py", "UltraQuantAttentionImpl._ultraquant_continuation_prefill"):
        ("use", "init", "v1/attention/backends/turboquant_attn.py:TurboQuantMetadataBuilder._reserve_workspace", "turboquant", ""),
}

# Read in vLLM 0.34's source: the CUDA sites new in 0.34 (a site of 0.33 keeps its 0.33 reading unless listed).
_CUDA_0_34: dict[tuple[str, str], tuple[str, str, str | None, str | None, str]] = {
    ("gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention._forward_flashinfer_prefill"):
        ("use", _PROFILE, "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:_warmup_prefill_kernels", None,
         "checkpoint buffer (0.33's _forward_core site moved here)"),
    ("kimi_k3/nvidia/kda.py", "KimiK3DeltaAttention.__init__"):
        ("reserve", "init", None, None, "FlashKDA buffers or the FlashInfer KDA output (1, max_num_batched_tokens, H, D): "
         "'Profiling skips attention, so reserve its runtime layout before the KV cache is sized'"),
    ("kimi_k3/nvidia/kv_balanced_mla/decode.py", "KvBalancedDecode._buffers"):
        ("reserve+use", "init", None, None, "split-KV scratch (workspace_bytes(heads, max_q, max_num_seqs),) int8 + persistent "
         "counts/work plans; KvBalancedDecode.__init__ calls _buffers() (slot 0, 0), each decode step again"),
    ("minimax_m3/nvidia/indexer_nvfp4.py", "MiniMaxM3IndexerNvfp4Impl.reserve_workspace"):
        ("reserve", _PROFILE, None, None, "(max_gather_pages, PAGE_SIZE, HEAD_DIM) fp8 gather pages; called from the model's "
         "forward when slot_mapping is not bound (the profile run)"),
    ("minimax_m3/nvidia/indexer_nvfp4.py", "MiniMaxM3IndexerNvfp4Impl._prefill"):
        ("use", _PROFILE, "models/minimax_m3/nvidia/indexer_nvfp4.py:MiniMaxM3IndexerNvfp4Impl.reserve_workspace", None,
         "(max(total_pages, 1), PAGE_SIZE, HEAD_DIM) fp8 per prefill chunk"),
    ("deepseek_v41/nvidia/flash_mla_mega_attn.py", "DeepseekV4MegaAttnAttention._forward_prefill_mega"):
        ("use", _PROFILE, "models/deepseek_v41/nvidia/flash_mla_mega_attn.py:_reserve_prefill_workspace", None,
         "get_simultaneous index scratch + get_retained KV chunk at the tail; _reserve_prefill_workspace sizes both side by side"),
}

_ROCM_ONLY_ON_CUDA_FILES = {
    ("backends/turboquant_attn.py", "TurboQuantAttentionImpl._ensure_on_device"),
    ("backends/ultraquant_attn.py", "UltraQuantAttentionImpl._ensure_on_device"),
}
"""Sites in CUDA files whose branch runs only on ROCm (counted as CUDA by path, flagged ``reachable_on_cuda: false``)."""


def release_of(version: str) -> str:
    """``"0.34"`` for ``"0.34.0"``: the version part of the output file's name."""
    return ".".join(version.split(".")[:2])


def out_path(version: str) -> Path:
    """``data/vllm_<major>_<minor>_workspace_consumers.json`` for a release such as ``"0.34.0"`` (0.33's for unknown)."""
    if version == "unknown":
        return OUT
    return ROOT / "data" / f"vllm_{release_of(version).replace('.', '_')}_workspace_consumers.json"


def _table(version: str) -> dict:
    """The hand-read classification for ``version``: 0.33's, with 0.34's readings on top from 0.34 on."""
    table = dict(_CUDA)
    if version != "unknown" and tuple(int(p) for p in release_of(version).split(".")) >= (0, 34):
        table.update(_CUDA_0_34)
    return table


def default_vllm_dir() -> Path:
    venv = Path(os.environ.get("PARITY_VENV", ROOT / ".venv-parity"))
    return venv / "lib" / "python3.11" / "site-packages" / "vllm"


def platform_of(path: str) -> str:
    """``rocm``, ``xpu`` or ``cuda`` for a path relative to the vllm package (see the module docstring)."""
    parts = path.split("/")
    if "xpu" in parts:
        return "xpu"
    if "amd" in parts or any(p.startswith("rocm_") for p in parts) or parts[-1] == "segmented_attention.py":
        return "rocm"
    return "cuda"


def find_call_sites(vllm_dir: Path) -> list[dict]:
    """Every ``get_simultaneous`` / ``get_persistent`` / ``get_persistent_resource`` call under ``vllm_dir``."""
    sites: list[dict] = []
    for path in sorted(vllm_dir.rglob("*.py")):
        rel = path.relative_to(vllm_dir).as_posix()
        if rel == "v1/worker/workspace.py":
            continue
        text = path.read_text(encoding="utf-8")
        if any(c in text for c in CALLS):  # an attribute's name is in the text: parse only those files
            _visit(ast.parse(text, filename=rel), rel, [], sites)
    return sites


def find_unlock_sites(vllm_dir: Path) -> list[dict]:
    """Every call of ``unlock_workspace()`` outside ``vllm/v1/worker/workspace.py`` (Elastic EP re-warms
    after unlocking: seed 002's table names it): ``site``, ``path``, ``line``, ``function``."""
    out: list[dict] = []
    for path in sorted(vllm_dir.rglob("*.py")):
        rel = path.relative_to(vllm_dir).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel == "v1/worker/workspace.py" or "unlock_workspace" not in text:
            continue
        for fn in [n for n in ast.walk(ast.parse(text, filename=rel)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for c in ast.walk(fn):
                if isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None)) == "unlock_workspace":
                    out.append({"site": f"{rel}:{c.lineno}", "path": rel, "line": c.lineno, "function": fn.name})
    return sorted({o["site"]: o for o in out}.values(), key=lambda o: (o["path"], o["line"]))


def _visit(node: ast.AST, rel: str, stack: list[str], out: list[dict]) -> None:
    for child in ast.iter_child_nodes(node):
        named = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in CALLS:
            out.append({"site": f"{rel}:{child.lineno}", "path": rel, "line": child.lineno,
                        "call": child.func.attr, "function": ".".join(stack)})
        _visit(child, rel, stack + [child.name] if named else stack, out)


def _phase_by_name(function: str) -> str:
    name = function.rsplit(".", 1)[-1]
    if name == "__init__" or name.startswith("_init_"):
        return "init"
    if "reserve" in name:
        return _PROFILE
    return "forward"


def classify(site: dict, table: dict | None = None) -> dict:
    """Add ``platform``, ``role``, ``first_sized_by``, ``covered_by``, ``consumer``, ``note`` to one site
    (``table``: :func:`_table` of the release; default 0.33's)."""
    table = _CUDA if table is None else table
    rec = dict(site)
    rec["platform"] = platform_of(site["path"])
    key = next((k for k in table if site["path"].endswith(k[0]) and site["function"] == k[1]), None)
    if rec["platform"] == "cuda":
        if key is None:
            raise SystemExit(f"unclassified CUDA call site {site['site']} in {site['function']}: read it and add it to "
                             f"_CUDA (or the release's _CUDA_<version> table)")
        role, phase, covered_by, consumer, note = table[key]
        rec.update(role=role, first_sized_by=phase, phase_source="read", covered_by=covered_by,
                   consumer=consumer, note=note, reachable_on_cuda=key not in _ROCM_ONLY_ON_CUDA_FILES)
    else:
        rec.update(role="persistent" if site["call"] != "get_simultaneous" else None,
                   first_sized_by=_phase_by_name(site["function"]), phase_source="name",
                   covered_by=None, consumer=None, note="not CUDA: not modelled", reachable_on_cuda=False)
    rec["assertion_name"] = f"{Path(site['path']).name}:{site['function'].rsplit('.', 1)[-1]}"
    return rec


def _vllm_version(vllm_dir: Path) -> str:
    metas = sorted(vllm_dir.parent.glob("vllm-*.dist-info/METADATA"))
    for line in (metas[0].read_text().splitlines() if metas else []):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def census(vllm_dir: Path) -> dict:
    """The census payload (without provenance): ``counts``, ``call_sites`` and ``unlock_sites``."""
    version = _vllm_version(vllm_dir)
    table = _table(version)
    sites = [classify(s, table) for s in find_call_sites(vllm_dir)]
    count = lambda pred: sum(1 for s in sites if pred(s))  # noqa: E731
    counts = {
        "call_sites": len(sites),
        "get_simultaneous": count(lambda s: s["call"] == "get_simultaneous"),
        "persistent": count(lambda s: s["call"] in ("get_persistent", "get_persistent_resource")),
        "cuda": count(lambda s: s["platform"] == "cuda"),
        "rocm": count(lambda s: s["platform"] == "rocm"),
        "xpu": count(lambda s: s["platform"] == "xpu"),
        "cuda_reachable": count(lambda s: s["reachable_on_cuda"]),
        "cuda_modelled": count(lambda s: s["platform"] == "cuda" and s["consumer"] is not None),
        "cuda_by_first_sized_by": {},
    }
    for s in sites:
        if s["platform"] == "cuda":
            d = counts["cuda_by_first_sized_by"]
            d[s["first_sized_by"]] = d.get(s["first_sized_by"], 0) + 1
    if any(s["call"] == "get_retained" for s in sites):
        counts["get_retained"] = count(lambda s: s["call"] == "get_retained")
    return {"vllm_version": version, "counts": counts, "call_sites": sites,
            "unlock_sites": find_unlock_sites(vllm_dir)}


def _provenance(version: str) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    return {"device": "none (source read with ast)", "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "commit": commit or "unknown", "command": "python parity/gen_consumer_census.py", "torch": "not used",
            "vllm": version}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", type=Path, default=None, help="vllm package directory (default: the parity venv's)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the recorded call sites differ")
    args = ap.parse_args(argv)
    vllm_dir = args.vllm or default_vllm_dir()
    if not (vllm_dir / "v1" / "worker" / "workspace.py").is_file():
        print(f"no vLLM source at {vllm_dir} (run bash parity/run.sh first, or pass --vllm)", file=sys.stderr)
        return 2
    payload = census(vllm_dir)
    out_file = out_path(payload["vllm_version"])
    if args.check:
        old = json.loads(out_file.read_text())
        same = all(old.get(k) == payload[k] for k in ("call_sites", "counts", "unlock_sites"))
        print("census up to date" if same else f"{out_file.name} differs from vLLM's source: re-run without --check")
        return 0 if same else 1
    out = {"provenance": _provenance(payload["vllm_version"]), **payload}
    out_file.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{out_file.relative_to(ROOT)}: {json.dumps(payload['counts'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
