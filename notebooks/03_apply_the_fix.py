# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Apply the fix: reserve the worst case before the lock
#
# vLLM PR #44053 ("Reserve workspace before CUDA graph capture") fixes notebook 02's crash
# in a few lines: when the TurboQuant attention backend builds its metadata builder, its new
# `_reserve_workspace()` asks the workspace for the **largest** buffers its two consumers can
# ever need, before the profile run, before capture, before the lock. You will learn:
#
# 1. what the reservation asks for, call by call, and how it lays out in the buffer;
# 2. why it is sized from `max_model_len` — and why that is enough;
# 3. that the report's prompt now completes after the lock (live, on `DEVICE`), and so does a
#    `max_model_len` prompt (on `meta`, shapes only);
# 4. what it costs per preset, in MiB and as a share of the KV cache on one GPU;
# 5. one gap the reservation leaves, and the one-line change that closes it.
#
# **Hardware.** CPU (default). `DEVICE = "cuda"` runs the live prompt on a GPU; the
# `max_model_len` runs and the per-preset sweeps always use `meta`.
#
# **Run time.** Under a minute on a small CPU box; the live prompt is most of it. The last
# cell prints the measured time.

# %%
import platform
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

import torch

import tqlab

print(
    f"tqlab {tqlab.__version__} · torch {torch.__version__} · Python {platform.python_version()} · "
    f"CUDA available: {torch.cuda.is_available()}"
)

# %% tags=["parameters"]
DEVICE = "cpu"  # where the engine runs the report's prompt: "cpu", "cuda" or "meta"
USE_RECORDED = True  # no GPU-only cell in this notebook; kept for a uniform interface

# %%
import matplotlib.pyplot as plt

from tqlab import recorded, viz
from tqlab.attention import kv_cache_bytes_per_token
from tqlab.config import EngineConfig, list_presets, load_preset
from tqlab.engine import LLMEngine
from tqlab.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    plan_bytes,
    prompt_chunks,
    reservation_plan,
    reserve_workspace,
)
from tqlab.viz import markdown_table, show_md
from tqlab.workspace import MiB, WorkspaceLockedError, WorkspaceManager, compute_layout, format_mb

device = recorded.pick_device(DEVICE)
PRESET = "nemotron-3-super-120b-a12b"
cfg = EngineConfig.from_preset(PRESET)
PROMPT_TOKENS = load_preset(PRESET)["default_prompt_tokens"]
print(f"engine device: {device!r}; preset {PRESET}; prompt {PROMPT_TOKENS:,} tokens")

# %% [markdown]
# ## 1 · What the reservation asks for
#
# **Question.** `_reserve_workspace()` makes the same `get_simultaneous` calls the two
# consumers make while serving, but with their worst-case arguments. Which calls, and how
# many bytes?
#
# 1. **split-KV decode** at `max_num_seqs` rows (every request decoding at once);
# 2. **continuation-prefill dequant buffers** at `cached_len = max_model_len - 1`, rounded
#    up to the block size — only when chunked prefill is on and `max_num_batched_tokens`
#    exceeds `CONTINUATION_DECODE_THRESHOLD` (otherwise no chunk ever takes that path).
#
# `tqlab.reservation` computes both with the *same functions* the backend calls while
# serving: one formula per buffer, so the reservation cannot drift from its consumer.

# %%
plan = reservation_plan(cfg)
consumers = ["split-KV decode", "continuation-prefill dequant"]
view_names = [["mid_out", "output", "lse"], ["k_buf", "v_buf"]]
rows = []
for consumer, call in zip(consumers, plan):
    lay = compute_layout(call)
    views = ", ".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in call)
    rows.append((consumer, views, f"{lay.total_bytes:,}", format_mb(lay.total_bytes)))
