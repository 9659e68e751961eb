"""Host time per call of the `triton` layernorm_backward / rmsnorm_backward against their device time.

    OUT=dir python scripts/gpu/triton_norms_host.py            (CUDA: every norms perf case, ~2-3 min on an H100)
    python scripts/gpu/triton_norms_host.py --dry-run          (CPU: plans, and the Python per call with the
                                                                kernel launches stubbed; no GPU, no interpreter)

For each norms perf case (cases.select("perf", op=...)) and each sizing in CONFIGS (the text of
$GRADORACLE_TRITON_NORM, applied to `_norm.GPU_CONFIG`; plans re-made for each):

  plan         launches (chunk_sums / main / stage2), grid, finish, workspace elements, allocations per call
  device_us    CUDA: device time per call: `calls` back-to-back unchecked calls queued while the GPU spins
               (torch.cuda._sleep), bracketed by CUDA events (warm L2 for the small cases)
  host_us      host time to queue one unchecked call (the harness's `fn.unchecked`), with the GPU held busy
               (on the CPU: the Python alone, every launch a no-op)
  loop_us      CUDA: wall time per call of `calls` back-to-back unchecked calls, one sync after: what a
               training loop sees; loop_share = device_us / loop_us
  fast         the call went through the Call's fast closure (Config.fast), not Step by Step
  same_bits    CUDA: the timed (unchecked) call's outputs equal (bitwise) those of the default sizing
               (dx for every sizing; dweight / dbias too where the finish is the same), on outputs
               poisoned with NaN first
  rel_err      CUDA: max |output - float64 reference| / max |reference|, per output (NaN: left unwritten)

On the CPU the launches are stubbed with triton's own CudaLauncher class around a no-op launcher, so
the old default (`fast=0,ws_cache=0`, Step by Step) pays what triton's launch path costs
in Python and `fast=1` what the fast closure does; the workspace comes from the meta device (the CUDA
caching allocator's cost is not in it).
Writes $OUT/triton_norms_host.json (or --json PATH); stops starting cases after --budget seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# "": the default sizing (the fast closure, the kept workspace, and since results/h100/s6/ the one-launch
# finish for calls of at most 32 MiB); the others are A/B candidates (Config knobs): the old default
# (Step by Step, a workspace per call, two launches), each knob alone, and the one-launch finish everywhere.
CONFIGS = ("", "fast=0,ws_cache=0,last_below=0", "fast=1,ws_cache=0", "fast=0,ws_cache=1", "last_below=0",
           "finish=last")
SPIN_US = 300  # GPU spin per call queued behind it (host times per call reach ~130 us on the H100)
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}


def perf_cases():
    """The norms perf cases, smallest first (a budget cut drops the largest, where host time matters least)."""
    from math import prod

    from backends.triton import _norm
    from cases import select

    return sorted((c for op in _norm.OPS for c in select("perf", op=op)), key=lambda c: prod(c.params["shape"]))


def make_tensors(torch, case, device: str):
    """(inputs, outs, params, tensors) of one call: the case's shapes, contiguous; random on CUDA."""
    from harness.registry import get_op

    shapes = get_op(case.op).shapes(case)
    dt = getattr(torch, DTYPES[case.dtype])
    st = torch.float64 if case.dtype == "f64" else torch.float32
    inputs, outs = {}, {}
    for name, shape in shapes.items():
        dtype = st if name in ("mean", "rstd") else dt
        if device == "cpu":
            t = torch.empty(shape, dtype=dtype)
        elif name == "rstd":
            t = torch.rand(shape, dtype=dtype, device=device) + 0.5
        else:
            t = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
        (outs if name in ("dx", "dweight", "dbias") else inputs)[name] = t
    return inputs, outs, dict(case.params)


