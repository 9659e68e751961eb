"""Host side of the normalisation backwards (layernorm_backward, rmsnorm_backward) for the `cupy`
backend: layouts, launch planning, argument packing and the launch sequence, over the device code
in backends/cuda/norm_common.cuh (+ layernorm_backward.cuh's ladder rungs).

Everything here but `CupyDevice` is pure Python, so it is tested without a GPU: tests/test_cuda_norms.py
runs `run` against Python ports of the kernels, tests/test_cuda_norms_host.py against the .cuh source
itself compiled for the CPU (tests/cuda_host).  Importing this module never imports cupy.

Inputs may have any strides (16-byte vectors where the layout allows, scalar accesses otherwise);
outputs must be C-contiguous.  Per call: `call` builds a key from the arrays' shapes, strides,
dtypes, 16-byte alignment and device, finds (or, once, builds and checks) the `Entry` for it,
checks that no output overlaps another array, and launches one kernel, plus nb_colsum when
dweight / dbias come from partial rows or the rungs' accumulators.  The launch contract is
documented at the top of norm_common.cuh.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from math import prod

import numpy as np

from backends.cupy import nvrtc as _nvrtc

LN, RMS = "layernorm_backward", "rmsnorm_backward"
SOURCES = {LN: "layernorm_backward.cuh", RMS: "rmsnorm_backward.cuh"}
POLICIES = {LN: "NBLayerNorm", RMS: "NBRmsNorm"}
DTYPES = ("f32", "f16", "bf16", "f64")
CUDA_TYPE = {"f32": "float", "f64": "double", "f16": "__half", "bf16": "__nv_bfloat16"}
ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}
RUNGS = ("v1", "v2", "v3", "v4", "v5")

# Must match norm_common.cuh / layernorm_backward.cuh (a compile test checks them).
MAX_LEAD = 6
NT = 5  # row tensors, in this order:
ROW_TENSORS = ("x", "dy", "dx", "mean", "rstd")
ROWS_BLOCK = 512
CHUNK_BLOCK = 512
COLSUM_BLOCK = 512
COLSUM_COLS = 32
MAX_TILE_ROWS = 32
HAS_W, HAS_B = 1, 2
PARAMS_WORDS = 3 + MAX_LEAD + NT * MAX_LEAD + 4 + 2 + 6
V1_BLOCK = 256
V4_BLOCK = 1024
V5_MAX_CPT = 16

# Tuning (not part of the contract).  Elements of a row each thread holds in nb_rows: with the next
# row prefetched and the dweight / dbias sums in registers this is what fits in the 128 registers
# a 512-thread block leaves each thread without spilling (ptxas -v on sm_90).
ROWS_ELEMS = {"vec": {2: 16, 4: 8, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}
CHUNK_ELEMS = {"vec": {2: 8, 4: 8, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}
TILE_ROWS = 8          # nb_chunked: rows whose two passes run back to back (the second hits L2)
V5_BLOCKS_PER_SM = 2   # v5's grid: 1024-thread blocks resident per SM
DEFAULT_SMS = 132      # H100 SXM; only when no device is queried


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ============================================================================= layouts


@dataclass(frozen=True)
class Layout:
    """Where every element of a call is, in elements: M rows of N over merged leading dims."""

    rows: int
    n: int
    sizes: tuple[int, ...]               # merged leading dims, outer -> inner
    strides: tuple[tuple[int, ...], ...]  # per ROW_TENSORS, per merged dim
    col: tuple[int, int, int, int]       # x, dy, dx, weight strides along N (weight: 0 when absent)
    out: tuple[int, int]                 # dweight, dbias strides (0 when absent)


def merge_lead(sizes, per_tensor) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Leading dims with size-1 dims dropped and neighbours merged where every tensor allows
    (outer stride = inner stride * inner size): (sizes, strides per tensor)."""
    dims: list[tuple[int, list[int]]] = []
    for d, size in enumerate(sizes):
        if size == 1:
            continue
        st = [s[d] for s in per_tensor]
        if dims and all(o == i * size for o, i in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * size, st)
        else:
            dims.append((size, st))
    return tuple(n for n, _ in dims), tuple(tuple(st[t] for _, st in dims) for t in range(len(per_tensor)))


