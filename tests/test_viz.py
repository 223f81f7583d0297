"""tqlab.lab.plots_workspace and tqlab.lab.display: the data behind each figure (exact values) and that every figure draws."""

from __future__ import annotations

import logging
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from tqlab.lab import display, plots_workspace as plots
from tqlab.core.workspace import MiB, WorkspaceLockedError, WorkspaceManager, compute_layout, rewarm_workspace, ubatch_context


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


TOY = (((2, 3, 4, 6), torch.float32), ((2, 3, 5), torch.bfloat16), ((2, 3), torch.float32))


# --------------------------------------------------------------------------- formatting
@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (256, "256 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
     (2 * MiB, "2.00 MiB"), (268544, "262.25 KiB"), (3 << 30, "3.00 GiB")],
)
def test_fmt_bytes(n, text):
    assert display.fmt_bytes(n) == text


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_fmt_bytes_rejects(bad, exc):
    with pytest.raises(exc):
        display.fmt_bytes(bad)


def test_markdown_table_exact_and_escaped():
    assert display.markdown_table(("a", "b"), [(1, "x|y"), ("two\nlines", 2.5)]) == (
        "| a | b |\n|---|---|\n| 1 | x\\|y |\n| two lines | 2.5 |"
    )


def test_markdown_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        display.markdown_table(("a", "b"), [(1,)])


def test_show_md_and_show_error_print_outside_notebooks(capsys):
    display.show_md("**hi**")
    display.show_error(ValueError("boom"), "title")
    out = capsys.readouterr().out
    assert "**hi**" in out and "title\nValueError: boom" in out


# --------------------------------------------------------------------------- byte map
def test_layout_segments_exact():
    lay = compute_layout(TOY)
    segs = plots.layout_segments(lay, ["mid_out", "output", "lse"], buffer_bytes=2048)
    assert [(s.kind, s.label, s.start, s.end) for s in segs] == [
        ("view", "mid_out", 0, 576),
        ("pad", "pad after mid_out", 576, 768),
        ("view", "output", 768, 828),
        ("pad", "pad after output", 828, 1024),
        ("view", "lse", 1024, 1048),
        ("pad", "pad after lse", 1048, 1280),
        ("free", "unused", 1280, 2048),
    ]
    # the segments tile the buffer exactly
    assert all(a.end == b.start for a, b in zip(segs, segs[1:]))


def test_layout_segments_aligned_view_has_no_pad_and_empty_view_no_segment():
    lay = compute_layout((((64,), torch.float32), ((0, 5), torch.float16), ((3,), torch.uint8)))
    segs = plots.layout_segments(lay)
    assert [(s.kind, s.start, s.end) for s in segs] == [("view", 0, 256), ("view", 256, 259), ("pad", 259, 512)]


def test_layout_segments_bad_input():
    lay = compute_layout(TOY)
    with pytest.raises(ValueError, match="2 labels for 3 views"):
        plots.layout_segments(lay, ["a", "b"])
    with pytest.raises(ValueError, match="buffer_bytes"):
        plots.layout_segments(lay, buffer_bytes=-1)


@pytest.mark.parametrize("schematic", [False, True])
def test_plot_layout_and_byte_maps_draw(schematic):
    lay = compute_layout(TOY)
    ax = plots.plot_layout(lay, ["mid_out", "output", "lse"], schematic=schematic, buffer_bytes=4096)
    assert ax.get_xlim()[1] >= 4096
    texts = [t.get_text() for t in ax.texts]
    assert "768" in texts and "1,024" in texts  # offsets are labelled
    two = plots.plot_byte_maps(
        [("a", lay, None), ("b", compute_layout((((10,), torch.uint8),)), ["x"])], schematic=schematic
    )
    assert [t.get_text() for t in two.get_yticklabels()] == ["b", "a"]


def test_plot_byte_maps_needs_rows():
    with pytest.raises(ValueError):
        plots.plot_byte_maps([])


# --------------------------------------------------------------------------- timeline
def _lifecycle():
    m = WorkspaceManager("meta", 2)
    marks = []
    marks.append(("init", len(m.events)))
    m.get_simultaneous(((1000,), torch.uint8))
    with ubatch_context(1):
        m.get_simultaneous(((300,), torch.uint8))
    m.get_simultaneous(((5000,), torch.uint8))
    marks.append(("warm-up", len(m.events)))
    m.lock()
    marks.append(("lock", len(m.events)))
    try:
        m.get_simultaneous(((9000,), torch.uint8))
    except WorkspaceLockedError:
        pass
    marks.append(("serve", len(m.events)))
    with rewarm_workspace(m):
        m.get_simultaneous(((9000,), torch.uint8))
    marks.append(("re-warm", len(m.events)))
    return m, marks