def reference(torch, op: str, inputs: dict) -> dict:
    """The op's outputs in float64 (the module docstring of backends/triton/_norm.py), on the GPU."""
    x, dy, rstd = inputs["x"].double(), inputs["dy"].double(), inputs["rstd"].double()[..., None]
    xhat = (x - inputs["mean"].double()[..., None]) * rstd if op.startswith("layernorm") else x * rstd
    w = inputs.get("weight")
    g = dy * w.double() if w is not None else dy
    d = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if op.startswith("layernorm"):
        d = d - g.mean(-1, keepdim=True)
    rows = tuple(range(x.dim() - 1))
    out = {"dx": rstd * d}
    if w is not None:
        out["dweight"] = (dy * xhat).sum(rows)
    out["dbias"] = dy.sum(rows)
    return out


def plan_row(call) -> dict:
    """What a call of this plan does on the GPU: launches, grid, finish, allocations."""
    p = call.plan
    c = p.constexprs
    steps = call.launches()
    return {"launches": len(steps), "kernels": list(steps), "grid": list(p.grid), "num_warps": p.num_warps,
            "BM": c.get("BM"), "BN": c.get("BN"), "finish": {0: "none", 1: "kernel", 2: "last"}.get(c.get("FINISH")),
            "pdl": c.get("PDL"), "stage2_grid": list(p.stage2["grid"]) if p.stage2 else None,
            "ws_numel": p.ws_numel, "sums_numel": call.sums_numel, "table": p.table is not None,
            "allocs_per_call": int(bool(p.ws_numel) and not getattr(p, "ws_cache", False)) + int(bool(call.sums_numel)),
            "ws_cache": getattr(p, "ws_cache", False), "fast_planned": getattr(p, "fast", False)}


def _fast(call) -> bool:
    """Whether calls of this Call go through its fast closure."""
    return getattr(call, "fast", None) is not None and call.entry == call.fast


# ----------------------------------------------------------------------------- CPU: stubbed launches


def stub_launches(torch, call) -> None:
    """Make a CPU Call launch as a CUDA one would, through triton's CudaLauncher around a no-op."""
    import triton
    from triton.backends.nvidia.driver import CudaLauncher

    from backends.triton import _steps

    if getattr(triton.runtime.driver, "_active", None) is None:
        triton.runtime.driver._active = object()  # CudaLauncher.__call__ reads it (3.8)
    _steps._bind_torch()
    _steps._raw_stream = lambda device: 0
    code = CudaLauncher.__call__.__code__
    for step in (call.split, call.main, call.stage2):
        if step is None:
            continue
        run = CudaLauncher.__new__(CudaLauncher)
        run.launch = lambda *args: None
        run.num_ctas, run.global_scratch_size, run.global_scratch_align = 1, 0, 1
        run.profile_scratch_size, run.profile_scratch_align, run.gsan_enabled = 0, 1, False
        run.launch_cooperative_grid, run.launch_pdl = False, bool(step.options.get("launch_pdl"))
        if code.co_argcount > 6:  # 3.8: the arguments go to the launcher module with their C signature
            run.arg_annotations, run.kernel_signature = [None] * (step.n_tensors + len(step.tail)), b""
        compiled = type("Compiled", (), {})()
        compiled.run, compiled.function, compiled.packed_metadata = run, 0, (step.num_warps, 1, 0)
        step.compiled, step.device = compiled, 0
        step.runner = _steps._lean_runner(compiled, step.grid, lambda *a, stream: None) or (lambda *a, stream: None)
    call.index, call.current_device, call.current_stream = 0, (lambda: 0), (lambda index: 0)
    call.device = torch.device("meta")  # workspace without host malloc (the GPU's caching allocator is faster)
    if hasattr(call, "fast_state"):  # (the probe also runs on trees from before the fast path)
        call.fast_state = None if call.plan.fast else False


