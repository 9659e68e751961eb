"""Launches of compiled Triton kernels, the per-call path of every plan of the triton backend
(binary_backward, reduce_sum, the norms), and what an SM holds of a compiled kernel.

`kernel[grid](*args, num_warps=...)` on a JITFunction binds every argument, works out its
specialisation (dtypes; pointers 16-byte aligned or not; ints equal to 1 or divisible by 16),
looks the compiled kernel up and only then launches: tens of microseconds of Python for a
kernel of thirty arguments, more than the device time of a small call.

A `Step` is one kernel launch of a cached plan: the kernel, its grid, its options and every
argument after the leading tensor arguments are fixed when the plan is made.  Its first call
goes through the JIT (which compiles, or finds the kernel in triton's caches) and keeps the
compiled kernel; later calls hand the arguments straight to that compiled kernel's launcher.
A direct call is valid exactly when the JIT would pick the same compiled kernel:

* the same dtypes and int arguments: fixed by the plan that owns the Step (its cache key
  holds the dtypes, shapes and strides the ints come from);
* the same pointer alignment: a call with any pointer that is not 16-byte aligned goes through
  the JIT (which picks, or compiles, the variant for it), and the launcher is only taken from
  a first call whose pointers were all aligned;
* the same device: call a Step with its device current (the plans switch devices when needed).

Launch modes (`mode`, default from $GRADORACLE_TRITON_LAUNCH):
  direct   the launcher gets the tensors' data pointers as ints, so it skips its own data_ptr()
           call and the driver's pointer query for each tensor (the default);
  tensors  the launcher gets the tensors (what triton's own runner does);
  jit      every call through the JIT (a fallback, and the reference for host-time comparisons).
Under the interpreter every call goes through the JIT.  With a triton whose compiled kernels
take other launcher arguments (a signature that does not list every argument, or a TypeError
from the first direct call) the Step falls back to the JIT for good.

`raw_launch`: a launch handed straight to triton's launcher module with the arguments its
CudaLauncher would pass (triton 3.6 and 3.8 layouts; None for any other), for plans that make
one per-call closure of all their launches (backends/triton/_norm.py, Call._make_fast).

`programs_per_sm` / `resources` / `occupancy`: programs of a compiled kernel resident per SM,
from its registers and shared memory, so that split launches can be sized to whole waves.
"""
from __future__ import annotations

import os
from functools import reduce
from operator import or_

from backends.triton import common

MODE_ENV = "GRADORACLE_TRITON_LAUNCH"
MODES = ("direct", "tensors", "jit")
ALIGN = 16  # bytes: triton specialises pointer arguments on this alignment


def interpreted() -> bool:
    return common.interpreted()


