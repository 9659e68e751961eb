"""Reports from a synthetic results.json (harness/report/), verdicts, the progress bar and the prefetcher."""
import io
import json

import numpy as np
import pytest

from harness.report import benchmarks_md, compare, figures, files, markdown
from harness.bench import Prefetch, Progress
from harness.timing import Samples

CEIL = {"device": {"kind": "cuda", "name": "Fake H100"}, "copy": {"gbs": 3000.0, "bytes_each": 2 << 30},
        "matmul": {"bf16": {"tflops": 800.0, "name": "bf16", "n": 8192},
                   "fp32": {"tflops": 50.0, "name": "fp32 (TF32 off)", "n": 8192}}}


def timing(median, spread=0.01, n=50, seed=0):
    rng = np.random.default_rng(seed)
    return Samples(list(median * (1 + spread * rng.standard_normal(n))), "cold", "cuda_event", stop="converged",
                   clocks={"source": "nvml", "median_mhz": 1980.0, "min_mhz": 1980.0, "max_mhz": 1980.0}).to_json()


def row(case, impl, ms=None, status="PASS", baseline=False, variant="default", rank=0, reason="", nbytes=3 << 30):
    backend = impl.split("@")[0]
    return {"op": "binary_backward", "case": case, "dtype": "bf16", "impl": impl, "backend": backend,
            "variant": variant, "variant_rank": rank, "baseline": baseline, "status": status, "reason": reason,
            "cost": {"bytes": nbytes, "flops": nbytes // 6}, "outputs": [], "repro": f"python -m harness run {impl}",
            "timing": timing(ms) if ms else None}


def synthetic():
    rows = []
    for k, case in enumerate(["mul[bf16,A=8x2048x4096,B=4096]", "add[bf16,A=8x2048x4096,B=8x2048x1]"]):
        rows += [row(case, "torch", 2.0 + k, baseline=True),
                 row(case, "cupy@opt", 1.1 + k, variant="opt", rank=0),    # registered first, but...
                 row(case, "cupy@naive", 4.0 + k, variant="naive", rank=1),  # ...naive heads the ladder
                 row(case, "triton", status="FAIL", reason="timed re-validation: stale"),
                 row(case, "jax", status="SKIP", reason="jax: no GPU backend")]
    results = {"schema": files.SCHEMA, "created": "2026-11-22T00:00:00", "command": "python -m harness bench --cases perf",
               "device": {"kind": "cuda", "name": "Fake H100", "sms": 132, "l2_bytes": 50 << 20,
                          "memory_bytes": 80 << 30, "capability": "9.0", "cuda": "13.0", "driver": "580"},
               "versions": {"python": "3.12", "torch": "2.11"}, "ceilings": CEIL,
               "config": {"mode": "cold", "rel_ci": 0.005, "min_samples": 10, "max_samples": 500, "budget_s": 1.0,
                          "warmup_rtol": 0.05, "throttle": 0.95, "sample_above": 1 << 22},
               "clock": {"source": "nvml", "max_seen_mhz": 1980.0, "max_supported_mhz": 1980.0},
               "ops": {"binary_backward": {"cost_model": "bytes: each input read once, each output written once."}},
               "elapsed_s": 12.5, "interrupted": "", "rows": rows}
    return figures.add_figures(results)


def test_figures_speedups_and_ladder_order():
    res = synthetic()
    by = {(r["case"], r["impl"]): r for r in res["rows"]}
    case = "mul[bf16,A=8x2048x4096,B=4096]"
    opt, naive, torch = (by[(case, i)]["figures"] for i in ("cupy@opt", "cupy@naive", "torch"))
    assert figures.ladders(res["rows"]) == {("binary_backward", "cupy"): ["cupy@naive", "cupy@opt"]}
    med = {i: by[(case, i)]["timing"]["median"] for i in ("torch", "cupy@opt", "cupy@naive")}
    assert opt["speedup_vs_baseline"] == pytest.approx(med["torch"] / med["cupy@opt"])
    assert opt["speedup_vs_ladder_ref"] == pytest.approx(med["cupy@naive"] / med["cupy@opt"])
    assert naive["speedup_vs_ladder_ref"] == pytest.approx(1.0) and torch["speedup_vs_baseline"] == pytest.approx(1.0)
    assert opt["gbs"] == pytest.approx((3 << 30) / (med["cupy@opt"] * 1e-3) / 1e9)
    assert opt["pct_copy"] == pytest.approx(100 * opt["gbs"] / 3000.0) and opt["matmul_roof"] == "bf16"
    assert "gbs" not in by[(case, "triton")]["figures"]


def test_markdown_report_has_every_figure_and_the_seed_table_shapes():
    md = markdown.markdown(synthetic(), ["plots/roofline_binary_backward.png"])
    assert "Fake H100 (132 SMs, L2 50.0 MiB" in md and "driver 580" in md
    assert "copy 3000 GB/s (read+write" in md and "fp32 (TF32 off) 50 TFLOP/s" in md
    assert "`python -m harness bench --cases perf`" in md and "torch 2.11" in md
    assert "![roofline_binary_backward](plots/roofline_binary_backward.png)" in md
    assert ("| case | impl | status | time (ms) | loop (ms) | binding ceiling | peak mem | 95% CI (ms) | "
            "p10–p90 (ms) | GB/s | % copy |") in md
    assert "### Variant ladder: cupy (cupy@naive → cupy@opt)" in md
    assert "| case | version | time (ms) | GB/s | % of peak | speedup |" in md
    line = next(l for l in md.splitlines() if l.startswith("- mul[bf16") and "time_ref" in l)
    ref, opt = (float(x) for x in line.replace(" ms", "").split("time_ref = ")[1].split("  speedup")[0]
                .split("  time_opt = "))
    speedup = float(line.split("speedup = ")[1].rstrip("x"))
    assert 3.9 < ref < 4.1 and 1.05 < opt < 1.15 and speedup == pytest.approx(ref / opt, rel=0.01)
    assert "**FAIL** triton" in md and "reproduce: `python -m harness run triton`" in md
    assert "2 × jax: no GPU backend" in md
    assert "SM clock: median 1980 MHz" in md


def test_benchmarks_md_regenerates_between_markers(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("Notes written by hand.\n\n" + benchmarks_md.BEGIN + "\nold table\n" + benchmarks_md.END + "\n\nMore notes.\n")
    res = synthetic()
    benchmarks_md.update_benchmarks_md(res, path)
    text = path.read_text()
    assert text.startswith("Notes written by hand.") and text.rstrip().endswith("More notes.")
    assert "old table" not in text and text.count(benchmarks_md.BEGIN) == 1
    assert "**Device**: Fake H100" in text and "**Command**: `python -m harness bench --cases perf`" in text
    assert "| case | bytes | impl | time (ms) | loop (ms) | binding ceiling | peak mem | vs torch |" in text
    assert "<!-- gradoracle:op binary_backward begin -->" in text and "time_ref = " in text
    res["rows"][1]["timing"] = timing(0.5)  # a rerun with new numbers updates the block in place
    benchmarks_md.update_benchmarks_md(figures.add_figures(res), path)
    again = path.read_text()
    assert again != text and again.startswith("Notes written by hand.") and again.count(benchmarks_md.BEGIN) == 1
    fresh = tmp_path / "NEW.md"
    benchmarks_md.update_benchmarks_md(res, fresh)
    assert fresh.read_text().startswith(benchmarks_md.BEGIN)
    # A run that refreshes one op's section of several: its run lines stay in that section, not atop
    # the block, where they would claim the kept sections too.
    other = fresh.read_text().replace("gradoracle:op binary_backward", "gradoracle:op reduce_sum")
    fresh.write_text(other)
    benchmarks_md.update_benchmarks_md(res, fresh)
    mixed = fresh.read_text()
    assert "<!-- gradoracle:op reduce_sum begin -->" in mixed and "**Device**: Fake H100" not in mixed
    assert "Run: Fake H100" in mixed


def test_write_makes_json_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    out = files.write(synthetic(), tmp_path / "rep")
    assert json.loads(out["results"].read_text())["schema"] == files.SCHEMA
    names = sorted(p.name for p in out["plots"])
    assert names == ["bars_binary_backward_1.png", "roofline_binary_backward.png"]
    for p in out["plots"]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert "plots/bars_binary_backward_1.png" in out["report"].read_text()
    assert files.load(out["results"])["device"]["name"] == "Fake H100"
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="not a gradoracle bench results file"):
        files.load(tmp_path / "bad.json")


# ----------------------------------------------------------------------------- verdicts


def T(median, lo, hi, p10, p90):
    return {"median": median, "ci_lo": lo, "ci_hi": hi, "p10": p10, "p90": p90}


def test_verdicts_from_intervals_and_spreads():
    a = T(1.00, 0.99, 1.01, 0.95, 1.05)
    assert compare.verdict(a, T(1.005, 1.00, 1.012, 0.96, 1.06)) == "SAME"  # CIs overlap
    assert compare.verdict(a, T(0.80, 0.79, 0.81, 0.76, 0.84)) == "FASTER"  # spreads apart too
    assert compare.verdict(a, T(1.30, 1.29, 1.31, 1.25, 1.36)) == "SLOWER"
    assert compare.verdict(a, T(1.03, 1.02, 1.04, 0.98, 1.08)) == "AMBIGUOUS"  # CIs apart, spreads overlap
    noisy = T(1.00, 0.90, 1.10, 0.60, 1.60)
    assert compare.verdict(noisy, T(1.08, 1.01, 1.15, 0.70, 1.70)) == "SAME"  # 8% inside a noisy run's CI


def test_verdicts_on_synthetic_sample_sets():
    def summary(median, spread, seed):
        return timing(median, spread, n=400, seed=seed)

    same = compare.verdict(summary(1.0, 0.01, 1), summary(1.0, 0.01, 2))
    assert same in ("SAME", "AMBIGUOUS")
    assert compare.verdict(summary(1.0, 0.005, 1), summary(0.9, 0.005, 2)) == "FASTER"
    assert compare.verdict(summary(1.0, 0.005, 1), summary(1.1, 0.005, 2)) == "SLOWER"
    assert compare.verdict(summary(1.0, 0.05, 1), summary(1.03, 0.05, 2)) == "AMBIGUOUS"


def test_compare_two_runs(tmp_path):
    a, b = synthetic(), synthetic()
    case = "mul[bf16,A=8x2048x4096,B=4096]"
    for r in b["rows"]:
        if r["case"] == case and r["impl"] == "cupy@opt":
            r["timing"] = timing(0.5)  # B made it twice as fast
    b["rows"] = [r for r in b["rows"] if not (r["impl"] == "torch" and r["case"] != case)]
    result = compare.compare(a, b)
    v = {(r["case"], r["impl"]): r["verdict"] for r in result["rows"]}
    assert v[(case, "cupy@opt")] == "FASTER"
    assert v[(case, "torch")] == "SAME" and v[(case, "triton")] == "NOT_TIMED"
    assert v[("add[bf16,A=8x2048x4096,B=8x2048x1]", "torch")] == "ONLY_A"
    s = result["summary"]
    assert s["compared"] == 5 and s["within"] == 4 and s["fraction_within"] == pytest.approx(0.8)
    text = compare.format_compare(result, "a.json", "b.json")
    assert "FASTER" in text and "medians within 2%: 4/5 = 80.0%" in text
    assert "SAME" not in text.split("\n", 3)[3].split("summary")[0]  # SAME rows only with --all
    b["config"] = {**b["config"], "mode": "hot"}
    assert compare.compare(a, b)["warnings"] == ["mode differs: cold vs hot"]


# ----------------------------------------------------------------------------- progress and prefetch


def test_progress_lines_when_not_a_terminal():
    out = io.StringIO()
    clock = iter(range(100))
    p = Progress(40, stream=out, now=lambda: next(clock))
    for i in range(40):
        p.update(f"item {i}")
    p.close()
    lines = out.getvalue().splitlines()
    assert 15 <= len(lines) <= 22  # one per 5% step
    assert lines[-1].startswith("[########################] 40/40 100%") and "item 39" in lines[-1]


def test_progress_redraws_in_place_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress(3, stream=out)
    for _ in range(3):
        p.update("x")
    p.close()
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\n")


@pytest.mark.parametrize("depth", [0, 2])
def test_prefetch_keeps_order_and_reports_errors(depth):
    def work(x):
        if x == 3:
            raise MemoryError("too big")
        return x * 10

    got = list(Prefetch(range(6), work, depth))
    assert [i for i, _ in got] == list(range(6))
    assert [r for i, r in got if i != 3] == [0, 10, 20, 40, 50] and isinstance(got[3][1], MemoryError)


def test_prefetch_quiet_runs_no_preparation_inside():
    import threading
    import time as _time

    log = []
    lock = threading.Lock()

    def work(x):
        with lock:
            log.append(("start", x, _time.monotonic()))
        _time.sleep(0.05)
        with lock:
            log.append(("end", x, _time.monotonic()))
        return x

    fetch = Prefetch(range(8), work, 3)
    windows = []
    for i, _ in fetch:
        with fetch.quiet():
            t0 = _time.monotonic()
            _time.sleep(0.03)  # "timing": no preparation may start or run meanwhile
            windows.append((t0, _time.monotonic()))
    for t0, t1 in windows:
        for kind, _x, t in log:
            assert not (t0 < t < t1), (kind, t0, t, t1)
    # and nothing was running across a window: every start/end pair lies on one side of it
    starts = {x: t for k, x, t in log if k == "start"}
    ends = {x: t for k, x, t in log if k == "end"}
    for t0, t1 in windows:
        assert all(ends[x] <= t0 or starts[x] >= t1 for x in starts)
