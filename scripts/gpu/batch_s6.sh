#!/usr/bin/env bash
# Issue 13's last H100 steps, one call (about 8.5 minutes): the triton norms' one-launch finish for small
# calls through the full set, then the norms perf bench beside the baselines with the default that passed.
#   OUT=/some/dir bash scripts/gpu/batch_s6.sh          (from the repo root)
# Steps (STEPS="full bench" by default), each under its own time limit (timeout -s INT: the harness still
# writes its JSON checkpoint):
#   full   harness run --cases full, triton, layernorm_backward + rmsnorm_backward, 8 shards side by side,
#          with GRADORACLE_TRITON_NORM=last_below=33554432 (41 of the 120 cases take finish "last",
#          which has not run the full set on the H100)                       -> full-*.{json,log} (<= 150 s)
#   bench  harness bench (cold) of the norms perf cases: triton, torch, torch_compile, jax, cupy@best (no
#          torch_ext: its build takes 3 minutes), last_below on only if every full case passed above -> bench/ (<= 330 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s6.tgz (res/: everything, re-packed after each step).
# Then: flip GPU_DEFAULT's last_below to LAST_BELOW_CANDIDATE if `full` says 120/120, and regenerate the
# norms sections of BENCHMARKS.md with `python -m harness bench --from res/bench/results.json ...`.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
PY=${PYTHON:-python3} STEPS=${STEPS:-full bench} LAST="last_below=33554432"
. scripts/gpu/steps.sh
pack() { tar czf "$OUT/s6.tgz" -C "$OUT" res; }
ops=(--op layernorm_backward --op rmsnorm_backward)

stamp "== setup"
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1

passed=0
if has full; then
  stamp "== full: triton norms with $LAST"
  pids=()
  for k in 0 1 2 3 4 5 6 7; do
    GRADORACLE_TRITON_NORM=$LAST timeout -s INT 150 $PY -m harness run --backend triton "${ops[@]}" --cases full \
      --device cuda --shard "$k/8" --json "$R/full-$k.json" > "$R/full-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  passed=$($PY - "$R" <<'EOF'
import glob, json, sys
rows = [r for f in glob.glob(sys.argv[1] + "/full-*.json") for r in json.load(open(f))["results"]]
ok = sum(r["status"] == "PASS" for r in rows)
print(ok, file=sys.stderr)
print(ok)
EOF
)
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log
  echo "full: $passed of 120 PASS"; pack
fi

if has bench; then
  env=(); [ "$passed" = 120 ] && env=(GRADORACLE_TRITON_NORM=$LAST)
  stamp "== bench: norms perf cases (${env[*]:-default sizing})"
  env "${env[@]}" timeout -s INT 330 $PY -m harness bench --device cuda --cases perf --mode cold --budget 0.1 \
    --warmup-budget 0.05 --min-samples 10 --max-samples 400 --interleave --time-limit 310 --no-plots -q "${ops[@]}" \
    --backend torch --backend torch_compile --backend jax --backend triton --backend cupy@best \
    --report "$R/bench" > "$R/bench.log" 2>&1
  echo "bench exit $?"; tail -5 "$R/bench.log"; pack
fi

{ stamp "== done"; for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  echo "full: $passed of 120 PASS"; tail -5 "$R/bench.log" 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"
