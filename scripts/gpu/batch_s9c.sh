#!/usr/bin/env bash
# Ninth session, second call: the one triton full case batch_s9.sh's 100 s window cut
# (scripts/gpu/cases/binary_left_s9b.json), then the attention bench resumed from results/h100/s9/attn.
#   OUT=/some/dir bash scripts/gpu/batch_s9c.sh       (STEPS="left attn"; STEPS=attn for later calls)
# The attention step is batch_s9.sh's (RESUME, ATTN_S as there), run in /tmp/attn-step; its
# results.json, attn_table.txt and attn.log are copied to $OUT.
set -uo pipefail
PY=${PYTHON:-python3} STEPS=${STEPS:-left attn}
PACK=s9c
. scripts/gpu/steps.sh
setup
if has left; then
  mkdir -p "$R/left"
  stamp "== left: the triton case batch_s9.sh's window cut"
  timeout -s INT 120 $PY -m harness run --cases scripts/gpu/cases/binary_left_s9b.json --device cuda \
    --backend triton --seed 8 --json "$R/left/triton.json" > "$R/left/triton.log" 2>&1
  tail -1 "$R/left/triton.log"; failures "$R/left/triton.log"; pack
fi
if has attn; then
  STEPS=attn RESUME=${RESUME:-results/h100/s9/attn/results.json} ATTN_S=${ATTN_S:-300} OUT=/tmp/attn-step \
    bash scripts/gpu/batch_s9.sh > /dev/null 2>&1
  cp /tmp/attn-step/results.json /tmp/attn-step/attn_table.txt /tmp/attn-step/res/attn.log "$OUT/"
  cat "$OUT/attn_table.txt"; tail -2 "$OUT/attn.log"
fi
stamp "== done"; pack
