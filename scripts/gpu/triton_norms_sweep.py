"""Launch-sizing sweep of the Triton norm kernels on a GPU (backends/triton/_norm.py Config).

For a few perf shapes, times the default sizing and one-knob variations of it (pipelining
depth, programs per SM, rows per program, elements per thread, rows per tile, PDL), cold
(L2 flushed by a read before each call), median of CUDA-event samples; the bytes are the
op's cost model, so GB/s and % of the copy ceiling compare with the bench.  Each variant's
outputs are compared with the default's (relative max difference: sums in another order
differ by rounding only).  Also: torch eager's fused backward on the same inputs, and the
host time of one unchecked call (Python + launches) of the default sizing.

    python scripts/gpu/triton_norms_sweep.py --out DIR [--time-limit 45] [--copy-gbs 3022]
    TRITON_INTERPRET=1 python scripts/gpu/triton_norms_sweep.py --device cpu   # dry run, tiny shapes

Writes DIR/sweep.json and prints a table (DIR/sweep.txt).  Stops starting new shapes after
--time-limit seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from backends.triton import _norm  # noqa: E402
from cases.registry import Case  # noqa: E402
from harness.registry import get_op  # noqa: E402

LN, RMS = _norm.LAYERNORM, _norm.RMSNORM
# (op, dtype, shape, params): the most telling perf shapes first
SHAPES = [
    (LN, "f32", (1024, 2048), {}),
    (LN, "bf16", (2048, 4096), {}),
    (RMS, "bf16", (2048, 8192), {"eps": 1e-5}),
    (LN, "bf16", (8192, 8192), {}),
    (RMS, "f32", (2048, 4096), {}),
    (LN, "bf16", (8192, 4096), {"affine": False, "bias": False}),
]
BASE = _norm.GPU_CONFIG
VARIANTS = {
    "default": BASE,
    "stages=1": replace(BASE, stages=1),
    "stages=2": replace(BASE, stages=2),
    "stages=4": replace(BASE, stages=4),
    "ws_ratio=6": replace(BASE, ws_ratio=6),
    "ws_ratio=24": replace(BASE, ws_ratio=24),
    "warps_per_sm=32": replace(BASE, warps_per_sm=32),
    "thread_elems=8": replace(BASE, thread_elems=8),
    "tile_elems=8192": replace(BASE, tile_elems=8192),
    "pdl=off": replace(BASE, pdl=False),
}
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def make(op, dtype, shape, params, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    dt = DT[dtype]
    n = shape[-1]
    x = (torch.randn(shape, device=dev, generator=g) * 2 + 0.5).to(dt)
    dy = torch.randn(shape, device=dev, generator=g).to(dt)
    xf = x.float()
    affine = params.get("affine", True)
    bias = params.get("bias", True) and op == LN
    ins = {"dy": dy, "x": x}
    if op == LN:
        eps = params.get("eps", 1e-5)
        mean = xf.mean(-1)
        ins["mean"] = mean
        ins["rstd"] = torch.rsqrt(((xf - mean[..., None]) ** 2).mean(-1) + eps)
    else:
        ins["rstd"] = torch.rsqrt((xf * xf).mean(-1) + params.get("eps", 1e-6))
    if affine:
        ins["weight"] = torch.randn(n, device=dev, generator=g).to(dt)
    outs = {"dx": torch.empty_like(x)}
    if affine:
        outs["dweight"] = torch.empty(n, device=dev, dtype=dt)
    if bias:
        outs["dbias"] = torch.empty(n, device=dev, dtype=dt)
    return ins, outs


def cold_median(fn, flush, reps=20):
    if flush is None:  # CPU dry run: wall time
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    times = []
    for _ in range(reps + 2):
        flush.sum()  # a read: the call finds none of its data in L2
        torch.cuda._sleep(100_000)  # ~50 us: the GPU stays busy while the host queues the call
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times[2:])


def torch_eager(op, ins, outs, params):
    """torch's fused CUDA backward on the same inputs (the bench's baseline runs autograd)."""
    x, dy = ins["x"], ins["dy"]
    n = x.shape[-1]
    if op == LN:
        w = ins.get("weight")
        bias = torch.empty(n, dtype=x.dtype, device=x.device) if "dbias" in outs else None  # only says "want dbias"
        mask = [True, w is not None, bias is not None]
        return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [n], ins["mean"][..., None],
                                                                 ins["rstd"][..., None], w, bias, mask)
    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    if fused is None:
        return None
    return lambda: fused(dy, x, [n], ins["rstd"][..., None], ins["weight"], [True, True])


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--time-limit", type=float, default=45.0)
    ap.add_argument("--copy-gbs", type=float, default=3022.0, help="copy ceiling for the %% column")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script on tiny shapes "
                                                      "(TRITON_INTERPRET=1)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    flush = torch.empty(2 * 64 * 2**20, dtype=torch.uint8, device=dev) if cuda else None
    started = time.time()
    name = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    rows, lines = [], [f"{name}  PDL supported: {_norm.PDL_SUPPORTED}"]
    for op, dtype, shape, params in SHAPES:
        if not cuda:
            shape = (min(shape[0], 8), min(shape[1], 64))
        if time.time() - started > args.time_limit:
            lines.append(f"time limit: stopped before {op} {dtype} {shape}")
            break
        case = Case(op, dtype, {"shape": list(shape), **params})
        nbytes = get_op(op).cost(case).bytes
        ins, outs = make(op, dtype, shape, params, dev)
        lines.append(f"\n{op} {dtype} {'x'.join(map(str, shape))} {params or ''}  ({nbytes / 2**20:.1f} MiB)")
        eager = torch_eager(op, ins, outs, params) if cuda else None
        if eager is not None:
            eager()
            us = cold_median(eager, flush)
            lines.append(f"  {'torch eager (fused aten)':28s} {us:9.2f} us  {nbytes / us / 1e3:7.0f} GB/s "
                         f"{100 * nbytes / us / 1e3 / args.copy_gbs:5.1f}%")
            rows.append(dict(op=op, dtype=dtype, shape=shape, params=params, variant="torch_eager", us=us))
        ref = None
        for name, cfg in VARIANTS.items():
            o = {k: torch.full_like(v, float("nan")) for k, v in outs.items()}
            try:
                _norm.run(op, ins, o, params, cfg)  # compiles, checks the layout
                sync()
                us = cold_median(lambda: _norm.run(op, ins, o, params, cfg, check=False), flush)
            except Exception as exc:  # noqa: BLE001 - one variant failing must not end the sweep
                lines.append(f"  {name:28s} ERROR {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if ref is None:
                ref = {k: v.double() for k, v in o.items()}
            diff = max(float(((o[k].double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
                       for k, r in ref.items())
            nan = any(bool(torch.isnan(v).any()) for v in o.values())
            plan = next(p for key, p in _norm._PLANS.items() if key[0] == op and key[1] == ins["x"].shape
                        and key[-1] is cfg)
            desc = (f"grid={plan.grid} warps={plan.num_warps} BM={plan.constexprs['BM']} "
                    f"rows/prog={plan.ints['rows_per']} pdl={plan.constexprs['PDL']}")
            lines.append(f"  {name:28s} {us:9.2f} us  {nbytes / us / 1e3:7.0f} GB/s "
                         f"{100 * nbytes / us / 1e3 / args.copy_gbs:5.1f}%  maxreldiff={diff:.1e}"
                         f"{'  NaN!' if nan else ''}  {desc}")
            rows.append(dict(op=op, dtype=dtype, shape=shape, params=params, variant=name, us=us, reldiff=diff,
                             nan=nan, grid=plan.grid, warps=plan.num_warps, config=asdict(cfg)))
        # host time of one unchecked call with the default sizing (launch-bound loop, synced at the end)
        o = {k: torch.empty_like(v) for k, v in outs.items()}
        _norm.run(op, ins, o, params)
        sync()
        calls = 200 if cuda else 2
        t = time.perf_counter()
        for _ in range(calls):
            _norm.run(op, ins, o, params, check=False)
        host = (time.perf_counter() - t) / calls * 1e6
        sync()
        lines.append(f"  host time per unchecked call (default sizing, back to back): {host:.1f} us")
        rows.append(dict(op=op, dtype=dtype, shape=shape, params=params, variant="host_us", us=host))
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.txt").write_text(text + "\n")
    (out / "sweep.json").write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
