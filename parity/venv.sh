# Sourced by parity/install.sh and parity/run.sh: the one rule naming a vLLM release's parity venv.
#   parity_venv ROOT VERSION  ->  ROOT/.venv-parity for 0.33.0 (the first release; notebooks and
#   tqlab.vllm.source_scan look there), ROOT/.venv-parity-<major.minor> for any other (0.34.0 ->
#   .venv-parity-0.34). PARITY_VENV, when set, overrides it in both scripts.
parity_venv() {
  if [[ "$2" == "0.33.0" ]]; then echo "$1/.venv-parity"; else echo "$1/.venv-parity-${2%.*}"; fi
}
