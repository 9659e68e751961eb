"""binary_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/binary_backward.cuh)
compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.

Variants of binary_backward, the ladder of seed 000 (registration order: reports take speedups
against the first), then the best kernel:
  @naive  the first kernel one writes: a thread per element of O and atomicAdd into
          zeroed float accumulators, then a cast.  Not deterministic.
  @opt    one pass over grad_out for both gradients, deterministic two-stage reduction
          (per-tile sums into final outputs or float partial rows, then a fixed-order sum).
  @opt2   the source's next rung: a thread per element of O again, O's dims collapsed per
          tensor so each offset costs one divide per remaining dim; a broadcast operand's
          gradient by atomics (not deterministic), the other written directly.
  @best   no atomics, deterministic: 16-byte packs (bb_both: 4 rows of grad_out in flight in
          4-byte types) of a / b / grad_out / the elementwise
          gradient where layout and alignment allow (scalar accesses otherwise), grids of one
          wave of resident blocks over grid-stride loops, float (double) sums in per-block
          partial rows and a fixed-order finish.  Bias-like, row-sum and both-operand broadcasts get
          their own kernels (bb_cols, bb_rows, bb_both for a short Y: its P rows read once per task,
          dQ summed over Y in registers; bb_batch for a long one), dense no-broadcast cases bb_fast, the rest (strided no-broadcast,
          lanes along K with both reduced) the opt kernels.  The kernel torch_ext launches.
          GRADORACLE_CUPY_BB (best_options) tunes it, legacy=1 restores the first GPU runs' plans.

Per call the Python is a dict lookup: the checks and the plan (kernel names, BBParams bytes,
grids) are made once per layout (`_ENTRIES`: shapes, strides, dtype, fn, 16-byte alignment,
device), the overlap check once per set of addresses.

The plan is not made here: backends/_plans/binary_backward.py splits O into the K x RA x RB
box and backends/_plans/binary_backward_cuda.py picks the kernel, its tiles and its BBParams
words (the same plan torch_ext's CUDA op launches from).  This module checks the arguments,
names the kernel instantiations and launches them.

Importing this module never imports cupy.
"""
from __future__ import annotations

import os
from math import prod

import numpy as np

from backends._plans import binary_backward as bcast
from backends._plans.binary_backward import Plan
from backends._plans.binary_backward_cuda import (BLOCK, COLLAPSED_WORDS, J_BATCH, PARAMS_WORDS, Launch,
                                                  finalize_grid, naive_grid, naive_words, opt2_words, plan_best,
                                                  plan_launch)
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
    dt = dtypes.short_or_none(a.dtype)
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

ENV = "GRADORACLE_CUPY_BB"
# ur, minblocks -> BB_BEST_UR, BB_BEST_MIN_BLOCKS; legacy=1: the previous @best launches (plan_best's
# `legacy`: bb_batch's y-looped mode for every Y), for A/B timing against the GPU's first figures.
# pf -> BB_BEST_PF (L2 prefetch distance in loop steps of bb_cols / bb_rows / bb_batch, 0: none);
# colsur, colsminblocks -> BB_COLS_UR, BB_COLS_MIN_BLOCKS (bb_cols' own; the first GPU runs had 2, 3);
# yg -> BB_YG (rows of g bb_both loads before their use, for every type: default 4, 1 for f64);
# bothminblocks -> BB_BOTH_MIN_BLOCKS.
SETTINGS = {"ur": (1, 2, 4, 8), "minblocks": (1, 2, 3, 4, 6, 8), "pf": (0, 1, 2, 4), "colsur": (1, 2, 4),
            "colsminblocks": (1, 2, 3, 4, 6, 8), "yg": (1, 2, 4, 8), "bothminblocks": (2, 3, 4), "legacy": (0, 1)}
_MACROS = {"ur": "BB_BEST_UR", "minblocks": "BB_BEST_MIN_BLOCKS", "pf": "BB_BEST_PF", "colsur": "BB_COLS_UR",
           "colsminblocks": "BB_COLS_MIN_BLOCKS", "yg": "BB_YG", "bothminblocks": "BB_BOTH_MIN_BLOCKS"}