def make_layout(op: str, shape, strides: dict) -> Layout:
    """`strides`: element strides of x, dy, dx (full), mean (layernorm), rstd (leading dims),
    weight, dweight, dbias (1-tuples, or None when absent)."""
    shape = tuple(int(s) for s in shape)
    n = shape[-1]
    lead = shape[:-1]
    rank = len(shape)
    per = []
    for name in ROW_TENSORS:
        st = strides.get(name)
        if name in ("mean", "rstd"):
            per.append(tuple(st) if st is not None else (0,) * (rank - 1))
        else:
            per.append(tuple(st[:-1]))
    sizes, merged = merge_lead(lead, per)
    if len(sizes) > MAX_LEAD:
        raise ValueError(f"{op}: x {shape} with these strides has {len(sizes)} leading dims that do not merge, "
                         f"expected at most {MAX_LEAD}")
    rows = prod(lead)
    if rows > 2**31 - 1:
        raise ValueError(f"{op}: x {shape} has {rows} rows, expected fewer than 2**31")
    if n > 2**31 - 2**20:
        raise ValueError(f"{op}: x {shape} has rows of {n} elements, expected fewer than 2**31 - 2**20")
    w = strides.get("weight")
    col = (strides["x"][-1], strides["dy"][-1], strides["dx"][-1], w[0] if w is not None else 0)
    out = tuple(strides[k][0] if strides.get(k) is not None else 0 for k in ("dweight", "dbias"))
    return Layout(rows, n, sizes, merged, col, out)


def vector_width(layout: Layout, itemsize: int, aligned: bool, has_w: bool) -> int:
    """16 // itemsize when every row of x, dy, dx (and weight) is a dense 16-byte aligned run
    of whole vectors, else 1."""
    v = 16 // itemsize
    if not aligned or layout.n % v:
        return 1
    if any(c != 1 for c in layout.col[:3]) or (has_w and layout.col[3] != 1):
        return 1
    if any(s % v for t in (0, 1, 2) for s in layout.strides[t]):
        return 1
    return v


# ============================================================================= launches


@dataclass
class Launch:
    """One call's launches: the main kernel, then nb_colsum when `colsum`."""

    kind: str                  # zero | rows | chunked | v1 ... v5
    expr: str = ""             # main kernel's name expression
    grid: int = 0
    block: int = 0
    words: list[int] = field(default_factory=list)
    nparts: int = 0            # partial rows per output (rungs: 1, the atomic accumulators)
    colsum: bool = False
    vec: int = 1
    vpt: int = 0
    gw: int = 0
    rows_per_block: int = 0
    tile_rows: int = 0


def pack_params(layout: Layout, flags: int, gw: int = 1, rows_per_block: int = 0, nparts: int = 1,
                tile_rows: int = 1) -> list[int]:
    """NBParams words in field order (the struct is all long long)."""
    nl = len(layout.sizes)
    pad = MAX_LEAD - nl
    words = [layout.rows, layout.n, nl] + list(layout.sizes) + [1] * pad
    for t in range(NT):
        words += list(layout.strides[t]) + [0] * pad
    words += list(layout.col) + list(layout.out)
    words += [flags, gw, gw.bit_length() - 1, rows_per_block, nparts, tile_rows]
    assert len(words) == PARAMS_WORDS
    return words


def _flags(has_w: bool, has_b: bool) -> int:
    return (HAS_W if has_w else 0) | (HAS_B if has_b else 0)


def rows_config(n: int, vec: int, itemsize: int) -> tuple[int, int] | None:
    """(VPT, gw) of nb_rows for rows of n elements, or None when the row does not fit in registers."""
    nv = _ceil_div(n, vec)
    vpt_max = ROWS_ELEMS["vec" if vec > 1 else "scalar"][itemsize] // vec
    if nv > ROWS_BLOCK * vpt_max:
        return None
    vpt = min(vpt_max, next_pow2(_ceil_div(nv, 32)))
    return vpt, next_pow2(_ceil_div(nv, vpt))


def _split_rows(rows: int, target_blocks: int, step: int) -> tuple[int, int]:
    """(rows per block, a multiple of step; blocks) covering `rows` with about target_blocks blocks."""
    rpb = _ceil_div(_ceil_div(rows, max(1, target_blocks)), step) * step
    return rpb, _ceil_div(rows, rpb)


