"""binary_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/binary_backward.cuh)
compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.

Variants of binary_backward:
  @opt    one pass over grad_out for both gradients, deterministic two-stage reduction
          (per-tile sums into final outputs or float partial rows, then a fixed-order sum).
  @naive  the first kernel one writes: a thread per element of O and atomicAdd into
          zeroed float accumulators, then a cast.  Not deterministic.

Host planning (pure Python, testable without a GPU): backends/_bcast_plan.py splits O into
the K x RA x RB box; `plan_launch` picks the kernel, assigns the groups and operands to
the kernel's roles, sizes the tiles and chunks, and packs BBParams.  The launch contract
is documented at the top of the .cuh; backends/torch_ext/binary_backward_cuda.cu mirrors
`plan_launch` in C++.

Importing this module never imports cupy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from backends import _bcast_plan
from backends._bcast_plan import Group, Plan
from backends.cupy import cupy_backend
from backends.cupy.common import CUDA_TYPE, byte_span, check, element_strides, num_sms  # noqa: F401
from backends.cupy.common import function as _compiled
from harness import argcheck, dtypes
from oracle.binary_backward import FNS  # index = FN template argument

OP = "binary_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
SOURCE = "binary_backward.cuh"

# Must match the #defines in the .cuh (a compile test checks BB_PARAMS_WORDS).
MAX_DIMS = _bcast_plan.MAX_DIMS
BLOCK = 256
J_BATCH = 8
EW_TILE = 1024
GROUP_WORDS = 2 + MAX_DIMS + 5 * MAX_DIMS
PARAMS_WORDS = 3 * GROUP_WORDS + 12

# Launch heuristics.
BLOCKS_PER_SM = 2048 // BLOCK  # resident 256-thread blocks at full occupancy
TARGET_WAVES = 2               # aim the tile count at this many full waves
MAX_GRID_WAVES = 4             # grid-stride kernels launch at most this many waves of blocks
MAX_CHUNKS = 1024              # bound on partial rows per output
MIN_ITEMS_PER_THREAD = 8       # a chunk gives each thread at least this many rows / elements
DEFAULT_SMS = 132              # H100 SXM; only used when no device is queried

ROLE_SLOTS = {False: ("a", "b", "g", "ga", "gb"), True: ("b", "a", "g", "gb", "ga")}  # by `swap`

# ============================================================================= launch planning


@dataclass
class Launch:
    """One configured launch of the opt variant (see the .cuh contract)."""

    kind: str                   # zero | fast | ew | lk1 | lk8 | lr_stream | lr_batched
    grid: int = 0
    words: list[int] = field(default_factory=list)  # BBParams, PARAMS_WORDS int64 (not for fast/zero)
    swap: bool = False          # True: role P is b (dP = grad_b), Q is a
    nchunks: tuple[int, int] = (1, 1)  # partial rows of dP, dQ (1: written final by the kernel)
    numel_out: tuple[int, int] = (0, 0)  # numel of dP, dQ
    vectorized: bool = False    # fast only


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _log2_pow2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _sorted_group(grp: Group) -> Group:
    """The group's dims reordered by decreasing |g stride|, so the fastest dim in g is innermost."""
    order = sorted(range(grp.ndim), key=lambda d: -abs(grp.strides["g"][d]))
    return Group([grp.sizes[d] for d in order], {t: [s[d] for d in order] for t, s in grp.strides.items()})


def _min_g_stride(grp: Group) -> float:
    return min((abs(s) for s in grp.strides["g"]), default=float("inf"))


def pack_group(grp: Group | None, slots) -> list[int]:
    """BBGroup words: ndim, numel, size[8], stride[5][8] with strides in `slots` order."""
    grp = grp or Group()
    pad = MAX_DIMS - grp.ndim
    words = [grp.ndim, grp.numel] + list(grp.sizes) + [1] * pad
    for slot in slots:
        words += list(grp.strides[slot]) + [0] * pad
    assert len(words) == GROUP_WORDS
    return words


def pack_params(groups, slots, *, lanes=1, chunk=(1, 1, 1), nchunk=(1, 1, 1), ntiles=1, swap=False,
                numel_out=(0, 0)) -> list[int]:
    """BBParams words in field order (the struct is all long long)."""
    words = []
    for grp in groups:
        words += pack_group(grp, slots)
    words += [lanes, _log2_pow2(lanes), *chunk, *nchunk, ntiles, int(swap), *numel_out]
    assert len(words) == PARAMS_WORDS
    return words