def default_mode() -> str:
    """The launch mode from $GRADORACLE_TRITON_LAUNCH (direct when unset)."""
    mode = os.environ.get(MODE_ENV, "direct") or "direct"
    if mode not in MODES:
        raise ValueError(f"triton launch: ${MODE_ENV}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


# ============================================================================= occupancy


def programs_per_sm(n_regs: int, smem: int, num_warps: int, max_threads: int = 2048, regs: int = 65536,
                    smem_per_sm: int = 233472) -> int:
    """How many programs of a compiled kernel an SM holds at once (H100 defaults): threads,
    registers (allocated 256 per warp at a time) and shared memory (1 KiB reserved per block)."""
    threads = 32 * num_warps
    per_warp = common.cdiv(max(1, n_regs) * 32, 256) * 256
    limits = [max_threads // threads, regs // (per_warp * num_warps), 32]
    if smem:
        limits.append(smem_per_sm // (smem + 1024))
    return max(1, min(limits))


def _facts(k) -> dict:
    return {"regs": int(k.n_regs), "spills": int(getattr(k, "n_spills", 0) or 0),
            "shared": int(getattr(k.metadata, "shared", 0) or 0)}


def resources(kernel, args: tuple, kwargs: dict, num_warps: int) -> dict | None:
    """{"regs", "spills", "shared"} of `kernel` compiled for these arguments (compiled now, as
    a launch would compile it: same argument types and alignment), or None where the API does
    not answer (an untested triton, the interpreter)."""
    if interpreted():
        return None
    try:
        k = kernel.warmup(*args, **kwargs, num_warps=num_warps, grid=(1,))
        k._init_handles()
        return _facts(k)
    except Exception:  # noqa: BLE001 - an API that moved: the caller falls back to its guess
        return None


def occupancy(res: dict | None, num_warps: int, device) -> int | None:
    """Programs per SM of a kernel with resources `res` on a CUDA device; None without `res`."""
    if not res:
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    return programs_per_sm(res["regs"], res["shared"], num_warps,
                           getattr(props, "max_threads_per_multi_processor", 2048),
                           getattr(props, "regs_per_multiprocessor", 65536),
                           getattr(props, "shared_memory_per_multiprocessor", 233472))


# ============================================================================= launching

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


class Step:
    """One launch of `kernel` on `grid` (an int or a tuple of up to 3): `step(*tensors)` or
    `step.launch(*tensors)`.

    `values` holds every argument after the first `n_tensors` (ints and constexprs, by name);
    `options` go to the JIT as keywords (launch_pdl=True, ...).  After the first call,
    `compiled` is triton's compiled kernel (n_regs, n_spills, metadata: for reports; None under
    the interpreter), and `runner` the direct launcher, or False where every call goes through
    the JIT.  Launches on the current device's current stream, as the JIT does, unless given one.
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

    launch = __call__

    def jit(self, *tensors):
        """Launch through triton's JIT (and, on the first aligned call, keep the direct launcher)."""
        compiled = self.kernel[self.grid](*tensors, *self.tail, num_warps=self.num_warps, **self.options)
        self.calls[0] += 1
        if compiled is not None and not interpreted():
            self.compiled = compiled
        if self.runner is None:
            if interpreted():
                self.runner = False
            elif aligned(tensors):
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
        if _raw_stream is None:  # a CPU-only torch: no raw stream to hand the launcher
            return False
        return _lean_runner(compiled, self.grid, runner) or runner

    def raw(self):
        """`raw_launch` of the compiled kernel, once this Step launches it directly with data
        pointers (mode direct, after an aligned first call); else None.  `go(stream, ptrs + tail)`
        launches what `step(*tensors, stream=stream)` would (`calls` does not count it)."""
        if not self.runner or self.mode != "direct" or self.compiled is None:
            return None
        return raw_launch(self.compiled, self.grid)

    def signature(self) -> tuple:
        """What the launch runs: equal signatures launch the same kernel the same way."""
        return (getattr(self.kernel, "__name__", repr(self.kernel)), self.grid, self.tail, self.num_warps,
                tuple(sorted(self.options.items())))

    def resources(self) -> dict | None:
        """{"regs", "spills", "shared"} of the compiled kernel (after the first launch), else None."""
        k = self.compiled
        if k is None or getattr(k, "n_regs", None) is None:
            return None
        return _facts(k)


def _lean_runner(compiled, grid: tuple, runner):
    """The compiled kernel's launch without its runner's per-call extras, or None.

    triton's runner (`compiled[grid]`, triton 3.3 to 3.8) builds the launch metadata for the launch
    hooks and hands the launcher the hook chains, which it calls even when empty: microseconds a
    launch.  With no hook registered this calls the launcher (`compiled.run`) as the runner would,
    with no metadata and no hooks; while any hook is registered (a profiler's), each launch goes
    through `runner` instead, so the hooks see every launch.
    """
    chains = hook_chains()
    try:
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except Exception:  # noqa: BLE001 - another triton: its own runner
        return None
    if chains is None:
        return None
    enter, leave = chains
    gx, gy, gz = grid

    def lean(*args, stream):
        if enter.calls or leave.calls:
            runner(*args, stream=stream)
        else:
            run(gx, gy, gz, stream, function, meta, None, None, None, *args)

    return lean


# ============================================================================= raw launches

# The parameters of triton's CudaLauncher.__call__ (triton/backends/nvidia/driver.py) whose launch
# call raw_launch repeats: 3.8 hands the launcher module the arguments as one tuple with their C
# signature; 3.6 passes them on one by one to a launcher compiled per kernel.
_CALL_38 = ("self", "gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
            "launch_enter_hook", "launch_exit_hook")
_CALL_36 = ("self", "gridX", "gridY", "gridZ", "stream", "function")
_CO_VARARGS = 0x04


def raw_launch(compiled, grid: tuple):
    """`go(stream, args)`: a launch of `compiled` on `grid` handed straight to its launcher
    module (`compiled.run.launch`), with the arguments triton's own CudaLauncher would pass it
    for a kernel that needs no scratch memory, with no launch metadata and no hooks; or None
    where that cannot be done exactly so (another triton, scratch memory, a sanitizer build).

    It skips what CudaLauncher.__call__ adds in Python per launch (two closures, the scratch
    allocations it does not need, the driver lookup): about a microsecond.  Callers check the
    launch hooks first (`hooks`), as the lean runner does, and call it only while none is set.
    """
    run = getattr(compiled, "run", None)
    try:
        function, meta = compiled.function, compiled.packed_metadata
        launch, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
        scratch = (run.global_scratch_size, run.profile_scratch_size)
        code = type(run).__call__.__code__
    except AttributeError:
        return None
    if any(scratch) or getattr(run, "gsan_enabled", False):
        return None
    names = code.co_varnames[:code.co_argcount]
    gx, gy, gz = grid
    if not code.co_flags & _CO_VARARGS:  # both take the kernel's arguments as *args
        return None
    if names == _CALL_38 and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        ann, sig = run.arg_annotations, run.kernel_signature

        def go(stream, args):
            launch(gx, gy, gz, stream, function, coop, pdl, meta, None, None, None, None, None, ann, sig, args)

        return go
    if names == _CALL_36 and not hasattr(run, "arg_annotations"):

        def go(stream, args):
            launch(gx, gy, gz, stream, function, coop, pdl, None, None, meta, None, None, None, *args)

        return go
    return None


def hook_chains():
    """triton's (launch_enter_hook, launch_exit_hook) chains: a launch hook (a profiler's) is
    registered while `enter.calls or leave.calls`; None where this triton keeps its hooks
    elsewhere (then no raw launches)."""
    try:
        from triton import knobs

        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    except Exception:  # noqa: BLE001 - another triton
        return None
    if not (isinstance(getattr(enter, "calls", None), list) and isinstance(getattr(leave, "calls", None), list)):
        return None
    return enter, leave
