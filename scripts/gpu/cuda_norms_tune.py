"""The cupy norm backwards' `best` variant under each planner setting, side by side, on a CUDA machine.

Settings are GRADORACLE_CUPY_NORMS strings (backends/cupy/_norm_plan.py `settings`): the first
best kernel as it shipped (nb_rows + nb_colsum through cupy.RawKernel), the same through
cuLaunchKernel, and nb_rows3 (kernel=rows3) with its copy stages, elements per thread, finish
and launch path varied.  Per (shape, setting), with the L2 flushed by a read of 2 x L2 before each sample (as
`harness bench --mode cold`) and the GPU held busy by a spin while the host queues the sample:

  main_us   the first kernel alone (nb_rows3 / nb_rows; with nb_rows3's fused finish the whole call)
  call_us   one call as the backend makes it (plan.call: key, overlap check, launches)
  GB/s      the op's byte model (oracle cost: dy, x, dx, weight, dweight, dbias, mean, rstd) / call_us
  %copy     a device-to-device copy of the same bytes (read + write) as a share of call_us
  %roof     GB/s as a share of the harness's copy ceiling (its cached figure; else the first
            shape's copy GB/s here)
  xtorch    torch eager's device time (the harness's torch backward) / call_us
  host_us   wall time of plan.call while the GPU is busy (what the host takes to queue one call)
  err       max |out - float64 reference| / max |reference|, worst output, the reference computed
            on the GPU in float64 from the same (rounded) inputs; `ok` within 3 units of the
            output dtype's rounding (plus float32 summation slack) and within 2x of the first
            setting's error.  `=` marks outputs bitwise equal to the first setting's.

Then a ranking: per setting the geometric mean over shapes of call_us relative to the default
setting, and the fastest setting per shape.  First, each kernel's resources as the driver reports
them (registers, local memory = spills, static shared memory, resident blocks per SM).

    python scripts/gpu/cuda_norms_tune.py [--json out.json] [--samples 25] [--time-limit 110]
    python scripts/gpu/cuda_norms_tune.py --warm [--jobs 16]   # compile every kernel it needs
    python scripts/gpu/cuda_norms_tune.py --best-from out.json # the fastest nb_rows3 setting's knobs
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from backends.cupy import _norm_plan as plan  # noqa: E402

LN, RMS = plan.LN, plan.RMS
SHAPES = [  # (op, dtype, shape, bias): the issue's examples first
    (LN, "bf16", (2048, 4096), True),
    (LN, "bf16", (8192, 8192), True),
    (LN, "f32", (1024, 2048), True),    # the seed's 16x64x2048
    (RMS, "bf16", (2048, 4096), False),
    (RMS, "bf16", (4096, 8192), False),
    (LN, "bf16", (2048, 8192), False),
    (LN, "bf16", (8192, 4096), True),
    (RMS, "f32", (2048, 4096), False),
    (LN, "f16", (2048, 4096), True),
]
SETTINGS = {  # name -> GRADORACLE_CUPY_NORMS; the first is the reference for `err` and bitwise equality
    "rows-cupy": "kernel=rows,launch=cupy",   # the first best variant as it shipped
    "rows": "kernel=rows",                    # the same kernels, cuLaunchKernel path (the default kernel)
    "rows3": "kernel=rows3",                  # nb_rows3: its defaults (fused cooperative finish)
    "rows3-s2": "kernel=rows3,stages=2",
    "rows3-s3": "kernel=rows3,stages=3",
    "rows3-s6": "kernel=rows3,stages=6",
    "rows3-e4": "kernel=rows3,elems=4",       # float: one vector a thread (default two), twice the threads a row
    "colsum": "kernel=rows3,finish=colsum",   # the column sums in a second kernel (nb_colsum)
    "colsum-s3": "kernel=rows3,finish=colsum,stages=3",
    "colsum-cupy": "kernel=rows3,finish=colsum,launch=cupy",  # host time of cupy.RawKernel calls
}
DEFAULT = "rows"


def _fake(shape, dt):
    """An object with what build_entry reads of an array (no device needed)."""
    from harness import dtypes

    d = np.dtype(dtypes.numpy_dtype(dt))
    strides, acc = [], d.itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return SimpleNamespace(shape=tuple(shape), strides=tuple(reversed(strides)), dtype=d)


def _fake_arrays(op, dt, shape, bias):
    n, lead = shape[-1], shape[:-1]
    stat = "f64" if dt == "f64" else "f32"
    return {"x": _fake(shape, dt), "dy": _fake(shape, dt), "weight": _fake((n,), dt),
            "mean": _fake(lead, stat) if op == LN else None, "rstd": _fake(lead, stat), "dx": _fake(shape, dt),
            "dweight": _fake((n,), dt), "dbias": _fake((n,), dt) if bias else None}


def needed_exprs(num_sms: int = 132) -> list[tuple[str, str]]:
    """(source, name expression) of every kernel the sweep can launch."""
    out = set()
    for op, dt, shape, bias in SHAPES:
        for knobs in SETTINGS.values():
            entry = plan.build_entry(op, "best", dt, _fake_arrays(op, dt, shape, bias), True, num_sms,
                                     knobs=plan.settings(knobs))
            out |= {(entry.source, k.expr) for k in entry.kernels}
    return sorted(out)


def _compile(job):
    source, expr = job
    t0 = time.perf_counter()
    try:
        from backends.cupy.common import function

        function(source, expr, plan.compile_options())
        return expr, time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - report every failure
        return expr, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def warm(jobs: int) -> int:
    from concurrent.futures import ProcessPoolExecutor

    todo = needed_exprs()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_compile, todo))
    bad = [(e, err) for e, _, err in results if err]
    print(f"compiled {len(todo) - len(bad)}/{len(todo)} kernels in {time.perf_counter() - t0:.1f} s ({jobs} workers)")
    for e, err in bad:
        print(f"FAILED {e}: {err[:3000]}")
    return 1 if bad else 0


def resources(dev) -> None:
    """Registers, local memory (spills), shared memory and occupancy of every kernel the sweep uses."""
    print(f"{'kernel':48} {'regs':>4} {'local_B':>7} {'static_smem':>11} {'dyn_smem':>8} {'blocks/SM':>9}")
    smem = {}
    for op, dt, shape, bias in SHAPES:
        for knobs in SETTINGS.values():
            entry = plan.build_entry(op, "best", dt, _fake_arrays(op, dt, shape, bias), True, 132,
                                     knobs=plan.settings(knobs))
            for k in entry.kernels:
                smem[(entry.source, k.expr, k.block)] = k.smem
    for (source, expr, block), dyn in sorted(smem.items(), key=lambda kv: kv[0][1]):
        try:
            fn = dev.function(source, expr)
            occ = dev.occupancy(source, expr, block, dyn)
            print(f"{expr[:48]:48} {fn.num_regs:4d} {fn.local_size_bytes:7d} {fn.shared_size_bytes:11d} {dyn:8d} "
                  f"{occ:9d}")
        except Exception as exc:  # noqa: BLE001
            print(f"{expr[:48]:48} ERROR {type(exc).__name__}: {str(exc)[:200]}")


def best_from(path: str) -> str:
    """The knobs of the nb_rows3 setting (driver launch) with the lowest geometric-mean call time
    among those that checked ok on every shape they ran."""
    rows = json.loads(Path(path).read_text())["rows"]
    score = {}
    for name, knobs in SETTINGS.items():
        if "kernel=rows3" not in knobs or "launch=cupy" in knobs:
            continue
        mine = [r for r in rows if r["setting"] == name]
        if not mine or any("error" in r or not r.get("ok") for r in mine):
            continue
        score[name] = sum(math.log(r["call_us"]) for r in mine) / len(mine)
    if not score:
        return SETTINGS["rows3"]
    return SETTINGS[min(score, key=score.get)]


# ============================================================================= timing

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""


class Timer:
    """Cold device time of a callable (CUDA events on the current stream) and its host time."""

    def __init__(self, cp, samples: int):
        self.cp, self.samples = cp, samples
        l2 = cp.cuda.Device().attributes["L2CacheSize"]
        self.flush_buf = cp.ones(2 * l2 // 4, dtype=cp.float32)
        self.sink = cp.empty((), dtype=cp.float32)
        self.spin = cp.RawKernel(SPIN, "spin")
        clock_khz = cp.cuda.Device().attributes["ClockRate"]
        self.cycles = np.int64(clock_khz * 0.3)  # 300 us at the rated clock: the host queues the sample meanwhile

    def __call__(self, fn) -> tuple[float, float]:
        """(median device us, median host us) over `samples` cold calls."""
        cp = self.cp
        fn()
        pairs, host = [], []
        for _ in range(self.samples):
            self.spin((1,), (1,), (self.cycles,))
            cp.sum(self.flush_buf, out=self.sink)  # reads 2 x L2: the call finds none of its data there
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            b.record()
            pairs.append((a, b))
        pairs[-1][1].synchronize()
        dev = [cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in pairs]
        return float(np.median(dev)), float(np.median(host))


# ============================================================================= data and references


def to_f64(cp, a):
    """A float64 copy of a cupy array (bfloat16 through its bits: cupy does no bfloat16 arithmetic)."""
    if a.dtype.itemsize == 2 and a.dtype != np.float16:
        return (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
    return a.astype(cp.float64)


def make_case(cp, op, dt, shape, bias, rng):
    """Inputs as the harness makes them (rounded to dt; mean / rstd of the rounded x), empty outputs,
    the float64 reference outputs (computed on the GPU), and the inputs' values on the host."""
    from harness import dtypes

    npdt = dtypes.numpy_dtype(dt)
    n = shape[-1]
    wide = np.float64 if dt == "f64" else np.float32  # holds every value of dt exactly
    hx = (rng.standard_normal(shape, dtype=np.float32) + rng.uniform(-1, 1, shape[:-1] + (1,)).astype(np.float32))
    hx = hx.astype(npdt).astype(wide)
    hdy = rng.standard_normal(shape, dtype=np.float32).astype(npdt).astype(wide)
    hw = rng.uniform(0.5, 1.5, n).astype(npdt).astype(wide)
    x, dy, w = (cp.asarray(a.astype(npdt)) for a in (hx, hdy, hw))
    x64, dy64, w64 = (cp.asarray(a).astype(cp.float64) for a in (hx, hdy, hw))
    eps = 1e-5
    if op == LN:
        mean64 = x64.mean(axis=-1, keepdims=True)
        xc = x64 - mean64
    else:
        mean64, xc = None, x64
    rstd64 = 1.0 / cp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    stat = cp.float64 if dt == "f64" else cp.float32
    mean = mean64[..., 0].astype(stat) if op == LN else None
    rstd = rstd64[..., 0].astype(stat)
    # The reference uses the statistics as passed (rounded to the stats dtype), as the kernels do.
    m = mean.astype(cp.float64)[..., None] if op == LN else 0.0
    r = rstd.astype(cp.float64)[..., None]
    xhat = (x64 - m) * r
    g = dy64 * w64
    a = g.mean(axis=-1, keepdims=True) if op == LN else 0.0
    b = (g * xhat).mean(axis=-1, keepdims=True)
    ref = {"dx": r * (g - a - xhat * b), "dweight": (dy64 * xhat).sum(axis=0)}
    if bias:
        ref["dbias"] = dy64.sum(axis=0)
    inputs = {"x": x, "dy": dy, "weight": w, "rstd": rstd}
    if op == LN:
        inputs["mean"] = mean
    outs = {"dx": cp.empty(shape, dtype=npdt), "dweight": cp.empty(n, dtype=npdt)}
    if bias:
        outs["dbias"] = cp.empty(n, dtype=npdt)
    host = {"x": hx, "dy": hdy, "weight": hw, "rstd": rstd.get()}
    if op == LN:
        host["mean"] = mean.get()
    del x64, dy64, xhat, g, xc
    return inputs, outs, ref, host


