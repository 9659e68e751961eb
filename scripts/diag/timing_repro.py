"""Why two bench runs disagree by more than 2% (issue 4), measured on the GPU.

1. Small torch kernels (20-60 us, cold): the same case timed by the engine in several fresh
   allocations of its inputs.  If the medians move with the allocation, rotating input sets
   within one measurement averages the effect out.
2. JAX: wall time per blocking call (what the engine did) against device time from CUPTI
   (torch.profiler sees every kernel of the process, XLA's too): per sample the span from the
   first to the last kernel of the call, between a flush and a marker kernel.

    python scripts/diag/timing_repro.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from cases import select
from harness import frameworks, timing
from harness.registry import discover, find_impl, get_op, timed_callable
from harness.runner import prepare, timed_check

SMALL = [("torch", "dgrad1d[f32,N=1,C=1->1,L=1048576,k=3,s=1,p=1,d=1,g=1,ncw]"),
         ("torch_compile", "layernorm[f32,1024x2048]"),
         ("torch", "sum[f32,X=33554432,axes=all]"),
         ("torch_compile", "matmul[bf16,A=1024x1024,B=1024x1024]")]
JAXES = ["mul[bf16,A=8x2048x4096,B=4096]", "layernorm[f32,1024x2048]", "dgrad1d[f32,N=1,C=1->1,L=1048576,k=3,s=1,p=1,d=1,g=1,ncw]",
         "sum[bf16,X=33554432,axes=all]"]


def case_by_id(cid):
    for c in select("perf"):
        if c.id == cid:
            return c
    raise KeyError(cid)


def small_kernels(out):
    cfg = timing.TimingConfig(mode="cold", min_samples=10, max_samples=600, budget_s=0.4, rel_ci=0.003)
    keep = []
    for impl_id, cid in SMALL:
        case = case_by_id(cid)
        impl = find_impl(case.op, impl_id)
        prep = prepare(case, 0, "auto", "cuda")
        meds = []
        for rep in range(5):
            keep.append(torch.empty(int(np.random.randint(1, 64)) << 20, dtype=torch.uint8, device="cuda"))
            res = timed_check(impl, case, "cuda", prep.inputs, prep, cfg)
            meds.append(res.samples.median * 1e3 if res.samples else None)
        out.setdefault("small", []).append({"impl": impl_id, "case": cid, "medians_us": meds})
        print("small", impl_id, cid, ["%.2f" % m for m in meds], "spread %.2f%%" % (100 * (max(meds) / min(meds) - 1)),
              flush=True)


def kineto_spans(run_call, n, marker_cycles=2000):
    """Device span of each of n calls: kernels after a marker spin, up to the next flush."""
    flush = timing.flush_for("cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            flush()
            torch.cuda._sleep(marker_cycles)
            torch.cuda.synchronize()
            run_call(i)
        flush()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    names = sorted({e.name for e in evs})
    spans, sums, cur = [], [], None
    for e in evs:
        if "spin" in e.name or "sleep" in e.name.lower():
            if cur:
                cur.pop()  # the flush that ended the previous sample
                spans.append(cur[-1].time_range.end - cur[0].time_range.start if cur else float("nan"))
                sums.append(sum(x.time_range.end - x.time_range.start for x in cur))
            cur = []
        elif cur is not None:
            cur.append(e)
    if cur:
        cur.pop()
        spans.append(cur[-1].time_range.end - cur[0].time_range.start if cur else float("nan"))
        sums.append(sum(x.time_range.end - x.time_range.start for x in cur))
    return spans, sums, names


def jax_timings(out):
    jax_impls = {}
    for cid in JAXES:
        case = case_by_id(cid)
        impl = find_impl(case.op, "jax")
        prep = prepare(case, 0, "auto", "cuda")
        fw = frameworks.adapter("jax")
        inputs = {k: fw.upload(t, "cuda") for k, t in prep.inputs.items()}
        nones = {o: None for o in get_op(case.op).outputs_of(case)}
        impl.fn(inputs, nones, case.params)  # checked once, then the raw function
        raw = timed_callable(impl)

        def fn(inputs, _outs, params):
            return raw(inputs, nones, params)
        row = {"case": cid, "wall_us": [], "span_us": [], "sum_us": []}
        for rep in range(3):
            flush = timing.flush_for("cuda")
            walls = []
            for i in range(200):
                flush()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(inputs, {}, case.params)
                walls.append((time.perf_counter() - t0) * 1e6)
            spans, sums, names = kineto_spans(lambda i: fn(inputs, {}, case.params), 200)
            row["wall_us"].append(float(np.median(walls)))
            row["span_us"].append(float(np.median(spans)) if spans else None)
            row["sum_us"].append(float(np.median(sums)) if sums else None)
            row["kernels"] = names[:12]
            row["n_spans"] = len(spans)
        out.setdefault("jax", []).append(row)
        print("jax", cid, json.dumps({k: v for k, v in row.items() if k != "kernels"}), row["kernels"][:6], flush=True)
    # the same CUPTI span for a torch call, against its event time
    case = case_by_id(SMALL[0][1])
    impl = find_impl(case.op, "torch")
    prep = prepare(case, 0, "auto", "cuda")
    fw = frameworks.adapter("torch")
    inputs = {k: fw.view(fw.upload(t, "cuda"), t) for k, t in prep.inputs.items()}
    shapes = get_op(case.op).shapes(case)
    outs = {o: fw.poisoned(shapes[o], case.dtype, "cuda") for o in ("dx",)}
    impl.fn(inputs, outs, case.params)
    spans, sums, names = kineto_spans(lambda i: impl.fn(inputs, outs, case.params), 300)
    out["torch_span"] = {"case": case.id, "span_us": float(np.median(spans)), "sum_us": float(np.median(sums)),
                         "kernels": names[:8]}
    print("torch span", out["torch_span"], flush=True)


def hold_order(out):
    """Median of a 23 us kernel (cold) against the spin's place and length: flush-spin-call or spin-flush-call."""
    case = case_by_id(SMALL[0][1])
    impl = find_impl(case.op, "torch")
    prep = prepare(case, 0, "auto", "cuda")
    fw = frameworks.adapter("torch")
    inputs = {k: fw.view(fw.upload(t, "cuda"), t) for k, t in prep.inputs.items()}
    outs = {"dx": fw.poisoned(get_op(case.op).shapes(case)["dx"], case.dtype, "cuda")}
    impl.fn(inputs, outs, case.params)
    raw = timed_callable(impl)
    flush = timing.flush_for("cuda")
    rate = timing.GpuHold.for_cuda().cycles_per_ms
    rows = []
    for rep in range(2):
        for order in ("flush-spin", "spin-flush"):
            for hold_ms in (0.05, 0.2, 0.8):
                pairs = []
                for i in range(300):
                    b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    if order == "flush-spin":
                        flush()
                        torch.cuda._sleep(int(hold_ms * rate))
                    else:
                        torch.cuda._sleep(int(hold_ms * rate))
                        flush()
                    b.record()
                    raw(inputs, outs, case.params)
                    e.record()
                    pairs.append((b, e))
                torch.cuda.synchronize()
                med = float(np.median([b.elapsed_time(e) for b, e in pairs])) * 1e3
                rows.append({"rep": rep, "order": order, "hold_ms": hold_ms, "median_us": med})
                print("hold", rep, order, hold_ms, "%.2f us" % med, flush=True)
    out["hold_order"] = rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--parts", default="jax_timings,small_kernels,hold_order")
    args = ap.parse_args()
    discover()
    out = {"device": torch.cuda.get_device_name()}
    for part in [globals()[name] for name in args.parts.split(",")]:
        try:
            part(out)
        except Exception as exc:  # one part failing must not lose the other
            import traceback

            traceback.print_exc()
            out[part.__name__ + "_error"] = repr(exc)
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
