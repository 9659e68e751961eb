"""Op and backend registries: the one place every op, backend and variant is declared.

An op (`OpSpec`) is declared once, in its `oracle/<op>.py` module: its inputs,
outputs, params, both oracles, the input generator, the error model that the
tolerances use, the cost model that the benchmarks use, the argument rule every
implementation's entry runs, and what the stress path and the fuzz tests need.  Ops are
found in the `oracle` package and in the `gradoracle.ops` entry-point group (an installed
package; its OpSpec names the module of its cases, `cases_module`).

A backend is a module that makes a `Backend` and registers one function per op
(and per variant) with the `Backend.impl` decorator.  Backends are found in the
`backends` package (the kernel backends, one module or package each) and its `backends.baselines`
subpackage (the libraries they compete with), in the `gradoracle.backends` entry-point group, and in the modules
named by the environment variable GRADORACLE_BACKENDS (comma-separated importable module
names, e.g. `GRADORACLE_BACKENDS=planted_crash PYTHONPATH=tests`): every `Backend` such a
module defines is registered, including those made with `register=False` (test fixtures
kept out of the registry when merely imported).  Subprocesses inherit the variable, so
`run --isolate` and `run --gpus N` workers find the same backends.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import math
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from harness import dtypes as _dtypes

# ----------------------------------------------------------------------------- ops


@dataclass(frozen=True)
class Cost:
    """Minimum traffic and arithmetic of one call: each input read once, each output written once."""

    bytes: int
    flops: int


@dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, str]  # param name -> meaning
    # shapes(case) -> {tensor name: shape} for every input and output the case has: an op may
    # leave out an optional one (layernorm without weight has no dweight); see outputs_of.
    shapes: Callable[[Any], dict]
    # generate(case, rng) -> {input name: HostTensor}, values exactly representable in case.dtype.
    generate: Callable[[Any, Any], dict]
    # numpy_oracle(inputs: {name: float64 ndarray}, params) -> {output name: float64 ndarray}
    numpy_oracle: Callable[..., dict]
    # jax_vjp(inputs: {name: jax array}, params) -> {output name: jax array}: jax.vjp of the
    # forward, dtype-agnostic.  The JAX oracle runs it in float64; the `jax` baseline, jitted,
    # in the case dtype.
    jax_vjp: Callable[..., dict]
    # error_scale(inputs, params) -> {output name: (scale ndarray shaped like the output, reduction length n)}
    error_scale: Callable[..., dict]
    # cost(case) -> Cost
    cost: Callable[[Any], Cost]
    # case_id(case) -> stable readable id, e.g. 'mul[f32,A=2x3x4x5,B=1x1x4x5]'
    case_id: Callable[[Any], str]
    # For the finite-difference check: loss(inputs, params) = sum(cotangent * forward(inputs)), in
    # float64, and which input each output is the derivative of.
    loss: Callable[..., float] | None = None
    wrt: Mapping[str, str] | None = None
    # validate(case) -> None, or raises ValueError naming the param (for cases loaded from files)
    validate: Callable[[Any], None] = lambda case: None
    # For ops whose inputs include results of the forward pass that the numpy oracle uses as
    # given (attention's o and lse, stored rounded): exact_inputs(inputs, params) -> the inputs
    # with those replaced by their exact float64 values.  The JAX vjp recomputes the forward, so
    # the oracle cross-checks compare the two on these (tests/test_oracles.py).
    exact_inputs: Callable[..., dict] | None = None
    # The argument rule every implementation's entry runs (harness/argcheck.py):
    # check_args(call) checks the params the op reads and every shape, through the helpers of
    # argcheck.Call (fail, expect, expect_param_shape, broadcast, flag, number, ints).  None: each
    # tensor must have the shape shapes() gives for the call's params.
    check_args: Callable[[Any], None] | None = None
    # io_names(params) -> (inputs, outputs) a call has with these params, for an op whose params
    # decide which tensors exist (layernorm's affine and bias).  None: all of `inputs`, `outputs`.
    io_names: Callable[[Mapping], tuple[tuple[str, ...], tuple[str, ...]]] | None = None
    # Inputs that are the forward's saved statistics (layernorm's mean and rstd, attention's lse): held
    # in the accumulation dtype (float32; float64 for float64 data), not the case dtype.
    stats: tuple[str, ...] = ()
    # Every tensor either has the row axis (axis 0 of the largest tensor) or is shared by all rows,
    # so a huge case can be built and judged in row chunks (harness/stress.py).
    row_separable: bool = False
    # The module that registers this op's cases and its hypothesis strategy (cases.registry.add,
    # cases.registry.strategy), when it is not a module of the `cases` package: an op installed
    # from a package (the `gradoracle.ops` entry points) names its own.
    cases_module: str | None = None
    # What an implementation must follow beyond the shapes and dtypes, one line each (saved statistics'
    # dtype, log base, layout, masks, accumulation): printed by `python -m harness describe OP`, with
    # the calling conventions every op shares (harness/describe.py).  The docstring holds the why.
    conventions: tuple[str, ...] = ()
    # The exact-arithmetic input set (harness/exact.py): attached by `declare_exact_set` at the end
    # of the op's module; None: the op has none (its outputs are never exact, e.g. attention's exp).
    exact_set: "ExactSet | None" = None


    def names(self, params: Mapping) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(inputs, outputs) a call has with these params (io_names, or all of them)."""
        return self.io_names(params) if self.io_names is not None else (self.inputs, self.outputs)

    def outputs_of(self, case) -> tuple[str, ...]:
        """The outputs this case has: those of `outputs` that shapes(case) lists."""
        shapes = self.shapes(case)
        return tuple(name for name in self.outputs if name in shapes)

    def jax_oracle(self, inputs: dict, params: dict, on: str = "cpu") -> dict:
        """The JAX oracle: jax_vjp in float64 on `on` ('cpu', or 'cuda' for large cases)."""
        from oracle.jax_setup import run_float64

        return run_float64(self.jax_vjp, inputs, params, on)


