"""Data helpers and pictures for notebook 04 (TurboQuant KV cache).

Each picture has a plain data function (tested) and a ``plot_*`` function; matplotlib is imported
lazily, so importing this module never needs a display.

* :func:`slot_table` / :func:`plot_slot_layouts` -- the bytes of one slot, per preset;
* :func:`plot_key_journey` -- one key vector to bytes and back (from ``quant.key_journey``);
* :func:`plot_accuracy` -- compression ratio vs attention error (rows of ``accuracy.accuracy_table``);
* :func:`workspace_vs_cache` -- continuation-prefill workspace bytes vs the packed bytes they come
  from, per cached length (shapes from ``tqlab.core.reservation``);
* :func:`bench_summary` / :func:`plot_decode_bench` -- the recorded GPU benchmark
  (``data/turboquant_bench.json``) as tables and a plot;
* :func:`vs_vllm_series` / :func:`plot_decode_vs_vllm` -- decode time against context for tqlab,
  vLLM 0.33's own kernels, fp16 SDPA and the byte limit, preset as colour
  (``data/turboquant_vs_vllm_h200.json``, written by ``benchmarks/bench_turboquant.py --vs-vllm``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tqlab.turboquant.spec import TQ_PRESETS, fp16_slot_bytes, get_spec

__all__ = [
    "finish_loglog",
    "FIELD_COLORS",
    "slot_table",
    "plot_slot_layouts",
    "plot_key_journey",
    "plot_accuracy",
    "workspace_vs_cache",
    "bench_summary",
    "plot_decode_bench",
    "PRESET_COLORS",
    "vs_vllm_series",
    "plot_decode_vs_vllm",
]

PRESET_COLORS = {
    "turboquant_k8v4": "#2b6cb0",
    "turboquant_4bit_nc": "#2f855a",
    "turboquant_k3v4_nc": "#b7791f",
    "turboquant_3bit_nc": "#c53030",
}
_SERIES = ("tqlab", "tqlab_best", "vllm", "byte_limit")

FIELD_COLORS = {
    "key_idx": "#2b6cb0",
    "key_fp8": "#2c5282",
    "key_norm": "#90cdf4",
    "val_idx": "#c05621",
    "val_scale": "#fbd38d",
    "val_zero": "#f6e05e",
    "pad": "#e2e8f0",
}


def finish_loglog(ax, xlabel: str, ylabel: str, title: str, *, fontsize: int = 8, ncol: int = 1, legend: bool = True):
    """The figures' log-log house style: x in powers of two, y log, both grids, a legend (unless
    ``legend=False``: the caller places its own). Returns ``ax``."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    if legend:
        ax.legend(fontsize=fontsize, ncol=ncol)
    return ax


