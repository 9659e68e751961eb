"""Run one implementation on one case and judge it against the float64 oracle.

`run_case` is the correctness path.  On top of the oracle comparison of the first call it
runs the guards of harness/guards.py on every call (unwritten outputs, out-of-bounds writes
and reads, mutated inputs) and three more checks:

- **repeats** (races, non-determinism): the implementation is called `repeats` times on the
  same inputs, fresh poisoned outputs each time.  A deterministic implementation
  (`Impl.deterministic`, the default) must give the same bits every time; a non-deterministic
  one must pass the oracle every time, and the result records its run-to-run spread
  (`CaseResult.spread`: max |call i - call 1| over the tolerance).  Default: 2 calls for cases
  whose buffers total at most REPEAT_MAX_BYTES, 1 above (a second call costs about as much as
  the first; the oracle, the expensive part on the CPU, is not repeated).  `run --repeat N`
  (or $GRADORACLE_REPEAT) asks for N calls everywhere.
- **stale output** (caches, skipped work): after the checked calls the input buffers are
  refilled in place with a second input set of the case (seed variant 1: same addresses,
  same view objects), the outputs re-poisoned in place, and one more call is made.  When the
  case's oracle is cheap (`cheap_oracle`: the op's cost model within RECHECK_ORACLE_BYTES and
  RECHECK_ORACLE_FLOPS) that call is judged against the second set's own oracle
  (`recheck="oracle"`); otherwise, to bound the cost, no second oracle runs and the call fails if
  an output is left all NaN or comes back bit-for-bit unchanged although the inputs changed
  (`recheck="changed"`).  The tier is a function of the case alone, never of a measured time, so a
  verdict that depends on it is the same on every machine; the tier that ran is in the result.
  The second oracle is computed once per case and shared by every implementation (harness/prepare.py
  caches it); every smoke case is under the bounds.  Timed runs skip the check: `timed_check`
  re-validates the final timed call against the second set's oracle anyway.
- **exact arithmetic** (dropped or extra terms that rounding noise hides): last, the inputs are
  refilled with the op's exact-arithmetic set (harness/exact.py: dyadic grid values on which
  every sum is exact in float32) and the outputs the op declares exact there must come back
  exactly, to the rounding of their final store.  Ops and cases with no exact output skip it;
  like the stale-output check it runs on untimed runs (`recheck`), and GRADORACLE_EXACT=0 skips it.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

import numpy as np

from harness import dtypes, exact, frameworks, guards, prepared as _prepared, status, stress, timing
from harness.compare import OutputReport, compare, tolerance
from harness.cuda_errors import sticky_cuda_error
from harness.prepare import generate, prepare
from harness.prepared import Prepared, sample_index
from harness.registry import ENV_BACKENDS, Impl, env_backend_modules, get_op, timed_callable
from harness.results import CaseResult


PROJECT_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding harness/, oracle/, cases/


def module_root(name: str) -> str | None:
    """The sys.path folder the (imported) module `name` was found in, or None."""
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        return None
    root = Path(path).resolve().parent
    for _ in range(name.count(".") + (Path(path).name == "__init__.py")):
        root = root.parent
    return str(root)


def _installed_dirs() -> set[str]:
    """Folders Python searches without being told: site-packages (system and user)."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(site.getusersitepackages())
    return {str(Path(d).resolve()) for d in dirs if d}


def env_assignments(module: str) -> str:
    """'GRADORACLE_BACKENDS=<module> [PYTHONPATH=<its folder>] ': what a fresh shell in the project
    root needs to find `module`.  The folder is left out when Python finds the module there anyway
    (the project root, site-packages)."""
    text = f"{ENV_BACKENDS}={shlex.quote(module)} "
    root = module_root(module)
    if root and root != PROJECT_ROOT and root not in _installed_dirs():
        text += f"PYTHONPATH={shlex.quote(root)} "
    return text


def env_prefix(impl: Impl) -> str:
    """env_assignments(module) when `impl`'s backend was registered from a module named in
    $GRADORACLE_BACKENDS (registry.discover), else '': without it the command would not find the backend."""
    module = impl.backend.origin or getattr(impl.fn, "__module__", "") or ""
    return env_assignments(module) if module and module in env_backend_modules() else ""


