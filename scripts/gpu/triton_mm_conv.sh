#!/usr/bin/env bash
# Triton matmul_backward / conv_backward_data / conv_backward_weight on a CUDA machine (issue 14).
# Run from the repo root with $OUT a folder:   OUT=/some/dir scripts/gpu/triton_mm_conv.sh
# 1. probe: every perf case once through triton (checked call = autotune, then 5 timed unchecked calls):
#    ms, TFLOP/s, the tile chosen, registers/spills of the launches  -> probe.txt (PROBE_LIMIT s);
# 2. every `full` case of each op through triton (correctness, repeats, guards), JSON + log per op,
#    each run cut (SIGINT: partial JSON kept) after FULL_MM / FULL_CONV s;
# 3. `harness bench --cases perf` per op: triton beside torch (cuDNN/cuBLAS) and torch_compile
#    (cold, interleaved, BENCH_LIMIT s per op), report per op.
# Everything goes to $OUT/triton_mm_conv.tgz; $OUT/summary.txt is this script's output.
# About 8.5 minutes on an H100 (each step is cut at its limit; a bench finishes its current pair after it).
# Knobs: PROBE_LIMIT=45 FULL_MM=60 FULL_CONV=110 BENCH_LIMIT=35 DEVICE=cuda.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
PROBE_LIMIT=${PROBE_LIMIT:-45} FULL_MM=${FULL_MM:-60} FULL_CONV=${FULL_CONV:-110} BENCH_LIMIT=${BENCH_LIMIT:-35}
DEVICE=${DEVICE:-cuda}
W="$OUT/triton_mm_conv"
mkdir -p "$W"
exec > >(tee "$OUT/summary.txt") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2
stamp "== device"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$W/env.txt"

stamp "== probe: perf cases once through triton"
timeout -s INT "$PROBE_LIMIT" python3 - <<'EOF' 2>&1 | tee "$W/probe.txt"
import os
import time
import numpy as np
import torch
from cases import select
from harness import dtypes
from harness.registry import find_impl, get_op
from backends.triton import matmul_backward as mm, conv_backward_data as cd, conv_backward_weight as cw

DEV = os.environ.get("DEVICE", "cuda")

def tensor(h):
    """A HostTensor as a torch tensor on DEV with the same strides (bfloat16 through its bits)."""
    base = h.base
    if base.dtype == dtypes.numpy_dtype("bf16"):
        flat = torch.from_numpy(base.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        flat = torch.from_numpy(base.copy())
    return flat.to(DEV).as_strided(h.shape, h.strides, h.offset)

def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()

mods = {"matmul_backward": mm, "conv_backward_data": cd, "conv_backward_weight": cw}


def launches(plan):
    """The _launch.Launch objects of a cached plan of any of the three ops."""
    if hasattr(plan, "products"):
        return [p.launch for p in plan.products]
    if hasattr(plan, "main"):
        return [plan.main] + ([plan.finish] if plan.finish is not None else [])
    return [plan.launch]


def resources(mod):
    """kernel grid warps tile regs/spills/shared of the newest cached plan's launches."""
    entry = list(mod._PLANS.values())[-1]
    plan = entry[-1][1] if isinstance(entry, list) else entry
    out = []
    for L in launches(plan) if plan is not None else []:
        k = L.compiled
        names = L.kernel.arg_names[L.n_tensors:]
        tile = {n: v for n, v in zip(names, L.tail) if n in ("BM", "BN", "BK", "EW")}
        regs = getattr(k, "n_regs", None)
        out.append(f"{L.kernel.__name__} grid={L.grid[:2]} w{L.num_warps} {tile} regs={regs} "
                   f"spills={getattr(k, 'n_spills', None)} smem={getattr(getattr(k, 'metadata', None), 'shared', None)}")
    return "; ".join(out)
for op, mod in mods.items():
    impl = find_impl(op, "triton")
    spec = get_op(op)
    t_op = time.time()
    for case in select(os.environ.get("PROBE_CASES", "perf"), op=op):
        if time.time() - t_op > float(os.environ.get("PROBE_OP_S", "14")):  # every op gets its share
            print(f"{op}: probe time share spent, later cases left out", flush=True)
            break
        try:
            host = spec.generate(case, np.random.default_rng(0))
            inputs = {k: tensor(v) for k, v in host.items()}
            shapes = spec.shapes(case)
            dt = getattr(torch, {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}[case.dtype])
            outs = {k: torch.empty(shapes[k], dtype=dt, device=DEV) for k in spec.outputs}
            t = time.time()
            impl.fn(inputs, outs, case.params)
            sync()
            first = time.time() - t
            un = impl.fn.unchecked
            un(inputs, outs, case.params)
            sync()
            h = time.perf_counter()
            for _ in range(5):
                un(inputs, outs, case.params)
            host_us = (time.perf_counter() - h) / 5 * 1e6  # the launches are asynchronous: host time
            sync()
            ms = (time.perf_counter() - h) / 5 * 1e3  # device-bound loop: about the device time
            tf = spec.cost(case).flops / ms / 1e9
            print(f"{case.id:90s} {ms:8.3f} ms {tf:7.1f} TFLOP/s host {host_us:6.1f} us first {first:5.1f}s", flush=True)
            print("    " + resources(mod), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{case.id:90s} ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    for k, v in mod.TUNER.log.items():
        print("  tune", op, k[1], v)
EOF

run_full() {  # op, limit
  stamp "== full cases through triton: $1"
  timeout -s INT "$2" python3 -m harness run --op "$1" --backend triton --cases full --device "$DEVICE" \
    --json "$W/full-$1.json" > "$W/full-$1.log" 2>&1
  echo "exit $?"
  grep -E "^(FAIL|ERROR)" "$W/full-$1.log" | cut -c1-250 | head -30
  tail -2 "$W/full-$1.log"
}
run_full matmul_backward "$FULL_MM"
run_full conv_backward_data "$FULL_CONV"
run_full conv_backward_weight "$FULL_CONV"

for op in matmul_backward conv_backward_data conv_backward_weight; do
  stamp "== bench perf: $op (torch, torch_compile, triton)"
  python3 -m harness bench --op "$op" --backend torch --backend torch_compile --backend triton \
    --device "$DEVICE" --cases perf --mode cold --budget 0.2 --warmup-budget 0.2 --min-samples 10 \
    --max-samples 300 --interleave --time-limit "$BENCH_LIMIT" --report "$W/bench-$op" --no-plots -q \
    > "$W/bench-$op.log" 2> "$W/bench-$op.err"
  echo "exit $?"
  grep -E "^bench:" "$W/bench-$op.err" | tail -3
  grep -E "^(FAIL|ERROR)" "$W/bench-$op.log" | cut -c1-220 | head -10
  grep -A80 "^## $op" "$W/bench-$op/report.md" 2>/dev/null | grep -E "^\|" | head -60
done

stamp "done"
tar -C "$OUT" -czf "$OUT/triton_mm_conv.tgz" triton_mm_conv && rm -rf "$W"
ls -la "$OUT"
