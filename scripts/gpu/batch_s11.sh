#!/usr/bin/env bash
# Superseded by scripts/gpu/batch_s14.sh: the fourteenth session ran check, full, mmf32, dgf32, convd, convw and attn
# (results/h100/s14/); its @sgemm rung became cupy@best's float32 path, so the mmf32 step names a variant gone.
# The eleventh session's H100 calls: what issues 16 and 14 still lack after the tenth (repo root).
#   STEPS="check full" OUT=/some/dir bash scripts/gpu/batch_s11.sh     (issues 16 and 14: FULL_S=520 s from the start)
#   STEPS="bench profile" OUT=...                                      (a warm machine: about 8 minutes)
#   STEPS="profile" OUT=...                                            (issue 14: triton's misses, about 4 minutes)
#   TORCH_EXT=0 STEPS="mmf32 dgf32 profile" PROFILE_LIST=scripts/gpu/cases/profile_mm_s12.txt OUT=...
#                                                                      (issue 14's float32 FMA-dot A/Bs and the
#                                                                       two matmul misses: a short call)
#   STEPS=convd OUT=...  then  STEPS=convw OUT=...                     (issues 14 and 16: one-run conv tables)
#   STEPS=attn OUT=...                                                 (issue 14: the one-run attention table)
# Steps:
#   (setup) the torch_ext build starts in the background (MAX_JOBS=8) when a step needs torch_ext
#   check   the code written after the tenth session's runs: cupy@best's small-Cin dgrad plan and torch_ext's
#           launch of it (record kinds 5/6) on the 24 small-Cin full cases (smallc_full_s10.json)  -> check-*
#   bench   the stem dgrad bench (dgrad_stem_s10.json: cupy@best, torch_ext, torch), and the conv scalar fills'
#           cases (cv_gather: the stem wgrad, channels-first 1x1 and 3x3; gather_s11.json), beside torch,
#           whose ratios the tenth session and BENCHMARKS have from before the change  -> stem-d/, gather/
#   mmf32   cupy@sgemm (thirteenth session) on matmul's 29 float32 full cases; the float32 1024^3 matmul
#           through triton (the twelfth session's staged candidates), cupy@sgemm, cupy@best and torch; and
#           triton's tuner's per-candidate times (scripts/gpu/tuner_log.py)
#                                                         -> sgemm-full.*, mm-f32/, mm-f32-tuner.json
#   dgf32   the tuner's per-candidate times on triton's float32 dgrad perf cases (dgrad_f32_s13.json: 1D and
#           2D, stride 1 and 2, both layouts): the plain tiles against the channel-major ones (thirteenth
#           session); the convd step's bench has them beside torch                       -> dg-f32-tuner.json
#   full    the full pairs no run passed (scripts/gpu/full_left.py): conv_left_cupy_s11.json (47 cases) through
#           cupy@best and cupy@pertap in 2 shards, tc_left_torch_ext_s11.json (120) through torch_ext in 3,
#           triton_left_s11.json (87) through triton in 3, all side by side until FULL_S after the start -> full-tc/
#           (a left pair costs about 30 s of host time, most of it the float64 oracle passes on the host:
#           each list runs only its own backend's pairs).  Afterwards: full_left.py per backend over
#           results/h100/s*/ for what is left.
#   profile harness profile of scripts/gpu/cases/profile_tc_s11.txt (triton's misses; cupy@best's scalar conv
#           fills after cv_gather), or of PROFILE_LIST                                 -> profile/
#   convd   harness bench of conv_backward_data's 43 perf cases: cupy@best, torch_ext, triton, torch (the one
#           run per op issue 14 and 16's tables need; --resume CONV_RESUME to go on)    -> convd/
#   convw   the same for conv_backward_weight                                          -> convw/
#   fa2     attention_backward's full set through the first fa2 rungs, cupy@fa2 and cupy@fa2_det (the lean
#           kernels, cupy@best and torch_ext's, passed all 246 pairs in the sixth and seventh sessions; these
#           two passed 108 of 246 in the third), 8 shards of FULL_S                      -> full-fa2/
#   attn    harness bench of attention_backward's 42 perf cases: triton (its default makes dq by the separate
#           pass since the ninth session's runs, so their triton column is stale), triton@det, SDPA flash
#           and cuDNN: issue 14's one-run table (--resume ATTN_RESUME to go on)            -> attn/
# Files: $OUT/run.log, $OUT/summary.txt, $OUT/s11.tgz (res/); copy res/ to results/h100/s11/ after each call.
set -uo pipefail
export MAX_JOBS=${MAX_JOBS:-8}
PY=${PYTHON:-python3} STEPS=${STEPS:-check full} FULL_S=${FULL_S:-520} CONV_S=${CONV_S:-420} ATTN_S=${ATTN_S:-420}
PACK=s11
. scripts/gpu/steps.sh
C=scripts/gpu/cases
BENCH="--device cuda --mode cold --budget 0.1 --warmup-budget 0.03 --min-samples 10 --max-samples 300 --no-plots -q"

