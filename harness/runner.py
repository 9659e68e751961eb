"""Run one implementation on one case and judge it against the float64 oracle."""
from __future__ import annotations

import json
import shlex
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from math import prod

import numpy as np

from harness import dtypes, frameworks, timing
from harness.compare import OutputReport, compare
from harness.registry import Impl, get_op

# Outputs with more elements than this are judged on a sample (see `judge`) when the caller asks.
SAMPLE_ABOVE = 1 << 22
SAMPLE_SIZE = 1 << 20


@dataclass
class Prepared:
    """A case's inputs and its oracle verdict, shared by every backend that runs it."""

    inputs: dict  # name -> HostTensor (exact values in the case dtype)
    inputs64: dict  # name -> float64 ndarray of the same values
    ref: dict  # output name -> float64 oracle value
    scale: dict  # output name -> (error scale ndarray, reduction length)
    oracle: str  # which oracle judged: numpy, jax, or jax@cuda
    seed: int
    nan_counts: dict = field(default_factory=dict)  # output name -> NaNs in the oracle's value (lazy)

    def nan_count(self, name: str) -> int:
        if name not in self.nan_counts:
            self.nan_counts[name] = int(np.isnan(self.ref[name]).sum())
        return self.nan_counts[name]


@dataclass
class CaseResult:
    op: str
    impl: str
    case: str
    dtype: str
    device: str
    status: str  # PASS, FAIL, SKIP or ERROR
    outputs: list[OutputReport] = field(default_factory=list)
    reason: str = ""
    time_ms: float | None = None
    oracle: str = ""
    seed: int = 0
    repro: str = ""
    timing: dict | None = None  # the sample set of a timed run (timing.Samples.to_json())

    @property
    def passed(self) -> bool:
        return self.status in ("PASS", "SKIP")

    def report(self) -> str:
        head = f"{self.op} {self.impl} {self.case} [{self.device}, oracle={self.oracle}, seed={self.seed}]: {self.status}"
        lines = [head] + [f"  {o.line()}" for o in self.outputs]
        if self.reason:
            lines.append(f"  {self.reason}")
        if self.status in ("FAIL", "ERROR") and self.repro:
            lines.append(f"  reproduce: {self.repro}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"op": self.op, "impl": self.impl, "case": self.case, "dtype": self.dtype, "device": self.device,
                "status": self.status, "reason": self.reason, "time_ms": self.time_ms, "oracle": self.oracle,
                "seed": self.seed, "outputs": [o.to_json() for o in self.outputs], "repro": self.repro,
                "timing": self.timing}


_PREPARED: OrderedDict = OrderedDict()
_PREPARED_MAX = 3  # large cases hold several GB of float64; keep only the most recent


# Above this many bytes of float64 inputs, "auto" hands the oracle to JAX (jit, x64) on the GPU:
# the numpy definition of a perf-size attention or conv would take hours on the host.
NUMPY_ORACLE_MAX_BYTES = 1 << 30


def choose_oracle(oracle: str, inputs64: dict, device: str) -> tuple[str, str]:
    """(oracle, where it runs): 'auto' is numpy unless the case is large and a GPU is in use."""
    if oracle != "auto":
        return oracle, "cpu"
    big = sum(v.nbytes for v in inputs64.values()) > NUMPY_ORACLE_MAX_BYTES
    return ("jax", "cuda") if big and device.startswith("cuda") else ("numpy", "cpu")


def input_seed(case, run_seed: int = 0, variant: int = 0) -> int:
    """Variant 0 is the case's seed (what `run` checks); variants 1, 2, ... are other input sets of it."""
    seed = case.seed(run_seed)
    return seed if variant == 0 else zlib.crc32(f"{seed}/{variant}".encode())


def generate(case, run_seed: int = 0, variant: int = 0) -> dict:
    """The case's inputs (HostTensors) for a seed variant, without an oracle."""
    return get_op(case.op).generate(case, np.random.default_rng(input_seed(case, run_seed, variant)))