show_md(markdown_table(("consumer", "views (shape dtype)", "bytes", "MB"), rows))
reserved = plan_bytes(plan)
show_md(
    f"The calls never run at the same time, and each starts at offset 0 of the same buffer, so the "
    f"workspace needs only the **largest** call: **{reserved:,} bytes = {format_mb(reserved)} MB** per "
    f"ubatch slot on one rank."
)
ax = viz.plot_byte_maps(
    [(f"call {i + 1}: {c}", compute_layout(call), names) for i, (c, call, names) in enumerate(zip(consumers, plan, view_names))],
    schematic=True,
    title="The reservation's two calls, in one buffer (schematic widths, true offsets)",
)
plt.show()

# %% [markdown]
# **Predict, then run.** The PR's own unit test (seed 000) expects these exact calls for its
# fake configuration, which is the preset `pr-44053-unit-test`. The cell checks our plan
# against the expected list copied from the test.

# %%
f32, f16 = torch.float32, torch.float16
PR_TEST_EXPECTS = [  # vLLM PR #44053, TestTurboQuantWorkspaceReservation
    (((16, 8, 4, 129), f32), ((16, 8, 128), f16), ((16, 8), f32)),
    (((1, 4, 8192, 128), f16), ((1, 4, 8192, 128), f16)),
]
assert reservation_plan(EngineConfig.from_preset("pr-44053-unit-test")) == PR_TEST_EXPECTS
assert reserved == max(compute_layout(call).total_bytes for call in plan)
print("the plan matches PR #44053's unit test")

# %% [markdown]
# ## 2 · Why `max_model_len`?
#
# **Question.** The continuation buffers grow with the number of tokens already cached.
# How large can that get?
#
# A request never holds more than `max_model_len` tokens, so a chunk can find at most
# `max_model_len - 1` tokens cached before it. Sizing the buffers for that length covers
# every chunk of every prompt the server accepts — whatever the prompt, chunk size or
# scheduling. Anything smaller is a guess about traffic, which is how vLLM 0.20 failed: it
# sized from what the profile run happened to do.

# %%
step = cfg.block_size * 64
lengths = list(range(0, cfg.max_model_len, step)) + [cfg.max_model_len - 1]
needs = [compute_layout(continuation_workspace_shapes(n, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)).total_bytes
         for n in lengths]
locked_no_fix = compute_layout(plan[0]).total_bytes  # what capture locked in notebook 02: decode only
cached_8k, q_8k = prompt_chunks(PROMPT_TOKENS, cfg.max_num_batched_tokens)[-1]
need_8k = chunk_workspace_request(cfg, cached_8k, q_8k).nbytes
ax = viz.plot_need_curve(
    lengths,
    needs,
    levels=[("locked without the fix", locked_no_fix), ("reserved by the fix", reserved)],
    points=[(f"the {PROMPT_TOKENS:,}-token prompt's last chunk", cached_8k, need_8k)],
    label="continuation dequant buffers",
    title=f"{PRESET}, one rank: continuation buffers vs cached length",
)
plt.show()

# %% [markdown]
# **Predict, then run.** Every cached length the server can meet — each block-aligned value
# below `max_model_len`, and the last one — needs at most the reservation; and the
# reservation is exactly the need at `max_model_len - 1`.

# %%
every_len = range(0, cfg.max_model_len, cfg.block_size)
worst = max(
    compute_layout(continuation_workspace_shapes(n, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)).total_bytes
    for n in every_len
)
assert worst <= reserved == needs[-1]
assert need_8k <= reserved
show_md(
    f"Checked {len(every_len):,} cached lengths: the largest need is {format_mb(worst)} MB ≤ reserved "
    f"{format_mb(reserved)} MB. The report's chunk needs {format_mb(need_8k)} MB, "
    f"{reserved / need_8k:.0f}× below the reservation."
)

# %% [markdown]
# ## 3 · The report's prompt, after the lock
#
# **Question.** Notebook 02 crashed on this prompt. With the reservation, what happens?
#
# Same preset, same start-up, `fix=True`. The workspace now grows while the metadata
# builder is built — before the profile run — and capture finds it already big enough.

