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
# Seed 002 §8 states the rule that keeps this safe in vLLM: **warm up before capture, capture
# largest bucket first, lock the workspace after capture**. This notebook shows each link of that
# chain live, then breaks it on purpose:
#
# 1. buckets and static inputs (how a batch of 3 is replayed in the graph for 4);
# 2. warm-up before capture (otherwise the workspace grows *inside* the capture);
# 3. pointer stability (the views' `data_ptr()` at capture = at every replay; replay = eager);
# 4. the hazard: unlock, grow, replay without guard / with the lock / with the guard;
# 5. three cases from public reports: (a) small-to-large capture without reservation,
#    (b) a consumer that needs *more* workspace at a *smaller* batch, (c) a warm-up after capture;
# 6. latency: eager vs replay per decode step.
#
# **Where it runs.** With CUDA every demonstration uses real `torch.cuda.CUDAGraph`s
# (`tqlab.engine.cuda_graph.CUDAGraphDecodeRunner`, the engine's decode runner on CUDA). Without CUDA the
# same runner runs in *simulated* mode: a replay re-runs the step but answers every workspace request
# with the view recorded at capture (the frozen pointers), and every GPU-only figure (latency, the
# concurrent-writer divergence) comes from `data/` under a banner naming device, date and commit.
# On CUDA every GPU-live cell must run live; the last cell checks it. Runs in well under a minute on
# a 2-core CPU. Parameters: `DEVICE` (`auto`, `cpu`, `cuda`), `USE_RECORDED` (`auto`: recorded GPU
# figures when not on CUDA; `always`; `never`); both can also come from environment variables.

# %% tags=["parameters"]
import os

DEVICE = os.environ.get("DEVICE", "auto")  # "auto" | "cpu" | "cuda"
USE_RECORDED = os.environ.get("USE_RECORDED", "auto")  # "auto" | "always" | "never"

# %%
import json
import time

import torch

from tqlab.engine import cuda_graph as cg
from tqlab.lab import graph_demos as demos
from tqlab.lab import graph_latency as latency
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
REC_LIVE = latency.load_recorded("live")  # the GPU run of this notebook
REC_LAT = latency.load_recorded("latency")  # benchmarks/bench_cuda_graphs.py on the GPU
print(f"device: {DEVICE} ({torch.cuda.get_device_name(0) if ON_CUDA else 'no CUDA: simulated graphs'}), torch {torch.__version__}")
print(f"demo config: {DEMO.preset}, {DEMO.num_hidden_layers} layers, Hq/rank {DEMO.num_heads_per_rank}, "
      f"Hk/rank {DEMO.num_kv_heads_per_rank}, D {DEMO.head_dim}, max_num_seqs {DEMO.max_num_seqs}, "
      f"max_model_len {DEMO.max_model_len}, {DEMO.kv_cache_dtype}")
if SHOW_RECORDED:
    print(latency.recorded_banner(REC_LIVE))
    print(latency.recorded_banner(REC_LAT))

# %% [markdown]
# ## 1 · Buckets and static inputs
#
# One graph per decode batch-size bucket: 1, 2, 4, then multiples of 8 (16 above 256) up to and
# *including* `max_num_seqs`. A batch replays in the smallest bucket that holds it; the unused lanes
# are padding: token 0, slot −1 (the cache store skips it), block table all null block (0), `seq_len` 1.
# Static inputs are sized for the largest bucket and `ceil(max_model_len / block_size)` blocks, so
# the longest request fits.

# %%
from tqlab.config import EngineConfig

for name in ("nemotron-3-super-120b-a12b", "llama-3.1-8b"):
    sizes = EngineConfig.from_preset(name).capture_sizes()
    print(f"{name}: {len(sizes)} buckets {sizes[:6]} ... {sizes[-3:]}")
sizes = EngineConfig.from_preset("llama-3.1-8b").capture_sizes()
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
# ## 2 · Warm-up before capture
#
# Without reservation (`fix=False`) the workspace is empty when capture starts. With the eager
# warm-up the step grows it first and the capture itself allocates nothing (seed 002 §8.1: the fast
# path of `_ensure_workspace_size`). Without warm-up the growth happens *inside* the capture: on CUDA
# the buffer then comes out of the graph's private pool.

# %%
r = demos.warmup_demo(DEMO, DEVICE)
RESULTS["warmup"] = r
print(latency.format_table([dict(variant=k, **v) for k, v in r.items()],
                      ["variant", "num_warmups", "workspace_bytes_before", "resizes_in_warmup", "resizes_in_capture",
                       "workspace_bytes_after", "ok"]))
for k, v in r.items():
    if v["error"]:
        print(f"{k}: capture raised {v['error']}")
LIVE.ran("warmup")
if SHOW_RECORDED and REC_LIVE and "warmup" in REC_LIVE:
    print("\n" + latency.recorded_banner(REC_LIVE) + " -- real CUDA graph capture:")
    print(latency.format_table([dict(variant=k, **v) for k, v in REC_LIVE["warmup"].items()],
                          ["variant", "num_warmups", "resizes_in_warmup", "resizes_in_capture", "workspace_bytes_after", "ok"]))