def test_slot_sizes_after_events_exact():
    m, _ = _lifecycle()
    assert [e.kind for e in m.events] == ["resize", "resize", "resize", "lock", "violation", "unlock", "resize", "lock"]
    assert plots.slot_sizes_after_events(m.events, 2) == [
        (1024, 0), (1024, 512), (5120, 512), (5120, 512), (5120, 512), (5120, 512), (9216, 512), (9216, 512),
    ]
    with pytest.raises(ValueError, match="slot 1"):
        plots.slot_sizes_after_events(m.events, 1)


def test_timeline_points_exact():
    m, marks = _lifecycle()
    points, spans = plots.timeline_points(m.events, marks)
    assert spans == [("init", 0.0, 1.0), ("warm-up", 1.0, 4.0), ("lock", 4.0, 5.0), ("serve", 5.0, 6.0),
                     ("re-warm", 6.0, 9.0)]
    assert [p[0] for p in points] == [float(i) for i in range(10)]
    assert points[1] == (1.0, (0, 0), None)  # the event-less init phase still gets a step
    assert points[-1][1] == (9216, 512) and points[-1][2].kind == "lock"


def test_timeline_points_without_phases_and_with_tail():
    m, marks = _lifecycle()
    points, spans = plots.timeline_points(m.events)
    assert spans == [] and len(points) == len(m.events) + 1
    points, spans = plots.timeline_points(m.events, marks[:2])
    assert [s[0] for s in spans] == ["init", "warm-up"] and len(points) == len(m.events) + 2


def test_timeline_points_rejects_bad_marks():
    m, _ = _lifecycle()
    with pytest.raises(ValueError, match="outside"):
        plots.timeline_points(m.events, [("a", 3), ("b", 2)])
    with pytest.raises(ValueError, match="outside"):
        plots.timeline_points(m.events, [("a", 99)])


