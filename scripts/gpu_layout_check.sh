#!/usr/bin/env bash
# The GPU check of the harness layout (issue 12: one prepare(), select(), result row; multi_gpu/
# and report/ split; sanitize running the CLI as a program).  One device call, under 10 minutes,
# on one GPU, from the repo root:
#   OUT=dir scripts/gpu_layout_check.sh
# Writes 7 files to $OUT (the device tool brings back at most 8):
#   list.txt          environment and `harness list` (builds torch_ext first)
#   smoke.log         `harness run --cases smoke` through every backend available on the GPU
#   smoke.json.gz     its rows (compare with an earlier smoke run: same rows and statuses)
#   bench/results.json, bench/report.md
#                     `harness bench` of the first perf case of each op: the prefetch threads defer the
#                     JAX-on-GPU oracle of cases over 1 GiB to the main thread (prepare.finish)
#   sanitize.json     `run --sanitize memcheck --backend cupy` on the binary_backward smoke cases: the
#                     sanitized process runs `python -m harness` through runpy (harness/sanitize.py)
#   summary.txt       exit statuses and summary lines of all of the above, plus `run --gpus 1`
#                     (one pinned worker, harness/multi_gpu/) and pytest's generated tests on cuda
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
OUT=${OUT:-results/local}
WORK=$(mktemp -d)
mkdir -p "$OUT/bench"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }
summary() { echo "$@" >> "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, triton, cupy, jax, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'jax', jax.__version__)"
  python3 -m harness list
} > "$OUT/list.txt" 2>&1
summary "list: exit $? at $(elapsed)"

timeout -k 10 180 python3 -m harness run --cases smoke --seed 1 --json "$WORK/smoke.json" > "$OUT/smoke.log" 2>&1
summary "run --cases smoke: exit $? at $(elapsed): $(tail -1 "$OUT/smoke.log")"
gzip -c "$WORK/smoke.json" > "$OUT/smoke.json.gz" 2>/dev/null

timeout -k 10 110 python3 -m harness bench --cases perf --per-op 1 --interleave --budget 0.2 --time-limit 80 \
  --no-plots -q --report "$WORK/bench" > "$WORK/bench.log" 2>&1
summary "bench --cases perf --per-op 1: exit $? at $(elapsed): $(tail -3 "$WORK/bench.log" | head -1)"
cp "$WORK/bench/results.json" "$WORK/bench/report.md" "$OUT/bench/" 2>/dev/null
summary "  oracles: $(python3 -c "import json, collections; r = json.load(open('$WORK/bench/results.json'))['rows']; print(dict(collections.Counter(x['oracle'] for x in r)))" 2>&1)"

timeout -k 10 110 python3 -m harness run --sanitize memcheck --backend cupy --op binary_backward --cases smoke \
  --seed 1 --case-timeout 100 --json "$WORK/sanitize.json" > "$WORK/sanitize.log" 2>&1
summary "run --sanitize memcheck --backend cupy: exit $? at $(elapsed): $(tail -1 "$WORK/sanitize.log")"
cp "$WORK/sanitize.json" "$OUT/sanitize.json" 2>/dev/null

timeout -k 10 60 python3 -m harness run --gpus 1 --op binary_backward --backend cupy --cases smoke --seed 1 \
  --json "$WORK/gpus1.json" > "$WORK/gpus1.log" 2>&1
summary "run --gpus 1: exit $? at $(elapsed): $(tail -1 "$WORK/gpus1.log")"
summary "  rows per gpu: $(python3 -c "import json, collections; r = json.load(open('$WORK/gpus1.json'))['results']; print(dict(collections.Counter(str(x.get('gpu')) for x in r)))" 2>&1)"

timeout -k 10 60 python3 -m pytest -q -p no:cacheprovider tests/test_correctness.py --device cuda \
  --op binary_backward --backend triton --backend cupy --dtype bf16 > "$WORK/pytest.log" 2>&1
summary "pytest test_correctness --device cuda (binary_backward, triton and cupy, bf16): exit $? at $(elapsed): $(tail -1 "$WORK/pytest.log")"
cat "$OUT/summary.txt"
