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
# # 03 · Apply the fix: reserve the worst case before the lock
#
# vLLM PR #44053 ("Reserve workspace before CUDA graph capture") fixes notebook 02's crash
# in a few lines: when the TurboQuant attention backend builds its metadata builder, its new
# `_reserve_workspace()` asks the workspace for the **largest** buffers its two consumers can
# ever need — after the profile run, before capture, before the lock. In vLLM 0.33 the builder
# is first built inside `determine_available_memory`, when the CUDA-graph memory profiling sets up a
# minimal KV cache; section 3 draws the whole start-up. You will learn, section by section:
#
# 1. what the reservation asks for, call by call, and how it lays out in the buffer;
# 2. why it is sized from `max_model_len` — and why that is enough;
# 3. vLLM 0.33's start-up step by step, every consumer in it, and the report's prompt completing
#    after the lock (live, on `DEVICE`);
# 4. a `max_model_len` prompt served too (on `meta`, shapes only);
# 5. what it costs per preset, in MiB per rank (its share of a real KV pool is notebook 06 §2's topic);
# 6. what it does not need to cover (short continuation chunks make no workspace call in
#    vLLM 0.33), and the two deployments PR #44053 leaves exposed: chunked prefill off with
#    prefix caching, and DBO's second ubatch slot;
# 7. three start-ups side by side: eager, CUDA graphs without and with the fix;
# 8. speculative decoding: what the reservation covers;
# 9. the PR's own record, checked.
#
# Each **predict, then run** prompt stands before the cell that answers it; answers are folded
# under **Answer**. The [glossary](00_glossary.md) defines *slot*, *ubatch* and *continuation chunk*.
# Exercises checked by code close the notebook.
#
# **Hardware.** CPU (default). `DEVICE = "cuda"` runs the live prompt on a GPU; the
# `max_model_len` runs and the per-preset sweeps always use `meta`.
#
# **Run time.** Under a minute on a small CPU box; the live prompt is most of it (on CPU it
# runs a model with fewer layers: section 3 explains why that changes no workspace number).
# The last cell prints the measured time.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

import torch

from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # where the engine runs the report's prompt: "cpu", "cuda" or "meta"
check_device(DEVICE, ("cpu", "cuda", "meta"), "03")  # one clear line for any other DEVICE
USE_RECORDED = True  # show vLLM's own results from the recorded parity run (data/parity_results.json, under a banner)

# %%
import matplotlib.pyplot as plt

from tqlab import vllm as vt
from tqlab.predict import report as rp
from tqlab.lab import plots_startup
from tqlab.lab import plots_workspace as plots
from tqlab.lab import recorded
from tqlab.lab.display import markdown_table, show_error, show_md
from tqlab.core.config import EngineConfig, load_preset
from tqlab.lab.presets import refusal_summary, turboquant_presets
from tqlab.engine import LLMEngine
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    plan_bytes,
    reservation_plan,
    reserve_workspace,
)
from tqlab.predict import analysis
from tqlab.predict.analysis import first_failing_prompt, prefill_chunks
from tqlab.core.workspace import MiB, WorkspaceLockedError, WorkspaceManager, compute_layout, format_mb, ubatch_context

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
#    exceeds `CONTINUATION_DECODE_THRESHOLD`. That condition is the PR's; section 6 shows a
#    deployment where a continuation chunk happens without it.
#
# `tqlab.core.reservation` computes both with the *same functions* the backend calls while
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
show_md(markdown_table(("consumer", "views (shape dtype)", "bytes", "MiB"), rows))
reserved = plan_bytes(plan)
show_md(
    f"The calls never run at the same time, and each starts at offset 0 of the same buffer, so the "
    f"workspace needs only the **largest** call: **{reserved:,} bytes = {format_mb(reserved)} MiB** per "
    f"ubatch slot on one rank."
)
ax = plots.plot_byte_maps(
    [(f"call {i + 1}: {c}", compute_layout(call), names) for i, (c, call, names) in enumerate(zip(consumers, plan, view_names))],
    schematic=True,
    title="The reservation's two calls, in one buffer (schematic widths, true offsets)",
)
plt.show()

# %% [markdown]
# ### The PR's own unit test
#
# **Predict, then run.** The PR's own unit test (in vLLM PR #44053) builds the metadata builder for a fake
# configuration — the preset `pr-44053-unit-test`: 16 sequences, 8 query heads, 4 KV heads, `head_dim` 128,
# 4 KV splits, fp16, `max_model_len` 8,192, block size 32. Write down the shapes of the two calls it
# expects before running the cell, which prints our plan for that preset and checks it against the list
# copied from the test.

# %%
f32, f16 = torch.float32, torch.float16
unit_plan = reservation_plan(EngineConfig.from_preset("pr-44053-unit-test"))
show_md(markdown_table(("call", "views (shape dtype)"), [
    (i + 1, ", ".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in call)) for i, call in enumerate(unit_plan)]))
PR_TEST_EXPECTS = [  # vLLM PR #44053, TestTurboQuantWorkspaceReservation
    (((16, 8, 4, 129), f32), ((16, 8, 128), f16), ((16, 8), f32)),
    (((1, 4, 8192, 128), f16), ((1, 4, 8192, 128), f16)),
]
assert unit_plan == PR_TEST_EXPECTS
assert reserved == max(compute_layout(call).total_bytes for call in plan)
print("the plan matches PR #44053's unit test")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Decode: `(16, 8, 4, 129)` float32, `(16, 8, 128)` fp16, `(16, 8)` float32 — `max_num_seqs` rows, the query
# heads, the KV splits and `head_dim + 1`. Continuation: two fp16 `(1, 4, 8192, 128)` — one batch row, the KV
# heads, `max_model_len - 1` = 8,191 rounded up to the 32-token block, `head_dim`.
#
# </details>

# %% [markdown]
# ## 2 · Why `max_model_len`?
#
# **Question.** The continuation buffers grow with the number of tokens already cached.
# How large can that get?
#
# A request never holds more than `max_model_len` tokens, so a chunk can find at most
# `max_model_len - 1` tokens cached before it. Sizing the buffers for that length covers
# every chunk of every prompt the server accepts — whatever the prompt, chunk size or
# scheduling — provided the reservation makes this call at all (section 6). Anything
# smaller is a guess about traffic, which is how vLLM 0.20 failed: it sized from what the
# profile run happened to do.
#
# **Predict, then run.** The next figure draws the dequant buffers' size against the cached length. Is
# there a cached length the server can meet — any block-aligned value below `max_model_len`, or the last
# one — whose dequant call needs more than the reservation? At which cached length is the need exactly the
# reservation?

# %%
step = cfg.block_size * 64
lengths = list(range(0, cfg.max_model_len, step)) + [cfg.max_model_len - 1]
needs = [compute_layout(continuation_workspace_shapes(n, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)).total_bytes
         for n in lengths]
