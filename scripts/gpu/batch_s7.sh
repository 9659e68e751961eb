#!/usr/bin/env bash
# The next H100 call (about 9 minutes): torch_ext's attention on the lean kernels, and the profiles of
# the memory-bound misses that have none (issues 13, 15, 17).
#   OUT=/some/dir bash scripts/gpu/batch_s7.sh          (from the repo root)
# Steps (STEPS="profile full repeat bench" by default), each under its own limit (timeout -s INT: the
# harness still writes its JSON checkpoint):
#   (setup)  pip install; the torch_ext build starts in the background (MAX_JOBS=16; about 3 minutes)
#   profile  harness profile (ncu) of each line of scripts/gpu/cases/profile_misses_s6.txt: the triton
#            layernorm calls at 83% of copy, cupy@best's bf16 div row sums, then (after the build)
#            torch_ext's bf16 add row sums                                   -> profile/ (<= 150 s each)
#   full     harness run --cases full of attention_backward through torch_ext (cupy@best's lean
#            kernels) and torch_ext@det (the lean deterministic ones), 8 shards  -> full-*.{json,log} (<= FULL_S)
#   repeat   torch_ext@det --repeat 50 on scripts/gpu/cases/cuda_attn_repeat.json -> repeat.{json,log} (<= 70 s)
#   bench    harness bench (cold) of the first 6 cases of attn_s4.json: torch_ext, torch_ext@det,
#            cupy@best, sdpa_flash, sdpa_cudnn                             -> bench/, attn_table.txt (<= 130 s)
#   long     (not in the default STEPS) harness bench (cold) of the three long attention perf cases
#            (scripts/gpu/cases/attn_long_s6.json: S=8k GQA causal, S=16k with and without causal) through
#            cupy@best, torch_ext, sdpa_flash, sdpa_cudnn; their float64 oracles now run in JAX on the GPU
#            (over 1e11 flops)                                          -> long/, long_table.txt (<= 200 s)
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s7.tgz (res/: everything, re-packed after each step).
set -uo pipefail
PY=${PYTHON:-python3} STEPS=${STEPS:-profile full repeat bench} FULL_S=${FULL_S:-200}
PACK=s7
. scripts/gpu/steps.sh
LIST=scripts/gpu/cases/profile_misses_s6.txt

setup 420

if has profile; then
  mkdir -p "$R/profile"
  profile "$LIST" '^(triton|cupy)'; pack
fi
wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
if has profile; then profile "$LIST" '^torch_ext'; pack; fi

if has full; then
  stamp "== full: attention through torch_ext and torch_ext@det (8 shards, $FULL_S s)"
  full_shards "$FULL_S" --op attention_backward --backend torch_ext --backend torch_ext@det --seed 7
fi

if has repeat; then attn_repeat torch_ext@det 70; fi

if has bench; then
  stamp "== bench: the first 6 attn_s4.json cases"
  $PY -c "import json, sys; d = json.load(open('scripts/gpu/cases/attn_s4.json')); d['cases'] = d['cases'][:6]; \
json.dump(d, open(sys.argv[1], 'w'), indent=1)" "$R/cases6.json"
  timeout -k 15 -s INT 130 $PY -m harness bench --op attention_backward --cases "$R/cases6.json" --device cuda \
    --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q --time-limit 120 \
    --backend torch_ext --backend torch_ext@det --backend cupy@best --backend sdpa_flash --backend sdpa_cudnn \
    --report "$R/bench" > "$R/bench.log" 2>&1
  echo "exit $?"; tail -2 "$R/bench.log"
  $PY scripts/gpu/tflops_table.py "$R/bench/results.json" --impl torch_ext --impl torch_ext@det --impl cupy@best \
    --impl sdpa_flash --impl sdpa_cudnn --ratio torch_ext/sdpa_flash --ratio torch_ext/sdpa_cudnn \
    --ratio torch_ext@det/sdpa_flash > "$R/attn_table.txt" 2>&1
  cat "$R/attn_table.txt"; pack
fi

if has long; then
  stamp "== bench: the long attention cases"
  timeout -k 15 -s INT 200 $PY -m harness bench --op attention_backward --cases scripts/gpu/cases/attn_long_s6.json \
    --device cuda --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots -q \
    --time-limit 190 --backend cupy@best --backend torch_ext --backend sdpa_flash --backend sdpa_cudnn \
    --report "$R/long" > "$R/long.log" 2>&1
  echo "exit $?"; tail -2 "$R/long.log"
  $PY scripts/gpu/tflops_table.py "$R/long/results.json" --impl cupy@best --impl torch_ext --impl sdpa_flash \
    --impl sdpa_cudnn --ratio cupy@best/sdpa_flash --ratio cupy@best/sdpa_cudnn > "$R/long_table.txt" 2>&1
  cat "$R/long_table.txt"; pack
fi

{ stamp "== done"; tail -1 "$R/build.log"; ls "$R/profile" 2>/dev/null | grep -c txt
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  tail -1 "$R/repeat.log" 2>/dev/null; cat "$R/attn_table.txt" "$R/long_table.txt" 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"