def nbytes(op, dt, shape, bias) -> int:
    """The harness's byte model (oracle `_cost`) for this case."""
    from cases.registry import Case
    from harness.registry import get_op

    params = {"shape": list(shape)}
    if op == LN and not bias:
        params["bias"] = False
    if op == RMS:
        params["eps"] = 1e-5
    spec = get_op(op)
    return spec.cost(Case(op, dt, params, frozenset(), "tune")).bytes


def errors(cp, outs, ref):
    """max |out - ref| / max |ref|, the worst over the outputs."""
    worst = 0.0
    for k, want in ref.items():
        got = to_f64(cp, outs[k])
        scale = float(cp.abs(want).max()) or 1.0
        worst = max(worst, float(cp.abs(got - want).max()) / scale)
    return worst


def tolerance(dt, shape) -> float:
    unit = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-24, "f64": 2.0**-53}[dt]
    return 3 * unit + 64 * 2.0**-24 * math.sqrt(shape[0])  # rounding of the outputs; float32 sums over rows


def torch_time(timer, op, dt, shape, bias, host):
    """torch eager's device time on the same values (the harness's torch backward), or None."""
    try:
        import torch
    except ImportError:
        return None
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}[dt]
    stat = torch.float64 if dt == "f64" else torch.float32
    t = {k: torch.from_numpy(a).to("cuda").to(stat if k in ("mean", "rstd") else tdt) for k, a in host.items()}
    back = importlib.import_module(f"backends._torch_autograd.{op}").backward
    params = {"shape": list(shape), "bias": bias, "eps": 1e-5}
    dev_us, _ = timer(lambda: back(t, params))
    return dev_us


