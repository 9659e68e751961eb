"""The `triton` backend's launches on every perf case, on the GPU: registers, spills and
occupancy of each compiled kernel, grids and waves, the autotuner's choices, and a quick
side-by-side timing of every named sizing (preset).

    python scripts/gpu/triton_tune_info.py [--json OUT.json] [--op binary_backward] [--op reduce_sum]
                                           [--presets] [--time-limit S] [--calls N]

For each perf case of binary_backward (plus pow, sub and minimum in bf16 on the no-broadcast,
bias and per-sequence shapes) and reduce_sum it makes inputs on the GPU, calls the checked
entry once (planning; binary_backward also autotunes its shape class), reads the compiled
kernels of the cached plan, and times `--calls` back-to-back unchecked calls with CUDA events
(a call reads 100-400 MiB, past the 50 MiB L2, so about cold).  With --presets it does the
same for every preset of each op (binary_backward.PRESETS, reduce_sum.PRESETS), pinned, until
--time-limit seconds have passed.  The figures are for ranking sizings; the bench's are the
ones to quote.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from math import prod
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

COPY_GBS = 3022.0  # the H100's measured copy ceiling (the bench measures its own)
LLAMA = (8, 2048, 4096)
TORCH_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}


def binary_cases() -> list[dict]:
    from cases import select

    out = [dict(op="binary_backward", dtype=c.dtype, params=dict(c.params), id=c.id)
           for c in select("perf", op="binary_backward")]
    for fn in ("pow", "sub", "minimum"):
        for b in (LLAMA, (4096,), (8, 1, 4096)):
            params = {"fn": fn, "a": list(LLAMA), "b": list(b)}
            out.append(dict(op="binary_backward", dtype="bf16", params=params,
                            id=f"{fn}[bf16,A={'x'.join(map(str, LLAMA))},B={'x'.join(map(str, b))}]"))
    return out


def reduce_cases() -> list[dict]:
    from cases import select

    return [dict(op="reduce_sum", dtype=c.dtype, params=dict(c.params), id=c.id)
            for c in select("perf", op="reduce_sum")]


def binary_call(torch, case: dict):
    """(checked, unchecked, args, bytes, plan getter) of one binary_backward case; inputs in [0.5, 2)."""
    from backends._bcast_plan import broadcast_shape
    from backends.triton import binary_backward as tk

    p, dt = case["params"], getattr(torch, TORCH_DT[case["dtype"]])
    a_shape, b_shape = tuple(p["a"]), tuple(p["b"])
    o_shape = broadcast_shape(a_shape, b_shape)

    def make(s):
        return torch.rand(s, device="cuda", dtype=torch.float32).mul_(1.5).add_(0.5).to(dt)

    inputs = {"a": make(a_shape), "b": make(b_shape), "grad_out": make(o_shape)}
    outs = {"grad_a": torch.empty(a_shape, dtype=dt, device="cuda"),
            "grad_b": torch.empty(b_shape, dtype=dt, device="cuda")}
    params = {"fn": p["fn"], "a": list(a_shape), "b": list(b_shape)}
    item = inputs["a"].element_size()
    reads_ab = p["fn"] not in ("add", "sub")
    nbytes = item * ((2 if reads_ab else 1) * (prod(a_shape) + prod(b_shape)) + prod(o_shape))

    def plan(cfg):
        a, b, g, ga, gb = (inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"])
        return tk._PLANS.get(tk._key(p["fn"], a, b, g, ga, gb, cfg))

    return (inputs, outs, params), nbytes, plan


def reduce_call(torch, case: dict):
    from backends.triton import reduce_sum as rs
    from oracle.reduce_sum import out_shape

    p, dt = case["params"], getattr(torch, TORCH_DT[case["dtype"]])
    shape = list(p["shape"])
    if p.get("x_layout") == "transposed":
        x = torch.randn(shape[:-2] + [shape[-1], shape[-2]], device="cuda", dtype=torch.float32)
        x = x.to(dt).transpose(-1, -2)  # the last two dims swapped in memory
    else:
        x = torch.randn(shape, device="cuda", dtype=torch.float32).to(dt)
    params = {k: v for k, v in p.items() if k != "x_layout"}
    y = torch.empty(out_shape(shape, params), dtype=dt, device="cuda")
    nbytes = x.element_size() * (x.numel() + y.numel())

    def plan(cfg):
        return rs._PLANS.get((tuple(x.shape), x.stride(), x.dtype, x.device, rs._form(params), cfg))

    return ({"x": x}, {"y": y}, params), nbytes, plan


def _device_ms(torch, fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _launches(plan) -> list[dict]:
    from backends.triton._steps import programs_per_sm

    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    for step in plan.steps() if plan is not None else []:
        res = step.resources() or {}
        row = {"kernel": step.kernel.__name__, "grid": step.grid, "warps": step.num_warps, **res}
        if res:
            occ = programs_per_sm(res["regs"], res["shared"], step.num_warps)
            row.update(occupancy=occ, waves=round(step.grid / (sms * occ), 2))
        out.append(row)
    return out


def probe(torch, case: dict, preset: str | None, calls: int) -> dict:
    """Plan (and tune), read the launches, time the unchecked calls of one case under one sizing."""
    if case["op"] == "binary_backward":
        from backends.triton import binary_backward as mod
    else:
        from backends.triton import reduce_sum as mod
    make = binary_call if case["op"] == "binary_backward" else reduce_call
    (inputs, outs, params), nbytes, plan_of = make(torch, case)
    cfg = None if preset is None else mod.PRESETS[preset]
    if case["op"] == "binary_backward":
        if cfg is None:
            mod.binary_backward(inputs, outs, params)
            call = lambda: mod.binary_backward.unchecked(inputs, outs, params)  # noqa: E731
        else:
            mod.run(inputs, outs, params, cfg)
            call = lambda: mod._call(params["fn"], inputs["a"], inputs["b"], inputs["grad_out"],  # noqa: E731
                                     outs["grad_a"], outs["grad_b"], cfg)
    else:
        if cfg is None:
            mod.reduce_sum(inputs, outs, params)
        else:
            mod.run(inputs, outs, params, cfg)
        call = lambda: mod._run(inputs, outs, params, cfg)  # noqa: E731
    ms = _device_ms(torch, call, calls)
    gbs = nbytes / ms / 1e6
    row = {"case": case["id"], "op": case["op"], "preset": preset or "(default)", "ms": round(ms, 5),
           "gbs": round(gbs), "pct_copy": round(100 * gbs / COPY_GBS, 1), "launches": _launches(plan_of(cfg))}
    del inputs, outs
    return row


def _print(row: dict) -> None:
    main = row["launches"][0] if row["launches"] else {}
    more = " + ".join(f"{l['kernel']} {l.get('regs', '?')}r" for l in row["launches"][1:])
    print(f"{row['case']:50s} {row['preset']:16s} {row['ms']:9.4f} ms {row['pct_copy']:6.1f}%  "
          f"{main.get('kernel', '-'):18s} grid {main.get('grid', 0):6d} w{main.get('warps', 0):<2d} "
          f"regs {main.get('regs', '?'):>3} spill {main.get('spills', '?'):>3} occ {main.get('occupancy', '?'):>2} "
          f"waves {main.get('waves', '?'):>6}{'  ' + more if more else ''}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", action="append", choices=("binary_backward", "reduce_sum"))
    ap.add_argument("--presets", action="store_true", help="also time every preset, pinned")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=0, help="seconds; no new preset probes after (0: none)")
    ap.add_argument("--match", default="", help="only cases whose id contains this")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    from backends.triton import binary_backward as tk
    from backends.triton import reduce_sum as rs

    t0 = time.time()
    cases = []
    for op in args.op or ("binary_backward", "reduce_sum"):
        cases += binary_cases() if op == "binary_backward" else reduce_cases()
    cases = [c for c in cases if args.match in c["id"]]
    rows = []

    def save():  # after every probe: a run cut by a time limit keeps what it measured
        if args.json:
            tuning = {" ".join(map(str, k)): {"chosen": v["chosen"],
                                              "tried": [{kk: (vars(vv) if kk == "config" else vv)
                                                         for kk, vv in t.items()} for t in v["tried"]]}
                      for k, v in tk.TUNING_LOG.items()}
            args.json.write_text(json.dumps({"rows": rows, "tuning": tuning, "seconds": round(time.time() - t0, 1)},
                                            indent=1, default=str))

    printed: set = set()
    for preset in [None] + (["*"] if args.presets else []):
        for case in cases:
            mod = tk if case["op"] == "binary_backward" else rs
            for name in ([None] if preset is None else list(mod.PRESETS)):
                if name is not None and args.time_limit and time.time() - t0 > args.time_limit:
                    break
                try:
                    rows.append(probe(torch, case, name, args.calls))
                    _print(rows[-1])
                except Exception as exc:  # noqa: BLE001 - report it, go on
                    rows.append({"case": case["id"], "op": case["op"], "preset": name or "(default)",
                                 "error": f"{type(exc).__name__}: {exc}"[:400]})
                    print(f"{case['id']:50s} {name or '(default)':16s} ERROR {rows[-1]['error']}", flush=True)
                torch.cuda.empty_cache()
                save()
                for key in [k for k in tk.TUNING_LOG if k not in printed]:
                    printed.add(key)
                    v = tk.TUNING_LOG[key]
                    times = ", ".join(f"{t['ms'] * 1e3:.1f}" + (f" (spills {t['spills']})" if t.get("spills") else "")
                                      if "ms" in t else ("same as %d" % t["same_as"] if "same_as" in t else "error")
                                      for t in v["tried"])
                    print(f"tuned {' '.join(map(str, key))}: chose {v['chosen']} of [{times}] us", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
