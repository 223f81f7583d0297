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
# # 12 · vLLM 0.34: what changed for the workspace
#
# Notebooks 01-11 show vLLM 0.33. vLLM 0.34 keeps the workspace manager, its lock and TurboQuant's fix
# (PR #44053's `_reserve_workspace`) as they were, but three things around them changed. This short notebook
# puts the two releases side by side, from vLLM's own code where it is installed and from the data tqlab
# generated from each release otherwise:
#
# | you will learn | section |
# |---|---|
# | the V1 model runner is gone: which runner starts the server, and what runs before the lock | 1 |
# | the manager grew: `get_retained` and a named view alignment (notebook 01 §5c teaches the retained tail) | 2 |
# | which call sites of the workspace are new, moved or gone (the census of notebook 10, per version) | 3 |
# | which model architectures reach a different set of consumers | 4 |
#
# **Hardware.** CPU only; nothing is timed. Where the parity environments are installed (`.venv-parity` for
# 0.33 and `.venv-parity-0.34` for 0.34: `make parity`, see `parity/README.md`), sections 1 and 2 read vLLM's
# files live (as text and with `ast`; nothing of vLLM is imported); otherwise they show what tqlab recorded for
# each release (`tqlab.core.vllm_versions`). Sections 3 and 4 read the generated data in `data/`, with its
# provenance.
#
# **Run time.** A few seconds on a small CPU box; the last cell prints it.
#
# Each **predict, then run** question stands before the cell that answers it; the answers are folded under
# **Answer** after the output. The words of the [glossary](00_glossary.md) are used as there.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

from tqlab.lab.environment import environment, show_environment

ENV = show_environment(vllm="0.33")  # the baseline this notebook compares against; 0.34 is named where it is read
ENV_NEW = environment("0.34")
print(f"vLLM 0.34's parity environment: {ENV_NEW['vllm_parity'] or 'not found (recorded facts are shown)'}")

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # nothing here runs kernels; the retained-tail check of section 2 uses the CPU
check_device(DEVICE, ("cpu", "meta"), "12")  # one clear line for any other DEVICE
USE_RECORDED = True  # without a parity environment, show tqlab's recorded facts of that release (said so)
USE_VLLM = True  # read vLLM's files live where its parity environment is installed

# %%
import matplotlib.pyplot as plt
import torch

from tqlab.core import vllm_versions
from tqlab.core.provenance import load_recorded
from tqlab.core.workspace import WorkspaceManager
from tqlab.lab.display import markdown_table, show_md
from tqlab.lab.version_diff import arch_diff, plot_sites_by_phase, site_diff, source_facts

OLD, NEW = vllm_versions.get("0.33"), vllm_versions.get("0.34")
ROOTS = {OLD.name: ENV["vllm_parity"] if USE_VLLM else None, NEW.name: ENV_NEW["vllm_parity"] if USE_VLLM else None}


def facts(v):
    """``(facts, where)`` of release ``v``: live from its parity environment, else tqlab's record of it."""
    root = ROOTS[v.name]
    if root is not None:
        return source_facts(root), f"live, from {root}"
    if not USE_RECORDED:
        raise RuntimeError(f"no parity environment for {v} and USE_RECORDED is False")
    return ({"runners": list(v.runners), "v2_runner_flag": len(v.runners) > 1, "manager_methods": None,
             "workspace_lines": None, "view_alignment_named": None},
            "recorded: tqlab.core.vllm_versions (read from the release's wheel)")


# %% [markdown]
# ## 1 · One model runner
#
# **Question.** vLLM 0.33 ships two GPU model runners: the V1 runner (`vllm/v1/worker/gpu_model_runner.py`)
# and Model Runner V2 (`vllm/v1/worker/gpu/model_runner.py`), chosen by `VLLM_USE_V2_MODEL_RUNNER`. tqlab's
# start-up rules (what runs before `lock_workspace()`, the decode rows at the lock) are read from 0.33's V1
# runner. In both releases `capture_model` ends in `lock_workspace()` and an `--enforce-eager` server never
# locks.
#
# **Predict, then run.** Which runner files does each release ship, and does `VLLM_USE_V2_MODEL_RUNNER` still
# exist in 0.34? Does Model Runner V2's JIT warm-up (`warmup_kernels`: a real prefill and decode step before
# capture) then run on every 0.34 server?

# %%
F = {}
rows = []
for v in (OLD, NEW):
    F[v.name], where = facts(v)
    rows.append((f"vLLM {v.name}", ", ".join(f"`{r}`" for r in F[v.name]["runners"]),
                 "yes" if F[v.name]["v2_runner_flag"] else "no",
                 "always" if v.jit_warmup_always else "only when Model Runner V2 runs",
                 "yes" if v.startup_rules_modelled else "no (0.33's rules, said so)", where))
