"""Compile every norm kernel the cupy planner can launch, in parallel, on a CUDA machine.

cupy caches each compiled module on disk, keyed by source, options and name expression, so the
harness runs that follow (which compile one kernel at a time, on first use) find them there.
Each worker compiles through backends.cupy.common.function, exactly as the backend does.

    python scripts/gpu/cuda_norms_warm.py [--jobs N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends.cupy import _norm_plan as plan  # noqa: E402


def _compile(job: tuple[str, str]) -> tuple[str, float, str]:
    source, expr = job
    t0 = time.perf_counter()
    try:
        from backends.cupy.common import function

        function(source, expr, plan.compile_options())
        return expr, time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - report every failure, not the first
        return expr, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4))
    args = ap.parse_args()
    jobs = [(plan.SOURCES[op], expr) for op in (plan.LN, plan.RMS) for dt in plan.DTYPES
            for expr in plan.all_kernel_exprs(op, dt)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_compile, jobs))
    failed = [(e, err) for e, _, err in results if err]
    print(f"compiled {len(jobs) - len(failed)}/{len(jobs)} kernels in {time.perf_counter() - t0:.1f} s "
          f"({args.jobs} workers; slowest {max(t for _, t, _ in results):.1f} s)")
    for expr, err in failed:
        print(f"FAILED {expr}: {err[:2000]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
