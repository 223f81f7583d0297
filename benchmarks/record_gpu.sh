#!/usr/bin/env bash
# Record the GPU results that CPU-only readers see under a banner, in one go.
#
#   OUT=/some/dir TQLAB_COMMIT=<sha> bash benchmarks/record_gpu.sh
#
# Runs on a CUDA machine from the repository root, with the image's python3
# (no Jupyter needed: the notebooks' paired py:percent scripts run as plain
# Python). Every step has its own time limit; results land in $OUT.
set -u
OUT=${OUT:?set OUT to a folder for the results}
export PYTHONPATH=$PWD MPLBACKEND=Agg PYTHONUNBUFFERED=1
export TQLAB_COMMIT=${TQLAB_COMMIT:-unknown}
mkdir -p "$OUT"
log() { echo "== $(date -u +%H:%M:%S) $*"; }

log "device"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'

log "GPU tests: CUDA graphs (incl. notebook 05 on cuda) and TurboQuant Triton kernels"
TQLAB_NB05_RESULTS=$OUT/cuda_graphs_live.json timeout 240 \
  python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/test_cuda_graphs.py tests/test_turboquant_triton.py \
  2>&1 | tail -n 15

log "repro on cuda: without and with the fix"
timeout 90 python3 -m tqlab repro --preset nemotron-3-super-120b-a12b --device cuda --max-tokens 4 > "$OUT/repro_cuda.log" 2>&1
echo "no-fix exit $?" | tee -a "$OUT/repro_cuda.log"
timeout 90 python3 -m tqlab repro --preset nemotron-3-super-120b-a12b --device cuda --fix --max-tokens 4 >> "$OUT/repro_cuda.log" 2>&1
echo "fix exit $?" | tee -a "$OUT/repro_cuda.log"
tail -n 4 "$OUT/repro_cuda.log"

log "notebooks 01 and 02 on cuda, recording"
for n in 01_workspace_buffer_layouts 02_reproduce_locked_workspace; do
  sed -e 's/^DEVICE = "cpu"/DEVICE = "cuda"/' -e 's/^RECORD_GPU = False/RECORD_GPU = True/' "notebooks/$n.py" > "/tmp/$n.py"
  timeout 120 python3 "/tmp/$n.py" > "/tmp/$n.log" 2>&1; echo "$n exit $?"; tail -n 2 "/tmp/$n.log"
done
cp data/workspace_growth_peak_cuda.json data/repro_nemotron_cuda.json "$OUT/" 2>/dev/null

log "CUDA-graph latency benchmark (seed shard, 8 layers; llama-3.1-8b shard, 32 layers)"
timeout 220 python3 benchmarks/bench_cuda_graphs.py --out "$OUT/cuda_graphs_latency.json" 2>&1 | tail -n 25
log "done"
