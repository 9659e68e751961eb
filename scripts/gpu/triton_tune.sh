#!/usr/bin/env bash
# The triton binary_backward and reduce_sum after the register diet, on a CUDA machine (H100), in
# one batch of under 8 minutes: kernel facts, correctness, the perf bench, the candidate sizings
# side by side, and ncu profiles of whatever is still under its bar.
#   OUT=/some/dir bash scripts/gpu/triton_tune.sh            (from the repo root)
# Steps (STEPS="info check bench variants profile" by default; any subset, in that order):
#   info      scripts/gpu/triton_tune_info.py: per perf case (+ pow, sub, minimum bf16) the launches
#             of the tuned default plan: registers, spills, programs per SM, grid, waves, and the
#             autotuner's candidate timings; then every preset, pinned, quick-timed on the FOCUS
#             cases                                         -> $OUT/kernels.json, $OUT/info.log
#   check     python -m harness run --backend triton --op binary_backward --op reduce_sum, the perf
#             cases (float64 oracle in JAX on the GPU), then the smoke cases
#                                                            -> $OUT/check-{perf,smoke}.{json,log}
#   bench     python -m harness bench --op binary_backward --op reduce_sum --backend triton --cases perf
#             --budget 0.2 --interleave                      -> $OUT/bench/{results.json,report.md}
#   variants  the FOCUS cases (those under the bar in the first H100 run, and pow) benched with
#             triton (tuned) beside triton@<preset> for BINARY_VARIANTS and REDUCE_VARIANTS: which
#             sizing wins, decided in one run               -> $OUT/variants/{results.json,report.md}
#   profile   scripts/gpu/profile_cases.sh on the cases under the bar after `bench` (at most
#             PROFILE_MAX)                                  -> $OUT/profile/, $OUT/misses.txt
# Ends with the tables (scripts/gpu/triton_tune_report.py): case, ms, % of copy, bar, host ms,
# registers / occupancy / grid of the main kernel; then each focus case's % of copy per sizing.
# Sizings (see backends/triton/binary_backward.py PRESETS, reduce_sum.py PRESETS):
#   binary  lean (the default: 16-byte vector a thread, prefetch, one-wave splits), lean_noprefetch,
#           wide (two vectors a thread), narrow_strips (512-byte column strips), loop_inner (both
#           reduce: loop over the contiguous class), whole_rows, old (the first run's sizing)
#   reduce  default (4 KiB blocks read 4 a step), unroll8, wide_unroll2, prefetch, kernel_finish,
#           finish32k, wide_segments, before (the first run's sizing)
# To pin one for everything: GRADORACLE_TRITON_BINARY=<name>, GRADORACLE_TRITON_REDUCE=<name>.
# Time limits (seconds, each a hard cap): INFO_LIMIT=50 PRESETS_LIMIT=20 (+10) CHECK_PERF_LIMIT=70
# CHECK_SMOKE_LIMIT=35 BENCH_LIMIT=100 and VARIANTS_LIMIT=60 (pairs started by then; the bench also
# measures the ceilings once, ~15 s) PROFILE_LIMIT=80 (PROFILE_MAX=3 cases): at most about 7.8 minutes
# in all with start-up and reports.  Each step prints its start time; a step cut short keeps what it
# finished.  Other knobs: PYTHON=python3 BUDGET=0.2 VARIANT_BUDGET=0.1 BINARY_VARIANTS REDUCE_VARIANTS
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} STEPS=${STEPS:-info check bench variants profile}
INFO_LIMIT=${INFO_LIMIT:-50} PRESETS_LIMIT=${PRESETS_LIMIT:-20} CHECK_PERF_LIMIT=${CHECK_PERF_LIMIT:-70}
CHECK_SMOKE_LIMIT=${CHECK_SMOKE_LIMIT:-35} BENCH_LIMIT=${BENCH_LIMIT:-100} VARIANTS_LIMIT=${VARIANTS_LIMIT:-60}
PROFILE_LIMIT=${PROFILE_LIMIT:-80}
BUDGET=${BUDGET:-0.2} VARIANT_BUDGET=${VARIANT_BUDGET:-0.1} PROFILE_MAX=${PROFILE_MAX:-3}
BINARY_VARIANTS=${BINARY_VARIANTS:-lean_noprefetch,wide,old}
REDUCE_VARIANTS=${REDUCE_VARIANTS:-prefetch,finish32k,before}
WORK=$(mktemp -d /tmp/gradoracle-tune.XXXXXX)
export GRADORACLE_CACHE=$WORK/cache  # one ceilings measurement for every bench
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

stamp "== device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1 | head -2
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1 2>/dev/null

# The focus cases: under the bar in the first H100 run (results/h100/triton/*-1), the ones
# skipped there for time, and pow; the variants step benches them side by side.
$PY - "$WORK/focus.json" <<'EOF'
import json, sys
L = [8, 2048, 4096]
b = lambda fn, dt, a, bb: {"op": "binary_backward", "dtype": dt, "params": {"fn": fn, "a": a, "b": bb}}
r = lambda dt, shape, **p: {"op": "reduce_sum", "dtype": dt, "params": {"shape": shape, **p}}
cases = [b("mul", "bf16", L, [4096]), b("mul", "bf16", L, [8, 1, 4096]), b("div", "bf16", L, [4096]),
         b("maximum", "bf16", L, [4096]), b("maximum", "bf16", L, [8, 1, 4096]), b("mul", "bf16", [8, 1, 4096], L),
         b("mul", "bf16", [1, 2048, 4096], [8, 2048, 1]), b("mul", "f32", [1, 2048, 4096], [8, 2048, 1]),
         b("pow", "bf16", L, L), b("pow", "bf16", L, [4096]),
         r("bf16", [33554432], axes=None), r("bf16", L, target=[4096]), r("bf16", L, target=[8, 1, 4096]),
         r("bf16", L, target=[1, 2048, 4096]), r("bf16", [16384, 4096], axes=[1]), r("f32", L, target=[4096])]
