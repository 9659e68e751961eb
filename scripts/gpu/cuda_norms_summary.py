"""Summary of a scripts/gpu/cuda_norms.sh run: correctness tallies and the norm targets.

    python scripts/gpu/cuda_norms_summary.py OUT_DIR

Reads OUT_DIR/*.json from `harness run --json` (status per implementation) and
OUT_DIR/bench_*/results.json from `harness bench --report` (figures), and prints:
  * PASS / FAIL / ... counts per implementation, and every row that did not pass;
  * per timed case: each implementation's median, GB/s, % of copy, speedup against torch;
  * the issue's targets for cupy@best: >= 85% of copy for N from 1024 to 8192 and >= 3x torch
    eager, each case marked met or MISSED.
"""
from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def _n_of(case_json) -> int | None:
    try:
        return int(case_json["params"]["shape"][-1])
    except (KeyError, TypeError, IndexError, ValueError):
        return None


def correctness(out: Path) -> None:
    for path in sorted(out.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        rows = doc.get("results")
        if not isinstance(rows, list):
            continue
        print(f"== {path.name}: {len(rows)} results")
        by_impl: dict = defaultdict(Counter)
        for r in rows:
            by_impl[r["impl"]][r["status"]] += 1
        for impl, counts in sorted(by_impl.items()):
            print(f"   {impl:16} " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for r in rows:
            if r["status"] not in ("PASS", "SKIP", "XFAIL", "XPASS"):
                print(f"   {r['status']:6} {r['impl']:14} {r['case']}  {str(r.get('reason', ''))[:200]}")


def bench(out: Path) -> None:
    for path in sorted(out.glob("bench_*/results.json")):
        doc = json.loads(path.read_text())
        rows = doc.get("rows", [])
        print(f"\n== {path.parent.name}: {len(rows)} rows"
              + (f" (interrupted: {doc['interrupted']})" if doc.get("interrupted") else ""))
        by_case: dict = defaultdict(list)
        for r in rows:
            by_case[(r["op"], r["case"])].append(r)
        targets = []
        for (op, case), rs in by_case.items():
            print(f"   {case}")
            for r in sorted(rs, key=lambda r: r["impl"]):
                t, f = r.get("timing") or {}, r.get("figures") or {}
                med = t.get("median")
                if med is None:
                    print(f"      {r['impl']:16} {r['status']:5} {str(r.get('reason', ''))[:120]}")
                    continue
                sp = f.get("speedup_vs_baseline")
                lad = f.get("speedup_vs_ladder_ref")
                print(f"      {r['impl']:16} {med * 1e3:9.2f} us  {f.get('gbs', 0):7.0f} GB/s  "
                      f"{f.get('pct_copy', 0):5.1f}% copy  x{sp or 0:5.2f} vs torch"
                      + (f"  x{lad:7.1f} vs {f.get('ladder_ref')}" if lad else "")
                      + f"  host {(t.get('host_ms') or 0) * 1e3:6.1f} us  {r['status']}")
                if r["impl"] == "cupy@best":
                    targets.append((case, _n_of(r.get("case_json")), f.get("pct_copy"), sp, r["status"]))
        if targets:
            print("   targets for cupy@best (>= 85% of copy for N in [1024, 8192]; >= 3x torch):")
            for case, n, pct, sp, status in targets:
                in_range = n is not None and 1024 <= n <= 8192
                bw = "n/a" if not in_range else ("met" if pct and pct >= 85 else "MISSED")
                x3 = "met" if sp and sp >= 3 else ("MISSED" if sp else "no torch figure")
                print(f"      {case:44} N={n}  copy {pct or 0:5.1f}% [{bw}]  x{sp or 0:4.2f} torch [{x3}]  {status}")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    correctness(out)
    bench(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
