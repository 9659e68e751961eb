"""`python -m harness merge OUT.json PART1.json PART2.json ...`: join the results of the parts of one
run -- `run --shard k/N` slices run by a cluster scheduler, `--resume` rounds, or `bench` runs --
into one results file and its report.

    python -m harness merge OUT.json[.gz] PART.json[.gz] ... [--report OUT.md]

`run` parts (their rows under "results"): a row is keyed by (op, impl, case, device); a later
part's row replaces an earlier one's (a resumed round re-runs what an interrupted one lacked).
The merged file has a run's results keys (harness/results.py `write_run`): the first part's header,
the status counts of the merged rows, `interrupted` None (a part cut short may have been resumed
by a later one: which parts were is in "parts_interrupted", their notes in order), plus
"merged_from" (the part files), "seeds" and "parts" (per part: its file, counts and interruption).  The report (OUT.md unless --report names another file): the counts, an op x
implementation matrix of statuses, and every failure with its reason and repro line.

`bench` parts (schema "gradoracle-bench/1", rows under "rows"): keyed by (op, case, impl), later
replacing earlier; the merged document keeps the first part's device, ceilings and config (a
merge of runs on different devices is refused), its figures recomputed, and its report is the
bench report.md (harness/report/markdown.py).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter, OrderedDict
from pathlib import Path

from harness import status
from harness.results import load_run

BENCH_SCHEMA = "gradoracle-bench/1"


def add_parser(sub) -> None:
    m = sub.add_parser("merge", help="join the results JSONs of a run's shards (--shard k/N) or rounds "
                                     "(--resume) into one results JSON and report")
    m.add_argument("out", help="the merged results JSON (.json or .json.gz)")
    m.add_argument("parts", nargs="+", help="results JSONs of `run --json` (shards, resumed rounds) or of `bench`")
    m.add_argument("--report", help="the markdown report (default: OUT with .md in place of .json[.gz])")


def merge_run(parts: list, sources: list) -> dict:
    """The merged `run` results document (see the module docstring)."""
    rows: dict = OrderedDict()
    for part in parts:
        for row in part.get("results", []):
            rows[(row["op"], row["impl"], row["case"], row.get("device"))] = row
    merged = sorted(rows.values(), key=lambda r: r["op"])  # op by op, as a single run prints them; stable within
    head = {k: v for k, v in parts[0].items() if k not in ("results", "counts", "interrupted")}
    return {**head, "counts": status.counts(r.get("status") for r in merged), "interrupted": None,
            "parts_interrupted": [p.get("interrupted") for p in parts],
            "merged_from": list(sources), "seeds": [p.get("seed") for p in parts],
            "parts": [{"file": src, "counts": p.get("counts"), "interrupted": p.get("interrupted")}
                      for src, p in zip(sources, parts)],
            "results": merged}


def merge_bench(parts: list, sources: list) -> dict:
    """One bench results document from several (see the module docstring)."""
    from harness.report.figures import add_figures

    names = {(p.get("device") or {}).get("name") for p in parts}
    if len(names) > 1:
        raise SystemExit(f"error: merge: the bench parts ran on different devices ({', '.join(map(str, names))}): "
                         "merge runs of one device")
    rows: dict = OrderedDict()
    for part in parts:
        for row in part.get("rows", []):
            rows[(row["op"], row["case"], row["impl"])] = row
    ops: dict = {}
    for part in parts:
        ops.update(part.get("ops") or {})
    notes = [f"{src}: {p['interrupted']}" for src, p in zip(sources, parts) if p.get("interrupted")]
    doc = {**parts[0], "rows": list(rows.values()), "ops": ops, "interrupted": "; ".join(notes),
           "merged_from": list(sources), "elapsed_s": round(sum(p.get("elapsed_s") or 0 for p in parts), 2)}
    return add_figures(doc)


def run_report(head: dict, rows: list) -> str:
    """Markdown of a merged run: counts, the op x implementation matrix, failures with repro lines."""
    counts = status.counts(r.get("status") for r in rows)
    lines = ["# gradoracle results (merged)", "",
             f"- parts: {', '.join(f'`{s}`' for s in head.get('merged_from', []))}",
             f"- device: {head.get('device_name') or head.get('device')}; cases: {head.get('cases')}; "
             f"seeds: {', '.join(str(s) for s in head.get('seeds', []))}",
             "- counts: " + ", ".join(f"{s} {n}" for s, n in counts.items() if n),
             "- parts cut short (a later part may have resumed them): "
             + (", ".join(f"`{p['file']}` ({p['interrupted']})" for p in head.get("parts", []) if p.get("interrupted"))
                or "none"), "",
             "| op | impl | " + " | ".join(s for s in status.ALL if counts.get(s)) + " |",
             "|---|---|" + "---:|" * sum(1 for s in status.ALL if counts.get(s))]
    cells: dict = OrderedDict()
    for r in rows:
        cells.setdefault((r["op"], r["impl"]), Counter())[r["status"]] += 1
    for (op, impl), c in cells.items():
        lines.append(f"| {op} | {impl} | " + " | ".join(str(c.get(s, 0) or "") for s in status.ALL if counts.get(s))
                     + " |")
    bad = [r for r in rows if r.get("status") in status.REPRO]
    if bad:
        lines += ["", "## Failures", ""]
        for r in bad:
            lines.append(f"- **{r['status']}** {r['op']} {r['impl']} `{r['case']}`: {r.get('reason', '')}")
            if r.get("repro"):
                lines.append(f"  - reproduce: `{r['repro']}`")
    return "\n".join(lines) + "\n"


def _report_path(out: str) -> Path:
    name = Path(out).name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return Path(out).with_name(name[: -len(suffix)] + ".md")
    return Path(out).with_name(name + ".md")


def write_json(path, doc: dict) -> None:
    """`doc` as JSON, gzip-compressed when the name ends in .gz, replaced atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(doc, indent=1, default=str).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    tmp.replace(path)


def cmd_merge(args) -> int:
    parts = [load_run(p) for p in args.parts]
    kinds = {p.get("schema") == BENCH_SCHEMA for p in parts}
    if len(kinds) > 1:
        raise SystemExit("error: merge: the parts mix `run` and `bench` results")
    report = Path(args.report) if args.report else _report_path(args.out)
    if kinds == {True}:
        from harness.report.markdown import markdown

        doc = merge_bench(parts, args.parts)
        rows, text = doc["rows"], markdown(doc)
    else:
        doc = merge_run(parts, args.parts)
        rows, text = doc["results"], run_report(doc, doc["results"])
    write_json(args.out, doc)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    counts = status.counts(r.get("status") for r in rows)
    print(f"{args.out}: {len(rows)} rows from {len(parts)} parts; "
          + ", ".join(f"{s} {n}" for s, n in counts.items() if n) + f"\nwrote {args.out}\nwrote {report}")
    return 0
