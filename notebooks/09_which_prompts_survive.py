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
# # 09 · Which prompts survive without the fix, preset by preset
#
# Notebook 02 crashed one deployment with one long prompt. An engineer who meets
# "Workspace is locked" in their own deployment asks the next questions: *which* prompts are
# safe on my server, and how short can a fatal one be? This notebook answers them for every
# preset in `data/presets/`, with the one analysis that `tqlab plan` and `tqlab inspect-vllm`
# use (`tqlab.predict.analysis`), and checks each answer on the engine. You will learn:
#
# 1. the workspace each preset locks without the fix, predicted in closed form and confirmed
#    by starting the engine;
# 2. the first failing prompt of each preset when it runs alone, found exactly (no trial of
#    every length), and why one preset never fails;
# 3. where that boundary sits: one prefill chunk plus vLLM's 128-token threshold;
# 4. why a busy server fails far earlier: another request's share of the token budget moves
#    the chunk boundaries, and a prompt of a few hundred tokens can die;
# 5. that with the fix (vLLM PR #44053) no prompt fails, alone or on a busy server.
#
# **What you need.** Nothing but this repository. Every engine here runs on PyTorch's `meta`
# device: shapes and workspace calls are real, no arithmetic is done, so full-size presets
# with 100K-token contexts start in about a second. `DEVICE = "cpu"` runs the same engines
# with real attention in every layer (about a minute on a 2-core box).
#
# **Run time.** About 10 s on a 2-core CPU box; the last cell prints the measured time.
# Five **predict, then run** cells state a prediction, then check it with an `assert`.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()



from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "meta"  # where the engines run: "meta" (shapes only, fast), "cpu" or "cuda" (real attention, slow)
check_device(DEVICE, ("meta", "cpu", "cuda"), "09")  # one clear line for any other DEVICE
USE_RECORDED = False  # nothing here needs a GPU: every number is computed live

# %%
import matplotlib.pyplot as plt

from tqlab.predict import analysis
from tqlab.predict.analysis import first_failing_prompt, prefill_chunks, safe_max_model_len
from tqlab.core.config import EngineConfig
from tqlab.lab.presets import refusal_summary, turboquant_presets
from tqlab.engine import LLMEngine
from tqlab.lab import plots_workspace as plots
from tqlab.lab import recorded
from tqlab.lab.display import markdown_table, show_error, show_md
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD, chunk_workspace_request
from tqlab.core.workspace import WorkspaceLockedError, format_mb

device = recorded.pick_device(DEVICE)
PRESET = "nemotron-3-super-120b-a12b"  # the bug report's deployment, one tensor-parallel rank
T = CONTINUATION_DECODE_THRESHOLD  # vLLM 0.33: a continuation chunk of at most T new tokens runs the decode kernel
# The presets whose only workspace consumer is TurboQuant and that vLLM starts (MoE/MLA presets: notebook 10).
started, refused_presets = turboquant_presets()
configs = {n: EngineConfig.from_preset(n) for n in started}
print(f"engine device: {device!r}; presets: {', '.join(configs)}")
for n, why in refused_presets.items():  # vLLM's start-up validation refuses it: no lock, no prompt to survive
    print(f"left out, vLLM 0.33 does not start it: {n} ({refusal_summary(why)})")

# %% [markdown]
# ## 1 · What each preset locks
#
# **Question.** Without the fix, how large is each preset's workspace when capture locks it?
# (Each preset here: the ones whose only workspace consumer is TurboQuant; notebook 10 adds MoE and MLA models,
# where another consumer can set the lock.)
#
# Capture runs the decode graphs, largest batch first; TurboQuant's split-KV decode asks the
# workspace for its scratch, sized by the rows of that batch. Nothing else touches the
# workspace before the lock (notebook 02 §2 shows why the profile run does not). So
# `tqlab.predict.analysis.locked_bytes(config, fix=False)` predicts the locked size in closed form
# from the capture sizes vLLM 0.33 picks (`VllmConfig._set_cudagraph_sizes`).
#
# **Predict, then run.** Does starting each preset's engine without the fix lock the workspace at
# exactly the predicted size? The workspace is one buffer shared by every layer and capture
# runs the largest batch first, so a one-layer engine that captures only a batch of
# `max_num_seqs` requests locks at the same size, much faster, whenever the largest decode
# capture holds exactly `max_num_seqs` rows (true of every preset here: the table's third
# column). The cell checks that too, on two presets with every layer and every batch size.

