"""Tuning data for the cupy norm kernels (backends/cupy/_norm_plan.py), on a CUDA machine.

For each shape, times `cupy@best` of layernorm_backward / rmsnorm_backward under a few planner
settings (elements per thread, forced column chunks), the main kernel alone and the whole call,
next to a device-to-device copy of the same bytes (read + write = the op's byte model), all with
the L2 flushed before each sample (cold, as `harness bench --mode cold`).  Each setting's outputs
are compared with the default setting's (same inputs): a setting that disagrees is marked BAD.

    python scripts/gpu/cuda_norms_sweep.py [--json out.json] [--samples 30]

Prints one table; the harness's own figures come from `harness bench` (scripts/gpu/cuda_norms.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# This sweep tunes nb_rows (the first best kernel); nb_rows3's is scripts/gpu/cuda_norms_tune.py.
os.environ["GRADORACLE_CUPY_NORMS"] = "kernel=rows,launch=cupy"

import numpy as np  # noqa: E402

from backends.cupy import _norm_plan as plan  # noqa: E402

SHAPES = [  # (op, dtype, shape, affine/bias)
    (plan.LN, "f32", (1024, 2048), True),   # the seed's 16x64x2048
    (plan.LN, "f32", (2048, 4096), True),
    (plan.LN, "bf16", (2048, 4096), True),
    (plan.LN, "bf16", (8192, 8192), True),
    (plan.LN, "bf16", (2048, 1024), True),
    (plan.RMS, "bf16", (4096, 4096), True),
    (plan.RMS, "bf16", (2048, 8192), True),
]
SETTINGS = {  # name -> planner overrides
    "default": {},
    "E8": {"ROWS_ELEMS": {"vec": {2: 8, 4: 8, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}},
    "E16": {"ROWS_ELEMS": {"vec": {2: 16, 4: 16, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}},
    "E32": {"ROWS_ELEMS": {"vec": {2: 32, 4: 16, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}},
    "chunked": {"ROWS_ELEMS": {"vec": {2: 0, 4: 0, 8: 0}, "scalar": {2: 0, 4: 0, 8: 0}}},
}


def _arrays(cp, op, dt, shape, rng):
    """Inputs as the harness makes them (bfloat16 through ml_dtypes) and empty outputs."""
    from harness import dtypes

    npdt = dtypes.numpy_dtype(dt)
    n = shape[-1]
    x64 = rng.standard_normal(shape) + rng.uniform(-1, 1, shape[:-1] + (1,))
    x = x64.astype(npdt)
    xr = x.astype(np.float64)
    mean = xr.mean(axis=-1)
    rstd = 1 / np.sqrt(((xr - mean[..., None]) ** 2).mean(axis=-1) + 1e-5) if op == plan.LN else \
        1 / np.sqrt((xr ** 2).mean(axis=-1) + 1e-5)
    stat = np.float64 if dt == "f64" else np.float32
    arrays = {"x": cp.asarray(x), "dy": cp.asarray(rng.standard_normal(shape).astype(npdt)),
              "weight": cp.asarray(rng.uniform(0.5, 1.5, n).astype(npdt)),
              "mean": cp.asarray(mean.astype(stat)) if op == plan.LN else None, "rstd": cp.asarray(rstd.astype(stat))}
    arrays.update(dx=cp.empty(shape, dtype=npdt), dweight=cp.empty(n, dtype=npdt),
                  dbias=cp.empty(n, dtype=npdt) if op == plan.LN else None)
    return arrays


def _time(cp, fn, flush, samples):
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    fn()
    for _ in range(samples):
        flush.fill(1)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--samples", type=int, default=30)
    args = ap.parse_args()
    import cupy as cp

    from backends.cupy.common import num_sms

    dev = plan.CupyDevice()
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    flush = cp.empty(2 * l2 // 4, dtype=cp.float32)
    rng = np.random.default_rng(0)
    defaults = {k: getattr(plan, k) for k in ("ROWS_ELEMS",)}
    rows = []
    print(f"{'op':18} {'dtype':5} {'shape':12} {'setting':8} {'kernel':50} {'main_us':>8} {'call_us':>8} "
          f"{'GB/s':>7} {'copy_us':>8} {'copyGB/s':>8} check")
    for op, dt, shape, _ in SHAPES:
        arrays = _arrays(cp, op, dt, shape, rng)
        item = plan.ITEMSIZE[dt]
        m, n = shape
        nbytes = item * (3 * m * n + (3 if op == plan.LN else 2) * n) + 4 * m * (2 if op == plan.LN else 1)
        src = cp.empty(nbytes // 2, dtype=cp.uint8)
        dst = cp.empty_like(src)
        copy_ms = _time(cp, lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3,
                                                                 cp.cuda.get_current_stream().ptr), flush, args.samples)
        ref = None
        for name, over in SETTINGS.items():
            for k, v in defaults.items():
                setattr(plan, k, v)
            for k, v in over.items():
                setattr(plan, k, v)
            try:
                entry = plan.build_entry(op, "best", dt, arrays, True, num_sms(),
                                         occupancy=lambda e, b, sm=0: dev.occupancy(plan.SOURCES[op], e, b, sm))
                arrs = tuple(arrays[k] for k in plan.NAMES)
                call_ms = _time(cp, lambda: plan.run(dev, entry, arrs), flush, args.samples)
                la = entry.launch
                ptr_args = tuple(plan._NULL if a is None else a for a in arrs)
                main_args = (entry.params, *ptr_args[:6], dev.workspace(entry, entry.ws_size, entry.acc)
                             if entry.ws_size else plan._NULL)
                if la.kind == "rows":
                    main_args += ptr_args[6:]
                main_ms = _time(cp, lambda: dev.launch(plan.SOURCES[op], la.expr, la.grid, la.block, main_args),
                                flush, args.samples)
                plan.run(dev, entry, arrs)
                cp.cuda.get_current_stream().synchronize()
                outs = [arrays[k].get().astype(np.float32) for k in ("dx", "dweight", "dbias") if arrays[k] is not None]
                if ref is None:
                    ref, check = outs, "ref"
                else:
                    ok = all(np.allclose(o, r, rtol=2e-2, atol=2e-2 * float(np.abs(r).max())) for o, r in zip(outs, ref))
                    check = "ok" if ok else "BAD"
                row = dict(op=op, dtype=dt, shape=list(shape), setting=name, kernel=la.expr, kind=la.kind,
                           nparts=la.nparts, gw=la.gw, vpt=la.vpt, main_us=main_ms * 1e3, call_us=call_ms * 1e3,
                           gbs=nbytes / call_ms / 1e6, copy_us=copy_ms * 1e3, copy_gbs=nbytes / copy_ms / 1e6,
                           check=check)
            except Exception as exc:  # noqa: BLE001 - one bad setting must not end the sweep
                row = dict(op=op, dtype=dt, shape=list(shape), setting=name, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            if "error" in row:
                print(f"{op:18} {dt:5} {str(shape):12} {name:8} ERROR {row['error'][:150]}")
            else:
                print(f"{op:18} {dt:5} {'x'.join(map(str, shape)):12} {name:8} {row['kernel']:50} "
                      f"{row['main_us']:8.2f} {row['call_us']:8.2f} {row['gbs']:7.0f} {row['copy_us']:8.2f} "
                      f"{row['copy_gbs']:8.0f} {check}")
        for k, v in defaults.items():
            setattr(plan, k, v)
    if args.json:
        Path(args.json).write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
