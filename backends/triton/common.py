"""What every Triton kernel module of this backend shares: the guarded triton import, the
interpreter switch, dtype conversions inside kernels, launch-size helpers, and the buffer checks
(byte_span, overlap: defined once for every backend in backends/_buffers.py, re-exported here).

Importing it never raises: without triton, `tl` and `jit` are stand-ins so kernel modules
still import (the backend then reads as unavailable, with IMPORT_ERROR as the reason).
"""
from __future__ import annotations

import os

from backends._buffers import byte_span, overlap  # noqa: F401 - re-exported for op modules

try:  # guarded: listing backends must work on machines without triton
    import triton
    import triton.language as tl

    IMPORT_ERROR = None
    jit = triton.jit
except Exception as exc:  # noqa: BLE001 - any broken install reads as "unavailable"
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
    triton = None

    class tl:  # noqa: N801 - stands in for triton.language so kernel modules still import
        @staticmethod
        def constexpr(value=None):
            return value

    def jit(fn=None, **_):
        return fn if fn is not None else (lambda f: f)



@jit
def up(x, IS_F64: tl.constexpr):
    """To the compute dtype: float64 for float64 inputs, float32 otherwise."""
    if IS_F64:
        y = x.to(tl.float64)
    else:
        y = x.to(tl.float32)
    return y


@jit
def to_out(x, out_ptr):
    """x in out_ptr's dtype, rounded to nearest even.  The GPU converts so; the interpreter
    truncates float32 to bfloat16, so there the rounding is done on the bits."""
    if INTERPRETER and out_ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        y = tl.where(x != x, x.to(tl.bfloat16), (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True))
    else:
        y = x.to(out_ptr.dtype.element_ty)
    return y



# Whether kernels are made by the interpreter (TRITON_INTERPRET=1 set before triton's import).
INTERPRETER = tl.constexpr(type(up).__name__ == "InterpretedFunction")


def interpreted() -> bool:
    return bool(INTERPRETER)


def check(device: str) -> str | None:
    """None if the backend can run on `device`, else why not."""
    if IMPORT_ERROR is not None:
        return f"triton: cannot import triton ({IMPORT_ERROR})"
    if device == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1" or not interpreted():
            return "triton: CPU needs TRITON_INTERPRET=1 set before triton is imported"
        return None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "triton: no CUDA device"
        if interpreted():
            return "triton: TRITON_INTERPRET=1 is set, so kernels would run in the interpreter, not on the GPU"
        return None
    return f"triton: unknown device {device!r}"


# Autotuning, shared by the ops that time their candidate sizings on the call's own tensors.
TUNE_ENV = "GRADORACLE_TRITON_TUNE"  # =0: no timing, every call takes the default sizing


def tuning_on() -> bool:
    return os.environ.get(TUNE_ENV, "1") != "0"


def capturing(device) -> bool:
    """Whether the current CUDA stream is capturing a graph (no syncs, no timing then)."""
    import torch

    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def time_ms(run, reps: int = 3, rounds: int = 3) -> float:
    """Fastest mean of `reps` back-to-back calls of `run()` over `rounds`, by CUDA events (after one warm call)."""
    import torch

    run()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def p2(n: int) -> int:
    """Smallest power of two >= n."""
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def on_device(x):
    """Context for a launch on x's device (triton launches on the current device, not the tensors')."""
    import contextlib

    if x.device.type == "cpu":
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(x.device)
