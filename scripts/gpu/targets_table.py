"""The issues' target summary of a `harness bench` results file: per op and implementation, the
cases at the % of copy bar, min / median % of copy, host-bound rows (harness.timing.host_bound), and
the speedup over each baseline (min / median over the same cases).  Markdown on stdout.

    python scripts/gpu/targets_table.py RESULTS.json[.gz] --bar 85 [--dtype bf16 --dtype f32]
        [--impl triton --impl cupy@best ...] [--base torch --base torch_compile]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.report.files import load  # noqa: E402
from harness.timing import host_bound  # noqa: E402


def summary(rows: list, bar: float, dtypes: list, impls: list, bases: list) -> list[str]:
    rows = [r for r in rows if r["status"] == "PASS" and (not dtypes or r["dtype"] in dtypes)]
    by: dict = {}
    for r in rows:
        by.setdefault(r["op"], {}).setdefault(r["impl"], {})[r["case"]] = r
    impls = impls or sorted({r["impl"] for r in rows})
    out = [f"| op ({bar:g}% of copy) | impl | at the bar | min / median % copy | host-bound | "
           + " | ".join(f"x {b} (min / median)" for b in bases) + " |",
           "|---|---|---|---|---|" + "---|" * len(bases)]
    for op, per in sorted(by.items()):
        for impl in impls:
            got = per.get(impl)
            if not got:
                continue
            pct = [r["figures"]["pct_copy"] for r in got.values()]
            hb = sum(host_bound(r["timing"]) for r in got.values())
            cells = []
            for b in bases:
                ratios = [per[b][c]["timing"]["median"] / r["timing"]["median"]
                          for c, r in got.items() if c in per.get(b, {})]
                cells.append(f"{min(ratios):.2f} / {statistics.median(ratios):.2f}" if ratios else "-")
            out.append(f"| {op} | {impl} | {sum(p >= bar for p in pct)}/{len(pct)} | {min(pct):.1f} / "
                       f"{statistics.median(pct):.1f} | {hb} | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--bar", type=float, required=True, help="%% of the copy ceiling")
    ap.add_argument("--dtype", action="append", default=[], help="only these dtypes (the bar's)")
    ap.add_argument("--impl", action="append", default=[], help="rows for these (default: every impl)")
    ap.add_argument("--base", action="append", default=[], help="speedup columns over these")
    a = ap.parse_args(argv)
    print("\n".join(summary(load(a.results)["rows"], a.bar, a.dtype, a.impl, a.base)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
