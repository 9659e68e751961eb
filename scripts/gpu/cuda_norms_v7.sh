#!/usr/bin/env bash
# GPU batch for nb_rows3, the rows kernel of layernorm_backward / rmsnorm_backward with its loads
# copied into shared memory rows ahead (cupy@v7; GRADORACLE_CUPY_NORMS=kernel=rows3 makes cupy@best
# take it too).  It has passed the CPU tests (NVRTC and nvcc compiles, ptxas: <= 64 registers and no
# spills for every instantiation the planner picks, the g++ stand-in with the harness's checks, the
# Python emulator) and has never run on a GPU.  Run from the repo root on a CUDA machine:
#     OUT=/some/dir bash scripts/gpu/cuda_norms_v7.sh
#
#  0. pip install -e . (no deps), device and versions                     -> env.txt
#  1. the kernels cupy@v7 can launch compiled in parallel into cupy's cache -> warm.txt
#  2. cupy@v7 on the smoke sets of both ops, and again with finish=colsum  -> smoke{,_colsum}.{json,log}
#  3. cupy@v7 on the full sets less the perf cases (the bench validates those: its last call of
#     each case is checked against the oracle)                            -> full.json, full.log
#  4. the perf cases: cupy@best (today's default), cupy@v7, triton, torch, ops interleaved, new
#     cases stopped after PERF_LIMIT s                                     -> bench_perf/{results.json,report.md}
#  5. knobs of v7 on two bf16 shapes (LN 2048x4096, RMS 4096x8192): finish=colsum (a second
#     kernel instead of the fused cooperative finish), stages=3 (fewer copies in flight),
#     minrows=8 (rows per block at least: more blocks, more partial rows)
#                                                                          -> knobs/<k>/{ln,rms}/report.md
#  6. ncu through `harness profile` of cupy@v7 on the same two shapes       -> profile/*.{txt,json}
# About 7-8 minutes on an H100 with the defaults.  Knobs: PERF_LIMIT=140 (s) BUDGET=0.2 (s per
# pair) KNOBS="finish=colsum stages=3 minrows=8" SKIP_KNOBS=1 SKIP_PROFILE=1 SKIP_FULL=1
# DEVICE=cuda.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PERF_LIMIT=${PERF_LIMIT:-140} BUDGET=${BUDGET:-0.2} DEVICE=${DEVICE:-cuda}
SKIP_KNOBS=${SKIP_KNOBS:-0} SKIP_PROFILE=${SKIP_PROFILE:-0} SKIP_FULL=${SKIP_FULL:-0}
KNOBS=${KNOBS:-finish=colsum stages=3 minrows=8}
OPS=(--op layernorm_backward --op rmsnorm_backward)
mkdir -p "$OUT"
unset GRADORACLE_CUPY_NORMS
WORK=$(mktemp -d /tmp/gradoracle-norms-v7.XXXXXX)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== install, device"
pip install -q -e . --no-deps --no-build-isolation > "$WORK/pip.log" 2>&1 || { echo "pip install failed"; tail -5 "$WORK/pip.log"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, cupy, numpy; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"

stamp "== compile cupy@v7's kernels (nb_rows3, nb_colsum, the fallbacks') in parallel"
timeout 240 python3 - <<'PY' 2>&1 | tee "$OUT/warm.txt" | tail -8
import sys, time
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, "scripts/gpu")
from cuda_norms_warm import _compile
from backends.cupy import _norm_plan as plan
jobs = [(plan.SOURCES[op], e) for op in (plan.LN, plan.RMS) for dt in plan.DTYPES
        for e in plan.all_kernel_exprs(op, dt) if e.startswith(("nb_rows3", "nb_colsum", "nb_rows<", "nb_chunked"))]
t0 = time.perf_counter()
with ProcessPoolExecutor(14) as pool:
    res = list(pool.map(_compile, jobs))
bad = [(e, err) for e, _, err in res if err]
print(f"compiled {len(jobs) - len(bad)}/{len(jobs)} kernels in {time.perf_counter() - t0:.1f} s")
for e, err in bad:
    print("FAILED", e, err[:1500])
PY

stamp "== smoke: cupy@v7"
python3 -m harness run "${OPS[@]}" --backend cupy@v7 --cases smoke --device "$DEVICE" --json "$OUT/smoke.json" \
  > "$OUT/smoke.log" 2>&1
