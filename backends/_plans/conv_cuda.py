"""Launch plans of the conv dgrad / wgrad CUDA kernels (backends/cuda/conv_backward_data.cuh,
conv_backward_weight.cuh): the ConvParams words, the dgrad phase table, grids and split counts.
Pure Python; the one plan that every host of that device code uses.

Geometry: the op's params (oracle/conv_common.py `geometry`), padded to 3 spatial dims (size 1,
kernel 1, stride 1, no padding, dilation 1 in the missing leading dims).  Tensors are passed by
element strides in (n, c, d, h, w) order (weights (co, ci, kd, kh, kw)), whatever the layout or view.

Fast divmod: `magic(d)` gives (mul, shift) with q = (umulhi(n, mul) + n) >> shift == n // d for
0 <= n < 2**31 (conv_common.cuh); every dividend a kernel divides is a row index below the
plan's checked bound INDEX_LIMIT.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

import numpy as np

from backends._plans.conv_geometry import Geo3, data_strides, weight_strides

from oracle import conv_common as cc

BM = BN = 64          # CV_BM (SIMT tile rows), CV_BN
BM_TC = 128           # CV_BM_TC: tile rows on tensor cores
BK = 32               # CV_BK
THREADS = 128         # CV_THREADS
FINISH_THREADS = 256
WORDS = 54            # CV_WORDS
DGRAD_HEAD = 14       # CVD_HEAD: ints before a phase's taps in its table row
INDEX_LIMIT = 2 ** 31  # dividends of the fast divmod stay below this
GRID_Y_MAX = 65535
MODES = {"div": 0, "fastdiv_load": 1, "fastdiv": 2}
DIRECT_MAX = 64       # Cin/g * Cout/g below this: the direct kernels (cv_*_dw), not a GEMM tile
DIRECT_THREADS = 256
# wgrad with groups == 1 and Cin below this (and more than one tap): every tap in one GEMM (cv_wgrad_taps).
# A tap's own GEMM fills Cin of the tile's 64 columns: below 16 that is under a quarter, and dy is
# re-read once per tap.  16 and up stay per tap (multiples of 8 there take the 16-byte channels-last path).
MERGE_CIG_MAX = 16
# dgrad with groups == 1 and Cin up to this (not a direct case): cv_dgrad_smallc, a thread per dx row with
# every input channel in registers, in place of a 64-column GEMM tile only Cin of whose columns are used.
# On the six stem perf cases (Cin 3) it measured 3.7-9.2x faster than the GEMM tile (BENCHMARKS.md,
# tenth session); cupy@fastdiv keeps the GEMM tile for the A/B.
SMALLC_MAX = 8
SMALLC_THREADS = 256
ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}


def magic(d: int) -> tuple[int, int]:
    """(mul, shift) of divisor d >= 1 for the kernels' fast divmod (exact for n < 2**31)."""
    if d < 1 or d >= INDEX_LIMIT:
        raise ValueError(f"conv fast divmod: divisor must be in [1, 2**31), got {d}")
    shift = (d - 1).bit_length()
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return mul, shift


