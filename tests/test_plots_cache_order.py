"""tqlab.lab.plots_cache_order: notebook 04 §6 (vLLM's slot order beside block-SoA) -- exact values."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from tqlab.lab.plots_cache_order import (
    ORDERS,
    block_byte_ranges,
    order_rows,
    order_targets,
    plot_block_orders,
    plot_order_decode,
)
from tqlab.turboquant import TQ_PRESETS, get_spec


@pytest.mark.parametrize("preset", list(TQ_PRESETS))
@pytest.mark.parametrize("order", ORDERS)
def test_drawn_ranges_are_exactly_field_addresses(preset, order):
    d, bs = 128, 16
    ranges = block_byte_ranges(preset, d, bs, order)
    spec = get_spec(preset, order)
    want = {(k, off + o * stride, off + o * stride + n) for k, (off, stride, n) in
            spec.field_addresses(d, bs).items() for o in range(bs)}
    got = set()
    for r in ranges:  # split each drawn run back into its tokens' fields
        n = (r["end"] - r["start"]) // len(r["tokens"])
        got |= {(r["kind"], r["start"] + i * n, r["start"] + (i + 1) * n) for i in range(len(r["tokens"]))}
        assert r["aligned"] == (r["start"] % 16 == 0)
    assert got == want
    assert ranges[0]["start"] == 0 and ranges[-1]["end"] == bs * spec.slot_bytes(d)
    assert all(a["end"] == b["start"] for a, b in zip(ranges, ranges[1:]))  # they tile the region


def test_3bit_ranges_exact():
    soa = block_byte_ranges("turboquant_3bit_nc", 128, 16, "block_soa")
    assert [(r["kind"], r["start"], r["end"], r["aligned"]) for r in soa] == [
        ("key_idx", 0, 768, True), ("val_idx", 768, 1536, True), ("key_norm", 1536, 1568, True),
        ("val_scale", 1568, 1600, True), ("val_zero", 1600, 1632, True)]
    vl = block_byte_ranges("turboquant_3bit_nc", 128, 16, "vllm")
    assert len(vl) == 80 and sum(r["aligned"] for r in vl) == 10
    assert [(r["kind"], r["start"], r["end"]) for r in vl[:6]] == [
        ("key_idx", 0, 48), ("key_norm", 48, 50), ("val_idx", 50, 98), ("val_scale", 98, 100),
        ("val_zero", 100, 102), ("key_idx", 102, 150)]
    with pytest.raises(ValueError, match="cache_layout"):
        block_byte_ranges("turboquant_3bit_nc", 128, 16, "aos")


def _row(shape, ctx, preset, sdpa, vllm, tq, soa, frac=0.5):
    return {"shape": shape, "batch": 2, "ctx": ctx, "preset": preset, "sdpa_fp16_ms": sdpa, "vllm_ms": vllm,
            "tqlab_best_ms": tq, "soa_best_ms": soa, "sdpa_over_soa_best": sdpa / soa, "vllm_over_soa_best": vllm / soa,
            "soa_best_frac_of_byte_limit": frac}


REC = {"targets": {"vllm_over_tqlab_min": 5.0, "sdpa_over_tqlab_min_32k_128k": 1.0,
                   "sdpa_over_tqlab_llama_3bit_128k": 2.0, "soa_frac_of_byte_limit_llama": 0.4},
       "rows": [_row("llama3.1-8b", 8192, "turboquant_3bit_nc", 1.0, 8.0, 2.0, 1.0),
                _row("llama3.1-8b", 32768, "turboquant_3bit_nc", 4.0, 16.0, 4.0, 2.0, 0.25),
                _row("llama3.1-8b", 131072, "turboquant_3bit_nc", 16.0, 40.0, 16.0, 8.0),
                _row("seed_tp8_rank", 32768, "turboquant_3bit_nc", 1.0, 4.0, 2.0, 4.0)]}


def test_order_rows_and_targets_exact():
    rows = order_rows(REC, "turboquant_3bit_nc")
    assert [(r["shape"], r["ctx"], r["vllm_order_over_soa"], r["sdpa_over_soa"]) for r in rows] == [
        ("llama3.1-8b", 8192, 2.0, 1.0), ("llama3.1-8b", 32768, 2.0, 2.0), ("llama3.1-8b", 131072, 2.0, 2.0),
        ("seed_tp8_rank", 32768, 0.5, 0.25)]
    assert order_targets(REC) == {
        "at_sdpa_32k_128k": {"target": 1.0, "met": 2, "of": 3, "worst": 0.25},
        "vllm_5x": {"target": 5.0, "met": 3, "of": 4, "worst": 1.0},
        "llama_3bit_128k_2x": {"target": 2.0, "met": 1, "of": 1, "worst": 2.0},
        # the byte-limit target: the 32K/128K Llama rows only
        "llama_byte_limit_32k_128k": {"target": 0.4, "met": 1, "of": 2, "worst": 0.25}}
    rec = {**REC, "targets": {**REC["targets"], "soa_frac_of_byte_limit_llama": 0.2}}
    assert order_targets(rec)["llama_byte_limit_32k_128k"] == {"target": 0.2, "met": 2, "of": 2, "worst": 0.25}
    assert [(r["soa_frac"], r["soa_kernel"]) for r in rows] == [(0.5, None), (0.25, None), (0.5, None), (0.5, None)]
    fill = {**REC["rows"][0], "soa_ms": 1.2, "soa_kernel": "block_soa", "soa_fill_ms": 1.0, "soa_fill_kernel": "gluon"}
    assert order_rows({"rows": [fill]}, "turboquant_3bit_nc")[0]["soa_kernel"] == "gluon"
    assert order_rows({"rows": [{**fill, "soa_fill_ms": 1.5}]}, "turboquant_3bit_nc")[0]["soa_kernel"] == "block_soa"
    with pytest.raises(ValueError, match="no rows for preset"):
        order_rows(REC, "turboquant_k8v4")
    bad = {"rows": [{k: v for k, v in REC["rows"][0].items() if k != "soa_best_ms"}]}
    with pytest.raises(ValueError, match="no block-SoA columns"):
        order_rows(bad, "turboquant_3bit_nc")


def test_figures_render():
    import matplotlib.pyplot as plt

    ax = plot_block_orders("turboquant_3bit_nc", 128, 16)
    assert len(ax.patches) == 80 + 5
    ax2 = plot_order_decode(REC, "llama3.1-8b", "turboquant_3bit_nc")
    assert [ln.get_ydata().tolist() for ln in ax2.lines] == [[1.0, 4.0, 16.0], [8.0, 16.0, 40.0], [2.0, 4.0, 16.0],
                                                            [1.0, 2.0, 8.0]]
    with pytest.raises(ValueError, match="no rows for shape"):
        plot_order_decode(REC, "other", "turboquant_3bit_nc")
    plt.close("all")
