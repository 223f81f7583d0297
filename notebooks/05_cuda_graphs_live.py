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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · CUDA graphs live: capture, replay, frozen workspace pointers, and a replay guard
#
# A CUDA graph records kernels *with their arguments*, raw device pointers included, and replays them
# without asking Python again. The decode step asks the workspace for its split-KV scratch
# (`get_simultaneous`), so a captured decode graph has the workspace buffer's address baked in.
# vLLM keeps this safe with one order of events in `GPUModelRunner.capture_model`
# (`vllm/v1/worker/gpu_model_runner.py`): **warm up before capture, capture the largest batch first,
# lock the workspace after capture** (`lock_workspace()`, `vllm/v1/worker/workspace.py`).
#
# **You will learn**
#
# 1. buckets and static inputs (how a batch of 3 is replayed in the graph for 4);
# 2. why the warm-up must come before capture (otherwise the workspace grows *inside* the capture);
# 3. pointer stability (the views' `data_ptr()` at capture = at every replay; replay = eager);
# 4. the hazard: unlock, grow, replay without guard / with the lock / with the guard;
# 5. three cases from public reports: (a) small-to-large capture without reservation,
#    (b) a consumer that needs *more* workspace at a *smaller* batch, (c) a warm-up after capture;
# 6. latency: eager vs replay per decode step;
# 7. piecewise graphs: which ops are captured and which run eagerly between the pieces, and what vLLM 0.33's
#    `CUDAGraphMode` does with TurboQuant's `AttentionCGSupport.UNIFORM_BATCH`;
# 8. the capture sequence around the lock, and the memory budget: why a buffer allocated lazily after
#    the KV cache was sized can run out of memory (vLLM issue #40420), before and after PR #44053;
# 9. the split count fixed at capture, and why vLLM fixes `tq_max_kv_splits_for_cuda_graph` at 32.
#
# **What you need.** Nothing but this repository. With CUDA every demonstration uses real
# `torch.cuda.CUDAGraph`s (`tqlab.engine.cuda_graph.CUDAGraphDecodeRunner`, the engine's decode runner on
# CUDA). Without CUDA the same runner runs in *simulated* mode: a replay re-runs the step but answers
# every workspace request with the view recorded at capture (the frozen pointers), and every GPU-only
# figure (latency, the concurrent-writer divergence) comes from `data/` under a banner naming device,
# date and commit. Sections 7–9 are CPU simulations on every machine (they model vLLM's decisions, they
# do not time anything). On CUDA every GPU-live cell must run live; the last cell checks it.
#
# **Run time.** About 25 s on a 2-core CPU box; the last cell prints it. Parameters: `DEVICE` (`auto`,
# `cpu`, `cuda`), `USE_RECORDED` (`auto`: recorded GPU figures when not on CUDA; `always`; `never`);
# both can also come from environment variables.

# %% tags=["parameters"]
import os

from tqlab.lab.recorded import check_device

DEVICE = os.environ.get("DEVICE", "auto")  # "auto" | "cpu" | "cuda"
USE_RECORDED = os.environ.get("USE_RECORDED", "auto")  # "auto" | "always" | "never"
check_device(DEVICE, ("auto", "cpu", "cuda"), "05", "CUDA graphs capture real memory; a meta-device runner has none")

# %%
import json
import platform
import time

import torch

from tqlab.engine import cuda_graph as cg
from tqlab.lab import graph_demos as demos
from tqlab.lab import graph_latency as latency
from tqlab.lab.display import text_table
from tqlab.lab.recorded import banner_text, has_recorded, jsonable, load_recorded, make_provenance, show_banner
from tqlab.predict.analysis import decode_capture_rows, decode_rows_at_lock
from tqlab.engine.replay_guard import StalePointerError
from tqlab.lab.plots_graphs import plot_latency

T0 = time.perf_counter()
if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("DEVICE='cuda' but torch.cuda.is_available() is False")
if USE_RECORDED not in ("auto", "always", "never"):
    raise ValueError(f"USE_RECORDED must be 'auto', 'always' or 'never', got {USE_RECORDED!r}")
ON_CUDA = DEVICE == "cuda"
SHOW_RECORDED = USE_RECORDED == "always" or (USE_RECORDED == "auto" and not ON_CUDA)

# The seed model's rank shard (TP 8 of the bug report): 4 query heads, 1 KV head, head_dim 128,
# max_num_seqs 4, turboquant_3bit_nc; short max_model_len so each engine builds in a second.
# 8 layers on CUDA, 2 on CPU (the layer count changes no pointer, only the run time).
DEMO = demos.make_demo_config(num_hidden_layers=8 if ON_CUDA else 2)
LIVE = demos.LiveCells(DEVICE, ["warmup", "pointer_stability", "hazard", "case_a", "case_b", "case_c", "latency"])
RESULTS: dict = {}
# The GPU recordings (plain dicts, None when absent): this notebook's GPU run, benchmarks/bench_cuda_graphs.py.
REC_LIVE, REC_LAT = (load_recorded(n).data if has_recorded(n) else None for n in ("cuda_graphs_live", "cuda_graphs_latency"))
print(f"device: {DEVICE} ({torch.cuda.get_device_name(0) if ON_CUDA else 'no CUDA: simulated graphs'}), torch {torch.__version__}")
print(f"demo config: {DEMO.preset}, {DEMO.num_hidden_layers} layers, Hq/rank {DEMO.num_heads_per_rank}, "
      f"Hk/rank {DEMO.num_kv_heads_per_rank}, D {DEMO.head_dim}, max_num_seqs {DEMO.max_num_seqs}, "
      f"max_model_len {DEMO.max_model_len}, {DEMO.kv_cache_dtype}")
if SHOW_RECORDED:
    for rec in (REC_LIVE, REC_LAT):
        if rec:
            show_banner(rec["provenance"])
        else:
            print("no GPU recording under data/ yet (run this notebook or benchmarks/bench_cuda_graphs.py on a GPU)")

# %%
# New in this lecture: tables, the piecewise and memory-budget simulations (sections 7-9).
import matplotlib.pyplot as plt

