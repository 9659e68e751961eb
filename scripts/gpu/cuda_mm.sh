#!/usr/bin/env bash
# matmul_backward CUDA ladder (issue 16 part 2: cupy@naive, @regtile, @smem, @best = mma.sync, and
# torch_ext): the GPU batch.  Run from the repo root on a CUDA machine with $OUT a folder:
#   OUT=/some/dir scripts/gpu/cuda_mm.sh
# 0. installs the checkout (editable, no deps); starts the torch_ext build (nvcc, sm_90) in the
#    background; writes the plan of each perf case (kernel, grid, smem, folds) and compiles its
#    kernels with NVRTC: registers, local memory, static smem (plans.txt);
# 1. every cupy rung on the smoke set (smoke.json / smoke.log);
# 2. the full set, 3 shards side by side through scripts/gpu_parallel_run.sh: (a) cupy@best
#    (scripts/jobs/cuda-mm-full.txt) while torch_ext builds, (b) torch_ext after the build
#    (scripts/jobs/cuda-mm-full-ext.txt): full-cupy/, full-ext/ (summary.txt, runs.tar.gz);
# 3. `harness bench` (cold) on the perf cases: torch, triton, cupy@best, torch_ext
#    (bench/report.md: TFLOP/s and % of the matmul ceiling);
# 4. the ladder: every cupy rung, torch and torch_compile on the seed's 1024^3 (f32, bf16) and a
#    4096^3 bf16 with b transposed (scripts/gpu/cases/matmul_ladder.json): ladder/report.md.
# PROFILE=1 adds `harness profile` (ncu) of cupy@best and torch on the 4096 x 4096 x 14336 bf16 case.
# Everything lands in $OUT/cuda_mm.tgz, with $OUT/summary.txt beside it (2 files).
# Whole script: about 7 minutes on an H100 (build 2.5 min in the background of the smoke set and
# cupy's full set; torch_ext's full set ~1.5, benches ~3.5); every step has a timeout, logs are kept
# whatever happens, and the tarball is written on exit.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
BUDGET=${BUDGET:-0.3} PY=${PY:-python3}
W="$OUT/cuda_mm"
mkdir -p "$W"
S="$OUT/summary.txt"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }
pack() { tar -czf "$OUT/cuda_mm.tgz" -C "$OUT" cuda_mm 2>/dev/null; }
trap pack EXIT

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, torch, cupy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)"
  nvcc --version | tail -2
} > "$W/env.txt" 2>&1
cat "$W/env.txt" >> "$S"

stamp "== 0. install; torch_ext build in the background; cupy compile + plans"
$PY -m pip install -q -e . --no-deps --no-build-isolation > "$W/pip.log" 2>&1; echo "pip exit $?" | tee -a "$S"
( timeout 480 $PY -c "from backends import torch_ext; print('torch_ext cuda:', torch_ext._check('cuda') or 'available')" \
    > "$W/build.log" 2>&1; echo "build exit $?" >> "$W/build.log" ) &
BUILD=$!
timeout 240 $PY - > "$W/plans.txt" 2>&1 <<'PYEOF'
import time
from backends._plans import matmul_backward_cuda as mmplan
from backends.cupy import matmul_backward as mm
from backends.cupy.common import function
from cases import select
from harness.registry import get_op

used = set()
for case in select("perf", op=mm.OP):
    s = get_op(mm.OP).shapes(case)
    lay = {n: case.params.get(f"{n}_layout", "contig") for n in ("a", "b", "dy")}
    def strides(shape, layout):  # element strides of harness/tensors.py's contig / transposed layouts
        dims = list(shape[:-2]) + [shape[-1], shape[-2]] if layout == "transposed" else list(shape)
        out, acc = [], 1
        for n in reversed(dims):
            out.append(acc)
            acc *= max(n, 1)
        out = out[::-1]
        return tuple(out[:-2] + [out[-1], out[-2]] if layout == "transposed" else out)
    gemms = mmplan.plan_call(s["a"], strides(s["a"], lay["a"]), s["b"], strides(s["b"], lay["b"]),
                             s["dy"], strides(s["dy"], lay["dy"]))
    for g in gemms:
        vec = mmplan.vec_ok(g, 0, 0)
        la = mmplan.choose(g, "best", case.dtype, vec)
        print(f"{case.id:70s} {g.out}: {la.expr:45s} grid {la.grid} smem {la.smem} P={g.P} F={g.F}")
        used.add(la.expr)
