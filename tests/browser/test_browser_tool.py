"""tools/browser_test.py without a browser: the throw-away Jupyter root, its settings and the server helpers."""

from __future__ import annotations

import json
import os
import socket

from tools import browser_test as bt


def test_root_holds_copies_of_the_notebooks_and_links_to_the_rest(tmp_path):
    notebooks = bt.find_notebooks(None)
    root = bt.make_root(tmp_path, notebooks)
    copies = sorted(p.name for p in (root / "notebooks").iterdir())
    assert copies == [p.name for p in notebooks]
    for p in (root / "notebooks").iterdir():
        assert not p.is_symlink()  # the browser can never write into the repository's notebooks
    assert (root / "data").is_symlink() and (root / "data").resolve() == bt.REPO_ROOT / "data"
    for skipped in (".git", ".venv", "build"):
        assert not (root / skipped).exists()


def test_find_notebooks_filters_like_make_run():
    all_nbs = bt.find_notebooks(None)
    assert all(p.suffix == ".ipynb" for p in all_nbs)
    only = bt.find_notebooks("08")
    assert [p.name for p in only] == ["08_interactive_explorers.ipynb"]
    assert bt.find_notebooks("no-such-notebook") == []


def test_jupyter_env_is_private_and_turns_autosave_off(tmp_path):
    env = bt.jupyter_env(tmp_path)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        assert env[var].startswith(str(tmp_path))
    doc = tmp_path / "lab-settings" / "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings"
    assert json.loads(doc.read_text()) == {"autosave": False}
    assert env["JUPYTER_PATH"].split(os.pathsep)[0].endswith(os.path.join("share", "jupyter"))


def test_free_port_is_bindable_on_loopback():
    port = bt.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_missing_chromium_is_a_setup_failure(capsys):
    assert bt.main(["--chromium", "/nonexistent/chromium", "--only", "08"]) == 2
    assert "apt-get install -y chromium" in capsys.readouterr().err


def test_chromium_flags_keep_the_browser_offline_and_headless():
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"):
        assert flag in bt.CHROMIUM_ARGS
