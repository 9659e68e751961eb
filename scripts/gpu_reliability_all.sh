#!/usr/bin/env bash
# One device call (about 9 minutes on an H100) for everything but the benchmarks, results in $OUT:
#   1. the timing diagnosis (scripts/diag/timing_repro.py) with the GPU to itself, while the CPU
#      builds torch_ext (`harness list`);
#   2. then side by side:
#      - the stress batch (scripts/gpu_stress.sh: the >2**31-element cases of every memory-bound
#        op through every backend that claims them, plus tests/test_planted_gpu.py and the GPU
#        bad-input tests), into $OUT/stress/;
#      - the reliability batch (scripts/gpu_reliability.sh: compute-sanitizer memcheck,
#        racecheck and initcheck over cupy, torch_ext and triton, and the planted crashes),
#        into $OUT/reliability/;
#      - the baseline-failure diagnoses (scripts/diag/*.py) into $OUT/diag.txt.
#   OUT=dir bash scripts/gpu_reliability_all.sh
# Knobs: BUDGET (s, default 545).
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
# Nine sanitized processes, a stress run and the diagnoses share one GPU: no JAX preallocation.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:?set OUT}
BUDGET=${BUDGET:-545}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
mkdir -p "$OUT/stress" "$OUT/reliability"

python3 -m harness list > "$OUT/list.txt" 2>&1 &
build=$!
timeout -k 10 150 python3 scripts/diag/timing_repro.py --json "$OUT/timing_repro.json" > "$OUT/timing_repro.log" 2>&1
echo "timing diagnosis: exit $? at $(elapsed)s" >> "$OUT/steps.txt"
wait "$build"
echo "build (harness list): done at $(elapsed)s" >> "$OUT/steps.txt"

left=$(( BUDGET - $(elapsed) ))
OUT="$OUT/stress" BUDGET=$(( left - 15 )) RESERVE=60 bash scripts/gpu_stress.sh > "$OUT/stress.out" 2>&1 &
stress=$!
OUT="$OUT/reliability" BUDGET=$(( left - 20 )) bash scripts/gpu_reliability.sh > "$OUT/reliability.out" 2>&1 &
reliability=$!
{
  timeout -k 10 120 python3 scripts/diag/jax_baseline_failures.py
  echo "exit $?"
  timeout -k 10 120 python3 scripts/diag/conv_wgrad_algorithms.py
  echo "exit $?"
} > "$OUT/diag.txt" 2>&1
echo "diagnoses: done at $(elapsed)s" >> "$OUT/steps.txt"
wait "$stress"; echo "stress: exit $? at $(elapsed)s" >> "$OUT/steps.txt"
wait "$reliability"; echo "reliability: exit $? at $(elapsed)s" >> "$OUT/steps.txt"

# At most 8 files come back: pack the folders.
tar czf "$OUT/stress.tar.gz" -C "$OUT" stress && rm -rf "$OUT/stress"
tar czf "$OUT/reliability.tar.gz" -C "$OUT" reliability && rm -rf "$OUT/reliability"
tar czf "$OUT/logs.tar.gz" -C "$OUT" list.txt stress.out reliability.out timing_repro.log && \
  rm -f "$OUT/list.txt" "$OUT/stress.out" "$OUT/reliability.out"
cat "$OUT/steps.txt"
