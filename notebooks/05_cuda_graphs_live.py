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
# # 05 · CUDA graphs live: capture, replay, frozen workspace pointers, and a replay guard
#
# A CUDA graph records kernels *with their arguments*, raw device pointers included, and replays them
# without asking Python again. The decode step asks the workspace for its split-KV scratch
# (`get_simultaneous`), so a captured decode graph has the workspace buffer's address baked in.
# vLLM keeps this safe with one order of events in `GPUModelRunner.capture_model`
# (`vllm/v1/worker/gpu_model_runner.py`): **warm up before capture, capture the largest batch first,
# lock the workspace after capture** (`lock_workspace()`, `vllm/v1/worker/workspace.py`).
#
# | you will learn | section |
# |---|---|
# | which graph a decode batch replays in, and what fills the unused lanes | 1 |
# | why the eager warm-up must come before the capture | 2 |
# | that a replay uses exactly the views the capture saw, and equals the eager step | 3 |
# | what a replay does when the workspace moved after capture — and what stops it | 4 |
# | three ways a graph goes stale: two from vLLM issues, one constructed | 5 |
# | what a replay saves per decode step (GPU recording) | 6 |
# | piecewise graphs: why a prefill chunk can still ask the workspace after the lock | 7 |
# | the capture sequence around the lock, and the memory budget of a late buffer (vLLM issue #40420) | 8 |
# | why vLLM fixes the split count at capture (`tq_max_kv_splits_for_cuda_graph` = 32) | 9 |
#
# **What you need.** Nothing but this repository. With CUDA every demonstration uses real
# `torch.cuda.CUDAGraph`s (`tqlab.engine.cuda_graph.CUDAGraphDecodeRunner`). Without CUDA the same runner
# runs in *simulated* mode: a replay re-runs the step but answers every workspace request with the view
# recorded at capture (the frozen pointers). GPU-only numbers (latency, a second stream writing into a
# freed block) come from `data/` under a banner naming device, date and commit. Sections 7–9 model vLLM's
# decisions on the CPU on every machine. On CUDA the last cell checks that every GPU-capable cell ran live.
#
# **Run time.** About 10 s on a 2-core CPU box; the last cell prints it.
#
# Each section asks a question, then runs one cell that answers it with a picture, a small table and an
# `assert` — the **predict, then run** check: decide your answer before you run the cell. Bytes are in
# KiB/MiB/GiB (powers of 2; vLLM's messages call MiB "MB"). Parameters: `DEVICE` (`auto`, `cpu`, `cuda`),
# `USE_RECORDED` (`auto`: recorded GPU figures when not on CUDA; `always`; `never`); both can also come from
# environment variables.

# %%
from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

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

import matplotlib.pyplot as plt
import torch

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes
from tqlab.core.workspace import WorkspaceManager, compute_layout
from tqlab.engine import cuda_graph as cg
from tqlab.lab import graph_demos as demos
from tqlab.lab import graph_latency as latency
from tqlab.lab import memory_budget as mb
from tqlab.lab import piecewise as pw
from tqlab.lab import plots_graphs as gplots
from tqlab.lab.display import fmt_bytes, markdown_table, recording_label, show_md
from tqlab.lab.recorded import banner_text, has_recorded, jsonable, load_recorded, make_provenance, show_banner
from tqlab.predict.analysis import decode_capture_rows, decode_rows_at_lock

T0 = time.perf_counter()
if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cuda" and not torch.cuda.is_available():
    raise RuntimeError("DEVICE='cuda' but torch.cuda.is_available() is False")
if USE_RECORDED not in ("auto", "always", "never"):
    raise ValueError(f"USE_RECORDED must be 'auto', 'always' or 'never', got {USE_RECORDED!r}")
ON_CUDA = DEVICE == "cuda"
SHOW_RECORDED = USE_RECORDED == "always" or (USE_RECORDED == "auto" and not ON_CUDA)

# The bug report's model, one rank of TP 8 (4 query heads, 1 KV head, head_dim 128, max_num_seqs 4,
# turboquant_3bit_nc), with a short max_model_len so each engine builds in a second; 8 layers on CUDA, 2 on
# CPU (the layer count changes no pointer, only the run time).
DEMO = demos.make_demo_config(num_hidden_layers=8 if ON_CUDA else 2)
LIVE = demos.LiveCells(DEVICE, ["warmup", "pointer_stability", "hazard", "case_a", "case_b", "case_c", "latency"])
RESULTS: dict = {}
# GPU recordings (plain dicts, None when absent): this notebook's GPU run, and benchmarks/bench_cuda_graphs.py.
REC_LIVE, REC_LAT = (load_recorded(n).data if has_recorded(n) else None for n in ("cuda_graphs_live", "cuda_graphs_latency"))
show_md(markdown_table(("device", "torch", "demo model (one rank)", "layers", "Hq / Hk per rank", "head_dim",
                        "max_num_seqs", "max_model_len", "cache"),
                       [(f"{DEVICE} ({torch.cuda.get_device_name(0) if ON_CUDA else 'no CUDA: simulated graphs'})",
                         torch.__version__, DEMO.preset, DEMO.num_hidden_layers,
                         f"{DEMO.num_heads_per_rank} / {DEMO.num_kv_heads_per_rank}", DEMO.head_dim, DEMO.max_num_seqs,
                         DEMO.max_model_len, DEMO.kv_cache_dtype)]))
if SHOW_RECORDED:
    for rec, name in ((REC_LIVE, "cuda_graphs_live"), (REC_LAT, "cuda_graphs_latency")):
        if rec:
            show_banner(rec["provenance"])
        else:
            print(f"no GPU recording data/{name}.json yet (run this notebook or benchmarks/bench_cuda_graphs.py on a GPU)")