locked_no_fix = compute_layout(plan[0]).total_bytes  # what capture locked in notebook 02: decode only
cached_8k, q_8k = prefill_chunks(cfg, PROMPT_TOKENS)[-1]
need_8k = chunk_workspace_request(cfg, cached_8k, q_8k).nbytes
ax = plots.plot_need_curve(
    lengths,
    needs,
    levels=[("locked without the fix", locked_no_fix), ("reserved by the fix", reserved)],
    points=[(f"the {PROMPT_TOKENS:,}-token prompt's last chunk", cached_8k, need_8k)],
    label="continuation dequant buffers",
    title=f"{PRESET}, one rank: continuation buffers vs cached length",
)
plt.show()

# %%
every_len = range(0, cfg.max_model_len, cfg.block_size)
worst = max(
    compute_layout(continuation_workspace_shapes(n, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)).total_bytes
    for n in every_len
)
assert worst <= reserved == needs[-1]
assert need_8k <= reserved
show_md(
    f"Checked {len(every_len):,} cached lengths: the largest need is {format_mb(worst)} MiB ≤ reserved "
    f"{format_mb(reserved)} MiB. The report's chunk needs {format_mb(need_8k)} MiB, "
    f"{reserved / need_8k:.0f}× below the reservation."
)

# %% [markdown]
# <details><summary>Answer</summary>
#
# Every cached length the server can meet — each block-aligned value
# below `max_model_len`, and the last one — needs at most the reservation; and the
# reservation is exactly the need at `max_model_len - 1`.
#
# </details>

# %% [markdown]
# ## 3 · vLLM 0.33's start-up, and the report's prompt after the lock
#
# **Question.** Where in start-up does each workspace consumer ask, and where does the slot reach the
# size the lock freezes?
#
# vLLM 0.33's `EngineCore._initialize_kv_caches` (`vllm/v1/engine/core.py`) calls three worker methods
# (`vllm/v1/worker/gpu_worker.py`):
#
# 1. **`determine_available_memory`** runs the **profile run** (a dummy prefill: TurboQuant asks nothing,
#    a fused MoE asks its scratch), then — when CUDA graphs will be captured —
#    **`profile_cudagraph_memory`** (`gpu_model_runner.py`). That step first builds a *minimal KV cache*
#    (`_init_minimal_kv_cache_for_profiling` → `initialize_kv_cache` → `initialize_metadata_builders`):
#    this is where `TurboQuantMetadataBuilder._reserve_workspace` **first** runs. It then warms up and
#    captures the two largest graphs of each CUDA-graph mode, to measure their memory; the largest FULL
#    decode graph asks the decode scratch.
# 2. **`initialize_from_config`** builds the real KV cache and the metadata builders again
#    (`_reserve_workspace` again: same sizes, no growth).
# 3. **`compile_or_warm_up_model`** runs the kernel warm-ups, then `capture_model`, every size largest first,
#    which ends with `lock_workspace()`.
#
# tqlab's engine runs the same calls as six coarser phases (`build_backend` stands for both builder steps,
# `capture` for both capture steps); every later step asks at most what the first of its kind asked, so
# the sizes agree. `tqlab.lab.plots_startup.plot_startup_consumers` draws vLLM's finer order, every active
# consumer of the deployment as a row: the start-up figure of these notebooks (elsewhere they link here).
#
# **Predict, then run.** For the report's deployment, which step grows the slot without the fix, and which
# with it? Does the profile run ask anything? And on a MoE model (`qwen3-30b-a3b`), which consumer sets
# the slot before TurboQuant's reservation runs?

# %%
fig, axes = plt.subplots(3, 1, figsize=(13, 8.6), layout="constrained")
for ax, (c, fix) in zip(axes, ((cfg, False), (cfg, True), (EngineConfig.from_preset("qwen3-30b-a3b"), True))):
    plots_startup.plot_startup_consumers(c, fix, ax=ax)
plt.show()
steps = plots_startup.startup_steps(cfg)
show_md(markdown_table(("step", "vLLM 0.33 call", "tqlab engine phase"),
                       [(s.name.replace("\n", " "), f"`{s.vllm}`", s.engine_phase) for s in steps]))

# %% [markdown]
# <details><summary>Answer</summary>
#
# Without the fix nothing asks before the CUDA-graph profiling: the largest FULL decode graph, captured
# inside `determine_available_memory`, grows the slot to the decode scratch, and `capture_model` asks the
# same again. With the fix the slot grows one step earlier, when the minimal KV cache builds the metadata
# builder and `_reserve_workspace` asks for the continuation buffers at `max_model_len`; nothing after it
# grows. The profile run asks nothing of the report's deployment; on the MoE model the fused MoE's
# scratch, asked in the profile run, sets the slot first, and TurboQuant's reservation grows it a little
# further. The next cell checks these claims against the engine and the predictor.
#
# </details>

# %%
def grows_at(c: EngineConfig, fix: bool) -> list[str]:
    """The steps where slot 0 grows, in vLLM 0.33's order."""
    st = plots_startup.startup_steps(c)
    sizes = plots_startup.slot_after_steps(plots_startup.startup_requests(c, fix), st)
    return [s.name for s, before, after in zip(st, [0] + sizes, sizes) if after > before]


qwen = EngineConfig.from_preset("qwen3-30b-a3b")
assert grows_at(cfg, False) == ["cudagraph profiling:\n2 largest graphs/mode"]
assert grows_at(cfg, True) == ["cudagraph profiling:\nminimal KV cache"]
assert grows_at(qwen, True)[0] == "profile_run"
for c, fix in ((cfg, False), (cfg, True), (qwen, True), (qwen, False)):
    final = plots_startup.slot_after_steps(plots_startup.startup_requests(c, fix), plots_startup.startup_steps(c))[-1]
    assert final == analysis.locked_bytes(c, fix=fix) == LLMEngine(c, fix=fix, device="meta").locked_bytes
print("the step-by-step start-up locks what the engine and the predictor lock, with and without the fix")

# %% [markdown]
# ### The report's prompt, after the lock
#
# **Question.** Notebook 02 crashed on this prompt. With the reservation, what happens?
#
# The preset models the report's attention, not its AWQ MoE (notebook 02 §3 computes what that MoE would
# change on vLLM 0.33: a MoE asking its scratch in the profile run could hide the crash). The comparison
# below is therefore the attention's, with and without PR #44053.
#
# **Fewer layers on CPU.** Every attention layer makes the same workspace calls, one after
# the other, into the one shared buffer: the workspace numbers are *per layer call*, and the
# layer count changes only how much arithmetic a CPU does. So on CPU the engine below runs
# `CPU_LAYERS` attention layers instead of the model's. The next cell checks the claim
# first, on `meta`: with the fix the locked size is the same for both layer counts; without
# it the report's prompt is refused with the same bytes requested and the same size locked.

# %%
from tqlab.lab.report_gaps import moe_hidden_to_hold

