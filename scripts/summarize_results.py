"""Print a markdown table of the row counts (PASS/FAIL/SKIP/ERROR, and CRASH/TIMEOUT when any)
of `harness run --json` result files (.json or .json.gz), one line per file plus a total.
A file whose run was cut short says so in the last column (its `interrupted` note, or the
notes of the merged parts that were, for files made by `python -m harness merge`).

    python scripts/summarize_results.py results/h100/baselines-full/*.json.gz
    python scripts/summarize_results.py --by-impl FILE...   # one line per (file, implementation)
"""
from __future__ import annotations

import gzip
import json
import os
import sys
from collections import Counter

STATUSES = ("PASS", "FAIL", "SKIP", "ERROR")
EXTRA = ("CRASH", "TIMEOUT")  # columns only when some file has them (harness run --isolate)


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def note(data: dict) -> str:
    """'' for a complete run; else why it is not (or was not before a merge completed it)."""
    if data.get("interrupted"):
        return f"interrupted: {data['interrupted']}"
    parts = [p for p in data.get("parts_interrupted") or [] if p]
    if parts:
        return f"merged; {len(parts)} of {len(data['parts_interrupted'])} parts were interrupted, later parts resumed them"
    return ""


def summarize(paths: list[str], by_impl: bool = False) -> str:
    lines = []
    for path in paths:
        data = load(path)
        groups: dict[str, Counter] = {}
        for row in data.get("results", []):
            key = row.get("impl", "?") if by_impl else ""
            groups.setdefault(key, Counter())[row["status"]] += 1
        for key in sorted(groups) or [""]:
            lines.append((os.path.basename(path), key, groups.get(key, Counter()), note(data)))
    cols = STATUSES + tuple(s for s in EXTRA if any(c[s] for _, _, c, _ in lines))
    total = sum((c for _, _, c, _ in lines), Counter())
    head = ["file"] + (["impl"] if by_impl else []) + list(cols) + ["rows", "note"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, key, c, why in lines + [("**total**", "", total, "")]:
        cells = [name] + ([key] if by_impl else []) + [str(c[s]) for s in cols] + [str(sum(c.values())), why]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    by_impl = "--by-impl" in argv
    paths = [a for a in argv[1:] if a != "--by-impl"]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    print(summarize(paths, by_impl))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
