"""Benchmark results: figures, results.json, report.md, plots, BENCHMARKS.md, and run-to-run verdicts.

results.json (schema "gradoracle-bench/1") holds everything a report is made from, so
every report can be regenerated from it (`bench --from results.json`):
  command, created, device, versions, ceilings (harness/ceilings.py), config (timing
  rules), clock, ops (each op's cost model), elapsed_s, interrupted, and rows: one per
  (op, case, impl) with status, reason, outputs (the re-validation), cost {bytes, flops},
  timing (harness.timing.Samples.to_json(): median, min, max, p10/p25/p75/p90, the 95% CI
  of the median, samples, dropped (throttled) samples, mode, clocks, warm-up) and figures.

Figures per row: time (median ms), GB/s and % of the copy ceiling, TFLOP/s and % of the
matmul ceiling (bf16 roof for 16-bit dtypes, fp32 for f32/f64), arithmetic intensity,
% of the roofline (`ceilings.figures`), speedup against the op's baseline implementation
measured in the same run, and, for a backend with several variants (a ladder such as
cupy@naive, cupy@opt), speedup against the ladder's first variant: one named naive, ref,
reference, baseline or default if there is one, else the first registered.

Verdicts of `compare A B` for each (op, case, impl) timed in both, B against A, from the
spreads each run recorded (no fixed percentage: a noisy measurement needs a larger change):
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

import json
import math
import os
import re
from collections import OrderedDict
from pathlib import Path

from harness import ceilings as _ceilings
from harness.timing import COLD_SETS_BYTES

SCHEMA = "gradoracle-bench/1"
REF_NAMES = ("naive", "ref", "reference", "baseline", "default")
VERDICTS = ("FASTER", "SLOWER", "SAME", "AMBIGUOUS")
BEGIN = "<!-- gradoracle:benchmarks begin -->"
END = "<!-- gradoracle:benchmarks end -->"


# ----------------------------------------------------------------------------- figures


def _t(row) -> float | None:
    t = row.get("timing") or {}
    return t.get("median") if row.get("status") == "PASS" and t.get("median") else None


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
    for r in rows:
        t = _t(r)
        fig = _ceilings.figures(r["cost"]["bytes"], r["cost"]["flops"], t, ceil, r["dtype"])
        peers = by_case[(r["op"], r["case"])]
        base = next((p for p in peers.values() if p.get("baseline")), None)
        if t and base is not None and _t(base):
            fig["baseline"] = base["impl"]
            fig["speedup_vs_baseline"] = _t(base) / t
        order = ladder.get((r["op"], r["backend"]))
        if t and order:
            ref = peers.get(order[0])
            fig["ladder_ref"] = order[0]
            if ref is not None and _t(ref):
                fig["speedup_vs_ladder_ref"] = _t(ref) / t
        r["figures"] = fig
    return results


# ----------------------------------------------------------------------------- formatting helpers


def _num(x, fmt=".3g", none="–") -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return none
    return format(x, fmt)


def _rate(x) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def _ms(x) -> str:
    if x is None:
        return "–"
    return f"{x:.4g}" if x >= 0.001 else f"{x:.3g}"


def _host(t: dict) -> str:
    """Host time to queue one call; marked ! when it exceeds the device time (launch-bound in a loop)."""
    host, med = t.get("host_ms"), t.get("median")
    if host is None:
        return "–"
    return _ms(host) + (" !" if t.get("hold_ms") and med and host > med else "")


def _size(n) -> str:
    if n is None:
        return "–"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} B"


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def device_line(results: dict) -> str:
    d = results.get("device") or {}
    if d.get("kind") == "cuda":
        extra = [f"{d.get('sms')} SMs", f"L2 {_size(d.get('l2_bytes'))}", f"{_size(d.get('memory_bytes'))}",
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
            f"highest seen {_num(clock.get('max_seen_mhz'), '.0f')}")
    if clock.get("max_supported_mhz"):
        text += f", max supported {clock['max_supported_mhz']:.0f}"
    return text + f" ({clock.get('source')}); throttled samples dropped: {dropped}"


def ceilings_line(results: dict) -> str:
    c = results.get("ceilings") or {}
    if not c:
        return "not measured"
    parts = []
    if c.get("copy"):
        parts.append(f"copy {c['copy']['gbs']:.0f} GB/s (read+write, {_size(c['copy'].get('bytes_each'))} buffers)")
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


# ----------------------------------------------------------------------------- report.md


def _ops(results):
    seen = OrderedDict()
    for r in results.get("rows", []):
        seen.setdefault(r["op"], []).append(r)
    return seen


def _cases(rows):
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
        pairs = []
        for case, crow in _cases(rows).items():
            members = {r["impl"]: r for r in crow if r["impl"] in order}
            if not members:
                continue
            for k, impl in enumerate(order):
                r = members.get(impl)
                if r is None:
                    continue
                f = r.get("figures") or {}
                sp = f.get("speedup_vs_ladder_ref")
                lines.append(f"| {_esc(case) if k == 0 else ''} | {impl} | {_ms(_t(r)) if _t(r) else r['status']} | "
                             f"{_rate(f.get('gbs'))} | {_rate(f.get('pct_roofline'))} | "
                             f"{_num(sp, '.2f') + 'x' if sp else '–'} |")
            if len(order) == 2 and all(i in members and _t(members[i]) for i in order):
                ref, opt = (members[i] for i in order)
                pairs.append(f"- {_esc(case)}: time_ref = {_ms(_t(ref))} ms  time_opt = {_ms(_t(opt))} ms  "
                             f"speedup = {_t(ref) / _t(opt):.2f}x")
        lines.append("")
        lines.append("% of peak: the roofline's lower bound on the time, max(bytes / copy, flops / matmul), "
                     "over the measured time (for a memory-bound op, the % of the copy ceiling).")
        if pairs:
            lines += ["", f"{order[0]} (ref) vs {order[1]} (opt):", ""] + pairs
    return lines


def markdown(results: dict, plots: list | None = None) -> str:
    rows = results.get("rows", [])
    counts = {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "ERROR", "SKIP", "XFAIL", "XPASS")}
    counts = {s: n for s, n in counts.items() if n or s not in ("XFAIL", "XPASS")}
    lines = ["# gradoracle benchmark report", "",
             f"- device: {device_line(results)}",
             f"- SM clock: {clock_line(results)}",
             f"- ceilings: {ceilings_line(results)}",
             f"- timing: {timing_line(results)}",
             f"- command: `{results.get('command', '')}`",
             f"- versions: {versions_line(results)}",
             f"- created {results.get('created')}, {results.get('elapsed_s')} s; "
             + ", ".join(f"{k} {v}" for k, v in counts.items())
             + (f"; stopped early: {results['interrupted']}" if results.get("interrupted") else "")]
    ladder = ladders(rows)
    plots = [Path(p) for p in (plots or [])]
    for op, orows in _ops(results).items():
        lines += ["", f"## {op}", ""]
        model = (results.get("ops") or {}).get(op, {}).get("cost_model")
        if model:
            lines += ["Cost model: " + " ".join(model.split()), ""]
        for p in plots:
            if p.stem.endswith(op) or f"_{op}_" in p.stem:
                lines.append(f"![{p.stem}](plots/{p.name})")
        lines += ["", "| case | impl | status | time (ms) | 95% CI (ms) | p10–p90 (ms) | GB/s | % copy | TFLOP/s | "
                  "% matmul | % roofline | vs baseline | host (ms) | n (dropped) | mode |",
                  "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for case, crow in _cases(orows).items():
            for k, r in enumerate(crow):
                t, f = r.get("timing") or {}, r.get("figures") or {}
                timed = _t(r) is not None
                sp = f.get("speedup_vs_baseline")
                mode = (t.get("mode") or "") + (f" ({t.get('stop')})" if t.get("stop") else "")
                if t.get("fallback"):
                    mode += " *"
                lines.append(
                    f"| {_esc(case) if k == 0 else ''} | {r['impl']}{' (baseline)' if r.get('baseline') else ''} | "
                    f"{r['status']} | {_ms(t.get('median')) if timed else '–'} | "
                    + (f"{_ms(t.get('ci_lo'))}–{_ms(t.get('ci_hi'))} | {_ms(t.get('p10'))}–{_ms(t.get('p90'))} | "
                       if timed else "– | – | ")
                    + f"{_rate(f.get('gbs'))} | {_rate(f.get('pct_copy'))} | {_num(f.get('tflops'), '.3g')} | "
                    f"{_num(f.get('pct_matmul'), '.2g')} | {_rate(f.get('pct_roofline'))} | "
                    f"{_num(sp, '.2f') + 'x' if sp else '–'} | {_host(t) if timed else '–'} | "
                    f"{str(t.get('n', '–')) + ' (' + str(t.get('dropped', 0)) + ')' if timed else '–'} | {mode} |")
        lines += ladder_section(orows, ladder, op)
        fallbacks = sorted({(r['impl'], (r.get('timing') or {}).get('fallback')) for r in orows
                            if (r.get('timing') or {}).get('fallback')})
        if fallbacks:
            lines += ["", "\\* mode fallbacks:"] + [f"- {i}: {why}" for i, why in fallbacks]
        bad = [r for r in orows if r["status"] in ("FAIL", "ERROR", "XFAIL")]
        if bad:
            lines += ["", "### Failures", ""]
            for r in bad:
                lines.append(f"- **{r['status']}** {r['impl']} {_esc(r['case'])}: {_esc(r['reason'])}")
                for o in r.get("outputs", []):
                    if not o.get("passed"):
                        lines.append(f"  - [{o['name']}] {_esc(o.get('message', ''))} (err/tol {_num(o.get('worst_ratio'))})")
                lines.append(f"  - reproduce: `{r.get('repro', '')}`")
        skips: dict = {}
        for r in orows:
            if r["status"] == "SKIP":
                skips[r["reason"]] = skips.get(r["reason"], 0) + 1
        if skips:
            lines += ["", "### Skipped", ""] + [f"- {n} × {_esc(why)}" for why, n in sorted(skips.items())]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- BENCHMARKS.md


def benchmarks_md(results: dict, existing: str | None = None, plots: dict | None = None) -> str:
    """The generated block (per-op tables); replaces the block between the markers of `existing`.

    plots: op -> [relative link of a PNG], shown under the op's heading."""
    rows = results.get("rows", [])
    lines = [BEGIN, "# Benchmarks", "",
             "_Generated by `python -m harness bench ... --benchmarks-md BENCHMARKS.md` from a results.json "
             "(rerun to update; text outside the markers is kept)._", "",
             f"- **Device**: {device_line(results)}",
             f"- **SM clock**: {clock_line(results)}",
             f"- **Ceilings**: {ceilings_line(results)}",
             f"- **Timing**: {timing_line(results)}",
             f"- **Versions**: {versions_line(results)}",
             f"- **Command**: `{results.get('command', '')}`",
             f"- **Date**: {results.get('created')}"]
    ladder = ladders(rows)
    for op, orows in _ops(results).items():
        impls = list(OrderedDict.fromkeys(r["impl"] for r in orows))
        base = next((r["impl"] for r in orows if r.get("baseline")), None)
        lines += ["", f"## {op}", ""]
        model = (results.get("ops") or {}).get(op, {}).get("cost_model")
        if model:
            lines += ["Cost model: " + " ".join(model.split()), ""]
        for link in (plots or {}).get(op, []):
            lines.append(f"![{Path(link).stem}]({link})")
        if (plots or {}).get(op):
            lines.append("")
        lines += ["Median time per call in ms (% of the copy ceiling); – not run, FAIL/ERROR as marked:", "",
                  "| case | bytes | " + " | ".join(impls) + " |", "|---|---:|" + "---:|" * len(impls)]
        for case, crow in _cases(orows).items():
            by = {r["impl"]: r for r in crow}
            cells = []
            for i in impls:
                r = by.get(i)
                if r is None or r["status"] == "SKIP":
                    cells.append("–")
                elif _t(r) is None:
                    cells.append(r["status"])
                else:
                    cells.append(f"{_ms(_t(r))} ({_num((r.get('figures') or {}).get('pct_copy'), '.0f')}%)")
            lines.append(f"| {_esc(case)} | {_size(crow[0]['cost']['bytes'])} | " + " | ".join(cells) + " |")
        if base:
            others = [i for i in impls if i != base]
            lines += ["", f"Speedup against {base} (same run):", "",
                      "| case | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
            for case, crow in _cases(orows).items():
                by = {r["impl"]: r for r in crow}
                cells = [(_num((by[i].get("figures") or {}).get("speedup_vs_baseline"), ".2f") + "x")
                         if i in by and (by[i].get("figures") or {}).get("speedup_vs_baseline") else "–" for i in others]
                lines.append(f"| {_esc(case)} | " + " | ".join(cells) + " |")
        lines += ladder_section(orows, ladder, op)
    lines.append(END)
    block = "\n".join(lines) + "\n"
    if existing and BEGIN in existing and END in existing:
        head, rest = existing.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        return head + block.rstrip("\n") + tail if tail.strip() else head + block
    return block


# ----------------------------------------------------------------------------- plots


def _short(case: str, width: int = 34) -> str:
    return case if len(case) <= width else case[: width - 1] + "…"


def plot(results: dict, outdir, per_figure: int = 10) -> list:
    """A roofline per op and grouped bars (GB/s per case, one bar per impl) as PNGs; returns the paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    ceil = results.get("ceilings") or {}
    copy = (ceil.get("copy") or {}).get("gbs")
    roofs = {k: v["tflops"] for k, v in (ceil.get("matmul") or {}).items() if v}
    names = {k: v.get("name", k) for k, v in (ceil.get("matmul") or {}).items() if v}
    paths = []
    for op, orows in _ops(results).items():
        slug = re.sub(r"[^A-Za-z0-9_]+", "_", op)
        impls = list(OrderedDict.fromkeys(r["impl"] for r in orows))
        colors = {i: plt.cm.tab10(k % 10) for k, i in enumerate(impls)}
        markers = "osD^v<>pXh"
        # roofline
        pts = [(r["figures"]["ai"], r["figures"]["tflops"], r["impl"]) for r in orows
               if _t(r) and (r.get("figures") or {}).get("ai") and (r["figures"].get("tflops") or 0) > 0]
        fig, ax = plt.subplots(figsize=(7.5, 5))
        ai = [p[0] for p in pts] or [0.1]
        lo = min(ai) / 4
        hi = max(ai + [(roofs.get("bf16", 0) * 1e3 / copy) if copy else 1.0]) * 4
        xs = [lo * (hi / lo) ** (k / 200) for k in range(201)]
        if copy:
            ax.plot(xs, [copy * 1e9 * x / 1e12 for x in xs], "k--", lw=1, label=f"copy {copy:.0f} GB/s")
            for k, style in (("bf16", "-"), ("fp32", ":")):
                if k in roofs:
                    ax.plot(xs, [min(copy * 1e9 * x / 1e12, roofs[k]) for x in xs], "k" + style, lw=1.2,
                            label=f"roof {names[k]} {roofs[k]:.3g} TFLOP/s")
        for k, i in enumerate(impls):
            mine = [(a, t) for a, t, who in pts if who == i]
            if mine:
                ax.scatter([a for a, _ in mine], [t for _, t in mine], s=22, color=colors[i], marker=markers[k % 10],
                           label=i, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (flop / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        skipped = sum(1 for r in orows if _t(r) and not (r.get("figures") or {}).get("flops"))
        ax.set_title(f"{op}: roofline ({(results.get('device') or {}).get('name', '')})"
                     + (f"\n{skipped} zero-flop results not shown" if skipped else ""), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = outdir / f"roofline_{slug}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
        # bars
        cases = list(_cases(orows).items())
        for part in range(0, len(cases), per_figure):
            chunk = cases[part: part + per_figure]
            fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(chunk) + 2), 5))
            width = 0.8 / max(len(impls), 1)
            for k, i in enumerate(impls):
                ys = []
                for _, crow in chunk:
                    r = next((x for x in crow if x["impl"] == i), None)
                    ys.append((r.get("figures") or {}).get("gbs") or 0 if r and _t(r) else 0)
                ax.bar([c + (k - (len(impls) - 1) / 2) * width for c in range(len(chunk))], ys, width, label=i,
                       color=colors[i])
            if copy:
                ax.axhline(copy, color="k", ls="--", lw=1, label=f"copy ceiling {copy:.0f} GB/s")
            ax.set_xticks(range(len(chunk)))
            ax.set_xticklabels([_short(c) for c, _ in chunk], rotation=35, ha="right", fontsize=7)
            ax.set_ylabel("GB/s (cost-model bytes / median time)")
            ax.set_title(f"{op}: cases {part + 1}–{part + len(chunk)} of {len(cases)}", fontsize=9)
            ax.legend(fontsize=7, ncol=2)
            fig.tight_layout()
            path = outdir / f"bars_{slug}_{part // per_figure + 1}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths


# ----------------------------------------------------------------------------- writing


def write(results: dict, outdir, plots: bool = True) -> dict:
    """DIR/results.json, DIR/report.md and DIR/plots/*.png; returns their paths."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    pngs = plot(results, outdir / "plots") if plots else []
    (outdir / "report.md").write_text(markdown(results, pngs))
    return {"results": outdir / "results.json", "report": outdir / "report.md", "plots": pngs}


def update_benchmarks_md(results: dict, path, plots_dir=None) -> Path:
    """Rewrite the generated block of `path`; with `plots_dir`, link the PNGs there (per op, by file name)."""
    path = Path(path)
    existing = path.read_text() if path.exists() else None
    plots: dict = {}
    if plots_dir is not None:
        for png in sorted(Path(plots_dir).glob("*.png")):
            for op in _ops(results):
                if png.stem.endswith(op) or f"_{op}_" in png.stem:
                    plots.setdefault(op, []).append(os.path.relpath(png, path.resolve().parent))
    path.write_text(benchmarks_md(results, existing, plots))
    return path


def load(path) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a gradoracle bench results file (schema {data.get('schema')!r}, "
                         f"expected {SCHEMA!r})")
    return data


# ----------------------------------------------------------------------------- compare


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
        elif _t(ra) is None or _t(rb) is None:
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
