#!/usr/bin/env bash
# Batch E (one device call, ~8.5 min): `harness profile` (ncu) of the memory-bound misses
# (scripts/gpu/cases/profile_misses.txt), then the binary perf cases bench-2 had not reached
# (binary_rest2.json) through the same impls.  $OUT/e.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_ALLOCATOR=platform
: "${OUT:?set OUT}"
base=$OUT; W=$(mktemp -d)/e; mkdir -p "$W"
python3 -m pip install -q -e . --no-deps --no-build-isolation > /dev/null 2>&1
python3 -c "from backends import torch_ext; print('torch_ext:', torch_ext._check('cuda') or 'available')" 2>&1 | tail -1
t0=$(date +%s)
OUT=$W timeout 280 bash scripts/gpu/profile_cases.sh scripts/gpu/cases/profile_misses.txt > "$W/profile.log" 2>&1
echo "profiles in $(( $(date +%s) - t0 )) s: $(ls "$W/profile" | wc -l) files"
bk=(); for x in torch torch_compile jax triton cupy@naive cupy@opt cupy@opt2 cupy@best torch_ext; do bk+=(--backend "$x"); done
python3 -m harness bench --device cuda --mode cold --budget 0.1 --warmup-budget 0.05 --min-samples 10 --max-samples 400 \
  --interleave --no-plots -q --cases scripts/gpu/cases/binary_rest2.json --op binary_backward "${bk[@]}" \
  --time-limit "${REST_LIMIT:-200}" --report "$W/rest2" > "$W/rest2.log" 2>&1
echo "rest2 exit $?: $(grep timed "$W/rest2.log" | tail -1)"
tar -czf "$base/e.tgz" -C "$(dirname "$W")" e
