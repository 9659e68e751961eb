"""Backends that take their process down, for testing `run --isolate` and the sticky-error stop.

Kept out of the global registry on import (register=False), so no pytest session runs
them by accident.  A subprocess finds them through GRADORACLE_BACKENDS, which registers
every Backend of the modules it names:

    GRADORACLE_BACKENDS=planted_crash PYTHONPATH=tests \\
        python -m harness run --isolate --case-timeout 5 --backend planted_crash --backend torch

planted_crash (CPU, numpy): @segfault reads address 0 (SIGSEGV), @abort calls abort()
(SIGABRT), @exit leaves with status 3, @hang sleeps forever, @raises raises an ordinary
Python error, @sticky raises an exception worded like torch's illegal-address error
(a CUDA context loss simulated on the CPU), and @correct is right.
planted_cuda (GPU, cupy): @illegal_address writes through a null pointer from a raw CUDA
kernel, the real illegal memory access (cudaErrorIllegalAddress).
"""
import ctypes
import os
import time

import numpy as np

from harness.registry import Backend
from oracle.binary_backward import partials
from oracle.broadcast import sum_to_shape

OP = "binary_backward"
ALL = ("f32", "f16", "bf16", "f64")

planted_crash = Backend("planted_crash", framework="numpy", devices=("cpu",), register=False,
                        description="kernels that crash, hang or lose the CUDA context")


@planted_crash.impl(OP, variant="correct", dtypes=ALL)
def correct(inputs, outs, params):
    """The float64 formula rounded to the output dtype: passes, so the run has a PASS row."""
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    outs["grad_a"][...] = sum_to_shape(g * da, a.shape)
    outs["grad_b"][...] = sum_to_shape(g * db, b.shape)


@planted_crash.impl(OP, variant="segfault", dtypes=ALL)
def segfault(inputs, outs, params):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@planted_crash.impl(OP, variant="abort", dtypes=ALL)
def abort(inputs, outs, params):
    os.abort()  # SIGABRT, like a failed assert() in a C++ extension


@planted_crash.impl(OP, variant="exit", dtypes=ALL)
def exit_3(inputs, outs, params):
    os._exit(3)  # a library calling exit(): no exception, no signal


@planted_crash.impl(OP, variant="hang", dtypes=ALL)
def hang(inputs, outs, params):
    while True:  # a kernel that never finishes, as far as the host can tell
        time.sleep(3600)


@planted_crash.impl(OP, variant="raises", dtypes=ALL)
def raises(inputs, outs, params):
    raise RuntimeError("planted: an ordinary error, the process is fine")


@planted_crash.impl(OP, variant="sticky", dtypes=ALL)
def sticky(inputs, outs, params):
    raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                       "CUDA kernel errors might be asynchronously reported at some other API call")


# ----------------------------------------------------------------------------- on a GPU

planted_cuda = Backend("planted_cuda", framework="cupy", devices=("cuda",), register=False,
                       description="a raw CUDA kernel that writes through a null pointer")

_WILD = r"""
extern "C" __global__ void write_wild(float* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 1.0f;  // p is null: every thread faults
}
"""


@planted_cuda.impl(OP, variant="illegal_address", dtypes=("f32",))
def illegal_address(inputs, outs, params):
    import cupy

    kernel = cupy.RawKernel(_WILD, "write_wild")
    kernel((4,), (256,), (np.uint64(0), np.int32(1024)))  # a null float*
    cupy.cuda.get_current_stream().synchronize()  # the fault surfaces here: cudaErrorIllegalAddress
