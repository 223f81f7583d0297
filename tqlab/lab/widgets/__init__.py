"""Interactive explorers for JupyterLab: workspace layout, reservation planner, lifecycle stepper.

Each explorer has pure functions that draw a static figure (so executed and
HTML-exported notebooks show something) and a widget built on ipywidgets,
imported lazily: ``import tqlab.lab.widgets`` works without it.

* :mod:`.layout_explorer` — one ``get_simultaneous`` call, view by view;
* :mod:`.planner` — what PR #44053's ``_reserve_workspace`` reserves, and the first crashing prompt without it;
* :mod:`.lifecycle` — two engines (without / with the fix) step by step.
"""

from tqlab.lab.widgets._common import figure_png, snapshot
from tqlab.lab.widgets.layout_explorer import (
    DTYPE_CHOICES,
    LayoutExplorer,
    LayoutRow,
    default_layout_requests,
    layout_add,
    layout_explorer,
    layout_figure,
    layout_remove,
    layout_rows,
    parse_shape,
    refresh_layout,
)
from tqlab.lab.widgets.lifecycle import (
    LifecycleStep,
    LifecycleStepper,
    LifecycleTrace,
    lifecycle_figure,
    lifecycle_stepper,
    lifecycle_trace,
    refresh_lifecycle,
    render_lifecycle,
)
from tqlab.lab.widgets.planner import (
    PlannerResult,
    ReservationPlanner,
    need_curve,
    plan_summary,
    planner_figure,
    planner_load_preset,
    refresh_planner,
    reservation_planner,
)

__all__ = [
    "DTYPE_CHOICES",
    "LayoutExplorer",
    "LayoutRow",
    "LifecycleStep",
    "LifecycleStepper",
    "LifecycleTrace",
    "PlannerResult",
    "ReservationPlanner",
    "default_layout_requests",
    "figure_png",
    "layout_add",
    "layout_explorer",
    "layout_figure",
    "layout_remove",
    "layout_rows",
    "lifecycle_figure",
    "lifecycle_stepper",
    "lifecycle_trace",
    "need_curve",
    "parse_shape",
    "plan_summary",
    "planner_figure",
    "planner_load_preset",
    "refresh_layout",
    "refresh_lifecycle",
    "refresh_planner",
    "render_lifecycle",
    "reservation_planner",
    "snapshot",
]
