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
# # 04 · The TurboQuant KV cache: from a key vector to bytes and back
#
# `--kv-cache-dtype turboquant_3bit_nc` stores a 128-dimensional key **and** value in 102 bytes
# instead of 512. This notebook opens that box. You will learn:
#
# 1. the four presets and the byte layout of one cache slot (`[key_packed | value_packed]`);
# 2. one key vector's journey: norm, Hadamard rotation, Lloyd-Max indices, packed bits — and back;
# 3. what the compression costs in accuracy (computed live, per preset), and whether keys or values
#    set the attention error at each bit width;
# 4. the three operations the attention backend runs on the packed cache — store, full dequant
#    (continuation prefill), split-KV decode — and **where the workspace enters**: the dequant
#    buffers are sized by the cached length, the very buffers of the "Workspace is locked" crash.
#
# How fast a GPU reads this cache — Triton kernels, another byte order inside a block, the H200
# recordings — is the appendix, [notebook 11](11_appendix_turboquant_kernels.ipynb).
#
# **What you need.** Nothing but this repository. CPU (default): everything runs on the torch reference;
# with `DEVICE = "cuda"` the operations run the Triton kernels.
#
# **Run time.** About 10 s on a 2-core CPU box; the last cell prints the measured time.
#
# Each **predict, then run** prompt stands before the cell that answers it; the answers are folded under
# **Answer**, and a cell of `assert`s checks them. Words such as *split-KV* and *continuation chunk* are in
# the [glossary](00_glossary.md). Exercises checked by code close the notebook.

# %%
import time

_T0, _CPU0 = time.perf_counter(), time.process_time()

import torch

from tqlab.lab.environment import show_environment

ENV = show_environment(vllm="0.33")  # the vLLM version this notebook shows; torch, CUDA, its parity environment

# %% tags=["parameters"]
from tqlab.lab.recorded import check_device

DEVICE = "cpu"  # where the cache operations run: "cpu" or "cuda"
check_device(DEVICE, ("cpu", "cuda"), "04", "its cells read real cache values; a meta tensor has none")
USE_RECORDED = True  # the parameter every notebook has; this one is all live (notebook 11 shows the H200 recordings)

# %%
import matplotlib.pyplot as plt

from tqlab.core.config import EngineConfig
from tqlab.lab import recorded
from tqlab.lab.display import fmt_bytes, markdown_table, show_md
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes
from tqlab.turboquant import (
    TQ_PRESETS,
    decode_attention,
    dequant_kv,
    get_spec,
    key_journey,
    kv_cache_shape,
    lloyd_max_standard,
    store_kv,
    TurboQuantSpec,
)
from tqlab.lab import plots_turboquant as figures
from tqlab.turboquant.accuracy import accuracy_table, key_mse
from tqlab.core.workspace import WorkspaceManager

device = recorded.pick_device(DEVICE)
D = 128  # head_dim of the bug report's model (and of Llama-3.1-8B)

# %% [markdown]
# ## 1 · Four presets, one slot layout
#
# A slot holds one (position, kv-head): the key part is `ceil(D·bits/8)` bytes of packed indices
# plus the key's norm in fp16 (fp8 keys: just `D` bytes), the value part `ceil(D·bits/8)` bytes of
# packed codes plus an fp16 scale and zero point; the slot is rounded up to an even size. A layer's
# cache is one uint8 tensor `(num_blocks, num_kv_heads, block_size, slot_bytes)`.
#
# **Predict, then run.** How many bytes does one `turboquant_3bit_nc` slot take at `D` = 128, for a key
# *and* a value, and how many times smaller is it than fp16 (`2 × D × 2` bytes)? (Keys: 3-bit indices plus a
# 2-byte norm; values: 3-bit codes plus a 2-byte scale and a 2-byte zero.)

# %%
rows = figures.slot_table(D)
show_md(markdown_table(list(rows[0]), [list(r.values()) for r in rows]))
print("cache tensor of 1,000 blocks, 1 kv head, block 16, 3bit_nc:",
      kv_cache_shape(1000, 1, 16, D, "turboquant_3bit_nc"), "uint8")
