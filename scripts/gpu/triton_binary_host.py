"""Host cost per call of the `triton` binary_backward, against its device time.

    python scripts/gpu/triton_binary_host.py --device cuda [--calls 200] [--json OUT.json]
    python scripts/gpu/triton_binary_host.py --device cpu  [--calls 1000]   (kernel launches stubbed)

For each perf shape (bf16 and f32 mul, every broadcast pattern of cases/binary_backward.py)
it calls the checked entry once (planning; on CUDA compiling and autotuning), then measures:

  plan_us      a call that plans from scratch (plan cache cleared before each call): about what
               every call cost before plans were cached.  On CUDA it includes the upload of the
               plan's descriptor, which waits for the kernels already queued (a stream sync)
  checked_us   the checked entry on a cached plan (argument checks + lookup + launches)
  unchecked_us the unchecked entry (`binary_backward.unchecked`, what the harness times): host
               time to queue one call
CUDA only:
  device_us    device time per call: `calls` back-to-back unchecked calls queued while the GPU
               spins (torch.cuda._sleep), bracketed by CUDA events, so launch gaps are not counted
  loop_us      wall time per call of `calls` back-to-back unchecked calls with
               torch.cuda.synchronize() around them and no spin: what a caller looping sees
  loop_share   device_us / loop_us (1.0: the loop runs at device speed)

On CUDA it then times every fn (add ... minimum) in bf16 on the no-broadcast and the
bias-gradient (B=4096) llama shapes: device time per call and GB/s of the op's minimum traffic,
to show whether pow or div is compute-bound (slower than mul) there.

On the CPU the kernel launches are stubbed out, so the figures are the Python alone: run it
without TRITON_INTERPRET.  With --json the rows, the per-fn rows and the autotuner's log (CUDA)
are written there.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LLAMA = (8, 2048, 4096)
SHAPES = [  # (A, B) of the perf cases
    (LLAMA, (4096,)), (LLAMA, (8, 1, 4096)), (LLAMA, (8, 2048, 1)), (LLAMA, LLAMA),
    ((8, 1, 4096), LLAMA), ((1, 2048, 4096), (8, 2048, 1)),
]


def _per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def _case(torch, device: str, a_shape, b_shape, dtype, fn: str = "mul"):
    """(inputs, outs, params) of one call; values in [0.5, 4.5) (pow's a > 0)."""
    from backends._plans.binary_backward import broadcast_shape

    o_shape = broadcast_shape(a_shape, b_shape)
    make = (lambda s: torch.empty(s, dtype=dtype, device=device)) if device == "cpu" else \
        (lambda s: torch.randn(s, dtype=torch.float32, device=device).to(dtype).abs_().add_(0.5))
    inputs = {"a": make(a_shape), "b": make(b_shape), "grad_out": make(o_shape)}
    outs = {"grad_a": torch.empty(a_shape, dtype=dtype, device=device),
            "grad_b": torch.empty(b_shape, dtype=dtype, device=device)}
    return inputs, outs, {"fn": fn, "a": list(a_shape), "b": list(b_shape)}


def _device_us(torch, call, calls: int) -> tuple[float, float]:
    """(host us to queue one call, device us per call): `calls` calls queued while the GPU
    spins, bracketed by CUDA events, so launch gaps are not counted."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(calls * 80e-6 * 2e9))  # ~80 us of host time per call at ~2 GHz
    start.record()
    host = _per_call_us(call, calls)
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def measure(tk, torch, device: str, a_shape, b_shape, dtype, calls: int) -> dict:
    inputs, outs, params = _case(torch, device, a_shape, b_shape, dtype)
    checked, unchecked = tk.binary_backward, tk.binary_backward.unchecked
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    checked(inputs, outs, params)  # plans (compiles, autotunes) once
    sync()

    def from_scratch():
        tk.clear_plans()
        unchecked(inputs, outs, params)

    row = {"a": list(a_shape), "b": list(b_shape), "dtype": str(dtype).replace("torch.", "")}
    row["plan_us"] = _per_call_us(from_scratch, max(10, calls // 4))
    checked(inputs, outs, params)
    sync()
    row["checked_us"] = _per_call_us(lambda: checked(inputs, outs, params), calls)
    sync()
    if device != "cuda":
        row["unchecked_us"] = _per_call_us(lambda: unchecked(inputs, outs, params), calls)
        return row
    row["unchecked_us"], row["device_us"] = _device_us(torch, lambda: unchecked(inputs, outs, params), calls)
    t0 = time.perf_counter()
    for _ in range(calls):
        unchecked(inputs, outs, params)
    sync()
    row["loop_us"] = (time.perf_counter() - t0) / calls * 1e6
    row["loop_share"] = row["device_us"] / row["loop_us"]
    row["host_below_device"] = row["unchecked_us"] < row["device_us"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--calls", type=int, default=None, help="calls per measurement (cuda 200, cpu 1000)")
    ap.add_argument("--dtype", action="append", choices=("bf16", "f32"), help="default: both")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    from backends.triton import binary_backward as tk

    calls = args.calls or (200 if args.device == "cuda" else 1000)
    if args.device == "cpu":
        if tk.interpreted():
            ap.error("run without TRITON_INTERPRET=1: on the CPU the launches are stubbed, not interpreted")
        from backends.triton import _steps as _launch

        _launch.Step.launch = lambda self, *tensors: None  # the Python alone
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    rows = []
    for dt in args.dtype or ("bf16", "f32"):
        for a_shape, b_shape in SHAPES:
            row = measure(tk, torch, args.device, a_shape, b_shape, dtypes[dt], calls)
            rows.append(row)
            figures = "  ".join(f"{k} {v:.1f}" if isinstance(v, float) and k.endswith("_us") else
                                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                for k, v in row.items() if k not in ("a", "b", "dtype"))
            print(f"{dt} A={'x'.join(map(str, a_shape))} B={'x'.join(map(str, b_shape))}: {figures}", flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    fn_rows = []
    if args.device == "cuda":
        from oracle.binary_backward import FNS

        for a_shape, b_shape in ((LLAMA, LLAMA), (LLAMA, (4096,))):
            for fn in FNS:
                inputs, outs, params = _case(torch, "cuda", a_shape, b_shape, torch.bfloat16, fn)
                tk.binary_backward(inputs, outs, params)
                _, dev = _device_us(torch, lambda: tk.binary_backward.unchecked(inputs, outs, params), 50)
                n_o, n_a, n_b = (inputs["grad_out"].numel(), inputs["a"].numel(), inputs["b"].numel())
                gbs = 2 * (n_o + 2 * n_a + 2 * n_b) / dev / 1e3
                fn_rows.append({"fn": fn, "b": list(b_shape), "device_us": dev, "gbs": gbs,
                                "pct_of_3022": 100 * gbs / 3022})
                print(f"bf16 {fn:8s} B={'x'.join(map(str, b_shape))}: device_us {dev:.1f}  {gbs:.0f} GB/s "
                      f"({100 * gbs / 3022:.1f}% of 3022 GB/s)", flush=True)
                del inputs, outs
                torch.cuda.empty_cache()
    log = {" ".join(map(str, key)): {"chosen": v["chosen"], "case_bytes": v["case_bytes"],
                                      "tried": [{**{k: t[k] for k in t if k != "config"}, "config": vars(t["config"])}
                                                for t in v["tried"]]}
           for key, v in tk.TUNING_LOG.items()}
    for key, v in log.items():
        times = ", ".join(f"{t['ms'] * 1e3:.1f}" if "ms" in t else ("same as %d" % t["same_as"] if "same_as" in t
                                                                     else "error") for t in v["tried"])
        print(f"tuned {key}: chose {v['chosen']} of [{times}] us")
    if args.json:
        report = {"device": args.device, "calls": calls, "rows": rows, "fns": fn_rows, "tuning": log}
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