@dataclass(frozen=True)
class ExactSet:
    """An op's exact-arithmetic input set: a third input set every case also runs on (harness/exact.py).

    generate(case, rng) -> {input name: HostTensor}: values on a coarse dyadic grid (small integers
    times a power of two), with the shapes, layouts and dtypes of OpSpec.generate, chosen so that
    every product the op forms is exact in the input dtype and every sum exact in float32.
    outputs(case) -> the outputs that are then exact: any implementation that follows the spec
    (products in the input dtype, sums in at least float32) gets them exactly before its final
    store, so they are judged to output rounding only (half an ulp, harness/compare.py).
    """

    generate: Callable[[Any, Any], dict]
    outputs: Callable[[Any], tuple[str, ...]]


def declare_exact_set(spec: OpSpec, generate: Callable, outputs: Callable) -> OpSpec:
    """Attach an ExactSet to a registered op (the op modules do it last, after their own declaration)."""
    object.__setattr__(spec, "exact_set", ExactSet(generate, outputs))
    return spec


OPS: dict[str, OpSpec] = {}
# Entry points of `gradoracle.ops` whose module failed to import: name -> reason.  Listed by
# `harness list`, named by get_op; never fatal to the ops that did load.
BROKEN_OPS: dict[str, str] = {}
OPS_GROUP = "gradoracle.ops"
_ops_loaded = False


def register_op(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} is registered twice")
    OPS[spec.name] = spec
    return spec


def get_op(name: str) -> OpSpec:
    if name not in OPS:
        load_ops()
    if name not in OPS:
        broken = "".join(f"; entry point {k!r} of {OPS_GROUP} failed: {why}" for k, why in sorted(BROKEN_OPS.items()))
        raise KeyError(f"unknown op {name!r}: registered ops are {', '.join(sorted(OPS)) or 'none'}{broken}")
    return OPS[name]


def load_ops() -> dict[str, OpSpec]:
    """Every op: the modules of the `oracle` package, then each `gradoracle.ops` entry point's module
    (an installed op package; see README "Adding an op")."""
    global _ops_loaded
    if not _ops_loaded:
        _ops_loaded = True  # first: an op module that asks for an op while loading finds what is there
        try:
            importlib.import_module("oracle")  # its __init__ imports every op module
        except BaseException:
            _ops_loaded = False  # the next call raises again, as this one does
            raise
        for ep in importlib.metadata.entry_points(group=OPS_GROUP):
            try:
                importlib.import_module(ep.value.split(":")[0])
            except Exception as exc:  # one broken package must not take the other ops down
                BROKEN_OPS[ep.name] = f"import of {ep.value} failed: {type(exc).__name__}: {exc}"
    return OPS


# ----------------------------------------------------------------------------- backends

DEFAULT_VARIANT = "default"


