"""The benchmark driver behind `python -m harness bench` and tests/test_benchmark.py.

For each selected case (in registry order) and each implementation that can run it
(baseline first), `runner.timed_check` times the implementation with the timing engine
(harness/timing.py) and re-validates the outputs of one more timed call against the
oracle.  Inputs: the timed calls read input set 1 of the case (another seed of it, no
oracle needed); the final call reads set 0, refilled in place into the same buffers: the
case's `run` inputs, whose oracle judges it.  So the first call any implementation ever
sees differs from the one that is judged, and a cached or stale result fails.

Outputs with more than 4M elements are judged on 1M elements gathered on the device, with
the NaN count checked over all of them (`runner.judge(sample_above=...)`); `--full-validation`
judges every element.  While one case is timed, up to `prefetch` later cases have their
inputs generated and their numpy oracle computed in threads (`prepare.prepare(defer_gpu=True)`:
host work only; an oracle that runs on the GPU, JAX for the largest cases, is computed in the
main thread between timings, `prepare.finish`, so it never overlaps a measurement).

Rows are `results.CaseResult`s with the bench's own keys in `extra` (backend, variant,
baseline, library (a backends/baselines library), variant_rank, framework, case_json, cost,
footprint_bytes); the results document holds their JSON, to which harness/report/figures.py adds `figures`.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from harness import ceilings as _ceilings
from harness import prepare as _prepare
from harness import prepared as _prepared
from harness import runner, status, timing
from harness.registry import Impl, baseline_for, get_op, is_baseline
from harness.report.figures import add_figures
from harness.report.files import SCHEMA
from harness.results import CHECKPOINT_S, CaseResult
from harness.selection import select


@dataclass
class BenchOptions:
    device: str
    timing: timing.TimingConfig = field(default_factory=timing.TimingConfig)
    seed: int = 0
    oracle: str = "auto"
    sample_above: int | None = _prepared.SAMPLE_ABOVE
    prefetch: int = 0
    time_limit_s: float | None = None
    progress: bool = True

    def to_json(self) -> dict:
        """What an isolate worker needs to time a pair as this process would (`in_worker`)."""
        return {"device": self.device, "timing": self.timing.to_json(), "seed": self.seed, "oracle": self.oracle,
                "sample_above": self.sample_above, "prefetch": self.prefetch}

    @classmethod
    def from_json(cls, obj: dict) -> "BenchOptions":
        return cls(obj["device"], timing.TimingConfig(**obj["timing"]), obj["seed"], obj["oracle"],
                   obj["sample_above"], prefetch=obj.get("prefetch", 0), progress=False)


def default_prefetch() -> int:
    """Threads preparing later cases: a quarter of the cores, at most 4 (none on small machines)."""
    return min(4, (os.cpu_count() or 1) // 4)


# ----------------------------------------------------------------------------- progress


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line every 5% otherwise."""

    def __init__(self, total: int, stream=None, enabled: bool = True, now=time.monotonic, width: int = 24):
        self.total, self.done = max(total, 0), 0
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.now, self.width = now, width
        self.started = now()
        self._step = -1

    @staticmethod
    def _clock(seconds: float) -> str:
        seconds = int(max(seconds, 0))
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def line(self, label: str = "") -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        elapsed = self.now() - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {100 * frac:3.0f}% "
                f"{self._clock(elapsed)} eta {self._clock(eta)} {label}").rstrip()

    def update(self, label: str = "", n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + self.line(label)[:160])
            self.stream.flush()
            return
        step = int(20 * self.done / self.total)
        if step != self._step or self.done == self.total:
            self._step = step
            self.stream.write(self.line(label) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ----------------------------------------------------------------------------- inputs


@dataclass
class CaseInputs:
    final: _prepared.Prepared   # set 0 and its oracle: judges the final call (its oracle may be pending)
    timing: dict                # set 1 (HostTensors): what the timed calls read


def case_inputs(case, seed: int, oracle: str, device: str) -> CaseInputs:
    """Both input sets (harness/prepare.py); set 0's oracle too when it runs on the host (safe in a thread)."""
    final = _prepare.prepare(case, seed, oracle, device, 0, cache=False, defer_gpu=True)
    return CaseInputs(final, _prepare.generate(case, seed, 1, oracle, device))


def finish(case, inputs: CaseInputs) -> CaseInputs:
    """Run a GPU oracle left pending (main thread, between measurements)."""
    _prepare.finish(inputs.final, case)
    return inputs


class Prefetch:
    """Yields (item, result or exception) in order, computing up to `depth` items ahead in threads.

    `quiet()` is a context in which no preparation runs: it waits for running ones to end and
    holds new ones back.  Every measurement runs inside it: a thread computing an oracle takes
    the GIL and the cores from the launching thread, and the gaps it leaves between the
    launches of a multi-kernel op count as device time (H100: SDPA and cupy attention
    backward read 10-300x slow beside a float64 attention oracle being prepared).
    """

    def __init__(self, items, fn, depth: int):
        self.items, self.fn, self.depth = list(items), fn, depth
        self._pool = None
        self._cond = threading.Condition()
        self._busy = 0
        self._quiet = False

    def _safe(self, item):
        with self._cond:
            while self._quiet:
                self._cond.wait()
            self._busy += 1
        try:
            return self.fn(item)
        except Exception as exc:  # reported as that case's error, never fatal to the run
            return exc
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    @contextmanager
    def quiet(self):
        with self._cond:
            self._quiet = True
            while self._busy and self._pool is not None:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._quiet = False
                self._cond.notify_all()

    def submit(self, item):
        """Start preparing `item` in a thread now, outside iteration (an isolate worker's lookahead):
        its future.  `quiet()` holds it back like the others."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(self.depth, 1), thread_name_prefix="gradoracle-prep")
        return self._pool.submit(self._safe, item)

    def __iter__(self):
        if self.depth <= 0:
            for item in self.items:
                yield item, self._safe(item)
            return
        self._pool = ThreadPoolExecutor(self.depth, thread_name_prefix="gradoracle-prep")
        queue: deque = deque()
        upcoming = iter(self.items)
        try:
            for item in upcoming:
                queue.append((item, self._pool.submit(self._safe, item)))
                if len(queue) > self.depth:
                    break
            while queue:
                item, fut = queue.popleft()
                nxt = next(upcoming, None)
                if nxt is not None:
                    queue.append((nxt, self._pool.submit(self._safe, nxt)))
                yield item, fut.result()
        finally:
            self.close()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# ----------------------------------------------------------------------------- one row


def variant_rank(impl: Impl) -> int:
    """Registration order of the variant within its backend (ladders read it)."""
    for i, (key, other) in enumerate(impl.backend.impls.items()):
        if other is impl:
            return i
    return 0


def repro(impl: Impl, case, seed: int, device: str) -> str:
    return runner.repro_command(impl, case, seed, device) + " --time"


def base_row(impl: Impl, case, opts: BenchOptions) -> CaseResult:
    """A SKIP row of `impl` on `case` with the bench's keys (the module docstring); the caller fills the verdict."""
    cost = get_op(case.op).cost(case)
    return CaseResult(case.op, impl.id, case.id, case.dtype, opts.device, status.SKIP, seed=opts.seed,
                      repro=repro(impl, case, opts.seed, opts.device),
                      extra={"case_json": case.to_json(), "backend": impl.backend.name, "variant": impl.variant,
                             "baseline": bool(impl.baseline), "library": is_baseline(impl.backend),
                             "variant_rank": variant_rank(impl),
                             "framework": impl.backend.framework,
                             "cost": {"bytes": int(cost.bytes), "flops": int(cost.flops)}})


_UNKNOWN = object()
STOPPED = "stopped"  # how `interrupted` begins when the run could not go on (bench_cli exits non-zero)


def bench_pair(impl: Impl, case, inputs: CaseInputs, opts: BenchOptions, clock=None, uploads: dict | None = None,
               skip=_UNKNOWN, quiet=nullcontext) -> dict:
    """Time and re-validate one implementation on one case; the result row's JSON (no figures yet).

    skip: impl.skip_reason(case, device) if the caller has it already.
    quiet: the prefetch's `quiet`, held while samples are taken (runner.timed_check)."""
    row = base_row(impl, case, opts)
    reason = impl.skip_reason(case, opts.device) if skip is _UNKNOWN else skip
    if reason:
        row.reason = reason
        return row.to_json()
    row.oracle = inputs.final.oracle
    row.extra["footprint_bytes"] = runner.footprint_bytes(case, inputs.timing)
    try:
        tr = runner.timed_check(impl, case, opts.device, inputs.timing, inputs.final, opts.timing, clock,
                                opts.sample_above, uploads, quiet)
    except Exception as exc:  # one broken implementation must not end a long run
        row.status, row.reason = status.ERROR, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return row.to_json()
    row.status, row.reason = tr.status, tr.reason
    row.extra["phases_s"] = {k: round(v, 4) for k, v in tr.phases.items()}
    if tr.status == status.FAIL and tr.reason == runner.REVALIDATION:  # stale, or just inaccurate on these inputs?
        row.reason = runner.diagnose_revalidation(impl, None, inputs.final, case, opts.device, inputs.timing)
    row.status, row.reason = runner.known_status(impl, case, opts.device, row.status, row.reason, tr.outputs)
    row.outputs = tr.outputs
    if tr.samples is not None:
        row.timing, row.time_ms = tr.samples.to_json(), tr.samples.median
    return row.to_json()


def prepare_failed(impl: Impl, case, opts: BenchOptions, exc: Exception, skip: str | None) -> dict:
    """The row of a pair whose case could not be prepared: its SKIP if it declines the case, else an ERROR."""
    row = base_row(impl, case, opts)
    row.status, row.reason = (status.SKIP, skip) if skip else \
        (status.ERROR, f"preparing the case failed: {type(exc).__name__}: {exc}")
    return row.to_json()


# ----------------------------------------------------------------------------- in a worker process

_WORKER: dict = {}  # an isolate worker's state: the case being timed (inputs, uploads), its clocks, lookahead


def _ahead(opts: BenchOptions, upcoming: list) -> Prefetch:
    """The worker's lookahead: the next cases the parent named (`upcoming`, their JSON), prepared in
    `opts.prefetch` threads while this one is timed, as the in-process bench's Prefetch does."""
    from cases.registry import from_json

    ahead = _WORKER.get("ahead")
    if ahead is None or ahead.depth != opts.prefetch:
        ahead = _WORKER["ahead"] = Prefetch([], lambda case: case_inputs(case, opts.seed, opts.oracle, opts.device),
                                            opts.prefetch)
        _WORKER["futures"] = {}
    futures = _WORKER["futures"]
    wanted = [_key(spec, opts) for spec in upcoming[:opts.prefetch]]
    for key in set(futures) - set(wanted):
        futures.pop(key).cancel()  # no longer next (the parent moved on): its memory goes
    for key, spec in zip(wanted, upcoming):
        if key not in futures:
            futures[key] = ahead.submit(from_json(spec, "bench lookahead"))
    return ahead


def _key(spec: dict, opts: BenchOptions) -> tuple:
    return json.dumps(spec, sort_keys=True), opts.seed, opts.oracle, opts.device


def in_worker(impl: Impl, case, spec: dict):
    """In a `harness.isolate` worker: prepare `case` (once, for all its implementations, which come one
    after another; in a lookahead thread when an earlier job named it) and return the call that times
    `impl` on it: {"result": row JSON, "clock_mhz": ...}, the row exactly as `run` builds it in process."""
    opts = BenchOptions.from_json(spec)
    key = _key(case.to_json(), opts)
    fresh = _WORKER.get("key") != key
    if fresh:
        _WORKER.pop("inputs", None)
        _WORKER.pop("uploads", None)
        _release(opts.device)
        future = _WORKER.get("futures", {}).pop(key, None)
    ahead = _ahead(opts, spec.get("upcoming", []))  # the next cases start preparing now
    if fresh:
        t0 = time.perf_counter()
        try:
            inputs = future.result() if future is not None and not future.cancelled() else \
                case_inputs(case, opts.seed, opts.oracle, opts.device)
            if isinstance(inputs, Exception):  # Prefetch keeps a preparation's exception as its result
                raise inputs
            inputs = finish(case, inputs)
        except Exception as exc:  # every implementation of the case gets the ERROR row
            inputs = exc
        _WORKER.update(key=key, inputs=inputs, uploads={}, prepare_s=time.perf_counter() - t0)
    clocks = _WORKER.setdefault("clocks", {})
    clock = clocks.get(opts.device) or clocks.setdefault(opts.device, timing.ClockMonitor.for_device(opts.device))

    def call() -> dict:
        inputs = _WORKER["inputs"]
        if isinstance(inputs, Exception):
            row = prepare_failed(impl, case, opts, inputs, None)
        else:
            if impl.backend.before_timing:
                impl.backend.before_timing()
            row = bench_pair(impl, case, inputs, opts, clock,
                             _WORKER["uploads"].setdefault(impl.backend.framework, {}), None, ahead.quiet)
            if fresh:  # the first implementation of a case waited for its preparation (or made it)
                row["phases_s"] = {"prepare": round(_WORKER["prepare_s"], 4), **row.get("phases_s", {})}
        return {"result": row, "clock_mhz": clock.max_seen}

    return call


def isolated_pair(runner, impl: Impl, case, opts: BenchOptions, clock, upcoming: list = ()) -> dict:
    """Time `impl` on `case` in the runner's worker (harness/isolate.py), which prepares the cases of
    `upcoming` meanwhile; a worker that died, overran or raised gives this process's CRASH, TIMEOUT or
    ERROR row, with the bench's keys and repro line."""
    reply = runner.call(impl, case, {"bench": {**opts.to_json(), "upcoming": [c.to_json() for c in upcoming]}})
    if isinstance(reply, CaseResult):
        row = base_row(impl, case, opts)
        row.status, row.reason = reply.status, reply.reason
        row.extra.update(reply.extra)
        return row.to_json()
    clock.max_seen = max(clock.max_seen, reply.get("clock_mhz") or 0.0)  # the session's top clock, for the JSON
    return reply["result"]


# ----------------------------------------------------------------------------- the run


def plan(cases, ops=None, wanted=None, dtypes=None, per_op: int | None = None, interleave: bool = False) -> list:
    """[(case, [impls])] of harness/selection.py in the cases' order, baseline first; `wanted` holds
    backend or backend@variant names.

    per_op: at most this many cases of each op (the first in registry order).  interleave: take
    the ops in turn (first case of each op, then the second, ...), so a run cut short by a time
    limit still covers every op.
    """
    by_op: dict = {}
    pairs = select(cases, ops, dtypes, wanted)
    for case, impls in pairs:
        if per_op is None or len(by_op.get(case.op, [])) < per_op:
            by_op.setdefault(case.op, []).append((case, impls))
    if not interleave:
        keep = {id(c) for ps in by_op.values() for c, _ in ps}
        return [p for p in pairs if id(p[0]) in keep]
    out, k = [], 0
    while any(k < len(ps) for ps in by_op.values()):
        out += [ps[k] for ps in by_op.values() if k < len(ps)]
        k += 1
    return out


def left_to_run(pairs: list, earlier: dict) -> list:
    """`pairs` without those an earlier results document (`bench --resume`) has a verdict for: every row
    but the SKIPs its time limit or stop left ("not run: ..."), which run now.  A case that limit cut
    part-way runs whole again, so that its ratios to the baselines come from one run (its fresh rows
    replace the earlier ones when the two documents are merged)."""
    rows = earlier.get("rows", [])
    cut = [r for r in rows if r["status"] == status.SKIP and str(r.get("reason") or "").startswith("not run")]
    partial = {(r["op"], r["case"]) for r in cut}
    done = {(r["op"], r["case"], r["impl"]) for r in rows if (r["op"], r["case"]) not in partial}
    out = []
    for case, impls in pairs:
        left = [i for i in impls if (case.op, case.id, i.id) not in done]
        if left:
            out.append((case, left))
    return out


def run(pairs: list, opts: BenchOptions, ceilings: dict | None, command: str = "", runner=None,
        checkpoint=None) -> dict:
    """Measure every (case, impl) of `pairs`; the results document (see harness/report/files.py).

    runner: an isolate.IsolatedRunner: each pair is timed in its worker process (`isolated_pair`), which
    prepares the inputs itself; a crash costs that pair (a CRASH row) and the next starts a fresh worker.
    None: every pair in this process, with `opts.prefetch` threads preparing later cases.
    checkpoint: called with the document of the rows so far every CHECKPOINT_S seconds between pairs
    (`interrupted` says it is one), so that a run killed outright (SIGKILL, a lost machine) leaves
    what it measured for `bench --resume`."""
    clock = timing.ClockMonitor.for_device(opts.device)
    total = sum(len(impls) for _, impls in pairs)
    progress = Progress(total, enabled=opts.progress)
    started = time.monotonic()
    rows: list = []
    skips = {(id(c), i.id): i.skip_reason(c, opts.device) for c, impls in pairs for i in impls}
    runnable = [(c, impls) for c, impls in pairs if any(skips[(id(c), i.id)] is None for i in impls)]
    for case, impls in pairs:
        if all(skips[(id(case), i.id)] is not None for i in impls):
            for impl in impls:
                rows.append(bench_pair(impl, case, None, opts, skip=skips[(id(case), impl.id)]))
                progress.update()
    interrupted = ""
    limit = opts.time_limit_s
    saved = started

    def document(rows: list, interrupted: str) -> dict:
        return _document(rows, pairs, opts, ceilings, command, clock, started, interrupted)

    def over_time() -> bool:
        return limit is not None and time.monotonic() - started > limit

    if runner is None:
        fetch = Prefetch(runnable, lambda item: case_inputs(item[0], opts.seed, opts.oracle, opts.device),
                         opts.prefetch)
    else:  # the worker prepares each case; what this process cached (a ceilings measurement) goes back
        fetch = Prefetch(runnable, lambda item: None, 0)
        _release(opts.device)
    later = {id(c): [d for d, _ in runnable[k + 1:k + 1 + opts.prefetch]] for k, (c, _) in enumerate(runnable)}
    try:
        for (case, impls), prepared in fetch:
            if over_time():
                interrupted = f"time limit of {limit:g} s reached"
                break
            if runner is None and not isinstance(prepared, Exception):
                try:
                    prepared = finish(case, prepared)
                except Exception as exc:
                    prepared = exc
            uploads: dict = {}
            for impl in impls:
                if interrupted:
                    break
                t_pair = time.monotonic()
                if runner is not None:
                    skip = skips[(id(case), impl.id)]
                    try:
                        row = bench_pair(impl, case, None, opts, skip=skip) if skip else \
                            isolated_pair(runner, impl, case, opts, clock, later[id(case)])
                    except Exception as exc:  # no worker could start (isolate.RunStopped): nothing more runs
                        interrupted = f"{STOPPED}: {exc}"
                        break
                    if over_time():
                        interrupted = f"time limit of {limit:g} s reached"
                elif isinstance(prepared, Exception):
                    row = prepare_failed(impl, case, opts, prepared, skips[(id(case), impl.id)])
                else:
                    if impl.backend.before_timing and skips[(id(case), impl.id)] is None:
                        impl.backend.before_timing()
                    row = bench_pair(impl, case, prepared, opts, clock, uploads.setdefault(impl.backend.framework, {}),
                                     skips[(id(case), impl.id)], fetch.quiet)
                    if over_time():
                        interrupted = f"time limit of {limit:g} s reached"
                row["pair_s"] = round(time.monotonic() - t_pair, 4)  # wall time of the pair, as this process saw it
                rows.append(row)
                t = row["timing"]["median"] if row.get("timing") else None
                progress.update(f"{row['status']} {row['impl']} {row['case']}" + (f" {t:.4g} ms" if t else ""))
                if checkpoint is not None and time.monotonic() - saved > CHECKPOINT_S:
                    checkpoint(document([dict(r) for r in rows],
                                        f"checkpoint after {len(rows)} rows (the run did not finish)"))
                    saved = time.monotonic()
            del uploads, prepared
            if runner is None:
                _release(opts.device)
            if interrupted:
                break
    except KeyboardInterrupt:
        interrupted = "interrupted"
    finally:
        fetch.close()
        progress.close()
    if interrupted:  # every pair not measured is still a row, saying why
        done = {(r["op"], r["case"], r["impl"]) for r in rows}
        for case, impls in runnable:
            for impl in impls:
                if (case.op, case.id, impl.id) not in done:
                    row = base_row(impl, case, opts)
                    row.reason = skips[(id(case), impl.id)] or f"not run: {interrupted}"
                    rows.append(row.to_json())
    return document(rows, interrupted)


def _document(rows: list, pairs: list, opts: BenchOptions, ceilings: dict | None, command: str, clock,
              started: float, interrupted: str) -> dict:
    """The results document of `rows` (in `pairs`' order), with figures: run's return and its checkpoints."""
    position = {(c.op, c.id, i.id): k for k, (c, i) in enumerate((c, i) for c, impls in pairs for i in impls)}
    rows.sort(key=lambda r: position.get((r["op"], r["case"], r["impl"]), len(position)))
    results = {
        "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
        "device": _ceilings.device_info(opts.device), "versions": _ceilings._versions(), "ceilings": ceilings,
        "config": {**opts.timing.to_json(), "seed": opts.seed, "oracle": opts.oracle,
                   "sample_above": opts.sample_above, "prefetch": opts.prefetch, "time_limit_s": opts.time_limit_s},
        "clock": {"source": clock.source, "max_seen_mhz": clock.reference,
                  "max_supported_mhz": clock.max_supported_mhz},
        "ops": {op: {"cost_model": (get_op(op).cost.__doc__ or "").strip()} for op in sorted({r["op"] for r in rows})},
        "elapsed_s": round(time.monotonic() - started, 2), "interrupted": interrupted,
        "rows": rows,
    }
    add_figures(results)
    return results


def _release(device: str) -> None:
    """Hand cached device memory back between cases: torch, cupy and JAX share the card."""
    if not device.startswith("cuda"):
        return
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:
        pass
    if "cupy" in sys.modules:
        try:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


# ----------------------------------------------------------------------------- pytest session


class BenchSession:
    """State one pytest session's benchmarks share: ceilings, clock, prepared inputs, baseline times."""

    def __init__(self, opts: BenchOptions, ceilings: dict | None = None):
        self.opts = opts
        self._ceilings = ceilings
        self.clock = timing.ClockMonitor.for_device(opts.device)
        self.baselines: dict = {}  # (op, case id) -> median ms of the baseline, measured this session
        self._inputs: OrderedDict = OrderedDict()

    @property
    def ceilings(self) -> dict | None:
        if self._ceilings is None:
            try:
                self._ceilings = _ceilings.get(self.opts.device)
            except Exception:
                self._ceilings = {}
        return self._ceilings

    def inputs(self, case) -> CaseInputs:
        key = (case.op, case.id)
        if key not in self._inputs:
            self._inputs[key] = finish(case, case_inputs(case, self.opts.seed, self.opts.oracle, self.opts.device))
            while len(self._inputs) > 2:
                self._inputs.popitem(last=False)
        self._inputs.move_to_end(key)
        return self._inputs[key]

    def measure(self, impl: Impl, case) -> dict:
        """One row with figures and, against the baseline measured in this session, a speedup."""
        if impl.skip_reason(case, self.opts.device):
            return bench_pair(impl, case, None, self.opts)
        row = bench_pair(impl, case, self.inputs(case), self.opts, self.clock)
        key = (case.op, case.id)
        t = row["timing"]["median"] if row["status"] == status.PASS and row.get("timing") else None
        if t and impl.baseline:
            self.baselines[key] = t
        base = baseline_for(case.op)
        if t and base is not None and not impl.baseline and key not in self.baselines \
                and base.skip_reason(case, self.opts.device) is None:
            b = bench_pair(base, case, self.inputs(case), self.opts, self.clock)
            if b["status"] == status.PASS and b.get("timing"):
                self.baselines[key] = b["timing"]["median"]
        fig = _ceilings.figures(row["cost"]["bytes"], row["cost"]["flops"], t, self.ceilings, case.dtype,
                                dram=(row.get("timing") or {}).get("mode") == "cold")
        if fig.get("impossible"):
            row["flag"], t = fig["impossible"], None
        if t and key in self.baselines and base is not None:
            fig["baseline"] = base.id
            fig["speedup_vs_baseline"] = self.baselines[key] / t
        row["figures"] = fig
        return row
