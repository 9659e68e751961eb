"""The measurement engine: one way to time a call, on a GPU or on the CPU.

    samples = time_fn(call, device="cuda", cfg=TimingConfig(mode="cold"))

`call(i)` runs call number i (the caller rotates input sets on i).  What the engine does:

Timers.  On CUDA each sample is bracketed by two CUDA events recorded on the current
stream (`cuda_event`); samples are queued in batches and read after one synchronize, so
the host stays ahead of the GPU.

Hold.  Before each sample the GPU is kept busy by a spin kernel (`torch.cuda._sleep`)
for `GpuHold.ms`: 1.5 x the median host time of the recent calls (what Python, the
framework and the launches take to queue one call) plus 20 us, at most HOLD_MAX_MS.  The
spin comes before the cold flush, so the call follows the flush at once rather than after
an idle memory system of a length that follows the host's speed (H100, a 23 us dgrad,
spins of 0.2 and 0.8 ms, two repeats: flush-spin-call medians 22.7-24.1 us,
spin-flush-call 23.8-24.1 us; scripts/diag/timing_repro.py).  The host therefore has the
whole call queued before the start event fires,
and the sample is the call's device time: kernels plus the gaps between them on the GPU,
not the host's launch latency, which varies with whatever else the host is doing.  The
host time per call is recorded beside (`Samples.host_ms`): when it exceeds the device
time, the call is launch-bound in a loop (graph mode removes that).  Torch, Triton and
cupy launch on the current stream, which the hold orders.  On the CPU, `time.perf_counter`
around the call and the framework's sync (`perf_counter`).  Graph mode times replays of a
captured CUDA graph (`cuda_graph`).

JAX (`cupti_busy`).  XLA launches from threads and onto streams of its own, and the JAX
implementation blocks on its results inside the call, so neither events on the current
stream nor a hold can bracket its work, and its wall time is mostly dispatch and the
host's wake-up (measured on the H100: 0.27-0.29 ms of wall time around 22 us of kernels
for a 1024x2048 layernorm; timed that way, 14 of 20 JAX medians of two runs were more than
2% apart, up to 38%).  Its samples are therefore its device busy time
from CUPTI (through torch.profiler, which records every kernel, copy and memset of the
process, XLA's included): per call, the length of the union of the intervals of the GPU
activities it ran, found between two marker kernels (a short spin) queued before the call
and after the flush.  Gaps between its kernels are not counted (for torch they are, a
microsecond or two per kernel boundary); the wall time per call is `host_ms`.  Without
CUPTI (no kineto CUDA activity), JAX falls back to the wall time, with the reason in
`Samples.fallback`.

Warm-up rule.  Call repeatedly, each call timed alone, until two consecutive calls agree
within `warmup_rtol` (5%) after at least `warmup_min` calls; or `warmup_max` calls; or
`warmup_budget_s` seconds after the first call ended (the first call is the one that
loads modules, compiles with NVRTC/Triton/Inductor, autotunes and builds cuDNN plans, so
it is never counted against the budget, however long it is).

Stop rule.  Sample in batches (the first `min_samples` long, later ones about `batch_s`
of wall time).  After each batch compute the median and its 95% confidence interval from
order statistics (distribution-free: ranks n/2 -+ 1.96 sqrt(n)/2 of the sorted samples).
Stop when the CI half-width is at most `rel_ci` (0.5%) of the median, with at least
`min_samples` kept samples; or at `max_samples`; or when `budget_s` of sampling time is
spent (`min_samples` wins over the budget: a call slower than the budget still gets them).

Modes.
  cold   before each sample, read a buffer of 2 x L2 (size read from the device) so the
         timed call finds none of its data in L2.  Reading, not writing: a zero-filled
         flush leaves dirty lines whose write-back the timed call would pay for.  On the
         CPU the flush reads 2 x the last-level cache (sysconf; 32 MiB if unknown).
         The samples rotate over several input sets, each its own allocation
         (`plan_rotation`: up to `cold_sets`, 16, while their total stays under
         COLD_SETS_BYTES, 512 MiB): a 20-60 us kernel's median moves by up to 5% with
         where its buffers sit (measured on the H100 over 5 fresh allocations: 0.4-4.9%),
         so one allocation per measurement made two runs disagree; a median over 16 does not
         hang on any one.
  hot    no flush: back-to-back calls on the same inputs, L2 warm where they fit.
  graph  capture N calls in one torch.cuda.CUDAGraph and time replays / N, which removes
         the launch gaps that dominate small cases (N auto: replays of about 2 ms, at most
         200 calls).  Inputs that fit in L2 rotate over k sets (the caller builds k copies,
         `plan_rotation`: k x footprint >= 2 x L2, at most 64), so the numbers are DRAM
         numbers like cold ones.  cupy is captured through an ExternalStream on the capture
         stream; JAX (XLA's own streams) and any capture that fails fall back to hot with
         the reason recorded in `Samples.fallback`.  No graphs on the CPU: hot, with reason.

Loop figure (`time_loop`).  The device time above is what the kernel costs; a training step
that calls it back to back also pays whatever the host needs to queue each call, once that is
longer than the kernel (measured on the H100: triton.testing.do_bench, a back-to-back timer,
read 1.7-2.9x the device time of triton, torch_compile and jax calls whose host time per call
exceeded their kernel time, and agreed within 2% elsewhere).  So after sampling (cold and hot
modes) the engine also runs LOOP_REPEATS loops of N calls with no hold, no flush and no sync
between them (the inputs still rotate over the sets), one sync before and one after each loop,
wall clock around it; `Samples.loop_ms` is the median loop time / N.  N (`loop_calls`) is about
LOOP_TARGET_MS of calls by max(device, host) time, within LOOP_MIN_CALLS..LOOP_MAX_CALLS.  A row
is host-bound when its host time per call exceeds its device time or its loop figure exceeds
HOST_BOUND_LOOP (1.1) x the device time (`host_bound`).  Graph mode: none (replays have no host).

Back-to-back device time (`time_b2b`, CUDA with the hold).  A loop can also exceed the cold device
time without the host being the cause: a call that follows another finds its L2 full of the dirty
lines of the previous call's outputs and pays their write-back, which a cold flush (a read) never
leaves (measured on the H100: triton layernorm bf16 8192x8192, 142.5 us cold, 152.2 us back to back
with the host out of the way, loop 153.5).  So the engine also queues the loop's N calls behind one spin
long enough for the host to queue them all (a batch that outlasts its spin is dropped and the spin
grows), between two events, LOOP_REPEATS times; `Samples.b2b_ms` is the median span / calls: the
device time of the loop's calls with no host gap.  A loop figure within
HOST_BOUND_LOOP x b2b_ms is the GPU's, not the host's: such a row is not host-bound by the loop rule.

Peak memory (`memory_probe`).  One more call after the loop, alone: on CUDA, the device memory
it allocates beyond its (already allocated) inputs and outputs -- workspace, fp32 accumulators,
autograd temporaries.  torch: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus
memory_allocated before; cupy: growth of the default memory pool's total_bytes over the call
after its free blocks were released (the pool keeps what a call freed, so that is its high-water
mark); JAX: none (XLA's peak cannot be reset per call): `Samples.peak_note` says so.  Not on the
CPU, not in graph mode.

Throttling.  The SM clock is read once per batch while the GPU runs it (NVML through
pynvml / nvidia-ml-py, else torch.cuda.clock_rate).  A sample whose clock is below
`throttle` (95%) of the highest clock seen this session is throttled: reported, dropped
from the statistics.  If fewer than 3 samples would remain, all are kept and the set is
marked `throttled_all`.  The device's maximum SM clock is recorded beside.  A set that comes back
throttled_all is taken once more after the GPU rested idle for `rest_s` (2 s): the power cap that
brought the clock down (a tuner's or the previous implementation's sustained load heats the next
one's samples) lifts within that, so rows of one run compare at one clock.  `Samples.rested_s` says
a set was retaken; throttled_all on it means the clock stayed down (the kernel's own load).
"""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

