"""binary_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/binary_backward.cuh)
compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.

Variants of binary_backward:
  @opt    one pass over grad_out for both gradients, deterministic two-stage reduction
          (per-tile sums into final outputs or float partial rows, then a fixed-order sum).
  @naive  the first kernel one writes: a thread per element of O and atomicAdd into
          zeroed float accumulators, then a cast.  Not deterministic.

The plan is not made here: backends/_plans/binary_backward.py splits O into the K x RA x RB
box and backends/_plans/binary_backward_cuda.py picks the kernel, its tiles and its BBParams
words (the same plan torch_ext's CUDA op launches from).  This module checks the arguments,
names the kernel instantiations and launches them.

Importing this module never imports cupy.
"""
from __future__ import annotations

from math import prod

import numpy as np

from backends._plans import binary_backward as bcast
from backends._plans.binary_backward import Plan
from backends._plans.binary_backward_cuda import (BLOCK, J_BATCH, PARAMS_WORDS, Launch, finalize_grid, naive_grid,
                                                  naive_words, plan_launch)
from backends.cupy import cupy_backend
from backends.cupy.common import CUDA_TYPE, byte_span, check, element_strides, num_sms, overlap  # noqa: F401
from backends.cupy.common import function as _compiled
from harness import argcheck, dtypes
from oracle.binary_backward import FNS  # index = FN template argument

OP = "binary_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
SOURCE = "binary_backward.cuh"

# ============================================================================= argument checks


def _fmt(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def check_args(inputs, outs, params) -> tuple[str, str]:
    """Validate names, dtypes and shapes; returns (dtype short name, fn)."""
    for name in ("a", "b", "grad_out"):
        if name not in inputs:
            raise ValueError(f"{OP}: missing input {name!r}, expected a, b, grad_out")
    for name in ("grad_a", "grad_b"):
        if name not in outs:
            raise ValueError(f"{OP}: missing output {name!r}, expected grad_a, grad_b")
    fn = params.get("fn")
    if fn not in FNS:
        raise ValueError(f"{OP}: fn is {fn!r}, expected one of {', '.join(FNS)}")
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    try:
        dt = dtypes.from_any(a.dtype)
    except TypeError:
        dt = None
    if dt not in DTYPES:
        raise TypeError(f"{OP}: a has dtype {a.dtype}, expected one of float32, float16, bfloat16, float64")
    for name, x in (("b", b), ("grad_out", g), ("grad_a", outs["grad_a"]), ("grad_b", outs["grad_b"])):
        if x.dtype != a.dtype:
            raise TypeError(f"{OP}: {name} has dtype {x.dtype}, expected {a.dtype} (the dtype of a)")
    out_shape = bcast.broadcast_shape(a.shape, b.shape)
    if tuple(g.shape) != out_shape:
        raise ValueError(f"{OP}: grad_out has shape {_fmt(g.shape)}, expected {_fmt(out_shape)}")
    for name, x, like in (("grad_a", outs["grad_a"], a), ("grad_b", outs["grad_b"], b)):
        if tuple(x.shape) != tuple(like.shape):
            raise ValueError(f"{OP}: {name} has shape {_fmt(x.shape)}, expected {_fmt(like.shape)}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{OP}: {name} must be C-contiguous, got strides {x.strides}")
    # Outputs are written while inputs (and, across blocks, the other output) are still read.
    arrays = {"a": a, "b": b, "grad_out": g, "grad_a": outs["grad_a"], "grad_b": outs["grad_b"]}
    spans = {name: byte_span(x) for name, x in arrays.items() if x.size}
    for name in ("grad_a", "grad_b"):
        for other in ("a", "b", "grad_out", "grad_a"):
            if other != name and name in spans and other in spans and overlap(spans[name], spans[other]):
                raise ValueError(f"{OP}: {name} shares memory with {other}, expected a buffer of its own "
                                 "(outputs are written while inputs are read)")
    return dt, fn


# ============================================================================= device side

def _function(expr: str):
    """The kernel for name expression `expr` of this op's source, compiled once per process."""
    return _compiled(SOURCE, expr)


def kernel_expr(kind: str, dt: str, fn: str | None = None, vectorized: bool = False) -> str:
    """Name expression of one instantiation, e.g. ('lk8', 'f16', 'mul') -> 'bb_lk<__half, 2, 8>',
    ('cols', 'bf16', 'mul', True) -> 'bb_cols<__nv_bfloat16, 2, 8>' (16-byte packs)."""
    t = CUDA_TYPE[dt]
    if kind == "finalize":
        return f"bb_finalize<{t}>"
    f = FNS.index(fn)
    if kind in ("lk1", "lk8"):
        return f"bb_lk<{t}, {f}, {1 if kind == 'lk1' else J_BATCH}>"
    if kind in ("cols", "rows"):
        return f"bb_{kind}<{t}, {f}, {16 // ITEMSIZE[dt] if vectorized else 1}>"
    return f"bb_{kind}<{t}, {f}>"


ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}
OPT_KINDS = ("fast", "ew", "lk1", "lk8", "lr_stream", "lr_batched", "naive")