@dataclass(frozen=True)
class Deviation:
    """A known, explained way in which an implementation differs from the spec.

    A FAIL on a case for which `applies(case, device)` holds, whose failing outputs are all
    finite accuracy errors (no guard finding, no NaN or unwritten element, no wrong shape or
    dtype: those are never excused) of outputs named by `outputs(case)`, becomes XFAIL; a
    PASS on such a case is XPASS (harness/status.py).
    why: one line, what differs and why the oracle is right.
    where: the file (and section) that holds the measurements behind it.
    """

    why: str
    where: str
    applies: Callable[[Any, str], bool]
    outputs: Callable[[Any], tuple[str, ...]] | None = None  # None: every output of the case

    def covers(self, case, device: str) -> bool:
        return bool(self.applies(case, device))

    def excuses(self, case, failing: list) -> bool:
        """Whether every failing report is a finite accuracy error of an output this deviation names.

        Finite means the error itself (max_abs: NaN and inf count as inf there), not err/tol: on
        the exact-arithmetic set an output whose exact value is 0 has a tolerance of 0, so any
        rounding there is err/tol = inf while still a plain accuracy error."""
        named = set(self.outputs(case)) if self.outputs is not None else None
        return bool(failing) and all(not r.details.get("check") and r.numel and math.isfinite(r.max_abs)
                                     and (named is None or r.name in named) for r in failing)

    def label(self) -> str:
        return f"known deviation: {self.why} (see {self.where})"


@dataclass
class Impl:
    """One implementation of one op by one backend, possibly one of several named variants."""

    backend: "Backend"
    op: str
    variant: str
    fn: Callable
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    baseline: bool
    deterministic: bool
    # supports(case) -> None or the reason this implementation cannot run the case
    supports: Callable[[Any], str | None] | None = None
    deviations: tuple[Deviation, ...] = ()  # known, explained differences from the spec: XFAIL, not FAIL

    def deviation_for(self, case, device: str) -> Deviation | None:
        return next((d for d in self.deviations if d.covers(case, device)), None)

    @property
    def id(self) -> str:
        return self.backend.name if self.variant == DEFAULT_VARIANT else f"{self.backend.name}@{self.variant}"

    def skip_reason(self, case, device: str) -> str | None:
        """Why this implementation cannot run `case` on `device`, or None if it can."""
        reason = self.backend.unavailable_reason(device)
        if reason:
            return reason
        if device not in self.devices:
            return f"{self.id}: {self.op} runs on {', '.join(self.devices)}, not {device}"
        if case.dtype not in self.dtypes:
            return f"{self.id}: {self.op} does not support {case.dtype} (supports {', '.join(self.dtypes)})"
        if self.supports is not None:
            return self.supports(case)
        return None


@dataclass
class Backend:
    """A source of implementations, e.g. `torch` (eager autograd) or `cupy` (raw CUDA through NVRTC).

    framework: the array type its functions take and return ('torch', 'cupy', 'jax' or 'numpy').
    devices: where it can run ('cpu', 'cuda').
    check(device) -> None if usable on that device, else the reason it is not (e.g. "cupy: no CUDA device").
    before_timing() -> None, optional: called by `bench` before each timed case, so the figure does not
    depend on the cases timed before it (torch_compile resets dynamo: every case compiles fresh,
    for its own shape, as a training run with fixed shapes would).
    """

    name: str
    framework: str
    devices: tuple[str, ...]
    description: str = ""
    check: Callable[[str], str | None] | None = None
    impls: dict[tuple[str, str], Impl] = field(default_factory=dict)
    origin: str = ""  # the module or entry point that registered it
    register: bool = True  # False keeps it out of the global registry (test fixtures)
    before_timing: Callable[[], None] | None = None
    _reasons: dict[str, str | None] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.register:
            register_backend(self)

    def impl(self, op: str, *, variant: str = DEFAULT_VARIANT, dtypes: tuple[str, ...] = ("f32", "f16", "bf16", "f64"),
             devices: tuple[str, ...] | None = None, baseline: bool = False, deterministic: bool = True,
             supports: Callable[[Any], str | None] | None = None, deviations: tuple[Deviation, ...] = ()):
        """Decorator registering `fn(inputs, outs, params)` as this backend's `op` (variant `variant`).

        inputs: {name: array on the device}, possibly non-contiguous views.
        outs: {name: contiguous array of the output shape and dtype, pre-filled with NaN}; the
              function writes into them and returns None.  A functional framework (JAX) may
              instead return {name: array}.
        params: the case's params (e.g. {'fn': 'mul', ...}).
        baseline: this is the implementation a user would otherwise pick; speedups are against it.
        deviations: known, explained differences from the spec (`Deviation`): their FAILs are XFAIL.
        """
        for d in dtypes:
            _dtypes.check(d)

        def register(fn):
            key = (op, variant)
            if key in self.impls:
                raise ValueError(f"backend {self.name!r} registers {op}@{variant} twice")
            self.impls[key] = Impl(self, op, variant, fn, tuple(dtypes), tuple(devices or self.devices),
                                   baseline, deterministic, supports, tuple(deviations))
            return fn

        return register

    def unavailable_reason(self, device: str) -> str | None:
        if device not in self.devices:
            return f"{self.name}: runs on {', '.join(self.devices)}, not {device}"
        if device not in self._reasons:
            try:
                self._reasons[device] = self.check(device) if self.check else None
            except Exception as exc:  # a broken install must read as unavailable, not crash listing
                self._reasons[device] = f"{self.name}: {type(exc).__name__}: {exc}"
        return self._reasons[device]


