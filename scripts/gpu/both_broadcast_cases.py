"""Write the registry's binary_backward cases in which BOTH operands broadcast as a case file
(for `harness run/bench --cases FILE`), for scripts/gpu/bb_both.sh.

    python scripts/gpu/both_broadcast_cases.py full OUT.json   # the full cases, checked
    python scripts/gpu/both_broadcast_cases.py perf OUT.json   # the perf cases, benched

An operand broadcasts when its shape, padded on the left with 1s, differs from the output's
(so a scalar or a size-1 dim against a wider one counts; the plain no-broadcast case does not).
Prints how many cases it kept of how many it read.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cases.registry import select  # noqa: E402
from oracle.broadcast import broadcast_shape  # noqa: E402

OP = "binary_backward"


def broadcasts(shape, out) -> bool:
    """Whether an operand of `shape` is broadcast to `out`."""
    return (1,) * (len(out) - len(shape)) + tuple(shape) != tuple(out)


def both_broadcast(case) -> bool:
    a, b = case.params["a"], case.params["b"]
    out = broadcast_shape(a, b)
    return broadcasts(a, out) and broadcasts(b, out)


def main(tag: str, path: str) -> None:
    found = select(tag, op=OP)
    kept = [c for c in found if both_broadcast(c)]
    Path(path).write_text(json.dumps({"cases": [c.to_json() for c in kept]}, indent=1) + "\n")
    print(f"{path}: {len(kept)} of {len(found)} {tag} {OP} cases (both operands broadcast)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
