#!/usr/bin/env bash
# The SM clock under triton's and cuBLAS's 14336-wide bf16 GEMMs (repo root, OUT=...): in the fifteenth
# session's one-run matmul table triton's samples on these 4 cases ran at 1590-1740 MHz (throttled_all)
# and torch's at 1980. Three harness bench runs of the 4 cases (scripts/gpu/cases/mm_14336.json), triton
# and torch, with nvidia-smi sampling clock, power, temperature and clock-event reasons every 50 ms:
#   a  as the one-run table ran it (triton tunes on its first checked call, just before it is timed)
#   b  the same, the tune file from a (no tuning: does the kernel itself bring the clock down?)
#   c  b with 200 samples each (about 0.3 s of back-to-back calls of both: sustained load)
# -> $OUT/{smi.csv, a/, b/, c/, *.log, tables.txt}
set -uo pipefail
PY=${PYTHON:-python3}
R=$OUT
timeout 60 $PY -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv,nounits -lms 50 > "$R/smi.csv" 2>&1 &
smi=$!
export GRADORACLE_TUNE_FILE=$R/tune.json
B="--cases scripts/gpu/cases/mm_14336.json --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --no-plots -q"
for run in a b c; do
  s="--min-samples 10 --max-samples 300"; [ $run = c ] && s="--min-samples 200 --max-samples 200"
  echo "[$(date +%T)] run $run"
  timeout -s INT 150 $PY -m harness bench --op matmul_backward $B $s --backend triton --backend torch \
    --report "$R/$run" > "$R/$run.log" 2>&1
  echo "exit $?"
  $PY - "$R/$run/results.json" <<'PY' | tee -a "$R/tables.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[1])
for r in d["rows"]:
    t = r.get("timing") or {}; c = t.get("clocks") or {}
    print(f'{r["impl"]:8s} {r["case"]:56s} {r["time_ms"] or 0:8.4f} ms  n={t.get("n")}  MHz min/med/max '
          f'{c.get("min_mhz")}/{c.get("median_mhz")}/{c.get("max_mhz")}  throttled_all={t.get("throttled_all")}  '
          f'first={t.get("warmup", {}).get("first_ms")}')
PY
done
kill $smi