from tqlab.lab import memory_budget as mb
from tqlab.lab import piecewise as pw
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes
from tqlab.lab.display import fmt_bytes, markdown_table, show_md
from tqlab.core.workspace import WorkspaceManager, compute_layout

# %% [markdown]
# ## 1 · Buckets and static inputs
#
# One graph per decode batch-size bucket: 1, 2, 4, then multiples of 8 (16 above 256) up to and
# *including* `max_num_seqs`. A batch replays in the smallest bucket that holds it; the unused lanes
# are padding: token 0, slot −1 (the cache store skips it), block table all null block (0), `seq_len` 1.
# Static inputs are sized for the largest bucket and `ceil(max_model_len / block_size)` blocks, so
# the longest request fits.

# %%
from tqlab.core.config import EngineConfig

for name in ("nemotron-3-super-120b-a12b", "llama-3.1-8b"):
    sizes = decode_capture_rows(EngineConfig.from_preset(name))
    print(f"{name}: {len(sizes)} buckets {sizes[:6]} ... {sizes[-3:]}")
sizes = decode_capture_rows(EngineConfig.from_preset("llama-3.1-8b"))
print("batch -> bucket:", {b: cg.select_bucket(b, sizes) for b in (1, 3, 5, 9, 17, 100, 255, 256)})

static = cg.StaticDecodeInputs(max_batch=4, max_blocks_per_seq=6, device="cpu")
static.fill(cg.DecodeBatch(torch.tensor([11, 12, 13, 14]), torch.tensor([40, 57, 81, 99]),
                           torch.tensor([[2, 3, 0], [4, 5, 0], [6, 7, 8], [9, 10, 11]], dtype=torch.int32),
                           torch.tensor([9, 26, 34, 52], dtype=torch.int32)), bucket=4)
static.fill(cg.DecodeBatch(torch.tensor([21, 22, 23]), torch.tensor([41, 58, 82]),
                           torch.tensor([[2, 3], [4, 5], [6, 7]], dtype=torch.int32),
                           torch.tensor([10, 27, 35], dtype=torch.int32)), bucket=4)
print("\nafter a batch of 4, then a batch of 3 in bucket 4 (lane 3 is padding, stale values cleared):")
print("input_ids   ", static.input_ids.tolist())
print("slot_mapping", static.slot_mapping.tolist())
print("seq_lens    ", static.seq_lens.tolist())
print("block_tables", static.block_tables.tolist())

# %% [markdown]
# **Predict, then run.** A batch of 3 replays in bucket 4, a batch of 5 in bucket 8. After the batch of 3,
# lane 3 is padding: slot −1 (the cache store skips it), `seq_len` 1, block table all null block 0.

# %%
assert cg.select_bucket(3, sizes) == 4 and cg.select_bucket(5, sizes) == 8
assert static.slot_mapping.tolist()[3] == -1 and static.seq_lens.tolist()[3] == 1
assert set(static.block_tables[3].tolist()) == {0}
print("buckets and padding as predicted")

# %% [markdown]
# ## 2 · Warm-up before capture
#
# Without reservation (`fix=False`) the workspace is empty when capture starts. With the eager
# warm-up the step grows it first and the capture itself allocates nothing (the fast path of
# `WorkspaceManager._ensure_workspace_size` in `vllm/v1/worker/workspace.py`: the buffer is big enough). Without warm-up the growth happens *inside* the capture: on CUDA
# the buffer then comes out of the graph's private pool.

# %%
b = decode_rows_at_lock(DEMO)  # the largest decode bucket (rows)
r = {}
for name, num_warmups in (("with_warmup", 2), ("without_warmup", 0)):
    # an engine without the reservation: empty workspace, no graph captured yet, not locked
    eng, dr = demos.make_engine_and_runner(DEMO, DEVICE, fix=False, capture=False, lock=False)
    row = dict(bucket=b, num_warmups=num_warmups, workspace_bytes_before=eng.workspace.size_bytes(0))
    try:
        dr.capture(b, num_warmups=num_warmups)  # eager warm-up steps, then the capture of one decode step
        row.update(ok=True, resizes_in_warmup=dr.graphs[b].resizes_in_warmup,
                   resizes_in_capture=dr.graphs[b].resizes_in_capture, error=None)
    except Exception as e:  # a failed capture is a result here, not a crash
        row.update(ok=False, resizes_in_warmup=None, resizes_in_capture=None, error=f"{type(e).__name__}: {e}"[:400])
    row["workspace_bytes_after"] = eng.workspace.size_bytes(0)
    r[name] = row
    del eng, dr
RESULTS["warmup"] = r
print(text_table(["variant", "num_warmups", "workspace_bytes_before", "resizes_in_warmup", "resizes_in_capture",
                  "workspace_bytes_after", "ok"], [dict(variant=k, **v) for k, v in r.items()]))
for k, v in r.items():
    if v["error"]:
        print(f"{k}: capture raised {v['error']}")
LIVE.ran("warmup")

# %% [markdown]
# **Predict, then run.** Both variants end with the same workspace (the decode scratch at the bucket);
# with the warm-up every resize happens before the capture, without it the one resize happens inside it.

# %%
assert r["with_warmup"]["resizes_in_capture"] == 0 and r["with_warmup"]["resizes_in_warmup"] >= 1
assert r["without_warmup"]["resizes_in_capture"] >= 1
assert r["with_warmup"]["workspace_bytes_after"] == r["without_warmup"]["workspace_bytes_after"]
if REC_LIVE and "warmup" in REC_LIVE:  # the same prediction holds for real CUDA graphs (recorded)
    g = REC_LIVE["warmup"]
    assert g["with_warmup"]["resizes_in_capture"] == 0 and g["without_warmup"]["resizes_in_capture"] >= 1
print("warm-up moved every resize out of the capture")
if SHOW_RECORDED and REC_LIVE and "warmup" in REC_LIVE:
    show_banner(REC_LIVE["provenance"], what="Real CUDA graph capture recorded")
    print(text_table(["variant", "num_warmups", "resizes_in_warmup", "resizes_in_capture", "workspace_bytes_after", "ok"],
                     [dict(variant=k, **v) for k, v in REC_LIVE["warmup"].items()]))