# %%
marker = viz.PhaseMarker(echo=True)
t = time.perf_counter()
engine = LLMEngine(cfg, fix=True, device=device, on_phase=marker)
print(f"start-up took {time.perf_counter() - t:.1f} s on {device}")
show_md(viz.phases_markdown(engine.phases))

# %%
events_at_lock = len(engine.workspace.events)
t = time.perf_counter()
out = engine.generate(PROMPT_TOKENS, max_tokens=1)
marker.mark("serve", engine.workspace)
show_md(
    f"Request finished: **{out.finished}** — {out.prompt_len:,} prompt tokens, output token ids "
    f"{out.output_token_ids}, in {time.perf_counter() - t:.1f} s on `{device}`."
)
ax = viz.plot_workspace_timeline(engine.workspace.events, marker.marks,
                                 title=f"{PRESET}, one rank, with the fix: the workspace's life")
plt.show()

# %% [markdown]
# **Predict, then run.** The request finishes; after the lock there is no resize and no
# violation; the buffer is the one that was locked (same size, same address).

# %%
assert out.finished and engine.dead is None
assert len(engine.workspace.events) == events_at_lock  # nothing happened to the workspace while serving
assert engine.workspace.size_bytes() == engine.locked_bytes == reserved
by_phase = {p.name: p.workspace_bytes[0] for p in engine.phases}
assert by_phase["build_backend"] == reserved  # grown by _reserve_workspace(), before the profile run
assert by_phase["profile_run"] == by_phase["capture"] == reserved  # capture found it big enough
print(f"served after the lock; the workspace stayed at {format_mb(engine.locked_bytes)} MB")

# %% [markdown]
# ## 4 · A `max_model_len` prompt (on `meta`)
#
# **Question.** The reservation claims to cover the longest request the server accepts.
# Does it?
#
# A prompt of `max_model_len - 1` tokens (plus one generated token) is too much arithmetic
# for a CPU, but the `meta` device runs the very same engine code on shapes only: every
# chunk, every workspace request, no numbers.

# %%
longest = cfg.max_model_len - 1
meta_engine = LLMEngine(cfg, fix=True, device="meta")
meta_events = len(meta_engine.workspace.events)
t = time.perf_counter()
meta_out = meta_engine.generate(longest, max_tokens=1)
meta_s = time.perf_counter() - t
n_chunks = len(prompt_chunks(longest, cfg.max_num_batched_tokens))
show_md(f"{longest:,}-token prompt on `meta`: finished **{meta_out.finished}** after {n_chunks} chunks, in {meta_s:.1f} s.")

unfixed = LLMEngine(cfg, fix=False, device="meta")
try:
    unfixed.generate(longest, max_tokens=1)
except WorkspaceLockedError as exc:
    viz.show_error(exc, "The same prompt without the fix (caught)")
else:
    raise AssertionError("the unfixed engine served a max_model_len prompt")

# %% [markdown]
# **Predict, then run.** With the fix: served, no workspace event after the lock. Without
# it: refused at the first chunk that needs more than the decode scratch.

# %%
assert meta_out.finished and len(meta_engine.workspace.events) == meta_events
assert unfixed.dead is not None
print("max_model_len prompt: served with the fix, refused without it")

# %% [markdown]
# ## 5 · What it costs, per preset
#
# **Question.** The reservation holds worst-case memory for the server's whole life. How
# much is that, next to the KV cache it serves?
#
# Per rank (one GPU) and per ubatch slot: the reservation is the larger of the two calls.
# For the denominator we use **the KV cache one rank needs to hold `max_num_seqs` requests
# of `max_model_len` tokens** in the configured cache format:
# `kv_cache_bytes_per_token(config) × max_model_len × max_num_seqs`, where
# `kv_cache_bytes_per_token` counts every attention layer on the rank (TurboQuant formats
# are packed, `auto` is the model dtype). This is the same denominator `tqlab plan` prints.

