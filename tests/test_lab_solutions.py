"""The exercises' references (tqlab/lab/solutions) and the solutions the notebooks show: exact values, and the
shown solution code agrees with the reference on every case the notebook checks."""

import re
from pathlib import Path

import pytest
import torch

from tqlab.lab.environment import environment, environment_rows
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb01, nb02, nb03, nb04, nb12

R = "nemotron-3-super-120b-a12b"
TQ = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_nb01_references_exact():
    dec = [((2, 3, 4, 6), torch.float32), ((2, 3, 5), torch.bfloat16), ((2, 3), torch.float32)]
    assert nb01.view_offsets(dec) == [0, 768, 1024]
    assert nb01.call_bytes(dec) == 1280
    assert nb01.growth_peak(1000, 3000, "free_then_allocate") == 3072
    assert nb01.growth_peak(1000, 3000, "allocate_then_free") == 1024 + 3072
    assert nb01.dbo_slot_sizes([(0, 100), (1, 1000), (0, 50)]) == [256, 1024]
    # vLLM 0.34's get_retained: the tail survives scratch below its start, not scratch into it, not another key,
    # not a reallocation; same key and start but another size counts as intact (vLLM compares (key, start))
    assert nb01.retained_flags([("retained", "kv", 4096), ("scratch", 8192), ("retained", "kv", 4096)], 65536) == [
        False, True]
    assert nb01.retained_flags([("retained", "kv", 4096), ("scratch", 61441), ("retained", "kv", 4096)], 65536) == [
        False, False]
    assert nb01.retained_flags([("retained", "a", 100), ("retained", "b", 100), ("retained", "a", 100)], 1000) == [
        False, False, False]
    assert nb01.retained_flags([("retained", "kv", 1000), ("retained", "kv", 900), ("retained", "kv", 600)], 4096) == [
        False, True, False]
    assert nb01.retained_flags([("retained", "kv", 512), ("scratch", 5000), ("retained", "kv", 512)], 4096) == [
        False, False]


def test_nb12_references_exact():
    assert nb12.new_call_sites(["a.py:f", "b.py:g"], ["b.py:g", "c.py:h", "a.py:f2"]) == ["a.py:f2", "c.py:h"]
    assert nb12.retained_start(65536, 4096) == 61440 and nb12.retained_start(1000, 100) == 768
    assert nb12.retained_start(1024, 5000) == 0  # the span grows the slot to exactly its bytes
    assert [nb12.jit_warmup_before_capture(v, r) for v, r in (("0.33", False), ("0.33", True), ("0.34", False))] == [
        False, True, True]


def test_nb02_nb03_references_exact():
    assert [nb02.kv_heads_per_rank(k, tp) for k, tp in ((2, 8), (8, 2), (8, 8))] == [1, 4, 1]
    assert nb02.decode_scratch_bytes(4, 4, 128, 32) == 268_544  # the report's "0.26 MB"
    assert nb02.continuation_bytes(4096, 1, 128, 16) == 2 * 2**20  # the report's "2.00 MB"
    assert nb02.fits_after_lock("nemotron-3-super-120b-a12b", 4096, 4096, 268_544) is False
    assert nb02.fits_after_lock("nemotron-3-super-120b-a12b", 4096, 100, 268_544) is True
    assert nb03.reservation_bytes("nemotron-3-super-120b-a12b") == 64 * 2**20
    assert nb03.continuation_alloc_len(131072, 16) == 131072 and nb03.continuation_alloc_len(4097, 2080) == 4160
    assert [nb03.reserves_continuation(*a) for a in ((True, 4096), (True, 128), (True, 129), (False, 131072))] == [
        True, False, True, False]
    assert [nb03.first_failing_prompt_no_fix(m) for m in (4096, 2048)] == [4225, 2177]


def test_nb04_references_exact():
    assert nb04.slot_bytes("turboquant_3bit_nc", 128) == 102 and nb04.slot_bytes("turboquant_k8v4", 128) == 128 + 68
    assert abs(nb04.compression_vs_fp16("turboquant_3bit_nc", 128) - 512 / 102) < 1e-12
    assert nb04.packed_index_bytes(128, 3) == 48 and nb04.packed_index_bytes(40, 3) == 15
    assert nb04.continuation_vs_packed(300, 1, 128, 16, "turboquant_3bit_nc") == (300 * 102, 2 * 304 * 128 * 2)


