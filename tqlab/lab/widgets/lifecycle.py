"""Lifecycle stepper: two engines (without / with PR #44053's fix) step by step, start-up phases then serving.

:func:`lifecycle_trace` / :func:`lifecycle_figure` (static) and the widget
:func:`lifecycle_stepper` (callbacks :func:`refresh_lifecycle`,
:func:`render_lifecycle`). The engine is :class:`tqlab.engine.LLMEngine`; its
phases follow vLLM 0.33's start-up order (``tqlab.engine.llm_engine.STARTUP_PHASES``):
``init_workspace_manager``, ``load_model``, the profile run (``determine_available_memory``),
then the metadata builders (``initialize_kv_cache`` → ``initialize_metadata_builders``, where
PR #44053's ``_reserve_workspace`` runs), CUDA graph capture, then ``lock_workspace()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tqlab.predict.analysis import prefill_chunks
from tqlab.core.config import EngineConfig, list_presets, load_preset
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, chunk_workspace_request, deployment_decode_shapes
from tqlab.core.workspace import WorkspaceEvent, compute_layout
from tqlab.lab.widgets._common import CRASH_COLOR, FIX_COLOR, NOFIX_COLOR, esc, figure_png, mib, require_widgets

__all__ = [
    "LifecycleStep",
    "LifecycleStepper",
    "LifecycleTrace",
    "lifecycle_figure",
    "lifecycle_stepper",
    "lifecycle_trace",
    "refresh_lifecycle",
    "render_lifecycle",
]


@dataclass(frozen=True)
class LifecycleStep:
    """One step of the lifecycle: a start-up phase or a serving step.

    ``kind`` is ``"phase"`` or ``"serve"``; ``workspace_bytes`` per ubatch slot
    after the step; ``events`` the workspace events during it; ``need_bytes``
    the largest call a serving step asks for (0 for phases); ``error`` the
    exception text if the step raised.
    """

    index: int
    kind: str
    name: str
    note: str
    workspace_bytes: tuple[int, ...]
    events: tuple[WorkspaceEvent, ...]
    need_bytes: int = 0
    error: str | None = None

    @property
    def live_bytes(self) -> int:
        return sum(self.workspace_bytes)


@dataclass
class LifecycleTrace:
    """The steps of one engine (``fix`` on or off) serving one prompt of ``prompt_tokens`` alone."""

    config: EngineConfig
    fix: bool
    prompt_tokens: int
    max_tokens: int
    steps: list[LifecycleStep] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return any(s.error for s in self.steps)

    @property
    def locked_bytes(self) -> int:
        """Slot-0 bytes after the ``lock`` phase."""
        return next(s.workspace_bytes[0] for s in self.steps if s.name == "lock")


_TRACE_CACHE: dict[tuple, LifecycleTrace] = {}


def _serving_steps(config: EngineConfig, prompt_tokens: int, max_tokens: int) -> list[tuple[str, str, int]]:
    """``(name, note, bytes the step's largest workspace call needs)`` of each serving step of one request alone."""
    steps = []
    for cached, q in prefill_chunks(config, prompt_tokens):
        req = chunk_workspace_request(config, cached, q)
        note = {"prefill": "first chunk: no cached tokens, no workspace",
                "decode_kernel": (f"continuation of {q} tokens <= {CONTINUATION_DECODE_THRESHOLD}: decode "
                                  f"kernel, {q} rows, its own scratch: no workspace call (vLLM 0.33)"),
                "continuation": f"continuation prefill: dequantize {cached:,} cached tokens"}[req.path]
        steps.append((f"chunk {cached:,}+{q:,}", note, req.nbytes))
    one_row = compute_layout(deployment_decode_shapes(config, 1)).total_bytes
    steps += [(f"decode @{prompt_tokens + j:,}", "one decode row (CUDA graph replay)", one_row)
              for j in range(max_tokens - 1)]
    return steps


def lifecycle_trace(
    config: EngineConfig, prompt_tokens: int, fix: bool, *, max_tokens: int = 2, device: str = "meta"
) -> LifecycleTrace:
    """Build an :class:`~tqlab.engine.LLMEngine` (``fix`` on/off) and serve one prompt, recording every step.

    The start-up phases come from ``engine.phases`` with the workspace events
    of each (split by counting ``workspace.events`` in the engine's
    ``on_phase`` callback); then one serving step per ``engine.step()`` until
    the request finishes or a step raises (recorded in the step's ``error``;
    the engine is then dead). ``device="meta"`` runs shapes only (seconds).
    Results are cached per (config, prompt, fix, max_tokens, device). Leaves
    the engine's workspace as the current workspace manager.

    Raises ``ValueError`` for a prompt that does not fit ``max_model_len``.
    """
    from tqlab.engine import LLMEngine
    from tqlab.core.workspace import current_workspace_manager, is_workspace_manager_initialized

    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be an int >= 1, got {prompt_tokens!r}")
    if prompt_tokens + max_tokens > config.max_model_len:
        raise ValueError(
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len ({config.max_model_len})"
        )
    key = (repr(sorted(config.to_dict().items())), prompt_tokens, bool(fix), max_tokens, str(device))
    if key in _TRACE_CACHE:
        return _TRACE_CACHE[key]

    marks: list[int] = []

    def on_phase(_rec) -> None:
        marks.append(len(current_workspace_manager().events) if is_workspace_manager_initialized() else 0)

    engine = LLMEngine(config, fix=bool(fix), device=device, on_phase=on_phase)
    events = engine.workspace.events
    trace = LifecycleTrace(config, bool(fix), prompt_tokens, max_tokens)
    prev = 0
    for i, (rec, mark) in enumerate(zip(engine.phases, marks)):
        trace.steps.append(LifecycleStep(i, "phase", rec.name, rec.note, tuple(rec.workspace_bytes),
                                         tuple(events[prev:mark])))
        prev = mark
    engine.add_request(prompt_tokens, max_tokens)
    for name, note, need in _serving_steps(config, prompt_tokens, max_tokens):
        before = len(events)
        error = None
        try:
            engine.step()
        except Exception as e:  # the engine is dead after this; record and stop
            error = f"{type(e).__name__}: {e}"
        trace.steps.append(LifecycleStep(len(trace.steps), "serve", name, note, tuple(engine.workspace.sizes_bytes()),
                                         tuple(events[before:]), need, error))
        if error is not None or not engine.has_unfinished_requests():
            break
    if len(_TRACE_CACHE) > 32:
        _TRACE_CACHE.clear()
    _TRACE_CACHE[key] = trace
    return trace


_SHORT = {"init_workspace": "init", "load_model": "load", "profile_run": "profile", "build_backend": "builder",
          "capture": "capture", "before_lock": "hook", "lock": "lock"}


def _step_label(s: LifecycleStep) -> str:
    return _SHORT.get(s.name, s.name) if s.kind == "phase" else s.name.replace("chunk ", "")


def lifecycle_figure(traces: Sequence[LifecycleTrace], step: int | None = None):
    """One panel per trace: workspace MiB (all ubatch slots) after each step, as bars.

    Serving steps also mark what their largest workspace call needs (black
    tick); a step that raised gets a red X at its need. The grey band is the
    lock; ``step`` frames that step index and greys out the steps after it
    (not taken yet). Returns a matplotlib ``Figure``.
    """
    if not traces:
        raise ValueError("lifecycle_figure needs at least one trace")
    from matplotlib.figure import Figure

    longest = max(traces, key=lambda t: len(t.steps))
    n = len(longest.steps)
    fig = Figure(figsize=(10.0, 1.2 + 1.9 * len(traces)), layout="constrained")
    axes = fig.subplots(len(traces), 1, sharex=True, squeeze=False)[:, 0]
    lock_idx = next(s.index for s in longest.steps if s.name == "lock")
    for ax, t in zip(axes, traces):
        color = FIX_COLOR if t.fix else NOFIX_COLOR
        xs = [s.index for s in t.steps]
        ys = [mib(s.live_bytes) for s in t.steps]
        shown = [step is None or x <= step for x in xs]  # steps after the cursor: faded, not yet taken
        ax.bar(xs, ys, width=0.7, color=[color if v else "#dddddd" for v in shown], alpha=0.85)
        prev = None
        for x, y, v in zip(xs, ys, shown):
            if y != prev and v:
                ax.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                            textcoords="offset points")
            prev = y
        serve = [s for s in t.steps if s.kind == "serve"]
        ax.plot([s.index for s in serve], [mib(s.need_bytes) for s in serve], "_", color="black", ms=14, mew=2,
                label="what the step's largest call needs")
        for s in t.steps:
            if s.error and (step is None or s.index <= step):
                ax.plot([s.index], [mib(s.need_bytes)], "x", color=CRASH_COLOR, ms=11, mew=2.5)
                ax.annotate(f"needs {mib(s.need_bytes):.2f} MiB: Workspace is locked",
                            (s.index, mib(s.need_bytes)), xytext=(-8, 0), textcoords="offset points",
                            fontsize=8, color=CRASH_COLOR, ha="right", va="center")
        ax.axvspan(lock_idx - 0.5, lock_idx + 0.5, color="grey", alpha=0.15, lw=0)
        if step is not None:
            ax.axvspan(step - 0.45, step + 0.45, fill=False, edgecolor="black", lw=1.2, ls="--")
        ax.set_ylim(0, max([1e-6] + ys + [mib(s.need_bytes) for s in serve]) * 1.3)
        ax.set_ylabel("MiB", fontsize=8)
        ax.set_title(f"{'with' if t.fix else 'without'} the fix: locked at {mib(t.locked_bytes):.2f} MiB"
                     + (" -> the request crashes" if t.crashed else " -> the request is served"),
                     fontsize=9, loc="left", color=color)
        ax.legend(fontsize=7, loc="upper left")
    stride = max(1, n // 14)
    ticks = [s.index for s in longest.steps if s.index % stride == 0 or s.kind == "phase"]
    axes[-1].set_xticks(ticks)
    axes[-1].set_xticklabels([_step_label(longest.steps[i]) for i in ticks], rotation=30, ha="right", fontsize=7)
    axes[-1].set_xlim(-0.6, n - 0.4)
    cfg = longest.config
    fig.suptitle(f"{cfg.preset or 'custom'}: prompt {longest.prompt_tokens:,} tokens in chunks of "
                 f"{cfg.chunk_budget:,}; workspace after each step (grey = lock)", fontsize=9)
    return fig


def _event_text(e: WorkspaceEvent) -> str:
    if e.kind == "resize":
        return f"resize {mib(e.old_bytes):.2f} -> {mib(e.new_bytes):.2f} MiB by {e.caller}"
    if e.kind == "violation":
        return f"VIOLATION: {e.caller} asked {mib(e.new_bytes):.2f} MiB, locked at {mib(e.old_bytes):.2f} MiB"
    return f"{e.kind} at {mib(e.new_bytes):.2f} MiB ({e.caller})"


def _step_html(t: LifecycleTrace, i: int) -> str:
    who = "with fix" if t.fix else "without fix"
    color = FIX_COLOR if t.fix else NOFIX_COLOR
    if i >= len(t.steps):
        last = t.steps[-1]
        body = ("<i>engine dead (EngineDeadError): no further steps</i>" if last.error
                else "<i>request finished</i>")
        return f"<div style='border-left:4px solid {color};padding-left:6px'><b>{who}</b>: {body}</div>"
    s = t.steps[i]
    ev = "".join(f"<li>{esc(_event_text(e))}</li>" for e in s.events) or "<li>no workspace events</li>"
    need = f"; call needs {mib(s.need_bytes):.2f} MiB" if s.kind == "serve" else ""
    err = (f"<div style='color:{CRASH_COLOR}'><b>{esc(s.error)}</b></div>" if s.error else "")
    return (
        f"<div style='border-left:4px solid {color};padding-left:6px'><b>{who}</b> — step {i}: "
        f"<code>{esc(s.name)}</code> ({esc(s.note)})<br>"
        f"workspace after: {', '.join(f'{mib(b):.2f}' for b in s.workspace_bytes)} MiB{need}"
        f"<ul style='margin:2px 0'>{ev}</ul>{err}</div>"
    )


class LifecycleStepper:
    """Controls and state of :func:`lifecycle_stepper` (see there)."""

    def __init__(self, preset: str, prompt_tokens: int | None, device: str = "meta"):
        w = require_widgets()
        self._suspend = False
        self.device = device
        self.traces: list[LifecycleTrace] = []
        self.preset = w.Dropdown(options=list_presets(), value=preset, description="preset")
        self.prompt_tokens = w.IntSlider(min=1, max=2, value=1, description="prompt tokens", continuous_update=False,
                                         style={"description_width": "120px"}, layout=w.Layout(width="560px"))
        self.step = w.IntSlider(min=0, max=1, value=0, description="step", continuous_update=True,
                                style={"description_width": "120px"}, layout=w.Layout(width="560px"))
        self.back_button = w.Button(description="back", icon="step-backward")
        self.next_button = w.Button(description="step", icon="step-forward")
        self.status = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.detail = w.HTML()
        self.preset.observe(lambda _c: _stepper_load_preset(self, None), names="value")
        self.prompt_tokens.observe(lambda _c: refresh_lifecycle(self), names="value")
        self.step.observe(lambda _c: render_lifecycle(self), names="value")
        self.back_button.on_click(lambda _b: _move(self, -1))
        self.next_button.on_click(lambda _b: _move(self, +1))
        self.view = w.VBox(
            [w.HTML(f"<b>Lifecycle stepper</b>: the engine on device={device!r}, with and without the fix"),
             self.preset, self.prompt_tokens, w.HBox([self.back_button, self.next_button]), self.step,
             self.status, self.image, self.detail],
            layout=w.Layout(border="1px solid #ddd", padding="6px"),
        )
        self.view.add_class("tqlab-explorer")
        _stepper_load_preset(self, prompt_tokens)

    def config(self) -> EngineConfig:
        return EngineConfig.from_preset(self.preset.value)

    def _repr_mimebundle_(self, **kw):
        return self.view._repr_mimebundle_(**kw)


def _default_prompt(cfg: EngineConfig, max_tokens: int = 2) -> int:
    return max(1, min(load_preset(cfg.preset)["default_prompt_tokens"], cfg.max_model_len - max_tokens))


def _stepper_load_preset(ui: LifecycleStepper, prompt_tokens: int | None) -> None:
    cfg = ui.config()
    top = cfg.max_model_len - 2
    value = _default_prompt(cfg) if prompt_tokens is None else prompt_tokens
    if not 1 <= value <= top:
        raise ValueError(f"prompt_tokens must be in [1, {top}] for preset {cfg.preset!r}, got {value}")
    ui._suspend = True
    try:
        ui.prompt_tokens.max = max(top, ui.prompt_tokens.min + 1)
        ui.prompt_tokens.value = value
    finally:
        ui._suspend = False
    refresh_lifecycle(ui)


def _move(ui: LifecycleStepper, delta: int) -> None:
    ui.step.value = min(max(ui.step.value + delta, ui.step.min), ui.step.max)


def refresh_lifecycle(ui: LifecycleStepper) -> None:
    """Build both engines (fix off / on) for the controls' preset and prompt, reset the step slider (callback)."""
    if ui._suspend:
        return
    cfg = ui.config()
    ui.status.value = f"building both engines on device={ui.device!r} ..."
    ui.traces = [lifecycle_trace(cfg, ui.prompt_tokens.value, fix, device=ui.device) for fix in (False, True)]
    n = max(len(t.steps) for t in ui.traces)
    ui._suspend = True
    try:
        ui.step.max = n - 1
        ui.step.value = 0
    finally:
        ui._suspend = False
    ui.status.value = " | ".join(
        f"{'with' if t.fix else 'without'} fix: {len(t.steps)} steps, "
        + ("crashes" if t.crashed else "serves the prompt") for t in ui.traces
    )
    render_lifecycle(ui)


def render_lifecycle(ui: LifecycleStepper) -> None:
    """Redraw the figure with a cursor at ``ui.step.value`` and describe that step for both engines (callback)."""
    if ui._suspend or not ui.traces:
        return
    i = ui.step.value
    ui.image.value = figure_png(lifecycle_figure(ui.traces, i))
    ui.detail.value = "".join(_step_html(t, i) for t in ui.traces)


def lifecycle_stepper(
    preset: str = "pr-44053-unit-test", prompt_tokens: int | None = None, device: str = "meta"
) -> LifecycleStepper:
    """Build the lifecycle stepper: step both engines (fix off / on) phase by phase, then serving step by step.

    ``prompt_tokens`` defaults to the preset's ``default_prompt_tokens`` (at
    most ``max_model_len - 2``: one prefill-sampled token plus one decode).
    Each preset/prompt change builds two engines on ``device`` (``"meta"``:
    shapes only, under a second for the default preset; presets with many
    decode buckets, e.g. ``max_num_seqs=256``, take several seconds).

    Raises ``ValueError`` for an unknown preset, a prompt out of range or a bad
    device, ``ImportError`` without ipywidgets.
    """
    load_preset(preset)
    if device not in ("meta", "cpu", "cuda"):
        raise ValueError(f"device must be 'meta', 'cpu' or 'cuda', got {device!r}")
    return LifecycleStepper(preset, prompt_tokens, device)
