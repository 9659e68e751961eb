"""`python -m harness.multi_gpu compare ONE.json TWO.json` and `compare-junit A.xml B.xml`
(scripts/gpu_multi.sh): see harness/multi_gpu/check.py."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.multi_gpu.check import compare_junit, compare_runs, format_comparison, read_junit
from harness.results import load_run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.multi_gpu",
                                     description="check a `harness run --gpus N` against a single run, or two "
                                                 "pytest sessions (-n N against -n 1) by their --junitxml files")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="ONE (single run) against TWO (--gpus run) of the same selection and seed")
    c.add_argument("one")
    c.add_argument("two")
    c.add_argument("--wall-one", type=float, help="seconds the single run took (for the speedup)")
    c.add_argument("--wall-two", type=float, help="seconds the --gpus run took")
    c.add_argument("--json", help="write the comparison here")
    c.add_argument("--show", type=int, default=20, help="list at most this many differing rows of each kind")
    j = sub.add_parser("compare-junit", help="two pytest --junitxml files: same outcome for every test?")
    j.add_argument("a")
    j.add_argument("b")
    j.add_argument("--show", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "compare":
        result = compare_runs(load_run(args.one), load_run(args.two), args.wall_one, args.wall_two)
        print(format_comparison(result, args.show))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    result = compare_junit(read_junit(args.a), read_junit(args.b))
    print(f"{args.a}: " + ", ".join(f"{n} {k}" for k, n in result["counts_a"].items()))
    print(f"{args.b}: " + ", ".join(f"{n} {k}" for k, n in result["counts_b"].items()))
    for t, a, b in result["differ"][:args.show]:
        print(f"  differs: {t}: {a} / {b}")
    print(f"same outcome for every test: {'yes' if result['same'] else 'NO'} ({len(result['differ'])} differ)")
    return 0 if result["same"] else 1