# A first (cold) call spends about 180 s building torch_ext: `full` starts the cupy and triton shards and the
# cupy@best small-Cin check at once, beside the build, and torch_ext's check and shards after it, all ending
# by FULL_S (the pairs are host-bound: each shard is one process of the 16 cores).
# TORCH_EXT=0: no build and none of torch_ext's runs (a short call: the build alone takes about 180 s)
TORCH_EXT=${TORCH_EXT:-1} PROFILE_LIST=${PROFILE_LIST:-$C/profile_tc_s11.txt}
if [ "$TORCH_EXT" = 1 ] && { has check || has full || has bench || has convd || has convw; }; then setup 450
else setup; build=; fi
deadline=$(( $(date +%s) + FULL_S ))
left() { echo $(( deadline - $(date +%s) )); }   # seconds to the deadline
pids=()
run_list() {  # run_list NAME CASES NSHARDS BACKEND...: NSHARDS shards of one list until the deadline -> $R/full-NAME-K.*
  local name=$1 cases=$2 n=$3 k
  shift 3
  for ((k = 0; k < n; k++)); do
    env $(threads 8) timeout -s INT "$(left)" $PY -m harness run --cases "$cases" --device cuda "${@/#/--backend=}" --seed 11 \
      --shard "$k/$n" --json "$R/full-$name-$k.json" > "$R/full-$name-$k.log" 2>&1 &
    pids+=($!)
  done
}
if has full; then
  stamp "== full: the pairs left, cupy@best + cupy@pertap and triton now, torch_ext after its build"
  run_list cupy $C/conv_left_cupy_s11.json 2 cupy@best cupy@pertap
  run_list triton $C/triton_left_s11.json 3 triton
fi
check_smallc() {  # check_smallc BACKEND SECONDS: the 24 small-Cin full cases through BACKEND -> $R/check-BACKEND.*
  stamp "== check: the small-Cin dgrad through $1 on its full cases"
  env $(threads 8) timeout -s INT "$2" $PY -m harness run --cases $C/smallc_full_s10.json --device cuda --backend "$1" \
    --seed 11 --json "$R/check-$1.json" > "$R/check-$1.log" 2>&1
  tail -1 "$R/check-$1.log"; failures "$R/check-$1.log"; pack
}
has check && check_smallc cupy@best 200   # beside the build
[ -n "$build" ] && wait "$build" && stamp "build: $(tail -1 "$R/build.log")"
has check && [ "$TORCH_EXT" = 1 ] && check_smallc torch_ext 150   # its launch records kinds 5/6
if has full; then
  [ "$TORCH_EXT" = 1 ] && [ "$(left)" -gt 60 ] && run_list torch_ext $C/tc_left_torch_ext_s11.json 3 torch_ext
  for p in "${pids[@]}"; do wait "$p"; done
  for f in "$R"/full-*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; done
  failures "$R"/full-*.log; shards_to full-tc; pack
fi
if has bench; then
  stamp "== bench: the stem dgrad (small-Cin plan) and the conv scalar fills' cases (cv_gather) beside torch"
  timeout -k 20 -s INT 120 $PY -m harness bench --op conv_backward_data --cases $C/dgrad_stem_s10.json $BENCH \
    --time-limit 100 --backend cupy@best --backend torch_ext --backend torch --report "$R/stem-d" > "$R/stem-d.log" 2>&1
  echo "exit $?"; grep -E "cupy|torch" "$R/stem-d.log" | head -20
  timeout -k 20 -s INT 150 $PY -m harness bench --cases $C/gather_s11.json $BENCH --time-limit 130 \
    --backend cupy@best --backend torch_ext --backend torch --report "$R/gather" > "$R/gather.log" 2>&1
  echo "exit $?"; grep -E "cupy|torch" "$R/gather.log" | head -40; pack
