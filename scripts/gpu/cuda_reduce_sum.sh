#!/usr/bin/env bash
# reduce_sum CUDA ladder (cupy@v0 .. @v5, cupy@best): the GPU batch.  Run from the repo root on a
# CUDA machine with $OUT a folder for the results:
#   OUT=/some/dir scripts/gpu/cuda_reduce_sum.sh
# 0. compiles every instantiation (one NVRTC module per dtype, kept in cupy's disk cache for the
#    later steps) and writes each kernel's registers and occupancy, and each perf case's plan
#    (kernel, grid, lanes, chunks), to plans.txt;
# 1. every rung and best on the smoke set (one `harness run --backend cupy`): smoke.json / smoke.log;
# 2. cupy@best on the full set: full-best.json / full-best.log;
# 3. `harness bench` of torch and every cupy variant on the reduce_sum perf cases, side by side
#    (BUDGET s of sampling per pair, stops starting pairs after TIME_LIMIT s): bench/results.json,
#    bench/report.md (with the ladder table), bench/plots/;
# 4. the seed's own shape (32M floats, full sum) through every rung and best, cold and hot L2:
#    seed-cold/, seed-hot/ (results.json, report.md).
# SANITIZE=1 adds compute-sanitizer racecheck and memcheck of every cupy reduce_sum variant on the
# smoke set (sanitize-*.json and logs; about 2 more minutes).
# Whole script: about 6 minutes on an H100 (most of it step 3 and the full set's 64M-element oracles).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
BUDGET=${BUDGET:-0.3} TIME_LIMIT=${TIME_LIMIT:-150} PY=${PY:-python3}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
SEED='{"op": "reduce_sum", "dtype": "f32", "params": {"shape": [33554432], "axes": null}}'

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, cupy, numpy; print('python', sys.version.split()[0], 'cupy', cupy.__version__,
'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/env.txt"

stamp "== 0. compile, registers, occupancy, plans"
$PY - > "$OUT/plans.txt" 2>&1 <<'PYEOF'
import time
from backends.cupy import reduce_sum as rs
from cases import select

dev = rs.device()
print(f"SMs {dev.num_sms()}")
for dt in rs.DTYPES:
    t = time.perf_counter()
    rs.kernel(rs.all_kernel_exprs(dt)[0])  # one NVRTC module per dtype
    print(f"== {dt}: module compiled in {time.perf_counter() - t:.1f} s")
    for expr in rs.all_kernel_exprs(dt):
        fn = rs.kernel(expr)
        print(f"{expr:45s} regs {fn.num_regs:3d} local {fn.local_size_bytes:4d} B smem {fn.shared_size_bytes:5d} B "
              f"blocks/SM {dev.occupancy(expr)}")
print()
for case in select("perf"):
    if case.op != rs.OP:
        continue
    plan = rs.case_plan(case)
    item = rs.dtypes.numpy_dtype(case.dtype).itemsize
    launch = rs.plan_launch(plan, case.dtype, vec=plan.vec_possible(item), vec_store=plan.vec_store_possible(item),
                            num_sms=dev.num_sms(), occupancy=dev.occupancy)
    w = dict(zip(rs.FIELDS, launch.words[2 * rs.GROUP_WORDS:]))
    print(f"{case.id:50s} {launch.kernel:9s} vec={int(launch.vec)} simple={int(launch.simple)} grid={launch.grid:5d} "
          f"lanes={w['lanes']:3d} nchunk={w['nchunk']:4d} ntiles={w['ntiles']:5d} partials={launch.n_part}"
          + ("" if isinstance(rs.rung_segments(plan), str) else "  [ladder runs it]"))
PYEOF
echo "exit $?"; tail -22 "$OUT/plans.txt"

stamp "== 1. every variant on the smoke set"
$PY -m harness run --op reduce_sum --backend cupy --cases smoke --json "$OUT/smoke.json" > "$OUT/smoke.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/smoke.log" | head -40; tail -2 "$OUT/smoke.log"

stamp "== 2. cupy@best on the full set"
$PY -m harness run --op reduce_sum --backend cupy@best --cases full --json "$OUT/full-best.json" \
  > "$OUT/full-best.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/full-best.log" | head -40; tail -2 "$OUT/full-best.log"

stamp "== 3. bench: torch and every cupy variant on the perf cases"
$PY -m harness bench --op reduce_sum --backend torch --backend cupy --cases perf --budget "$BUDGET" \
  --time-limit "$TIME_LIMIT" --report "$OUT/bench" -q > "$OUT/bench.log" 2>&1
echo "exit $?"; tail -5 "$OUT/bench.log"
[ -f "$OUT/bench/report.md" ] && grep -A40 "Variant ladder" "$OUT/bench/report.md" | head -60

stamp "== 4. the seed's shape (32M floats, full sum), cold and hot"
for mode in cold hot; do
  $PY -m harness bench --op reduce_sum --backend torch --backend cupy --cases "$SEED" --mode "$mode" \
    --budget 0.5 --report "$OUT/seed-$mode" -q > "$OUT/seed-$mode.log" 2>&1
  echo "$mode exit $?"
  [ -f "$OUT/seed-$mode/report.md" ] && grep -A12 "Variant ladder" "$OUT/seed-$mode/report.md" | head -14
done

if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in racecheck memcheck; do
    stamp "== sanitize $tool"
    $PY -m harness run --sanitize "$tool" --op reduce_sum --backend cupy --json "$OUT/sanitize-$tool.json" \
      > "$OUT/sanitize-$tool.log" 2>&1
    echo "exit $?"; tail -12 "$OUT/sanitize-$tool.log"
  done
fi
stamp "done"
