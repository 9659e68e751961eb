"""Case files of binary_backward's both-operands-broadcast cases (issue 15: cupy@best's bb_both),
for scripts/gpu/cuda_bb_both.sh:
    python scripts/gpu/bb_both_cases.py OUTDIR  ->  OUTDIR/both_full.json  (cases.full: a and b both
                                                    broadcast against grad_out)
                                                    OUTDIR/both_perf.json  (the perf cases among them)
Both broadcast: each of a and b has a dim of size 1 (or a missing leading dim) where grad_out's is
larger, so each gradient is a sum."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cases import select

OP = "binary_backward"


def _broadcasts(shape, out) -> bool:
    shape = [1] * (len(out) - len(shape)) + list(shape)
    return any(s == 1 and o > 1 for s, o in zip(shape, out))


def both_broadcast(case) -> bool:
    a, b = case.params["a"], case.params["b"]
    n = max(len(a), len(b))
    pa, pb = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = [max(x, y) for x, y in zip(pa, pb)]
    return _broadcasts(a, out) and _broadcasts(b, out)


def doc(cases) -> dict:
    return {"cases": [{"op": c.op, "dtype": c.dtype, "params": c.params, "tags": sorted(c.tags)} for c in cases]}


def main(out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    full = [c for c in select("full", op=OP) if both_broadcast(c)]
    perf = [c for c in select("perf", op=OP) if both_broadcast(c)]
    for name, cases in (("both_full", full), ("both_perf", perf)):
        Path(out, f"{name}.json").write_text(json.dumps(doc(cases), indent=1))
        print(f"{name}.json: {len(cases)} cases")


if __name__ == "__main__":
    main(sys.argv[1])
