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
# # 10 · Every workspace consumer: the lock is a maximum, and the crash can come from any
#
# TurboQuant is one of many users of vLLM's `WorkspaceManager`; this notebook is their home. Five of them are
# the classic examples of how the workspace is used — FlashAttention with decode context parallelism (DCP),
# fused MoE, the sparse attention indexer, FlashMLA sparse, Elastic EP — and the census of vLLM 0.33's call
# sites (`data/vllm_0_33_workspace_consumers.json`, read from vLLM's source) finds many more. This notebook
# gives them vLLM 0.33's real sizes for four models.
# You will learn:
#
# 1. why a slot is as large as the **largest** request made before the lock, not the sum (live, on the
#    manager's buffer pointer);
# 2. what every active consumer asks for on a dense Llama, a MoE (Qwen3-30B-A3B), DeepSeek-V3.2 (MLA + sparse
#    indexer) and the bug report's hybrid, and which one sets the lock;
# 3. the five classic cases with vLLM's real shapes, and which start-up phase sizes each; then the whole
#    census, the rows no model shows (test fixtures, benchmark scripts) and how Elastic EP saves and restores
#    the block tables around its re-warm-up;
# 4. what TurboQuant's fix (vLLM PR #44053) does on a MoE model: the MoE's profile-run scratch hides the bug,
#    and where it stops hiding it; and why the bug report's own "current size is 0.26 MB" says its MoE asked
#    nothing before the lock;
# 5. the four latent crashes reading vLLM 0.33's code suggests, each with vLLM's own evidence and verdict.
#
# Which consumers vLLM 0.34 adds, moves or drops, and what else changed there for the workspace, is
# [notebook 12](12_vllm_0_34_what_changed.ipynb).
#
# **Hardware.** CPU (default); `DEVICE = "cuda"` or `"meta"` moves the live workspace cells. Every size is
# computed by the consumer registry (`tqlab.core.consumers`, each module citing vLLM's file and function);
# section 5 re-runs vLLM's own classes when the parity environment (`.venv-parity`, `bash parity/run.sh`)
# exists and shows the recorded run under a banner otherwise.
#
# **Run time.** Under a minute on a small CPU box (about 20 s on a 2-core box, 10–20 s of it vLLM's own classes
# when installed).
# The last cell prints the measured time.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

import torch


from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # where the workspace cells of section 1 run: "cpu", "cuda" or "meta"
check_device(DEVICE, ("cpu", "cuda", "meta"), "10")  # one clear line for any other DEVICE
USE_RECORDED = True  # without vLLM, show the recorded latent-crash run (data/vllm_0_33_latent_crashes.json) under a banner
USE_VLLM = True  # with .venv-parity present, re-run the latent-crash checks with vLLM 0.33's own classes

# %%
import math
import re

import matplotlib.pyplot as plt

from tqlab.core.config import EngineConfig
from tqlab.core.consumers.base import StartUp
from tqlab.core.consumers.fused_moe import FusedMoE
from tqlab.core.consumers.registry import UNMODELLED
from tqlab.core.consumers.turboquant import TurboQuantContinuation
from tqlab.core.provenance import load_recorded
from tqlab.core.reservation import CONTINUATION_DECODE_THRESHOLD
from tqlab.core.workspace import WorkspaceManager, compute_layout, format_mb
from tqlab.lab import consumer_cases, recorded
from tqlab.lab import plots_consumers as pc
from tqlab.lab.display import markdown_table, show_md
from tqlab.predict import analysis
from tqlab.vllm.validation import startup_refusal

device = recorded.pick_device(DEVICE)
HAS_POINTERS = device != "meta"  # meta tensors have no memory, so no addresses to compare
MODELS = {  # the four deployments (data/presets/*.json, each with its config.json source)
    "dense Llama": "llama-3.1-8b",
    "MoE": "qwen3-30b-a3b",
    "MLA + sparse indexer": "deepseek-v3.2",
    "the bug report's hybrid": "nemotron-3-super-120b-a12b",
}
cfgs = {preset: EngineConfig.from_preset(preset) for preset in MODELS.values()}
tables = {preset: analysis.consumer_table(c) for preset, c in cfgs.items()}
print(f"workspace cells on {device!r}; presets: {', '.join(cfgs)}")

# %% [markdown]
# ## 1 · Why a maximum, not a sum
#
# **Question.** Qwen3-30B-A3B's fused MoE asks the workspace for its scratch during the profile run; TurboQuant's
# metadata builder reserves its continuation buffers in `__init__`. Two consumers, two separate
# `get_simultaneous` calls. Does the slot hold both, one after the other, or only the larger?
#
# vLLM's rule (`vllm/v1/worker/workspace.py`, `WorkspaceManager.get_simultaneous`): every call carves its views
# from **offset 0** of the same buffer and grows the buffer only when the call needs more than it holds. So a
# later call overwrites an earlier call's views — consumers never hold views across each other's calls (two DCP
# calls show it; vLLM 0.33's `flash_attn.py` `_forward_with_dcp` keeps only the first and writes the query
# attention into the layer's `output`). The two real calls, from the registry's modules, on
# tqlab's `WorkspaceManager`.
#
# **Predict, then run.** After the second (smaller) call: is the slot the sum of the two calls or the larger one?
# Does the second call's first view start at the same address as the first call's?