# %% [markdown]
# ## 1 · Which graph does a batch of 3 replay in?
#
# **Question.** vLLM captures one decode graph per batch-size *bucket*: 1, 2, 4, then multiples of 8 (of 16
# above 256) up to and including `max_num_seqs`. A graph has fixed shapes, so a batch of 3 cannot have its
# own. Which graph runs it, and what sits in the lanes the batch does not fill?
#
# The static inputs a graph reads are sized for the largest bucket and for `ceil(max_model_len / block_size)`
# blocks, so the longest request fits; every step copies the batch into them and rewrites the unused lanes as
# padding (`StaticDecodeInputs.fill`).
#
# **Predict, then run.** Which bucket runs a batch of 3, and one of 5? After a batch of 4 and then a batch of
# 3 in bucket 4, what do lane 3's slot, `seq_len` and block table hold?

# %%
sizes = decode_capture_rows(EngineConfig.from_preset("llama-3.1-8b"))
gplots.plot_bucket_lanes([1, 3, 5, 9, 17, 100, 255], sizes)
plt.show()

static = cg.StaticDecodeInputs(max_batch=4, max_blocks_per_seq=3, device="cpu")
static.fill(cg.DecodeBatch(torch.tensor([11, 12, 13, 14]), torch.tensor([40, 57, 81, 99]),
                           torch.tensor([[2, 3, 0], [4, 5, 0], [6, 7, 8], [9, 10, 11]], dtype=torch.int32),
                           torch.tensor([9, 26, 34, 52], dtype=torch.int32)), bucket=4)
static.fill(cg.DecodeBatch(torch.tensor([21, 22, 23]), torch.tensor([41, 58, 82]),
                           torch.tensor([[2, 3], [4, 5], [6, 7]], dtype=torch.int32),
                           torch.tensor([10, 27, 35], dtype=torch.int32)), bucket=4)
show_md("Static inputs after a batch of 4, then a batch of 3 in bucket 4:\n\n" + markdown_table(
    ("lane", "input_ids", "slot_mapping", "seq_lens", "block_tables"),
    [(i, static.input_ids[i].item(), static.slot_mapping[i].item(), static.seq_lens[i].item(),
      static.block_tables[i].tolist()) for i in range(4)]))

assert cg.select_bucket(3, sizes) == 4 and cg.select_bucket(5, sizes) == 8
assert static.slot_mapping[3].item() == cg.PAD_SLOT == -1 and static.seq_lens[3].item() == 1
assert set(static.block_tables[3].tolist()) == {cg.NULL_BLOCK}  # the batch of 4's blocks [9, 10, 11] are gone
print(f"llama-3.1-8b captures {len(sizes)} buckets ({sizes[:4]} ... {sizes[-2:]}); batch 3 -> bucket 4, "
      f"batch 5 -> bucket 8; lane 3 is padding: slot {cg.PAD_SLOT} (the cache store skips it), seq_len 1, null blocks")

# %% [markdown]
# A padding lane that kept the batch of 4's slot would make the replay store a token into that request's
# cache: the lanes are rewritten on every step, not only when the bucket changes.
#
# ## 2 · Why warm up before the capture?
#
# **Question.** Without the reservation (`fix=False`) the workspace is empty when capture starts. vLLM runs
# eager warm-up steps (`_warmup_and_capture`) before it captures a bucket. Where does the workspace grow with
# the warm-up, and where without it?
#
# **Predict, then run.** With two warm-up steps, how many resizes happen *inside* the capture? With none?
# Do the two end with the same workspace size?

# %%
r = demos.warmup_demo(DEMO, DEVICE)  # captures the largest bucket with 2 eager warm-ups, and with none
RESULTS["warmup"] = r
gplots.plot_capture_resizes(r)
plt.show()
show_md(markdown_table(("variant", "num_warmups", "workspace before", "workspace after", "capture ok"),
                       [(k, v["num_warmups"], fmt_bytes(v["workspace_bytes_before"]), fmt_bytes(v["workspace_bytes_after"]),
                         v["ok"]) for k, v in r.items()]))
LIVE.ran("warmup")

assert r["with_warmup"]["resizes_in_capture"] == 0 and r["with_warmup"]["resizes_in_warmup"] >= 1
assert r["without_warmup"]["resizes_in_capture"] >= 1
assert r["with_warmup"]["workspace_bytes_after"] == r["without_warmup"]["workspace_bytes_after"]
if REC_LIVE and "warmup" in REC_LIVE:  # the same holds for real CUDA graphs (recorded)
    g = REC_LIVE["warmup"]
    assert g["with_warmup"]["resizes_in_capture"] == 0 and g["without_warmup"]["resizes_in_capture"] >= 1
print(f"with the warm-up: {r['with_warmup']['resizes_in_capture']} resizes inside the capture; without it: "
      f"{r['without_warmup']['resizes_in_capture']}; both end at {fmt_bytes(r['with_warmup']['workspace_bytes_after'])}")

# %% [markdown]
# The warm-up takes the growth out of the capture: when the capture asks, `_ensure_workspace_size` finds the
# buffer big enough (its fast path) and allocates nothing. Without it, on CUDA the buffer would come out of
# the graph's private memory pool, in the middle of a capture.
#
# ## 3 · Does a replay see the workspace the capture saw?
#
# **Question.** Reserved (PR #44053), warmed up, captured largest first, locked — vLLM's sequence. Each step
# replays a batch of `max_num_seqs − 1` requests (one padded lane) and, between steps, an eager continuation
# prefill uses the same workspace bytes (prefill stays eager: section 7 shows why).
#
# **Predict, then run.** At each replay, are the decode views at the capture's offsets? Is the replay's output
# bitwise equal to the eager step on the same inputs? How many resizes happen during capture?

# %%
r = demos.pointer_stability_demo(DEMO, DEVICE, steps=3)
if ON_CUDA:
    assert r["mode"] == "cuda", r["mode"]
