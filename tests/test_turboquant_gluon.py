"""The Gluon block-SoA decode (``tqlab.turboquant._gluon_decode``, issue 20 round 5) and its routing.

CPU: its PTX programs (``ptx_tables.planes_key_pair_ptx``, ``key4_pair_ptx``, ``planes_value_pair_ptx``,
``value4_pair_ptx``) run by the PTX emulator give every code's fp16 centroid pair / scaled integer pair, and
``ops.decode_kernel_name`` reports the routing rule.  GPU: the kernel (the rotated presets 3bit_nc, k3v4_nc,
4bit_nc) against the torch reference on the same block-SoA cache (uneven splits whose starts are not 16-aligned,
empty and one-token requests, GQA 1 / 4 / 8), ``mid_out`` included, and ``ops.decode_attention`` routes to it only
for the rotated presets (4 warps per program below one program per SM, 2 from there on).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_turboquant_triton's PTX emulator

from tqlab.turboquant import TQ_PRESETS, decode_attention, get_spec, kv_cache_shape, store_kv
from tqlab.turboquant import ptx_tables as pt
from tqlab.turboquant.codebook import lloyd_max
from tqlab.turboquant.ops import decode_kernel_name
from tqlab.turboquant.quant import planes_from_codes

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _chunks(n: int, seed: int):
    """``n`` random 32-code chunks and their nibble-plane words ``L0, L1, H`` (python ints)."""
    codes = torch.randint(0, 8, (n, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    words = planes_from_codes(codes).view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    return codes.numpy(), [tuple(int(x) for x in w) for w in words]


def test_key_pair_ptx_gives_centroid_pairs():
    """``planes_key_pair_ptx``: output ``m`` of a half chunk = the fp16 centroids of codes ``2m`` (low half) and
    ``2m + 1`` (high half), for both halves of 24 random chunks; 4-bit keys refused."""
    from test_turboquant_triton import _ptx_emulate

    cent = np.asarray(lloyd_max(3, 128).centroids, dtype=np.float16).view(np.uint16)
    asm = pt.planes_key_pair_ptx(TQ_PRESETS["turboquant_3bit_nc"], 128)
    codes, words = _chunks(24, 7)
    for c, (l0, l1, h) in zip(codes, words):
        for half, (lw, hw) in enumerate(((l0, (h << 2) & 0xFFFFFFFF), (l1, h))):
            r = _ptx_emulate(asm, {"$8": lw, "$9": lw, "$10": hw, "$11": hw})
            for m in range(8):
                lo, hi = c[16 * half + 2 * m], c[16 * half + 2 * m + 1]
                assert r[f"${m}"] == int(cent[lo]) | int(cent[hi]) << 16, (half, m)
    with pytest.raises(ValueError, match="3-bit codes; turboquant_4bit_nc has 4-bit keys"):
        pt.planes_key_pair_ptx(TQ_PRESETS["turboquant_4bit_nc"], 128)


def test_key4_pair_ptx_gives_centroid_pairs():
    """``key4_pair_ptx``: output ``m`` of a word of 4-bit codes = the fp16 centroids of codes ``2m`` (low half) and
    ``2m + 1`` (high half); 3-bit keys refused."""
    from test_turboquant_triton import _ptx_emulate

    cent = np.asarray(lloyd_max(4, 128).centroids, dtype=np.float16).view(np.uint16)
    asm = pt.key4_pair_ptx(TQ_PRESETS["turboquant_4bit_nc"], 128)
    g = np.random.default_rng(5)
    for _ in range(32):
        c = g.integers(0, 16, 8)
        r = _ptx_emulate(asm, {"$4": sum(int(x) << (4 * i) for i, x in enumerate(c)), "$5": 0})
        assert [r[f"${m}"] for m in range(4)] == [int(cent[c[2 * m]]) | int(cent[c[2 * m + 1]]) << 16 for m in range(4)]
    with pytest.raises(ValueError, match="reads 4-bit codes; turboquant_3bit_nc has 3-bit keys"):
        pt.key4_pair_ptx(TQ_PRESETS["turboquant_3bit_nc"], 128)


def test_value_pair_ptx_gives_scaled_code_pairs():
    """``PLANES_VALUE_PAIR_ASM`` on two tokens' words: output ``j`` = code ``j`` of token A in the low half and of
    token B in the high half, each as the fp16 bit pattern ``code << s`` (``s = VALUE_PAIR_SHIFT[j % 4]``), and
    every such pattern is exactly ``code * 2^(s - 24)`` (the kernel's per-row rescale undoes it)."""
    from test_turboquant_triton import _ptx_emulate

    asm = pt.PLANES_VALUE_PAIR_ASM.value
    codes, words = _chunks(24, 8)
    for t in range(0, 24, 2):
        for half in range(2):
            hw = [(w[2] << 2) & 0xFFFFFFFF if half == 0 else w[2] for w in (words[t], words[t + 1])]
            r = _ptx_emulate(asm, {"$16": words[t][half], "$17": words[t + 1][half], "$18": hw[0], "$19": hw[1]})
            for j in range(16):
                s = pt.VALUE_PAIR_SHIFT[j % 4]
                a, b = int(codes[t][16 * half + j]), int(codes[t + 1][16 * half + j])
                assert r[f"${j}"] == a << s | b << (16 + s), (t, half, j)
    for s in set(pt.VALUE_PAIR_SHIFT):
        bits = np.array([c << s for c in range(8)], dtype=np.uint16)
        assert bits.view(np.float16).astype(np.float64).tolist() == [c * 2.0 ** (s - 24) for c in range(8)]


def test_value4_pair_ptx_gives_scaled_code_pairs():
    """``VALUE4_PAIR_ASM`` on two tokens' two words of 4-bit codes (vLLM's bit stream, code ``j`` at bits ``4j``):
    output ``j`` = ``code_A << s | code_B << (16 + s)``, ``s = VALUE4_PAIR_SHIFT[j % 4]``, each half an exact
    ``code * 2^(s - 24)``."""
    from test_turboquant_triton import _ptx_emulate

    g = np.random.default_rng(4)
    for _ in range(24):
        a, b = g.integers(0, 16, 16), g.integers(0, 16, 16)
        word = [[sum(int(x[8 * w + i]) << (4 * i) for i in range(8)) for w in range(2)] for x in (a, b)]
        r = _ptx_emulate(pt.VALUE4_PAIR_ASM.value, {"$16": word[0][0], "$17": word[1][0], "$18": word[0][1],
                                                     "$19": word[1][1]})
        for j in range(16):
            s = pt.VALUE4_PAIR_SHIFT[j % 4]
            assert r[f"${j}"] == int(a[j]) << s | int(b[j]) << (16 + s), j
    for s in set(pt.VALUE4_PAIR_SHIFT):
        bits = np.array([c << s for c in range(16)], dtype=np.uint16)
        assert bits.view(np.float16).astype(np.float64).tolist() == [c * 2.0 ** (s - 24) for c in range(16)]


def test_launch_warps_rule_and_refusals():
    """Warps per program: 2 from one program per SM on, 4 below (``launch.SOA_DEFAULTS["gluon_decode"]``); the
    kernel's entry point refuses a bad warp count and any call ``use_gluon`` does not serve (here: CPU tensors) with
    a ValueError naming it, before any launch."""
    from tqlab.turboquant import _gluon_decode as gd

    assert [gd.launch_warps(p, 132) for p in (1, 131, 132, 4096)] == [4, 4, 2, 2]
    spec = get_spec("turboquant_3bit_nc", cache_layout="block_soa")
    cache = torch.zeros(kv_cache_shape(4, 1, 16, 128, spec), dtype=torch.uint8)
    q, bt, sl = torch.zeros(1, 4, 128), torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    mid, out, lse = torch.zeros(1, 4, 2, 129), torch.full((1, 4, 128), 7.0), torch.zeros(1, 4)
    for nw in (3, 16, 0, True):
        with pytest.raises(ValueError, match=f"num_warps must be 1, 2, 4 or 8, got {nw!r}"):
            gd.decode_attention(q, cache, bt, sl, spec, 0.1, mid, out, lse, num_warps=nw)
    with pytest.raises(ValueError, match="does not serve turboquant_3bit_nc on block_soa with head_dim 128, GQA 4"):
        gd.decode_attention(q, cache, bt, sl, spec, 0.1, mid, out, lse)
    assert (out == 7.0).all()  # nothing written
    assert not gd.use_gluon(spec, cache, 128, 4)


def test_gluon_needs_triton_3_6():
    """``routing.gluon_available``: False for a Triton before 3.6 (whatever its ``experimental.gluon`` holds), so the
    Triton block-SoA decode serves; with this Triton it is the presence of ``triton.experimental.gluon``."""
    from unittest import mock

    import triton

    from tqlab.turboquant import routing

    assert routing.MIN_GLUON_TRITON == (3, 6)
    for old in ("3.5.1", "3.4.0", "2.3.0"):
        with mock.patch.object(triton, "__version__", old):
            assert routing.gluon_available() is False, old
    with mock.patch.object(triton, "__version__", "3.6.0"):
        assert routing.gluon_available() is (importlib.util.find_spec("triton.experimental.gluon") is not None)


def test_decode_kernel_name_reports_the_torch_and_portable_paths():
    """Without CUDA: the torch reference for ``"torch"``, the portable kernel under the interpreter."""
    spec = get_spec("turboquant_3bit_nc", cache_layout="block_soa")
    cache = torch.zeros(kv_cache_shape(4, 1, 16, 128, spec), dtype=torch.uint8)
    q = torch.zeros(1, 4, 128)
    assert decode_kernel_name(q, cache, spec, backend="torch") == "torch"
    if not torch.cuda.is_available():
        assert decode_kernel_name(q, cache, spec, backend="triton") == "portable"


@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"])
def test_gluon_kernel_compiles_for_sm90_with_registers_only_in_the_loop(name):
    """No GPU needed: ``benchmarks/_sass_sm90.py`` compiles the Gluon decode for sm_90 (2 warps, the launch's
    constexprs) with the local Triton and ptxas: the layouts and shapes are consistent, nothing spills, the loop has
    no shared-memory traffic and exactly 32 HMMA per warp and step (16 for the scores, 16 for ``P V``)."""
    import re
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import _sass_sm90 as ss
    finally:
        sys.path.pop(0)
    if not (ss._BIN / "nvdisasm").exists():
        pytest.skip(f"no nvdisasm in this Triton ({ss._BIN})")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tqlab_sass_{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # this module interprets kernels on CPU
    env["PYTHONPATH"] = str(bench.parent)
    res = subprocess.run([sys.executable, str(bench / "_sass_sm90.py"), "--gluon", "2", "--maxnreg", "0", "--preset",
                          name, "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(name + ":"))
    assert re.search(r"stack 0 B,.*\(STS 0, LDS 0, LDSM 0, LDL 0, STL 0\);.*local_alloc 0$", line), line
    loop = dict(ss.loop_ops((out / f"gluon_decode_{name.removeprefix('turboquant_')}.sass").read_text())["loop_opcodes"])
    assert loop.get("HMMA", 0) == 32, loop


def _case(name, hq, hk, seq, d=128, bs=16, seed=3):
    soa = get_spec(name, cache_layout="block_soa")
    b = len(seq)
    per = -(-max(seq) // bs) + 3
    nb = b * per
    g = torch.Generator().manual_seed(seed)
    cache = torch.zeros(kv_cache_shape(nb, hk, bs, d, soa), dtype=torch.uint8, device=DEV)
    n = nb * bs
    store_kv(cache, torch.randn(n, hk, d, generator=g).to(DEV), (torch.randn(n, hk, d, generator=g) * 2 + 0.5).to(DEV),
             torch.randperm(n, generator=g).to(DEV), soa)
    bt = torch.randperm(nb, generator=g).view(b, per).to(torch.int32).to(DEV)
    q = torch.randn(b, hq, d, generator=g).to(DEV, torch.bfloat16)
    return soa, cache, bt, q, torch.tensor(seq, device=DEV)


def _run(fn, q, splits, d=128):
    b, hq, _ = q.shape
    mid = torch.full((b, hq, splits, d + 1), float("nan"), device=DEV)
    out = torch.full((b, hq, d), float("nan"), device=DEV, dtype=q.dtype)
    lse = torch.full((b, hq), float("nan"), device=DEV)
    fn(mid, out, lse)
    return mid, out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_4bit_nc"])
@pytest.mark.parametrize("hq,hk,bs", [(8, 2, 16), (16, 2, 16), (2, 2, 16), (12, 2, 32), (4, 2, 64)])
def test_gpu_gluon_decode_matches_reference(hq, hk, bs, name):
    """The Gluon kernel called directly, against the torch reference on the same block-SoA cache: an empty
    request, one token, splits of 334 tokens (starts not 16-aligned), a split count above the tokens, GQA
    ``hq / hk`` (1, 2, 4, 6, 8), blocks of 16, 32 and 64 tokens (several 16-token groups per block); every
    ``mid_out`` split partial (output columns and LSE, ``-inf`` for empty splits) and the reduced output to fp16
    rounding."""
    from tqlab.turboquant import _gluon_decode as gd

    soa, cache, bt, q, seq = _case(name, hq, hk, [0, 1, 1000, 2999], bs=bs)
    assert gd.use_gluon(soa, cache, 128, hq // hk)
    ref = _run(lambda m, o, s: decode_attention(q, cache, bt, seq, soa, 128**-0.5, m, o, s, backend="torch"), q, 3)
    got = _run(lambda m, o, s: gd.decode_attention(q, cache, bt, seq, soa, 128**-0.5, m, o, s), q, 3)
    (m0, o0, l0), (m1, o1, l1) = ref, got
    assert not torch.isnan(m1).any() and not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.equal(torch.isinf(m0[..., -1]), torch.isinf(m1[..., -1]))  # the same empty splits
    live = ~torch.isinf(m0[..., -1])
    assert torch.allclose(m0[live], m1[live], atol=1e-2, rtol=2e-3)
    assert torch.allclose(o0.float(), o1.float(), atol=1e-2, rtol=2e-3)
    assert torch.isinf(l1[0]).all() and torch.allclose(l0[1:], l1[1:], atol=1e-2, rtol=2e-3)


@pytest.mark.gpu
def test_gpu_decode_routes_rotated_presets_to_gluon():
    """``ops.decode_attention`` on block-SoA takes the Gluon kernel for the rotated presets (4 warps below one program
    per SM, 2 from there on) and the Triton block-SoA decode for fp8 keys (k8v4); both warp counts agree with the
    torch reference."""
    from tqlab.turboquant import _gluon_decode as gd

    soa, cache, bt, q, seq = _case("turboquant_3bit_nc", 8, 2, [700, 1500, 40])
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    for s, warps in ((-(-sms // 6), 2), (2, 4)):  # B * Hk = 6 programs per split
        assert decode_kernel_name(q, cache, soa) == "gluon", s
        st: dict = {}
        got = _run(lambda m, o, x: gd.decode_attention(q, cache, bt, seq, soa, 128**-0.5, m, o, x, stats=st), q, s)
        assert st["num_warps"] == warps, s
        ref = _run(lambda m, o, x: decode_attention(q, cache, bt, seq, soa, 128**-0.5, m, o, x, backend="torch"), q, s)
        via_ops = _run(lambda m, o, x: decode_attention(q, cache, bt, seq, soa, 128**-0.5, m, o, x), q, s)
        assert torch.equal(got[1], via_ops[1]) and torch.equal(got[2], via_ops[2])
        assert torch.allclose(ref[1].float(), got[1].float(), atol=1e-2, rtol=2e-3)
        assert torch.allclose(ref[2], got[2], atol=1e-2, rtol=2e-3)
    for name, want in (("turboquant_k3v4_nc", "gluon"), ("turboquant_4bit_nc", "gluon"),
                       ("turboquant_k8v4", "block_soa")):
        other = get_spec(name, cache_layout="block_soa")
        c = torch.zeros(kv_cache_shape(bt.numel(), 2, 16, 128, other), dtype=torch.uint8, device=DEV)
        assert decode_kernel_name(q, c, other) == want, name
    with pytest.raises(ValueError, match="does not serve turboquant_k8v4"):
        gd.decode_attention(q, c, bt, seq, other, 0.1, *_run(lambda m, o, x: None, q, 2))