# %%
qwen = cfgs["qwen3-30b-a3b"]
startup = StartUp(analysis.cudagraph_mode(qwen), analysis.locks_workspace(qwen))
moe_call = FusedMoE().sizes(qwen, startup).reserved[0]  # _allocate_buffers at M = max_num_batched_tokens
cont_call = TurboQuantContinuation().sizes(qwen, startup).reserved[0]  # _reserve_workspace: cached_len = max_model_len - 1
m = WorkspaceManager(device)
moe_views = m.get_simultaneous(*moe_call)
after_moe = (m.size_bytes(), m.buffer().data_ptr() if HAS_POINTERS else None)
cont_views = m.get_simultaneous(*cont_call)
after_cont = (m.size_bytes(), m.buffer().data_ptr() if HAS_POINTERS else None)
calls = {"fused MoE (profile run)": moe_call, "TurboQuant continuation (builder __init__)": cont_call}
show_md(markdown_table(
    ("call", "views (shape dtype)", "bytes", "MiB"),
    [(name, ", ".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in call),
      f"{compute_layout(call).total_bytes:,}", format_mb(compute_layout(call).total_bytes))
     for name, call in calls.items()],
))

# %%
sizes = {name: compute_layout(call).total_bytes for name, call in calls.items()}
assert m.size_bytes() == max(sizes.values()) < sum(sizes.values())
assert after_moe[0] == after_cont[0]  # the smaller call did not grow the buffer
if HAS_POINTERS:
    assert moe_views[0].data_ptr() == cont_views[0].data_ptr() == after_moe[1] == after_cont[1]
print(f"slot = max = {format_mb(m.size_bytes())} MiB, not the sum {format_mb(sum(sizes.values()))} MiB"
      + ("; both calls start at the same address" if HAS_POINTERS else " (meta: no addresses to compare)"))
del moe_views, cont_views, m

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# The larger one: the slot is the maximum of the two calls, and both
# calls' first views start at offset 0 of the one buffer. So a deployment's lock size is the **maximum** over
# its active consumers' requests before the lock, and a refused call can come from any consumer whose request
# while serving is larger.
#
# </details>

# %% [markdown]
# ## 2 · Four models, every consumer
#
# **Question.** For each of the four deployments, which consumers are active, what does each ask before the
# lock (`reserved_bytes`, and the `phase` that asks it) and at most while serving (`max_runtime_bytes`)?
#
# **Predict, then run.** Before the cell runs: DeepSeek-V3.2 (TP 8, `fp8_ds_mla` cache) runs FlashMLA sparse
# and the sparse indexer, and its MoE is FP8. Which consumer sets its lock — the indexer's profile-run buffers,
# or FlashMLA sparse's `__init__` reservation? And which sets the MoE model's: the fused MoE or TurboQuant?

# %%
bars = pc.consumer_bars(tables)
for preset, table in tables.items():
    rows = [(f"`{r.consumer}`", r.phase, r.slot, f"{r.reserved_bytes:,}", format_mb(r.reserved_bytes),
             format_mb(r.max_runtime_bytes), "yes" if r.covered else "**no**") for r in table.rows]
    unmod = "".join(f"\n\n*Unmodelled:* `{u['consumer']}` — {u['reason']}" for u in table.unmodelled)
    show_md(f"**{preset}** — slot at the lock: **{format_mb(table.locked_bytes)} MiB** "
            f"(by {', '.join(pc.lock_setters(bars, preset))})\n\n"
            + markdown_table(("vLLM call site", "phase", "slot", "reserved (bytes)", "reserved (MiB)",
                              "serving, at most (MiB)", "covered"), rows) + unmod)
for preset, table in tables.items():
    assert table.locked_bytes == max(r.reserved_bytes for r in table.rows)  # the maximum, not the sum
    assert all(r.covered for r in table.rows)  # vLLM 0.33 as shipped (PR #44053 included) covers these four
assert pc.lock_setters(bars, "deepseek-v3.2") == ["flashmla_sparse"]
assert pc.lock_setters(bars, "qwen3-30b-a3b") == ["turboquant_decode"]
assert [u["consumer"].split(" ")[0] for u in tables["deepseek-v3.2"].unmodelled] == [
    "modular_kernel.py:_allocate_buffers", "deep_gemm_warmup.py:_warmup"]  # FP8 MoE: said, never a silent zero

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# DeepSeek-V3.2: FlashMLA sparse's `__init__` reservation (its
# `workspace_specs`: the Q concatenation buffer at `max_num_batched_tokens` rows and, for the `fp8_ds_mla` cache,
# a bf16 prefill workspace of `factor × max_model_len` rows plus three bf16 prefill query/output buffers at
# `max_num_batched_tokens` rows), larger than the indexer's profile-run buffers; its FP8 MoE's
# experts (DeepGEMM / CUTLASS) and DeepGEMM warm-up are **unmodelled** and listed, so tqlab's lock for it is a
# lower bound. Qwen3-30B-A3B: TurboQuant's decode reservation at `max_num_seqs` rows, just above the fused MoE's
# profile-run scratch. The picture:
#
# </details>

