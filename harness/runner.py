"""Run one implementation on one case and judge it against the float64 oracle."""
from __future__ import annotations

import json
import shlex
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from harness import frameworks
from harness.compare import OutputReport, compare
from harness.registry import Impl, get_op


@dataclass
class Prepared:
    """A case's inputs and its oracle verdict, shared by every backend that runs it."""

    inputs: dict  # name -> HostTensor (exact values in the case dtype)
    inputs64: dict  # name -> float64 ndarray of the same values
    ref: dict  # output name -> float64 oracle value
    scale: dict  # output name -> (error scale ndarray, reduction length)
    oracle: str
    seed: int


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
                "seed": self.seed, "outputs": [o.to_json() for o in self.outputs], "repro": self.repro}


_PREPARED: OrderedDict = OrderedDict()
_PREPARED_MAX = 3  # large cases hold several GB of float64; keep only the most recent


def prepare(case, run_seed: int = 0, oracle: str = "numpy") -> Prepared:
    key = (id(case), case.id, run_seed, oracle)
    if key in _PREPARED:
        _PREPARED.move_to_end(key)
        return _PREPARED[key]
    spec = get_op(case.op)
    seed = case.seed(run_seed)
    inputs = spec.generate(case, np.random.default_rng(seed))
    inputs64 = {k: v.float64() for k, v in inputs.items()}
    oracle_fn = {"numpy": spec.numpy_oracle, "jax": spec.jax_oracle}[oracle]
    ref = oracle_fn(inputs64, case.params)
    prepared = Prepared(inputs, inputs64, ref, spec.error_scale(inputs64, case.params), oracle, seed)
    _PREPARED[key] = prepared
    while len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.popitem(last=False)
    return prepared


def repro_command(impl: Impl, case, run_seed: int, device: str) -> str:
    spec = json.dumps(case.to_json(), separators=(",", ":"))
    return (f"python -m harness run --op {case.op} --backend {impl.id} --device {device} "
            f"--seed {run_seed} --cases {shlex.quote(spec)}")


def call(impl: Impl, prepared: Prepared, case, device: str):
    """Move inputs to the device, poison the outputs, call the implementation; return its outputs."""
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    shapes = spec.shapes(case)
    inputs = {k: fw.to_device(v, device) for k, v in prepared.inputs.items()}
    outs = {k: fw.poisoned(shapes[k], case.dtype, device) for k in spec.outputs}
    returned = impl.fn(inputs, outs, case.params)
    fw.sync(device)
    return inputs, (outs if returned is None else returned)


def judge(impl: Impl, prepared: Prepared, case, outs: dict) -> list[OutputReport]:
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    reports = []
    for name in spec.outputs:
        if name not in outs or outs[name] is None:
            reports.append(OutputReport(name, False, message="not returned"))
            continue
        scale, n = prepared.scale[name]
        reports.append(compare(name, fw.to_host64(outs[name]), prepared.ref[name], scale, n, case.dtype,
                               fw.dtype_name(outs[name])))
    return reports


def time_call(fn, device: str, warmup: int = 2, reps: int = 10) -> float:
    """Median milliseconds of `fn()` (a first look; the measurement engine does it properly)."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.startswith("cuda"):
        import torch

        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def run_case(impl: Impl, case, device: str, run_seed: int = 0, oracle: str = "numpy",
             timed: bool = False) -> CaseResult:
    result = CaseResult(case.op, impl.id, case.id, case.dtype, device, "SKIP",
                        repro=repro_command(impl, case, run_seed, device))
    reason = impl.skip_reason(case, device)
    if reason:
        result.reason = reason
        return result
    prepared = prepare(case, run_seed, oracle)
    result.oracle, result.seed = prepared.oracle, prepared.seed
    try:
        inputs, outs = call(impl, prepared, case, device)
    except (ValueError, TypeError, NotImplementedError) as exc:
        result.status, result.reason = "ERROR", f"{type(exc).__name__}: {exc}"
        return result
    result.outputs = judge(impl, prepared, case, outs)
    result.status = "PASS" if all(o.passed for o in result.outputs) else "FAIL"
    if timed and result.status == "PASS":
        result.time_ms = time_call(lambda: impl.fn(inputs, outs, case.params), device)
    return result