fi
if has mmf32; then
  stamp "== mmf32: cupy@sgemm's float32 full cases, then float32 1024^3 through triton (the staged candidates),"\
    "cupy@sgemm, cupy@best and torch, and triton's tuner's times"
  timeout -s INT 120 $PY -m harness run --op matmul_backward --cases full --dtype f32 --device cuda \
    --backend cupy@sgemm --seed 13 --json "$R/sgemm-full.json" > "$R/sgemm-full.log" 2>&1
  tail -1 "$R/sgemm-full.log"; failures "$R/sgemm-full.log"
  timeout -k 20 -s INT 90 $PY -m harness bench --cases $C/mm_f32_s12.json $BENCH --time-limit 70 \
    --backend triton --backend cupy@sgemm --backend cupy@best --backend torch --report "$R/mm-f32" > "$R/mm-f32.log" 2>&1
  echo "exit $?"; grep -E "triton|torch|cupy" "$R/mm-f32.log" | head
  timeout 60 $PY scripts/gpu/tuner_log.py $C/mm_f32_s12.json | tee "$R/mm-f32-tuner.json"; pack
fi
if has dgf32; then
  stamp "== dgf32: the tuner's times of triton's float32 dgrad candidates (the channel-major ones among them)"
  timeout 200 $PY scripts/gpu/tuner_log.py $C/dgrad_f32_s13.json | tee "$R/dg-f32-tuner.json"; pack
fi
if has profile; then
  profile "$PROFILE_LIST" '^(triton|cupy)'; pack
fi
for step in convd convw; do
  has $step || continue
  op=conv_backward_data; [ $step = convw ] && op=conv_backward_weight
  stamp "== $step: $op perf cases, cupy@best, torch_ext, triton, torch"
  timeout -k 20 -s INT $((CONV_S + 90)) $PY -m harness bench --op $op --cases perf $BENCH --time-limit "$CONV_S" \
    ${CONV_RESUME:+--resume "$CONV_RESUME"} --backend cupy@best --backend torch_ext --backend triton --backend torch \
    --report "$R/$step" > "$R/$step.log" 2>&1
  echo "exit $?"; tail -2 "$R/$step.log"
  $PY scripts/gpu/tflops_table.py "$R/$step/results.json" --impl cupy@best --impl torch_ext --impl triton \
    --impl torch --ratio cupy@best/torch --ratio torch_ext/torch --ratio triton/torch --host cupy@best \
    | tee "$R/${step}_table.txt"; pack
done
if has fa2; then
  stamp "== fa2: attention_backward full, cupy@fa2 and cupy@fa2_det"
  full_shards "$FULL_S" --op attention_backward --backend cupy@fa2 --backend cupy@fa2_det --seed 11
  shards_to full-fa2
fi
if has attn; then
  stamp "== attn: attention_backward perf cases, triton, triton@det, SDPA flash and cuDNN"
  GRADORACLE_ORACLE_PASSES=cuda timeout -k 20 -s INT $((ATTN_S + 150)) $PY -m harness bench --op attention_backward \
    --cases perf --device cuda --mode cold --budget 0.2 --warmup-budget 0.05 --min-samples 10 --max-samples 300 \
    --no-plots -q --prefetch 0 --time-limit "$ATTN_S" ${ATTN_RESUME:+--resume "$ATTN_RESUME"} --backend triton \
    --backend triton@det --backend sdpa_flash --backend sdpa_cudnn --report "$R/attn" > "$R/attn.log" 2>&1
  echo "exit $?"; tail -2 "$R/attn.log"
  $PY scripts/gpu/tflops_table.py "$R/attn/results.json" --impl triton --impl triton@det --impl sdpa_flash \
    --impl sdpa_cudnn --ratio triton/sdpa_flash --ratio triton/sdpa_cudnn --ratio triton@det/sdpa_flash \
    --host triton | tee "$R/attn_table.txt"; pack
fi

{ stamp "== done"; tail -1 "$R/build.log" 2>/dev/null
  for f in "$R"/full-*/full-*.log; do echo "${f#$R/}: $(grep -E 'passed|failed|interrupted' "$f" | tail -1)"; done
  failures "$R"/full-*/full-*.log 2>/dev/null; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"; pack