_BEST_KERNELS = ("bb_cols<", "bb_rows<", "bb_batch<", "bb_both<")


def best_options(text: str | None = None) -> tuple[str, ...]:
    """NVRTC -D options for the @best kernels from `text` (default: $GRADORACLE_CUPY_BB), e.g.
    "ur=4,minblocks=2": packs in flight per thread and the resident blocks per SM they are built
    for (tuning only; unset, the .cuh's defaults, which torch_ext uses too).  A bad setting is a
    ValueError naming the variable."""
    text = os.environ.get(ENV, "") if text is None else text
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if name not in SETTINGS or not value.isdigit() or int(value) not in SETTINGS[name]:
            raise ValueError(f"{ENV}: {item!r} in {text!r}, expected " +
                             "; ".join(f"{k}=one of {', '.join(map(str, v))}" for k, v in SETTINGS.items()))
        if name in _MACROS:
            out.append(f"-D{_MACROS[name]}={value}")
    return tuple(out)


def best_legacy(text: str | None = None) -> bool:
    """True when `text` (default: $GRADORACLE_CUPY_BB, checked by best_options) says legacy=1."""
    text = os.environ.get(ENV, "") if text is None else text
    best_options(text)
    return any(t.replace(" ", "") == "legacy=1" for t in text.split(","))


_OPTIONS = best_options()  # read once per process
_LEGACY = best_legacy()


def _function(expr: str):
    """The kernel for name expression `expr` of this op's source, compiled once per process."""
    return _compiled(SOURCE, expr, _OPTIONS if expr.startswith(_BEST_KERNELS) else ())


def kernel_expr(kind: str, dt: str, fn: str | None = None, vectorized: bool = False) -> str:
    """Name expression of one instantiation, e.g. ('lk8', 'f16', 'mul') -> 'bb_lk<__half, 2, 8>',
    ('cols', 'bf16', 'mul', True) -> 'bb_cols<__nv_bfloat16, 2, 8>' (16-byte packs),
    ('both', 'f32', 'mul', True) -> 'bb_both<float, 2, 4>'."""
    t = CUDA_TYPE[dt]
    if kind == "finalize":
        return f"bb_finalize<{t}>"
    f = FNS.index(fn)
    if kind in ("lk1", "lk8"):
        return f"bb_lk<{t}, {f}, {1 if kind == 'lk1' else J_BATCH}>"
    if kind in ("cols", "rows", "batch", "both"):
        return f"bb_{kind}<{t}, {f}, {16 // ITEMSIZE[dt] if vectorized else 1}>"
    return f"bb_{kind}<{t}, {f}>"


ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}
OPT_KINDS = ("fast", "ew", "lk1", "lk8", "lr_stream", "lr_batched", "naive")


def all_kernel_exprs(dt: str) -> list[str]:
    """Every instantiation a variant can launch for dtype `dt`."""
    out = [kernel_expr(k, dt, fn) for fn in FNS for k in OPT_KINDS + ("opt2",)]
    out += [kernel_expr(k, dt, fn, vec) for fn in FNS for k in ("cols", "rows", "batch", "both") for vec in (False, True)]
    return out + [kernel_expr("finalize", dt)]


PARAMS_DTYPE = np.dtype([("words", np.int64, (PARAMS_WORDS,))])


def params_struct(words: list[int]) -> np.ndarray:
    """BBParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


_NULL = np.uint64(0)  # a null pointer argument (8 zero bytes)
_OCCUPANCY: dict = {}


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

    def blocks_per_sm(self, expr: str) -> int:
        """Resident BLOCK-thread blocks per SM of the compiled kernel `expr` (the driver's figure)."""
        from cupy_backends.cuda.api import driver

        key = (self.cupy.cuda.runtime.getDevice(), expr)
        if key not in _OCCUPANCY:
            fptr = _function(expr).kernel.ptr  # RawKernel -> its cupy.cuda.Function
            _OCCUPANCY[key] = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fptr, BLOCK, 0))
        return _OCCUPANCY[key]


def _acc_dtype(dt: str):
    return np.float64 if dt == "f64" else np.float32


