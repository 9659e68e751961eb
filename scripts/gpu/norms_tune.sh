#!/usr/bin/env bash
# Tuning batch of the Triton layernorm_backward / rmsnorm_backward (one GPU, under 8 minutes).
#   OUT=/some/dir scripts/gpu/norms_tune.sh            (from the repo root)
# 1. check: the smoke and perf cases of both ops through triton, judged against the oracle
#    (python -m harness run ... --backend triton), in parallel processes: the smoke cases with the
#    default sizing and with GRADORACLE_TRITON_NORM=finish=kernel (the other finish), the perf cases
#    in CHECK_SHARDS shards (their numpy oracles are the slow part); each --isolate, so a crash or a
#    hang is one CRASH / TIMEOUT row, not a lost batch.  Stops after CHECK_LIMIT s.
# 2. sweep: scripts/gpu/triton_norms_sweep.py, every candidate sizing on every perf shape (cold
#    device time, err/tol against a float64 reference, host time per call, registers), ending in
#    the tables that decide: % of copy per shape and candidate, per-candidate totals, host vs device.
#    It gets the time left (minus a margin for its last shape and the tables).
# Writes 6 files under $OUT: env.txt, check.log (every check's summary, its failures, and the
# perf rows), check.json.gz (every result of the default sizing, merged), sweep.txt, sweep.json, batch.log (this script's
# own output).  About 7 minutes on an H100 (check ~2.5 min, the sweep the rest).
# Knobs: PYTHON=python3 DEVICE=cuda TOTAL=450 CHECK_LIMIT=210 CHECK_SHARDS=4 SWEEP_ARGS="" (e.g.
# SWEEP_ARGS='--only-variants --variant stages=4,finish=kernel' for a second look at a few candidates).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PY=${PYTHON:-python3} DEVICE=${DEVICE:-cuda} TOTAL=${TOTAL:-450} CHECK_LIMIT=${CHECK_LIMIT:-210}
SHARDS=${CHECK_SHARDS:-4} SWEEP_ARGS=${SWEEP_ARGS:-}
mkdir -p "$OUT"
exec > >(tee "$OUT/batch.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
TMP=$(mktemp -d)
ops=(--op layernorm_backward --op rmsnorm_backward)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  $PY -c "from backends.triton import _norm; print('triton PDL supported:', _norm.PDL_SUPPORTED); print('default', _norm.GPU_CONFIG)"
  nproc
} 2>&1 | tee "$OUT/env.txt"

stamp "== check: smoke (default, finish=kernel) and perf ($SHARDS shards) through triton, $CHECK_LIMIT s at most"
run=($PY -m harness run "${ops[@]}" --backend triton --device "$DEVICE" --isolate --case-timeout 120)
pids=()
timeout "$CHECK_LIMIT" "${run[@]}" --cases smoke --json "$TMP/smoke.json" > "$TMP/smoke.log" 2>&1 & pids+=($!)
GRADORACLE_TRITON_NORM=finish=kernel timeout "$CHECK_LIMIT" "${run[@]}" --cases smoke \
  --json "$TMP/smoke-kernel.json" > "$TMP/smoke-kernel.log" 2>&1 & pids+=($!)
for ((k = 0; k < SHARDS; k++)); do
  timeout "$CHECK_LIMIT" "${run[@]}" --cases perf --shard "$k/$SHARDS" --json "$TMP/perf-$k.json" \
    > "$TMP/perf-$k.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; echo "check process $p: exit $?"; done
{
  for f in "$TMP"/smoke.log "$TMP"/smoke-kernel.log "$TMP"/perf-*.log; do
    echo "== $(basename "$f" .log): $(tail -1 "$f")"
    grep -E "^(FAIL|ERROR|CRASH|TIMEOUT)" -A4 "$f" | head -40
  done
  echo "== perf rows"
  grep -hE "^(PASS|FAIL|ERROR|CRASH|TIMEOUT|XFAIL)" "$TMP"/perf-*.log
} > "$OUT/check.log"
grep -E "^== |^(FAIL|ERROR|CRASH|TIMEOUT)" "$OUT/check.log" | head -40
jsons=()  # the default sizing's results (finish=kernel's are in check.log)
for f in "$TMP"/smoke.json "$TMP"/perf-*.json; do [ -s "$f" ] && jsons+=("$f"); done
[ ${#jsons[@]} -gt 0 ] && $PY -m harness merge "$OUT/check.json.gz" "${jsons[@]}" 2>&1 | tail -3
stamp "check done"

left=$(( TOTAL - ($(date +%s) - t0) ))
limit=$(( left > 150 ? left - 60 : 90 ))
stamp "== sweep: every candidate on every perf shape (starts no shape after $limit s; hard stop $((limit + 120)) s)"
timeout $((limit + 120)) $PY scripts/gpu/triton_norms_sweep.py --out "$OUT" --time-limit "$limit" $SWEEP_ARGS \
  > "$TMP/sweep.out" 2>&1
echo "sweep exit $?"
# the decisive part: the final tables (sweep.txt holds the per-shape blocks too)
sed -n '/^== % of copy/,$p' "$OUT/sweep.txt"
grep -E "ERROR|Traceback|Error" "$TMP/sweep.out" | head -10
rm -rf "$TMP"
ls -la "$OUT"
stamp "done"
