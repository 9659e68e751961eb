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
inputs generated and their numpy oracle computed in threads (host work only: an oracle
that runs on the GPU, JAX for the largest cases, is computed in the main thread between
timings so it never overlaps a measurement).
"""
from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict, deque
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from harness import ceilings as _ceilings
from harness import runner, timing
from harness.registry import Impl, baseline_for, get_op, impls_for


@dataclass
class BenchOptions:
    device: str
    timing: timing.TimingConfig = field(default_factory=timing.TimingConfig)
    seed: int = 0
    oracle: str = "auto"
    sample_above: int | None = runner.SAMPLE_ABOVE
    prefetch: int = 0
    time_limit_s: float | None = None
    progress: bool = True


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
    final: runner.Prepared      # set 0 and its oracle: judges the final call
    timing: dict                # set 1 (HostTensors): what the timed calls read
    pending: tuple | None = None  # (oracle, where) still to run in the main thread (GPU oracles)


def prepare_host(case, seed: int, oracle: str, device: str) -> CaseInputs:
    """Both input sets; the oracle too when it runs on the host (safe in a thread)."""
    spec = get_op(case.op)
    s0 = runner.input_seed(case, seed, 0)
    inputs = spec.generate(case, np.random.default_rng(s0))
    inputs64 = {k: v.float64() for k, v in inputs.items()}
    which, where = runner.choose_oracle(oracle, inputs64, device)
    ref = None
    if where == "cpu":
        ref = spec.jax_oracle(inputs64, case.params, on="cpu") if which == "jax" else \
            spec.numpy_oracle(inputs64, case.params)
    scale = spec.error_scale(inputs64, case.params)
    label = which if where == "cpu" else f"{which}@{where}"
    final = runner.Prepared(inputs, inputs64, ref, scale, label, s0)
    return CaseInputs(final, runner.generate(case, seed, 1), None if ref is not None else (which, where))


def finish(case, inputs: CaseInputs) -> CaseInputs:
    """Run a GPU oracle left pending (main thread, between measurements)."""
    if inputs.pending is not None:
        _, where = inputs.pending
        inputs.final.ref = get_op(case.op).jax_oracle(inputs.final.inputs64, case.params, on=where)
        inputs.pending = None
    return inputs


class Prefetch:
    """Yields (item, result or exception) in order, computing up to `depth` items ahead in threads.

    `quiet()` is a context in which no preparation runs: it waits for running ones to end and
    holds new ones back.  A measurement whose samples include host time (JAX) runs inside it,
    so prefetch threads cannot take the GIL or the cores from it.
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


def base_row(impl: Impl, case, opts: BenchOptions) -> dict:
    spec = get_op(case.op)
    cost = spec.cost(case)
    return {"op": case.op, "case": case.id, "case_json": case.to_json(), "dtype": case.dtype, "impl": impl.id,
            "backend": impl.backend.name, "variant": impl.variant, "baseline": bool(impl.baseline),
            "variant_rank": variant_rank(impl), "framework": impl.backend.framework, "status": "SKIP",
            "reason": "", "oracle": "", "seed": opts.seed, "outputs": [],
            "cost": {"bytes": int(cost.bytes), "flops": int(cost.flops)}, "timing": None,
            "repro": repro(impl, case, opts.seed, opts.device)}


_UNKNOWN = object()


def bench_pair(impl: Impl, case, inputs: CaseInputs, opts: BenchOptions, clock=None, uploads: dict | None = None,
               skip=_UNKNOWN) -> dict:
    """Time and re-validate one implementation on one case; the result row (no figures yet).

    skip: impl.skip_reason(case, device) if the caller has it already."""
    row = base_row(impl, case, opts)
    reason = impl.skip_reason(case, opts.device) if skip is _UNKNOWN else skip
    if reason:
        row["reason"] = reason
        return row
    row["oracle"] = inputs.final.oracle
    row["footprint_bytes"] = runner.footprint_bytes(case, inputs.timing)
    try:
        tr = runner.timed_check(impl, case, opts.device, inputs.timing, inputs.final, opts.timing, clock,
                                opts.sample_above, uploads)
    except Exception as exc:  # one broken implementation must not end a long run
        row["status"], row["reason"] = "ERROR", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return row
    row["status"], row["reason"] = tr.status, tr.reason
    if tr.status == "FAIL" and tr.reason == runner.REVALIDATION:  # stale, or just inaccurate on these inputs?
        row["reason"] = runner.diagnose_revalidation(impl, None, inputs.final, case, opts.device, inputs.timing)
    row["status"], row["reason"] = runner.known_status(impl, case, opts.device, row["status"], row["reason"],
                                                       tr.outputs)
    row["outputs"] = [o.to_json() for o in tr.outputs]
    row["timing"] = tr.samples.to_json() if tr.samples is not None else None
    return row


# ----------------------------------------------------------------------------- the run


