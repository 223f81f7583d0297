"""The predictor: closed-form analysis of a deployment (``analysis``) and the inspect-vllm report (``report``)."""