MODES = ("cold", "hot", "graph")
Z95 = 1.959964
MAX_ROTATE = 64
COLD_SETS_BYTES = 512 << 20
MARKER_CYCLES = 2000  # the CUPTI timer's marker spin: about a microsecond
MARKER_NAME = "spin_kernel"  # torch.cuda._sleep's kernel, as CUPTI names it
GRAPH_TARGET_MS = 2.0
GRAPH_MAX_CALLS = 200
LOOP_TARGET_MS, LOOP_MIN_CALLS, LOOP_MAX_CALLS, LOOP_REPEATS = 20.0, 10, 1000, 3
HOST_BOUND_LOOP = 1.1
# A backend's autotuner records its choices (JSON) in the file this names, and takes the ones already
# there untimed: `harness profile` tunes in a process of its own, then profiles with those choices.
TUNE_FILE_ENV = "GRADORACLE_TUNE_FILE"
B2B_SPIN_FACTOR, B2B_SPIN_PAD_MS, B2B_SPIN_MAX_MS = 1.5, 0.05, 200.0  # the spin before a back-to-back batch


# ----------------------------------------------------------------------------- config and results


@dataclass
class TimingConfig:
    mode: str = "cold"            # cold | hot | graph
    rel_ci: float = 0.005         # stop when the 95% CI half-width of the median <= rel_ci * median
    min_samples: int = 10
    max_samples: int = 500
    budget_s: float = 1.0         # sampling time budget (min_samples wins)
    warmup_rtol: float = 0.05     # warm when two consecutive calls agree within this
    warmup_min: int = 3
    warmup_max: int = 100
    warmup_budget_s: float = 0.5  # counted from the end of the first call
    throttle: float = 0.95        # samples below this fraction of the session's top SM clock are dropped
    rest_s: float = 2.0           # idle this long, then sample again, when every sample ran throttled; 0: never
    graph_calls: int = 0          # calls per graph replay; 0: auto
    rotate: int = 0               # input sets to rotate over; 0: auto (graph mode, cases that fit in L2)
    batch_s: float = 0.02         # wall time of one batch of samples after the first
    hold: bool = True             # CUDA, cold/hot: spin the GPU while the host queues each sample (GpuHold)
    cold_sets: int = 16           # cold mode: input sets (allocations) to rotate over, within COLD_SETS_BYTES
    loop: bool = True             # cold/hot: also time back-to-back calls (the loop figure, `time_loop`)
    loop_calls: int = 0           # calls per loop; 0: auto (about LOOP_TARGET_MS of calls, LOOP_MIN..LOOP_MAX)
    memory: bool = True           # cold/hot, CUDA: measure the peak extra device memory of one call

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"timing mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.rest_s < 0:
            raise ValueError(f"rest_s {self.rest_s}: expected seconds >= 0")
        if self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError(f"need 1 <= min_samples ({self.min_samples}) <= max_samples ({self.max_samples})")

    @classmethod
    def quick(cls, mode: str = "hot") -> "TimingConfig":
        """Small budget: `run --time` and the CI smoke benchmark."""
        return cls(mode=mode, rel_ci=0.02, min_samples=5, max_samples=50, budget_s=0.05, warmup_max=10,
                   warmup_budget_s=0.05, loop=False, memory=False)

    def to_json(self) -> dict:
        return asdict(self)


