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
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Cross-check with vLLM, and watch a real workspace
#
# The other notebooks use tqlab's own `WorkspaceManager` and reservation. This one puts
# them next to **vLLM's own classes** (vLLM 0.33, which contains the fix, PR #44053) and
# shows the same numbers from both. You will learn, point by point, where tqlab matches vLLM:
#
# 1. the same call sequence through `vllm.v1.worker.workspace.WorkspaceManager` and
#    `tqlab.core.workspace.WorkspaceManager`: view offsets, slot sizes, refusals, word for word;
# 2. the reservation that vLLM's `TurboQuantMetadataBuilder` makes, next to
#    `tqlab.core.reservation.reservation_plan`, for every preset;
# 3. the bug report's assertion, raised by vLLM's own `_continuation_prefill`;
# 4. `tqlab.vllm.WorkspaceTracer` attached to vLLM's manager in the bug report's scenario:
#    the high-water mark per caller, the size at lock, and the violation with its caller;
# 5. the predictor behind `tqlab inspect-vllm`: a `vllm serve` command line plus the
#    model's `config.json` give, per consumer, the workspace a prompt needs and the
#    largest safe `max_model_len`;
# 6. where tqlab and vLLM differ on purpose, and what the parity suite counted.
#
# **What you need.** CPU only. vLLM's pure-Python modules run on a CPU-only torch; its
# kernels never run (see `parity/README.md`).
#
# **vLLM.** If `vllm` can be imported (the `.venv-parity` venv made by
# `bash parity/install.sh`), sections 1–4 run live. Otherwise they show the results
# recorded by `bash parity/run.sh --record` in `data/parity_results.json`, under a
# banner that names the date, commit, command and vLLM version. Sections 4 (on tqlab's
# manager) and 5 always run live.
#
# **Run time.** Under 10 s without vLLM. With vLLM, about 30 s, most of it the import
# of vLLM. Five **predict, then run** cells check tqlab's predictions against vLLM's own
# classes with `assert`s.

# %%
import platform
import time

_T0 = time.perf_counter()

import torch

import tqlab
from tqlab.vllm import vllm_available, vllm_version

print(
    f"tqlab {tqlab.__version__} · torch {torch.__version__} · Python {platform.python_version()} · "
    f"vLLM importable: {vllm_available()} ({vllm_version() or 'not installed'})"
)

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # this notebook is CPU-only: vLLM's Python classes, never its kernels
check_device(DEVICE, ("cpu",), "07", "it runs vLLM's Python classes, never its kernels")
USE_RECORDED = True  # without vLLM, show the recorded parity results (under a banner)
USE_VLLM = True  # run vLLM's classes live when vllm is importable
PRESET = "nemotron-3-super-120b-a12b"  # the bug report's deployment (data/presets)
CACHED_LEN = None  # cached tokens before the long continuation chunk; None: the chunk vLLM refuses first (computed)

# %%
from tqlab import vllm as vt
from tqlab.predict import report as rp
from tqlab.core.config import EngineConfig, load_preset
from tqlab.lab.display import markdown_table, show_md
from tqlab.lab.recorded import show_parity_banner
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes
from tqlab.core.workspace import compute_layout, format_mb

LIVE = USE_VLLM and vllm_available()
config = EngineConfig.from_preset(PRESET)
recorded_prov, recorded = (None, None)
if not LIVE:
    if not USE_RECORDED:
        raise SystemExit("vLLM is not importable and USE_RECORDED is False: nothing to show for sections 1-3")
    recorded_prov, recorded = vt.load_parity_results()
    show_parity_banner(recorded_prov)
    show_md(
        "**To run this notebook live:** `bash parity/install.sh` (about 3 minutes: vLLM's wheel "
        "with `--no-deps`, its non-CUDA requirements, CPU torch 2.13), then run the notebook with "
        "`.venv-parity/bin/python` as kernel or run the whole suite with `bash parity/run.sh`."
    )
print(f"mode: {'LIVE, vLLM ' + str(vllm_version()) if LIVE else 'recorded results'}; preset {PRESET}: "
      f"per rank Hq {config.num_heads_per_rank}, Hk {config.num_kv_heads_per_rank}, D {config.head_dim}, "
      f"{config.max_num_seqs} sequences, {config.tq_max_kv_splits_for_cuda_graph} KV splits, {config.dtype}")

