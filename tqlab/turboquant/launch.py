"""Launch configuration of the Triton kernels (no triton import here, so tests can read it anywhere).

``block_t`` tokens per tile, ``num_warps``, ``num_stages`` (software pipelining of the token loop;
None = Triton's default), ``maxnreg`` (register cap; None = none), for decode ``prefetch`` (load
the next tile's packed words before computing the current one) and for dequant ``tiles`` (tiles
per program, so the sign matrix is loaded once per ``tiles * block_t`` tokens).  ``decode`` is used
for the rotated (MSE-key) presets, ``decode_fp8`` for fp8 keys.  Values: the fastest variants of
``benchmarks/dev_turboquant_variants.py`` on an H200 with Triton 3.6 (CUDA-graph replay, L2
flushed; Llama-3.1-8B shard, batch 16, 32K context, and the seed rank at 128K), see
``benchmarks/NOTES_turboquant.md``.
"""

DEFAULTS: dict = {
    # the fast kernels of issue 20 (``_triton_fast``, ``_triton_dequant``), measured by benchmarks/dev_turboquant_fast.py:
    # no software prefetch (it costs 75 registers: 4 -> 2 CTAs per SM), norm by 16 in-thread
    # products + 3 shuffles (the MMA against ones cost more), tiles per dequant program: 2, or 1
    # when that leaves fewer than 4 programs per SM
    "fast_decode": {"block_t": 64, "num_warps": 4, "prefetch": False, "norm_mma": False, "lut": 2},
    # "w32": "4bit" = aligned 32-bit code words when a field is 4-bit (k3v4_nc, 4bit_nc): share of copy on the
    # Llama shard at 32K/128K 0.50-0.54 -> 0.60-0.67 on block-SoA, 0.48-0.53 -> 0.51-0.56 on vLLM's order; 3bit_nc
    # loses 1-4 % with it (data/turboquant_dequant_variants_sweep_h200.json, H200, aa4d1ae)
    "fast_dequant": {"block_t": 64, "num_warps": 4, "tiles": 2, "lut": 2, "w32": "4bit"},
    "decode": {"block_t": 64, "num_warps": 4, "num_stages": 1, "maxnreg": None, "prefetch": True},
    "decode_fp8": {"block_t": 128, "num_warps": 4, "num_stages": 1, "maxnreg": None, "prefetch": False},
    "dequant": {"block_t": 64, "num_warps": 4, "num_stages": None, "maxnreg": None, "tiles": 8},
}

# block-SoA decode (``_triton_soa``): 128-token tiles, 4 warps (the ``soa_x32_128x4`` variant of
# benchmarks/dev_turboquant_soa.py, data/turboquant_soa_x32_launch_h200.json); since issue 20's round 4 the
# query tile has the GQA group's own rows (``gp_min`` 4: Triton pads the MMA below 16, the softmax runs on 4
# rows instead of 16) and a register cap of 96 -> 5 CTAs per SM (``gp4_r96`` of
# data/turboquant_gp_launch_h200.json, which set gp_min 1: the same 4 rows for the bench shapes' GQA 4; Llama
# shard 3bit_nc 128K 1.592 -> 1.319 ms; 128 registers with 16 rows before).  gp_min 4 rather than 1 keeps the
# GQA-1 and -2 tiles at the 4 rows the GPU run measured.  Kept apart from DEFAULTS, which data/turboquant_bench.json's sweep recorded.
SOA_DEFAULTS: dict = {"soa_decode": {"block_t": 128, "num_warps": 4, "maxnreg": 96, "lut": 2, "gp_min": 4},
                     # the Gluon decode (``_gluon_decode``, issue 20 round 5: the rotated presets, GQA <= 8, D 128):
                     # warps per program (each warp keeps its own softmax over its own tokens), 2 when the launch has
                     # at least one program (request x KV head x split) per SM, else 4 (fixed per captured graph).
                     # H200 (data/turboquant_gluon_launch_h200.json, benchmarks/NOTES_turboquant.md): with >= 1
                     # program per SM 2 warps are best at 32K (Llama 3bit_nc 0.236 ms; 1 warp 0.240, 4 warps 0.253)
                     # and within 1 % of 4 at 128K, where 1 warp is 5 % slower (1 warp is up to 7 % faster at 8K);
                     # below it (the seed rank's 32 splits: 128 programs on 132 SMs) 4 warps are 1.2-1.7x faster
                     "gluon_decode": {"num_warps": 2, "num_warps_below_one_program_per_sm": 4}}
