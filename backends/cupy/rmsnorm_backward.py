"""rmsnorm_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/rmsnorm_backward.cuh over
norm_common.cuh) compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.

Variants:
  @v6    layernorm_backward@v6's kernel without the mean (nb_rows2: 64 registers, 1024 threads
         per SM, one 16-byte vector of x and dy per thread per row); not yet the default;
  @v7    layernorm_backward@v7's kernel without the mean (nb_rows3: 64 registers, loads copied
         into shared memory rows ahead, the finish in the same cooperative launch);
  @best  nb_rows3 where it applies (as @v7), else layernorm_backward's nb_rows design without
         the mean: the row in registers; long rows: two passes over column chunks; no atomics:
         per-block partial rows of dweight, then a fixed-order column sum; deterministic.

Host planning and launching: backends/cupy/_norm_plan.py.  Importing this module never imports cupy.
"""
from __future__ import annotations

from backends.cupy import _norm_plan as plan
from backends.cupy import cupy_backend
from harness import argcheck

OP = "rmsnorm_backward"
DTYPES = plan.DTYPES


@argcheck.register(cupy_backend, OP, variant="v6", dtypes=DTYPES, deterministic=True)
def rmsnorm_backward_v6(inputs, outs, params):
    plan.call(OP, "v6", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v7", dtypes=DTYPES, deterministic=True)
def rmsnorm_backward_v7(inputs, outs, params):
    plan.call(OP, "v7", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="best", dtypes=DTYPES, deterministic=True)
def rmsnorm_backward_best(inputs, outs, params):
    plan.call(OP, "best", inputs, outs)