# %% [markdown]
# ## 0 · tqlab's predictions, before anything runs
#
# Every number the sections below check comes from here: the workspace at lock (the
# split-KV decode views at `max_num_seqs` rows), the first call vLLM refuses for the
# preset's long prompt (a continuation chunk's two fp16 dequant buffers), and its size.
# The cached length of that chunk is `CACHED_LEN` unless the parameter cell sets it.

# %%
PROMPT = load_preset(PRESET)["default_prompt_tokens"]  # the bug report's "~8K tokens" prompt
first = rp.predict(config, [PROMPT]).requests[0].first_refused_unfixed  # the call vLLM dies on
if not LIVE:  # the recorded runs used one cached length: predict for that one
    rec_cached = {r["vllm"]["cached_len"] for r in recorded["test_seed_scenario_table:rows"]}
    assert len(rec_cached) == 1, rec_cached
    if CACHED_LEN is not None and CACHED_LEN not in rec_cached:
        print(f"CACHED_LEN={CACHED_LEN} ignored: the recorded runs used cached_len {min(rec_cached)}")
    CACHED_LEN = min(rec_cached)
CACHED_LEN = first.cached_len if CACHED_LEN is None else CACHED_LEN
HK, D = config.num_kv_heads_per_rank, config.head_dim
LOCKED = rp.locked_bytes_without_fix(config)  # decode at the largest captured batch
ONE_ROW = compute_layout(decode_workspace_shapes(1, config.num_heads_per_rank, D, config.tq_max_kv_splits_for_cuda_graph,
                                                 config.dtype)).total_bytes
CONT = compute_layout(continuation_workspace_shapes(CACHED_LEN, HK, D, config.block_size)).total_bytes
FIXED = rp.predict(config).locked_fixed  # with PR #44053's reservation
TAIL = f"requires {format_mb(CONT)} MB, current size is {format_mb(LOCKED)} MB. Workspace growth is not allowed after locking."
show_md(markdown_table(
    ["prediction", "bytes", "MB"],
    [
        [f"workspace at lock without the fix (decode, {config.max_num_seqs} rows)", f"{LOCKED:,}", format_mb(LOCKED)],
        ["workspace at lock with PR #44053", f"{FIXED:,}", format_mb(FIXED)],
        [f"first refused call of a {PROMPT:,}-token prompt: cached {first.cached_len:,}, {first.q_len:,} new",
         f"{first.nbytes:,}", format_mb(first.nbytes)],
        [f"continuation call at CACHED_LEN = {CACHED_LEN:,}: 2 × (1, {HK}, {CACHED_LEN}, {D}) fp16", f"{CONT:,}",
         format_mb(CONT)],
    ],
))
print(f"predicted refusal: ... {TAIL}")
print(f"bug report (vLLM 0.20): requires {rp.BUG_REPORT_REQUIRED_MB} MB, current size is {rp.BUG_REPORT_LOCKED_MB} MB")

# %% [markdown]
# ## 1 · One call sequence, two workspace managers
#
# Each step is either a `get_simultaneous` on a ubatch slot (2 slots, as with DBO) or a
# lock/unlock. The steps are the bug report's decode views, a small request in slot 1, empty
# views, the lock, a request that fits, the continuation request for `CACHED_LEN` cached
# tokens that does not, the decode views at `max_num_seqs` rows on slot 1, then an unlock. Both managers are called from the same line of
# `tqlab/vllm/`, so their refusal messages must match to the letter, caller included.

# %%
if LIVE:
    rows = vt.compare_managers(vt.demo_steps(config, CACHED_LEN))
else:
    rows = recorded["test_manager_table:rows"]
show_md(markdown_table(
    ["step", "call", "vLLM", "tqlab", "same"],
    [[r["step"], r["op"], r["vllm"], r["tqlab"], "✔" if r["same"] else "✘"] for r in rows],
))
print(f"{sum(r['same'] for r in rows)}/{len(rows)} steps identical")

# %% [markdown]
# The two refusals are the bug in miniature. After the lock, slot 0 holds the decode
# views and the continuation buffers do not fit. Slot 1 grew only for a single decode
# row, so it refuses `max_num_seqs` rows. vLLM 0.33 grows only the slot that asks, and
# so does tqlab.
#
# **Predict, then run.** Every step is identical. Exactly two steps are refused: slot 0's
# continuation request (`CONT` bytes against `LOCKED`) and slot 1's decode views at
# `max_num_seqs` rows (`LOCKED` bytes against one row's `ONE_ROW`).