RESULTS["pointer_stability"] = r
gplots.plot_pointer_steps(r)
plt.show()
show_md(markdown_table(("replay step", "views at the capture's addresses", "bitwise equal to eager", "max abs diff"),
                       [(s["step"], s["same_as_capture"], s["bitwise_equal"], s["max_abs_diff"]) for s in r["steps"]]))
LIVE.ran("pointer_stability")

assert set(r["resizes_in_capture"].values()) == {0}  # per bucket
assert all(st["same_as_capture"] for st in r["steps"]), r["steps"]
assert all(st["bitwise_equal"] for st in r["steps"]), r["steps"]
if REC_LIVE and "pointer_stability" in REC_LIVE:  # and on the GPU recording
    assert all(st["same_as_capture"] and st["bitwise_equal"] for st in REC_LIVE["pointer_stability"]["steps"])
print(f"mode {r['mode']}: {len(r['steps'])} replays of batch {r['batch']} in bucket {r['bucket']}, all at the capture's "
      f"addresses and equal to eager; 0 resizes during the capture of buckets {r['buckets']}")

# %% [markdown]
# ## 4 · What does a replay do after the workspace moved — and what stops it?
#
# **Question.** A graph keeps the raw address of the buffer it was captured with. If the workspace grows after
# capture, the manager frees that buffer and allocates a new one. What does the next replay touch? vLLM PR
# #46067 describes this on GPUs: the freed block is released with `empty_cache()`, and the first decode step
# hits "an illegal memory access" (vLLM issue #45670). Here the runner keeps a reference to every buffer a
# graph captured, so the demonstration only ever touches memory this process owns. Three runs on one engine:
#
# * **lock**: after the lock, a request to grow is refused and nothing moves;
# * **no guard**: unlock, grow (the captured buffer is freed), replay;
# * **guard**: the same replay with `tqlab.engine.replay_guard` on.
#
# **Predict, then run.** Without the guard, how many bytes does the replay write into the *new* buffer — and
# into the freed one? Does its output still equal the eager step while nobody else uses the freed block?
# With the guard, does the replay run at all?

# %%
r = demos.stale_replay_demo(DEMO, DEVICE)
if ON_CUDA:
    assert r["mode"] == "cuda" and "concurrent_owner_trials" in r["no_guard"], r["mode"]
RESULTS["hazard"] = HAZ = r
lk, nd, gd = r["lock"], r["no_guard"], r["guard"]
gplots.plot_stale_replay(nd)
plt.show()
show_md(markdown_table(("run", "what happened"), [
    ("lock", f"growth refused: {lk['refused']}; buffer unchanged: {lk.get('pointer_unchanged')}; "
             f"replay = eager: {lk.get('bitwise_equal')}"),
    ("no guard", f"graph views inside the freed buffer: {nd['graph_views_inside_old_buffer']}, inside the new one: "
                 f"{nd['graph_views_inside_new_buffer']}; output = eager while the freed block is ours alone: "
                 f"{nd['exclusive_old_buffer']['bitwise_equal']}"),
    ("guard", f"`StalePointerError` before anything ran: {gd['raised']}"),
]))
print("the guard's message:", gd.get("error"))
LIVE.ran("hazard")

assert lk["refused"] and lk.get("pointer_unchanged")
assert nd["graph_views_inside_old_buffer"] and not nd["graph_views_inside_new_buffer"]
assert nd["old_buffer_bytes_overwritten"] > 0 and nd["new_buffer_bytes_touched"] == 0
assert nd["new_owner_bytes_corrupted"] > 0 and gd["raised"]
if REC_LIVE and "hazard" in REC_LIVE:  # and with real CUDA graphs (recorded)
    g = REC_LIVE["hazard"]
    assert g["lock"]["refused"] and g["guard"]["raised"] and g["no_guard"]["new_buffer_bytes_touched"] == 0
print(f"no guard: {nd['old_buffer_bytes_overwritten']:,} bytes written into the freed buffer, "
      f"{nd['new_buffer_bytes_touched']} into the new one; guard: refused")

# %% [markdown]
# While the freed block belongs to nobody else the output is still right — which is why this bug hides. Whoever
# owns the block next loses its data (the third bar). On a GPU, a second stream writing into the block during
# the replay makes the output itself diverge (recorded):

# %%
if REC_LIVE and "concurrent_owner_trials" in REC_LIVE.get("hazard", {}).get("no_guard", {}):
    g = REC_LIVE["hazard"]["no_guard"]
    if SHOW_RECORDED:
        show_banner(REC_LIVE["provenance"])
    show_md(markdown_table(("trial", "bitwise equal to eager", "max abs diff", "non-finite logits", "argmax mismatches"),
                           [(i, t["bitwise_equal"], t["max_abs_diff"], t["nonfinite"], t["argmax_mismatch"])
                            for i, t in enumerate(g["concurrent_owner_trials"])]))
    print(f"{g['concurrent_owner_diverged']} of {len(g['concurrent_owner_trials'])} replays diverged from eager")
elif ON_CUDA:
    print(f"live: {nd['concurrent_owner_diverged']} of {len(nd['concurrent_owner_trials'])} replays diverged")
else:
    print("no GPU recording of the concurrent-owner trials under data/")

# %% [markdown]
# ## 5 · Three ways a captured graph goes stale
#
# Each case below captures every bucket of the demo deployment, locks, and replays each graph with the guard
# on; a red cell is a graph whose workspace buffer moved after its capture.
#
# **(a) Small-to-large capture without a reservation.** vLLM issue #45670 (TurboQuant, CUDA graphs, GB200:
# "an illegal memory access" on the first decode) and the fix proposed for it, vLLM PR #46067: graphs were
# captured for ascending batch sizes, "each larger capture grows the workspace, freeing the address an
# earlier-captured (smaller-batch) graph still points at". vLLM's V1 runner captures largest first; PR
# #44053's reservation sizes the decode scratch for `max_num_seqs` before any capture.
#
# **Predict, then run.** Small-to-large without a reservation: which buckets are stale? With the decode
# reservation at `max_num_seqs`? Largest first, without a reservation?

