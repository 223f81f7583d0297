"""The serving engine of one tensor-parallel rank, as vLLM's V1 engine walks it.

- ``scheduler.py``    — requests, the KV block pool, chunked prefill (vLLM ``Scheduler``)
- ``model_runner.py`` — a tiny real model, the KV caches, the profile run and
  decode capture (vLLM ``GPUModelRunner``)
- ``llm_engine.py``   — the lifecycle: init workspace → load model → profile → build backend →
  capture → lock → serve (vLLM ``EngineCore`` / ``GPUWorker``)
"""

from tqlab.engine.llm_engine import EngineDeadError, LLMEngine, PhaseRecord, RequestOutput

__all__ = ["EngineDeadError", "LLMEngine", "PhaseRecord", "RequestOutput"]
