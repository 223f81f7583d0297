"""tqlab.lab.presets: the TurboQuant lessons use only presets vLLM 0.33 starts, and say why one is left out."""

from tqlab.core.config import EngineConfig, list_presets
from tqlab.core.consumers.registry import turboquant_only
from tqlab.lab.presets import refusal_summary, turboquant_presets
from tqlab.predict.analysis import predict


def test_turboquant_presets_split_started_from_refused():
    started, refused = turboquant_presets()
    tq_only = [n for n in list_presets() if turboquant_only(EngineConfig.from_preset(n))]
    assert sorted(started + list(refused)) == sorted(tq_only) and not set(started) & set(refused)
    assert started == [n for n in tq_only if n in started]  # list_presets order
    assert list(refused) == ["gemma-2-9b"]  # sliding-window layers: vLLM's TurboQuant backend refuses them
    assert "nemotron-3-super-120b-a12b" in started and "qwen3-30b-a3b" not in started  # a MoE: notebook 10
    assert all(predict(EngineConfig.from_preset(n)).verdict != "refused" for n in started)
    assert refusal_summary(refused["gemma-2-9b"]) == (
        "the TurboQuant backend: sliding window not supported "
        "(vllm/platforms/cuda.py:CudaPlatformBase.get_attn_backend_cls)")


def test_refusal_summary_without_a_turboquant_entry_keeps_the_first_sentence():
    assert refusal_summary("Chunked prefill is required. Set it (vllm/x.py:f)") == "Chunked prefill is required"