# %% [markdown]
# ## 3 · Pointer stability
#
# Reserved (PR #44053), warmed up, captured largest first, locked — vLLM's sequence. Each step replays
# a batch of `max_num_seqs − 1` requests (one padded lane), compares with the eager step on the same
# static inputs, and asks the workspace for the decode views again; between steps an eager
# continuation prefill uses the same workspace bytes (prefill stays eager: section 7 shows why).

# %%
r = demos.pointer_stability_demo(DEMO, DEVICE, steps=3)
if ON_CUDA:
    assert r["mode"] == "cuda", r["mode"]
RESULTS["pointer_stability"] = r
print(f"mode {r['mode']}; batch {r['batch']} in bucket {r['bucket']}; buckets {r['buckets']}; "
      f"workspace {r['workspace_bytes']} bytes; resizes during capture {r['resizes_in_capture']}")
print(f"capture: buffer 0x{r['capture_buffer_ptr']:x}, views {[hex(p) for p in r['capture_view_ptrs']]} "
      f"({r['num_workspace_requests_in_graph']} requests in the graph, {r['distinct_view_ptr_sets_in_graph']} distinct pointer set)")
print(text_table(["step", "buffer_ptr", "view_ptrs", "same_as_capture", "bitwise_equal", "max_abs_diff",
                  "argmax_mismatch"], r["steps"], hex_cols=["buffer_ptr", "view_ptrs"]))
LIVE.ran("pointer_stability")

# %% [markdown]
# **Predict, then run.** No resize during capture; every replay step sees the capture's pointers and
# matches the eager step bitwise.

# %%
assert set(r["resizes_in_capture"].values()) == {0}  # per bucket
assert all(st["same_as_capture"] for st in r["steps"]), r["steps"]
assert all(st["bitwise_equal"] for st in r["steps"]), r["steps"]
if REC_LIVE and "pointer_stability" in REC_LIVE:  # and on the GPU recording
    assert all(st["same_as_capture"] and st["bitwise_equal"] for st in REC_LIVE["pointer_stability"]["steps"])
print(f"{len(r['steps'])} replays, pointers and outputs as predicted")
if SHOW_RECORDED and REC_LIVE and "pointer_stability" in REC_LIVE:
    g = REC_LIVE["pointer_stability"]
    show_banner(REC_LIVE["provenance"])
    print(f"real CUDA graphs: mode {g['mode']}, batch {g['batch']} in bucket {g['bucket']}")
    print(text_table(["step", "buffer_ptr", "same_as_capture", "bitwise_equal", "max_abs_diff"], g["steps"],
                     hex_cols=["buffer_ptr"]))

# %% [markdown]
# ## 4 · The hazard, and what stops it
#
# One engine, graphs captured and locked; the runner is told to keep a reference to the buffer each
# graph captured, so nothing below can touch memory the process does not own (in vLLM's report the
# freed block went back to the driver and the first decode hit an illegal memory access).
#
# * **lock**: a request to grow after the lock is refused; the pointer is unchanged.
# * **no guard**: unlock, grow (the manager frees the captured buffer), replay. The graph's views
#   still point into the *old* buffer: a sentinel there is overwritten, the new buffer is untouched.
#   While that memory is ours alone the output still equals eager — which is why this bug hides — but
#   whoever owns the freed block next loses its data; on CUDA a second stream writing into it during
#   the replay makes the output diverge.
# * **guard**: the same replay with the guard on raises `StalePointerError`, naming the moved slot,
#   before anything runs.

# %%
r = demos.stale_replay_demo(DEMO, DEVICE)
if ON_CUDA:
    assert r["mode"] == "cuda" and "concurrent_owner_trials" in r["no_guard"], r["mode"]
RESULTS["hazard"] = r
lk, nd, gd = r["lock"], r["no_guard"], r["guard"]
print(f"[lock]     refused: {lk['refused']}\n           {lk.get('error')}\n"
      f"           pointer unchanged: {lk.get('pointer_unchanged')}, replay == eager bitwise: {lk.get('bitwise_equal')}")
print(f"[no guard] captured buffer 0x{nd['old_buffer_ptr']:x} -> workspace now 0x{nd['new_buffer_ptr']:x} "
      f"({nd['new_bytes']} bytes); stale buckets {nd['stale_buckets']}")
print(f"           graph views inside old buffer: {nd['graph_views_inside_old_buffer']}, "
      f"inside new buffer: {nd['graph_views_inside_new_buffer']}")
print(f"           replay overwrote {nd['old_buffer_bytes_overwritten']} sentinel bytes of the old buffer, "
      f"touched {nd['new_buffer_bytes_touched']} bytes of the new one")
print(f"           output vs eager while the old memory is ours alone: {nd['exclusive_old_buffer']}")
print(f"           a new owner's data in the freed block: {nd['new_owner_bytes_corrupted']} of "
      f"{nd['new_owner_bytes']} bytes destroyed by one replay")
if "concurrent_owner_trials" in nd:
    print(f"           new owner writing on another stream during the replay: "
          f"{nd['concurrent_owner_diverged']} of {len(nd['concurrent_owner_trials'])} replays diverged")
    print(text_table(["bitwise_equal", "max_abs_diff", "nonfinite", "argmax_mismatch", "rows"], nd["concurrent_owner_trials"]))
print(f"[guard]    raised: {gd['raised']}\n           {gd.get('error')}")
LIVE.ran("hazard")
HAZ = r

# %% [markdown]
# **Predict, then run.** The lock refuses the growth; without the guard the stale replay writes into the
# old buffer and not a byte of the new one; with the guard the replay never starts.

# %%
assert HAZ["lock"]["refused"] and HAZ["lock"].get("pointer_unchanged")
assert HAZ["no_guard"]["graph_views_inside_old_buffer"] and not HAZ["no_guard"]["graph_views_inside_new_buffer"]
assert HAZ["no_guard"]["old_buffer_bytes_overwritten"] > 0 and HAZ["no_guard"]["new_buffer_bytes_touched"] == 0
assert HAZ["guard"]["raised"]
if REC_LIVE and "hazard" in REC_LIVE:  # and with real CUDA graphs (recorded)
    g = REC_LIVE["hazard"]
    assert g["lock"]["refused"] and g["guard"]["raised"] and g["no_guard"]["new_buffer_bytes_touched"] == 0
