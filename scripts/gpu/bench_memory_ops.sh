#!/usr/bin/env bash
# One `harness bench` run of the memory-bound ops (reduce_sum, layernorm_backward, rmsnorm_backward,
# binary_backward) on the perf cases: the kernel backends (triton, cupy@best, torch_ext) beside the
# baselines (torch, torch_compile, jax), cold L2, ops interleaved so a time-limited run covers each;
# then BENCHMARKS.md's sections of these ops regenerated from it.
#   OUT=dir scripts/gpu/bench_memory_ops.sh        Knobs: TIME_LIMIT (s, 470), BUDGET (0.15), PER_OP
# Writes $OUT/bench.tgz (results.json, report.md, bench.log) and $OUT/BENCHMARKS.md.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16} XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
: "${OUT:?set OUT}"
TIME_LIMIT=${TIME_LIMIT:-470} BUDGET=${BUDGET:-0.15}
per_op=(); [[ -n "${PER_OP:-}" ]] && per_op=(--per-op "$PER_OP")
W=$(mktemp -d)/bench
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
python3 -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')"
python3 -m harness bench --device cuda --cases perf --mode cold --budget "$BUDGET" --warmup-budget 0.1 \
  --min-samples 10 --max-samples 400 --interleave --time-limit "$TIME_LIMIT" --no-plots -q "${per_op[@]}" \
  --op reduce_sum --op layernorm_backward --op rmsnorm_backward --op binary_backward \
  --backend torch --backend torch_compile --backend jax --backend triton --backend cupy@best --backend torch_ext \
  --report "$W" > "$W.log" 2>&1
echo "bench exit $?"; tail -4 "$W.log"
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
python3 -m harness bench --from "$W/results.json" --benchmarks-md "$OUT/BENCHMARKS.md" --no-plots > /dev/null 2>&1 \
  || echo "BENCHMARKS.md regeneration failed"
mv "$W.log" "$W/bench.log"; tar -czf "$OUT/bench.tgz" -C "$(dirname "$W")" bench
