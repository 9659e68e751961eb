"""Wall and CPU time of `harness run` with and without crash isolation (issue 11 item 3).

    python scripts/isolation_overhead.py [--repeats 5] [-- RUN ARGS...]   (default: --cases smoke --backend torch_ext --device cpu)

Runs the same selection alternately with --no-isolate and with the default (isolated: a worker
process), `repeats` times each, and prints the medians and the overhead.  CPU time counts the
worker (a waited-for child).  On a shared machine compare the medians of several repeats.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def once(args: list[str]) -> tuple[float, float]:
    before = os.times()
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = os.times()
    if out.returncode not in (0, 1):
        raise SystemExit(f"harness run {' '.join(args)} exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("run_args", nargs="*", default=["--cases", "smoke", "--backend", "torch_ext", "--device", "cpu"])
    opts = parser.parse_args()
    base = opts.run_args + ["--seed", "5"]
    times = {"in-process": [], "isolated": []}
    for _ in range(opts.repeats):
        times["in-process"].append(once(base + ["--no-isolate"]))
        times["isolated"].append(once(base))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    for k, (wall, cpu) in med.items():
        print(f"{k:10}  wall median {wall:6.2f} s  cpu median {cpu:6.2f} s  "
              f"(walls: {', '.join(f'{w:.2f}' for w, _ in times[k])})")
    (w0, c0), (w1, c1) = med["in-process"], med["isolated"]
    print(f"overhead: wall {100 * (w1 / w0 - 1):+.1f}%  cpu {100 * (c1 / c0 - 1):+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