# %%
def locked_without_fix(c: EngineConfig) -> int:
    """Locked workspace bytes of an unfixed engine (one layer, largest capture batch only)."""
    quick = c.replace(num_hidden_layers=1, cudagraph_capture_sizes=(c.max_num_seqs,))
    return LLMEngine(quick, fix=False, device=device).locked_bytes


locked = {name: analysis.locked_bytes(c, fix=False) for name, c in configs.items()}  # predicted
rows = []
for name, c in configs.items():
    engine_locked = locked_without_fix(c)
    assert engine_locked == locked[name], (name, engine_locked, locked[name])
    rows.append((name, ", ".join(map(str, analysis.capture_sizes(c))), analysis.decode_rows_at_lock(c),
                 f"{locked[name]:,}", f"{engine_locked:,}", format_mb(engine_locked)))
for name in (PRESET, "pr-44053-unit-test"):  # every layer and every batch size: the same size
    assert LLMEngine(configs[name], fix=False, device=device).locked_bytes == locked[name]
show_md(markdown_table(("preset", "capture sizes", "decode rows at the lock", "predicted (bytes)",
                        "engine locked (bytes)", "MiB"), rows))

# %% [markdown]
# ## 2 · The longest prompt that survives alone
#
# **Question.** A request alone on the server is prefilled in chunks of
# `max_num_batched_tokens`. Which is the first prompt length whose chunks ask the locked
# workspace for more than it holds?
#
# Only a *continuation* chunk (one with tokens already cached) of more than 128 new tokens
# asks: it dequantizes the cached keys and values into fp16 buffers sized by `cached_len`.
# Those buffers grow with `cached_len`, so `first_failing_prompt` bisects on the chunk index
# instead of trying every length, using the same per-chunk formula the backend uses
# (`tqlab.core.reservation.chunk_workspace_request`).
#
# **Predict, then run.** The largest dequant call a preset can ever make is a continuation
# chunk that ends at `max_model_len - 1`: 129 new tokens on `max_model_len - 130` cached ones.
# A preset whose locked workspace holds that call survives every prompt. From §1's locks,
# which presets survive every prompt without the fix? The survey below finds each preset's
# first failing prompt; the last cell of this section computes that largest call for every
# preset and checks that the survivors are exactly the presets it fits.

# %%
survey = []
for name, c in configs.items():
    bad = first_failing_prompt(c, locked[name])
    if bad is None:
        longest, path, need = c.max_model_len - 1, "—", None
    else:
        cached, q = prefill_chunks(c, bad)[-1]
        r = chunk_workspace_request(c, cached, q)
        longest, path, need = bad - 1, f"{r.path} (cached {cached:,}, {q} new)", r.nbytes
    survey.append({"name": name, "cfg": c, "locked": locked[name], "bad": bad, "longest": longest, "path": path,
                   "need": need})

show_md(
    markdown_table(
        ("preset", "locked (MiB)", "longest surviving prompt", "max_model_len", "share", "first failing chunk", "it needs (MiB)"),
        [
            (s["name"], format_mb(s["locked"]), f"{s['longest']:,}", f"{s['cfg'].max_model_len:,}",
             f"{100 * s['longest'] / s['cfg'].max_model_len:.1f} %", s["path"],
             "—" if s["need"] is None else format_mb(s["need"]))
            for s in survey
        ],
    )
)
ax = plots.plot_bars(
    [s["name"] for s in survey],
    [100 * s["longest"] / s["cfg"].max_model_len for s in survey],
    ylabel="longest surviving prompt, % of max_model_len (no fix)",
    fmt="{:.1f} %",
    horizontal=True,
    title="Longest prompt that survives alone without the fix, as a share of max_model_len",
)
plt.show()

