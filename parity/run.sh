#!/usr/bin/env bash
# The parity suite: vLLM's own classes vs tqlab's (see parity/README.md).
#
#   bash parity/run.sh              # install vLLM into .venv-parity/ if needed, then run the suite
#   bash parity/run.sh --record     # ... and write data/parity_results.json (with provenance)
#   bash parity/run.sh -k seed      # extra arguments go to pytest
#
# Environment: VLLM_VERSION (0.33.0; 0.34.0 runs vLLM 0.34 in .venv-parity-0.34), PARITY_VENV (default:
# parity/venv.sh's rule), PARITY_SKIP_INSTALL=1. --record writes data/parity_results.json for 0.33.0 and
# data/parity_results_<major>_<minor>.json for any other release.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
source "$ROOT/parity/venv.sh"
export PARITY_VENV="${PARITY_VENV:-$(parity_venv "$ROOT" "$VLLM_VERSION")}"
VENV="$PARITY_VENV"
cd "$ROOT"

RECORD=()
ARGS=()
for a in "$@"; do
  if [[ "$a" == "--record" ]]; then
    if [[ "$VLLM_VERSION" == "0.33.0" ]]; then out=parity_results.json; else v="${VLLM_VERSION%.*}"; out="parity_results_${v//./_}.json"; fi
    RECORD=(--parity-record "$ROOT/data/$out")
  else
    ARGS+=("$a")
  fi
done

if [[ "${PARITY_SKIP_INSTALL:-0}" != "1" ]]; then
  bash "$ROOT/parity/install.sh"
fi
if [[ -f "$VENV/.parity-install-seconds" ]]; then
  export PARITY_INSTALL_SECONDS="$(cat "$VENV/.parity-install-seconds")"
fi
export PARITY_REQUIRE_VLLM=1
export PARITY_COMMAND="bash parity/run.sh $*"
exec "$VENV/bin/python" -m pytest -c parity/pytest.ini --rootdir "$ROOT" \
  -W ignore::DeprecationWarning "${RECORD[@]}" "${ARGS[@]}" parity