# %%
refused = [r for r in rows if "Workspace is locked" in r["vllm"]]
assert all(r["same"] for r in rows), [r["step"] for r in rows if not r["same"]]
assert len(refused) == 2, [r["step"] for r in refused]
assert refused[0]["vllm"].endswith(TAIL)
assert refused[1]["vllm"].endswith(f"requires {format_mb(LOCKED)} MB, current size is {format_mb(ONE_ROW)} MB. "
                                   "Workspace growth is not allowed after locking.")
show_md(f"Slot 0 refused **{format_mb(CONT)} MB** at **{format_mb(LOCKED)} MB**; slot 1 refused "
        f"**{format_mb(LOCKED)} MB** at **{format_mb(ONE_ROW)} MB**: as predicted, in both managers.")

# %% [markdown]
#
# ## 2 · The reservation (PR #44053), vLLM's builder vs `reservation_plan`
#
# vLLM's `TurboQuantMetadataBuilder` is built with stand-in configs, as vLLM's own unit
# test builds it (`tqlab.vllm.fake_vllm_configs`). A recorder stands in for the
# workspace manager and keeps the calls.

# %%
rows = vt.compare_reservations() if LIVE else recorded["test_reservation_table:rows"]
show_md(markdown_table(
    ["preset", "vLLM: TurboQuantMetadataBuilder._reserve_workspace", "tqlab: reservation_plan", "reserved", "same"],
    [[r["preset"], r["vllm_calls"], r["tqlab_calls"], f"{format_mb(r['reserved_bytes'])} MB", "✔" if r["same"] else "✘"]
     for r in rows],
))

# %% [markdown]
# ## 3 · The bug report's assertion, raised by vLLM's own code
#
# vLLM's `_decode_attention` warms the workspace up at `max_num_seqs` rows, as CUDA graph
# capture does. Then the workspace locks. Then one chunk of `CONTINUATION_DECODE_THRESHOLD + 1`
# new tokens after `CACHED_LEN` cached ones goes through vLLM's `_prefill_attention`, which hands it to
# `_continuation_prefill`. The same steps run once more with the fix (the builder reserves
# first), and once through tqlab's manager.

# %%
if LIVE:
    seed_rows = []
    for fixed in (False, True):
        v = vt.run_vllm_seed_scenario(config, cached_len=CACHED_LEN, fixed=fixed)
        t = vt.run_seed_scenario(config, cached_len=CACHED_LEN, fixed=fixed)
        seed_rows.append({"fixed": fixed, "vllm": v.to_dict(), "tqlab": t.to_dict()})
else:
    seed_rows = recorded["test_seed_scenario_table:rows"]


def _outcome(d):
    if d["error"]:
        return d["error"]
    return "buffers granted" + (f" (then {d['kernel_error']}: a Triton kernel, not runnable on CPU)" if d.get("kernel_error") else "")


show_md(markdown_table(
    ["PR #44053", "size at lock", "vLLM 0.33 (its own _continuation_prefill)", "tqlab"],
    [["with" if r["fixed"] else "without", f"{format_mb(r['vllm']['size_at_lock'][0])} MB",
      _outcome(r["vllm"]), _outcome(r["tqlab"])] for r in seed_rows],
))

# %% [markdown]
# **Predict, then run.** Without the fix, vLLM's own `_continuation_prefill` and tqlab's
# manager refuse the predicted `CONT` bytes at the predicted `LOCKED` bytes, word for word
# after the caller. With the fix both lock at the reservation's size and grant the buffers.

# %%
unfixed, fixed = (next(r for r in seed_rows if r["fixed"] is f) for f in (False, True))
for side in ("vllm", "tqlab"):
    assert unfixed[side]["cached_len"] == CACHED_LEN
    assert unfixed[side]["error"].endswith(TAIL), unfixed[side]["error"]
    assert ":_continuation_prefill' requires" in unfixed[side]["error"]
    assert unfixed[side]["size_at_lock"][0] == LOCKED
    assert fixed[side]["error"] is None and fixed[side]["size_at_lock"][0] == FIXED
