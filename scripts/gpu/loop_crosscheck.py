"""Cross-check bench's loop figure against an independent back-to-back timer, triton.testing.do_bench
(the timer issue 11 used to find the gap between device time and what a loop sees).

    python3 scripts/gpu/loop_crosscheck.py RESULTS.json [--impl triton --impl torch ...] [--max 8]

For each timed row of the given implementations (torch and cupy frameworks: do_bench syncs through
torch), the case is rebuilt from the row's case JSON, its timing inputs generated and uploaded as
bench does, and the implementation's unchecked entry timed by do_bench (median, L2 cleared between
calls by do_bench itself, no hold).  Prints per row: device time, loop figure, do_bench, and the
ratios do_bench / loop and do_bench / device.  Where the host is the bottleneck do_bench should
follow the loop figure, not the device time; otherwise all three agree.  Informational: exits 0.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--impl", action="append", default=None)
    parser.add_argument("--max", type=int, default=8)
    parser.add_argument("--device", default="cuda", help="cpu: dry run of the logic, timed by perf_counter")
    args = parser.parse_args()

    import time

    import numpy as np
    import torch

    if args.device.startswith("cuda"):
        from triton.testing import do_bench
    else:
        def do_bench(fn, warmup, rep, return_mode):
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return float(np.median(times))

    from cases.registry import from_json
    from harness import frameworks, prepare
    from harness.registry import discover, find_impl, get_op, timed_callable

    frameworks.interpret_triton_without_gpu()  # no GPU (the dry run): Triton's interpreter
    discover()
    rows = [r for r in json.loads(Path(args.results).read_text())["rows"]
            if r["status"] == "PASS" and (r.get("timing") or {}).get("loop_ms") and not r.get("flag")
            and r.get("framework") in (("torch", "cupy") if args.device.startswith("cuda") else ("torch",)) and (args.impl is None or r["backend"] in args.impl)]
    print(f"{'op':20} {'impl':14} {'case':44} {'device':>8} {'loop':>8} {'do_bench':>9} {'db/loop':>8} {'db/dev':>7}")
    for r in rows[: args.max]:
        case = from_json(r["case_json"], "results row")
        impl = find_impl(case.op, r["impl"])
        fw = frameworks.adapter(impl.backend.framework)
        host = prepare.generate(case, r.get("seed", 0), 1)
        flats = {k: fw.upload(t, args.device) for k, t in host.items()}
        views = {k: fw.view(flats[k], host[k]) for k in flats}
        shapes = get_op(case.op).shapes(case)
        outs = {o: fw.poisoned(shapes[o], case.dtype, args.device) for o in get_op(case.op).outputs_of(case)}
        impl.fn(views, outs, case.params)  # the checked entry once, then the thin one
        fn = timed_callable(impl)
        ms = do_bench(lambda: fn(views, outs, case.params), warmup=25, rep=100, return_mode="median")
        t = r["timing"]
        print(f"{r['op'][:20]:20} {r['impl'][:14]:14} {r['case'][:44]:44} {t['median']:8.4f} {t['loop_ms']:8.4f} "
              f"{ms:9.4f} {ms / t['loop_ms']:8.2f} {ms / t['median']:7.2f}")
        del flats, views, outs
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
