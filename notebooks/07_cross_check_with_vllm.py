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
# # 07 · How do we know tqlab is right? Cross-checks against vLLM's own code
#
# Every other notebook runs tqlab's `WorkspaceManager`, reservation and predictor. Why trust them? This
# lesson puts them next to **vLLM's own classes** (vLLM 0.33, which contains the fix, PR #44053) and asks,
# for each piece, the question a reviewer would ask: *run the same input through both — do they give the
# same output, byte for byte?* You will learn three ways to check a model of a system against the system:
#
# 1. **the same calls, side by side**: one call sequence through vLLM's `WorkspaceManager` and tqlab's
#    (view offsets, slot sizes, refusals, word for word), and the reservation vLLM's
#    `TurboQuantMetadataBuilder` makes next to `tqlab.core.reservation.reservation_plan`, for every preset;
# 2. **the failure itself, reproduced by the real code**: the bug report's assertion raised by vLLM's own
#    `_continuation_prefill`, a tracer that watches vLLM's manager, and one picture of every byte count;
# 3. **prediction before observation**: `tqlab inspect-vllm` predicts from a `vllm serve` line and a
#    `config.json`; a recorded two-rank deployment, traced by tqlab's vLLM plugin, is held against it;
#    and where tqlab and vLLM still differ, and what the parity suite counted.
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
# of vLLM. Each **predict, then run** question comes before the cell that answers it and
# checks tqlab's predictions against vLLM's own classes with `assert`s.
#
# **Units.** MiB = 2**20 bytes, as everywhere in tqlab (notebook 01); vLLM's own message says
# "MB" for the same unit, and is quoted as it is.

# %%
import time

_T0 = time.perf_counter()

import torch

from tqlab.vllm import vllm_available, vllm_version

from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment
print(f"vLLM importable in this kernel: {vllm_available()} ({vllm_version() or 'not installed'})")

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
from tqlab.predict.analysis import safe_max_model_len, unfixed_locked_bytes
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
first = rp.consumer_report(config, [PROMPT]).requests[0].first_refused_unfixed  # the call vLLM dies on
if not LIVE:  # the recorded runs used one cached length: predict for that one
    rec_cached = {r["vllm"]["cached_len"] for r in recorded["test_seed_scenario_table:rows"]}
    assert len(rec_cached) == 1, rec_cached
    if CACHED_LEN is not None and CACHED_LEN not in rec_cached:
        print(f"CACHED_LEN={CACHED_LEN} ignored: the recorded runs used cached_len {min(rec_cached)}")
    CACHED_LEN = min(rec_cached)
CACHED_LEN = first.cached_len if CACHED_LEN is None else CACHED_LEN
HK, D = config.num_kv_heads_per_rank, config.head_dim
LOCKED = unfixed_locked_bytes(config)  # decode at the largest captured batch
ONE_ROW = compute_layout(decode_workspace_shapes(1, config.num_heads_per_rank, D, config.tq_max_kv_splits_for_cuda_graph,
                                                 config.dtype)).total_bytes
