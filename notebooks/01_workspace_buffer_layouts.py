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
# # 01 · Workspace buffer layouts: one buffer, many views
#
# vLLM keeps the scratch memory of its hot path in a single `WorkspaceManager`
# (`vllm/v1/worker/workspace.py`, added by vLLM PR #40941). Attention backends, fused MoE
# and the sparse indexer all ask it for temporary tensors instead of calling `torch.empty`.
# `tqlab.core.workspace` re-implements it in plain PyTorch so that every mechanism can be
# watched on a laptop. This notebook walks through all of them, live:
#
# | you will learn | section |
# |---|---|
# | where each view sits in the buffer: alignment, offsets, padding (a byte map) | 1 |
# | views that share one buffer and overwrite each other — on purpose (FlashAttention DCP, fused MoE) | 2 |
# | growth that frees the old buffer *before* allocating the new one, and what that saves at the peak | 3 |
# | a view a consumer still holds keeps the old buffer alive across growth (vLLM PR #56902) | 3 |
# | the lock, and an error that names the line that asked for too much | 4 |
# | DBO: one buffer per ubatch slot, one slot per thread | 5 |
# | lanes and persistent resources (vLLM 0.33): a slot per (ubatch, lane), kept tensors refused after the lock | 5b |
# | the retained tail (vLLM 0.34's `get_retained`): scratch that outlives a request, and when it is lost | 5c |
# | the debug log (`TQLAB_DEBUG_WORKSPACE=1`, vLLM's `VLLM_DEBUG_WORKSPACE`) | 6 |
# | the whole lifecycle: init → warm-up → lock → serve → re-warm | 7 |
#
# **Hardware.** CPU only. With `DEVICE = "cuda"` the live cells run on a GPU, and section 3
# also measures the CUDA allocator's peak; without CUDA that cell shows a recorded GPU
# run (under a banner) when `data/` has one.
#
# **Run time.** Seconds on a small CPU box; the last cell prints the measured time.
#
# Each section asks a question and a **predict, then run** prompt *before* the cell that
# answers it: write your prediction down, run the cell, compare. The answer is folded under
# **Answer** after the output, and a cell of `assert`s checks it (re-run them after changing the
# numbers). The words *ubatch*, *lane*, *slot*, *bucket*, *continuation chunk* and *split-KV* are
# defined in the [glossary](00_glossary.md). The notebook ends with exercises checked by code.
#
# **Units, once for every notebook.** A MiB is 2**20 = 1,048,576 bytes and a KiB 2**10 bytes;
# tqlab writes sizes in MiB in every table, figure and command-line line. vLLM's own
# `WorkspaceManager` prints the same 2**20-byte unit as "MB" (`requires 2.00 MB, current size is
# 0.26 MB`); where its message is quoted, it is quoted as vLLM prints it. So "2.00 MB" in a
# vLLM message and "2.00 MiB" in tqlab's text are the same 2,097,152 bytes.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

import torch

from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # "cpu", "cuda" or "meta" (meta: shapes only, no memory)
check_device(DEVICE, ("cpu", "cuda", "meta"), "01")  # one clear line for any other DEVICE
USE_RECORDED = True  # without CUDA, show recorded GPU measurements from data/ under a banner
RECORD_GPU = False  # on CUDA: also write the GPU measurement to data/ (with provenance) for CPU-only readers

# %%
import gc
import math
import os
import threading
import weakref

import matplotlib.pyplot as plt

from tqlab.predict.analysis import decode_capture_rows
from tqlab.core.config import EngineConfig
from tqlab.lab import plots_workspace as plots
from tqlab.lab import recorded
from tqlab.lab.display import debug_workspace_log, markdown_table, show_error, show_md
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes, reservation_plan
from tqlab.core.workspace import (
    ALIGNMENT,
    MiB,
    WorkspaceLockedError,
    WorkspaceManager,
    compute_layout,
    current_ubatch_id,
    current_workspace_manager,
    format_mb,
    init_workspace_manager,
    is_workspace_manager_initialized,
    lock_workspace,
    reset_workspace_manager,
    rewarm_workspace,
    round_up,
    ubatch_context,
    use_workspace_lane,
)

device = recorded.pick_device(DEVICE)
HAS_POINTERS = device != "meta"  # meta tensors have no memory, so no addresses to compare
print(f"running on {device!r}; every view starts at a multiple of ALIGNMENT = {ALIGNMENT} bytes")

# %% [markdown]
# ## 1 · Where does each view live?
#
# **Question.** The split-KV decode kernel needs three scratch tensors at the same time:
# the per-split partial outputs (with one extra column for each split's log-sum-exp),
# the reduced output, and the final log-sum-exp. It asks for all three in **one**
# `get_simultaneous` call. Where inside the flat `uint8` buffer does each one start?
#
# The rule (`WorkspaceManager.get_simultaneous`, `vllm/v1/worker/workspace.py`): view *i* starts at the sum of the sizes of the views before
# it, each size rounded up to `ALIGNMENT` bytes; the call needs the sum of all rounded
# sizes. We use tiny shapes first so that the padding is visible: 2 sequences, 3 query heads,
# `head_dim` 5, 4 KV splits, bf16 output.
#
# **Predict, then run.** Before running the next cell, write down each view's offset from the
# rule above, using only the shapes and the dtypes' item sizes (`mid_out` is float32 of shape
# `(2, 3, 4, 6)`, `output` bf16 `(2, 3, 5)`, `lse` float32 `(2, 3)`), and the bytes the call needs.

# %%
names = ["mid_out", "output", "lse"]
toy = decode_workspace_shapes(batch_size=2, num_heads=3, head_dim=5, num_kv_splits=4, output_dtype=torch.bfloat16)

m = WorkspaceManager(device)
views = m.get_simultaneous(*toy)
lay = m.layout(*toy)

rows = []
for name, v, off, pad in zip(names, views, lay.offsets, lay.padding):
    nbytes = v.numel() * v.element_size()
    rows.append((name, tuple(v.shape), str(v.dtype).removeprefix("torch."), nbytes, pad, off, off % ALIGNMENT))
show_md(markdown_table(("view", "shape", "dtype", "bytes used", "padding after", "offset", "offset % ALIGNMENT"), rows))
show_md(f"The call needs **{lay.total_bytes:,} bytes**; the buffer is now **{m.size_bytes():,} bytes**.")
assert m.size_bytes() == lay.total_bytes == sum(round_up(v.numel() * v.element_size(), ALIGNMENT) for v in views)

# %%
ax = plots.plot_layout(lay, names)
plt.show()

# %% [markdown]
# The next cell recomputes the offsets from the returned tensors and checks them against the
# manager — and, on a device with real memory, against the actual addresses of the views
# inside the buffer.

# %%
used = [v.numel() * v.element_size() for v in views]
predicted = [sum(round_up(n, ALIGNMENT) for n in used[:i]) for i in range(len(used))]
assert list(lay.offsets) == predicted
assert all(off % ALIGNMENT == 0 for off in lay.offsets)
assert m.size_bytes() == sum(round_up(n, ALIGNMENT) for n in used) == lay.total_bytes
if HAS_POINTERS:
    base = m.buffer().data_ptr()
    assert [v.data_ptr() - base for v in views] == predicted
