"""tqlab.core.vllm_versions: one place per vLLM version, chosen once per run."""

from __future__ import annotations

import pytest

from tqlab.core import vllm_versions as vv


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(vv.ENV, raising=False)
    vv.reset()
    yield
    vv.reset()


def test_supported_and_default():
    """The default is the newest version whose start-up rules are modelled (0.33 while 0.34's are partial)."""
    assert vv.SUPPORTED == ("0.33", "0.34") and vv.NEWEST == "0.34"
    assert not vv.VERSIONS["0.34"].startup_rules_modelled
    assert vv.DEFAULT == "0.33" and vv.current() is vv.VERSIONS["0.33"]


@pytest.mark.parametrize("text", ["0.34", "0.34.0", "v0.34", " 0.34 "])
def test_spellings(text):
    assert vv.get(text).name == "0.34"


@pytest.mark.parametrize("bad", ["0.35", "0.34.1", "0.3", "", "latest"])
def test_unsupported_names_the_value(bad):
    with pytest.raises(ValueError, match=f"unsupported vLLM version {bad!r}: tqlab models 0.33, 0.34"):
        vv.get(bad)


def test_select_env_and_reset(monkeypatch):
    monkeypatch.setenv(vv.ENV, "0.33")
    assert vv.current().name == "0.33"
    assert vv.select("0.34").name == "0.34" and vv.current().name == "0.34"
    with pytest.raises(ValueError):
        vv.select("0.20")
    assert vv.current().name == "0.34"  # a refused choice leaves the old one
    vv.reset()
    assert vv.current().name == "0.33"
    monkeypatch.setenv(vv.ENV, "9.9")
    with pytest.raises(ValueError, match=r"^\$TQLAB_VLLM_VERSION: unsupported vLLM version '9.9'"):
        vv.current()


def test_what_differs():
    v33, v34 = vv.VERSIONS["0.33"], vv.VERSIONS["0.34"]
    assert (v33.has_get_retained, v34.has_get_retained) == (False, True)
    assert v33.runners == ("v1/worker/gpu_model_runner.py", "v1/worker/gpu/model_runner.py")
    assert v34.runners == ("v1/worker/gpu/model_runner.py",) and v34.model_runner == "v1/worker/gpu/model_runner.py"
    assert (v33.jit_warmup_always, v34.jit_warmup_always) == (False, True)
    assert v33.view_alignment == v34.view_alignment == 256
    assert v34.release == "0.34.0" and v33.release == "0.33.0"
    assert (v33.startup_rules_modelled, v34.startup_rules_modelled) == (True, False)
    assert (v33.decode_graphs_in_requests, v34.decode_graphs_in_requests) == (False, True)


def test_data_files_are_named_by_version():
    v33 = vv.VERSIONS["0.33"]
    assert v33.flags_file.name == "vllm_0_33_flags.json" and v33.flags_file.is_file()
    assert v33.census_file.name == "vllm_0_33_workspace_consumers.json" and v33.census_file.is_file()
    assert v33.latent_crashes_file.is_file()
    v34 = vv.VERSIONS["0.34"]
    assert (v34.flags_file.name, v34.census_file.name, v34.architectures_file.name) == (
        "vllm_0_34_flags.json", "vllm_0_34_workspace_consumers.json", "vllm_0_34_arch_consumers.json")


def test_sparse_indexer_rows_are_one_rule_in_both_versions():
    """Issue 31's 1M-token numbers: x 40 rows is factor 5, x 16 is factor 2; both wheels resolve the factor the
    same way (``VllmConfig.__post_init__``: 5 up to 256 Ki tokens, else 2), so "5036.40 MB" needs factor 5 set."""
    from tqlab.core.consumers.sparse_indexer import indexer_profile_call, max_prefill_buffer_size
    from tqlab.core.workspace import compute_layout, format_mb

    def mb(rows: int) -> str:
        return format_mb(compute_layout(indexer_profile_call(rows, 128)).total_bytes)

    assert max_prefill_buffer_size(1_000_000) == 16_000_000  # default factor 2 above 262,144 tokens
    assert (mb(max_prefill_buffer_size(1_000_000)), mb(max_prefill_buffer_size(1_000_000, 5))) == ("2015.16", "5036.40")
    assert max_prefill_buffer_size(262_144) == 262_144 * 40 and max_prefill_buffer_size(262_145) == 262_145 * 16
