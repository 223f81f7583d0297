"""A real vLLM backend tqlab does not model is never a silent ``ok`` (issue 30: "Three answers, not two").

``--attention-backend`` names a member of vLLM 0.33's ``AttentionBackendEnum`` (``vllm/v1/attention/backends/
registry.py``) that tqlab's selector model (``tqlab.core.consumers.backends.BACKENDS``) does not hold: ROCm, CPU,
DeepSeek-V4's, B12X. tqlab replays neither vLLM's validation of it nor its workspace requests, so the registry's
unmodelled list names it (``unmodelled_backend``) and the verdict is ``partial`` (exit 4), not ``ok`` (exit 0).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.consumers.registry import unmodelled
from tqlab.predict import analysis
from tqlab.vllm.deployment import deployment_from_vllm

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("backend", ["ROCM_ATTN", "CPU_ATTN", "FLASHMLA_SPARSE_DSV4", "ROCM_AITER_FA"])
def test_an_unmodelled_vllm_backend_makes_the_answer_partial(backend):
    cfg = deployment_from_vllm(f"vllm serve M --attention-backend {backend}", LLAMA, gpu="H200").config
    assert unmodelled(cfg)[0] == {
        "consumer": f"attention backend {backend}",
        "reason": f"attention backend {backend} (pinned) is not one tqlab models: neither vLLM's validation of it nor "
                  "its workspace requests are replayed"}
    pred = analysis.predict(cfg)
    assert (pred.verdict, pred.locked_bytes, pred.partial) == ("partial", 0, True)
    assert [u["consumer"] for u in pred.unsized] == [f"attention backend {backend}"]


def test_a_modelled_backend_stays_ok_and_the_cli_exits_by_the_verdict(tmp_path):
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(LLAMA))
    ok = deployment_from_vllm("vllm serve M --attention-backend FLASH_ATTN", LLAMA, gpu="H200").config
    assert unmodelled(ok) == [] and analysis.predict(ok).verdict == "ok"
    runs = {b: CliRunner().invoke(app, ["inspect-vllm", "--config", str(cfg_path), "--args",
                                        f"vllm serve M --attention-backend {b}", "--json", "-"]) for b in
            ("FLASH_ATTN", "ROCM_ATTN")}
    assert [runs[b].exit_code for b in ("FLASH_ATTN", "ROCM_ATTN")] == [0, 4]  # ok, partial (tqlab.cli.options)
    got = json.loads(runs["ROCM_ATTN"].output)
    assert (got["verdict"], [u["consumer"] for u in got["unsized"]]) == ("partial", ["attention backend ROCM_ATTN"])
