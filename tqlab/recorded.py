"""Deprecated alias of :mod:`tqlab.lab.recorded` (files: :mod:`tqlab.provenance`).

Kept only while notebook 06, ``tests/test_turboquant.py`` and
``tqlab/vllm_trace/cpu_harness.py`` still import ``tqlab.recorded``; removed when
they are repointed. New code imports ``tqlab.lab.recorded`` (notebooks) or
``tqlab.provenance`` (library code below ``tqlab.lab``).
"""

from .lab.display import in_notebook as _in_notebook  # noqa: F401  (cpu_harness.show_parity_banner)
from .lab.recorded import *  # noqa: F401,F403
