"""The inline-PTX tables of the fast TurboQuant kernels (issue 20): plain Python that writes the PTX strings,
and the ``tl.constexpr`` globals the kernels read them from.  Moved here from ``_triton_fast`` /
``_triton_soa`` (no change to any string: the compiled kernels are byte-identical).

* the ``prmt`` centroid tables of the key codes in vLLM's bit order: :func:`lut_asm` (per 4 byte
  codes) and :func:`lut_group_asm` (per group of 16 codes);
* the nibble-plane tables (3-bit fields of the block-SoA layout, ``TurboQuantSpec.code_order``):
  :func:`planes_asm`, :func:`planes_key_asm`, :data:`PLANES_VALUE_ASM`, :data:`PLANES_VALUE1024_ASM`;
* the conversions :data:`VALUE4_PTX` (4-bit value codes -> exact fp16 integers) and :data:`FP8_PTX`
  (fp8 e4m3 keys -> fp16, the block-SoA decode's k8v4 path);
* which table a launch uses: :func:`use_lut`, :func:`tk_interpret`, ``_lut_mode``, ``_asm_for``.

The jit helpers that run these tables are in ``_triton_unpack`` (16 codes per thread) and
``_triton_soa_unpack`` (32 codes per thread).
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl

from tqlab.turboquant.codebook import lloyd_max
from tqlab.turboquant.spec import TurboQuantSpec

_LUT_ASM: dict = {}


# ----------------------------------------------------------------------------- centroid table
def _fp16_bits(values) -> list[int]:
    return [int(v) for v in np.asarray(values, dtype=np.float16).view(np.uint16)]


def _word(bs) -> int:
    """Four bytes, little-endian, as one 32-bit PTX immediate (a ``prmt`` table register)."""
    return bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24


def lut_asm(spec: TurboQuantSpec, d: int) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=4)``: four uint8 codes in ``$2`` -> four fp16
    centroids in ``$0, $1`` (two per register), by ``prmt`` lookups in the byte tables of the
    fp16 centroids.  3 bits: one 8-entry table.  4 bits: the 8 positive centroids
    ``c[8..15]`` (``c[i] = -c[15 - i]``, symmetric Lloyd-Max), index ``i ^ 7`` and the sign bit
    set for ``i < 8``.  2 bits: the 4 centroids padded to 8.  (Key presets use 3 and 4 bits.)"""
    key = (spec.key_bits, d)
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    bits = spec.key_bits
    cent = np.asarray(lloyd_max(bits, d).centroids, dtype=np.float64)
    if bits == 4:
        table = cent[8:]
    else:
        table = np.concatenate([cent, np.zeros(8 - len(cent))])
    h = _fp16_bits(table)
    lo = [x & 0xFF for x in h]
    hi = [x >> 8 for x in h]

    lines = ["{", ".reg .b32 x, s, t, l, h, m, f;"]
    if bits == 4:
        # m: 0x07 in each byte whose code is < 8 (negative centroid); index = code ^ 7 there
        lines += ["shr.b32 f, $2, 3;", "and.b32 f, f, 0x01010101;", "xor.b32 f, f, 0x01010101;",
                  "mul.lo.u32 m, f, 7;", "xor.b32 x, $2, m;", "and.b32 x, x, 0x07070707;"]
    else:
        lines += ["and.b32 x, $2, 0x07070707;"]
    lines += [
        "shr.b32 t, x, 4;", "or.b32 s, x, t;",            # byte0 = c0 | c1 << 4, byte2 = c2 | c3 << 4
        "and.b32 t, s, 0xFF;", "shr.b32 s, s, 8;", "and.b32 s, s, 0xFF00;", "or.b32 s, s, t;",
        f"prmt.b32 l, {_word(lo[:4])}, {_word(lo[4:])}, s;",
        f"prmt.b32 h, {_word(hi[:4])}, {_word(hi[4:])}, s;",
        "prmt.b32 $0, l, h, 0x5140;", "prmt.b32 $1, l, h, 0x7362;",
    ]
    if bits == 4:  # sign bit 15 of each fp16 from the per-byte flags f (bit 0 of byte k)
        lines += ["shl.b32 s, f, 15;", "and.b32 l, s, 0x8000;", "shl.b32 s, f, 23;", "and.b32 s, s, 0x80000000;",
                  "or.b32 l, l, s;", "xor.b32 $0, $0, l;",
                  "shr.b32 s, f, 1;", "and.b32 l, s, 0x8000;", "shl.b32 s, f, 7;", "and.b32 s, s, 0x80000000;",
                  "or.b32 l, l, s;", "xor.b32 $1, $1, l;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


def lut_group_asm(spec: TurboQuantSpec, d: int) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=1)``: the 32-bit windows ``$16, $17, ...`` of one
    group of 16 key codes -> their 16 fp16 centroids ``$0 .. $15``, four codes at a time.

    3 bits: a nibble selector cut from the packed bits by shifts and masks, then ``prmt`` lookups
    of the low and high bytes of the 8 fp16 centroids and two ``prmt`` to interleave them.
    4 bits (the nibbles are the selectors): ``prmt`` takes 8 table bytes, so the low 3 bits of each
    code look up both halves of the 16-entry table (codes 0-7 and 8-15) and one more ``prmt`` per
    byte plane picks the half by the code's bit 3 (selector ``0x3210 | (bit 3 << 2)`` per byte):
    13 instructions per 4 codes instead of 24 for the symmetric table with sign fix-up (issue 20)."""
    bits = spec.key_bits
    key = ("group", bits, d)
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    if bits not in (3, 4):
        raise ValueError("group table lookup: 3- or 4-bit keys")
    cent = np.asarray(lloyd_max(bits, d).centroids, dtype=np.float64)
    h = _fp16_bits(cent)
    lo = [x & 0xFF for x in h]
    hi = [x >> 8 for x in h]

    lines = ["{", ".reg .b32 q, s, t, l, h, a, b, r0, r1, tl0, tl1, th0, th1;",
             f"mov.b32 tl0, {_word(lo[:4])};", f"mov.b32 tl1, {_word(lo[4:8])};",
             f"mov.b32 th0, {_word(hi[:4])};", f"mov.b32 th1, {_word(hi[4:8])};"]
    for k in range(4):  # quad k: codes 4k .. 4k+3
        if bits == 3:  # bits 12k .. 12k+11 of the group: window 12k // 16 shifted by 12k % 16
            lines += [f"shr.b32 q, ${16 + 12 * k // 16}, {12 * k % 16};",
                      "and.b32 s, q, 0x7;", "shl.b32 t, q, 1;", "and.b32 t, t, 0x70;", "or.b32 s, s, t;",
                      "shl.b32 t, q, 2;", "and.b32 t, t, 0x700;", "or.b32 s, s, t;",
                      "shl.b32 t, q, 3;", "and.b32 t, t, 0x7000;", "or.b32 s, s, t;",
                      "prmt.b32 l, tl0, tl1, s;", "prmt.b32 h, th0, th1, s;"]
        else:  # low 3 bits index both table halves; bit 3 picks the half, byte by byte
            lines += [f"and.b32 s, ${16 + k}, 0x7777;", f"shr.b32 t, ${16 + k}, 1;", "and.b32 t, t, 0x4444;",
                      "or.b32 t, t, 0x3210;",
                      "prmt.b32 a, tl0, tl1, s;", f"prmt.b32 b, {_word(lo[8:12])}, {_word(lo[12:])}, s;",
                      "prmt.b32 l, a, b, t;",
                      "prmt.b32 a, th0, th1, s;", f"prmt.b32 b, {_word(hi[8:12])}, {_word(hi[12:])}, s;",
                      "prmt.b32 h, a, b, t;"]
        lines += ["prmt.b32 r0, l, h, 0x5140;", "prmt.b32 r1, l, h, 0x7362;",
                  f"mov.b32 {{${4 * k}, ${4 * k + 1}}}, r0;", f"mov.b32 {{${4 * k + 2}, ${4 * k + 3}}}, r1;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


VALUE4_PTX = "\n".join(
    ["{", ".reg .b32 t, r, m;", "mov.b32 m, 0x64006400;"]
    + [line for w in range(2) for k in range(4) for line in (
        ([f"shr.b32 t, ${16 + w}, {4 * k};"] if k else [f"mov.b32 t, ${16 + w};"])
        + ["and.b32 r, t, 0x000F000F;", "or.b32 r, r, m;", "sub.f16x2 r, r, m;",
           f"mov.b32 {{${8 * w + k}, ${8 * w + k + 4}}}, r;"])]
    + ["}"])
"""PTX for ``tl.inline_asm_elementwise(pack=1)``: 4-bit value codes -> exact fp16 integers.  ``$16``
holds codes 0-7 of a group of 16 (nibble ``j`` = code ``j``), ``$17`` codes 8-15; codes ``j`` and
``j + 4`` sit 16 bits apart, so one mask puts both in the low mantissa bits of a half2 under the
exponent of 1024 (``0x6400``): ``(w >> 4k) & 0x000F000F | 0x64006400`` is ``(1024 + c_k, 1024 + c_{k+4})``,
and one ``sub.f16x2`` of 1024 leaves the codes exactly: 2-3 instructions per two codes (issue 20)."""
VALUE4_ASM = tl.constexpr(VALUE4_PTX)  # a jit function may read a global only as a constexpr



# ----------------------------------------------------------------------------- nibble planes

def _plane_selector(half: int, dst: str, lw: str, hw: str) -> list[str]:
    """PTX lines that put the ``prmt`` selector of codes ``8 * half .. 8 * half + 7`` of a nibble-plane half chunk
    into ``dst`` (nibble ``j`` = code ``j``): ``(L & 0x33333333) | (H' & 0x44444444)``, both shifted first for the
    second half (``lw`` = the plane word ``L``, ``hw`` = ``H`` shifted as :func:`planes_asm`'s ``$17``; uses the
    scratch register ``t``)."""
    if half == 0:
        return [f"and.b32 {dst}, {lw}, 0x33333333;", f"and.b32 t, {hw}, 0x44444444;", f"or.b32 {dst}, {dst}, t;"]
    return [f"shr.b32 {dst}, {lw}, 2;", f"and.b32 {dst}, {dst}, 0x33333333;", f"shr.b32 t, {hw}, 1;",
            "and.b32 t, t, 0x44444444;", f"or.b32 {dst}, {dst}, t;"]


def _plane_quads(lw: str, hw: str):
    """The four quads (4 codes each) of a nibble-plane half chunk: yields ``(quad, selector register, PTX lines
    to emit before the quad's lookups)`` -- the selector of codes 0-7 into ``s`` before quad 0, of codes 8-15
    before quad 2 (:func:`_plane_selector`), the upper 4 nibbles moved into ``u`` before quads 1 and 3."""
    for half in range(2):
        yield 2 * half, "s", _plane_selector(half, "s", lw, hw)
        yield 2 * half + 1, "u", ["shr.b32 u, s, 16;"]


def _byte_tables(table16: list[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The low- and high-byte ``prmt`` tables (two 32-bit words each) of 8 fp16 bit patterns."""
    lo, hi = [x & 0xFF for x in table16], [x >> 8 for x in table16]
    return (_word(lo[:4]), _word(lo[4:])), (_word(hi[:4]), _word(hi[4:]))


def planes_asm(table16: list[int] | None) -> str:
    """PTX for ``tl.inline_asm_elementwise(pack=1)`` on a 3-bit field in nibble-plane order
    (``TurboQuantSpec.code_order``): ``$16`` = a plane word ``L`` (``L0`` or ``L1``), ``$17`` = the
    chunk's ``H`` shifted so that code ``j``'s high bit is at bit ``4j + 2`` (``H << 2`` for codes
    0-15 of the chunk, ``H`` for codes 16-31) -> 16 fp16 ``$0 .. $15`` of codes ``0..15`` of that
    half.  The ``prmt`` selector of 8 codes is ``(L & 0x33333333) | (H' & 0x44444444)`` (3 ops; the
    next 8: both shifted right by 2 and 1 first).  ``table16``: the 8 fp16 bit patterns (key
    centroids: low- and high-byte tables, two ``prmt`` to interleave); None = the values' table
    fp16(0..7), whose low bytes are all zero (one ``prmt`` of the high bytes, two against zero)."""
    key = ("planes", None if table16 is None else tuple(table16))
    if key in _LUT_ASM:
        return _LUT_ASM[key]
    lines = ["{", ".reg .b32 s, t, u, l, h, r0, r1, z;", "mov.b32 z, 0;"]
    tlo, thi = _byte_tables(_fp16_bits(np.arange(8)) if table16 is None else table16)
    for quad, sel, pre in _plane_quads("$16", "$17"):
        o = 4 * quad
        lines += pre + [f"prmt.b32 h, {thi[0]}, {thi[1]}, {sel};"]
        if table16 is not None:
            lines += [f"prmt.b32 l, {tlo[0]}, {tlo[1]}, {sel};",
                      "prmt.b32 r0, l, h, 0x5140;", "prmt.b32 r1, l, h, 0x7362;"]
        else:
            lines += ["prmt.b32 r0, h, z, 0x1404;", "prmt.b32 r1, h, z, 0x3424;"]
        lines += [f"mov.b32 {{${o}, ${o + 1}}}, r0;", f"mov.b32 {{${o + 2}, ${o + 3}}}, r1;"]
    lines.append("}")
    _LUT_ASM[key] = "\n".join(lines)
    return _LUT_ASM[key]


def planes_key_asm(spec: TurboQuantSpec, d: int) -> str:
    """:func:`planes_asm` with the fp16 Lloyd-Max centroids of 3-bit keys."""
    if spec.key_bits != 3:
        raise ValueError(f"nibble planes hold 3-bit codes; {spec.name} has {spec.key_bits}-bit keys")
    return planes_asm(_fp16_bits(lloyd_max(3, d).centroids))


def planes_value_pair_ptx() -> str:
    """PTX for ``inline_asm_elementwise(pack=2)`` over two tokens ``A, B`` of a 3-bit nibble-plane value field
    (the Gluon decode's ``V^T`` operand, ``_gluon_decode``): ``$16, $17`` = a plane word ``L`` of ``A`` and ``B``,
    ``$18, $19`` = their ``H`` shifted as ``$17`` of :func:`planes_asm` -> ``$0 .. $15``: code ``j`` of both
    tokens as one half2 register whose halves are fp16 *bit patterns* of the integer code times a power of two,
    no table: ``code_A << s | code_B << (16 + s)`` with ``s = 0, 4, 8, 4`` for ``j % 4 = 0, 1, 2, 3``.  Bit
    patterns below ``0x0800`` are ``bits * 2^-24`` exactly (subnormals and the first binade share that spacing),
    so the half2 holds ``(c_A, c_B) * 2^(s - 24)``: the MMA sums them exactly like the integers, and the decode
    multiplies output row ``j`` by ``2^(24 - s)`` once at the end (:data:`VALUE_PAIR_SHIFT`).  Per two tokens and
    16 codes: 2 selectors per token (as :func:`planes_asm`), 4 ``prmt`` that gather 4 codes of ``A`` in the low
    and of ``B`` in the high half, then 1-2 ops per register: ~1.1 instructions per value (issue 20, round 5)."""
    lines = ["{", ".reg .b32 sa, sb, x, t;"]
    for half in range(2):  # codes 8*half .. 8*half + 7
        lines += _plane_selector(half, "sa", "$16", "$18") + _plane_selector(half, "sb", "$17", "$19")
        for quad, sel in ((0, "0x5410"), (1, "0x7632")):  # nibbles [A 4q .. 4q+3, B 4q .. 4q+3]
            o = 8 * half + 4 * quad
            lines += [f"prmt.b32 x, sa, sb, {sel};",
                      f"and.b32 ${o}, x, 0x000F000F;", f"and.b32 ${o + 1}, x, 0x00F000F0;",
                      f"and.b32 ${o + 2}, x, 0x0F000F00;", "shr.b32 t, x, 8;", f"and.b32 ${o + 3}, t, 0x00F000F0;"]
    lines.append("}")
    return "\n".join(lines)


def planes_key_pair_ptx(spec: TurboQuantSpec, d: int) -> str:
    """:func:`planes_key_asm` for ``inline_asm_elementwise(pack=2)`` with 32-bit outputs: ``$8`` (= ``$9``) a
    plane word ``L``, ``$10`` (= ``$11``) the chunk's shifted ``H`` -> ``$0 .. $7``: the fp16 centroids of codes
    ``2m, 2m + 1`` of the half chunk as one half2 each (the Gluon decode's key A operand: its input words are
    joined with themselves so that the pair of a packed instance is the code parity).  The same selectors and
    ``prmt`` lookups as :func:`planes_asm`, written straight into the output registers."""
    if spec.key_bits != 3:
        raise ValueError(f"nibble planes hold 3-bit codes; {spec.name} has {spec.key_bits}-bit keys")
    tlo, thi = _byte_tables(_fp16_bits(lloyd_max(3, d).centroids))
    lines = ["{", ".reg .b32 s, t, u, l, h;"]
    for quad, sel, pre in _plane_quads("$8", "$10"):
        o = 2 * quad
        lines += pre + [f"prmt.b32 h, {thi[0]}, {thi[1]}, {sel};", f"prmt.b32 l, {tlo[0]}, {tlo[1]}, {sel};",
                        f"prmt.b32 ${o}, l, h, 0x5140;", f"prmt.b32 ${o + 1}, l, h, 0x7362;"]
    lines.append("}")
    return "\n".join(lines)


def key4_pair_ptx(spec: TurboQuantSpec, d: int) -> str:
    """:func:`planes_key_pair_ptx` for 4-bit keys (vLLM's bit stream: code ``j`` of a 32-bit word at bits ``4j``):
    ``$4`` (= ``$5``) one word -> ``$0 .. $3``: the fp16 centroids of codes ``2m, 2m + 1`` of the word as one half2
    each.  The lookups of :func:`lut_group_asm`'s 4-bit path (the low 3 bits of each code index both halves of the
    16-entry table, one more ``prmt`` per byte plane picks the half by bit 3), written straight into the outputs:
    13 instructions per 4 codes."""
    if spec.key_bits != 4:
        raise ValueError(f"key4_pair_ptx reads 4-bit codes; {spec.name} has {spec.key_bits}-bit keys")
    h = _fp16_bits(lloyd_max(4, d).centroids)
    lo, hi = [x & 0xFF for x in h], [x >> 8 for x in h]
    lines = ["{", ".reg .b32 q, s, t, a, b, l, h;"]
    for quad in range(2):  # codes 4 quad .. 4 quad + 3 of the word
        lines += ["mov.b32 q, $4;"] if quad == 0 else ["shr.b32 q, $4, 16;"]
        lines += ["and.b32 s, q, 0x7777;", "shr.b32 t, q, 1;", "and.b32 t, t, 0x4444;", "or.b32 t, t, 0x3210;"]
        for tab, out in ((lo, "l"), (hi, "h")):
            lines += [f"prmt.b32 a, {_word(tab[:4])}, {_word(tab[4:8])}, s;",
                      f"prmt.b32 b, {_word(tab[8:12])}, {_word(tab[12:])}, s;", f"prmt.b32 {out}, a, b, t;"]
        lines += [f"prmt.b32 ${2 * quad}, l, h, 0x5140;", f"prmt.b32 ${2 * quad + 1}, l, h, 0x7362;"]
    lines.append("}")
    return "\n".join(lines)


def key3_nibble_pair_ptx(spec: TurboQuantSpec, d: int) -> str:
    """:func:`key4_pair_ptx` for 3-bit keys spread to 4-bit pitch (code ``j`` of a 32-bit word at bits ``4j .. 4j + 2``,
    bit ``4j + 3`` zero: ``_gluon_vllm_decode._spread`` of vLLM's 3-bit stream): ``$4`` (= ``$5``) one word -> ``$0 ..
    $3``, the fp16 centroids of codes ``2m, 2m + 1`` as one half2 each.  A code is a ``prmt`` byte selector of the
    8-entry table as it stands (``prmt`` reads the low 16 bits of the selector): 5 instructions per 4 codes."""
    if spec.key_bits != 3:
        raise ValueError(f"key3_nibble_pair_ptx reads 3-bit codes; {spec.name} has {spec.key_bits}-bit keys")
    h = _fp16_bits(lloyd_max(3, d).centroids)
    lo, hi = [x & 0xFF for x in h], [x >> 8 for x in h]
    lines = ["{", ".reg .b32 q, l, h;"]
    for quad in range(2):  # codes 4 quad .. 4 quad + 3 of the word
        lines += ["mov.b32 q, $4;"] if quad == 0 else ["shr.b32 q, $4, 16;"]
        for tab, out in ((lo, "l"), (hi, "h")):
            lines += [f"prmt.b32 {out}, {_word(tab[:4])}, {_word(tab[4:8])}, q;"]
        lines += [f"prmt.b32 ${2 * quad}, l, h, 0x5140;", f"prmt.b32 ${2 * quad + 1}, l, h, 0x7362;"]
    lines.append("}")
    return "\n".join(lines)


VALUE_PAIR_SHIFT = (0, 4, 8, 4)
"""``s`` of :func:`planes_value_pair_ptx` for code ``j % 4`` of a quad."""
PLANES_VALUE_PAIR_ASM = tl.constexpr(planes_value_pair_ptx())


def value4_pair_ptx() -> str:
    """:func:`planes_value_pair_ptx` for 4-bit value codes (vLLM's bit stream: code ``j`` of a word at bits
    ``4j .. 4j + 3``): ``$16, $17`` = word 0 (codes 0..7 of a half chunk) of tokens ``A, B``, ``$18, $19`` = word 1
    (codes 8..15) -> ``$0 .. $15``: ``code_A << s | code_B << (16 + s)`` with ``s = 0, 4, 4, 4`` for ``j % 4 = 0, 1,
    2, 3`` (:data:`VALUE4_PAIR_SHIFT`; a 4-bit code shifted by 8 would leave the exact ``bits * 2^-24`` range
    below ``0x0800``).  Per two tokens and 16 codes: 4 ``prmt`` and 1-2 ops per register (~0.9 per value)."""
    lines = ["{", ".reg .b32 x, t;"]
    for w, (a, b) in enumerate((("$16", "$17"), ("$18", "$19"))):
        for quad, sel in ((0, "0x5410"), (1, "0x7632")):  # nibbles [A 4q .. 4q+3, B 4q .. 4q+3]
            o = 8 * w + 4 * quad
            lines += [f"prmt.b32 x, {a}, {b}, {sel};",
                      f"and.b32 ${o}, x, 0x000F000F;", f"and.b32 ${o + 1}, x, 0x00F000F0;",
                      "shr.b32 t, x, 4;", f"and.b32 ${o + 2}, t, 0x00F000F0;",
                      "shr.b32 t, x, 8;", f"and.b32 ${o + 3}, t, 0x00F000F0;"]
    lines.append("}")
    return "\n".join(lines)


VALUE4_PAIR_SHIFT = (0, 4, 4, 4)
"""``s`` of :func:`value4_pair_ptx` for code ``j % 4``."""
VALUE4_PAIR_ASM = tl.constexpr(value4_pair_ptx())


# the values' tables, globals the kernels read as constexprs: fp16(0..7) (the SoA decode's MMA operand) and
# the bits 0x6400 | code = fp16(1024 + code) (the fast dequant's, which subtracts 1024 as for the other fields)
PLANES_VALUE_ASM = tl.constexpr(planes_asm(None))
PLANES_VALUE1024_ASM = tl.constexpr(planes_asm([0x6400 | c for c in range(8)]))


# ----------------------------------------------------------------------------- fp8 keys
FP8_PTX = "\n".join(
    ["{", ".reg .b16 l, h;", ".reg .b32 r;"]
    + [line for w in range(4) for line in (
        f"mov.b32 {{l, h}}, ${16 + w};", "cvt.rn.f16x2.e4m3x2 r, l;", f"mov.b32 {{${4 * w}, ${4 * w + 1}}}, r;",
        "cvt.rn.f16x2.e4m3x2 r, h;", f"mov.b32 {{${4 * w + 2}, ${4 * w + 3}}}, r;")]
    + ["}"])
"""PTX: four 32-bit words of fp8 e4m3 key bytes (``$16 .. $19``, codes ``4w .. 4w+3`` in word ``w``, little
endian) -> their 16 fp16 values in code order, two per ``cvt.rn.f16x2.e4m3x2`` (exact: every e4m3 value is
an fp16 value)."""
FP8_ASM = tl.constexpr(FP8_PTX)


# ----------------------------------------------------------------------------- which table a launch uses
def _lut_mode(spec: TurboQuantSpec, device, lut, cfg) -> int:
    """0 (polynomial), 1 or 2 (``prmt`` tables): the table only where PTX runs and keys are 3/4-bit."""
    if lut is None:
        lut = cfg.get("lut", 2)
    return int(lut) if lut and use_lut(spec, device) else 0


def _asm_for(spec: TurboQuantSpec, d: int, lut: int) -> str:
    """The key table asm for ``LUT``: 2 = per group of 16 codes (:func:`planes_key_asm` where the key
    field is in nibble-plane order, ``TurboQuantSpec.code_order``), 1 = per 4 byte codes, 0 = none."""
    if lut == 2 and not spec.key_fp8 and spec.code_order("key_idx", d) == "planes":
        return planes_key_asm(spec, d)
    return {0: "", 1: lut_asm, 2: lut_group_asm}[lut](spec, d) if lut else ""


def use_lut(spec: TurboQuantSpec, device: torch.device) -> bool:
    """The ``prmt`` table needs PTX (a CUDA device, not the interpreter) and MSE keys."""
    return torch.device(device).type == "cuda" and spec.key_bits in (3, 4) and not tk_interpret()


def tk_interpret() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
