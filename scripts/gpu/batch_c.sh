#!/usr/bin/env bash
# Batch C (one device call, ~9.5 min): scripts/jobs/kernels-full-2.txt side by side (300 s), then two
# short benches alone on the GPU: reduce_sum bf16 through the triton finish variants, and attention
# through triton beside SDPA.  $OUT gets summary.txt, runs.tar.gz, bench.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=16 XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
bash scripts/gpu_parallel_run.sh scripts/jobs/kernels-full-2.txt "${PAR_S:-300}" > /dev/null 2>&1
cat "$OUT/summary.txt"
W=$(mktemp -d)/bench; mkdir -p "$W"
common=(--device cuda --cases perf --mode cold --budget 0.15 --warmup-budget 0.1 --min-samples 10 --max-samples 400 --no-plots -q)
GRADORACLE_TRITON_REDUCE_VARIANTS=finish_last,tiles timeout 150 python3 -m harness bench "${common[@]}" --op reduce_sum \
  --dtype bf16 --backend triton --backend triton@finish_last --backend triton@tiles --time-limit 100 --report "$W/reduce" \
  > "$W/reduce.log" 2>&1
echo "reduce bench exit $?"; grep -E "^reduce_sum" "$W/reduce.log" | tail -40
timeout 150 python3 -m harness bench "${common[@]}" --op attention_backward --backend triton --backend triton@det \
  --backend sdpa_flash --backend sdpa_cudnn --time-limit 100 --report "$W/attn" > "$W/attn.log" 2>&1
echo "attn bench exit $?"; grep -E "^attention" "$W/attn.log" | tail -60
tar -czf "$OUT/bench.tgz" -C "$(dirname "$W")" bench