def median_ci(times) -> tuple[float, float]:
    """Distribution-free 95% CI of the median: order statistics at ranks n/2 -+ 1.96 sqrt(n)/2."""
    x = np.sort(np.asarray(times, dtype=np.float64))
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    half = Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)) - 1, 0)  # 1-based rank floor(n/2 - h) -> 0-based
    hi = min(int(math.ceil(1 + n / 2 + half)) - 1, n - 1)
    return float(x[lo]), float(x[hi])


def rel_ci(times) -> float:
    if len(times) == 0:
        return math.inf
    lo, hi = median_ci(times)
    med = float(np.median(times))
    return (hi - lo) / 2 / med if med > 0 else math.inf


def summarize(times) -> dict:
    """median, min, max, mean, p10, p25, p75, p90, 95% CI of the median, its relative half-width, MAD."""
    x = np.asarray(times, dtype=np.float64)
    if len(x) == 0:
        return {k: None for k in ("median", "min", "max", "mean", "p10", "p25", "p75", "p90", "ci_lo", "ci_hi",
                                  "rel_ci", "mad")}
    med = float(np.median(x))
    lo, hi = median_ci(x)
    p10, p25, p75, p90 = (float(v) for v in np.percentile(x, [10, 25, 75, 90]))
    return {"median": med, "min": float(x.min()), "max": float(x.max()), "mean": float(x.mean()),
            "p10": p10, "p25": p25, "p75": p75, "p90": p90, "ci_lo": lo, "ci_hi": hi,
            "rel_ci": (hi - lo) / 2 / med if med > 0 else None, "mad": float(np.median(np.abs(x - med)))}


@dataclass
class Samples:
    """One sample set: kept times (ms per call), dropped (throttled) ones, and how they were taken."""

    times_ms: list
    mode: str
    timer: str
    dropped_ms: list = field(default_factory=list)
    stop: str = ""                 # converged | max_samples | budget | budget_throttled
    warmup: dict = field(default_factory=dict)
    clocks: dict | None = None
    calls_per_sample: int = 1
    rotate: int = 1
    flush_bytes: int = 0
    requested_mode: str = ""
    fallback: str = ""             # why the requested mode was not used
    elapsed_s: float = 0.0
    throttled_all: bool = False
    rested_s: float = 0.0          # the idle rest before this set: a first set ran throttled throughout
    final_ms: float | None = None  # the re-validated final call (not in the statistics)
    host_ms: float | None = None   # median host time to queue one call (sampling phase)
    hold_ms: float = 0.0           # the GPU hold before each sample's start event (0: none)
    loop_ms: float | None = None   # per call, median over LOOP_REPEATS loops of back-to-back calls (`time_loop`)
    loop_calls: int = 0            # calls in each of those loops
    b2b_ms: float | None = None    # per call: loop_calls calls queued behind a spin, between two events (`time_b2b`)
    peak_extra_bytes: int | None = None  # device memory one call allocates beyond its inputs and outputs
    peak_note: str = ""            # how peak_extra_bytes was read, or why it was not

    @property
    def n(self) -> int:
        return len(self.times_ms)

    @property
    def dropped(self) -> int:
        return len(self.dropped_ms)

    @property
    def median(self) -> float:
        return float(np.median(self.times_ms))

    def stats(self) -> dict:
        return summarize(self.times_ms)

    def to_json(self) -> dict:
        out = self.stats()
        out.update(n=self.n, dropped=self.dropped, mode=self.mode, requested_mode=self.requested_mode or self.mode,
                   timer=self.timer, stop=self.stop, warmup=self.warmup, clocks=self.clocks,
                   calls_per_sample=self.calls_per_sample, rotate=self.rotate, flush_bytes=self.flush_bytes,
                   fallback=self.fallback, elapsed_s=round(self.elapsed_s, 4), throttled_all=self.throttled_all,
                   rested_s=self.rested_s,
                   final_ms=self.final_ms, host_ms=self.host_ms, hold_ms=round(self.hold_ms, 4),
                   loop_ms=self.loop_ms, loop_calls=self.loop_calls, b2b_ms=self.b2b_ms,
                   peak_extra_bytes=self.peak_extra_bytes,
                   peak_note=self.peak_note,
                   samples_ms=[float(f"{t:.6g}") for t in self.times_ms],
                   dropped_ms=[float(f"{t:.6g}") for t in self.dropped_ms])
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Samples":
        return cls(times_ms=list(d.get("samples_ms", [])), mode=d.get("mode", ""), timer=d.get("timer", ""),
                   dropped_ms=list(d.get("dropped_ms", [])), stop=d.get("stop", ""), warmup=d.get("warmup", {}),
                   clocks=d.get("clocks"), calls_per_sample=d.get("calls_per_sample", 1), rotate=d.get("rotate", 1),
                   flush_bytes=d.get("flush_bytes", 0), requested_mode=d.get("requested_mode", ""),
                   fallback=d.get("fallback", ""), elapsed_s=d.get("elapsed_s", 0.0),
                   throttled_all=d.get("throttled_all", False), rested_s=d.get("rested_s", 0.0),
                   final_ms=d.get("final_ms"),
                   host_ms=d.get("host_ms"), hold_ms=d.get("hold_ms", 0.0), loop_ms=d.get("loop_ms"),
                   loop_calls=d.get("loop_calls", 0), b2b_ms=d.get("b2b_ms"), peak_extra_bytes=d.get("peak_extra_bytes"),
                   peak_note=d.get("peak_note", ""))


