"""tqlab.lab.recorded (on tqlab.core.provenance): recorded results with provenance, the banner, device helpers."""

from __future__ import annotations

import json

import pytest

from tqlab.lab import recorded

PROV = {
    "device": "NVIDIA H200",
    "date": "2026-11-29T07:30:00+00:00",
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "command": "python benchmarks/bench_growth.py --device cuda",
    "torch": "2.11.0+cu130",
}


def _write(tmp_path, name, obj):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(obj), encoding="utf-8")
    return p


# --------------------------------------------------------------------------- provenance
def test_validate_provenance_accepts_complete_and_stringifies():
    out = recorded.validate_provenance({**PROV, "extra": 3})
    assert out["device"] == "NVIDIA H200"
    assert out["extra"] == "3"


def test_validate_provenance_names_every_missing_and_empty_key():
    bad = dict(PROV)
    del bad["commit"], bad["torch"]
    bad["date"] = "  "
    with pytest.raises(ValueError) as e:
        recorded.validate_provenance(bad)
    msg = str(e.value)
    assert "missing commit, torch" in msg and "empty date" in msg


def test_validate_provenance_rejects_non_mapping():
    with pytest.raises(TypeError, match="mapping"):
        recorded.validate_provenance(["device", "date"])


def test_make_provenance_has_every_key(tmp_path):
    import torch

    p = recorded.make_provenance("python -m tqlab repro", device="test-device", commit="abc")
    assert set(recorded.PROVENANCE_KEYS) <= set(p)
    assert p["device"] == "test-device" and p["commit"] == "abc" and p["torch"] == torch.__version__
    assert p["command"] == "python -m tqlab repro"
    recorded.validate_provenance(p)


def test_make_provenance_rejects_empty_command():
    with pytest.raises(ValueError, match="command"):
        recorded.make_provenance("  ")


# --------------------------------------------------------------------------- files
def test_save_then_load_round_trip(tmp_path):
    path = recorded.save_recorded("growth", {"peak_bytes": {"a": 1}}, PROV, data_dir=tmp_path)
    assert path == tmp_path / "growth.json"
    rec = recorded.load_recorded("growth", data_dir=tmp_path)
    assert rec.name == "growth"
    assert rec.provenance == PROV
    assert rec["peak_bytes"] == {"a": 1}
    assert recorded.list_recorded(tmp_path) == ["growth"]
    assert recorded.has_recorded("growth", tmp_path) and not recorded.has_recorded("other", tmp_path)


def test_load_accepts_name_with_json_suffix(tmp_path):
    _write(tmp_path, "x", {"provenance": PROV, "v": 1})
    assert recorded.load_recorded("x.json", data_dir=tmp_path)["v"] == 1


