# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python (tqlab)
#     language: python
#     name: tqlab
# ---

# %% [markdown]
# # 08 · Interactive explorers: layout, reservation, lifecycle
#
# Three explorers to move sliders on, each built from the same functions the rest of tqlab uses.
#
# **You will learn** to read one `get_simultaneous` call byte by byte, to predict for any deployment what
# PR #44053 reserves and which prompt would crash without it, and to watch the lifecycle that decides it:
#
# 1. **Layout explorer** — one `get_simultaneous` call, view by view: offsets, 256-byte padding, total
#    (`tqlab.core.workspace.compute_layout`, mirroring `vllm/v1/worker/workspace.py`).
# 2. **Reservation planner** — what `_reserve_workspace` (vLLM PR #44053) reserves per tensor-parallel rank
#    for a deployment, its share of the KV cache, and the longest prompt that survives *without* the fix
#    (`tqlab.core.reservation`).
# 3. **Lifecycle stepper** — the small engine (`tqlab.engine.LLMEngine`) on `device="meta"`, stepped phase by
#    phase (init workspace → load model → profile run → metadata builder → CUDA graph capture → lock → serving), with and
#    without the fix.
#
# Every explorer cell first shows a **static figure at the defaults** (what an HTML export or a headless run
# shows), then the live widget below it.
#
# **What you need.** A running Jupyter kernel with `ipywidgets` for the sliders; nothing here needs a GPU
# (every number is computed live, the engine runs on the `meta` device).
#
# **Run time.** About 10 s headless on a 2-core CPU box. Three **predict, then run** cells check the
# explorers' numbers with `assert`s.

# %%
from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "meta"  # where the lifecycle stepper builds its engines ("meta" = shapes only, seconds)
check_device(DEVICE, ("meta", "cpu", "cuda"), "08")  # one clear line for any other DEVICE
USE_RECORDED = False  # nothing in this notebook needs a GPU: every number is computed live
PLANNER_PRESET = "nemotron-3-super-120b-a12b"  # the bug report's deployment (data/presets/)
STEPPER_PRESET = "pr-44053-unit-test"  # small and fast on the meta device

# %%
from IPython.display import Markdown, display

from tqlab.lab import widgets as tw
from tqlab.core.config import EngineConfig, load_preset

# %% [markdown]
# ## 1 · Layout explorer
#
# The default call is the split-KV decode scratch of the PR's unit-test configuration: a view whose bytes are
# not a multiple of 256 is followed by padding up to the next 256-byte boundary, and the next view starts there.
#
# **Predict, then run.** For the default call (PR #44053's unit test: 16 rows, 8 heads, 4 splits, head
# size 128), how many bytes is each of the three views, which of them needs padding to the 256-byte
# alignment, and what is the total?

# %%
from tqlab.core.workspace import compute_layout

lay = compute_layout(tw.default_layout_requests())
assert lay.nbytes == (16 * 8 * 4 * 129 * 4, 16 * 8 * 128 * 2, 16 * 8 * 4)
assert all(o % 256 == 0 for o in lay.offsets) and lay.padding == (0, 0, 0)
assert lay.total_bytes == sum(lay.nbytes)
print(f"offsets {lay.offsets}, total {lay.total_bytes:,} bytes, as predicted")

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# The first view is 16·8·4·129 float32 = 264,192 bytes, a multiple
# of 256, so no padding; the second, 16·8·128 float16 = 32,768 bytes, also none; the last, 16·8 float32 =
# 512 bytes. Every offset is a multiple of 256 and the total is the sum.
#
# </details>
#
# Now the explorer, at that call: type a shape (e.g. `5, 7`), pick a dtype and **add view** to see padding
# appear. **schematic** widths make small views and padding readable; **bytes** is to scale.

# %%
display(tw.snapshot(tw.layout_figure(tw.default_layout_requests())))
layout_ui = tw.layout_explorer()
layout_ui

# %% [markdown]
# ## 2 · Reservation planner
#
# Pick a preset, then move the sliders. The left panel is what the fix reserves per consumer (one ubatch
# slot, one rank); the right panel is the largest workspace call a prompt makes while it prefills alone in
# chunks of `max_num_batched_tokens`, against the size the workspace is **locked** at without the fix
# (the decode capture at `max_num_seqs` rows) and with it. Where the black line crosses the dashed orange one
# is the first prompt that dies with *"Workspace is locked"*. The line stays at zero for up to 128 tokens past
# each chunk boundary: such a short continuation chunk runs the split-KV decode kernel, one row per new token,
# with the kernel's **own** scratch, and asks the workspace for nothing (as in vLLM 0.33, checked against its
# code by `parity/`). So the first crash is a last chunk of 129 tokens, which dequantizes every cached token.
# An impossible combination (e.g. a TP that does not divide the heads) is reported and the last valid numbers
# stay.

# %%
planner_defaults = tw.plan_summary(EngineConfig.from_preset(PLANNER_PRESET))
display(tw.snapshot(tw.planner_figure(planner_defaults)))
planner_ui = tw.reservation_planner(PLANNER_PRESET)
planner_ui

# %% [markdown]
# ## 3 · Lifecycle stepper
#
# Two engines are built on the meta device from the same configuration — one without the reservation
# (vLLM 0.20), one with it (PR #44053) — and the same prompt is served on both. **step** walks the
# start-up phases, then one scheduler step per prefill chunk. Watch the workspace stay small until the lock
# without the fix, and the second chunk (a continuation prefill that dequantizes every cached token) ask for
# more than was locked.

