"""The lines and cells both markdown reports (report.md, BENCHMARKS.md) share: the device, clock,
ceilings, timing-rule and versions lines, number formats, rows grouped by op and case, and the
variant-ladder table."""
from __future__ import annotations

import math
from collections import OrderedDict

from harness.report.figures import timed_ms
from harness.timing import COLD_SETS_BYTES


def num(x, fmt=".3g", none="–") -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return none
    return format(x, fmt)


def rate(x) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def ms(x) -> str:
    if x is None:
        return "–"
    return f"{x:.4g}" if x >= 0.001 else f"{x:.3g}"


def host(t: dict) -> str:
    """Host time to queue one call; marked ! when it exceeds the device time (launch-bound in a loop)."""
    host, med = t.get("host_ms"), t.get("median")
    if host is None:
        return "–"
    return ms(host) + (" !" if t.get("hold_ms") and med and host > med else "")


def size(n) -> str:
    if n is None:
        return "–"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} B"


def esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def device_line(results: dict) -> str:
    d = results.get("device") or {}
    if d.get("kind") == "cuda":
        extra = [f"{d.get('sms')} SMs", f"L2 {size(d.get('l2_bytes'))}", f"{size(d.get('memory_bytes'))}",
                 f"sm_{str(d.get('capability', '')).replace('.', '')}", f"CUDA {d.get('cuda')}"]
        if d.get("driver"):
            extra.append(f"driver {d['driver']}")
        return f"{d.get('name')} ({', '.join(extra)})"
    return f"{d.get('name')} (CPU, {d.get('cores')} cores)"