def _shown_solutions(stem: str) -> dict[str, str]:
    """{function name: source} of every ```python block inside a <details><summary>Solution</summary> cell."""
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    out = {}
    for block in re.findall(r"<summary>Solution</summary>\n#\n# ```python\n(.*?)\n# ```", text, re.S):
        src = "\n".join(line[2:] if line.startswith("# ") else line[1:] for line in block.splitlines())
        out[re.search(r"def (\w+)\(", src).group(1)] = src
    return out


@pytest.mark.parametrize("stem, module, cases", [
    ("01_workspace_buffer_layouts", nb01, {
        "view_offsets": [([((2, 3, 4, 6), torch.float32), ((2, 3, 5), torch.bfloat16)],),
                         ([((1,), torch.uint8), ((257,), torch.uint8), ((3,), torch.uint8)],)],
        "call_bytes": [([((5,), torch.float16), ((300,), torch.uint8)],)],
        "growth_peak": [(1000, 3000, "free_then_allocate"), (64, 4096, "allocate_then_free")],
        "dbo_slot_sizes": [([(0, 4096), (1, 1024)],), ([(1, 300), (1, 10)],)],
        "retained_flags": [([("retained", "k", 300), ("scratch", 700), ("retained", "k", 300)], 2048),
                           ([("scratch", 9000), ("retained", "k", 4000), ("retained", "k", 4100)], 1024)],
    }),
    ("02_reproduce_locked_workspace", nb02, {
        "kv_heads_per_rank": [(2, 8), (8, 2), (8, 1)],
        "decode_scratch_bytes": [(4, 4, 128, 32), (3, 5, 64, 8)],
        "continuation_bytes": [(4096, 1, 128, 16), (1000, 2, 64, 2080), (7, 1, 16, 16)],
        "fits_after_lock": [(R, 4096, 4096, 268_544), (R, 4096, 128, 268_544), (R, 0, 4096, 1), (R, 64, 200, 2**17)],
    }),
    ("03_apply_the_fix", nb03, {
        "reservation_bytes": [(p,) for p in ("nemotron-3-super-120b-a12b", "qwen3-32b", "gemma-2-9b")],
        "continuation_alloc_len": [(131072, 16), (1, 16), (100, 33)],
        "reserves_continuation": [(True, 129), (True, 128), (False, 131072)],
        "first_failing_prompt_no_fix": [(4096,), (1024,)],
    }),
    ("12_vllm_0_34_what_changed", nb12, {
        "new_call_sites": [(["a:f"], ["a:f", "b:g"]), (["a:f", "c:h"], [])],
        "retained_start": [(4096, 1000), (300, 600), (65536, 1)],
        "jit_warmup_before_capture": [("0.33", False), ("0.34", False), ("0.33", True)],
    }),
    ("04_turboquant_kv_cache", nb04, {
        "slot_bytes": [(p, d) for p in TQ for d in (16, 96, 128)],
        "compression_vs_fp16": [(p, 256) for p in TQ],
        "packed_index_bytes": [(64, 2), (72, 3), (16, 4)],
        "continuation_vs_packed": [(17, 2, 64, 16, "turboquant_k3v4_nc"), (4096, 1, 128, 2080, "turboquant_k8v4")],
    }),
])
def test_shown_solutions_match_references(stem, module, cases):
    import math

    from tqlab.core.config import EngineConfig
    from tqlab.core.reservation import (CONTINUATION_DECODE_THRESHOLD, continuation_workspace_shapes,
                                        decode_workspace_shapes)
    from tqlab.core.workspace import ALIGNMENT, compute_layout, round_up
    from tqlab.turboquant import get_spec

    shown = _shown_solutions(stem)
    assert set(shown) == set(cases)
    for name, src in shown.items():
        ns = {"math": math, "ALIGNMENT": ALIGNMENT, "round_up": round_up, "torch": torch, "EngineConfig": EngineConfig,
              "CONTINUATION_DECODE_THRESHOLD": CONTINUATION_DECODE_THRESHOLD, "compute_layout": compute_layout,
              "continuation_workspace_shapes": continuation_workspace_shapes,
              "decode_workspace_shapes": decode_workspace_shapes, "get_spec": get_spec}
        exec(src, ns)
        assert check(name, ns[name], getattr(module, name), cases[name], verbose=False).passed, name