# %% [markdown]
# ## 3 · Pointer stability
#
# Reserved (PR #44053), warmed up, captured largest first, locked — vLLM's sequence. Each step replays
# a batch of `max_num_seqs − 1` requests (one padded lane), compares with the eager step on the same
# static inputs, and asks the workspace for the decode views again; between steps an eager
# continuation prefill uses the same workspace bytes (prefill stays eager, seed 002 §8.3).

# %%
r = demos.pointer_stability_demo(DEMO, DEVICE, steps=3)
if ON_CUDA:
    assert r["mode"] == "cuda", r["mode"]
RESULTS["pointer_stability"] = r
print(f"mode {r['mode']}; batch {r['batch']} in bucket {r['bucket']}; buckets {r['buckets']}; "
      f"workspace {r['workspace_bytes']} bytes; resizes during capture {r['resizes_in_capture']}")
print(f"capture: buffer 0x{r['capture_buffer_ptr']:x}, views {[hex(p) for p in r['capture_view_ptrs']]} "
      f"({r['num_workspace_requests_in_graph']} requests in the graph, {r['distinct_view_ptr_sets_in_graph']} distinct pointer set)")
print(latency.format_table(r["steps"], ["step", "buffer_ptr", "view_ptrs", "same_as_capture", "bitwise_equal",
                                   "max_abs_diff", "argmax_mismatch"], hex_cols=["buffer_ptr", "view_ptrs"]))