def repro_command(impl: Impl, case, run_seed: int, device: str) -> str:
    """The one-line shell command that reruns `impl` on `case` alone (with its env prefix, if any)."""
    spec = json.dumps(case.to_json(), separators=(",", ":"))
    return (f"{env_prefix(impl)}python -m harness run --op {case.op} --backend {impl.id} --device {device} "
            f"--seed {run_seed} --case {shlex.quote(spec)}")


def call(impl: Impl, prepared: Prepared, case, device: str):
    """Move inputs to the device, poison the outputs (inside guard bands), call the implementation;
    return (its input views, its outputs).  The guards' findings are dropped: run_case keeps them."""
    guarded = guards.GuardedCall(impl, case, device, prepared.inputs)
    outs, _ = guarded.call()
    return guarded.views, outs


def judge(impl: Impl, prepared: Prepared, case, outs: dict, sample_above: int | None = None) -> list[OutputReport]:
    """Each output against the oracle.

    sample_above: outputs with more elements are judged on prepared.SAMPLE_SIZE elements gathered on
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
        if name in prepared.samples or (sample_above is not None and prod(prepared.ref[name].shape) > sample_above):
            reports.append(_sampled_compare(fw, name, outs[name], prepared, n, case.dtype))
            continue
        got = fw.to_host64(outs[name])
        report = compare(name, got, prepared.ref[name], scale, n, case.dtype, fw.dtype_name(outs[name]),
                         exact=name in prepared.exact)
        if not report.passed and report.numel:  # say so when the wrong output is a trivial one
            in_dtypes = {k: dtypes.from_any(t.dtype) for k, t in prepared.inputs.items()}
            why = guards.trivial(got, prepared.inputs64, in_dtypes, fw.dtype_name(outs[name]))
            if why:
                report.message, report.details["trivial"] = f"{why}; {report.message}", why
        reports.append(report)
    return reports


def _sampled_compare(fw, name: str, x, prepared: Prepared, n: int, dtype: str) -> OutputReport:
    ref, scale = prepared.ref[name], prepared.scale[name][0]
    if tuple(x.shape) != tuple(ref.shape):
        return OutputReport(name, False, message=f"shape {tuple(x.shape)}, expected {tuple(ref.shape)}")
    if fw.dtype_name(x) != dtype:
        return OutputReport(name, False, message=f"dtype {fw.dtype_name(x)}, expected {dtype}")
    numel = prod(ref.shape)
    if name in prepared.samples:  # the oracle of a huge case exists only at its sample
        idx, ref_at, scale_at = prepared.samples[name]
    else:
        idx = sample_index(numel, _prepared.SAMPLE_SIZE, prepared.seed)
        ref_at, scale_at = ref.reshape(-1)[idx], scale.reshape(-1)[idx]
    report = compare(name, fw.gather64(x, idx), ref_at, scale_at, n, dtype)
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
    # wall seconds of each phase (upload: inputs to the device and their clones; wait: for the
    # prefetch's quiet; time: warm-up, samples and loop; final: the re-validated call and its
    # judgement): where a bench's time goes, beside the samples' own elapsed time
    phases: dict = field(default_factory=dict)


REVALIDATION = ("timed re-validation: the final timed call (inputs refilled in place with other values, "
                "outputs re-poisoned) does not match the oracle: stale or cached output?")


def footprint_bytes(case, inputs: dict) -> int:
    """Device bytes one call touches: its input buffers (gaps included, guard bands not) and its outputs."""
    spec = get_op(case.op)
    shapes = spec.shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    return sum(t.span_nbytes for t in inputs.values()) + sum(prod(shapes[o]) * item for o in spec.outputs_of(case))


def timed_check(impl: Impl, case, device: str, timing_inputs: dict, final: Prepared,
                cfg: timing.TimingConfig, clock: timing.ClockMonitor | None = None,
                sample_above: int | None = None, uploads: dict | None = None,
                quiet=nullcontext) -> TimedResult:
    """Time `impl` on `timing_inputs`, then re-validate the outputs of one more timed call.

    The timed calls read device copies of `timing_inputs` (k copies when rotating).  After
    sampling, the buffers of the set the final call reads are overwritten in place with
    `final`'s inputs (other values, same addresses), that set's outputs are re-poisoned with
    NaN (every set's in graph mode), the final call runs (a graph replay in graph mode) and its
    outputs are judged against `final`'s oracle.  A backend that skips work it believes done,
    returns a cached result, or keys a cache on buffer addresses fails here.

    The first call (a warm-up call, never a sample) goes through `impl.fn` and its argument
    checks; once it has passed them every later call, the final one included, goes through
    `registry.timed_callable(impl)` (the k sets are alike: same shapes, dtypes, layouts and
    device), so the checks' microseconds of Python stay out of the timings.

    uploads: a dict shared by the implementations of one framework on one case: both input
    sets go to the device once and are cloned there for each implementation.
    quiet: a context the samples and the final call are taken in (the bench's prefetch holds its
    host work back there: an op of several launches waits on the host between them, and a
    thread computing an oracle beside it stretches those gaps into the device time).
    """
    spec = get_op(case.op)
    fw = frameworks.adapter(impl.backend.framework)
    phases: dict = {}
    t0 = time.perf_counter()
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
    fns = [impl.fn, timed_callable(impl)]  # the first call with the argument checks, the rest without

    def call(i):
        _, views, outs = sets[i % rotate]
        returned = fns[0](views, outs, case.params)
        fns[0] = fns[-1]  # reached only once the checks passed
        results[i % rotate] = outs if returned is None else returned

    phases["upload"] = time.perf_counter() - t0
    try:
        with _timed(phases, "wait", quiet()):
            t0 = time.perf_counter()
            run = timing.time_fn(call, device, cfg, fw.name, lambda: fw.sync(device), clock, rotate)
            phases["time"] = time.perf_counter() - t0
        j = run.last_index % rotate
        flats, views, _ = sets[j]
        for k in flats:
            flats[k] = fw.copy(flats[k], uploads["final"][k])
            views[k] = fw.view(flats[k], final.inputs[k])
        for _, _, outs in (sets if run.graph is not None else [sets[j]]):
            for o in outs:
                outs[o] = fw.fill_nan(outs[o])
        results.pop(j, None)
        with _timed(phases, "wait", quiet()):
            t0 = time.perf_counter()
            run.samples.final_ms = run.final_call()
            fw.sync(device)
        got = results.get(j) if run.graph is None else sets[j][2]
        reports = judge(impl, final, case, got or {}, sample_above)
        phases["final"] = time.perf_counter() - t0
    except (ValueError, TypeError, NotImplementedError) as exc:
        return TimedResult(status.ERROR, reason=describe_exception(exc), phases=phases)
    passed = all(o.passed for o in reports)
    return TimedResult(status.PASS if passed else status.FAIL, run.samples, reports, "" if passed else REVALIDATION,
                       phases)


@contextmanager
def _timed(phases: dict, key: str, ctx):
    """Enter `ctx` and add the seconds its entry took to phases[key] (the quiet's wait for preparations)."""
    t0 = time.perf_counter()
    with ctx:
        phases[key] = phases.get(key, 0.0) + time.perf_counter() - t0
        yield


def diagnose_revalidation(impl: Impl, first: Prepared | None, alt: Prepared, case, device: str,
                          other_inputs: dict | None = None) -> str:
    """Why a timed re-validation failed.  One plain call on the final inputs, in fresh buffers:
    if it matches their oracle, only the timed (reused-buffer) path is stale; if it matches
    the first input set's oracle instead (when there is one: `bench` times on inputs with no
    oracle), the implementation returns a cached result; if it matches neither, it is simply
    inaccurate on the second input set."""
    try:
        _, outs = call(impl, alt, case, device)
        if all(o.passed for o in judge(impl, alt, case, outs, _prepared.SAMPLE_ABOVE)):
            return REVALIDATION + " A plain call on the same inputs passes."
        if first is not None and all(o.passed for o in judge(impl, first, case, outs, _prepared.SAMPLE_ABOVE)):
            return REVALIDATION + " A plain call on them returns the first input set's result."
        fw = frameworks.adapter(impl.backend.framework)
        if first is None and other_inputs is not None:  # no oracle for the other set: compare the outputs
            _, other = call(impl, Prepared(other_inputs, {}, {}, {}, "", 0), case, device)
            if all(outs.get(k) is not None and other.get(k) is not None
                   and np.array_equal(fw.to_host64(outs[k]), fw.to_host64(other[k]), equal_nan=True) for k in outs):
                return REVALIDATION + " Plain calls on two different input sets return the same bits: a cached result."
        if any(fw.nan_count(outs[k]) > alt.nan_count(k) for k in outs if outs[k] is not None):
            return REVALIDATION + " A plain call on them leaves outputs unwritten (skipped work)."
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"{REVALIDATION} (a plain call on those inputs raised {type(exc).__name__}: {exc})"
    return ("fails on a second input set (seed variant 1) in a plain, untimed call too: "
            "an accuracy failure on those inputs, not a stale result")


REPEAT_ENV = "GRADORACLE_REPEAT"  # `run --repeat N` sets it, so --isolate and --gpus workers see it too
DEFAULT_REPEATS = 2
REPEAT_MAX_BYTES = 64 << 20  # footprint above which the default is one call
# The stale check's second oracle runs where the case's cost model is within both bounds.  Measured on
# one host core: the slowest preparation of the 2,451 registered cases within them (every smoke case)
# takes 0.52 s; cases of 0.4 to 3 s lie just outside (a 32 Mi-float sum, layernorm 2048 x 4096).
RECHECK_ORACLE_BYTES = 16 << 20
RECHECK_ORACLE_FLOPS = 2 * 10**9

STALE = ("stale-output check: the input buffers were refilled in place with a second input set (seed variant 1, "
         "same addresses) and the outputs re-poisoned; the next call")


def repeat_count(repeats: int | None, case, inputs: dict) -> tuple[int, bool]:
    """(calls on the same inputs, whether they were asked for): `repeats`, else $GRADORACLE_REPEAT,
    else DEFAULT_REPEATS when the case's footprint is at most REPEAT_MAX_BYTES and 1 above."""
    asked = repeats is not None or bool(os.environ.get(REPEAT_ENV))
    if repeats is None and asked:
        try:
            repeats = int(os.environ[REPEAT_ENV])
        except ValueError:
            raise ValueError(f"run_case: ${REPEAT_ENV} must be an integer >= 1, "
                             f"got {os.environ[REPEAT_ENV]!r}") from None
    if repeats is None:
        repeats = DEFAULT_REPEATS if footprint_bytes(case, inputs) <= REPEAT_MAX_BYTES else 1
    if repeats < 1:
        raise ValueError(f"run_case: repeats must be >= 1, got {repeats}")
    return repeats, asked


def cheap_oracle(case) -> bool:
    """Whether the stale-output check judges the second input set against its own oracle (module docstring)."""
    cost = get_op(case.op).cost(case)
    return cost.bytes <= RECHECK_ORACLE_BYTES and cost.flops <= RECHECK_ORACLE_FLOPS


def _passed(reports) -> bool:
    return all(o.passed for o in reports)


def _spread(fw, prepared: Prepared, case, first: dict, again: dict) -> float:
    """Max over outputs of |again - first| / tolerance (inf where only one of them is NaN)."""
    worst = 0.0
    for name, ref in prepared.ref.items():
        if first.get(name) is None or again.get(name) is None or name in prepared.samples:
            continue  # (a sampled output has no whole oracle to scale by; its calls were compared bitwise or judged)
        a, b = fw.to_host64(first[name]), fw.to_host64(again[name])
        if a.shape != ref.shape or b.shape != ref.shape or not a.size:
            continue
        scale, n = prepared.scale[name]
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))
            ratio = np.where(np.isnan(d), np.inf, d / tolerance(ref, scale, n, case.dtype))
        worst = max(worst, float(ratio.max()))
    return worst


