#!/usr/bin/env bash
# GPU check of the backends/ layout (issue 12, backends half), from the repo root on a CUDA
# machine, results in $OUT.  What changed on the GPU path, and what each step checks:
#   - torch_ext's CUDA op no longer plans: it launches a BBLaunch made in Python
#     (backends/_plans/binary_backward_cuda.py, the plan cupy launches too).  build: the CUDA
#     build and the listing; check: tests/test_torch_ext.py on the GPU machine, binary_backward
#     `full` cases (1294) through torch_ext, cupy@opt and cupy@naive, the gpu-marked bad-input
#     tests of torch_ext and cupy; stress (optional): the stress cases (over 2**31 elements)
#     through torch_ext and cupy@opt, each case in a worker (--isolate).
#   - cupy's NVRTC source now has binary_backward_defs.h inlined (cupy/nvrtc.py); the same runs.
#   - per-call cost: the plan is looked up in Python per call (cached per layout).  bench: hot
#     timings of the binary_backward perf cases, torch_ext and cupy@opt (the control: its kernels
#     and launches did not change); with BASE=<a checkout of the previous commit, b2f3da4>, the
#     same bench there and `harness compare` of the two (expect SAME for cupy@opt, SAME for
#     torch_ext: the timer measures device time, and the kernels and launches are the same).
#
# Device calls of under 10 minutes each on an H100 (a later call reuses the first's build/):
#   OUT=dir STEPS="build check" scripts/gpu_layout_backends.sh                # about 7 min
#   git archive b2f3da4 --prefix=.base/ | tar -x      # before the call: the previous tree, carried along
#   OUT=dir STEPS=bench BASE=.base scripts/gpu_layout_backends.sh             # about 8 min (builds .base)
#   OUT=dir STEPS=stress scripts/gpu_layout_backends.sh                       # optional, up to 7 min
# Writes env.txt, list.txt, pytest-torch_ext.log, run-full.{json,log}, pytest-bad-input.log,
# stress.{json,log}, bench-new/ (results.json, report.md), bench-base/, compare.txt, summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export PATH="$PATH:$CUDA_HOME/bin"
OUT=${OUT:-results/local}
STEPS=${STEPS:-build check}
BASE=${BASE:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$OUT/summary.txt"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, torch, triton, cupy, jax, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'jax', jax.__version__, 'numpy', numpy.__version__)"
  nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1

if want build; then
  timeout 420 python3 -m harness list > "$OUT/list.txt" 2>&1
  note "build+list exit $? ($(grep -A1 '^  torch_ext ' "$OUT/list.txt" | tail -1 | xargs))"
fi

if want check; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_torch_ext.py > "$OUT/pytest-torch_ext.log" 2>&1
  note "tests/test_torch_ext.py exit $?: $(tail -1 "$OUT/pytest-torch_ext.log")"
  timeout -s TERM 240 python3 -m harness run --op binary_backward --backend torch_ext --backend cupy@opt \
    --backend cupy@naive --cases full --device cuda --json "$OUT/run-full.json" > "$OUT/run-full.log" 2>&1
  note "run --cases full exit $?: $(tail -1 "$OUT/run-full.log")"
  grep -E "^(FAIL|ERROR|CRASH)" -A3 "$OUT/run-full.log" | head -40 >> "$OUT/summary.txt"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_bad_input.py -m gpu -k "torch_ext or cupy" \
    > "$OUT/pytest-bad-input.log" 2>&1
  note "bad input (gpu, torch_ext and cupy) exit $?: $(tail -1 "$OUT/pytest-bad-input.log")"
fi

if want stress; then
  timeout -s TERM 420 python3 -m harness run --op binary_backward --backend torch_ext --backend cupy@opt \
    --cases stress --device cuda --isolate --json "$OUT/stress.json" > "$OUT/stress.log" 2>&1
  note "run --cases stress exit $?: $(tail -1 "$OUT/stress.log")"
fi

bench() {  # $1: tree, $2: report folder
  (cd "$1" && timeout -s TERM 420 python3 -m harness bench --op binary_backward --backend torch_ext \
     --backend cupy@opt --cases perf --mode hot --budget 0.3 --warmup-budget 0.2 --time-limit 150 \
     --report "$2" > "$2.log" 2>&1)
}
if want bench; then
  bench "$PWD" "$OUT/bench-new"
  note "bench (this tree) exit $?: $(tail -1 "$OUT/bench-new.log")"
  if [[ -n "$BASE" && -d "$BASE" ]]; then
    bench "$BASE" "$OUT/bench-base"
    note "bench ($BASE) exit $?: $(tail -1 "$OUT/bench-base.log")"
    python3 -m harness compare "$OUT/bench-base/results.json" "$OUT/bench-new/results.json" --all \
      > "$OUT/compare.txt" 2>&1
    note "compare base -> new: $(grep -E '^summary:' "$OUT/compare.txt") (compare.txt)"
  fi
fi
note "done"