def plan_best(op: str, dt: str, layout: Layout, has_w: bool, has_b: bool, vec: int, num_sms: int = DEFAULT_SMS,
              occupancy=None) -> Launch:
    """The best variant's launches.  occupancy(expr, block) -> resident blocks per SM (default 1)."""
    if layout.rows == 0:
        return Launch("zero")
    occupancy = occupancy or (lambda expr, block: 1)
    item, t, pol = ITEMSIZE[dt], CUDA_TYPE[dt], POLICIES[op]
    flags = _flags(has_w, has_b)
    cfg = rows_config(layout.n, vec, item)
    if cfg is not None:
        vpt, gw = cfg
        wide = gw > 32
        expr = f"nb_rows<{pol}, {t}, {vec}, {vpt}, {'true' if wide else 'false'}>"
        per_sm = max(1, occupancy(expr, ROWS_BLOCK))
        rpb, nparts = _split_rows(layout.rows, num_sms * per_sm, ROWS_BLOCK // gw)
        words = pack_params(layout, flags, gw=gw, rows_per_block=rpb, nparts=nparts)
        return Launch("rows", expr, nparts, ROWS_BLOCK, words, nparts, nparts > 1 and bool(flags), vec, vpt, gw,
                      rpb)
    vpt = CHUNK_ELEMS["vec" if vec > 1 else "scalar"][item] // vec
    expr = f"nb_chunked<{pol}, {t}, {vec}, {vpt}>"
    per_sm = max(1, occupancy(expr, CHUNK_BLOCK))
    rpb, nparts = _split_rows(layout.rows, num_sms * per_sm, 1)
    tile = min(TILE_ROWS, MAX_TILE_ROWS, rpb)
    words = pack_params(layout, flags, rows_per_block=rpb, nparts=nparts, tile_rows=tile)
    return Launch("chunked", expr, nparts, CHUNK_BLOCK, words, nparts, bool(flags), vec, vpt, 0, rpb, tile)


def v5_cols_per_thread(n: int) -> int:
    return next_pow2(_ceil_div(n, V4_BLOCK))


def plan_rung(rung: str, dt: str, layout: Layout, has_w: bool, has_b: bool, num_sms: int = DEFAULT_SMS) -> Launch:
    """A ladder rung's launch (layernorm_backward.cuh): atomics into zeroed A buffers, then a cast."""
    if layout.rows == 0:
        return Launch("zero")
    t, m = CUDA_TYPE[dt], layout.rows
    flags = _flags(has_w, has_b)
    colsum = bool(flags)
    if rung == "v1":
        return Launch("v1", f"ln_v1<{t}>", _ceil_div(m, V1_BLOCK), V1_BLOCK, pack_params(layout, flags), 1, colsum)
    if rung in ("v2", "v3"):
        return Launch(rung, f"ln_{rung}<{t}>", m, 32, pack_params(layout, flags), 1, colsum)
    if rung == "v4":
        return Launch("v4", f"ln_v4<{t}>", m, V4_BLOCK, pack_params(layout, flags), 1, colsum)
    if rung == "v5":
        cpt = v5_cols_per_thread(layout.n)
        if cpt > V5_MAX_CPT:
            raise ValueError(f"layernorm_backward cupy@v5: N = {layout.n}, expected at most {V5_MAX_CPT * V4_BLOCK} "
                             f"(v5 keeps {V5_MAX_CPT} columns per thread in registers)")
        rpb, nblocks = _split_rows(m, num_sms * V5_BLOCKS_PER_SM, 1)
        return Launch("v5", f"ln_v5<{t}, {cpt}>", nblocks, V4_BLOCK, pack_params(layout, flags, rows_per_block=rpb),
                      1, colsum, rows_per_block=rpb)
    raise ValueError(f"layernorm_backward: unknown rung {rung!r}, expected one of {', '.join(RUNGS)}")


def colsum_expr(dt: str) -> str:
    return f"nb_colsum<{CUDA_TYPE[dt]}>"


def all_kernel_exprs(op: str, dt: str) -> list[str]:
    """Every name expression the planner can launch for (op, dtype)."""
    item, t, pol = ITEMSIZE[dt], CUDA_TYPE[dt], POLICIES[op]
    exprs = set()
    for vec in sorted({1, 16 // item}):
        kind = "vec" if vec > 1 else "scalar"
        vpt_max = ROWS_ELEMS[kind][item] // vec
        for nv in (1 << k for k in range(0, 20)):  # every row-config the planner reaches
            cfg = rows_config(nv * vec, vec, item)
            if cfg is None:
                break
            vpt, gw = cfg
            exprs.add(f"nb_rows<{pol}, {t}, {vec}, {vpt}, {'true' if gw > 32 else 'false'}>")
        assert any(f", {vpt_max}, true>" in e for e in exprs if f"{t}, {vec}," in e)
        exprs.add(f"nb_chunked<{pol}, {t}, {vec}, {CHUNK_ELEMS[kind][item] // vec}>")
    exprs.add(colsum_expr(dt))
    if op == LN:
        exprs |= {f"ln_{r}<{t}>" for r in ("v1", "v2", "v3", "v4")}
        exprs |= {f"ln_v5<{t}, {1 << k}>" for k in range(V5_MAX_CPT.bit_length())}
    return sorted(exprs)


# ============================================================================= compilation


_OPTIONS: tuple[str, ...] | None = None


def compile_options() -> tuple[str, ...]:
    """-I backends/cuda for norm_common.cuh, and its checksum as a define: cupy's disk cache keys
    on the source text and options, not on included files, so an edit of the header must change
    the options."""
    global _OPTIONS
    if _OPTIONS is None:
        crc = zlib.crc32((_nvrtc.CUDA_DIR / "norm_common.cuh").read_bytes())
        _OPTIONS = (f"-I{_nvrtc.CUDA_DIR}", f"-DNB_COMMON_CRC=0x{crc:08x}")
    return _OPTIONS


# ============================================================================= calls


_NULL = np.uint64(0)  # a null pointer argument
PARAMS_DTYPE = np.dtype([("words", np.int64, (PARAMS_WORDS,))])


def params_struct(words: list[int]) -> np.ndarray:
    """NBParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


def acc_dtype(dt: str):
    return np.float64 if dt == "f64" else np.float32


NAMES = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")  # the order of `arrs` below
X, DY, W, MEAN, RSTD, DX, DW, DB = range(len(NAMES))
OUTPUTS = (DX, DW, DB)


@dataclass
class Entry:
    """A planned call: its launches with their constant arguments packed, and what the overlap
    check needs.  Built once per (shapes, strides, dtypes, alignment, device)."""

    op: str
    variant: str
    dt: str
    launch: Launch
    layout: Layout
    source: str
    params: np.ndarray | None
    # (output index, its byte extent, other index, its byte extent) for every pair that must not overlap
    pairs: list
    acc: type = np.float32
    ws_size: int = 0             # elements of the partial-row buffer (best) or accumulators (rungs)
    colsum: tuple | None = None  # (expr, grid, row0, nparts, n, stride0, stride1) of nb_colsum
    workspace: dict = field(default_factory=dict)  # stream -> partial buffer (best: reused call to call)


def _extent(shape, strides_bytes, itemsize: int) -> tuple[int, int]:
    if prod(shape) == 0:
        return 0, 0
    low = sum((n - 1) * s for n, s in zip(shape, strides_bytes) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides_bytes) if s > 0)
    return low, high + itemsize


def _element_strides(op: str, name: str, x) -> tuple[int, ...]:
    item = x.dtype.itemsize
    if any(s % item for s in x.strides):
        raise ValueError(f"{op}: {name} has strides {x.strides} bytes, expected multiples of its itemsize {item}")
    return tuple(s // item for s in x.strides)


def _c_contiguous(shape, strides_bytes, itemsize: int) -> bool:
    if 0 in tuple(shape):
        return True  # no elements: any strides
    want = itemsize
    for n, s in zip(reversed(tuple(shape)), reversed(tuple(strides_bytes))):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def build_entry(op: str, variant: str, dt: str, arrays: dict, aligned: bool, num_sms: int, occupancy=None) -> Entry:
    """Plan a call on `arrays` (name -> array or None; any object with shape, strides in bytes,
    dtype) whose pointers are 16-byte aligned or not (`aligned`).  Inputs may have any strides;
    outputs must be C-contiguous (the backends' contract: the harness passes them so)."""
    x = arrays["x"]
    for name in ("dy", "dx"):
        if tuple(arrays[name].shape) != tuple(x.shape):
            raise ValueError(f"{op}: {name} has shape {tuple(arrays[name].shape)}, expected {tuple(x.shape)}")
    for name in ("dx", "dweight", "dbias"):
        a = arrays.get(name)
        if a is not None and not _c_contiguous(a.shape, a.strides, a.dtype.itemsize):
            raise ValueError(f"{op}: {name} must be C-contiguous, got strides {tuple(a.strides)} bytes for shape "
                             f"{tuple(a.shape)}")
    strides = {name: _element_strides(op, name, a) for name, a in arrays.items() if a is not None}
    layout = make_layout(op, x.shape, strides)
    has_w, has_b = arrays.get("weight") is not None, arrays.get("dbias") is not None
    if has_w != (arrays.get("dweight") is not None):
        raise ValueError(f"{op}: weight and dweight must come together (got weight "
                         f"{'without' if has_w else 'absent, with'} dweight)")
    if variant != "best" and op != LN:
        raise ValueError(f"{op}: variant {variant!r} has no kernel: the ladder rungs are layernorm_backward's")
    if variant == "best":
        vec = vector_width(layout, ITEMSIZE[dt], aligned, has_w)
        launch = plan_best(op, dt, layout, has_w, has_b, vec, num_sms, occupancy)
    else:
        launch = plan_rung(variant, dt, layout, has_w, has_b, num_sms)
    extents = [_extent(a.shape, a.strides, a.dtype.itemsize) if a is not None else (0, 0)
               for a in (arrays.get(k) for k in NAMES)]
    pairs = [(i, *extents[i], j, *extents[j]) for i in OUTPUTS for j in range(len(NAMES))
             if (j not in OUTPUTS or j > i) and extents[i][1] > extents[i][0] and extents[j][1] > extents[j][0]]
    entry = Entry(op, variant, dt, launch, layout, SOURCES[op], params_struct(launch.words) if launch.words else None,
                  pairs, acc_dtype(dt))
    n = layout.n
    outs = [s for present, s in zip((has_w, has_b), layout.out) if present]
    if launch.kind in ("rows", "chunked") and launch.colsum:
        entry.ws_size = 2 * launch.nparts * n
    elif launch.kind in RUNGS and outs:
        entry.ws_size = 2 * n
    if launch.colsum:
        # Partial rows (and the rungs' accumulators) hold dweight's rows first, then dbias's.
        nparts = launch.nparts
        row0 = 0 if has_w else nparts
        entry.colsum = (colsum_expr(dt), (_ceil_div(n, COLSUM_COLS), len(outs)), np.int64(row0), np.int64(nparts),
                        np.int64(n), np.int64(outs[0]), np.int64(outs[1] if len(outs) == 2 else 0))
    return entry


def check_overlap(entry: Entry, ptrs) -> None:
    """Outputs are written while inputs (and the other outputs) are read: none may share memory.
    ptrs: the arrays' addresses in NAMES order."""
    for i, a0, a1, j, b0, b1 in entry.pairs:
        pi, pj = ptrs[i], ptrs[j]
        if pi + a0 < pj + b1 and pj + b0 < pi + a1:
            raise ValueError(f"{entry.op}: {NAMES[i]} shares memory with {NAMES[j]}, expected a buffer of its own "
                             "(outputs are written while inputs are read)")


def run(dev, entry: Entry, arrs) -> None:
    """Launch `entry` on `arrs` (the arrays in NAMES order, None where absent) through `dev`
    (CupyDevice, or the tests' emulator)."""
    launch = entry.launch
    kind = launch.kind
    x, dy, w, mean, rstd, dx, dw, db = arrs
    if kind == "zero":  # no rows: dweight and dbias are sums of nothing
        if dw is not None:
            dev.fill_zero(dw)
        if db is not None:
            dev.fill_zero(db)
        return
    w = _NULL if w is None else w
    mean = _NULL if mean is None else mean
    if kind == "rows" or kind == "chunked":
        part = dev.workspace(entry, entry.ws_size, entry.acc) if entry.ws_size else _NULL
        args = (entry.params, x, dy, w, mean, rstd, dx, part)
        if kind == "rows":
            args += (_NULL if dw is None else dw, _NULL if db is None else db)
    else:
        part = dev.zeros(entry.ws_size, entry.acc) if entry.ws_size else _NULL
        args = (entry.params, x, dy, w, mean, rstd, dx, part)
    dev.launch(entry.source, launch.expr, launch.grid, launch.block, args)
    cs = entry.colsum
    if cs is not None:
        expr, grid, row0, nparts, n, s0, s1 = cs
        if dw is None:
            dw, db = db, None
        dev.launch(entry.source, expr, grid, COLSUM_BLOCK, (part, row0, nparts, n, dw, s0, _NULL if db is None else db,
                                                            s1))


# ============================================================================= the cupy side


class CupyDevice:
    """What `run` needs from the device: launches on cupy's current stream, buffers, occupancy."""

    def __init__(self):
        import cupy

        from backends.cupy.common import function

        self.cupy = cupy
        self._function = function
        self._occupancy: dict = {}

    def function(self, source: str, expr: str):
        return self._function(source, expr, compile_options())

    def launch(self, source: str, expr: str, grid, block: int, args) -> None:
        self._function(source, expr, compile_options())(grid if isinstance(grid, tuple) else (grid,), (block,),
                                                        tuple(args))

    def workspace(self, entry: Entry, n: int, dtype):
        """The entry's partial-row buffer for the current stream, kept from call to call (every
        element a call reads it also writes first, and calls on one stream run in order)."""
        stream = self.cupy.cuda.get_current_stream().ptr
        buf = entry.workspace.get(stream)
        if buf is None:
            buf = entry.workspace[stream] = self.cupy.empty(n, dtype=dtype)
        return buf

    def zeros(self, n: int, dtype):
        return self.cupy.zeros(n, dtype=dtype)

    def fill_zero(self, x) -> None:
        x.fill(0)

    def occupancy(self, source: str, expr: str, block: int) -> int:
        """Resident blocks per SM of `block` threads (the driver's figure for the compiled kernel)."""
        key = (self.cupy.cuda.runtime.getDevice(), source, expr, block)
        if key not in self._occupancy:
            from cupy_backends.cuda.api import driver

            fn = self.function(source, expr)  # a cupy.RawKernel; .kernel is its cupy.cuda.Function
            self._occupancy[key] = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, 0))
        return self._occupancy[key]


_DEVICE: CupyDevice | None = None
_ENTRIES: dict = {}


def _device() -> CupyDevice:
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = CupyDevice()
    return _DEVICE


def _dtype_name(op: str, x) -> str:
    from harness import dtypes

    try:
        dt = dtypes.from_any(x.dtype)
    except TypeError:
        dt = None
    if dt not in DTYPES:
        raise TypeError(f"{op}: x has dtype {x.dtype}, expected one of float32, float16, bfloat16, float64")
    return dt


def _check_dtypes(op: str, dt: str, arrays: dict) -> None:
    x = arrays["x"]
    stats = np.dtype(acc_dtype(dt))
    for name, a in arrays.items():
        if a is None:
            continue
        want = stats if name in ("mean", "rstd") else x.dtype
        if a.dtype != want:
            raise TypeError(f"{op}: {name} has dtype {a.dtype}, expected {want}"
                            + (" (saved statistics: float32, float64 for float64 data)" if name in ("mean", "rstd")
                               else " (the dtype of x)"))


def call(op: str, variant: str, inputs, outs) -> None:
    """One call of `variant` (best, v1 ... v5) of `op` on cupy arrays (argcheck has checked names,
    dtypes and shapes on the checked path; what the kernels rely on is checked here too, once per
    plan)."""
    g = inputs.get
    x = inputs["x"]
    arrs = (x, inputs["dy"], g("weight"), g("mean"), inputs["rstd"], outs["dx"], outs.get("dweight"), outs.get("dbias"))
    ptrs = [0 if a is None else a.data.ptr for a in arrs]
    aligned = not (ptrs[X] | ptrs[DY] | ptrs[DX] | ptrs[W]) & 15
    key = (op, variant, x.device.id, aligned, *[None if a is None else (a.shape, a.strides, a.dtype) for a in arrs])
    entry = _ENTRIES.get(key)
    if entry is None:
        entry = _ENTRIES[key] = _build(op, variant, dict(zip(NAMES, arrs)), aligned)
    check_overlap(entry, ptrs)
    run(_device(), entry, arrs)


def _build(op: str, variant: str, arrays: dict, aligned: bool) -> Entry:
    from backends.cupy.common import num_sms

    dt = _dtype_name(op, arrays["x"])
    _check_dtypes(op, dt, arrays)
    if (arrays["mean"] is None) != (op == RMS):
        raise ValueError(f"{op}: {'unexpected' if op == RMS else 'missing'} input 'mean'")
    dev = _device()
    src = SOURCES[op]
    return build_entry(op, variant, dt, arrays, aligned, num_sms(),
                       occupancy=lambda expr, block: dev.occupancy(src, expr, block))