echo "exit $?"; tail -4 "$OUT/smoke.log"
stamp "== smoke: cupy@v7 with finish=colsum (the rows phase alone, then nb_colsum: no cooperative launch)"
GRADORACLE_CUPY_NORMS=finish=colsum python3 -m harness run "${OPS[@]}" --backend cupy@v7 --cases smoke \
  --device "$DEVICE" --json "$OUT/smoke_colsum.json" > "$OUT/smoke_colsum.log" 2>&1
echo "exit $?"; tail -4 "$OUT/smoke_colsum.log"

if [ "$SKIP_FULL" != 1 ]; then
  stamp "== full (less the perf cases): cupy@v7"
  python3 - "$WORK/full_noperf.json" <<'PY'
import json, sys
from cases import select
cases = [c.to_json() for op in ("layernorm_backward", "rmsnorm_backward") for c in select("full", op=op)
         if "perf" not in c.tags]
json.dump(cases, open(sys.argv[1], "w"))
print(len(cases), "cases")
PY
  timeout 200 python3 -m harness run "${OPS[@]}" --backend cupy@v7 --cases "$WORK/full_noperf.json" --device "$DEVICE" \
    --json "$OUT/full.json" > "$OUT/full.log" 2>&1
  echo "exit $?"; tail -4 "$OUT/full.log"
fi

bench_args=(--device "$DEVICE" --mode cold --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10 --max-samples 1000
            --rel-ci 0.005 --no-plots)
stamp "== perf cases: cupy@best, cupy@v7, triton, torch (new cases stop after ${PERF_LIMIT}s)"
timeout $((PERF_LIMIT + 120)) python3 -m harness bench "${OPS[@]}" --cases perf --interleave --time-limit "$PERF_LIMIT" \
  "${bench_args[@]}" --backend cupy@best --backend cupy@v7 --backend triton --backend torch --report "$OUT/bench_perf" \
  > "$OUT/bench_perf.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR)" "$OUT/bench_perf.log" | cut -c1-220 | head -8
grep -E "^\|" "$OUT/bench_perf/report.md" 2>/dev/null | head -80 | cut -c1-220

LN_BF16='{"op": "layernorm_backward", "dtype": "bf16", "params": {"shape": [2048, 4096]}}'
RMS_BF16='{"op": "rmsnorm_backward", "dtype": "bf16", "params": {"shape": [4096, 8192], "eps": 1e-05}}'
if [ "$SKIP_KNOBS" != 1 ]; then
  for knobs in $KNOBS; do
    stamp "== cupy@v7 with GRADORACLE_CUPY_NORMS=$knobs"
    GRADORACLE_CUPY_NORMS=$knobs timeout 60 python3 -m harness bench --op layernorm_backward --backend cupy@v7 \
      --cases "$LN_BF16" "${bench_args[@]}" --report "$OUT/knobs/$knobs/ln" > "$WORK/knobs-$knobs-ln.log" 2>&1
    echo "exit $?"
    GRADORACLE_CUPY_NORMS=$knobs timeout 60 python3 -m harness bench --op rmsnorm_backward --backend cupy@v7 \
      --cases "$RMS_BF16" "${bench_args[@]}" --report "$OUT/knobs/$knobs/rms" > "$WORK/knobs-$knobs-rms.log" 2>&1
    echo "exit $?"
    grep -hE "^\| " "$OUT/knobs/$knobs"/*/report.md 2>/dev/null | cut -c1-200 | head -8
  done
fi

if [ "$SKIP_PROFILE" != 1 ]; then
  mkdir -p "$OUT/profile"
  for spec in "layernorm_backward|$LN_BF16" "rmsnorm_backward|$RMS_BF16"; do
    op=${spec%%|*} case=${spec#*|}
    name="$op-cupy-v7"
    stamp "== profile $op cupy@v7"
    timeout 100 python3 -m harness profile --op "$op" --backend cupy@v7 --case "$case" \
      --json "$OUT/profile/$name.json" > "$OUT/profile/$name.txt" 2>&1
    echo "exit $?"; tail -25 "$OUT/profile/$name.txt" | cut -c1-200
  done
fi

tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
stamp "done"
