"""conv_backward_weight (wgrad) for the `cupy` backend: backends/cuda/conv_backward_weight.cuh
compiled with NVRTC, an implicit GEMM per tap and group (tensor cores for bf16 / f16, fp32
accumulation; FMA for f32 / f64), every layout and view through element strides.  The N x spatial
reduction is split over blocks into fp32 (fp64) partial tiles, summed in a fixed order by a
finishing kernel: deterministic, no atomics.

Host side (plans cached per layout): backends/cupy/_conv.py, backends/_plans/conv_cuda.py.
"""
from __future__ import annotations

from backends.cupy import _conv, cupy_backend
from harness import argcheck

OP = "conv_backward_weight"


@argcheck.register(cupy_backend, OP, variant="best", dtypes=_conv.DTYPES, deterministic=True)
def conv_backward_weight_best(inputs, outs, params):
    _conv.call(OP, "best", inputs["dy"], inputs["x"], outs["dw"], params)