# ============================================================================= the sweep


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--time-limit", type=float, default=110.0, help="no new shape after this many seconds")
    ap.add_argument("--warm", action="store_true", help="only compile every kernel the sweep needs")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--only", help="comma-separated setting names (default: all)")
    ap.add_argument("--best-from", help="print the fastest nb_rows3 setting's knobs in this sweep JSON")
    args = ap.parse_args()
    if args.warm:
        return warm(args.jobs)
    if args.best_from:
        print(best_from(args.best_from))
        return 0
    import cupy as cp

    t_start = time.perf_counter()
    names = args.only.split(",") if args.only else list(SETTINGS)
    timer = Timer(cp, args.samples)
    dev = plan._device()
    resources(dev)
    print()
    rng = np.random.default_rng(0)
    roof = None
    try:
        from harness import ceilings

        path = ceilings.cache_path("cuda", ceilings.device_info("cuda"))
        if path.exists():
            roof = json.loads(path.read_text()).get("copy", {}).get("gbs")
    except Exception:  # noqa: BLE001 - the ceiling is only a reference
        roof = None
    rows = []
    hdr = (f"{'case':30} {'setting':11} {'kernel':44} {'main_us':>8} {'call_us':>8} {'GB/s':>6} {'%copy':>6} "
           f"{'%roof':>6} {'xtorch':>6} {'host_us':>7}  err")
    print("roof:", f"harness copy ceiling {roof:.0f} GB/s" if roof else "first shape's copy GB/s (no ceiling cached)")
    print(hdr)
    for op, dt, shape, bias in SHAPES:
        if time.perf_counter() - t_start > args.time_limit:
            print(f"(time limit {args.time_limit:.0f} s: no further shapes)")
            break
        label = f"{'ln' if op == LN else 'rms'} {dt} {'x'.join(map(str, shape))}"
        label += "" if bias or op == RMS else " nobias"
        inputs, outs, ref, host = make_case(cp, op, dt, shape, bias, rng)
        nb = nbytes(op, dt, shape, bias)
        src, dst = cp.empty(nb // 2, dtype=cp.uint8), cp.empty(nb // 2, dtype=cp.uint8)
        copy_us, _ = timer(lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3,
                                                                cp.cuda.get_current_stream().ptr))
        del src, dst
        if roof is None:
            roof = nb / copy_us / 1e3
        try:
            torch_us = torch_time(timer, op, dt, shape, bias, host)
        except Exception as exc:  # noqa: BLE001 - the baseline is only a reference
            print(f"torch eager: {type(exc).__name__}: {str(exc)[:200]}")
            torch_us = None
        first_bits, first_err = None, None
        for name in names:
            row = dict(op=op, dtype=dt, shape=list(shape), bias=bias, setting=name, knobs=SETTINGS[name],
                       bytes=nb, copy_us=copy_us, torch_us=torch_us)
            try:
                os.environ[plan.ENV] = SETTINGS[name]
                plan._ENTRIES.clear()  # planned again under this setting

                def call():
                    plan.call(op, "best", inputs, outs)

                call()
                cp.cuda.get_current_stream().synchronize()
                entry = next(iter(plan._ENTRIES.values()))
                err = errors(cp, outs, ref)
                bits = [outs[k].view(cp.uint8).copy() for k in sorted(outs)]
                same = first_bits is not None and all(bool((a == b).all()) for a, b in zip(bits, first_bits))
                if first_bits is None:
                    first_bits, first_err = bits, err
                ok = err <= tolerance(dt, shape) and err <= 2 * first_err + 1e-12
                call_us, host_us = timer(call)
                k0 = entry.kernels[0]
                part = bar = plan._NULL
                if entry.ws_size:
                    part = dev.workspace(entry, entry.ws_size, entry.acc)
                if entry.launch.coop:
                    bar = dev.barrier(entry)
                arrs = tuple(inputs.get(k, outs.get(k)) for k in plan.NAMES)
                kargs = plan.kernel_args(k0, arrs, part, bar)
                main_us, _ = timer(lambda: dev.launch(entry.source, k0.expr, k0.grid, k0.block, kargs, smem=k0.smem,
                                                      coop=k0.coop))
                la = entry.launch
                row.update(kernel=la.expr, kind=la.kind, vpt=la.vpt, gw=la.gw, stages=la.stages, nparts=la.nparts,
                           rows_per_block=la.rows_per_block, smem=la.smem, launches=len(entry.kernels),
                           main_us=main_us, call_us=call_us, host_us=host_us, gbs=nb / call_us / 1e3,
                           pct_copy=100 * copy_us / call_us, pct_roof=100 * nb / call_us / 1e3 / roof,
                           x_torch=(torch_us / call_us) if torch_us else None, err=err, ok=ok, bitwise_first=same)
                print(f"{label:30} {name:11} {la.expr[:44]:44} {main_us:8.2f} {call_us:8.2f} {row['gbs']:6.0f} "
                      f"{row['pct_copy']:5.1f}% {row['pct_roof']:5.1f}% "
                      f"{(torch_us / call_us) if torch_us else float('nan'):6.2f} {host_us:7.1f}  "
                      f"{err:.1e} {'ok' if ok else 'BAD'}{' =' if same else ''}", flush=True)
            except Exception as exc:  # noqa: BLE001 - one bad setting must not end the sweep
                row["error"] = f"{type(exc).__name__}: {exc}"
                print(f"{label:30} {name:11} ERROR {row['error'][:300]}", flush=True)
                cp.cuda.get_current_stream().synchronize()
            rows.append(row)
        print(f"{label:30} {'copy':11} {'(same bytes, d2d memcpy)':44} {copy_us:8.2f} {'':8} {nb / copy_us / 1e3:6.0f}"
              f"{'':15}{'torch eager %.2f us' % torch_us if torch_us else ''}", flush=True)
        del inputs, outs, ref, host
        plan._ENTRIES.clear()
        cp.get_default_memory_pool().free_all_blocks()
    os.environ.pop(plan.ENV, None)
    summary = ranking(rows)
    print(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "roof_gbs": roof,
                                               "settings": SETTINGS, "rows": rows}, indent=1))
    return 0


