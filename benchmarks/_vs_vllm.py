"""Side-by-side decode timing: vLLM 0.33's TurboQuant kernels vs tqlab vs fp16 SDPA vs the byte limit.

Used by ``bench_turboquant.py --vs-vllm``.  vLLM's kernels are imported at run time from a
``vllm_tq`` anchor folder (``--vllm-anchor``; its ``vllm_tq_kernels`` package and ``tq_layout``
helpers, Apache-2.0, see that folder's NOTICE.md); nothing of vLLM is copied into the project.

Per (shape, B, ctx): one random fp16 K/V; fp16 SDPA (flash backend) on it; per preset the same
K/V stored into vLLM's cache layout by vLLM's store kernel and into tqlab's by tqlab's, twice:
in vLLM's slot order (columns ``tqlab*``) and in the opt-in block-SoA order (``cache_layout=
"block_soa"``, columns ``soa*``; vLLM's kernels stay on vLLM's layout).  Every
time is the median of CUDA-graph replays of one call, each replay after a 256 MiB write that
evicts L2 (a model step reads the other layers in between), timed with CUDA events.

Byte limit (ms) = bytes one decode step must read or write (packed cache + block table + query
+ output; the fp16 K/V for SDPA) / the measured device copy bandwidth (read + written bytes per
second of a 1 GiB copy).  ``frac_of_byte_limit`` = byte-limit ms / measured ms.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from _tq_bench import BLOCK, fill_paged, random_decode_inputs, sdpa

SHAPES = {  # per tensor-parallel rank, with the batch of the table
    "llama3.1-8b": dict(hq=32, hk=8, d=128, batch=16),
    "seed_tp8_rank": dict(hq=4, hk=1, d=128, batch=4),
}
CONTEXTS = (8192, 32768, 131072)


def load_anchor(path: str | None):
    """(vllm_tq_kernels module, tq_layout module, info) from the anchor folder, or (None, None, info)."""
    if not path or not (Path(path) / "vllm_tq_kernels").is_dir():
        return None, None, {"anchor": path, "error": "no vllm_tq_kernels folder there"}
    sys.path.insert(0, str(Path(path).resolve()))
    import tq_layout  # noqa: PLC0415
    import vllm_tq_kernels as vk  # noqa: PLC0415

    return vk, tq_layout, {"anchor": str(Path(path).resolve()), "vllm_version": getattr(vk, "VLLM_VERSION", "?")}


def step_bytes(batch, ctx, hq, hk, d, slot_bytes, q_bytes=2) -> int:
    """Bytes a decode step must move: packed cache + int32 block table + query + output."""
    return batch * ctx * hk * slot_bytes + batch * math.ceil(ctx / BLOCK) * 4 + 2 * batch * hq * d * q_bytes


def time_vllm(vk, tq_layout, preset, k, v, q, seq_lens, splits, timer) -> dict:
    """vLLM 0.33's decode (q rotation GEMM + stage1 + stage2) on its own cache of the same K/V."""
    b, hq, d = q.shape
    cfg = vk.TurboQuantConfig.from_cache_dtype(preset, d)
    consts = vk.layer_constants(cfg, "cuda")
    cache, bt = tq_layout.fill_cache_vllm(k, v, cfg, consts, BLOCK, seed=k.shape[2])
    mid = torch.empty(b, hq, splits, d + 1, device="cuda")
    out = torch.empty(b, hq, d, device="cuda", dtype=q.dtype)
    lse = torch.empty(b, hq, device="cuda")

    def run():
        vk.triton_turboquant_decode_attention(
            query=q, kv_cache=cache, block_table=bt, seq_lens=seq_lens, Pi=consts["Pi"],
            centroids=consts["centroids"], scale=d**-0.5, mse_bits=cfg.key_mse_bits,
            key_packed_size=cfg.key_packed_size, value_quant_bits=cfg.value_quant_bits,
            key_fp8=cfg.key_fp8, norm_correction=cfg.norm_correction, PiT=consts["PiT"],
            mid_o_buf=mid, output_buf=out, lse_buf=lse, max_num_kv_splits=splits)

    ms = timer(run)
    res = {"ms": ms, "slot_bytes": cfg.slot_size_aligned, "out": out.clone()}
    del cache, bt
    return res


