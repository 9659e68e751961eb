#!/usr/bin/env bash
# The triton binary_backward where BOTH operands broadcast, on an H100 (under 150 s): the batch kernel
# (backends/triton/binary_backward.py `_batch_kernel`, issue 13) against the generic tile kernel it replaces.
#   OUT=/some/dir bash scripts/gpu/triton_bb_both.sh          (from the repo root)
# Steps (STEPS="full bench profile" by default), each under its own limit (timeout -s INT: the harness
# still writes its JSON checkpoint):
#   full     harness run --cases full of the cases where both operands broadcast (the registry's full
#            cases filtered by scripts/gpu/both_broadcast_cases.py: 381), 8 shards -> full-*.{json,log} (<= 45 s)
#   bench    harness bench (cold) of the three both-broadcast perf cases mul[bf16|f16|f32,
#            A=1x2048x4096, B=8x2048x1] through triton (autotuned: the batch kernel's candidates and the
#            tile kernel), triton@no_batch (the tile kernel pinned: the old plan), triton@batch4 and torch
#                                                                      -> bench/, bench.log (<= 50 s)
#   profile  harness profile (ncu) of the bf16 case through triton     -> profile.{json,txt} (the rest, <= 45 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/bb.tgz (res/: everything, re-packed after each step).
set -uo pipefail
export PYTHONUNBUFFERED=1 GRADORACLE_TRITON_VARIANTS=no_batch,batch4
PY=${PYTHON:-python3} STEPS=${STEPS:-full bench profile}
. scripts/gpu/steps.sh
pack() { tar czf "$OUT/bb.tgz" -C "$OUT" res; }
CASE='{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}'

stamp "== setup"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tail -1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
$PY scripts/gpu/both_broadcast_cases.py full "$R/both_full.json" && \
  $PY scripts/gpu/both_broadcast_cases.py perf "$R/both_perf.json" || exit 1

if has full; then
  stamp "== full: triton on the both-broadcast full cases (8 shards, 45 s)"
  full_shards 45 --op binary_backward --backend triton --cases "$R/both_full.json"
fi

if has bench; then
  stamp "== bench: the both-broadcast perf cases"
  timeout -k 10 -s INT 50 $PY -m harness bench --op binary_backward --cases "$R/both_perf.json" --device cuda \
    --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 45 \
    --backend triton --backend triton@no_batch --backend triton@batch4 --backend torch \
    --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; tail -25 "$R/bench.log"; pack
fi

if has profile; then
  left=$(( 145 - ($(date +%s) - t0) ))
  stamp "== profile: triton, $CASE (${left} s)"
  if (( left > 20 )); then
    timeout -k 5 -s INT "$left" $PY -m harness profile --op binary_backward --backend triton --case "$CASE" \
      --json "$R/profile.json" > "$R/profile.txt" 2>&1
    echo "exit $?"; tail -30 "$R/profile.txt"
  else
    echo "skipped: ${left} s left of 145"
  fi
  pack
fi

{ stamp "== done"
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log; tail -25 "$R/bench.log" 2>/dev/null; grep -iE "duration|dram|throughput" "$R/profile.txt" 2>/dev/null | head -8
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