# %%
fig = pc.plot_consumer_bytes(tables, title="vLLM 0.33 workspace consumers per model: each slot holds the maximum")
plt.show()

# %% [markdown]
# ## 3 · The five classic cases, with vLLM's real sizes
#
# Each of the five classic consumers is a registry module here, so each gets a real size. DCP needs
# FlashAttention (an unquantized cache) and a DCP group: the Llama with `--kv-cache-dtype auto` and DCP 2. vLLM
# 0.33 starts DCP for a GQA model only when the tensor-parallel size exceeds the model's KV heads and DCP is at most
# their quotient (`ModelConfig.verify_with_parallel_config`, `vllm/config/model.py`): Llama-3.1-8B has 8 KV heads,
# so `-tp 2 -dcp 2` is refused and the cell takes the smallest TP that starts, twice the KV heads.
# Elastic EP makes no request of its own: it unlocks, re-runs the profile run, warm-up and capture, and locks
# again (section 5, candidate 3).
#
# **Predict, then run.** Which start-up phase first sizes each case: a constructor (`init`), the profile run
# `_dummy_run(max_num_batched_tokens)`, or CUDA graph capture — and what happens to DCP with PIECEWISE-only graphs?

# %%
llama = cfgs["llama-3.1-8b"]
DCP = 2
refused_dcp = startup_refusal(llama.replace(kv_cache_dtype="auto", tensor_parallel_size=2, decode_context_parallel_size=DCP))
assert refused_dcp is not None and "greater than the model's total number of KV heads" in refused_dcp.reason
print(f"TP 2, DCP {DCP}: vLLM 0.33 refuses it: {refused_dcp.reason.split('. ')[0]}")
dcp = llama.replace(kv_cache_dtype="auto", tensor_parallel_size=DCP * llama.num_key_value_heads,
                    decode_context_parallel_size=DCP)
assert startup_refusal(dcp) is None  # TP 16, DCP 2: started
dcp_piecewise = dcp.replace(cudagraph_mode="PIECEWISE")
ds = "deepseek-v3.2"
cases = [  # (the case, deployment, its table, registry name)
    ("FlashAttention DCP", f"llama-3.1-8b, auto cache, TP {dcp.tensor_parallel_size}, DCP {DCP}",
     analysis.consumer_table(dcp), "flash_attn_dcp"),
    ("… with PIECEWISE-only graphs", "the same, cudagraph_mode PIECEWISE", analysis.consumer_table(dcp_piecewise),
     "flash_attn_dcp"),
    ("fused MoE", "qwen3-30b-a3b", tables["qwen3-30b-a3b"], "fused_moe"),
    ("sparse attention indexer", ds, tables[ds], "sparse_indexer"),
    ("FlashMLA sparse", ds, tables[ds], "flashmla_sparse"),
]
case_rows = {}
for section, where, table, name in cases:
    r = next(r for r in table.rows if r.name == name)
    case_rows[section] = r
    show_md(f"- **{section}** ({where}): `{r.consumer}` — phase `{r.phase}`, reserved {format_mb(r.reserved_bytes)} MiB, "
            f"serving at most {format_mb(r.max_runtime_bytes)} MiB, covered: **{r.covered}**")
assert case_rows["FlashAttention DCP"].phase == "capture"  # only FULL capture builds DCP's decode metadata
assert case_rows["… with PIECEWISE-only graphs"].phase == "none"
assert not case_rows["… with PIECEWISE-only graphs"].covered  # latent crash 2 (section 5)
assert case_rows["fused MoE"].phase == case_rows["sparse attention indexer"].phase == "profile_run"
assert case_rows["FlashMLA sparse"].phase == "init"  # reserved in FlashMLASparseImpl.__init__

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# FlashMLA sparse reserves in its constructor; fused MoE and the indexer
# are sized by the profile run at `max_num_batched_tokens` tokens; DCP only by FULL capture — with PIECEWISE-only
# graphs nothing reaches it before the lock, and its first decode asks an empty slot.
#
# </details>

# %% [markdown]
# ### The whole census, and the rows no model shows
#
# The five cases are a sample. The census reads every `get_simultaneous` / `get_persistent` call and every
# `unlock_workspace` in vLLM 0.33's source with `ast` (`parity/gen_consumer_census.py`, nothing imported), live
# when vLLM's source is installed (`.venv-parity`), else its recording with provenance. Two more rows belong
# in the table of workspace users: **test fixtures** (`tests/conftest.py` creates and resets the manager
# around a test) and **benchmark scripts** (`benchmarks/benchmark_*.py` create one before they time a
# kernel). Both live in vLLM's git repository, outside the installed `vllm` package, and run no serving
# engine: they can make a test or a benchmark allocate, never set the lock a server runs with.
#
# **Predict, then run.** How many files of vLLM 0.33 call the workspace — about five, a dozen, or more? How
# many reserve ahead, as TurboQuant now does? Does any call site of the installed package sit in a test or a
# benchmark?