def _repeat(result: CaseResult, impl: Impl, prepared: Prepared, case, guarded, first: dict, calls: int) -> None:
    """Calls 2..calls on the same inputs, fresh outputs: bitwise equal to call 1 if deterministic,
    else each judged against the oracle; the spread goes into result.spread."""
    fw, result.spread = guarded.fw, 0.0
    for i in range(2, calls + 1):
        again, found = guarded.call()
        result.calls = i
        if impl.deterministic:
            found = [f for f in (guards.compare_calls(fw, k, first.get(k), again.get(k), i)
                                 for k in guarded.output_names) if f] + found
            reports = []
        else:
            reports = judge(impl, prepared, case, again)
        if found or not _passed(reports):
            result.spread = _spread(fw, prepared, case, first, again)
            result.status = status.FAIL
            result.outputs = (reports or list(result.outputs)) + found
            result.reason = (f"call {i} of {calls} on the same inputs (fresh poisoned outputs) "
                             + ("differs from call 1" if impl.deterministic else "fails the oracle; call 1 passed")
                             + ": a race, or state carried between calls?")
            return
        if not impl.deterministic:
            result.spread = max(result.spread, _spread(fw, prepared, case, first, again))


def _recheck(result: CaseResult, impl: Impl, prepared: Prepared, case, device: str, run_seed: int, oracle: str,
             guarded) -> None:
    """The stale-output check (module docstring): refill the inputs in place, re-poison, call, judge."""
    fw = guarded.fw
    full = cheap_oracle(case)
    alt = prepare(case, run_seed, oracle, device, variant=1) if full else None
    host = alt.inputs if full else generate(case, run_seed, variant=1)
    before = None if full else {k: fw.clone(v) for k, v in guarded.last.items() if v is not None}
    guarded.refill(host)
    got, found = guarded.call(fresh=False)
    result.calls += 1
    result.recheck = "oracle" if full else "changed"
    reports = judge(impl, alt, case, got) if full else _unchanged(fw, before, got)
    if _passed(reports) and not found:
        return
    result.status = status.FAIL
    result.outputs = (reports if full else result.outputs + reports) + found
    if not _passed(reports):
        result.reason = _stale_reason(impl, prepared, alt, case, device, got) if full else \
            f"{STALE} returns outputs that did not change (or were not written): stale or cached output?"


