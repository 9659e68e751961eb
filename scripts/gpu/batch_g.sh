#!/usr/bin/env bash
# Batch G (~4 min): the triton binary_backward full set after the extent-1 operand tile change (6 shards
# side by side), then the both-broadcast cases and three unchanged patterns benched, triton beside torch.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"
base=$OUT
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
OUT=$base/full bash scripts/gpu_parallel_run.sh scripts/jobs/triton-binary-full.txt "${PAR:-170}" > /dev/null 2>&1
cat "$base/full/summary.txt"
W=$(mktemp -d)/g; mkdir -p "$W"
python3 -m harness bench --device cuda --mode cold --budget 0.15 --warmup-budget 0.1 --min-samples 10 --no-plots -q \
  --cases scripts/gpu/cases/binary_both_check.json --op binary_backward --backend torch --backend triton --no-isolate \
  --time-limit 60 --report "$W/bench" > "$W/bench.log" 2>&1
grep -E "^binary|timed" "$W/bench.log"
tar -czf "$base/g.tgz" -C "$(dirname "$W")" g
