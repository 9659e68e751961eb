#!/usr/bin/env bash
# GPU benchmarks: run from the repo root on a CUDA machine with $OUT a folder for the results.
#   OUT=/some/dir scripts/gpu_bench.sh
# 1. builds what compiles on first use (`harness list` builds the torch extension) and measures the
#    device's ceilings (copy bandwidth, bf16 and fp32 matmul);
# 2. runs `bench` over the perf cases twice, back to back, into bench1 and bench2 (each run stops
#    starting new pairs after TIME_LIMIT seconds; ops are interleaved so a cut-short run covers all);
# 3. compares the two runs (FASTER / SLOWER / SAME / AMBIGUOUS) and prints the fraction of pairs
#    whose medians agree within 2%;
# 4. regenerates BENCHMARKS.md from the second run.
# $OUT gets 8 files: ceilings.json, bench{1,2}/results.json, bench{1,2}/report.md, compare.txt,
# BENCHMARKS.md and extras.tar.gz (the plots, logs, compare.json, env.txt).
# Knobs (environment): CASES=perf OPS="" (all; space-separated) BACKENDS="" (all) MODE=cold
# BUDGET=0.3 (sampling s per pair) TIME_LIMIT=130 (s per run) PER_OP="" PREFETCH="" (default cores/4)
# RESULTS_DIR=results/h100/bench (the plots BENCHMARKS.md links; the 2026-11-23 run: PER_OP=3 TIME_LIMIT=185 BUDGET=0.25)
# DEVICE=cuda (cpu dry-runs the script's logic anywhere).
# Whole script: about 7 minutes on an H100 with the defaults (2 x 130 s of measuring, the rest
# start-up, the extension build, ceilings and reports).
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
: "${OUT:?set OUT to a folder for the results}"
CASES=${CASES:-perf} OPS=${OPS:-} BACKENDS=${BACKENDS:-} MODE=${MODE:-cold} BUDGET=${BUDGET:-0.3}
TIME_LIMIT=${TIME_LIMIT:-130} PER_OP=${PER_OP:-} PREFETCH=${PREFETCH:-} DEVICE=${DEVICE:-cuda}
RESULTS_DIR=${RESULTS_DIR:-results/h100/bench}  # where BENCHMARKS.md's plots live (commit them with it)
WORK=$(mktemp -d /tmp/gradoracle-bench.XXXXXX)
export GRADORACLE_CACHE=$WORK/cache
mkdir -p "$OUT/bench1" "$OUT/bench2"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.total \
    --format=csv
  python3 -c "import sys, torch, triton, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__,
'triton', triton.__version__, 'numpy', numpy.__version__)"
  python3 -c "import cupy, jax; print('cupy', cupy.__version__, 'jax', jax.__version__)" 2>&1 | tail -1
} 2>&1 | tee "$WORK/env.txt"

stamp "== build (harness list)"
python3 -m harness list > "$WORK/list.txt" 2>&1
grep -E "unavailable|failed" "$WORK/list.txt" | head -8

stamp "== ceilings"
python3 -m harness ceilings --device "$DEVICE" --refresh --json "$OUT/ceilings.json" 2>&1 | tail -3

args=(--device "$DEVICE" --cases "$CASES" --mode "$MODE" --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10
      --max-samples 1000 --rel-ci 0.005 --interleave --time-limit "$TIME_LIMIT")
for op in $OPS; do args+=(--op "$op"); done
for b in $BACKENDS; do args+=(--backend "$b"); done
[ -n "$PER_OP" ] && args+=(--per-op "$PER_OP")
[ -n "$PREFETCH" ] && args+=(--prefetch "$PREFETCH")

for run in 1 2; do
  stamp "== bench run $run: python3 -m harness bench ${args[*]} --report $WORK/bench$run"
  python3 -m harness bench "${args[@]}" --report "$WORK/bench$run" > "$WORK/bench$run.log" 2> "$WORK/bench$run.err"
  echo "exit $?"
  grep -E "^bench:" "$WORK/bench$run.err"
  grep -E "^\[[#.]+\]" "$WORK/bench$run.err" | awk 'NR % 4 == 1' | cut -c1-150  # every 4th progress line
  grep -E "^\[[#.]+\]" "$WORK/bench$run.err" | tail -1 | cut -c1-150
  grep -E "^(FAIL|ERROR)" "$WORK/bench$run.log" | cut -c1-220 | head -12
  grep -E "timed, .* failed" "$WORK/bench$run.log"
  cp "$WORK/bench$run/results.json" "$WORK/bench$run/report.md" "$OUT/bench$run/" 2>/dev/null
done

stamp "== compare bench1 -> bench2"
python3 -m harness compare "$WORK/bench1/results.json" "$WORK/bench2/results.json" --json "$WORK/compare.json" \
  > "$OUT/compare.txt" 2>&1
grep -E "^(FASTER|SLOWER)" "$OUT/compare.txt" | head -10
tail -2 "$OUT/compare.txt"

stamp "== BENCHMARKS.md"
mkdir -p "$RESULTS_DIR/plots" && rm -f "$RESULTS_DIR"/plots/*.png && cp "$WORK"/bench2/plots/*.png "$RESULTS_DIR/plots/" 2>/dev/null
python3 -m harness bench --from "$WORK/bench2/results.json" --benchmarks-md BENCHMARKS.md \
  --plots-link "$RESULTS_DIR/plots" | tail -1
cp BENCHMARKS.md "$OUT/"

tar czf "$OUT/extras.tar.gz" -C "$WORK" env.txt list.txt compare.json bench1.log bench1.err bench2.log bench2.err \
  $(cd "$WORK" && ls -d bench1/plots bench2/plots 2>/dev/null)
ls -la "$OUT" "$OUT/bench1" "$OUT/bench2"
stamp "done"