print("lock, stale replay and guard behaved as predicted")
if SHOW_RECORDED and REC_LIVE:
    show_banner(REC_LIVE["provenance"])
    if "concurrent_owner_trials" in REC_LIVE.get("hazard", {}).get("no_guard", {}):
        g = REC_LIVE["hazard"]["no_guard"]
        print(f"on the GPU, the new owner writing on another stream during the stale replay: "
              f"{g['concurrent_owner_diverged']} of {len(g['concurrent_owner_trials'])} replays diverged from eager")
        print(text_table(["bitwise_equal", "max_abs_diff", "nonfinite", "argmax_mismatch", "rows"], g["concurrent_owner_trials"]))

# %% [markdown]
# ## 5 · Cases from public reports
#
# **(a)** Capturing small-to-large without a reservation: each bucket's warm-up grows the workspace
# and frees the buffer the earlier graphs baked in. The guard refuses those graphs; reserve-then-capture
# (PR #44053's decode reservation at `max_num_seqs`) and largest-first both avoid the growth.

# %%
CTX = 32  # context of the replayed decode batch
for order, reserve in (("smallest_first", None), ("smallest_first", "max_num_seqs"), ("largest_first", None)):
    # no fix at start-up; optionally PR #44053's decode reservation; capture every bucket in `order`; lock
    eng, dr = demos.make_engine_and_runner(DEMO, DEVICE, fix=False, order=order, reserve=reserve, guard=True,
                             keep_captured_buffers=True, kv_cache_tokens=DEMO.max_num_seqs * CTX + 4 * DEMO.block_size)
    captures = [dict(bucket=b, buffer_ptr=dr.graphs[b].snapshot.ptrs[0], bytes=dr.graphs[b].snapshot.sizes[0],
                     resizes_in_warmup=dr.graphs[b].resizes_in_warmup, resizes_in_capture=dr.graphs[b].resizes_in_capture)
                for b in dr.captured_sizes]  # the workspace buffer each graph baked in
    batch = demos.prepare_decode_batch(eng.runner, max(dr.captured_sizes), CTX)
    replay = {}
    for b in dr.captured_sizes:  # replay every bucket with the guard on
        try:
            dr.run(*batch.rows(b).astuple())
            replay[b] = {"ok": True}
        except StalePointerError as e:
            replay[b] = {"ok": False, "slot": e.slot, "error": str(e)}
    r = dict(order=order, reserve=reserve, captures=captures, final_ptr=eng.workspace.data_ptrs()[0],
             final_bytes=eng.workspace.size_bytes(0), stale_buckets=dr.stale_buckets(), replay=replay)
    RESULTS.setdefault("case_a", []).append(r)
    del eng, dr
    print(f"\norder {order}, reserve {reserve}: stale buckets {r['stale_buckets']}")
    print(text_table(["bucket", "buffer_ptr", "bytes", "resizes_in_warmup", "resizes_in_capture"], r["captures"],
                     hex_cols=["buffer_ptr"]))
    print("guarded replay:", {b: ("ok" if v["ok"] else "StalePointerError") for b, v in r["replay"].items()})
bad = RESULTS["case_a"][0]["replay"]
print("\nfirst refusal:", next(v["error"] for v in bad.values() if not v["ok"]))
# Predicted: only small-to-large *without* a reservation leaves stale graphs.
assert [bool(x["stale_buckets"]) for x in RESULTS["case_a"]] == [True, False, False]
if REC_LIVE and "case_a" in REC_LIVE:
    assert [bool(x["stale_buckets"]) for x in REC_LIVE["case_a"]] == [True, False, False]
LIVE.ran("case_a")
if SHOW_RECORDED and REC_LIVE and "case_a" in REC_LIVE:
    show_banner(REC_LIVE["provenance"], what="Real CUDA graphs recorded")
    for g in REC_LIVE["case_a"]:
        print(f"order {g['order']}, reserve {g['reserve']}: stale buckets {g['stale_buckets']}, buffer per capture "
              f"{[hex(c['buffer_ptr']) for c in g['captures']]}")

# %% [markdown]
# **(b)** A consumer whose need is not monotonic in the batch: `BatchDependentSplitsBackend` gives
# batches of at most 2 rows four times as many KV splits (small batches split the context more to fill
# the GPU). Largest-first capture and the PR's reservation at `max_num_seqs` both miss it: the capture
# of bucket 2 grows the workspace after bucket 4 was captured — before the lock, so the lock cannot see
# it. Only reserving the maximum over *all* buckets is safe.
#
# **Predict, then run.** Which bucket's graph goes stale with the reservation at `max_num_seqs`, and which
# with the maximum over all buckets? (The asserts at the end of the cell check it.)

# %%
for reserve in ("max_num_seqs", "all_buckets"):
    r = demos.nonmonotonic_demo(DEMO, DEVICE, reserve=reserve)
    RESULTS.setdefault("case_b", []).append(r)
    print(f"\nreserve {reserve}: need per bucket {r['need_bytes']} bytes (largest at bucket {r['argmax_need']}); "
          f"stale buckets {r['stale_buckets']}")
    print(text_table(["bucket", "buffer_ptr", "bytes", "resizes_in_warmup", "resizes_in_capture"], r["captures"],
                     hex_cols=["buffer_ptr"]))
    print("guarded replay:", {b: ("ok" if v["ok"] else "StalePointerError") for b, v in r["replay"].items()})
LIVE.ran("case_b")
# Predicted: the need peaks at bucket 2; reserving at max_num_seqs leaves bucket 4's graph stale, the maximum
# over all buckets leaves none (live, and on the GPU recording).
for res in [RESULTS["case_b"]] + ([REC_LIVE["case_b"]] if REC_LIVE and "case_b" in REC_LIVE else []):
    assert [(x["reserve"], bool(x["stale_buckets"])) for x in res] == [("max_num_seqs", True), ("all_buckets", False)]
    assert all(x["argmax_need"] == 2 for x in res)
if SHOW_RECORDED and REC_LIVE and "case_b" in REC_LIVE:
    show_banner(REC_LIVE["provenance"], what="Real CUDA graphs recorded")
    for g in REC_LIVE["case_b"]:
        print(f"reserve {g['reserve']}: need {g['need_bytes']}, stale buckets {g['stale_buckets']}")

