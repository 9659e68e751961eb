"""report.md of one bench run: the run's header lines, then per op its cost model, plots, a table of
every (case, impl) with its figures, the variant ladders, failures with their repro lines, skips."""
from __future__ import annotations

from pathlib import Path

from harness import status
from harness.report import cells
from harness.report.figures import ladders, timed_ms
from harness.report.text import (by_case, by_op, ceilings_line, clock_line, device_line, esc, host, ladder_section,
                                 ms, num, rate, timing_line, versions_line)


def markdown(results: dict, plots: list | None = None) -> str:
    rows = results.get("rows", [])
    always = (status.PASS, status.FAIL, status.ERROR, status.SKIP)
    counts = {s: n for s, n in status.counts(r["status"] for r in rows).items() if n or s in always}
    lines = ["# gradoracle benchmark report", "",
             f"- device: {device_line(results)}",
             f"- SM clock: {clock_line(results)}",
             f"- ceilings: {ceilings_line(results)}",
             f"- timing: {timing_line(results)}",
             f"- columns: {cells.RULES}",
             f"- command: `{results.get('command', '')}`",
             f"- versions: {versions_line(results)}",
             f"- created {results.get('created')}, {results.get('elapsed_s')} s; "
             + ", ".join(f"{k} {v}" for k, v in counts.items())
             + (f"; stopped early: {results['interrupted']}" if results.get("interrupted") else "")]
    ladder = ladders(rows)
    plots = [Path(p) for p in (plots or [])]
    for op, orows in by_op(results).items():
        lines += ["", f"## {op}", ""]
        model = (results.get("ops") or {}).get(op, {}).get("cost_model")
        if model:
            lines += ["Cost model: " + " ".join(model.split()), ""]
        for p in plots:
            if p.stem.endswith(op) or f"_{op}_" in p.stem:
                lines.append(f"![{p.stem}](plots/{p.name})")
        lines += ["", "| case | impl | status | time (ms) | loop (ms) | binding ceiling | peak mem | 95% CI (ms) | "
                  "p10–p90 (ms) | GB/s | % copy | TFLOP/s | % matmul | % roofline | vs baseline | host (ms) | "
                  "n (dropped) | mode |",
                  "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for case, crow in by_case(orows).items():
            for k, r in enumerate(crow):
                t, f = r.get("timing") or {}, r.get("figures") or {}
                timed = timed_ms(r) is not None
                sp = f.get("speedup_vs_baseline")
                mode = (t.get("mode") or "") + (f" ({t.get('stop')})" if t.get("stop") else "")
                if t.get("fallback"):
                    mode += " *"
                lines.append(
                    f"| {esc(case) if k == 0 else ''} | {r['impl']}{' (baseline)' if r.get('baseline') else ''} | "
                    f"{cells.status(r)} | {ms(t.get('median')) + cells.throttled(r) if timed else '–'} | "
                    f"{cells.loop(r)} | "
                    f"{cells.binding(r)} | {cells.peak(r)} | "
                    + (f"{ms(t.get('ci_lo'))}–{ms(t.get('ci_hi'))} | {ms(t.get('p10'))}–{ms(t.get('p90'))} | "
                       if timed else "– | – | ")
                    + f"{rate(f.get('gbs'))} | {rate(f.get('pct_copy'))} | {num(f.get('tflops'), '.3g')} | "
                    f"{num(f.get('pct_matmul'), '.2g')} | {rate(f.get('pct_roofline'))} | "
                    f"{num(sp, '.2f') + 'x' if sp else '–'} | {host(t) if timed else '–'} | "
                    f"{str(t.get('n', '–')) + ' (' + str(t.get('dropped', 0)) + ')' if timed else '–'} | {mode} |")
        lines += ladder_section(orows, ladder, op)
        lines += cells.flags(orows)
        fallbacks = sorted({(r['impl'], (r.get('timing') or {}).get('fallback')) for r in orows
                            if (r.get('timing') or {}).get('fallback')})
        if fallbacks:
            lines += ["", "\\* mode fallbacks:"] + [f"- {i}: {why}" for i, why in fallbacks]
        bad = [r for r in orows if r["status"] in status.REPRO]
        if bad:
            lines += ["", "### Failures", ""]
            for r in bad:
                lines.append(f"- **{r['status']}** {r['impl']} {esc(r['case'])}: {esc(r['reason'])}")
                for o in r.get("outputs", []):
                    if not o.get("passed"):
                        lines.append(f"  - [{o['name']}] {esc(o.get('message', ''))} (err/tol {num(o.get('worst_ratio'))})")
                lines.append(f"  - reproduce: `{r.get('repro', '')}`")
        skips: dict = {}
        for r in orows:
            if r["status"] == status.SKIP:
                skips[r["reason"]] = skips.get(r["reason"], 0) + 1
        if skips:
            lines += ["", "### Skipped", ""] + [f"- {n} × {esc(why)}" for why, n in sorted(skips.items())]
    return "\n".join(lines) + "\n"
