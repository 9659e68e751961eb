#!/usr/bin/env bash
# triton reduce_sum on the GPU: correctness over the full cases, then timings of the perf cases.
# Run from the repo root on a CUDA machine (python3 with torch, triton, jax), $OUT a folder:
#   OUT=/some/dir bash scripts/gpu/triton_reduce_sum.sh
# 1. python3 -m harness run --op reduce_sum --backend triton --cases full
#      -> $OUT/triton-reduce-full.json (+ .log); capped at RUN_LIMIT s (SIGTERM keeps what ran).
# 2. python3 -m harness bench --op reduce_sum --backend triton --cases perf, the other finish
#    (GRADORACLE_TRITON_REDUCE_FINISH=kernel: the partials added by _stage2_kernel instead of the
#    last program of each tile) -> $OUT/bench-reduce-kernel-finish/{results.json,report.md}.
# 3. python3 -m harness bench --op reduce_sum --backend torch --backend torch_compile --backend jax
#      --backend triton --cases perf (triton with its default finish, "last")
#      -> $OUT/bench-reduce/{results.json,report.md,plots}; stops starting pairs after BENCH_LIMIT s.
# Each step prints its summary; the tables of 2 and 3 (median ms and % of the copy ceiling) end the log.
# About 6 minutes on an H100 with the defaults (RUN_LIMIT=150, KERNEL_LIMIT=45, BENCH_LIMIT=110 s of
# work, the rest start-up, ceilings and reports).  Knobs: RUN_LIMIT KERNEL_LIMIT BENCH_LIMIT BUDGET, and
# RUN_CASES=full BENCH_CASES=perf DEVICE=cuda (a CPU dry run of the script's logic:
# TRITON_INTERPRET=1 DEVICE=cpu RUN_CASES=smoke BENCH_CASES=smoke).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
RUN_LIMIT=${RUN_LIMIT:-150} KERNEL_LIMIT=${KERNEL_LIMIT:-45} BENCH_LIMIT=${BENCH_LIMIT:-110} BUDGET=${BUDGET:-0.3}
RUN_CASES=${RUN_CASES:-full} BENCH_CASES=${BENCH_CASES:-perf} DEVICE=${DEVICE:-cuda}
WORK=$(mktemp -d /tmp/gradoracle-reduce.XXXXXX)
export GRADORACLE_CACHE=$WORK/cache  # one ceilings measurement for both benches
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 | head -2
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

stamp "== 1. correctness, full cases (at most ${RUN_LIMIT}s)"
timeout -k 15 -s TERM "$RUN_LIMIT" python3 -m harness run --op reduce_sum --backend triton --cases "$RUN_CASES" --device "$DEVICE" \
  --json "$OUT/triton-reduce-full.json" > "$OUT/triton-reduce-full.log" 2>&1
echo "exit $? (124: cut at ${RUN_LIMIT}s, the JSON holds the cases that ran)"
grep -E "^(FAIL|ERROR|XFAIL)" "$OUT/triton-reduce-full.log" | cut -c1-200 | head -20
tail -4 "$OUT/triton-reduce-full.log"

bench=(--op reduce_sum --cases "$BENCH_CASES" --device "$DEVICE" --mode cold --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10
       --max-samples 1000 --rel-ci 0.005 -q)

stamp "== 2. bench triton, finish=kernel (at most ${KERNEL_LIMIT}s of pairs)"
GRADORACLE_TRITON_REDUCE_FINISH=kernel python3 -m harness bench "${bench[@]}" --backend triton \
  --time-limit "$KERNEL_LIMIT" --no-plots --report "$OUT/bench-reduce-kernel-finish" \
  > "$WORK/kernel.log" 2>&1
echo "exit $?"
grep -E "^(FAIL|ERROR)" "$WORK/kernel.log" | cut -c1-200 | head -8

stamp "== 3. bench torch, torch_compile, jax, triton (at most ${BENCH_LIMIT}s of pairs)"
python3 -m harness bench "${bench[@]}" --backend torch --backend torch_compile --backend jax --backend triton \
  --time-limit "$BENCH_LIMIT" --report "$OUT/bench-reduce" > "$WORK/bench.log" 2>&1
echo "exit $?"
grep -E "^(FAIL|ERROR)" "$WORK/bench.log" | cut -c1-200 | head -8
cp "$WORK/kernel.log" "$OUT/bench-reduce-kernel-finish/bench.log" 2>/dev/null
cp "$WORK/bench.log" "$OUT/bench-reduce/bench.log" 2>/dev/null

stamp "== tables: case, impl, status, median ms, % of the copy ceiling"
for d in bench-reduce-kernel-finish bench-reduce; do
  echo "-- $d"
  grep -E "^\| (sum|sum_to)\[" "$OUT/$d/report.md" 2>/dev/null | awk -F'|' '{printf "%-48s %-22s %-5s %10s %7s\n", $2, $3, $4, $5, $9}'
done
stamp "done"
