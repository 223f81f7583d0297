"""tqlab.lab.plots_parity: notebook 07's vLLM-vs-tqlab picture (data exact, figure renders)."""

from __future__ import annotations

import pytest

from tqlab.core.workspace import MiB
from tqlab.lab.plots_parity import parity_points, plot_parity_side_by_side


def _side(lock: int, cont: int) -> dict:
    return {"size_at_lock": [lock], "trace": {"callers": [
        {"caller": "turboquant_attn.py:942:_continuation_prefill", "high_water_bytes": cont},
        {"caller": "turboquant_attn.py:1122:_decode_attention", "high_water_bytes": lock}]}}


SEED = [{"fixed": False, "vllm": _side(268544, 2 * MiB), "tqlab": _side(268544, 2 * MiB)},
        {"fixed": True, "vllm": _side(64 * MiB, 2 * MiB), "tqlab": _side(64 * MiB, 2 * MiB)}]


def test_parity_points_pairs_every_value():
    pts = parity_points({"a": (16 * MiB, 16 * MiB), "b": (1, 2)}, SEED)
    assert pts == [
        ("reservation per preset (PR #44053)", "a", 16 * MiB, 16 * MiB),
        ("reservation per preset (PR #44053)", "b", 1, 2),
        ("the bug report's scenario", "size at lock, no fix", 268544, 268544),
        ("the bug report's scenario", "_continuation_prefill asks", 2 * MiB, 2 * MiB),
        ("the bug report's scenario", "size at lock, with the fix", 64 * MiB, 64 * MiB),
    ]
    with pytest.raises(ValueError, match="one unfixed and one fixed"):
        parity_points({}, SEED[:1])


def test_plot_has_one_panel_per_group_and_names_a_mismatch():
    fig = plot_parity_side_by_side(parity_points({"a": (MiB, 2 * MiB)}, SEED), title="t")
    top, bottom = fig.axes
    assert top.get_title(loc="left").startswith("reservation") and bottom.get_xscale() == "log"
    texts = [t.get_text() for t in top.texts]
    assert texts == ["vLLM 1.00 ≠ tqlab 2.00 MiB"]
    assert [t.get_text() for t in bottom.texts] == ["both 0.26 MiB", "both 2.00 MiB", "both 64.00 MiB"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_preset_that_reserves_nothing_is_drawn_and_labelled_without_a_warning():
    import warnings

    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a non-positive limit on the log axis used to warn and leave the row empty
        fig = plot_parity_side_by_side(parity_points({"a": (MiB, MiB), "mla": (0, 0)}, SEED))
    top = fig.axes[0]
    assert [t.get_text() for t in top.texts] == ["both 1.00 MiB", "both 0 B (nothing reserved)"]
    lo, _ = top.get_xlim()
    assert 0 < lo < min(x for line in top.lines for x in line.get_xdata())  # every marker inside the axis
    plt.close(fig)


def test_notebook_04_figures_label_every_axis_and_keep_legends_off_the_data():
    """Issue 21: 04's key journey had panels 1 and 4 without a y label; legends covered data there and in the
    tqlab-vs-vLLM decode chart."""
    import matplotlib.pyplot as plt
    import torch

    from tqlab.core.provenance import load_recorded
    from tqlab.lab import plots_turboquant as figures
    from tqlab.turboquant import get_spec, key_journey

    spec = get_spec("turboquant_3bit_nc")
    figures.plot_key_journey(key_journey(torch.randn(128, generator=torch.Generator().manual_seed(4)), spec), spec)
    axes = plt.gcf().axes
    assert [a.get_ylabel() for a in axes] == ["k[i]", "(H u)[i]", "", "k[i] and k_hat[i]"]
    for a in (axes[1], axes[3]):  # headroom above the data for the legend
        ys = [float(max(line.get_ydata())) for line in a.get_lines()] + [float(c.get_offsets()[:, 1].max())
                                                                            for c in a.collections]
        data_top = max(ys)
        assert a.get_ylim()[1] > data_top * 1.2
    plt.close("all")
    ax = figures.plot_decode_vs_vllm(load_recorded("turboquant_vs_vllm_h200"), "llama3.1-8b")
    leg = ax.get_legend()
    assert [t.get_text() for t in leg.get_texts()] == [
        "k8v4", "4bit_nc", "k3v4_nc", "3bit_nc", "tqlab", "vLLM 0.33", "byte limit", "fp16 SDPA (flash)"]
    assert leg.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).y0 < 0  # below the axes
    plt.close("all")
