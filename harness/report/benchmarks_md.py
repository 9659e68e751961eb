"""BENCHMARKS.md: the generated block between its BEGIN and END markers; text outside them is kept.

The block is a header (what the columns mean) and one section per op, each between its own op
markers and carrying its own run line (device, date, command): a section is made from the rows of
the last of one or more bench results that has the op (`bench --from A.json --from B.json`, e.g.
one run per op), so its figures and speedups all come from one run.  Ops the new
results do not have keep their section from the existing file, so op sections can be refreshed one
run at a time.  Per op: one row per (case, implementation) with the median device time, the loop
figure and its host-bound mark, the binding ceiling (% of it, with TFLOP/s or GB/s), the peak extra
memory, and the speedup against each baseline library measured in the same run; then the variant
ladders and any IMPOSSIBLE flags.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path

from harness import status
from harness.report import cells
from harness.report.figures import add_figures, ladders, timed_ms
from harness.report.text import (by_case, by_op, ceilings_line, clock_line, device_line, esc, ladder_section, ms,
                                 size, timing_line, versions_line)

BEGIN = "<!-- gradoracle:benchmarks begin -->"
END = "<!-- gradoracle:benchmarks end -->"
OP_BEGIN = "<!-- gradoracle:op {} begin -->"
OP_END = "<!-- gradoracle:op {} end -->"
_OP_SECTION = re.compile(r"<!-- gradoracle:op (\S+) begin -->\n.*?<!-- gradoracle:op \1 end -->", re.S)


def _run_lines(results: dict) -> list:
    return [f"- **Device**: {device_line(results)}",
            f"- **SM clock**: {clock_line(results)}",
            f"- **Ceilings**: {ceilings_line(results)}",
            f"- **Timing**: {timing_line(results)}",
            f"- **Versions**: {versions_line(results)}",
            f"- **Command**: `{results.get('command', '')}`",
            f"- **Date**: {results.get('created')}"]


def _speedup(row, base) -> str:
    t, b = timed_ms(row), timed_ms(base) if base else None
    return f"{b / t:.2f}x" if t and b else "–"


def op_section(op: str, results: dict, orows: list, plots: list | None = None) -> str:
    """One op's section, markers included: its run, cost model, plots, the table, ladders, flags."""
    impls = list(OrderedDict.fromkeys(r["impl"] for r in orows))
    libs = [i for i in impls if any(r["impl"] == i and (r.get("library") or r.get("baseline")) for r in orows)]
    lines = [OP_BEGIN.format(op), f"## {op}", ""]
    lines += [f"Run: {device_line(results)}, {results.get('created')}; ceilings: {ceilings_line(results)}; "
              f"Command: `{results.get('command', '')}`", ""]
    model = (results.get("ops") or {}).get(op, {}).get("cost_model")
    if model:
        lines += ["Cost model: " + " ".join(model.split()), ""]
    for link in plots or []:
        lines.append(f"![{Path(link).stem}]({link})")
    if plots:
        lines.append("")
    lines += ["Median device time per call (throttled marked), loop figure (ms per call back to back; host-bound "
              "marked), "
              "% of the binding ceiling, peak extra memory, and speedup (same run) against each baseline library:",
              "", "| case | bytes | impl | time (ms) | loop (ms) | binding ceiling | peak mem | "
              + " | ".join(f"vs {b}" for b in libs) + (" |" if libs else "|"),
              "|---|---:|---|---:|---:|---:|---:|" + "---:|" * len(libs)]
    for case, crow in by_case(orows).items():
        by = {r["impl"]: r for r in crow}
        for k, r in enumerate(crow):
            if r["status"] == status.SKIP:
                continue
            time = ms(timed_ms(r)) + cells.throttled(r) if timed_ms(r) else cells.status(r)
            lines.append(f"| {esc(case) if k == 0 else ''} | {size(r['cost']['bytes']) if k == 0 else ''} | "
                         f"{r['impl']} | {time} | {cells.loop(r)} | {cells.binding(r)} | {cells.peak(r)} | "
                         + " | ".join("base" if b == r["impl"] else _speedup(r, by.get(b)) for b in libs)
                         + (" |" if libs else "|"))
    lines += ladder_section(orows, ladders(orows), op)
    lines += cells.flags(orows)
    lines.append(OP_END.format(op))
    return "\n".join(lines)


def latest_by_op(docs: list) -> dict:
    """op -> (document, its rows of the op), from the last document that has the op: a section's
    figures and speedups all come from one run."""
    out: dict = OrderedDict()
    for doc in docs:
        for op, orows in by_op(doc).items():
            out[op] = (doc, orows)
    return out


def benchmarks_md(results: dict | list, existing: str | None = None, plots: dict | None = None) -> str:
    """The generated block; replaces the block between the markers of `existing`, whose op sections
    for ops `results` lacks are kept.

    results: one bench results document or a list of them (one run per op, say).
    plots: op -> [relative link of a PNG], shown under the op's heading."""
    docs = results if isinstance(results, list) else [results]
    for d in docs:
        add_figures(d)
    kept: dict = OrderedDict()
    if existing and BEGIN in existing and END in existing:
        old = existing.split(BEGIN, 1)[1].split(END, 1)[0]
        kept = OrderedDict((m.group(1), m.group(0)) for m in _OP_SECTION.finditer(old))
    sections = OrderedDict(kept)
    fresh = latest_by_op(docs)
    for op, (doc, orows) in fresh.items():
        sections[op] = op_section(op, doc, orows, (plots or {}).get(op))
    lines = [BEGIN, "# Benchmarks", "",
             "_Generated by `python -m harness bench ... --benchmarks-md BENCHMARKS.md` (or `bench --from "
             "A/results.json --from B/results.json --benchmarks-md BENCHMARKS.md`, one run per op): each op section "
             "comes from one run, named in its Run line; sections of ops not in the new results are kept; text "
             "outside the markers is kept._", "",
             f"_Columns: {cells.RULES}._", ""]
    if len(docs) == 1 and set(sections) == set(fresh):  # the run's lines head the block only if it made every section
        lines += _run_lines(docs[0]) + [""]
    for op in sorted(sections):
        lines += [sections[op], ""]
    lines.append(END)
    block = "\n".join(lines) + "\n"
    if existing and BEGIN in existing and END in existing:
        head, rest = existing.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        return head + block.rstrip("\n") + tail if tail.strip() else head + block
    return block


def update_benchmarks_md(results: dict | list, path, plots_dir=None) -> Path:
    """Rewrite the generated block of `path`; with `plots_dir`, link the PNGs there (per op, by file name)."""
    path = Path(path)
    existing = path.read_text() if path.exists() else None
    docs = results if isinstance(results, list) else [results]
    plots: dict = {}
    if plots_dir is not None:
        ops = {r["op"] for d in docs for r in d.get("rows", [])}
        for png in sorted(Path(plots_dir).glob("*.png")):
            for op in ops:
                if png.stem.endswith(op) or f"_{op}_" in png.stem:
                    plots.setdefault(op, []).append(os.path.relpath(png, path.resolve().parent))
    path.write_text(benchmarks_md(docs, existing, plots))
    return path
