#!/usr/bin/env bash
# The GPU correctness check: run from the repo root on a CUDA machine, with $OUT a folder for results.
#   scripts/gpu_check.sh [CASES] [more `harness run` options, e.g. --op binary_backward --backend cupy]
# Builds the torch extension (through `list`), then runs the harness over CASES (default: full),
# timed, writing the log and the results JSON to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-results/local}
mkdir -p "$OUT"
cases=${1:-full}
shift || true

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, torch, triton, cupy, jax, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'jax', jax.__version__, 'numpy', numpy.__version__)"
  nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.txt"

echo "== build and list"
start=$(date +%s)
python3 -m harness list 2>&1 | tee "$OUT/list.txt"
echo "list (includes the torch_ext build) took $(( $(date +%s) - start ))s"

echo "== harness run --cases $cases"
python3 -m harness run --cases "$cases" "$@" --time --json "$OUT/run-$cases.json" \
  > "$OUT/run-$cases.log" 2>&1
echo "exit $?"
grep -E "^(FAIL|ERROR)" -A3 "$OUT/run-$cases.log" | head -60
tail -1 "$OUT/run-$cases.log"