# %% [markdown]
# **(c)** A warm-up that runs *after* capture and grows the workspace (here a dummy decode of
# `2 × max_num_seqs` rows). Between capture and lock the lock cannot catch it: the guard does, at the
# first replay. After the lock, the lock refuses it.
#
# **Predict, then run.** Before the lock: does the buffer move, and who notices? After the lock?

# %%
r = demos.late_warmup_demo(DEMO, DEVICE)
RESULTS["case_c"] = r
for when, v in r.items():
    print(f"\nwarm-up {when}: {v['bytes_before']} -> {v['bytes_after']} bytes, moved {v['moved']}, "
          f"stale buckets {v['stale_buckets']}")
    if v["warmup_refused"]:
        print("  lock refused it:", v["warmup_refused"])
    print("  guarded replay:", {b: ("ok" if x["ok"] else "StalePointerError") for b, x in v["replay"].items()})
LIVE.ran("case_c")
# Predicted: before the lock the late warm-up moves the buffer and every graph goes stale (the guard catches
# it); after the lock the lock refuses it and nothing moves.
assert r["before_lock"]["moved"] and r["before_lock"]["stale_buckets"] and not r["before_lock"]["warmup_refused"]
assert not r["after_lock"]["moved"] and not r["after_lock"]["stale_buckets"] and r["after_lock"]["warmup_refused"]

# %% [markdown]
# ## 6 · Latency: eager vs replay per decode step
#
# CUDA events, warm-up, medians, microseconds. *eager*: the decode step as Python launches it;
# *replay*: `graph.replay()` on filled static inputs; *runner step*: guard + copy into the static
# inputs + padding + replay; *summed kernel time*: device time of the replay's kernels under
# `torch.profiler`. The benchmark's own targets (stored with the recording): replay ≥ 5× faster than
# eager at batch 1, and within 1.3× of the summed kernel time. On CUDA this cell measures live, without the profiler (a profiler session
# slows later launches in the same process): the bug report's model, its 8-layer shard, at every batch, and the
# 32-layer model at three batches, each captured as its own bucket. The full sweep with kernel sums is
# `benchmarks/bench_cuda_graphs.py` (one process per model), shown from `data/` below.

# %%
LAT_COLS = ["batch", "bucket", "eager_us", "replay_us", "run_us", "kernel_sum_replay_us", "speedup",
            "replay_over_kernel_sum"]


def latency_table(rows, cols=LAT_COLS):
    """Markdown table; microseconds with thousands separators and one decimal, ratios with two."""
    def cell(c, v):
        if v is None:
            return "–"
        if c.endswith("_us"):
            return f"{v:,.1f}"
        return f"{v:.2f}" if isinstance(v, float) else str(v)
    return markdown_table([c.replace("_us", " (µs)") for c in cols], [[cell(c, r.get(c)) for c in cols] for r in rows])


# %%
if ON_CUDA:
    live_lat = {
        "seed (live)": latency.measure_decode_latency(EngineConfig.from_preset("nemotron-3-super-120b-a12b"), "cuda",
                                                 batch_sizes=[1, 2, 3, 4], iters=20, profile_reps=0, label="seed"),
        "llama-3.1-8b (live)": latency.measure_decode_latency(
            EngineConfig.from_preset("llama-3.1-8b", cudagraph_capture_sizes=(1, 32, 256)), "cuda",
            batch_sizes=[1, 32, 256], iters=15, profile_reps=0, label="llama"),
    }
    RESULTS["latency"] = live_lat
    for k, v in live_lat.items():
        print(f"{k}: buckets {len(v['buckets'])}, capture {v['capture_s']:.2f} s")
        show_md(latency_table(v["rows"]))
    plot_latency(live_lat, title=f"live on {torch.cuda.get_device_name(0)}")
    LIVE.ran("latency")
else:
    LIVE.recorded("latency")
if SHOW_RECORDED or not ON_CUDA:
    if not REC_LAT:
        print("no GPU recording data/cuda_graphs_latency.json yet (run benchmarks/bench_cuda_graphs.py on a GPU)")
    else:
        show_banner(REC_LAT["provenance"])
        for k, v in REC_LAT["results"].items():
            print(f"\n{k}: {v['num_hidden_layers']} layers, Hq/rank {v['num_heads_per_rank']}, Hk/rank "
                  f"{v['num_kv_heads_per_rank']}, {v['kv_cache_dtype']}, context {v['context_len']} tokens")
            show_md(latency_table(v["rows"]))
        tg = REC_LAT.get("targets", {})
        for k, v in (REC_LAT.get("summary") or {}).items():
            rk = v["replay_over_kernel_sum"]
            print(f"{k}: replay is {v['speedup_at_batch_1']:.2f}x faster than eager at batch 1 "
                  f"(target met: {'yes' if v['speedup_target_met'] else 'no'}); replay / summed kernel time "
                  f"{rk['min']:.2f}-{rk['max']:.2f} (target met at every batch: "
                  f"{'yes' if v['kernel_sum_target_met_all_batches'] else 'no'})")
        for k, v in REC_LAT.get("errors", {}).items():
            print(f"not recorded: {k}: {v}")
        for note in REC_LAT.get("notes", []):
            print("note:", note)
        plot_latency(REC_LAT["results"], title=banner_text(REC_LAT["provenance"]).split("\n")[0])