def fast_div(n, d: int):
    """What the kernel computes for n // d (numpy arrays of uint64 or ints): the test's reference."""
    mul, shift = magic(d)
    n = np.asarray(n, dtype=np.uint64)
    hi = (n * np.uint64(mul)) >> np.uint64(32)
    return ((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)


def geo3(params: dict, op: str) -> Geo3:
    g = cc.geometry(params, op)
    pad = 3 - g.rank
    one, zero = (1,) * pad, (0,) * pad
    return Geo3(g.n, g.cin, g.cout, g.groups, one + g.spatial, one + g.out, one + g.kernel, one + g.stride,
                zero + g.padding, one + g.dilation, g.channels_last)


def bm(dt: str) -> int:
    """Tile rows of the GEMM kernels for dtype dt (CvTile<T>::BM)."""
    return BM_TC if dt in ("f16", "bf16") else BM


def wgrad_bm(dt: str, cog: int) -> int:
    """wgrad's tile rows (output channels): 128 on tensor cores when Cout/g exceeds 64, else 64 (a
    128-row tile would be half padding)."""
    return BM_TC if dt in ("f16", "bf16") and cog > BM else BM


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _words(g: Geo3, sa, sb, sc, *, rows=0, mblocks=0, cblocks=0, splits=1, chunk=0, taps=0, phases=0, trow=0,
           cfast=0, magics=(0,) * 6) -> list[int]:
    words = [g.n, g.cin, g.cout, g.groups, g.cig, g.cog, *g.inp, *g.out, *g.k, *g.s, *g.p, *g.d,
             *sa, *sb, *sc, rows, mblocks, cblocks, splits, chunk, taps, phases, trow, cfast, *magics]
    assert len(words) == WORDS, len(words)
    return [int(v) for v in words]


@dataclass
class Launch:
    """One kernel launch: name expression, grid, block, and (dgrad) the phase table."""
    expr: str
    grid: tuple
    block: int
    words: list
    table: np.ndarray | None = None
    finish: tuple | None = None  # wgrad: (expr, grid) of the finishing kernel
    ws_elems: int = 0            # wgrad: workspace elements (accumulator type); 0: none


def phases(g: Geo3):
    """The dgrad filter phases with at least one input position: per phase (T, i0, taps), taps as
    (kd, kh, kw, cd, ch, cw), where the phase's t-th position is i0 + s*t and a tap reads dy at o = t + c."""
    per_dim = []
    for I, K, s, p, d in zip(g.inp, g.k, g.s, g.p, g.d):
        opts = []
        for r in range(s):
            i0 = (r - p) % s
            if i0 >= I:
                continue
            T = _cdiv(I - i0, s)
            taps = [(k, (i0 + p - k * d) // s) for k in range(K) if (k * d) % s == r]
            opts.append((T, i0, taps))
        per_dim.append(opts)
    out = []
    for combo in product(*per_dim):
        T = tuple(c[0] for c in combo)
        i0 = tuple(c[1] for c in combo)
        taps = [(a[0], b[0], c[0], a[1], b[1], c[1]) for a, b, c in product(*(c[2] for c in combo))]
        out.append((T, i0, taps))
    return out


VEC = 8  # elements of a 16-byte copy (16-bit types)


def vec_ok(dt: str, aligned: bool, g: Geo3, *strides) -> bool:
    """Whether the channels-last fast path (cv_*_vec: 16-byte cp.async of 8 channels) applies: a
    16-bit type, 16-byte aligned pointers, unit channel strides (strides[k][1]) and Cin/g, Cout/g and
    every other stride multiples of 8, so a copy never straddles a tensor's edge."""
    if dt not in ("f16", "bf16") or not aligned or g.cig % VEC or g.cog % VEC:
        return False
    return all(st[1] == 1 and all(v % VEC == 0 for i, v in enumerate(st) if i != 1) for st in strides)


def dgrad_plan(params: dict, dt: str, dy_strides, w_strides, dx_strides, mode: str, aligned: bool = False,
               small_cin: bool = True) -> Launch:
    """The cv_dgrad launch for these tensors (element strides in their case layout); `aligned`: every
    pointer is 16-byte aligned; small_cin (cupy@best, torch_ext): cv_dgrad_smallc where it applies, else
    the GEMM tile for every Cin (the fast-divmod A/B variants)."""
    g = geo3(params, "conv_backward_data")
    sa = data_strides(dy_strides, g.channels_last)
    sb = weight_strides(w_strides, g.channels_last)
    sc = data_strides(dx_strides, g.channels_last)
    ph = phases(g)
    max_taps = max(len(t) for _, _, t in ph)
    trow = DGRAD_HEAD + 4 * max_taps
    table = np.zeros((len(ph), trow), dtype=np.int64)
    mblocks = 1
    for row, (T, i0, taps) in zip(table, ph):
        m = g.n * prod(T)
        if m >= INDEX_LIMIT:
            raise ValueError(f"cupy conv_backward_data: a filter phase has {m} rows, the kernel's limit is 2**31 - 1")
        mblocks = max(mblocks, _cdiv(m, bm(dt)))
        mw, shw = magic(T[2])
        mh, shh = magic(T[1])
        md, shd = magic(T[0])
        row[:DGRAD_HEAD] = [*T, *i0, mw, shw, mh, shh, md, shd, m, len(taps)]
        for j, (kd, kh, kw, cd, ch, cw) in enumerate(taps):
            woff = kd * sb[2] + kh * sb[3] + kw * sb[4]
            if not -INDEX_LIMIT < woff < INDEX_LIMIT:
                raise ValueError(f"cupy conv_backward_data: weight tap offset {woff} does not fit 32 bits")
            row[DGRAD_HEAD + 4 * j:DGRAD_HEAD + 4 * j + 4] = [cd, ch, cw, woff]
    cblocks = _cdiv(g.cig, BN)
    gy = len(ph) * g.groups * cblocks
    if gy > GRID_Y_MAX:
        raise ValueError(f"cupy conv_backward_data: {len(ph)} phases x {g.groups} groups x {cblocks} channel blocks "
                         f"= {gy} exceeds the grid's y limit {GRID_Y_MAX}")
    words = _words(g, sa, sb, sc, mblocks=mblocks, cblocks=cblocks, phases=len(ph), trow=trow,
                   cfast=int(sa[1] == 1))
    # The table as int32 words (the magic multipliers as their unsigned 32-bit patterns).
    table32 = (table & 0xFFFFFFFF).astype(np.uint32).view(np.int32).reshape(-1).copy()
    expr = f"<{CUDA_TYPE[dt]}, {MODES[mode]}>"
    elems = max(g.n * prod(T) for T, _, _ in ph) * g.cin
    if g.cig * g.cog < DIRECT_MAX and elems < INDEX_LIMIT - DIRECT_THREADS:
        words[-6:-4] = list(magic(g.cin))  # the direct kernel's element -> (row, channel) split
        return Launch("cv_dgrad_dw" + expr, (_cdiv(elems, DIRECT_THREADS), len(ph)), DIRECT_THREADS, words, table32)
    if small_cin and g.groups == 1 and g.cin <= SMALLC_MAX:
        v = 16 // ITEMSIZE[dt]  # dy as 16-byte words: channels-last, aligned, every other stride and Cout whole words
        vec = aligned and sa[1] == 1 and g.cog % v == 0 and all(x % v == 0 for i, x in enumerate(sa) if i != 1)
        rows = max(g.n * prod(T) for T, _, _ in ph)
        return Launch(f"cv_dgrad_smallc<{CUDA_TYPE[dt]}, {g.cin if g.cin <= 4 else 8}, {str(vec).lower()}>",
                      (_cdiv(rows, SMALLC_THREADS), len(ph)), SMALLC_THREADS, words, table32)
    name = "cv_dgrad_vec" if vec_ok(dt, aligned, g, sa, sb) else "cv_dgrad"
    return Launch(name + expr, (mblocks, gy), THREADS, words, table32)


CUDA_TYPE = {"f32": "float", "f64": "double", "f16": "__half", "bf16": "__nv_bfloat16"}


def wgrad_plan(params: dict, dt: str, dy_strides, x_strides, dw_strides, num_sms: int, aligned: bool = False,
               per_tap: bool = False) -> Launch:
    """The cv_wgrad launch (and its finish) for these tensors on a GPU of num_sms SMs.  The merged-tap
    GEMM (cv_wgrad_taps) where it applies, unless per_tap (cupy@pertap: a GEMM per tap everywhere, the
    A/B's other side; on the ResNet stem the merged GEMM measured 17-25x faster, BENCHMARKS.md)."""
    g = geo3(params, "conv_backward_weight")
    sa = data_strides(dy_strides, g.channels_last)
    sb = data_strides(x_strides, g.channels_last)
    sc = weight_strides(dw_strides, g.channels_last)
    rows = g.n * prod(g.out)
    if rows >= INDEX_LIMIT:
        raise ValueError(f"cupy conv_backward_weight: N * prod(O) = {rows} pairs, the kernel's limit is 2**31 - 1")
    rows_tile = wgrad_bm(dt, g.cog)
    mblocks, cblocks, taps = _cdiv(g.cog, rows_tile), _cdiv(g.cig, BN), prod(g.k)
    direct = g.cig * g.cog < DIRECT_MAX
    merged = not per_tap and not direct and g.groups == 1 and g.cig < MERGE_CIG_MAX and taps > 1
    if merged:
        cblocks = _cdiv(taps * g.cig, BN)  # the (tap, ci) columns
    ylanes = 1 if merged else taps if direct else taps * g.groups
    tiles = _cdiv(g.cout * g.cig, 32) * taps if direct else mblocks * cblocks * ylanes
    # Split the reduction until about 4 blocks per SM are busy, each chunk at least 8 K-steps long
    # (direct: 8 steps of its 8 reduction lanes).
    splits = max(1, min(_cdiv(4 * num_sms, tiles), _cdiv(rows, 8 * (64 if direct else BK)), GRID_Y_MAX // ylanes))
    chunk = _cdiv(_cdiv(rows, splits), BK) * BK
    splits = _cdiv(rows, chunk)
    if ylanes * splits > GRID_Y_MAX:
        raise ValueError(f"cupy conv_backward_weight: {taps} taps x {g.groups} groups exceeds the grid's y limit "
                         f"{GRID_Y_MAX}")
    magics = [*magic(g.out[2]), *magic(g.out[1]), *magic(g.out[0])]
    words = _words(g, sa, sb, sc, rows=rows, mblocks=mblocks, cblocks=cblocks, splits=splits, chunk=chunk,
                   taps=taps, cfast=int(sa[1] == 1), magics=magics)
    t = CUDA_TYPE[dt]
    total = g.cout * taps * g.cig
    finish = (f"cv_wgrad_finish<{t}>", (max(1, min(_cdiv(total, FINISH_THREADS), 8 * num_sms)), 1)) \
        if splits > 1 else None
    ws_elems = splits * total if splits > 1 else 0
    if direct:
        return Launch(f"cv_wgrad_dw<{t}>", (_cdiv(g.cout * g.cig, 32), taps * splits), DIRECT_THREADS, words,
                      finish=finish, ws_elems=ws_elems)
    name = "cv_wgrad_taps" if merged else "cv_wgrad_vec" if vec_ok(dt, aligned, g, sa, sb) else "cv_wgrad"
    return Launch(f"{name}<{t}, {rows_tile}>", (mblocks * cblocks, ylanes * splits), THREADS, words,
                  finish=finish, ws_elems=ws_elems)


def all_exprs(op: str, dt: str) -> list[str]:
    """Every kernel instantiation the plans launch for op and dtype."""
    t = CUDA_TYPE[dt]
    vec = dt in ("f16", "bf16")
    if op == "conv_backward_data":
        kinds = ("cv_dgrad", "cv_dgrad_dw", "cv_dgrad_vec")[:2 + vec]
        return [f"{k}<{t}, {m}>" for k in kinds for m in MODES.values()] + \
            [f"cv_dgrad_smallc<{t}, {cp}, {v}>" for cp in (1, 2, 3, 4, 8) for v in ("false", "true")]
    rows = (BM, BM_TC) if vec else (BM,)
    return [f"cv_wgrad<{t}, {r}>" for r in rows] + [f"cv_wgrad_dw<{t}>", f"cv_wgrad_finish<{t}>"] + \
        [f"cv_wgrad_vec<{t}, {r}>" for r in rows if vec] + [f"cv_wgrad_taps<{t}, {r}>" for r in rows]