def _exact_check(result: CaseResult, impl: Impl, case, device: str, run_seed: int, oracle: str, guarded) -> None:
    """The exact-arithmetic check (module docstring): refill the inputs in place with the op's exact
    set, re-poison, call, judge the exact outputs to half an ulp.  A failure goes into `result`
    (FAIL, the exact set's reports, the reason); the call is not added to `result.calls`, which
    counts the repeats and the stale-output check (the spread line reads it)."""
    exact.remember([])
    if not exact.applies(case):
        return
    prepared = exact.prepare(case, run_seed, oracle, device)
    guarded.refill(prepared.inputs)
    got, found = guarded.call(fresh=False)
    reports = judge(impl, prepared, case, got)
    exact.remember(reports)
    if _passed(reports) and not found:
        return
    result.status = status.FAIL
    result.outputs = reports + found
    names = ", ".join(o for o in get_op(case.op).outputs if o in prepared.exact)
    result.reason = f"{exact.EXACT}: the call fails it ({names} exact there: judged to half an ulp)"


def _unchanged(fw, before: dict, got: dict) -> list[OutputReport]:
    """Without a second oracle: outputs left all NaN, or bitwise equal to the previous input set's."""
    found = []
    for name, old in before.items():
        new = got.get(name)
        if new is None or not prod(new.shape):
            continue
        if fw.nan_count(new) == prod(new.shape) and fw.nan_count(old) < prod(old.shape):
            found.append(guards.finding(name, "stale", "not written after the inputs changed (still NaN-poisoned)"))
        elif tuple(old.shape) == tuple(new.shape) and fw.dtype_name(old) == fw.dtype_name(new) and \
                fw.first_difference(old, new) is None and np.any(fw.to_host64(old)):  # all-zero: may be right
            found.append(guards.finding(name, "stale", "unchanged after the inputs changed: bitwise equal to the "
                                                       "output for the previous input set"))
    return found


