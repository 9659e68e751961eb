#!/usr/bin/env bash
# The tenth session's H100 calls: what issues 16 and 14 still lack after the ninth (repo root).
#   STEPS="cuda stem" OUT=/some/dir bash scripts/gpu/batch_s10.sh      (issue 16: about 7 minutes)
#   STEPS=ladder OUT=...                                                (issue 16: the ladder's 6 cases left)
#   STEPS=triton OUT=...  then  STEPS=triton LEFT=1 OUT=...             (issue 14: the full sets)
# Steps:
#   (setup) the torch_ext build starts in the background (MAX_JOBS=8) when a step needs torch_ext
#   cuda    the conv full pairs no run passed (scripts/gpu/full_left.py): conv_left_cupy_s10.json through
#           cupy@best and cupy@pertap (8 shards), then after the build tc_left_torch_ext_s10.json through
#           torch_ext (the 124 conv/matmul cases its shards did not reach, and the 18 small-Cin wgrad cases
#           its plan now gives the merged-tap kernel), FULL_S each                 -> full-cupy/, full-torch_ext/
#           Then cupy@smallc (the small-Cin dgrad, on trial) on its 24 full cases (smallc_full_s10.json)
#   stem    harness bench (cold) of the six stem wgrad perf cases: cupy@best (merged taps), torch_ext, triton
#           (merged taps too, MT), torch; of the six stem dgrad perf cases (dgrad_stem_s10.json): cupy@smallc,
#           cupy@best, torch_ext, triton, torch;
#           then harness profile of scripts/gpu/cases/profile_tc_s10.txt (the stem kernels, and two GQA 64:8
#           attention cases for issue 17)                                           -> stem/, stem-d/, profile/
#   ladder  the matmul ladder resumed from LADDER_RESUME (default: the ninth session's document), LADDER_S
#           -> ladder/
#   triton  attention_backward, conv_backward_{data,weight}, matmul_backward --cases full through triton,
#           8 shards (FULL_S); with LEFT=1 only the pairs results/h100/s10/triton*/ lack (full_left.py)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s10.tgz (res/); copy res/ to results/h100/s10/ after each call.
set -uo pipefail
export MAX_JOBS=${MAX_JOBS:-8}
PY=${PYTHON:-python3} STEPS=${STEPS:-cuda stem} LADDER_S=${LADDER_S:-240} FULL_S=${FULL_S:-110}
LADDER_RESUME=${LADDER_RESUME:-results/h100/s9b/taps-ladder-call/ladder.json}
PACK=s10
. scripts/gpu/steps.sh
C=scripts/gpu/cases

if has cuda || has stem || has ladder; then setup 450; else setup; build=; fi
if has cuda; then
  stamp "== cuda: the conv full pairs left, cupy@best and cupy@pertap"
  full_shards "$FULL_S" --cases $C/conv_left_cupy_s10.json --backend cupy@best --backend cupy@pertap --seed 10
  shards_to full-cupy
  stamp "== cuda: cupy@smallc on its full cases"
  timeout -s INT 100 $PY -m harness run --cases $C/smallc_full_s10.json --device cuda --backend cupy@smallc \
    --seed 10 --json "$R/smallc.json" > "$R/smallc.log" 2>&1
  tail -1 "$R/smallc.log"; failures "$R/smallc.log"; pack
fi
[ -n "$build" ] && wait "$build" && stamp "build: $(tail -1 "$R/build.log")"
if has cuda; then
  stamp "== cuda: the conv/matmul full pairs left, torch_ext"
  full_shards "$FULL_S" --cases $C/tc_left_torch_ext_s10.json --backend torch_ext --seed 10
  shards_to full-torch_ext
fi
if has stem; then
  stamp "== stem: the stem wgrad perf cases, merged taps beside cuDNN"
  timeout -k 20 -s INT 150 $PY -m harness bench --op conv_backward_weight --cases $C/wgrad_stem_s9.json \
    --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit 120 --backend cupy@best --backend torch_ext --backend triton --backend torch --report "$R/stem" > "$R/stem.log" 2>&1
  echo "exit $?"; grep -E "cupy|torch" "$R/stem.log" | head -20
  timeout -k 20 -s INT 150 $PY -m harness bench --op conv_backward_data --cases $C/dgrad_stem_s10.json \
    --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit 120 --backend cupy@smallc --backend cupy@best --backend torch_ext --backend triton --backend torch \
    --report "$R/stem-d" > "$R/stem-d.log" 2>&1
  echo "exit $?"; grep -E "cupy|torch" "$R/stem-d.log" | head -26
  profile $C/profile_tc_s10.txt '^cupy'; pack
fi
if has ladder; then
  stamp "== ladder: matmul_backward perf cases left, resumed"
  timeout -k 20 -s INT $((LADDER_S + 90)) $PY -m harness bench --op matmul_backward --cases perf --device cuda \
    --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit "$LADDER_S" --resume "$LADDER_RESUME" \
    --backend cupy@naive --backend cupy@regtile --backend cupy@smem --backend cupy@best --backend torch \
    --backend triton --backend torch_ext --report "$R/ladder" > "$R/ladder.log" 2>&1
  echo "exit $?"; tail -2 "$R/ladder.log"
  $PY scripts/gpu/tflops_table.py "$R/ladder/results.json" --impl cupy@naive --impl cupy@regtile --impl cupy@smem \
    --impl cupy@best --impl torch_ext --impl triton --impl torch --ratio cupy@best/torch --ratio torch_ext/torch \
    --ratio triton/torch --host cupy@best | tee "$R/ladder_table.txt"; pack
fi
if has triton; then
  TOPS="--op attention_backward --op conv_backward_data --op conv_backward_weight --op matmul_backward"
  cases=full
  if [ -n "${LEFT:-}" ]; then
    $PY scripts/gpu/full_left.py $TOPS --backend triton --out "$R/triton_left.json" \
      $(find results/h100/s10 -path '*triton*' -name 'full-*.json') | grep -v '^  left'
    cases=$R/triton_left.json
  fi
  stamp "== triton: the tensor-core ops' full sets ($cases)"
  full_shards "$FULL_S" --cases "$cases" $TOPS --backend triton --seed 10
  shards_to "full-triton${LEFT:+-left}"
fi

{ stamp "== done"; tail -1 "$R/build.log" 2>/dev/null
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/full-*/full-*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