# %% [markdown]
# Why each preset fails where it does, computed from the same formulas, per preset:

# %%
reasons = []
for s in survey:
    c = s["cfg"]
    if s["bad"] is None:
        cont = chunk_workspace_request(c, c.max_model_len - 1, T + 1).nbytes
        if not c.enable_chunked_prefill or c.max_num_batched_tokens >= c.max_model_len:
            why = "one chunk covers the whole context, so no continuation prefill ever happens"
        else:
            why = (f"its locked decode scratch ({format_mb(s['locked'])} MiB, `max_num_seqs` = {c.max_num_seqs}) "
                   f"already exceeds the dequant buffers at `max_model_len` ({format_mb(cont)} MiB)")
        reasons.append(f"- **{s['name']}** survives every prompt: {why}.")
    else:
        cached, q = prefill_chunks(c, s["bad"])[-1]
        s_cached, s_q = prefill_chunks(c, s["longest"])[-1]
        s_path = chunk_workspace_request(c, s_cached, s_q).path
        reasons.append(
            f"- **{s['name']}** fails on the dequant buffers of a continuation chunk of {q} new tokens once "
            f"cached_len reaches {cached:,} tokens ({format_mb(s['need'])} MiB > {format_mb(s['locked'])} MiB). "
            f"Its longest survivor ({s['longest']:,} tokens) ends in a chunk of {s_q} new tokens after "
            f"{s_cached:,} cached: the `{s_path}` path, which makes no workspace call."
        )
show_md("\n".join(reasons))

# %% [markdown]
# The check of the prediction: the largest call against each preset's lock.

# %%
largest_call = {s["name"]: analysis.continuation_bytes(s["cfg"], s["cfg"].max_model_len - 1 - (T + 1))
                for s in survey}
survivors = {s["name"] for s in survey if s["bad"] is None}
assert survivors == {name for name, need in largest_call.items() if need <= locked[name]}
assert survivors and survivors != set(configs)  # some presets survive every prompt, some do not
show_md(f"Survive every prompt without the fix: **{', '.join(sorted(survivors))}**.")

# %% [markdown]
# ## 3 · The boundary: one chunk plus the threshold
#
# Why the survivors end where they do: a continuation chunk of at most
# `CONTINUATION_DECODE_THRESHOLD` (128) new tokens does not dequantize. In vLLM 0.33 it runs
# the decode kernel, one query row per new token, with the kernel's own scratch, and asks the
# workspace for nothing (`TurboQuantAttentionImpl.forward` in
# `vllm/v1/attention/backends/turboquant_attn.py`; `make parity` checks it against vLLM's own
# code, and tqlab's backend does the same).
#
# **Predict, then run.** On the bug report's preset, does the longest surviving prompt touch the
# workspace after the lock? Which path does its last chunk take? What does one token more do?

# %%
row = next(s for s in survey if s["name"] == PRESET)
cfg, m = row["cfg"], row["cfg"].max_num_batched_tokens
assert row["longest"] == m + T and row["bad"] == row["longest"] + 1  # one chunk plus the threshold
last_cached, last_q = prefill_chunks(cfg, row["longest"])[-1]
assert chunk_workspace_request(cfg, last_cached, last_q).shapes is None  # no workspace call

ok_engine = LLMEngine(cfg, fix=False, device=device)
events_at_lock = len(ok_engine.workspace.events)
out = ok_engine.generate(row["longest"], max_tokens=1)
assert out.finished and ok_engine.dead is None
assert len(ok_engine.workspace.events) == events_at_lock  # nothing asked of the locked workspace
assert ok_engine.backend.path_counts["decode_kernel"] == cfg.num_hidden_layers  # once per layer
show_md(
    f"**{row['longest']:,} tokens** ({m:,} + {T}) on {PRESET}: served; its last chunk ({last_cached:,} cached + "
    f"{last_q} new) ran the decode kernel in each of the {cfg.num_hidden_layers} layers; "
    f"{len(ok_engine.workspace.events) - events_at_lock} workspace events after the lock."
)