print("offsets predicted:", predicted, "— all checks passed")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `mid_out` is 2·3·4·6 float32 = 576 bytes, padded to 768; `output` is 2·3·5 bf16 = 60 bytes,
# padded to 256; `lse` is 2·3 float32 = 24 bytes, padded to 256. The offsets are 0, 768 and
# 768 + 256 = 1,024, and the call needs 1,024 + 256 = 1,280 bytes.
#
# </details>

# %% [markdown]
# ### The same arithmetic at full size
#
# The bug report's deployment (preset `nemotron-3-super-120b-a12b`, one tensor-parallel
# rank) runs the same three views with `max_num_seqs` rows. The schematic byte map gives
# every segment a readable width; the labels carry the true offsets and sizes.

# %%
cfg = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
real = decode_workspace_shapes(
    cfg.max_num_seqs, cfg.num_heads_per_rank, cfg.head_dim, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype
)
real_lay = compute_layout(real)
ax = plots.plot_layout(real_lay, names, schematic=True)
plt.show()
show_md(
    f"Decode scratch for {cfg.max_num_seqs} sequences × {cfg.num_heads_per_rank} query heads per rank × "
    f"{cfg.tq_max_kv_splits_for_cuda_graph} KV splits × head_dim {cfg.head_dim}: **{real_lay.total_bytes:,} bytes "
    f"= {format_mb(real_lay.total_bytes)} MiB** (2**20 bytes: vLLM's message calls it \"MB\"). Keep this number in mind: "
    "notebook 02 finds it again."
)

# %% [markdown]
# ## 2 · Views share one buffer — and the next call overwrites them
#
# **Question.** Every `get_simultaneous` call carves its views from offset 0 of the
# *same* buffer. What happens to the tensors of the previous call?
#
# **The FlashAttention DCP pattern** (vLLM's FlashAttention backend with decode context parallelism). With decode context parallelism the
# backend asks for a buffer for the context attention output, consumes it (the DCP
# combine), and only then asks for a second buffer for the query attention output. The
# second call reuses the first one's bytes: two large outputs never occupy memory at once.
# The same holds for views a layer keeps as attributes after `__init__`: they are
# only valid inside that layer's compute window. Our own shapes: 6 context rows, then 3 query rows.
#
# **Predict, then run.** After `query_out.fill_(2.0)`, what does `context_out` hold — all ones,
# all twos, or some of each? Was anything lost?

# %%
heads, dcp_world, head_dim = 2, 2, 4
n_context, n_query = 6, 3
(context_out,) = m.get_simultaneous(((n_context, heads * dcp_world, head_dim), torch.bfloat16))
context_out.fill_(1.0)  # "attention over the context" writes its output here
combined = context_out.float().sum()  # ...and the combine consumes it before the next call

(query_out,) = m.get_simultaneous(((n_query, heads, head_dim), torch.bfloat16))
query_out.fill_(2.0)  # the query attention writes into the same bytes

ax = plots.plot_byte_maps(
    [
        ("1st call: context_out", m.layout(((n_context, heads * dcp_world, head_dim), torch.bfloat16)), ["context_out"]),
        ("2nd call: query_out", m.layout(((n_query, heads, head_dim), torch.bfloat16)), ["query_out"]),
    ],
    buffer_bytes=m.size_bytes(),
    title="Two calls, one buffer: both start at offset 0",
)
plt.show()

# %%
flat = context_out.flatten()
k = query_out.numel()
if device != "meta":
    assert bool((flat[:k] == 2).all()) and bool((flat[k:] == 1).all())
    assert combined.item() == context_out.numel()  # computed before the overwrite
if HAS_POINTERS:
    assert query_out.data_ptr() == context_out.data_ptr() == m.buffer().data_ptr()
print(f"context_out now holds {k} overwritten and {flat.numel() - k} original elements")

# %% [markdown]
# <details><summary>Answer</summary>
#
# After `query_out.fill_(2.0)`, what does `context_out` hold?
# Its first `query_out.numel()` elements now read 2 (they *are* `query_out`'s bytes);
# the rest still read 1. The combine already ran, so nothing was lost.
#
# </details>

# %% [markdown]
# ### The fused-MoE pattern
#
# vLLM's fused-MoE layer needs three intermediate
# buffers, but the first (`workspace13`) and the last (`fused_out`) are never alive at the
# same time. So it asks for *two* views — a shared region big enough for either, and
# `workspace2` — and reshapes the shared region twice. Three logical buffers, two
# physical regions. Our own shapes: a few tokens, top-k experts, made-up widths.
#
# **Predict, then run.** Where do `workspace13` and `fused_out` start, relative to `common`? And
# `workspace2`? How many bytes does sharing save?

# %%
tokens, top_k, inter, hidden = 5, 2, 16, 8
ws13_shape = (tokens * top_k, max(2 * inter, hidden))
ws2_shape = (tokens * top_k, inter)
fused_out_shape = (tokens, hidden)
dt = torch.bfloat16

shared_numel = max(math.prod(ws13_shape), math.prod(fused_out_shape))
common, workspace2 = m.get_simultaneous(((shared_numel,), dt), (ws2_shape, dt))
workspace13 = common[: math.prod(ws13_shape)].view(ws13_shape)
fused_out = common[: math.prod(fused_out_shape)].view(fused_out_shape)

naive = compute_layout(((ws13_shape, dt), (ws2_shape, dt), (fused_out_shape, dt)))
shared = compute_layout((((shared_numel,), dt), (ws2_shape, dt)))
ax = plots.plot_byte_maps(
    [
        ("three separate views", naive, ["workspace13", "workspace2", "fused_out"]),
        ("shared region + workspace2", shared, ["workspace13 / fused_out", "workspace2"]),
    ],
    title="Fused MoE: workspace13 and fused_out share one region",
)
plt.show()
show_md(
    f"Separate views need **{naive.total_bytes:,} bytes**; sharing needs **{shared.total_bytes:,} bytes** "
    f"(saves {naive.total_bytes - shared.total_bytes:,} bytes, "
    f"{100 * (naive.total_bytes - shared.total_bytes) / naive.total_bytes:.0f} %)."
)

# %%
assert shared.offsets[1] == round_up(shared_numel * dt.itemsize, ALIGNMENT)
if HAS_POINTERS:
    assert workspace13.data_ptr() == fused_out.data_ptr() == common.data_ptr()
    assert workspace2.data_ptr() - common.data_ptr() == shared.offsets[1]
print("shared region checks passed; workspace2 starts at byte", shared.offsets[1])

# %% [markdown]
# <details><summary>Answer</summary>
#
# `workspace13` and `fused_out` start at the same address as
# `common`; `workspace2` starts right after the shared region, rounded up to `ALIGNMENT`.
#
# </details>

# %% [markdown]
# ## 3 · Growth: free first, then allocate
#
# **Question.** A request that does not fit makes the slot grow. How much workspace memory
# exists at the worst moment of that growth?
#
# `resize_` (or "allocate the new buffer, then drop the old one") holds both at once:
# old + new. vLLM drops its reference to the old buffer *first* (`_ensure_workspace_size`), so the
# peak is only the new size. `tqlab` can do either (`growth_policy=`), and every resize
# event records `peak_bytes`. The accounting below uses the `meta` device, which allocates
# nothing, so the sizes can be realistic. With two DBO slots, vLLM today grows only the
# slot that asked; earlier vLLM revisions grew every slot (`grow_all_slots=True`).
#
# *Where the accounting counts held views:* `WorkspaceManager.live_bytes()` and the resize
# events' `peak_bytes` see only the manager's own buffers. `live_storage_bytes()` below adds
# every storage a held view keeps alive; the table and the next subsections use it.
#
# **Predict, then run.** Every slot starts at 64 MiB, then slot 0 grows to 128 MiB. In terms of
# the old and new sizes, what is the peak for each row of the next table: one slot
# free-then-allocate, allocate-then-free, two slots vLLM's way, two slots earlier vLLM's way, and
# free-then-allocate while a view is still held?

