"""Host side of the normalisation backwards (layernorm_backward, rmsnorm_backward) for the `cupy`
backend: layouts, launch planning, argument packing and the launch sequence, over the device code
in backends/cuda/norm_common.cuh (+ layernorm_backward.cuh's ladder rungs).

Everything here but `CupyDevice` is pure Python, so it is tested without a GPU: tests/test_cuda_norms.py
runs `run` against Python ports of the kernels, tests/test_cuda_norms_host.py against the .cuh source
itself compiled for the CPU (tests/cuda_host).  Importing this module never imports cupy.

Inputs may have any strides (16-byte vectors where the layout allows, scalar accesses otherwise);
outputs must be C-contiguous.  Per call: `call` builds a key from the arrays' shapes, strides,
dtypes, 16-byte alignment and device, finds (or, once, builds and checks) the `Entry` for it,
checks that no output overlaps another array (once per set of addresses), and launches one kernel,
plus nb_colsum when dweight / dbias come from partial rows or the rungs' accumulators (unless
nb_rows3 finishes them itself in a cooperative launch).  The launch contract is documented at
the top of norm_common.cuh.

The best variant's kernel and launch path are chosen at plan time from the environment variable
GRADORACLE_CUPY_NORMS (see `settings`), so one process can compare them; entries are planned once
per key, so a change of the variable applies to shapes not planned before it.
"""
from __future__ import annotations

import os
import threading
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
# Variants planned by plan_best: `best` with GRADORACLE_CUPY_NORMS' kernel, `v6` with nb_rows2 and
# `v7` with nb_rows3 whatever the variable's kernel (its other knobs apply).
BEST_VARIANTS = {"best": None, "v6": "rows2", "v7": "rows3"}

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
FLAGS_WORD = 3 + MAX_LEAD + NT * MAX_LEAD + 4 + 2  # NBParams.flags
PHASE_ROWS, PHASE_COLS = 4, 8  # norm_rows3.cuh
# H100 / H200: 227 KiB of shared memory per block, less 8 KiB of headroom for static arrays
# (nb_rows3's take 1 KiB at most).
ROWS3_SMEM_LIMIT = 232448 - 8192
V1_BLOCK = 256
V4_BLOCK = 1024
V5_MAX_CPT = 16

