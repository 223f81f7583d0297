"""Data helpers and pictures for notebook 11's cache-order sections: vLLM's slot order
beside tqlab's opt-in block-SoA order, inside one (block, KV head) region of the cache.

* :func:`block_byte_ranges` / :func:`plot_block_orders` -- which byte ranges of one block hold key
  codes, value codes, norms/scales (from :meth:`TurboQuantSpec.field_addresses`, the one place both
  orders are defined), and which field starts are 16-byte aligned;
* :func:`order_rows` / :func:`order_targets` / :func:`plot_order_decode` -- the recorded decode
  times of both orders beside fp16 SDPA and vLLM 0.33's kernels, and which of issue 20's targets
  (the recording's own ``targets``) the block-SoA order meets
  (``data/turboquant_vs_vllm_h200.json``, ``benchmarks/bench_turboquant.py --vs-vllm``).

matplotlib is imported lazily.
"""

from __future__ import annotations

from typing import Any, Mapping

from tqlab.lab.plots_turboquant import FIELD_COLORS, finish_loglog
from tqlab.turboquant.spec import get_spec

__all__ = ["ALIGN", "ORDERS", "block_byte_ranges", "plot_block_orders", "order_rows", "order_targets",
           "plot_order_decode"]

ALIGN = 16  # bytes of one wide (128-bit) vector load
ORDERS = ("vllm", "block_soa")


def block_byte_ranges(kv_cache_dtype: str, head_dim: int, block_size: int, order: str) -> list[dict[str, Any]]:
    """The byte ranges of one (block, KV head) region of ``block_size * slot_bytes`` bytes in
    ``order`` (``"vllm"`` or ``"block_soa"``), ascending, one per maximal run of one field kind.

    Returns:
        dicts ``{"kind", "start", "end", "tokens", "aligned"}``: bytes ``[start, end)``, the tokens
        whose field lies there (ascending), ``aligned`` = ``start % ALIGN == 0``.  The ranges tile
        the region exactly.

    Raises:
        ValueError: unknown preset, order, ``head_dim`` or ``block_size`` (from ``get_spec`` /
            ``field_addresses``).
    """
    spec = get_spec(kv_cache_dtype, order)
    pieces = sorted((off + o * stride, off + o * stride + n, kind, o)
                    for kind, (off, stride, n) in spec.field_addresses(head_dim, block_size).items()
                    for o in range(block_size))
    out: list[dict[str, Any]] = []
    for start, end, kind, tok in pieces:
        if out and out[-1]["kind"] == kind and out[-1]["end"] == start:
            out[-1]["end"] = end
            out[-1]["tokens"].append(tok)
        else:
            out.append({"kind": kind, "start": start, "end": end, "tokens": [tok]})
    for r in out:
        r["aligned"] = r["start"] % ALIGN == 0
    return out