# %%
CASE_A = [("smallest_first", None), ("smallest_first", "max_num_seqs"), ("largest_first", None)]
RESULTS["case_a"] = [demos.capture_order_demo(DEMO, DEVICE, order=o, reserve=res) for o, res in CASE_A]
gplots.plot_graph_status({f"{x['order'].replace('_', ' ')}, reserve: {x['reserve']}": x["replay"]
                          for x in RESULTS["case_a"]}, title="(a) capture order, with and without the reservation")
plt.show()
show_md(markdown_table(("capture order", "reservation", "buffers the graphs baked in", "stale buckets"),
                       [(x["order"], x["reserve"], len({c["buffer_ptr"] for c in x["captures"]}), x["stale_buckets"])
                        for x in RESULTS["case_a"]]))
LIVE.ran("case_a")

assert [bool(x["stale_buckets"]) for x in RESULTS["case_a"]] == [True, False, False]
assert RESULTS["case_a"][0]["stale_buckets"] == sorted(decode_capture_rows(DEMO))[:-1]  # all but the last captured
if REC_LIVE and "case_a" in REC_LIVE:
    assert [bool(x["stale_buckets"]) for x in REC_LIVE["case_a"]] == [True, False, False]
print("stale: every bucket captured before the largest, and only without the reservation and largest-first order")

# %% [markdown]
# **(b) A consumer that needs *more* workspace at a *smaller* batch — a constructed example.** No vLLM
# report describes this; tqlab's `BatchDependentSplitsBackend` is made up to show where largest-first
# capture stops protecting: it gives batches of at most 2 rows four times as many KV splits (split-KV
# kernels do pick more splits for small batches to fill the GPU; TurboQuant in vLLM 0.33 does not, its
# split count is fixed, section 9). The capture of bucket 2 then grows the workspace *after* bucket 4 was
# captured — before the lock, so the lock cannot see it.
#
# **Predict, then run.** At which bucket is the need largest? Which graph goes stale with the reservation at
# `max_num_seqs`, and which with the maximum over *all* buckets?

# %%
RESULTS["case_b"] = [demos.nonmonotonic_demo(DEMO, DEVICE, reserve=res) for res in ("max_num_seqs", "all_buckets")]
gplots.plot_graph_status({f"reserve: {x['reserve']}": x["replay"] for x in RESULTS["case_b"]},
                         title="(b) a need that peaks at a small batch (constructed)")
plt.show()
show_md(markdown_table(["reservation"] + [f"need at bucket {b}" for b in RESULTS["case_b"][0]["need_bytes"]]
                       + ["stale buckets"],
                       [[x["reserve"]] + [fmt_bytes(v) for v in x["need_bytes"].values()] + [x["stale_buckets"]]
                        for x in RESULTS["case_b"]]))
LIVE.ran("case_b")

for res in [RESULTS["case_b"]] + ([REC_LIVE["case_b"]] if REC_LIVE and "case_b" in REC_LIVE else []):
    assert [(x["reserve"], bool(x["stale_buckets"])) for x in res] == [("max_num_seqs", True), ("all_buckets", False)]
    assert all(x["argmax_need"] == 2 for x in res)
print(f"need peaks at bucket 2; stale with the reservation at max_num_seqs: {RESULTS['case_b'][0]['stale_buckets']}; "
      "with the maximum over all buckets: none")

# %% [markdown]
# **(c) A warm-up that runs after capture.** vLLM issue #55336 (model runner V2, DeepSeek-V4-Flash on GB200):
# `warmup_kernels` ran *after* `capture_model()`, grew the workspace and freed the buffer the graphs had baked
# in; PR #55341 moved the warm-up before capture. Here the late warm-up is a dummy decode of
# `2 × max_num_seqs` rows, run once between capture and lock and once after the lock.
#
# **Predict, then run.** Before the lock: does the buffer move, and who notices? After the lock?

# %%
RESULTS["case_c"] = r = demos.late_warmup_demo(DEMO, DEVICE)
gplots.plot_graph_status({f"late warm-up {w.replace('_', ' ')}": v["replay"] for w, v in r.items()},
                         title="(c) a warm-up after capture")
plt.show()
show_md(markdown_table(("late warm-up", "workspace before → after", "buffer moved", "refused by the lock", "stale buckets"),
                       [(w, f"{fmt_bytes(v['bytes_before'])} → {fmt_bytes(v['bytes_after'])}", v["moved"],
                         bool(v["warmup_refused"]), v["stale_buckets"]) for w, v in r.items()]))
LIVE.ran("case_c")

assert r["before_lock"]["moved"] and r["before_lock"]["stale_buckets"] and not r["before_lock"]["warmup_refused"]
assert not r["after_lock"]["moved"] and not r["after_lock"]["stale_buckets"] and r["after_lock"]["warmup_refused"]
print("before the lock: the buffer moves and every graph is stale (the guard catches it at the first replay); "
      "after the lock: the lock refuses the warm-up")
if SHOW_RECORDED and REC_LIVE and all(k in REC_LIVE for k in ("case_a", "case_b", "case_c")):
    show_banner(REC_LIVE["provenance"], what="The same three cases with real CUDA graphs, recorded")
    print({k: [bool(x["stale_buckets"]) for x in REC_LIVE[k]] for k in ("case_a", "case_b")},
          {w: bool(v["stale_buckets"]) for w, v in REC_LIVE["case_c"].items()})