def cpu_case(torch, case, text: str, calls: int) -> dict:
    from backends.triton import _norm
    from backends.triton import layernorm_backward, rmsnorm_backward

    fn = {_norm.LAYERNORM: layernorm_backward.layernorm_backward,
          _norm.RMSNORM: rmsnorm_backward.rmsnorm_backward}[case.op]
    inputs, outs, params = make_tensors(torch, case, "cpu")
    t = (inputs["x"], inputs["dy"], inputs.get("weight"), inputs.get("mean"), inputs["rstd"],
         outs["dx"], outs.get("dweight"), outs.get("dbias"))
    call = _norm.prepare(case.op, t)
    stub_launches(torch, call)
    fn(inputs, outs, params)  # checked call; builds the fast closure where allowed
    made = _norm.PLANS_MADE[0]
    unchecked = fn.unchecked

    def us(f):
        f()
        return min(timeit.repeat(f, number=calls, repeat=5)) / calls * 1e6

    row = {**plan_row(call), "host_us": us(lambda: unchecked(inputs, outs, params)),
           "key_lookup_us": us(lambda: _norm._PLANS.get(_norm._key(case.op, t, None))),
           "entry_us": us(lambda: getattr(call, "entry", call)(*t)), "fast": _fast(call)}
    row["planned_per_call"] = _norm.PLANS_MADE[0] - made
    # the parts: the Step path's operands (workspace included) and each Step's launch (through
    # triton's CudaLauncher), each raw launch with its arguments gathered, one workspace
    main_args, split_args = call.operands(*t, 0)
    args = {"chunk_sums": split_args, "main": main_args, "stage2": main_args[6:9]}
    row["operands_us"] = us(lambda: call.operands(*t, 0))
    row["alloc_us"] = us(lambda: torch.empty(call.ws_numel, dtype=call.acc, device=call.device)) \
        if call.ws_numel else 0.0
    row["step_us"] = {k: us(lambda s=s, a=args[k]: s(*a, stream=0)) for k, s in call.launches().items()}
    row["raw_us"] = {}
    for k, s in call.launches().items():
        go = s.raw() if hasattr(s, "raw") else None  # (trees from before raw launches)
        if go:
            a = tuple(map(torch.Tensor.data_ptr, args[k])) + s.tail
            row["raw_us"][k] = us(lambda go=go, a=a: go(0, a))
    return row


# ----------------------------------------------------------------------------- CUDA


