"""Guards around a kernel call: what the oracle comparison alone cannot see.

`GuardedCall` holds one case's inputs on the device and calls an implementation on them as
often as the runner asks, each time with these checks:

- **Unwritten outputs**: every output starts NaN-poisoned, so an element the kernel does not
  write fails the oracle comparison (harness/compare.py).
- **Out-of-bounds writes**: each output view is the middle of a larger flat buffer, with
  GUARD_BYTES before and after it filled with a canary bit pattern (`CANARY`, by element
  width: 0xDEADBEEF for 4-byte floats, a finite value, so a stray NaN, 0 or result written
  there changes it).  The view handed to the kernel is contiguous, of the output's shape and
  dtype, as before; after the call a changed band element fails the case with the output's
  name and the offset, e.g. `[grad_b] FAIL guard band written: 1 element(s) after the end
  changed, first at end+0`.
- **Out-of-bounds reads**: the input buffers carry NaN guard bands (harness/tensors.py), so
  a read past either end that changes a result makes it NaN, and the comparison fails.
- **Inputs mutated**: each input's whole flat buffer (guard bands and layout gaps included)
  is copied on the device before the calls and compared bit for bit after each one; a
  change fails the case naming the input, the number of changed elements and the first, as a
  view index (or the band or gap it lies in).  The copy doubles the inputs' device memory.

JAX implementations are functional (they return new arrays and cannot write in place), so
they get no output buffers, no bands and no input snapshot: there is nothing to guard.

Findings are `OutputReport`s (`passed=False`, `numel=0`, the text in `message`, the kind in
`details["check"]`), so reports, JSON and the CLI print them like any output line.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from harness import dtypes, frameworks
from harness.compare import OutputReport
from harness.registry import get_op
from harness.tensors import GUARD_BYTES

# One finite, recognisable pattern per element width (not NaN: writing NaN must show too).
CANARY = {1: 0xA5, 2: 0xBEEF, 4: 0xDEADBEEF, 8: 0xDEADBEEFDEADBEEF}


def band_elems(itemsize: int) -> int:
    """Canary elements in each band around an output of this element width."""
    return max(1, GUARD_BYTES // itemsize)


def finding(name: str, check: str, message: str, **details) -> OutputReport:
    return OutputReport(name, False, message=message, details={"check": check, **details})


def _index(shape, flat: int) -> str:
    return "(" + ",".join(str(int(i)) for i in np.unravel_index(flat, shape)) + ")" if shape else "()"


@dataclass
class GuardedOutputs:
    """Output buffers of one call: name -> (flat buffer with bands, view handed to the kernel)."""

    flats: dict
    views: dict
    guard: int  # canary elements in each band
    canary: int


class GuardedCall:
    """One implementation on one case's inputs (HostTensors, uploaded once), called with every guard.

    call(fresh=True) -> (outputs, findings): fresh guarded, poisoned outputs each call, or
    (fresh=False) the previous call's buffers re-poisoned in place, same addresses.
    refill(host) overwrites the input buffers in place with another input set of the case
    (same shapes and layouts), keeping their addresses and the view objects the kernel saw.
    """

    def __init__(self, impl, case, device: str, host_inputs: dict):
        self.impl, self.case, self.device = impl, case, device
        self.fw = frameworks.adapter(impl.backend.framework)
        spec = get_op(case.op)
        self.shapes, self.output_names = spec.shapes(case), spec.outputs_of(case)
        self.host = dict(host_inputs)
        self.flats = {k: self.fw.upload(t, device) for k, t in self.host.items()}
        self.views = {k: self.fw.view(self.flats[k], t) for k, t in self.host.items()}
        self.snapshot = self._snapshot()
        self.outs: GuardedOutputs | None = None
        self.last: dict = {}  # the outputs of the latest call

    def _snapshot(self) -> dict | None:
        if self.fw.name == "jax":  # immutable arrays: nothing can change them
            return None
        return {k: self.fw.clone(v) for k, v in self.flats.items()}

    def _guarded_outputs(self) -> GuardedOutputs:
        item = dtypes.numpy_dtype(self.case.dtype).itemsize
        guard, canary = band_elems(item), CANARY[item]
        flats, views = {}, {}
        for name in self.output_names:
            flats[name], views[name] = self.fw.guarded(self.shapes[name], self.case.dtype, self.device, guard, canary)
        return GuardedOutputs(flats, views, guard, canary)

    def call(self, fresh: bool = True) -> tuple[dict, list[OutputReport]]:
        if fresh or self.outs is None:
            self.outs = self._guarded_outputs()
        else:
            for name, view in self.outs.views.items():
                if view is not None:
                    self.fw.fill_nan(view)
        returned = self.impl.fn(self.views, self.outs.views, self.case.params)
        self.fw.sync(self.device)
        self.last = self.outs.views if returned is None else returned
        return self.last, self.band_findings() + self.mutation_findings()

    def refill(self, host_inputs: dict) -> None:
        for k, t in host_inputs.items():
            old = self.host[k]
            if (t.base.shape, t.base.dtype, t.offset, t.shape, t.strides) != \
                    (old.base.shape, old.base.dtype, old.offset, old.shape, old.strides):
                raise ValueError(f"{self.case.op}: refill of input {k!r} expects the same buffer layout "
                                 f"({old.base.size} x {old.base.dtype}, view {old.shape}), got "
                                 f"{t.base.size} x {t.base.dtype}, view {t.shape}")
            new = self.fw.copy(self.flats[k], self.fw.upload(t, self.device))
            if new is not self.flats[k]:  # JAX: no in-place refill, a new array and view
                self.flats[k], self.views[k] = new, self.fw.view(new, t)
            self.host[k] = t
        self.fw.sync(self.device)
        self.snapshot = self._snapshot()

    def band_findings(self) -> list[OutputReport]:
        """A finding for each output whose canary bands changed during the call."""
        found, outs = [], self.outs
        for name, flat in outs.flats.items():
            if flat is None:
                continue
            n, g = prod(self.shapes[name]), outs.guard
            before = np.flatnonzero(self.fw.bits_host(flat, 0, g) != outs.canary)
            after = np.flatnonzero(self.fw.bits_host(flat, g + n, n + 2 * g) != outs.canary)
            if not before.size and not after.size:
                continue
            parts = []
            if after.size:
                parts.append(f"{after.size} element(s) after the end changed, first at end+{after[0]}")
            if before.size:
                parts.append(f"{before.size} element(s) before the start changed, nearest at start-{g - before[-1]}")
            found.append(finding(name, "guard_band", "guard band written: " + "; ".join(parts),
                                 before=int(before.size), after=int(after.size)))
        return found

    def mutation_findings(self) -> list[OutputReport]:
        """A finding for each input whose buffer no longer matches its snapshot bit for bit."""
        if self.snapshot is None:
            return []
        found = []
        for k, flat in self.flats.items():
            diff = self.fw.first_difference(self.snapshot[k], flat)
            if diff is None:
                continue
            first, count = diff
            was, now = (float(self.fw.gather64(x, np.array([first]))[0]) for x in (self.snapshot[k], flat))
            found.append(finding(k, "input_mutated",
                                 f"input modified by the call: {count} element(s) changed, first at "
                                 f"{self.host[k].locate(first)}: was {was:.6g}, now {now:.6g}",
                                 changed=count, first=first))
        return found


def compare_calls(fw, name: str, first, again, call_no: int) -> OutputReport | None:
    """A finding if output `name` of call `call_no` differs bit for bit from call 1's; None if equal."""
    if first is None or again is None:
        return None
    if tuple(first.shape) != tuple(again.shape) or fw.dtype_name(first) != fw.dtype_name(again):
        return finding(name, "nondeterministic",
                       f"not deterministic: call {call_no} returned shape {tuple(again.shape)} {fw.dtype_name(again)}, "
                       f"call 1 {tuple(first.shape)} {fw.dtype_name(first)}")
    diff = fw.first_difference(first, again)
    if diff is None:
        return None
    at, count = diff
    a, b = (float(fw.gather64(x, np.array([at]))[0]) for x in (first, again))
    return finding(name, "nondeterministic",
                   f"not deterministic (the implementation says it is): call {call_no} differs bitwise from "
                   f"call 1 in {count} element(s), first at {_index(tuple(first.shape), at)}: {b:.9g} vs {a:.9g}",
                   call=call_no, differing=count)


def trivial(got: np.ndarray, inputs64: dict, input_dtypes: dict, out_dtype: str) -> str:
    """'output is all zeros' / "output equals input 'a' bitwise", or '' (got: float64 on the host).

    Float64 conversion is exact and one-to-one on finite values, so equal float64 bits of a
    same-dtype input mean equal bits in the case dtype.
    """
    if got.size and not np.any(got):
        return "output is all zeros"
    for k, x in inputs64.items():
        if got.size and x.shape == got.shape and input_dtypes[k] == out_dtype and \
                np.array_equal(np.ascontiguousarray(got).view(np.uint64), np.ascontiguousarray(x).view(np.uint64)):
            return f"output equals input {k!r} bitwise"
    return ""
