"""conv_backward_weight (wgrad) for the `cupy` backend: backends/cuda/conv_backward_weight.cuh
compiled with NVRTC, an implicit GEMM per tap and group (tensor cores for bf16 / f16, fp32
accumulation; FMA for f32 / f64), every layout and view through element strides.  The N x spatial
reduction is split over blocks into fp32 (fp64) partial tiles, summed in a fixed order by a
finishing kernel: deterministic, no atomics.

Variants:
  @best    a GEMM per tap (direct kernels for small channel groups), except groups == 1 with small
           Cin (plan.MERGE_CIG_MAX) and more than one tap: one GEMM over every (tap, ci) column
           (cv_wgrad_taps), dy read once for all taps;
  @pertap  a GEMM per tap there too: @best before the merged GEMM, kept for the A/B (the ResNet
           stem: 7.6-26 ms against 0.45-1.07 ms merged, BENCHMARKS.md).
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


for _variant in ("best", "pertap"):
    argcheck.register(cupy_backend, OP, variant=_variant, dtypes=_conv.DTYPES, deterministic=True)(_impl(_variant))
