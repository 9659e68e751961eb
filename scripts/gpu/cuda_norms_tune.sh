#!/usr/bin/env bash
# GPU batch for issue 15: the cupy norm backwards' best variant under GRADORACLE_CUPY_NORMS'
# knobs: nb_rows3 (kernel=rows3) checked and compared with the first version (nb_rows).  Run from the repo
# root on a CUDA machine:   OUT=/some/dir bash scripts/gpu/cuda_norms_tune.sh      (about 5-6 min)
#
#  1. device, versions, commit                                                    -> tune.txt (top)
#  2. background: `harness run --backend cupy@best --cases perf` of both ops, default settings
#     meanwhile: every kernel the sweep uses compiled in parallel (cupy's disk cache); then the
#     smoke + full (less perf) cases of both ops under the default, kernel=rows3 and
#     kernel=rows3,finish=colsum,stages=2 settings                                -> correctness.log
#  3. the sweep (scripts/gpu/cuda_norms_tune.py): kernel resources (registers, spills, occupancy),
#     then per shape and setting: main-kernel and call device us (cold L2), GB/s, % of a copy of
#     the same bytes, % of the harness's copy ceiling, x torch eager, host us per call, error vs a
#     float64 reference; the ranking of settings                        -> tune.txt, tune.json
#  4. ncu (scripts/gpu/profile_cases.sh) of bf16 2048x4096 and 8192x8192 layernorm_backward under
#     the first version (kernel=rows,launch=cupy) and the sweep's fastest nb_rows3 setting
#                                                                               -> profiles.tar.gz
#  Everything printed also goes to run.log.  Five files under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gradoracle-norms-tune.XXXXXX)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
OPS=(--op layernorm_backward --op rmsnorm_backward)
unset GRADORACLE_CUPY_NORMS

main() {
stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, cupy, numpy; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
  git log -1 --format='commit %H %s' 2>/dev/null
} 2>&1 | tee "$WORK/env.txt"

stamp "== perf cases, cupy@best, default settings (background)"
( timeout 220 python3 -m harness run "${OPS[@]}" --backend cupy@best --cases perf --device cuda \
    > "$WORK/perf.log" 2>&1; echo "exit $?" >> "$WORK/perf.log" ) &
perf_pid=$!

stamp "== compile the sweep's kernels"
timeout 150 python3 scripts/gpu/cuda_norms_tune.py --warm --jobs 12 2>&1 | tail -8

stamp "== smoke + full (less perf) cases under three settings"
python3 - "$WORK/cases.json" <<'EOF'
import json, sys
from cases import select
ops = ("layernorm_backward", "rmsnorm_backward")
cases = [c.to_json() for op in ops for c in select("smoke", op=op)]
cases += [c.to_json() for op in ops for c in select("full", op=op) if "perf" not in c.tags]
json.dump(cases, open(sys.argv[1], "w"))
print(len(cases), "cases")
EOF
ONLY=""  # settings the sweep leaves out: a cooperative finish that failed or hung here
for knobs in "" "kernel=rows3" "kernel=rows3,finish=colsum,stages=2"; do
  echo "--- GRADORACLE_CUPY_NORMS='$knobs'" >> "$WORK/checks.log"
  GRADORACLE_CUPY_NORMS="$knobs" timeout 120 python3 -m harness run "${OPS[@]}" --backend cupy@best \
    --cases "$WORK/cases.json" --device cuda >> "$WORK/checks.log" 2>&1
  rc=$?
  echo "exit $rc" >> "$WORK/checks.log"
  echo "settings '$knobs': exit $rc: $(grep -E 'passed|failed' "$WORK/checks.log" | tail -1)"
  if [ "$knobs" = "kernel=rows3" ] && [ $rc -ne 0 ]; then
    ONLY="--only rows-cupy,rows,colsum,colsum-s3,colsum-cupy"
    echo "kernel=rows3 (cooperative finish) failed (exit $rc): the sweep leaves the coop settings out"
  fi
done

stamp "== waiting for the perf cases"
wait "$perf_pid"
grep -vE "^PASS" "$WORK/perf.log" | tail -12

stamp "== sweep"
timeout 200 python3 scripts/gpu/cuda_norms_tune.py --json "$OUT/tune.json" --time-limit 85 --samples 20 $ONLY \
  2>&1 | tee "$WORK/sweep.txt"

stamp "== ncu: first version and the fastest nb_rows3 setting"
best=$(python3 scripts/gpu/cuda_norms_tune.py --best-from "$OUT/tune.json" 2>/dev/null || echo "")
echo "fastest nb_rows3 setting: '${best}'"
cat > "$WORK/profile.list" <<'EOF'
layernorm_backward cupy@best {"op": "layernorm_backward", "dtype": "bf16", "params": {"shape": [2048, 4096]}}
layernorm_backward cupy@best {"op": "layernorm_backward", "dtype": "bf16", "params": {"shape": [8192, 8192]}}
EOF
OUT="$WORK/prof-rows" GRADORACLE_CUPY_NORMS="kernel=rows,launch=cupy" timeout 75 \
  bash scripts/gpu/profile_cases.sh "$WORK/profile.list" 2>&1
OUT="$WORK/prof-best" GRADORACLE_CUPY_NORMS="$best" timeout 75 \
  bash scripts/gpu/profile_cases.sh "$WORK/profile.list" 2>&1
echo "$best" > "$WORK/prof-best/settings.txt" 2>/dev/null
tar czf "$OUT/profiles.tar.gz" -C "$WORK" prof-rows prof-best 2>/dev/null

stamp "== files"
{
  cat "$WORK/env.txt"
  echo
  echo "== correctness: perf cases (default settings)"
  grep -E "passed|failed|^exit" "$WORK/perf.log" | tail -2
  echo "== correctness: smoke + full (less perf) under each setting"
  grep -E "^--- |passed|failed|^exit" "$WORK/checks.log"
  echo
  cat "$WORK/sweep.txt"
} > "$OUT/tune.txt"
cat "$WORK/perf.log" "$WORK/checks.log" > "$OUT/correctness.log"
ls -la "$OUT"
stamp "done"
}

main 2>&1 | tee "$OUT/run.log"