show_md(markdown_table(("release", "GPU model runners shipped", "`VLLM_USE_V2_MODEL_RUNNER`",
                        "JIT warm-up before capture", "tqlab's start-up rules are this release's", "source"), rows))
assert F[OLD.name]["runners"] == list(OLD.runners) and F[NEW.name]["runners"] == list(NEW.runners)
assert F[OLD.name]["v2_runner_flag"] and not F[NEW.name]["v2_runner_flag"]
assert NEW.jit_warmup_always and not OLD.jit_warmup_always
assert NEW.model_runner == "v1/worker/gpu/model_runner.py"

# %% [markdown]
# <details><summary>Answer</summary>
#
# vLLM 0.33 ships both runners and the flag that chooses between them; 0.34 ships only Model Runner V2, and the
# flag is gone from `vllm/envs.py` (`vllm/v1/worker/gpu_worker.py` imports `vllm.v1.worker.gpu.model_runner`).
# So on 0.34 the JIT warm-up runs before capture on every server with `KernelConfig.enable_jit_warmup` (the
# default): a real prefill and decode step, with attention metadata built, that grows the workspace before
# the lock. tqlab's start-up rules stay 0.33's, and every answer that depends on them says so
# (`VllmVersion.startup_rules_modelled`; 0.34 also captures decode graphs in requests, not tokens:
# `parity/README.md`, "vLLM 0.34").
#
# </details>

# %% [markdown]
# ## 2 · The manager grew
#
# **Question.** The lock, the error message, `get_simultaneous`, `get_persistent` and lanes are unchanged.
# What did 0.34 add to `WorkspaceManager` (`vllm/v1/worker/workspace.py`)?
#
# **Predict, then run.** Which public methods does each release's manager have, and does tqlab's manager,
# built for each release (`WorkspaceManager(device, vllm_version=...)`), have the same ones?

# %%
rows = []
for v in (OLD, NEW):
    m = WorkspaceManager(DEVICE, vllm_version=v.name)
    live = F[v.name]["manager_methods"]
    rows.append((f"vLLM {v.name}", ", ".join(f"`{x}`" for x in (live or v.manager_methods)),
                 "—" if F[v.name]["workspace_lines"] is None else f"{F[v.name]['workspace_lines']:,}",
                 "—" if F[v.name]["view_alignment_named"] is None else str(F[v.name]["view_alignment_named"]),
                 str(hasattr(m, "get_retained"))))
    if live is not None:
        assert set(v.manager_methods) <= set(live)  # tqlab's record of the release against its code
        assert ("get_retained" in live) == v.has_get_retained == hasattr(m, "get_retained")
show_md(markdown_table(("release", "public methods of vLLM's manager", "lines of workspace.py",
                        "`_VIEW_ALIGNMENT` named", "tqlab's manager has `get_retained`"), rows))
new_methods = sorted(set(NEW.manager_methods) - set(OLD.manager_methods))
print(f"added in vLLM {NEW.name}: {new_methods}; view alignment in both: {OLD.view_alignment} = {NEW.view_alignment} bytes")
assert new_methods == ["get_retained"] and OLD.view_alignment == NEW.view_alignment == 256
tail = WorkspaceManager(DEVICE, vllm_version=NEW.name)
tail.get_simultaneous(((4096,), torch.uint8))
_, first = tail.get_retained("kv", (1024,), torch.uint8)
_, again = tail.get_retained("kv", (1024,), torch.uint8)
assert (first, again) == (False, True)  # the span is remembered between calls (notebook 01 §5c)

# %% [markdown]
# <details><summary>Answer</summary>
#
# One method: `get_retained(key, shape, dtype) -> (view, intact)`, a view at the tail of the slot's buffer
# whose contents can outlive a request (its one user is DeepSeek-V4.1's mega-attention; notebook 01 §5c shows
# when it stays intact and when it is lost). The 256-byte view alignment is the same number, now named
# `_VIEW_ALIGNMENT`. tqlab's manager follows the release it is built for: a 0.33 manager has no
# `get_retained`, as vLLM 0.33's has none.
#
# </details>

# %% [markdown]
# ## 3 · The consumers, per release
#
# **Question.** Notebook 10's census lists every call of the workspace in vLLM's source
# (`parity/gen_consumer_census.py`, with `ast`). Generated once per release, two censuses can be compared call
# site by call site (a site = file and function; CUDA sites only, the platform the crash is about).
#
# **Predict, then run.** Does 0.34 have more CUDA call sites than 0.33 or fewer? Which models bring the new
# ones, and does any 0.33 site disappear?

