#!/usr/bin/env bash
# torch_ext custom ops reduce_sum, layernorm_backward, rmsnorm_backward (issue 15): the GPU batch.
# Run from the repo root on a CUDA machine with $OUT a folder for the results:
#   OUT=/some/dir scripts/gpu/torch_ext_ops.sh
# 0. installs the checkout (editable, no deps) and builds the extension with its CUDA sources for
#    sm_90 (`harness list` triggers the build; build.log);
# 1. torch_ext on the full set of the three ops (full.json / full.log);
# 2. `harness bench` of torch, torch_ext, cupy@best and triton on the three ops' perf cases, side by
#    side (bench/results.json, bench/report.md; BUDGET s of sampling per pair, PER_OP cases of each
#    op (default 10: 30 cases x 4 backends), no pair started after TIME_LIMIT s);
# 3. per perf case: host time per call of torch_ext's unchecked path (what the harness times) against
#    its device time (GPU kept busy while the host queues), and the plan's header (host.txt).
# Everything ends up in $OUT/torch_ext_ops.tgz (plus summary.txt beside it).
# Whole script: about 7 minutes on an H100 (nvcc build 2-3 minutes, full set under 2, bench 2.5).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-16}
BUDGET=${BUDGET:-0.2} TIME_LIMIT=${TIME_LIMIT:-150} PER_OP=${PER_OP:-10} PY=${PY:-python3}
W="$OUT/work"
mkdir -p "$W"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
OPS=(--op reduce_sum --op layernorm_backward --op rmsnorm_backward)

stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -2
} > "$W/env.txt" 2>&1
cat "$W/env.txt" >> "$OUT/summary.txt"

stamp "== 0. install, build (harness list)"
$PY -m pip install -q -e . --no-deps --no-build-isolation > "$W/pip.log" 2>&1; echo "pip exit $?" | tee -a "$OUT/summary.txt"
timeout 420 $PY -m harness list > "$W/build.log" 2>&1; echo "list exit $?" | tee -a "$OUT/summary.txt"
$PY -c "from backends import torch_ext; print('torch_ext cuda:', torch_ext._check('cuda') or 'available')" 2>&1 \
  | tee -a "$OUT/summary.txt"

stamp "== 1. torch_ext on the full set"
timeout 240 $PY -m harness run "${OPS[@]}" --backend torch_ext --cases full --json "$W/full.json" > "$W/full.log" 2>&1
echo "exit $?" | tee -a "$OUT/summary.txt"
grep -E "^(FAIL|ERROR|CRASH)" -A3 "$W/full.log" | head -60 >> "$OUT/summary.txt"; tail -3 "$W/full.log" >> "$OUT/summary.txt"

stamp "== 2. bench: torch, torch_ext, cupy@best, triton on the perf cases"
$PY -m harness bench "${OPS[@]}" --backend torch --backend torch_ext --backend cupy@best --backend triton \
  --cases perf --budget "$BUDGET" --warmup-budget 0.1 --per-op "$PER_OP" --time-limit "$TIME_LIMIT" --report "$W/bench" -q > "$W/bench.log" 2>&1
echo "exit $?" | tee -a "$OUT/summary.txt"; tail -5 "$W/bench.log" >> "$OUT/summary.txt"

stamp "== 3. plans, host time per call (unchecked path) and device time, per perf case"
$PY - > "$W/host.txt" 2>&1 <<'PYEOF'
import time
import torch
from backends.torch_ext import _norm, layernorm_backward as tln, reduce_sum as trs, rmsnorm_backward as trms, require
from cases import select
from harness.registry import get_op

require()
DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
IMPL = {"reduce_sum": trs._reduce_sum_impl.unchecked, "layernorm_backward": tln._layernorm_backward_impl.unchecked,
        "rmsnorm_backward": trms._rmsnorm_backward_impl.unchecked}


def tensor(shape, dtype, layout):
    if layout == "transposed" and len(shape) >= 2:
        return torch.rand(*shape[:-2], shape[-1], shape[-2], device="cuda", dtype=dtype).transpose(-1, -2) + 0.5
    if layout == "sliced" and len(shape) >= 1:
        return torch.rand(*shape[:-1], 2 * shape[-1] + 1, device="cuda", dtype=dtype)[..., :2 * shape[-1]:2] + 0.5
    return torch.rand(tuple(shape), device="cuda", dtype=dtype) + 0.5


def make(case):
    spec = get_op(case.op)
    shapes, (ins, outs) = spec.shapes(case), spec.names(case.params)
    acc = torch.float64 if case.dtype == "f64" else torch.float32
    i = {n: tensor(shapes[n], acc if n in ("mean", "rstd") else DT[case.dtype], case.params.get(f"{n}_layout", "contig"))
         for n in ins}
    return i, {n: torch.empty(shapes[n], device="cuda", dtype=DT[case.dtype]) for n in outs}


def record(case, i, o):
    if case.op == "reduce_sum":
        return trs.plan_for(i["x"], o["y"], case.params)[: trs.HEADER].tolist()
    args = [(i.get(k) if k in ("dy", "x", "weight", "mean", "rstd") else o.get(k))
            for k in ("dy", "x", "weight", "mean", "rstd", "dx", "dweight", "dbias")]
    return _norm.plan_for(case.op, *args)[: _norm.HEADER].tolist()


N = 50
print(f"{'case':72s} {'host_us':>8s} {'dev_us':>8s}  record header")
for case in select("perf"):
    if case.op not in IMPL:
        continue
    i, o = make(case)
    fn = IMPL[case.op]
    for _ in range(3):
        fn(i, o, case.params)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(40_000_000)  # the GPU busy while the host queues: the events then time the kernels alone
    e0.record()
    t = time.perf_counter()
    for _ in range(N):
        fn(i, o, case.params)
    host = (time.perf_counter() - t) / N * 1e6
    e1.record()
    e1.synchronize()
    dev = e0.elapsed_time(e1) / N * 1e3
    print(f"{case.id:72s} {host:8.1f} {dev:8.1f}  {'OK ' if host < dev else 'SLOW'} {record(case, i, o)}")
    del i, o
PYEOF
echo "exit $?" | tee -a "$OUT/summary.txt"; cat "$W/host.txt" >> "$OUT/summary.txt"

stamp "done"
tar -C "$W" -czf "$OUT/torch_ext_ops.tgz" . && rm -rf "$W"
