#!/usr/bin/env bash
# The next H100 calls: the five full cases the eighth session's shards did not reach, and the attention
# perf cases still unbenched (issue 17).
#   OUT=/some/dir bash scripts/gpu/batch_s9.sh                                  (first call)
#   RESUME=results/h100/s9/attn/results.json STEPS=attn OUT=... bash scripts/gpu/batch_s9.sh   (the next ones)
# Steps (STEPS="left attn ext"):
#   (setup) pip install; the torch_ext build starts in the background with MAX_JOBS=8, so that the
#           bench's case preparation keeps half the cores (s8b's 16-job build beside 16 harness
#           processes slowed every step)
#   left    harness run of the cases no run reached on the current code: triton binary_backward
#           (scripts/gpu/cases/binary_left_s9.json, 3 cases of 64M elements) and cupy@best rmsnorm
#           (rmsnorm_left_s9.json, 2 cases)                                           -> left/
#   attn    harness bench (cold) of the attention perf cases (attn_rest_s8.json) that
#           $RESUME (default: results/h100/s8b/attn/results.json, s8b's 9 cases) has no verdict for, through
#           cupy@best, triton (and triton@det: the backend's name selects both), SDPA flash and SDPA
#           cuDNN (a case $RESUME's limit cut part-way runs whole again: bench.left_to_run);
#           float64 passes on the GPU, no prefetch; ATTN_S the time limit. A pair can take a
#           minute on the S=16k cases (preparation, cupy's tuning, triton's autotuning), so the kill
#           comes 150 s after the limit                                               -> attn/
#   ext     after the build: the two rmsnorm cases through torch_ext                   -> left/
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/attn_table.txt, $OUT/results.json (the attention bench,
# also inside the tgz), $OUT/s9.tgz (res/).
set -uo pipefail
export MAX_JOBS=${MAX_JOBS:-8}
PY=${PYTHON:-python3} STEPS=${STEPS:-left attn ext} ATTN_S=${ATTN_S:-330}
RESUME=${RESUME:-results/h100/s8b/attn/results.json}
PACK=s9
. scripts/gpu/steps.sh

if has ext; then setup 500; else setup; fi
mkdir -p "$R/left"
if has left; then
  stamp "== left: the full cases no run reached on the current code"
  timeout -s INT 100 $PY -m harness run --cases scripts/gpu/cases/binary_left_s9.json --device cuda \
    --backend triton --seed 8 --json "$R/left/triton.json" > "$R/left/triton.log" 2>&1 &
  p1=$!
  timeout -s INT 100 $PY -m harness run --cases scripts/gpu/cases/rmsnorm_left_s9.json --device cuda \
    --backend cupy@best --seed 8 --json "$R/left/cupy.json" > "$R/left/cupy.log" 2>&1
  wait $p1
  for f in "$R"/left/*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/left/*.log; pack
fi

if has attn; then
  stamp "== attn: the attention perf cases $RESUME has no verdict for (limit $ATTN_S s)"
  GRADORACLE_ORACLE_PASSES=cuda timeout -k 20 -s INT $((ATTN_S + 150)) $PY -m harness bench \
    --op attention_backward --cases scripts/gpu/cases/attn_rest_s8.json --device cuda --mode cold \
    --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots --prefetch 0 \
    --time-limit "$ATTN_S" --resume "$RESUME" \
    --backend cupy@best --backend triton --backend sdpa_flash --backend sdpa_cudnn \
    --report "$R/attn" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -3 "$R/attn.log"
  $PY scripts/gpu/tflops_table.py "$R/attn/results.json" --impl cupy@best --impl triton --impl triton@det \
    --impl sdpa_flash --impl sdpa_cudnn --ratio cupy@best/sdpa_flash --ratio cupy@best/sdpa_cudnn \
    --ratio triton/sdpa_flash --host cupy@best > "$OUT/attn_table.txt" 2>&1
  cat "$OUT/attn_table.txt"; cp "$R/attn/results.json" "$OUT/results.json"; pack
fi

if has ext; then
  wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
  stamp "== ext: the two rmsnorm cases through torch_ext"
  timeout -s INT 100 $PY -m harness run --cases scripts/gpu/cases/rmsnorm_left_s9.json --device cuda \
    --backend torch_ext --seed 8 --json "$R/left/torch_ext.json" > "$R/left/torch_ext.log" 2>&1
  tail -1 "$R/left/torch_ext.log"; failures "$R/left/torch_ext.log"; pack
fi

{ stamp "== done"
  for f in "$R"/left/*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/left/*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