# %%
from tqlab.vllm.source_scan import find_vllm_source, load_census, workspace_consumers

census, census_from = load_census(find_vllm_source())  # live from vLLM's source when installed, else recorded
users = workspace_consumers(census)
show_md(markdown_table(
    ["the classic case", "consumer", "file in vLLM 0.33", "still there", "get_simultaneous calls"],
    [[r["scenario"], f"`{r['consumer']}`", f"`{r['file']}`", "yes" if r["present"] else "no", r["get_simultaneous_calls"]]
     for r in users["seed_table"]]
    + [["test fixture", "`conftest.py`", "`tests/conftest.py` (repository only)", "not in the package", "—"],
       ["benchmark scripts", "`benchmark_*.py`", "`benchmarks/` (repository only)", "not in the package", "—"]]))
by_top = sorted({site["path"].split("/")[0] for site in census["call_sites"]})
show_md(f"{census_from}: **{len(users['files'])} files** call the workspace "
        f"({sum(users['get_simultaneous_calls'].values())} `get_simultaneous` calls), under {by_top}; "
        f"**{len(users['reservers'])}** reserve ahead:\n\n" + "\n".join(f"* `{r}`" for r in users["reservers"]))
assert all(r["present"] for r in users["seed_table"]) and len(users["files"]) > len(users["seed_table"])
assert "v1/attention/backends/turboquant_attn.py" in users["reservers"]
assert not any(p.startswith(("tests/", "benchmarks/")) or "/tests/" in p or "benchmark" in p
               for p in (site["path"] for site in census["call_sites"]))  # no test or benchmark in the package

# %% [markdown]
# ### Elastic EP: unlock, re-warm, lock — with the block tables set aside
#
# Elastic expert parallelism changes the number of experts while the server runs, so the MoE layers may need a
# larger scratch. vLLM 0.33's `EPScaleExecutor.warm_and_capture` (`vllm/distributed/elastic_ep/elastic_execute.py`)
# drops the CUDA graphs, calls `unlock_workspace()`, re-runs the profile run and the warm-up and capture, and
# calls `lock_workspace()` again. The dummy runs would write the running requests' block tables, so it wraps
# them in `GPUModelRunner.preserve_serving_state()` (`vllm/v1/worker/gpu_model_runner.py`): clone every block
# table (GPU and CPU copy), clear them, run, then copy the clones back. The cell checks that in vLLM's source
# (when installed; the census records the unlock site either way) and re-enacts the sequence on tqlab's
# manager, with a block table of the running requests.
#
# **Predict, then run.** After the re-warm-up: is the workspace larger than before, is it locked again, and are
# the running requests' block tables what they were — though the dummy run wrote into them?

# %%
from tqlab.core.workspace import WorkspaceLockedError

(unlock_site,) = census["unlock_sites"]
assert (unlock_site["path"], unlock_site["function"]) == ("distributed/elastic_ep/elastic_execute.py", "warm_and_capture")
src = find_vllm_source()
if src is not None:  # vLLM's own code, read live
    ep = (src / unlock_site["path"]).read_text()
    runner = (src / "v1/worker/gpu_model_runner.py").read_text()
    body = runner[runner.index("def preserve_serving_state"):][:900]
    w = ep[ep.index("def warm_and_capture"):]  # the function the census names
    assert w.index("unlock_workspace()") < w.index("preserve_serving_state") < w.index("\n        lock_workspace()")
    assert "bt.block_table.gpu.clone(), bt.block_table.cpu.clone()" in body and "multi_block_table.clear()" in body
    assert "bt.block_table.gpu.copy_(saved_gpu)" in body and "bt.block_table.cpu.copy_(saved_cpu)" in body
    print(f"vLLM's source ({src}): warm_and_capture unlocks at line {unlock_site['line']}, re-warms inside "
          "preserve_serving_state (clone, clear, restore every block table), then locks")
moe = FusedMoE().sizes(qwen, startup).reserved[0]  # the MoE's scratch at the old expert count
grown = [((2 * s[0], *s[1:]), d) for s, d in moe]  # more experts per rank: a larger scratch (for the re-enactment)
ws = WorkspaceManager("meta")
ws.get_simultaneous(*moe)
ws.lock()
block_table = torch.arange(4 * 8, dtype=torch.int32).reshape(4, 8)  # 4 running requests, 8 blocks each
try:
    ws.get_simultaneous(*grown)
    refused_while_locked = False
except WorkspaceLockedError:
    refused_while_locked = True