def _finalize(dev, dt: str, part, nchunks: int, out, n: int) -> None:
    dev.launch(kernel_expr("finalize", dt), finalize_grid(n, dev.num_sms()),
               (part, np.int64(nchunks), np.int64(n), out))


def run_opt(dev, dt: str, fn: str, a, b, g, ga, gb, plan: Plan, launch: Launch | None = None,
            params_arg=None) -> Launch:
    """The opt variant's host side (stage 1, then stage 2 for outputs left in partial rows); with
    `launch` (and its packed `params_arg`), that launch instead: the best variant's."""
    arrays = (a, b, g, ga, gb)
    if launch is None:
        launch = plan_launch(plan, dev.num_sms(), tuple(dev.ptr(x) for x in arrays), np.dtype(a.dtype).itemsize)
    if launch.kind == "zero":  # sums over nothing
        dev.fill_zero(ga)
        dev.fill_zero(gb)
        return launch
    expr = kernel_expr(launch.kind, dt, fn, launch.vectorized)
    if launch.kind == "fast":
        dev.launch(expr, launch.grid, (*arrays, np.int64(plan.numel), np.int32(launch.vectorized)))
        return launch
    if params_arg is None:
        params_arg = params_struct(launch.words)
    if launch.kind == "ew":
        dev.launch(expr, launch.grid, (params_arg, *arrays))
        return launch
    p_op, q_op, d_p, d_q = (b, a, gb, ga) if launch.swap else (a, b, ga, gb)
    parts = [dev.empty(n * numel, _acc_dtype(dt)) if n > 1 else None
             for n, numel in zip(launch.nchunks, launch.numel_out)]
    args = [params_arg, p_op, q_op, g, d_p, _NULL if parts[0] is None else parts[0], d_q]
    if launch.kind not in ("lr_stream", "cols", "rows", "both"):  # these write dQ final, they have no dQ_part
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


COLLAPSED_DTYPE = np.dtype([("words", np.int64, (COLLAPSED_WORDS,))])


def run_opt2(dev, dt: str, fn: str, a, b, g, ga, gb, words: list[int], direct: tuple[bool, bool], numel: int) -> None:
    """The opt2 variant's host side: zeroed accumulators for the reduced gradients, one launch,
    then casts of the accumulators."""
    if numel == 0:
        dev.fill_zero(ga)
        dev.fill_zero(gb)
        return
    arg = np.zeros(1, dtype=COLLAPSED_DTYPE)
    arg["words"][0] = words
    accs = [None if d else dev.zeros(prod(x.shape), _acc_dtype(dt)) for d, x in zip(direct, (ga, gb))]
    dev.launch(kernel_expr("opt2", dt, fn), naive_grid(numel),
               (arg, a, b, g, ga, gb, *(_NULL if acc is None else acc for acc in accs)))
    for acc, out in zip(accs, (ga, gb)):
        if acc is not None:
            _finalize(dev, dt, acc, 1, out, prod(out.shape))


# ============================================================================= per-layout entries


class Entry:
    """One layout's plan for one variant: what `run_entry` launches, made once (`build_entry`)."""

    __slots__ = ("variant", "dt", "fn", "plan", "launch", "params_arg", "opt2", "checked")

    def __init__(self, variant, dt, fn, plan, launch=None, params_arg=None, opt2=None):
        self.variant, self.dt, self.fn, self.plan = variant, dt, fn, plan
        self.launch, self.params_arg, self.opt2 = launch, params_arg, opt2
        self.checked: set = set()  # address tuples whose overlap check passed


