#!/usr/bin/env bash
# Batch F (~5 min): ncu profiles of binary_backward with both operands broadcast, then attention_backward
# benched with the loop figure (4 perf cases, triton beside SDPA flash / cuDNN).  $OUT/f.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
base=$OUT; W=$(mktemp -d)/f; mkdir -p "$W"
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
OUT=$W timeout 100 bash scripts/gpu/profile_cases.sh scripts/gpu/cases/profile_both_broadcast.txt > "$W/profile.log" 2>&1
echo "profiles: $(ls "$W/profile" 2>/dev/null | wc -l) files"; grep -E "kernel|DRAM|occupancy|sectors|waves|stalls" "$W/profile.log" | head -30
python3 -m harness bench --device cuda --mode cold --budget 0.15 --warmup-budget 0.1 --min-samples 10 --max-samples 400 \
  --no-plots -q --cases perf --op attention_backward --per-op "${PER_OP:-4}" --backend sdpa_flash --backend sdpa_cudnn \
  --backend triton --backend triton@det --time-limit "${ATTN_LIMIT:-190}" --report "$W/attn" > "$W/attn.log" 2>&1
echo "attn exit $?"; grep -E "^attention|timed" "$W/attn.log" | tail -20
tar -czf "$base/f.tgz" -C "$(dirname "$W")" f
