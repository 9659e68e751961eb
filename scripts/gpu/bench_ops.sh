#!/usr/bin/env bash
# One `harness bench` run (cold L2) of the ops in OPS through the implementations in BACKENDS, then,
# when SEEDS is set, a second run of the ladder-seed cases (scripts/gpu/cases/ladder_seeds.json) of
# those ops through SEED_BACKENDS (hot L2, the source programs' own setting).
#   OUT=dir OPS="layernorm_backward rmsnorm_backward" BACKENDS="torch triton ..." bash scripts/gpu/bench_ops.sh
# Knobs: TAG (bench), CASES (perf), TIME_LIMIT (s, 480), BUDGET (0.1), WARMUP (0.05), SEED_LIMIT (60).
# Writes $OUT/$TAG.tgz: $TAG/{results.json, report.md, bench.log} and $TAG-seeds/ likewise.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16} XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
: "${OUT:?set OUT}" "${OPS:?set OPS}" "${BACKENDS:?set BACKENDS}"
TAG=${TAG:-bench} CASES=${CASES:-perf} TIME_LIMIT=${TIME_LIMIT:-480} BUDGET=${BUDGET:-0.1} WARMUP=${WARMUP:-0.05}
W=$(mktemp -d)/$TAG; mkdir -p "$W"
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
python3 -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')" 2>&1 | tail -1
ops=(); for o in $OPS; do ops+=(--op "$o"); done
bks=(); for b in $BACKENDS; do bks+=(--backend "$b"); done
t0=$(date +%s)
python3 -m harness bench --device cuda --cases "$CASES" --mode cold --budget "$BUDGET" --warmup-budget "$WARMUP" \
  --min-samples 10 --max-samples 400 --interleave --time-limit "$TIME_LIMIT" --no-plots -q "${ops[@]}" "${bks[@]}" \
  --report "$W" > "$W/bench.log" 2>&1
echo "bench exit $? in $(( $(date +%s) - t0 )) s"; tail -3 "$W/bench.log"
if [[ -n "${SEEDS:-}" ]]; then
  sb=(); for b in ${SEED_BACKENDS:-$BACKENDS}; do sb+=(--backend "$b"); done
  python3 -m harness bench --device cuda --cases scripts/gpu/cases/ladder_seeds.json --mode hot --budget 0.2 \
    --min-samples 20 --time-limit "${SEED_LIMIT:-60}" --no-plots -q "${ops[@]}" "${sb[@]}" --report "$W-seeds" \
    > "$W-seeds.log" 2>&1
  echo "seeds exit $?"; mv "$W-seeds.log" "$W-seeds/bench.log" 2>/dev/null
fi
tar -czf "$OUT/$TAG.tgz" -C "$(dirname "$W")" .
