#!/usr/bin/env bash
# Issue 16 on the H100: the profiles its misses lack, the matmul ladder on the perf cases, and the conv
# full sets through cupy@best, cupy@taps and torch_ext. Three calls of under 10 minutes each (repo root):
#   STEPS=profile OUT=/some/dir bash scripts/gpu/batch_s9b.sh
#   STEPS="taps ladder" OUT=/some/dir bash scripts/gpu/batch_s9b.sh
#   STEPS=full OUT=/some/dir bash scripts/gpu/batch_s9b.sh
# Steps:
#   (setup)  the torch_ext build starts in the background (MAX_JOBS=8: the steps keep half the cores)
#   profile  harness profile (ncu) of each line of scripts/gpu/cases/profile_tc_s9.txt: the mma.sync matmul,
#            the Cin=3 stem dgrad/wgrad, channels-first dgrad, 1x1 and 3x3 wgrad, all cupy@best  -> profile/
#   ladder   harness bench (cold) of matmul_backward's perf cases: cupy@naive, @regtile, @smem, @best,
#            torch (cuBLAS), triton; then torch_ext after the build, resumed into the same document
#            (LADDER_S each)                                                            -> ladder/
#   taps     harness bench (cold) of the six Cin=3 stem wgrad perf cases (wgrad_stem_s9.json): cupy@taps
#            (every tap in one GEMM, not yet run on a GPU) beside cupy@best and torch (cuDNN)  -> taps/
#   full     conv_backward_data + conv_backward_weight --cases full, 8 shards, through cupy@best and
#            cupy@taps (the wgrad kernels' shared helpers are new since the last GPU run), then
#            torch_ext after the build (FULL_S each); matmul_backward full through torch_ext  -> full-*/
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s9b.tgz (res/), $OUT/ladder.json (the ladder's results).
set -uo pipefail
export MAX_JOBS=${MAX_JOBS:-8}
PY=${PYTHON:-python3} STEPS=${STEPS:-profile ladder full} LADDER_S=${LADDER_S:-100} FULL_S=${FULL_S:-110}
PACK=s9b
. scripts/gpu/steps.sh

if has ladder || has full || has taps; then setup 450; else setup; build=; fi
if has profile; then profile scripts/gpu/cases/profile_tc_s9.txt '^cupy'; pack; fi
if has taps; then
  stamp "== taps: the stem wgrad cases, cupy@taps beside cupy@best and cuDNN"
  timeout -k 20 -s INT 150 $PY -m harness bench --op conv_backward_weight --cases scripts/gpu/cases/wgrad_stem_s9.json \
    --device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit 120 --backend cupy@taps --backend cupy@best --backend torch --report "$R/taps" > "$R/taps.log" 2>&1
  echo "exit $?"; grep -E "cupy|torch" "$R/taps.log" | head -20; pack
fi

ladder() {  # ladder IMPL... [-- --resume FILE]: the matmul perf bench of those implementations
  timeout -k 20 -s INT $((LADDER_S + 90)) $PY -m harness bench --op matmul_backward --cases perf --device cuda \
    --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit "$LADDER_S" "$@" --report "$R/ladder" >> "$R/ladder.log" 2>&1
  echo "exit $?"; tail -2 "$R/ladder.log"
}
if has ladder; then
  stamp "== ladder: matmul_backward perf cases, the cupy rungs beside cuBLAS and triton"
  ladder --backend cupy@naive --backend cupy@regtile --backend cupy@smem --backend cupy@best --backend torch \
    --backend triton
  pack
fi
if has full; then
  stamp "== full: conv dgrad + wgrad through cupy@best and cupy@taps"
  full_shards "$FULL_S" --op conv_backward_data --op conv_backward_weight --backend cupy@best --backend cupy@taps \
    --seed 9
  shards_to full-cupy
fi

[ -n "$build" ] && wait "$build" && stamp "build: $(tail -1 "$R/build.log")"
if has ladder; then
  stamp "== ladder: torch_ext, resumed into the same document"
  cp "$R/ladder/results.json" "$R/ladder-1.json"
  ladder --backend cupy@naive --backend cupy@regtile --backend cupy@smem --backend cupy@best --backend torch \
    --backend triton --backend torch_ext --resume "$R/ladder-1.json"
  $PY scripts/gpu/tflops_table.py "$R/ladder/results.json" --impl cupy@naive --impl cupy@regtile --impl cupy@smem \
    --impl cupy@best --impl torch_ext --impl triton --impl torch --ratio cupy@best/torch --ratio torch_ext/torch \
    --ratio triton/torch --host cupy@best > "$R/ladder_table.txt" 2>&1
  cat "$R/ladder_table.txt"; cp "$R/ladder/results.json" "$OUT/ladder.json"; pack
fi
if has full; then
  stamp "== full: conv dgrad + wgrad and matmul through torch_ext"
  full_shards "$FULL_S" --op conv_backward_data --op conv_backward_weight --op matmul_backward \
    --backend torch_ext --seed 9
  shards_to full-torch_ext
fi

{ stamp "== done"; tail -1 "$R/build.log" 2>/dev/null
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/full-*/full-*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
