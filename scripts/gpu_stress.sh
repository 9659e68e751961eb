#!/usr/bin/env bash
# Stress batch for one GPU machine (H100 80 GB, 128 GB host, 16 cores), one device call of
# about 9 minutes, results in $OUT:
#   - the stress cases (over 2**31 elements) of the memory-bound ops through every backend that
#     claims them: one `harness run --cases stress --isolate` process per op, one after the
#     other (a case takes up to ~60 GB of the card: nothing heavy runs beside it), in order of
#     priority, binary_backward (the custom kernels) first.  Each runs under `timeout -s TERM`
#     with what is left of BUDGET less a reserve for the ops after it, so a late one still
#     saves its checkpoint JSON; the parts are merged into stress.json.  A backend that does
#     not claim a case shows as SKIP with its reason (stress.log lists them).
#   - beside them (small on the GPU): the torch_ext build (`harness list`), then
#     tests/test_planted_gpu.py and the gpu-marked tests of tests/test_bad_input.py (C++
#     errors reaching Python through torch_ext, ...).
#
#   OUT=dir scripts/gpu_stress.sh
#   OUT=dir RESUME=earlier-out-dir scripts/gpu_stress.sh   # run only what that run lacks
# Knobs: BUDGET (s, default 540), OPS (space-separated, in order), SEED (default 1),
# CASES (default stress), DEVICE (default cuda; `DEVICE=cpu CASES=tiny.json
# GRADORACLE_HUGE_NUMEL=10` dry-runs the batch on a CPU machine).
# Writes env.txt, list.txt, stress-OP.{json,log}, stress.json, stress.log, pytest-*.log, summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
# torch, cupy and JAX share the card; each keeps what it frees unless told otherwise.  JAX's
# platform allocator gives memory back (harness/stress.py empties torch's and cupy's caches).
export XLA_PYTHON_CLIENT_ALLOCATOR=${XLA_PYTHON_CLIENT_ALLOCATOR:-platform}
OUT=${OUT:-results/local}
BUDGET=${BUDGET:-540}
SEED=${SEED:-1}
CASES=${CASES:-stress}
DEVICE=${DEVICE:-cuda}
OPS=${OPS:-binary_backward layernorm_backward rmsnorm_backward reduce_sum}
RESERVE=${RESERVE:-75}  # seconds kept for each op still to come
mkdir -p "$OUT"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB"
  python3 -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
  for m in torch triton cupy jax; do python3 -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
} > "$OUT/env.txt" 2>&1

# Beside the stress runs: build torch_ext (`list` loads it), then the GPU pytest files (BESIDE=0: not them).
(
  t0=$(date +%s)
  python3 -m harness list > "$OUT/list.txt" 2>&1
  echo "list (with the torch_ext build) took $(( $(date +%s) - t0 ))s" >> "$OUT/list.txt"
  [[ ${BESIDE:-1} == 0 ]] && exit 0
  timeout -k 10 200 python3 -m pytest -q -p no:cacheprovider tests/test_planted_gpu.py \
    > "$OUT/pytest-planted-gpu.log" 2>&1
  echo "exit $?" >> "$OUT/pytest-planted-gpu.log"
  timeout -k 10 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_bad_input.py \
    > "$OUT/pytest-bad-input-gpu.log" 2>&1
  echo "exit $?" >> "$OUT/pytest-bad-input-gpu.log"
) &
beside=$!

set -- $OPS
left_ops=$#
: > "$OUT/timings.txt"
for op in "$@"; do
  left_ops=$(( left_ops - 1 ))
  secs=$(( BUDGET - $(elapsed) - left_ops * RESERVE ))
  if (( secs < 30 )); then
    echo "$op: not run (${secs}s left of BUDGET=$BUDGET)" >> "$OUT/timings.txt"
    continue
  fi
  resume=()
  if [[ -n "${RESUME:-}" && -f "$RESUME/stress-$op.json" ]]; then
    resume=(--resume "$RESUME/stress-$op.json")
  fi
  t0=$(date +%s)
  timeout -k 15 -s TERM "$secs" python3 -m harness run --cases "$CASES" --op "$op" --device "$DEVICE" \
    --seed "$SEED" --isolate --case-timeout 240 --show-skips -v "${resume[@]}" \
    --json "$OUT/stress-$op.json" > "$OUT/stress-$op.log" 2>&1
  echo "$op: exit $? in $(( $(date +%s) - t0 ))s (limit ${secs}s)" >> "$OUT/timings.txt"
done

wait "$beside"
parts=()
for op in $OPS; do [[ -f "$OUT/stress-$op.json" ]] && parts+=("$OUT/stress-$op.json"); done
if (( ${#parts[@]} )); then
  python3 -m harness merge "$OUT/stress.json" "${parts[@]}" > /dev/null
fi

{
  echo "== stress cases through every backend ($(elapsed)s in all)"
  cat "$OUT/timings.txt"
  python3 - "$OUT/stress.json" <<'EOF'
import json, sys
from collections import Counter
try:
    data = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no stress.json ({exc})")
    raise SystemExit
rows = data["results"]
print("counts:", dict(Counter(r["status"] for r in rows)))
for r in rows:
    worst = max((o.get("worst_ratio") or 0 for o in r.get("outputs", [])), default=0)
    line = f"{r['status']:7} {r['op']:18} {r['impl']:14} {r['case']:44} err/tol={worst:.3g}"
    if r["status"] != "PASS":
        line += "  " + (r.get("reason") or "").splitlines()[0][:160] if r.get("reason") else ""
        for o in r.get("outputs", []):
            if not o.get("passed"):
                line += f"\n        [{o['name']}] {o.get('message', '')[:200]}"
    print(line)
EOF
  for log in "$OUT"/pytest-*.log; do
    [[ -f "$log" ]] && echo "== $(basename "$log" .log): $(grep -E "passed|failed|skipped|error" "$log" | tail -1)"
  done
  tail -1 "$OUT/list.txt" 2>/dev/null
  echo "total $(elapsed)s"
} > "$OUT/summary.txt" 2>&1
cat "$OUT"/stress-*.log > "$OUT/stress.log" 2>/dev/null
cat "$OUT/summary.txt"
