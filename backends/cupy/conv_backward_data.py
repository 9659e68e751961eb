"""conv_backward_data (dgrad) for the `cupy` backend: backends/cuda/conv_backward_data.cuh compiled
with NVRTC, an implicit GEMM per filter phase (tensor cores for bf16 / f16, fp32 accumulation;
FMA for f32 / f64), every layout and view through element strides.

Variants (the strided-dgrad coordinate mapping, seed 002's A/B):
  @div           a row's (n, t) coordinates by plain / and % on both the load and the store path;
  @fastdiv_load  fast divmod (magic multiply and shift) on the load path, / and % on the store path;
  @fastdiv       fast divmod on both paths;
  @best          = fastdiv, except groups 1 with Cin <= 8 (plan.SMALLC_MAX, not a direct case): a thread
                 per dx row with every input channel in registers (cv_dgrad_smallc), on FMA, in place of
                 a GEMM tile whose 64 columns hold Cin channels (3.7-9.2x the GEMM tile on the ResNet
                 stem, BENCHMARKS.md; @fastdiv is the A/B's other side).
Host side (plans cached per layout): backends/cupy/_conv.py, backends/_plans/conv_cuda.py.
"""
from __future__ import annotations

from backends.cupy import _conv, cupy_backend
from harness import argcheck

OP = "conv_backward_data"


def _impl(variant: str):
    def fn(inputs, outs, params):
        _conv.call(OP, variant, inputs["dy"], inputs["w"], outs["dx"], params)
    fn.__name__ = f"conv_backward_data_{variant}"
    return fn


for _variant in ("div", "fastdiv_load", "fastdiv", "best"):
    argcheck.register(cupy_backend, OP, variant=_variant, dtypes=_conv.DTYPES, deterministic=True)(_impl(_variant))
