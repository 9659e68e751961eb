#!/usr/bin/env bash
# GPU batch for the cupy norm kernels (layernorm_backward ladder v1-v5 and best, rmsnorm_backward
# best): correctness, the seed's ladder, the perf cases beside the baselines, tuning data.
# Run from the repo root on a CUDA machine:   OUT=/some/dir scripts/gpu/cuda_norms.sh
#
#  1. device and versions; the copy ceiling (harness ceilings)            -> env.txt, ceilings.json
#  2. every norm kernel compiled once, in parallel, into cupy's disk cache -> warm.txt
#     (meanwhile, in the background: tests/test_cuda_norms.py -k nvcc, the headers through nvcc
#     with torch_ext's no-implicit-half-conversion defines; skipped without nvcc -> nvcc_test.txt)
#  3. every cupy variant on the smoke sets of both ops                     -> smoke.json, smoke.log
#  4. cupy@best on the full sets (the perf-tagged cases are validated by the benches' final call)
#                                                                          -> full_best.json, full_best.log
#  5. the ladder on the seed's shape (fp32 16x64x2048): v1 ... v5, best, torch, torch_compile
#                                                                          -> bench_ladder/{results.json,report.md}
#  6. the perf cases of both ops: cupy@best, v2 ... v5, torch, torch_compile side by side, ops
#     interleaved, stopping new cases after PERF_LIMIT s (v1 is left out: ~0.25 s a call at 8192x8192)
#                                                                          -> bench_perf/{results.json,report.md}
#  7. tuning sweep of cupy@best (elements per thread, forced column chunks) beside a copy of the
#     same bytes, cold L2                                                  -> sweep.txt, sweep.json
#  8. summary: tallies, failures, every timed figure, the targets met or missed -> summary.txt
# About 7 minutes on an H100 with the defaults.  Knobs: PERF_LIMIT=170 (s) BUDGET=0.2 (s per pair)
# SKIP_SWEEP=1 DEVICE=cuda.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PERF_LIMIT=${PERF_LIMIT:-170} BUDGET=${BUDGET:-0.2} DEVICE=${DEVICE:-cuda} SKIP_SWEEP=${SKIP_SWEEP:-0}
OPS=(--op layernorm_backward --op rmsnorm_backward)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gradoracle-norms.XXXXXX)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, cupy, numpy; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"

stamp "== ceilings"
python3 -m harness ceilings --device "$DEVICE" --json "$OUT/ceilings.json" 2>&1 | tail -3

stamp "== nvcc compile test of every instantiation (background; torch_ext's defines)"
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
( timeout 600 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_norms.py -k nvcc > "$OUT/nvcc_test.txt" 2>&1
  echo "exit $?" >> "$OUT/nvcc_test.txt" ) &
nvcc_pid=$!

stamp "== compile every norm kernel (parallel, into cupy's cache)"
timeout 300 python3 scripts/gpu/cuda_norms_warm.py --jobs 12 2>&1 | tee "$OUT/warm.txt" | tail -12

stamp "== smoke: every cupy variant"
python3 -m harness run "${OPS[@]}" --backend cupy --cases smoke --device "$DEVICE" --json "$OUT/smoke.json" \
  > "$OUT/smoke.log" 2>&1
echo "exit $?"; tail -4 "$OUT/smoke.log"

stamp "== full (less the perf cases): cupy@best"
python3 - "$WORK/full_noperf.json" <<'EOF'
import json, sys
from cases import select
cases = [c.to_json() for op in ("layernorm_backward", "rmsnorm_backward") for c in select("full", op=op)
         if "perf" not in c.tags]
json.dump(cases, open(sys.argv[1], "w"))
print(len(cases), "cases")
EOF
python3 -m harness run "${OPS[@]}" --backend cupy@best --cases "$WORK/full_noperf.json" --device "$DEVICE" \
  --json "$OUT/full_best.json" > "$OUT/full_best.log" 2>&1
echo "exit $?"; tail -4 "$OUT/full_best.log"

bench_args=(--device "$DEVICE" --mode cold --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10 --max-samples 1000
            --rel-ci 0.005 --no-plots)
stamp "== ladder on the seed's shape (fp32 16x64x2048)"
python3 -m harness bench --op layernorm_backward --backend cupy --backend torch --backend torch_compile \
  --cases '{"op": "layernorm_backward", "dtype": "f32", "params": {"shape": [16, 64, 2048]}}' "${bench_args[@]}" \
  --report "$OUT/bench_ladder" > "$WORK/bench_ladder.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR)" "$WORK/bench_ladder.log" | cut -c1-220 | head -8

stamp "== perf cases: best, v2-v5, torch, torch_compile (new cases stop after ${PERF_LIMIT}s)"
python3 -m harness bench "${OPS[@]}" --cases perf --interleave --time-limit "$PERF_LIMIT" "${bench_args[@]}" \
  --backend cupy@best --backend cupy@v2 --backend cupy@v3 --backend cupy@v4 --backend cupy@v5 \
  --backend torch --backend torch_compile --report "$OUT/bench_perf" > "$WORK/bench_perf.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR)" "$WORK/bench_perf.log" | cut -c1-220 | head -8

if [ "$SKIP_SWEEP" != 1 ]; then
  stamp "== tuning sweep"
  timeout 240 python3 scripts/gpu/cuda_norms_sweep.py --json "$OUT/sweep.json" > "$OUT/sweep.txt" 2>&1
  echo "exit $?"; cat "$OUT/sweep.txt" | cut -c1-160
fi

stamp "== nvcc compile test"
wait "$nvcc_pid"
tail -3 "$OUT/nvcc_test.txt"

stamp "== summary"
python3 scripts/gpu/cuda_norms_summary.py "$OUT" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt" | cut -c1-200 | tail -120
tar czf "$OUT/logs.tar.gz" -C "$WORK" bench_ladder.log bench_perf.log full_noperf.json 2>/dev/null
ls -la "$OUT"
stamp "done"
