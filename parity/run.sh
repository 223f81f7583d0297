#!/usr/bin/env bash
# The parity suite: vLLM's own classes vs tqlab's (see parity/README.md).
#
#   bash parity/run.sh              # install vLLM into .venv-parity/ if needed, then run the suite
#   bash parity/run.sh --record     # ... and write data/parity_results.json (with provenance)
#   bash parity/run.sh -k seed      # extra arguments go to pytest
#
# Environment: PARITY_VENV (default .venv-parity), VLLM_VERSION (0.33.0), PARITY_SKIP_INSTALL=1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PARITY_VENV:-$ROOT/.venv-parity}"
cd "$ROOT"

RECORD=()
ARGS=()
for a in "$@"; do
  if [[ "$a" == "--record" ]]; then
    RECORD=(--parity-record "$ROOT/data/parity_results.json")
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