def _stale_reason(impl: Impl, first: Prepared, alt: Prepared, case, device: str, got: dict) -> str:
    """Why the stale-output check failed: a cached result, skipped work, a buffer-keyed cache, or
    plain inaccuracy on the second input set (a call on fresh buffers fails too)."""
    if _passed(judge(impl, first, case, got)):
        return f"{STALE} returns the first input set's result: stale or cached output."
    fw = frameworks.adapter(impl.backend.framework)
    if any(got.get(k) is not None and fw.nan_count(got[k]) > alt.nan_count(k) for k in alt.ref):
        return f"{STALE} leaves outputs unwritten: skipped work it believed done?"
    try:
        fresh, _ = guards.GuardedCall(impl, case, device, alt.inputs).call()
        if _passed(judge(impl, alt, case, fresh)):
            return (f"{STALE} is wrong, while a call on fresh buffers holding the same values passes: "
                    "state keyed on the buffers (addresses)?")
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"{STALE} is wrong (and a call on fresh buffers raised {type(exc).__name__}: {exc})"
    return ("fails on a second input set (seed variant 1) in fresh buffers too: an accuracy failure on those "
            "inputs, not a stale result")


FRAMES = 4  # innermost traceback frames an ERROR row keeps


def describe_exception(exc: BaseException, frames: int = FRAMES) -> str:
    """'Type: message' and, below it, the innermost `frames` frames ('file:line in function: source'):
    those below the harness's last frame (the implementation's own) when there are any.

    An argument error of harness/argcheck.py (a ValueError or TypeError raised there) names op,
    argument, expected and got by itself: it stays one line."""
    head = f"{type(exc).__name__}: {exc}".strip()
    stack = traceback.extract_tb(exc.__traceback__)
    if not stack or stack[-1].filename.endswith(os.path.join("harness", "argcheck.py")):
        return head
    ours = os.path.join(PROJECT_ROOT, "harness") + os.sep
    last = max((i for i, f in enumerate(stack) if f.filename.startswith(ours)), default=-1)
    lines = []
    for f in (stack[last + 1:] or stack)[-frames:]:
        name = f.filename
        if name.startswith(PROJECT_ROOT + os.sep):
            name = name[len(PROJECT_ROOT) + 1:]
        source = (f.line or "").strip()
        source = source if len(source) <= 100 else source[:97] + "..."
        lines.append(f"{name}:{f.lineno} in {f.name}" + (f": {source}" if source else ""))
    return head + "".join(f"\n    {line}" for line in lines)