def time_tqlab(preset, k, v, q, seq_lens, splits_list, timer, cache_layout="vllm") -> dict:
    """tqlab's decode on its own cache (in ``cache_layout``) of the same K/V, for each split count."""
    from tqlab.turboquant import decode_attention, get_spec
    from tqlab.turboquant.ops import decode_kernel_name

    spec = get_spec(preset, cache_layout=cache_layout)
    b, hq, d = q.shape
    cache, bt = fill_paged(spec, k, v)
    res = {"slot_bytes": spec.slot_bytes(d), "by_splits": {}}
    for s in splits_list:
        mid = torch.empty(b, hq, s, d + 1, device="cuda")
        out = torch.empty(b, hq, d, device="cuda", dtype=q.dtype)
        lse = torch.empty(b, hq, device="cuda")
        ms = timer(lambda: decode_attention(q, cache, bt, seq_lens, spec, d**-0.5, mid, out, lse))
        res["by_splits"][s] = {"ms": ms, "out": out.clone(), "kernel": decode_kernel_name(q, cache, spec)}
    del cache, bt
    return res


def _rel(out, ref) -> float:
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def bench_context(shape, ctx, presets, vllm_presets, anchor, copy_gbps, timer, log) -> list[dict]:
    """All rows of one (shape, ctx): SDPA once, then per preset vLLM (if anchored) and tqlab."""
    from tqlab.turboquant.ops import VLLM_NUM_SPLITS, decode_num_splits

    sh = SHAPES[shape]
    b, hq, hk, d = sh["batch"], sh["hq"], sh["hk"], sh["d"]
    k, v, q = random_decode_inputs(b, hq, hk, ctx, d, seed=1000 + ctx + b + hq)
    seq_lens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    q4 = q.to(torch.float16)[:, :, None, :]
    sdpa_ms = timer(lambda: sdpa(q4, k, v, d**-0.5))
    ref = sdpa(q4.float(), k.float(), v.float(), d**-0.5)[:, :, 0]  # fp32, unquantized
    sdpa_bytes = 2 * b * hk * ctx * d * 2 + 2 * b * hq * d * 2
    splits = sorted({VLLM_NUM_SPLITS, decode_num_splits(b, hk, "fill")})
    rows = []
    for preset in presets:
        row = {"shape": shape, "hq": hq, "hk": hk, "d": d, "batch": b, "ctx": ctx, "preset": preset,
               "sdpa_fp16_ms": sdpa_ms, "sdpa_byte_limit_ms": sdpa_bytes / copy_gbps / 1e6}
        tq = time_tqlab(preset, k, v, q, seq_lens, splits, timer)
        nbytes = step_bytes(b, ctx, hq, hk, d, tq["slot_bytes"])
        row.update({"slot_bytes": tq["slot_bytes"], "step_bytes": nbytes, "byte_limit_ms": nbytes / copy_gbps / 1e6})
        for s, r in tq["by_splits"].items():
            key = "tqlab" if s == VLLM_NUM_SPLITS else "tqlab_fill"
            row[f"{key}_ms"], row[f"{key}_splits"], row[f"{key}_kernel"] = r["ms"], s, r["kernel"]
            row[f"{key}_rel_err_vs_fp32"] = _rel(r["out"], ref)
        del tq
        for s, r in time_tqlab(preset, k, v, q, seq_lens, splits, timer, "block_soa")["by_splits"].items():
            key = "soa" if s == VLLM_NUM_SPLITS else "soa_fill"
            row[f"{key}_ms"], row[f"{key}_splits"], row[f"{key}_kernel"] = r["ms"], s, r["kernel"]
            row[f"{key}_rel_err_vs_fp32"] = _rel(r["out"], ref)
        if anchor[0] is not None and preset in vllm_presets:
            vr = time_vllm(anchor[0], anchor[1], preset, k, v, q, seq_lens, VLLM_NUM_SPLITS, timer)
            row.update({"vllm_ms": vr["ms"], "vllm_rel_err_vs_fp32": _rel(vr["out"], ref)})
        _derive(row)
        rows.append(row)
        log(row)
        torch.cuda.empty_cache()
    del k, v
    torch.cuda.empty_cache()
    return rows


