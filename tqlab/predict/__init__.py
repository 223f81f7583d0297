"""The predictor, beside the engine on vLLM's rules (:mod:`tqlab.core.vllm_rules`); it never runs the engine.

- ``analysis.py``   — the one :class:`~tqlab.predict.analysis.Prediction` (:func:`~tqlab.predict.analysis.predict`)
  and its JSON: the lock, the verdict, the first failing prompt, the safe ``max_model_len``
- ``prompts.py``    — prompt-level closed forms: chunks, the first refused call, safe bounds
- ``consumers.py``  — inspect-vllm's per-consumer view of one prediction (``ConsumerReport``)
- ``bug_report.py`` — the bug report's numbers against a deployment
- ``report.py``     — ``tqlab inspect-vllm``: reads the deployment (:mod:`tqlab.vllm`), prints, writes JSON
"""
