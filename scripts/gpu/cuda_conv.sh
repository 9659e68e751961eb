#!/usr/bin/env bash
# conv dgrad / wgrad CUDA kernels (cupy@div, @fastdiv_load, @fastdiv, @best; wgrad @best): the GPU batch.
# Run from the repo root on a CUDA machine:   OUT=/some/dir scripts/gpu/cuda_conv.sh
# 0. every instantiation compiled (NVRTC), its registers / local memory / shared memory, and the
#    perf cases' plans (grid, phases, splits): plans.txt;
# 1. every cupy variant of both ops on the smoke set: smoke.json / smoke.log;
# (the torch_ext build runs in the background meanwhile: torch_ext_build.log)
# 2. cupy@best and torch_ext on the full sets, 8 shards side by side (scripts/jobs/cuda-conv-full.txt through
#    scripts/gpu_parallel_run.sh): full/summary.txt, full/runs.tar.gz;
# 3. bench (cold) of the bf16 perf cases (BENCH_DTYPE): torch (cuDNN), triton, cupy@best, torch_ext,
#    both ops in turn: bench/;
# 4. the fast-divmod A/B: cupy@div, @fastdiv_load, @fastdiv on the strided dgrad perf cases
#    (ab/), then `harness compare` div -> fastdiv_load and div -> fastdiv: ab/compare-*.txt.
# 5. (PROFILE=1, the default) harness profile of up to three bf16 layers while the clock is under
#    PROFILE_BEFORE (400) / PROFILE_UNTIL (450) s: profile/.  PROFILE_BEFORE=9999 forces them.
# $OUT gets two files: cuda_conv.tgz (everything above) and summary.txt (this script's log).
# About 7-8 minutes on an H100; every step has its own time limit.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # one torch_ext build digest for every process
: "${OUT:?set OUT to a folder for the results}"
PY=${PY:-python3}
W="$(mktemp -d)/cuda_conv"  # the work folder: packed into $OUT/cuda_conv.tgz at the end (few files come back)
mkdir -p "$W" "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
# Pack whatever exists however the script ends (a step's time limit, or the caller's).
trap 'tar -czf "$OUT/cuda_conv.tgz" -C "$(dirname "$W")" cuda_conv 2>/dev/null' EXIT
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, torch, cupy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cupy', cupy.__version__)"
} 2>&1 | tee "$W/env.txt"

stamp "== torch_ext build (background; about 2.5 min)"
( export MAX_JOBS=16 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0
  timeout 400 $PY -c "from backends import torch_ext; print('torch_ext cuda check:', torch_ext._check('cuda'))" \
    > "$W/torch_ext_build.log" 2>&1 ) &
BUILD_PID=$!

stamp "== 0. compile, registers, plans"
cat > "$W/compile_report.py" <<'PYEOF'
# Every instantiation compiled once, 8 processes side by side (cupy's disk cache then serves the
# later steps' processes), with its registers, local memory and static shared memory.
import time
from concurrent.futures import ProcessPoolExecutor

from backends._plans import conv_cuda as plan
from backends.cupy import _conv
from backends.cupy.common import function, num_sms
from cases import select