def build_entry(variant: str, dt: str, fn: str, shapes_strides, ptrs, num_sms: int, blocks_per_sm=None,
                legacy: bool | None = None) -> Entry:
    """The plan of `variant` for tensors a, b, grad_out of these (shape, element strides) and
    the alignment of `ptrs` (a, b, g, ga, gb addresses; only their alignment matters).  blocks_per_sm(expr) -> resident blocks
    per SM of a compiled kernel (the device's figure; default: the plan's assumption).  legacy:
    @best's previous launches (default: GRADORACLE_CUPY_BB's legacy setting)."""
    (a_shape, a_str), (b_shape, b_str), (_, g_str) = shapes_strides
    plan = bcast.make_plan(a_shape, b_shape, a_str, b_str, g_str)
    if variant == "opt2":
        return Entry(variant, dt, fn, plan, opt2=opt2_words(a_shape, b_shape, a_str, b_str, g_str))
    if variant != "best":
        return Entry(variant, dt, fn, plan)
    occ = None
    if blocks_per_sm is not None:
        def occ(kind, vec):
            return blocks_per_sm(kernel_expr(kind, dt, fn, vec))
    launch = plan_best(plan, num_sms, ptrs, ITEMSIZE[dt], occ, _LEGACY if legacy is None else legacy)
    return Entry(variant, dt, fn, plan, launch, params_struct(launch.words) if launch.words else None)


def run_entry(dev, entry: Entry, a, b, g, ga, gb) -> None:
    if entry.variant == "best":
        run_opt(dev, entry.dt, entry.fn, a, b, g, ga, gb, entry.plan, entry.launch, entry.params_arg)
    elif entry.variant == "opt2":
        run_opt2(dev, entry.dt, entry.fn, a, b, g, ga, gb, *entry.opt2)
    elif entry.variant == "opt":
        run_opt(dev, entry.dt, entry.fn, a, b, g, ga, gb, entry.plan)
    else:
        run_naive(dev, entry.dt, entry.fn, a, b, g, ga, gb, entry.plan)


_ENTRIES: dict = {}
_MAX_ENTRIES = 1 << 14  # a run over many shapes must not grow it without bound
_DEVICE = None


def _device():
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = CupyDevice()
    return _DEVICE


def call(variant: str, inputs, outs, params) -> None:
    """One call of `variant` on cupy arrays: checks and plan once per layout, the overlap check
    once per set of addresses, then the launches."""
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    ga, gb = outs["grad_a"], outs["grad_b"]
    ptrs = (a.data.ptr, b.data.ptr, g.data.ptr, ga.data.ptr, gb.data.ptr)
    aligned = not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15
    fn = params.get("fn")
    key = (variant, fn, a.dtype, a.shape, a.strides, b.shape, b.strides, g.shape, g.strides, ga.shape, ga.strides,
           ga.dtype, gb.shape, gb.strides, gb.dtype, aligned, a.device.id)
    entry = _ENTRIES.get(key)
    if entry is None:
        dt, fn = check_args(inputs, outs, params)
        dev = _device()
        layout = tuple((x.shape, element_strides(x, n)) for x, n in ((a, "a"), (b, "b"), (g, "grad_out")))
        entry = build_entry(variant, dt, fn, layout, (0,) * 5 if aligned else (1,) * 5, dev.num_sms(),
                            dev.blocks_per_sm)
        if len(_ENTRIES) >= _MAX_ENTRIES:
            _ENTRIES.clear()
        _ENTRIES[key] = entry
        entry.checked.add(ptrs)
    elif ptrs not in entry.checked:
        check_args(inputs, outs, params)  # the overlap check, for these addresses
        if len(entry.checked) >= 64:
            entry.checked.clear()
        entry.checked.add(ptrs)
    run_entry(_device(), entry, a, b, g, ga, gb)


# argcheck: the op's checks (names, cupy arrays, dtypes, shapes, one device); check_args then
# repeats the few this kernel depends on and adds its own limit (contiguous outputs).
# Registration order is the ladder's order: reports take speedups against the first, naive.
@argcheck.register(cupy_backend, OP, variant="naive", dtypes=DTYPES, deterministic=False)
def binary_backward_naive(inputs, outs, params):
    call("naive", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="opt", dtypes=DTYPES, deterministic=True)
def binary_backward_opt(inputs, outs, params):
    call("opt", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="opt2", dtypes=DTYPES, deterministic=False)
def binary_backward_opt2(inputs, outs, params):
    call("opt2", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="best", dtypes=DTYPES, deterministic=True)
def binary_backward_best(inputs, outs, params):
    call("best", inputs, outs, params)
