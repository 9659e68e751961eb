#!/usr/bin/env bash
# The next H100 calls after the fourteenth and fifteenth sessions' (repo root): what issues 16 and 14 still lack.
# After the fifteenth session (results/h100/s15/: check, mm, attn and the 33 profiles ran), in this order:
#   STEPS="tconv tconvd tconvw" OUT=...        (no build: triton's conv full sets in 8 shards of FULL_S, then its
#                                              one-run conv tables beside torch; about 13 minutes: two calls,
#                                              STEPS=tconv then STEPS="tconvd tconvw")
#   STEPS=profile PROFILE_LIST=scripts/gpu/cases/profile_s15.txt OUT=...   (16 profiles, about 6 minutes)
#   STEPS="check mm" OUT=/some/dir bash scripts/gpu/batch_s14.sh       (cold: the torch_ext build, then about 6 min)
#   STEPS=profile PROFILE_PART=0/3 OUT=...  then  1/3, 2/3              (11 profiles a call, up to 8 minutes each:
#                                                                       harness profile runs each case twice, a
#                                                                       tuning child without ncu, then under ncu)
#   STEPS=attn OUT=...                                                 (the 12 attention perf cases left, 5 minutes)
# Steps:
#   check   float32 matmul_backward's 29 full cases through cupy@best and torch_ext, whose float32 path is
#           mm_sgemm since the fourteenth session (cupy@sgemm, the same kernels, passed them on the H100 that
#           session; torch_ext's launch of it is new), and cupy@pertap's 18 full pairs where its plan differs
#           from @best's (pertap_left_s14.json)                                        -> check-*.{json,log}
#   mm      harness bench of matmul_backward's 10 perf cases: cupy@best, torch_ext, triton, torch (the one
#           run issue 14's matmul table needs: triton's float32 tile is the staged one since the tuner timed
#           it; --resume MM_RESUME to go on)                                           -> mm/
#   profile harness profile (ncu) of scripts/gpu/cases/profile_s14.txt (PROFILE_LIST: another list): one case
#           per class of miss in the fourteenth session's one-run conv and attention tables (33; all run in the
#           fifteenth session), PROFILE_PART=k/n of its lines -> profile/.  Next: PROFILE_LIST=
#           scripts/gpu/cases/profile_s15.txt (the fifteenth session's misses that have no profile, 3)
#   attn    harness bench of attention_backward's perf cases, resumed from the fourteenth session's 30
#           (ATTN_RESUME): triton, triton@det, SDPA flash and cuDNN                    -> attn/
#   tconv   triton's conv_backward_data and conv_backward_weight full sets (408 pairs), 8 shards of FULL_S:
#           the fifteenth session changed its channels-first staging (identity copies skipped, thin copy
#           tiles) and its wgrad split and finish after the H100 passed them           -> full-tconv/
#   tconvd, tconvw  harness bench of the op's perf cases, triton and torch (cuDNN): the one-run triton
#           tables of the current code (cupy@best's and torch_ext's are results/h100/s14/call3, call4), each
#           under CONV_S; RESUME_DIR=results/h100/sNN/callK goes on from that call's cut-off run -> tconvd/, tconvw/
# Files: $OUT/run.log, $OUT/s14.tgz (res/); extract it to results/h100/sNN/callK/ after each call.
set -uo pipefail
export MAX_JOBS=${MAX_JOBS:-8}
PY=${PYTHON:-python3} STEPS=${STEPS:-check mm} MM_S=${MM_S:-300} ATTN_S=${ATTN_S:-400} FULL_S=${FULL_S:-480}
CONV_S=${CONV_S:-240}
PACK=s14
. scripts/gpu/steps.sh
C=scripts/gpu/cases
BENCH="--device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q"
ATTN_RESUME=${ATTN_RESUME:-results/h100/s14/call6/res/attn/results.json}