def test_plot_workspace_timeline_draws_phases_and_violation():
    m, marks = _lifecycle()
    ax = plots.plot_workspace_timeline(m.events, marks, title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["init", "warm-up", "lock", "serve", "re-warm"]
    assert ax.get_ylabel() == "workspace size (KiB)"
    assert any("violation" in t.get_text() for t in ax.texts)
    ax2 = plots.plot_workspace_timeline(m.events, unit="B")
    assert ax2.get_ylabel() == "workspace size (B)"
    with pytest.raises(ValueError, match="unit"):
        plots.plot_workspace_timeline(m.events, unit="MB")


# --------------------------------------------------------------------------- phases
class _Rec:
    def __init__(self, name, sizes, seconds=0.5, note="n"):
        self.name, self.workspace_bytes, self.seconds, self.note = name, sizes, seconds, note


def test_phase_marker_records_event_counts(capsys):
    from tqlab.core.workspace import init_workspace_manager, reset_workspace_manager

    marker = plots.PhaseMarker(echo=True)
    reset_workspace_manager()
    try:
        marker(_Rec("before_init", (0,)))
        m = init_workspace_manager("meta")
        m.get_simultaneous(((MiB,), torch.uint8))
        marker(_Rec("warm", (MiB,)))
        m.lock()
        marker.mark("serve", m)
    finally:
        reset_workspace_manager()
    assert marker.marks == [("before_init", 0), ("warm", 1), ("serve", 2)]
    assert "warm            workspace [1.00] MiB   n" in capsys.readouterr().out


def test_phases_markdown_exact():
    md = plots.phases_markdown([_Rec("capture", (268544,), 1.234, "decode buckets"), _Rec("lock", (268544, 0))])
    assert md.splitlines()[2] == "| capture | 0.26 | 268,544 | 1.23 | decode buckets |"
    assert md.splitlines()[3] == "| lock | 0.26 / 0.00 | 268,544 | 0.50 | n |"


def test_plot_phases_and_bars_draw():
    ax = plots.plot_phases([_Rec("a", (0,)), _Rec("b", (MiB // 4,))], need_bytes=2 * MiB, need_label="8K prompt")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    assert any("8K prompt: 2.00 MiB" == t.get_text() for t in ax.texts)
    ax = plots.plot_bars(["x", "y"], [1.0, 3.0], fmt="{:.1f}", hline=2.0, hline_label="h")
    assert [t.get_text() for t in ax.texts] == ["1.0", "3.0"]
    ax = plots.plot_bars(["x", "y"], [1.0, 30.0], horizontal=True, log=True)
    assert ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="2 labels but 1 values"):
        plots.plot_bars(["x", "y"], [1.0])


def test_plot_need_curve_draws_levels_and_points():
    ax = plots.plot_need_curve([0, 16, 32], [0, MiB, 2 * MiB], levels=[("locked", MiB // 4)], points=[("8K", 16, MiB)])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["workspace the request needs", "locked: 0.25 MiB"]
    assert [t.get_text() for t in ax.texts] == ["8K\n1.00 MiB"]
    with pytest.raises(ValueError, match="as many values"):
        plots.plot_need_curve([0, 1], [0])
    with pytest.raises(ValueError, match="at least one"):
        plots.plot_need_curve([], [])


# --------------------------------------------------------------------------- debug log
def test_debug_workspace_log_collects_and_restores(monkeypatch, capsys):
    monkeypatch.delenv("TQLAB_DEBUG_WORKSPACE", raising=False)
    log = logging.getLogger("tqlab.core.workspace")
    handlers_before, prop_before = list(log.handlers), log.propagate
    m = WorkspaceManager("meta")
    with display.debug_workspace_log() as lines:
        assert os.environ["TQLAB_DEBUG_WORKSPACE"] == "1"
        m.get_simultaneous(((2 * MiB,), torch.uint8))
        m.lock()
    assert os.environ.get("TQLAB_DEBUG_WORKSPACE") is None
    assert log.handlers == handlers_before and log.propagate == prop_before
    assert len(lines) == 2
    assert lines[0].startswith("[WORKSPACE DEBUG] Resized workspace from ") and "0.00 MB -> 2.00 MB" in lines[0]
    assert lines[1] == "[WORKSPACE DEBUG] Workspace locked. Current sizes: [2.00]"
    assert lines[1] in capsys.readouterr().out
    m.unlock()  # after the block: not collected
    assert len(lines) == 2


def test_debug_workspace_log_restores_after_error(monkeypatch):
    monkeypatch.setenv("TQLAB_DEBUG_WORKSPACE", "0")
    with pytest.raises(RuntimeError):
        with display.debug_workspace_log(echo=False):
            raise RuntimeError("x")
    assert os.environ["TQLAB_DEBUG_WORKSPACE"] == "0"


# --------------------------------------------------------------------------- one table rule, one unit rule
def test_byte_unit_is_the_rule_of_fmt_bytes():
    assert display.byte_unit(0) == ("B", 1)
    assert display.byte_unit(1023) == ("B", 1)
    assert display.byte_unit(1536) == ("KiB", 1024)
    assert display.byte_unit(64 * MiB) == ("MiB", MiB)
    assert display.fmt_bytes(262144) == "256.00 KiB"  # the report's "0.26 MB" (decimal MB) is 256 KiB


def test_text_table_exact():
    assert display.text_table(("a", "bb"), [(1, None), (2.5, 14950.0)]) == (
        "  a      bb\n---  ------\n  1       -\n2.5  14,950"
    )
    assert display.text_table(["addr"], [{"addr": 255}], hex_cols=["addr"]) == "addr\n----\n0xff"


def test_markdown_table_of_mappings_takes_the_union_of_keys():
    assert display.markdown_table(None, [{"a": 1}, {"b": 2}]) == "| a | b |\n|---|---|\n| 1 | - |\n| - | 2 |"
    with pytest.raises(ValueError, match="mappings"):
        display.markdown_table(None, [(1, 2)])


def test_progress_is_a_text_line_without_a_live_frontend(capsys, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert display.live_frontend() is False
    assert list(display.progress(range(3), desc="sweep")) == [0, 1, 2]
    out = capsys.readouterr().out
    assert "sweep" in out and "3/3" in out


def test_live_frontend_needs_a_server_kernel(monkeypatch):
    monkeypatch.setattr(display, "in_notebook", lambda: True)
    monkeypatch.setenv("JPY_SESSION_NAME", "/notebooks/08.ipynb")
    monkeypatch.delenv("TQLAB_HEADLESS", raising=False)
    assert display.live_frontend() is True
    monkeypatch.setenv("TQLAB_HEADLESS", "1")
    assert display.live_frontend() is False
    monkeypatch.delenv("TQLAB_HEADLESS")
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert display.live_frontend() is False  # nbclient / nbmake: a kernel, but no one watching


# --------------------------------------------------------------------------- timeline scale
def test_timeline_uses_a_log_axis_when_sizes_span_orders_of_magnitude():
    m = WorkspaceManager("meta", 1)
    m.get_simultaneous(((268544,), torch.uint8))  # the report's 0.26 MB lock
    m.lock()
    with pytest.raises(WorkspaceLockedError):
        m.get_simultaneous(((64 * MiB,), torch.uint8))
    assert plots.plot_workspace_timeline(m.events).get_yscale() == "symlog"  # auto: 64 MiB / 0.26 MiB > 20
    assert plots.plot_workspace_timeline(m.events, yscale="linear").get_yscale() == "linear"
    small, _ = _lifecycle()  # 0.5 .. 9 KiB: under 20x, stays linear
    assert plots.plot_workspace_timeline(small.events).get_yscale() == "linear"
    assert plots.plot_workspace_timeline(small.events, yscale="log").get_yscale() == "symlog"
    with pytest.raises(ValueError, match="yscale"):
        plots.plot_workspace_timeline(m.events, yscale="broken")