WARNINGS_KEPT, WARNING_CHARS = 5, 500  # a row keeps at most this many distinct warnings, each this long


def _warning_texts(caught) -> list[str]:
    """The first WARNINGS_KEPT distinct messages of recorded warnings, in order ('Category: message')."""
    texts = dict.fromkeys(f"{w.category.__name__}: {str(w.message).strip()}"[:WARNING_CHARS] for w in caught)
    return list(texts)[:WARNINGS_KEPT]


def run_case(impl: Impl, case, device: str, run_seed: int = 0, oracle: str = "auto",
             timed: bool = False, timing_config: timing.TimingConfig | None = None,
             repeats: int | None = None, recheck: bool = True) -> CaseResult:
    """Check `impl` on `case`: one guarded call judged against the oracle, the repeats, the
    stale-output check (`recheck`; untimed runs only), then, when `timed` and still passing,
    the timed run and its re-validation.  See the module docstring for the defaults.

    Whatever the implementation raises becomes this case's row, never the end of the run:
    NotImplementedError on its first call is a SKIP (it declines the case: the reason is the
    message), any other exception an ERROR with the innermost frames (`describe_exception`).
    Only a sticky CUDA error (harness/cuda_errors.py) propagates: the process's context is gone,
    and the caller (harness/isolate.py) must stop or replace the process.  Warnings raised
    during the case are recorded, not printed: a SKIP or ERROR reason ends with them (SDPA
    says why it declines a case in a warning), and any row keeps them in extra["warnings"]."""
    result = CaseResult(case.op, impl.id, case.id, case.dtype, device, status.SKIP,
                        repro=repro_command(impl, case, run_seed, device))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every case's own: a reason repeated in the next case is recorded again
        for hidden in (DeprecationWarning, PendingDeprecationWarning):  # hidden by Python's defaults: not a row's
            warnings.filterwarnings("ignore", category=hidden)
        try:
            reason = impl.skip_reason(case, device)
            if reason:
                result.reason = reason
            else:
                _checked(result, impl, case, device, run_seed, oracle, timed, timing_config, repeats, recheck)
        except Exception as exc:  # noqa: BLE001 - the case's ERROR row; the run goes on
            if sticky_cuda_error(exc):
                raise
            result.status, result.reason = status.ERROR, describe_exception(exc)
    said = _warning_texts(caught)
    if said:
        result.extra["warnings"] = said
        if result.status in (status.SKIP, status.ERROR):
            new = [w for w in said if w.split(": ", 1)[-1] not in result.reason]
            if new:
                result.reason = (result.reason or "declined") + "; warned: " + "; ".join(new)
    if result.status == status.SKIP and not result.reason:
        result.reason = "no reason given"
    return apply_deviation(impl, case, device, result)