print()
t = time.perf_counter()
for expr in sorted(used):  # each kernel is its own NVRTC module (cupy caches it on disk for the later steps)
    fn = function(mm.SOURCE, expr)
    print(f"{expr:50s} regs {fn.num_regs:3d} local {fn.local_size_bytes:4d} B static smem {fn.shared_size_bytes:5d} B")
print(f"compiled {len(used)} kernels in {time.perf_counter() - t:.1f} s")
PYEOF
echo "plans exit $?" | tee -a "$S"; grep -E "mm_mma|==" "$W/plans.txt" | head -12 >> "$S"; tail -20 "$W/plans.txt" >> "$S"

stamp "== 1. every cupy rung on the smoke set"
timeout 300 $PY -m harness run --op matmul_backward --backend cupy --cases smoke --json "$W/smoke.json" \
  > "$W/smoke.log" 2>&1
echo "exit $?" | tee -a "$S"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$W/smoke.log" | head -40 >> "$S"; tail -3 "$W/smoke.log" >> "$S"

stamp "== 2a. cupy@best on the full set (3 shards, while torch_ext builds)"
OUT="$W/full-cupy" timeout 200 bash scripts/gpu_parallel_run.sh scripts/jobs/cuda-mm-full.txt 170 > "$W/full-cupy.log" 2>&1
echo "exit $?" | tee -a "$S"; cat "$W/full-cupy/summary.txt" >> "$S" 2>/dev/null

stamp "== 2b. torch_ext on the full set (3 shards, after the build)"
wait "$BUILD"; tail -3 "$W/build.log" | tee -a "$S"
OUT="$W/full-ext" timeout 200 bash scripts/gpu_parallel_run.sh scripts/jobs/cuda-mm-full-ext.txt 170 > "$W/full-ext.log" 2>&1
echo "exit $?" | tee -a "$S"; cat "$W/full-ext/summary.txt" >> "$S" 2>/dev/null

stamp "== 3. bench (cold): torch, triton, cupy@best, torch_ext on the perf cases"
timeout 180 $PY -m harness bench --op matmul_backward --backend torch --backend triton --backend cupy@best \
  --backend torch_ext --cases perf --budget "$BUDGET" --warmup-budget 0.1 --time-limit 110 --case-timeout 40 \
  --report "$W/bench" -q > "$W/bench.log" 2>&1
echo "exit $?" | tee -a "$S"; tail -5 "$W/bench.log" >> "$S"
[ -f "$W/bench/report.md" ] && sed -n '1,80p' "$W/bench/report.md" >> "$S"

stamp "== 4. the ladder: every cupy rung, torch and torch_compile on matmul_ladder.json"
timeout 130 $PY -m harness bench --op matmul_backward --backend torch --backend torch_compile --backend cupy \
  --cases scripts/gpu/cases/matmul_ladder.json --budget 0.2 --warmup-budget 0.1 --time-limit 70 --case-timeout 40 \
  --report "$W/ladder" -q > "$W/ladder.log" 2>&1
echo "exit $?" | tee -a "$S"; tail -5 "$W/ladder.log" >> "$S"
[ -f "$W/ladder/report.md" ] && sed -n '1,60p' "$W/ladder/report.md" >> "$S"

if [ "${PROFILE:-0}" = 1 ]; then
  CASE='{"op": "matmul_backward", "dtype": "bf16", "params": {"a": [4096, 4096], "b": [4096, 14336]}}'
  for be in cupy@best torch; do
    stamp "== profile $be"
    timeout 240 $PY -m harness profile --op matmul_backward --backend "$be" --case "$CASE" \
      --json "$W/profile-${be//@/-}.json" > "$W/profile-${be//@/-}.log" 2>&1
    echo "exit $?" | tee -a "$S"; tail -25 "$W/profile-${be//@/-}.log" >> "$S"
  done
fi
rm -rf "$W/bench/plots" "$W/ladder/plots" 2>/dev/null  # keep the tarball small; report.md and results.json stay
stamp "done"