# %%
census = {v.name: load_recorded(v.census_file.stem) for v in (OLD, NEW)}
for v in (OLD, NEW):
    p = census[v.name].provenance
    print(f"vLLM {v.name} census: {p['vllm']}, {p['date'][:10]}, commit {p['commit'][:12]}, `{p['command']}`")
diff = site_diff(census[OLD.name], census[NEW.name])
show_md(markdown_table(("", "CUDA call site (`path:function` under `vllm/`)"),
                       [("new in 0.34", f"`{s}`") for s in diff["added"]]
                       + [("gone in 0.34", f"`{s}`") for s in diff["removed"]]))
counts = {v.name: census[v.name]["counts"] for v in (OLD, NEW)}
print(f"CUDA call sites: {counts[OLD.name]['cuda']} in 0.33, {counts[NEW.name]['cuda']} in 0.34 "
      f"({len(diff['kept'])} sites in both); get_retained calls in 0.34: {counts[NEW.name].get('get_retained', 0)}")
assert diff["added"] == sorted(NEW.added_consumers) and diff["removed"] == sorted(NEW.removed_consumers)
assert counts[NEW.name]["cuda"] > counts[OLD.name]["cuda"] and counts[NEW.name]["get_retained"] == 1
assert any("kimi_k3" in s for s in diff["added"]) and any("minimax_m3" in s for s in diff["added"])
assert any("fused_humming_moe" in s for s in diff["removed"])
by_phase = {f"vLLM {v.name}": counts[v.name]["cuda_by_first_sized_by"] for v in (OLD, NEW)}
plot_sites_by_phase(by_phase, title="CUDA workspace call sites by the start-up phase that first sizes them")
plt.show()
assert sum(by_phase[f"vLLM {NEW.name}"].values()) == counts[NEW.name]["cuda"]
grew = {ph for ph in set(by_phase[f"vLLM {OLD.name}"]) | set(by_phase[f"vLLM {NEW.name}"])
        if by_phase[f"vLLM {NEW.name}"].get(ph, 0) != by_phase[f"vLLM {OLD.name}"].get(ph, 0)}
assert grew == {"init", "profile_run"}  # the new sites are sized before the lock, at init or in the profile run

# %% [markdown]
# <details><summary>Answer</summary>
#
# More. The new CUDA sites come with two new model families: Kimi-K3's KV-balanced MLA decode
# (`KvBalancedDecode._buffers`: split-KV scratch sized at start-up) and its delta attention, and MiniMax-M3's
# NVFP4 indexer (`reserve_workspace`: FP8 gather pages, reserved in the profile run's forward, then used by its
# prefill). The Qwen gated-delta-net site moved from `_forward_core` to `_forward_flashinfer_prefill` (gone in
# one function, new in another), and the Humming quantized-MoE experts no longer ask the workspace at all. The
# figure shows where the new sites are first sized: at init and in the profile run, before the lock. Each
# new site is one more consumer whose size before the lock has to cover what it asks afterwards — the question
# notebook 10 asks of every consumer.
#
# </details>

# %% [markdown]
# ## 4 · Which architectures reach a different set of consumers
#
# **Question.** `parity/gen_arch_consumers.py` walks vLLM's model registry per release: for every architecture,
# the workspace call sites its model classes can reach. A deployment's consumers follow from its architecture.
#
# **Predict, then run.** Roughly how many architectures are new in 0.34, and do existing architectures reach
# different consumers — gaining sites, losing them, or both?

# %%
tables = {v.name: load_recorded(v.architectures_file.stem) for v in (OLD, NEW)}
ad = arch_diff(tables[OLD.name], tables[NEW.name])
gained = {a: d for a, d in ad["changed"].items() if d["gained"] and not d["lost"]}
moved = {a: d for a, d in ad["changed"].items() if d["gained"] and d["lost"]}
by_change = {}
for a, d in ad["changed"].items():
    by_change.setdefault((tuple(d["gained"]), tuple(d["lost"])), []).append(a)
show_md(markdown_table(("reachable call sites gained", "lost", "architectures", "for example"),
                       [(", ".join(f"`{x}`" for x in g) or "—", ", ".join(f"`{x}`" for x in lost) or "—", len(names),
                         ", ".join(names[:3])) for (g, lost), names in sorted(by_change.items(), key=lambda kv: -len(kv[1]))]))