def _per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def cuda_case(torch, case, call_fn, calls: int) -> dict:
    """device_us, host_us, loop_us of `call_fn` (the unchecked call, planned and compiled already)."""
    sync = torch.cuda.synchronize
    sync()
    torch.cuda._sleep(int(calls * SPIN_US * 1e-6 * 1.8e9))  # the GPU stays busy while the host queues
    host = _per_call_us(call_fn, calls)
    # device time: a fresh batch queued behind a spin long enough to hide the host
    sync()
    torch.cuda._sleep(int(calls * SPIN_US * 1e-6 * 1.8e9))
    s2, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s2.record()
    for _ in range(calls):
        call_fn()
    e2.record()
    e2.synchronize()
    dev = s2.elapsed_time(e2) / calls * 1e3
    loops = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call_fn()
        sync()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
    loop = sorted(loops)[1]
    return {"device_us": dev, "host_us": host, "loop_us": loop, "loop_share": dev / loop,
            "host_below_device": host < dev}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: plans and the stubbed Python per call")
    ap.add_argument("--calls", type=int, default=None, help="calls per figure (CUDA 100, CPU 2000)")
    ap.add_argument("--configs", default=";".join(CONFIGS), help="';'-separated sizings ('' the default)")
    ap.add_argument("--cases", type=int, default=0, help="only the first N perf cases (0: all)")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds after which no new case starts")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    t_start = time.time()
    import torch

    from backends.triton import _norm
    from backends.triton import layernorm_backward, rmsnorm_backward

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: use --dry-run on the CPU")
    if _norm.interpreted():
        ap.error("run without TRITON_INTERPRET=1")
    calls = args.calls or (100 if device == "cuda" else 2000)
    configs = args.configs.split(";")
    cases = perf_cases()[:args.cases or None]
    base = _norm.GPU_CONFIG
    fns = {_norm.LAYERNORM: layernorm_backward.layernorm_backward,
           _norm.RMSNORM: rmsnorm_backward.rmsnorm_backward}
    rows, skipped = [], []
    for case in cases:
        if time.time() - t_start > args.budget:
            skipped.append(case.id)
            continue
        ref = exact = None
        tensors = None if device == "cpu" else make_tensors(torch, case, device)
        for text in configs:
            cfg = _norm.parse_config(text, base)
            _norm.GPU_CONFIG = _norm.INTERPRETER_CONFIG = cfg
            _norm._PLANS.clear()
            row = {"case": case.id, "op": case.op, "dtype": case.dtype, "shape": case.params["shape"],
                   "config": text or "default"}
            try:
                if device == "cpu":
                    row.update(cpu_case(torch, case, text, calls))
                else:
                    inputs, outs, params = tensors
                    fn = fns[case.op]
                    for o in outs.values():
                        o.fill_(float("nan"))
                    fn(inputs, outs, params)  # plans, compiles; makes the fast closure where allowed
                    for o in outs.values():  # what the timed (unchecked) call writes is what is judged
                        o.fill_(float("nan"))
                    fn.unchecked(inputs, outs, params)
                    torch.cuda.synchronize()
                    got = {k: v.clone() for k, v in outs.items()}
                    if exact is None:
                        exact = reference(torch, case.op, inputs)
                    row["rel_err"] = {k: float((got[k].double() - exact[k]).abs().max() / exact[k].abs().max())
                                      for k in got}  # max |error| / max |value|: ~1e-2 for bf16, NaN: unwritten
                    if ref is None:
                        ref, ref_finish = got, cfg.finish
                    row["same_bits"] = {k: bool(torch.equal(got[k], ref[k])) for k in got
                                        if k == "dx" or cfg.finish == ref_finish}
                    t = (inputs["x"], inputs["dy"], inputs.get("weight"), inputs.get("mean"), inputs["rstd"],
                         outs["dx"], outs.get("dweight"), outs.get("dbias"))
                    call = _norm._PLANS[_norm._key(case.op, t, None)]
                    row.update(plan_row(call))
                    row.update(cuda_case(torch, case, lambda: fn.unchecked(inputs, outs, params), calls))
                    row["fast"] = _fast(call)
                    row["fast_calls"] = getattr(call, "fast_calls", [0])[0]
            except Exception as exc:  # noqa: BLE001 - one sizing failing must not lose the others
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            figs = "  ".join(f"{k} {row[k]:.1f}" for k in ("device_us", "host_us", "loop_us", "key_lookup_us",
                                                            "entry_us") if k in row)
            print(f"{case.id:48s} {row['config']:24s} launches {row.get('launches')} allocs "
                  f"{row.get('allocs_per_call')} fast {row.get('fast')}  {figs}"
                  f"{'  same_bits ' + str(row['same_bits']) if 'same_bits' in row else ''}"
                  f"{'  max rel_err %.1e' % max(row['rel_err'].values()) if row.get('rel_err') else ''}"
                  f"{'  ERROR ' + row['error'] if 'error' in row else ''}", flush=True)
        if device == "cuda":
            del tensors
            torch.cuda.empty_cache()
    _norm.GPU_CONFIG = base
    out = args.json or (Path(os.environ["OUT"]) / "triton_norms_host.json" if os.environ.get("OUT") else None)
    report = {"device": device, "calls": calls, "configs": configs, "rows": rows, "skipped": skipped,
              "seconds": time.time() - t_start}
    if device == "cuda":
        import triton

        report["gpu"], report["triton"] = torch.cuda.get_device_name(), triton.__version__
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {out}")
    print(f"{len(rows)} rows, {len(skipped)} cases skipped (budget), {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
