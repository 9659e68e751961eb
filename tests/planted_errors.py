"""Backends that raise what third-party kernels raise, for tests/test_run_robustness.py.

Kept out of the global registry on import (register=False); a subprocess finds them through
GRADORACLE_BACKENDS=planted_errors (PYTHONPATH=tests).

planted_errors (CPU, numpy): @runtime raises RuntimeError, @assertion fails a kernel's own
`assert` (as the Triton tutorial's `assert do.is_contiguous()`), @keyerror looks up a
missing config key, @declines warns why it declines (as SDPA does) and raises
NotImplementedError when there is no CUDA device, and @correct is right.
"""
import warnings

import numpy as np

from harness.registry import Backend
from oracle.binary_backward import partials
from oracle.broadcast import sum_to_shape

OP = "binary_backward"
ALL = ("f32", "f16", "bf16", "f64")
DECLINE_WARNING = "Flash attention kernel not used because: planted reason, head dim 300 > 256"

planted_errors = Backend("planted_errors", framework="numpy", devices=("cpu",), register=False,
                         description="kernels that raise")


@planted_errors.impl(OP, variant="correct", dtypes=ALL)
def correct(inputs, outs, params):
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    outs["grad_a"][...] = sum_to_shape(g * da, a.shape)
    outs["grad_b"][...] = sum_to_shape(g * db, b.shape)


@planted_errors.impl(OP, variant="runtime", dtypes=ALL)
def runtime(inputs, outs, params):
    raise RuntimeError("planted: out of resource: shared memory, Required: 262144, Hardware limit: 232448")


def _check_contiguous(x):
    assert x.flags["C_CONTIGUOUS"], "planted: grad_out must be contiguous"


@planted_errors.impl(OP, variant="assertion", dtypes=ALL)
def assertion(inputs, outs, params):
    _check_contiguous(np.zeros((2, 3)).T)  # a transposed view: the kernel's own assert fails


@planted_errors.impl(OP, variant="keyerror", dtypes=ALL)
def keyerror(inputs, outs, params):
    return {"BLOCK": 128}["BLOCK_SIZE_N"] and None


@planted_errors.impl(OP, variant="declines", dtypes=ALL)
def declines(inputs, outs, params):
    import torch

    if not torch.cuda.is_available():
        warnings.warn(DECLINE_WARNING, UserWarning)
        raise NotImplementedError("planted: no available kernel")
    correct(inputs, outs, params)