# %% [markdown]
# ## 7 · Piecewise graphs: what is captured, what runs eagerly between the pieces
#
# **Question.** The bug report's crash is an `AssertionError` raised from inside `_continuation_prefill`
# at serve time. If decode runs from a captured graph that never calls Python, how does a prefill chunk
# get to ask the workspace anything after the lock?
#
# vLLM 0.33 captures two kinds of graphs (`CompilationConfig.cudagraph_mode`, `vllm/config/compilation.py`):
# a **FULL** graph holds the whole forward, attention included; a **PIECEWISE** graph is split at the
# attention ops (`CompilationConfig._attention_ops`, e.g. `vllm::unified_attention_with_output`): the
# pieces between two attentions are captured, attention itself runs eagerly in between. The mode names a
# pair (decode batches, mixed prefill-decode batches): `FULL_AND_PIECEWISE` (the default) = (FULL, PIECEWISE),
# `FULL_DECODE_ONLY` = (FULL, NONE). `resolve_cudagraph_mode_and_sizes` then downgrades what the attention
# backend cannot take: TurboQuant's metadata builder declares `AttentionCGSupport.UNIFORM_BATCH`
# (`vllm/v1/attention/backends/turboquant_attn.py`), so it may be captured FULL only for uniform batches —
# decodes — never for mixed ones. `tqlab.lab.piecewise` mirrors these rules; the cell below applies them.
#
# ```
# decode batch  (FULL)       [qkv · attention · o_proj+mlp · qkv · attention · o_proj+mlp]   one graph
# mixed batch   (PIECEWISE)  [qkv] attention [o_proj+mlp · qkv] attention [o_proj+mlp]      pieces + eager
# ```

# %%
rows = []
for requested in pw.CUDAGraphMode:
    got, why = pw.resolve_cudagraph_mode(requested, pw.TURBOQUANT_CG_SUPPORT)
    rows.append([requested.name, got.name, pw.runtime_mode(got, True).name, pw.runtime_mode(got, False).name, why])
show_md(markdown_table(["requested", "runs as (TurboQuant, UNIFORM_BATCH)", "decode batches", "mixed / prefill batches",
                        "why"], rows))

fig, axes = plt.subplots(3, 1, figsize=(9, 2.6), sharex=True)
for ax, mode in zip(axes, (pw.CUDAGraphMode.FULL, pw.CUDAGraphMode.PIECEWISE, pw.CUDAGraphMode.NONE)):
    plan = pw.forward_plan(2, mode)
    ax.barh(0, [1] * len(plan), left=range(len(plan)), color=["#55a868" if w == "graph" else "#dd8452" for _, w in plan],
            edgecolor="white")
    for i, (op, w) in enumerate(plan):
        ax.text(i + 0.5, 0, op.split(".")[1].replace("o_proj_mlp", "o_proj+mlp"), ha="center", va="center", fontsize=8)
    ax.set_yticks([0], [mode.name])
    ax.set_xlim(0, len(plan))
axes[0].set_title("2-layer forward: green = inside a captured graph, orange = eager (Python runs it every step)",
                  fontsize=9)
axes[-1].set_xticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# **Live.** The toy decoder of `tqlab.lab.piecewise.PiecewiseForward` (2 layers, the demo's per-rank
# attention shape) asks the workspace for its decode scratch in every attention call. Capture one FULL graph
# and one PIECEWISE graph for batch 4, lock the workspace as `capture_model` does, then step each mode once.
#
# **Predict, then run.** FULL: the replay runs no Python, so the workspace sees **0** calls — the
# pointers were baked in at capture, and nothing would notice if they went stale (section 4). PIECEWISE:
# each attention runs eagerly and calls `get_simultaneous` again, **one call per layer**, same pointers;
# a mixed batch whose attention needs more than the lock holds raises `Workspace is locked` loudly. That
# is the bug report's crash: `_continuation_prefill` runs in a mixed batch, between the pieces.

# %%
ws = WorkspaceManager("cpu")
fwd = pw.PiecewiseForward(ws, num_layers=2, num_heads=DEMO.num_heads_per_rank, head_dim=DEMO.head_dim,
                          num_splits=DEMO.tq_max_kv_splits_for_cuda_graph, dtype=DEMO.dtype)
cap = {m: fwd.capture(m, 4) for m in (pw.CUDAGraphMode.FULL, pw.CUDAGraphMode.PIECEWISE)}
ws.lock()
full, piece = fwd.step(pw.CUDAGraphMode.FULL, 4), fwd.step(pw.CUDAGraphMode.PIECEWISE, 4)
print(f"locked at {fmt_bytes(ws.size_bytes())}")
print(f"FULL replay:      Python ran {full.python_ops or 'nothing'}; workspace calls {full.workspace_calls}")
print(f"PIECEWISE replay: Python ran {piece.python_ops}; workspace calls {piece.workspace_calls}")
try:
    fwd.step(pw.CUDAGraphMode.NONE, 2 * DEMO.max_num_seqs)  # a larger eager attention after the lock
    bigger_error = None
except AssertionError as err:
    bigger_error = str(err)
print("an eager attention that needs more after the lock:", bigger_error)

assert full.workspace_calls == 0 and full.python_ops == []
assert piece.workspace_calls == 2 and all(op.endswith("attention") for op in piece.python_ops)
assert piece.view_ptrs == cap[pw.CUDAGraphMode.PIECEWISE].view_ptrs  # same buffer, checked by the lock each call
assert bigger_error is not None and "Workspace is locked" in bigger_error

# %% [markdown]
# **What this means at the lock.** Under `FULL_AND_PIECEWISE` the TurboQuant decode scratch lives in
# FULL graphs: its pointers must not move after capture (sections 3–5). The continuation prefill's dequant
# buffers are asked for eagerly, at serve time, in mixed batches: they must already *fit* when the lock
# closes — that is what PR #44053 reserves. With `cudagraph_mode=NONE`, `GPUModelRunner.capture_model`
# returns before it reaches `lock_workspace()`, so that runner never locks and the workspace may grow (model
# runner V2, `vllm/v1/worker/gpu/model_runner.py`, has its own capture path, which also ends with
# `lock_workspace()`).