def prepare(case, run_seed: int = 0, oracle: str = "auto", device: str = "cpu", variant: int = 0) -> Prepared:
    key = (id(case), case.id, run_seed, oracle, device, variant)
    if key in _PREPARED:
        _PREPARED.move_to_end(key)
        return _PREPARED[key]
    prepared = build_prepared(case, run_seed, oracle, device, variant)
    _PREPARED[key] = prepared
    while len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.popitem(last=False)
    return prepared


def build_prepared(case, run_seed: int = 0, oracle: str = "auto", device: str = "cpu", variant: int = 0) -> Prepared:
    """Inputs (seed variant `variant`) and the oracle's verdict, uncached: the bench prepares ahead in threads."""
    spec = get_op(case.op)
    seed = input_seed(case, run_seed, variant)
    inputs = spec.generate(case, np.random.default_rng(seed))
    inputs64 = {k: v.float64() for k, v in inputs.items()}
    oracle, where = choose_oracle(oracle, inputs64, device)
    if oracle == "jax":
        ref = spec.jax_oracle(inputs64, case.params, on=where)
    else:
        ref = spec.numpy_oracle(inputs64, case.params)
    label = oracle if where == "cpu" else f"{oracle}@{where}"
    return Prepared(inputs, inputs64, ref, spec.error_scale(inputs64, case.params), label, seed)


def repro_command(impl: Impl, case, run_seed: int, device: str) -> str:
    spec = json.dumps(case.to_json(), separators=(",", ":"))
    return (f"python -m harness run --op {case.op} --backend {impl.id} --device {device} "
            f"--seed {run_seed} --case {shlex.quote(spec)}")


def call(impl: Impl, prepared: Prepared, case, device: str):
    """Move inputs to the device, poison the outputs, call the implementation; return its outputs."""
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    shapes = spec.shapes(case)
    inputs = {k: fw.to_device(v, device) for k, v in prepared.inputs.items()}
    outs = {k: fw.poisoned(shapes[k], case.dtype, device) for k in spec.outputs_of(case)}
    returned = impl.fn(inputs, outs, case.params)
    fw.sync(device)
    return inputs, (outs if returned is None else returned)


def judge(impl: Impl, prepared: Prepared, case, outs: dict, sample_above: int | None = None) -> list[OutputReport]:
    """Each output against the oracle.

    sample_above: outputs with more elements are judged on SAMPLE_SIZE elements gathered on
    the device (plus the first and the last) under the same tolerance model, and their NaN
    count is checked over every element, so unwritten (still poisoned) elements fail wherever
    they are.  None (the default): every element.
    """
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    reports = []
    for name in spec.outputs_of(case):
        if name not in outs or outs[name] is None:
            reports.append(OutputReport(name, False, message="not returned"))
            continue
        scale, n = prepared.scale[name]
        if sample_above is not None and prod(prepared.ref[name].shape) > sample_above:
            reports.append(_sampled_compare(fw, name, outs[name], prepared, n, case.dtype))
            continue
        reports.append(compare(name, fw.to_host64(outs[name]), prepared.ref[name], scale, n, case.dtype,
                               fw.dtype_name(outs[name])))
    return reports


def sample_index(numel: int, size: int, seed: int) -> np.ndarray:
    """Sorted flat indices: `size` uniform draws plus the first and the last element."""
    rng = np.random.default_rng(seed)
    return np.unique(np.concatenate([rng.integers(0, numel, size), [0, numel - 1]])).astype(np.int64)