def compile_one(job):
    op, expr = job
    t = time.perf_counter()
    try:
        fn = function(_conv.SOURCES[op], expr)
    except Exception as exc:  # noqa: BLE001 - reported, the others still compile
        return f"{expr:36s} FAILED: {type(exc).__name__}: {str(exc)[:2000]}"
    return (f"{expr:36s} regs {fn.num_regs:3d} local {fn.local_size_bytes:4d} B smem {fn.shared_size_bytes:5d} B "
            f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    jobs = [(op, e) for op in _conv.SOURCES for dt in _conv.DTYPES for e in plan.all_exprs(op, dt)]
    t = time.perf_counter()
    with ProcessPoolExecutor(8) as pool:
        for line in pool.map(compile_one, jobs):
            print(line, flush=True)
    print(f"{len(jobs)} instantiations in {time.perf_counter() - t:.1f} s; SMs {num_sms()}")
    print()
    for op in _conv.SOURCES:
        for case in select("perf", op=op):
            g = plan.geo3(case.params, op)
            cl = g.channels_last
            def strides(shape):
                out, s = [], 1
                for n in reversed(shape):
                    out.append(s)
                    s *= n
                return tuple(reversed(out))
            from oracle import conv_common as cc
            geo = cc.geometry(case.params, op)
            if op == "conv_backward_data":
                la = plan.dgrad_plan(case.params, case.dtype, strides(geo.y_shape), strides(geo.w_shape),
                                     strides(geo.x_shape), "fastdiv", True)
                extra = f"phases {la.words[45]} trow {la.words[46]}"
            else:
                la = plan.wgrad_plan(case.params, case.dtype, strides(geo.y_shape), strides(geo.x_shape),
                                     strides(geo.w_shape), num_sms(), True)
                extra = f"splits {la.words[42]} chunk {la.words[43]}"
            print(f"{case.id:80s} {la.expr:30s} grid {la.grid} {extra}")
PYEOF
PYTHONPATH=$PWD timeout -k 15 -s INT 100 $PY "$W/compile_report.py" > "$W/plans.txt" 2>&1
echo "exit $?"; grep -E "regs" "$W/plans.txt" | head -24

stamp "== 1. every cupy variant on the smoke sets"
timeout -k 15 -s TERM 110 $PY -m harness run --op conv_backward_data --op conv_backward_weight --backend cupy --cases smoke \
  --seed 2 --json "$W/smoke.json" > "$W/smoke.log" 2>&1
echo "exit $?"; grep -E "^(FAIL|ERROR|CRASH)" -A3 "$W/smoke.log" | head -30; tail -3 "$W/smoke.log"

stamp "== waiting for the torch_ext build"
wait $BUILD_PID; cat "$W/torch_ext_build.log" | tail -3

stamp "== 2. cupy@best and torch_ext on the full sets (8 shards)"
OUT="$W/full" bash scripts/gpu_parallel_run.sh scripts/jobs/cuda-conv-full.txt 120 2>&1 | tail -40

stamp "== 3. bench: torch (cuDNN), triton, cupy@best, torch_ext on the perf cases"
timeout -k 15 -s INT 140 $PY -m harness bench --op conv_backward_data --op conv_backward_weight --backend torch \
  --backend triton --backend cupy@best --backend torch_ext --cases perf --dtype "${BENCH_DTYPE:-bf16}" --interleave \
  --budget 0.2 --warmup-budget 0.2 --time-limit 110 --report "$W/bench" -q \
  > "$W/bench.log" 2>&1
echo "exit $?"; tail -5 "$W/bench.log"
[ -f "$W/bench/report.md" ] && head -80 "$W/bench/report.md"

stamp "== 4. fast-divmod A/B on the strided dgrad perf cases"
timeout -k 15 -s INT 20 $PY - "$W/strided.json" <<'PYEOF'
import json, sys
from cases import select
cases = [{"op": c.op, "dtype": c.dtype, "params": c.params} for c in select("perf", op="conv_backward_data")
         if max(c.params.get("stride", [1])) > 1]
json.dump(cases, open(sys.argv[1], "w"))
print(len(cases), "strided dgrad perf cases")
PYEOF
timeout -k 15 -s INT 110 $PY -m harness bench --op conv_backward_data --backend cupy@div --backend cupy@fastdiv_load \
  --backend cupy@fastdiv --cases "$W/strided.json" --budget 0.3 --interleave --time-limit 85 --report "$W/ab" -q \
  > "$W/ab.log" 2>&1
echo "exit $?"; tail -3 "$W/ab.log"
timeout -k 15 -s INT 30 $PY - "$W/ab" <<'PYEOF'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
doc = json.loads((d / "results.json").read_text())
for v in ("div", "fastdiv_load", "fastdiv"):
    one = dict(doc, rows=[dict(r, impl="cupy@mapping") for r in doc.get("rows", []) if r.get("impl") == f"cupy@{v}"])
    (d / f"{v}.json").write_text(json.dumps(one))
    print(v, len(one["rows"]), "rows")
PYEOF
for b in fastdiv_load fastdiv; do
  timeout 30 $PY -m harness compare "$W/ab/div.json" "$W/ab/$b.json" --all --json "$W/ab/compare-$b.json" \
    > "$W/ab/compare-$b.txt" 2>&1
  echo "== div -> $b"; cat "$W/ab/compare-$b.txt" | head -30
done

# 5. harness profile (Nsight Compute) of three bf16 channels-last layers, while the batch's time allows:
#    tensor-pipe use, occupancy, bank conflicts, stalls for the report's explanations of any misses.
if [ "${PROFILE:-1}" = 1 ] && [ $(( $(date +%s) - t0 )) -lt "${PROFILE_BEFORE:-400}" ]; then
  stamp "== 5. harness profile"
  mkdir -p "$W/profile"
  G3S1='"n": 32, "cin": 64, "cout": 64, "spatial": [56, 56], "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "layout": "channels_last"'
  G3S2='"n": 32, "cin": 128, "cout": 128, "spatial": [56, 56], "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "layout": "channels_last"'
  for job in "dgrad-s2:conv_backward_data:$G3S2" "wgrad-s1:conv_backward_weight:$G3S1" "dgrad-s1:conv_backward_data:$G3S1"; do
    [ $(( $(date +%s) - t0 )) -lt "${PROFILE_UNTIL:-450}" ] || break
    name=${job%%:*}; rest=${job#*:}; op=${rest%%:*}; geo=${rest#*:}
    timeout 60 $PY -m harness profile --op "$op" --backend cupy@best --case "{\"op\": \"$op\", \"dtype\": \"bf16\", \"params\": {$geo}}" \
      --json "$W/profile/$name.json" > "$W/profile/$name.txt" 2>&1
    echo "$name exit $?"; head -40 "$W/profile/$name.txt"
  done
fi

stamp "== pack"
tar -czf "$OUT/cuda_conv.tgz" -C "$(dirname "$W")" cuda_conv
ls -la "$OUT"
stamp "done"