def plot_block_orders(kv_cache_dtype: str, head_dim: int, block_size: int, ax=None):
    """One bar per order: the region's bytes coloured by field kind (``FIELD_COLORS``), a tick on
    every 16-byte boundary, a black triangle on each field range that starts aligned.  Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 2.6))
    kinds: dict[str, None] = {}
    for y, order in enumerate(ORDERS):
        ranges = block_byte_ranges(kv_cache_dtype, head_dim, block_size, order)
        for r in ranges:
            kinds[r["kind"]] = None
            ax.barh(y, r["end"] - r["start"], left=r["start"], height=0.6, color=FIELD_COLORS[r["kind"]],
                    edgecolor="white", linewidth=0.3)
            if r["aligned"]:
                ax.plot(r["start"], y + 0.38, "kv", ms=4)
    total = ranges[-1]["end"]
    ax.set_xticks(range(0, total + 1, ALIGN), minor=True)
    ax.grid(axis="x", which="minor", color="#cccccc", lw=0.3)
    ax.set_yticks(range(len(ORDERS)), ["vLLM slot order", "block-SoA"])
    ax.set_ylim(-0.6, len(ORDERS) - 0.2)
    ax.set_xlim(0, total)
    ax.set_xlabel(f"byte in one (block, KV head) region: {block_size} tokens, {total} bytes "
                  f"(grid: {ALIGN} B; ▼ = field starts {ALIGN}-byte aligned)")
    ax.set_title(f"{kv_cache_dtype}, D {head_dim}: one block's bytes in both orders", fontsize=9)
    ax.legend(handles=[Patch(color=FIELD_COLORS[k], label=k) for k in kinds], fontsize=7, ncol=len(kinds),
              loc="upper center", bbox_to_anchor=(0.5, -0.32), frameon=False)
    return ax


def order_rows(rec: Mapping[str, Any], preset: str) -> list[dict[str, Any]]:
    """Rows of one preset from the side-by-side recording: decode ms of fp16 SDPA, vLLM 0.33's
    kernels on vLLM's layout, tqlab in vLLM's slot order and in block-SoA (each tqlab order at its
    faster split policy, ``*_best_ms``), the ratios ``vllm_order / soa`` and ``sdpa / soa``, block-SoA's share of
    the byte limit (``soa_frac``) and the kernel that served that block-SoA time (``soa_kernel``, as
    ``ops.decode_kernel_name``; None in recordings made before the side-by-side recorded it).

    Raises:
        ValueError: no row of that preset, or a row without block-SoA columns.
    """
    rows = [r for r in rec["rows"] if r["preset"] == preset]
    if not rows:
        raise ValueError(f"no rows for preset {preset!r} in the recording")
    out = []
    for r in rows:
        if "soa_best_ms" not in r:
            raise ValueError(f"row {r['shape']} {r['ctx']} {preset} has no block-SoA columns (soa_best_ms)")
        out.append({"shape": r["shape"], "batch": r["batch"], "ctx": r["ctx"], "sdpa_ms": r["sdpa_fp16_ms"],
                    "vllm_ms": r["vllm_ms"], "vllm_order_ms": r["tqlab_best_ms"], "soa_ms": r["soa_best_ms"],
                    "vllm_order_over_soa": r["tqlab_best_ms"] / r["soa_best_ms"],
                    "sdpa_over_soa": r["sdpa_fp16_ms"] / r["soa_best_ms"],
                    "soa_frac": r.get("soa_best_frac_of_byte_limit"), "soa_kernel": _best_kernel(r)})
    return sorted(out, key=lambda r: (r["shape"], r["ctx"]))


def _best_kernel(r: Mapping[str, Any]) -> str | None:
    """The kernel of the faster block-SoA split policy of a side-by-side row (``soa_kernel`` / ``soa_fill_kernel``)."""
    fill = "soa_fill_ms" in r and r["soa_fill_ms"] < r.get("soa_ms", float("inf"))
    return r.get("soa_fill_kernel" if fill else "soa_kernel")


def order_targets(rec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 20's decode targets (the recording's ``targets``), each for the block-SoA order at its
    best split policy over every row: ``{"at_sdpa_32k_128k": ..., "vllm_5x": ..., "llama_3bit_128k_2x": ...,
    "llama_byte_limit_32k_128k": ...}``, each ``{"target": x, "met": n_rows, "of": n_rows, "worst": min ratio}``.
    The 32K/128K rows are ``ctx >= 32768``; the 2× row is 3bit_nc on ``llama3.1-8b`` at the largest recorded
    context; the byte-limit rows are the Llama shard's at 32K/128K (every preset), share of the byte limit against
    ``targets["soa_frac_of_byte_limit_llama"]``."""
    t, rows = rec["targets"], list(rec["rows"])
    long_rows = [r for r in rows if r["ctx"] >= 32768]
    llama = [r for r in rows if r["shape"] == "llama3.1-8b" and r["preset"] == "turboquant_3bit_nc"]
    top = [r for r in llama if r["ctx"] == max(x["ctx"] for x in llama)]

    def one(target: float, rs: list, key: str) -> dict[str, Any]:
        vals = [r[key] for r in rs]
        return {"target": target, "met": sum(v >= target for v in vals), "of": len(vals), "worst": min(vals)}

    llama_long = [r for r in long_rows if r["shape"] == "llama3.1-8b"]
    return {"llama_byte_limit_32k_128k": one(t["soa_frac_of_byte_limit_llama"], llama_long,
                                             "soa_best_frac_of_byte_limit"),
            "at_sdpa_32k_128k": one(t["sdpa_over_tqlab_min_32k_128k"], long_rows, "sdpa_over_soa_best"),
            "vllm_5x": one(t["vllm_over_tqlab_min"], rows, "vllm_over_soa_best"),
            "llama_3bit_128k_2x": one(t["sdpa_over_tqlab_llama_3bit_128k"], top, "sdpa_over_soa_best")}


def plot_order_decode(rec: Mapping[str, Any], shape: str, preset: str, ax=None):
    """Decode ms (log) against context (log2) for one shape and preset: fp16 SDPA, vLLM 0.33's
    kernels, tqlab in vLLM's slot order, tqlab in block-SoA.  Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in order_rows(rec, preset) if r["shape"] == shape]
    if not rows:
        raise ValueError(f"no rows for shape {shape!r} and preset {preset!r}")
    x = [r["ctx"] for r in rows]
    for key, style, label in (("sdpa_ms", "k-D", "fp16 SDPA (flash)"), ("vllm_ms", "--s", "vLLM 0.33 kernels"),
                              ("vllm_order_ms", "-o", "tqlab, vLLM slot order"), ("soa_ms", "-^", "tqlab, block-SoA")):
        ax.plot(x, [r[key] for r in rows], style, ms=4, label=label)
    return finish_loglog(ax, "context (tokens)", "ms per decode step (one layer)",
                         f"{shape}, batch {rows[0]['batch']}, {preset.removeprefix('turboquant_')}")
