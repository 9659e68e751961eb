"""layernorm_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/layernorm_backward.cuh over
norm_common.cuh) compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.

Variants, the ladder of seed 004 and then the best kernel (each rung's kernel is described at the
top of layernorm_backward.cuh):
  @v1    one thread per row, atomicAdd of every dweight / dbias term;
  @v2    one warp per row, shuffle reductions, atomics;
  @v3    v2 with dy staged through shared memory in the second pass;
  @v4    1024 threads per row, block reduction, atomics;
  @v5    the seed's proposed next rung: a 1024-thread block takes many rows and keeps its
         columns' dweight / dbias sums in registers, one atomicAdd per column per block (N <= 16384);
  @v6    the best design at 64 registers (nb_rows2): blocks of 256-1024 threads capped at 64
         registers by their launch bounds (1024 threads per SM), one 16-byte vector of x and dy
         per thread per row, the next row's loads in flight; per-block dweight / dbias partial
         rows, a fixed-order column sum; deterministic.  Longer rows than it holds: @best's plan.
         Not yet the default (GRADORACLE_CUPY_NORMS=kernel=rows2 makes @best take it too);
  @v7    nb_rows3 (backends/cuda/norm_rows3.cuh), for dense 16-byte aligned rows up to 8192
         elements (4096 in float64): blocks of 256-1024 threads capped at 64 registers, a warp (or
         a power-of-two group of warps) per row, x / dy / mean / rstd copied into shared memory
         STAGES - 1 rows ahead with cp.async (the bytes in flight cost no registers), per-block
         dweight / dbias partial rows summed in the same cooperative launch after a grid
         barrier; deterministic.  Other layouts and longer rows: nb_rows below;
  @best  nb_rows3 where it applies (as @v7; GRADORACLE_CUPY_NORMS=kernel=rows brings back the
         former default).  Elsewhere the row in registers, the next row's loads in flight
         (nb_rows); long rows: two passes over column chunks.  No atomics: per-block partial rows
         of dweight / dbias, then a fixed-order column sum in a second kernel; deterministic.
The rungs accumulate dweight / dbias in float (double for f64) atomics: not deterministic.

Host planning and launching: backends/cupy/_norm_plan.py.  Importing this module never imports cupy.
"""
from __future__ import annotations

from backends.cupy import _norm_plan as plan
from backends.cupy import cupy_backend
from harness import argcheck

OP = "layernorm_backward"
DTYPES = plan.DTYPES


def _v5_supports(case) -> str | None:
    n = case.params["shape"][-1]
    if plan.v5_cols_per_thread(n) > plan.V5_MAX_CPT:
        return (f"cupy@v5: N = {n} > {plan.V5_MAX_CPT * plan.V4_BLOCK}: v5 keeps at most {plan.V5_MAX_CPT} "
                f"columns per thread of its 1024-thread block in registers")
    return None


# Registration order is the ladder's order: reports take speedups against the first, v1.
@argcheck.register(cupy_backend, OP, variant="v1", dtypes=DTYPES, deterministic=False)
def layernorm_backward_v1(inputs, outs, params):
    plan.call(OP, "v1", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v2", dtypes=DTYPES, deterministic=False)
def layernorm_backward_v2(inputs, outs, params):
    plan.call(OP, "v2", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v3", dtypes=DTYPES, deterministic=False)
def layernorm_backward_v3(inputs, outs, params):
    plan.call(OP, "v3", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v4", dtypes=DTYPES, deterministic=False)
def layernorm_backward_v4(inputs, outs, params):
    plan.call(OP, "v4", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v5", dtypes=DTYPES, deterministic=False, supports=_v5_supports)
def layernorm_backward_v5(inputs, outs, params):
    plan.call(OP, "v5", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v6", dtypes=DTYPES, deterministic=True)
def layernorm_backward_v6(inputs, outs, params):
    plan.call(OP, "v6", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="v7", dtypes=DTYPES, deterministic=True)
def layernorm_backward_v7(inputs, outs, params):
    plan.call(OP, "v7", inputs, outs)


@argcheck.register(cupy_backend, OP, variant="best", dtypes=DTYPES, deterministic=True)
def layernorm_backward_best(inputs, outs, params):
    plan.call(OP, "best", inputs, outs)
