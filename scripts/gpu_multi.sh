#!/usr/bin/env bash
# Many GPUs (issue 5), one device call on a host of 2 GPUs (at most BUDGET=530 s plus 15 s grace;
# about 5 minutes expected), results in $OUT:
#   1. env.txt: the GPUs (nvidia-smi -L), driver, Python packages; then `harness list` (builds torch_ext);
#   2. pytest -n 2 -m gpu and the same tests with -n 1 (the first also warms the Triton and CuPy
#      kernel caches for step 3): worker -> GPU lines ("GPU per worker"), outcomes compared test by
#      test through --junitxml (python -m harness.multi_gpu compare-junit);
#   3. one selection of `harness run`, same seed, first with --gpus 2 (two.json), then in one
#      process on GPU 0 (one.json), each timed; python -m harness.multi_gpu compare checks the same
#      (op, impl, case, dtype) rows with the same status, the rows per GPU, and the speedup;
#   4. an nvidia-smi sample a second (utilization, memory per GPU), summarised per step;
#   5. summary.txt with the figures.
# Files back: env.txt, summary.txt, one.json.gz, two.json.gz, compare.json, logs.tar.gz (logs,
# junit files, the case file, GPU samples).
#
#   OUT=dir bash scripts/gpu_multi.sh               # on the GPU host
#   OUT=dir DEVICE=cpu bash scripts/gpu_multi.sh    # the same logic on CPU workers, tiny selection
#
# The selection (default, DEVICE=cuda): every `full` case of binary_backward, reduce_sum,
# layernorm_backward and rmsnorm_backward, every dtype, whose bytes moved (the op's cost model) are
# at most MAX_MB=64 MiB: 1286 + 136 + 60 + 52 of 1568 cases.  The 34 left out are the perf-size
# ones (largest tensor 8.4M to 67M elements), 2% of the cases but most of the CPU time, which is
# what a run costs on a GPU host: the float64 numpy oracle and judging each implementation's outputs in
# float64 (measured on a CPU: 1 to 26 s to prepare one such case, before any implementation runs,
# against 3.7 s for all 1286 binary_backward cases kept).  Backends cupy (@naive and @opt),
# torch_ext, triton and torch: 5 implementations of binary_backward, torch alone for the other
# three ops, 6678 rows.  MAX_MB=0 takes the tag (CASES, default full) as it is.
# Override with OPS, BACKENDS, DTYPES, MAX_MB, CASES, SEED, NGPU, BUDGET (seconds for the whole batch).
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
OUT=${OUT:-results/local/gpu-multi}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
NGPU=${NGPU:-2}
SEED=${SEED:-5150}
BUDGET=${BUDGET:-530}
CASES=${CASES:-full}
if [[ $DEVICE == cpu ]]; then  # a dry run of the logic: tiny selection, CPU workers, pins from a made-up list
  OPS=${OPS:-binary_backward reduce_sum}
  BACKENDS=${BACKENDS:-torch torch_ext}
  DTYPES=${DTYPES:-f64}
  MAX_MB=${MAX_MB:-0.01}
  PYTEST_FILES=${PYTEST_FILES:-tests/test_correctness.py}
  PYTEST_MARK=${PYTEST_MARK:-not gpu}
  PYTEST_CASES=${PYTEST_CASES:-smoke}
  PYTEST_ENV=(CUDA_VISIBLE_DEVICES=0,1)
else
  OPS=${OPS:-binary_backward reduce_sum layernorm_backward rmsnorm_backward}
  BACKENDS=${BACKENDS:-cupy torch_ext triton torch}
  DTYPES=${DTYPES:-}
  MAX_MB=${MAX_MB:-64}
  PYTEST_FILES=${PYTEST_FILES:-tests/test_correctness.py tests/test_planted_gpu.py tests/test_timing.py}
  PYTEST_MARK=${PYTEST_MARK:-gpu}
  PYTEST_CASES=${PYTEST_CASES:-smoke}
  PYTEST_ENV=()