# %% [markdown]
# ## 6 · What does a replay save per decode step?
#
# **Question.** A graph replay launches the step's kernels without Python. How much faster is it than the
# eager step at batch 1, and how close to the kernels' own time? Measured with CUDA events (warm-up, medians,
# microseconds): *eager* = the step as Python launches it; *replay* = `graph.replay()` on filled static
# inputs; *runner step* = guard + copy into the static inputs + padding + replay; *summed kernel time* = the
# replay's kernels under `torch.profiler`. On CUDA this cell measures live (without the profiler); the full
# sweep is `benchmarks/bench_cuda_graphs.py`, shown from `data/` below.
#
# **Predict, then run.** Is replay at batch 1 faster than eager by the benchmark's target (≥ 5×)? (The
# recording states whether each target was met.)

# %%
LAT_COLS = ["batch", "bucket", "eager_us", "replay_us", "run_us", "kernel_sum_replay_us", "speedup",
            "replay_over_kernel_sum"]


def latency_table(rows, cols=LAT_COLS):
    """Markdown table; microseconds with thousands separators and one decimal, ratios with two."""
    def cell(c, v):
        if v is None:
            return "–"
        return f"{v:,.1f}" if c.endswith("_us") else (f"{v:.2f}" if isinstance(v, float) else str(v))
    return markdown_table([c.replace("_us", " (µs)") for c in cols], [[cell(c, r.get(c)) for c in cols] for r in rows])


if ON_CUDA:
    LAT = {
        "bug report's deployment (live)": latency.measure_decode_latency(EngineConfig.from_preset("nemotron-3-super-120b-a12b"), "cuda",
                                                      batch_sizes=[1, 2, 3, 4], iters=20, profile_reps=0, label="bug report"),
        "llama-3.1-8b (live)": latency.measure_decode_latency(
            EngineConfig.from_preset("llama-3.1-8b", cudagraph_capture_sizes=(1, 32, 256)), "cuda",
            batch_sizes=[1, 32, 256], iters=15, profile_reps=0, label="llama"),
    }
    RESULTS["latency"] = LAT
    gplots.plot_latency(LAT, title=f"live on {torch.cuda.get_device_name(0)}")
    plt.show()
    LIVE.ran("latency")
else:
    LIVE.recorded("latency")
    LAT = None
if REC_LAT:  # the recording's keys ("seed": the bug report's rank) as a reader names them
    REC_LAT = dict(REC_LAT, results={recording_label(k): v for k, v in REC_LAT["results"].items()},
                   summary={recording_label(k): v for k, v in (REC_LAT.get("summary") or {}).items()})
if REC_LAT and (SHOW_RECORDED or not ON_CUDA):
    show_banner(REC_LAT["provenance"])
    gplots.plot_latency(REC_LAT["results"], title=banner_text(REC_LAT["provenance"]).split("\n")[0])
    plt.show()
    for k, v in REC_LAT["results"].items():
        show_md(f"**{k}**: {v['num_hidden_layers']} layers, Hq/rank {v['num_heads_per_rank']}, Hk/rank "
                f"{v['num_kv_heads_per_rank']}, {v['kv_cache_dtype']}, context {v['context_len']} tokens\n\n"
                + latency_table(v["rows"]))
    for note in REC_LAT.get("notes", []):
        print("note:", note)
src = LAT if LAT else (REC_LAT["results"] if REC_LAT else {})
for k, v in src.items():
    b1 = next((row for row in v["rows"] if row["batch"] == 1), None)
    if b1:
        assert b1["replay_us"] < b1["eager_us"]  # a replay is faster than the eager step at batch 1
        print(f"{k}: batch 1 replay {b1['replay_us']:,.1f} µs vs eager {b1['eager_us']:,.1f} µs "
              f"({b1['eager_us'] / b1['replay_us']:.1f}×)")
for k, v in ((REC_LAT or {}).get("summary") or {}).items():
    print(f"{k} (recorded): ≥ 5× at batch 1 met: {'yes' if v['speedup_target_met'] else 'no'}; "
          f"replay within 1.3× of summed kernel time at every batch: "
          f"{'yes' if v['kernel_sum_target_met_all_batches'] else 'no'}")

# %% [markdown]
# ## 7 · Piecewise graphs: how does a prefill chunk reach the workspace after the lock?
#
# **Question.** The bug report's crash is an `AssertionError` raised inside `_continuation_prefill` at serve
# time. If decode runs from a captured graph that never calls Python, how does a prefill chunk get to ask the
# workspace anything after the lock?
#
# vLLM 0.33 captures two kinds of graphs (`CompilationConfig.cudagraph_mode`, `vllm/config/compilation.py`):
# a **FULL** graph holds the whole forward, attention included; a **PIECEWISE** graph is split at the
# attention ops (`CompilationConfig._attention_ops`, e.g. `vllm::unified_attention_with_output`): the pieces
# between two attentions are captured, attention runs eagerly in between. The mode names a pair (decode
# batches, mixed batches): `FULL_AND_PIECEWISE` (the default) = (FULL, PIECEWISE), `FULL_DECODE_ONLY` =
# (FULL, NONE). `resolve_cudagraph_mode_and_sizes` downgrades what the backend cannot take: TurboQuant's
# metadata builder declares `AttentionCGSupport.UNIFORM_BATCH` (`vllm/v1/attention/backends/turboquant_attn.py`),
# so it is captured FULL only for uniform batches — decodes. `tqlab.lab.piecewise` mirrors these rules.

# %%
gplots.plot_forward_plans({m.name: pw.forward_plan(2, m) for m in
                           (pw.CUDAGraphMode.FULL, pw.CUDAGraphMode.PIECEWISE, pw.CUDAGraphMode.NONE)})
plt.show()
rows = []
for requested in pw.CUDAGraphMode:
    got, why = pw.resolve_cudagraph_mode(requested, pw.TURBOQUANT_CG_SUPPORT)
    rows.append([requested.name, got.name, pw.runtime_mode(got, True).name, pw.runtime_mode(got, False).name, why])
