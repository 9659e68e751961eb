"""Cells of the bench tables (report.md, BENCHMARKS.md) for the figures beside the time: the
throttled mark, the loop figure with its host-bound mark, the binding ceiling, the peak extra memory,
and the flag of an impossible figure."""
from __future__ import annotations

from harness.report.figures import timed_ms
from harness.report.text import esc

HOST_BOUND = "host-bound"
THROTTLED = "throttled"
RULES = (f"{THROTTLED} (beside a time): every sample ran below 95% of the run's top SM clock, after a rest and a "
         "second try (the clock the samples ran at beside it), so the row is slower than the same kernel at the "
         "clock of the others; "
         "loop: per call, N back-to-back calls with no hold, flush or sync between them (one sync at the end); "
         f"{HOST_BOUND}: the host needs longer to queue a call than the GPU to run it (host time > device time, "
         "or loop > 1.1 x device time), so a training loop sees the loop figure, not the device time; "
         "binding ceiling: the roof the case's arithmetic intensity puts it under (flops/bytes above the ridge "
         "matmul/copy: % of the matmul roof, with TFLOP/s; else % of the copy roof, with GB/s); "
         "peak mem: device memory one call allocates beyond its inputs and outputs; "
         "IMPOSSIBLE: faster than the datasheet allows, a timing or cost-model error, not a result")


def _ms(x) -> str:
    return "–" if x is None else f"{x:.4g}" if x >= 0.001 else f"{x:.3g}"


def throttled(row) -> str:
    """' (throttled, 1635 MHz)' where every sample of the row ran under the throttle clock, else ''."""
    t = row.get("timing") or {}
    if not t.get("throttled_all"):
        return ""
    mhz = (t.get("clocks") or {}).get("median_mhz")
    return f" ({THROTTLED}, {mhz:.0f} MHz)" if mhz else f" ({THROTTLED})"


def loop(row) -> str:
    """The loop figure in ms, with the host-bound mark."""
    t, f = row.get("timing") or {}, row.get("figures") or {}
    if timed_ms(row) is None:
        return "–"
    return _ms(t.get("loop_ms")) + (f" ({HOST_BOUND})" if f.get("host_bound") else "")  # host > device, loop or not


def binding(row) -> str:
    """'% of the binding roof' with its rate: '41% mm, 330 TFLOP/s' or '78% copy, 2600 GB/s'."""
    f = row.get("figures") or {}
    if timed_ms(row) is None or f.get("pct_binding") is None:
        return "–"
    if f.get("binding") == "matmul":
        return f"{f['pct_binding']:.0f}% mm, {f.get('tflops', 0):.3g} TFLOP/s"
    return f"{f['pct_binding']:.0f}% copy, {f.get('gbs', 0):.4g} GB/s"


def peak(row) -> str:
    """Peak extra device memory of one call; n/a where it was not measured."""
    n = (row.get("timing") or {}).get("peak_extra_bytes")
    if n is None:
        return "n/a" if row.get("timing") else "–"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} B"


def status(row) -> str:
    """The row's status, with IMPOSSIBLE when its time is flagged."""
    return row["status"] + (" IMPOSSIBLE" if row.get("flag") else "")


def flags(rows) -> list:
    """Markdown lines listing the rows flagged IMPOSSIBLE with the reason (none if there are none)."""
    bad = [r for r in rows if r.get("flag")]
    if not bad:
        return []
    return ["", "### Impossible figures (not results)", ""] + [
        f"- {r['impl']} {esc(r['case'])}: {esc(r['flag'])} (median {_ms((r.get('timing') or {}).get('median'))} ms)"
        for r in bad]


def console(rows) -> list:
    """The bench command's closing table: per timed or flagged row, device time, loop figure and
    mark, binding ceiling, peak extra memory (plain text, one line each)."""
    shown = [r for r in rows if timed_ms(r) is not None or r.get("flag")]
    if not shown:
        return []
    width = min(max(len(r["case"]) for r in shown), 60)
    head = (f"{'op':20} {'impl':16} {'case':{width}} {'time ms':>9} {'loop ms':>20} {'binding ceiling':>26} "
            f"{'peak mem':>10}")
    out = [head]
    for r in shown:
        t = timed_ms(r)
        out.append(f"{r['op'][:20]:20} {r['impl'][:16]:16} {r['case'][:width]:{width}} "
                   f"{(_ms(t) + throttled(r)) if t else 'IMPOSSIBLE':>9} {loop(r):>20} {binding(r):>26} {peak(r):>10}")
    return out
