"""conv_backward_weight (wgrad) for the `cupy` backend: backends/cuda/conv_backward_weight.cuh
compiled with NVRTC, an implicit GEMM per tap and group (tensor cores for bf16 / f16, fp32
accumulation; FMA for f32 / f64), every layout and view through element strides.  The N x spatial
reduction is split over blocks into fp32 (fp64) partial tiles, summed in a fixed order by a
finishing kernel: deterministic, no atomics.

Variants:
  @best  the GEMM per tap (direct kernels for small channel groups);
  @taps  = best, except groups == 1 with small Cin (plan.MERGE_CIG_MAX) and more than one tap: one
         GEMM over every (tap, ci) column (cv_wgrad_taps), dy read once for all taps.  On trial
         against @best (the ResNet stem) before it becomes the default.
Host side (plans cached per layout): backends/cupy/_conv.py, backends/_plans/conv_cuda.py.
"""
from __future__ import annotations

from backends.cupy import _conv, cupy_backend
from harness import argcheck

OP = "conv_backward_weight"


def _impl(variant: str):
    def fn(inputs, outs, params):
        _conv.call(OP, variant, inputs["dy"], inputs["x"], outs["dw"], params)
    fn.__name__ = f"conv_backward_weight_{variant}"
    return fn


for _variant in ("best", "taps"):
    argcheck.register(cupy_backend, OP, variant=_variant, dtypes=_conv.DTYPES, deterministic=True)(_impl(_variant))