before = ws.size_bytes()
saved = block_table.clone()  # preserve_serving_state: clone ...
block_table.zero_()  # ... clear (multi_block_table.clear()) ...
ws.unlock()  # unlock_workspace()
ws.get_simultaneous(*grown)  # the re-run profile run / warm-up asks for the larger scratch
block_table[:, 0] = -1  # the dummy run writes its own block ids
ws.lock()  # lock_workspace()
block_table.copy_(saved)  # ... and copy back
assert refused_while_locked and ws.size_bytes() > before and ws.is_locked()
assert torch.equal(block_table, torch.arange(32, dtype=torch.int32).reshape(4, 8))
print(f"workspace {format_mb(before)} -> {format_mb(ws.size_bytes())} MiB, locked again: {ws.is_locked()}; "
      "block tables restored bit for bit")

# %% [markdown]
# ## 4 · TurboQuant's fix on a MoE model
#
# **Question.** Notebook 02's crash needs a continuation chunk that asks more than the lock holds. On a MoE
# model the fused MoE's profile run asks for its scratch at `M = max_num_batched_tokens` rows *before* the
# lock — does that cover TurboQuant's continuation buffers even without the fix?
#
# Qwen3-30B-A3B with the bug report's `--max-num-seqs` (so the decode scratch is small, as in the report),
# `max_num_batched_tokens` halved step by step. Without the fix the slot is the maximum of TurboQuant's decode
# capture scratch and the MoE's scratch (`tqlab.lab.consumer_cases.lock_without_fix`); "attention alone" is the
# same model's TurboQuant without its MoE — what a dense model with this attention would lock.
#
# **Predict, then run.** At the preset's `max_num_batched_tokens` does any prompt crash without the fix? From
# which `max_num_batched_tokens` down does the MoE stop hiding the bug? What does the fix add on top of the
# MoE's scratch at the preset's value?

# %%
report = cfgs["nemotron-3-super-120b-a12b"]
moe_small = qwen.replace(max_num_seqs=report.max_num_seqs)
worst_cont = next(r.max_runtime_bytes for r in analysis.consumer_table(moe_small).rows
                  if r.name == "turboquant_continuation")  # the largest continuation chunk while serving
sweep = []
m_val = qwen.max_num_batched_tokens
while m_val > CONTINUATION_DECODE_THRESHOLD:
    c = moe_small.replace(max_num_batched_tokens=m_val)
    parts = consumer_cases.lock_without_fix(c)
    lock = max(parts.values())
    sweep.append(dict(m=m_val, tq=parts["turboquant"], moe=parts["fused_moe"], lock=lock,
                      alone=analysis.first_failing_prompt(c, parts["turboquant"]),
                      with_moe=analysis.first_failing_prompt(c, lock),
                      fixed=analysis.consumer_table(c).locked_bytes))
    m_val //= 2
moe_per_token = sweep[0]["moe"] // sweep[0]["m"]  # the MoE scratch grows linearly with M
m_hides = math.ceil(worst_cont / moe_per_token)  # the smallest M whose MoE scratch holds the worst continuation
show_md(markdown_table(
    ("max_num_batched_tokens", "TurboQuant at the lock, no fix (MiB)", "fused MoE, profile run (MiB)",
     "slot, no fix (MiB)", "first failing prompt: attention alone", "… with the MoE", "slot with PR #44053 (MiB)"),
    [(f"{r['m']:,}", format_mb(r["tq"]), format_mb(r["moe"]), format_mb(r["lock"]), f"{r['alone']:,}",
      "none" if r["with_moe"] is None else f"{r['with_moe']:,}", format_mb(r["fixed"])) for r in sweep]))
show_md(f"The largest continuation chunk while serving asks **{format_mb(worst_cont)} MiB**; the MoE asks "
        f"{moe_per_token:,} bytes per token of `M`, so it holds that from `max_num_batched_tokens` ≥ **{m_hides:,}**.")
fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
ms = [r["m"] for r in sweep]
ax.plot(ms, [r["moe"] / 2**20 for r in sweep], "o-", label="fused MoE scratch (profile run)")
ax.axhline(worst_cont / 2**20, color="#e45756", ls="--", label="largest continuation chunk (serving)")
ax.axhline(sweep[0]["tq"] / 2**20, color="grey", ls=":", label="TurboQuant's lock without the fix")
ax.axvline(m_hides, color="black", lw=0.8)
ax.set(xscale="log", yscale="log", xlabel="max_num_batched_tokens", ylabel="MiB",
       title=f"{qwen.preset}, max_num_seqs {moe_small.max_num_seqs}: the MoE hides the bug from M = {m_hides:,}")
ax.legend(fontsize=8)
plt.show()