# %%
cost = []
for name in list_presets():
    c = EngineConfig.from_preset(name)
    res = plan_bytes(reservation_plan(c)) * c.num_ubatches
    decode_only = compute_layout(reservation_plan(c)[0]).total_bytes * c.num_ubatches
    kv = kv_cache_bytes_per_token(c) * c.max_model_len * c.max_num_seqs
    kv_model_dtype = c.kv_bytes_per_token_per_rank() * c.max_model_len * c.max_num_seqs
    cost.append(dict(name=name, cfg=c, res=res, decode_only=decode_only, kv=kv, kv_model_dtype=kv_model_dtype))
show_md(
    markdown_table(
        ("preset", "cache", "TP", "reserved / rank (MiB)", "added by the fix (MiB)", "KV cache / rank (MiB)",
         "share of KV cache", "share of a model-dtype KV cache"),
        [
            (x["name"], x["cfg"].kv_cache_dtype, x["cfg"].tensor_parallel_size, f"{x['res'] / MiB:,.2f}",
             f"{(x['res'] - x['decode_only']) / MiB:,.2f}", f"{x['kv'] / MiB:,.0f}",
             f"{100 * x['res'] / x['kv']:.3f} %", f"{100 * x['res'] / x['kv_model_dtype']:.3f} %")
            for x in cost
        ],
    )
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 3.6))
viz.plot_bars([x["name"] for x in cost], [x["res"] / MiB for x in cost], ax=ax1, horizontal=True, log=True,
              ylabel="reserved workspace per rank (MiB, log scale)", fmt="{:,.1f} MiB",
              title="Workspace reserved by the fix")
viz.plot_bars([x["name"] for x in cost], [100 * x["res"] / x["kv"] for x in cost], ax=ax2, horizontal=True,
              ylabel="% of the rank's KV cache (max_num_seqs × max_model_len)", fmt="{:.2f} %",
              title="…as a share of the KV cache")
ax2.set_yticklabels([])
fig.tight_layout()
plt.show()

# %% [markdown]
# The whole deployment pays this on every rank (× `tensor_parallel_size`), and with DBO
# on every ubatch slot: the reservation sizes each slot, since a slot that warm-up never
# touched fails on its first request after the lock (notebook 01, section 5).
#
# **Predict, then run.** With DBO on, the reservation holds twice the bytes: two slots of
# the same size.

# %%
dbo_cfg = cfg.replace(enable_dbo=True)
m = WorkspaceManager("meta", num_ubatches=dbo_cfg.num_ubatches)
reserve_workspace(dbo_cfg, m)
assert m.sizes_bytes() == [reserved, reserved] and m.live_bytes() == 2 * reserved
show_md(
    f"{PRESET} with DBO: {m.num_ubatches} slots × {format_mb(reserved)} MB = {format_mb(m.live_bytes())} MB per rank; "
    f"× TP {cfg.tensor_parallel_size} = {format_mb(m.live_bytes() * cfg.tensor_parallel_size)} MB for the deployment."
)

# %% [markdown]
# ## 6 · The gap the reservation leaves
#
# **Question.** The reservation covers decode at `max_num_seqs` rows and the dequant buffers
# at `max_model_len`. Is that every request the backend can make?
#
# Not quite. A continuation chunk of at most `CONTINUATION_DECODE_THRESHOLD` new tokens
# does not dequantize: it runs the *decode kernel* with one row per new token. That can be
# more rows than `max_num_seqs`. Often the dequant reservation is large enough to cover
# those rows anyway; the cell finds the presets where it is not.

# %%
def worst_decode_kernel_bytes(c: EngineConfig) -> int:
    """Largest decode-kernel request of a short continuation chunk (threshold rows)."""
    return chunk_workspace_request(c, c.max_num_batched_tokens, CONTINUATION_DECODE_THRESHOLD).nbytes


