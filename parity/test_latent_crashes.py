"""Issue 19's latent-crash candidates, confirmed or refuted with vLLM 0.33's own classes (parity/latent_crashes.py).

The verdicts here are the ones recorded in data/vllm_0_33_latent_crashes.json (``python parity/latent_crashes.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import latent_crashes as lc

RECORDED = Path(__file__).resolve().parent.parent / "data" / "vllm_0_33_latent_crashes.json"


@pytest.mark.parametrize("check", lc.CHECKS, ids=lambda c: c.__name__)
def test_latent_crash_verdict(check, record):
    result = check()
    record(f"latent_crash_{result['candidate']}", {"verdict": result["verdict"]})
    assert result["verdict"] == "confirmed", json.dumps(result["evidence"], default=str)[:2000]
    recorded = {r["candidate"]: r["verdict"] for r in json.loads(RECORDED.read_text())["checks"]}
    assert recorded[result["candidate"]] == result["verdict"]


def test_dcp_crash_names_vllms_call_site():
    ev = lc.check_flash_attn_dcp_piecewise()["evidence"]
    assert "flash_attn.py" in ev["first_dcp_decode_after_lock"] and "_forward_with_dcp" in ev["first_dcp_decode_after_lock"]
    assert "current size is 0.00 MB" in ev["first_dcp_decode_after_lock"]
    assert ev["dcp_dummy_context_len"]["FULL uniform-decode capture"] == 2  # FULL capture does reach it