# %%
top = sweep[0]
assert top["moe"] > top["tq"] and top["alone"] is not None and top["with_moe"] is None  # hidden
for r in sweep:
    assert (r["with_moe"] is None) == (r["moe"] >= worst_cont) == (r["m"] >= m_hides)
    assert r["alone"] is not None  # the attention alone always crashes without the fix
    c = moe_small.replace(max_num_batched_tokens=r["m"])
    assert r["fixed"] == max(r["moe"], analysis.locked_bytes(c, fix=True))
    pred = analysis.predict(c)  # the one predictor (tqlab plan / inspect-vllm) takes the same maximum
    assert (pred.locked_bytes, pred.lock_set_by) == (r["lock"], "modular_kernel.py:_allocate_buffers")
    assert pred.first_failing_prompt_tokens == r["with_moe"] and pred.verdict == ("ok" if r["with_moe"] is None else "crash")
assert top["fixed"] == top["moe"]  # at the preset's M the fix costs no byte: the MoE's scratch already holds it
first_exposed = next(r for r in sweep if r["with_moe"] is not None)
print(f"hidden down to M = {m_hides:,}; at M = {first_exposed['m']:,} prompts from {first_exposed['with_moe']:,} tokens "
      f"crash without the fix; with it the slot is {format_mb(first_exposed['fixed'])} MiB")

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# At the preset's `max_num_batched_tokens` the MoE's profile-run
# scratch is larger than every continuation chunk, so the prompt that crashes the attention alone is served:
# the MoE **hides** the bug, and PR #44053's reservation adds nothing to the slot. Below the printed `M` the
# MoE's scratch is smaller than the longest continuation, and long prompts crash again without the fix. A
# predictor that looks only at TurboQuant would call the first deployment a crash — a **false crash**; tqlab's
# `predict()` (behind `tqlab plan` and `inspect-vllm`) takes the maximum over consumers, names the MoE's call
# site as the one that sets the lock, and agrees with the table row by row (checked above).
#
# </details>

# %% [markdown]
# ### The engine agrees: the MoE's request sets the lock
#
# `tqlab`'s engine runs a stand-in per consumer that asks the workspace for vLLM's shapes in the phase where vLLM
# asks; `tqlab repro` runs the same engine (the command is printed below). On `meta` (shapes only), without the
# fix, the same deployment at the preset's `max_num_batched_tokens`, with its MoE and without it.
#
# **Predict, then run.** Which consumer's request sets slot 0 at the lock, and in which phase? Is the prompt
# that crashes the attention alone served when the MoE is there?

# %%
from tqlab.core.workspace import WorkspaceLockedError
from tqlab.engine import LLMEngine

engine_rows, engines = [], {}
for label, c in (("with its MoE", moe_small), ("attention alone (moe=None)", moe_small.replace(moe=None))):
    e = LLMEngine(c, fix=False, device="meta")
    try:
        e.generate(top["alone"], max_tokens=1)
        outcome = "served"
    except WorkspaceLockedError as exc:
        outcome = f"`{exc}`".split(" Workspace growth")[0] + "`"
    engines[label] = (e, outcome)
    engine_rows.append((label, format_mb(e.locked_bytes), e.slot_sizer.consumer, e.slot_sizer.phase,
                        f"{top['alone']:,} tokens: {outcome}"))
show_md(markdown_table(("deployment (no fix)", "slot at the lock (MiB)", "set by", "in phase", "the prompt"),
                       engine_rows))
print(f"the same run from a shell: tqlab repro --preset {qwen.preset} --device meta --max-num-seqs {moe_small.max_num_seqs} "
      f"--prompt-tokens {top['alone']}")
moe_engine, moe_outcome = engines["with its MoE"]
alone_engine, alone_outcome = engines["attention alone (moe=None)"]
assert (moe_engine.slot_sizer.consumer, moe_engine.slot_sizer.phase) == ("fused_moe", "profile_run")
assert moe_engine.locked_bytes == top["lock"] == top["moe"] and moe_outcome == "served"
assert alone_engine.slot_sizer.consumer == "turboquant_decode" and alone_engine.locked_bytes == top["tq"]
assert "_continuation_prefill" in alone_outcome and alone_engine.dead is not None

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# The fused MoE's `_allocate_buffers`, in the profile run, sets slot 0;
# with it the prompt is served, without it (the attention alone) TurboQuant's continuation prefill is refused.
#
# </details>
#
# ### The bug report's own evidence: its MoE asked nothing before the lock
#
# The report serves `Nemotron-3-Super-120B-AWQ-4bit` with `--enable-expert-parallel` on vLLM 0.20, and its lock
# was **0.26 MB**. If its MoE had asked the workspace during the profile run, the slot would hold at least the
# MoE's output `(M, hidden_size)` in bf16 at `M = max_num_batched_tokens` rows.
#
# **Predict, then run.** Is the report's 0.26 MB exactly TurboQuant's decode scratch? Above which hidden size
# would a MoE output at `M` rows alone have locked more?