def test_environment_facts():
    env = environment()
    assert env["torch"] == torch.__version__ and env["cuda"] == torch.cuda.is_available()
    rows = environment_rows(dict(env, cuda=False, gpu=None, vllm_parity=None))
    assert rows[2] == ("CUDA", "not available", "GPU cells show recorded runs under a banner")
    assert rows[3][1] == "not found" and "recorded" in rows[3][2]


@pytest.mark.parametrize("stem, module", [("01_workspace_buffer_layouts", nb01), ("02_reproduce_locked_workspace", nb02),
                                          ("03_apply_the_fix", nb03), ("04_turboquant_kv_cache", nb04),
                                          ("12_vllm_0_34_what_changed", nb12)])
def test_notebook_cases_pass_with_the_shown_solutions(stem, module):
    """Every exercise's own cases (the ``check(...)`` line of the notebook) run through the reference without an
    error, and the solution the notebook shows passes them: an attempted exercise never crashes the lecture."""
    import math

    from tqlab.core.config import EngineConfig
    from tqlab.core.reservation import (CONTINUATION_DECODE_THRESHOLD, continuation_workspace_shapes,
                                        decode_workspace_shapes)
    from tqlab.core.workspace import ALIGNMENT, MiB, compute_layout, round_up
    from tqlab.turboquant import TQ_PRESETS, get_spec

    c = EngineConfig.from_preset(R)
    ns = {"torch": torch, "math": math, "MiB": MiB, "PRESET": R, "TQ_PRESETS": TQ_PRESETS, "get_spec": get_spec,
          "CONTINUATION_DECODE_THRESHOLD": CONTINUATION_DECODE_THRESHOLD, "ALIGNMENT": ALIGNMENT,
          "round_up": round_up, "compute_layout": compute_layout, "EngineConfig": EngineConfig,
          "continuation_workspace_shapes": continuation_workspace_shapes,
          "decode_workspace_shapes": decode_workspace_shapes,
          "real": decode_workspace_shapes(c.max_num_seqs, c.num_heads_per_rank, c.head_dim,
                                          c.tq_max_kv_splits_for_cuda_graph, c.dtype)}
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    calls = re.findall(r'check\("(\w+)", \w+, solutions\.\w+, (.*?)(?:, rel_tol=([^)]*))?\)\n', text, re.S)
    shown = _shown_solutions(stem)
    assert sorted(name for name, _, _ in calls) == sorted(shown) and len(calls) >= 3
    for name, cases, tol in calls:
        exec(shown[name], ns)
        r = check(name, ns[name], getattr(module, name), eval(cases, ns), float(tol or 0), verbose=False)
        assert r.passed, (name, r.failures)


def test_interpreter_store_check_runs_the_triton_kernel_on_cpu():
    pytest.importorskip("triton")
    from tqlab.lab.kernel_checks import interpreter_store_check

    r = interpreter_store_check("turboquant_k3v4_nc", tokens=16, head_dim=32)
    assert (r["identical"], r["differing"]) == (True, 0) and r["bytes"] > 0
    with pytest.raises(RuntimeError, match="failed"):
        interpreter_store_check("not_a_preset")


def test_show_environment_selects_and_states_the_version(capsys):
    from tqlab.core import vllm_versions
    from tqlab.lab.environment import parity_venv_names, show_environment

    try:
        for name in vllm_versions.SUPPORTED:
            env = show_environment(vllm=name)
            assert env["vllm"] == name and vllm_versions.current().name == name
            assert f"This notebook shows vLLM {name}" in capsys.readouterr().out
        assert parity_venv_names("0.33") == (".venv-parity",) and parity_venv_names("0.34") == (".venv-parity-0.34",)
        with pytest.raises(ValueError, match="0.99"):
            show_environment(vllm="0.99")
        assert vllm_versions.current().name == vllm_versions.SUPPORTED[-1]  # a bad version leaves the choice
        rows = environment_rows(dict(environment("0.34"), vllm_parity=None))
        assert rows[3][0] == "vLLM 0.34 (parity env)" and rows[3][1] == "not found"
    finally:
        vllm_versions.reset()