CONT = compute_layout(continuation_workspace_shapes(CACHED_LEN, HK, D, config.block_size)).total_bytes
FIXED = rp.consumer_report(config).locked_fixed  # with PR #44053's reservation
TAIL = f"requires {format_mb(CONT)} MB, current size is {format_mb(LOCKED)} MB. Workspace growth is not allowed after locking."
show_md(markdown_table(
    ["prediction", "bytes", "MiB"],
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
# tokens, the decode views at `max_num_seqs` rows on slot 1, then an unlock. Both managers are
# called from the same line of `tqlab/vllm/`, so their refusal messages must match to the
# letter, caller included. vLLM 0.33 grows only the slot that asks.
#
# **Predict, then run.** How many of the steps differ between the two managers? How many are
# refused after the lock, on which slot, and asking how many bytes against how many? (Hint:
# `CONT`, `LOCKED` and one decode row's `ONE_ROW` are in section 0's table.)

# %%
if LIVE:
    rows = vt.compare_managers(vt.demo_steps(config, CACHED_LEN))
else:
    rows = recorded["test_manager_table:rows"]
show_md(markdown_table(
    ["step", "call", "vLLM", "tqlab", "same"],
    [[r["step"], r["op"], r["vllm"], r["tqlab"], "✔" if r["same"] else "✘"] for r in rows],
))
refused = [r for r in rows if "Workspace is locked" in r["vllm"]]
assert all(r["same"] for r in rows), [r["step"] for r in rows if not r["same"]]
assert len(refused) == 2, [r["step"] for r in refused]
assert refused[0]["vllm"].endswith(TAIL)
assert refused[1]["vllm"].endswith(f"requires {format_mb(LOCKED)} MB, current size is {format_mb(ONE_ROW)} MB. "
                                   "Workspace growth is not allowed after locking.")
show_md(f"{sum(r['same'] for r in rows)}/{len(rows)} steps identical. Slot 0 refused **{format_mb(CONT)} MiB** at "
        f"**{format_mb(LOCKED)} MiB**; slot 1 refused **{format_mb(LOCKED)} MiB** at **{format_mb(ONE_ROW)} MiB**: "
        "as predicted, in both managers.")

# %% [markdown]
# The two refusals are the bug in miniature. After the lock, slot 0 holds the decode
# views and the continuation buffers do not fit. Slot 1 grew only for a single decode
# row, so it refuses `max_num_seqs` rows.

# %% [markdown]
# ## 2 · The reservation (PR #44053), vLLM's builder vs `reservation_plan`
#
# vLLM's `TurboQuantMetadataBuilder` is built with stand-in configs, as vLLM's own unit
# test builds it (`tqlab.vllm.fake_vllm_configs`). A recorder stands in for the
# workspace manager and keeps the calls.
#
# **Predict, then run.** For how many presets do vLLM's builder and `reservation_plan` make
# different calls? Which preset reserves the most, and is it the longest `max_model_len` or
# the most KV heads per rank that decides?

# %%
rows = vt.compare_reservations() if LIVE else recorded["test_reservation_table:rows"]
show_md(markdown_table(
    ["preset", "vLLM: TurboQuantMetadataBuilder._reserve_workspace", "tqlab: reservation_plan", "reserved", "same"],
    [[r["preset"], r["vllm_calls"], r["tqlab_calls"], f"{format_mb(r['reserved_bytes'])} MiB", "✔" if r["same"] else "✘"]
     for r in rows],
))
assert all(r["same"] for r in rows), [r["preset"] for r in rows if not r["same"]]
biggest = max(rows, key=lambda r: r["reserved_bytes"])
print(f"{sum(not r['same'] for r in rows)} of {len(rows)} presets differ; the largest reservation is "
      f"{biggest['preset']}'s, {format_mb(biggest['reserved_bytes'])} MiB")

# %% [markdown]
# ### The early return
#
# PR #44053's `_reserve_workspace` starts with
# `if not is_workspace_manager_initialized(): return` (`vllm/v1/attention/backends/turboquant_attn.py`):
# a metadata builder made outside a worker, with no workspace manager yet (a unit test, a
# tool), reserves nothing and raises nothing. `tqlab.core.reservation.reserve_workspace` does
# the same when it is given no manager and none is initialized.
#
# **Predict, then run.** With no manager initialized, does `reserve_workspace` raise, return
# the plan, or return nothing? Does it create a manager on the way?

# %%
from tqlab.core.reservation import reserve_workspace
from tqlab.core.workspace import init_workspace_manager, is_workspace_manager_initialized, reset_workspace_manager

reset_workspace_manager()
early = reserve_workspace(config)  # no manager given, none initialized
assert early == [] and not is_workspace_manager_initialized()
m_now = init_workspace_manager("meta")
made = reserve_workspace(config)  # now the process-wide manager exists: the plan is made
assert len(made) == 2 and m_now.size_bytes() == FIXED
reset_workspace_manager()
if LIVE:  # vLLM's own builder, with vLLM's manager reset: no error, no manager created
    import importlib

    import vllm.v1.worker.workspace as vws

    tq = importlib.import_module("vllm.v1.attention.backends.turboquant_attn")
    vws.reset_workspace_manager()
    vllm_config, spec = vt.fake_vllm_configs(config)
    with vt.vllm_cpu_patches():
        tq.TurboQuantMetadataBuilder(kv_cache_spec=spec, layer_names=["model.layers.0.self_attn.attn"],
                                     vllm_config=vllm_config, device=torch.device("cpu"))
    assert not vws.is_workspace_manager_initialized()
    print("vLLM's TurboQuantMetadataBuilder without a manager: built, nothing reserved (live)")
else:
    print("vLLM side (recorded): " + rec_early if (rec_early := recorded.get(
        "test_reservation_returns_early_without_a_manager_in_both:outcome")) else
          "vLLM side: run `bash parity/run.sh -k early` (parity/test_startup_order_parity.py) to see it")
print(f"no manager: reserve_workspace returned {early}; with one: {len(made)} calls, {format_mb(FIXED)} MiB")

# %% [markdown]
# **Who else asks the workspace?** TurboQuant is one consumer of many. Notebook 10 is their home: every
# consumer vLLM 0.33's source calls the workspace from (a census read from its code), which phase sizes each,
# and which could crash the way TurboQuant did.

# %% [markdown]
# ## 3 · The bug report's assertion, raised by vLLM's own code
#
# vLLM's `_decode_attention` warms the workspace up at `max_num_seqs` rows, as CUDA graph
# capture does. Then the workspace locks. Then one chunk of `CONTINUATION_DECODE_THRESHOLD + 1`
# new tokens after `CACHED_LEN` cached ones goes through vLLM's `_prefill_attention`, which hands it to
# `_continuation_prefill`. The same steps run once more with the fix (the builder reserves
# first), and once through tqlab's manager.
#
# **Predict, then run.** Without the fix, what size does vLLM's own `_continuation_prefill`
# ask for, against what size at lock — and does tqlab's manager word it the same way after the
# caller? With the fix, at what size do both lock?

# %%
if LIVE:
    report_rows = []
    for fixed in (False, True):
        v = vt.run_vllm_seed_scenario(config, cached_len=CACHED_LEN, fixed=fixed)
        t = vt.run_seed_scenario(config, cached_len=CACHED_LEN, fixed=fixed)
        report_rows.append({"fixed": fixed, "vllm": v.to_dict(), "tqlab": t.to_dict()})
else:
    report_rows = recorded["test_seed_scenario_table:rows"]


def _outcome(d):
    if d["error"]:
        return d["error"]
    return "buffers granted" + (f" (then {d['kernel_error']}: a Triton kernel, not runnable on CPU)" if d.get("kernel_error") else "")


show_md(markdown_table(
    ["PR #44053", "size at lock", "vLLM 0.33 (its own _continuation_prefill)", "tqlab"],
    [["with" if r["fixed"] else "without", f"{format_mb(r['vllm']['size_at_lock'][0])} MiB",
      _outcome(r["vllm"]), _outcome(r["tqlab"])] for r in report_rows],
))
unfixed, fixed = (next(r for r in report_rows if r["fixed"] is f) for f in (False, True))
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
# ### The picture: vLLM and tqlab, value by value
#
# Every byte count of sections 2 and 3, measured on both sides: the reservation vLLM's
# builder makes per preset (its calls laid out by the workspace rule) next to tqlab's
# `reservation_plan`, and the bug report's scenario — the size at lock without the fix, what
# `_continuation_prefill` asks, the size at lock with the fix — from vLLM's manager and from
# tqlab's. A dot (vLLM) and a diamond (tqlab) at the same height in each row agree; a preset
# that reserves nothing (no TurboQuant layer) sits at the left edge, labelled.
#
# **Predict, then run.** Will any row show the two markers apart? And how many times larger
# than the size at lock (without the fix) is the continuation request?

# %%
from tqlab.core.reservation import plan_bytes, reservation_plan
import matplotlib.pyplot as plt

from tqlab.lab.plots_parity import parity_points, plot_parity_side_by_side


def _vllm_calls(preset: str) -> list:
    """vLLM's builder calls for ``preset``: live, or from the recorded parity run (dtype names -> torch)."""
    if LIVE:
        with vt.vllm_cpu_patches():
            return vt.vllm_reservation_calls(EngineConfig.from_preset(preset))
    return [tuple((tuple(sh), getattr(torch, dt)) for sh, dt in call)
            for call in recorded[f"test_presets_side_by_side[{preset}]:calls"]]


presets_shown = [r["preset"] for r in vt.compare_reservations()] if LIVE else sorted(
    k.split("[", 1)[1].split("]", 1)[0] for k in recorded if k.startswith("test_presets_side_by_side[") and
    k.endswith(":calls"))
reservations = {p: (plan_bytes(_vllm_calls(p)), plan_bytes(reservation_plan(EngineConfig.from_preset(p))))
                for p in presets_shown}
points = parity_points(reservations, report_rows)
fig = plot_parity_side_by_side(points, title=f"tqlab vs vLLM {vllm_version() if LIVE else recorded_prov['vllm'] + ' (recorded)'}"
                               f": {PRESET} scenario at cached_len {CACHED_LEN:,}, reservations per preset")
plt.show()
apart = [(panel, label) for panel, label, v, t in points if v != t]
ratio = next(v for _, label, v, _ in points if label == "_continuation_prefill asks") / LOCKED
assert apart == [], apart
print(f"{len(points)} rows, {len(apart)} apart; the continuation request is {ratio:.1f}× the size at lock")

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
#
# **Predict, then run.** How many violations does each tracer record, by which caller? Which
# caller's high-water mark set the size at lock?

# %%
m_trace = vt.run_seed_scenario(config, cached_len=CACHED_LEN, fixed=False)  # always live: tqlab's manager
traces = [(f"vLLM, {'with' if r['fixed'] else 'without'} the fix{'' if LIVE else ' (recorded)'}", r["vllm"]["trace"])
          for r in report_rows] + [("tqlab, without the fix (live)", m_trace.trace)]


def _high(trace, name):
    return next((c["high_water_bytes"] for c in trace["callers"] if c["caller"].endswith(":" + name)), 0)


show_md(markdown_table(
    ["manager", "_decode_attention high-water", "_continuation_prefill high-water", "size at lock", "violations"],
    [[label, f"{format_mb(_high(t, '_decode_attention'))} MiB", f"{format_mb(_high(t, '_continuation_prefill'))} MiB",
      f"{format_mb(t['size_at_lock_bytes'][0])} MiB",
      "; ".join(f"{v['caller'].rsplit(':', 1)[1]} asked {format_mb(v['required_bytes'])} MiB at "
                f"{format_mb(v['current_bytes'])} MiB (slot {v['slot']})" for v in t["violations"]) or "none"]
     for label, t in traces]))
for label, trace in (("vLLM", unfixed["vllm"]["trace"]), ("tqlab", m_trace.trace)):
    (v,) = trace["violations"]
    assert v["caller"].endswith(":_continuation_prefill") and v["slot"] == 0, (label, v)
    assert (v["required_bytes"], v["current_bytes"]) == (CONT, LOCKED), (label, v)
    assert trace["size_at_lock_bytes"][0] == LOCKED
    assert _high(trace, "_continuation_prefill") == CONT and _high(trace, "_decode_attention") == LOCKED, label
assert fixed["vllm"]["trace"]["violations"] == []
print(f"both tracers: one violation, {format_mb(CONT)} MiB asked at {format_mb(LOCKED)} MiB, as predicted; "
      "none with the fix")

# %% [markdown]
# ## 5 · Predict it from the deployment: `tqlab inspect-vllm`
#
# The input is the bug report's `vllm serve` line and the model's `config.json`. This notebook
# downloads nothing, so the `config.json` here is built from the preset: its attention fields
# (query heads, KV heads, head dim, dtype) and, because the report's model is a **hybrid**
# (Mamba and MoE layers around 8 attention layers), a Nemotron-H layer pattern
# (`hybrid_override_pattern`: `*` attention, `M` Mamba, `E` MoE) with those 8 attention layers. The
# hybrid layout matters: for a dense model vLLM 0.33 keeps the first and last two attention layers
# off TurboQuant, for a hybrid none (`TurboQuantConfig.get_boundary_skip_layers`), and a hybrid with
# prefix caching on ends its prefill chunks on block boundaries. The Mamba state sizes are not in the
# preset, so the block size stays the preset's (vLLM would raise it to fit a Mamba page; notebook 02 §5).
# `inspect_vllm` turns both into per-rank shapes; for each prompt length and each consumer it gives the
# workspace needed and whether that fits the size at lock, with and without the fix, and the largest
# safe `max_model_len` for a request alone and for any chunking a busy scheduler or a prefix-cache hit
# can produce. With vLLM importable (`demo`), the first crashing chunk also runs through vLLM's own
# classes.
#
# **Predict, then run.** Of the four prompt lengths in the cell, which crash without the fix? For
# the first that does: at what cached length is the refused chunk, and how many bytes do its
# two fp16 dequant buffers take? (The chunk rule: the first chunk is `max_num_batched_tokens`
# fresh tokens; a second chunk of at most 128 new tokens runs the decode kernel.) How many of the
# 8 attention layers are TurboQuant, and does the busy-server bound agree with notebook 09's?

# %%
serve_cmd = (
    f"vllm serve /models/{PRESET} --tensor-parallel-size {config.tensor_parallel_size} "
    f"--max-num-seqs {config.max_num_seqs} --max-model-len {config.max_model_len} "
    f"--max-num-batched-tokens {config.max_num_batched_tokens} --trust-remote-code "
    f"--kv-cache-dtype {config.kv_cache_dtype}"
)
model_json = {  # the fields of the model's config.json that size the workspace
    "architectures": ["NemotronHForCausalLM"],
    "num_attention_heads": config.num_attention_heads,
    "num_key_value_heads": config.num_key_value_heads,
    "head_dim": config.head_dim,
    "num_hidden_layers": 3 * config.num_hidden_layers,  # one Mamba, one attention, one MoE layer per group
    "hybrid_override_pattern": "M*E" * config.num_hidden_layers,
    "torch_dtype": str(config.dtype).removeprefix("torch."),
}
first_two_chunks = config.max_num_batched_tokens + 1 + rp.CONTINUATION_DECODE_THRESHOLD  # 128 new tokens: last safe
prompts = [config.max_num_batched_tokens, first_two_chunks - 1, first_two_chunks, 2 * config.max_num_batched_tokens]
print(serve_cmd)
report = rp.inspect_vllm(serve_cmd, model_json, prompt_tokens=prompts, demo=LIVE, quiet=True)
pred = report["prediction"]
show_md("\n".join(f"- {n}" for n in pred["notes"] if "hybrid" in n or "layers" in n))

m = config.max_num_batched_tokens
by_len = {r["prompt_tokens"]: r for r in pred["requests"]}
want = 2 * HK * m * D * 2  # two fp16 buffers of (1, Hk, m, D), m a multiple of block_size
assert m % config.block_size == 0
assert [by_len[n]["crashes_unfixed"] for n in prompts] == [False, False, True, True]
assert not any(r["crashes_fixed"] for r in by_len.values())
assert pred["first_failing_prompt"] == first_two_chunks
for n in prompts[2:]:
    f = by_len[n]["first_refused_unfixed"]
    assert (f["consumer"], f["cached_len"], f["nbytes"]) == (rp.DEQUANT_CHUNK, m, want), f
assert pred["max_num_batched_tokens_source"] == "flag --max-num-batched-tokens"
assert not any("TurboQuant layers:" in n for n in pred["notes"])  # a hybrid: every attention layer is TurboQuant
busy = safe_max_model_len(config, LOCKED, schedule="any")  # notebook 09 §4's bound, from the preset
assert pred["safe_max_model_len_any_schedule"] == busy
if LIVE:
    (v_unfixed, *v_fixed) = report["demo"]
    assert v_unfixed["error"].endswith(f"requires {format_mb(want)} MB, current size is {format_mb(LOCKED)} MB. "
                                       "Workspace growth is not allowed after locking.")
    assert all(r["error"] is None for r in v_fixed)
show_md("Crash without the fix: " + ", ".join(f"{n:,} tokens: **{'yes' if by_len[n]['crashes_unfixed'] else 'no'}**"
                                              for n in prompts)
        + f". First refused call: cached {m:,}, 2 × {HK} × {m:,} × {D} × 2 bytes = **{want:,} bytes = "
        f"{format_mb(want)} MiB**{', as vLLM raised it' if LIVE else ''}. Safe `max_model_len` without the fix: "
        f"{pred['safe_max_model_len_alone']:,} for a request alone, **{pred['safe_max_model_len_any_schedule']:,}** "
        f"under any chunking — notebook 09's bound for the preset is {busy:,}.")

# %% [markdown]
# **The same line without `--max-num-batched-tokens`.** The bug report does not give it.
# vLLM then uses its default for `vllm serve` on a small GPU, and the prompt is cut
# into smaller chunks: the first refused call comes one smaller chunk in, and is
# smaller. The report names that call, the chunk size it assumed and where that came
# from, and says when the difference from the bug report's size is only the chunk size.

# %%
bare_cmd = serve_cmd.replace(f" --max-num-batched-tokens {m}", "")
bare = rp.inspect_vllm(bare_cmd, model_json, prompt_tokens=[PROMPT], quiet=True)["prediction"]
m0 = bare["max_num_batched_tokens"]
f0 = bare["requests"][0]["first_refused_unfixed"]
assert bare["max_num_batched_tokens_source"].startswith("vLLM default (`vllm serve`")
assert m0 < m and (f0["cached_len"], f0["nbytes"]) == (m0, 2 * HK * m0 * D * 2)
assert any(n.startswith(f"the bug report's '{rp.BUG_REPORT_REQUIRED_MB} MB'") for n in bare["notes"])
show_md(f"Default chunk {m0:,}: first refused call at cached {m0:,}, **{format_mb(f0['nbytes'])} MiB** "
        f"(the bug report's message: \"{rp.BUG_REPORT_REQUIRED_MB} MB\", with chunks of {m:,}).")

# %% [markdown]
# The two bounds differ a lot. A request prefilled alone survives until its second chunk
# takes the dequant path: more than 128 new tokens after `max_num_batched_tokens` cached
# ones. On a busy server the scheduler can cut any prompt at any point, and a prefix-cache
# hit can start a chunk after any block. Past a few hundred cached tokens some chunk can
# always crash. With the fix, every length up to `max_model_len` fits.
#
# ## 6 · Where tqlab and vLLM differ, and what the parity suite counted
#
# A cross-check is only as good as what it compared. The parity suite (`make parity`) runs vLLM's own
# classes against tqlab's on random call sequences, random configurations and the predictor's verdicts,
# and records what it found. Two behaviours differ on purpose (a first request whose views are all empty,
# a negative dimension); one difference it found was a tqlab bug, since fixed: a continuation chunk of at
# most 128 new tokens runs vLLM's decode kernel, which allocates its own buffers and asks the workspace
# for nothing. (Which slot the reservation sizes under DBO is notebook 03 §6c's lesson.)
#
# **Predict, then run.** Did the recorded parity run fail anything? Did every comparison it
# counts actually happen (call sequences with refusals among them, random configs, predictor
# verdicts)?

# %%
prov, rec = vt.load_parity_results()  # the divergences as the last parity run observed them
if LIVE:
    print(f"from the last recorded parity run: vLLM {prov['vllm']}, {prov['date']}, commit {prov['commit'][:12]}")
else:
    show_parity_banner(prov)
show_md(markdown_table(
    ["case", f"vLLM {prov['vllm']}", "tqlab"],
    [
        ["first request on a slot, all views empty", rec["test_divergence_1_all_empty_first_request:vllm"],
         rec["test_divergence_1_all_empty_first_request:tqlab"]],
        ["negative dimension", rec["test_divergence_2_negative_dimension:vllm"],
         rec["test_divergence_2_negative_dimension:tqlab"]],
        [f"continuation chunk of ≤ {rp.CONTINUATION_DECODE_THRESHOLD} new tokens (found by this suite, now agreeing)",
         rec["test_short_continuation_chunks_make_no_workspace_call:vllm_q128"]
         + " (the decode kernel allocates its own buffers)",
         f"{rec['test_short_continuation_chunks_make_no_workspace_call:tqlab_reservation_q128_bytes']} bytes asked of the workspace"],
    ],
))
diff = rec["test_zz_record_differential_stats:differential"]
cfgs = rec["test_zz_record_reservation_coverage:random_configs"]
pred_cov = rec["test_zz_record_predictor_coverage:predictor_cases"]
counts = {"parity tests passed": rec["summary"].get("passed", 0), "parity tests failed": rec["summary"].get("failed", 0),
          "random call sequences": diff["sequences"], "… their steps": diff["steps"], "… refusals (same text)": diff["refusals"],
          "random configs: builder == reservation_plan": cfgs["compared"],
          "random configs: predictor verdict == vLLM's code path": pred_cov["compared"]}
fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
ax.barh(list(counts)[::-1], list(counts.values())[::-1], color=["#c53030" if "failed" in k else "#2b6cb0" for k in counts][::-1])
ax.set_xscale("symlog")
ax.set_xlabel("count (symmetric log scale)")
for y, v in enumerate(list(counts.values())[::-1]):
    ax.annotate(f"{v:,}", (v, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
ax.set_title(f"what the parity suite compared (vLLM {prov['vllm']}, recorded {prov['date'][:10]})", fontsize=10, loc="left")
plt.show()
assert rec["summary"].get("failed", 0) == 0 and rec["summary"].get("error", 0) == 0
assert rec["summary"]["passed"] > 0
assert diff["sequences"] > 0 and diff["steps"] >= diff["sequences"] and diff["refusals"] > 0
assert cfgs["compared"] > 0
assert pred_cov["compared"] == pred_cov["crashes"] + pred_cov["fits"] > 0
print(f"parity summary: {rec['summary']}")

# %% [markdown]
# What the suite also showed about vLLM itself: PR #44053 reserves continuation buffers only when chunked
# prefill is on, yet a prefix-cache hit produces a continuation chunk all the same, and vLLM's own code
# refuses that chunk with the fix in place (`test_fix_leaves_prefix_hits_uncovered_without_chunked_prefill`;
# notebook 03 §6b). That was shown with vLLM's classes on CPU; it has not been run end to end on a GPU.

# %% [markdown]
# ## 7 · Every rank of a real deployment: the vLLM plugin
#
# Sections 3 and 4 ran vLLM's classes in this process. A real deployment runs one worker
# process per GPU, and each builds its own `WorkspaceManager`. vLLM 0.33 calls every
# `vllm.general_plugins` entry point in each process it starts
# (`vllm/plugins/__init__.py`, `load_general_plugins`: the front end, the engine core and
# every worker). tqlab registers one, `tqlab_trace`. Without `TQLAB_VLLM_TRACE` it returns
# at once and changes nothing. With `TQLAB_VLLM_TRACE=DIR`, every process that creates a
# workspace manager writes `DIR/<host>-<pid>.json`, which holds:
#
# * the rank as vLLM knows it (tensor, pipeline and data parallel group), the vLLM version
#   and the config fields the worker can read;
# * per consumer, the largest request and whether it came before or after the lock;
# * every slot's size at every lock, and every refused request with vLLM's message.
#
# The file is rewritten (temp file, then rename) at every lock and at every refusal,
# **before** vLLM's `AssertionError` leaves the manager, because a dying engine may never
# run `atexit`. `tqlab trace-report DIR` merges the files: one row per rank, whether the
# ranks agree, and with the deployment (`--config`/`--preset`, `--args`) every number held
# against the prediction of section 5.
#
# The recording below comes from `parity/trace_ranks.py`. Two processes were spawned as
# vLLM spawns its workers, each with vLLM's own plugin loader, a gloo process group
# (tensor parallel 2) and the bug report's requests through vLLM's own TurboQuant code.
# Rank 1 then died with `os._exit`, so no `atexit` ran. The parity suite re-runs this
# with vLLM (`parity/test_plugin_parity.py`).
#
# **Predict, then run.** At tensor parallel 2 each rank holds 16 query heads. What size
# does each rank's workspace lock at? Does the 129-token chunk after 4,096 cached tokens
# fit? And does rank 1, which never ran `atexit`, leave a record? The next cell computes
# the prediction before it reads the records.

# %%
from tqlab.core.provenance import DATA_DIR, load_recorded
from tqlab.lab.recorded import show_banner
from tqlab.predict import analysis
from tqlab.predict.trace_report import load_trace_dir, trace_report
from tqlab.vllm.deployment import deployment_from_preset

TRACE = load_recorded("trace_two_ranks")
show_banner(TRACE.provenance, what=f"Recorded two-rank trace: vLLM {TRACE.provenance['vllm']}",
            why="two spawned ranks take about a minute; this shows their recording")
tp2 = deployment_from_preset(TRACE.data["engine_args"], TRACE.data["preset"]).config
TP2_LOCKED = analysis.locked_bytes(tp2, fix=False)
TP2_CONT = analysis.continuation_bytes(tp2, TRACE.data["cached_len"])
print(f"prediction for `{TRACE.data['engine_args']}`: per rank Hq {tp2.num_heads_per_rank}, "
      f"lock at {format_mb(TP2_LOCKED)} MB without PR #44053; the chunk after {TRACE.data['cached_len']:,} cached "
      f"tokens asks {format_mb(TP2_CONT)} MB -> {'refused' if TP2_CONT > TP2_LOCKED else 'fits'}")

# %%
TRACE_DIR = DATA_DIR / "trace_two_ranks"
trace = trace_report(TRACE_DIR, TRACE.data["engine_args"], preset=TRACE.data["preset"])  # `tqlab trace-report`'s data
show_md(markdown_table(
    ["rank", "record", "locked at", "refused", "predicted"],
    [[row["rank"], f"`{row['file']}` ({row['event']})", ", ".join(f"{format_mb(b)} MiB" for b in row["lock_bytes"]),
      "; ".join(f"{r['consumer']}: {format_mb(r['required_bytes'])} MiB at {format_mb(r['current_bytes'])} MiB"
                for r in row["refused"]) or "none",
      f"lock {format_mb(TP2_LOCKED)} MiB, refuse {format_mb(TP2_CONT)} MiB"] for row in trace["rows"]]))
print(f"trace-report's verdict: {trace['verdict']}; ranks agree: {trace['ranks_agree']}")

# %% [markdown]
# **Check it yourself.** Both ranks locked at the predicted size and refused the
# predicted request, with the same numbers on each rank, as tensor parallel ranks must.
# Rank 1's record ends at the refusal, flushed before the assertion left the manager.

# %%
records, _ = load_trace_dir(TRACE_DIR)
assert trace["verdict"] == "as predicted" and trace["ranks_agree"]
assert [r["rank"]["tp"]["rank"] for r in records] == [0, 1]
assert [r["event"] for r in records] == ["exit", "refused"]  # rank 1: no atexit, the refusal flush is its record
for row in trace["rows"]:
    assert row["lock_bytes"] == [TP2_LOCKED]
    (refusal,) = row["refused"]
    assert (refusal["required_bytes"], refusal["current_bytes"]) == (TP2_CONT, TP2_LOCKED)
print(f"both ranks: locked at {format_mb(TP2_LOCKED)} MB, refused {format_mb(TP2_CONT)} MB: as predicted")

# %% [markdown]
# On your own deployment, three lines do the same (see the README):
# `pip install` tqlab into vLLM's environment, start `vllm serve ...` with
# `TQLAB_VLLM_TRACE=./tq-trace`, then run
# `tqlab trace-report ./tq-trace --config config.json --args "vllm serve ..."`.
# A record cut short by a killed process, or a stray JSON file in the folder, is skipped
# with a one-line warning, and the rank it would have described is named as missing: a
# report over half the ranks is not "as predicted". The next cell shows it on a copy of
# the recording.

# %%
import shutil
import tempfile
from pathlib import Path

with tempfile.TemporaryDirectory() as tmp:
    copy = Path(tmp) / "tq-trace"
    shutil.copytree(TRACE_DIR, copy)
    first = sorted(copy.glob("*.json"))[0]
    first.write_text(first.read_text()[:200])  # as if the process died mid-write without the atomic rename
    cut = trace_report(copy, TRACE.data["engine_args"], preset=TRACE.data["preset"])
print("\n".join(cut["warnings"]))
print("\n".join(cut["record_problems"]))
assert len(cut["warnings"]) == 1 and len(cut["rows"]) == 1
assert cut["record_problems"] == ["1 of 2 ranks have no record: DP 0/1 PP 0/1 TP 0/2"]
assert cut["verdict"] == "1 disagreement(s) with the prediction"

# %%
print(f"notebook ran in {time.perf_counter() - _T0:.1f} s ({'live vLLM' if LIVE else 'recorded parity results'})")

# %% [markdown]
# ## Exercises
#
# Write each function below (replace `raise NotImplementedError`), then run the cell: it checks your answer
# against tqlab's own on a few cases and says, per exercise, "correct", what differs, or "not attempted yet".
# Everything runs on a CPU. The solutions are in the collapsed cell after it.
#
# 1. **vLLM's words.** `refusal_tail(required_bytes, current_bytes)`: the end of vLLM's refusal, from
#    `requires` on: sizes in MiB with two decimals (vLLM calls them MB), then
#    `Workspace growth is not allowed after locking.` (§1)
# 2. **The continuation call.** `continuation_call_bytes(cached_len, kv_heads, head_dim, block_size)`: the two
#    float16 dequant buffers `(1, kv_heads, cached_len rounded up to block_size, head_dim)`, each rounded up to
#    256 bytes. (§3)
# 3. **The first refused chunk.** `first_refused_cached_len(preset)`: the cached length of the first chunk of the
#    preset's default prompt (`load_preset(preset)["default_prompt_tokens"]`) that the locked workspace refuses
#    without the fix, or `None` (use `tqlab.predict.analysis.prefill_chunks`, `continuation_bytes` and
#    `unfixed_locked_bytes`; a chunk of at most 128 new tokens asks nothing). (§5)

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb07


def refusal_tail(required_bytes, current_bytes):
    raise NotImplementedError


def continuation_call_bytes(cached_len, kv_heads, head_dim, block_size):
    raise NotImplementedError


def first_refused_cached_len(preset):
    raise NotImplementedError


check("refusal_tail", refusal_tail, nb07.refusal_tail, nb07.CASES["refusal_tail"])
check("continuation_call_bytes", continuation_call_bytes, nb07.continuation_call_bytes, nb07.CASES["continuation_call_bytes"])
check("first_refused_cached_len", first_refused_cached_len, nb07.first_refused_cached_len, nb07.CASES["first_refused_cached_len"])

# %% [markdown]
# <details><summary><b>Solutions</b> (click to open)</summary>
#
# ```python
# from tqlab.core.config import EngineConfig, load_preset
# from tqlab.predict import analysis
#
#
# def refusal_tail(required_bytes, current_bytes):
#     return (f"requires {required_bytes / 2**20:.2f} MB, current size is {current_bytes / 2**20:.2f} MB. "
#             "Workspace growth is not allowed after locking.")
#
#
# def continuation_call_bytes(cached_len, kv_heads, head_dim, block_size):
#     padded = -(-cached_len // block_size) * block_size
#     one = kv_heads * padded * head_dim * 2  # float16
#     return 2 * (-(-one // 256) * 256)
#
#
# def first_refused_cached_len(preset):
#     cfg = EngineConfig.from_preset(preset)
#     lock = analysis.unfixed_locked_bytes(cfg)
#     for cached, new in analysis.prefill_chunks(cfg, load_preset(preset)["default_prompt_tokens"]):
#         if cached and new > 128 and analysis.continuation_bytes(cfg, cached) > lock:
#             return cached
#     return None
# ```
#
# </details>