bad_engine = LLMEngine(cfg, fix=False, device=device)
try:
    bad_engine.generate(row["bad"], max_tokens=1)
except WorkspaceLockedError as exc:
    assert exc.required_bytes == row["need"]
    show_error(exc, f"{row['bad']:,} tokens: one more than the longest survivor (caught)")
else:
    raise AssertionError("the first failing prompt was served")

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# On the bug report's preset, the longest surviving prompt completes
# without a single workspace event after the lock, its last chunk on the decode-kernel
# path; one token more kills the engine.
#
# </details>

# %% [markdown]
# ## 4 · A busy server fails far earlier
#
# **Question.** The survey above assumed the prompt runs *alone*, so its chunks start at
# multiples of `max_num_batched_tokens`. On a real server other requests share each step's
# token budget: vLLM's scheduler serves the running requests first and gives a new prompt
# what is left (`Scheduler.schedule`, `vllm/v1/core/sched/scheduler.py`). A prompt of `n`
# tokens whose first step gets only `n - 129` of them has a second chunk of 129 new tokens
# on `n - 129` cached ones: a dequantizing continuation, at any `n`.
#
# One rule narrows what a step can leave: for a hybrid model with prefix caching on (vLLM's
# default; the nemotron preset), every chunk but a prompt's last is cut back to a block
# boundary (`Scheduler._mamba_block_aligned_split`), so cached lengths are whole blocks.
#
# `safe_max_model_len(config, locked, schedule="any")` finds the largest context that no
# chunking can break (the bound to trust on a busy server); `schedule="alone"` repeats the
# survey's answer. Both bisect on the same per-chunk formula. They answer in `max_model_len`,
# which must leave room for one output token: the "alone" column is one more than §2's
# longest surviving prompt.

# %%
bounds = []
for s in survey:
    c = s["cfg"]
    alone = safe_max_model_len(c, s["locked"], schedule="alone")
    busy = safe_max_model_len(c, s["locked"], schedule="any")
    bounds.append({"name": s["name"], "cfg": c, "alone": alone, "busy": busy})
show_md(markdown_table(
    ("preset", "chunks end", "max_model_len", "largest safe max_model_len: alone", "on a busy server", "busy / alone"),
    [(b["name"], "on a block" if b["cfg"].mamba_block_aligned_split else "at the token budget",
      f"{b['cfg'].max_model_len:,}", f"{b['alone']:,}", f"{b['busy']:,}",
      f"{100 * b['busy'] / b['alone']:.1f} %") for b in bounds],
))

fig, ax = plt.subplots(figsize=(9, 0.6 + 0.45 * len(bounds)))
names = [b["name"] for b in bounds]
share_busy = [100 * b["busy"] / b["cfg"].max_model_len for b in bounds]
share_alone = [100 * b["alone"] / b["cfg"].max_model_len for b in bounds]
ax.barh(names, [100] * len(bounds), color="#f8d7da", label="can crash")
ax.barh(names, share_alone, color="#fde9b6", label="safe only when prompts run alone")
ax.barh(names, share_busy, color="#b7e4c7", label="safe under any schedule")
ax.set_xlabel("context length, % of max_model_len (no fix)")
ax.set_xlim(0, 100)
ax.invert_yaxis()
ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ### The busy-server bound, served on the engine
#
# **Predict, then run.** Take the bug report's preset and the shortest prompt that the
# busy-server bound says can fail. Put a request of `max_num_batched_tokens - (n - 129)`
# tokens in front of it, so that its first step gets `n - 129` tokens. Predict: that prompt
# dies on its second chunk, asking for exactly the continuation buffers of `n - 129` cached
# tokens (a whole number of blocks); one token shorter, the same schedule is served, because
# its first chunk is cut back to the block boundary below. The cell prints each step's
# chunks as the scheduler handed them out. (The preset's blocks are vLLM's default 16 tokens;
# notebook 02 §5 shows what a larger hybrid block changes.)

