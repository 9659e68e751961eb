#!/usr/bin/env bash
# Issue 14, second matmul/conv round on a CUDA machine: the pipelined Triton GEMMs (16-byte
# alignment facts proven by the plans: matmul XC/YC, dgrad WVEC; matmul da + db in one launch;
# dgrad taps computed, not loaded; channels-first convs staged to channels last).
# Run from the repo root with $OUT a folder:   OUT=/some/dir scripts/gpu/triton_mm2.sh
# 1. every `full` case of matmul_backward, conv_backward_data and conv_backward_weight through
#    triton, in 7 parallel shards (the numpy oracle and the compiles are CPU-bound), each
#    cut (SIGINT: partial JSON kept) after FULL_LIMIT s;
# 2. probe: each perf case once through triton (checked call: autotunes) and 5 unchecked calls:
#    ms, TFLOP/s, host us per call, the tile chosen and each launch's registers, spills and shared
#    memory (shared >= 2 tiles: the pipeline is there on the device too)  -> probe.txt;
# 3. `harness bench --cases perf` per op, triton beside torch (cuBLAS / cuDNN), cold, interleaved,
#    cut after BENCH_MM / BENCH_CONV s (a bench finishes its current pair after that).
# Everything goes to $OUT/triton_mm2.tgz; $OUT/summary.txt is this script's output.
# About 7 minutes on an H100.  Knobs: FULL_LIMIT=110 PROBE_LIMIT=45 BENCH_MM=90 BENCH_CONV=70.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to a folder for the results}"
FULL_LIMIT=${FULL_LIMIT:-110} PROBE_LIMIT=${PROBE_LIMIT:-45} BENCH_MM=${BENCH_MM:-90} BENCH_CONV=${BENCH_CONV:-70}
W="$OUT/triton_mm2"
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

stamp "== full cases through triton (parallel shards, ${FULL_LIMIT}s)"
pids=()
full() {  # name, op, shard
  timeout -k 15 -s INT "$FULL_LIMIT" python3 -m harness run --op "$2" --backend triton --cases full --device cuda \
    --shard "$3" --json "$W/full-$1.json" > "$W/full-$1.log" 2>&1 &
  pids+=($!)
}
full mm matmul_backward 0/1
for k in 0 1 2; do
  full dgrad$k conv_backward_data $k/3
  full wgrad$k conv_backward_weight $k/3
done
for p in "${pids[@]}"; do wait "$p"; done
for log in "$W"/full-*.log; do
  echo "-- $(basename "$log" .log): $(tail -1 "$log" | cut -c1-200)"
  grep -E "^(FAIL|ERROR)" "$log" | cut -c1-250 | head -15
done

stamp "== probe: perf cases once through triton (${PROBE_LIMIT}s)"
timeout -k 15 -s INT "$PROBE_LIMIT" python3 - <<'EOF' 2>&1 | tee "$W/probe.txt"
import time

import numpy as np
import torch

from backends.triton import conv_backward_data as cd, conv_backward_weight as cw, matmul_backward as mm
from cases import select
from harness import dtypes
from harness.registry import find_impl, get_op


def tensor(h):
    """A HostTensor as a CUDA torch tensor with the same strides (bfloat16 through its bits)."""
    base = h.base
    if base.dtype == dtypes.numpy_dtype("bf16"):
        flat = torch.from_numpy(base.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        flat = torch.from_numpy(base.copy())
    return flat.to("cuda").as_strided(h.shape, h.strides, h.offset)


def launches(plan):
    """The Steps of a cached plan: matmul's one or two, wgrad's main and finish, dgrad's main;
    and the staging copies (channels first) of the conv plans."""
    if hasattr(plan, "products"):
        return [p.launch for p in plan.products]
    staged = [r.step for r in getattr(plan, "stage", None) or ()]
    if hasattr(plan, "main"):
        return [plan.main] + ([plan.finish] if plan.finish is not None else []) + staged
    return [plan.launch] + staged


def resources(mod):
    """Each launch of the newest cached plan: tile, alignment codes, regs/spills/shared, stages."""
    entry = list(mod._PLANS.values())[-1]
    plan = entry[-1][1] if isinstance(entry, list) else entry
    out = []
    for L in launches(plan) if plan is not None else []:
        L = L if hasattr(L, "kernel") else L.launch  # dgrad's _Launch holds its Step
        k = L.compiled
        names = L.kernel.arg_names[L.n_tensors:]
        facts = {n: v for n, v in zip(names, L.tail)
                 if n.rstrip("01") in ("BM", "BN", "BK", "EW", "XC", "YC", "WVEC", "BS", "BC", "TMA")}
        out.append(f"{L.kernel.__name__} w{L.num_warps} s{L.options.get('num_stages')} {facts} "
                   f"regs={getattr(k, 'n_regs', None)} spills={getattr(k, 'n_spills', None)} "
                   f"smem={getattr(getattr(k, 'metadata', None), 'shared', None)}")
    return "; ".join(out)


for op, mod, share in (("matmul_backward", mm, 18), ("conv_backward_data", cd, 12), ("conv_backward_weight", cw, 12)):
    impl, spec, t_op = find_impl(op, "triton"), get_op(op), time.time()
    for case in select("perf", op=op):
        if case.dtype != "bf16" and op != "matmul_backward":
            continue
        if time.time() - t_op > share:
            print(f"{op}: probe share spent, later cases left out", flush=True)
            break
        try:
            host = spec.generate(case, np.random.default_rng(0))
            inputs = {k: tensor(v) for k, v in host.items()}
            shapes = spec.shapes(case)
            dt = getattr(torch, {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}[case.dtype])
            outs = {k: torch.empty(shapes[k], dtype=dt, device="cuda") for k in spec.outputs}
            impl.fn(inputs, outs, case.params)
            un = impl.fn.unchecked
            un(inputs, outs, case.params)
            torch.cuda.synchronize()
            h = time.perf_counter()
            for _ in range(5):
                un(inputs, outs, case.params)
            host_us = (time.perf_counter() - h) / 5 * 1e6
            torch.cuda.synchronize()
            ms = (time.perf_counter() - h) / 5 * 1e3
            print(f"{case.id:90s} {ms:8.3f} ms {spec.cost(case).flops / ms / 1e9:7.1f} TFLOP/s host {host_us:6.1f} us",
                  flush=True)
            print("    " + resources(mod), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{case.id:90s} ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        torch.cuda.empty_cache()
    for k, v in mod.TUNER.log.items():
        print("  tune", op, k[1], v)
EOF

bench() {  # op, limit
  stamp "== bench perf: $1 (torch, triton; ${2}s)"
  python3 -m harness bench --op "$1" --backend torch --backend triton --device cuda --cases perf --mode cold \
    --budget 0.2 --warmup-budget 0.2 --min-samples 10 --max-samples 300 --interleave --time-limit "$2" \
    --report "$W/bench-$1" --no-plots -q > "$W/bench-$1.log" 2> "$W/bench-$1.err"
  echo "exit $?"
  grep -E "^bench:" "$W/bench-$1.err" | tail -3
  grep -E "^(FAIL|ERROR)" "$W/bench-$1.log" | cut -c1-220 | head -10
  grep -A80 "^## $1" "$W/bench-$1/report.md" 2>/dev/null | grep -E "^\|" | head -60
}
bench matmul_backward "$BENCH_MM"
bench conv_backward_data "$BENCH_CONV"
bench conv_backward_weight "$BENCH_CONV"

stamp "done"
tar -C "$OUT" -czf "$OUT/triton_mm2.tgz" triton_mm2 && rm -rf "$W"
ls -la "$OUT"