# ----------------------------------------------------------------------------- clocks


class ClockMonitor:
    """Reads the SM clock in MHz and remembers the highest reading of the session.

    `read` is any zero-argument callable returning MHz (or None); tests pass fakes.
    """

    def __init__(self, read: Callable[[], float | None] | None = None, source: str = "none",
                 max_supported_mhz: float | None = None):
        self._read = read
        self.source = source if read else "none"
        self.max_supported_mhz = max_supported_mhz
        self.max_seen: float = 0.0

    def read(self) -> float | None:
        if self._read is None:
            return None
        try:
            mhz = self._read()
        except Exception:  # a flaky NVML read must not lose a measurement
            return None
        if mhz:
            self.max_seen = max(self.max_seen, float(mhz))
            return float(mhz)
        return None

    @property
    def reference(self) -> float | None:
        return self.max_seen or None

    @classmethod
    def for_device(cls, device: str) -> "ClockMonitor":
        """NVML through pynvml if importable, else torch.cuda.clock_rate, else no clock (the CPU)."""
        if not device.startswith("cuda"):
            return cls()
        index = int(device.split(":")[1]) if ":" in device else None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = _nvml_handle(pynvml, index)
            top = None
            try:
                top = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
            except Exception:
                pass
            return cls(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM), "nvml", top)
        except Exception:
            pass
        try:
            import torch

            torch.cuda.clock_rate(index)
            return cls(lambda: torch.cuda.clock_rate(index), "torch.cuda.clock_rate")
        except Exception:
            return cls()


