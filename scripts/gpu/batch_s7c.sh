#!/usr/bin/env bash
# The seventh session's last H100 call (about 5 minutes): the CUDA memory-bound kernels' full sets on
# the current code (issue 15: the audit found cupy@best's and torch_ext's binary_backward and
# reduce_sum full runs older than later kernel commits), after bb_both's 8-byte packs in 16-bit and
# torch_ext's grid from the driver's resident blocks.
#   OUT=/some/dir bash scripts/gpu/batch_s7c.sh          (from the repo root)
# Steps (STEPS="full bench"), each under its own limit (SIGINT: the JSON checkpoint is still written):
#   (setup)  pip install; the torch_ext build starts in the background (MAX_JOBS=16)
#   full     harness run --cases full of binary_backward and reduce_sum through cupy@best, and
#            binary_backward --cases smoke through cupy@opt (8 shards, <= FULL_S); then, after the
#            build, the same full sets through torch_ext (8 shards, <= FULL_S)  -> full-cupy/, full-torch_ext/
#   bench    harness bench (cold) of binary_rows_s7.json (the 8 row-sum perf cases, B=8x2048x1, and the
#            3 both-broadcast ones): torch_ext, cupy@best, triton, torch          -> bench/ (<= 130 s)
#   lnab     (last) the three triton layernorm perf cases at 83% of copy (ln_finish_s7.json), bench (cold) with
#            the default finish (two launches above LAST_BELOW) and with the one-launch finish for every
#            call (GRADORACLE_TRITON_NORM=last_below=1073741824)                   -> lnab-*/ (<= 45 s each)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s7c.tgz (res/: everything, re-packed after each step).
set -uo pipefail
PY=${PYTHON:-python3} STEPS=${STEPS:-full bench lnab} FULL_S=${FULL_S:-110}
PACK=s7c
. scripts/gpu/steps.sh

setup 300

if has full; then
  stamp "== full: binary_backward + reduce_sum through cupy@best (8 shards, $FULL_S s)"
  full_shards "$FULL_S" --op binary_backward --op reduce_sum --backend cupy@best --seed 7
  shards_to full-cupy
  stamp "== smoke: binary_backward through cupy@opt"
  timeout -s INT 60 $PY -m harness run --cases smoke --device cuda --op binary_backward --backend cupy@opt \
    --json "$R/smoke-opt.json" > "$R/smoke-opt.log" 2>&1; tail -1 "$R/smoke-opt.log"; failures "$R/smoke-opt.log"
fi
wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
if has full; then
  stamp "== full: the same through torch_ext (8 shards, $FULL_S s)"
  full_shards "$FULL_S" --op binary_backward --op reduce_sum --backend torch_ext --seed 7
  shards_to full-torch_ext
fi

if has bench; then
  stamp "== bench: the row-sum and both-broadcast binary perf cases"
  timeout -k 15 -s INT 130 $PY -m harness bench --op binary_backward --cases scripts/gpu/cases/binary_rows_s7.json \
    --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit 120 --backend torch_ext --backend cupy@best --backend triton --backend torch \
    --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; tail -2 "$R/bench.log"; grep -E "copy" "$R/bench.log" | grep -v torch\ \  | head -40; pack
fi

if has lnab; then
  for s in default last_below=1073741824; do
    stamp "== lnab: triton layernorm, $s"
    GRADORACLE_TRITON_NORM=$([ "$s" = default ] || echo "$s") timeout -k 10 -s INT 45 $PY -m harness bench \
      --op layernorm_backward --cases scripts/gpu/cases/ln_finish_s7.json --device cuda --mode cold --budget 0.1 \
      --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 40 --backend triton \
      --report "$R/lnab-${s%%=*}" > "$R/lnab-${s%%=*}.log" 2>&1
    grep -E "copy" "$R/lnab-${s%%=*}.log"; pack
  done
fi

{ stamp "== done"; tail -1 "$R/build.log"
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed' "$f" | tail -1)"; done
  echo "smoke-opt: $(tail -1 "$R/smoke-opt.log" 2>/dev/null)"
  failures "$R"/full-*/full-*.log "$R/smoke-opt.log" 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