# %% [markdown]
# ## 8 · The capture sequence around the lock, and the memory budget
#
# `GPUModelRunner.capture_model` (`vllm/v1/worker/gpu_model_runner.py`, vLLM 0.33), in order:
#
# 1. `set_cudagraph_capturing_enabled(True)`; inside `graph_capture(...)`: `torch.accelerator.synchronize()`,
#    `torch.accelerator.empty_cache()`, note the free memory;
# 2. for each runtime mode (PIECEWISE first, then FULL: `CudagraphDispatcher.get_capture_descs`,
#    `vllm/v1/cudagraph_dispatcher.py`), `_capture_cudagraphs` over the batch descriptors, **largest first**
#    ("so that the smaller shapes can reuse the memory pool allocated for the large shapes"), each through
#    `_warmup_and_capture` (eager warm-up runs, then the capture);
# 3. `set_cudagraph_capturing_enabled(False)` — any later capture is an error;
# 4. `synchronize()`, `empty_cache()`, then **`lock_workspace()`**.
#
# And before all of it, in `EngineCore` start-up: `determine_available_memory()` runs the **profile run**
# (`profile_run`, a dummy forward of `max_num_batched_tokens` that builds no TurboQuant metadata, so no
# attention workspace), and sizes the KV cache as `gpu_memory_utilization × total − (weights + activation
# peak + non-torch)` (`Worker.determine_available_memory`, `vllm/v1/worker/gpu_worker.py`); then
# `initialize_kv_cache` creates the metadata builders (PR #44053's `_reserve_workspace` runs here) *before*
# it allocates the KV cache tensors; then `capture_model`.
#
# **Predict, then run.** Replay that order on tqlab's manager with the demo's decode buckets: the workspace
# grows only in the warm-ups of the largest bucket (a smaller bucket fits in it), never inside a capture, and
# the lock comes last.

# %%
seq_ws = WorkspaceManager("cpu")
shapes = lambda b: decode_workspace_shapes(b, DEMO.num_heads_per_rank, DEMO.head_dim,  # noqa: E731
                                           DEMO.tq_max_kv_splits_for_cuda_graph, DEMO.dtype)
log = []
for b in sorted(decode_capture_rows(DEMO), reverse=True):  # capture the large shapes first
    before = seq_ws.size_bytes()
    seq_ws.get_simultaneous(*shapes(b))  # warm-up run
    grew_in_warmup = seq_ws.size_bytes() > before
    before = seq_ws.size_bytes()
    seq_ws.get_simultaneous(*shapes(b))  # the capture asks again
    log.append(dict(bucket=b, grew_in_warmup=grew_in_warmup, grew_in_capture=seq_ws.size_bytes() > before,
                    workspace=fmt_bytes(seq_ws.size_bytes())))
seq_ws.lock()  # lock_workspace()
show_md(markdown_table(list(log[0]), [list(r.values()) for r in log]))
assert [r["grew_in_warmup"] for r in log] == [True] + [False] * (len(log) - 1)
assert not any(r["grew_in_capture"] for r in log) and seq_ws.is_locked
assert seq_ws.size_bytes() == compute_layout(shapes(decode_rows_at_lock(DEMO))).total_bytes

# %% [markdown]
# **Why allocating late is risky: the memory budget.** The KV cache takes all of `gpu_memory_utilization ×
# total` that the profile run did not use. A buffer allocated *lazily* at serve time comes out of what is
# left: the `1 − gpu_memory_utilization` headroom minus CUDA graph pools, NCCL buffers and the CUDA context.
# vLLM issue #40420 (2 × RTX A5000, 24 GiB each, TP 2, `turboquant_k8v4`, `max_model_len` 262,144,
# `gpu_memory_utilization` 0.905) shows exactly this: the continuation prefill's dequant buffers for a long
# prompt asked for **88 MiB with 42 MiB free** (`CUDA OOM: tried 88 MiB, 42 MiB free`), a cliff at ~234K
# tokens; at 0.85 the cliff was gone.
#
# The chart rebuilds that budget with `tqlab.lab.memory_budget` (vLLM's arithmetic). **Inputs from the
# report:** 24 GiB, 0.905, 42 MiB free, 88 MiB asked. **Assumed** (the report does not give them; they change
# the bar heights, not the verdict): weights 35 GB FP8 / TP 2 (the model's name: 35B parameters, 1 byte
# each), an activation peak of 1 GiB; what CUDA graphs, NCCL and the context took after the profile is then
# whatever leaves 42 MiB free (the same bytes at 0.85). The reservation
# (after the fix) is computed live: two float16 `(1, Hk, round_up(max_model_len − 1, 16), D)` buffers with
# `Hk·D` = 128 per rank, the `Hk·D` for which 88 MiB holds ~180K cached tokens.

# %%
GiB, MiB = 2**30, 2**20
TOTAL, UTIL, FREE_AT_OOM, ASKED = 24 * GiB, 0.905, 42 * MiB, 88 * MiB  # vLLM issue #40420
WEIGHTS, ACT = 35 * 10**9 // 2, 1 * GiB  # assumed (see above)
HK_D, MAX_LEN = 128, 262_144
cached_at_oom = ASKED // (2 * 2 * HK_D)  # two float16 buffers of Hk·D per cached token
reserve = compute_layout(continuation_workspace_shapes(MAX_LEN - 1, 1, HK_D, 16)).total_bytes
startup_ws = compute_layout(decode_workspace_shapes(2, 2, 128, 32, torch.bfloat16)).total_bytes  # max_num_seqs 2
# what graphs, NCCL and the context took from the headroom after the KV cache was sized: all but 42 MiB
after_profile = TOTAL - int(UTIL * TOTAL) - FREE_AT_OOM - startup_ws


def budgets(util):
    base = dict(total=TOTAL, util=util, weights=WEIGHTS, activation_peak=ACT, after_profile=after_profile,
                workspace_startup=startup_ws)
    return {f"lazy\nutil {util}": mb.memory_budget(**base, workspace_need=ASKED, reserved=False),
            f"PR #44053\nutil {util}": mb.memory_budget(**base, workspace_need=reserve, reserved=True)}


B = {**budgets(0.905), **budgets(0.85)}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw=dict(width_ratios=[3, 2]))
mb.plot_budgets(B, title="one GPU of vLLM issue #40420, while a long prompt prefills", ax=axes[0])
mb.zoom_budgets(B, title="the top of each bar, in MiB", ax=axes[1])
plt.tight_layout()
plt.show()
print(f"88 MiB at Hk·D = {HK_D} is {cached_at_oom:,} cached tokens; the reservation for {MAX_LEN:,}: {fmt_bytes(reserve)}")
for name, b in B.items():
    print(f"{name.replace(chr(10), ', '):24s} KV cache {b.segments['KV cache'] / GiB:6.2f} GiB, workspace {fmt_bytes(b.segments['workspace']):>10s}, "
          f"free {b.free / MiB:8.1f} MiB -> {b.fails_at or 'runs'}")

