"""A TFLOP/s table of a `harness bench` results.json, one row per case, for the GPU scripts' summaries.

    python scripts/gpu/tflops_table.py RESULTS --impl A --impl B ... [--ratio A/B ...] [--host IMPL] [--markdown]

Columns: each --impl's TFLOP/s (its status where it has no figure), then each --ratio A/B (TFLOP/s of
A over B); --host IMPL flags rows where that implementation's host time per call exceeds its device time.
A figure whose samples all ran throttled (below 95% of the run's top SM clock) is marked: "(throttled)"
in the markdown cell, "throttled: IMPL ..." after the text row.
--markdown: the same table as a BENCHMARKS.md table (a "host > device" column with --host).
"""
from __future__ import annotations

import argparse
import gzip
import json
from typing import NamedTuple


class Cell(NamedTuple):
    """What the table reads of one implementation's row of one case."""
    status: str
    median: float | None
    tflops: float | None
    host: float | None
    throttled: bool


NONE = Cell("-", None, None, None, False)  # an implementation with no row for the case


def table(results: str, impls: list, ratios: list, host: str | None = None, markdown: bool = False) -> list[str]:
    opener = gzip.open if results.endswith(".gz") else open
    with opener(results, "rt") as f:
        rows = json.load(f)["rows"]
    by: dict = {}
    for r in rows:
        t, f = r.get("timing") or {}, r.get("figures") or {}
        by.setdefault(r["case"], {})[r["impl"]] = Cell(r["status"], t.get("median"), f.get("tflops"),
                                                       t.get("host_ms"), bool(t.get("throttled_all")))
    width = max([12] + [len(i) + 1 for i in impls])
    if markdown:
        head = ["case", *impls, *ratios] + (["host > device"] if host else [])
        lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    else:
        lines = [f"{'case':64s} " + " ".join(f"{i:>{width}s}" for i in impls) + "  "
                 + " ".join(f"{r:>12s}" for r in ratios) + "  (TFLOP/s)"]
    for case, d in by.items():
        figs, rs, flag, hot = _row(d, impls, ratios, host)
        if markdown:
            cells = [(f"{v:.1f}" + (" (throttled)" if i in hot else "")) if isinstance(v, float) else v
                     for i, v in zip(impls, figs)] + \
                [f"{v:.2f}" if v is not None else "-" for v in rs] + \
                ([{True: "yes", False: "no", None: "-"}[flag]] if host else [])
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
        else:
            cells = " ".join(f"{v:{width}.1f}" if isinstance(v, float) else f"{v:>{width}s}" for v in figs)
            text = " ".join(f"{v:12.2f}" if v is not None else f"{'-':>12s}" for v in rs)
            lines.append(f"{case:64s} {cells}  {text}{'  host>device' if flag else ''}"
                         + (f"  throttled: {' '.join(hot)}" if hot else ""))
    return lines


def _row(d: dict, impls: list, ratios: list, host: str | None) -> tuple:
    """One case's cells: each impl's TFLOP/s (its status, or "-", where it has none), each ratio (None
    where a side has no figure), whether host's host time exceeds its device time (None: unknown), and
    the impls whose samples all ran throttled."""
    cell = {i: d.get(i, NONE) for i in impls}
    figs = [float(c.tflops) if c.tflops else c.status for c in cell.values()]
    rs = []
    for spec in ratios:
        a, b = (cell[x].tflops for x in spec.split("/"))
        rs.append(a / b if a and b else None)
    flag = None
    if host:
        h, dev = d.get(host, NONE).host, d.get(host, NONE).median  # host need not be among impls
        flag = h > dev if h and dev else None
    return figs, rs, flag, [i for i in impls if cell[i].throttled]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--impl", action="append", required=True)
    ap.add_argument("--ratio", action="append", default=[], help="A/B: TFLOP/s of impl A over impl B")
    ap.add_argument("--host", help="flag rows where this impl's host time exceeds its device time")
    ap.add_argument("--markdown", action="store_true", help="a BENCHMARKS.md table")
    args = ap.parse_args(argv)
    for spec in args.ratio:
        if spec.count("/") != 1 or any(x not in args.impl for x in spec.split("/")):
            ap.error(f"--ratio {spec!r}: expected A/B with both among --impl")
    print("\n".join(table(args.results, args.impl, args.ratio, args.host, args.markdown)))


if __name__ == "__main__":
    main()