# %%
small, big = 64 * MiB, 128 * MiB


def live_storage_bytes(manager: WorkspaceManager, held=()) -> int:
    """Bytes of every distinct storage alive: the manager's slot buffers *and* those that held views keep alive.

    `manager.live_bytes()` and the events' `peak_bytes` count only the manager's own buffers.
    """
    storages = {}  # id -> storage; holding the storage keeps its id unique while we count
    for t in [manager.buffer(i) for i in range(manager.num_ubatches)] + list(held):
        if t is not None:
            st = t.untyped_storage()
            storages[id(st)] = st
    return sum(st.nbytes() for st in storages.values())


def grow_scenario(slots: int, policy: str, grow_all: bool = False, hold_view: bool = False) -> dict:
    """Every slot to `small`, then slot 0 to `big`; report the peak and what stays live."""
    w = WorkspaceManager("meta", slots, growth_policy=policy, grow_all_slots=grow_all)
    held = []
    for s in range(slots):
        with ubatch_context(s):
            views = w.get_simultaneous(((small,), torch.uint8))
            if hold_view and s == 0:
                held = views  # a consumer keeps slot 0's view across the growth
    n_before = len(w.events)
    w.get_simultaneous(((big,), torch.uint8))
    growth = w.events[n_before:]
    return {  # held storages were alive through the whole growth, so they add to its peak
        "peak": max(max(e.peak_bytes for e in growth), live_storage_bytes(w, held)),
        "live": live_storage_bytes(w, held),
        "sizes": w.sizes_bytes(),
    }


scenarios = {
    "1 slot, free then allocate (vLLM)": grow_scenario(1, "free_then_allocate"),
    "1 slot, allocate then free (resize_)": grow_scenario(1, "allocate_then_free"),
    "2 slots, free then allocate, requesting slot only (vLLM)": grow_scenario(2, "free_then_allocate"),
    "2 slots, free then allocate, every slot (earlier vLLM)": grow_scenario(2, "free_then_allocate", grow_all=True),
    "1 slot, free then allocate, a view held (vLLM PR #56902)": grow_scenario(1, "free_then_allocate", hold_view=True),
}
show_md(
    markdown_table(
        ("scenario", "peak during growth (MiB)", "live after (MiB)", "slot sizes after (MiB)"),
        [
            (k, f"{v['peak'] / MiB:.0f}", f"{v['live'] / MiB:.0f}", " / ".join(f"{s / MiB:.0f}" for s in v["sizes"]))
            for k, v in scenarios.items()
        ],
    )
)
ax = plots.plot_bars(
    list(scenarios),
    [v["peak"] / MiB for v in scenarios.values()],
    ylabel="peak workspace during growth (MiB)",
    fmt="{:.0f} MiB",
    hline=big / MiB,
    hline_label="the new size",
    title=f"Growing slot 0 from {small // MiB} MiB to {big // MiB} MiB",
    horizontal=True,
)
plt.show()
assert scenarios["1 slot, free then allocate (vLLM)"]["peak"] == big  # the first row; the next cell checks all

# %%
one_vllm, one_resize, two_vllm, two_all, one_held = scenarios.values()
assert one_vllm["peak"] == big
assert one_resize["peak"] == small + big
assert two_vllm["peak"] == two_vllm["live"] == small + big and two_vllm["sizes"] == [big, small]
assert two_all["live"] == 2 * big and two_all["sizes"] == [big, big]
assert one_held["peak"] == one_held["live"] == small + big and one_held["sizes"] == [big]
print("growth accounting checks passed")

# %% [markdown]
# <details><summary>Answer</summary>
#
# One slot, free-then-allocate: the peak equals the new size.
# Allocate-then-free: old + new. Two slots, vLLM's way: slot 1 keeps its old size and the
# peak is slot 1 + the new slot 0. Earlier vLLM's way: both slots end at the new size. And
# free-then-allocate with a view still held costs as much as `resize_`: old + new.
#
# </details>

# %% [markdown]
# ### Growth moves the buffer — views taken before it go stale
#
# Growth allocates a *new* buffer. A view handed out before the growth still points into
# the old one: writes through it never reach the workspace again. (It also keeps the old
# memory alive: the free in "free then allocate" happens only when nobody holds a view.)
# A CUDA graph captured with the old address would replay into that old memory — this is
# why vLLM locks the workspace after capture (`GPUModelRunner.capture_model`, `vllm/v1/worker/gpu_model_runner.py`).

# %%
g = WorkspaceManager(device)
(early,) = g.get_simultaneous(((4096,), torch.uint8))
g.get_simultaneous(((4 * 4096,), torch.uint8))  # grows
if HAS_POINTERS:
    old_addr = early.untyped_storage().data_ptr()
    new_addr = g.buffer().untyped_storage().data_ptr()
    print(f"view taken before growth lives at {old_addr:#x}; the workspace is now at {new_addr:#x}")
    assert old_addr != new_addr  # the old storage is still alive (the view holds it), so the new one cannot be there
else:
    print("meta device: no addresses to compare")

# %% [markdown]
# ### A view held across growth keeps the old buffer alive (vLLM PR #56902)
#
# **Question.** vLLM drops its own reference to the old buffer before allocating the new
# one. But PyTorch frees a storage only when *nothing* refers to it — and a view a
# consumer still holds refers to it. How many workspace bytes are really alive after the
# growth, and when does the old buffer go? (vLLM PR #56902 looks at exactly this case.)
#
# We hold a view from `get_simultaneous`, force a growth, and count every live storage:
# the manager's buffer (`size_bytes()`) plus the storage the held view points into
# (`view.untyped_storage().nbytes()`). A weak reference to the old storage tells us when
# it is really freed (PyTorch keeps one Python object per live storage).
#
# **Predict, then run.** Growing 64 KiB → 256 KiB while the view is held: how many bytes are live,
# and how many does the manager's own accounting (the resize event's `peak_bytes`) report? And
# after `del view`?

# %%
hv_device = "cpu" if device == "meta" else device  # real storages, so "alive" means memory
old_bytes, new_bytes = 64 * 1024, 4 * 64 * 1024
hv = WorkspaceManager(hv_device)
(held,) = hv.get_simultaneous(((old_bytes,), torch.uint8))  # a consumer keeps this view
old_storage = weakref.ref(held.untyped_storage())
hv.get_simultaneous(((new_bytes,), torch.uint8))  # growth: the manager frees its reference first
growth_event = hv.events[-1]
gc.collect()
moments = {"before growth": (old_bytes, 0)}
moments["after growth, view held"] = (held.untyped_storage().nbytes(), hv.size_bytes())
held_live, held_manager_says = live_storage_bytes(hv, [held]), hv.live_bytes()
old_alive_while_held = old_storage() is not None

del held  # the consumer lets go
gc.collect()
moments["after del view"] = (0, hv.size_bytes())
after_live, old_alive_after = live_storage_bytes(hv), old_storage() is not None