assert cfg.moe is None  # the preset models no MoE: what follows is the attention's behaviour
show_md(f"`{PRESET}` has no MoE fields. On vLLM 0.33 the report's AWQ MoE, asking its output `(M, hidden)` in "
        f"the profile run, would hold the report's chunk from a hidden size of "
        f"{moe_hidden_to_hold(cfg, compute_layout(continuation_workspace_shapes(cached_8k, cfg.num_kv_heads_per_rank, cfg.head_dim, cfg.block_size)).total_bytes):,} "
        f"and every chunk from {moe_hidden_to_hold(cfg, reserved):,}: the crash shown here is the attention's.")

CPU_LAYERS = 2
run_cfg = EngineConfig.from_preset(PRESET, num_hidden_layers=CPU_LAYERS) if device == "cpu" else cfg


def workspace_numbers(c: EngineConfig) -> tuple[int, int, int]:
    """(locked bytes with the fix, locked bytes without it, bytes the refused chunk asks for), on meta."""
    unfixed = LLMEngine(c, fix=False, device="meta")
    try:
        unfixed.generate(PROMPT_TOKENS, max_tokens=1)
    except WorkspaceLockedError as exc:
        return LLMEngine(c, fix=True, device="meta").locked_bytes, exc.current_bytes, exc.required_bytes
    raise AssertionError(f"{c.num_hidden_layers} layers: the unfixed engine served the report's prompt")


per_layers = {n: workspace_numbers(cfg.replace(num_hidden_layers=n)) for n in (cfg.num_hidden_layers, CPU_LAYERS)}
assert per_layers[CPU_LAYERS] == per_layers[cfg.num_hidden_layers] and per_layers[CPU_LAYERS][0] == reserved
show_md(
    f"On `meta`, {cfg.num_hidden_layers} and {CPU_LAYERS} layers give the same numbers: locked with the fix "
    f"{format_mb(per_layers[CPU_LAYERS][0])} MiB; without it locked {format_mb(per_layers[CPU_LAYERS][1])} MiB and "
    f"the report's chunk asks {format_mb(per_layers[CPU_LAYERS][2])} MiB. The live engine runs "
    f"**{run_cfg.num_hidden_layers}** attention layers on `{device}`."
)

# %%
marker = plots.PhaseMarker(echo=True)
t = time.perf_counter()
engine = LLMEngine(run_cfg, fix=True, device=device, on_phase=marker)
print(f"start-up took {time.perf_counter() - t:.1f} s on {device}")
show_md(plots.phases_markdown(engine.phases))

# %% [markdown]
# #### Serving the prompt
#
# **Predict, then run.** Does the request finish? After the lock, does the workspace resize or
# refuse anything? Is the buffer still the one that was locked?

# %%
events_at_lock = len(engine.workspace.events)
t = time.perf_counter()
out = engine.generate(PROMPT_TOKENS, max_tokens=1)
marker.mark("serve", engine.workspace)
show_md(
    f"Request finished: **{out.finished}** — {out.prompt_len:,} prompt tokens, output token ids "
    f"{out.output_token_ids}, in {time.perf_counter() - t:.1f} s on `{device}`."
)
ax = plots.plot_workspace_timeline(engine.workspace.events, marker.marks,
                                 title=f"{PRESET}, one rank, with the fix: the workspace's life")
plt.show()

# %%
assert out.finished and engine.dead is None
assert len(engine.workspace.events) == events_at_lock  # nothing happened to the workspace while serving
assert engine.workspace.size_bytes() == engine.locked_bytes == reserved
by_phase = {p.name: p.workspace_bytes[0] for p in engine.phases}
phase_order = [p.name for p in engine.phases]
assert phase_order.index("profile_run") < phase_order.index("build_backend") < phase_order.index("capture")
assert by_phase["profile_run"] == 0  # the profile run asks nothing of the workspace (vLLM 0.33 too)
assert by_phase["build_backend"] == reserved  # grown by _reserve_workspace(), after the profile run
assert plots_startup.slot_after_steps(plots_startup.startup_requests(cfg, True), steps)[-1] == reserved
assert by_phase["capture"] == reserved  # capture found it big enough
print(f"served after the lock; the workspace stayed at {format_mb(engine.locked_bytes)} MiB")

# %% [markdown]
# <details><summary>Answer</summary>
#
# The request finishes; after the lock there is no resize and no
# violation; the buffer is the one that was locked (same size, same address).
#
# </details>

# %% [markdown]
# ## 4 · A `max_model_len` prompt (on `meta`)
#
# **Question.** The reservation claims to cover the longest request the server accepts.
# Does it?
#
# A prompt of `max_model_len - 1` tokens (plus one generated token) is too much arithmetic
# for a CPU, but the `meta` device runs the very same engine code on shapes only: every
# chunk, every workspace request, no numbers.
#
# **Predict, then run.** With the fix, is the `max_model_len` prompt served, and does anything
# happen to the workspace after the lock? Without it, where is it refused?

# %%
longest = cfg.max_model_len - 1
meta_engine = LLMEngine(cfg, fix=True, device="meta")
meta_events = len(meta_engine.workspace.events)
t = time.perf_counter()
meta_out = meta_engine.generate(longest, max_tokens=1)
meta_s = time.perf_counter() - t
n_chunks = len(prefill_chunks(cfg, longest))
show_md(f"{longest:,}-token prompt on `meta`: finished **{meta_out.finished}** after {n_chunks} chunks, in {meta_s:.1f} s.")

unfixed = LLMEngine(cfg, fix=False, device="meta")
try:
    unfixed.generate(longest, max_tokens=1)
except WorkspaceLockedError as exc:
    show_error(exc, "The same prompt without the fix (caught)")
else:
    raise AssertionError("the unfixed engine served a max_model_len prompt")

# %%
assert meta_out.finished and len(meta_engine.workspace.events) == meta_events
assert unfixed.dead is not None
print("max_model_len prompt: served with the fix, refused without it")

# %% [markdown]
# <details><summary>Answer</summary>
#
# With the fix: served, no workspace event after the lock. Without
# it: refused at the first chunk that needs more than the decode scratch.
#
# </details>

# %% [markdown]
# ## 5 · What it costs, per preset
#
# **Question.** The reservation holds worst-case memory for the server's whole life. How much is that,
# per rank, and how much of it does the fix add on top of the decode scratch capture would lock anyway?
#
# Per rank (one GPU) and per ubatch slot: the reservation is the larger of the two calls. Whether that is
# a lot depends on the KV pool a real GPU holds next to it (its memory × `--gpu-memory-utilization`, minus
# weights and activations) and on the layers vLLM keeps off TurboQuant: notebook 06 §2 is the home of
# that comparison.
#
# **Predict, then run.** Which preset reserves the most per rank, and for which is the fix's addition
# (reserved minus the decode scratch) zero?

# %%
cost = []
TQ_PRESETS, TQ_REFUSED = turboquant_presets()  # TurboQuant-only presets vLLM starts (notebook 10: the others)
for name, why in TQ_REFUSED.items():  # a preset vLLM's start-up validation refuses reserves nothing: it never starts
    print(f"{name}: not started by vLLM 0.33, so no reservation: {refusal_summary(why)}")
