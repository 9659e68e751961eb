#!/usr/bin/env bash
# Issues 13 and 15 on an H100 (about 6 minutes): binary_backward with both operands broadcast
# (mul[*, A=1x2048x4096, B=8x2048x1]: triton 76-80% of copy, cupy@best 61-72% before this), through
# triton's _batch_kernel, cupy@best's and torch_ext's bb_both.
#   OUT=/some/dir bash scripts/gpu/bb_both.sh          (from the repo root)
# Steps (STEPS="full bench profile"), each under its own limit (timeout -s INT: the harness still writes
# its JSON checkpoint); the torch_ext build runs in the background from the start:
#   full     harness run --cases full restricted to the both-broadcast cases (both_broadcast_cases.py: 381
#            cases), triton and cupy@best, 8 shards (<= 110 s), then torch_ext after its build (<= 70 s)
#   bench    harness bench (cold) of the three both-broadcast perf cases: triton, triton@no_batch (the old
#            tile kernel), cupy@best, torch_ext, torch                          -> bench/ (<= 90 s)
#   profile  harness profile (ncu) of the bf16 perf case through triton and cupy@best -> profile-*.{txt,json}
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/bb_both.tgz (res/: everything, re-packed after each step).
set -uo pipefail
export GRADORACLE_TRITON_VARIANTS=no_batch,batch4  # triton@no_batch, @batch4 (PRESETS)
PY=${PYTHON:-python3} STEPS=${STEPS:-full bench profile}
PACK=bb_both
. scripts/gpu/steps.sh
CASE='{"op":"binary_backward","dtype":"bf16","params":{"fn":"mul","a":[1,2048,4096],"b":[8,2048,1]}}'

setup 300
$PY scripts/gpu/both_broadcast_cases.py full "$R/both_full.json" && \
  $PY scripts/gpu/both_broadcast_cases.py perf "$R/both_perf.json" || exit 1

if has full; then
  stamp "== full: the both-broadcast cases through triton and cupy@best (8 shards, 110 s)"
  full_shards 110 --op binary_backward --backend triton --backend cupy@best --cases "$R/both_full.json"
  shards_to full-kernels
fi
wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
if has full; then
  stamp "== full: the same cases through torch_ext (8 shards, 70 s)"
  full_shards 70 --op binary_backward --backend torch_ext --cases "$R/both_full.json"
  shards_to full-torch_ext
fi

if has bench; then
  stamp "== bench: the both-broadcast perf cases"
  timeout -k 15 -s INT 90 $PY -m harness bench --op binary_backward --cases "$R/both_perf.json" --device cuda \
    --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 80 \
    --backend triton --backend triton@no_batch --backend triton@batch4 --backend cupy@best --backend torch_ext --backend torch \
    --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; tail -2 "$R/bench.log"; grep -E "A=1x2048x4096|copy" "$R/bench.log" | head -20; pack
fi

if has profile; then
  for impl in triton cupy@best; do
    stamp "== profile: bf16 through $impl"
    timeout -s INT 50 $PY -m harness profile --op binary_backward --backend "$impl" --case "$CASE" \
      --json "$R/profile-${impl//@/-}.json" > "$R/profile-${impl//@/-}.txt" 2>&1
    tail -8 "$R/profile-${impl//@/-}.txt"; pack
  done
fi

{ stamp "== done"; tail -1 "$R/build.log"
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*/full-*.log; grep -E "A=1x2048x4096" "$R/bench.log"; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