# %%
report_src = load_recorded("report_sources")
said = float(re.search(r"current size is ([\d.]+) MB", report_src["bug_report"]["message"]).group(1))
tq_lock = analysis.locked_bytes(report, fix=False)
min_hidden = tq_lock // (report.max_num_batched_tokens * report.dtype.itemsize) + 1
assert format_mb(tq_lock) == f"{said:.2f}"  # the report's lock is TurboQuant's decode scratch
assert report.moe is None and [r.name for r in tables[report.preset].rows] == ["turboquant_decode", "turboquant_continuation"]
assert min_hidden * report.max_num_batched_tokens * report.dtype.itemsize > tq_lock
show_md(f"TurboQuant's decode scratch: {tq_lock:,} bytes = {format_mb(tq_lock)} MiB, the report's `{said:.2f} MB`. "
        f"A MoE output of `({report.max_num_batched_tokens:,}, hidden)` bf16 would exceed it for any hidden size "
        f"of {min_hidden} or more. So in the report's vLLM 0.20 run nothing but TurboQuant's decode capture asked the "
        f"workspace before the lock, and the preset models no MoE.")

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# The report's 0.26 MB equals TurboQuant's decode scratch to the byte,
# and any MoE request at `M` rows would have been larger: its MoE asked nothing before the lock. That is vLLM
# 0.20's behaviour for that deployment. Reading vLLM 0.33 instead: AWQ MoE layers
# (`quantization/auto_awq.py` `AutoAWQMoEMethod`) build their kernel with `make_wna16_moe_kernel`, whose Marlin
# experts run through the modular kernel's `_allocate_buffers` (`fused_moe/experts/marlin_moe.py`
# `MarlinExperts.workspace_shapes`) — on 0.33 the same deployment's MoE would ask during the profile run, as in
# the table above. tqlab does not size quantized experts: it lists them as unmodelled instead.
#
# </details>

# %% [markdown]
# ## 5 · Four latent crashes in vLLM 0.33, checked with vLLM's own classes
#
# Reading vLLM 0.33's code suggests four more ways to the assertion.
# `parity/latent_crashes.py` checks each with vLLM's own classes on a CPU. With `.venv-parity` present the cell
# re-runs the checks now (a subprocess in that environment; 10–20 s); otherwise it shows the recorded run
# `data/vllm_0_33_latent_crashes.json` under a banner, with the parity suite's outcome from
# `data/parity_results.json`.
#
# **Predict, then run.** For each candidate, does vLLM's own code confirm or refute it? And does tqlab's
# registry see each one — an uncovered consumer, a start-up that never locks, an unmodelled consumer?

# %%
from tqlab import vllm as vt
from tqlab.vllm.source_scan import find_vllm_source

rec = load_recorded("vllm_0_33_latent_crashes")
py = consumer_cases.parity_python(find_vllm_source()) if USE_VLLM else None
checks, live, why = None, False, "no .venv-parity here" if USE_VLLM else "USE_VLLM is False"
if py is not None:
    t = time.perf_counter()
    try:
        checks = consumer_cases.run_latent_crash_checks(py)
    except RuntimeError as exc:  # a broken or half-installed .venv-parity: say so, show the recording
        why = f"the live run failed: {exc}"
    else:
        live = True
        show_md(f"*Live: vLLM's own classes via `{py}`, {time.perf_counter() - t:.1f} s.*")
        assert [c["verdict"] for c in checks] == [c["verdict"] for c in rec["checks"]]  # the recording still holds
if checks is None:
    if not USE_RECORDED:
        raise SystemExit(f"{why} and USE_RECORDED is False: nothing to show for section 5")
    recorded.show_banner(rec.provenance, what=f"Recorded latent-crash checks: vLLM {rec.provenance['vllm']}", why=why)
    checks = rec["checks"]
    parity_prov, parity = vt.load_parity_results()
    outcomes = {k: v for k, v in parity["tests"].items() if "test_latent_crashes" in k}
    show_md(f"*The parity suite (`{parity_prov['command']}`, {parity_prov['date']}): "
            + ", ".join(f"{k.split('::')[1]} **{v}**" for k, v in outcomes.items()) + "*")
ev = {c["candidate"]: c["evidence"] for c in checks}
show_md(markdown_table(("#", "candidate", "verdict", "vLLM's evidence", "limits"), [
    (c["candidate"], c["name"], f"**{c['verdict']}**",
     next((v for k, v in c["evidence"].items() if isinstance(v, str) and "Workspace is locked" in v),
          f"calls of the method: {c['evidence'].get('calls_of_the_method')}"), c["limits"]) for c in checks]))

no_chunk = report.replace(enable_chunked_prefill=False, max_num_batched_tokens=report.max_model_len,
                          mamba_block_aligned_split=False)
