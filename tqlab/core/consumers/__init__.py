"""vLLM 0.33's workspace consumers, one small module each, and their registry (:mod:`.registry`)."""
