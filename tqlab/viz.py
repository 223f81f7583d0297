"""Deprecated alias of :mod:`tqlab.lab.plots_workspace` and :mod:`tqlab.lab.display`.

Kept only while notebooks 05/06 still import ``tqlab.viz``; removed when they are
repointed (the CUDA-graph/strategies split). New code imports from ``tqlab.lab``.
"""

from .lab.display import debug_workspace_log, fmt_bytes, markdown_table, show_error, show_md  # noqa: F401
from .lab.plots_workspace import *  # noqa: F401,F403