# %%
def serve_behind(c: EngineConfig, n: int, *, fix: bool) -> tuple[list[str], WorkspaceLockedError | None]:
    """Serve an ``n``-token prompt behind a request that leaves it ``n - T - 1`` tokens of the first step."""
    eng = LLMEngine(c, fix=fix, device=device)
    eng.add_request(c.max_num_batched_tokens - (n - T - 1), max_tokens=2)
    eng.add_request(n, max_tokens=1)
    reqs = dict(zip(("front", "prompt"), eng.scheduler.waiting))  # the scheduler's Request objects
    steps = []
    while eng.has_unfinished_requests():
        before = {who: r.num_computed_tokens for who, r in reqs.items()}
        try:
            eng.step()
        except WorkspaceLockedError as exc:  # the engine is dead now; nothing else is expected
            r = reqs["prompt"]
            return steps + [f"prompt {r.prompt_len - r.num_computed_tokens} new on {r.num_computed_tokens:,} cached: "
                            "refused"], exc
        steps.append(", ".join(f"{who} {r.num_computed_tokens - before[who]} new on {before[who]:,} cached"
                               for who, r in reqs.items() if r.num_computed_tokens != before[who]
                               and before[who] < r.prompt_len) or "decode only")
    return steps, None


busy_bound = next(b["busy"] for b in bounds if b["name"] == PRESET)
n_bad = busy_bound + 1  # the shortest prompt that some schedule breaks
steps, err = serve_behind(cfg, n_bad, fix=False)
assert isinstance(err, WorkspaceLockedError)
assert err.required_bytes == chunk_workspace_request(cfg, n_bad - T - 1, T + 1).nbytes > err.current_bytes
show_md(f"**{n_bad:,} tokens behind another request**, steps: " + "; ".join(steps) + ".")
show_error(err, f"{n_bad:,} tokens on a busy server: refused ({err.required_bytes:,} B > {err.current_bytes:,} B locked)")

steps_ok, err_ok = serve_behind(cfg, n_bad - 1, fix=False)
assert err_ok is None
cut = (n_bad - 1 - T - 1) // cfg.block_size * cfg.block_size  # the block boundary below its first step's share
assert f"prompt {cut} new on 0 cached" in steps_ok[0] and steps_ok[1] == f"prompt {n_bad - 1 - cut} new on {cut} cached"
assert n_bad < row["bad"] // 4  # far shorter than the first failing prompt alone
assert (n_bad - T - 1) % cfg.block_size == 0  # the refused chunk starts on a block boundary
show_md(f"**{n_bad - 1:,} tokens, the same schedule:** served ({'; '.join(steps_ok)}). Alone, the first failing "
        f"prompt is {row['bad']:,} tokens; behind another request, {n_bad:,}.")

# %% [markdown]
# The refused size and the locked size print alike in vLLM's message, which rounds to two
# decimals; in bytes the request is a little larger (the cell above prints both). The bug
# report's 8K prompt was the first one long enough to fail *alone*; on a busy server with this
# configuration, the first crash can come from a far shorter prompt.

# %% [markdown]
# ## 5 · With the fix, nothing fails
#
# **Predict, then run.** With PR #44053, the metadata builder reserves the largest call each
# consumer can make for `max_model_len` before the lock (notebook 03 shows what and what it
# costs). For how many presets does some prompt still fail alone? How far does the busy-server bound
# reach? Are the two crashes above served?

# %%
fixed_rows = []
for name, c in configs.items():
    with_fix = analysis.locked_bytes(c, fix=True)
    assert first_failing_prompt(c, with_fix) is None
    assert safe_max_model_len(c, with_fix, schedule="any") == c.max_model_len
    fixed_rows.append((name, format_mb(locked[name]), format_mb(with_fix), f"{c.max_model_len:,}"))
