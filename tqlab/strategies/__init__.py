"""The bug report's four fixes for a locked workspace, as engine options, and the measurements that compare them.

- ``fixes.py``     — the strategies (``none``, ``dummy_run``, ``reserve`` = vLLM PR #44053,
  ``replay_aware``, ``fallback``, and the control ``grow_no_recapture``) and
  :func:`make_strategy_engine`
- ``measure.py``   — one strategy end to end, the comparison, sweeps, the workspace timeline
- ``allocator.py`` — request traces, growth peaks, DBO slot policies, the manager's cost per call

Figures are in :mod:`tqlab.lab.plots_strategies`, the comparison table in :mod:`tqlab.lab.strategy_tables`.
"""

from tqlab.strategies.allocator import (
    TraceCall,
    dbo_memory_held,
    growth_peak,
    growth_sizes_for_prompt,
    long_request_trace,
    memory_experiments,
    overhead_requests,
    replay_trace,
    workspace_call_overhead,
)
from tqlab.strategies.fixes import (
    ALL_STRATEGIES,
    STRATEGIES,
    STRATEGY_INFO,
    FallbackWorkspace,
    ReplayAwareWorkspace,
    WorkspaceFallbackWarning,
    captured_graphs_valid,
    check_strategy,
    dummy_run_chunks,
    long_context_dummy_run,
    make_strategy_engine,
    strategy_config,
)
from tqlab.strategies.measure import (
    PromptResult,
    StrategyResult,
    compare_strategies,
    default_prompts,
    longest_surviving_prompt,
    results_from_payload,
    run_strategy,
    threshold_sweep,
    warm_up_process,
    workspace_timeline,
    workspace_vs_max_model_len,
)

__all__ = [
    "ALL_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_INFO",
    "FallbackWorkspace",
    "PromptResult",
    "ReplayAwareWorkspace",
    "StrategyResult",
    "TraceCall",
    "WorkspaceFallbackWarning",
    "captured_graphs_valid",
    "check_strategy",
    "compare_strategies",
    "dbo_memory_held",
    "default_prompts",
    "dummy_run_chunks",
    "growth_peak",
    "growth_sizes_for_prompt",
    "long_context_dummy_run",
    "long_request_trace",
    "longest_surviving_prompt",
    "make_strategy_engine",
    "strategy_config",
    "memory_experiments",
    "overhead_requests",
    "replay_trace",
    "results_from_payload",
    "run_strategy",
    "threshold_sweep",
    "warm_up_process",
    "workspace_call_overhead",
    "workspace_timeline",
    "workspace_vs_max_model_len",
]
