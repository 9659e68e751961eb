"""Benchmarks: `test_benchmark[<op>-<impl>-<case>]`, one per implementation and case (conftest.py).

The timer.  pytest-benchmark's own timer reads a host clock around the call and never waits
for the GPU, so on CUDA it times kernel launches, not kernels.  Here the harness's engine
(harness/timing.py: warm-up, CUDA events, L2 flush, adaptive stop, throttled samples dropped,
the final call re-validated against the oracle) takes the samples, and they are then
replayed into pytest-benchmark: `benchmark.pedantic` runs one round per kept sample with a
replay clock as its timer, each round advancing that clock by exactly one sample.  So
pytest-benchmark's statistics, tables, --benchmark-save, --benchmark-compare and
--benchmark-json hold the engine's times (the replay clock is named in the saved JSON's
options.timer).  `benchmark.group` is the case id, so implementations line up per case;
`extra_info` carries GB/s, % of the ceilings, TFLOP/s and the speedup against the op's
baseline measured in the same session.
"""
import pytest


class ReplayClock:
    """A pytest-benchmark timer that advances by recorded samples (seconds), one per round."""

    __name__ = "gradoracle.timing-replay"

    def __init__(self, samples_s):
        self.samples = list(samples_s)
        self.now = 0.0
        self.rounds = 0

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += self.samples[self.rounds % len(self.samples)]
        self.rounds += 1


def replay(benchmark, samples_ms) -> ReplayClock:
    clock = ReplayClock([t * 1e-3 for t in samples_ms])
    benchmark._timer = clock  # read by pytest-benchmark when it builds each round's runner
    benchmark.pedantic(clock.advance, rounds=len(samples_ms), iterations=1, warmup_rounds=0)
    return clock


def _failure(row) -> str:
    lines = [f"{row['status']}: {row['reason']}"]
    for o in row.get("outputs", []):
        if not o.get("passed"):
            lines.append(f"  [{o['name']}] {o.get('message', '')} err/tol={o.get('worst_ratio')}")
    lines.append(f"  reproduce: {row.get('repro', '')}")
    return "\n".join(lines)


EXTRA = ("gbs", "pct_copy", "tflops", "pct_matmul", "pct_roofline", "ai", "speedup_vs_baseline", "baseline")


def test_benchmark(benchmark, op_name, impl, case, bench_session, request):
    row = bench_session.measure(impl, case)
    if row["status"] == "SKIP":
        pytest.skip(row["reason"])
    if row["status"] in ("XFAIL", "XPASS"):  # a declared, explained deviation (harness/status.py), as in test_correctness
        request.applymarker(pytest.mark.xfail(reason=row["reason"], strict=False))
    assert row["status"] in ("PASS", "XPASS"), _failure(row)
    timing, fig = row["timing"], row["figures"]
    benchmark.group = case.id
    benchmark.extra_info.update({k: fig[k] for k in EXTRA if fig.get(k) is not None})
    benchmark.extra_info.update(median_ms=timing["median"], ci_ms=[timing["ci_lo"], timing["ci_hi"]],
                                mode=timing["mode"], timer=timing["timer"], samples=timing["n"],
                                dropped=timing["dropped"], stop=timing["stop"], fallback=timing["fallback"],
                                clocks=timing["clocks"], bytes=row["cost"]["bytes"], flops=row["cost"]["flops"])
    clock = replay(benchmark, timing["samples_ms"])
    assert clock.rounds >= 1
