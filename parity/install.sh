#!/usr/bin/env bash
# Install vLLM's Python package into a separate CPU-only venv for the parity suite.
#
#   bash parity/install.sh            # idempotent: a no-op when the venv already works
#   VLLM_VERSION=0.34.0 bash parity/install.sh    # another release, in its own venv (.venv-parity-0.34)
#   PARITY_VENV=/path VLLM_VERSION=0.33.0 bash parity/install.sh
#
# What it does (see parity/README.md for why this works and its limits):
#   1. creates $PARITY_VENV (default: parity/venv.sh's rule, .venv-parity/ for 0.33.0) with python3;
#   2. installs torch==2.13.0 (the CPU build from the machine's wheel cache) and
#      the test tools (pytest, hypothesis, numpy);
#   3. downloads the vLLM wheel (--no-deps), derives its runtime requirements from
#      the wheel's METADATA with parity/derive_requirements.py (dropping torch,
#      CUDA/kernel and codec packages) and installs them under a constraint that
#      pins torch==2.13.0, so nothing can pull a CUDA torch;
#   4. installs the vLLM wheel itself with --no-deps;
#   5. checks that the modules the suite needs import, and writes a stamp;
#   6. installs this project editable with --no-deps (its vllm.general_plugins entry point),
#      also on later runs whenever the entry point is missing, and checks it from outside the
#      repository (python -I in an empty folder: parity/check_entry_point.py).
# Prints the wall time of each step and the total (minutes).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
source "$ROOT/parity/venv.sh"
VENV="${PARITY_VENV:-$(parity_venv "$ROOT" "$VLLM_VERSION")}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.parity-installed"
WANT="vllm==$VLLM_VERSION torch==$TORCH_VERSION"

t0=$(date +%s)
step() { echo "[parity/install] $(($(date +%s) - t0))s: $*"; }

check_imports() {
  PYTHONPATH="$ROOT" VLLM_VERSION="$VLLM_VERSION" "$VENV/bin/python" - <<'PY'
import os
import torch
assert torch.version.cuda is None, f"parity venv must hold a CPU torch, found CUDA {torch.version.cuda}"
import vllm.v1.worker.workspace as ws
from vllm.v1.attention.backends import turboquant_attn as tq
assert hasattr(tq.TurboQuantMetadataBuilder, "_reserve_workspace"), "vLLM lacks PR #44053"
import vllm
assert vllm.__version__ == os.environ["VLLM_VERSION"], f"venv holds vllm {vllm.__version__}, not {os.environ['VLLM_VERSION']}"
# The manager's API is the one tqlab's version home says (tqlab/core/vllm_versions.py; a release being added is
# not there yet: say so and go on).
from tqlab.core import vllm_versions
try:
    known = vllm_versions.get(vllm.__version__)
except ValueError as e:
    print(f"note: {e} (add it to tqlab/core/vllm_versions.py)")
else:
    missing = [m for m in known.manager_methods if not hasattr(ws.WorkspaceManager, m)]
    assert not missing, f"vllm {vllm.__version__}'s WorkspaceManager lacks {missing}"
    assert hasattr(ws.WorkspaceManager, "get_retained") == known.has_get_retained, "get_retained differs from tqlab's table"
print(f"vllm {vllm.__version__} / torch {torch.__version__}: workspace + turboquant_attn import")
PY
}

# tqlab itself, editable and --no-deps (its vllm.general_plugins entry point, parity/test_plugin_parity.py):
# a few seconds, redone whenever the entry point is missing (a venv made before the plugin existed).
# The check runs isolated (python -I) from an empty folder outside the repository: a tqlab.egg-info in
# the repository root must not pass for an install into this venv (parity/check_entry_point.py).
entry_point_ok() {
  local away rc=0
  away="$(mktemp -d)"
  (cd "$away" && "$VENV/bin/python" -I "$ROOT/parity/check_entry_point.py") || rc=$?
  rmdir "$away"
  return $rc
}
install_project() {
  if ! entry_point_ok >/dev/null 2>&1; then
    step "installing tqlab (editable, --no-deps) for its vllm.general_plugins entry point"
    # --no-build-isolation builds with the venv's own setuptools: PEP 660 editables and a built-in
    # bdist_wheel need setuptools >= 70.1 (python3 -m venv on 3.11 seeds 65.5)
    quiet "$VENV/bin/python" -m pip --disable-pip-version-check install -q "setuptools>=70.1"
    quiet "$VENV/bin/python" -m pip --disable-pip-version-check install -q --no-deps --no-build-isolation -e "$ROOT"
  fi
  step "checking the entry point from outside the repository"
  entry_point_ok
}
# pip warns once per package about the machine's optional local index folders; drop that noise only
quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2 || true); }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && check_imports; then
  install_project
  step "already installed ($WANT) in $VENV"
  exit 0
fi

step "creating venv $VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

CONSTRAINTS="$VENV/parity-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

step "installing torch==$TORCH_VERSION (CPU) + test tools"
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" "torch==$TORCH_VERSION" numpy pytest hypothesis packaging
if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then
  echo "parity/install: torch==$TORCH_VERSION resolved to a CUDA build; a CPU wheel must be on pip's find-links" >&2
  exit 1
fi

WHEELS="$VENV/wheels"
mkdir -p "$WHEELS"
step "downloading vllm==$VLLM_VERSION (--no-deps)"
quiet "${PIP[@]}" download -q --no-deps -d "$WHEELS" "vllm==$VLLM_VERSION"
WHEEL="$(ls "$WHEELS"/vllm-"$VLLM_VERSION"-*.whl | head -n1)"

step "deriving runtime requirements from $(basename "$WHEEL")"
"$VENV/bin/python" "$ROOT/parity/derive_requirements.py" "$WHEEL" > "$VENV/vllm-requirements.txt"
grep -vc '^#' "$VENV/vllm-requirements.txt" | sed 's/^/  kept requirements: /'

step "installing the derived requirements (torch pinned by constraint)"
quiet "${PIP[@]}" install -q -c "$CONSTRAINTS" -r "$VENV/vllm-requirements.txt"

step "installing the vLLM wheel --no-deps"
quiet "${PIP[@]}" install -q --no-deps "$WHEEL"

step "checking imports"
check_imports
install_project
echo "$WANT" > "$STAMP"
rm -f "$WHEEL"
t1=$(date +%s)
echo "$((t1 - t0))" > "$VENV/.parity-install-seconds"
echo "[parity/install] done in $((t1 - t0)) s ($(awk "BEGIN{printf \"%.1f\", ($t1-$t0)/60}") min)"
