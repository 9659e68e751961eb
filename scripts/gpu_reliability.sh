#!/usr/bin/env bash
# Reliability batch for a GPU machine, one device call (under 9 minutes), results in $OUT:
#   - compute-sanitizer memcheck, racecheck and initcheck over each CUDA backend (cupy,
#     torch_ext, triton) on the binary_backward smoke cases: the 9 runs go side by side
#     (one GPU, many cores), each `harness run --sanitize TOOL --backend B`;
#   - the GPU planted-crash tests (tests/test_isolate.py -m gpu): an illegal address is a
#     CRASH under --isolate, and a clean stop naming the case without it.
#   OUT=dir scripts/gpu_reliability.sh
# Writes env.txt, list.txt, sanitize-TOOL-BACKEND.{json,log} (+ -logs/ folders),
# planted-crash.log and summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
OUT=${OUT:-results/local}
BUDGET=${BUDGET:-520}  # seconds for the whole batch
mkdir -p "$OUT"
start=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  compute-sanitizer --version | tail -1
} > "$OUT/env.txt" 2>&1

# Build torch_ext before any sanitizer starts.
python3 -m harness list > "$OUT/list.txt" 2>&1
# The planted crash first and alone: its faulting context shares the GPU with nothing.
timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_isolate.py > "$OUT/planted-crash.log" 2>&1
left=$(( BUDGET - ($(date +%s) - start) - 40 ))
echo "list and planted-crash tests took $(( $(date +%s) - start ))s; ${left}s per sanitizer run" > "$OUT/summary.txt"

for tool in memcheck racecheck initcheck; do
  for backend in cupy torch_ext triton; do
    timeout -k 10 $(( left + 20 )) python3 -m harness run --sanitize "$tool" --backend "$backend" \
      --op binary_backward --cases smoke --seed 1 --case-timeout "$left" \
      --json "$OUT/sanitize-$tool-$backend.json" > "$OUT/sanitize-$tool-$backend.log" 2>&1 &
  done
done
wait

{
  for log in "$OUT"/sanitize-*.log; do
    echo "== $(basename "$log" .log)"
    grep -E "^(CLEAN|ERRORS|INCOMPLETE|TIMEOUT|UNAVAILABLE) " -A6 "$log" | head -20
  done
  echo "== planted-crash tests: $(tail -1 "$OUT/planted-crash.log")"
  echo "total $(( $(date +%s) - start ))s"
} >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