# %% [markdown]
# **Predict, then run.** At 0.905 the lazy engine dies at serve time (88 MiB asked, 42 MiB free); with the
# reservation the same budget fails at **start-up** instead, where the operator sees it; at 0.85 both run.
# Note what vLLM 0.33 actually does: `_reserve_workspace` runs when the builders are created, *after* the
# profile run measured the non-KV memory, so the reservation is not subtracted from the KV cache: it comes
# out of the headroom, like the lazy buffer — but before the KV tensors and the graphs are allocated.

# %%
assert 170_000 < cached_at_oom < 190_000  # "~180K cached tokens"
assert B["lazy\nutil 0.905"].fails_at == "serve" and B["lazy\nutil 0.905"].free == FREE_AT_OOM
assert B["PR #44053\nutil 0.905"].fails_at == "start-up"
assert B["lazy\nutil 0.85"].fails_at is None and B["PR #44053\nutil 0.85"].fails_at is None
print("budgets as predicted")

# %% [markdown]
# ## 9 · The split count is fixed at capture
#
# **Question.** Split-KV decode splits each request's context into `S` pieces, computes partial results
# into the `(B, Hq, S, D+1)` float32 scratch, and reduces them. An eager kernel would pick `S` from the
# context length. What if a graph is captured with the split plan of a short context and replayed at a long
# one? A public report did exactly that: captured at ~35 tokens, replayed at ~2,400 → illegal memory access.
# The grid (and the scratch's size) were frozen at capture; the kernel at replay indexes splits that the
# captured buffer does not have.
#
# vLLM 0.33 avoids it by not choosing: `AttentionConfig.tq_max_kv_splits_for_cuda_graph = 32`
# (`vllm/config/attention.py`: "Fixes the split count so grid dimensions are constant across captures, and
# buffers can be pre-allocated"); `TurboQuantAttentionImpl.__init__` stores it as `max_num_kv_splits` and every
# decode uses it; `_reserve_workspace` sizes the scratch for it.
#
# **Predict, then run.** With a context-dependent plan (one split per 64 tokens, at most 32) the capture at
# 35 tokens sizes the scratch for 1 split; the replay at 2,400 tokens wants 32: the kernel writes 31 splits'
# worth of partials past the end. With `S` fixed at 32 the replay writes exactly what was captured.

# %%
hq, d = DEMO.num_heads_per_rank, DEMO.head_dim
s_cap, s_rep = pw.dynamic_num_splits(35), pw.dynamic_num_splits(2400)
dyn = pw.replay_writes(s_cap, s_rep, 1, hq, d)
fixed = pw.replay_writes(DEMO.tq_max_kv_splits_for_cuda_graph, DEMO.tq_max_kv_splits_for_cuda_graph, 1, hq, d)
show_md(markdown_table(["plan", "S at capture", "S at replay", "scratch captured", "replay writes", "out of bounds"],
                       [["by context length", s_cap, s_rep, fmt_bytes(dyn["buffer_bytes"]), fmt_bytes(dyn["write_bytes"]),
                         fmt_bytes(dyn["out_of_bounds_bytes"])],
                        ["fixed (vLLM)", DEMO.tq_max_kv_splits_for_cuda_graph, DEMO.tq_max_kv_splits_for_cuda_graph,
                         fmt_bytes(fixed["buffer_bytes"]), fmt_bytes(fixed["write_bytes"]),
                         fmt_bytes(fixed["out_of_bounds_bytes"])]]))
# The fixed plan's scratch is exactly the first view of PR #44053's decode reservation at one row:
assert fixed["buffer_bytes"] == 1 * hq * DEMO.tq_max_kv_splits_for_cuda_graph * (d + 1) * 4
assert (s_cap, s_rep) == (1, 32) and dyn["out_of_bounds_bytes"] == dyn["write_bytes"] - dyn["buffer_bytes"] > 0
assert fixed["out_of_bounds_bytes"] == 0

# %% [markdown]
# The price of a fixed `S`: a short context still launches 32 splits (most of them empty) and the scratch is
# sized for 32 at `max_num_seqs` rows — a few hundred KiB per rank, which is why it costs nothing next to the
# continuation buffers. vLLM's comment says benchmarks showed no eager-mode regression.


# %% [markdown]
# ## Closing check
#
# On CUDA every GPU-capable cell above must have run live (`LiveCells.finish` raises otherwise), so a GPU
# run cannot "pass" by silently falling back to recorded data. On a CPU the latency cell shows the GPU
# recording instead: that is the expected outcome here, not a failure. With `TQLAB_NB05_LOG` set the log is
# written there; with `TQLAB_NB05_RESULTS` set the live results are saved (that is how
# `data/cuda_graphs_live.json` was recorded).

# %%
summary = LIVE.finish(os.environ.get("TQLAB_NB05_LOG") or None)
print(f"device {summary['device']}: {len(summary['ran'])} of {len(summary['expected'])} GPU-capable cells ran live "
      f"here ({', '.join(summary['ran'])})")
if summary["recorded"]:
    print(f"shown from a GPU recording instead (no CUDA here, expected): {', '.join(summary['recorded'])}")
if not LIVE.on_cuda:
    print("on CUDA every one of them must run live; this check is skipped on the CPU")
if SHOW_RECORDED and REC_LIVE:
    show_banner(REC_LIVE["provenance"])
    print("how it was recorded:", REC_LIVE.get("source") or f"`{REC_LIVE['provenance']['command']}` (this notebook)")
    if REC_LIVE.get("gpu_tests_passed") is None:
        print("that recording stored no GPU test counts (only this notebook's results)")
    else:
        print(f"GPU tests in that session: {REC_LIVE['gpu_tests_passed']} passed, {REC_LIVE.get('gpu_tests_failed')} failed")
out_path = os.environ.get("TQLAB_NB05_RESULTS")
if out_path:
    payload = {"provenance": make_provenance("DEVICE=cuda python notebooks/05_cuda_graphs_live.py",
                                             extra={"cuda": torch.version.cuda, "python": platform.python_version()}), **RESULTS}
    with open(out_path, "w") as f:
        json.dump(jsonable(payload), f, indent=1)
    print("results written to", out_path)
print(f"notebook time: {time.perf_counter() - T0:.1f} s")