def test_save_refuses_bad_input_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="missing"):
        recorded.save_recorded("r", {"v": 1}, {"device": "x"}, data_dir=tmp_path)
    with pytest.raises(ValueError, match="provenance"):
        recorded.save_recorded("r", {"provenance": {}}, PROV, data_dir=tmp_path)
    with pytest.raises(TypeError, match="mapping"):
        recorded.save_recorded("r", [1, 2], PROV, data_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_load_missing_file_lists_what_exists(tmp_path):
    _write(tmp_path, "present", {"provenance": PROV})
    with pytest.raises(FileNotFoundError, match="present"):
        recorded.load_recorded("absent", data_dir=tmp_path)


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"v": 1}', "no 'provenance'"),
        ('{"provenance": {"device": "x"}}', "missing date, commit, command, torch"),
    ],
)
def test_load_rejects_bad_files(tmp_path, content, match):
    (tmp_path / "bad.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        recorded.load_recorded("bad", data_dir=tmp_path)


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", 3])
def test_bad_names_are_refused(name, tmp_path):
    with pytest.raises(ValueError, match="name"):
        recorded.recorded_path(name, tmp_path)


def test_list_recorded_ignores_presets_folder():
    # data/presets/*.json are configs, not recordings
    assert not any(n in recorded.list_recorded() for n in ("nemotron-3-super-120b-a12b", "pr-44053-unit-test"))


def test_list_recorded_of_missing_dir_is_empty(tmp_path):
    assert recorded.list_recorded(tmp_path / "nope") == []


def test_every_recording_in_data_has_provenance():
    for name in recorded.list_recorded():
        recorded.load_recorded(name)  # raises if a recording lacks its provenance


# --------------------------------------------------------------------------- banner
def test_banner_text_exact_without_cuda():
    text = recorded.banner_text(PROV, cuda_here=False)
    first, second = text.split("\n")
    assert first == "Recorded on NVIDIA H200, 2026-11-29T07:30:00+00:00, commit 0123456789ab — no CUDA here"
    assert second == "command: python benchmarks/bench_growth.py --device cuda (torch 2.11.0+cu130)"


def test_banner_text_with_cuda_and_short_commit():
    text = recorded.banner_text({**PROV, "commit": "unknown"}, cuda_here=True)
    assert text.startswith("Recorded on NVIDIA H200, 2026-11-29T07:30:00+00:00, commit unknown — CUDA is available")


def test_show_banner_prints_outside_notebooks(capsys):
    text = recorded.show_banner(PROV, cuda_here=False)
    out = capsys.readouterr().out
    assert "Recorded on NVIDIA H200" in out and "no CUDA here" in out
    assert text.split("\n")[0] in out


def test_show_banner_refuses_incomplete_provenance(capsys):
    with pytest.raises(ValueError, match="missing"):
        recorded.show_banner({"device": "x"})
    assert capsys.readouterr().out == ""


def test_show_banner_html_in_a_kernel(monkeypatch):
    shown = []
    monkeypatch.setattr(recorded, "in_notebook", lambda: True)
    import IPython.display as disp

    monkeypatch.setattr(disp, "display", lambda obj: shown.append(obj))
    recorded.show_banner({**PROV, "device": "<b>GPU</b>"}, cuda_here=False)
    (obj,) = shown
    assert "Recorded on &lt;b&gt;GPU&lt;/b&gt;" in obj.data  # escaped
    assert "no CUDA here" in obj.data


# --------------------------------------------------------------------------- devices
def test_has_cuda_matches_torch():
    import torch

    assert recorded.has_cuda() == torch.cuda.is_available()


def test_has_cuda_never_raises(monkeypatch):
    import torch

    def boom():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    assert recorded.has_cuda() is False


@pytest.mark.parametrize("dev", ["cpu", "meta", "CPU "])
def test_pick_device_passes_cpu_and_meta(dev):
    assert recorded.pick_device(dev) == dev.strip().lower()


def test_pick_device_falls_back_loudly(monkeypatch, capsys):
    monkeypatch.setattr(recorded, "has_cuda", lambda: False)
    assert recorded.pick_device("cuda") == "cpu"
    assert "running on 'cpu' instead" in capsys.readouterr().out
    monkeypatch.setattr(recorded, "has_cuda", lambda: True)
    assert recorded.pick_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("dev, exc", [("tpu", ValueError), (3, TypeError)])
def test_pick_device_rejects_unknown(dev, exc):
    with pytest.raises(exc):
        recorded.pick_device(dev)


# --------------------------------------------------------------------------- one call per notebook cell
def test_show_recorded_shows_the_banner_or_says_there_is_none(tmp_path, capsys):
    assert recorded.show_recorded("absent", data_dir=tmp_path) is None
    assert "No recording `data/absent.json` yet (recordings available: none)" in capsys.readouterr().out
    recorded.save_recorded("growth", {"peak": 3}, PROV, data_dir=tmp_path)
    rec = recorded.show_recorded("growth", data_dir=tmp_path, cuda_here=False)
    assert rec["peak"] == 3 and rec.provenance["device"] == "NVIDIA H200"
    assert "Recorded on NVIDIA H200" in capsys.readouterr().out


def test_record_run_writes_fresh_provenance(tmp_path, capsys):
    path = recorded.record_run("run", {"x": 1}, "python bench.py", data_dir=tmp_path)
    assert path == tmp_path / "run.json" and f"recorded to {path}" in capsys.readouterr().out
    rec = recorded.load_recorded("run", data_dir=tmp_path)
    assert rec["x"] == 1 and rec.provenance["command"] == "python bench.py"


def test_parity_banner_is_the_one_banner_with_vllm_words(capsys):
    text = recorded.show_parity_banner({**PROV, "vllm": "0.33.0"})
    assert text.split("\n")[0] == (
        "Recorded parity results: vLLM 0.33.0 on NVIDIA H200, 2026-11-29T07:30:00+00:00, commit 0123456789ab "
        "— vLLM is not importable here"
    )
    assert text.split("\n")[0] in capsys.readouterr().out
    with pytest.raises(ValueError, match="missing"):
        recorded.show_parity_banner({"device": "cpu"})


def test_provenance_is_the_core_of_lab_recorded():
    from tqlab.core import provenance

    assert recorded.load_recorded is provenance.load_recorded
    assert provenance.git_commit("/") == "unknown"  # outside git: never raises


def test_readme_names_every_recording_not_made_on_the_h200():
    """Issue 21: the README said every data/*.json came from an H200; the list of the others must stay true."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    para = readme[readme.index("each file's `provenance.device` says where it"):]
    para = para[: para.index("To record them again")]
    named = set(re.findall(r"`([\w.]+\.json)`", para))
    not_h200 = {p.name for p in (root / "data").glob("*.json")
                if "H200" not in json.loads(p.read_text(encoding="utf-8"))["provenance"]["device"]}
    assert named == not_h200
