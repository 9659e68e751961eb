#!/usr/bin/env bash
# The eighth session's second and third H100 calls: what batch_s8.sh left, and issue 17's perf cases.
#   OUT=/some/dir bash scripts/gpu/batch_s8b.sh          (from the repo root)
# (A record of what ran on 2026-12-06: its triton step reads the s8 shards' JSONs, since packed into
# results/h100/s8/full.tar.gz; batch_s9.sh carries on from it.)
# Steps (STEPS="triton attn ext"):
#   triton  the 8 triton binary_backward full cases batch_s8.sh's shards did not reach before their time
#           limit: `harness run --resume` of each shard's JSON (results/h100/s8/full-triton/)  -> full-triton/
#           and, beside them, layernorm_backward + rmsnorm_backward full through cupy@best  -> full-cupy-norms/
#   (setup) the torch_ext build starts in the background
#   attn    harness bench (cold) of the attention perf cases no earlier session benched
#           (scripts/gpu/cases/attn_rest_s8.json, cheapest first) through cupy@best, triton, SDPA flash and
#           SDPA cuDNN, their float64 passes on the GPU ($GRADORACLE_ORACLE_PASSES=cuda, checked against the
#           host's by batch_s8.sh: 0 input elements differ) and no prefetch (a later case's passes on the
#           GPU would share it with the pair being timed); RESUME=results.json(.gz) goes on from an
#           earlier call, ATTN_S the time limit                                          -> attn/
#   ext     after the build: the norms full and reduce_sum's two largest full cases through torch_ext
#           (scripts/gpu/cases/reduce_big_s8.json; s7's shards were cut before them)     -> full-torch_ext/
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s8b.tgz (res/, re-packed after each step).
set -uo pipefail
PY=${PYTHON:-python3} STEPS=${STEPS:-triton attn ext} ATTN_S=${ATTN_S:-300} RESUME=${RESUME:-}
PACK=s8b
. scripts/gpu/steps.sh

setup 450
if has triton; then
  stamp "== triton: the binary_backward full cases the s8 shards did not reach; the norms through cupy@best"
  pids=()
  for k in 0 1 2 3 4 5 6 7; do
    timeout -s INT 90 $PY -m harness run --cases full --device cuda --op layernorm_backward \
      --op rmsnorm_backward --backend cupy@best --seed 8 --shard "$k/8" --json "$R/norms-$k.json" \
      > "$R/norms-$k.log" 2>&1 &
    pids+=($!)
  done
  for k in 0 1 2 3 4 5 6 7; do
    timeout -s INT 90 $PY -m harness run --cases full --device cuda --op binary_backward --backend triton \
      --seed 8 --shard "$k/8" --resume "results/h100/s8/full-triton/full-$k.json" --json "$R/full-$k.json" \
      > "$R/full-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log; shards_to full-triton
  for f in "$R"/norms-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/norms-*.log; mkdir -p "$R/full-cupy-norms"; mv "$R"/norms-* "$R/full-cupy-norms/"; pack
fi

if has attn; then
  stamp "== attn: the attention perf cases not benched before (limit $ATTN_S s)"
  GRADORACLE_ORACLE_PASSES=cuda timeout -k 20 -s INT $((ATTN_S + 40)) $PY -m harness bench \
    --op attention_backward --cases scripts/gpu/cases/attn_rest_s8.json --device cuda --mode cold \
    --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 --no-plots --prefetch 0 \
    --time-limit "$ATTN_S" ${RESUME:+--resume "$RESUME"} \
    --backend cupy@best --backend triton --backend sdpa_flash --backend sdpa_cudnn \
    --report "$R/attn" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -3 "$R/attn.log"
  $PY scripts/gpu/tflops_table.py "$R/attn/results.json" --impl cupy@best --impl triton --impl sdpa_flash \
    --impl sdpa_cudnn --ratio cupy@best/sdpa_flash --ratio cupy@best/sdpa_cudnn --ratio triton/sdpa_flash \
    --host cupy@best > "$R/attn_table.txt" 2>&1
  cat "$R/attn_table.txt"; pack
fi

wait "$build"; stamp "build: $(tail -1 "$R/build.log")"
if has ext; then
  stamp "== ext: the norms full and reduce_sum's two largest full cases through torch_ext"
  full_shards 60 --op layernorm_backward --op rmsnorm_backward --backend torch_ext --seed 8
  shards_to full-torch_ext
  timeout -s INT 60 $PY -m harness run --cases scripts/gpu/cases/reduce_big_s8.json --device cuda \
    --backend torch_ext --seed 8 --json "$R/full-torch_ext/reduce-big.json" > "$R/full-torch_ext/reduce-big.log" 2>&1
  tail -1 "$R/full-torch_ext/reduce-big.log"; pack
fi

{ stamp "== done"
  for f in "$R"/full-*/*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/full-*/*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
