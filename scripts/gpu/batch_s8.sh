#!/usr/bin/env bash
# The next H100 call (about 4 minutes): the full-set runs the seventh session's device budget did
# not reach, on the current code.
#   OUT=/some/dir bash scripts/gpu/batch_s8.sh          (from the repo root)
# Steps (STEPS="passes full bench"), each under its own limit (SIGINT: the JSON checkpoint is still written):
#   passes   scripts/gpu/oracle_passes.py: two attention perf cases prepared with their float64 passes on
#            the host and on the GPU ($GRADORACLE_ORACLE_PASSES=cuda), compared and timed  -> passes.log (<= 120 s)
#   (setup)  pip install; the torch_ext build starts in the background (MAX_JOBS=16)
#   full     harness run --cases full, 8 shards each (<= FULL_S):
#              binary_backward through triton (issue 13: the tile path's host code was refactored by
#              7d81a46 after its last full run; the both-broadcast 381 passed on it in s7) -> full-triton/
#              reduce_sum through cupy@best (issue 15: 20 of its 157 cases were past s7's time limit)
#              and binary_backward's both-broadcast cases (both_broadcast_cases.py) through cupy@best
#              (16-bit bb_both back on 16-byte packs, 1 row, after s7's GPU runs)        -> full-cupy/
#              the same both-broadcast cases through torch_ext, after its build         -> full-torch_ext/
#   bench    harness bench (cold) of the three both-broadcast perf cases: cupy@best, torch_ext, triton,
#            torch                                                                     -> bench/ (<= 60 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s8.tgz (res/: everything, re-packed after each step).
set -uo pipefail
PY=${PYTHON:-python3} STEPS=${STEPS:-passes full bench} FULL_S=${FULL_S:-100}
PACK=s8
. scripts/gpu/steps.sh

setup 300
$PY scripts/gpu/both_broadcast_cases.py full "$R/both_full.json" && \
  $PY scripts/gpu/both_broadcast_cases.py perf "$R/both_perf.json" || exit 1

if has passes; then
  stamp "== passes: the attention oracle's float64 passes on the GPU beside the host"
  timeout -s INT 120 $PY scripts/gpu/oracle_passes.py > "$R/passes.log" 2>&1; echo "exit $?"; cat "$R/passes.log"; pack
fi

if has full; then
  stamp "== full: binary_backward through triton"
  full_shards "$FULL_S" --op binary_backward --backend triton --seed 8
  shards_to full-triton
  stamp "== full: reduce_sum and the both-broadcast binary cases through cupy@best"
  full_shards "$FULL_S" --op reduce_sum --backend cupy@best --seed 8
  shards_to full-cupy-reduce
  full_shards "$FULL_S" --op binary_backward --backend cupy@best --cases "$R/both_full.json" --seed 8
  shards_to full-cupy-both
fi
wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
if has full; then
  stamp "== full: the both-broadcast binary cases through torch_ext"
  full_shards "$FULL_S" --op binary_backward --backend torch_ext --cases "$R/both_full.json" --seed 8
  shards_to full-torch_ext-both
fi

if has bench; then
  stamp "== bench: the both-broadcast perf cases"
  timeout -k 15 -s INT 60 $PY -m harness bench --op binary_backward --cases "$R/both_perf.json" --device cuda \
    --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 50 \
    --backend cupy@best --backend torch_ext --backend triton --backend torch --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; grep -E "copy" "$R/bench.log"; pack
fi

{ stamp "== done"; tail -1 "$R/build.log"
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/full-*/full-*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