def _sampled_compare(fw, name: str, x, prepared: Prepared, n: int, dtype: str) -> OutputReport:
    ref, scale = prepared.ref[name], prepared.scale[name][0]
    if tuple(x.shape) != tuple(ref.shape):
        return OutputReport(name, False, message=f"shape {tuple(x.shape)}, expected {tuple(ref.shape)}")
    if fw.dtype_name(x) != dtype:
        return OutputReport(name, False, message=f"dtype {fw.dtype_name(x)}, expected {dtype}")
    numel = prod(ref.shape)
    idx = sample_index(numel, SAMPLE_SIZE, prepared.seed)
    report = compare(name, fw.gather64(x, idx), ref.reshape(-1)[idx], scale.reshape(-1)[idx], n, dtype)
    for attr in ("max_abs_index", "worst_index"):
        flat = getattr(report, attr)
        if flat:
            setattr(report, attr, tuple(int(i) for i in np.unravel_index(int(idx[flat[0]]), ref.shape)))
    if report.message.startswith("worst at ("):
        report.message = f"worst at ({','.join(map(str, report.worst_index))})" + report.message.split(")", 1)[1]
    got_nan, ref_nan = fw.nan_count(x), prepared.nan_count(name)
    notes = [f"sampled {len(idx)} of {numel} elements, NaN count checked on all"]
    if got_nan != ref_nan:
        report.passed = False
        notes.append(f"NaN count {got_nan}, the oracle has {ref_nan} (unwritten or poisoned elements)")
    report.details["sampled"] = {"checked": int(len(idx)), "numel": int(numel), "nan": got_nan, "nan_ref": ref_nan}
    report.message = "; ".join(notes + ([report.message] if report.message else []))
    return report


@dataclass
class TimedResult:
    """A timed run and the verdict on its final call's outputs."""

    status: str  # PASS, FAIL or ERROR
    samples: timing.Samples | None = None
    outputs: list[OutputReport] = field(default_factory=list)
    reason: str = ""


REVALIDATION = ("timed re-validation: the final timed call (inputs refilled in place with other values, "
                "outputs re-poisoned) does not match the oracle: stale or cached output?")


def footprint_bytes(case, inputs: dict) -> int:
    """Device bytes one call touches: its input buffers (gaps included) and its outputs."""
    spec = get_op(case.op)
    shapes = spec.shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    return sum(t.base.nbytes for t in inputs.values()) + sum(prod(shapes[o]) * item for o in spec.outputs_of(case))


def timed_check(impl: Impl, case, device: str, timing_inputs: dict, final: Prepared,
                cfg: timing.TimingConfig, clock: timing.ClockMonitor | None = None,
                sample_above: int | None = None, uploads: dict | None = None) -> TimedResult:
    """Time `impl` on `timing_inputs`, then re-validate the outputs of one more timed call.

    The timed calls read device copies of `timing_inputs` (k copies when rotating).  After
    sampling, the buffers of the set the final call reads are overwritten in place with
    `final`'s inputs (other values, same addresses), that set's outputs are re-poisoned with
    NaN (every set's in graph mode), the final call runs (a graph replay in graph mode) and its
    outputs are judged against `final`'s oracle.  A backend that skips work it believes done,
    returns a cached result, or keys a cache on buffer addresses fails here.

    uploads: a dict shared by the implementations of one framework on one case: both input
    sets go to the device once and are cloned there for each implementation.
    """
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    shapes = spec.shapes(case)
    outputs = spec.outputs_of(case)
    uploads = {} if uploads is None else uploads
    for tag, host in (("timing", timing_inputs), ("final", final.inputs)):
        if tag not in uploads:
            uploads[tag] = {k: fw.upload(t, device) for k, t in host.items()}
    mode, _ = timing.effective_mode(cfg.mode, device)
    rotate = timing.plan_rotation(cfg, mode, footprint_bytes(case, timing_inputs),
                                  timing.cache_bytes(device) if mode == "graph" else 0)
    sets = []
    for _ in range(rotate):
        flats = {k: fw.clone(v) for k, v in uploads["timing"].items()}
        views = {k: fw.view(flats[k], timing_inputs[k]) for k in flats}
        outs = {o: fw.poisoned(shapes[o], case.dtype, device) for o in outputs}
        sets.append((flats, views, outs))
    results: dict = {}

    def call(i):
        _, views, outs = sets[i % rotate]
        returned = impl.fn(views, outs, case.params)
        results[i % rotate] = outs if returned is None else returned

    try:
        run = timing.time_fn(call, device, cfg, fw.name, lambda: fw.sync(device), clock, rotate)
        j = run.last_index % rotate
        flats, views, _ = sets[j]
        for k in flats:
            flats[k] = fw.copy(flats[k], uploads["final"][k])
            views[k] = fw.view(flats[k], final.inputs[k])
        for _, _, outs in (sets if run.graph is not None else [sets[j]]):
            for o in outs:
                outs[o] = fw.fill_nan(outs[o])
        results.pop(j, None)
        run.samples.final_ms = run.final_call()
        fw.sync(device)
        got = results.get(j) if run.graph is None else sets[j][2]
        reports = judge(impl, final, case, got or {}, sample_above)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return TimedResult("ERROR", reason=f"{type(exc).__name__}: {exc}")
    passed = all(o.passed for o in reports)
    return TimedResult("PASS" if passed else "FAIL", run.samples, reports, "" if passed else REVALIDATION)