def apply_deviation(impl: Impl, case, device: str, result):
    """`result` (a CaseResult) with its status passed through `known_status`."""
    result.status, result.reason = known_status(impl, case, device, result.status, result.reason, result.outputs)
    return result


def known_status(impl: Impl, case, device: str, verdict: str, reason: str, outputs) -> tuple[str, str]:
    """(status, reason): FAIL -> XFAIL, PASS -> XPASS where `impl` declares a known deviation
    covering the case (registry.Deviation) and, for a FAIL, every failing output is a plain
    comparison of one it names; any other verdict, or an undeclared case, is left as it is."""
    dev = impl.deviation_for(case, device) if verdict in (status.FAIL, status.PASS) else None
    if dev is None:
        return verdict, reason
    if verdict == status.PASS:
        return status.XPASS, f"passed this time; {dev.label()}"
    if dev.excuses(case, [o for o in outputs if not o.passed]):
        return status.XFAIL, dev.label() + (f"; {reason}" if reason else "")
    return verdict, reason


def _checked(result: CaseResult, impl: Impl, case, device: str, run_seed: int, oracle: str, timed: bool,
             timing_config, repeats, recheck) -> None:
    """run_case's checks on a case the implementation accepts; the verdict goes into `result`."""
    if stress.applies(case):  # the last implementation's cached device memory (torch, cupy) back first
        stress.release(device)
    prepared = prepare(case, run_seed, oracle, device)
    result.oracle, result.seed = prepared.oracle, prepared.seed
    calls, asked = repeat_count(repeats, case, prepared.inputs)
    if asked:
        result.repro += f" --repeat {calls}"
    try:
        guarded = guards.GuardedCall(impl, case, device, prepared.inputs)
        outs, found = guarded.call()
    except NotImplementedError as exc:  # declined at its first call: it does not do this case
        result.status, result.reason = status.SKIP, f"declined at the call: {type(exc).__name__}: {exc}"
        return
    except (ValueError, TypeError) as exc:  # an argument error: one line (describe_exception)
        result.status, result.reason = status.ERROR, describe_exception(exc)
        return
    try:
        result.calls = 1
        result.outputs = judge(impl, prepared, case, outs) + found
        result.status = status.PASS if _passed(result.outputs) else status.FAIL
        if result.status == status.PASS and calls > 1:
            _repeat(result, impl, prepared, case, guarded, outs, calls)
        if result.status == status.PASS and recheck and not timed:
            _recheck(result, impl, prepared, case, device, run_seed, oracle, guarded)
        if result.status == status.PASS and recheck and not timed:
            _exact_check(result, impl, case, device, run_seed, oracle, guarded)
    except (ValueError, TypeError, NotImplementedError) as exc:
        result.status, result.reason = status.ERROR, describe_exception(exc)
        return
    if timed and result.status == status.PASS:
        # Timed on the inputs just checked; the final call gets another input set (variant 1).
        alt = prepare(case, run_seed, oracle, device, variant=1)
        del guarded, outs
        tr = timed_check(impl, case, device, prepared.inputs, alt, timing_config or timing.TimingConfig.quick(),
                         sample_above=_prepared.SAMPLE_ABOVE)
        if tr.samples is not None:
            result.time_ms = tr.samples.median
            result.timing = tr.samples.to_json()
        if tr.status != status.PASS:
            result.status, result.reason = tr.status, tr.reason
            result.outputs = tr.outputs or result.outputs
            result.repro += " --time"
            if tr.status == status.FAIL:
                result.reason = diagnose_revalidation(impl, prepared, alt, case, device)
