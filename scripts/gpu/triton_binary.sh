#!/usr/bin/env bash
# The triton binary_backward on a CUDA machine: correctness of every `full` case, the perf
# benchmark against torch and torch.compile, and the host cost per call.
#   OUT=/some/dir scripts/gpu/triton_binary.sh            (from the repo root)
# Steps (STEPS="host full bench" by default; any subset, in that order):
#   host   scripts/gpu/triton_binary_host.py: per perf shape (bf16, f32 mul), host time per call
#          (planning from scratch, checked, unchecked) against the device time, 200 back-to-back
#          unchecked calls with a sync around them, and the autotuner's choices and timings
#          -> $OUT/host.json, $OUT/host.log                                  (~1-2 min: compiles, tuning)
#   full   python -m harness run --op binary_backward --backend triton --cases full
#          -> $OUT/binary_backward-full-triton.json, $OUT/full.log           (1294 cases, ~4 min)
#          FULL_SPLIT=1 splits it by dtype into two runs (bf16+f16+f64, then f32) of about half each.
#   bench  python -m harness bench --op binary_backward --backend torch --backend torch_compile
#          --backend triton --cases perf --report $OUT/bench  (38 cases x 3; 3-8 min: torch.compile
#          compiles each case afresh; TIME_LIMIT=S stops starting new pairs after S seconds)
#          -> $OUT/bench/{results.json,report.md,plots/}, $OUT/bench.log, and $OUT/summary.txt:
#          triton's % of the copy ceiling per perf case (the bar: >= 88%) and its host time
#          per call against the device time.
# Whole script: about 8-14 minutes on an H100 (a fresh machine compiles every kernel once); where one
# command may run 10 minutes at most, run STEPS="host full" and STEPS=bench as two commands.
# Knobs: PYTHON=python3 DEVICE=cuda STEPS="host full bench" FULL_SPLIT=0 BUDGET=0.3 (bench seconds per
# pair) TIME_LIMIT="" (bench)
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} DEVICE=${DEVICE:-cuda} STEPS=${STEPS:-host full bench} FULL_SPLIT=${FULL_SPLIT:-0}
BUDGET=${BUDGET:-0.3} TIME_LIMIT=${TIME_LIMIT:-}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

stamp "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if has host; then
  stamp "== host cost per call: $PY scripts/gpu/triton_binary_host.py --device $DEVICE --json $OUT/host.json"
  $PY scripts/gpu/triton_binary_host.py --device "$DEVICE" --json "$OUT/host.json" 2>&1 | tee "$OUT/host.log"
  echo "exit ${PIPESTATUS[0]}"
fi

if has full; then
  run=($PY -m harness run --op binary_backward --backend triton --cases full --device "$DEVICE")
  if [ "$FULL_SPLIT" = 1 ]; then
    stamp "== full (bf16, f16, f64)"
    "${run[@]}" --dtype bf16 --dtype f16 --dtype f64 --json "$OUT/binary_backward-full-triton-16-64.json" \
      > "$OUT/full-16-64.log" 2>&1
    echo "exit $?"; tail -4 "$OUT/full-16-64.log"
    stamp "== full (f32)"
    "${run[@]}" --dtype f32 --json "$OUT/binary_backward-full-triton-f32.json" > "$OUT/full-f32.log" 2>&1
    echo "exit $?"; tail -4 "$OUT/full-f32.log"
  else
    stamp "== full: ${run[*]} --json $OUT/binary_backward-full-triton.json"
    "${run[@]}" --json "$OUT/binary_backward-full-triton.json" > "$OUT/full.log" 2>&1
    echo "exit $?"; tail -4 "$OUT/full.log"
  fi
  grep -E "FAIL|ERROR|CRASH" "$OUT"/full*.log | head -20
fi

if has bench; then
  stamp "== bench: perf cases through torch, torch_compile, triton"
  limit=(); [ -n "$TIME_LIMIT" ] && limit=(--time-limit "$TIME_LIMIT")
  $PY -m harness bench --op binary_backward --backend torch --backend torch_compile --backend triton \
    --cases perf --device "$DEVICE" --budget "$BUDGET" "${limit[@]}" --report "$OUT/bench" \
    > "$OUT/bench.log" 2> "$OUT/bench.err"
  echo "exit $?"
  grep -E "^bench:" "$OUT/bench.err" | tail -3
  stamp "== summary (triton: % of copy, host time per call vs device time) -> $OUT/summary.txt"
  $PY - "$OUT/bench/results.json" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == "binary_backward"]
bar, worst = 88.0, []
print(f"{'case':48s} {'status':6s} {'ms':>8s} {'%copy':>6s} {'host_ms':>8s}  torch_compile %copy")
tc = {r["case"]: r for r in rows if r["impl"] == "torch_compile"}
for r in rows:
    if r["impl"] != "triton":
        continue
    t, f = r.get("timing") or {}, r.get("figures") or {}
    pct, host, med = f.get("pct_copy"), t.get("host_ms"), t.get("median")
    other = (tc.get(r["case"], {}).get("figures") or {}).get("pct_copy")
    flags = ("" if pct is None or pct >= bar else "  < 88%") + ("  host > device" if host and med and host > med else "")
    print(f"{r['case']:48s} {r['status']:6s} {med or 0:8.4f} {pct or 0:6.1f} {host or 0:8.4f}  "
          f"{'' if other is None else f'{other:.1f}'}{flags}")
    if pct is not None:
        worst.append((pct, r["case"]))
if worst:
    low = [c for p, c in worst if p < bar]
    print(f"triton: {len(worst)} timed, lowest {min(worst)[0]:.1f}% ({min(worst)[1]}), {len(low)} under {bar:.0f}%")
EOF
fi
stamp "== done"
