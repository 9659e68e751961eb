#!/usr/bin/env bash
# The tensor-core ops' bench (issue 11: loop figure and binding ceiling for every op), time-limited per
# op, after an optional first run of REST (a cases file) through REST_OPS/REST_BACKENDS.
# Writes $OUT/compute.tgz.  Knobs: MM_LIMIT (80) CONV_LIMIT (130) ATTN_LIMIT (90).
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
W=$(mktemp -d)/compute; mkdir -p "$W"
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
common=(--device cuda --mode cold --budget 0.1 --warmup-budget 0.05 --min-samples 10 --max-samples 400 --interleave --no-plots -q)
b() { local name=$1; shift; local t0=$(date +%s)
  python3 -m harness bench "${common[@]}" "$@" --report "$W/$name" > "$W/$name.log" 2>&1
  echo "$name exit $? in $(( $(date +%s) - t0 )) s: $(grep -E 'timed' "$W/$name.log" | tail -1)"; mv "$W/$name.log" "$W/$name/bench.log" 2>/dev/null; }
if [[ -n "${REST:-}" ]]; then
  rb=(); for x in $REST_BACKENDS; do rb+=(--backend "$x"); done
  b rest --cases "$REST" --op "$REST_OPS" "${rb[@]}" --time-limit "${REST_LIMIT:-220}"
fi
b matmul --cases perf --op matmul_backward --backend torch --backend torch_compile --backend jax --backend triton --time-limit "${MM_LIMIT:-80}"
b conv --cases perf --op conv_backward_data --op conv_backward_weight --backend torch --backend torch_compile --backend jax \
  --backend triton --time-limit "${CONV_LIMIT:-130}"
b attn --cases perf --op attention_backward --backend sdpa_flash --backend sdpa_cudnn --backend jax --backend triton \
  --backend triton@det --time-limit "${ATTN_LIMIT:-90}"
tar -czf "$OUT/compute.tgz" -C "$(dirname "$W")" compute
