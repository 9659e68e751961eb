#!/usr/bin/env bash
# GPU batch for nb_rows2, the 64-register rows kernel of layernorm_backward / rmsnorm_backward
# (cupy@v6; GRADORACLE_CUPY_NORMS=kernel=rows2 makes cupy@best take it too).  It has passed the
# CPU tests (NVRTC and nvcc compiles, ptxas: <= 64 registers and no spills, the g++ stand-in) and
# has never run on a GPU.  Run from the repo root on a CUDA machine:
#     OUT=/some/dir bash scripts/gpu/cuda_norms_v6.sh
#
#  1. device and versions                                                 -> env.txt
#  2. the kernels cupy@v6 launches compiled in parallel into cupy's cache -> warm.txt
#  3. cupy@v6 on the smoke sets of both ops                               -> smoke.json, smoke.log
#  4. cupy@v6 on the full sets less the perf cases (the benches' final call validates those)
#                                                                         -> full.json, full.log
#  5. the perf cases: cupy@best (today's default), cupy@v6, triton, ops interleaved, new cases
#     stopped after PERF_LIMIT s                                          -> bench_perf/{results.json,report.md}
#  6. knobs of v6 on two bf16 shapes: minrows=8 (rows per block at least when partial rows are
#     written; default 16), prefetch=2 (two rows in flight: ptxas spills it, measured anyway)
#                                                                         -> knobs/<k>/{ln,rms}/report.md
#  7. ncu through `harness profile` of cupy@v6 (and cupy@best with PROFILE_BEST=1) on two bf16
#     shapes                                                              -> profile/*.{txt,json}
# About 7-8 minutes on an H100 with the defaults.  Knobs: PERF_LIMIT=150 (s) BUDGET=0.2 (s per
# pair) KNOBS="minrows=8 prefetch=2" SKIP_KNOBS=1 SKIP_PROFILE=1 PROFILE_BEST=1 DEVICE=cuda.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PERF_LIMIT=${PERF_LIMIT:-150} BUDGET=${BUDGET:-0.2} DEVICE=${DEVICE:-cuda}
SKIP_KNOBS=${SKIP_KNOBS:-0} SKIP_PROFILE=${SKIP_PROFILE:-0} PROFILE_BEST=${PROFILE_BEST:-0}
KNOBS=${KNOBS:-minrows=8 prefetch=2}
OPS=(--op layernorm_backward --op rmsnorm_backward)
mkdir -p "$OUT"
unset GRADORACLE_CUPY_NORMS
WORK=$(mktemp -d /tmp/gradoracle-norms-v6.XXXXXX)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, cupy, numpy; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"

stamp "== compile cupy@v6's kernels (nb_rows2, nb_colsum, the fallback's) in parallel"
timeout 240 python3 - <<'EOF' 2>&1 | tee "$OUT/warm.txt" | tail -8
import sys, time
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, "scripts/gpu")
from cuda_norms_warm import _compile
from backends.cupy import _norm_plan as plan
jobs = [(plan.SOURCES[op], e) for op in (plan.LN, plan.RMS) for dt in plan.DTYPES
        for e in plan.all_kernel_exprs(op, dt) if e.startswith(("nb_rows2", "nb_colsum", "nb_rows<", "nb_chunked"))]
t0 = time.perf_counter()
with ProcessPoolExecutor(14) as pool:
    res = list(pool.map(_compile, jobs))
bad = [(e, err) for e, _, err in res if err]
print(f"compiled {len(jobs) - len(bad)}/{len(jobs)} kernels in {time.perf_counter() - t0:.1f} s")
for e, err in bad:
    print("FAILED", e, err[:1500])
EOF

stamp "== smoke: cupy@v6"
python3 -m harness run "${OPS[@]}" --backend cupy@v6 --cases smoke --device "$DEVICE" --json "$OUT/smoke.json" \
  > "$OUT/smoke.log" 2>&1
echo "exit $?"; tail -4 "$OUT/smoke.log"

stamp "== full (less the perf cases): cupy@v6"
python3 - "$WORK/full_noperf.json" <<'EOF'
import json, sys
from cases import select
cases = [c.to_json() for op in ("layernorm_backward", "rmsnorm_backward") for c in select("full", op=op)
         if "perf" not in c.tags]
json.dump(cases, open(sys.argv[1], "w"))
print(len(cases), "cases")
EOF
timeout 200 python3 -m harness run "${OPS[@]}" --backend cupy@v6 --cases "$WORK/full_noperf.json" --device "$DEVICE" \
  --json "$OUT/full.json" > "$OUT/full.log" 2>&1
echo "exit $?"; tail -4 "$OUT/full.log"

bench_args=(--device "$DEVICE" --mode cold --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10 --max-samples 1000
            --rel-ci 0.005 --no-plots)
stamp "== perf cases: cupy@best, cupy@v6, triton (new cases stop after ${PERF_LIMIT}s)"
timeout $((PERF_LIMIT + 120)) python3 -m harness bench "${OPS[@]}" --cases perf --interleave --time-limit "$PERF_LIMIT" \
  "${bench_args[@]}" --backend cupy@best --backend cupy@v6 --backend triton --report "$OUT/bench_perf" \
  > "$OUT/bench_perf.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR)" "$OUT/bench_perf.log" | cut -c1-220 | head -8
grep -E "^\|" "$OUT/bench_perf/report.md" 2>/dev/null | head -60 | cut -c1-220

LN_BF16='{"op": "layernorm_backward", "dtype": "bf16", "params": {"shape": [2048, 4096]}}'
RMS_BF16='{"op": "rmsnorm_backward", "dtype": "bf16", "params": {"shape": [8192, 4096], "eps": 1e-05}}'
if [ "$SKIP_KNOBS" != 1 ]; then
  for knobs in $KNOBS; do
    stamp "== cupy@v6 with GRADORACLE_CUPY_NORMS=$knobs"
    GRADORACLE_CUPY_NORMS=$knobs timeout 60 python3 -m harness bench --op layernorm_backward --backend cupy@v6 \
      --cases "$LN_BF16" "${bench_args[@]}" --report "$OUT/knobs/$knobs/ln" > "$WORK/knobs-$knobs-ln.log" 2>&1
    echo "exit $?"
    GRADORACLE_CUPY_NORMS=$knobs timeout 60 python3 -m harness bench --op rmsnorm_backward --backend cupy@v6 \
      --cases "$RMS_BF16" "${bench_args[@]}" --report "$OUT/knobs/$knobs/rms" > "$WORK/knobs-$knobs-rms.log" 2>&1
    echo "exit $?"
    grep -hE "^\| " "$OUT/knobs/$knobs"/*/report.md 2>/dev/null | cut -c1-200 | head -8
  done
fi

if [ "$SKIP_PROFILE" != 1 ]; then
  mkdir -p "$OUT/profile"
  impls=(cupy@v6); [ "$PROFILE_BEST" = 1 ] && impls+=(cupy@best)
  for impl in "${impls[@]}"; do
    for spec in "layernorm_backward|$LN_BF16" "rmsnorm_backward|$RMS_BF16"; do
      op=${spec%%|*} case=${spec#*|}
      name="$op-${impl//@/-}"
      stamp "== profile $op $impl"
      timeout 100 python3 -m harness profile --op "$op" --backend "$impl" --case "$case" \
        --json "$OUT/profile/$name.json" > "$OUT/profile/$name.txt" 2>&1
      echo "exit $?"; tail -25 "$OUT/profile/$name.txt" | cut -c1-200
    done
  done
fi

tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
stamp "done"