show_md(markdown_table(["requested", "runs as (TurboQuant, UNIFORM_BATCH)", "decode batches", "mixed / prefill batches",
                        "why"], rows))

# %% [markdown]
# ### Live: one FULL and one PIECEWISE replay after the lock
#
# The toy decoder of `tqlab.lab.piecewise.PiecewiseForward` (2 layers, the demo's per-rank attention
# shape) asks the workspace for its decode scratch in every attention call. Capture one FULL and one PIECEWISE
# graph for batch 4, lock the workspace as `capture_model` does, then step each mode once.
#
# **Predict, then run.** How many workspace calls does a FULL replay make? A PIECEWISE replay? And an eager
# attention that needs more than the lock holds?

# %%
ws = WorkspaceManager("cpu")
fwd = pw.PiecewiseForward(ws, num_layers=2, num_heads=DEMO.num_heads_per_rank, head_dim=DEMO.head_dim,
                          num_splits=DEMO.tq_max_kv_splits_for_cuda_graph, dtype=DEMO.dtype)
cap = {m: fwd.capture(m, 4) for m in (pw.CUDAGraphMode.FULL, pw.CUDAGraphMode.PIECEWISE)}
ws.lock()
full, piece = fwd.step(pw.CUDAGraphMode.FULL, 4), fwd.step(pw.CUDAGraphMode.PIECEWISE, 4)
try:
    fwd.step(pw.CUDAGraphMode.NONE, 2 * DEMO.max_num_seqs)  # a larger eager attention after the lock
    bigger_error = None
except AssertionError as err:
    bigger_error = str(err)
show_md(markdown_table(("replay", "Python ran", "workspace calls"),
                       [("FULL", ", ".join(full.python_ops) or "nothing", full.workspace_calls),
                        ("PIECEWISE", ", ".join(piece.python_ops), piece.workspace_calls)]))
print(f"locked at {fmt_bytes(ws.size_bytes())}; an eager attention that needs more:", bigger_error)

assert full.workspace_calls == 0 and full.python_ops == []
assert piece.workspace_calls == 2 and all(op.endswith("attention") for op in piece.python_ops)
assert piece.view_ptrs == cap[pw.CUDAGraphMode.PIECEWISE].view_ptrs  # same buffer, checked by the lock each call
assert bigger_error is not None and "Workspace is locked" in bigger_error

# %% [markdown]
# FULL: 0 calls — the pointers were baked in at capture, and nothing would notice if they went stale
# (section 4). PIECEWISE: one call per layer, same pointers; a bigger need raises `Workspace is locked`. That
# is the bug report's crash: `_continuation_prefill` runs in a mixed batch, between the pieces. So under
# `FULL_AND_PIECEWISE` the decode scratch must not *move* after capture (sections 3–5), and the continuation
# prefill's buffers must already *fit* when the lock closes — what PR #44053 reserves. With
# `cudagraph_mode=NONE`, `GPUModelRunner.capture_model` returns before it reaches `lock_workspace()`, so that
# runner never locks (model runner V2, `vllm/v1/worker/gpu/model_runner.py`, also ends its capture with
# `lock_workspace()` in vLLM 0.33).
#
# ## 8 · The capture sequence around the lock, and the memory budget
#
# **Question.** In what order does vLLM reserve, profile, capture and lock — and why is a buffer that is
# allocated late (at serve time) a memory risk even when nothing is locked?
#
# `GPUModelRunner.capture_model` (`vllm/v1/worker/gpu_model_runner.py`, vLLM 0.33), in order:
# `set_cudagraph_capturing_enabled(True)`; for each runtime mode (PIECEWISE first, then FULL:
# `CudagraphDispatcher.get_capture_descs`) `_capture_cudagraphs` over the batch descriptors, **largest first**
# ("so that the smaller shapes can reuse the memory pool allocated for the large shapes"), each through
# `_warmup_and_capture`; `set_cudagraph_capturing_enabled(False)`; `synchronize()`, `empty_cache()`, then
# **`lock_workspace()`**. Before all of it, engine start-up runs `determine_available_memory()` — the
# **profile run**, a dummy forward that builds no TurboQuant metadata, so no attention workspace — and sizes
# the KV cache as `gpu_memory_utilization × total − (weights + activation peak + non-torch)`
# (`Worker.determine_available_memory`, `vllm/v1/worker/gpu_worker.py`). With CUDA graphs that method also
# measures the graphs' memory (`GPUModelRunner.profile_cudagraph_memory`), on a minimal KV cache whose
# metadata builders are built first: **PR #44053's `_reserve_workspace` first runs there, after the profile
# run** (notebook 03 §3 draws the whole start-up). Then `initialize_kv_cache` builds the real KV cache and the
# builders again (the same reservation, no growth); then `capture_model`.
#
# **Predict, then run.** Replayed on tqlab's manager with the demo's decode buckets, largest first: in which
# bucket's warm-up does the workspace grow, and does it ever grow inside a capture?

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
    log.append((b, grew_in_warmup, seq_ws.size_bytes() > before, fmt_bytes(seq_ws.size_bytes())))
seq_ws.lock()  # lock_workspace()
show_md(markdown_table(("bucket (capture order)", "grew in warm-up", "grew in capture", "workspace"), log))
assert [g for _, g, _, _ in log] == [True] + [False] * (len(log) - 1)
assert not any(c for _, _, c, _ in log) and seq_ws.is_locked()
assert seq_ws.size_bytes() == compute_layout(shapes(decode_rows_at_lock(DEMO))).total_bytes

