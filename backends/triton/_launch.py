"""Direct launches of compiled Triton kernels: the per-call launch path of the triton backend's plans.

`kernel[grid](*args, num_warps=...)` on a JITFunction binds every argument, works out its
specialisation (dtypes; pointers 16-byte aligned or not; ints equal to 1 or divisible by 16),
looks the compiled kernel up and only then launches: tens of microseconds of Python for a
kernel of thirty arguments, more than the device time of a small call.

A `Launch` is one kernel launch of a cached plan: the kernel, its grid, its options and every
argument after the leading tensor arguments are fixed when the plan is made.  Its first call
goes through the JIT (which compiles, or finds the kernel in triton's caches) and keeps the
compiled kernel; later calls hand the arguments straight to that compiled kernel's launcher.
A direct call is valid exactly when the JIT would pick the same compiled kernel:

* the same dtypes and int arguments: fixed by the plan that owns the Launch (its cache key
  holds the dtypes, shapes and strides the ints come from);
* the same pointer alignment: a call with any pointer that is not 16-byte aligned goes through
  the JIT (which picks, or compiles, the variant for it), and the launcher is only taken from
  a first call whose pointers were all aligned;
* the same device: call a Launch with its device current (the plans switch devices when needed).

Launch modes (`mode`, default from $GRADORACLE_TRITON_LAUNCH):
  direct   the launcher gets the tensors' data pointers as ints, so it skips its own data_ptr()
           call and the driver's pointer query for each tensor (the default);
  tensors  the launcher gets the tensors (what triton's own runner does);
  jit      every call through the JIT (a fallback, and the reference for host-time comparisons).
Under the interpreter every call goes through the JIT.  With a triton whose compiled kernels
take other launcher arguments (a signature that does not list every argument, or a TypeError
from the first direct call) the Launch falls back to the JIT for good.
"""
from __future__ import annotations

import os
from functools import reduce
from operator import or_

from backends.triton.common import interpreted

MODE_ENV = "GRADORACLE_TRITON_LAUNCH"
MODES = ("direct", "tensors", "jit")
ALIGN = 16  # bytes: triton specialises pointer arguments on this alignment


def default_mode() -> str:
    """The launch mode from $GRADORACLE_TRITON_LAUNCH (direct when unset)."""
    mode = os.environ.get(MODE_ENV, "direct") or "direct"
    if mode not in MODES:
        raise ValueError(f"triton launch: ${MODE_ENV}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


# Set on the first direct launcher made (torch is imported lazily, like everywhere in this backend).
_data_ptr = None
_raw_stream = None


def _bind_torch() -> None:
    global _data_ptr, _raw_stream
    import torch

    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds
    _data_ptr = torch.Tensor.data_ptr


def _current_device() -> int:
    import torch

    return torch.cuda.current_device()


def aligned(tensors) -> bool:
    """Whether every tensor's data pointer is ALIGN-byte aligned."""
    if _data_ptr is None:
        _bind_torch()
    return not reduce(or_, map(_data_ptr, tensors), 0) & (ALIGN - 1)


class Launch:
    """One launch of `kernel` on `grid` (an int or a tuple of up to 3): `launch(*tensors)`.

    `values` holds every argument after the first `n_tensors` (ints and constexprs, by name);
    `options` go to the JIT as keywords (launch_pdl=True, ...).  After the first call,
    `compiled` is triton's compiled kernel (n_regs, n_spills, metadata: for reports), and
    `runner` the direct launcher, or False where every call goes through the JIT.
    """

    __slots__ = ("kernel", "grid", "n_tensors", "tail", "num_warps", "options", "mode", "runner", "compiled",
                 "device", "calls")

    def __init__(self, kernel, grid, n_tensors: int, values: dict, num_warps: int, mode: str | None = None,
                 **options):
        names = list(kernel.arg_names)
        missing = [n for n in names[n_tensors:] if n not in values]
        if missing:
            raise KeyError(f"triton launch of {getattr(kernel, '__name__', kernel)}: no value for {missing}")
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        if not 1 <= len(grid) <= 3:
            raise ValueError(f"triton launch: grid of 1 to 3 dims expected, got {grid}")
        self.kernel, self.n_tensors, self.num_warps, self.options = kernel, n_tensors, num_warps, options
        self.grid = grid + (1,) * (3 - len(grid))
        self.tail = tuple(values[n] for n in names[n_tensors:])
        self.mode = mode or default_mode()
        if self.mode not in MODES:
            raise ValueError(f"triton launch: mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        self.runner = False if self.mode == "jit" else None
        self.compiled = None
        self.device = None
        self.calls = [0, 0]  # [through the JIT, direct]: tests and reports read it

    def __call__(self, *tensors, stream=None) -> None:
        """Launch on `tensors` (the first n_tensors arguments), on `stream` (a raw CUDA stream
        handle; None: the current stream of the launch's device)."""
        runner = self.runner
        if runner:
            ptrs = tuple(map(_data_ptr, tensors))
            if not reduce(or_, ptrs) & (ALIGN - 1):
                if stream is None:
                    stream = _raw_stream(self.device)
                try:
                    runner(*(ptrs if self.mode == "direct" else tensors), *self.tail, stream=stream)
                    self.calls[1] += 1
                    return
                except TypeError:  # a launcher that takes other arguments (an untested triton)
                    self.runner = False
        self.jit(*tensors)

    def jit(self, *tensors):
        """Launch through triton's JIT (and, on the first aligned call, keep the direct launcher)."""
        compiled = self.kernel[self.grid](*tensors, *self.tail, num_warps=self.num_warps, **self.options)
        self.calls[0] += 1
        if compiled is not None:
            self.compiled = compiled
        if self.runner is None and aligned(tensors):
            self.runner = self._direct_runner(compiled)
        return compiled

    def warmup(self, *tensors):
        """Compile (or find in triton's caches) the kernel these tensors would launch; launch nothing."""
        return self.kernel.warmup(*tensors, *self.tail, grid=self.grid, num_warps=self.num_warps, **self.options)

    def _direct_runner(self, compiled):
        """The compiled kernel's launcher for this grid, or False where it cannot stand in for
        the JIT: under the interpreter, or a triton whose launcher takes other arguments (triton
        3.3 to 3.8 pass every argument, constexprs included, as the JIT binds them)."""
        if interpreted() or compiled is None:
            return False
        signature = getattr(getattr(compiled, "src", None), "signature", None)
        if not isinstance(signature, dict) or len(signature) != len(self.kernel.arg_names):
            return False
        try:
            runner = compiled[self.grid]
            self.device = _current_device()
        except Exception:  # noqa: BLE001 - an unexpected triton: keep launching through the JIT
            return False
        if _data_ptr is None:
            _bind_torch()
        return runner

    def signature(self) -> tuple:
        """What the launch runs: equal signatures launch the same kernel the same way."""
        return (getattr(self.kernel, "__name__", repr(self.kernel)), self.grid, self.tail, self.num_warps,
                tuple(sorted(self.options.items())))
