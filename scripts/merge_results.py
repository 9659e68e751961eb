"""Merge `harness run --json` result files (.json or .json.gz) into one, e.g. the shards and
resumed rounds of a long run.  A row is keyed by (op, impl, case, device); a later file's row
replaces an earlier one's.  The header is the first file's, with the seeds, sources and
interruption notes of all of them.

    python scripts/merge_results.py OUT.json.gz IN1.json[.gz] IN2.json[.gz] ...
"""
from __future__ import annotations

import gzip
import json
import sys
from collections import Counter


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def merge(datas: list[dict], sources: list[str]) -> dict:
    rows: dict = {}
    for data in datas:
        for row in data.get("results", []):
            rows[(row["op"], row["impl"], row["case"], row.get("device"))] = row
    head = {k: v for k, v in datas[0].items() if k != "results"}
    merged = list(rows.values())
    counts = Counter(r["status"] for r in merged)
    head.update(seed=[d.get("seed") for d in datas], merged_from=sources,
                interrupted=None, parts_interrupted=[d.get("interrupted") for d in datas],
                counts={s: counts.get(s, 0) for s in sorted(set(counts) | set(head.get("counts", {})))})
    return {**head, "results": merged}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, ins = argv[1], argv[2:]
    merged = merge([load(p) for p in ins], ins)
    opener = gzip.open if out.endswith(".gz") else open
    with opener(out, "wt") as f:
        json.dump(merged, f, indent=None, separators=(",", ":"))
    print(f"{out}: {len(merged['results'])} rows {merged['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
