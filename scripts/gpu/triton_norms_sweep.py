"""Candidate sizings of the Triton norm backwards, side by side on every perf shape (GPU).

Every candidate is a Config text relative to the GPU default (backends/triton/_norm.py
Config, as $GRADORACLE_TRITON_NORM takes it: "finish=kernel,stages=4").  For each perf case
of layernorm_backward and rmsnorm_backward (smallest first) and each candidate:

* device time: cold (L2 flushed by a read before each call, the GPU held busy while the host
  queues the call), CUDA events, median of samples taken in interleaved rounds over the
  candidates, so drift hits all alike; GB/s and % of the copy ceiling from the op's cost model;
* correctness: outputs against a float64 reference computed on the GPU from the same inputs,
  as err/tol under the harness's tolerance model (harness/compare.py: < 1 passes), and the
  relative difference to the default's outputs;
* the main kernel's registers, spills and shared memory (from the compiled kernel), grid, warps;
* host time per call (median of single calls, the GPU kept busy so launches never wait):
  unchecked (what the harness times) per candidate, checked (argument checks too) for the
  default, and the default's kernels launched through the JIT (launch=jit) and with tensors
  (launch=tensors) instead of data pointers;
* torch eager's fused backward (aten) on the same inputs.

Every kernel of every candidate is compiled first, in parallel worker processes (triton's
disk cache then serves the timing process).  Prints a block per shape as it goes (and
appends it to DIR/sweep.txt), then the final tables: % of copy per shape and candidate with
the best marked, per candidate the shapes at >= 85%, mean and worst % of copy, wins, worst
err/tol and host time; and the default's host time against its device time.  DIR/sweep.json
holds every row.

    python scripts/gpu/triton_norms_sweep.py --out DIR [--time-limit 240] [--copy-gbs 3022]
        [--variant "stages=4,finish=kernel" ...] [--only-variants] [--shape 2048x4096 ...] [--jobs 12]
    TRITON_INTERPRET=1 python scripts/gpu/triton_norms_sweep.py --device cpu   # dry run, tiny shapes
    python scripts/gpu/triton_norms_sweep.py --regs [--variant ...] [--shape ...]  # no GPU: sm_90 registers
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from backends.triton import _norm  # noqa: E402
from cases import select  # noqa: E402
from harness import dtypes  # noqa: E402
from harness.registry import get_op  # noqa: E402

LN, RMS = _norm.LAYERNORM, _norm.RMSNORM
# Candidates: Config texts over the default ("" is the default).  Compared on device time.
# Left out after the first H100 sweep (results/h100/triton/norms-1): stages 1 and 2 (slower
# everywhere), ws_ratio=24 (slower on small shapes, equal on large), warps_per_sm=32 (two
# waves: the sm_90 compile's registers allow one program of 16 warps per SM; see --regs).
VARIANTS = [
    "",
    "finish=kernel",
    "finish=kernel,pdl=0",
    "finish=kernel,stage2_rows=128,stage2_cols=32",
    "finishers=16",
    "finishers=32",
    "stages=4",
    "stages=4,finish=kernel",
    "ws_ratio=6",
    "thread_elems=8",
    "tile_elems=4096",
    "tile_elems=8192",
    "stages=4,tile_elems=4096",
    "inflight=64",
    "inflight=96",
    "inflight=128",
    "inflight=96,finish=kernel",
    "stream=1",
]
# Host-only candidates: the same kernels, launched another way (device time unchanged).
HOST_VARIANTS = ["launch=jit", "launch=tensors"]
BAR = 85.0  # % of copy: the issue's bar for the norms
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def label(text: str) -> str:
    return text or "default"


def perf_shapes() -> list:
    """(op, dtype, shape, params, bytes) of every perf case of both ops, fewest bytes first."""
    out = []
    for c in select("perf"):
        if c.op in _norm.OPS:
            params = {k: v for k, v in c.params.items() if k != "shape"}
            out.append((c.op, c.dtype, tuple(c.params["shape"]), params, get_op(c.op).cost(c).bytes))
    return sorted(out, key=lambda s: (s[4], s[0], s[1]))


def shape_name(op, dtype, shape, params) -> str:
    flags = ",".join(f"{k}={v}" for k, v in params.items())
    return f"{'ln' if op == LN else 'rms'} {dtype} {'x'.join(map(str, shape))}{' ' + flags if flags else ''}"


# ----------------------------------------------------------------------------- tensors


def make(op, dtype, shape, params, dev, empty=False):
    """(inputs, outputs) of a case: random inputs with consistent saved statistics, NaN outputs."""
    dt = DT[dtype]
    st = torch.float64 if dtype == "f64" else torch.float32
    n = shape[-1]
    affine = params.get("affine", True)
    bias = params.get("bias", True) and op == LN
    if empty:  # planning and compiling only: no data
        ins = {"x": torch.empty(shape, dtype=dt, device=dev), "dy": torch.empty(shape, dtype=dt, device=dev),
               "rstd": torch.empty(shape[:-1], dtype=st, device=dev)}
        if op == LN:
            ins["mean"] = torch.empty(shape[:-1], dtype=st, device=dev)
    else:
        g = torch.Generator(device=dev).manual_seed(0)
        x = (torch.randn(shape, device=dev, generator=g) * 2 + 0.5).to(dt)
        ins = {"dy": torch.randn(shape, device=dev, generator=g).to(dt), "x": x}
        xf = x.to(st)
        if op == LN:
            mean = xf.mean(-1)
            ins["mean"] = mean
            ins["rstd"] = torch.rsqrt(((xf - mean[..., None]) ** 2).mean(-1) + params.get("eps", 1e-5))
        else:
            ins["rstd"] = torch.rsqrt((xf * xf).mean(-1) + params.get("eps", 1e-6))
    if affine:
        ins["weight"] = torch.randn(n, device=dev).to(dt) if not empty else torch.empty(n, dtype=dt, device=dev)
    outs = {"dx": torch.full(shape, float("nan"), dtype=dt, device=dev)}
    if affine:
        outs["dweight"] = torch.full((n,), float("nan"), dtype=dt, device=dev)
    if bias:
        outs["dbias"] = torch.full((n,), float("nan"), dtype=dt, device=dev)
    return ins, outs


def tensors_of(ins, outs) -> tuple:
    return (ins["x"], ins["dy"], ins.get("weight"), ins.get("mean"), ins["rstd"], outs["dx"], outs.get("dweight"),
            outs.get("dbias"))


def reference(op, dtype, ins, outs) -> dict:
    """float64 outputs from the same inputs and statistics, and each output's (scale, n) of the
    harness's error model (oracle/<op>.py error_scale)."""
    f = {k: v.double() for k, v in ins.items()}
    x, dy, rstd = f["x"], f["dy"], f["rstd"][..., None]
    n = x.shape[-1]
    mean = f["mean"][..., None] if op == LN else torch.zeros_like(rstd)
    xhat = (x - mean) * rstd
    g = dy * f["weight"] if "weight" in f else dy
    b = (g * xhat).mean(-1, keepdim=True)
    if op == LN:
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * b)
        xs2 = rstd ** 2 * (x * x + mean * mean)
        s_dx = rstd * torch.sqrt(g * g + (g * g).sum(-1, keepdim=True) / n ** 2
                                 + xs2 * (g * g * xs2).sum(-1, keepdim=True) / n ** 2)
    else:
        dx = rstd * (g - xhat * b)
        xs2 = xhat * xhat
        s_dx = rstd * torch.sqrt(g * g + xs2 * (g * g * xs2).sum(-1, keepdim=True) / n ** 2)
    rows = tuple(range(x.dim() - 1))
    m = x.numel() // n
    ref = {"dx": (dx, s_dx, n)}
    if "dweight" in outs:
        ref["dweight"] = ((dy * xhat).sum(rows), torch.sqrt((dy * dy * xs2).sum(rows)), m)
    if "dbias" in outs:
        ref["dbias"] = (dy.sum(rows), torch.sqrt((dy * dy).sum(rows)), m)
    return ref


