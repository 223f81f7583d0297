"""tqlab.lab.version_diff: censuses, architecture tables and vLLM's source compared release by release."""

import json

import pytest

from tqlab.core import vllm_versions
from tqlab.lab.version_diff import arch_diff, cuda_sites, manager_methods, site_diff, source_facts


def _census(*sites):
    return {"call_sites": [{"path": p, "function": f, "platform": pl} for p, f, pl in sites]}


def test_site_diff_counts_cuda_sites_only():
    old = _census(("a.py", "f", "cuda"), ("b.py", "g", "cuda"), ("r.py", "h", "rocm"))
    new = _census(("b.py", "g", "cuda"), ("c.py", "k", "cuda"), ("r.py", "z", "rocm"))
    assert cuda_sites(old) == {"a.py:f", "b.py:g"}
    assert site_diff(old, new) == {"added": ["c.py:k"], "removed": ["a.py:f"], "kept": ["b.py:g"]}


def test_recorded_censuses_match_the_versions_added_and_removed_consumers():
    old, new = (json.loads(vllm_versions.get(v).census_file.read_text()) for v in ("0.33", "0.34"))
    d = site_diff(old, new)
    assert d["added"] == sorted(vllm_versions.get("0.34").added_consumers)
    assert d["removed"] == sorted(vllm_versions.get("0.34").removed_consumers)


def test_arch_diff():
    def row(*consumers):
        return {"call_sites": [{"consumer": c} for c in consumers]}

    old = {"architectures": {"A": row("x"), "B": row("x", "y"), "Gone": row()}}
    new = {"architectures": {"A": row("x"), "B": row("x", "z"), "New": row("z")}}
    assert arch_diff(old, new) == {"added": ["New"], "removed": ["Gone"], "counts": (3, 3),
                                   "changed": {"B": {"gained": ["z"], "lost": ["y"]}}}


def test_manager_methods_and_source_facts(tmp_path):
    text = "class WorkspaceManager:\n    def lock(self): ...\n    def _grow(self): ...\n    def get_retained(self): ...\n"
    assert manager_methods(text) == ["lock", "get_retained"]
    with pytest.raises(ValueError, match="no class WorkspaceManager"):
        manager_methods("x = 1\n")
    with pytest.raises(FileNotFoundError, match="not a vLLM package folder"):
        source_facts(tmp_path)
    (tmp_path / "v1" / "worker" / "gpu").mkdir(parents=True)
    (tmp_path / "v1" / "worker" / "workspace.py").write_text(text + "_VIEW_ALIGNMENT = 256\n")
    (tmp_path / "v1" / "worker" / "gpu" / "model_runner.py").write_text("")
    (tmp_path / "envs.py").write_text("VLLM_HOST_IP = 1\n")
    assert source_facts(tmp_path) == {"runners": ["v1/worker/gpu/model_runner.py"], "v2_runner_flag": False,
                                      "manager_methods": ["lock", "get_retained"], "workspace_lines": 5,
                                      "view_alignment_named": True}


def test_plot_sites_by_phase_orders_phases_by_start_up():
    import matplotlib

    matplotlib.use("Agg")
    from tqlab.lab.version_diff import plot_sites_by_phase

    ax = plot_sites_by_phase({"a": {"capture": 3, "init": 2, "odd": 1}, "b": {"init": 5}})
    assert [t.get_text() for t in ax.get_yticklabels()] == ["init", "capture", "odd"]
    assert sorted(int(b.get_width()) for b in ax.patches) == [0, 0, 1, 2, 3, 5]
    with pytest.raises(ValueError, match="at least one census"):
        plot_sites_by_phase({})