def all_kernel_exprs(dt: str) -> list[str]:
    """Every instantiation a variant can launch for dtype `dt`."""
    out = [kernel_expr(k, dt, fn) for fn in FNS for k in OPT_KINDS + ("opt2",)]
    out += [kernel_expr(k, dt, fn, vec) for fn in FNS for k in ("cols", "rows") for vec in (False, True)]
    return out + [kernel_expr("finalize", dt)]


PARAMS_DTYPE = np.dtype([("words", np.int64, (PARAMS_WORDS,))])


def params_struct(words: list[int]) -> np.ndarray:
    """BBParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


_NULL = np.uint64(0)  # a null pointer argument (8 zero bytes)


def _plan_of(inputs) -> Plan:
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    return bcast.make_plan(a.shape, b.shape, element_strides(a, "a"), element_strides(b, "b"),
                                 element_strides(g, "grad_out"))


class CupyDevice:
    """What the host code needs from the device: launches, allocations, pointers."""

    def __init__(self):
        import cupy

        self.cupy = cupy

    def launch(self, expr: str, grid: int, args) -> None:
        _function(expr)((grid,), (BLOCK,), tuple(args))  # cupy's current stream

    def empty(self, n: int, dtype):
        return self.cupy.empty(n, dtype=dtype)

    def zeros(self, n: int, dtype):
        return self.cupy.zeros(n, dtype=dtype)

    def fill_zero(self, x) -> None:
        # Outputs are contiguous and +0.0 is all-zero bits in every float format (bf16 included).
        if x.nbytes:
            x.data.memset_async(0, x.nbytes)

    def ptr(self, x) -> int:
        return x.data.ptr

    def num_sms(self) -> int:
        return num_sms()


def _acc_dtype(dt: str):
    return np.float64 if dt == "f64" else np.float32


def _finalize(dev, dt: str, part, nchunks: int, out, n: int) -> None:
    dev.launch(kernel_expr("finalize", dt), finalize_grid(n, dev.num_sms()),
               (part, np.int64(nchunks), np.int64(n), out))


def run_opt(dev, dt: str, fn: str, a, b, g, ga, gb, plan: Plan) -> Launch:
    """The opt variant's host side (stage 1, then stage 2 for outputs left in partial rows)."""
    arrays = (a, b, g, ga, gb)
    launch = plan_launch(plan, dev.num_sms(), tuple(dev.ptr(x) for x in arrays), np.dtype(a.dtype).itemsize)
    if launch.kind == "zero":  # sums over nothing
        dev.fill_zero(ga)
        dev.fill_zero(gb)
        return launch
    expr = kernel_expr(launch.kind, dt, fn)
    if launch.kind == "fast":
        dev.launch(expr, launch.grid, (*arrays, np.int64(plan.numel), np.int32(launch.vectorized)))
        return launch
    params_arg = params_struct(launch.words)
    if launch.kind == "ew":
        dev.launch(expr, launch.grid, (params_arg, *arrays))
        return launch
    p_op, q_op, d_p, d_q = (b, a, gb, ga) if launch.swap else (a, b, ga, gb)
    parts = [dev.empty(n * numel, _acc_dtype(dt)) if n > 1 else None
             for n, numel in zip(launch.nchunks, launch.numel_out)]
    args = [params_arg, p_op, q_op, g, d_p, _NULL if parts[0] is None else parts[0], d_q]
    if launch.kind != "lr_stream":  # bb_lr_stream writes dQ final, it has no dQ_part
        args.append(_NULL if parts[1] is None else parts[1])
    dev.launch(expr, launch.grid, args)
    for part, n, numel, out in zip(parts, launch.nchunks, launch.numel_out, (d_p, d_q)):
        if part is not None:
            _finalize(dev, dt, part, n, out, numel)
    return launch


def run_naive(dev, dt: str, fn: str, a, b, g, ga, gb, plan: Plan) -> None:
    """The naive variant's host side: zeroed accumulators, atomics, then casts."""
    if plan.numel == 0:
        dev.fill_zero(ga)
        dev.fill_zero(gb)
        return
    n_a, n_b = prod(ga.shape), prod(gb.shape)
    acc_a, acc_b = dev.zeros(n_a, _acc_dtype(dt)), dev.zeros(n_b, _acc_dtype(dt))
    dev.launch(kernel_expr("naive", dt, fn), naive_grid(plan.numel),
               (params_struct(naive_words(plan)), a, b, g, acc_a, acc_b))
    _finalize(dev, dt, acc_a, 1, ga, n_a)
    _finalize(dev, dt, acc_b, 1, gb, n_b)


# argcheck: the op's checks (names, cupy arrays, dtypes, shapes, one device); check_args then
# repeats the few this kernel depends on and adds its own limit (contiguous outputs).
@argcheck.register(cupy_backend, OP, variant="opt", dtypes=DTYPES, deterministic=True)
def binary_backward_opt(inputs, outs, params):
    dt, fn = check_args(inputs, outs, params)
    run_opt(CupyDevice(), dt, fn, inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"],
            _plan_of(inputs))


@argcheck.register(cupy_backend, OP, variant="naive", dtypes=DTYPES, deterministic=False)
def binary_backward_naive(inputs, outs, params):
    dt, fn = check_args(inputs, outs, params)
    run_naive(CupyDevice(), dt, fn, inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"],
              _plan_of(inputs))
