"""Which pairs of a `full` selection no result file has a PASS for: the cases left after time-limited
shards, written as a case file the next device call can run.

    python scripts/gpu/full_left.py --op conv_backward_data --backend cupy@best [--cases full] \
        [--out left.json] RESULT.json ...

RESULT: `harness run --json` files (their "results"), `harness bench` documents (their "rows"), or
`harness run` logs (their "PASS op impl case" lines: runs whose JSON was lost or not kept).
Prints, per implementation, pairs passed / pairs selected, then the pairs without a PASS.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.results import load_run  # noqa: E402
from harness.selection import select  # noqa: E402


def _load(path: str) -> list:
    if path.endswith(".log"):
        with open(path, errors="replace") as f:
            return [dict(zip(("status", "op", "impl", "case"), line.split()[:4])) for line in f
                    if line.startswith("PASS ") and len(line.split()) >= 4]
    doc = load_run(path)
    return doc.get("results") or doc.get("rows") or []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", action="append", required=True)
    ap.add_argument("--backend", action="append", required=True)
    ap.add_argument("--cases", default="full")
    ap.add_argument("--out", help="write the cases with a pair left to this case file")
    ap.add_argument("results", nargs="+")
    args = ap.parse_args(argv)
    passed = {(r["op"], r["impl"], r["case"]) for p in args.results for r in _load(p) if r.get("status") == "PASS"}
    counts, left = collections.Counter(), {}
    for case, impls in select(args.cases, args.op, None, args.backend):
        for impl in impls:
            counts[impl.id, "all"] += 1
            if (case.op, impl.id, case.id) in passed:
                counts[impl.id, "pass"] += 1
            else:
                left.setdefault(case.id, (case, []))[1].append(impl.id)
    for impl in sorted({k for k, _ in counts}):
        print(f"{impl}: {counts[impl, 'pass']}/{counts[impl, 'all']} PASS")
    for cid, (_, impls) in left.items():
        print(f"  left: {cid} ({', '.join(impls)})")
    if args.out:
        Path(args.out).write_text(json.dumps({"cases": [c.to_json() for c, _ in left.values()]}, indent=1) + "\n")
        print(f"wrote {args.out} ({len(left)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
