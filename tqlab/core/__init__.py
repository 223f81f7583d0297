"""The core: what tqlab knows per vLLM version (``vllm_versions``), vLLM 0.33's rules (``vllm_rules``), the workspace
manager and its layout, the engine config, the consumers' shapes and the reservation, notes, provenance.

Nothing here imports the engine, the predictor, vLLM's inputs or the notebook support.
"""