def err_over_tol(got: dict, ref: dict, dtype: str) -> float:
    """Worst err/tol over the outputs (harness.compare.tolerance, on the GPU); inf for NaN."""
    u, u_acc = dtypes.unit_roundoff(dtype), dtypes.unit_roundoff(dtypes.accumulate_dtype(dtype))
    worst = 0.0
    for name, (r, s, n) in ref.items():
        tol = u * r.abs() + 8.0 * (u + u_acc * math.sqrt(max(n, 1))) * s + dtypes.tiny(dtype)
        ratio = ((got[name].double() - r).abs() / tol).max()
        worst = max(worst, float("inf") if torch.isnan(ratio) else float(ratio))
    return worst


# ----------------------------------------------------------------------------- compiling


def _compile_jobs(shapes, texts, sms) -> list:
    return [(s[:4], t, sms) for s in shapes for t in texts]


def _compile_worker(jobs) -> list:
    """Compile every kernel of each (shape, candidate) into triton's disk cache; report errors."""
    torch.cuda.init()
    out = []
    for (op, dtype, shape, params), text, sms in jobs:
        try:
            cfg = replace(_norm.parse_config(text, _norm.GPU_CONFIG), sms=sms)  # sms: as the device plans
            meta = tensors_of(*make(op, dtype, shape, params, "meta", empty=True))  # the layout, no memory
            plan = _norm.make_plan(op, dict(zip(_norm.NAMES, meta)), cfg)
            call = _norm.Call(plan, torch.device("cuda", torch.cuda.current_device()), DT[dtype])
            # small tensors of the same dtypes: the kernels specialise on dtypes, alignment and the ints
            call.warmup(*tensors_of(*make(op, dtype, (16, shape[-1]), params, "cuda", empty=True)))
            out.append(None)
        except Exception as exc:  # noqa: BLE001 - reported; the timing pass shows the error too
            out.append(f"{shape_name(op, dtype, shape, params)} [{label(text)}]: {type(exc).__name__}: {exc}"[:400])
    return out