for name in TQ_PRESETS:
    c = EngineConfig.from_preset(name)
    res = plan_bytes(reservation_plan(c)) * c.num_ubatches
    decode_only = compute_layout(reservation_plan(c)[0]).total_bytes * c.num_ubatches
    cost.append(dict(name=name, cfg=c, res=res, decode_only=decode_only))
show_md(
    markdown_table(
        ("preset", "cache", "TP", "max_num_seqs", "max_model_len", "reserved / rank (MiB)", "added by the fix (MiB)"),
        [
            (x["name"], x["cfg"].kv_cache_dtype, x["cfg"].tensor_parallel_size, x["cfg"].max_num_seqs,
             f"{x['cfg'].max_model_len:,}", f"{x['res'] / MiB:,.2f}", f"{(x['res'] - x['decode_only']) / MiB:,.2f}")
            for x in cost
        ],
    )
)
ax = plots.plot_bars([x["name"] for x in cost], [x["res"] / MiB for x in cost], horizontal=True, log=False,
                     ylabel="reserved workspace per rank (MiB)", fmt="{:,.1f} MiB",
                     title="Workspace reserved by the fix, per rank and slot")
plt.show()

# %%
biggest = max(cost, key=lambda x: x["res"])
no_addition = [x["name"] for x in cost if x["res"] == x["decode_only"]]
for x in cost:
    assert x["res"] == max(x["decode_only"], plan_bytes(reservation_plan(x["cfg"])[1:]) * x["cfg"].num_ubatches)
