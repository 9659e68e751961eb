"""Plots of a bench run (matplotlib, Agg; none without matplotlib): per op a roofline of achieved
TFLOP/s against arithmetic intensity, and grouped bars of GB/s per case, one bar per implementation."""
from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path

from harness.report.figures import timed_ms
from harness.report.text import by_case, by_op


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
    for op, orows in by_op(results).items():
        slug = re.sub(r"[^A-Za-z0-9_]+", "_", op)
        impls = list(OrderedDict.fromkeys(r["impl"] for r in orows))
        colors = {i: plt.cm.tab10(k % 10) for k, i in enumerate(impls)}
        markers = "osD^v<>pXh"
        # roofline
        pts = [(r["figures"]["ai"], r["figures"]["tflops"], r["impl"]) for r in orows
               if timed_ms(r) and (r.get("figures") or {}).get("ai") and (r["figures"].get("tflops") or 0) > 0]
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
        skipped = sum(1 for r in orows if timed_ms(r) and not (r.get("figures") or {}).get("flops"))
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
        cases = list(by_case(orows).items())
        for part in range(0, len(cases), per_figure):
            chunk = cases[part: part + per_figure]
            fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(chunk) + 2), 5))
            width = 0.8 / max(len(impls), 1)
            for k, i in enumerate(impls):
                ys = []
                for _, crow in chunk:
                    r = next((x for x in crow if x["impl"] == i), None)
                    ys.append((r.get("figures") or {}).get("gbs") or 0 if r and timed_ms(r) else 0)
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