def split_chunks(n_items: int, min_per_chunk: int, base_tiles: int, target_tiles: int,
                 multiple: int = 1) -> tuple[int, int]:
    """(number of chunks, chunk length) for splitting n_items so that base_tiles * chunks is
    at most about target_tiles (no split when base_tiles alone reaches it: partials cost a
    buffer and a second launch), each chunk has at least min_per_chunk items, there are at
    most MAX_CHUNKS, and the chunk length is a multiple of `multiple`."""
    want = target_tiles // max(base_tiles, 1)
    most = max(1, n_items // max(min_per_chunk, 1))
    n = max(1, min(want, most, MAX_CHUNKS))
    size = _ceil_div(_ceil_div(n_items, n), multiple) * multiple
    return _ceil_div(n_items, size), size


def _grid(tiles: int, num_sms: int) -> int:
    return max(1, min(tiles, num_sms * BLOCKS_PER_SM * MAX_GRID_WAVES))


def _target_blocks(num_sms: int) -> int:
    return num_sms * BLOCKS_PER_SM * TARGET_WAVES


def _plan_ew(plan: Plan, num_sms: int) -> Launch:
    k = _sorted_group(plan.k)
    ncols = k.sizes[-1]
    nrows = k.numel // ncols
    # A tensor whose fast dim is not the column dim (a transposed view) wants tiles that span
    # rows, so its sectors are reused from L1; otherwise take wide rows.
    fast_dims = {min(range(k.ndim), key=lambda d: (abs(k.strides[t][d]), -d)) for t in ROLE_SLOTS[False]}
    tc = 32 if fast_dims != {k.ndim - 1} else min(EW_TILE, max(32, next_pow2(ncols)))
    nchunk = (_ceil_div(ncols, tc), _ceil_div(nrows, EW_TILE // tc), 1)
    ntiles = nchunk[0] * nchunk[1]
    words = pack_params([k, None, None], ROLE_SLOTS[False], lanes=tc, chunk=(tc, EW_TILE // tc, 1),
                        nchunk=nchunk, ntiles=ntiles)
    return Launch("ew", _grid(ntiles, num_sms), words)


def _plan_lk(plan: Plan, k: Group, num_sms: int) -> Launch:
    """Lanes along K; U = the smaller reduced group (in registers), V = the other (rows)."""
    ra, rb = _sorted_group(plan.ra), _sorted_group(plan.rb)
    u, v = (ra, rb) if ra.numel <= rb.numel else (rb, ra)
    swap = v is rb  # P is the operand broadcast along V: b when V = RB
    j = 1 if u.numel == 1 else J_BATCH
    kw = min(32, next_pow2(k.numel))
    nw = BLOCK // kw
    n_kt = _ceil_div(k.numel, kw)
    cu = min(u.numel, j)
    n_cu = _ceil_div(u.numel, cu)
    n_cv, cv = split_chunks(v.numel, nw * MIN_ITEMS_PER_THREAD, n_kt * n_cu, _target_blocks(num_sms))
    ntiles = n_kt * n_cu * n_cv
    numel_p, numel_q = k.numel * u.numel, k.numel * v.numel  # dP keeps K, U; dQ keeps K, V
    words = pack_params([k, u, v], ROLE_SLOTS[swap], lanes=kw, chunk=(kw, cu, cv), nchunk=(n_kt, n_cu, n_cv),
                        ntiles=ntiles, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("lk1" if j == 1 else "lk8", _grid(ntiles, num_sms), words, swap, (n_cv, n_cu), (numel_p, numel_q))


def _plan_lr(plan: Plan, x: Group, x_is_ra: bool, num_sms: int) -> Launch:
    """Lanes along the reduced group X that holds grad_out's fast dim; Y = the other one."""
    y = _sorted_group(plan.rb if x_is_ra else plan.ra)
    z = _sorted_group(plan.k)
    swap = not x_is_ra  # P is the operand broadcast along X: b when X = RB
    xw = min(32, next_pow2(x.numel))
    numel_p, numel_q = z.numel * y.numel, z.numel * x.numel  # dP keeps Z, Y; dQ keeps Z, X
    if y.numel == 1:
        segs_target = num_sms * 2048 * TARGET_WAVES // xw
        n_cx, cx = split_chunks(x.numel, xw * MIN_ITEMS_PER_THREAD, z.numel, segs_target, multiple=xw)
        ntasks = n_cx * z.numel
        words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, 1, 1), nchunk=(n_cx, 1, z.numel),
                            ntiles=ntasks, swap=swap, numel_out=(numel_p, numel_q))
        return Launch("lr_stream", _grid(_ceil_div(ntasks, BLOCK // xw), num_sms), words, swap, (n_cx, 1),
                      (numel_p, numel_q))
    nw = BLOCK // xw
    cx = xw * J_BATCH
    n_cx = _ceil_div(x.numel, cx)
    n_cy, cy = split_chunks(y.numel, nw * MIN_ITEMS_PER_THREAD, n_cx * z.numel, _target_blocks(num_sms))
    ntiles = n_cx * n_cy * z.numel
    words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, cy, 1), nchunk=(n_cx, n_cy, z.numel),
                        ntiles=ntiles, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("lr_batched", _grid(ntiles, num_sms), words, swap, (n_cx, n_cy), (numel_p, numel_q))


def plan_launch(plan: Plan, num_sms: int = DEFAULT_SMS, ptrs=(0, 0, 0, 0, 0), itemsize: int = 4) -> Launch:
    """The opt variant's launch for `plan`.  `ptrs` (a, b, g, ga, gb addresses) and `itemsize`
    decide the fast path's 16-byte vectorization."""
    if plan.numel == 0:
        return Launch("zero")
    if plan.contiguous_fast_path():
        vec = all(p % 16 == 0 for p in ptrs)
        items = plan.numel // (16 // itemsize) if vec else plan.numel
        return Launch("fast", _grid(_ceil_div(max(items, 1), BLOCK), num_sms), vectorized=vec)
    if plan.no_broadcast:
        return _plan_ew(plan, num_sms)
    # Lanes go along the group that holds grad_out's fastest dim (ties: K first).
    groups = {"k": plan.k, "ra": plan.ra, "rb": plan.rb}
    lane = min((name for name, g in groups.items() if g.ndim), key=lambda name: _min_g_stride(groups[name]))
    if lane == "k":
        return _plan_lk(plan, _sorted_group(plan.k), num_sms)
    return _plan_lr(plan, _sorted_group(groups[lane]), lane == "ra", num_sms)


def naive_words(plan: Plan) -> list[int]:
    """BBParams for bb_naive: the plan's groups as they are, natural slots."""
    return pack_params([plan.k, plan.ra, plan.rb], ROLE_SLOTS[False])


def finalize_grid(n: int, num_sms: int = DEFAULT_SMS) -> int:
    return _grid(_ceil_div(n, BLOCK), num_sms)


def naive_grid(n: int) -> int:
    return max(1, min(_ceil_div(n, BLOCK), 2**31 - 1))


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
    out_shape = _bcast_plan.broadcast_shape(a.shape, b.shape)
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
            if other != name and name in spans and other in spans and \
                    spans[name][0] < spans[other][1] and spans[other][0] < spans[name][1]:
                raise ValueError(f"{OP}: {name} shares memory with {other}, expected a buffer of its own "
                                 "(outputs are written while inputs are read)")
    return dt, fn


# ============================================================================= device side

def _function(expr: str):
    """The kernel for name expression `expr` of this op's source, compiled once per process."""
    return _compiled(SOURCE, expr)


def kernel_expr(kind: str, dt: str, fn: str | None = None) -> str:
    """Name expression of one instantiation, e.g. ('lk8', 'f16', 'mul') -> 'bb_lk<__half, 2, 8>'."""
    t = CUDA_TYPE[dt]
    if kind == "finalize":
        return f"bb_finalize<{t}>"
    f = FNS.index(fn)
    if kind in ("lk1", "lk8"):
        return f"bb_lk<{t}, {f}, {1 if kind == 'lk1' else J_BATCH}>"
    return f"bb_{kind}<{t}, {f}>"


def all_kernel_exprs(dt: str) -> list[str]:
    kinds = ("fast", "ew", "lk1", "lk8", "lr_stream", "lr_batched", "naive")
    return [kernel_expr(k, dt, fn) for fn in FNS for k in kinds] + [kernel_expr("finalize", dt)]


PARAMS_DTYPE = np.dtype([("words", np.int64, (PARAMS_WORDS,))])


def params_struct(words: list[int]) -> np.ndarray:
    """BBParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


_NULL = np.uint64(0)  # a null pointer argument (8 zero bytes)


def _plan_of(inputs) -> Plan:
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    return _bcast_plan.make_plan(a.shape, b.shape, element_strides(a, "a"), element_strides(b, "b"),
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