def clock_line(results: dict) -> str:
    readings, dropped = [], 0
    for r in results.get("rows", []):
        c = (r.get("timing") or {}).get("clocks") or {}
        if c.get("median_mhz"):
            readings.append(c["median_mhz"])
        dropped += (r.get("timing") or {}).get("dropped", 0) or 0
    clock = results.get("clock") or {}
    if not readings:
        return "not read (no NVML / CPU run)" if clock.get("source") in (None, "none") else "no readings"
    readings.sort()
    med = readings[len(readings) // 2]
    text = (f"median {med:.0f} MHz across measurements (range {readings[0]:.0f}–{readings[-1]:.0f}), "
            f"highest seen {num(clock.get('max_seen_mhz'), '.0f')}")
    if clock.get("max_supported_mhz"):
        text += f", max supported {clock['max_supported_mhz']:.0f}"
    return text + f" ({clock.get('source')}); throttled samples dropped: {dropped}"


def ceilings_line(results: dict) -> str:
    c = results.get("ceilings") or {}
    if not c:
        return "not measured"
    parts = []
    if c.get("copy"):
        parts.append(f"copy {c['copy']['gbs']:.0f} GB/s (read+write, {size(c['copy'].get('bytes_each'))} buffers)")
    for key in ("bf16", "fp32"):
        m = (c.get("matmul") or {}).get(key)
        if m:
            parts.append(f"matmul {m.get('name', key)} {m['tflops']:.3g} TFLOP/s ({m.get('n')}³)")
    return "; ".join(parts) + (f"; measured {c.get('measured_at')}" if c.get("measured_at") else "")


def timing_line(results: dict) -> str:
    cfg = results.get("config") or {}
    text = (f"mode {cfg.get('mode')}; stop when the 95% CI of the median is within ±{100 * cfg.get('rel_ci', 0):.2g}% "
            f"({cfg.get('min_samples')}–{cfg.get('max_samples')} samples, {cfg.get('budget_s')} s budget); "
            f"warm-up until two calls agree within {100 * cfg.get('warmup_rtol', 0):.2g}%; "
            f"samples under {100 * cfg.get('throttle', 0):.0f}% of the top SM clock dropped")
    if cfg.get("hold", False) and (results.get("device") or {}).get("kind") == "cuda":
        text += ("; device time: the GPU spins before each sample's flush until the host has queued the call; "
                 "JAX (own streams and threads): its GPU busy time from CUPTI, kernels of the call only; "
                 "host = time to queue one call (JAX: wall time of the blocking call), ! where it exceeds the device time")
    if cfg.get("mode") == "cold" and cfg.get("cold_sets", 1) > 1:
        text += (f"; samples rotate over up to {cfg['cold_sets']} input allocations "
                 f"(at most {COLD_SETS_BYTES >> 20} MiB in all)")
    above = cfg.get("sample_above")
    text += ("; the final timed call re-validated against the oracle"
             + (f" (outputs over {above} elements on a 1M-element sample + a full NaN count)" if above else ""))
    return text


def versions_line(results: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in (results.get("versions") or {}).items())


def by_op(results):
    seen = OrderedDict()
    for r in results.get("rows", []):
        seen.setdefault(r["op"], []).append(r)
    return seen


def by_case(rows):
    seen = OrderedDict()
    for r in rows:
        seen.setdefault(r["case"], []).append(r)
    return seen


def ladder_section(rows: list, ladder: dict, op: str) -> list:
    """Per ladder of `op`: a `version | time | GB/s | % of peak | speedup` table and the ref/opt lines."""
    lines = []
    for (lop, backend), order in ladder.items():
        if lop != op:
            continue
        lines += ["", f"### Variant ladder: {backend} ({' → '.join(order)})", "",
                  "| case | version | time (ms) | GB/s | % of peak | speedup |", "|---|---|---:|---:|---:|---:|"]
        pairs: dict = {k: [] for k in range(1, len(order))}  # rung k against the first (the seed's compare lines)
        for case, crow in by_case(rows).items():
            members = {r["impl"]: r for r in crow if r["impl"] in order}
            if not members:
                continue
            for k, impl in enumerate(order):
                r = members.get(impl)
                if r is None:
                    continue
                f = r.get("figures") or {}
                sp = f.get("speedup_vs_ladder_ref")
                lines.append(f"| {esc(case) if k == 0 else ''} | {impl} | {ms(timed_ms(r)) if timed_ms(r) else r['status']} | "
                             f"{rate(f.get('gbs'))} | {rate(f.get('pct_roofline'))} | "
                             f"{num(sp, '.2f') + 'x' if sp else '–'} |")
            for k in range(1, len(order)):
                if all(i in members and timed_ms(members[i]) for i in (order[0], order[k])):
                    ref, opt = members[order[0]], members[order[k]]
                    pairs[k].append(f"- {esc(case)}: time_ref = {ms(timed_ms(ref))} ms  time_opt = {ms(timed_ms(opt))} "
                                    f"ms  speedup = {timed_ms(ref) / timed_ms(opt):.2f}x")
        lines.append("")
        lines.append("% of peak: the roofline's lower bound on the time, max(bytes / copy, flops / matmul), "
                     "over the measured time (for a memory-bound op, the % of the copy ceiling).")
        for k, found in pairs.items():
            if found:
                lines += ["", f"{order[0]} (ref) vs {order[k]} (opt):", ""] + found
    return lines


# ----------------------------------------------------------------------------- the terminal: `run`'s closing matrix

# One letter per verdict in a matrix cell; PASS is the bare leading number.
MATRIX_LETTERS = (("FAIL", "F"), ("ERROR", "E"), ("CRASH", "C"), ("TIMEOUT", "T"), ("XFAIL", "x"), ("XPASS", "X"),
                  ("SKIP", "S"))


def _cell(counts: dict) -> str:
    """'12' (passed), then each other verdict that occurred: '10 2F 1S'; '·' when nothing ran."""
    if not counts:
        return "·"
    parts = [str(counts.get("PASS", 0))] + [f"{counts[s]}{letter}" for s, letter in MATRIX_LETTERS if counts.get(s)]
    return " ".join(parts)


def status_matrix(rows) -> list[str]:
    """The implementation x op matrix of verdict counts that ends `harness run` (plain text lines).

    rows: (op, impl, status) triples.  A cell is 'P nF nE ...' (PASS count, then the others that
    occurred, letters in MATRIX_LETTERS); ops head the columns without their '_backward' suffix."""
    ops, impls, cells = [], [], {}
    for op, impl, verdict in rows:
        if op not in ops:
            ops.append(op)
        if impl not in impls:
            impls.append(impl)
        cell = cells.setdefault((impl, op), {})
        cell[verdict] = cell.get(verdict, 0) + 1
    if not ops:
        return []
    heads = [op.removesuffix("_backward") for op in ops]
    table = [[_cell(cells.get((impl, op), {})) for op in ops] for impl in impls]
    corner = "impl \\ op"
    first = max(len(corner), *(len(i) for i in impls))
    widths = [max(len(h), *(len(r[k]) for r in table)) for k, h in enumerate(heads)]
    lines = ["  ".join([f"{corner:{first}}"] + [f"{h:>{w}}" for h, w in zip(heads, widths)])]
    for impl, r in zip(impls, table):
        lines.append("  ".join([f"{impl:{first}}"] + [f"{c:>{w}}" for c, w in zip(r, widths)]))
    legend = ", ".join(f"{letter} {s}" for s, letter in MATRIX_LETTERS)
    return lines + [f"(cells: PASS count, then {legend}; · nothing ran)"]