def slot_table(head_dim: int = 128, presets: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per preset: key/value/slot bytes, fp16 bytes (``4*D``) and the compression ratio."""
    rows = []
    for name in presets or TQ_PRESETS:
        s = get_spec(name)
        rows.append({
            "preset": name,
            "key bits": "fp8" if s.key_fp8 else s.key_bits,
            "value bits": s.value_bits,
            "norm corr.": s.norm_correction,
            "key_packed B": s.key_packed_bytes(head_dim),
            "value_packed B": s.value_packed_bytes(head_dim),
            "slot B": s.slot_bytes(head_dim),
            "fp16 K+V B": fp16_slot_bytes(head_dim),
            "ratio": round(s.compression_ratio(head_dim), 2),
        })
    return rows


def plot_slot_layouts(head_dim: int = 128, presets: Sequence[str] | None = None, ax=None):
    """Horizontal byte map of one slot per preset (fields coloured), with the fp16 size for scale."""
    import matplotlib.pyplot as plt

    names = list(presets or TQ_PRESETS)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 * len(names) + 1.2))
    fp16 = fp16_slot_bytes(head_dim)
    for i, name in enumerate(names):
        for f in get_spec(name).layout(head_dim):
            ax.barh(i, f.nbytes, left=f.offset, color=FIELD_COLORS[f.kind], edgecolor="white", height=0.6)
            if f.nbytes >= 12:
                ax.text(f.offset + f.nbytes / 2, i, f"{f.nbytes}", ha="center", va="center", fontsize=8)
        ax.text(get_spec(name).slot_bytes(head_dim) + 4, i, f"{get_spec(name).slot_bytes(head_dim)} B", va="center", fontsize=9)
    ax.axvline(fp16, color="k", ls="--", lw=1)
    ax.text(fp16 - 4, -0.55, f"fp16 K+V = {fp16} B", ha="right", va="bottom", fontsize=9)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel(f"bytes per (position, kv-head), head_dim = {head_dim}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in FIELD_COLORS.values()]
    ax.legend(handles, list(FIELD_COLORS), ncol=7, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ax.set_xlim(0, fp16 * 1.05)
    ax.set_ylim(len(names) - 0.5, -0.9)
    return ax


def plot_key_journey(journey: Mapping[str, Any], spec, max_bytes: int = 24):
    """Four panels: the key, its rotated unit vector on the Lloyd-Max levels, the packed bytes,
    and the reconstruction on top of the original."""
    import matplotlib.pyplot as plt
    import numpy as np

    from tqlab.turboquant.codebook import lloyd_max

    spec = get_spec(spec)
    k = journey["key"].numpy()
    d = k.shape[0]
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5))
    a = axes[0, 0]
    a.bar(range(d), k, color="#4a5568", width=1.0)
    a.set_title(f"1. key k (D={d}), ||k|| = {float(np.linalg.norm(k)):.3f}")
    a.set_xlabel("coordinate")
    a.set_ylabel("k[i]")
    a = axes[0, 1]
    if "rotated" in journey:
        cb = lloyd_max(spec.key_bits, d)
        y = journey["rotated"].numpy()
        a.scatter(range(d), y, s=8, color="#2b6cb0", label="H u (rotated unit key)")
        a.scatter(range(d), journey["centroid"].numpy(), s=8, color="#c05621", marker="x", label="centroid[idx]")
        for b in cb.boundaries:
            a.axhline(b, color="#a0aec0", lw=0.5, ls=":")
        for c in cb.centroids:
            a.axhline(c, color="#c05621", lw=0.4)
        a.set_title(f"2. rotate, then snap to {1 << spec.key_bits} Lloyd-Max levels for N(0, 1/{d})")
        a.set_ylabel("(H u)[i]")
        lo, hi = float(min(y.min(), cb.centroids.min())), float(max(y.max(), cb.centroids.max()))
        a.set_ylim(lo - 0.05 * (hi - lo), hi + 0.35 * (hi - lo))  # headroom: the legend sits above the data
        a.legend(fontsize=8, loc="upper center", ncol=2, framealpha=0.9)
    else:
        a.text(0.5, 0.5, "fp8 keys: no rotation, no codebook", ha="center", va="center")
    a.set_xlabel("coordinate")
    a = axes[1, 0]
    packed = journey["packed"].numpy()
    shown = packed[:max_bytes]
    bits = np.unpackbits(shown[:, None], axis=1, bitorder="little")  # (n, 8), bit 0 first
    a.imshow(bits, cmap="Greys", aspect="auto", interpolation="nearest")
    a.set_yticks(range(len(shown)), [f"{i:2d}: 0x{b:02x}" for i, b in enumerate(shown)], fontsize=7)
    a.set_xticks(range(8), [f"b{i}" for i in range(8)], fontsize=7)
    a.set_title(f"3. packed key bytes (first {len(shown)} of {len(packed)}), bit 0 left")
    a = axes[1, 1]
    kh = journey["key_hat"].numpy()
    a.plot(k, color="#4a5568", lw=1, label="k")
    a.plot(kh, color="#c05621", lw=1, ls="--", label="k_hat (dequantized)")
    rel = float(np.linalg.norm(k - kh) / np.linalg.norm(k))
    a.set_title(f"4. back: relative error {rel:.3f}")
    lo, hi = float(min(k.min(), kh.min())), float(max(k.max(), kh.max()))
    a.set_ylim(lo - 0.05 * (hi - lo), hi + 0.3 * (hi - lo))  # headroom: the legend sits above the data
    a.legend(fontsize=8, loc="upper center", ncol=2, framealpha=0.9)
    a.set_xlabel("coordinate")
    a.set_ylabel("k[i] and k_hat[i]")
    fig.suptitle(f"One key's journey through {spec.name}")
    fig.tight_layout()
    return fig


def plot_accuracy(rows: Sequence[Mapping[str, Any]], ax=None):
    """Compression ratio (x) vs decode attention relative error (y), one labelled point per preset."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    for r in rows:
        ax.scatter(r["compression"], r["rel_err"], s=50)
        ax.annotate(f"{r['preset']}\ncos_min {r['cos_min']:.3f}", (r["compression"], r["rel_err"]),
                    textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel("compression vs fp16 K+V (x)")
    ax.set_ylabel("attention output relative error")
    ax.set_title("Compression vs accuracy (decode vs fp32 SDPA, random data)")
    ax.grid(alpha=0.3)
    return ax


def workspace_vs_cache(cached_lens: Sequence[int], num_kv_heads: int, head_dim: int, block_size: int,
                       spec) -> list[dict[str, int]]:
    """Per cached length: bytes of the two fp16 continuation-prefill workspace buffers
    (``tqlab.core.reservation.continuation_workspace_shapes``) and of the packed slots they are
    dequantized from (``cached_len * Hk * slot_bytes``)."""

    from tqlab.core.reservation import continuation_workspace_shapes

    spec = get_spec(spec)
    out = []
    for n in cached_lens:
        shapes = continuation_workspace_shapes(n, num_kv_heads, head_dim, block_size)
        ws = sum(math.prod(shape) * dt.itemsize for shape, dt in shapes)
        out.append({"cached_len": n, "workspace_bytes": ws, "packed_bytes": n * num_kv_heads * spec.slot_bytes(head_dim)})
    return out


def bench_summary(bench: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Tables from a recorded benchmark: ``dequant`` rows (GB/s, share of copy) and ``decode`` rows
    (per shape, batch, context: SDPA fp16 ms and, per preset, ms and speedup at the engine's S=32
    splits plus the best split count measured)."""
    deq = [{"shape": r["shape"], "cached_len": r["cached_len"], "preset": r["kind"], "ms": round(r["ms"], 4),
            "GB/s": round(r["GBps"]), "share of copy": round(r["share_of_copy"], 3)} for r in bench.get("dequant", [])]
    groups: dict = {}
    for r in bench.get("decode", []):
        key = (r["shape"], r["batch"], r["context"])
        g = groups.setdefault(key, {"shape": r["shape"], "batch": r["batch"], "context": r["context"]})
        if r["kind"] == "sdpa_fp16":
            g["sdpa_fp16 ms"] = round(r["ms"], 4)
        else:
            short = r["kind"].replace("turboquant_", "")
            if r.get("splits") == 32:
                g[f"{short} ms"] = round(r["ms"], 4)
                g[f"{short} x"] = round(r["speedup_vs_sdpa_fp16"], 3)
            best = g.get(f"{short} best x", 0.0)
            if r["speedup_vs_sdpa_fp16"] > best:
                g[f"{short} best x"] = round(r["speedup_vs_sdpa_fp16"], 3)
                g[f"{short} best S"] = r.get("splits")
    return {"dequant": deq, "decode": list(groups.values())}


def plot_decode_bench(bench: Mapping[str, Any], shape: str, batch: int, ax=None):
    """Decode time (ms, log) vs context for fp16 SDPA and each preset (S=32), one shape and batch."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    rows = [r for r in bench.get("decode", []) if r["shape"] == shape and r["batch"] == batch]
    kinds = ["sdpa_fp16"] + [k for k in TQ_PRESETS]
    for kind in kinds:
        pts = sorted((r["context"], r["ms"]) for r in rows if r["kind"] == kind and r.get("splits", 32) == 32)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=2 if kind == "sdpa_fp16" else 1,
                    color="k" if kind == "sdpa_fp16" else None, label=kind.replace("turboquant_", ""))
    return finish_loglog(ax, "context (tokens)", "ms per decode step (one layer)", f"{shape}, batch {batch}")


def vs_vllm_series(rec: Mapping[str, Any], shape: str) -> dict[str, Any]:
    """Plot data of one shape from the side-by-side recording.

    Args:
        rec: the loaded ``turboquant_vs_vllm_h200`` JSON, a dict or ``recorded.load_recorded(...)``
            (its ``rows``).
        shape: ``"llama3.1-8b"`` or ``"seed_tp8_rank"``.

    Returns:
        ``{"batch": B, "sdpa": [(ctx, ms)], "<preset>": {"tqlab": [(ctx, ms)], "tqlab_best": ...,
        "vllm": ..., "byte_limit": ...}}``, contexts ascending; ``tqlab`` is vLLM's 32 splits,
        ``tqlab_best`` the faster of that and the ``"fill"`` split policy; series with no recorded
        point are empty lists.

    Raises:
        ValueError: no row of that shape.
    """
    all_rows = rec["rows"]  # a dict or a tqlab.core.provenance.RecordedResult
    rows = [r for r in all_rows if r["shape"] == shape]
    if not rows:
        raise ValueError(f"no rows for shape {shape!r}; recorded: {sorted({r['shape'] for r in all_rows})}")
    out: dict[str, Any] = {"batch": rows[0]["batch"], "sdpa": sorted({(r["ctx"], r["sdpa_fp16_ms"]) for r in rows})}
    for preset in TQ_PRESETS:
        pr = sorted((r for r in rows if r["preset"] == preset), key=lambda r: r["ctx"])
        out[preset] = {k: [(r["ctx"], r[f"{k}_ms"]) for r in pr if f"{k}_ms" in r] for k in _SERIES}
    return out


def plot_decode_vs_vllm(rec: Mapping[str, Any], shape: str, ax=None, best: bool = False):
    """Decode ms (log) against context (log2): tqlab solid, vLLM 0.33 dashed, byte limit dotted,
    one colour per preset; fp16 SDPA (flash) black.  ``best``: tqlab's faster split policy
    instead of vLLM's 32 splits.  Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    data = vs_vllm_series(rec, shape)
    style = {"tqlab_best" if best else "tqlab": ("-", "o", "tqlab"), "vllm": ("--", "s", "vLLM 0.33"),
             "byte_limit": (":", None, "byte limit")}
    for preset, color in PRESET_COLORS.items():
        for key, (ls, mk, who) in style.items():
            pts = data[preset][key]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker=mk, color=color, ms=4,
                        label=f"{who} {preset.removeprefix('turboquant_')}")
    pts = data["sdpa"]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "k-", marker="D", lw=2, label="fp16 SDPA (flash)")
    finish_loglog(ax, "context (tokens)", "ms per decode step (one layer)",
                  f"{shape}, batch {data['batch']}: decode time, L2 flushed", legend=False)
    # One legend entry per colour (preset) and per line style (who), below the axes: never over the data.
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, lw=2, label=p.removeprefix("turboquant_")) for p, c in PRESET_COLORS.items()]
    handles += [Line2D([], [], color="#555555", ls=ls, marker=mk, ms=4, label=who) for ls, mk, who in style.values()]
    handles.append(Line2D([], [], color="k", marker="D", lw=2, label="fp16 SDPA (flash)"))
    ax.legend(handles=handles, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    return ax