BACKENDS: dict[str, Backend] = {}
# Backends whose module failed to import: name -> reason.  Listed as unavailable, never fatal.
BROKEN: dict[str, str] = {}
_discovered = False


def register_backend(backend: Backend) -> Backend:
    old = BACKENDS.get(backend.name)
    if old is not None and old is not backend:
        raise ValueError(f"backend {backend.name!r} is registered twice ({old.origin} and {backend.origin})")
    BACKENDS[backend.name] = backend
    return backend


def _import_backend(module_name: str, label: str, adopt: bool = False) -> None:
    try:
        before = set(BACKENDS)
        module = importlib.import_module(module_name)
        if adopt:  # GRADORACLE_BACKENDS: its Backend objects, registered or not
            for obj in vars(module).values():
                if isinstance(obj, Backend) and BACKENDS.get(obj.name) is not obj:
                    register_backend(obj)
        for name in set(BACKENDS) - before:
            BACKENDS[name].origin = getattr(module, "__name__", module_name)
    except Exception as exc:
        BROKEN[label] = f"import of {module_name} failed: {type(exc).__name__}: {exc}{_raised_at(exc)}"


def _raised_at(exc: BaseException) -> str:
    """' (raised at FILE:LINE)': the innermost frame of `exc` outside the import machinery, or ''."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    return f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


ENV_BACKENDS = "GRADORACLE_BACKENDS"


def env_backend_modules() -> list[str]:
    """The module names in $GRADORACLE_BACKENDS (comma-separated), in order."""
    import os

    return [m.strip() for m in os.environ.get(ENV_BACKENDS, "").split(",") if m.strip()]


# Packages whose modules (and subpackages) are backends, one each: every name without a leading
# underscore (underscore names are helpers they share).  A package listed here is a folder of
# backends, not a backend itself.
BACKEND_PACKAGES = ("backends.baselines", "backends")
BASELINES_PACKAGE = "backends.baselines"


def is_baseline(backend: Backend) -> bool:
    """Whether `backend` is one of the libraries a kernel competes with (it lives in backends/baselines/)."""
    return backend.origin == BASELINES_PACKAGE or backend.origin.startswith(BASELINES_PACKAGE + ".")


def discover() -> dict[str, Backend]:
    """Import every backend module of BACKEND_PACKAGES, every `gradoracle.backends` entry point and
    every module in $GRADORACLE_BACKENDS."""
    global _discovered
    if _discovered:
        return BACKENDS
    _discovered = True
    load_ops()
    for package in BACKEND_PACKAGES:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            module_name = f"{package}.{info.name}"
            if not info.name.startswith("_") and module_name not in BACKEND_PACKAGES:
                _import_backend(module_name, info.name)
    for ep in importlib.metadata.entry_points(group="gradoracle.backends"):
        _import_backend(ep.value.split(":")[0], ep.name)
    for module_name in env_backend_modules():
        _import_backend(module_name, module_name, adopt=True)
    return BACKENDS


def impls_for(op: str) -> list[Impl]:
    """Every registered implementation of `op`, baseline first, then by id."""
    discover()
    found = [impl for be in BACKENDS.values() for (o, _), impl in be.impls.items() if o == op]
    return sorted(found, key=lambda i: (not i.baseline, i.id))


def find_impl(op: str, impl_id: str) -> Impl:
    for impl in impls_for(op):
        if impl.id == impl_id:
            return impl
    known = ", ".join(i.id for i in impls_for(op)) or "none"
    raise KeyError(f"no implementation {impl_id!r} of {op}: registered are {known}")


def timed_callable(impl: Impl) -> Callable:
    """What timed loops call: `impl.fn` without its argument checks (harness.argcheck.register keeps
    the raw function as `fn.unchecked`), so their 10-25 us of Python stay out of the timings; `impl.fn`
    itself when it has none.  Call `impl.fn` at least once on the same buffers first: the checks must
    have passed before they are skipped."""
    return getattr(impl.fn, "unchecked", impl.fn)


def baseline_for(op: str) -> Impl | None:
    found = [i for i in impls_for(op) if i.baseline]
    return found[0] if found else None