gap_rows, gaps = [], []
for x in cost:
    c = x["cfg"]
    need = worst_decode_kernel_bytes(c)
    per_slot = x["res"] // c.num_ubatches
    # such a chunk exists only if a prompt can be longer than one chunk plus the threshold
    reachable = c.enable_chunked_prefill and c.max_num_batched_tokens + CONTINUATION_DECODE_THRESHOLD < c.max_model_len
    covered = "n/a (no such chunk)" if not reachable else ("**no**" if need > per_slot else "yes")
    gap_rows.append((x["name"], format_mb(per_slot), format_mb(need), covered))
    if reachable and need > per_slot:
        gaps.append(x["name"])
show_md(markdown_table(("preset", "reserved (MB)", f"{CONTINUATION_DECODE_THRESHOLD}-row decode kernel needs (MB)",
                        "covered?"), gap_rows))

# %% [markdown]
# **Predict, then run.** For each uncovered preset, a prompt of `max_num_batched_tokens`
# plus `CONTINUATION_DECODE_THRESHOLD` tokens crashes *even with the fix*: its second chunk
# is exactly a threshold-sized decode-kernel chunk. Reserving the decode rows for
# `max(max_num_seqs, CONTINUATION_DECODE_THRESHOLD)` (the engine's `decode_batch_reservation`
# option) closes it.
# (One layer and the largest capture bucket lock at the same size as the full engine, as
# notebook 02 checked; that keeps this fast.)

# %%
for name in gaps:
    c = EngineConfig.from_preset(name)
    quick = c.replace(num_hidden_layers=1, cudagraph_capture_sizes=(c.max_num_seqs,))
    prompt = c.max_num_batched_tokens + CONTINUATION_DECODE_THRESHOLD
    fixed = LLMEngine(quick, fix=True, device="meta")
    try:
        fixed.generate(prompt, max_tokens=1)
    except WorkspaceLockedError as exc:
        assert exc.caller.endswith(":_decode_attention")
        viz.show_error(exc, f"{name}, PR #44053's reservation, {prompt:,}-token prompt (caught)")
    else:
        raise AssertionError(f"{name}: expected the decode-kernel gap to crash")
    wider = LLMEngine(quick, fix=True, device="meta",
                      decode_batch_reservation=max(c.max_num_seqs, CONTINUATION_DECODE_THRESHOLD))
    assert wider.generate(prompt, max_tokens=1).finished
    show_md(f"**{name}** with decode rows reserved for {max(c.max_num_seqs, CONTINUATION_DECODE_THRESHOLD)}: "
            f"the {prompt:,}-token prompt is served; the workspace is {format_mb(wider.locked_bytes)} MB.")
if not gaps:
    show_md("*No preset has the gap.*")

# %% [markdown]
# ## Summary
#
# * The crash was a sizing problem: the lock froze what start-up happened to touch.
# * The fix sizes the workspace from the configuration — `max_num_seqs` and
#   `max_model_len` — through the consumers' own shape functions, before the lock; with it
#   the longest request the server accepts is served after the lock.
# * Its cost is fixed per rank and per slot, whatever the traffic:

# %%
lo, hi = min(cost, key=lambda x: x["res"] / x["kv"]), max(cost, key=lambda x: x["res"] / x["kv"])
show_md(
    f"Across the presets the reservation is {100 * lo['res'] / lo['kv']:.3f} % ({lo['name']}) to "
    f"{100 * hi['res'] / hi['kv']:.1f} % ({hi['name']}) of the KV cache a rank needs for `max_num_seqs` full-length "
    f"requests. Where the dequant buffers dominate, both scale with the KV heads per rank and `max_model_len`, "
    f"which cancel: what is left is fp16 buffers for *one* layer against a cache that holds *every* layer, packed, "
    f"for `max_num_seqs` requests. So the share is largest with few sequences and few attention layers — {PRESET} "
    f"({cfg.max_num_seqs} sequences, {cfg.num_hidden_layers} attention layers) reserves {format_mb(reserved)} MB "
    f"per rank next to a {next(x for x in cost if x['name'] == PRESET)['kv'] / MiB:,.0f} MiB KV cache."
)
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU (live prompt on `{device}`).*")