if has check || has mm; then setup 450; else setup; build=; fi
if has check; then
  stamp "== check: cupy@pertap's 18 full pairs where its plan differs from @best's, then float32 matmul"
  env $(threads 2) timeout -s INT 120 $PY -m harness run --cases $C/pertap_left_s14.json --device cuda \
    --backend cupy@pertap --seed 14 --json "$R/check-pertap.json" > "$R/check-pertap.log" 2>&1
  tail -1 "$R/check-pertap.log"; failures "$R/check-pertap.log"
  [ -n "$build" ] && wait "$build" && stamp "build: $(tail -1 "$R/build.log")"
  timeout -s INT 180 $PY -m harness run --op matmul_backward --cases full --dtype f32 --device cuda \
    --backend cupy@best --backend torch_ext --seed 14 --json "$R/check-mm-f32.json" > "$R/check-mm-f32.log" 2>&1
  tail -1 "$R/check-mm-f32.log"; failures "$R/check-mm-f32.log"; pack
fi
if has mm; then
  [ -n "$build" ] && wait "$build"
  stamp "== mm: matmul_backward perf cases, cupy@best, torch_ext, triton, torch"
  timeout -k 20 -s INT $((MM_S + 90)) $PY -m harness bench --op matmul_backward --cases perf $BENCH \
    --time-limit "$MM_S" ${MM_RESUME:+--resume "$MM_RESUME"} --backend cupy@best --backend torch_ext \
    --backend triton --backend torch --report "$R/mm" > "$R/mm.log" 2>&1
  echo "exit $?"; tail -2 "$R/mm.log"
  $PY scripts/gpu/tflops_table.py "$R/mm/results.json" --impl cupy@best --impl torch_ext --impl triton \
    --impl torch --ratio cupy@best/torch --ratio torch_ext/torch --ratio triton/torch --host cupy@best \
    | tee "$R/mm_table.txt"; pack
fi
if has profile; then
  # PROFILE_PART k/n: the list's profile lines k, k+n, k+2n, ... (a call holds about 11 of them)
  part=${PROFILE_PART:-0/1}
  grep -vE '^(#|$)' "${PROFILE_LIST:-$C/profile_s14.txt}" | awk -v k="${part%/*}" -v n="${part#*/}" '(NR - 1) % n == k' \
    > "$R/profile-list-${part%/*}.txt"
  profile "$R/profile-list-${part%/*}.txt" '^(triton|cupy)'; pack
fi
if has attn; then
  stamp "== attn: attention_backward perf cases (resumed), triton, triton@det, SDPA flash and cuDNN"
  GRADORACLE_ORACLE_PASSES=cuda timeout -k 20 -s INT $((ATTN_S + 150)) $PY -m harness bench --op attention_backward \
    --cases perf --device cuda --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 \
    --no-plots -q --prefetch 0 --time-limit "$ATTN_S" --resume "$ATTN_RESUME" --backend triton \
    --backend triton@det --backend sdpa_flash --backend sdpa_cudnn --report "$R/attn" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -2 "$R/attn.log"
  $PY scripts/gpu/tflops_table.py "$R/attn/results.json" --impl triton --impl triton@det --impl sdpa_flash \
    --impl sdpa_cudnn --ratio triton/sdpa_flash --ratio triton/sdpa_cudnn --ratio triton@det/sdpa_flash \
    --host triton | tee "$R/attn_table.txt"; pack
fi
if has tconv; then
  stamp "== tconv: triton's conv dgrad and wgrad full sets, 8 shards of $FULL_S s"
  full_shards "$FULL_S" --op conv_backward_data --op conv_backward_weight --backend triton --seed 15
  shards_to full-tconv; pack
fi
for step in tconvd tconvw; do
  has $step || continue
  op=conv_backward_data; [ $step = tconvw ] && op=conv_backward_weight
  stamp "== $step: $op perf cases, triton and torch"
  prev=${RESUME_DIR:+$RESUME_DIR/res/$step/results.json}   # a cut-off run of this step to go on from
  [ -n "$prev" ] && [ ! -f "$prev" ] && prev=
  timeout -k 20 -s INT $((CONV_S + 90)) $PY -m harness bench --op $op --cases perf $BENCH --time-limit "$CONV_S" \
    ${prev:+--resume "$prev"} --backend triton --backend torch --report "$R/$step" > "$R/$step.log" 2>&1
  echo "exit $?"; tail -2 "$R/$step.log"
  $PY scripts/gpu/tflops_table.py "$R/$step/results.json" --impl triton --impl torch --ratio triton/torch \
    --host triton | tee "$R/${step}_table.txt"; pack
done
stamp "== done"; pack
