#!/usr/bin/env bash
# Issue 15 on an H100 (under 200 s): cupy@best's bb_both, the kernel for binary_backward with both
# operands broadcast and a short Y (mul[*, A=1x2048x4096, B=8x2048x1], 60.9-71.5% of copy before it).
#   OUT=/some/dir bash scripts/gpu/cuda_bb_both.sh          (from the repo root)
# Steps (STEPS="full bench profile" by default), each under its own limit (timeout -s INT: the harness
# still writes its JSON checkpoint):
#   full     harness run --cases full restricted to the both-broadcast cases (scripts/gpu/bb_both_cases.py
#            writes them: 381 cases), cupy@best, 8 shards                    -> full-*.{json,log} (<= 80 s)
#   bench    harness bench (cold) of the three both-broadcast perf cases, cupy@best and torch
#            (torch_ext left out: its build alone takes about 3 minutes)     -> bench/ (<= 60 s)
#   profile  harness profile (ncu) of the bf16 perf case through cupy@best   -> profile.{txt,json} (<= 50 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/bb_both.tgz (res/: everything, re-packed after each step).
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3} STEPS=${STEPS:-full bench profile}
. scripts/gpu/steps.sh
pack() { tar czf "$OUT/bb_both.tgz" -C "$OUT" res; }

stamp "== setup"
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
PYTHONPATH=. $PY scripts/gpu/bb_both_cases.py "$R"

if has full; then
  stamp "== full: the both-broadcast cases through cupy@best (8 shards, 80 s)"
  full_shards 80 --op binary_backward --backend cupy@best --cases "$R/both_full.json"
fi

if has bench; then
  stamp "== bench: the both-broadcast perf cases, cupy@best and torch"
  timeout -k 15 -s INT 60 $PY -m harness bench --op binary_backward --cases "$R/both_perf.json" --device cuda \
    --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 50 \
    --backend cupy@best --backend torch --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; tail -2 "$R/bench.log"
  grep -E "A=1x2048x4096" "$R/bench/report.md" | head -12; pack
fi

if has profile; then
  stamp "== profile: bf16 through cupy@best"
  timeout -s INT 50 $PY -m harness profile --op binary_backward --backend cupy@best \
    --case '{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}' \
    --json "$R/profile.json" > "$R/profile.txt" 2>&1
  tail -14 "$R/profile.txt"; pack
fi

stamp "== done"
{ grep -hE "passed|failed" "$R"/full-*.log 2>/dev/null | tail -8; failures "$R"/full-*.log 2>/dev/null
  grep -E "A=1x2048x4096" "$R/bench/report.md" 2>/dev/null | head -12; head -8 "$R/profile.txt" 2>/dev/null; } \
  > "$OUT/summary.txt"
pack
