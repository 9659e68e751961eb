#!/usr/bin/env bash
# Triton layernorm_backward / rmsnorm_backward on a CUDA machine: run from the repo root with $OUT a folder.
#   OUT=/some/dir scripts/gpu/triton_norms.sh
# 1. every `full` case of both ops through triton (correctness, repeat, guards), JSON and log into $OUT;
# 2. one `harness bench` of the perf cases of both ops: torch, torch_compile, jax, triton (cold, interleaved,
#    stops starting pairs after BENCH_LIMIT s), report (results.json, report.md, plots) into $OUT/bench;
# 3. the launch-sizing sweep (scripts/gpu/triton_norms_sweep.py, SWEEP_LIMIT s): $OUT/sweep.{txt,json}.
# About 6 minutes on an H100 (full ~2.5 min incl. oracles and Triton compiles, bench BENCH_LIMIT=130 s + its tail,
# sweep ~1 min).  Knobs: BENCH_LIMIT=130 SWEEP_LIMIT=40 BUDGET=0.2 DEVICE=cuda.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
BENCH_LIMIT=${BENCH_LIMIT:-130} SWEEP_LIMIT=${SWEEP_LIMIT:-40} BUDGET=${BUDGET:-0.2} DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
ops=(--op layernorm_backward --op rmsnorm_backward)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "from backends.triton import _norm; print('triton PDL supported:', _norm.PDL_SUPPORTED)"
} 2>&1 | tee "$OUT/env.txt"

stamp "== full cases through triton"
python3 -m harness run "${ops[@]}" --backend triton --cases full --device "$DEVICE" --json "$OUT/full.json" \
  > "$OUT/full.log" 2>&1
echo "exit $?"
grep -E "^(FAIL|ERROR)" -A3 "$OUT/full.log" | head -40
tail -1 "$OUT/full.log"

stamp "== bench perf cases: torch, torch_compile, jax, triton"
python3 -m harness bench "${ops[@]}" --backend torch --backend torch_compile --backend jax --backend triton \
  --device "$DEVICE" --cases perf --mode cold --budget "$BUDGET" --warmup-budget 0.2 --min-samples 10 \
  --max-samples 500 --rel-ci 0.005 --interleave --time-limit "$BENCH_LIMIT" --report "$OUT/bench" \
  > "$OUT/bench.log" 2> "$OUT/bench.err"
echo "exit $?"
grep -E "^bench:" "$OUT/bench.err"
grep -E "^(FAIL|ERROR)" "$OUT/bench.log" | cut -c1-220 | head -12
grep -A40 "^## layernorm_backward" "$OUT/bench/report.md" 2>/dev/null | grep -E "^\|" | head -24
grep -A40 "^## rmsnorm_backward" "$OUT/bench/report.md" 2>/dev/null | grep -E "^\|" | head -24

stamp "== launch-sizing sweep"
python3 scripts/gpu/triton_norms_sweep.py --out "$OUT" --time-limit "$SWEEP_LIMIT" 2>&1 | tail -80
ls -la "$OUT" "$OUT/bench" 2>/dev/null
stamp "done"
