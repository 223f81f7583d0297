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
# ever need — after the profile run (vLLM 0.33 builds the metadata builders in
# `initialize_kv_cache`, after `determine_available_memory`), before capture, before the lock.
# You will learn:
#
# 1. what the reservation asks for, call by call, and how it lays out in the buffer;
# 2. why it is sized from `max_model_len` — and why that is enough;
# 3. that the report's prompt now completes after the lock (live, on `DEVICE`), and so does a
#    `max_model_len` prompt (on `meta`, shapes only);
# 4. what it costs per preset, in MiB and as a share of the KV cache of `max_num_seqs` sequences
#    of `max_model_len` tokens on one GPU;
# 5. what it does not need to cover (short continuation chunks make no workspace call in
#    vLLM 0.33), and the two deployments PR #44053 leaves exposed: chunked prefill off with
#    prefix caching, and DBO's second ubatch slot.
#
# **Hardware.** CPU (default). `DEVICE = "cuda"` runs the live prompt on a GPU; the
# `max_model_len` runs and the per-preset sweeps always use `meta`.
#
# **Run time.** Under a minute on a small CPU box; the live prompt is most of it (on CPU it
# runs a model with fewer layers: section 3 explains why that changes no workspace number).
# The last cell prints the measured time.

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
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # where the engine runs the report's prompt: "cpu", "cuda" or "meta"
check_device(DEVICE, ("cpu", "cuda", "meta"), "03")  # one clear line for any other DEVICE
USE_RECORDED = True  # show vLLM's own results from the recorded parity run (data/parity_results.json, under a banner)

# %%
import math

import matplotlib.pyplot as plt

from tqlab import vllm as vt
from tqlab.predict import report as rp
from tqlab.attention import kv_cache_bytes_per_token
from tqlab.lab import plots_workspace as plots
from tqlab.lab import recorded
from tqlab.lab.display import markdown_table, show_error, show_md
from tqlab.core.config import EngineConfig, list_presets, load_preset
from tqlab.core.consumers.registry import turboquant_only
from tqlab.engine import LLMEngine
from tqlab.core.reservation import (
    CONTINUATION_DECODE_THRESHOLD,
    chunk_workspace_request,
    continuation_workspace_shapes,
    plan_bytes,
    reservation_plan,
    reserve_workspace,
)
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
# **Predict, then run.** The PR's own unit test (in vLLM PR #44053) expects these exact calls for its
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
# scheduling — provided the reservation makes this call at all (section 6). Anything
# smaller is a guess about traffic, which is how vLLM 0.20 failed: it sized from what the
# profile run happened to do.

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

# %% [markdown]
# **Predict, then run.** Is there a cached length the server can meet — any block-aligned value
# below `max_model_len`, or the last one — whose dequant call needs more than the reservation? At
# which cached length is the need exactly the reservation?

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
# **Answer** (checked by the cell above). Every cached length the server can meet — each block-aligned value
# below `max_model_len`, and the last one — needs at most the reservation; and the
# reservation is exactly the need at `max_model_len - 1`.

# %% [markdown]
# ## 3 · The report's prompt, after the lock
#
# **Question.** Notebook 02 crashed on this prompt. With the reservation, what happens?
#
# Same preset, same start-up, `fix=True`. The profile run still touches no workspace; the
# workspace grows when the metadata builder is built right after it (vLLM 0.33:
# `Worker.determine_available_memory` runs `profile_run`, then `initialize_kv_cache` →
# `initialize_metadata_builders` → `TurboQuantMetadataBuilder.__init__` → `_reserve_workspace`),
# and capture finds it already big enough.
#
# **Fewer layers on CPU.** Every attention layer makes the same workspace calls, one after
# the other, into the one shared buffer: the workspace numbers are *per layer call*, and the
# layer count changes only how much arithmetic a CPU does. So on CPU the engine below runs
# `CPU_LAYERS` attention layers instead of the model's. The next cell checks the claim
# first, on `meta`: with the fix the locked size is the same for both layer counts; without
# it the report's prompt is refused with the same bytes requested and the same size locked.

# %%
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

# %% [markdown]
# **Predict, then run.** Does the request finish? After the lock, does the workspace resize or
# refuse anything? Is the buffer still the one that was locked?

# %%
assert out.finished and engine.dead is None
assert len(engine.workspace.events) == events_at_lock  # nothing happened to the workspace while serving
assert engine.workspace.size_bytes() == engine.locked_bytes == reserved
by_phase = {p.name: p.workspace_bytes[0] for p in engine.phases}
phase_order = [p.name for p in engine.phases]
assert phase_order.index("profile_run") < phase_order.index("build_backend") < phase_order.index("capture")
assert by_phase["profile_run"] == 0  # the profile run asks nothing of the workspace (vLLM 0.33 too)
assert by_phase["build_backend"] == reserved  # grown by _reserve_workspace(), after the profile run
assert by_phase["capture"] == reserved  # capture found it big enough
print(f"served after the lock; the workspace stayed at {format_mb(engine.locked_bytes)} MiB")

