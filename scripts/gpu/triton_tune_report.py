"""The final tables of scripts/gpu/triton_tune.sh, from its bench results and kernel probe.

    python scripts/gpu/triton_tune_report.py --bench DIR [--variants DIR ...] [--info kernels.json]
                                             [--misses LIST] [--bar binary_backward=88 --bar reduce_sum=92]

1. Per perf case of the `triton` backend (bench DIR/results.json): status, median ms, % of the
   copy ceiling, the bar, host ms per call (! over the device time) and the main kernel's
   registers, programs per SM and grid (from the probe's kernels.json).
2. Per case benched with variants (each --variants DIR): % of copy of every implementation
   side by side (triton = the tuned default, triton@<preset> = a pinned sizing), the best marked.
3. --presets: the probe's quick event timings (back to back, no L2 flush) of every preset per
   focus case, with the main kernel's registers: a ranking, not a figure to quote.
--misses writes the cases under their bar as "<op> triton <json case>" lines, the input of
scripts/gpu/profile_cases.sh.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BARS = {"binary_backward": 88.0, "reduce_sum": 92.0}


def _rows(path: Path) -> list[dict]:
    f = path / "results.json"
    return json.loads(f.read_text())["rows"] if f.exists() else []


def _figures(r: dict) -> tuple:
    t, f = r.get("timing") or {}, r.get("figures") or {}
    return t.get("median"), f.get("pct_copy"), t.get("host_ms")


def _kernels(info: Path | None) -> dict:
    """case id -> main launch of the default (tuned) plan, from the probe."""
    if not info or not info.exists():
        return {}
    out = {}
    for row in json.loads(info.read_text()).get("rows", []):
        if row.get("preset") == "(default)" and row.get("launches"):
            out[row["case"]] = row["launches"][0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True)
    ap.add_argument("--variants", type=Path, action="append", default=[])
    ap.add_argument("--info", type=Path)
    ap.add_argument("--presets", type=Path, help="the probe's quick timings of every preset (kernels-presets.json)")
    ap.add_argument("--misses", type=Path)
    ap.add_argument("--bar", action="append", default=[], help="op=percent (default binary_backward=88, reduce_sum=92)")
    args = ap.parse_args(argv)
    bars = dict(BARS, **{k: float(v) for k, v in (b.split("=") for b in args.bar)})
    kernels = _kernels(args.info)

    rows = [r for r in _rows(args.bench) if r["impl"] == "triton"]
    print(f"{'op':15s} {'case':50s} {'status':6s} {'ms':>8s} {'%copy':>6s} {'bar':>4s} {'host_ms':>8s}  "
          f"{'kernel':14s} {'regs':>4s} {'occ':>3s} {'grid':>6s}")
    misses, lows = [], {}
    for r in rows:
        ms, pct, host = _figures(r)
        bar = bars.get(r["op"], 0.0)
        k = kernels.get(r["case"], {})
        over = bool(host and ms and host > ms)
        flag = ("  < bar" if pct is not None and pct < bar else "") + ("  host > device" if over else "")
        print(f"{r['op']:15s} {r['case']:50s} {r['status']:6s} {ms or 0:8.4f} {pct or 0:6.1f} {bar:4.0f} "
              f"{host or 0:8.4f}{'!' if host and ms and host > ms else ' '} {k.get('kernel', '-')[:14]:14s} "
              f"{k.get('regs', '-'):>4} {k.get('occupancy', '-'):>3} {k.get('grid', '-'):>6}{flag}")
        if pct is not None and pct < bar:
            misses.append(r)
        if pct is not None:
            lows.setdefault(r["op"], []).append((pct, r["case"]))
    for op, v in lows.items():
        under = sum(1 for p, _ in v if p < bars.get(op, 0))
        print(f"{op}: {len(v)} timed, lowest {min(v)[0]:.1f}% ({min(v)[1]}), {under} under {bars.get(op, 0):.0f}%")
    if args.misses:
        args.misses.write_text("".join(f"{r['op']} triton {json.dumps(r['case_json'], separators=(',', ':'))}\n"
                                       for r in misses))

    for vdir in args.variants:
        vrows = _rows(vdir)
        if not vrows:
            continue
        impls = sorted({r["impl"] for r in vrows}, key=lambda i: (i != "triton", i))
        print(f"\n-- side by side ({vdir.name}): % of copy; * = best")
        print(f"{'case':50s} " + " ".join(f"{i.replace('triton@', '@')[:15]:>15s}" for i in impls))
        by_case: dict = {}
        for r in vrows:
            by_case.setdefault(r["case"], {})[r["impl"]] = r
        for case, got in by_case.items():
            pcts = {i: _figures(got[i])[1] if i in got and got[i]["status"] == "PASS" else None for i in impls}
            best = max((p for p in pcts.values() if p is not None), default=None)
            cells = []
            for i in impls:
                p = pcts[i]
                status = got[i]["status"] if i in got else "-"
                cells.append(f"{(f'{p:.1f}' + ('*' if p == best else ' ')) if p is not None else status:>15s}")
            print(f"{case:50s} " + " ".join(cells))

    if args.presets and args.presets.exists():
        prow = [r for r in json.loads(args.presets.read_text()).get("rows", []) if "pct_copy" in r]
        for op in dict.fromkeys(r["op"] for r in prow):
            rows_op = [r for r in prow if r["op"] == op]
            names = list(dict.fromkeys(r["preset"] for r in rows_op))
            print(f"\n-- {op} presets, quick timing (% of copy / registers of the main kernel); * = best")
            print(f"{'case':50s} " + " ".join(f"{n[:15]:>15s}" for n in names))
            by_case: dict = {}
            for r in rows_op:
                by_case.setdefault(r["case"], {})[r["preset"]] = r
            for case, got in by_case.items():
                best = max(r["pct_copy"] for r in got.values())
                cells = []
                for n in names:
                    r = got.get(n)
                    regs = (r["launches"][0].get("regs", "?") if r.get("launches") else "?") if r else ""
                    cell = f"{r['pct_copy']}{'*' if r['pct_copy'] == best else ' '}/{regs}" if r else "-"
                    cells.append(f"{cell:>15s}")
                print(f"{case:50s} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
