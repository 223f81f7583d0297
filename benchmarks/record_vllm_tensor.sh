#!/usr/bin/env bash
# One H200 call for issue 34: the TurboQuant kernels on vLLM's own cache tensor, side by side with vLLM 0.33's
# kernels and fp16 SDPA (the anchor bench, a measuring stick kept outside the package).
#
#   OUT=/some/dir ANCHORS=anchors/vllm_tq TQLAB_COMMIT=<sha> bash benchmarks/record_vllm_tensor.sh
#
# Runs on a CUDA machine from the repository root with the image's python3; ANCHORS is a copy of
# ../shared/anchors/vllm_tq inside the checkout.  Results in $OUT: gpu_tests.log, vllm_checks.jsonl (the gpu test's
# store/decode comparison with vLLM's kernels), vllm_tensor.jsonl (tqlab on vLLM's tensor, the default layout) and
# block_soa.jsonl (tqlab on the opt-in block-SoA order).
set -u
OUT=${OUT:?set OUT}; ANCHORS=${ANCHORS:?set ANCHORS}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TQLAB_VLLM_ANCHORS=$PWD/$ANCHORS TQLAB_GPU_RECORD=$OUT/vllm_checks.jsonl
export TQLAB_COMMIT=${TQLAB_COMMIT:-unknown}
PRESETS=${PRESETS:-turboquant_3bit_nc,turboquant_k3v4_nc,turboquant_4bit_nc,turboquant_k8v4}
log() { echo "== $(date -u +%H:%M:%S) $*"; }
log "device"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
log "anchor bench: tqlab on vLLM's tensor"
timeout ${BENCH_S:-300} python3 "$ANCHORS/bench_vllm_tq.py" --all --preset "$PRESETS" --tqlab . --commit "$TQLAB_COMMIT" \
  --out "$OUT/vllm_tensor.jsonl" > "$OUT/vllm_tensor.log" 2>&1; echo "exit $?"; tail -n 32 "$OUT/vllm_tensor.log"
log "anchor bench: tqlab on block-SoA"
timeout 150 python3 "$ANCHORS/bench_vllm_tq.py" --all --preset "$PRESETS" --tqlab . --tqlab-layout block_soa --no-dequant --no-breakdown \
  --commit "$TQLAB_COMMIT" --out "$OUT/block_soa.jsonl" > "$OUT/block_soa.log" 2>&1; echo "exit $?"
tail -n 14 "$OUT/block_soa.log"
log "GPU tests: beside vLLM's kernels"
timeout 120 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/test_turboquant_vllm_decode.py \
  > "$OUT/gpu_tests.log" 2>&1; echo "exit $?"; tail -n 4 "$OUT/gpu_tests.log"
log "GPU tests: the kernels' own (-m gpu)"
timeout ${TEST_S:-170} python3 -m pytest -o addopts="" -q -p no:cacheprovider -m gpu tests/test_turboquant_triton.py \
  tests/test_turboquant.py ${EXTRA_TESTS:-} >> "$OUT/gpu_tests.log" 2>&1; echo "exit $?"; tail -n 12 "$OUT/gpu_tests.log"
log "done"
