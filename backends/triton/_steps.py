"""Launch bookkeeping of the binary_backward and reduce_sum kernels: a kernel called through the
compiled kernel's own launcher, and what an SM holds of a compiled kernel.

* `Step`: one kernel launch with fixed arguments after the tensors.  The first launch goes
  through triton's JIT (compiling, or finding the kernel in triton's cache); later ones call
  the compiled kernel's launcher directly, which skips the JIT's per-call argument binding,
  specialisation and cache lookup (tens of microseconds of Python per launch).
* `programs_per_sm` / `resources`: programs of a compiled kernel resident per SM, from its
  registers and shared memory, so that split launches can be sized to whole waves.
"""
from __future__ import annotations

from backends.triton import common


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


def resources(kernel, args: tuple, kwargs: dict, num_warps: int) -> dict | None:
    """{"regs", "spills", "shared"} of `kernel` compiled for these arguments (compiled now, as
    a launch would compile it: same argument types and alignment), or None where the API does
    not answer (an untested triton, the interpreter)."""
    if common.interpreted():
        return None
    try:
        k = kernel.warmup(*args, **kwargs, num_warps=num_warps, grid=(1,))
        k._init_handles()
        return {"regs": int(k.n_regs), "spills": int(getattr(k, "n_spills", 0) or 0),
                "shared": int(getattr(k.metadata, "shared", 0) or 0)}
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


def direct_runner(kernel, compiled, grid: int):
    """The compiled kernel's own launcher for `grid`, or None where it cannot stand in for a
    launch through the JIT: under the interpreter, or with a triton whose launcher takes
    other arguments (triton 3.3 to 3.8 pass every argument, constexprs included, as here)."""
    if common.interpreted() or compiled is None:
        return None
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if not isinstance(signature, dict) or len(signature) != len(kernel.arg_names):
        return None
    try:
        return compiled[(grid, 1, 1)]
    except Exception:  # noqa: BLE001 - an unexpected triton: keep launching through the JIT
        return None


class Step:
    """One kernel launch of a plan: the kernel, its grid and the arguments after the tensors.

    Launches on torch's current stream and device, as the JIT does.  runner: None before the
    first launch, False where every launch goes through the JIT (the interpreter; a triton
    whose launcher differs).  compiled: the compiled kernel of the first launch (its n_regs,
    n_spills), None before it or under the interpreter.
    """

    __slots__ = ("kernel", "grid", "tail", "num_warps", "runner", "compiled")

    def __init__(self, kernel, grid: int, n_tensors: int, values: dict, num_warps: int):
        self.kernel, self.grid, self.num_warps, self.runner, self.compiled = kernel, grid, num_warps, None, None
        self.tail = tuple(values[name] for name in kernel.arg_names[n_tensors:])

    def launch(self, *tensors) -> None:
        runner = self.runner
        if runner:
            try:
                runner(*tensors, *self.tail)
                return
            except TypeError:  # arguments the launcher does not take (an untested triton): use the JIT
                self.runner = False
        compiled = self.kernel[(self.grid,)](*tensors, *self.tail, num_warps=self.num_warps)
        if self.runner is None:
            self.runner = direct_runner(self.kernel, compiled, self.grid) or False
            self.compiled = None if common.interpreted() else compiled

    def signature(self) -> tuple:
        return (self.kernel.__name__, self.grid, self.tail, self.num_warps)

    def resources(self) -> dict | None:
        """{"regs", "spills", "shared"} of the compiled kernel (after the first launch), else None."""
        k = self.compiled
        if k is None or getattr(k, "n_regs", None) is None:
            return None
        return {"regs": int(k.n_regs), "spills": int(getattr(k, "n_spills", 0) or 0),
                "shared": int(getattr(k.metadata, "shared", 0) or 0)}