def precompile(shapes, texts, jobs: int, lines: list) -> None:
    """Fill triton's disk cache with every kernel the sweep launches, `jobs` processes at a time."""
    import multiprocessing as mp

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    todo = _compile_jobs(shapes, texts, sms)
    t0 = time.time()
    chunks = [todo[i::jobs] for i in range(jobs)]
    errors = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(_compile_worker, c) for c in chunks if c]):
            try:
                errors += [e for e in fut.result() if e]
            except Exception as exc:  # noqa: BLE001 - a worker that died: the timing pass compiles itself
                errors.append(f"compile worker: {type(exc).__name__}: {exc}"[:300])
    lines.append(f"precompiled {len(todo)} (shape, candidate) plans in {time.time() - t0:.0f} s with {jobs} "
                 f"processes; {len(errors)} errors")
    lines += [f"  compile error: {e}" for e in errors[:10]]


# ----------------------------------------------------------------------------- timing


class Clock:
    """Cold device time of a call and host time per call, on CUDA (wall time on the CPU)."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        if self.cuda:
            # a read of 2 x L2 before each sample (a read: no dirty lines for the call to write back)
            l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20)
            self.flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
            torch.cuda._sleep(1000)  # load the spin kernel, then calibrate its cycles per us
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(5_000_000)
            b.record()
            b.synchronize()
            self.cycles_per_us = 5_000_000 / max(a.elapsed_time(b) * 1e3, 1.0)

    def _spin(self, us: float) -> None:
        torch.cuda._sleep(int(us * self.cycles_per_us))

    def cold(self, fn, reps: int) -> list:
        """Device us of `reps` calls, each after a spin and an L2 flush."""
        if not self.cuda:
            out = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e6)
            return out
        pairs = []
        for _ in range(reps):
            self._spin(60)  # the host queues the flush and the call while the GPU spins
            self.flush.sum()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            pairs.append((a, b))
        pairs[-1][1].synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in pairs]

    def host(self, fn, calls: int = 100) -> float:
        """Median host us of one call, the GPU kept busy (launches never wait for a free slot)."""
        if self.cuda:
            torch.cuda.synchronize()
            self._spin(calls * 150)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        if self.cuda:
            torch.cuda.synchronize()
        return statistics.median(times) * 1e6


def torch_eager(op, ins, outs):
    """torch's fused CUDA backward on the same inputs (the bench's baseline runs autograd)."""
    x, dy = ins["x"], ins["dy"]
    n = x.shape[-1]
    if op == LN:
        w = ins.get("weight")
        bias = torch.empty(n, dtype=x.dtype, device=x.device) if "dbias" in outs else None  # says "want dbias"
        mask = [True, w is not None, bias is not None]
        return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [n], ins["mean"][..., None],
                                                                 ins["rstd"][..., None], w, bias, mask)
    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    if fused is None:
        return None
    return lambda: fused(dy, x, [n], ins["rstd"][..., None], ins["weight"], [True, True])


def kernel_info(call) -> str:
    """Grid, warps, tile and the main kernel's registers / spills / shared memory."""
    plan, c = call.plan, call.plan.constexprs
    k = call.main.compiled if call.main is not None else None
    regs = getattr(k, "n_regs", None)
    spills = getattr(k, "n_spills", None)
    shared = getattr(getattr(k, "metadata", None), "shared", None)
    fin = {0: "direct", 1: "kernel" + ("+pdl" if c["PDL"] else ""), 2: f"last x{plan.ints['finishers']}"}[c["FINISH"]]
    return (f"grid={plan.grid[0]} warps={plan.num_warps} BM={c['BM']} rows/prog={plan.ints['rows_per']} "
            f"stages={c['STAGES']} "
            f"finish={fin} regs={regs} spills={spills} smem={shared}")


