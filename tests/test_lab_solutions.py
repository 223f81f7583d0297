"""The exercises' references (tqlab/lab/solutions) and the solutions the notebooks show: exact values, and the
shown solution code agrees with the reference on every case the notebook checks."""

import re
from pathlib import Path

import pytest
import torch

from tqlab.lab.environment import environment, environment_rows
from tqlab.lab.exercises import check
from tqlab.lab.solutions import nb01

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_nb01_references_exact():
    dec = [((2, 3, 4, 6), torch.float32), ((2, 3, 5), torch.bfloat16), ((2, 3), torch.float32)]
    assert nb01.view_offsets(dec) == [0, 768, 1024]
    assert nb01.call_bytes(dec) == 1280
    assert nb01.growth_peak(1000, 3000, "free_then_allocate") == 3072
    assert nb01.growth_peak(1000, 3000, "allocate_then_free") == 1024 + 3072
    assert nb01.dbo_slot_sizes([(0, 100), (1, 1000), (0, 50)]) == [256, 1024]


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
    }),
])
def test_shown_solutions_match_references(stem, module, cases):
    import math

    from tqlab.core.workspace import ALIGNMENT, round_up

    shown = _shown_solutions(stem)
    assert set(shown) == set(cases)
    for name, src in shown.items():
        ns = {"math": math, "ALIGNMENT": ALIGNMENT, "round_up": round_up, "torch": torch}
        exec(src, ns)  # noqa: S102 - the notebook's own solution text
        assert check(name, ns[name], getattr(module, name), cases[name], verbose=False).passed, name


def test_environment_facts():
    env = environment()
    assert env["torch"] == torch.__version__ and env["cuda"] == torch.cuda.is_available()
    rows = environment_rows(dict(env, cuda=False, gpu=None, vllm_parity=None))
    assert rows[2] == ("CUDA", "not available", "GPU cells show recorded runs under a banner")
    assert rows[3][1] == "not found" and "recorded" in rows[3][2]