# Tuning (not part of the contract).  Elements of a row each thread holds in nb_rows: with the next
# row prefetched and the dweight / dbias sums in registers this is what fits in the 128 registers
# a 512-thread block leaves each thread without spilling (ptxas -v on sm_90).
ROWS_ELEMS = {"vec": {2: 16, 4: 8, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}
CHUNK_ELEMS = {"vec": {2: 8, 4: 8, 8: 4}, "scalar": {2: 8, 4: 8, 8: 4}}
# nb_rows2 (kernel=rows2, cupy@v6): blocks of these sizes, every one capped at 64 registers by its
# launch bounds (1024 threads resident per SM).  Vectors per thread: one 16-byte vector of x and
# of dy per row in the vector layouts, up to ROWS2_SCALAR_VPT elements in the scalar ones; with
# PF = 1 row prefetched these are the largest that ptxas -v on sm_90 compiles without spills (PF = 2
# spills in every vector layout: the `prefetch` knob keeps it for measurement).  Longer rows
# take the default kernels' plan.
ROWS2_BLOCKS = (1024, 512, 256)
ROWS2_MAX_GW = 1024
ROWS2_SCALAR_VPT = {2: 4, 4: 4, 8: 2}
ROWS2_PF = 1
# nb_rows2: each block takes at least this many rows when it writes partial rows (dweight / dbias),
# so that the partial rows (written, then read by nb_colsum: 2 x 4 bytes per column per output)
# stay a small fraction of the block's own traffic (x, dy, dx: 6 bytes per column per row in 16-bit
# types): 16 rows, about 17% in the worst case, layernorm with both sums.
ROWS2_MIN_ROWS = 16
# nb_rows3 (kernel=rows3, cupy@v7; norm_rows3.cuh says why): elements of a row per thread at most
# (its dweight / dbias sums in registers: 16 32-bit registers).  ptxas -v on sm_90 at the 64-register
# cap: these compile without spills for every N; 16 in 16-bit and 32-bit types (32 sum registers)
# spill 24-80 bytes (the `elems` knob keeps them for measurement).  Copy stages STAGES (fewer when
# shared memory is short), at least ROWS2_MIN_ROWS rows per block when partial rows are written,
# finished in the same cooperative launch unless finish=colsum.
ROWS3_ELEMS = {2: 8, 4: 8, 8: 4}
STAGES = 4
ROWS3_MIN_BLOCK = 256
ROWS3_MAX_GW = 1024
ROWS3_REGS = 64
# nb_rows3: each block takes enough rows that the bytes of its rows (x, dy read, dx written) are at
# least this many times those of its partial rows (written, then read by the finish): the Triton
# kernel's ws_ratio, which its H100 sweep kept.  16 rows in 16-bit layer norm (two sums), 8 in
# 16-bit RMS norm or 32-bit layer norm, 4 in 32-bit RMS norm.
ROWS3_WS_RATIO = 12
TILE_ROWS = 8          # nb_chunked: rows whose two passes run back to back (the second hits L2)
V5_BLOCKS_PER_SM = 2   # v5's grid: 1024-thread blocks resident per SM
DEFAULT_SMS = 132      # H100 SXM; only when no device is queried


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ============================================================================= settings

ENV = "GRADORACLE_CUPY_NORMS"
# Defaults: nb_rows3 with the driver launch path: on the H100 every smoke and full case passes, and it
# is faster than nb_rows on every perf case (1.05-1.21x; results/h100/cupy/norms-v7/).
SETTINGS = {  # name -> (allowed values, default); None: the planner's own choice
    # nb_rows, or nb_rows2 (64 registers, 1024 threads per SM: cupy@v6; every full case passes on
    # the H100, results/h100/kernels-full-3/; faster on the medians, still short of the bar:
    # results/h100/bench-2/norms/), or nb_rows3 (64 registers,
    # loads copied STAGES rows ahead into shared memory: cupy@v7, the default: results/h100/cupy/norms-v7/)
    "kernel": (("rows", "rows2", "rows3"), "rows3"),
    "stages": ((2, 3, 4, 5, 6), None),         # nb_rows3: copy stages (default STAGES, as many as fit)
    "elems": ((4, 8, 16, 32), None),           # nb_rows3: elements per thread at most (default
                                               # ROWS3_ELEMS; 16 and more spill: ptxas)
    # nb_rows3: nb_colsum after it, or its own (cooperative launch, the default)
    "finish": (("colsum", "coop"), None),
    # cuLaunchKernel on prebuilt arguments, or cupy.RawKernel calls; default: driver for nb_rows3 (its
    # cooperative launch goes through the driver either way: prebuilt arguments keep the host time
    # per call low), cupy for the others
    "launch": (("driver", "cupy"), None),
    "prefetch": ((1, 2), None),                # nb_rows2: rows whose loads are in flight (default ROWS2_PF)
    "minrows": ((1, 2, 4, 8, 16, 32, 64), None),  # nb_rows2, nb_rows3: rows per block at least (default
                                                  # ROWS2_MIN_ROWS; nb_rows3: rows3_min_rows)
}


def settings(text: str | None = None) -> dict:
    """The best variant's knobs from `text` (default: the environment variable GRADORACLE_CUPY_NORMS),
    comma-separated name=value pairs, e.g. "kernel=rows3,stages=3,finish=colsum".  Unnamed knobs take
    their defaults; a bad name or value is a ValueError naming the variable."""
    text = os.environ.get(ENV, "") if text is None else text
    out = {k: d for k, (_, d) in SETTINGS.items()}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if name not in SETTINGS:
            raise ValueError(f"{ENV}: unknown setting {name!r} in {text!r}, expected one of {', '.join(SETTINGS)}")
        allowed = SETTINGS[name][0]
        got = int(value) if value.isdigit() and isinstance(allowed[0], int) else value
        if got not in allowed:
            raise ValueError(f"{ENV}: {name}={value!r}, expected one of {', '.join(map(str, allowed))}")
        out[name] = got
    return out


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
    """One call's launches: the main kernel, then nb_colsum when `colsum` (nb_rows3 with `coop`
    sums the partial rows itself, after a grid-wide barrier, in a cooperative launch)."""

    kind: str                  # zero | rows | rows2 | rows3 | chunked | v1 ... v5
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
    smem: int = 0              # dynamic shared memory (nb_rows3)
    stages: int = 0
    coop: bool = False


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
    vpt_max = max(1, ROWS_ELEMS["vec" if vec > 1 else "scalar"][itemsize] // vec)
    if nv > ROWS_BLOCK * vpt_max:
        return None
    vpt = min(vpt_max, next_pow2(_ceil_div(nv, 32)))
    return vpt, next_pow2(_ceil_div(nv, vpt))


def rows2_config(n: int, vec: int, itemsize: int) -> tuple[int, int] | None:
    """(VPT, gw) of nb_rows2 for rows of n elements, or None when the row does not fit."""
    vpt_max = 1 if vec > 1 else ROWS2_SCALAR_VPT[itemsize]
    nv = _ceil_div(n, vec)
    if nv > ROWS2_MAX_GW * vpt_max:
        return None
    vpt = min(vpt_max, next_pow2(_ceil_div(nv, 32)))
    return vpt, next_pow2(_ceil_div(nv, vpt))


def rows2_expr(op: str, dt: str, vec: int, vpt: int, block: int, pf: int) -> str:
    return f"nb_rows2<{POLICIES[op]}, {CUDA_TYPE[dt]}, {vec}, {vpt}, {block}, {pf}>"


def rows2_split(rows: int, gw: int, block: int, min_rows: int, target_blocks: int) -> tuple[int, int]:
    """(rows per block, blocks) of nb_rows2: about target_blocks blocks, each at least min_rows rows
    (rounded up to whole steps of block // gw rows)."""
    step = block // gw
    rpb, _ = _split_rows(rows, target_blocks, step)
    rpb = max(rpb, _ceil_div(min_rows, step) * step)
    return rpb, _ceil_div(rows, rpb)


def plan_rows2(op: str, dt: str, layout: Layout, flags: int, vec: int, num_sms: int, occupancy, knobs: dict):
    """nb_rows2's Launch, or None when the row does not fit.  The block size is the one that keeps
    the most threads resident (blocks x block, at most 1024 per SM), the larger on a tie (fewer
    partial rows)."""
    cfg = rows2_config(layout.n, vec, ITEMSIZE[dt])
    if cfg is None:
        return None
    vpt, gw = cfg
    pf = knobs.get("prefetch") or ROWS2_PF
    # Without dweight / dbias there are no partial rows to amortise.
    min_rows = (knobs.get("minrows") or ROWS2_MIN_ROWS) if flags else 1
    best = None
    for block in ROWS2_BLOCKS:
        if block < gw:
            continue
        expr = rows2_expr(op, dt, vec, vpt, block, pf)
        per_sm = max(1, occupancy(expr, block, 0))
        rpb, nparts = rows2_split(layout.rows, gw, block, min_rows, num_sms * per_sm)
        score = min(nparts, num_sms * per_sm) * block
        if best is None or score > best[0]:
            best = (score, expr, block, rpb, nparts)
    _, expr, block, rpb, nparts = best
    words = pack_params(layout, flags, gw=gw, rows_per_block=rpb, nparts=nparts)
    return Launch("rows2", expr, nparts, block, words, nparts, nparts > 1 and bool(flags), vec, vpt, gw, rpb)


def rows3_config(n: int, vec: int, itemsize: int, elems: int | None = None) -> tuple[int, int] | None:
    """(VPT, GW) of nb_rows3 for rows of n elements: a warp (or part of one) per row as long as
    32 threads of `elems` elements (default ROWS3_ELEMS) hold it, else the fewest threads that do; or
    None when it does not apply (scalar accesses, or more than ROWS3_MAX_GW threads a row)."""
    if vec == 1:
        return None
    vpt_max = max(1, (elems or ROWS3_ELEMS[itemsize]) // vec)
    nv = _ceil_div(n, vec)
    if nv > ROWS3_MAX_GW * vpt_max:
        return None
    vpt = min(vpt_max, next_pow2(_ceil_div(nv, 32)))
    return vpt, next_pow2(_ceil_div(nv, vpt))


def rows3_min_rows(dt: str, flags: int) -> int:
    """Rows per nb_rows3 block at least when it writes partial rows (ROWS3_WS_RATIO)."""
    sums = bin(flags & (HAS_W | HAS_B)).count("1")
    acc = 8 if dt == "f64" else 4
    return max(1, _ceil_div(ROWS3_WS_RATIO * sums * acc, 3 * ITEMSIZE[dt]))


def rows3_block(gw: int) -> int:
    return max(ROWS3_MIN_BLOCK, gw)


def rows3_smem_bytes(dt: str, vpt: int, gw: int, stages: int) -> int:
    """nb_rows3's dynamic shared memory (NBRows3Smem in norm_rows3.cuh)."""
    block, vec, acc = rows3_block(gw), 16 // ITEMSIZE[dt], 8 if dt == "f64" else 4
    stage = 2 * vpt * block * 16 + 2 * block * acc
    pipe = stages * stage + vpt * block * 16
    return max(pipe, 2 * vpt * vec * block * acc)


def rows3_expr(op: str, dt: str, vpt: int, gw: int, stages: int) -> str:
    return f"nb_rows3<{POLICIES[op]}, {CUDA_TYPE[dt]}, {vpt}, {gw}, {stages}>"


def rows3_stages(dt: str, vpt: int, gw: int, knobs: dict) -> int | None:
    """Copy stages of nb_rows3: the knob's (default STAGES), fewer while shared memory is short;
    None when two do not fit."""
    stages = knobs.get("stages") or STAGES
    while stages > 2 and rows3_smem_bytes(dt, vpt, gw, stages) > ROWS3_SMEM_LIMIT:
        stages -= 1
    return stages if rows3_smem_bytes(dt, vpt, gw, stages) <= ROWS3_SMEM_LIMIT else None


def plan_rows3(op: str, dt: str, layout: Layout, flags: int, vec: int, num_sms: int, occupancy, knobs: dict):
    """nb_rows3's Launch, or None where it does not apply (the caller falls back to the default
    kernels' plan: scalar layouts, rows longer than ROWS3_MAX_GW threads hold).  The grid is at
    most the resident blocks (SMs x the driver's blocks per SM), each block taking at least
    `minrows` rows (default rows3_min_rows) when it writes partial rows; with several partial
    rows the same launch sums them after a grid barrier (cooperative) unless finish=colsum."""
    cfg = rows3_config(layout.n, vec, ITEMSIZE[dt], knobs.get("elems"))
    if cfg is None:
        return None
    vpt, gw = cfg
    stages = rows3_stages(dt, vpt, gw, knobs)
    if stages is None:
        return None
    block, smem = rows3_block(gw), rows3_smem_bytes(dt, vpt, gw, stages)
    expr = rows3_expr(op, dt, vpt, gw, stages)
    per_sm = max(1, occupancy(expr, block, smem))
    min_rows = (knobs.get("minrows") or rows3_min_rows(dt, flags)) if flags else 1
    rpb, nparts = rows2_split(layout.rows, gw, block, min_rows, num_sms * per_sm)
    sums = nparts > 1 and bool(flags)
    coop = sums and (knobs["finish"] or "coop") == "coop"  # nparts <= resident blocks: rows2_split never exceeds it
    phases = PHASE_ROWS | (PHASE_COLS if coop else 0)
    words = pack_params(layout, flags | phases, gw=gw, rows_per_block=rpb, nparts=nparts)
    return Launch("rows3", expr, nparts, block, words, nparts, sums and not coop, vec, vpt, gw, rpb,
                  smem=smem, stages=stages, coop=coop)


def _split_rows(rows: int, target_blocks: int, step: int) -> tuple[int, int]:
    """(rows per block, a multiple of step; blocks) covering `rows` with about target_blocks blocks."""
    rpb = _ceil_div(_ceil_div(rows, max(1, target_blocks)), step) * step
    return rpb, _ceil_div(rows, rpb)


def plan_best(op: str, dt: str, layout: Layout, has_w: bool, has_b: bool, vec: int, num_sms: int = DEFAULT_SMS,
              occupancy=None, knobs: dict | None = None) -> Launch:
    """The best variant's launches.  occupancy(expr, block, smem) -> resident blocks per SM (default 1);
    knobs: `settings()` (default: the environment's)."""
    if layout.rows == 0:
        return Launch("zero")
    knobs = settings() if knobs is None else knobs
    occupancy = occupancy or (lambda expr, block, smem=0: 1)
    item, t, pol = ITEMSIZE[dt], CUDA_TYPE[dt], POLICIES[op]
    flags = _flags(has_w, has_b)
    if knobs["kernel"] == "rows2":
        launch = plan_rows2(op, dt, layout, flags, vec, num_sms, occupancy, knobs)
        if launch is not None:
            return launch
    if knobs["kernel"] == "rows3":  # where it does not apply: the default kernel's plan below
        launch = plan_rows3(op, dt, layout, flags, vec, num_sms, occupancy, knobs)
        if launch is not None:
            return launch
    cfg = rows_config(layout.n, vec, item)
    if cfg is not None:
        vpt, gw = cfg
        wide = gw > 32
        expr = f"nb_rows<{pol}, {t}, {vec}, {vpt}, {'true' if wide else 'false'}>"
        per_sm = max(1, occupancy(expr, ROWS_BLOCK, 0))
        rpb, nparts = _split_rows(layout.rows, num_sms * per_sm, ROWS_BLOCK // gw)
        words = pack_params(layout, flags, gw=gw, rows_per_block=rpb, nparts=nparts)
        return Launch("rows", expr, nparts, ROWS_BLOCK, words, nparts, nparts > 1 and bool(flags), vec, vpt, gw,
                      rpb)
    vpt = CHUNK_ELEMS["vec" if vec > 1 else "scalar"][item] // vec
    expr = f"nb_chunked<{pol}, {t}, {vec}, {vpt}>"
    per_sm = max(1, occupancy(expr, CHUNK_BLOCK, 0))
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


def all_kernel_exprs(op: str, dt: str, knobs: dict | None = None) -> list[str]:
    """Every name expression the planner can launch for (op, dtype): nb_rows, nb_chunked, nb_colsum,
    the rungs, nb_rows2, and nb_rows3 with `knobs`' stages and elements per thread (default: the
    defaults'), whichever kernel the environment picks."""
    item, t, pol = ITEMSIZE[dt], CUDA_TYPE[dt], POLICIES[op]
    exprs = set()
    knobs = dict(settings(""), **(knobs or {}))
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
    pf = knobs.get("prefetch") or ROWS2_PF
    for vec in sorted({1, 16 // item}):
        for nv in (1 << k for k in range(0, 20)):
            cfg = rows2_config(nv * vec, vec, item)
            if cfg is None:
                break
            for block in ROWS2_BLOCKS:
                if block >= cfg[1]:
                    exprs.add(rows2_expr(op, dt, vec, cfg[0], block, pf))
    for nv in (1 << k for k in range(0, 20)):  # nb_rows3 (vector layouts only) with `knobs`' elems and stages
        vec = 16 // item
        cfg = rows3_config(nv * vec, vec, item, knobs.get("elems"))
        if cfg is None:
            break
        stages = rows3_stages(dt, cfg[0], cfg[1], knobs)
        if stages is not None:
            exprs.add(rows3_expr(op, dt, cfg[0], cfg[1], stages))
    exprs.add(colsum_expr(dt))
    if op == LN:
        exprs |= {f"ln_{r}<{t}>" for r in ("v1", "v2", "v3", "v4")}
        exprs |= {f"ln_v5<{t}, {1 << k}>" for k in range(V5_MAX_CPT.bit_length())}
    return sorted(exprs)


# ============================================================================= compilation


_OPTIONS: tuple[str, ...] | None = None


def compile_options() -> tuple[str, ...]:
    """-I backends/cuda for norm_common.cuh, and the checksum of it and norm_rows3.cuh (which it
    includes) as a define: cupy's disk cache keys on the source text and options, not on included
    files, so an edit of a header must change the options."""
    global _OPTIONS
    if _OPTIONS is None:
        crc = zlib.crc32(b"".join((_nvrtc.CUDA_DIR / f).read_bytes() for f in ("norm_common.cuh", "norm_rows3.cuh")))
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
PART, BAR = "part", "bar"  # argument tokens: the workspace's partial rows, nb_rows3's barrier words


@dataclass
class Kernel:
    """One launch of a call.  `args` are tokens: an int indexes NAMES (that array, or a null pointer
    when it is absent), PART / BAR the call's workspace buffers, anything else (the params struct,
    np.int64, the np.uint64 null) is passed as it is."""

    expr: str
    grid: int | tuple
    block: int
    args: tuple
    smem: int = 0
    coop: bool = False  # a cooperative launch (every block resident at once)


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
    zeroed: bool = False         # the rungs' accumulators: a zeroed buffer every call
    kernels: list = field(default_factory=list)  # the launches, in order
    fast: bool = False           # the cupy device may launch it through prebuilt driver arguments
    workspace: dict = field(default_factory=dict)  # per stream: partial buffer (reused call to call)
    checked: set = field(default_factory=set)      # address tuples whose overlap check passed


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


def build_entry(op: str, variant: str, dt: str, arrays: dict, aligned: bool, num_sms: int, occupancy=None,
                knobs: dict | None = None) -> Entry:
    """Plan a call on `arrays` (name -> array or None; any object with shape, strides in bytes,
    dtype) whose pointers are 16-byte aligned or not (`aligned`).  Inputs may have any strides;
    outputs must be C-contiguous (the backends' contract: the harness passes them so).  knobs:
    `settings()` (default: read from the environment now)."""
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
    if variant not in BEST_VARIANTS and op != LN:
        raise ValueError(f"{op}: variant {variant!r} has no kernel: the ladder rungs are layernorm_backward's")
    knobs = settings() if knobs is None else knobs
    if BEST_VARIANTS.get(variant):
        knobs = dict(knobs, kernel=BEST_VARIANTS[variant])
    if variant in BEST_VARIANTS:
        vec = vector_width(layout, ITEMSIZE[dt], aligned, has_w)
        launch = plan_best(op, dt, layout, has_w, has_b, vec, num_sms, occupancy, knobs)
    else:
        launch = plan_rung(variant, dt, layout, has_w, has_b, num_sms)
    extents = [_extent(a.shape, a.strides, a.dtype.itemsize) if a is not None else (0, 0)
               for a in (arrays.get(k) for k in NAMES)]
    pairs = [(i, *extents[i], j, *extents[j]) for i in OUTPUTS for j in range(len(NAMES))
             if (j not in OUTPUTS or j > i) and extents[i][1] > extents[i][0] and extents[j][1] > extents[j][0]]
    entry = Entry(op, variant, dt, launch, layout, SOURCES[op], params_struct(launch.words) if launch.words else None,
                  pairs, acc_dtype(dt))
    if launch.kind == "zero":
        return entry
    n = layout.n
    outs = [s for present, s in zip((has_w, has_b), layout.out) if present]
    sums = launch.colsum or launch.coop  # partial rows (or the rungs' accumulators) to sum
    if launch.kind in ("rows", "rows2", "rows3", "chunked") and sums:
        entry.ws_size = 2 * launch.nparts * n
    elif launch.kind in RUNGS and outs:
        entry.ws_size, entry.zeroed = 2 * n, True
    part = PART if entry.ws_size else _NULL
    main = (entry.params, X, DY, W, MEAN, RSTD, DX, part)
    if launch.kind in ("rows", "rows2"):
        main += (DW, DB)
    elif launch.kind == "rows3":
        main += (DW, DB, BAR if launch.coop else _NULL)
    entry.kernels.append(Kernel(launch.expr, launch.grid, launch.block, main, launch.smem, launch.coop))
    if launch.colsum:
        # Partial rows (and the rungs' accumulators) hold dweight's rows first, then dbias's.
        nparts = launch.nparts
        row0 = 0 if has_w else nparts
        out0, out1 = (DW, DB if has_b else _NULL) if has_w else (DB, _NULL)
        entry.kernels.append(Kernel(colsum_expr(dt), (_ceil_div(n, COLSUM_COLS), len(outs)), COLSUM_BLOCK,
                                    (PART, np.int64(row0), np.int64(nparts), np.int64(n), out0, np.int64(outs[0]),
                                     out1, np.int64(outs[1] if len(outs) == 2 else 0))))
    entry.fast = variant in BEST_VARIANTS and (knobs["launch"] or ("driver" if launch.kind == "rows3" else "cupy")) \
        == "driver"
    return entry


def check_overlap(entry: Entry, ptrs) -> None:
    """Outputs are written while inputs (and the other outputs) are read: none may share memory.
    ptrs: the arrays' addresses in NAMES order."""
    for i, a0, a1, j, b0, b1 in entry.pairs:
        pi, pj = ptrs[i], ptrs[j]
        if pi + a0 < pj + b1 and pj + b0 < pi + a1:
            raise ValueError(f"{entry.op}: {NAMES[i]} shares memory with {NAMES[j]}, expected a buffer of its own "
                             "(outputs are written while inputs are read)")


def check_overlap_once(entry: Entry, ptrs) -> None:
    """check_overlap, skipped for address tuples it has passed before (the answer depends on nothing
    else); at most 64 remembered."""
    key = tuple(ptrs)
    if key not in entry.checked:
        check_overlap(entry, ptrs)
        if len(entry.checked) >= 64:
            entry.checked.clear()
        entry.checked.add(key)


def kernel_args(kernel: Kernel, arrs, part, bar) -> tuple:
    """A Kernel's arguments for the arrays `arrs` (NAMES order, None where absent)."""
    out = []
    for t in kernel.args:
        if type(t) is int:
            a = arrs[t]
            out.append(_NULL if a is None else a)
        elif isinstance(t, str):
            out.append(part if t == PART else bar)
        else:
            out.append(t)
    return tuple(out)


def run(dev, entry: Entry, arrs) -> None:
    """Launch `entry` on `arrs` (the arrays in NAMES order, None where absent) through `dev`
    (CupyDevice, or the tests' emulators): dev.launch(source, expr, grid, block, args, smem=, coop=);
    dev.workspace(entry, n, dtype) the stream's partial-row buffer, kept from call to call;
    dev.barrier(entry) the stream's zeroed barrier words; dev.zeros / dev.fill_zero."""
    if entry.launch.kind == "zero":  # no rows: dweight and dbias are sums of nothing
        for a in arrs[DW], arrs[DB]:
            if a is not None:
                dev.fill_zero(a)
        return
    part = bar = _NULL
    if entry.ws_size:
        part = dev.zeros(entry.ws_size, entry.acc) if entry.zeroed else dev.workspace(entry, entry.ws_size, entry.acc)
    if entry.launch.coop:
        bar = dev.barrier(entry)
    for k in entry.kernels:
        dev.launch(entry.source, k.expr, k.grid, k.block, kernel_args(k, arrs, part, bar), smem=k.smem, coop=k.coop)


# ============================================================================= the cupy side


MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class _Fast:
    """One entry's launches on one stream, ready for cuLaunchKernel: `vals` holds the eight array
    addresses (NAMES order), the partial-row buffer's and the barrier's, then the constants; each
    launch's `addrs` points at its arguments' values (the params struct at its own bytes)."""

    def __init__(self, dev: "CupyDevice", entry: Entry, stream: int):
        cp = dev.cupy
        self.lock = threading.Lock()  # vals is filled and read by one call at a time
        self.part = cp.empty(entry.ws_size, dtype=entry.acc) if entry.ws_size else None
        self.bar = cp.zeros(2, dtype=np.uint32) if entry.launch.coop else None
        consts = []
        for k in entry.kernels:
            consts += [t for t in k.args if isinstance(t, np.integer)]
        self.vals = np.zeros(len(NAMES) + 2 + len(consts), dtype=np.uint64)
        self.vals[8] = 0 if self.part is None else self.part.data.ptr
        self.vals[9] = 0 if self.bar is None else self.bar.data.ptr
        self.vals[10:] = [int(c) & (2**64 - 1) for c in consts]
        base = self.vals.ctypes.data
        self.stream = stream
        self.launches = []
        self.addrs = []  # kept alive with the entry
        ci = 10
        for k in entry.kernels:
            addrs = np.zeros(len(k.args), dtype=np.uint64)
            for i, t in enumerate(k.args):
                if type(t) is int:
                    addrs[i] = base + 8 * t
                elif isinstance(t, str):
                    addrs[i] = base + 8 * (8 if t == PART else 9)
                elif isinstance(t, np.ndarray):
                    addrs[i] = t.ctypes.data  # the params struct (entry.params, kept by the entry)
                else:
                    addrs[i] = base + 8 * ci
                    ci += 1
            self.addrs.append(addrs)
            gx, gy = k.grid if isinstance(k.grid, tuple) else (k.grid, 1)
            fptr = dev.function_ptr(entry.source, k.expr, k.smem)
            self.launches.append((k.coop, fptr, gx, gy, k.block, k.smem, addrs.ctypes.data))


class CupyDevice:
    """What `run` needs from the device: launches on cupy's current stream, buffers, occupancy;
    and `run_fast`, the same launches through cuLaunchKernel on prebuilt argument arrays."""

    def __init__(self):
        import cupy
        from cupy_backends.cuda.api import driver

        from backends.cupy.common import function

        self.cupy = cupy
        self.driver = driver
        self._function = function
        self._occupancy: dict = {}
        self._smem_set: set = set()

    def function(self, source: str, expr: str):
        return self._function(source, expr, compile_options())

    def function_ptr(self, source: str, expr: str, smem: int = 0) -> int:
        """The CUfunction of `expr` on the current device, allowed `smem` bytes of dynamic shared memory."""
        fn = self.function(source, expr).kernel  # cupy.cuda.Function, loaded on the current device
        key = (fn.ptr, smem)
        if smem > 48 * 1024 and key not in self._smem_set:
            self.driver.funcSetAttribute(fn.ptr, MAX_DYNAMIC_SHARED, smem)
            self._smem_set.add(key)
        return fn.ptr

    def launch(self, source: str, expr: str, grid, block: int, args, smem: int = 0, coop: bool = False) -> None:
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not coop:
            fn = self.function(source, expr)
            if smem > 48 * 1024:
                self.function_ptr(source, expr, smem)
            fn(grid, (block,), tuple(args), shared_mem=smem)
            return
        keep, addrs = [], np.zeros(len(args), dtype=np.uint64)  # cupy.RawKernel has no cooperative launch
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                addrs[i] = a.ctypes.data
                continue
            box = np.array([a.data.ptr if isinstance(a, self.cupy.ndarray) else int(a) & (2**64 - 1)], dtype=np.uint64)
            keep.append(box)
            addrs[i] = box.ctypes.data
        gx, gy = grid if len(grid) == 2 else (grid[0], 1)
        self.driver.launchCooperativeKernel(self.function_ptr(source, expr, smem), gx, gy, 1, block, 1, 1, smem,
                                            self.cupy.cuda.get_current_stream().ptr, addrs.ctypes.data)

    def run_fast(self, entry: Entry, ptrs) -> None:
        """`run(self, entry, arrs)` for an entry with entry.fast, on the current stream: the same
        launches, their arguments written into the stream's prebuilt arrays (`_Fast`)."""
        stream = self.cupy.cuda.get_current_stream().ptr
        fast = entry.workspace.get(("fast", stream))
        if fast is None:
            fast = entry.workspace[("fast", stream)] = _Fast(self, entry, stream)
        drv = self.driver
        with fast.lock:
            fast.vals[:8] = ptrs
            for coop, fptr, gx, gy, block, smem, addrs in fast.launches:
                if coop:
                    drv.launchCooperativeKernel(fptr, gx, gy, 1, block, 1, 1, smem, stream, addrs)
                else:
                    drv.launchKernel(fptr, gx, gy, 1, block, 1, 1, smem, stream, addrs, 0)

    def workspace(self, entry: Entry, n: int, dtype):
        """The entry's partial-row buffer for the current stream, kept from call to call (every
        element a call reads it also writes first, and calls on one stream run in order; calls on
        other streams get buffers of their own)."""
        stream = self.cupy.cuda.get_current_stream().ptr
        buf = entry.workspace.get(stream)
        if buf is None:
            buf = entry.workspace[stream] = self.cupy.empty(n, dtype=dtype)
        return buf

    def barrier(self, entry: Entry):
        """nb_rows3's grid-barrier words for the current stream: zeroed once, left reusable by
        every launch (the count returns to 0)."""
        key = ("bar", self.cupy.cuda.get_current_stream().ptr)
        buf = entry.workspace.get(key)
        if buf is None:
            buf = entry.workspace[key] = self.cupy.zeros(2, dtype=np.uint32)
        return buf

    def zeros(self, n: int, dtype):
        return self.cupy.zeros(n, dtype=dtype)

    def fill_zero(self, x) -> None:
        x.fill(0)

    def occupancy(self, source: str, expr: str, block: int, smem: int = 0) -> int:
        """Resident blocks per SM of `block` threads and `smem` bytes of dynamic shared memory (the
        driver's figure for the compiled kernel)."""
        key = (self.cupy.cuda.runtime.getDevice(), source, expr, block, smem)
        if key not in self._occupancy:
            fptr = self.function_ptr(source, expr, smem)
            self._occupancy[key] = int(self.driver.occupancyMaxActiveBlocksPerMultiprocessor(fptr, block, smem))
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

    dt = dtypes.short_or_none(x.dtype)
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
    plan, and the overlap of outputs once per set of addresses)."""
    g = inputs.get
    x = inputs["x"]
    arrs = (x, inputs["dy"], g("weight"), g("mean"), inputs["rstd"], outs["dx"], outs.get("dweight"), outs.get("dbias"))
    ptrs = [0 if a is None else a.data.ptr for a in arrs]
    aligned = not (ptrs[X] | ptrs[DY] | ptrs[DX] | ptrs[W]) & 15
    dev_id = x.device.id
    key = (op, variant, dev_id, aligned, *[None if a is None else (a.shape, a.strides, a.dtype) for a in arrs])
    entry = _ENTRIES.get(key)
    if entry is None:
        entry = _ENTRIES[key] = _build(op, variant, dict(zip(NAMES, arrs)), aligned)
    check_overlap_once(entry, ptrs)
    dev = _device()
    if entry.fast and dev.cupy.cuda.runtime.getDevice() == dev_id:  # the functions are the current device's
        dev.run_fast(entry, ptrs)
    else:
        run(dev, entry, arrs)


def _build(op: str, variant: str, arrays: dict, aligned: bool) -> Entry:
    from backends.cupy.common import num_sms

    dt = _dtype_name(op, arrays["x"])
    _check_dtypes(op, dt, arrays)
    if (arrays["mean"] is None) != (op == RMS):
        raise ValueError(f"{op}: {'unexpected' if op == RMS else 'missing'} input 'mean'")
    dev = _device()
    src = SOURCES[op]
    return build_entry(op, variant, dt, arrays, aligned, num_sms(),
                       occupancy=lambda expr, block, smem=0: dev.occupancy(src, expr, block, smem))