# ----------------------------------------------------------------------------- one shape


def sweep_shape(spec, texts, clock, args, dev, emit) -> list:
    op, dtype, shape, params, nbytes = spec
    from backends.triton import triton_backend

    impl = triton_backend.impls[(op, "default")]
    name = shape_name(op, dtype, shape, params)
    ins, outs = make(op, dtype, shape, params, dev)
    ref = reference(op, dtype, ins, outs) if clock.cuda else None
    emit(f"\n{name}  ({nbytes / 2**20:.1f} MiB)")
    rows = []
    pct = lambda us: 100 * nbytes / us / 1e3 / args.copy_gbs  # noqa: E731

    runs, default_out = {}, None
    for text in texts:
        cfg = _norm.parse_config(text, _norm.GPU_CONFIG)
        o = {k: torch.full_like(v, float("nan")) for k, v in outs.items()}
        try:
            _norm.run(op, ins, o, params, cfg)  # checks the layout, launches through the JIT (compiled already)
            _norm.run(op, ins, o, params, cfg, check=False)  # the direct path, on the same outputs
            if clock.cuda:
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - one candidate failing must not end the sweep
            emit(f"  {label(text):44s} ERROR {type(exc).__name__}: {str(exc)[:200]}")
            rows.append(dict(shape=name, variant=label(text), error=f"{type(exc).__name__}: {exc}"[:500]))
            continue
        call = _norm.prepare(op, tensors_of(ins, o), cfg)
        if default_out is None:
            default_out = {k: v.double() for k, v in o.items()}
        diff = max(float(((o[k].double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
                   for k, r in default_out.items())
        runs[text] = dict(cfg=cfg, outs=o, call=call, times=[], diff=diff,
                          err=err_over_tol(o, ref, dtype) if ref is not None else float("nan"))

    eager = torch_eager(op, ins, outs) if clock.cuda else None
    eager_times = []
    if eager is not None:
        eager()
    # interleaved rounds: every candidate sampled in each round
    for _ in range(args.rounds):
        if eager is not None:
            eager_times += clock.cold(eager, args.reps)
        for text, r in runs.items():
            fn = (lambda op=op, o=r["outs"], cfg=r["cfg"]: _norm.run(op, ins, o, params, cfg, check=False))
            r["times"] += clock.cold(fn, args.reps)
    if eager_times:
        us = statistics.median(eager_times)
        emit(f"  {'torch eager (fused aten)':44s} {us:8.2f} us {nbytes / us / 1e3:6.0f} GB/s {pct(us):5.1f}%")
        rows.append(dict(shape=name, op=op, dtype=dtype, variant="torch_eager", us=us, pct=pct(us)))

    for text, r in runs.items():
        us = statistics.median(r["times"])
        host = clock.host(lambda o=r["outs"], cfg=r["cfg"]: _norm.run(op, ins, o, params, cfg, check=False))
        extra = ""
        if text == "":
            checked = clock.host(lambda o=r["outs"]: impl.fn(ins, o, params))
            unchecked = clock.host(lambda o=r["outs"]: impl.fn.unchecked(ins, o, params))
            extra = f"  checked {checked:.1f} us, harness unchecked {unchecked:.1f} us"
            rows.append(dict(shape=name, variant="host:checked", us=checked))
            rows.append(dict(shape=name, variant="host:unchecked", us=unchecked, device_us=us))
        bad = "  BAD" if r["err"] >= 1 else ""
        emit(f"  {label(text):44s} {us:8.2f} us {nbytes / us / 1e3:6.0f} GB/s {pct(us):5.1f}%  host {host:5.1f} us  "
             f"err/tol={r['err']:.2f}{bad} diff={r['diff']:.1e}  {kernel_info(r['call'])}{extra}")
        rows.append(dict(shape=name, op=op, dtype=dtype, variant=label(text), us=us, pct=pct(us), host_us=host,
                         err_over_tol=r["err"], reldiff=r["diff"], kernel=kernel_info(r["call"]),
                         samples=len(r["times"])))
    if "" in runs:  # the default's kernels launched other ways: host time only
        for text in HOST_VARIANTS:
            cfg = _norm.parse_config(text, _norm.GPU_CONFIG)
            o = runs[""]["outs"]
            _norm.run(op, ins, o, params, cfg)
            _norm.run(op, ins, o, params, cfg, check=False)
            host = clock.host(lambda cfg=cfg: _norm.run(op, ins, o, params, cfg, check=False))
            emit(f"  {text:44s} host {host:5.1f} us (the default's kernels)")
            rows.append(dict(shape=name, variant=text, host_us=host))
    del runs, ins, outs, ref
    if clock.cuda:
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- tables


def _good(row) -> bool:
    """A timed candidate whose outputs pass (err/tol < 1; NaN on the CPU dry run, which has no reference)."""
    return row is not None and not row["err_over_tol"] >= 1


def summary(rows: list, texts: list) -> list:
    """The final tables: % of copy per shape and candidate, per-candidate totals, host vs device."""
    names = list(dict.fromkeys(r["shape"] for r in rows))
    cand = [label(t) for t in texts]
    pcts = {(r["shape"], r["variant"]): r for r in rows if "pct" in r}
    width = max([len(n) for n in names] + [10])
    out = ["", f"== % of copy (cold) per shape; * best candidate; ! err/tol >= 1; bar {BAR:.0f}%"]
    cols = ["eager"] + cand
    out.append(f"{'shape':{width}s} " + " ".join(f"{i:>6d}" if i else f"{'eager':>6s}" for i in range(len(cols))) +
               "  best")
    best_of = {}
    for n in names:
        vals = [pcts.get((n, c)) for c in cand]
        ok = [(v["pct"], c) for v, c in zip(vals, cand) if _good(v)]
        best = best_of[n] = max(ok)[1] if ok else None
        e = pcts.get((n, "torch_eager"))
        cells = [f"{e['pct']:6.1f}" if e else f"{'-':>6s}"]
        for v, c in zip(vals, cand):
            if v is None:
                cells.append(f"{'-':>6s}")
            else:
                mark = "*" if c == best else ("!" if v["err_over_tol"] >= 1 else " ")
                cells.append(f"{v['pct']:5.1f}{mark}")
        out.append(f"{n:{width}s} " + " ".join(cells) + f"  {best}")
    out.append("columns: " + ", ".join(f"{i}={c}" for i, c in enumerate(cols) if i))
    out.append("")
    out.append(f"== per candidate over {len(names)} shapes")
    out.append(f"{'#':>3s} {'candidate':44s} {'>=bar':>6s} {'mean%':>6s} {'min%':>6s} {'wins':>5s} "
               f"{'vs def':>7s} {'err/tol':>8s} {'host us':>8s}")
    default = {n: pcts.get((n, "default")) for n in names}
    ranking = []
    for i, c in enumerate(cand, 1):
        vals = [pcts.get((n, c)) for n in names]
        got = [v for v in vals if v]
        if not got:
            continue
        p = [v["pct"] for v in got]
        wins = sum(1 for n in names if best_of.get(n) == c)
        speed = [default[n]["us"] / pcts[(n, c)]["us"] for n in names if default.get(n) and pcts.get((n, c))]
        gain = math.exp(statistics.mean(math.log(s) for s in speed)) if speed else float("nan")
        err = max(v["err_over_tol"] for v in got)
        host = statistics.median(v["host_us"] for v in got)
        at_bar = sum(1 for x in p if x >= BAR)
        ranking.append((at_bar, statistics.mean(p), c))
        out.append(f"{i:3d} {c:44s} {at_bar:3d}/{len(got):<2d} {statistics.mean(p):6.1f} {min(p):6.1f} {wins:5d} "
                   f"{gain:7.3f} {err:8.2f} {host:8.1f}")
    out.append("vs def: geometric mean of default us / candidate us (> 1: faster); host us: median unchecked")
    if ranking:
        top = sorted(ranking, reverse=True)[:3]
        out.append("ranked by shapes at the bar, then mean %: " + "; ".join(f"{c} ({n} at bar, {m:.1f}%)"
                                                                           for n, m, c in top))
    host_rows = {(r["shape"], r["variant"]): r for r in rows if r["variant"].startswith(("host:", "launch="))}
    out.append("")
    out.append("== host us per call (default sizing) against its device us")
    out.append(f"{'shape':{width}s} {'device':>7s} {'uncheck':>7s} {'checked':>7s} {'tensors':>7s} {'jit':>7s}"
               "  host<device")
    for n in names:
        h = host_rows.get((n, "host:unchecked"))
        if not h:
            continue
        get = lambda v: host_rows.get((n, v), {}).get("us", host_rows.get((n, v), {}).get("host_us"))  # noqa: E731
        vals = [h["device_us"], h["us"], get("host:checked"), get("launch=tensors"), get("launch=jit")]
        out.append(f"{n:{width}s} " + " ".join(f"{v:7.1f}" if v is not None else f"{'-':>7s}" for v in vals) +
                   f"  {'yes' if h['us'] < h['device_us'] else 'NO'}")
    return out


# ----------------------------------------------------------------------------- registers (no GPU)


def regs_report(texts: list, filters: list) -> list:
    """Per candidate and distinct main kernel of the perf shapes: the sm_90 compile's registers,
    spills and shared memory (ptxas -v, as tests/test_triton_norms.py compiles), and the programs
    an SM holds by threads, registers and shared memory against the programs per SM the grid needs."""
    sys.path.insert(0, str(ROOT / "tests"))
    import triton_sm90 as sm90  # the compile tests' launch specialisation, sm_90 compile and ptxas report

    lines = [f"{'candidate':28s} {'shape':34s} {'warps':>5s} {'BM':>3s} {'st':>2s} {'grid':>5s} {'regs':>5s} "
             f"{'spill':>5s} "
             f"{'smem':>7s} {'fit/SM':>6s} {'need/SM':>7s}"]
    seen = set()
    for text in texts:
        cfg = replace(_norm.parse_config(text, _norm.GPU_CONFIG), sms=132)
        for op, dtype, shape, params, _ in perf_shapes():
            name = shape_name(op, dtype, shape, params)
            if filters and not any(f in name for f in filters):
                continue
            plan = _norm.make_plan(op, dict(zip(_norm.NAMES, tensors_of(*make(op, dtype, shape, params, "meta",
                                                                                 empty=True)))), cfg)
            key = (text, op, dtype, shape[-1], tuple(sorted(params.items())), plan.grid, plan.num_warps)
            if key in seen:
                continue
            seen.add(key)
            ty, acc = sm90.TRITON_TY[dtype], "fp64" if dtype == "f64" else "fp32"
            ptrs = dict(x_ptr=ty, dy_ptr=ty, w_ptr=ty, mean_ptr=acc, rstd_ptr=acc, dx_ptr=ty, ws_ptr=acc, dw_ptr=ty,
                        db_ptr=ty, tab_ptr="i64", sums_ptr=acc, cnt_ptr="i32")
            sig, consts, attrs = sm90.launch_signature(_norm._rows_kernel, ptrs, plan.ints, plan.constexprs)
            k = sm90.compile_sm90(_norm._rows_kernel, sig, consts, attrs, plan.num_warps)
            r = sm90.ptxas_report(k.asm["ptx"])
            regs = r["regs"]
            spills = None if regs is None else r["spill_stores"] + r["spill_loads"]
            shared = k.metadata.shared
            threads = 32 * plan.num_warps
            per_warp = -(-(regs or 1) * 32 // 256) * 256  # registers are allocated 256 per warp at a time
            fit = min(2048 // threads, 65536 // (per_warp * plan.num_warps),
                      233472 // (shared + 1024) if shared else 32)
            need = -(-plan.grid[0] * plan.grid[1] // 132)
            lines.append(f"{label(text):28s} {name:34s} {plan.num_warps:5d} {plan.constexprs['BM']:3d} "
                         f"{plan.constexprs['STAGES']:2d} "
                         f"{plan.grid[0]:5d} {regs!s:>5s} {spills!s:>5s} {shared:7d} {fit:6d} {need:7d}"
                         f"{'  2 waves!' if need > fit else ''}")
            print(lines[-1], flush=True)
    return lines


# ----------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--time-limit", type=float, default=240.0, help="stop starting shapes after this many seconds")
    ap.add_argument("--copy-gbs", type=float, default=3022.0, help="copy ceiling for the %% column")
    ap.add_argument("--variant", action="append", default=[], help="another candidate (Config text); repeatable")
    ap.add_argument("--only-variants", action="store_true", help="the default and the --variant ones only")
    ap.add_argument("--shape", action="append", default=[], help="only shapes whose name contains this")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=8, help="cold samples per candidate per round")
    ap.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                    help="compile processes (0: no precompile)")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run on tiny shapes (TRITON_INTERPRET=1)")
    ap.add_argument("--regs", action="store_true", help="no GPU: registers, spills and shared memory of each "
                                                       "candidate's main kernels from the sm_90 compile")
    args = ap.parse_args()
    texts = [""] if args.only_variants else list(VARIANTS)
    texts += [v for v in dict.fromkeys(args.variant) if v not in texts]
    for t in texts + HOST_VARIANTS:
        _norm.parse_config(t, _norm.GPU_CONFIG)  # a typo fails now, not after the compiles
    if args.regs:
        regs_report(texts, args.shape)
        return 0
    dev = torch.device(args.device)
    shapes = [s for s in perf_shapes() if not args.shape or any(f in shape_name(*s[:4]) for f in args.shape)]
    if dev.type != "cuda":
        shapes = [(op, dt, (min(sh[0], 8), min(sh[-1], 64)), p, b) for op, dt, sh, p, b in shapes[:3]]
        texts = texts[:3]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    txt = out / "sweep.txt"
    txt.write_text("")

    def emit(line: str) -> None:
        print(line, flush=True)
        with txt.open("a") as f:
            f.write(line + "\n")

    started = time.time()
    head = [f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu (dry run)'}  PDL supported: "
            f"{_norm.PDL_SUPPORTED}  default: {_norm.GPU_CONFIG}",
            f"{len(shapes)} shapes x {len(texts)} candidates; {args.rounds} rounds x {args.reps} cold samples each"]
    if dev.type == "cuda" and args.jobs:
        precompile(shapes, texts, args.jobs, head)
    for line in head:
        emit(line)
    clock = Clock(dev)
    rows = []
    for spec in shapes:
        if time.time() - started > args.time_limit:
            emit(f"\ntime limit ({args.time_limit:.0f} s): stopped before {shape_name(*spec[:4])}")
            break
        rows += sweep_shape(spec, texts, clock, args, dev, emit)
        (out / "sweep.json").write_text(json.dumps(rows, indent=1, default=str))
    for line in summary(rows, texts):
        emit(line)
    emit(f"\nsweep: {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