def _stale_or_inaccurate(impl: Impl, first: Prepared, alt: Prepared, case, device: str) -> str:
    """Why a timed re-validation failed.  One plain call on the final inputs, in fresh buffers:
    if it matches their oracle, only the timed (reused-buffer) path is stale; if it matches
    the first input set's oracle instead, the implementation returns a cached result; if it
    matches neither, it is simply inaccurate on the second input set."""
    try:
        _, outs = call(impl, alt, case, device)
        if all(o.passed for o in judge(impl, alt, case, outs, SAMPLE_ABOVE)):
            return REVALIDATION + " A plain call on the same inputs passes."
        if all(o.passed for o in judge(impl, first, case, outs, SAMPLE_ABOVE)):
            return REVALIDATION + " A plain call on them returns the first input set's result."
        fw = frameworks.adapter(impl.backend.framework)
        if any(fw.nan_count(outs[k]) > alt.nan_count(k) for k in outs if outs[k] is not None):
            return REVALIDATION + " A plain call on them leaves outputs unwritten (skipped work)."
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"{REVALIDATION} (a plain call on those inputs raised {type(exc).__name__}: {exc})"
    return ("fails on a second input set (seed variant 1) in a plain, untimed call too: "
            "an accuracy failure on those inputs, not a stale result")


def run_case(impl: Impl, case, device: str, run_seed: int = 0, oracle: str = "auto",
             timed: bool = False, timing_config: timing.TimingConfig | None = None) -> CaseResult:
    result = CaseResult(case.op, impl.id, case.id, case.dtype, device, "SKIP",
                        repro=repro_command(impl, case, run_seed, device))
    reason = impl.skip_reason(case, device)
    if reason:
        result.reason = reason
        return result
    prepared = prepare(case, run_seed, oracle, device)
    result.oracle, result.seed = prepared.oracle, prepared.seed
    try:
        inputs, outs = call(impl, prepared, case, device)
    except (ValueError, TypeError, NotImplementedError) as exc:
        result.status, result.reason = "ERROR", f"{type(exc).__name__}: {exc}"
        return result
    result.outputs = judge(impl, prepared, case, outs)
    result.status = "PASS" if all(o.passed for o in result.outputs) else "FAIL"
    if timed and result.status == "PASS":
        # Timed on the inputs just checked; the final call gets another input set (variant 1).
        alt = prepare(case, run_seed, oracle, device, variant=1)
        del inputs, outs
        tr = timed_check(impl, case, device, prepared.inputs, alt, timing_config or timing.TimingConfig.quick(),
                         sample_above=SAMPLE_ABOVE)
        if tr.samples is not None:
            result.time_ms = tr.samples.median
            result.timing = tr.samples.to_json()
        if tr.status != "PASS":
            result.status, result.reason = tr.status, tr.reason
            result.outputs = tr.outputs or result.outputs
            result.repro += " --time"
            if tr.status == "FAIL":
                result.reason = _stale_or_inaccurate(impl, prepared, alt, case, device)
    return result
