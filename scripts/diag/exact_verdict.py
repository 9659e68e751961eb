"""Each implementation's error on a case's random inputs and on its exact-arithmetic set, side by side.

`harness run` stops at the first failing check, so a case that fails on its random inputs never
shows its exact-set margin.  This prints both, whatever the verdicts (harness/exact.py):

    python scripts/diag/exact_verdict.py --backend jax --device cuda --seed 3 \\
        --case '{"op": "binary_backward", "dtype": "bf16",
                 "params": {"fn": "sub", "a": [1, 1, 1], "b": [8, 2048, 4097]}}'
    python scripts/diag/exact_verdict.py --backend torch --cases smoke --op reduce_sum --json out.json

One line per (implementation, case, input set, output): PASS/FAIL, err/tol, and the worst element.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cases import select  # noqa: E402
from harness import exact, frameworks, guards  # noqa: E402
from harness.registry import discover, impls_for  # noqa: E402
from harness.runner import judge, prepare  # noqa: E402


def verdicts(impl, case, device: str, seed: int) -> list[dict]:
    rows = []
    sets = [("random", prepare(case, seed, "auto", device))]
    if exact.outputs(case):
        sets.append(("exact", exact.prepare(case, seed, "auto", device)))
    for name, prepared in sets:
        try:
            outs, found = guards.GuardedCall(impl, case, device, prepared.inputs).call()
            reports = judge(impl, prepared, case, outs) + found
        except (ValueError, TypeError, NotImplementedError) as exc:
            rows.append({"impl": impl.id, "case": case.id, "set": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for r in reports:
            rows.append({"impl": impl.id, "case": case.id, "set": name, "output": r.name, "passed": r.passed,
                         "exact": r.name in prepared.exact, "err_tol": r.worst_ratio, "message": r.message})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", action="append", required=True, help="backend or backend@variant (repeatable)")
    parser.add_argument("--case", "--cases", dest="cases", default="smoke", help="a case set, a file, or a JSON case")
    parser.add_argument("--op", action="append")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    frameworks.interpret_triton_without_gpu()
    discover()
    device = frameworks.default_device() if args.device == "auto" else args.device
    rows = []
    for case in select(args.cases):
        if args.op and case.op not in args.op:
            continue
        for impl in impls_for(case.op):
            if (impl.id in args.backend or impl.backend.name in args.backend) and not impl.skip_reason(case, device):
                for row in verdicts(impl, case, device, args.seed):
                    rows.append(row)
                    verdict = row.get("error") or (f"{'PASS' if row['passed'] else 'FAIL'} err/tol={row['err_tol']:.4g}"
                                                   f"{' (exact)' if row['exact'] else ''} {row['message']}")
                    print(f"{row['impl']:16} {row['case']:48} {row['set']:6} {row.get('output', ''):8} {verdict}",
                          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "seed": args.seed, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