tq_rows = {r.name: r for r in analysis.consumer_table(no_chunk).rows}
eager_moe = qwen.replace(enforce_eager=True)
ours = {  # tqlab's registry on each candidate
    1: not tq_rows["turboquant_continuation"].covered and tq_rows["turboquant_continuation"].phase == "none",
    2: not case_rows["… with PIECEWISE-only graphs"].covered,
    3: analysis.consumer_table(eager_moe).locked_bytes is None,  # eager start-up: never locked
    4: any(u.consumer.startswith("dots3_note") and "never called" in u.reason for u in UNMODELLED),
}
assert [c["verdict"] for c in checks] == ["confirmed"] * 4
assert "_continuation_prefill" in ev[1]["vllm_error"] and "_forward_with_dcp" in ev[2]["first_dcp_decode_after_lock"]
assert ev[3]["locked_after_eager_start_up"] is False and ev[3]["locked_after_scale_event"] is True
assert ev[4]["calls_of_the_method"] == []
assert all(ours.values()), ours
print("tqlab's registry sees each candidate:", ours)

# %% [markdown]
# <details><summary><b>Answer</b> (checked by the cell above)</summary>
#
# All four are **confirmed** by vLLM 0.33's own code:
#
# </details>
#
# 1. **TurboQuant, `--no-enable-chunked-prefill` + prefix caching.** PR #44053 reserves the continuation buffers
#    only with chunked prefill on (and `max_num_batched_tokens` above `_CONTINUATION_DECODE_THRESHOLD`); a prefix-cache hit followed by more than 128 new tokens still runs
#    `_continuation_prefill` and is refused with the report's numbers. tqlab: the continuation consumer has phase
#    `none` and is not covered.
# 2. **FlashAttention + DCP, PIECEWISE-only graphs.** Nothing reaches `_forward_with_dcp` before the lock; the
#    first decode asks an empty slot (section 3). Model Runner V2's JIT warm-up, or another consumer sizing the
#    slot larger (a MoE, section 4), hides it.
# 3. **Elastic EP locks an eager deployment.** The scale step re-runs warm-up and calls `lock_workspace()`
#    unconditionally: a deployment never locked at start-up is locked after its first scale event, with its MoE
#    scratch data-dependent under DeepEP high-throughput. tqlab models the start-up (never locked), not the scale
#    event.
# 4. **Dots3-Note's reservation is never called.** Its builder's method has no caller; the parent builder calls
#    Triton MLA's module function of the same name. tqlab lists the consumer as unmodelled, with this reason.

# %% [markdown]
# ## Summary
#
# * A slot holds the **largest** request made before the lock: separate `get_simultaneous` calls alias the same
#   bytes. The lock size is a maximum over every active consumer, and any consumer can be refused after it.
# * On a MoE model the profile run's MoE scratch can hide TurboQuant's bug (and make the fix free); it stops hiding
#   it when `max_num_batched_tokens` is small. Looking at TurboQuant alone predicts false crashes.
# * The bug report's 0.26 MB lock says its MoE asked nothing before the lock on vLLM 0.20.
# * Four latent crashes of vLLM 0.33 are confirmed with its own classes; tqlab's registry flags each.

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU "
        f"(workspace cells on `{device}`; latent crashes {'live' if live else 'recorded'}).*")

# %% [markdown]
# ## Exercises
#
# Write each function below (replace `raise NotImplementedError`), then run the cell: it checks your answer
# against tqlab's own on a few cases and says, per exercise, "correct", what differs, or "not attempted yet".
# Everything runs on a CPU. The solutions are in the collapsed cell after it.
#
# 1. **A maximum, not a sum.** `slot_after(call_bytes)`: the size of one ubatch slot after one-view calls of
#    `call_bytes` bytes, one after the other (each view rounded up to 256 bytes). (§1)
# 2. **The lock over every consumer.** `lock_without_fix(preset)`: the workspace at the lock without the fix,
#    the largest request of any consumer before it (use `tqlab.predict.analysis.predict`). (§2)
# 3. **The MoE's cover.** `crashes_without_fix(preset, max_num_batched_tokens, max_num_seqs)`: whether any
#    prompt crashes without the fix, when the MoE's profile-run scratch may already hold TurboQuant's largest
#    call. (§4)

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb10


def slot_after(call_bytes):
    raise NotImplementedError


def lock_without_fix(preset):
    raise NotImplementedError


def crashes_without_fix(preset, max_num_batched_tokens, max_num_seqs):
    raise NotImplementedError


check("slot_after", slot_after, nb10.slot_after, nb10.CASES["slot_after"])
check("lock_without_fix", lock_without_fix, nb10.lock_without_fix, nb10.CASES["lock_without_fix"])
check("crashes_without_fix", crashes_without_fix, nb10.crashes_without_fix, nb10.CASES["crashes_without_fix"])

# %% [markdown]
# <details><summary><b>Solutions</b> (click to open)</summary>
#
# ```python
# from tqlab.core.config import EngineConfig
# from tqlab.predict.analysis import predict
#
#
# def slot_after(call_bytes):
#     return max(-(-n // 256) * 256 for n in call_bytes)
#
#
# def lock_without_fix(preset):
#     return predict(EngineConfig.from_preset(preset)).locked_bytes
#
#
# def crashes_without_fix(preset, max_num_batched_tokens, max_num_seqs):
#     cfg = EngineConfig.from_preset(preset, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
#     return predict(cfg).first_failing_prompt_tokens is not None
# ```
#
# </details>