vllm_sizes = unfixed["vllm"]["error"].split("' requires ", 1)[1]
assert vllm_sizes == unfixed["tqlab"]["error"].split("' requires ", 1)[1]  # vLLM's message sizes == tqlab's
report_says = f"requires {rp.BUG_REPORT_REQUIRED_MB} MB, current size is {rp.BUG_REPORT_LOCKED_MB} MB"
show_md(markdown_table(
    ["source", "refusal"],
    [["bug report (vLLM 0.20, `turboquant_attn.py:757`)", report_says],
     [f"vLLM {recorded_prov['vllm'] if not LIVE else vllm_version()}{'' if LIVE else ' (recorded)'}", "requires " + vllm_sizes],
     ["tqlab prediction", TAIL]],
))
same_as_report = report_says in unfixed["vllm"]["error"]
print(f"vLLM's refusal {'matches' if same_as_report else 'differs from'} the bug report's numbers "
      f"(cached_len {CACHED_LEN:,}); the call sits on a different line in vLLM 0.33")

# %% [markdown]
#
# ## 4 · The tracer on the bug report's scenario
#
# `WorkspaceTracer(manager)` wraps the instance's growth path. On vLLM's manager that is
# `_ensure_workspace_size`, which every request passes through with its total bytes. On
# tqlab's manager it is `get_simultaneous`. No vLLM file changes. The tracer records
# every caller's high-water mark, the slot sizes at each lock, and every refusal with its
# caller. The wrapper frames carry the names the managers skip, so the managers still
# name the real caller. In a real deployment, `tqlab.vllm.install_vllm_hook(path)`
# does the same for every manager the worker process creates, and writes the report
# to JSON when the process exits.

# %%
for r in seed_rows:
    label = "with the fix" if r["fixed"] else "without the fix"
    print(f"--- vLLM's manager, {label}{'' if LIVE else ' (recorded)'}")
    print(vt.format_trace_report(r["vllm"]["trace"]))
    print()

m_trace = vt.run_seed_scenario(config, cached_len=CACHED_LEN, fixed=False)  # always live: tqlab's manager
print("--- tqlab's manager, without the fix (live)")
print(vt.format_trace_report(m_trace.trace))

# %% [markdown]
# **Predict, then run.** Both tracers record one violation, by `_continuation_prefill`:
# `CONT` bytes asked of a slot locked at `LOCKED`. The decode caller's high-water mark is
# `LOCKED` (it set the size), and the continuation caller's is `CONT`.

# %%
for label, trace in (("vLLM", unfixed["vllm"]["trace"]), ("tqlab", m_trace.trace)):
    (v,) = trace["violations"]
    assert v["caller"].endswith(":_continuation_prefill") and v["slot"] == 0, (label, v)
    assert (v["required_bytes"], v["current_bytes"]) == (CONT, LOCKED), (label, v)
    assert trace["size_at_lock_bytes"][0] == LOCKED
    high = {c["caller"].rsplit(":", 1)[1]: c["high_water_bytes"] for c in trace["callers"]}
    assert high["_continuation_prefill"] == CONT and high["_decode_attention"] == LOCKED, (label, high)
print(f"both tracers: one violation, {format_mb(CONT)} MB asked at {format_mb(LOCKED)} MB, as predicted")

# %% [markdown]
# ## 5 · Predict it from the deployment: `tqlab inspect-vllm`
#
# The input is the bug report's `vllm serve` line and a `config.json`. This notebook
# downloads nothing, so the `config.json` here is built from the preset's attention
# fields: query heads, KV heads, head dim and dtype. `inspect_vllm` turns both into
# per-rank shapes. For each prompt length and each consumer it gives the workspace
# needed and whether that fits the size at lock, with and without the fix. It also gives
# the largest safe `max_model_len`, in two versions: for a request alone, and for any
# chunking that a busy scheduler or a prefix-cache hit can produce. With vLLM importable
# (`demo`), the first crashing chunk also runs through vLLM's own classes.

