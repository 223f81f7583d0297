"""The core: the workspace manager and its layout, the engine config, the reservation, provenance.

Nothing here imports the engine, the predictor, vLLM's inputs or the notebook support.
"""