show_md(markdown_table(("preset", "locked without the fix (MiB)", "with the fix (MiB)", "safe max_model_len with the fix"),
                       fixed_rows))

fixed = LLMEngine(cfg, fix=True, device=device)
assert fixed.generate(row["bad"], max_tokens=1).finished  # the first failing prompt alone
steps_fixed, err_fixed = serve_behind(cfg, n_bad, fix=True)
assert err_fixed is None  # and the busy-server one
show_md(f"With the fix, {PRESET} serves the {row['bad']:,}-token prompt alone and the {n_bad:,}-token prompt "
        f"behind another request; it locked {format_mb(fixed.locked_bytes)} MiB instead of {format_mb(locked[PRESET])} MiB.")

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# With PR #44053, the metadata builder reserves the largest call each
# consumer can make for `max_model_len` before the lock (notebook 03 shows what and what it
# costs). Predict: for every preset, no prompt fails alone, the busy-server bound reaches
# `max_model_len`, and both crashes above are served.
#
# </details>

# %% [markdown]
# ## Next
#
# * Notebook 03 explains the fix line by line and what it costs per preset.
# * Notebook 08's reservation planner and `tqlab plan` give these answers for your own
#   deployment: `tqlab plan --preset nemotron-3-super-120b-a12b --json -` prints the first
#   failing prompt and the first refused call.

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU (engines on `{device}`).*")

# %% [markdown]
# ## Exercises
#
# Write each function below (replace `raise NotImplementedError`), then run the cell: it checks your answer
# against tqlab's own on a few cases and says, per exercise, "correct", what differs, or "not attempted yet".
# Everything runs on a CPU. The solutions are in the collapsed cell after it.
#
# 1. **Chunks.** `chunks(preset, prompt_tokens)`: `(cached, new)` for each prefill chunk of a prompt served
#    alone, in chunks of `max_num_batched_tokens`. (§2)
# 2. **Alone.** `survives_alone(preset, prompt_tokens)`: whether that prompt survives without the fix (use
#    `tqlab.predict.analysis.first_failing_prompt` and `unfixed_locked_bytes`). (§2)
# 3. **The largest call.** `largest_call_bytes(preset)`: the largest dequant call a prompt can make, 129 new tokens
#    on `max_model_len − 130` cached ones: two float16 `(1, Hk per rank, cached rounded up to the block size,
#    head_dim)` buffers, each rounded up to 256 bytes. (§2)

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb09


def chunks(preset, prompt_tokens):
    raise NotImplementedError


def survives_alone(preset, prompt_tokens):
    raise NotImplementedError


def largest_call_bytes(preset):
    raise NotImplementedError


check("chunks", chunks, nb09.chunks, nb09.CASES["chunks"])
check("survives_alone", survives_alone, nb09.survives_alone, nb09.CASES["survives_alone"])
check("largest_call_bytes", largest_call_bytes, nb09.largest_call_bytes, nb09.CASES["largest_call_bytes"])

# %% [markdown]
# <details><summary><b>Solutions</b> (click to open)</summary>
#
# ```python
# from tqlab.core.config import EngineConfig
# from tqlab.predict.analysis import first_failing_prompt, unfixed_locked_bytes
#
#
# def chunks(preset, prompt_tokens):
#     m = EngineConfig.from_preset(preset).max_num_batched_tokens
#     return [(c, min(m, prompt_tokens - c)) for c in range(0, prompt_tokens, m)]
#
#
# def survives_alone(preset, prompt_tokens):
#     cfg = EngineConfig.from_preset(preset)
#     bad = first_failing_prompt(cfg, unfixed_locked_bytes(cfg))
#     return bad is None or prompt_tokens < bad
#
#
# def largest_call_bytes(preset):
#     cfg = EngineConfig.from_preset(preset)
#     cached = cfg.max_model_len - 130
#     padded = -(-cached // cfg.block_size) * cfg.block_size
#     one = cfg.num_kv_heads_per_rank * padded * cfg.head_dim * 2
#     return 2 * (-(-one // 256) * 256)
# ```
#
# </details>
