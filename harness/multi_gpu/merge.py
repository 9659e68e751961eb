"""Merging the `--gpus` workers' results: one list of rows in the order a single run would print
them (resumed rows first, then op by op and case by case), each new row with the "gpu" and
"worker" it ran on, written as one run's JSON plus "gpus" and "workers"."""
from __future__ import annotations

import json
from pathlib import Path

from harness.results import CaseResult, write_run
from harness.selection import select


def load(path: Path) -> dict | None:
    """A worker's JSON, or None: not written yet, or caught mid-write (workers replace the file atomically)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def merge(worker_jsons: list, pins: list, resumed_rows: list, order: dict) -> list[dict]:
    """One list of rows (their JSON): the resumed ones, then every worker's new ones in single-run order.

    order: (op, case id) -> rank in the selection.  Each new row gets "gpu" and "worker"."""
    done = {(r["impl"], r["case"]) for r in resumed_rows}
    rows = []
    for k, data in enumerate(worker_jsons):
        for row in (data or {}).get("results", []):
            if (row["impl"], row["case"]) in done:
                continue
            done.add((row["impl"], row["case"]))
            result = CaseResult.from_json(row)
            result.extra.update(gpu=pins[k], worker=k)
            rows.append(result.to_json())
    rows.sort(key=lambda r: order.get((r["op"], r["case"]), (-1,)))  # stable: impl order within a case stays
    return list(resumed_rows) + rows


def selection_order(args) -> dict:
    """(op, case id) -> (position,) in a single run of the same selection (harness/selection.py, op by op)."""
    pairs = select(args.cases, args.op, args.dtype, None, by_op=True)
    return {(c.op, c.id): (i,) for i, (c, _) in enumerate(pairs)}


def write(path: str, rows: list[dict], args, device: str, pins: list, procs: list, paths: list,
          state: str | None) -> None:
    """The merged JSON: a single run's keys (taken from the first worker that wrote any) plus "workers"."""
    first = next((d for d in map(load, paths) if d), {})
    workers = []
    for k, (p, wpath) in enumerate(zip(procs, paths)):
        data = load(wpath) or {}
        workers.append({"worker": k, "gpu": pins[k], "shard": f"{k}/{len(procs)}", "exit_code": p.poll(),
                        "counts": data.get("counts"), "interrupted": data.get("interrupted")})
    head = {"device": device, "device_name": first.get("device_name"), "cases": args.cases, "seed": args.seed,
            "oracle": args.oracle, "versions": first.get("versions")}
    write_run(path, head, rows, state, gpus=len(procs), workers=workers)