def _derive(row: dict) -> None:
    """Ratios of one row: fraction of the byte limit, speedups over vLLM and SDPA."""
    for key in ("tqlab", "tqlab_fill", "soa", "soa_fill", "vllm"):
        if f"{key}_ms" in row:
            row[f"{key}_frac_of_byte_limit"] = row["byte_limit_ms"] / row[f"{key}_ms"]
    best = min(row[k] for k in ("tqlab_ms", "tqlab_fill_ms") if k in row)
    row["tqlab_best_ms"] = best
    row["sdpa_over_tqlab"] = row["sdpa_fp16_ms"] / row["tqlab_ms"]
    row["sdpa_over_tqlab_best"] = row["sdpa_fp16_ms"] / best
    if "vllm_ms" in row:
        row["vllm_over_tqlab"] = row["vllm_ms"] / row["tqlab_ms"]
        row["vllm_over_tqlab_best"] = row["vllm_ms"] / best
    if "soa_ms" in row:  # the block-SoA layout (opt-in)
        soa = min(row[k] for k in ("soa_ms", "soa_fill_ms") if k in row)
        row["soa_best_ms"] = soa
        row["soa_best_frac_of_byte_limit"] = row["byte_limit_ms"] / soa
        row["sdpa_over_soa_best"] = row["sdpa_fp16_ms"] / soa
        row["tqlab_best_over_soa_best"] = best / soa
        if "vllm_ms" in row:
            row["vllm_over_soa_best"] = row["vllm_ms"] / soa


def table(rows: list[dict]) -> str:
    """The issue's table: shape, B, ctx, preset, vLLM / tqlab (S=32) / tqlab (fill) / SDPA /
    byte-limit ms, tqlab's fraction of the byte limit, speedups."""
    def f(x, fmt="{:.3f}"):
        return fmt.format(x) if isinstance(x, (int, float)) else "-"

    head = ("| shape (per rank) | B | ctx | preset | vLLM 0.33 ms | tqlab ms (S=32) | tqlab ms (fill, S) | "
            "fp16 SDPA ms | byte limit ms | tqlab / byte limit | vLLM / tqlab | SDPA / tqlab (best) |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        out.append(
            f"| {r['shape']} (Hq {r['hq']}, Hk {r['hk']}, D {r['d']}) | {r['batch']} | {r['ctx'] // 1024}K | "
            f"{r['preset'].removeprefix('turboquant_')} | {f(r.get('vllm_ms'))} | {f(r['tqlab_ms'])} | "
            f"{f(r.get('tqlab_fill_ms'))} ({r.get('tqlab_fill_splits', '-')}) | {f(r['sdpa_fp16_ms'])} | "
            f"{f(r['byte_limit_ms'])} | {f(r['tqlab_frac_of_byte_limit'], '{:.1%}')} | "
            f"{f(r.get('vllm_over_tqlab'), '{:.2f}x')} | {f(r['sdpa_over_tqlab_best'], '{:.2f}x')} |")
    if any("soa_best_ms" in r for r in rows):
        out += ["", "Block-SoA layout (opt-in ``cache_layout='block_soa'``; best of S=32 and fill):", "",
                "| shape | ctx | preset | SDPA ms | vLLM ms | tqlab best ms | block-SoA ms (S=32) | block-SoA ms (fill) | "
                "SDPA / SoA | vLLM / SoA | tqlab / SoA | SoA / byte limit |", "|" + "---|" * 12]
        for r in rows:
            if "soa_best_ms" not in r:
                continue
            out.append(
                f"| {r['shape']} B{r['batch']} | {r['ctx'] // 1024}K | {r['preset'].removeprefix('turboquant_')} | "
                f"{f(r['sdpa_fp16_ms'])} | {f(r.get('vllm_ms'))} | {f(r['tqlab_best_ms'])} | {f(r.get('soa_ms'))} | "
                f"{f(r.get('soa_fill_ms'))} | {f(r['sdpa_over_soa_best'], '{:.2f}x')} | "
                f"{f(r.get('vllm_over_soa_best'), '{:.2f}x')} | {f(r['tqlab_best_over_soa_best'], '{:.2f}x')} | "
                f"{f(r['soa_best_frac_of_byte_limit'], '{:.1%}')} |")
    return "\n".join(out)