# %%
serve_cmd = (
    f"vllm serve /models/{PRESET} --tensor-parallel-size {config.tensor_parallel_size} "
    f"--max-num-seqs {config.max_num_seqs} --max-model-len {config.max_model_len} "
    f"--max-num-batched-tokens {config.max_num_batched_tokens} --trust-remote-code "
    f"--kv-cache-dtype {config.kv_cache_dtype}"
)
model_json = {  # the fields of the model's config.json that size the workspace
    "num_attention_heads": config.num_attention_heads,
    "num_key_value_heads": config.num_key_value_heads,
    "head_dim": config.head_dim,
    "num_hidden_layers": config.num_hidden_layers,
    "torch_dtype": str(config.dtype).removeprefix("torch."),
}
first_two_chunks = config.max_num_batched_tokens + 1 + rp.CONTINUATION_DECODE_THRESHOLD  # 128 new tokens: last safe
prompts = [config.max_num_batched_tokens, first_two_chunks - 1, first_two_chunks, 2 * config.max_num_batched_tokens]
print(serve_cmd)
report = rp.inspect_vllm(serve_cmd, model_json, prompt_tokens=prompts, demo=LIVE)

# %% [markdown]
# **Predict, then run.** Computed by hand from the chunk rule: the prompt of
# `max_num_batched_tokens + 128` tokens is served (its second chunk is short); one token
# more and the second chunk, at `cached_len = max_num_batched_tokens`, is the first
# refused call, with two `(1, Hk, max_num_batched_tokens, D)` fp16 buffers. With vLLM
# importable, vLLM's own classes refuse that chunk with exactly those bytes.

# %%
m = config.max_num_batched_tokens
by_len = {r["prompt_tokens"]: r for r in report["prediction"]["requests"]}
want = 2 * HK * m * D * 2  # two fp16 buffers of (1, Hk, m, D), m a multiple of block_size
assert m % config.block_size == 0
assert [by_len[n]["crashes_unfixed"] for n in prompts] == [False, False, True, True]
assert not any(r["crashes_fixed"] for r in by_len.values())
assert report["prediction"]["first_failing_prompt"] == first_two_chunks
for n in prompts[2:]:
    f = by_len[n]["first_refused_unfixed"]
    assert (f["consumer"], f["cached_len"], f["nbytes"]) == (rp.DEQUANT_CHUNK, m, want), f
assert report["prediction"]["max_num_batched_tokens_source"] == "flag --max-num-batched-tokens"
if LIVE:
    (v_unfixed, *v_fixed) = report["demo"]
    assert v_unfixed["error"].endswith(f"requires {format_mb(want)} MB, current size is {format_mb(LOCKED)} MB. "
                                       "Workspace growth is not allowed after locking.")
    assert all(r["error"] is None for r in v_fixed)
show_md(f"First refused call: cached {m:,}, 2 × {HK} × {m:,} × {D} × 2 bytes = **{want:,} bytes = "
        f"{format_mb(want)} MB**, as predicted{' and as vLLM raised it' if LIVE else ''}.")

# %% [markdown]
# **The same line without `--max-num-batched-tokens`.** The bug report does not give it.
# vLLM then uses its default for `vllm serve` on a small GPU, and the prompt is cut
# into smaller chunks: the first refused call comes one smaller chunk in, and is
# smaller. The report names that call, the chunk size it assumed and where that came
# from, and says when the difference from the bug report's size is only the chunk size.

# %%
bare_cmd = serve_cmd.replace(f" --max-num-batched-tokens {m}", "")
bare = rp.inspect_vllm(bare_cmd, model_json, prompt_tokens=[PROMPT])["prediction"]
m0 = bare["max_num_batched_tokens"]
f0 = bare["requests"][0]["first_refused_unfixed"]
assert bare["max_num_batched_tokens_source"].startswith("vLLM default (`vllm serve`")
assert m0 < m and (f0["cached_len"], f0["nbytes"]) == (m0, 2 * HK * m0 * D * 2)
assert any(n.startswith(f"the bug report's '{rp.BUG_REPORT_REQUIRED_MB} MB'") for n in bare["notes"])
show_md(f"Default chunk {m0:,}: first refused call at cached {m0:,}, **{format_mb(f0['nbytes'])} MB** "
        f"(the bug report: {rp.BUG_REPORT_REQUIRED_MB} MB, with chunks of {m:,}).")

# %% [markdown]
# The two bounds differ a lot. A request prefilled alone survives until its second chunk
# takes the dequant path: more than 128 new tokens after `max_num_batched_tokens` cached
# ones. On a busy server the scheduler can cut any prompt at any point, and a prefix-cache
# hit can start a chunk after any block. Past a few hundred cached tokens some chunk can
# always crash. With the fix, every length up to `max_model_len` fits.
#
# ## 6 · Where tqlab and vLLM differ, and what the parity suite counted