def ranking(rows) -> str:
    """Per setting: geometric mean of call_us / the default's over the shapes both ran, worst
    %copy, failures; per shape the fastest setting that checked ok."""
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r["op"], r["dtype"], tuple(r["shape"]), r["bias"]), {})[r["setting"]] = r
    out = ["", f"== ranking (call_us relative to '{DEFAULT}', geometric mean over shapes; lower is faster)"]
    for name in SETTINGS:
        ratios, bad, pct = [], 0, []
        for case in by_case.values():
            r, d = case.get(name), case.get(DEFAULT)
            if not r or "error" in r or not r.get("ok"):
                bad += 1 if r else 0
                continue
            pct.append(r["pct_copy"])
            if d and "error" not in d:
                ratios.append(r["call_us"] / d["call_us"])
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            out.append(f"   {name:11} x{gm:5.3f}  over {len(ratios)} shapes; %copy {min(pct):5.1f}..{max(pct):5.1f}"
                       f"{'; %d FAILED/ERROR' % bad if bad else ''}  ({SETTINGS[name] or 'defaults'})")
        else:
            out.append(f"   {name:11} no data{'; %d FAILED/ERROR' % bad if bad else ''}")
    out.append("== fastest setting per shape (checked ok)")
    for (op, dt, shape, bias), case in by_case.items():
        good = [r for r in case.values() if "error" not in r and r.get("ok")]
        if not good:
            continue
        best = min(good, key=lambda r: r["call_us"])
        d = case.get(DEFAULT, {})
        first = next(iter(case.values()))
        out.append(f"   {op[:3]} {dt:4} {'x'.join(map(str, shape)):11}{'' if bias or op == RMS else ' nobias':7} "
                   f"{best['setting']:11} {best['call_us']:8.2f} us  {best['pct_copy']:5.1f}% copy  "
                   f"x{best['x_torch'] or float('nan'):.2f} torch  host {best['host_us']:.1f} us   "
                   f"(default {d.get('call_us', float('nan')):.2f} us, {first['setting']} "
                   f"{first.get('call_us', float('nan')):.2f} us)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