fi

start=$(date +%s)
work=$(mktemp -d)/gpu-multi
mkdir -p "$OUT" "$work"
now() { date +%s.%N; }
left() { echo $(( start + BUDGET - $(date +%s) )); }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
cap() { local c=$1 l; l=$(left); (( c > l - 10 )) && c=$(( l - 10 )); (( c < 10 )) && c=10; echo "$c"; }
phase() { echo "$1 $2 $(now)" >> "$work/phases.txt"; }
log() { echo "[$(( $(date +%s) - start ))s] $*"; }

# ----------------------------------------------------------------------------- 1. environment, build
{
  echo "device=$DEVICE seed=$SEED budget=${BUDGET}s ngpu=$NGPU"
  nproc; free -g | head -2
  if [[ $DEVICE != cpu ]]; then
    nvidia-smi -L
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -1
  fi
  $PY -c "import sys, numpy, torch, triton; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'torch.cuda', torch.version.cuda, 'devices', torch.cuda.device_count() if torch.cuda.is_available() else 0)"
  $PY -c "import cupy, jax, xdist, pytest; print('cupy', cupy.__version__, 'jax', jax.__version__, 'pytest', pytest.__version__, 'xdist', xdist.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
gpus_seen=0
if [[ $DEVICE != cpu ]]; then
  gpus_seen=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
  (( gpus_seen < NGPU )) && log "WARNING: $gpus_seen GPU(s) seen, $NGPU asked for: the --gpus run will refuse"
  sampler() {  # one line per GPU a second: epoch, index, utilization %, memory used MiB
    while :; do
      t=$(now)
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null \
        | sed "s/^/$t, /"
      sleep 1
    done
  }
  sampler >> "$work/gpu-samples.csv" &
  sampler_pid=$!
  trap 'kill "$sampler_pid" 2>/dev/null' EXIT
fi

log "harness list (builds torch_ext on first use)"
phase list start; t0=$(now)
timeout -k 15 -s TERM "$(cap 240)" $PY -m harness list > "$work/list.txt" 2>&1
rc_list=$?; phase list end; wall_list=$(secs "$t0" "$(now)")
log "list exit $rc_list in ${wall_list}s"; grep -E "^  (cupy|torch_ext|triton|torch) " -A1 "$work/list.txt" | grep -E "cuda|cpu" | head -8

# ----------------------------------------------------------------------------- the selection
sel_args=(--seed "$SEED" --device "$DEVICE")
for op in $OPS; do sel_args+=(--op "$op"); done
for b in $BACKENDS; do sel_args+=(--backend "$b"); done
for d in $DTYPES; do sel_args+=(--dtype "$d"); done
if [[ ${MAX_MB:-0} != 0 ]]; then
  cases_arg="$work/cases.json"
  $PY - "$CASES" "$MAX_MB" "$cases_arg" "$OPS" "$DTYPES" "$BACKENDS" > "$work/selection.txt" 2>&1 <<'EOF'
import json, sys
from cases import select
from harness.registry import discover, get_op, impls_for
tag, cap_mb, out, ops, dtypes, backends = sys.argv[1], float(sys.argv[2]), sys.argv[3], *(a.split() for a in sys.argv[4:7])
discover()
chosen = [c for c in select(tag) if c.op in ops and (not dtypes or c.dtype in dtypes)]
keep = [c for c in chosen if get_op(c.op).cost(c).bytes <= cap_mb * 2**20]
left_out = [c for c in chosen if c not in keep]
json.dump([c.to_json() for c in keep], open(out, "w"))
impls = {op: [i.id for i in impls_for(op) if i.id in backends or i.backend.name in backends] for op in ops}
rows = sum(len(impls[c.op]) for c in keep)
print(f"{len(keep)} of {len(chosen)} '{tag}' cases (ops {' '.join(ops)}; dtypes {' '.join(dtypes) or 'all'}) "
      f"with at most {cap_mb:g} MiB moved; about {rows} rows")
print("  per op: " + "; ".join(f"{op} {sum(c.op == op for c in keep)} cases x {len(impls[op])} impls "
                               f"({', '.join(impls[op])})" for op in ops))
print(f"  left out ({len(left_out)}): " + ", ".join(c.id for c in left_out[:40]) + (" ..." if len(left_out) > 40 else ""))
EOF
else
  cases_arg=$CASES
  echo "--cases $CASES as it is (no size cap)" > "$work/selection.txt"
fi
sel_args=(--cases "$cases_arg" "${sel_args[@]}")
cat "$work/selection.txt"

# ----------------------------------------------------------------------------- 2. pytest -n 2 and -n 1
pytest_args=(-p no:cacheprovider -q -m "$PYTEST_MARK" --cases "$PYTEST_CASES" --seed "$SEED" --device "$DEVICE")
for op in $OPS; do pytest_args+=(--op "$op"); done
for b in $BACKENDS; do pytest_args+=(--backend "$b"); done
for d in $DTYPES; do pytest_args+=(--dtype "$d"); done
after_list=$(left)
declare -A wall_pytest rc_pytest
for n in "$NGPU" 1; do
  c=$(( n == 1 ? after_list / 4 : after_list / 6 )); (( c > 150 )) && c=150
  log "pytest -n $n (cap $(cap "$c")s)"
  phase "pytest-n$n" start; t0=$(now)
  # shellcheck disable=SC2086
  env "${PYTEST_ENV[@]}" timeout -k 15 -s INT "$(cap "$c")" $PY -m pytest -n "$n" $PYTEST_FILES "${pytest_args[@]}" \
    --junitxml "$work/pytest-n$n.xml" > "$work/pytest-n$n.log" 2>&1
  rc_pytest[$n]=$?; phase "pytest-n$n" end; wall_pytest[$n]=$(secs "$t0" "$(now)")
  log "pytest -n $n exit ${rc_pytest[$n]} in ${wall_pytest[$n]}s: $(tail -1 "$work/pytest-n$n.log")"
done

# ----------------------------------------------------------------------------- 3. harness run --gpus 2, then one process
c=$(( ($(left) - 25) * 36 / 100 ))
log "harness run --gpus $NGPU (cap $(cap "$c")s)"
phase two start; t0=$(now)
timeout -k 15 -s TERM "$(cap "$c")" $PY -m harness run "${sel_args[@]}" --gpus "$NGPU" --json "$work/two.json" \
  > "$work/two.log" 2>&1
rc_two=$?; phase two end; wall_two=$(secs "$t0" "$(now)")
log "two exit $rc_two in ${wall_two}s: $(tail -1 "$work/two.log")"

log "harness run in one process on GPU 0 (cap $(cap $(( $(left) - 15 )))s)"
phase one start; t0=$(now)
CUDA_VISIBLE_DEVICES=0 timeout -k 15 -s TERM "$(cap $(( $(left) - 15 )))" $PY -m harness run "${sel_args[@]}" \
  --json "$work/one.json" > "$work/one.log" 2>&1
rc_one=$?; phase one end; wall_one=$(secs "$t0" "$(now)")
log "one exit $rc_one in ${wall_one}s: $(tail -1 "$work/one.log")"

# ----------------------------------------------------------------------------- 4. comparisons, summary
[[ $DEVICE != cpu ]] && kill "$sampler_pid" 2>/dev/null
if [[ -f $work/one.json && -f $work/two.json ]]; then
  $PY -m harness.multi_gpu compare "$work/one.json" "$work/two.json" --wall-one "$wall_one" --wall-two "$wall_two" \
    --json "$OUT/compare.json" > "$work/compare.txt" 2>&1
  rc_cmp=$?
else
  echo "no comparison: one.json or two.json missing (exit statuses one $rc_one, two $rc_two)" > "$work/compare.txt"
  rc_cmp=2
fi
if [[ -f $work/pytest-n$NGPU.xml && -f $work/pytest-n1.xml ]]; then
  $PY -m harness.multi_gpu compare-junit "$work/pytest-n$NGPU.xml" "$work/pytest-n1.xml" 2>&1 \
    | sed "s|$work/||" > "$work/compare-junit.txt"
  rc_junit=${PIPESTATUS[0]}
else
  echo "no comparison: a junit file is missing" > "$work/compare-junit.txt"
  rc_junit=2
fi
gpu_use=""
if [[ -s $work/gpu-samples.csv ]]; then
  gpu_use=$($PY - "$work/phases.txt" "$work/gpu-samples.csv" <<'EOF'
import sys
phases = {}
for line in open(sys.argv[1]):
    name, edge, t = line.split()
    phases.setdefault(name, {})[edge] = float(t)
samples = []
for line in open(sys.argv[2]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 4 and all(p.replace(".", "").isdigit() for p in parts):
        samples.append((float(parts[0]), parts[1], float(parts[2]), float(parts[3])))
for name, edges in phases.items():
    if "end" not in edges:
        continue
    inside = [s for s in samples if edges["start"] <= s[0] <= edges["end"]]
    parts = []
    for gpu in sorted({s[1] for s in inside}, key=int):
        mine = [s for s in inside if s[1] == gpu]
        busy = sum(s[2] > 0 for s in mine)
        parts.append(f"GPU {gpu}: util mean {sum(s[2] for s in mine) / len(mine):.0f}% max {max(s[2] for s in mine):.0f}%, "
                     f"busy {busy}/{len(mine)} samples, memory max {max(s[3] for s in mine):.0f} MiB")
    print(f"  {name}: " + ("; ".join(parts) or "no samples"))
EOF
)
fi

{
  echo "gradoracle many-GPU check ($(date -u +%FT%TZ)), device=$DEVICE, seed $SEED, $(grep -c '^GPU ' "$OUT/env.txt") GPU(s) listed"
  grep -E "^GPU " "$OUT/env.txt"
  echo "harness list (torch_ext build): exit $rc_list, ${wall_list}s"
  echo
  echo "== harness run: one process on GPU 0 against --gpus $NGPU, same selection and seed"
  cat "$work/selection.txt"
  echo "one: exit $rc_one, wall ${wall_one}s: $(tail -1 "$work/one.log")"
  echo "two: exit $rc_two, wall ${wall_two}s: $(tail -1 "$work/two.log")"
  cat "$work/compare.txt"
  echo
  echo "== pytest -n $NGPU against -n 1 (-m '$PYTEST_MARK', $PYTEST_FILES, --cases $PYTEST_CASES)"
  for n in "$NGPU" 1; do
    echo "-n $n: exit ${rc_pytest[$n]}, wall ${wall_pytest[$n]}s: $(tail -1 "$work/pytest-n$n.log")"
    sed -n '/gradoracle: GPU per worker/,/distinct GPU/p' "$work/pytest-n$n.log" | sed 1d | sed 's/^/  /'
  done
  cat "$work/compare-junit.txt"
  if [[ -n $gpu_use ]]; then
    echo
    echo "== nvidia-smi, one sample a second, per step"
    echo "$gpu_use"
  fi
  echo
  echo "harness run check: $( ((rc_cmp == 0)) && echo "OK (same rows, same verdicts, rows on every GPU)" \
    || echo "NOT OK (compare exit $rc_cmp; see above)")"
  echo "pytest outcomes identical: $( ((rc_junit == 0)) && echo yes || echo "NO (compare-junit exit $rc_junit)")"
  echo "total $(( $(date +%s) - start ))s"
} > "$OUT/summary.txt"

for name in one two; do [[ -f $work/$name.json ]] && gzip -c "$work/$name.json" > "$OUT/$name.json.gz"; done
tar -czf "$OUT/logs.tar.gz" --exclude=one.json --exclude=two.json -C "$(dirname "$work")" "$(basename "$work")"
cat "$OUT/summary.txt"