print(f"architectures: {ad['counts'][0]} in 0.33, {ad['counts'][1]} in 0.34; new {len(ad['added'])}, gone "
      f"{len(ad['removed'])}, reaching other consumers {len(ad['changed'])}")
assert ad["counts"] == (len(tables[OLD.name]["architectures"]), len(tables[NEW.name]["architectures"]))
assert ad["added"] and ad["changed"] and gained and moved
assert 12 < len(ad["added"]) and all(d["gained"] for d in ad["changed"].values())  # none only loses
assert all(d["gained"] == ["qwen_gdn_linear_attn.py:_forward_flashinfer_prefill"]
           and d["lost"] == ["qwen_gdn_linear_attn.py:_forward_core"] for d in moved.values())

# %% [markdown]
# <details><summary>Answer</summary>
#
# More than a dozen architectures are new (the count is printed above) and a few are gone. Of those in both
# releases, the Qwen gated-delta-net models reach the moved site (one lost, one gained: the same consumer,
# another function), a group of draft and MoE models newly reach the fused-MoE buffers, and the Kimi models
# reach the new delta-attention site. None loses a consumer without gaining its replacement. tqlab's predictor
# reads the table of the release it is asked about (`tqlab.core.consumers.arch_table`), so a deployment's
# consumers are that release's.
#
# </details>

# %% [markdown]
# ## Summary
#
# * vLLM 0.34 ships one model runner (V2); its JIT warm-up runs before capture on every server. tqlab's
#   start-up rules are still 0.33's, and answers that depend on them say so.
# * The manager gained `get_retained` (the retained tail of notebook 01 §5c); everything notebooks 01-11 teach
#   about `get_simultaneous`, slots and the lock holds on 0.34.
# * New consumers (Kimi-K3, MiniMax-M3) and a moved one (Qwen GDN); TurboQuant and PR #44053's reservation are
#   unchanged.

# %% [markdown]
# ## Exercises
#
# Three functions; `check` runs yours beside a reference in `tqlab/lab/solutions/nb12.py` and says which cases
# differ ("not attempted yet" until you replace `raise NotImplementedError`). The solutions are folded under
# **Solution**.

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb12 as solutions

# %% [markdown]
# ### Exercise 1 · New call sites
#
# Given the `"path:function"` call sites of an older and a newer census, return the sorted sites of the newer
# one that the older one lacks (section 3).

# %%
def new_call_sites(old_sites, new_sites):
    """Sorted sites in new_sites and not in old_sites."""
    raise NotImplementedError


check("new_call_sites", new_call_sites, solutions.new_call_sites, [
    (["a.py:f", "b.py:g"], ["b.py:g", "c.py:h", "a.py:f2"]),
    (["x.py:f"], ["x.py:f"]),
    ([], ["z.py:k", "y.py:j"]),
])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def new_call_sites(old_sites, new_sites):
#     return sorted(set(new_sites) - set(old_sites))
# ```
#
# </details>

# %% [markdown]
# ### Exercise 2 · Where the retained span starts
#
# A slot holds `buffer_bytes` after one uint8 scratch request (rounded up to 256, as every `get_simultaneous`
# total). Return the byte where vLLM 0.34's `get_retained` of `nbytes` starts: the buffer first grows to `nbytes`
# if it is smaller (exactly, no rounding), then the span starts at `round_down(size − nbytes, 256)`.

# %%
def retained_start(buffer_bytes, nbytes):
    """Byte offset of the retained span."""
    raise NotImplementedError


check("retained_start", retained_start, solutions.retained_start, [(65536, 4096), (1000, 100), (1024, 5000), (4096, 4000)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def retained_start(buffer_bytes, nbytes):
#     size = max(round_up(buffer_bytes, 256), nbytes)
#     return (size - nbytes) // 256 * 256
# ```
#
# </details>

# %% [markdown]
# ### Exercise 3 · Does the JIT warm-up run before capture?
#
# Return whether Model Runner V2's `warmup_kernels` runs before capture on release `version` (`"0.33"` or
# `"0.34"`), given whether Model Runner V2 is the runner (`v2_runner`; on 0.34 it always is). Section 1.

# %%
def jit_warmup_before_capture(version, v2_runner):
    """True when the JIT warm-up runs before capture."""
    raise NotImplementedError


check("jit_warmup_before_capture", jit_warmup_before_capture, solutions.jit_warmup_before_capture, [
    ("0.33", False), ("0.33", True), ("0.34", False), ("0.34", True)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def jit_warmup_before_capture(version, v2_runner):
#     return version == "0.34" or v2_runner
# ```
#
# </details>

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU.*")