json.dump({"cases": cases}, open(sys.argv[1], "w"))
EOF

if has info; then
  stamp "== info: launches of every perf case (registers, spills, occupancy, waves), tuning, presets on the focus cases"
  timeout -k 15 -s TERM "$INFO_LIMIT" $PY scripts/gpu/triton_tune_info.py --json "$OUT/kernels.json" \
    > "$OUT/info.log" 2>&1
  echo "exit $? (124: cut at ${INFO_LIMIT}s)"
  # presets, quick-timed, on the focus cases only (their kernels are then compiled for `variants`)
  timeout -k 15 -s TERM $(( PRESETS_LIMIT + 10 )) $PY - "$WORK/focus.json" "$OUT/kernels-presets.json" "$PRESETS_LIMIT" \
    >> "$OUT/info.log" 2>&1 <<'EOF'
import json, sys
sys.path.insert(0, "scripts/gpu")
import triton_tune_info as ti
key = lambda c: (c["op"], c["dtype"], json.dumps(c["params"], sort_keys=True))
focus = {key(c) for c in json.load(open(sys.argv[1]))["cases"]}
pick = lambda cases: [c for c in cases if key(c) in focus]
ti.binary_cases_all, ti.reduce_cases_all = ti.binary_cases, ti.reduce_cases
ti.binary_cases = lambda: pick(ti.binary_cases_all())
ti.reduce_cases = lambda: pick(ti.reduce_cases_all())
ti.main(["--presets", "--time-limit", sys.argv[3], "--json", sys.argv[2]])
EOF
  echo "exit $?"
  grep -E "^(tuned|.*ERROR)" "$OUT/info.log" | cut -c1-220 | head -40
fi

if has check; then
  run=($PY -m harness run --op binary_backward --op reduce_sum --backend triton --device cuda)
  stamp "== check: perf cases (oracle: JAX float64 on the GPU; at most ${CHECK_PERF_LIMIT}s)"
  timeout -k 15 -s TERM "$CHECK_PERF_LIMIT" "${run[@]}" --cases perf --oracle jax --json "$OUT/check-perf.json" \
    > "$OUT/check-perf.log" 2>&1
  echo "exit $? (124: cut, the JSON holds the cases that ran)"
  grep -E "^(FAIL|ERROR|CRASH)" "$OUT/check-perf.log" | cut -c1-200 | head -12; tail -2 "$OUT/check-perf.log"
  stamp "== check: smoke cases (at most ${CHECK_SMOKE_LIMIT}s)"
  timeout -k 15 -s TERM "$CHECK_SMOKE_LIMIT" "${run[@]}" --cases smoke --json "$OUT/check-smoke.json" \
    > "$OUT/check-smoke.log" 2>&1
  echo "exit $? (124: cut)"
  grep -E "^(FAIL|ERROR|CRASH)" "$OUT/check-smoke.log" | cut -c1-200 | head -12; tail -2 "$OUT/check-smoke.log"
fi

bench=(bench --op binary_backward --op reduce_sum --device cuda --interleave -q)
if has bench; then
  stamp "== bench: perf cases through triton (pairs started within ${BENCH_LIMIT}s)"
  $PY -m harness "${bench[@]}" --backend triton --cases perf --budget "$BUDGET" --time-limit "$BENCH_LIMIT" \
    --report "$OUT/bench" > "$OUT/bench.log" 2>&1
  echo "exit $?"
  grep -E "^(FAIL|ERROR)" "$OUT/bench.log" | cut -c1-200 | head -8
fi

if has variants; then
  stamp "== variants: focus cases, triton beside triton@{$BINARY_VARIANTS} / {$REDUCE_VARIANTS} (${VARIANTS_LIMIT}s)"
  impls=(--backend triton)
  for v in ${BINARY_VARIANTS//,/ } ${REDUCE_VARIANTS//,/ }; do impls+=(--backend "triton@$v"); done
  GRADORACLE_TRITON_VARIANTS=$BINARY_VARIANTS GRADORACLE_TRITON_REDUCE_VARIANTS=$REDUCE_VARIANTS \
    $PY -m harness "${bench[@]}" "${impls[@]}" --cases "$WORK/focus.json" --budget "$VARIANT_BUDGET" \
    --warmup-budget 0.1 --time-limit "$VARIANTS_LIMIT" --no-plots --report "$OUT/variants" \
    > "$OUT/variants.log" 2>&1
  echo "exit $?"
  grep -E "^(FAIL|ERROR)" "$OUT/variants.log" | cut -c1-200 | head -8
fi

stamp "== tables"
$PY scripts/gpu/triton_tune_report.py --bench "$OUT/bench" --variants "$OUT/variants" --info "$OUT/kernels.json" \
  --presets "$OUT/kernels-presets.json" --misses "$OUT/misses.txt" | tee "$OUT/summary.txt"

if has profile && [ -s "$OUT/misses.txt" ]; then
  head -n "$PROFILE_MAX" "$OUT/misses.txt" > "$WORK/profile.list"
  stamp "== profile: $(wc -l < "$WORK/profile.list") case(s) under the bar (at most ${PROFILE_LIMIT}s)"
  OUT=$OUT timeout -k 15 -s TERM "$PROFILE_LIMIT" bash scripts/gpu/profile_cases.sh "$WORK/profile.list" \
    > "$OUT/profiles.txt" 2>&1
  echo "exit $?"
  grep -E "^(==|kernel|  time|  occupancy|  grid|  top)" "$OUT/profiles.txt" | cut -c1-160
fi
stamp "== done"