# %% [markdown]
# **Why allocating late is risky: the memory budget.** The KV cache takes all of `gpu_memory_utilization ×
# total` that the profile run did not use. A buffer allocated *lazily* at serve time comes out of what is left.
# vLLM issue #40420 (a comment by its reporter's tester: 2 × RTX A5000, 24 GiB each, TP 2, `turboquant_k8v4`,
# `max_model_len` 262,144, `gpu_memory_utilization` 0.905) shows this: the continuation prefill's dequant
# buffers for a long prompt asked for **88 MiB with 42 MiB free** ("CUDA OOM: tried 88 MiB, 42 MiB free"), a
# cliff at ~234K tokens; at 0.85 the cliff was gone.
#
# The chart rebuilds that budget with `tqlab.lab.memory_budget` (vLLM's arithmetic). **From the report:** 24 GiB,
# 0.905, 42 MiB free, 88 MiB asked. **Assumed** (not in the report; they change the bar heights, not the
# verdict): weights 35 GB FP8 / TP 2 (the model's name: 35B parameters, 1 byte each), an activation peak of
# 1 GiB; what CUDA graphs, NCCL and the context took is whatever leaves 42 MiB free. The reservation is
# computed live: two float16 `(1, Hk, round_up(max_model_len − 1, 16), D)` buffers with `Hk·D` = 128 per rank.
#
# **Predict, then run.** At 0.905, where does the lazy engine fail, and where the one with the reservation?
# At 0.85?

# %%
GiB, MiB = 2**30, 2**20
TOTAL, UTIL, FREE_AT_OOM, ASKED = 24 * GiB, 0.905, 42 * MiB, 88 * MiB  # vLLM issue #40420
WEIGHTS, ACT = 35 * 10**9 // 2, 1 * GiB  # assumed (see above)
HK_D, MAX_LEN = 128, 262_144
cached_at_oom = ASKED // (2 * 2 * HK_D)  # two float16 buffers of Hk·D per cached token
reserve = compute_layout(continuation_workspace_shapes(MAX_LEN - 1, 1, HK_D, 16)).total_bytes
startup_ws = compute_layout(decode_workspace_shapes(2, 2, 128, 32, torch.bfloat16)).total_bytes  # max_num_seqs 2
after_profile = TOTAL - int(UTIL * TOTAL) - FREE_AT_OOM - startup_ws  # graphs, NCCL, context: all but 42 MiB


def budgets(util):
    base = dict(total=TOTAL, util=util, weights=WEIGHTS, activation_peak=ACT, after_profile=after_profile,
                workspace_startup=startup_ws)
    return {f"lazy\nutil {util}": mb.memory_budget(**base, workspace_need=ASKED, reserved=False),
            f"PR #44053\nutil {util}": mb.memory_budget(**base, workspace_need=reserve, reserved=True)}


B = {**budgets(0.905), **budgets(0.85)}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw=dict(width_ratios=[3, 2]))
mb.plot_budgets(B, title="one GPU of vLLM issue #40420, while a long prompt prefills", ax=axes[0])
mb.zoom_budgets(B, title="the top of each bar", ax=axes[1])
plt.tight_layout()
plt.show()
show_md(markdown_table(("engine", "KV cache (GiB)", "workspace", "free", "fails at"),
                       [(k.replace("\n", ", "), f"{b.segments['KV cache'] / GiB:.2f}", fmt_bytes(b.segments["workspace"]),
                         fmt_bytes(max(0, b.free)), b.fails_at or "runs") for k, b in B.items()]))

assert 170_000 < cached_at_oom < 190_000  # 88 MiB holds ~180K cached tokens at Hk·D = 128
assert B["lazy\nutil 0.905"].fails_at == "serve" and B["lazy\nutil 0.905"].free == FREE_AT_OOM
assert B["PR #44053\nutil 0.905"].fails_at == "start-up"
assert B["lazy\nutil 0.85"].fails_at is None and B["PR #44053\nutil 0.85"].fails_at is None
print(f"{fmt_bytes(ASKED)} = {cached_at_oom:,} cached tokens at Hk·D = {HK_D}; the reservation for {MAX_LEN:,}: {fmt_bytes(reserve)}")

# %% [markdown]
# At 0.905 the lazy engine dies at serve time; with the reservation the same budget fails at **start-up**,
# where the operator sees it; at 0.85 both run. In vLLM 0.33, `_reserve_workspace` runs when the builders are
# created, *after* the profile run measured the non-KV memory, so the reservation is not subtracted from the KV
# cache: it comes out of the headroom, like the lazy buffer — but before the KV tensors and the graphs.
#
# ## 9 · Why is the split count fixed at capture?
#
# **Question.** Split-KV decode splits each request's context into `S` pieces, computes partial results into
# the `(B, Hq, S, D+1)` float32 scratch, and reduces them. An eager kernel could pick `S` from the context
# length. What if a graph is captured with the split plan of a short context and replayed at a long one? The
# grid and the scratch size were frozen at capture. The numbers below (capture at 35 tokens, replay at 2,400)
# are a **constructed example**; vLLM PR #51119 (ROCm MLA) describes the same mechanism in another backend:
# capture at `seq_len` 1 "records the one-split grid", and at replay "captured split count, grid, workspace,
# and stage topology remain unchanged".
#
# vLLM 0.33 avoids it for TurboQuant by not choosing: `AttentionConfig.tq_max_kv_splits_for_cuda_graph = 32`
# (`vllm/config/attention.py`: "Fixes the split count so grid dimensions are constant across captures, and
# buffers can be pre-allocated"); every decode uses it and `_reserve_workspace` sizes the scratch for it.
#
# **Predict, then run.** With a context-dependent plan (one split per 64 tokens, at most 32), how many splits
# does the capture at 35 tokens size the scratch for, and how many does the replay at 2,400 tokens write? With
# `S` fixed at 32, how many bytes land out of bounds?

