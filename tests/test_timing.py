"""The timing engine (harness/timing.py) on scripted timers, fake GPUs and the CPU."""
import math
import sys
import types
from contextlib import nullcontext

import numpy as np
import pytest

from harness import timing
from harness.timing import ClockMonitor, Samples, TimingConfig, measure, median_ci, summarize, warm_up

# ----------------------------------------------------------------------------- fakes


class Clock:
    """A fake wall clock that the fake timers advance."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class ScriptedTimer:
    """Sample i takes script(i) ms and advances the wall clock by as much (plus an overhead)."""

    name = "scripted"

    def __init__(self, script, clock, overhead_s=0.0):
        self.script, self.clock, self.overhead_s = script, clock, overhead_s
        self.calls = []

    def run(self, call, start, count, during=None):
        out = []
        for j in range(count):
            ms = float(self.script(start + j))
            self.calls.append(start + j)
            self.clock.t += ms * 1e-3 + self.overhead_s
            out.append(ms)
        if during:
            during()
        return out


class FakeGPU:
    """One in-order stream: work advances its clock; events read the clock when 'recorded'."""

    def __init__(self, durations):
        self.t = 0.0
        self.durations = durations
        self.log = []
        self.syncs = 0

    def call(self, i):
        self.log.append(("call", i))
        self.t += self.durations(i)

    def flush(self):
        self.log.append(("flush",))
        self.t += 0.5

    def event(self):
        gpu = self

        class Event:
            def __init__(self):
                self.t = None

            def record(self):
                self.t = gpu.t

            def synchronize(self):
                gpu.syncs += 1
                gpu.log.append(("sync",))

            def elapsed_time(self, other):
                return other.t - self.t

        return Event()


def quick(**kw):
    base = dict(mode="hot", rel_ci=0.005, min_samples=5, max_samples=50, budget_s=1.0, warmup_min=3,
                warmup_max=20, warmup_budget_s=0.5)
    base.update(kw)
    return TimingConfig(**base)


# ----------------------------------------------------------------------------- statistics


def test_median_ci_order_statistics():
    x = np.arange(1, 101, dtype=float)
    lo, hi = median_ci(x)
    assert (lo, hi) == (40.0, 61.0)  # ranks floor(50 - 9.8) = 40 and ceil(1 + 50 + 9.8) = 61
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # few samples: the whole range
    s = summarize(x)
    assert s["median"] == 50.5 and s["min"] == 1 and s["max"] == 100
    assert s["p10"] == pytest.approx(10.9) and s["p90"] == pytest.approx(90.1)
    assert s["rel_ci"] == pytest.approx((61 - 40) / 2 / 50.5)
    assert summarize([])["median"] is None


def test_config_rejects_unknown_mode_and_bad_counts():
    with pytest.raises(ValueError, match="timing mode"):
        TimingConfig(mode="warm")
    with pytest.raises(ValueError, match="min_samples"):
        TimingConfig(min_samples=10, max_samples=5)


# ----------------------------------------------------------------------------- warm-up


def test_warm_up_stops_when_two_consecutive_calls_agree():
    times = [900.0, 3.0, 1.2, 1.0, 1.01, 1.0]
    w = warm_up(lambda i: times[i], quick(warmup_rtol=0.05))
    assert w["calls"] == 5 and w["stop"] == "converged"  # 1.0 and 1.01 agree within 5%
    assert w["first_ms"] == 900.0 and w["last_ms"] == 1.01


def test_warm_up_first_call_is_outside_its_budget_and_budget_ends_it():
    clock = Clock()

    def run_one(i):
        clock.t += 100.0 if i == 0 else 0.1  # a 100 s compile, then calls that never agree
        return 5.0 if i % 2 else 1.0

    w = warm_up(run_one, quick(warmup_budget_s=0.35, warmup_max=1000), now=clock)
    assert w["stop"] == "budget"
    assert w["calls"] == 5  # the budget counts from the end of the slow first call: 4 calls of 0.1 s after it


def test_warm_up_max_calls():
    w = warm_up(lambda i: 1.0 + (i % 2), quick(warmup_max=7, warmup_budget_s=1e9))
    assert w["calls"] == 7 and w["stop"] == "max_calls"


# ----------------------------------------------------------------------------- adaptive stop


def test_stops_at_min_samples_when_converged():
    clock = Clock()
    timer = ScriptedTimer(lambda i: 2.0, clock)
    s = measure(None, timer, quick(min_samples=8), now=clock)
    assert s.stop == "converged" and s.n == 8 and s.median == 2.0
    assert s.warmup["calls"] == 3  # 2.0, 2.0 agree, but warmup_min is 3
    assert timer.calls == list(range(3 + 8))  # call indices run on from the warm-up


def test_noisy_samples_run_to_max_samples():
    clock = Clock()
    rng = np.random.default_rng(0)
    timer = ScriptedTimer(lambda i: 1.0 + rng.uniform(0, 1), clock)
    s = measure(None, timer, quick(max_samples=40, budget_s=1e9, rel_ci=1e-6), now=clock)
    assert s.stop == "max_samples" and s.n == 40


def test_budget_stops_sampling_but_min_samples_win():
    clock = Clock()
    rng = np.random.default_rng(1)
    timer = ScriptedTimer(lambda i: 1000.0 * (1 + rng.uniform(0, 1)), clock)  # 1-2 s per call
    s = measure(None, timer, quick(min_samples=6, budget_s=0.5, rel_ci=1e-6), now=clock)
    assert s.stop == "budget" and s.n == 6  # budget long gone, still min_samples samples

    clock = Clock()
    timer = ScriptedTimer(lambda i: 1.0 + (i % 3), clock, overhead_s=0.01)
    s = measure(None, timer, quick(min_samples=5, max_samples=10_000, budget_s=0.5, rel_ci=1e-9), now=clock)
    assert s.stop == "budget"
    assert 0.5 <= s.elapsed_s < 0.6 and 35 < s.n < 50  # 11-13 ms per sample: about 42 in 0.5 s


def test_converges_once_the_ci_is_tight_enough():
    clock = Clock()
    rng = np.random.default_rng(2)
    timer = ScriptedTimer(lambda i: 1.0 + rng.normal(0, 0.02), clock)
    s = measure(None, timer, quick(min_samples=5, max_samples=2000, budget_s=1e9, rel_ci=0.003), now=clock)
    assert s.stop == "converged" and s.stats()["rel_ci"] <= 0.003
    assert 20 < s.n < 2000


# ----------------------------------------------------------------------------- throttling


def test_throttled_samples_are_dropped_and_reported():
    clock = Clock()
    readings = iter([1980.0, 1980.0, 1500.0] + [1980.0] * 100)
    monitor = ClockMonitor(lambda: next(readings), "fake", max_supported_mhz=1980.0)
    # 3 warm-up calls, then batches of 5 (batch_s / 1 ms); the third batch (calls 13-17) runs slow at 1500 MHz
    timer = ScriptedTimer(lambda i: 1.0 + (i % 2) * 1e-3 if i < 13 or i >= 18 else 3.0, clock)
    cfg = quick(min_samples=5, max_samples=20, budget_s=1e9, rel_ci=1e-9, warmup_min=3, batch_s=0.0055)
    s = measure(None, timer, cfg, clock=monitor, now=clock)
    assert s.dropped == 5 and s.dropped_ms == [3.0] * 5
    assert s.n == 15 and s.median < 1.01 and not s.throttled_all and s.stop == "max_samples"
    assert s.clocks["throttled"] == 5 and s.clocks["min_mhz"] == 1500.0 and s.clocks["reference_mhz"] == 1980.0
    assert s.clocks["max_supported_mhz"] == 1980.0 and s.clocks["source"] == "fake"


def test_all_throttled_keeps_everything_and_says_so():
    clock = Clock()
    monitor = ClockMonitor(lambda: 1000.0, "fake")
    monitor.max_seen = 2000.0  # an earlier measurement ran at 2 GHz
    timer = ScriptedTimer(lambda i: 1.0, clock)
    rests = []
    s = measure(None, timer, quick(min_samples=5, max_samples=20, budget_s=0.001), clock=monitor, now=clock,
                sleep=rests.append)
    # the clock stayed down through the rest: the second set is kept whole, and says it was retaken
    assert rests == [2.0] and s.rested_s == 2.0
    assert s.throttled_all and s.stop == "budget_throttled" and s.n == 5 and s.dropped == 0
    assert Samples.from_json(s.to_json()).rested_s == 2.0


def test_a_throttled_set_is_retaken_after_a_rest():
    # a tuner's load left the clock down (1400 of 1980 MHz); it is back after the rest
    clock = Clock()
    rests = []
    monitor = ClockMonitor(lambda: 1980.0 if rests else 1400.0, "fake")
    monitor.max_seen = 1980.0
    timer = ScriptedTimer(lambda i: 1.0 if rests else 1.4, clock)
    cfg = quick(min_samples=5, max_samples=20, budget_s=0.001)
    s = measure(None, timer, cfg, clock=monitor, now=clock, sleep=rests.append)
    assert rests == [2.0] and s.rested_s == 2.0 and not s.throttled_all
    assert s.n >= 5 and s.median == 1.0 and s.dropped == 0 and s.clocks["min_mhz"] == 1980.0
    # with rest_s 0 the throttled set stands, marked
    rests.clear()
    s0 = measure(None, ScriptedTimer(lambda i: 1.4, clock), quick(min_samples=5, max_samples=20, budget_s=0.001,
                                                                 rest_s=0), clock=monitor, now=clock,
                 sleep=rests.append)
    assert rests == [] and s0.throttled_all and s0.rested_s == 0.0 and s0.median == 1.4


def test_clock_monitor_failures_and_cpu():
    assert ClockMonitor.for_device("cpu").source == "none"
    assert ClockMonitor.for_device("cpu").read() is None

    def broken():
        raise RuntimeError("nvml went away")

    m = ClockMonitor(broken, "nvml")
    assert m.read() is None and m.reference is None


def test_clock_monitor_reads_nvml_through_pynvml(monkeypatch):
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1, nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: ("uuid", uuid), nvmlDeviceGetHandleByIndex=lambda i: ("index", i),
        nvmlDeviceGetClockInfo=lambda handle, kind: 1755 if kind == 1 else 0,
        nvmlDeviceGetMaxClockInfo=lambda handle, kind: 1980)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    m = ClockMonitor.for_device("cuda")
    assert m.source == "nvml" and m.max_supported_mhz == 1980.0
    assert m.read() == 1755.0 and m.reference == 1755.0


# ----------------------------------------------------------------------------- CUDA paths, faked


def test_event_timer_flushes_before_each_sample_and_reads_clock_before_sync():
    gpu = FakeGPU(lambda i: 2.0)
    seen = []
    timer = timing.EventTimer(gpu.flush, gpu.event)
    out = timer.run(gpu.call, 10, 3, during=lambda: seen.append(list(gpu.log)))
    assert out == [2.0, 2.0, 2.0]  # the flush is outside the events
    assert gpu.log[:6] == [("flush",), ("call", 10), ("flush",), ("call", 11), ("flush",), ("call", 12)]
    assert ("sync",) not in seen[0] and gpu.syncs == 1  # clock read while the batch is queued


def test_gpu_hold_spins_before_each_start_event_and_follows_host_time():
    gpu = FakeGPU(lambda i: 2.0)
    host = iter([0.001, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1] + [0.1] * 100)  # seconds between clock reads
    t = [0.0]

    def clock():  # advances by the next host time on every second read (the end of a call)
        t[0] += next(host) if len(reads) % 2 else 0.0
        reads.append(t[0])
        return t[0]

    reads: list = []
    hold = timing.GpuHold(lambda cycles: gpu.log.append(("hold", cycles)), cycles_per_ms=1000.0)
    timer = timing.EventTimer(gpu.flush, gpu.event, hold=hold, clock=clock)
    timer.run(gpu.call, 0, 1)
    assert ("hold", 0) not in gpu.log and gpu.log[:2] == [("flush",), ("call", 0)]  # no hold before any host time
    assert hold.ms == pytest.approx(1.5 * 1.0 + 0.02)  # 1 ms of host time for the first call
    timer.run(gpu.call, 1, 6)
    holds = [e for e in gpu.log if e[0] == "hold"]
    assert len(holds) == 6 and holds[0] == ("hold", int((1.5 * 1.0 + 0.02) * 1000))
    # order per sample: hold, flush, then the call (between the events)
    k = gpu.log.index(("call", 1))
    assert gpu.log[k - 2:k] == [holds[0], ("flush",)]
    assert hold.ms == timing.HOLD_MAX_MS  # 100 ms host times: capped
    assert timer.host_ms[0] == pytest.approx(1.0) and len(timer.host_ms) == 7


def test_samples_record_host_time_and_hold():
    clock = Clock()
    timer = ScriptedTimer(lambda i: 1.0, clock)
    timer.host_ms = [0.5] * 100
    timer.hold = types.SimpleNamespace(ms=0.77)
    s = measure(None, timer, quick(min_samples=5, max_samples=5), now=clock)
    assert s.host_ms == 0.5 and s.hold_ms == 0.77
    j = s.to_json()
    assert j["host_ms"] == 0.5 and j["hold_ms"] == 0.77 and timing.Samples.from_json(j).hold_ms == 0.77


def test_time_fn_cold_mode_on_a_fake_gpu(monkeypatch):
    gpu = FakeGPU(lambda i: 1.5)
    monkeypatch.setattr(timing, "flush_for", lambda device: _Flush(gpu, 100 << 20))
    run = timing.time_fn(gpu.call, "cuda", quick(mode="cold"), event=gpu.event)
    s = run.samples
    assert s.mode == "cold" and s.timer == "cuda_event" and s.median == 1.5 and s.flush_bytes == 100 << 20
    assert s.stop == "converged"
    flushes = sum(1 for e in gpu.log if e == ("flush",))
    assert flushes == s.warmup["calls"] + s.n
    assert run.final_call() == 1.5 and gpu.log[-1] == ("sync",) and gpu.log[-2] == ("call", run.last_index)


class _Flush:
    def __init__(self, gpu, nbytes):
        self.gpu, self.nbytes = gpu, nbytes

    def __call__(self):
        self.gpu.flush()


class FakeGraph:
    def __init__(self, call, first, calls):
        self.call, self.first, self.calls = call, first, calls
        self.replays = 0

    def replay(self):
        self.replays += 1
        for i in range(self.calls):
            self.call(self.first + i)


def test_time_fn_graph_mode_times_replays_per_call():
    gpu = FakeGPU(lambda i: 0.004)  # a 4 us kernel: 2 ms / 4 us = 500 calls, capped at 200
    made = []

    def capture(call, calls, start, framework):
        made.append((calls, start, framework))
        return FakeGraph(call, start + 2, calls), None

    run = timing.time_fn(gpu.call, "cuda", quick(mode="graph"), framework="cupy", capture=capture, event=gpu.event)
    s = run.samples
    assert made == [(200, s.warmup["eager"]["calls"], "cupy")]
    assert s.mode == "graph" and s.timer == "cuda_graph" and s.calls_per_sample == 200 and not s.fallback
    assert s.median == pytest.approx(0.004)
    assert run.last_index == s.warmup["eager"]["calls"] + 2 + 199
    assert run.final_call() == pytest.approx(0.8) and run.graph.replays == s.warmup["calls"] + s.n + 1


def test_time_fn_graph_capture_failure_falls_back_to_hot_with_the_reason():
    gpu = FakeGPU(lambda i: 0.01)
    run = timing.time_fn(gpu.call, "cuda", quick(mode="graph", graph_calls=8), framework="torch",
                         capture=lambda *a: (None, "graph capture failed (RuntimeError: nope): timed as hot"),
                         event=gpu.event)
    s = run.samples
    assert s.mode == "hot" and s.requested_mode == "graph" and "nope" in s.fallback
    assert s.timer == "cuda_event" and s.median == pytest.approx(0.01) and run.graph is None


def _fake_torch(fail_on_capture=False):
    log = []

    class Stream:
        cuda_stream = 1234

        def wait_stream(self, other):
            log.append("wait")

    class Graph:
        pass

    def graph_ctx(g, stream=None, capture_error_mode=None):
        log.append(("capture", capture_error_mode))
        if fail_on_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        return nullcontext()

    cuda = types.SimpleNamespace(Stream=Stream, current_stream=lambda: Stream(), stream=lambda s: nullcontext(),
                                 synchronize=lambda: log.append("sync"), CUDAGraph=Graph, graph=graph_ctx)
    return types.SimpleNamespace(cuda=cuda), log


def test_capture_graph_warms_on_the_capture_stream_then_captures():
    torch, log = _fake_torch()
    seen = []
    graph, reason = timing.capture_graph(seen.append, 4, 10, "torch", torch=torch)
    assert reason is None and graph is not None
    assert seen == [10, 11, 12, 13, 14, 15]  # two warm-up calls, then four captured
    assert ("capture", "thread_local") in log


def test_capture_graph_failure_and_jax_are_reasons_not_errors():
    torch, _ = _fake_torch(fail_on_capture=True)
    graph, reason = timing.capture_graph(lambda i: None, 4, 0, "torch", torch=torch)
    assert graph is None and "graph capture failed (RuntimeError: operation not permitted" in reason
    graph, reason = timing.capture_graph(lambda i: None, 4, 0, "jax")
    assert graph is None and "XLA" in reason
    assert timing.capture_graph(lambda i: None, 4, 0, "numpy")[0] is None


def test_rotation_and_graph_size_plans():
    cfg = quick(mode="graph")
    l2 = 50 << 20
    assert timing.plan_rotation(cfg, "graph", 1 << 20, l2) == 64  # 100 sets would do: capped
    assert timing.plan_rotation(cfg, "graph", 10 << 20, l2) == 10
    assert timing.plan_rotation(cfg, "graph", 60 << 20, l2) == 1  # does not fit in L2 anyway
    assert timing.plan_rotation(cfg, "cold", 1 << 20, l2) == 16  # 16 allocations: the median hangs on none
    assert timing.plan_rotation(cfg, "cold", 100 << 20, l2) == 5  # 512 MiB of sets at most
    assert timing.plan_rotation(cfg, "cold", 400 << 20, l2) == 1
    assert timing.plan_rotation(quick(cold_sets=1), "cold", 1 << 20, l2) == 1
    assert timing.plan_rotation(quick(rotate=3), "hot", 1 << 20, l2) == 3
    assert timing.graph_calls(cfg, 0.5) == 4 and timing.graph_calls(cfg, 0.001) == 200
    assert timing.graph_calls(quick(graph_calls=7), 0.5) == 7
    assert timing.effective_mode("graph", "cpu") == ("hot", "graph mode needs a CUDA device: timed as hot")
    assert timing.effective_mode("graph", "cuda") == ("graph", "")


def test_l2_flush_is_sized_from_the_device(monkeypatch):
    import torch

    props = types.SimpleNamespace(L2_cache_size=50 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert timing.cache_bytes("cuda") == 50 << 20
    made = {}
    monkeypatch.setattr(timing, "L2Flush", lambda nbytes, device: made.setdefault("f", (nbytes, device)))
    monkeypatch.setattr(timing, "_FLUSHES", {})
    timing.flush_for("cuda:0")
    assert made["f"] == (100 << 20, "cuda:0")  # 2 x L2
    flush = timing.__dict__["CpuFlush"](1 << 20)
    flush()
    assert flush.buf.nbytes == 1 << 20


# ----------------------------------------------------------------------------- the CPU, for real


def test_cpu_timing_end_to_end():
    import time as _time

    def call(i):
        _time.sleep(0.002)

    run = timing.time_fn(call, "cpu", quick(mode="hot", rel_ci=0.5, budget_s=0.2))
    s = run.samples
    assert s.timer == "perf_counter" and s.mode == "hot" and s.clocks is None
    assert 2.0 <= s.median < 20.0 and s.n >= 5
    j = s.to_json()
    back = timing.Samples.from_json(j)
    assert back.median == pytest.approx(s.median, rel=1e-5) and back.mode == "hot" and j["n"] == s.n
    assert math.isfinite(j["ci_lo"]) and j["ci_lo"] <= j["median"] <= j["ci_hi"]


def test_graph_mode_on_the_cpu_is_hot_with_a_reason():
    run = timing.time_fn(lambda i: None, "cpu", quick(mode="graph", budget_s=0.05))
    assert run.samples.mode == "hot" and "needs a CUDA device" in run.samples.fallback


# ----------------------------------------------------------------------------- on a real GPU


@pytest.mark.gpu
def test_cuda_events_flush_and_graph_on_the_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    flush = timing.flush_for("cuda")
    assert flush.nbytes == 2 * torch.cuda.get_device_properties(0).L2_cache_size
    for mode in ("cold", "hot", "graph"):
        run = timing.time_fn(lambda i: torch.mul(x, 2.0, out=y), "cuda", quick(mode=mode),
                             clock=ClockMonitor.for_device("cuda"))
        s = run.samples
        assert s.mode == mode and not s.fallback and 0 < s.median < 10
        assert s.clocks is None or s.clocks["readings"] >= 1
    assert run.graph is not None and run.samples.calls_per_sample > 1


# ----------------------------------------------------------------------------- the CUPTI timer (JAX)


def test_busy_per_call_takes_the_union_between_markers():
    acts = [("spin_kernel", 0, 1), ("flush", 1, 40), ("spin_kernel", 40, 41),
            ("a", 50, 60), ("b", 55, 70), ("c", 80, 90),        # call 0: union 20 + 10 = 30 us
            ("spin_kernel", 100, 101), ("flush", 101, 140), ("spin_kernel", 140, 141),
            ("a", 150, 155),                                      # call 1: 5 us
            ("spin_kernel", 160, 161)]
    assert timing.busy_per_call(list(reversed(acts)), 2) == pytest.approx([0.030, 0.005])
    with pytest.raises(RuntimeError, match="expected 5 marker kernels, saw 4"):
        timing.busy_per_call(acts[:-1], 2)


class FakeCupti:
    """Activities on a fake device timeline: markers, a flush, and a call made of two overlapping kernels."""

    def __init__(self, kernels_us):
        self.t, self.acts, self.kernels_us, self.log = 0.0, [], kernels_us, []

    def _act(self, name, us):
        self.acts.append((name, self.t, self.t + us))
        self.t += us

    def marker(self):
        self.log.append("marker")
        self._act("at::cuda::spin_kernel(long)", 1.0)

    def flush(self):
        self.log.append("flush")
        self._act("reduce_kernel (flush)", 35.0)

    def sync(self):
        self.log.append("sync")
        self.t += 3.0  # idle gaps are not busy time

    def call(self, i):
        self.log.append(("call", i))
        start = self.t + 50.0  # dispatch latency: not busy time either
        for k, us in enumerate(self.kernels_us(i)):
            self.acts.append((f"fusion_{k}", start, start + us))
            start += us * 0.5  # the next kernel overlaps half of this one (two streams)
        self.t = start + 100.0

    def profile(self, body):
        self.acts = []
        body()
        return list(self.acts)


def test_cupti_timer_measures_busy_time_and_wall_beside():
    gpu = FakeCupti(lambda i: [10.0, 10.0])  # two 10 us kernels overlapping by 5: 15 us busy
    clock = Clock()
    timer = timing.CuptiTimer(flush=gpu.flush, marker=gpu.marker, sync=gpu.sync, profile=gpu.profile, clock=clock)
    got = timer.run(gpu.call, 7, 3)
    assert got == pytest.approx([0.015] * 3)
    assert gpu.log[:5] == ["marker", "flush", "marker", "sync", ("call", 7)]
    assert len(timer.host_ms) == 3


def test_time_fn_times_jax_by_cupti_and_falls_back_with_the_reason(monkeypatch):
    gpu = FakeCupti(lambda i: [20.0] if i > 0 else [5000.0])  # a compile-like first call
    monkeypatch.setattr(timing, "cupti_works", lambda: "")
    monkeypatch.setattr(timing, "cupti_timer", lambda flush: timing.CuptiTimer(
        flush=flush, marker=gpu.marker, sync=gpu.sync, profile=gpu.profile))
    run = timing.time_fn(gpu.call, "cuda", quick(min_samples=10, max_samples=40), framework="jax")
    s = run.samples
    assert s.timer == "cupti_busy" and s.median == pytest.approx(0.020) and s.fallback == ""
    assert s.n >= 10 and s.host_ms is not None
    assert run.final_call() == pytest.approx(0.020)

    monkeypatch.setattr(timing, "cupti_works", lambda: "torch.profiler recorded no CUDA activity (no CUPTI)")
    fake = FakeGPU(lambda i: 2.0)
    run = timing.time_fn(fake.call, "cuda", quick(), framework="jax", event=fake.event)
    assert run.samples.timer == "cuda_event"  # the fake event path: no CUPTI asked for
    monkeypatch.setattr(timing, "EventTimer", lambda *a, **k: timing.CpuTimer())
    run = timing.time_fn(lambda i: None, "cuda", quick(), framework="jax")
    assert run.samples.fallback == "jax timed by wall time: torch.profiler recorded no CUDA activity (no CUPTI)"
