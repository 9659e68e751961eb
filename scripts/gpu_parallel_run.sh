#!/usr/bin/env bash
# Several `harness run` processes side by side on one GPU host, for a case matrix that one
# process would not finish in a device call: the numpy oracle and compilers are CPU-bound,
# so N processes use N cores while they share the GPU.
#   scripts/gpu_parallel_run.sh JOBFILE [SECONDS]
# JOBFILE: one job a line, `name: harness-run-arguments` (# comments allowed).  Each job runs
# under `timeout SECONDS` (default 500): SIGTERM makes `harness run` save what it finished,
# marked "interrupted".  Writes $OUT/env.txt, $OUT/summary.txt and $OUT/runs.tar.gz (logs + JSON).
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-results/local}
jobs_file=$1
limit=${2:-500}
runs=$(mktemp -d)/runs
mkdir -p "$OUT" "$runs"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, torch, triton, cupy, jax, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'jax', jax.__version__, 'numpy', numpy.__version__)"
} > "$OUT/env.txt" 2>&1

while IFS= read -r line; do
  line=${line%%#*}
  [[ -z "${line// }" ]] && continue
  name=${line%%:*}; name=${name// /}
  args=${line#*:}
  # shellcheck disable=SC2086
  timeout -k 15 -s TERM "$limit" python3 -m harness run $args --json "$runs/$name.json" > "$runs/$name.log" 2>&1 &
done < "$jobs_file"
wait

for log in "$runs"/*.log; do
  echo "== $(basename "$log" .log): $(tail -1 "$log")"
  grep -E "^(FAIL|ERROR) " "$log" | head -20
done > "$OUT/summary.txt"
tar -czf "$OUT/runs.tar.gz" -C "$(dirname "$runs")" runs
cat "$OUT/summary.txt"