# %%
prov, rec = vt.load_parity_results()  # the divergences as the last parity run observed them
if LIVE:
    print(f"from the last recorded parity run: vLLM {prov['vllm']}, {prov['date']}, commit {prov['commit'][:12]}")
else:
    show_parity_banner(prov)
dbo_v = [f"{format_mb(b)} MB" for b in rec["test_divergence_dbo_reservation_sizes_one_slot:vllm_slot_sizes"]]
dbo_t = [f"{format_mb(b)} MB" for b in rec["test_divergence_dbo_reservation_sizes_one_slot:tqlab_slot_sizes"]]
show_md(markdown_table(
    ["case", f"vLLM {prov['vllm']}", "tqlab"],
    [
        ["first request on a slot, all views empty", rec["test_divergence_1_all_empty_first_request:vllm"],
         rec["test_divergence_1_all_empty_first_request:tqlab"]],
        ["negative dimension", rec["test_divergence_2_negative_dimension:vllm"],
         rec["test_divergence_2_negative_dimension:tqlab"]],
        ["dtype that is not a torch.dtype", "AttributeError", "TypeError"],
        ["ubatch slot out of range", "IndexError", "ValueError"],
        ["current_workspace_manager() before init", "AssertionError", "RuntimeError"],
        ["DBO: slot sizes after the builder's reservation", f"{dbo_v} (only the slot it runs in)",
         f"{dbo_t} (reserve_workspace sizes every slot)"],
        [f"continuation chunk of ≤ {rp.CONTINUATION_DECODE_THRESHOLD} new tokens (found by this suite, now agreeing)",
         rec["test_short_continuation_chunks_make_no_workspace_call:vllm_q128"]
         + " (the decode kernel allocates its own buffers)",
         f"{rec['test_short_continuation_chunks_make_no_workspace_call:tqlab_reservation_q128_bytes']} bytes asked of the workspace "
         "(tqlab first modelled decode views with q_len rows; the parity suite caught it)"],
    ],
))
diff = rec["test_zz_record_differential_stats:differential"]
cfgs = rec["test_zz_record_reservation_coverage:random_configs"]
pred = rec["test_zz_record_predictor_coverage:predictor_cases"]
show_md(markdown_table(
    ["what", "count"],
    [
        ["parity tests passed", rec["summary"].get("passed", 0)],
        ["parity tests failed", rec["summary"].get("failed", 0)],
        ["random call sequences / steps compared", f"{diff['sequences']} / {diff['steps']}"],
        ["… of which refusals (identical text)", diff["refusals"]],
        ["… all-empty first requests (divergence 1, asserted)", diff["all_empty_first"]],
        ["random configs: builder calls == reservation_plan", cfgs["compared"]],
        ["random configs: predictor verdict == vLLM's own code path", pred["compared"]],
    ],
))

# %% [markdown]
# **Predict, then run.** The recorded parity run failed nothing, and every comparison it
# counted was made: call sequences with refusals among them, every random config's
# reservation, every predictor verdict (crashes + fits).

# %%
assert rec["summary"].get("failed", 0) == 0 and rec["summary"].get("error", 0) == 0
assert rec["summary"]["passed"] > 0
assert diff["sequences"] > 0 and diff["steps"] >= diff["sequences"] and diff["refusals"] > 0
assert cfgs["compared"] > 0
assert pred["compared"] == pred["crashes"] + pred["fits"] > 0
print(f"parity summary: {rec['summary']}")

# %% [markdown]
# The last two rows of the divergence table are about more than tqlab. In vLLM 0.33 the
# reservation covers only the slot it runs in, so with DBO, slot 1 can still refuse a
# long chunk after the lock. And PR #44053 reserves continuation buffers only when chunked
# prefill is on. A prefix-cache hit produces a continuation chunk all the same, and the
# parity suite shows vLLM's own code refusing that chunk with the fix in place
# (`test_fix_leaves_prefix_hits_uncovered_without_chunked_prefill`). That was shown with
# vLLM's classes on CPU; it has not been run end to end on a GPU.

# %%
print(f"notebook ran in {time.perf_counter() - _T0:.1f} s ({'live vLLM' if LIVE else 'recorded parity results'})")
