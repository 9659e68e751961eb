"""Figures per row of a bench run: time (median ms), GB/s and % of the copy ceiling, TFLOP/s and % of
the matmul ceiling (bf16 roof for 16-bit dtypes, fp32 for f32/f64), arithmetic intensity, % of the
roofline (`ceilings.figures`), speedup against the op's baseline implementation measured in the
same run, and, for a backend with several variants (a ladder such as cupy@naive, cupy@opt),
speedup against the ladder's first variant: one named naive, ref, reference, baseline or default
if there is one, else the first registered.

Each row also gets: `binding` and `pct_binding`, the roof that bounds the case and the % of it
(harness/ceilings.py: by arithmetic intensity against the ridge point); `host_bound` and
`loop_ratio` (the loop figure over the device time; harness/timing.py `host_bound`); and
`peak_extra_bytes` (device memory one call needs beyond its inputs and outputs).  A row whose time
is faster than the hardware allows gets `flag` "IMPOSSIBLE: ..." (harness/ceilings.py `impossible`)
and counts as untimed everywhere (`timed_ms` is None): no rates, no speedups, not plotted.
"""
from __future__ import annotations

from collections import OrderedDict

from harness import ceilings as _ceilings
from harness import status
from harness.timing import host_bound

REF_NAMES = ("naive", "ref", "reference", "baseline", "default")


def timed_ms(row) -> float | None:
    """The row's median time in ms, if it passed and was timed."""
    t = row.get("timing") or {}
    return t.get("median") if row.get("status") == status.PASS and t.get("median") and not row.get("flag") else None


def from_dram(row, device: dict) -> bool:
    """Whether every byte a timed call reads had to come from DRAM: cold mode (L2 flushed), or input
    sets rotated over at least 2 x L2 (graph mode's rotation)."""
    t = row.get("timing") or {}
    if t.get("mode") == "cold":
        return True
    l2 = (device or {}).get("l2_bytes")
    return bool(l2 and (t.get("rotate") or 1) * (row.get("footprint_bytes") or 0) >= 2 * l2)


def ladders(rows) -> dict:
    """{(op, backend): [impl ids in ladder order]} for backends with two or more variants in the run."""
    found: dict = OrderedDict()
    for r in rows:
        found.setdefault((r["op"], r["backend"]), {})[r["impl"]] = (r.get("variant", ""), r.get("variant_rank", 0))
    out = {}
    for key, impls in found.items():
        if len(impls) >= 2:
            out[key] = sorted(impls, key=lambda i: (impls[i][0] not in REF_NAMES, impls[i][1], i))
    return out


def add_figures(results: dict) -> dict:
    """Fill each row's `figures` (see the module docstring); returns `results`."""
    rows = results.get("rows", [])
    ceil = results.get("ceilings")
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r["op"], r["case"]), {})[r["impl"]] = r
    ladder = ladders(rows)
    figs = {}
    for r in rows:  # first every row's own figures and flag: speedups only between real results
        r.pop("flag", None)
        tm = r.get("timing") or {}
        raw = tm.get("median") if r.get("status") == status.PASS else None
        fig = _ceilings.figures(r["cost"]["bytes"], r["cost"]["flops"], raw, ceil, r["dtype"],
                                dram=from_dram(r, results.get("device")))
        if fig.get("impossible"):
            r["flag"] = fig["impossible"]
        if raw and not fig.get("impossible"):
            fig["host_bound"] = host_bound(tm)
            if tm.get("loop_ms"):
                fig["loop_ratio"] = tm["loop_ms"] / raw
            if tm.get("b2b_ms"):  # back to back with no host gap: what the GPU alone adds in a loop
                fig["b2b_ratio"] = tm["b2b_ms"] / raw
        if tm.get("peak_extra_bytes") is not None:
            fig["peak_extra_bytes"] = tm["peak_extra_bytes"]
        figs[id(r)] = fig
    for r in rows:
        t = timed_ms(r)
        fig = figs[id(r)]
        peers = by_case[(r["op"], r["case"])]
        base = next((p for p in peers.values() if p.get("baseline")), None)
        if t and base is not None and timed_ms(base):
            fig["baseline"] = base["impl"]
            fig["speedup_vs_baseline"] = timed_ms(base) / t
        order = ladder.get((r["op"], r["backend"]))
        if t and order:
            ref = peers.get(order[0])
            fig["ladder_ref"] = order[0]
            if ref is not None and timed_ms(ref):
                fig["speedup_vs_ladder_ref"] = timed_ms(ref) / t
        r["figures"] = fig
    return results