# %%
hq, d = DEMO.num_heads_per_rank, DEMO.head_dim
S_FIXED = DEMO.tq_max_kv_splits_for_cuda_graph
s_cap, s_rep = pw.dynamic_num_splits(35), pw.dynamic_num_splits(2400)
dyn, fixed = pw.replay_writes(s_cap, s_rep, 1, hq, d), pw.replay_writes(S_FIXED, S_FIXED, 1, hq, d)
show_md(markdown_table(["plan", "S at capture", "S at replay", "scratch captured", "replay writes", "out of bounds"],
                       [["by context length", s_cap, s_rep, fmt_bytes(dyn["buffer_bytes"]), fmt_bytes(dyn["write_bytes"]),
                         fmt_bytes(dyn["out_of_bounds_bytes"])],
                        ["fixed (vLLM)", S_FIXED, S_FIXED, fmt_bytes(fixed["buffer_bytes"]), fmt_bytes(fixed["write_bytes"]),
                         fmt_bytes(fixed["out_of_bounds_bytes"])]]))
# The fixed plan's scratch is exactly the first view of PR #44053's decode reservation at one row:
assert fixed["buffer_bytes"] == 1 * hq * S_FIXED * (d + 1) * 4
assert (s_cap, s_rep) == (1, 32) and dyn["out_of_bounds_bytes"] == dyn["write_bytes"] - dyn["buffer_bytes"] > 0
assert fixed["out_of_bounds_bytes"] == 0
print(f"dynamic plan: {dyn['out_of_bounds_bytes']:,} bytes written past the captured scratch; fixed plan: 0")

# %% [markdown]
# The price of a fixed `S`: a short context still launches 32 splits (most of them empty), and the scratch is
# sized for 32 at `max_num_seqs` rows — a fraction of a MiB per rank, small next to the continuation buffers.
# vLLM's comment says benchmarks showed no eager-mode regression.
#
# ## Closing check
#
# On CUDA every GPU-capable cell above must have run live (`LiveCells.finish` raises otherwise), so a GPU run
# cannot "pass" by silently falling back to recorded data. On a CPU the latency cell shows the GPU recording
# instead: expected here, not a failure. With `TQLAB_NB05_LOG` set the log is written there; with
# `TQLAB_NB05_RESULTS` set the live results are saved (that is how `data/cuda_graphs_live.json` was recorded).

# %%
summary = LIVE.finish(os.environ.get("TQLAB_NB05_LOG") or None)
print(f"device {summary['device']}: {len(summary['ran'])} of {len(summary['expected'])} GPU-capable cells ran live "
      f"here ({', '.join(summary['ran'])})")
if summary["recorded"]:
    print(f"shown from a GPU recording instead (no CUDA here, expected): {', '.join(summary['recorded'])}")
if SHOW_RECORDED and REC_LIVE:
    show_banner(REC_LIVE["provenance"])
    print("how it was recorded:", REC_LIVE.get("source") or f"`{REC_LIVE['provenance']['command']}` (this notebook)")
out_path = os.environ.get("TQLAB_NB05_RESULTS")
if out_path:
    payload = {"provenance": make_provenance("DEVICE=cuda python notebooks/05_cuda_graphs_live.py",
                                             extra={"cuda": torch.version.cuda, "python": platform.python_version()}), **RESULTS}
    with open(out_path, "w") as f:
        json.dump(jsonable(payload), f, indent=1)
    print("results written to", out_path)
print(f"notebook time: {time.perf_counter() - T0:.1f} s")

# %% [markdown]
# ## Exercises
#
# Write each function below (replace `raise NotImplementedError`), then run the cell: it checks your answer
# against tqlab's own on a few cases and says, per exercise, "correct", what differs, or "not attempted yet".
# Everything runs on a CPU. The solutions are in the collapsed cell after it.
#
# 1. **Which graph?** `bucket_for(batch, sizes)`: the captured batch size (bucket) a decode batch of `batch`
#    rows replays in, given the capture sizes `sizes`; `None` when it is larger than every bucket (it then runs
#    eagerly). (§1)
# 2. **The frozen scratch.** `decode_scratch_bytes(rows, heads, head_dim, splits)`: the bytes of the split-KV
#    decode workspace call a graph captures at `rows` rows, for a bfloat16 model — three views
#    `(rows, heads, splits, head_dim + 1)` float32, `(rows, heads, head_dim)` bfloat16, `(rows, heads)` float32,
#    each rounded up to 256 bytes. (§3)
# 3. **The budget.** `kv_cache_bytes(total, util, weights, activations)`: what the KV cache gets at start-up,
#    `gpu_memory_utilization × total` minus what the profile run measured. (§8)

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb05


def bucket_for(batch, sizes):
    raise NotImplementedError


def decode_scratch_bytes(rows, heads, head_dim, splits):
    raise NotImplementedError


def kv_cache_bytes(total, util, weights, activations):
    raise NotImplementedError


check("bucket_for", bucket_for, nb05.bucket_for, nb05.CASES["bucket_for"])
check("decode_scratch_bytes", decode_scratch_bytes, nb05.decode_scratch_bytes, nb05.CASES["decode_scratch_bytes"])
check("kv_cache_bytes", kv_cache_bytes, nb05.kv_cache_bytes, nb05.CASES["kv_cache_bytes"])

# %% [markdown]
# <details><summary><b>Solutions</b> (click to open)</summary>
#
# ```python
# def bucket_for(batch, sizes):
#     fits = [s for s in sizes if s >= batch]
#     return min(fits) if fits else None
#
#
# def aligned(nbytes):
#     return -(-nbytes // 256) * 256
#
#
# def decode_scratch_bytes(rows, heads, head_dim, splits):
#     partial = rows * heads * splits * (head_dim + 1) * 4  # float32, the log-sum-exp in the last column
#     output = rows * heads * head_dim * 2  # bfloat16
#     lse = rows * heads * 4  # float32
#     return aligned(partial) + aligned(output) + aligned(lse)
#
#
# def kv_cache_bytes(total, util, weights, activations):
#     return int(util * total) - (weights + activations)
# ```
#
# </details>