LIVE.ran("pointer_stability")
if SHOW_RECORDED and REC_LIVE and "pointer_stability" in REC_LIVE:
    g = REC_LIVE["pointer_stability"]
    print("\n" + latency.recorded_banner(REC_LIVE))
    print(f"real CUDA graphs: mode {g['mode']}, batch {g['batch']} in bucket {g['bucket']}")
    print(latency.format_table(g["steps"], ["step", "buffer_ptr", "same_as_capture", "bitwise_equal", "max_abs_diff"],
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
    print(latency.format_table(nd["concurrent_owner_trials"], ["bitwise_equal", "max_abs_diff", "nonfinite", "argmax_mismatch", "rows"]))
print(f"[guard]    raised: {gd['raised']}\n           {gd.get('error')}")
LIVE.ran("hazard")
if SHOW_RECORDED:
    print("\n" + latency.recorded_banner(REC_LIVE))
    if REC_LIVE and "concurrent_owner_trials" in REC_LIVE.get("hazard", {}).get("no_guard", {}):
        g = REC_LIVE["hazard"]["no_guard"]
        print(f"on the GPU, the new owner writing on another stream during the stale replay: "
              f"{g['concurrent_owner_diverged']} of {len(g['concurrent_owner_trials'])} replays diverged from eager")
        print(latency.format_table(g["concurrent_owner_trials"], ["bitwise_equal", "max_abs_diff", "nonfinite", "argmax_mismatch", "rows"]))

# %% [markdown]
# ## 5 · Cases from public reports
#
# **(a)** Capturing small-to-large without a reservation: each bucket's warm-up grows the workspace
# and frees the buffer the earlier graphs baked in. The guard refuses those graphs; reserve-then-capture
# (PR #44053's decode reservation at `max_num_seqs`) and largest-first both avoid the growth.

# %%
rows = []
for order, reserve in (("smallest_first", None), ("smallest_first", "max_num_seqs"), ("largest_first", None)):
    r = demos.capture_order_demo(DEMO, DEVICE, order=order, reserve=reserve)
    RESULTS.setdefault("case_a", []).append(r)
    print(f"\norder {order}, reserve {reserve}: stale buckets {r['stale_buckets']}")
    print(latency.format_table(r["captures"], ["bucket", "buffer_ptr", "bytes", "resizes_in_warmup", "resizes_in_capture"],
                          hex_cols=["buffer_ptr"]))
    print("guarded replay:", {b: ("ok" if v["ok"] else "StalePointerError") for b, v in r["replay"].items()})
bad = RESULTS["case_a"][0]["replay"]
print("\nfirst refusal:", next(v["error"] for v in bad.values() if not v["ok"]))
LIVE.ran("case_a")
if SHOW_RECORDED and REC_LIVE and "case_a" in REC_LIVE:
    print("\n" + latency.recorded_banner(REC_LIVE) + " -- real CUDA graphs:")
    for g in REC_LIVE["case_a"]:
        print(f"order {g['order']}, reserve {g['reserve']}: stale buckets {g['stale_buckets']}, buffer per capture "
              f"{[hex(c['buffer_ptr']) for c in g['captures']]}")

# %% [markdown]
# **(b)** A consumer whose need is not monotonic in the batch: `BatchDependentSplitsBackend` gives
# batches of at most 2 rows four times as many KV splits (small batches split the context more to fill
# the GPU). Largest-first capture and the PR's reservation at `max_num_seqs` both miss it: the capture
# of bucket 2 grows the workspace after bucket 4 was captured — before the lock, so the lock cannot see
# it. Only reserving the maximum over *all* buckets is safe.

# %%
for reserve in ("max_num_seqs", "all_buckets"):
    r = demos.nonmonotonic_demo(DEMO, DEVICE, reserve=reserve)
    RESULTS.setdefault("case_b", []).append(r)
    print(f"\nreserve {reserve}: need per bucket {r['need_bytes']} bytes (largest at bucket {r['argmax_need']}); "
          f"stale buckets {r['stale_buckets']}")
    print(latency.format_table(r["captures"], ["bucket", "buffer_ptr", "bytes", "resizes_in_warmup", "resizes_in_capture"],
                          hex_cols=["buffer_ptr"]))
    print("guarded replay:", {b: ("ok" if v["ok"] else "StalePointerError") for b, v in r["replay"].items()})
LIVE.ran("case_b")
if SHOW_RECORDED and REC_LIVE and "case_b" in REC_LIVE:
    print("\n" + latency.recorded_banner(REC_LIVE) + " -- real CUDA graphs:")
    for g in REC_LIVE["case_b"]:
        print(f"reserve {g['reserve']}: need {g['need_bytes']}, stale buckets {g['stale_buckets']}")

# %% [markdown]
# **(c)** A warm-up that runs *after* capture and grows the workspace (here a dummy decode of
# `2 × max_num_seqs` rows). Between capture and lock the lock cannot catch it: the guard does, at the
# first replay. After the lock, the lock refuses it.

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

# %% [markdown]
# ## 6 · Latency: eager vs replay per decode step
#
# CUDA events, warm-up, medians, microseconds. *eager*: the decode step as Python launches it;
# *replay*: `graph.replay()` on filled static inputs; *runner step*: guard + copy into the static
# inputs + padding + replay; *summed kernel time*: device time of the replay's kernels under
# `torch.profiler`. Targets (issue 4): replay ≥ 5× faster than eager at batch 1, and within 1.3× of
# the summed kernel time. On CUDA this cell measures live, without the profiler (a profiler session
# slows later launches in the same process): the seed model's 8-layer shard at every batch, and the
# 32-layer model at three batches, each captured as its own bucket. The full sweep with kernel sums is
# `benchmarks/bench_cuda_graphs.py` (one process per model), shown from `data/` below.

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
        print(latency.format_table(v["rows"], ["batch", "bucket", "eager_us", "replay_us", "run_us", "kernel_sum_replay_us",
                                          "speedup", "replay_over_kernel_sum", "max_abs_diff"]))
    plot_latency(live_lat, title=f"live on {torch.cuda.get_device_name(0)}")
    LIVE.ran("latency")
else:
    LIVE.recorded("latency")
if SHOW_RECORDED or not ON_CUDA:
    print(latency.recorded_banner(REC_LAT))
    if REC_LAT:
        print("command:", REC_LAT["provenance"].get("command"))
        for k, v in REC_LAT["results"].items():
            print(f"\n{k}: {v['num_hidden_layers']} layers, Hq/rank {v['num_heads_per_rank']}, Hk/rank "
                  f"{v['num_kv_heads_per_rank']}, {v['kv_cache_dtype']}, context {v['context_len']} tokens")
            print(latency.format_table(v["rows"], ["batch", "bucket", "eager_us", "replay_us", "run_us",
                                              "kernel_sum_replay_us", "speedup", "replay_over_kernel_sum"]))
        print("\nsummary vs targets:", json.dumps(REC_LAT.get("summary"), indent=1))
        for k, v in REC_LAT.get("errors", {}).items():
            print(f"not recorded: {k}: {v}")
        for note in REC_LAT.get("notes", []):
            print("note:", note)
        plot_latency(REC_LAT["results"], title=latency.recorded_banner(REC_LAT))

# %% [markdown]
# ## Closing check
#
# On CUDA every cell above must have run live (`LiveCells.finish` raises otherwise), so a GPU run
# cannot "pass" by silently falling back to recorded data. With `TQLAB_NB05_LOG` set the log is
# written there; with `TQLAB_NB05_RESULTS` set the live results are saved (that is how
# `data/cuda_graphs_live.json` was recorded).

# %%
summary = LIVE.finish(os.environ.get("TQLAB_NB05_LOG") or None)
print(json.dumps(summary))
if SHOW_RECORDED and REC_LIVE:
    print(latency.recorded_banner(REC_LIVE))
    print("how it was recorded:", REC_LIVE.get("source", "this notebook's results file"))
    print("GPU tests passed in that session:", REC_LIVE.get("gpu_tests_passed"))
    print("GPU tests failed in that session:", REC_LIVE.get("gpu_tests_failed"))
out_path = os.environ.get("TQLAB_NB05_RESULTS")
if out_path:
    payload = {"provenance": latency.provenance("DEVICE=cuda python notebooks/05_cuda_graphs_live.py"), **RESULTS}
    with open(out_path, "w") as f:
        json.dump(latency.jsonable(payload), f, indent=1)
    print("results written to", out_path)
print(f"notebook time: {time.perf_counter() - T0:.1f} s")
