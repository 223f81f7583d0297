"""Issue 19's latent-crash candidates, confirmed or refuted with the installed vLLM's own classes (parity/latent_crashes.py).

The verdicts here are the ones recorded per version in data/vllm_<x>_<y>_latent_crashes.json
(``python parity/latent_crashes.py`` in that version's parity venv). vLLM 0.34 (parity/README.md, "vLLM 0.34"):
candidates 1, 3 and 4 are still there; candidate 2 needed the V1 runner, which is gone, and V2's JIT warm-up
(on by default) sizes the DCP scratch before the lock.
"""

from __future__ import annotations

import json

import pytest
import vllm

import latent_crashes as lc
from tqlab.core import vllm_versions

VERSION = vllm_versions.get(".".join(vllm.__version__.split(".")[:2]))
RECORDED = VERSION.latent_crashes_file
EXPECTED = {"0.33": {1: "confirmed", 2: "confirmed", 3: "confirmed", 4: "confirmed"},
            "0.34": {1: "confirmed", 2: "refuted", 3: "confirmed", 4: "confirmed"}}[VERSION.name]


@pytest.mark.parametrize("check", lc.CHECKS, ids=lambda c: c.__name__)
def test_latent_crash_verdict(check, record):
    result = check()
    record(f"latent_crash_{result['candidate']}", {"verdict": result["verdict"]})
    assert result["verdict"] == EXPECTED[result["candidate"]], json.dumps(result["evidence"], default=str)[:2000]
    recorded = {r["candidate"]: r["verdict"] for r in json.loads(RECORDED.read_text())["checks"]}
    assert recorded[result["candidate"]] == result["verdict"]


@pytest.mark.skipif(not VERSION.runners[0].endswith("gpu_model_runner.py"), reason="the V1 runner's PIECEWISE path")
def test_dcp_crash_names_vllms_call_site():
    ev = lc.check_flash_attn_dcp_piecewise()["evidence"]
    assert "flash_attn.py" in ev["first_dcp_decode_after_lock"] and "_forward_with_dcp" in ev["first_dcp_decode_after_lock"]
    assert "current size is 0.00 MB" in ev["first_dcp_decode_after_lock"]
    assert ev["dcp_dummy_context_len"]["FULL uniform-decode capture"] == 2  # FULL capture does reach it


@pytest.mark.skipif(VERSION.runners[0].endswith("gpu_model_runner.py"), reason="vLLM 0.34 on: V2 only")
def test_dcp_scratch_is_sized_by_the_jit_warmup_decode():
    ev = lc.check_flash_attn_dcp_piecewise()["evidence"]
    assert ev["enable_jit_warmup_default"] is True and ev["warmup_kernels_before_capture_model"] is True
    assert ev["slot_bytes_at_lock"] > 0 and ev["first_dcp_decode_after_lock"] is None