figures.plot_slot_layouts(D)
plt.show()
assert kv_cache_shape(1000, 1, 16, D, "turboquant_3bit_nc")[-1] == get_spec("turboquant_3bit_nc").slot_bytes(D)

# %%
s3 = get_spec("turboquant_3bit_nc")
assert s3.key_packed_bytes(D) == -(-D * 3 // 8) + 2 and s3.value_packed_bytes(D) == -(-D * 3 // 8) + 4
assert s3.slot_bytes(D) == 102
assert abs(2 * D * 2 / s3.slot_bytes(D) - 5.02) < 0.01
print(f"key {s3.key_packed_bytes(D)} B + value {s3.value_packed_bytes(D)} B = {s3.slot_bytes(D)} B per slot, "
      f"against {2 * D * 2} B in fp16: {2 * D * 2 / s3.slot_bytes(D):.2f}× smaller")
print(f"{s3.name}: {s3.slot_bytes(D)} bytes per slot, {2 * D * 2 / s3.slot_bytes(D):.2f}x smaller than fp16")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Key: ⌈128·3/8⌉ = 48 index bytes + 2 norm bytes = 50; value: 48 code bytes + 2 scale + 2 zero = 52; the slot
# is 102 bytes against 512 in fp16, about 5× smaller.
#
# </details>

# %% [markdown]
# ## 2 · One key's journey to bytes and back
#
# 1. keep the norm `‖k‖` (fp16), work on the unit vector `u = k/‖k‖`;
# 2. rotate with the orthonormal Sylvester Hadamard matrix `H` — every coordinate of `H u` now looks
#    like a draw from `N(0, 1/D)`, whatever `k` looked like (below: a key with two outlier channels);
# 3. snap each coordinate to the nearest of `2^bits` Lloyd-Max levels for `N(0, 1/D)` (the
#    minimum-squared-error levels for that bell curve, solved numerically once);
# 4. pack the indices, 3 bits each, little-endian: 128 × 3 bits = 48 bytes.
#
# Back: centroid values, **norm correction** (rescale to unit length — the `_nc`), rotate back with
# `H` (it is its own inverse), multiply by the norm.
#
# **Predict, then run.** How many bytes do `D` = 128 indices of 3 bits (plus the fp16 norm) pack into? How
# many distinct levels can one index take? What length does the norm-corrected vector have before it is
# scaled back?

# %%
spec = get_spec("turboquant_3bit_nc")
g = torch.Generator().manual_seed(4)
k = torch.randn(D, generator=g)
k[[7, 90]] = torch.tensor([9.0, -7.0])  # outlier channels, as real keys have
j = key_journey(k, spec)
figures.plot_key_journey(j, spec)
plt.show()
print("indices  :", j["idx"][:16].tolist(), "...")
print("key bytes:", " ".join(f"{b:02x}" for b in j["packed"][:12].tolist()), "...",
      f"({len(j['packed'])} bytes = 48 index bytes + 2 norm bytes)")
print(f"norm {float(j['norm']):.4f} stored as fp16; ‖corrected‖ = {float(j['corrected'].norm()):.6f}")
assert len(j["packed"]) == spec.key_packed_bytes(D)

# %%
assert len(j["packed"]) == D * 3 // 8 + 2
assert int(j["idx"].min()) >= 0 and int(j["idx"].max()) < 2**spec.key_bits
assert abs(float(j["corrected"].norm()) - 1.0) < 1e-3
print(f"{len(j['packed'])} packed bytes; indices in [{int(j['idx'].min())}, {int(j['idx'].max())}] of "
      f"{2**spec.key_bits} levels; corrected norm {float(j['corrected'].norm()):.4f}")
print("packed size, index range and unit norm as predicted")


# %% [markdown]
# <details><summary>Answer</summary>
#
# 128 indices × 3 bits = 384 bits = 48 bytes, plus 2 bytes of fp16 norm: 50 bytes. A 3-bit index takes one of
# 2³ = 8 levels. The norm-corrected vector has length 1 (that is what the correction does) before it is
# rotated back and multiplied by the stored norm.
#
# </details>

# %% [markdown]
# The rotation is what makes one fixed codebook work for every key: without it the outliers would
# need the whole range and every other coordinate would round to zero. Measured over 2,048 random
# unit keys, the squared error matches the Lloyd-Max distortion of `N(0,1)` for the bit width:

# %%
lm_rows = []
for bits in (2, 3, 4):
    plain = key_mse(TurboQuantSpec(f"k{bits}", bits, 4, False), D, n=2048)
    nc = key_mse(TurboQuantSpec(f"k{bits}nc", bits, 4, True), D, n=2048)
    lm_rows.append([bits, 1 << bits, f"{lloyd_max_standard(bits).distortion:.5f}", f"{plain['mse']:.5f}", f"{nc['mse']:.5f}"])
show_md(markdown_table(["bits", "levels", "Lloyd-Max distortion N(0,1)", "measured ‖u−û‖² (plain)",
                        "measured (norm corrected)"], lm_rows))

# %% [markdown]
# ## 3 · Compression vs accuracy
#
# Decode attention over the packed cache against fp32 `scaled_dot_product_attention` on the original
# keys and values (random Gaussian data, 8 query heads on 2 kv heads, 1,024 tokens of context).
# With near-flat attention the output is an *average of values*, so its relative error is close
# to √(value relative MSE) — compare the last two columns — and the keys add the rest.
#
# **Predict, then run.** Which adds more attention error at 3 bits: the keys or the values? Going from
# `turboquant_k3v4_nc` (3-bit keys, 4-bit values) to `turboquant_3bit_nc` (3-bit values too), does the
# error double? Use the last two columns of the table: `√(value rel. MSE)` is the error values alone would
# cause.

# %%
acc = accuracy_table(head_dim=D, context=1024)
show_md(markdown_table(
    ["preset", "slot B", "× vs fp16", "key MSE (unit)", "value rel. MSE", "cos min", "cos mean",
     "√(value rel. MSE)", "rel. error"],
    [[r["preset"], r["slot_bytes"], f"{r['compression']:.2f}", f"{r['key_mse']:.4f}", f"{r['value_rel_mse']:.4f}",
      f"{r['cos_min']:.4f}", f"{r['cos_mean']:.4f}", f"{r['value_rel_mse'] ** 0.5:.3f}", f"{r['rel_err']:.3f}"]
     for r in acc]))
figures.plot_accuracy(acc)
plt.show()
assert {r["preset"] for r in acc} == set(TQ_PRESETS)

# %%
by = {r["preset"]: r for r in acc}
floor = {p: r["value_rel_mse"] ** 0.5 for p, r in by.items()}  # the values' share of the error
k8, k3, b3 = by["turboquant_k8v4"], by["turboquant_k3v4_nc"], by["turboquant_3bit_nc"]
from_keys_k3 = k3["rel_err"] - floor["turboquant_k3v4_nc"]  # what 3-bit keys add on top of 4-bit values
raise_3bit_values = b3["rel_err"] / k3["rel_err"]
assert k8["rel_err"] < 1.1 * floor["turboquant_k8v4"]  # 8-bit keys: the values' floor is (almost) all of it
assert from_keys_k3 > floor["turboquant_k3v4_nc"]  # 3-bit keys add more than the 4-bit values cause
assert 1 < raise_3bit_values < 2  # 3-bit values raise the error, but do not double it
show_md(
    f"With 8-bit keys the values explain {floor['turboquant_k8v4']:.3f} of the {k8['rel_err']:.3f} error. "
    f"With 3-bit keys (`k3v4_nc`) the error is {k3['rel_err']:.3f}: the keys add {from_keys_k3:.3f}, more than "
    f"the values' {floor['turboquant_k3v4_nc']:.3f} — **at 3 bits the keys dominate**. Making the values 3-bit too "
    f"(`3bit_nc`) raises the error ×{raise_3bit_values:.2f}, to {b3['rel_err']:.3f}: not double."
)


# %% [markdown]
# <details><summary>Answer</summary>
#
# At 3 bits the keys: with 3-bit keys and 4-bit values the error is well above what the values alone cause.
# Making the values 3-bit too raises the error, but by less than a factor of two.
#
# </details>

# %% [markdown]
# ## 4 · The three operations, and where the workspace enters
#
# The attention backend (`tqlab/attention/turboquant_attn.py`, mirroring vLLM's `turboquant_attn.py`) calls three
# operations on the packed cache. Two of them write into **workspace** buffers whose shapes come from
# `tqlab/core/reservation.py` — one formula per buffer:
#
# * `store_kv` — quantize new K/V, write their slots (no workspace);
# * `dequant_kv` — a *continuation prefill* (a chunk whose request already has cached tokens)
#   dequantizes the whole cached K and V into two fp16 buffers `(1, Hk, round_up(cached_len, block), D)`;
# * `decode_attention` — split-KV decode writes per-split partials and log-sum-exp into
#   `(B, Hq, S, D+1)` float32, then reduces into `(B, Hq, D)` and `(B, Hq)`.
#
# Below, on the bug report's per-rank shape (Nemotron-3-Super on 8 GPUs: 4 query heads, 1 kv head),
# a 300-token request is stored, dequantized into workspace buffers, and decoded.
#
# **Predict, then run.** What shape and dtype do the two dequant buffers have for 300 cached tokens at
# block size 16, and the split-KV scratch (`tq_max_kv_splits_for_cuda_graph` splits)? The two calls go to one
# shared workspace: does it need the sum of the two layouts, or the larger one?

# %%
cfg = EngineConfig.from_preset("nemotron-3-super-120b-a12b")
hq, hk, bs = cfg.num_heads_per_rank, cfg.num_kv_heads_per_rank, cfg.block_size
spec = get_spec(cfg.kv_cache_dtype)
n_tok = 300
nb = -(-n_tok // bs)
cache = torch.zeros(kv_cache_shape(nb, hk, bs, D, spec), dtype=torch.uint8, device=device)
keys = torch.randn(n_tok, hk, D, generator=g).to(device)
vals = torch.randn(n_tok, hk, D, generator=g).to(device)
block_row = torch.randperm(nb, generator=g).to(torch.int32).to(device)  # paged: blocks anywhere
pos = torch.arange(n_tok, device=device)
store_kv(cache, keys, vals, block_row[pos // bs].long() * bs + pos % bs, spec)

ws = WorkspaceManager(device)
k_buf, v_buf = ws.get_simultaneous(*continuation_workspace_shapes(n_tok, hk, D, bs))
dequant_kv(cache, block_row, n_tok, k_buf, v_buf, spec)
rel_k = float((k_buf[0, :, :n_tok].float() - keys.transpose(0, 1)).norm() / keys.norm())
print(f"packed cache {tuple(cache.shape)} uint8 = {fmt_bytes(cache.numel())}; "
      f"workspace K/V buffers {tuple(k_buf.shape)} fp16 = {fmt_bytes(2 * k_buf.numel() * 2)}; "
      f"dequantized K relative error {rel_k:.3f}")

mid, out, lse = ws.get_simultaneous(*decode_workspace_shapes(1, hq, D, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype))
q = torch.randn(1, hq, D, generator=g).to(device, cfg.torch_dtype)
decode_attention(q, cache, block_row[None], torch.tensor([n_tok], device=device), spec, D**-0.5, mid, out, lse)
print(f"decode: mid_out {tuple(mid.shape)} f32, output {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}; "
      f"workspace now {fmt_bytes(ws.size_bytes())}")
assert ws.size_bytes() >= 2 * k_buf.numel() * k_buf.element_size()  # the dequant buffers fit the workspace

# %%
from tqlab.core.workspace import compute_layout

assert tuple(k_buf.shape) == (1, hk, -(-n_tok // bs) * bs, D) and k_buf.dtype == torch.float16
assert tuple(mid.shape) == (1, hq, cfg.tq_max_kv_splits_for_cuda_graph, D + 1)
lay_cont = compute_layout(continuation_workspace_shapes(n_tok, hk, D, bs)).total_bytes
lay_dec = compute_layout(decode_workspace_shapes(1, hq, D, cfg.tq_max_kv_splits_for_cuda_graph, cfg.dtype)).total_bytes
assert ws.size_bytes() == max(lay_cont, lay_dec)
print(f"dequant buffers {tuple(k_buf.shape)} {k_buf.dtype}, split-KV scratch {tuple(mid.shape)} {mid.dtype}; "
      f"workspace = max({fmt_bytes(lay_cont)}, {fmt_bytes(lay_dec)}) = {fmt_bytes(ws.size_bytes())}")


# %% [markdown]
# <details><summary>Answer</summary>
#
# Two fp16 buffers `(1, 1, 304, 128)` (300 rounded up to 19 blocks of 16) and a float32 split-KV scratch
# `(1, 4, S, 129)`. Both calls start at offset 0 of the same buffer, so it needs the larger layout, not the sum.
#
# </details>

# %% [markdown]
# ### The dequant buffers against the packed bytes
#
# The decode buffers depend on the batch (`max_num_seqs` after capture) and the split count — fixed
# numbers. The dequant buffers grow with the **cached length** of whichever request arrives: they are
# larger than the packed bytes they are read from by the compression ratio, and at the report's
# 8K-token prompt they need more than the workspace that start-up had seen. That is notebook 02's crash.
#
# **Predict, then run.** Does the ratio of the fp16 dequant buffers to the packed bytes they are read from
# change with the cached length? How many MiB do the two buffers need per rank at 131,071 cached tokens, the
# bug report's `max_model_len - 1`?

# %%
lens = [256, 1024, 4096, 8192, 32768, 131071]
wv = figures.workspace_vs_cache(lens, hk, D, bs, spec)
show_md(markdown_table(["cached_len", "packed K+V read (3bit_nc)", "fp16 workspace written", "ratio"],
                       [[f"{r['cached_len']:,}", fmt_bytes(r["packed_bytes"]), fmt_bytes(r["workspace_bytes"]),
                         f"{r['workspace_bytes'] / r['packed_bytes']:.2f}"] for r in wv]))
fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.plot(lens, [r["workspace_bytes"] / 2**20 for r in wv], marker="o", label="continuation workspace (2 × fp16)")
ax.plot(lens, [r["packed_bytes"] / 2**20 for r in wv], marker="s", label="packed slots it dequantizes")
figures.finish_loglog(ax, "cached_len (tokens)", "MiB", f"{cfg.preset}: one rank, Hk={hk}, D={D}")
plt.show()
assert all(r["workspace_bytes"] > r["packed_bytes"] for r in wv)  # fp16 is larger than the packed slots

# %%
for r in wv:
    if r["cached_len"] % bs == 0:
        assert abs(r["workspace_bytes"] / r["packed_bytes"] - 2 * 2 * D / spec.slot_bytes(D)) < 1e-9
assert wv[-1]["workspace_bytes"] == 2 * hk * (-(-131071 // bs) * bs) * D * 2 == 64 * 2**20
print(f"ratio {2 * 2 * D / spec.slot_bytes(D):.2f} at every block-aligned length (2·2·D / slot bytes); "
      f"{wv[-1]['workspace_bytes'] / 2**20:.0f} MiB at 131,071 cached tokens — the size PR #44053 reserves")


# %% [markdown]
# <details><summary>Answer</summary>
#
# No: both grow linearly with the cached length, so the ratio is the fixed 2·2·D / slot bytes (about 5 for
# `3bit_nc`) at every block-aligned length. At 131,071 cached tokens: 2 × 1 × 131,072 × 128 × 2 bytes = 64 MiB
# per rank, the size PR #44053 reserves (notebook 03).
#
# </details>

# %% [markdown]
# ## Summary
#
# * A TurboQuant slot is `[packed key indices | fp16 norm | packed value codes | fp16 scale, zero]`;
#   the Hadamard rotation makes one Lloyd-Max codebook fit every key.
# * On flat attention, the values set a floor on the error (√ of their relative MSE); at 3-bit keys the
#   keys add more than that floor, and 3-bit values raise the error further but do not double it
#   (section 3 computes both numbers live).
# * Continuation prefill dequantizes the *whole* cached context into fp16 workspace buffers larger
#   than the packed bytes by the compression ratio — sized by `cached_len`, which is why they must be reserved for
#   `max_model_len` before the workspace locks.
# * How fast a GPU reads the packed cache, and what another byte order inside a block buys, is the
#   appendix, notebook 11.

# %% [markdown]
# ## Exercises
#
# Four functions about the cache format; the references call the package's own code.
# Each exercise is a function to fill in: replace `raise NotImplementedError` with your code and run
# the cell. `check` runs your function beside a reference on several cases and says which differ
# (until then it says "not attempted yet"). Everything runs on a CPU. The solutions are folded under
# **Solution**; the references live in `tqlab/lab/solutions/nb04.py`.

# %%
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb04 as solutions

# %% [markdown]
# ### Exercise 1 · Bytes of a slot
#
# Return the bytes of one slot (a key and a value) of a preset at `head_dim` (section 1's rule). Read the bit
# widths from `get_spec(preset)`: `key_bits` (8 = fp8 keys: `D` bytes, no norm), `value_bits`.

# %%
def slot_bytes(preset, head_dim):
    raise NotImplementedError


check("slot_bytes", slot_bytes, solutions.slot_bytes, [(p, d) for p in TQ_PRESETS for d in (64, 128, 256)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def slot_bytes(preset, head_dim):
#     s = get_spec(preset)
#     key = head_dim if s.key_bits == 8 else -(-head_dim * s.key_bits // 8) + 2  # + fp16 norm
#     value = -(-head_dim * s.value_bits // 8) + 4  # + fp16 scale and zero
#     n = key + value
#     return n + (n & 1)  # rounded up to even
# ```
#
# </details>

# %% [markdown]
# ### Exercise 2 · Compression against fp16
#
# Return how many times smaller than fp16 K and V (`2 × head_dim × 2` bytes) a slot is. Floats are compared
# within a relative tolerance of 1e-9.

# %%
def compression_vs_fp16(preset, head_dim):
    raise NotImplementedError


check("compression_vs_fp16", compression_vs_fp16, solutions.compression_vs_fp16, [(p, 128) for p in TQ_PRESETS] + [("turboquant_3bit_nc", 64)], rel_tol=1e-9)

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def compression_vs_fp16(preset, head_dim):
#     return 2 * head_dim * 2 / get_spec(preset).slot_bytes(head_dim)
# ```
#
# </details>

# %% [markdown]
# ### Exercise 3 · Packed indices
#
# Return the bytes `head_dim` indices of `bits` bits pack into (section 2: little-endian bit stream, no norm).

# %%
def packed_index_bytes(head_dim, bits):
    raise NotImplementedError


check("packed_index_bytes", packed_index_bytes, solutions.packed_index_bytes, [(128, 3), (128, 2), (128, 4), (96, 3), (40, 3)])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def packed_index_bytes(head_dim, bits):
#     return -(-head_dim * bits // 8)
# ```
#
# </details>

# %% [markdown]
# ### Exercise 4 · What a continuation chunk reads and writes
#
# A continuation chunk dequantizes `cached_len` cached tokens of `kv_heads` heads. Return `(packed bytes it
# reads, fp16 workspace bytes it writes)` (section 4: the two buffers are `(1, Hk, round_up(cached_len,
# block_size), D)` fp16).

# %%
def continuation_vs_packed(cached_len, kv_heads, head_dim, block_size, preset):
    raise NotImplementedError


check("continuation_vs_packed", continuation_vs_packed, solutions.continuation_vs_packed, [(300, 1, 128, 16, "turboquant_3bit_nc"), (131071, 1, 128, 16, "turboquant_3bit_nc"),
    (8192, 8, 128, 16, "turboquant_k8v4"), (1000, 4, 64, 2080, "turboquant_4bit_nc")])

# %% [markdown]
# <details><summary>Solution</summary>
#
# ```python
# def continuation_vs_packed(cached_len, kv_heads, head_dim, block_size, preset):
#     packed = cached_len * kv_heads * get_spec(preset).slot_bytes(head_dim)
#     alloc_len = -(-cached_len // block_size) * block_size
#     return packed, 2 * kv_heads * alloc_len * head_dim * 2
# ```
#
# </details>

# %%
show_md(f"*Notebook ran in {time.perf_counter() - _T0:.1f} s wall, {time.process_time() - _CPU0:.1f} s CPU (ops on `{device}`).*")