def _nvml_handle(pynvml, index):
    """The NVML handle of torch's device `index`, matched by UUID (CUDA_VISIBLE_DEVICES renumbers)."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        return pynvml.nvmlDeviceGetHandleByIndex(index or 0)


def clock_summary(mhz: list, clock: ClockMonitor | None, throttled: int) -> dict | None:
    seen = [m for m in mhz if m]
    if clock is None or clock.source == "none":
        return None
    return {"source": clock.source, "readings": len(seen),
            "min_mhz": min(seen) if seen else None, "median_mhz": float(np.median(seen)) if seen else None,
            "max_mhz": max(seen) if seen else None, "reference_mhz": clock.reference,
            "max_supported_mhz": clock.max_supported_mhz, "throttled": throttled}


# ----------------------------------------------------------------------------- timers and flushes


class CpuTimer:
    """perf_counter around each call (and the framework's sync)."""

    name = "perf_counter"

    def __init__(self, sync: Callable[[], None] | None = None, flush: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.sync, self.flush, self._clock = sync, flush, clock

    def run(self, call, start: int, count: int, during=None) -> list:
        out = []
        for j in range(count):
            if self.flush:
                self.flush()
            t0 = self._clock()
            call(start + j)
            if self.sync:
                self.sync()
            out.append((self._clock() - t0) * 1e3)
        if during:
            during()
        return out


class GpuHold:
    """A spin kernel on the current stream before each sample (see Hold in the module docstring).

    `sleep(cycles)` queues the spin; `cycles_per_ms` converts (calibrated once per process by
    timing a long spin with events).  `adapt` sets the length from the host times of recent calls.
    """

    def __init__(self, sleep: Callable[[int], None], cycles_per_ms: float):
        self.sleep, self.cycles_per_ms = sleep, float(cycles_per_ms)
        self.ms = 0.0
        self.recent: list = []

    def __call__(self):
        if self.ms > 0:
            self.sleep(int(self.ms * self.cycles_per_ms))

    def spin_ms(self, ms: float) -> None:
        """One spin of `ms` (the back-to-back batches of `time_b2b`)."""
        self.sleep(int(ms * self.cycles_per_ms))

    def adapt(self, host_ms: list) -> None:
        self.recent = (self.recent + list(host_ms))[-HOLD_WINDOW:]
        self.ms = min(HOLD_MAX_MS, HOLD_FACTOR * float(np.median(self.recent)) + HOLD_PAD_MS)

    @classmethod
    def for_cuda(cls) -> "GpuHold":
        import torch

        if "cuda" not in _HOLD_RATE:
            torch.cuda._sleep(1000)  # load the kernel
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 5_000_000
            begin.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            _HOLD_RATE["cuda"] = cycles / max(begin.elapsed_time(end), 1e-3)
        return cls(torch.cuda._sleep, _HOLD_RATE["cuda"])


HOLD_FACTOR, HOLD_PAD_MS, HOLD_MAX_MS, HOLD_WINDOW = 1.5, 0.02, 2.0, 16
_HOLD_RATE: dict = {}


class EventTimer:
    """CUDA events around each call, a batch queued and then read after one synchronize.

    `during` runs after the batch is queued, while the GPU works through it (the clock read).
    `wait` (JAX) runs after each flush: a framework launching on streams of its own would
    otherwise overlap the flush, which only orders work on the current stream.
    `hold` (a GpuHold) spins the GPU before each start event while the host queues the call;
    the host time of every call is kept in `host_ms`.
    """

    name = "cuda_event"

    def __init__(self, flush: Callable[[], None] | None = None, event: Callable[[], object] | None = None,
                 wait: Callable[[], None] | None = None, hold: GpuHold | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if event is None:
            import torch

            def event():
                return torch.cuda.Event(enable_timing=True)
        self.flush, self._event, self.wait, self.hold, self._clock = flush, event, wait, hold, clock
        self.host_ms: list = []

    def run(self, call, start: int, count: int, during=None) -> list:
        pairs = [(self._event(), self._event()) for _ in range(count)]
        host = []
        for j, (begin, end) in enumerate(pairs):
            if self.hold:  # before the flush: the call starts right after it, with DRAM awake
                self.hold()
            if self.flush:
                self.flush()
                if self.wait:
                    self.wait()
            begin.record()
            t0 = self._clock()
            call(start + j)
            host.append((self._clock() - t0) * 1e3)
            end.record()
        self.host_ms.extend(host)
        if self.hold:
            self.hold.adapt(host)
        if during:
            during()
        pairs[-1][1].synchronize()
        return [begin.elapsed_time(end) for begin, end in pairs]


def busy_per_call(activities, count: int, marker: str = MARKER_NAME) -> list:
    """Per call, the ms its GPU activities kept the device busy (the union of their intervals).

    `activities`: (name, start_us, end_us) of every GPU activity of a CuptiTimer batch, in any
    order.  The batch queued, per call, marker, flush, marker, call, and one marker at the end:
    call j's activities lie between markers 2j+1 and 2j+2 (the flush between 2j and 2j+1).
    """
    acts = sorted(activities, key=lambda a: (a[1], a[2]))
    at = [i for i, a in enumerate(acts) if marker in a[0]]
    if len(at) != 2 * count + 1:
        raise RuntimeError(f"CUPTI timer: expected {2 * count + 1} marker kernels, saw {len(at)}")
    out = []
    for j in range(count):
        inside = sorted((a[1], a[2]) for a in acts[at[2 * j + 1] + 1:at[2 * j + 2]])
        busy, end = 0.0, -math.inf
        for lo, hi in inside:  # union of intervals: concurrent streams count once
            if hi > end:
                busy += hi - max(lo, end)
                end = hi
        out.append(busy / 1e3)
    return out


def torch_cuda_activities(body) -> list:
    """Run `body` under torch.profiler (CUPTI) and return every GPU activity as (name, start_us, end_us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        body()
    cuda = torch.autograd.DeviceType.CUDA
    return [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
            if e.device_type == cuda]


class CuptiTimer:
    """Device busy time of calls that launch on streams of their own (JAX); see the module docstring.

    `marker()` queues the marker kernel, `sync()` waits for the whole device, `profile(body)`
    runs body and returns its GPU activities; all replaceable so tests fake the GPU.
    """

    name = "cupti_busy"
    min_batch = 10  # a profiler session per batch costs milliseconds: amortise it

    def __init__(self, flush: Callable[[], None] | None = None, marker: Callable[[], None] | None = None,
                 sync: Callable[[], None] | None = None, profile: Callable | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if marker is None or sync is None:
            import torch

            marker = marker or (lambda: torch.cuda._sleep(MARKER_CYCLES))
            sync = sync or torch.cuda.synchronize
        self.flush, self.marker, self.sync = flush, marker, sync
        self.profile = profile or torch_cuda_activities
        self._clock = clock
        self.host_ms: list = []

    def run(self, call, start: int, count: int, during=None) -> list:
        host = []

        def body():
            for j in range(count):
                self.marker()
                if self.flush:
                    self.flush()
                self.marker()
                self.sync()  # the flush is over before the call's first kernel
                t0 = self._clock()
                call(start + j)
                self.sync()
                host.append((self._clock() - t0) * 1e3)
            self.marker()
            if during:
                during()
            self.sync()

        times = busy_per_call(self.profile(body), count)
        self.host_ms.extend(host)
        return times


_CUPTI: dict = {}


def cupti_timer(flush) -> CuptiTimer:
    """The CUPTI timer on the real GPU (a function, so tests can replace it)."""
    return CuptiTimer(flush)


def cupti_works() -> str:
    """'' when torch.profiler sees GPU activities here (checked once per process), else why not."""
    if "reason" not in _CUPTI:
        try:
            import torch

            acts = torch_cuda_activities(lambda: (torch.cuda._sleep(MARKER_CYCLES), torch.cuda.synchronize()))
            _CUPTI["reason"] = "" if any(MARKER_NAME in a[0] for a in acts) else \
                "torch.profiler recorded no CUDA activity (no CUPTI)"
        except Exception as exc:  # no kineto, no CUPTI, a profiler already running
            _CUPTI["reason"] = f"torch.profiler unusable ({type(exc).__name__}: {exc})"
    return _CUPTI["reason"]


class GraphTimer:
    """Events around each replay of a graph of `calls` calls; a sample is replay time / calls."""

    name = "cuda_graph"

    def __init__(self, graph, calls: int, event: Callable[[], object] | None = None):
        self.graph, self.calls = graph, calls
        self._events = EventTimer(None, event)

    def run(self, call, start: int, count: int, during=None) -> list:
        return [t / self.calls for t in self._events.run(lambda i: self.graph.replay(), start, count, during)]


class L2Flush:
    """Reads (sums) a float32 buffer of `nbytes` on the device: L2 ends up full of clean, unrelated lines."""

    def __init__(self, nbytes: int, device: str = "cuda"):
        import torch

        self.nbytes = int(nbytes)
        self.buf = torch.ones(max(self.nbytes // 4, 1), dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self):
        import torch

        torch.sum(self.buf, dim=0, out=self.sink)


class CpuFlush:
    """Reads a host buffer of `nbytes` (2 x the last-level cache)."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.buf = np.ones(max(self.nbytes // 8, 1), dtype=np.float64)

    def __call__(self):
        self.buf.sum()


def cache_bytes(device: str) -> int:
    """The device's L2 (CUDA, from its properties) or the host's last-level cache (sysconf), in bytes."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(_index(device)).L2_cache_size)
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            size = 0
        if size and size > 0:
            return int(size)
    return 16 << 20


def _index(device: str) -> int:
    if ":" in device:
        return int(device.split(":")[1])
    import torch

    return torch.cuda.current_device()


_FLUSHES: dict = {}


def flush_for(device: str):
    """One flush buffer per device, made on first use: 2 x its cache size."""
    if device not in _FLUSHES:
        size = 2 * cache_bytes(device)
        _FLUSHES[device] = L2Flush(size, device) if device.startswith("cuda") else CpuFlush(min(size, 256 << 20))
    return _FLUSHES[device]


# ----------------------------------------------------------------------------- the engine


def warm_up(run_one: Callable[[int], float], cfg: TimingConfig, now: Callable[[], float] = time.perf_counter) -> dict:
    """Call until two consecutive timings agree (see the module docstring); returns what happened."""
    times: list = []
    started = now()
    first_done = None
    stop = ""
    while True:
        times.append(float(run_one(len(times))))
        if first_done is None:
            first_done = now()
        n = len(times)
        if n >= max(cfg.warmup_min, 2):
            a, b = times[-2], times[-1]
            if abs(a - b) <= cfg.warmup_rtol * min(a, b):
                stop = "converged"
                break
        if n >= cfg.warmup_max:
            stop = "max_calls"
            break
        if n >= 2 and now() - first_done >= cfg.warmup_budget_s:
            stop = "budget"
            break
    return {"calls": len(times), "first_ms": times[0], "last_ms": times[-1], "stop": stop,
            "seconds": round(now() - started, 4), "times_ms": [float(f"{t:.6g}") for t in times[:12]]}


def _split(times, mhz, reference, throttle):
    if not reference:
        return list(times), []
    limit = throttle * reference
    kept = [t for t, m in zip(times, mhz) if m is None or m >= limit]
    dropped = [t for t, m in zip(times, mhz) if m is not None and m < limit]
    return kept, dropped


def measure(call, timer, cfg: TimingConfig, clock: ClockMonitor | None = None,
            now: Callable[[], float] = time.perf_counter, start: int = 0, warmup: dict | None = None,
            sleep: Callable[[float], None] = time.sleep) -> "Samples":
    """Warm up (unless `warmup` says it was done), then sample until the stop rule holds; a set
    that ran throttled throughout is taken again after `cfg.rest_s` of idle GPU."""
    index = start
    if warmup is None:
        warmup = warm_up(lambda i: timer.run(call, start + i, 1)[0], cfg, now)
        index += warmup["calls"]
    t0 = now()
    rested = 0.0
    while True:
        times, mhz, stop, index = _sample_set(call, timer, cfg, clock, now, index)
        kept, dropped = _split(times, mhz, clock.reference if clock else None, cfg.throttle)
        if len(kept) >= min(3, len(times)) or rested or not cfg.rest_s:
            break
        sleep(cfg.rest_s)  # the timer synchronised: the GPU idles, then one more set
        rested = cfg.rest_s
    throttled_all = False
    if len(kept) < min(3, len(times)):
        kept, dropped, throttled_all = list(times), [], True
    samples = Samples(kept, cfg.mode, timer.name, dropped_ms=dropped, stop=stop, warmup=warmup,
                      clocks=clock_summary(mhz, clock, len(dropped)), requested_mode=cfg.mode,
                      elapsed_s=now() - t0, throttled_all=throttled_all, rested_s=rested)
    host = getattr(timer, "host_ms", None)
    if host:
        samples.host_ms = float(np.median(host[-len(times):]))
    hold = getattr(timer, "hold", None)
    samples.hold_ms = float(hold.ms) if hold else 0.0
    samples._next_index = index
    return samples


def _sample_set(call, timer, cfg: TimingConfig, clock: ClockMonitor | None, now, index: int):
    """Batches of samples from call `index` on until the stop rule holds -> (times, clock per time,
    stop, next index)."""
    times: list = []
    mhz: list = []
    reading: list = [None]

    def during():
        reading[0] = clock.read() if clock is not None else None

    t0 = now()
    batch = cfg.min_samples
    while True:
        got = timer.run(call, index, batch, during)
        index += len(got)
        times.extend(float(t) for t in got)
        mhz.extend([reading[0]] * len(got))
        kept, _ = _split(times, mhz, clock.reference if clock else None, cfg.throttle)
        elapsed = now() - t0
        if len(times) >= cfg.max_samples:
            return times, mhz, "max_samples", index
        if len(kept) >= cfg.min_samples:
            if rel_ci(kept) <= cfg.rel_ci:
                return times, mhz, "converged", index
            if elapsed >= cfg.budget_s:
                return times, mhz, "budget", index
        elif elapsed >= 3 * cfg.budget_s:
            return times, mhz, "budget_throttled", index
        per = elapsed / len(times) if elapsed > 0 else 0.0
        if per > 0:
            want = int(min(cfg.batch_s, max(cfg.budget_s - elapsed, per)) / per)
        else:
            want = cfg.min_samples
        want = max(want, 1, cfg.min_samples - len(kept), getattr(timer, "min_batch", 1))
        batch = max(1, min(want, cfg.max_samples - len(times)))


def loop_calls(cfg: TimingConfig, device_ms: float | None, host_ms: float | None) -> int:
    """Calls per loop: cfg.loop_calls, else about LOOP_TARGET_MS by the slower of device and host time."""
    if cfg.loop_calls:
        return int(cfg.loop_calls)
    per = max(device_ms or 0.0, host_ms or 0.0)
    if per <= 0:
        return LOOP_MIN_CALLS
    return int(min(LOOP_MAX_CALLS, max(LOOP_MIN_CALLS, math.ceil(LOOP_TARGET_MS / per))))


def time_loop(call, start: int, calls: int, sync: Callable[[], None] | None,
              now: Callable[[], float] = time.perf_counter, repeats: int = LOOP_REPEATS) -> float:
    """Per-call ms of `calls` back-to-back calls (indices from `start`), the median of `repeats` loops:
    no hold, flush or sync between calls; one sync before (nothing else queued) and one after."""
    sync = sync or (lambda: None)
    per = []
    index = start
    for _ in range(repeats):
        sync()
        t0 = now()
        for _ in range(calls):
            call(index)
            index += 1
        sync()
        per.append((now() - t0) * 1e3 / calls)
    return float(np.median(per))


def time_b2b(call, start: int, calls: int, hold: GpuHold, event: Callable[[], object], host_ms: float,
             now: Callable[[], float] = time.perf_counter, repeats: int = LOOP_REPEATS) -> tuple[float | None, int]:
    """(device ms per call, the next free index) of batches of `calls` back-to-back calls (indices from
    `start`) with the host out of the way: each batch is queued behind one spin of B2B_SPIN_FACTOR x the
    host time of the batch (host_ms per call at first), between two events; the median of `repeats`
    batches.  A batch whose queueing took longer than its spin (the GPU may have waited for the host) is
    not counted, and the spin grows to cover it; None when no batch could be covered within
    B2B_SPIN_MAX_MS."""
    spin = min(B2B_SPIN_MAX_MS, B2B_SPIN_FACTOR * calls * host_ms + B2B_SPIN_PAD_MS)
    per = []
    index = start
    for _ in range(repeats + 2):  # two batches to spare for a spin that was too short
        begin, end = event(), event()
        hold.spin_ms(spin)
        begin.record()
        t0 = now()
        for _ in range(calls):
            call(index)
            index += 1
        queued = (now() - t0) * 1e3
        end.record()
        end.synchronize()
        if queued < spin:
            per.append(begin.elapsed_time(end) / calls)
            if len(per) == repeats:
                break
        else:
            spin = min(B2B_SPIN_MAX_MS, B2B_SPIN_FACTOR * queued + B2B_SPIN_PAD_MS)
    return (float(np.median(per)) if per else None), index


def host_bound(t: dict) -> bool:
    """Whether a timing record (Samples.to_json()) is host-bound: host time per call above the device
    time, or the loop figure above HOST_BOUND_LOOP x the device time, unless it is also within
    HOST_BOUND_LOOP x the back-to-back device time (then the GPU, not the host, made the loop slower)."""
    med, host, loop, b2b = t.get("median"), t.get("host_ms"), t.get("loop_ms"), t.get("b2b_ms")
    if not med:
        return False
    slow_loop = loop is not None and loop > HOST_BOUND_LOOP * med and not (b2b and loop <= HOST_BOUND_LOOP * b2b)
    return bool((host is not None and host > med) or slow_loop)


class TorchPeak:
    """Peak extra device memory of one call through torch's caching allocator."""

    note = "torch.cuda.max_memory_allocated over the call, minus memory_allocated before"

    def __init__(self, device: str):
        import torch

        self.torch, self.device = torch, torch.device(device)

    def __call__(self, run_one: Callable[[], None]) -> int:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        before = cuda.memory_allocated(self.device)
        cuda.reset_peak_memory_stats(self.device)
        run_one()
        cuda.synchronize(self.device)
        return int(cuda.max_memory_allocated(self.device) - before)


class CupyPeak:
    """Peak extra device memory of one call through cupy's default memory pool."""

    note = "cupy default pool: growth of total_bytes over the call, free blocks released before"

    def __call__(self, run_one: Callable[[], None]) -> int:
        import cupy

        pool = cupy.get_default_memory_pool()
        cupy.cuda.get_current_stream().synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        run_one()
        cupy.cuda.get_current_stream().synchronize()
        return int(pool.total_bytes() - before)


def memory_probe(framework: str, device: str) -> tuple[Callable | None, str]:
    """(probe(run_one) -> extra bytes, note) for a framework on a device; (None, why not) where none."""
    if not device.startswith("cuda"):
        return None, "not measured on the CPU"
    if framework == "torch":
        return TorchPeak(device), TorchPeak.note
    if framework == "cupy":
        return CupyPeak(), CupyPeak.note
    return None, f"{framework}: its allocator's peak cannot be read per call"


def effective_mode(mode: str, device: str) -> tuple[str, str]:
    """(mode used, reason it differs) for a device: no graphs on the CPU."""
    if mode == "graph" and not device.startswith("cuda"):
        return "hot", "graph mode needs a CUDA device: timed as hot"
    return mode, ""


def plan_rotation(cfg: TimingConfig, mode: str, footprint_bytes: int, cache: int) -> int:
    """Input sets to rotate over.  graph: cases that fit in the cache, k x footprint >= 2 x cache.
    cold: `cfg.cold_sets` allocations while k x footprint <= COLD_SETS_BYTES (see Modes)."""
    if cfg.rotate:
        return max(1, int(cfg.rotate))
    if mode == "cold" and footprint_bytes > 0:
        return int(max(1, min(cfg.cold_sets, COLD_SETS_BYTES // footprint_bytes)))
    if mode != "graph" or footprint_bytes <= 0 or cache <= 0 or footprint_bytes >= cache:
        return 1
    return int(min(MAX_ROTATE, math.ceil(2 * cache / footprint_bytes)))


def graph_calls(cfg: TimingConfig, call_ms: float) -> int:
    if cfg.graph_calls:
        return int(cfg.graph_calls)
    if not call_ms or call_ms <= 0:
        return 1
    return int(min(GRAPH_MAX_CALLS, max(1, math.ceil(GRAPH_TARGET_MS / call_ms))))


def _capture_stream_context(framework: str, stream):
    """Make a framework launch on the capture stream: cupy through an ExternalStream."""
    if framework == "cupy":
        import cupy

        return cupy.cuda.ExternalStream(stream.cuda_stream)
    return nullcontext()


def capture_graph(call, calls: int, start: int, framework: str, torch=None):
    """(graph, None) with `calls` calls captured (indices start+2 ...), or (None, reason).

    Two calls run first on the capture stream (allocator pools, library handles, cupy's pool
    for that stream), then capture; any exception means no graph and a recorded reason.
    """
    if framework == "jax":
        return None, "jax: XLA launches on its own streams, which a torch CUDA graph cannot capture: timed as hot"
    if framework not in ("torch", "cupy"):
        return None, f"{framework}: no CUDA graph capture for this framework: timed as hot"
    if torch is None:
        import torch
    stream = torch.cuda.Stream()
    try:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), _capture_stream_context(framework, stream):
            call(start)
            call(start + 1)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            with _capture_stream_context(framework, stream):
                for i in range(calls):
                    call(start + 2 + i)
        torch.cuda.synchronize()
        return graph, None
    except Exception as exc:
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        return None, f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): timed as hot"


@dataclass
class TimedRun:
    """A finished measurement, and how to make the one more (re-validated) call that follows it."""

    samples: Samples
    last_index: int            # index of the call whose outputs the next `final_call` leaves behind
    final_call: Callable[[], float]
    graph: object = None


def time_fn(call, device: str, cfg: TimingConfig, framework: str = "torch", sync: Callable[[], None] | None = None,
            clock: ClockMonitor | None = None, rotate: int = 1, now: Callable[[], float] = time.perf_counter,
            capture=capture_graph, event: Callable[[], object] | None = None,
            hold: GpuHold | None = None, memory=None) -> TimedRun:
    """Measure `call(i)` on `device` in `cfg.mode`; see the module docstring for every rule.

    `capture`, `event` (a CUDA event factory), `hold` and `memory` (a memory probe, see
    `memory_probe`) are replaceable so tests can fake the GPU; by default the hold is the real
    spin kernel when `cfg.hold` and the framework queues on the current stream (not JAX), and the
    memory probe the framework's (none with a fake event factory).
    """
    mode, fallback = effective_mode(cfg.mode, device)
    cuda = device.startswith("cuda")
    flush = flush_for(device) if mode == "cold" else None
    timer_note = ""
    if not cuda:
        timer = CpuTimer(sync, flush)
    elif framework == "jax" and event is None and not (timer_note := cupti_works()):
        timer = cupti_timer(flush)
    else:
        if timer_note:
            timer_note = f"jax timed by wall time: {timer_note}"
        wait = None
        if framework == "jax" and flush is not None and event is None:
            import torch

            wait = torch.cuda.current_stream().synchronize  # wall time: the flush must be over first
        if hold is None and cfg.hold and framework != "jax" and event is None:
            hold = GpuHold.for_cuda()
        timer = EventTimer(flush, event, wait, hold if framework != "jax" else None)
    if mode != "graph":
        samples = measure(call, timer, cfg, clock, now)
        nxt = samples._next_index
        if cfg.loop:  # after sampling: the calls are warm, and the samples are not disturbed
            samples.loop_calls = loop_calls(cfg, samples.median, samples.host_ms)
            samples.loop_ms = time_loop(call, nxt, samples.loop_calls, sync, now)
            nxt += samples.loop_calls * LOOP_REPEATS
            b2b_hold = getattr(timer, "hold", None)
            if b2b_hold is not None and hasattr(b2b_hold, "spin_ms") and samples.host_ms is not None:
                samples.b2b_ms, nxt = time_b2b(call, nxt, samples.loop_calls, b2b_hold, timer._event,
                                               samples.host_ms, now)
        if cfg.memory:
            if memory is None:
                memory, samples.peak_note = memory_probe(framework, device) if event is None else (None, "")
            else:
                samples.peak_note = getattr(memory, "note", "")
            if memory is not None:
                samples.peak_extra_bytes = memory(lambda nxt=nxt: call(nxt))
                nxt += 1

        def final_call(nxt=nxt):
            return timer.run(call, nxt, 1)[0]

        run = TimedRun(samples, nxt, final_call)
    else:
        eager = warm_up(lambda i: timer.run(call, i, 1)[0], cfg, now)
        n = graph_calls(cfg, eager["last_ms"])
        graph, reason = capture(call, n, eager["calls"], framework)
        if graph is None:
            mode, fallback = "hot", reason
            samples = measure(call, timer, cfg, clock, now, start=eager["calls"] + 2, warmup=eager)
            nxt = samples._next_index

            def final_call(nxt=nxt):
                return timer.run(call, nxt, 1)[0]

            run = TimedRun(samples, nxt, final_call)
        else:
            gtimer = GraphTimer(graph, n, event)
            samples = measure(None, gtimer, cfg, clock, now)
            samples.warmup = {**samples.warmup, "eager": eager}
            samples.calls_per_sample = n
            run = TimedRun(samples, eager["calls"] + 2 + n - 1, lambda: gtimer.run(None, 0, 1)[0] * n, graph)
    s = run.samples
    if run.graph is not None and cfg.memory:
        s.peak_note = "not measured in graph mode"
    s.mode, s.requested_mode = mode, cfg.mode
    s.fallback = "; ".join(r for r in (fallback, timer_note) if r)
    s.rotate = rotate
    s.flush_bytes = getattr(flush, "nbytes", 0) if flush else 0
    return run