def plan(cases, ops=None, wanted=None, dtypes=None, per_op: int | None = None, interleave: bool = False) -> list:
    """[(case, [impls])], baseline first; `wanted` holds backend or backend@variant names.

    per_op: at most this many cases of each op (the first in registry order).  interleave: take
    the ops in turn (first case of each op, then the second, ...), so a run cut short by a time
    limit still covers every op.
    """
    by_op: dict = {}
    for case in cases:
        if (ops and case.op not in ops) or (dtypes and case.dtype not in dtypes):
            continue
        impls = [i for i in impls_for(case.op) if not wanted or i.id in wanted or i.backend.name in wanted]
        if impls and (per_op is None or len(by_op.get(case.op, [])) < per_op):
            by_op.setdefault(case.op, []).append((case, impls))
    if not interleave:
        order = {id(c): k for k, c in enumerate(cases)}
        return sorted((p for ps in by_op.values() for p in ps), key=lambda p: order[id(p[0])])
    out, k = [], 0
    while any(k < len(ps) for ps in by_op.values()):
        out += [ps[k] for ps in by_op.values() if k < len(ps)]
        k += 1
    return out


def run(pairs: list, opts: BenchOptions, ceilings: dict | None, command: str = "") -> dict:
    """Measure every (case, impl) of `pairs`; the results document (see harness.report)."""
    from harness import report

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

    def over_time() -> bool:
        return limit is not None and time.monotonic() - started > limit

    fetch = Prefetch(runnable, lambda item: prepare_host(item[0], opts.seed, opts.oracle, opts.device), opts.prefetch)
    try:
        for (case, impls), prepared in fetch:
            if over_time():
                interrupted = f"time limit of {limit:g} s reached"
                break
            if not isinstance(prepared, Exception):
                try:
                    prepared = finish(case, prepared)
                except Exception as exc:
                    prepared = exc
            uploads: dict = {}
            for impl in impls:
                if interrupted:
                    break
                if isinstance(prepared, Exception):
                    row = base_row(impl, case, opts)
                    reason = skips[(id(case), impl.id)]
                    row["status"], row["reason"] = ("SKIP", reason) if reason else \
                        ("ERROR", f"preparing the case failed: {type(prepared).__name__}: {prepared}")
                else:
                    if impl.backend.before_timing and skips[(id(case), impl.id)] is None:
                        impl.backend.before_timing()
                    with fetch.quiet() if impl.backend.framework == "jax" else nullcontext():
                        row = bench_pair(impl, case, prepared, opts, clock,
                                         uploads.setdefault(impl.backend.framework, {}), skips[(id(case), impl.id)])
                    if over_time():
                        interrupted = f"time limit of {limit:g} s reached"
                rows.append(row)
                t = row["timing"]["median"] if row.get("timing") else None
                progress.update(f"{row['status']} {row['impl']} {row['case']}" + (f" {t:.4g} ms" if t else ""))
            del uploads, prepared
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
                    row["reason"] = skips[(id(case), impl.id)] or f"not run: {interrupted}"
                    rows.append(row)
    position = {(c.op, c.id, i.id): k for k, (c, i) in enumerate((c, i) for c, impls in pairs for i in impls)}
    rows.sort(key=lambda r: position.get((r["op"], r["case"], r["impl"]), len(position)))
    results = {
        "schema": report.SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
        "device": _ceilings.device_info(opts.device), "versions": _ceilings._versions(), "ceilings": ceilings,
        "config": {**opts.timing.to_json(), "seed": opts.seed, "oracle": opts.oracle,
                   "sample_above": opts.sample_above, "prefetch": opts.prefetch, "time_limit_s": opts.time_limit_s},
        "clock": {"source": clock.source, "max_seen_mhz": clock.reference,
                  "max_supported_mhz": clock.max_supported_mhz},
        "ops": {op: {"cost_model": (get_op(op).cost.__doc__ or "").strip()} for op in sorted({r["op"] for r in rows})},
        "elapsed_s": round(time.monotonic() - started, 2), "interrupted": interrupted,
        "rows": rows,
    }
    report.add_figures(results)
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
            self._inputs[key] = finish(case, prepare_host(case, self.opts.seed, self.opts.oracle, self.opts.device))
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
        t = row["timing"]["median"] if row["status"] == "PASS" and row.get("timing") else None
        if t and impl.baseline:
            self.baselines[key] = t
        base = baseline_for(case.op)
        if t and base is not None and not impl.baseline and key not in self.baselines \
                and base.skip_reason(case, self.opts.device) is None:
            b = bench_pair(base, case, self.inputs(case), self.opts, self.clock)
            if b["status"] == "PASS" and b.get("timing"):
                self.baselines[key] = b["timing"]["median"]
        fig = _ceilings.figures(row["cost"]["bytes"], row["cost"]["flops"], t, self.ceilings, case.dtype)
        if t and key in self.baselines and base is not None:
            fig["baseline"] = base.id
            fig["speedup_vs_baseline"] = self.baselines[key] / t
        row["figures"] = fig
        return row
