"""Run-to-run verdicts of `harness compare A B` for each (op, case, impl) timed in both, B against A,
from the spreads each run recorded (no fixed percentage: a noisy measurement needs a larger change):

  SAME             the 95% confidence intervals of the two medians overlap: the runs cannot
                   tell the medians apart;
  FASTER / SLOWER  the intervals are disjoint and so are the p10–p90 spreads of the samples:
                   most calls of one beat most calls of the other;
  AMBIGUOUS        the medians' intervals are disjoint but the p10–p90 spreads overlap: a
                   shift smaller than the call-to-call spread, real for these samples but
                   inside what one more run could move.

The summary adds the fraction of pairs whose medians agree within 2%.
"""
from __future__ import annotations

from harness.report.figures import timed_ms

VERDICTS = ("FASTER", "SLOWER", "SAME", "AMBIGUOUS")


def verdict(a: dict, b: dict) -> str:
    """B against A from their timing summaries (ci_lo, ci_hi, p10, p90): see the module docstring."""
    if b["ci_lo"] <= a["ci_hi"] and a["ci_lo"] <= b["ci_hi"]:
        return "SAME"
    if b["p90"] < a["p10"]:
        return "FASTER"
    if b["p10"] > a["p90"]:
        return "SLOWER"
    return "AMBIGUOUS"


def compare(a: dict, b: dict, agree: float = 0.02) -> dict:
    """Verdicts for every (op, case, impl) in either results document, and a summary."""
    index_a = {(r["op"], r["case"], r["impl"]): r for r in a.get("rows", [])}
    index_b = {(r["op"], r["case"], r["impl"]): r for r in b.get("rows", [])}
    rows = []
    for key in list(index_a) + [k for k in index_b if k not in index_a]:
        ra, rb = index_a.get(key), index_b.get(key)
        entry = {"op": key[0], "case": key[1], "impl": key[2]}
        if ra is None or rb is None:
            entry["verdict"] = "ONLY_A" if rb is None else "ONLY_B"
        elif timed_ms(ra) is None or timed_ms(rb) is None:
            entry["verdict"] = "NOT_TIMED"
            entry["status"] = f"{ra['status']}/{rb['status']}"
        else:
            ta, tb = ra["timing"], rb["timing"]
            entry.update(verdict=verdict(ta, tb), a_ms=ta["median"], b_ms=tb["median"],
                         a_ci=[ta["ci_lo"], ta["ci_hi"]], b_ci=[tb["ci_lo"], tb["ci_hi"]],
                         ratio=tb["median"] / ta["median"])
            entry["within"] = abs(entry["ratio"] - 1) <= agree
        rows.append(entry)
    timed = [r for r in rows if r["verdict"] in VERDICTS]
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS + ("NOT_TIMED", "ONLY_A", "ONLY_B")}
    within = sum(1 for r in timed if r["within"])
    warnings = []
    for what, get in (("device", lambda d: (d.get("device") or {}).get("name")),
                      ("mode", lambda d: (d.get("config") or {}).get("mode"))):
        if get(a) != get(b):
            warnings.append(f"{what} differs: {get(a)} vs {get(b)}")
    return {"rows": rows, "warnings": warnings,
            "summary": {"compared": len(timed), "counts": counts, "agree_within": agree, "within": within,
                        "fraction_within": within / len(timed) if timed else None}}


def format_compare(result: dict, name_a: str = "A", name_b: str = "B", show_all: bool = False) -> str:
    lines = [f"A = {name_a}", f"B = {name_b}"] + [f"warning: {w}" for w in result["warnings"]]
    lines.append(f"{'verdict':10} {'A ms':>10} {'B ms':>10} {'B/A':>7}  op / impl / case")
    for r in result["rows"]:
        if not show_all and r["verdict"] == "SAME":
            continue
        if r["verdict"] in VERDICTS:
            lines.append(f"{r['verdict']:10} {r['a_ms']:10.4g} {r['b_ms']:10.4g} {r['ratio']:7.3f}  "
                         f"{r['op']} / {r['impl']} / {r['case']}")
        else:
            lines.append(f"{r['verdict']:10} {'':10} {'':10} {'':7}  {r['op']} / {r['impl']} / {r['case']}"
                         + (f" ({r['status']})" if r.get("status") else ""))
    s = result["summary"]
    c = s["counts"]
    frac = s["fraction_within"]
    lines.append(f"summary: {s['compared']} timed in both: FASTER {c['FASTER']}, SLOWER {c['SLOWER']}, "
                 f"SAME {c['SAME']}, AMBIGUOUS {c['AMBIGUOUS']}; not timed {c['NOT_TIMED']}, only in A {c['ONLY_A']}, "
                 f"only in B {c['ONLY_B']}")
    lines.append(f"medians within {100 * s['agree_within']:.0f}%: {s['within']}/{s['compared']} = "
                 + (f"{100 * frac:.1f}%" if frac is not None else "n/a"))
    return "\n".join(lines)