# %%
stepper_cfg = EngineConfig.from_preset(STEPPER_PRESET)
stepper_prompt = min(load_preset(STEPPER_PRESET)["default_prompt_tokens"], stepper_cfg.max_model_len - 2)
traces = [tw.lifecycle_trace(stepper_cfg, stepper_prompt, fix, device=DEVICE) for fix in (False, True)]
display(tw.snapshot(tw.lifecycle_figure(traces)))
stepper_ui = tw.lifecycle_stepper(STEPPER_PRESET, stepper_prompt, device=DEVICE)
stepper_ui

# %% [markdown]
# ## The planner and the stepper agree
#
# **Predict, then run.** The planner predicts, without running anything, the shortest prompt that crashes
# without the fix; the stepper ran the engine. Both come from the same shape functions, so they must agree:
# the same locked size, a crash without the fix for a prompt at least that long, none with it.

# %%
plan = tw.plan_summary(stepper_cfg)
off, on = traces
crash = next(s for s in off.steps if s.error)
predicted = plan.first_failing_unfixed
assert off.locked_bytes == plan.unfixed_locked_bytes, (off.locked_bytes, plan.unfixed_locked_bytes)
assert predicted is not None and stepper_prompt >= predicted and off.crashed and not on.crashed
display(Markdown(
    f"- without the fix the engine locked at **{off.locked_bytes / 2**20:.2f} MiB** (planner: "
    f"{plan.unfixed_locked_bytes / 2**20:.2f} MiB); the planner's shortest failing prompt is "
    f"**{predicted:,} tokens**, so the {stepper_prompt:,}-token prompt crashes — and it did, at step "
    f"{crash.index} (`{crash.name}`), asking for {crash.need_bytes / 2**20:.2f} MiB.\n"
    f"- with the fix the engine locked at **{on.locked_bytes / 2**20:.2f} MiB** = the planner's reservation "
    f"({plan.reserved_bytes / 2**20:.2f} MiB) and served all {sum(s.kind == 'serve' for s in on.steps)} serving steps."
))

# %% [markdown]
# ## The boundary, run on the engine
#
# **Predict, then run.** One token either side of the planner's prediction, without the fix: which of the
# two prompts is served, and which path does each one's last chunk take?

# %%
edge = [tw.lifecycle_trace(stepper_cfg, n, False, device=DEVICE) for n in (predicted - 1, predicted)]
assert not edge[0].crashed and edge[1].crashed, [t.crashed for t in edge]
last_chunk = [next(s for s in reversed(t.steps) if s.name.startswith("chunk ")) for t in edge]
assert last_chunk[0].need_bytes == 0 and last_chunk[0].events == ()
display(Markdown("\n".join(
    f"- {t.prompt_tokens:,} tokens: last chunk `{s.name}`, {s.note}; asks "
    f"{s.need_bytes / 2**20:.2f} MiB of a workspace locked at {t.locked_bytes / 2**20:.2f} MiB -> "
    f"**{'crashed' if t.crashed else 'served'}**"
    for t, s in zip(edge, last_chunk)
)))

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# One token either side of the planner's prediction, without the fix: the shorter
# prompt ends in a short continuation chunk (decode kernel, no workspace call) and is served; the predicted
# one ends in a continuation prefill and crashes.
#
# </details>

# %% [markdown]
# ## Exercises
#
# Write each function below (replace `raise NotImplementedError`), then run the cell: it checks your answer
# against tqlab's own on a few cases and says, per exercise, "correct", what differs, or "not attempted yet".
# Everything runs on a CPU. The solutions are in the collapsed cell after it.
#
# 1. **One call's bytes.** `layout_total(views)`: the bytes of one `get_simultaneous` call whose views are
#    `(shape, dtype name)` pairs (`"float32"`, `"float16"`, `"bfloat16"`, `"uint8"`), each rounded up to 256
#    bytes. (§1)
# 2. **Padding.** `padding_after(nbytes)`: the padding after a view of `nbytes` bytes. (§1)
# 3. **The planner's bound.** `shortest_crashing_prompt(preset, max_num_seqs)`: the shortest prompt that crashes
#    without the fix when `max_num_seqs` changes, or `None` (use `tqlab.predict.analysis.predict`). (§2)

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb08


def layout_total(views):
    raise NotImplementedError


def padding_after(nbytes):
    raise NotImplementedError


def shortest_crashing_prompt(preset, max_num_seqs):
    raise NotImplementedError


check("layout_total", layout_total, nb08.layout_total, nb08.CASES["layout_total"])
check("padding_after", padding_after, nb08.padding_after, nb08.CASES["padding_after"])
check("shortest_crashing_prompt", shortest_crashing_prompt, nb08.shortest_crashing_prompt, nb08.CASES["shortest_crashing_prompt"])

# %% [markdown]
# <details><summary><b>Solutions</b> (click to open)</summary>
#
# ```python
# from tqlab.core.config import EngineConfig
# from tqlab.predict.analysis import predict
#
# ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}
#
#
# def padding_after(nbytes):
#     return -(-nbytes // 256) * 256 - nbytes
#
#
# def layout_total(views):
#     total = 0
#     for shape, dtype in views:
#         n = ITEMSIZE[dtype]
#         for d in shape:
#             n *= d
#         total += n + padding_after(n)
#     return total
#
#
# def shortest_crashing_prompt(preset, max_num_seqs):
#     return predict(EngineConfig.from_preset(preset, max_num_seqs=max_num_seqs)).first_failing_prompt_tokens
# ```
#
# </details>