fig, ax = plt.subplots(figsize=(9, 2.2))
labels = list(moments)
olds = [o / 1024 for o, _ in moments.values()]
news = [n / 1024 for _, n in moments.values()]
ax.barh(labels, olds, color="#a0aec0", label="old buffer (after growth only the held view keeps it)")
ax.barh(labels, news, left=olds, color="#3182ce", label="new buffer (the manager's)")
for y, (o, n) in enumerate(zip(olds, news)):
    ax.text(o + n, y, f" {o + n:,.0f} KiB", va="center", fontsize=9)
ax.invert_yaxis()
ax.set_xlim(right=1.25 * max(o + n for o, n in zip(olds, news)))
ax.set_xlabel("live workspace storage (KiB)")
ax.set_title(f"Growing {old_bytes // 1024} KiB → {new_bytes // 1024} KiB while a consumer holds a view", loc="left", fontsize=10)
ax.legend(fontsize=8, loc="upper right")
plt.show()
show_md(
    markdown_table(
        ("moment", "live storage bytes (counted)", "manager's `live_bytes()`", "old storage alive?"),
        [("after growth, view held", f"{held_live:,}", f"{held_manager_says:,}", old_alive_while_held),
         ("after del view", f"{after_live:,}", f"{hv.live_bytes():,}", old_alive_after)],
    )
)