# %% [markdown]
# **Answer** (checked by the cell above). The request finishes; after the lock there is no resize and no
# violation; the buffer is the one that was locked (same size, same address).

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
n_chunks = len(prefill_chunks(cfg, longest))
show_md(f"{longest:,}-token prompt on `meta`: finished **{meta_out.finished}** after {n_chunks} chunks, in {meta_s:.1f} s.")

unfixed = LLMEngine(cfg, fix=False, device="meta")
try:
    unfixed.generate(longest, max_tokens=1)
except WorkspaceLockedError as exc:
    show_error(exc, "The same prompt without the fix (caught)")
else:
    raise AssertionError("the unfixed engine served a max_model_len prompt")

# %% [markdown]
# **Predict, then run.** With the fix, is the `max_model_len` prompt served, and does anything
# happen to the workspace after the lock? Without it, where is it refused?

# %%
assert meta_out.finished and len(meta_engine.workspace.events) == meta_events
assert unfixed.dead is not None
print("max_model_len prompt: served with the fix, refused without it")

# %% [markdown]
# **Answer** (checked by the cell above). With the fix: served, no workspace event after the lock. Without
# it: refused at the first chunk that needs more than the decode scratch.

# %% [markdown]
# ## 5 · What it costs, per preset
#
# **Question.** The reservation holds worst-case memory for the server's whole life. How
# much is that, next to the KV cache it serves?
#
# Per rank (one GPU) and per ubatch slot: the reservation is the larger of the two calls.
# **"Share of the KV cache" has one meaning in this project:** reserved workspace (all
# ubatch slots) divided by **the KV cache of `max_num_seqs` sequences of `max_model_len`
# tokens** on one rank, in the configured cache format:
# `kv_cache_bytes_per_token(config) × max_model_len × max_num_seqs`, where
# `kv_cache_bytes_per_token` counts every attention layer on the rank (TurboQuant formats
# are packed, `auto` is the model dtype). This is the same denominator `tqlab plan` prints;
# notebook 06 uses it too, and shows the share of *one* `max_model_len` sequence
# (`max_num_seqs` times larger) as an upper bound.

# %%
cost = []
TQ_PRESETS = [n for n in list_presets() if turboquant_only(EngineConfig.from_preset(n))]  # notebook 10: the others
for name in TQ_PRESETS:
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
plots.plot_bars([x["name"] for x in cost], [x["res"] / MiB for x in cost], ax=ax1, horizontal=True, log=False,
              ylabel="reserved workspace per rank (MiB)", fmt="{:,.1f} MiB",
              title="Workspace reserved by the fix")
plots.plot_bars([x["name"] for x in cost], [100 * x["res"] / x["kv"] for x in cost], ax=ax2, horizontal=True,
              ylabel="% of the rank's KV cache (max_num_seqs × max_model_len)", fmt="{:.2f} %",
              title="…as a share of the KV cache")
ax2.set_yticklabels([])
fig.tight_layout()
plt.show()

# %% [markdown]
# **Predict, then run.** For the bug report's deployment, what share of the KV cache is the
# reservation — and how does the share of *one* `max_model_len` sequence (notebook 06's upper bound)
# relate to it?

# %%
seed_cost = next(x for x in cost if x["name"] == PRESET)
sc = seed_cost["cfg"]
seed_share = seed_cost["res"] / (kv_cache_bytes_per_token(sc) * sc.max_model_len * sc.max_num_seqs)
seed_share_one = seed_cost["res"] / (kv_cache_bytes_per_token(sc) * sc.max_model_len)
assert seed_share == seed_cost["res"] / seed_cost["kv"]
assert math.isclose(seed_share_one, sc.max_num_seqs * seed_share)
show_md(
    f"{PRESET}: share of the KV cache of {sc.max_num_seqs} sequences of {sc.max_model_len:,} tokens = "
    f"**{100 * seed_share:.3f} %**; of one {sc.max_model_len:,}-token sequence (upper bound) = "
    f"{100 * seed_share_one:.3f} %."
)

# %% [markdown]
# **Answer** (checked by the cell above). For the bug report's deployment the share is the reservation over
# the KV cache of `max_num_seqs` sequences of `max_model_len` tokens; the share of one
# sequence (notebook 06's upper bound) is `max_num_seqs` times that.