print(f"largest reservation: {biggest['name']} ({format_mb(biggest['res'])} MiB per rank); "
      f"the fix adds nothing for: {', '.join(no_addition) or 'none'}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# The reservation is the larger of the decode scratch at `max_num_seqs` rows and the continuation buffers
# at `max_model_len`. Presets with many sequences and few KV heads per rank (large decode scratch, small
# continuation buffers) get nothing added by the fix: capture already locked more. The whole deployment pays
# the reservation on every rank (× `tensor_parallel_size`). With DBO, tqlab's reservation and vLLM 0.33's
# pay it once, for slot 0 only — the second limit in section 6.
#
# </details>

# %% [markdown]
# ## 6 · What the reservation covers, and what it leaves exposed
#
# **Question.** After the lock, is every workspace request the backend makes one of the
# reservation's two calls, or smaller?
#
# For every call the TurboQuant backend can make with chunked prefill on and without DBO,
# yes — short continuation chunks included, because they make no workspace call at all
# (6a). The parity suite, run against vLLM 0.33's own classes (`parity/README.md`), found
# two deployments that PR #44053 leaves exposed: chunked prefill off with prefix caching
# (6b), and DBO (6c). Everything here runs on `meta`.
#
# ### 6a · Short continuation chunks make no workspace call
#
# A continuation chunk of at most `CONTINUATION_DECODE_THRESHOLD` new tokens does not
# dequantize the cache. vLLM 0.33 sends it through the decode kernel, one query row per new
# token, and that kernel allocates its own scratch: the chunk asks the workspace for
# nothing, so the reservation does not need to cover it. tqlab's backend does the same
# with private `torch.empty` buffers. That has a visible consequence *without* the fix, for the
# length of the shortest prompt that crashes.
#
# **Predict, then run.** Where does `first_failing_prompt` put the first failure of the unfixed
# engine, in chunks and threshold? What happens to the prompt one token shorter — and which call
# refuses the failing one?

# %%
m, T = cfg.max_num_batched_tokens, CONTINUATION_DECODE_THRESHOLD
short_engine = LLMEngine(cfg, fix=False, device="meta")
first_bad = first_failing_prompt(cfg, short_engine.locked_bytes)
assert first_bad == m + T + 1
survivor = first_bad - 1
last_cached, last_q = prefill_chunks(cfg, survivor)[-1]
last_req = chunk_workspace_request(cfg, last_cached, last_q)
assert last_req.path == "decode_kernel" and last_req.shapes is None and last_req.nbytes == 0

events_before = len(short_engine.workspace.events)
short_out = short_engine.generate(survivor, max_tokens=1)
assert short_out.finished and short_engine.dead is None
assert len(short_engine.workspace.events) == events_before  # no workspace call after the lock
assert short_engine.backend.path_counts["decode_kernel"] == cfg.num_hidden_layers

bad_engine = LLMEngine(cfg, fix=False, device="meta")
try:
    bad_engine.generate(first_bad, max_tokens=1)
except WorkspaceLockedError as exc:
    assert exc.caller.endswith(":_continuation_prefill")
    bad_need = exc.required_bytes
else:
    raise AssertionError("the first failing prompt was served")
show_md(markdown_table(
    ("prompt (tokens)", "last chunk: cached + new", "path", "workspace events after the lock", "no fix"),
    [
        (f"{survivor:,}", f"{last_cached:,} + {last_q}", last_req.path, len(short_engine.workspace.events) - events_before,
         "served"),
        (f"{first_bad:,}", f"{last_cached:,} + {last_q + 1}", chunk_workspace_request(cfg, last_cached, last_q + 1).path,
         "refused",
         f"crash: asks {format_mb(bad_need)} MiB of {format_mb(bad_engine.locked_bytes)} MiB"),
    ],
))

# %% [markdown]
# <details><summary>Answer</summary>
#
# `first_failing_prompt` puts the first failure of the unfixed
# engine one token past one chunk plus the threshold. The prompt one token shorter is
# served without a single workspace event after the lock, its last chunk on the
# decode-kernel path (once per layer); the failing one is refused by the dequant call.
#
# </details>

# %% [markdown]
# ### 6b · First limit: chunked prefill off, prefix caching on
#
# PR #44053 makes the dequant-buffer call only when chunked prefill is on and
# `max_num_batched_tokens` exceeds the threshold. Without chunked prefill a prompt is
# prefilled in one step, usually with nothing cached. But a **prefix-cache hit** skips
# the blocks that are already cached, so the request's first chunk starts with
# `cached_len > 0`: a continuation chunk. With more than `CONTINUATION_DECODE_THRESHOLD`
# new tokens it dequantizes `cached_len` tokens into the workspace — a call the
# reservation never made. tqlab's `reservation_plan` mirrors the PR's condition, so tqlab's
# fixed engine is exposed the same way.
#
# Below: the report's attention shapes with chunked prefill off (vLLM then requires
# `max_num_batched_tokens >= max_model_len`). For the hybrid Nemotron itself vLLM 0.33 refuses
# that with prefix caching on ("Chunked prefill is required for Mamba prefix caching",
# `MambaModelConfig.verify_and_update_config`), so the cell treats the shapes as an
# attention-only model (`mamba_block_aligned_split=False`), where the case is real.
# `tqlab.predict.report` gives the longest request that fits the fixed workspace *under
# any chunking* — prefix-cache hits included.

# %%
nocp = cfg.replace(enable_chunked_prefill=False, max_num_batched_tokens=cfg.max_model_len,
                   mamba_block_aligned_split=False)
nocp_plan = reservation_plan(nocp)
pred = rp.consumer_report(nocp)
show_md(markdown_table(
    ("", "chunked prefill on (the report)", "chunked prefill off"),
    [
        ("reservation calls", len(plan), len(nocp_plan)),
        ("workspace at lock with the fix (MiB)", format_mb(reserved), format_mb(pred.locked_fixed)),
        ("longest request safe under any chunking, with the fix",
         f"{rp.consumer_report(cfg).fixed_safe_any_schedule:,}", f"{pred.fixed_safe_any_schedule:,}"),
        ("max_model_len", f"{cfg.max_model_len:,}", f"{nocp.max_model_len:,}"),
    ],
))
print("\n".join(f"predict: {n}" for n in pred.notes))

# %% [markdown]
# #### A prefix-cache hit after the lock
#
# With chunked prefill off the plan is the decode call alone, so the fixed workspace is the decode
# scratch. A prefix-cache hit covers whole blocks.
#
# **Predict, then run.** A request within the predicted bound whose cached part (whole blocks, from a
# prefix-cache hit) is followed by `CONTINUATION_DECODE_THRESHOLD + 1` new tokens: is it served by the
# *fixed* engine? And with one more cached block and the same new tokens?
#
# tqlab's scheduler has no prefix cache, so the cell hands the fixed engine's attention
# backend the chunk a hit produces (`cached_len` cached tokens, then the new ones), after
# the lock, exactly as the model runner would.

# %%
assert nocp_plan == plan[:1] and pred.locked_fixed == pred.locked_unfixed == locked_no_fix
assert rp.consumer_report(cfg).fixed_safe_any_schedule == cfg.max_model_len > pred.fixed_safe_any_schedule
hit_engine = LLMEngine(nocp.replace(num_hidden_layers=1), fix=True, device="meta")  # one layer: same calls
assert hit_engine.locked_bytes == pred.locked_fixed


def prefix_hit_chunk(cached_len: int, new_tokens: int):
    """Run one layer's attention for a chunk after a prefix-cache hit of ``cached_len`` tokens (meta)."""
    c, dev = hit_engine.config, torch.device("meta")
    q = torch.empty(new_tokens, c.num_heads_per_rank, c.head_dim, dtype=c.torch_dtype, device=dev)
    kv = torch.empty(new_tokens, c.num_kv_heads_per_rank, c.head_dim, dtype=c.torch_dtype, device=dev)
    block_row = torch.zeros(hit_engine.max_blocks_per_seq, dtype=torch.int32, device=dev)
    return hit_engine.backend.forward_prefill(q, kv, kv, hit_engine.runner.kv_caches[0], block_row, cached_len)


bs, new = nocp.block_size, T + 1
cached_ok = (pred.fixed_safe_any_schedule - new) // bs * bs
cached_bad = cached_ok + bs
assert cached_ok + new <= pred.fixed_safe_any_schedule < cached_bad + new
events_before = len(hit_engine.workspace.events)
prefix_hit_chunk(cached_ok, new)
assert len(hit_engine.workspace.events) == events_before  # fits: no growth, no violation
try:
    prefix_hit_chunk(cached_bad, new)
except WorkspaceLockedError as exc:
    refused = exc
else:
    raise AssertionError("a prefix-hit chunk past the predicted bound was served")
assert refused.caller.endswith(":_continuation_prefill") and refused.current_bytes == hit_engine.locked_bytes
show_md(markdown_table(
    ("prefix-cache hit (blocks)", "cached + new tokens", "dequant buffers (bytes)", "locked (bytes)", "with the fix"),
    [
        (cached_ok // bs, f"{cached_ok:,} + {new}", f"{chunk_workspace_request(nocp, cached_ok, new).nbytes:,}",
         f"{hit_engine.locked_bytes:,}", "served"),
        (cached_bad // bs, f"{cached_bad:,} + {new}", f"{refused.required_bytes:,}", f"{refused.current_bytes:,}",
         "**refused**"),
    ],
))

# %% [markdown]
# <details><summary>Answer</summary>
#
# The request whose cached part ends on the last whole block within the predicted bound is served: its
# dequant buffers fit the decode scratch the fixed workspace locked. One more cached block, with the same new
# tokens, asks for more than that and is refused **with the fix**, naming `_continuation_prefill`: with chunked
# prefill off the PR reserves no continuation buffers, and a prefix-cache hit still produces a continuation
# chunk.
#
# </details>

# %% [markdown]
# The report's own second chunk, produced by a prefix-cache hit instead of by chunking,
# is refused with the report's numbers — with the fix in place. The parity suite ran such a
# chunk through vLLM 0.33's own `_continuation_prefill`, with the fix, and recorded
# vLLM's error; the cell compares the two texts past the caller's name. (Notebook 07
# reruns it live where vLLM is installed.) This was shown with vLLM's classes on CPU; it
# has not been run end to end on a GPU.

# %%
try:
    prefix_hit_chunk(cached_8k, q_8k)
except WorkspaceLockedError as exc:
    report_hit = exc
    show_error(exc, f"tqlab, with the fix, chunked prefill off: {cached_8k:,} cached by a prefix hit + {q_8k:,} new (caught)")
else:
    raise AssertionError("the report's chunk after a prefix-cache hit was served")
tail = str(report_hit).split("' ", 1)[1]  # "requires … MB, current size is … MB. Workspace growth …"
if USE_RECORDED and recorded.has_recorded(vt.PARITY_RESULTS):
    parity_prov, parity = vt.load_parity_results()
    recorded.show_parity_banner(parity_prov)
    vllm_text = parity["test_fix_leaves_prefix_hits_uncovered_without_chunked_prefill:vllm"]
    show_md(f"vLLM 0.33, with the fix, chunked prefill off, prefix-hit chunk:\n\n`{vllm_text}`")
    assert "_continuation_prefill" in vllm_text and vllm_text.endswith(tail)
    print("tqlab's refusal and vLLM's recorded one ask for the same bytes of the same locked size")
else:
    show_md(f"*No recorded parity run (`data/{vt.PARITY_RESULTS}.json`); `make parity` makes one.*")

# %% [markdown]
# ### 6c · Second limit: DBO, where vLLM sizes one slot of two
#
# With dual-batch overlap the workspace has one buffer per ubatch slot (notebook 01,
# section 5). vLLM's `_reserve_workspace` runs in the metadata builder's constructor,
# outside any micro-batch, so its calls land in slot 0 alone; the parity suite recorded
# the slot sizes vLLM's own builder leaves. tqlab's `reserve_workspace` does the same (plain
# `get_simultaneous` calls in the caller's slot); sizing every slot takes one call per slot, each
# inside its micro-batch. A continuation chunk that runs in the second micro-batch after the
# lock then finds slot 1 at whatever *other* start-up work left there. That depends on the
# deployment (other workspace consumers, such as fused MoE, grow it too; `grep current_workspace_manager` over vLLM lists
# them), and the parity suite did not model it. In the report's deployment, start-up
# without the fix left only the decode scratch in slot 0 (notebook 02), below the report's
# chunk; the cell locks right after the reservation, the case where nothing else touched
# slot 1.
#
# **Predict, then run.** With DBO, what sizes do the two slots have after tqlab's reservation, after the
# builder's calls made in slot 0 (vLLM's way), and after a reservation made in every slot? After the lock,
# which of them serves the report's chunk in slot 1?

# %%
dbo_cfg = cfg.replace(enable_dbo=True)
ours = WorkspaceManager("meta", num_ubatches=dbo_cfg.num_ubatches)
reserve_workspace(dbo_cfg, ours)  # tqlab: the caller's slot (0), as vLLM's builder
one_slot = WorkspaceManager("meta", num_ubatches=dbo_cfg.num_ubatches)
for call in reservation_plan(dbo_cfg):  # vLLM 0.33: the builder's calls run in the current slot (0)
    one_slot.get_simultaneous(*call)
every = WorkspaceManager("meta", num_ubatches=dbo_cfg.num_ubatches)
for slot in range(dbo_cfg.num_ubatches):  # not vLLM 0.33: a reservation inside each micro-batch
    with ubatch_context(slot):
        reserve_workspace(dbo_cfg, every)
assert every.sizes_bytes() == [reserved] * dbo_cfg.num_ubatches
assert ours.sizes_bytes() == one_slot.sizes_bytes() == [reserved] + [0] * (dbo_cfg.num_ubatches - 1)
assert locked_no_fix < need_8k  # decode scratch alone in slot 1 would not hold the report's chunk either
if USE_RECORDED and recorded.has_recorded(vt.PARITY_RESULTS):
    assert one_slot.sizes_bytes() == parity["test_divergence_dbo_reservation_sizes_one_slot:vllm_slot_sizes"]
    assert ours.sizes_bytes() == parity["test_divergence_dbo_reservation_sizes_one_slot:vllm_slot_sizes"]

slot1_result = {}
SLOT_WAYS = (("tqlab reserve_workspace", ours), ("vLLM 0.33 builder: slot 0", one_slot), ("every slot (not vLLM)", every))
for label, mgr in SLOT_WAYS:
    mgr.lock()
    events_before = len(mgr.events)
    with ubatch_context(1):
        try:
            mgr.get_simultaneous(*chunk_workspace_request(cfg, cached_8k, q_8k).shapes)
        except WorkspaceLockedError as exc:
            slot1_result[label] = f"refused: asks {format_mb(exc.required_bytes)} MiB of {format_mb(exc.current_bytes)} MiB"
        else:
            assert len(mgr.events) == events_before
            slot1_result[label] = "served, no growth"
assert slot1_result["every slot (not vLLM)"].startswith("served")
assert slot1_result["vLLM 0.33 builder: slot 0"].startswith("refused")
assert slot1_result["tqlab reserve_workspace"] == slot1_result["vLLM 0.33 builder: slot 0"]
show_md(markdown_table(
    ("reservation", "slot sizes (MiB)", "per rank (MiB)", f"× TP {cfg.tensor_parallel_size} (MiB)",
     "report's chunk in slot 1 after the lock"),
    [
        (label, " / ".join(format_mb(b) for b in mgr.sizes_bytes()), format_mb(mgr.live_bytes()),
         format_mb(mgr.live_bytes() * cfg.tensor_parallel_size), slot1_result[label])
        for label, mgr in SLOT_WAYS
    ],
))

# %% [markdown]
# <details><summary>Answer</summary>
#
# tqlab's reservation and vLLM's builder agree: slot 0 at the
# reserved size, slot 1 empty — the sizes the parity suite recorded from vLLM's builder. After the lock,
# the report's chunk in slot 1 is refused by both; only a reservation made inside every micro-batch
# (not what vLLM 0.33 does) serves it.
#
# </details>

# %% [markdown]
# ## 7 · Three start-ups of the report's deployment, side by side
#
# vLLM 0.33 calls `lock_workspace()` in one place on the serving path: the end of
# `GPUModelRunner.capture_model` (`vllm/v1/worker/gpu_model_runner.py`). With `--enforce-eager`
# the worker skips `capture_model` (`vllm/v1/worker/gpu_worker.py`, `compile_or_warm_up_model`),
# so an eager server **never locks**: it cannot hit the assertion, which is why `--enforce-eager`
# is the workaround users report (vLLM PR #46067's description lists "`--enforce-eager` works (no
# graphs)" among the symptoms of a TurboQuant CUDA-graph bug, issue #45670; the reporters of issue
# #40807 run `--enforce-eager` to get past TurboQuant's capture-time crash). Its price is decode speed: no CUDA graph replay (notebook 05
# measures replay against eager launches on a GPU). The fourth row is the named variant
# *lock-on-eager* (`lock_workspace_when_eager=True`, a proposed upstream change, off by
# default): what would change if eager start-ups locked too.
#
# **Predict, then run.** For each of the four start-ups: does the workspace lock, and at what size, and is
# the report's prompt served? The cell asks `tqlab.predict.analysis.predict` for each row's lock and verdict,
# then the engine runs the report's prompt (on `meta`: same code, shapes only) and must agree.

# %%
regimes = {
    "eager (vLLM 0.33: never locked)": (cfg.replace(enforce_eager=True), False),
    "CUDA graphs, without the fix": (cfg, False),
    "CUDA graphs, with PR #44053": (cfg, True),
    "lock-on-eager variant, without the fix": (cfg.replace(enforce_eager=True, lock_workspace_when_eager=True), False),
}
regime_rows, regime_preds = [], {}
for label, (c, fix) in regimes.items():
    pred = analysis.predict(c, PROMPT_TOKENS, max_tokens=2, fix=fix)
    eng = LLMEngine(c, fix=fix, device="meta")
    try:
        eng.generate(PROMPT_TOKENS, max_tokens=2)
        outcome = "served"
    except WorkspaceLockedError as e:
        outcome = f"{e.caller.split(':')[-1]} requires {format_mb(e.required_bytes)} MB, current size is {format_mb(e.current_bytes)} MB"
    assert eng.locked_bytes == pred.locked_bytes, label  # predicted lock == the engine's
    assert (outcome != "served") == (pred.verdict == "crash"), label  # predicted verdict == the engine's
    regime_preds[label] = pred
    regime_rows.append((label, "never" if pred.locked_bytes is None else f"{pred.locked_bytes:,}", pred.verdict,
                        "-" if pred.first_failing_prompt_tokens is None else f"{pred.first_failing_prompt_tokens:,}",
                        outcome))
assert regime_preds["eager (vLLM 0.33: never locked)"].verdict == "never_locked"
assert regime_preds["CUDA graphs, without the fix"].first_failing_prompt_tokens == 4225
assert regime_preds["CUDA graphs, with PR #44053"].verdict == "ok"
show_md(markdown_table(
    ("start-up", "locked (bytes)", "predicted", "shortest failing prompt", f"the engine, {PROMPT_TOKENS:,}-token prompt + 1 decode"),
    regime_rows,
))

# %% [markdown]
# <details><summary>Answer</summary>
#
# Eager never locks, so the report's prompt is served however large its chunks are (at the price of no CUDA
# graph replay). CUDA graphs without the fix lock at the decode scratch and the prompt's second chunk is
# refused, from the shortest failing prompt in the table up. With PR #44053 the lock holds the reservation and
# the prompt is served. The lock-on-eager variant locks an eager server at whatever warm-up left, and refuses
# the prompt like the unfixed CUDA-graph server. The predictor and the engine agree on every row (the cell
# asserts it).
#
# </details>

# %% [markdown]
# ## 8 · Speculative decoding: what the reservation covers
#
# With `--speculative-config` (`num_speculative_tokens = k`) a decode row carries `1 + k` tokens
# (vLLM's `uniform_decode_query_len`). In vLLM 0.33's TurboQuant backend that changes which
# kernel runs, and so what asks the workspace for memory:
#
# * **Capture.** The FULL decode graphs are captured for `min(max_num_seqs, cdiv(size, 1 + k))`
#   rows of `1 + k` tokens with `seq_lens = 1 + k` (`_dummy_run`). `1 + k` exceeds the metadata
#   builder's `reorder_batch_threshold` of 1, so the batch goes to `_prefill_attention` as
#   first chunks: **no workspace call**. The drafter's own capture is PIECEWISE
#   (`SpecDecodeBaseProposer.initialize_cudagraph_keys`) and passes no attention metadata. Without
#   the fix the workspace locks **empty**.
# * **Serving.** The target's `1 + k`-token rows run the decode kernel with its own scratch (the
#   short-continuation path). The drafter (an MTP/EAGLE head: its own attention layer, same
#   backend) runs `k` passes; passes 2..k are one-token decodes through `_decode_attention`,
#   which asks the workspace for decode views at the batch's rows — and is refused. With `k = 1`
#   there is no such pass.
#
# That is the kind of failure public reports show: vLLM issue #42544 (`turboquant_k3v4_nc` with an
# MTP drafter, `num_speculative_tokens` 2) dies on the first request with `'turboquant_attn.py:...:
# _decode_attention' requires 0.76 MB, current size is 0.00 MB`, and Sandermage/genesis-vllm-patches
# PR #28 quotes the same message for `turboquant_4bit_nc` with MTP, raised in the drafter's forward
# pass. (Their model is Qwen3.6-27B; the numbers below are tqlab's, for a layout that gives a
# decode row of the same size.) Here with 24 query heads
# of 256 per rank and one request (a decode row of 802,048 bytes):

# %%
mtp = EngineConfig(num_attention_heads=24, num_key_value_heads=8, head_dim=256, max_num_seqs=1, max_model_len=1024,
                   max_num_batched_tokens=1024, kv_cache_dtype="turboquant_4bit_nc")
spec_rows = []
for k in (0, 1, 2, 3):
    for fix in (False, True):
        c = mtp.replace(num_speculative_tokens=k)
        pred = analysis.predict(c, 8, max_tokens=2, fix=fix)
        eng = LLMEngine(c, fix=fix, device="meta")
        try:
            eng.generate(8, max_tokens=2)
            outcome = "served"
        except WorkspaceLockedError as e:
            outcome = f"{e.caller.split(':')[-1]} requires {format_mb(e.required_bytes)} MB, current size is {format_mb(e.current_bytes)} MB"
        assert eng.locked_bytes == pred.locked_bytes and (outcome != "served") == (pred.verdict == "crash")
        spec_rows.append((k, "with" if fix else "without", list(pred.capture_sizes), pred.decode_rows_at_lock,
                          f"{pred.locked_bytes:,}", pred.verdict, outcome))
assert [r[6] for r in spec_rows if r[1] == "without" and r[0] >= 2] == [
    "_decode_attention requires 0.76 MB, current size is 0.00 MB"] * 2
show_md(markdown_table(("k", "PR #44053", "capture sizes (tokens)", "decode rows at lock", "locked (bytes)", "predicted",
                        "the engine"), spec_rows))

# %% [markdown]
# **What PR #44053's reservation covers here.** It runs in the metadata builder's `__init__`,
# before capture, and reserves decode views for `max_num_seqs` rows and the dequant buffers of a
# `max_model_len - 1` continuation. The drafter's decode passes have at most `max_num_seqs` rows
# and the same head layout, so they fit; its continuation chunks are the target's.
#
# **What it does not cover.**
# * A drafter whose attention has more query heads per rank or a larger head size than the target:
#   `_reserve_workspace` sizes the decode views from the target's `model_config`
#   (`get_num_attention_heads`) and the builder's own `kv_cache_spec`.
# * DBO's second slot (6c) and chunked prefill off with prefix caching (6b), as without speculation.
# * vLLM issue #40807 (fix proposed in PR #43747) crashes *during graph capture* in the continuation
#   path with speculative decoding and chunked prefill on (`query_start_loc.tolist()` while capturing). vLLM 0.33's code does not lead there for this backend:
#   `_dummy_run` sets `seq_lens = max_query_len`, so a captured `1 + k`-token row is a first chunk,
#   not a continuation. tqlab does not reproduce that report; it models what 0.33's source does.

# %% [markdown]
# ## 9 · What the PR's record says, checked
#
# vLLM PR #44053 ("[Bugfix][V1][TurboQuant] Reserve workspace before CUDA graph capture") superseded
# PR #40798 and fixes issue #41565 (notebook 02's bug report). Its date, its review comments, its
# benchmark and the risks a review listed are loaded from a transcription in `data/` (from
# a report on the PR, with provenance). Two of them are claims about the code that tqlab can test:
#
# * the benchmark: serving throughput and time to first token move by a few per cent, **TPOT
#   (time per output token) essentially unchanged**;
# * a risk: **other backends may share the bug** (the review names FlashAttention). Which of vLLM 0.33's
#   other workspace consumers reserve ahead, and which rely on what start-up happens to run, is notebook
#   10's topic: its census of every consumer answers that risk.
#
# **Predict, then run.** Does the fix change anything a decode step does — the calls it makes to the
# workspace, the kernels it picks?

# %%
from tqlab.core.provenance import load_recorded

sources = load_recorded("report_sources")
pr = sources["fix_pr"]
show_md(markdown_table(("", "from the PR's record (data/report_sources.json)"), [
    ("PR", f"#{pr['pr']}: {pr['title']}"),
    ("merged", pr["merged"]),
    ("supersedes / fixes", f"PR #{pr['supersedes']} / issue #{pr['fixes']}"),
    *[(f"comment: {c['who']}", c["what"]) for c in pr["comments"]],
    ("benchmark (before → after)", f"{pr['benchmark']['req_s'][0]} → {pr['benchmark']['req_s'][1]} req/s, TTFT "
                                   f"{pr['benchmark']['ttft_ms'][0]:,} → {pr['benchmark']['ttft_ms'][1]:,} ms; TPOT "
                                   f"{pr['benchmark']['tpot']}"),
    *[("risk", r) for r in pr["risks"]],
]))
# TPOT: the same short request, decoded by an engine with and without the fix (both serve it).
unit = EngineConfig.from_preset("pr-44053-unit-test")
n_dec = 4
decode_calls = {}
for fix in (False, True):
    e = LLMEngine(unit, fix=fix, device="meta")
    at_lock = len(e.workspace.events)
    out_e = e.generate(unit.max_num_batched_tokens // 2, max_tokens=n_dec)
    decode_calls[fix] = (dict(e.backend.path_counts), len(e.workspace.events) - at_lock, out_e.finished)
assert decode_calls[False] == decode_calls[True]  # same kernels, same calls, no workspace event after the lock
show_md(
    f"Serving {n_dec} tokens after a {unit.max_num_batched_tokens // 2:,}-token prompt: paths "
    f"{decode_calls[True][0]} and {decode_calls[True][1]} workspace events after the lock, **with and without the "
    f"fix alike** — the fix adds no work to a decode step, which is what an unchanged TPOT needs (tqlab measures "
    f"no GPU time here)."
)

# %% [markdown]
# <details><summary>Answer</summary>
#
# No. With and without the fix a served request takes the same kernel paths and makes no workspace call that
# grows anything after the lock: the fix only moves the growth to start-up. That is what an unchanged TPOT
# needs; the few per cent the PR's benchmark shows in throughput and TTFT come from one before/after pair
# without a spread (notebook 06 §9), and tqlab measures no GPU time here.
#
# </details>

# %% [markdown]
# ## Summary
#
# * The crash was a sizing problem: the lock froze what start-up happened to touch.
# * The fix sizes the workspace from the configuration — `max_num_seqs` and
#   `max_model_len` — through the consumers' own shape functions, before the lock; with it
#   the longest request the server accepts is served after the lock.
# * Short continuation chunks need no cover: in vLLM 0.33 they make no workspace call.
# * Two deployments stay exposed with PR #44053: chunked prefill off with prefix caching
#   (the continuation call is never reserved; tqlab mirrors that), and DBO (vLLM sizes
#   slot 0 only; so does tqlab's `reserve_workspace`).
# * An eager vLLM 0.33 server never locks; with speculative decoding a graph start-up locks an
#   empty workspace and the drafter's decode is refused without the fix, served with it.
# * Its cost is fixed per rank and per slot, whatever the traffic (the next cell), and notebook 06 §2
#   sets it against a real KV pool.

# %%
lo, hi = min(cost, key=lambda x: x["res"]), max(cost, key=lambda x: x["res"])
show_md(
    f"Across the presets the reservation is {format_mb(lo['res'])} MiB ({lo['name']}) to {format_mb(hi['res'])} MiB "
    f"({hi['name']}) per rank; {PRESET} reserves {format_mb(reserved)} MiB. Notebook 06 §2 sets these against "
    f"the KV pool a real GPU holds."
)

# %% [markdown]
# ## Exercises
#
# Four functions about the fix; the references call the package's own code.
# Each exercise is a function to fill in: replace `raise NotImplementedError` with your code and run
# the cell. `check` runs your function beside a reference on several cases and says which differ
# (until then it says "not attempted yet"). Everything runs on a CPU. The solutions are folded under
# **Solution**; the references live in `tqlab/lab/solutions/nb03.py`.

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb03 as solutions

# %% [markdown]
# ### Exercise 1 · The reservation of a preset
#
# Return the bytes PR #44053's `_reserve_workspace` makes slot 0 hold for a preset (section 1): the larger of
# its two calls. Build the calls with `decode_workspace_shapes` and `continuation_workspace_shapes` (or by
# hand), and mind the PR's condition for the second one.

# %%
def reservation_bytes(preset):
    raise NotImplementedError


check("reservation_bytes", reservation_bytes, solutions.reservation_bytes, [(PRESET,), ("qwen3-32b",), ("llama-3.1-8b",), ("pr-44053-unit-test",)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def reservation_bytes(preset):
#     c = EngineConfig.from_preset(preset)
#     calls = [decode_workspace_shapes(c.max_num_seqs, c.num_heads_per_rank, c.head_dim,
#                                      c.tq_max_kv_splits_for_cuda_graph, c.dtype)]
#     if c.enable_chunked_prefill and c.max_num_batched_tokens > CONTINUATION_DECODE_THRESHOLD:
#         calls.append(continuation_workspace_shapes(c.max_model_len - 1, c.num_kv_heads_per_rank, c.head_dim,
#                                                    c.block_size))
#     return max(compute_layout(call).total_bytes for call in calls)
# ```
#
# </details>

# %% [markdown]
# ### Exercise 2 · Sized for which cached length?
#
# Return the cached-length dimension of the reserved continuation buffers for a `max_model_len` and a block
# size (section 2).

# %%
def continuation_alloc_len(max_model_len, block_size):
    raise NotImplementedError


check("continuation_alloc_len", continuation_alloc_len, solutions.continuation_alloc_len, [(131072, 16), (8192, 32), (4097, 2080), (1, 16)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def continuation_alloc_len(max_model_len, block_size):
#     cached = max(0, max_model_len - 1)
#     return -(-cached // block_size) * block_size
# ```
#
# </details>

# %% [markdown]
# ### Exercise 3 · The PR's condition
#
# Return whether PR #44053 reserves the continuation buffers for the report's deployment when chunked prefill
# is on or off and `max_num_batched_tokens` is given (section 6b shows what the condition leaves exposed).

# %%
def reserves_continuation(enable_chunked_prefill, max_num_batched_tokens):
    raise NotImplementedError


check("reserves_continuation", reserves_continuation, solutions.reserves_continuation, [(True, 4096), (True, CONTINUATION_DECODE_THRESHOLD), (True, CONTINUATION_DECODE_THRESHOLD + 1), (False, 131072)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def reserves_continuation(enable_chunked_prefill, max_num_batched_tokens):
#     return enable_chunked_prefill and max_num_batched_tokens > CONTINUATION_DECODE_THRESHOLD
# ```
#
# </details>

# %% [markdown]
# ### Exercise 4 · The shortest crashing prompt without the fix
#
# Without the fix the report's deployment locks the decode scratch only. For a chunk size
# `max_num_batched_tokens`, return the shortest prompt it refuses (section 6a's rule: the first chunk caches
# `max_num_batched_tokens` tokens; a second chunk of at most `CONTINUATION_DECODE_THRESHOLD` tokens takes the
# decode kernel).

# %%
def first_failing_prompt_no_fix(max_num_batched_tokens):
    raise NotImplementedError


check("first_failing_prompt_no_fix", first_failing_prompt_no_fix, solutions.first_failing_prompt_no_fix, [(4096,), (2048,), (8192,), (1024,)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def first_failing_prompt_no_fix(max_num_batched_tokens):
#     # every chunk size here caches more than the 0.26 MiB decode scratch holds after one chunk
#     return max_num_batched_tokens + CONTINUATION_DECODE_THRESHOLD + 1
# ```
#
# </details>

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU (live prompt on `{device}`).*")
