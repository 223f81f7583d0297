"""Launch configuration of the Triton kernels (no triton import here, so tests can read it anywhere).

``block_t`` tokens per tile, ``num_warps``, ``num_stages`` (software pipelining; None = Triton's
default) and ``maxnreg`` (register cap; None = none) for the two hot kernels.  The values are the
winners of the tile sweep recorded in ``data/turboquant_bench.json`` (``sweep`` rows, with registers
and spills per config; ``chosen_defaults``), measured on an H200 with Triton 3.6.
"""

DEFAULTS: dict = {
    "decode": {"block_t": 128, "num_warps": 4, "num_stages": 1, "maxnreg": None},
    "dequant": {"block_t": 32, "num_warps": 4, "num_stages": None, "maxnreg": None},
}
