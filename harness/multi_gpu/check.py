"""Checking a split run: the rows of a `--gpus N` run against a single run of the same selection and
seed (`compare_runs`), and two pytest sessions by their --junitxml files (`compare_junit`)."""
from __future__ import annotations

from collections import Counter

from harness.status import counts


def row_key(row: dict) -> tuple:
    return (row["op"], row["impl"], row["case"], row.get("dtype"))


def _figures(row: dict) -> list:
    """Per output: passed, max_rel, worst_ratio; equal when the same inputs gave the same bits."""
    return [(o.get("name"), o.get("passed"), o.get("max_rel"), o.get("worst_ratio")) for o in row.get("outputs") or []]


def compare_runs(one: dict, two: dict, wall_one: float | None = None, wall_two: float | None = None) -> dict:
    """`one` (a single run) against `two` (a --gpus run): same rows, same verdicts, and how the rows spread.

    The verdict `ok` needs: both runs complete (not interrupted, every worker exited 0 or 1), the
    same set of (op, impl, case, dtype) rows, no row twice, the same status on every row, and
    every worker of `two` holding rows (on a GPU: as many distinct GPUs as workers)."""
    rows1, rows2 = one.get("results", []), two.get("results", [])
    dup1, dup2 = ([k for k, n in Counter(map(row_key, rows)).items() if n > 1] for rows in (rows1, rows2))
    by1, by2 = {row_key(r): r for r in rows1}, {row_key(r): r for r in rows2}
    common = [k for k in by1 if k in by2]
    differ = [(k, by1[k]["status"], by2[k]["status"]) for k in common if by1[k]["status"] != by2[k]["status"]]
    same_figures = sum(_figures(by1[k]) == _figures(by2[k]) for k in common)

    def spread(field: str) -> dict:
        rows, cases = {}, {}
        for r in rows2:
            at = "none" if r.get(field) is None else str(r.get(field))
            rows[at] = rows.get(at, 0) + 1
            cases.setdefault(at, set()).add((r["op"], r["case"]))
        return {at: {"rows": n, "cases": len(cases[at])} for at, n in sorted(rows.items())}

    workers = two.get("workers") or []
    n_workers = two.get("gpus") or len(workers)
    per_gpu, per_worker = spread("gpu"), spread("worker")
    gpus_used = sorted(g for g in per_gpu if g != "none")
    on_gpu = str(two.get("device", "")).startswith("cuda")
    split = n_workers >= 2 and len([w for w in per_worker if w != "none"]) == n_workers \
        and (not on_gpu or len(gpus_used) == n_workers)
    incomplete = [f"{name}: {data.get('interrupted')}" for name, data in (("one", one), ("two", two))
                  if data.get("interrupted")]
    incomplete += [f"two: worker {w.get('worker')} exit status {w.get('exit_code')}" for w in workers
                   if w.get("exit_code") not in (0, 1, 5)]  # 5: all of its shard skipped (run_report)
    identical = not differ and not dup1 and not dup2 and set(by1) == set(by2)
    speedup = wall_one / wall_two if wall_one and wall_two else None
    # one cut short, two complete: one would have taken longer, so the speedup is at least this
    lower_bound = bool(speedup and one.get("interrupted") and not two.get("interrupted"))
    return {
        "ok": identical and split and not incomplete,
        "identical": identical, "split": split, "incomplete": incomplete,
        "rows_one": len(rows1), "rows_two": len(rows2), "common": len(common),
        "only_in_one": [list(k) for k in by1 if k not in by2],
        "only_in_two": [list(k) for k in by2 if k not in by1],
        "duplicates_one": [list(k) for k in dup1], "duplicates_two": [list(k) for k in dup2],
        "status_differs": [[*k, s1, s2] for k, s1, s2 in differ],
        "same_error_figures": same_figures,
        "counts_one": counts(r.get("status") for r in rows1), "counts_two": counts(r.get("status") for r in rows2),
        "seeds": [one.get("seed"), two.get("seed")], "device": two.get("device"),
        "device_name": [one.get("device_name"), two.get("device_name")],
        "workers": n_workers, "gpus_used": gpus_used, "per_gpu": per_gpu, "per_worker": per_worker,
        "worker_exit": [w.get("exit_code") for w in workers],
        "wall_one_s": wall_one, "wall_two_s": wall_two, "speedup": speedup, "speedup_is_lower_bound": lower_bound,
    }


def format_comparison(c: dict, show: int = 20) -> str:
    """The comparison as the lines of a summary."""
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    lines = [f"rows: one {c['rows_one']}, two {c['rows_two']}, in both {c['common']}; seeds {c['seeds']}",
             f"verdicts identical: {yes(c['identical'])} ({len(c['status_differs'])} status differences, "
             f"{len(c['only_in_one'])} rows only in one, {len(c['only_in_two'])} only in two, "
             f"{len(c['duplicates_one']) + len(c['duplicates_two'])} duplicated); error figures bit-equal on "
             f"{c['same_error_figures']}/{c['common']} rows",
             "counts one: " + ", ".join(f"{s} {n}" for s, n in c["counts_one"].items() if n),
             "counts two: " + ", ".join(f"{s} {n}" for s, n in c["counts_two"].items() if n),
             f"split over {c['workers']} workers: {yes(c['split'])}; device {c['device']}, "
             f"GPUs used {','.join(c['gpus_used']) or '-'}; worker exit statuses {c['worker_exit']}"]
    for field in ("per_gpu", "per_worker"):
        lines.append(f"  {field.replace('_', ' ')}: " + "; ".join(
            f"{at}: {v['rows']} rows, {v['cases']} cases" for at, v in c[field].items()))
    if c["wall_one_s"] and c["wall_two_s"]:
        lines.append(f"wall: one {c['wall_one_s']:.1f}s, two {c['wall_two_s']:.1f}s, speedup "
                     f"{'at least ' if c.get('speedup_is_lower_bound') else ''}{c['speedup']:.2f}x")
    for note in c["incomplete"]:
        lines.append(f"INCOMPLETE {note}")
    for label, key in (("status differs", "status_differs"), ("only in one", "only_in_one"),
                       ("only in two", "only_in_two"), ("duplicated in one", "duplicates_one"),
                       ("duplicated in two", "duplicates_two")):
        for item in c[key][:show]:
            lines.append(f"  {label}: {' | '.join(map(str, item))}")
        if len(c[key]) > show:
            lines.append(f"  {label}: ... {len(c[key]) - show} more")
    lines.append(f"verdict: {'OK' if c['ok'] else 'NOT OK'}")
    return "\n".join(lines)


def read_junit(path) -> dict:
    """test id (classname::name) -> passed | failed | error | skipped, from a pytest --junitxml file."""
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = ("error" if "error" in kinds else "failed" if "failure" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        out[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return out


def compare_junit(a: dict, b: dict) -> dict:
    """Two pytest sessions' outcomes (read_junit): the counts and the tests whose outcome differs."""
    def outcomes(d):
        return {k: sum(v == k for v in d.values()) for k in ("passed", "failed", "error", "skipped")}

    differ = sorted((t, a.get(t, "absent"), b.get(t, "absent")) for t in set(a) | set(b) if a.get(t) != b.get(t))
    return {"same": not differ, "counts_a": outcomes(a), "counts_b": outcomes(b), "differ": [list(d) for d in differ]}
