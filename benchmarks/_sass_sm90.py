"""Compile a Triton kernel for sm_90 on a machine without a GPU and print what the H200 would run.

Static analysis for the decode kernels of issue 20 (``benchmarks/NOTES_turboquant.md``): registers, local-memory
spills, shared memory, the SASS opcode histogram (``nvdisasm`` from Triton's bundled CUDA tools) and the number of
``convert_layout`` / ``local_alloc`` ops in the TTGIR (each ``local_alloc`` in the loop is an operand staged through
shared memory).  The local Triton may be newer than the GPU's (3.9 here, 3.6 on the H200): treat counts as estimates.

    PYTHONPATH=$PWD python benchmarks/_sass_sm90.py                 # the block-SoA decode, 3bit_nc, D 128
    PYTHONPATH=$PWD python benchmarks/_sass_sm90.py --preset turboquant_4bit_nc --out /tmp/sass
    PYTHONPATH=$PWD python benchmarks/_sass_sm90.py --gluon 2       # the Gluon decode, 2 warps, no cap

Library use: ``compile_sm90(fn, signature, constexprs, num_warps, maxnreg)`` and ``report(kernel, out_dir)``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int = 4, maxnreg: int | None = None,
                 arch: int = 90, divisible=(), gluon: bool = False):
    """``triton.compile`` of ``fn`` for ``cuda:arch`` without a device; constexpr arguments go in both dicts.

    ``divisible``: argument names the JIT would specialize as multiples of 16 (``tt.divisibility``: pointers
    16-byte aligned, integers ``% 16 == 0``, what a launch with those values compiles).  Without it Triton
    cannot prove a row start aligned, so stores come out as 2-byte ``STG.U16`` where the GPU's run has
    ``STG.128``.  ``gluon``: ``fn`` is a ``gluon.jit`` kernel (``GluonASTSource``)."""
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    opts = {"num_warps": num_warps}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as src
    else:
        src = ASTSource
    return triton.compile(src(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=opts)


def report(kernel, out_dir: str | os.PathLike = "/tmp/sass", name: str = "kernel") -> dict:
    """Write ``name.{cubin,sass,ttgir}`` under ``out_dir`` and return registers, stack, shared bytes, the SASS
    opcode counts (whole kernel) and the TTGIR's convert_layout / local_alloc counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cubin = out / f"{name}.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    (out / f"{name}.ttgir").write_text(kernel.asm["ttgir"])
    sass = subprocess.run([str(_BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    (out / f"{name}.sass").write_text(sass)
    res = subprocess.run([str(_BIN / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    ops = [m.group(1) for ln in sass.splitlines() if (m := _OP.match(ln))]
    ttgir = kernel.asm["ttgir"]
    return {"usage": usage, "sass_total": len(ops), "opcodes": collections.Counter(ops).most_common(),
            "convert_layout": ttgir.count("ttg.convert_layout"), "local_alloc": ttgir.count("ttg.local_alloc"),
            **loop_ops(sass)}


_OP = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def loop_ops(sass: str) -> dict:
    """The main loop of an ``nvdisasm -c`` listing: the instructions from the target label of the longest
    back-branch (``BRA`` to an earlier label) through that branch: ``loop_sass`` (count), ``loop_opcodes``
    (histogram, most common first) and ``loop_text`` (those lines); zeros when the kernel has no backward branch."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", ln))}
    span = (0, -1)
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA\s+`\((\.L_x_\d+)\)", ln)
        if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > span[1] - span[0]:
            span = (labels[m.group(1)], i)
    body = lines[span[0]: span[1] + 1]
    ops = [m.group(1) for ln in body if (m := _OP.match(ln))]
    return {"loop_sass": len(ops), "loop_opcodes": collections.Counter(ops).most_common(), "loop_text": "\n".join(body)}


def decode_signature() -> dict:
    """Argument types of the block-SoA decode kernels (``_triton_soa._decode_soa4_kernel`` and the dev copies)."""
    sig = {"q_ptr": "*fp16", "c16": "*u16", "c32": "*i32", "bt_ptr": "*i32", "sl_ptr": "*i32", "mid_ptr": "*fp32"}
    sig.update({f"c{i}": "fp32" for i in range(8)})
    sig.update(qk_scale="fp32", inv_sqrt_d="fp32", num_blocks="i32", num_splits="i32")
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "stride_cb16", "stride_ch16", "stride_btb", "stride_mb",
                                   "stride_mh", "stride_ms")})
    return sig


# arguments of the decode that the GPU launch specializes as multiples of 16 (torch allocations; strides of the
# benchmark shapes: stride_cb16 = Hk * 16 * slot / 2, stride_ch16 = 16 * slot / 2 with slot 102 / 120 / 136 B;
# not stride_ms = D + 1).  Without them 16-byte loads of 16-byte aligned fields compile as 4-byte loads and spill.
DECODE_DIV16 = ("q_ptr", "c16", "c32", "bt_ptr", "sl_ptr", "mid_ptr", "num_blocks", "num_splits", "stride_qb",
                "stride_qh", "stride_cb16", "stride_ch16", "stride_btb", "stride_mb", "stride_mh")


def soa_decode_meta(spec, d: int = 128, block_size: int = 16, block_t: int = 128, group: int = 4,
                    gp_min: int | None = None) -> dict:
    """Constexprs of ``_decode_soa4_kernel`` as ``_triton_soa.decode_attention`` sets them on the GPU (``PTX``,
    the prmt table for MSE keys)."""
    from tqlab.turboquant import _triton_kernels as tk
    from tqlab.turboquant import ptx_tables as pt
    from tqlab.turboquant.launch import SOA_DEFAULTS

    lut = 0 if spec.key_fp8 else 2
    gp_min = SOA_DEFAULTS["soa_decode"].get("gp_min", 16) if gp_min is None else gp_min
    return dict(GROUP=group, GP=tk.query_tile_rows(group, gp_min), BLOCK_SIZE=block_size, D=d, BLOCK_T=block_t,
                KBITS=spec.key_bits, VBITS=spec.value_bits, NORM_CORR=spec.norm_correction_on_read, LUT=lut,
                LUT_ASM=pt._asm_for(spec, d, lut), KEY_FP8=spec.key_fp8, PTX=True,
                **tk._field_addr(spec, d, block_size), **tk._planes_flags(spec, d, block_size))


def _soa_decode(preset: str, d: int, block_size: int, block_t: int, maxnreg: int | None, div16: bool = True):
    import torch  # noqa: F401  (tqlab's kernels import torch)

    from tqlab.turboquant import _triton_soa as ts
    from tqlab.turboquant import get_spec

    meta = soa_decode_meta(get_spec(preset, cache_layout="block_soa"), d, block_size, block_t)
    return compile_sm90(ts._decode_soa4_kernel, decode_signature(), meta, num_warps=4, maxnreg=maxnreg,
                        divisible=DECODE_DIV16 if div16 else ())


def _gluon_decode(preset: str, num_warps: int, maxnreg: int | None):
    """``_gluon_decode._decode_planes_kernel`` as ``_gluon_decode.decode_attention`` launches it (D 128, block 16,
    GQA 4), with the launcher's 16-divisibility."""
    import torch  # noqa: F401  (tqlab's kernels import torch)

    from tqlab.turboquant import _gluon_decode as gd
    from tqlab.turboquant import _triton_kernels as tk
    from tqlab.turboquant import get_spec
    from tqlab.turboquant import ptx_tables as pt

    spec, d, bs = get_spec(preset, cache_layout="block_soa"), 128, 16
    fa, planes = tk._field_addr(spec, d, bs), tk._planes_flags(spec, d, bs)
    sig = {"q_ptr": "*fp16", "c16": "*u16", "c32": "*i32", "bt_ptr": "*i32", "sl_ptr": "*i32", "mid_ptr": "*fp32",
           "qk_scale": "fp32", "inv_sqrt_d": "fp32", "num_blocks": "i32", "num_splits": "i32"}
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "stride_cb32", "stride_ch32", "stride_btb", "stride_mb",
                                   "stride_mh", "stride_ms")})
    meta = dict(GROUP=4, BLOCK_SIZE=bs, D=d, KO=fa["KO"], KP=planes["KP"], NO=fa["NO"], NS=fa["NS"], VO=fa["VO"],
                VP=planes["VP"], SO=fa["SO"], SS=fa["SS"], ZO=fa["ZO"], ZS=fa["ZS"],
                KASM=pt.planes_key_pair_ptx(spec, d) if spec.key_bits == 3 else pt.key4_pair_ptx(spec, d),
                **gd._value_table(spec), **gd.layouts(num_warps))
    div = [n.replace("16", "32") if n.startswith("stride_c") else n for n in DECODE_DIV16]
    return compile_sm90(gd._decode_planes_kernel, sig, meta, num_warps=num_warps, maxnreg=maxnreg, divisible=div,
                        gluon=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="turboquant_3bit_nc", help="one preset or a comma-separated list")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--block-t", type=int, default=128)
    ap.add_argument("--maxnreg", type=int, default=None,
                    help="register cap (default: launch.SOA_DEFAULTS' for the Triton kernel, none with --gluon)")
    ap.add_argument("--no-div16", action="store_true", help="compile without the launcher's 16-divisibility")
    ap.add_argument("--gluon", type=int, default=0, metavar="WARPS",
                    help="compile the Gluon decode (_gluon_decode) with this many warps instead (needs Triton's Gluon)")
    ap.add_argument("--out", default="/tmp/sass")
    a = ap.parse_args()
    if a.gluon and (a.head_dim, a.block_size, a.block_t) != (128, 16, 128):
        ap.error("--gluon compiles the Gluon decode at D 128, block 16, GQA 4: --head-dim/--block-size/--block-t "
                 "do not apply")
    if a.maxnreg is None:
        from tqlab.turboquant.launch import SOA_DEFAULTS

        a.maxnreg = 0 if a.gluon else SOA_DEFAULTS["soa_decode"].get("maxnreg") or 0  # the Gluon launch: no cap
    launch = f"Gluon decode, {a.gluon} warps" if a.gluon else f"{a.block_t} x 4 warps"
    print(f"Triton {triton.__version__}, sm_90, D {a.head_dim}, block {a.block_size}, {launch}, "
          f"maxnreg {a.maxnreg}, div16 {not a.no_div16}")
    for preset in a.preset.split(","):
        name = f"{'gluon' if a.gluon else 'soa'}_decode_{preset.removeprefix('turboquant_')}"
        kern = (_gluon_decode(preset, a.gluon, a.maxnreg or None) if a.gluon else
                _soa_decode(preset, a.head_dim, a.block_size, a.block_t, a.maxnreg or None, not a.no_div16))
        r = report(kern, a.out, name)
        lp = dict(r["loop_opcodes"])
        print(f"{preset}: registers {r['usage'].get('REG')}, stack {r['usage'].get('STACK')} B, shared "
              f"{r['usage'].get('SHARED')} B; SASS {r['sass_total']}, loop {r['loop_sass']} (STS {lp.get('STS', 0)}, "
              f"LDS {lp.get('LDS', 0)}, LDSM {lp.get('LDSM', 0)}, LDL {lp.get('LDL', 0)}, STL {lp.get('STL', 0)}); "
              f"TTGIR convert_layout {r['convert_layout']}, local_alloc {r['local_alloc']}")
        print("  " + ", ".join(f"{op} {n}" for op, n in r["opcodes"][:24]))
    print(f"files: {a.out}/{'gluon' if a.gluon else 'soa'}_decode_<preset>.{{sass,ttgir,cubin}}")


if __name__ == "__main__":
    main()