# %% [markdown]
# The whole deployment pays this on every rank (× `tensor_parallel_size`). With DBO,
# tqlab's reservation pays it once per ubatch slot; vLLM 0.33's pays it once, for one slot
# only — the second limit in section 6.

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
# with private `torch.empty` buffers. One visible consequence *without* the fix: a prompt
# one chunk plus `CONTINUATION_DECODE_THRESHOLD` tokens long survives, because its second
# chunk is short; one token more and the second chunk dequantizes and crashes.
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
# **Answer** (checked by the cell above). `first_failing_prompt` puts the first failure of the unfixed
# engine one token past one chunk plus the threshold. The prompt one token shorter is
# served without a single workspace event after the lock, its last chunk on the
# decode-kernel path (once per layer); the failing one is refused by the dequant call.

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
# **Predict, then run.** With chunked prefill off the plan is the decode call alone, so
# the fixed workspace is the decode scratch. A prefix-cache hit covers whole blocks: a
# request at the predicted bound whose cached part is whole blocks is served; one more
# cached block, and the same number of new tokens, is refused *with the fix*.
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
    q = torch.empty(new_tokens, c.num_heads_per_rank, c.head_dim, dtype=c.dtype, device=dev)
    kv = torch.empty(new_tokens, c.num_kv_heads_per_rank, c.head_dim, dtype=c.dtype, device=dev)
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
# **Answer** (checked by the cell above). tqlab's reservation and vLLM's builder agree: slot 0 at the
# reserved size, slot 1 empty — the sizes the parity suite recorded from vLLM's builder. After the lock,
# the report's chunk in slot 1 is refused by both; only a reservation made inside every micro-batch
# (not what vLLM 0.33 does) serves it.

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
# **Predict, then run**: `tqlab.predict.analysis.predict` gives each row's lock and verdict, then the
# engine runs the report's prompt (on `meta`: same code, shapes only) and must agree.

# %%
from tqlab.predict import analysis

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
# ## 8 · What the PR's record says, checked
#
# vLLM PR #44053 ("[Bugfix][V1][TurboQuant] Reserve workspace before CUDA graph capture") superseded
# PR #40798 and fixes issue #41565 (notebook 02's bug report). Its date, its review comments, its
# benchmark and the risks a review listed are loaded from `data/seed_sources.json` (transcribed from
# the session's seed 000, with provenance). Two of them are claims about the code that tqlab can test:
#
# * the benchmark: serving throughput and time to first token move by a few per cent, **TPOT
#   (time per output token) essentially unchanged**;
# * a risk: **other backends may share the bug** (the review names FlashAttention).
#
# **Predict, then run.** Does the fix change anything a decode step does — the calls it makes to the
# workspace, the kernels it picks? And of vLLM 0.33's other workspace consumers, how many reserve
# ahead the way TurboQuant now does?

# %%
from tqlab.core.provenance import load_recorded
from tqlab.vllm.source_scan import find_vllm_source, load_census, workspace_consumers

seed = load_recorded("seed_sources")
pr = seed["fix_pr"]
show_md(markdown_table(("", "from the PR's record (data/seed_sources.json)"), [
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
census, census_from = load_census(find_vllm_source())  # live from vLLM's source when installed, else recorded
consumers = workspace_consumers(census)
others = [f for f in consumers["files"] if "turboquant" not in f]
other_reservers = [f for f in consumers["reservers"] if "turboquant" not in f]
assert len(other_reservers) < len(others)  # most consumers rely on what start-up happens to run
show_md(
    f"Serving {n_dec} tokens after a {unit.max_num_batched_tokens // 2:,}-token prompt: paths "
    f"{decode_calls[True][0]} and {decode_calls[True][1]} workspace events after the lock, **with and without the "
    f"fix alike** — the fix adds no work to a decode step, which is what an unchanged TPOT needs (tqlab measures "
    f"no GPU time here). Of the {len(others)} other files of vLLM {consumers['vllm_version']} that call the "
    f"workspace, {len(other_reservers)} reserve ahead ({', '.join(f'`{f}`' for f in other_reservers)}); the rest "
    f"are safe only if start-up reaches their largest size ({census_from}). Notebook 07 §2b shows seed 002's rows."
)

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
# * Its cost is fixed per rank and per slot, whatever the traffic:

# %%
lo, hi = min(cost, key=lambda x: x["res"] / x["kv"]), max(cost, key=lambda x: x["res"] / x["kv"])
show_md(
    f"Across the presets the reservation is {100 * lo['res'] / lo['kv']:.3f} % ({lo['name']}) to "
    f"{100 * hi['res'] / hi['kv']:.1f} % ({hi['name']}) of the KV cache of `max_num_seqs` sequences of "
    f"`max_model_len` tokens on a rank. Where the dequant buffers dominate, both scale with the KV heads per rank and `max_model_len`, "
    f"which cancel: what is left is fp16 buffers for *one* layer against a cache that holds *every* layer, packed, "
    f"for `max_num_seqs` requests. So the share is largest with few sequences and few attention layers — {PRESET} "
    f"({cfg.max_num_seqs} sequences, {cfg.num_hidden_layers} attention layers) reserves {format_mb(reserved)} MiB "
    f"per rank next to a {next(x for x in cost if x['name'] == PRESET)['kv'] / MiB:,.0f} MiB KV cache."
)
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU (live prompt on `{device}`).*")