# %%
assert held_live == old_bytes + new_bytes == old_bytes + hv.size_bytes()
assert held_manager_says == growth_event.peak_bytes == new_bytes  # the bookkeeping misses the held view
assert old_alive_while_held
assert after_live == new_bytes == hv.size_bytes()
assert not old_alive_after
print(f"view held: {held_live:,} live bytes (old {old_bytes:,} + new {new_bytes:,}); after del: {after_live:,}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# While the view is held: live bytes = old + new, although the
# manager's own accounting (and the resize event's `peak_bytes`) says only new. After
# `del view`: live bytes = new, and the old storage is gone.
#
# </details>

# %% [markdown]
# ### On a GPU: the allocator's own peak
#
# The table above is bookkeeping. On CUDA, `torch.cuda.max_memory_allocated()` measures
# it. Without CUDA this cell shows a recording from `data/workspace_growth_peak_cuda.json`
# (with its provenance) when one exists; running this notebook on a GPU with
# `RECORD_GPU = True` writes that recording.

# %%
REC = "workspace_growth_peak_cuda"
if device.startswith("cuda"):
    measured = {}
    for policy in ("free_then_allocate", "allocate_then_free"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        w = WorkspaceManager(device, growth_policy=policy)
        w.get_simultaneous(((small,), torch.uint8))
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() - small  # memory that is not this workspace
        torch.cuda.reset_peak_memory_stats()
        w.get_simultaneous(((big,), torch.uint8))
        torch.cuda.synchronize()
        measured[policy] = torch.cuda.max_memory_allocated() - base
        del w
    show_md(
        markdown_table(
            ("growth policy", "measured peak (MiB)", "bookkeeping peak (MiB)"),
            [
                ("free_then_allocate", f"{measured['free_then_allocate'] / MiB:.0f}", f"{one_vllm['peak'] / MiB:.0f}"),
                ("allocate_then_free", f"{measured['allocate_then_free'] / MiB:.0f}", f"{one_resize['peak'] / MiB:.0f}"),
            ],
        )
    )
    assert measured["free_then_allocate"] == one_vllm["peak"]
    assert measured["allocate_then_free"] == one_resize["peak"]
    if RECORD_GPU:
        recorded.record_run(
            REC,
            {"small_bytes": small, "big_bytes": big, "peak_bytes": measured},
            f"notebooks/01_workspace_buffer_layouts.ipynb with DEVICE={DEVICE!r}, RECORD_GPU=True",
        )
elif USE_RECORDED:
    rec = recorded.show_recorded(REC)  # the banner and the recording, or a line saying there is none
    if rec is not None:
        show_md(
            markdown_table(
                ("growth policy", f"measured peak growing {rec['small_bytes'] / MiB:.0f} → {rec['big_bytes'] / MiB:.0f} MiB"),
                [(k, f"{v / MiB:.0f} MiB") for k, v in rec["peak_bytes"].items()],
            )
        )
else:
    show_md("*No CUDA here and USE_RECORDED is off: the bookkeeping above stands.*")

# %% [markdown]
# ## 4 · The lock, and who asked
#
# **Question.** After warm-up and CUDA graph capture, vLLM calls `lock_workspace()`.
# What happens when something then asks for more than the buffer holds — and how do you
# find out *which* code asked?
#
# The manager walks the call stack to the first frame outside itself and puts
# `file:line:function` into the error, along with both sizes in MB (2**20 bytes, two
# decimals).
#
# **Predict, then run.** The next cell warms the buffer up to section 1's full-size decode layout,
# locks it, and asks for a `(4096, head_dim)` fp16 tensor. What required size does the error report?
# Which caller does it name — the manager, or our function? What happens to the workspace and to
# the event log?

# %%
lk = WorkspaceManager(device)
lk.get_simultaneous(*real)  # warm-up: the buffer grows to what the decode kernel needs
lk.lock()


def my_long_context_kernel(n_tokens: int):
    """A stand-in consumer whose scratch grows with the context length."""
    return lk.get_simultaneous(((n_tokens, cfg.head_dim), torch.float16))


size_before, events_before = lk.size_bytes(), len(lk.events)
ptr_before = lk.buffer().data_ptr() if HAS_POINTERS else None
contents_before = lk.buffer().clone() if device != "meta" else None

my_long_context_kernel(8)  # fits: served from the existing buffer, nothing recorded
try:
    my_long_context_kernel(4096)
except WorkspaceLockedError as exc:
    err = exc
    show_error(err, "WorkspaceLockedError (an AssertionError, as vLLM raises)")
else:
    raise AssertionError("a locked workspace accepted a larger request")

show_md(
    markdown_table(
        ("attribute", "value"),
        [
            ("caller", f"`{err.caller}`"),
            ("required_bytes", f"{err.required_bytes:,} ({format_mb(err.required_bytes)} MiB)"),
            ("current_bytes", f"{err.current_bytes:,} ({format_mb(err.current_bytes)} MiB)"),
            ("ubatch slot", err.ubatch),
        ],
    )
)

# %% [markdown]
# The caller reads `file:line:function`, as vLLM formats `turboquant_attn.py:757:_continuation_prefill`;
# in Jupyter the file part is IPython's name for the cell's code (a number such as `312956335.py`,
# the file the kernel compiled this cell into), and the line counts from the top of the cell.
# The next cell checks the answer.
# %%
assert isinstance(err, AssertionError)
_code = my_long_context_kernel.__code__
assert err.caller == f"{os.path.basename(_code.co_filename)}:{_code.co_firstlineno + 2}:my_long_context_kernel"
assert err.required_bytes == round_up(4096 * cfg.head_dim * torch.float16.itemsize, ALIGNMENT)
assert err.current_bytes == size_before
assert err.caller.endswith(":my_long_context_kernel")
assert f"requires {format_mb(err.required_bytes)} MB, current size is {format_mb(size_before)} MB" in str(err)
assert lk.is_locked() and lk.size_bytes() == size_before
assert len(lk.events) == events_before + 1 and lk.events[-1].kind == "violation"
if HAS_POINTERS:
    assert lk.buffer().data_ptr() == ptr_before
if contents_before is not None:
    assert torch.equal(lk.buffer(), contents_before)
print("lock checks passed")

# %% [markdown]
# <details><summary>Answer</summary>
#
# The required size is the request's bytes rounded up to
# `ALIGNMENT`; the caller is our function (its file, the line of its `return`), not the
# manager; the workspace is untouched and the violation is in the event log.
#
# </details>

# %% [markdown]
# **A workspace locked before anyone asked.** If a start-up path locks before any
# consumer ran, the buffer is empty and the very first decode fails: the message then
# reports a current size of zero. Predict the required size of the first decode request
# below (one sequence of a wide model with a large head_dim) from section 1's rule, then run.

# %%
empty = WorkspaceManager(device)
empty.lock()
first_decode = decode_workspace_shapes(1, 24, 256, 32, torch.bfloat16)
try:
    empty.get_simultaneous(*first_decode)
except WorkspaceLockedError as exc:
    show_error(exc)
    assert exc.current_bytes == 0
    assert exc.required_bytes == compute_layout(first_decode).total_bytes
    print(f"needed {exc.required_bytes:,} bytes = {format_mb(exc.required_bytes)} MiB")
else:
    raise AssertionError("an empty locked workspace accepted a request")

# %% [markdown]
# ### Reserve the maximum first, then slice
#
# The sparse-attention indexer shows the healthy pattern: during profiling it asks once
# for *all* its buffers at their largest; afterwards each path asks for a subset and
# slices what it needs. After the lock nothing grows. This is exactly what the fix of
# notebook 03 does for TurboQuant.

# %%
ix = WorkspaceManager(device)
max_tokens, key_dim, topk_scratch = 64, 16, 512
ix.get_simultaneous(  # profiling: everything at once, at the maximum
    ((max_tokens, key_dim), torch.bfloat16), ((max_tokens, 4), torch.uint8), ((topk_scratch,), torch.uint8)
)
ix.lock()
n_locked_events = len(ix.events)
k_full, scale_full = ix.get_simultaneous(((max_tokens, key_dim), torch.bfloat16), ((max_tokens, 4), torch.uint8))
for chunk in (10, 37, 64):  # prefill chunks use the first rows
    k_chunk, s_chunk = k_full[:chunk], scale_full[:chunk]
(topk_ws,) = ix.get_simultaneous(((topk_scratch,), torch.uint8))  # the decode path
assert len(ix.events) == n_locked_events  # no growth, no violation after the lock
print(f"after the lock: {len(ix.events) - n_locked_events} workspace events; buffer stays {ix.size_bytes():,} bytes")

# %% [markdown]
# ## 5 · DBO: one buffer per ubatch slot, one slot per thread
#
# **Question.** With dual-batch overlap (DBO), two threads run two micro-batches at the
# same time. Do they trample each other's scratch?
#
# No: the manager keeps one buffer per ubatch slot, and each thread works in its own slot
# (vLLM maps thread ids to slots; `tqlab` uses a context variable, `ubatch_context(i)`).
#
# **Predict, then run.** Thread 0 asks for 4,096 bytes in slot 0 while thread 1 asks for 1,024 in
# slot 1. Which slot did each thread see, and how big did each slot grow? Which slot is the main
# thread in afterwards? Do the two buffers share memory?

# %%
dbo = WorkspaceManager(device, num_ubatches=2)
start = threading.Barrier(2)
seen = {}


def ubatch_worker(slot: int, nbytes: int) -> None:
    with ubatch_context(slot):
        start.wait()  # both threads ask at the same moment
        (v,) = dbo.get_simultaneous(((nbytes,), torch.uint8))
        seen[slot] = {"slot seen": current_ubatch_id(), "thread": threading.get_ident(),
                      "storage": v.untyped_storage().data_ptr() if HAS_POINTERS else None}


requests = {0: 4096, 1: 1024}
threads = [threading.Thread(target=ubatch_worker, args=(s, n)) for s, n in requests.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()

show_md(
    markdown_table(
        ("slot", "thread id", "slot the thread saw", "slot size after (bytes)"),
        [(s, seen[s]["thread"], seen[s]["slot seen"], dbo.size_bytes(s)) for s in sorted(seen)],
    )
)
ax = plots.plot_workspace_timeline(dbo.events, title="Two ubatch slots grow independently")
plt.show()
assert all(seen[s]["slot seen"] == s for s in requests)  # each thread in its own slot

# %%
assert all(seen[s]["slot seen"] == s for s in requests)
assert dbo.sizes_bytes() == [round_up(n, ALIGNMENT) for n in requests.values()]
assert current_ubatch_id() == 0
if HAS_POINTERS:
    assert seen[0]["storage"] != seen[1]["storage"]
print("DBO slot checks passed")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Each thread saw its own slot; each slot grew to its own request
# (rounded up); the main thread is still in slot 0; on real memory the two buffers differ.
#
# </details>

# %% [markdown]
# **The sibling-slot trap.** Warm up only slot 0, lock, and slot 1's first request fails —
# its buffer is still empty. The message prints both sizes with two decimals in MB, which
# can read the same for a small request; the exception's byte counts tell them apart.

# %%
sib = WorkspaceManager(device, num_ubatches=2)
sib.get_simultaneous(((4096,), torch.uint8))  # slot 0 only
sib.lock()
try:
    with ubatch_context(1):
        sib.get_simultaneous(((512,), torch.uint8))
except WorkspaceLockedError as exc:
    show_error(exc)
    print(f"bytes: required {exc.required_bytes}, current {exc.current_bytes} (slot {exc.ubatch})")
    assert exc.ubatch == 1 and exc.current_bytes == 0 and exc.required_bytes == round_up(512, ALIGNMENT)
else:
    raise AssertionError("slot 1 grew after the lock")

# %% [markdown]
# ## 5b · Lanes and persistent resources (vLLM 0.33)
#
# **Question.** vLLM 0.33's manager has two things older write-ups of it do not show
# (`vllm/v1/worker/workspace.py`): **lanes** — `WorkspaceManager(device, num_ubatches,
# num_lanes)` and `use_workspace_lane(lane)`, an independent owner inside each ubatch (lane 1
# is Model Runner V2's DSpark drafter) — and **persistent resources** — `get_persistent(key,
# shape, dtype, zero_init=...)` and `get_persistent_resource(key, factory)`, objects kept
# across calls (Marlin's locks keyed by CUDA stream, MoE permute scratch). Slots are keyed by
# (ubatch, lane) only. What does a drafter's lane see, and what happens to a key first asked
# for after the lock?
#
# **Predict, then run.** The target asks for 4,096 bytes in lane 0, the drafter for 1,024 in
# lane 1, and both ask for a persistent `locks` tensor. How big is each slot? Do the two lanes get
# the same `locks` tensor? After the lock, what happens to the existing key `locks`, and to a new
# key?

# %%
lanes = WorkspaceManager(device, num_ubatches=1, num_lanes=2)
lanes.get_simultaneous(((4096,), torch.uint8))  # the target model, lane 0
with use_workspace_lane(1):  # the drafter
    lanes.get_simultaneous(((1024,), torch.uint8))
    drafter_locks = lanes.get_persistent("locks", (16,), torch.int32, zero_init=True)
target_locks = lanes.get_persistent("locks", (16,), torch.int32, zero_init=True)
lanes.lock()
late = None
try:
    lanes.get_persistent("late_scratch", (8,), torch.float32)
except AssertionError as exc:  # vLLM's message, word for word
    late = str(exc)
    show_error(exc)
try:
    lanes.get_persistent("locks", (32,), torch.int32)  # same key, another shape
except ValueError as exc:
    show_error(exc)
print(f"slot sizes (ubatch 0 lane 0, ubatch 0 lane 1): {lanes.sizes_bytes()} bytes; "
      f"persistent keys per lane: {lanes.persistent_keys(0, 0)}, {lanes.persistent_keys(0, 1)}")
assert late is not None  # the new key was refused after the lock

# %% [markdown]
# <details><summary>Answer</summary>
#
# Two slots, each sized by its own lane's request (4,096 and 1,024 bytes); the two lanes hold
# different `locks` tensors; after the lock an existing key is still served (the same object) and
# a new key is refused with vLLM's "was not allocated during warmup" message. The next cell checks it.
#
# </details>

# %%
assert lanes.sizes_bytes() == [4096, 1024]
assert drafter_locks is not target_locks
assert lanes.get_persistent("locks", (16,), torch.int32, zero_init=True) is target_locks
assert late == ("Workspace is locked but (<class 'torch.Tensor'>, 'late_scratch') was not allocated during "
                "warmup for the current ubatch and lane.")
print("lane and persistent-resource checks passed")

# %% [markdown]
# ## 5c · The retained tail (vLLM 0.34)
#
# **Question.** Every `get_simultaneous` call carves its views from offset 0, so the next call
# overwrites them (section 2). That is what scratch is for — but some scratch is expensive to fill and
# would be the same for the next layer. vLLM 0.34's DeepSeek-V4.1 mega-attention
# (`DeepseekV4MegaAttnAttention._forward_prefill_mega`, `vllm/models/deepseek_v41/nvidia/flash_mla_mega_attn.py`)
# dequantizes and gathers one prefill chunk's compressed KV columns, and every attention layer of the same
# forward pass that reads the same compressed cache needs exactly those columns. Gathering them once per
# forward instead of once per layer needs a place in the workspace that the layers' own scratch leaves
# alone, and a way to know whether it still holds the columns.
#
# vLLM 0.34 adds it to the manager (`WorkspaceManager.get_retained`, `vllm/v1/worker/workspace.py`; vLLM 0.33
# has no such method): `get_retained(key, shape, dtype) -> (view, intact)`.
#
# * The view sits at the **tail** of the slot's buffer: it spans `nbytes = prod(shape) × itemsize` bytes from
#   `start = round_down(size − nbytes, 256)`, after growing the buffer to at least `nbytes` (unlocked only,
#   as any growth). Requests carved from offset 0 that stay below `start` never touch it.
# * `intact` is True when the previous `get_retained` of this (ubatch, lane) slot had the same `key` and the
#   same `start`, and the span has not been lost since; only the latest key is remembered.
# * The span is **lost** when another key's `get_retained` takes it over, when a `get_simultaneous` call's
#   256-rounded total reaches past `start`, and when the buffer is reallocated (growth).
#
# What the bytes mean is the caller's to track: DeepSeek's layer re-gathers when `intact` is False (or when
# it is the layer that just wrote new rows), and reuses the columns otherwise. The manager below is built for
# vLLM 0.34 (`WorkspaceManager(device, vllm_version="0.34")`; this notebook shows 0.33 everywhere else).
#
# **Predict, then run.** The slot holds 64 KiB from an earlier scratch request. A layer asks
# `get_retained("kv", (1024,), float32)` (4 KiB) and fills it. Then, in order: a layer's 8 KiB scratch, the
# same `get_retained` again; a 62 KiB scratch, `get_retained` again; another key `"idx"` of the same size,
# then `"kv"` again; `"kv"` for 4,000 bytes (`(1000,)` float32) right after a 4 KiB `"kv"`; a 128 KiB
# scratch, then `"kv"`. At which byte does the span start, and which of the `get_retained` calls return
# `intact = True`? Do the filled values survive exactly when `intact` says so? And what does a vLLM 0.33
# manager say to `get_retained`?

# %%
KIB = 1024
tail = WorkspaceManager(device, vllm_version="0.34")
tail.get_simultaneous(((64 * KIB,), torch.uint8))  # earlier scratch: the slot holds 64 KiB
FILL = 7.0
steps = [  # (what runs, ("scratch", nbytes) or ("retained", key, number of float32 elements))
    ("a layer's 8 KiB scratch", ("scratch", 8 * KIB)),
    ("get_retained('kv', 4 KiB) again", ("retained", "kv", 1024)),
    ("a 62 KiB scratch reaches into the tail", ("scratch", 62 * KIB)),
    ("get_retained('kv', 4 KiB) again", ("retained", "kv", 1024)),
    ("another key takes the span", ("retained", "idx", 1024)),
    ("get_retained('kv', 4 KiB) again", ("retained", "kv", 1024)),
    ("get_retained('kv', 4 KiB) again", ("retained", "kv", 1024)),
    ("get_retained('kv', 4,000 bytes)", ("retained", "kv", 1000)),
    ("a 128 KiB scratch: the buffer is reallocated", ("scratch", 128 * KIB)),
    ("get_retained('kv', 4 KiB) again", ("retained", "kv", 1024)),
]
view, intact = tail.get_retained("kv", (1024,), torch.float32)
view.fill_(FILL)  # the layer gathers its columns into the span
tail_rows = [("get_retained('kv', 4 KiB), then filled", tail.size_bytes(), tail.retained_span()[1], intact, "—")]
for what, call in steps:
    if call[0] == "scratch":
        for v in tail.get_simultaneous(((call[1],), torch.uint8)):
            v.zero_()  # the layer writes its scratch
        tail_rows.append((what, tail.size_bytes(), "—", "—", "span kept" if tail.retained_span() else "span lost"))
        continue
    view, intact = tail.get_retained(call[1], (call[2],), torch.float32)
    survived = device == "meta" or bool((view == FILL).all())  # meta tensors hold no values
    tail_rows.append((what, tail.size_bytes(), tail.retained_span()[1], intact,
                      "still filled" if survived else "overwritten"))
    if intact and not survived:
        raise AssertionError(f"{what}: intact but the values are gone")
    view.fill_(FILL)  # a layer that finds it not intact gathers again
show_md(markdown_table(("call", "buffer (bytes)", "span starts at byte", "intact", "the tail's values"),
                       [(r[0], f"{r[1]:,}", r[2] if r[2] == "—" else f"{r[2]:,}", *r[3:]) for r in tail_rows]))
old = WorkspaceManager(device, vllm_version="0.33")
print(f"vLLM 0.33's manager has get_retained: {hasattr(old, 'get_retained')}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# The span starts at 64 KiB − 4 KiB = 61,440: the last 4 KiB of the buffer. The first call is never intact
# (nothing was retained). The 8 KiB scratch ends far below 61,440, so the next `"kv"` call is intact and the
# values are still there. The 62 KiB scratch reaches past 61,440: the span is lost and the next call says
# `intact = False`. `"idx"` takes the span over, so `"kv"` afterwards is not intact either, although nobody
# wrote to it; the `"kv"` call after that is. The 4,000-byte `"kv"` call starts at
# round_down(65,536 − 4,000, 256) = 61,440, the same start as the 4 KiB span, and vLLM's code compares
# `(key, start)`, not the size: it counts as **intact** (its docstring says "the same key and size"; tqlab
# follows the code). The 128 KiB scratch reallocates the buffer: the span is lost, and the next `"kv"` starts
# at the end of the new buffer, not intact. Each time `intact` is True the values survived. vLLM 0.33's manager
# has no `get_retained` at all.
#
# </details>

# %%
intacts = [r[3] for r in tail_rows if r[3] != "—"]
assert intacts == [False, True, False, False, False, True, True, False]
assert tail_rows[0][2] == 64 * KIB - 4 * KIB and tail_rows[-1][2] == 128 * KIB - 4 * KIB
assert [r[4] for r in tail_rows if r[2] == "—"] == ["span kept", "span lost", "span lost"]
assert not hasattr(old, "get_retained")
try:
    old.get_retained("kv", (4,), torch.float32)
except AttributeError as exc:
    print(f"vLLM 0.33 mode: {exc}")
tail.lock()
try:  # locked: a retained view larger than the buffer is refused like any growth, naming the caller
    tail.get_retained("big", (256 * KIB,), torch.uint8)
except WorkspaceLockedError as exc:
    show_error(exc)
assert tail.retained_span() == ("kv", 128 * KIB - 4 * KIB)  # the refusal left the span as it was
print("retained-tail checks passed")

# %% [markdown]
# ## 6 · The debug log
#
# vLLM prints every resize, lock and unlock when `VLLM_DEBUG_WORKSPACE=1`. `tqlab` does
# the same with `TQLAB_DEBUG_WORKSPACE=1` (and logs violations too). `debug_workspace_log()`
# turns it on for a block and collects the lines.
#
# **Predict, then run.** Inside the block: slot 0 and slot 1 each grow to the decode layout, the
# manager locks, a 1 MiB request is refused, the manager unlocks; after the block, the 1 MiB request
# is repeated. How many log lines does the block collect, and for which events? Is a line collected
# for the resize after the block? What is `TQLAB_DEBUG_WORKSPACE` afterwards?

# %%
dbg = WorkspaceManager(device, num_ubatches=2)
env_before = os.environ.get("TQLAB_DEBUG_WORKSPACE")  # yours, if you started Jupyter with it set
with debug_workspace_log() as log_lines:
    dbg.get_simultaneous(*real)
    with ubatch_context(1):
        dbg.get_simultaneous(*real)
    dbg.lock()
    try:
        dbg.get_simultaneous(((MiB,), torch.uint8))
    except WorkspaceLockedError:
        pass
    dbg.unlock()
_ = dbg.get_simultaneous(((MiB,), torch.uint8))  # outside the block: not collected
print("\n".join(log_lines))

# %%
kinds_inside = [e.kind for e in dbg.events[:-1]]
assert len(log_lines) == len(kinds_inside) == 5
assert all(line.startswith("[WORKSPACE DEBUG]") for line in log_lines)
assert "Resized workspace" in log_lines[0] and "Resized workspace" in log_lines[1]
assert "Workspace locked" in log_lines[2] and "violation" in log_lines[3] and "Workspace unlocked" in log_lines[4]
assert os.environ.get("TQLAB_DEBUG_WORKSPACE") == env_before
print(f"{len(log_lines)} log lines for events {kinds_inside}; the later resize was not collected; "
      f"TQLAB_DEBUG_WORKSPACE is back to {env_before!r}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# One line per event inside the block (resize, resize, lock,
# violation, unlock), none collected for the resize after it, and the variable is back to
# what it was before the block (unset, unless you ran Jupyter with `TQLAB_DEBUG_WORKSPACE=1`).
#
# </details>

# %% [markdown]
# ## 7 · The lifecycle: init → warm-up → lock → serve → re-warm
#
# **Question.** How do the pieces fit together in an engine's life?
#
# 1. **init** — `init_workspace_manager(device, num_ubatches)`: slots exist, empty.
# 2. **warm-up / capture** — every consumer runs once; decode buckets go largest first,
#    so the buffer grows once, to the largest decode batch.
# 3. **lock** — `lock_workspace()`: sizes and addresses are frozen (CUDA graphs recorded them).
# 4. **serve** — every call fits, nothing is allocated, addresses never change... until a
#    request asks for more than warm-up ever did: a violation (the bug of notebook 02).
# 5. **re-warm** — elastic EP scaling unlocks, warms up again and re-locks (vLLM 0.33:
#    `vllm/distributed/elastic_ep/elastic_execute.py`, `warm_and_capture`). It first drops the captured
#    CUDA graphs (a growth would leave them pointing at the freed buffer), and runs the warm-up inside
#    `GPUModelRunner.preserve_serving_state`, which saves the live requests' block tables, clears them for
#    the dummy runs and copies them back afterwards. `rewarm_workspace()` re-locks even when the warm-up raises.
#
# We drive the module-level helpers with vLLM's names, using the per-rank shapes of the
# bug report's deployment.
#
# **Predict, then run.** How many times does warm-up grow the buffer, and to which layout? Does
# serving move the addresses? After the re-warm, is the buffer locked, and big enough for the long
# chunk? And if the warm-up raises, is the workspace left unlocked?

# %%
reset_workspace_manager()
phase_marks = []
ws = init_workspace_manager(device, num_ubatches=1)
phase_marks.append(("init", len(ws.events)))

for batch in sorted(decode_capture_rows(cfg), reverse=True):  # warm-up + capture, largest first
    current_workspace_manager().get_simultaneous(
        *decode_workspace_shapes(batch, cfg.num_heads_per_rank, cfg.head_dim, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype)
    )
phase_marks.append(("warm-up + capture", len(ws.events)))

lock_workspace()
phase_marks.append(("lock", len(ws.events)))
ptrs_at_lock = ws.data_ptrs()

for batch in (1, 3, cfg.max_num_seqs, 2):  # decode steps: every call fits
    current_workspace_manager().get_simultaneous(
        *decode_workspace_shapes(batch, cfg.num_heads_per_rank, cfg.head_dim, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype)
    )
assert ws.data_ptrs() == ptrs_at_lock  # the addresses CUDA graphs recorded are still right
long_chunk = continuation_workspace_shapes(cfg.max_num_batched_tokens, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)
try:  # a long prompt's continuation-prefill chunk
    current_workspace_manager().get_simultaneous(*long_chunk)
except WorkspaceLockedError as exc:
    serve_error = exc
phase_marks.append(("serve", len(ws.events)))

with rewarm_workspace():  # elastic-EP style: unlock, warm up again (now with the reservation), re-lock
    for call in reservation_plan(cfg):
        current_workspace_manager().get_simultaneous(*call)
phase_marks.append(("re-warm", len(ws.events)))

ax = plots.plot_workspace_timeline(ws.events, phase_marks, title="One workspace's life, from its event log")
plt.show()
show_error(serve_error, "The violation while serving (caught)")

# %%
resizes_in_warmup = [e for e in ws.events[: phase_marks[1][1]] if e.kind == "resize"]
assert len(resizes_in_warmup) == 1 and resizes_in_warmup[0].new_bytes == real_lay.total_bytes
assert ws.is_locked()
current_workspace_manager().get_simultaneous(*long_chunk)  # fits now

try:
    with rewarm_workspace():
        raise RuntimeError("warm-up failed half-way")
except RuntimeError:
    pass
assert ws.is_locked()  # re-locked anyway

reset_workspace_manager()
assert not is_workspace_manager_initialized()
print("lifecycle checks passed; the manager is reset")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Warm-up grew the buffer once (largest bucket first) to the decode
# layout of section 1; serving kept the addresses; the re-warm left it locked and big
# enough for the long chunk. And `rewarm_workspace()` re-locks even if the warm-up raises.
#
# </details>

# %% [markdown]
# ## What to take to notebook 02
#
# * One buffer per slot, views at `ALIGNMENT`-byte offsets from 0, overwritten by the next call.
# * Growth happens only while unlocked; the lock turns growth into an error that names the caller.
# * Warm-up decides the locked size. Anything warm-up never asked for fails after the lock.

# %% [markdown]
# ## Exercises
#
# Five small functions that restate this notebook's rules; the answer to each is the package's own code.
# Each exercise is a function to fill in: replace `raise NotImplementedError` with your code and run
# the cell. `check` runs your function beside a reference on several cases and says which differ
# (until then it says "not attempted yet"). Everything runs on a CPU. The solutions are folded under
# **Solution**; the references live in `tqlab/lab/solutions/nb01.py`.

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb01 as solutions

# %% [markdown]
# ### Exercise 1 · Offsets of one call
#
# Given the `(shape, dtype)` pairs of one `get_simultaneous` call, return the byte offset where each view
# starts (section 1's rule: each size rounded up to `ALIGNMENT` = 256, summed over the views before it).
# Use only `math.prod`, `dtype.itemsize` and `round_up`.

# %%
def view_offsets(shapes_and_dtypes):
    """[offset of view 0, offset of view 1, ...] in bytes."""
    raise NotImplementedError


check("view_offsets", view_offsets, solutions.view_offsets, [
    ([((2, 3, 4, 6), torch.float32), ((2, 3, 5), torch.bfloat16), ((2, 3), torch.float32)],),
    ([((1,), torch.uint8), ((256,), torch.uint8), ((257,), torch.uint8)],),
    ([((4, 32, 32, 129), torch.float32), ((4, 32, 128), torch.bfloat16), ((4, 32), torch.float32)],),
])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def view_offsets(shapes_and_dtypes):
#     offsets, at = [], 0
#     for shape, dtype in shapes_and_dtypes:
#         offsets.append(at)
#         at += round_up(math.prod(shape) * dtype.itemsize, ALIGNMENT)
#     return offsets
# ```
#
# </details>

# %% [markdown]
# ### Exercise 2 · Bytes a call needs
#
# Return the bytes the whole call needs: the sum of the rounded sizes. Check yourself on section 1's
# full-size decode layout (`real`), which notebook 02 meets again as vLLM's "0.26 MB".

# %%
def call_bytes(shapes_and_dtypes):
    """Total bytes of one get_simultaneous call, each view rounded up to ALIGNMENT."""
    raise NotImplementedError


check("call_bytes", call_bytes, solutions.call_bytes, [(real,), ([((5,), torch.float16)],), ([((1, 1, 8192, 128), torch.float16)] * 2,)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def call_bytes(shapes_and_dtypes):
#     return sum(round_up(math.prod(s) * d.itemsize, ALIGNMENT) for s, d in shapes_and_dtypes)
# ```
#
# </details>

# %% [markdown]
# ### Exercise 3 · The peak of a growth
#
# A slot holds `old_bytes`, then a request for `new_bytes` (> `old_bytes`) makes it grow. Return the peak
# workspace bytes during the growth under `policy`: `"free_then_allocate"` (vLLM) or
# `"allocate_then_free"` (what `resize_` does). Both sizes are rounded up to `ALIGNMENT` first (section 3).

# %%
def growth_peak(old_bytes, new_bytes, policy):
    """Peak bytes while one slot grows from old_bytes to new_bytes."""
    raise NotImplementedError


check("growth_peak", growth_peak, solutions.growth_peak, [(64 * MiB, 128 * MiB, "free_then_allocate"), (64 * MiB, 128 * MiB, "allocate_then_free"),
    (1000, 3000, "free_then_allocate"), (1000, 3000, "allocate_then_free")])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def growth_peak(old_bytes, new_bytes, policy):
#     old, new = round_up(old_bytes, ALIGNMENT), round_up(new_bytes, ALIGNMENT)
#     return new if policy == "free_then_allocate" else old + new
# ```
#
# </details>

# %% [markdown]
# ### Exercise 4 · Two ubatch slots
#
# With two ubatch slots, a list of `(slot, nbytes)` requests runs in order, one `uint8` view each. Return
# the two slot sizes afterwards (vLLM 0.33 grows only the slot that asks; section 5).

# %%
def dbo_slot_sizes(requests, num_ubatches=2):
    """[size of slot 0, size of slot 1] in bytes after the requests."""
    raise NotImplementedError


check("dbo_slot_sizes", dbo_slot_sizes, solutions.dbo_slot_sizes, [([(0, 4096), (1, 1024)],), ([(0, 100), (1, 1000), (0, 50)],), ([(1, 300)],)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def dbo_slot_sizes(requests, num_ubatches=2):
#     sizes = [0] * num_ubatches
#     for slot, nbytes in requests:
#         sizes[slot] = max(sizes[slot], round_up(nbytes, ALIGNMENT))
#     return sizes
# ```
#
# </details>

# %% [markdown]
# ### Exercise 5 · Is the retained tail intact?
#
# One slot of vLLM 0.34's manager first grows to `initial_bytes`. Then `calls` run in order: `("scratch",
# nbytes)` is a `get_simultaneous` of one uint8 view, `("retained", key, nbytes)` a `get_retained(key,
# (nbytes,), torch.uint8)`. Return the list of `intact` flags of the `get_retained` calls (section 5c's
# rules: the span's start, what reaches into it, what reallocates the buffer, which key it remembers).

# %%
def retained_flags(calls, initial_bytes):
    """[intact of the first get_retained, intact of the second, ...]."""
    raise NotImplementedError


check("retained_flags", retained_flags, solutions.retained_flags, [
    ([("retained", "kv", 4096), ("scratch", 8192), ("retained", "kv", 4096)], 65536),
    ([("retained", "kv", 4096), ("scratch", 63 * 1024), ("retained", "kv", 4096)], 65536),
    ([("retained", "a", 100), ("retained", "b", 100), ("retained", "a", 100), ("retained", "a", 100)], 1000),
    ([("retained", "kv", 1000), ("retained", "kv", 900), ("retained", "kv", 600)], 4096),
    ([("retained", "kv", 512), ("scratch", 5000), ("retained", "kv", 512)], 4096),
    ([("retained", "kv", 8192), ("retained", "kv", 8192)], 4096),
])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def retained_flags(calls, initial_bytes):
#     size, kept, flags = round_up(initial_bytes, ALIGNMENT), None, []
#     for call in calls:
#         if call[0] == "scratch":
#             need = round_up(call[1], ALIGNMENT)
#             if need > size:  # growth reallocates: the span is lost
#                 size, kept = need, None
#             elif kept is not None and need > kept[1]:  # reaches into the span
#                 kept = None
#         else:
#             _, key, nbytes = call
#             if nbytes > size:  # get_retained grows to exactly nbytes
#                 size, kept = nbytes, None
#             start = (size - nbytes) // ALIGNMENT * ALIGNMENT
#             flags.append(kept == (key, start))
#             kept = (key, start)
#     return flags
# ```
#
# </details>

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU on `{device}`.*")
