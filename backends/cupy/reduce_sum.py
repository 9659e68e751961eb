"""reduce_sum for the `cupy` backend: raw CUDA C++ (backends/cuda/reduce_sum.cuh) compiled with
NVRTC through cupy.RawModule, launched on cupy's current stream.  Spec: oracle/reduce_sum.py.

Variants of reduce_sum:
  @v0 .. @v5  the parallel-reduction ladder of seed 001 (interleaved addressing with `tid % (2*s)`,
              strided index, sequential addressing, first add during the load, last warp unrolled,
              warp shuffles).  Textbook kernels reduce contiguous segments: they run the forms whose
              reduced elements of each output are one contiguous run (full sums, row sums, the
              identity), relaunching on the per-block sums until one value per segment is left.
              Other forms SKIP with the reason.  Deterministic (no atomics).
  @best       every form (axes subsets, keepdim, sum_to_shape, strided views without copies,
              empty tensors) in one pass: 16-byte loads where the layout allows, grid-stride loops,
              float accumulation (double for f64), a last-block finish for reductions split across
              blocks (fixed-order, deterministic).

Host planning (pure Python, testable without a GPU): `make_plan` collapses any request into a
batched segmented reduction over (outer, reduced, inner) dim groups with strides in elements;
`plan_launch` picks the kernel, the lanes, chunks and grid and packs RSParams; `rung_segments` /
`rung_passes` plan the ladder.  Plans are cached per (shape, strides, dtype, params), so a
repeated call does no planning.  The launch contract is documented at the top of the .cuh.

Importing this module never imports cupy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Callable

import os

import numpy as np

from backends.cupy import nvrtc as _nvrtc
from backends.cupy import cupy_backend
from backends.cupy.common import CUDA_TYPE, byte_span, num_sms
from harness import argcheck, dtypes
from oracle.reduce_sum import reduced_axes

OP = "reduce_sum"
DTYPES = ("f32", "f16", "bf16", "f64")
SOURCE = "reduce_sum.cuh"
RUNGS = ("v0", "v1", "v2", "v3", "v4", "v5")

# Must match the #defines in the .cuh (a compile test checks them).
BLOCK = 256
MAX_DIMS = 8
UNROLL = 4
GROUP_WORDS = 2 + 3 * MAX_DIMS
PARAMS_WORDS = 2 * GROUP_WORDS + 16  # == 2 * GROUP_WORDS + len(FIELDS)

# Launch heuristics (see plan_launch).
DEFAULT_SMS = 132          # H100 SXM; only used when no device is queried
DEFAULT_BLOCKS_PER_SM = 4  # when the occupancy query is unavailable
MAX_WAVES = 32             # grids are capped at this many waves of blocks (under it, a block per task)
MANY_WAVES = 4             # this many waves of equal blocks balance themselves
WAVE_EFFICIENCY = 0.9      # fewer waves must keep their last one this full (see wave_efficiency)
MAX_CHUNKS = 1024          # bound on the blocks sharing one segment / column tile
MIN_UNITS_PER_THREAD = 8   # a row-block chunk gives each thread at least this many units
MIN_ROWS_PER_THREAD = 8    # a column chunk gives each row slot at least this many rows
COL_TILE = 128             # columns per column tile when rows are split (bounds the finish's reads)
MIN_RUN_BYTES = 128        # column tiles span at least a cache line of each row

ENV = "GRADORACLE_CUPY_RS"
SETTINGS = {"teamblocks": "RS_TEAM_MIN_BLOCKS", "colblocks": "RS_COL_MIN_BLOCKS"}


def build_options(text: str | None = None) -> tuple[str, ...]:
    """NVRTC -D options from `text` (default: $GRADORACLE_CUPY_RS), e.g. "teamblocks=1,colblocks=1":
    the resident blocks per SM rs_row_team / rs_col (SIMPLE) are built for (1-8; 1 = no bound, the
    build before the bounds; unset: the .cuh's 4).  The planner reads each kernel's occupancy from
    the driver, so grids follow.  A bad setting is a ValueError naming the variable."""
    text = os.environ.get(ENV, "") if text is None else text
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = (x.strip() for x in item.partition("="))
        if name not in SETTINGS or not value.isdigit() or not 1 <= int(value) <= 8:
            raise ValueError(f"{ENV}: {item!r} in {text!r}, expected teamblocks=1..8 and/or colblocks=1..8")
        out.append(f"-D{SETTINGS[name]}={value}")
    return tuple(out)


_OPTIONS = build_options()  # read once per process
MAX_GRID_Y = 65535         # ladder launches put segments in grid.y

# ============================================================================= collapsing


@dataclass(frozen=True)
class Group:
    """Dims outer -> inner: sizes, x strides and y strides (elements; y 0 for reduced dims)."""

    sizes: tuple[int, ...] = ()
    xs: tuple[int, ...] = ()
    ys: tuple[int, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    def drop_last(self) -> "Group":
        return Group(self.sizes[:-1], self.xs[:-1], self.ys[:-1])


def collapse(dims) -> Group:
    """(size, x stride, y stride) triples as one Group: size-1 dims dropped, the rest ordered by
    decreasing |x stride| (ties keep their order), neighbours merged where both strides chain."""
    kept = sorted(((n, xs, ys) for n, xs, ys in dims if n != 1), key=lambda d: -abs(d[1]))
    out: list[list[int]] = []
    for n, xs, ys in kept:
        if out and out[-1][1] == xs * n and out[-1][2] == ys * n:
            out[-1] = [out[-1][0] * n, xs, ys]
        else:
            out.append([n, xs, ys])
    return Group(tuple(d[0] for d in out), tuple(d[1] for d in out), tuple(d[2] for d in out))


def contiguous_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class Plan:
    """A reduce_sum request as a batched segmented reduction (see the .cuh).

    kind  empty: y has no elements; zero: the reduced dims hold no element (y = 0);
          row: the reduced dims hold x's fastest dim (one segment per output element, made of
          red.numel runs of `run` elements at stride run_xs); col: a kept dim is x's fastest
          (`inner`, lanes along it; rows of red looped).
    """

    kind: str
    out_numel: int
    red_numel: int
    outer: Group = Group()   # row: every kept dim; col: kept dims but inner
    red: Group = Group()     # row: reduced dims but the run; col: every reduced dim
    run: int = 1
    run_xs: int = 0
    inner: int = 1
    inner_xs: int = 0
    inner_ys: int = 0

    def vec_possible(self, itemsize: int) -> bool:
        """16-byte loads are legal for every 16-byte aligned x (see the .cuh's VEC contract)."""
        v = 16 // itemsize
        others = self.outer.xs + self.red.xs
        if any(s % v for s in others):
            return False
        if self.kind == "row":
            return self.run_xs == 1 and (self.red.ndim == 0 or self.run % v == 0)
        if self.kind == "col":
            return self.inner_xs == 1 and self.inner % v == 0
        return False

    def vec_store_possible(self, itemsize: int) -> bool:
        v = 16 // itemsize
        return self.kind == "col" and self.inner_ys == 1 and all(s % v == 0 for s in self.outer.ys)

    def simple(self) -> bool:
        """Offsets are idx * stride (the kernels' SIMPLE flag)."""
        if self.kind == "row":
            return self.outer.ndim <= 1 and self.red.ndim == 0
        return self.outer.ndim <= 1 and self.red.ndim <= 1


def make_plan(shape, strides, axes) -> Plan:
    """The plan for x of `shape` with element `strides`, summed over `axes` (ints in [0, rank))."""
    shape, strides, axes = tuple(shape), tuple(strides), frozenset(axes)
    kept_axes = [d for d in range(len(shape)) if d not in axes]
    kept_ys = contiguous_strides([shape[d] for d in kept_axes])
    out_numel = prod(shape[d] for d in kept_axes)
    red_numel = prod(shape[d] for d in axes)
    if out_numel == 0:
        return Plan("empty", 0, red_numel)
    if red_numel == 0:
        return Plan("zero", out_numel, 0)
    kept = collapse((shape[d], strides[d], ys) for d, ys in zip(kept_axes, kept_ys))
    red = collapse((shape[d], strides[d], 0) for d in sorted(axes))
    row = red.ndim > 0 and (kept.ndim == 0 or abs(red.xs[-1]) < abs(kept.xs[-1]))
    if row:
        plan = Plan("row", out_numel, red_numel, outer=kept, red=red.drop_last(), run=red.sizes[-1],
                    run_xs=red.xs[-1])
    elif kept.ndim == 0:  # a 0-d x (or only size-1 dims) summed over nothing: one element
        plan = Plan("col", out_numel, red_numel, red=red)
    else:
        plan = Plan("col", out_numel, red_numel, outer=kept.drop_last(), red=red, inner=kept.sizes[-1],
                    inner_xs=kept.xs[-1], inner_ys=kept.ys[-1])
    # A group holds MAX_DIMS dims; the run (row) or inner (col) dim is kept outside it.
    for name, merged, extra, grp in (("kept", kept, plan.kind == "col", plan.outer),
                                     ("reduced", red, plan.kind == "row", plan.red)):
        if grp.ndim > MAX_DIMS:
            raise ValueError(f"{OP}: x has {merged.ndim} {name} dims that do not merge (shape {shape}, strides "
                             f"{strides}), expected at most {MAX_DIMS + extra}")
    return plan


# ============================================================================= best: launch planning


@dataclass
class Launch:
    """One configured launch of the best variant."""

    kernel: str                 # row_team | row_block | col
    vec: bool
    simple: bool
    grid: int
    words: list[int] = field(default_factory=list)  # RSParams, PARAMS_WORDS int64
    n_part: int = 0             # accumulator elements of partials the launch needs
    n_ticket: int = 0           # tickets (zeroed uint32) it needs
    expr: str = ""              # filled when cached: the kernel's name expression
    args: object = None         # filled when cached: params_struct(words)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pack_group(grp: Group, with_y: bool = True) -> list[int]:
    """RSGroup words: ndim, numel, size[8] (unused 1), xs[8], ys[8] (unused 0)."""
    pad = MAX_DIMS - grp.ndim
    ys = grp.ys if with_y else (0,) * grp.ndim
    words = [grp.ndim, grp.numel, *grp.sizes, *([1] * pad), *grp.xs, *([0] * pad), *ys, *([0] * pad)]
    assert len(words) == GROUP_WORDS
    return words


# RSParams fields after its two groups, in declaration order.
FIELDS = ("nseg", "run", "run_xs", "nvec", "units", "tail", "inner", "inner_xs", "inner_ys", "lanes", "lanes_log2",
          "nchunk", "chunk", "ctiles", "ntiles", "vec_store")


def pack_params(plan: Plan, *, nvec=0, units=0, tail=0, lanes=1, nchunk=1, chunk=0, ctiles=1, ntiles=0,
                vec_store=False) -> list[int]:
    """RSParams words in field order (the struct is all long long)."""
    fields = dict(nseg=plan.outer.numel, run=plan.run, run_xs=plan.run_xs, nvec=nvec, units=units, tail=tail,
                  inner=plan.inner, inner_xs=plan.inner_xs, inner_ys=plan.inner_ys, lanes=lanes,
                  lanes_log2=lanes.bit_length() - 1, nchunk=nchunk, chunk=chunk, ctiles=ctiles, ntiles=ntiles,
                  vec_store=int(vec_store))
    words = pack_group(plan.outer) + pack_group(plan.red, with_y=False) + [fields[name] for name in FIELDS]
    assert len(words) == PARAMS_WORDS
    return words


def kernel_expr(kernel: str, dt: str, vec: bool, simple: bool) -> str:
    """Name expression of a best kernel, e.g. ('col', 'bf16', True, True) -> 'rs_col<__nv_bfloat16, true, true>'."""
    flag = {True: "true", False: "false"}
    return f"rs_{kernel}<{CUDA_TYPE[dt]}, {flag[vec]}, {flag[simple]}>"


def wave_efficiency(tasks: int, resident: int) -> float:
    """Busy fraction of the block slots over the launch when `tasks` equal blocks run `resident`
    at a time: 1 for a single (partial) wave, waves / ceil(waves) beyond."""
    waves = tasks / max(resident, 1)
    return 1.0 if waves <= 1 else waves / -(-tasks // max(resident, 1))


def chunks_for(tasks: int, resident: int, most: int) -> int:
    """Chunks to split each of `tasks` equal tasks into, at most `most`: up to one wave of resident
    blocks when the tasks are fewer than it; none when they fill MANY_WAVES waves or the last of
    their waves well; else enough for MANY_WAVES waves (a partial last wave of long blocks leaves
    SMs idle and too few loads in flight)."""
    if tasks <= resident:
        want = resident // tasks
    elif tasks >= MANY_WAVES * resident or wave_efficiency(tasks, resident) >= WAVE_EFFICIENCY:
        want = 1
    else:
        want = _ceil_div(MANY_WAVES * resident, tasks)
    return max(1, min(want, most, MAX_CHUNKS))


def _plan_row(plan: Plan, dt: str, vec: bool, itemsize: int, num_sms: int, occupancy) -> Launch:
    v = 16 // itemsize if vec else 1
    nvec, tail = (plan.run // v, plan.run % v) if vec else (plan.run, 0)
    units = plan.red.numel * nvec
    nseg = plan.outer.numel
    simple = plan.simple()
    # Teams (lanes <= 32, no block barrier) when segments are short (a warp takes a few unrolled
    # trips), or many (at least half a resident warp each) and their blocks fill their waves;
    # otherwise blocks, a segment split into chunks when that evens out the waves.
    team_expr = kernel_expr("row_team", dt, vec, simple)
    resident_team = num_sms * occupancy(team_expr)
    lanes = min(32, next_pow2(max(1, _ceil_div(units + tail, UNROLL))))
    team_blocks = _ceil_div(nseg, BLOCK // lanes)
    short = units + tail <= 32 * UNROLL * 4
    many = nseg * 2 * 32 >= resident_team * BLOCK
    if short or (many and wave_efficiency(team_blocks, resident_team) >= WAVE_EFFICIENCY):
        grid = max(1, min(team_blocks, resident_team * MAX_WAVES))
        words = pack_params(plan, nvec=nvec, units=units, tail=tail, lanes=lanes)
        return Launch("row_team", vec, simple, grid, words)
    resident = num_sms * occupancy(kernel_expr("row_block", dt, vec, simple))
    nchunk = chunks_for(nseg, resident, _ceil_div(units, BLOCK * MIN_UNITS_PER_THREAD))
    ntiles = nseg * nchunk
    grid = max(1, min(ntiles, resident * MAX_WAVES))
    words = pack_params(plan, nvec=nvec, units=units, tail=tail, nchunk=nchunk, ntiles=ntiles)
    split = nchunk > 1
    return Launch("row_block", vec, simple, grid, words, n_part=ntiles if split else 0, n_ticket=nseg if split else 0)


def _plan_col(plan: Plan, dt: str, vec: bool, vec_store: bool, itemsize: int, num_sms: int, occupancy) -> Launch:
    v = 16 // itemsize if vec else 1
    n_iv = plan.inner // v  # vec implies inner % v == 0
    rows = plan.red.numel
    simple = plan.simple()
    resident = num_sms * occupancy(kernel_expr("col", dt, vec, simple))
    # Lanes along inner: COL_TILE columns (at least a cache line of each row), then wider tiles
    # while the rows are too few to give every row slot MIN_ROWS_PER_THREAD of them.
    cap = min(BLOCK, next_pow2(n_iv))
    lanes = min(cap, max(MIN_RUN_BYTES // (v * itemsize), COL_TILE // v, 1))
    while lanes < cap and rows < (BLOCK // lanes) * MIN_ROWS_PER_THREAD:
        lanes *= 2
    nw = BLOCK // lanes
    ctiles = _ceil_div(n_iv, lanes)
    base = plan.outer.numel * ctiles
    # Rows split into chunks to fill one wave of resident blocks, or to even out the waves.
    nchunk = chunks_for(base, resident, rows // (nw * MIN_ROWS_PER_THREAD))
    chunk = _ceil_div(rows, nchunk)
    nchunk = _ceil_div(rows, chunk)
    ntiles = base * nchunk
    grid = max(1, min(ntiles, resident * MAX_WAVES))
    words = pack_params(plan, lanes=lanes, nchunk=nchunk, chunk=chunk, ctiles=ctiles, ntiles=ntiles,
                        vec_store=vec and vec_store)
    split = nchunk > 1
    return Launch("col", vec, simple, grid, words, n_part=ntiles * lanes * v if split else 0,
                  n_ticket=base if split else 0)


def plan_launch(plan: Plan, dt: str, *, vec: bool = False, vec_store: bool = False, num_sms: int = DEFAULT_SMS,
                occupancy: Callable[[str], int] | None = None) -> Launch:
    """The best variant's launch for a row or col plan.  vec / vec_store: 16-byte loads / stores
    (the caller checks plan.vec_possible and the pointers' alignment); occupancy(expr): resident
    blocks per SM of a kernel."""
    occupancy = occupancy or (lambda expr: DEFAULT_BLOCKS_PER_SM)
    itemsize = dtypes.numpy_dtype(dt).itemsize
    if plan.kind == "row":
        return _plan_row(plan, dt, vec, itemsize, num_sms, occupancy)
    if plan.kind == "col":
        return _plan_col(plan, dt, vec, vec_store, itemsize, num_sms, occupancy)
    raise ValueError(f"{OP}: plan kind {plan.kind!r} has no kernel launch")


PARAMS_DTYPE = np.dtype([("words", np.int64, (PARAMS_WORDS,))])


def params_struct(words: list[int]) -> np.ndarray:
    """RSParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


# ============================================================================= the ladder


def rung_segments(plan: Plan) -> tuple[int, int, int] | str:
    """(segments, elements per segment, segment stride) when every output element sums one
    contiguous run and y is in segment order (what the textbook kernels reduce), else why not."""
    if plan.kind in ("empty", "zero"):
        return (0, 0, 0)
    if plan.kind == "row" and plan.red.ndim == 0 and plan.outer.ndim <= 1 and (plan.run_xs == 1 or plan.run == 1):
        if plan.outer.ndim == 0:
            return (1, plan.run, 0)
        if plan.outer.ys[0] == 1:
            return (plan.outer.numel, plan.run, plan.outer.xs[0])
    if plan.kind == "col" and plan.red_numel == 1 and plan.outer.ndim == 0 and plan.inner_ys in (0, 1):
        return (plan.inner, 1, plan.inner_xs)  # nothing reduced: segments of one element
    if plan.kind == "col":
        why = "a kept dim is x's fastest (a column sum: each output sums a strided column)"
    elif plan.red.ndim:
        why = f"each output sums {plan.red.numel} runs of {plan.run} elements, not one contiguous segment"
    elif plan.run_xs != 1:
        why = f"the reduced elements are {plan.run_xs} elements apart, not contiguous"
    else:
        why = "the segments are not in output order"
    return f"the textbook kernels reduce contiguous segments; here {why}"


def rung_passes(n: int, seg_stride: int, span: int) -> list[tuple[int, int, int]]:
    """(elements per segment, segment stride, blocks per segment) of each ladder pass: a block
    sums `span` elements; the next pass reduces the per-block sums until one is left."""
    passes = []
    while True:
        nb = _ceil_div(n, span)
        passes.append((n, seg_stride, nb))
        if nb == 1:
            return passes
        n, seg_stride = nb, nb


def rung_span(rung: str) -> int:
    """Elements a block of the rung covers: v3 and later add two elements during the load."""
    return BLOCK * (2 if RUNGS.index(rung) >= 3 else 1)


def rung_expr(rung: str, ti: str, to: str) -> str:
    return f"rs_{rung}<{ti}, {to}>"


def acc_type(dt: str) -> str:
    return "double" if dt == "f64" else "float"


def all_kernel_exprs(dt: str) -> list[str]:
    """Every instantiation the host may launch for dtype dt."""
    t, a = CUDA_TYPE[dt], acc_type(dt)
    pairs = sorted({(t, a), (t, t), (a, a), (a, t)})
    exprs = [rung_expr(r, ti, to) for r in RUNGS for ti, to in pairs]
    exprs += [kernel_expr(k, dt, vec, simple) for k in ("row_team", "row_block", "col")
              for vec in (True, False) for simple in (True, False)]
    return exprs


# ============================================================================= cases and plans


def layout_strides(shape, layout: str = "contig") -> tuple[int, ...]:
    """Element strides of x in a case layout, as harness.tensors.from_values builds it."""
    shape = tuple(shape)
    if layout == "transposed":
        stored = shape[:-2] + (shape[-1], shape[-2])
        s = list(contiguous_strides(stored))
        s[-1], s[-2] = s[-2], s[-1]
        return tuple(s)
    if layout == "sliced":
        s = list(contiguous_strides(shape[:-1] + (2 * shape[-1] + 1,)))
        s[-1] = 2
        return tuple(s)
    return contiguous_strides(shape)


def case_plan(case) -> Plan:
    shape = tuple(case.params["shape"])
    strides = layout_strides(shape, case.params.get("x_layout", "contig"))
    return make_plan(shape, strides, reduced_axes(shape, case.params))


def _supports_rung(rung: str):
    def supports(case) -> str | None:
        try:
            got = rung_segments(case_plan(case))
        except ValueError as exc:
            return f"cupy@{rung}: {exc}"
        return f"cupy@{rung}: {got}" if isinstance(got, str) else None
    return supports


def _supports_best(case) -> str | None:
    try:
        case_plan(case)
    except ValueError as exc:
        return f"cupy@best: {exc}"
    return None


@dataclass
class Entry:
    """A cached plan and its launches per (vec, vec_store)."""

    plan: Plan
    vec_ok: bool
    store_ok: bool
    span: tuple[int, int]       # x's element offsets [low, high] relative to its pointer
    launches: dict = field(default_factory=dict)


_PLANS: dict = {}
_MAX_PLANS = 4096


def _form_key(params) -> tuple:
    target = params.get("target")
    if target is not None:
        return ("target", tuple(target))
    axes = params.get("axes")
    return ("axes", None if axes is None else tuple(axes), bool(params.get("keepdim", False)))


def entry_for(shape, byte_strides, dtype, params) -> Entry:
    """The cached Entry of a request (planning happens on the first call only)."""
    key = (shape, byte_strides, dtype, _form_key(params))
    entry = _PLANS.get(key)
    if entry is None:
        item = np.dtype(dtype).itemsize
        if any(s % item for s in byte_strides):
            raise ValueError(f"{OP}: x has strides {byte_strides} bytes, expected multiples of its itemsize {item}")
        strides = tuple(s // item for s in byte_strides)
        plan = make_plan(shape, strides, reduced_axes(shape, params))
        low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n > 0)
        high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n > 0)
        entry = Entry(plan, plan.vec_possible(item), plan.vec_store_possible(item), (low, high))
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = entry
    return entry


# ============================================================================= device side

_KERNELS: dict = {}     # name expression -> cupy.RawKernel
_EXPR_DTYPE: dict = {}  # name expression -> the dtype whose module holds it


def kernel(expr: str):
    """The compiled kernel of name expression `expr`.  The first use of a dtype compiles every
    instantiation of that dtype in one NVRTC module (one compile instead of dozens; cupy keeps
    it in its disk cache for later processes)."""
    fn = _KERNELS.get(expr)
    if fn is None:
        import cupy

        if not _EXPR_DTYPE:
            for dt in reversed(DTYPES):  # a shared expression (rs_v0<float, float>) goes to f32's module
                _EXPR_DTYPE.update((e, dt) for e in all_kernel_exprs(dt))
        if expr not in _EXPR_DTYPE:
            raise KeyError(f"{OP}: no kernel instantiation {expr!r} in {SOURCE}")
        exprs = all_kernel_exprs(_EXPR_DTYPE[expr])
        module = cupy.RawModule(code=_nvrtc.read_source(SOURCE), options=_nvrtc.compile_options(_OPTIONS),
                                name_expressions=exprs)
        for e in exprs:
            _KERNELS.setdefault(e, module.get_function(e))
        fn = _KERNELS[expr]
    return fn


class CupyDevice:
    """What the host code needs from the device: launches, buffers, pointers, occupancy."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self._work: dict = {}
        self._occ: dict = {}

    def launch(self, expr: str, grid, args) -> None:
        kernel(expr)(tuple(grid), (BLOCK,), tuple(args))  # cupy's current stream

    def empty(self, n: int, dtype):
        return self.cupy.empty(n, dtype=dtype)

    def fill_zero(self, y) -> None:
        # y is contiguous and +0.0 is all-zero bits in every float format (bf16 included).
        if y.nbytes:
            y.data.memset_async(0, y.nbytes)

    def ptr(self, x) -> int:
        return x.data.ptr

    def num_sms(self) -> int:
        return num_sms()

    def occupancy(self, expr: str) -> int:
        """Resident blocks per SM of a kernel (queried once per device and kernel)."""
        key = (self.cupy.cuda.Device().id, expr)
        if key not in self._occ:
            try:
                got = self.cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel(expr).kernel.ptr, BLOCK, 0)
                self._occ[key] = max(1, int(got))
            except Exception:  # noqa: BLE001 - an older cupy: a safe guess
                self._occ[key] = DEFAULT_BLOCKS_PER_SM
        return self._occ[key]

    def workspace(self, n_part: int, n_ticket: int, dtype):
        """(partials, tickets) of at least these sizes; tickets are zero between launches (allocated
        zeroed; every finishing block re-arms its own).  One per device and dtype, grown on demand."""
        key = (self.cupy.cuda.Device().id, np.dtype(dtype).char)
        part, ticket = self._work.get(key, (None, None))
        if part is None or part.size < n_part:
            part = self.cupy.empty(max(n_part, 1024), dtype=dtype)
        if ticket is None or ticket.size < n_ticket:
            ticket = self.cupy.zeros(max(n_ticket, 1024), dtype=np.uint32)
        self._work[key] = (part, ticket)
        return part, ticket


_DEVICE: list = []


def device() -> CupyDevice:
    if not _DEVICE:
        _DEVICE.append(CupyDevice())
    return _DEVICE[0]


_NULL = np.uint64(0)  # a null pointer argument


def _acc_dtype(dt: str):
    return np.float64 if dt == "f64" else np.float32


def _address(a) -> int:
    """Address of element 0 (cupy, or numpy in tests)."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]


def check_args(x, y, entry: Entry) -> None:
    """What the kernels rely on beyond argcheck's checks: y dense in C order, of the planned
    size, not overlapping x."""
    if y.size != entry.plan.out_numel:
        raise ValueError(f"{OP}: y has {y.size} elements, expected {entry.plan.out_numel}")
    if not y.flags.c_contiguous:
        raise ValueError(f"{OP}: y must be C-contiguous, got strides {y.strides}")
    if x.size and y.size:
        item, (lo, hi) = x.dtype.itemsize, entry.span
        x0, x1 = _address(x) + lo * item, _address(x) + (hi + 1) * item
        y0, y1 = byte_span(y)
        if y0 < x1 and x0 < y1:
            raise ValueError(f"{OP}: y shares memory with x, expected a buffer of its own "
                             "(y is written while x is read)")


def best_launch(dev, dt: str, entry: Entry, x, y) -> Launch:
    vec = entry.vec_ok and dev.ptr(x) % 16 == 0
    store = vec and entry.store_ok and dev.ptr(y) % 16 == 0
    launch = entry.launches.get((vec, store))
    if launch is None:
        launch = plan_launch(entry.plan, dt, vec=vec, vec_store=store, num_sms=dev.num_sms(), occupancy=dev.occupancy)
        launch.args = params_struct(launch.words)
        launch.expr = kernel_expr(launch.kernel, dt, launch.vec, launch.simple)
        entry.launches[(vec, store)] = launch
    return launch


def run_best(dev, dt: str, entry: Entry, x, y) -> Launch | None:
    """The best variant's host side: at most one kernel launch (or a memset)."""
    plan = entry.plan
    if plan.kind == "empty":
        return None
    if plan.kind == "zero":  # sums over nothing
        dev.fill_zero(y)
        return None
    launch = best_launch(dev, dt, entry, x, y)
    if launch.kernel == "row_team":
        dev.launch(launch.expr, (launch.grid,), (launch.args, x, y))
        return launch
    part, ticket = _NULL, _NULL
    if launch.n_part:
        part, ticket = dev.workspace(launch.n_part, launch.n_ticket, _acc_dtype(dt))
    dev.launch(launch.expr, (launch.grid,), (launch.args, x, y, part, ticket))
    return launch


def run_rung(dev, rung: str, dt: str, entry: Entry, x, y) -> list[tuple]:
    """A ladder rung's host side: passes of the textbook kernel until one value per segment.
    Returns the passes' (n, seg_stride, blocks per segment)."""
    plan = entry.plan
    if plan.kind == "empty":
        return []
    if plan.kind == "zero":
        dev.fill_zero(y)
        return []
    got = rung_segments(plan)
    if isinstance(got, str):
        raise ValueError(f"{OP}: cupy@{rung} cannot run this form: {got}")
    nseg, n, seg_stride = got
    passes = rung_passes(n, seg_stride, rung_span(rung))
    t, a = CUDA_TYPE[dt], acc_type(dt)
    src = x
    for i, (pn, pstride, nb) in enumerate(passes):
        last = i == len(passes) - 1
        dst = y if last else dev.empty(nseg * nb, _acc_dtype(dt))
        expr = rung_expr(rung, t if i == 0 else a, t if last else a)
        for seg0 in range(0, nseg, MAX_GRID_Y):
            dev.launch(expr, (nb, min(MAX_GRID_Y, nseg - seg0)),
                       (src, dst, np.int64(pn), np.int64(pstride), np.int64(seg0)))
        src = dst
    return passes


# ============================================================================= registration


def _entry(inputs, outs, params) -> tuple[str, Entry]:
    x, y = inputs["x"], outs["y"]
    dt = dtypes.short_or_none(x.dtype)
    if dt not in DTYPES:
        raise TypeError(f"{OP}: x has dtype {x.dtype}, expected one of float32, float16, bfloat16, float64")
    if y.dtype != x.dtype:
        raise TypeError(f"{OP}: y has dtype {y.dtype}, expected {x.dtype} (the dtype of x)")
    entry = entry_for(x.shape, x.strides, x.dtype, params)
    check_args(x, y, entry)
    return dt, entry


def _rung_impl(rung: str):
    def impl(inputs, outs, params):
        dt, entry = _entry(inputs, outs, params)
        run_rung(device(), rung, dt, entry, inputs["x"], outs["y"])
    impl.__name__ = impl.__qualname__ = f"reduce_sum_{rung}"
    impl.__doc__ = f"reduce_sum through the ladder's {rung} kernel (contiguous-segment forms)."
    return impl


# argcheck: the op's checks (names, cupy arrays, dtypes, shapes, params, one device); the impls
# then check what their kernels rely on (check_args).  Ladder order = registration order.
for _rung in RUNGS:
    argcheck.register(cupy_backend, OP, variant=_rung, dtypes=DTYPES, deterministic=True,
                      supports=_supports_rung(_rung))(_rung_impl(_rung))


@argcheck.register(cupy_backend, OP, variant="best", dtypes=DTYPES, deterministic=True, supports=_supports_best)
def reduce_sum_best(inputs, outs, params):
    dt, entry = _entry(inputs, outs, params)
    run_best(device(), dt, entry, inputs["x"], outs["y"])

