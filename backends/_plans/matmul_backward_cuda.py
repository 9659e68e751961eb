"""Launch plan of the CUDA matmul_backward kernels (backends/cuda/matmul_backward.cuh), shared by
the cupy backend and torch_ext's CUDA op.  Pure Python and numpy: no cupy, no torch.

A call becomes two folded GEMMs (the .cuh's contract): dA = dY·Bᵀ and dB = Aᵀ·dY, each
with the offset table of its folds (the broadcast batch elements its output sums, in batch
order: deterministic).  `plan_call` returns both; `choose` picks the kernel, grid, block and
shared memory of one GEMM for a variant, given whether 16-byte copies are legal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from math import prod

import numpy as np

from oracle.broadcast import broadcast_shape

# Must match the #defines of the .cuh (tests/test_cuda_matmul.py checks them).
BLOCK = 256
V = 4
BM = BN = 128
BK = 32
STAGES = 4
PAD = 8
GEMM_WORDS = 11
MAX_GRID_Y = 65535
SMEM_LIMIT = 48 * 1024  # above this a kernel needs its dynamic shared-memory limit raised
# Grids of fewer blocks than this (2 resident blocks on each of an H100's 132 SMs) leave SMs idle:
# mm_mma takes 64-row tiles instead (twice the blocks), the f32 path the smem rung's 64 x 64 tiles.
FULL_WAVE = 2 * 132
SMALL_BM = 64

# mm_smem's tiling (BM, BN, BK, TM, TN), 256 threads: the smem rung, and best's float64.
SMEM_RUNG = (64, 64, 16, 4, 4)
SG_BK = 8  # mm_sgemm's k step (its tiles: BM x BN, 128 x 128 or SMALL_BM x SMALL_BM for small grids)

CUDA_TYPE = {"f32": "float", "f64": "double", "f16": "__half", "bf16": "__nv_bfloat16"}
# best: mm_mma on bf16 / f16, mm_sgemm on float32 (1.30x the mm_smem tiles best ran there before, at
# float32 1024^3 on the H100, BENCHMARKS.md, fourteenth session), the smem rung's tiles on float64
VARIANTS = ("naive", "regtile", "smem", "best")


@dataclass
class Gemm:
    """One folded GEMM: C (P x I x J, dense) = sum_f X_f · Y_f (see the .cuh)."""

    out: str                      # "da" or "db"
    x: str                        # which input is X ("dy" or "a")
    y: str                        # which input is Y ("b" or "dy")
    I: int
    J: int
    R: int
    F: int
    P: int
    xi: int
    xr: int
    yr: int
    yj: int
    off: np.ndarray = field(repr=False, default=None)  # int64 [P * F * 2]: (x offset, y offset) per fold

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return self.I * self.J * self.P == 0

    @property
    def zero(self) -> bool:
        """The output sums nothing: all zeros."""
        return not self.empty and self.R * self.F == 0

    def words(self, tiles_i: int = 0, tiles_j: int = 0) -> list[int]:
        """MMGemm in field order."""
        return [self.I, self.J, self.R, self.F, self.P, self.xi, self.xr, self.yr, self.yj, tiles_i, tiles_j]


def _batch_offsets(batch, shape, strides) -> np.ndarray:
    """Element offset of each batch element of the broadcast batch `batch` (C order) in an operand
    of `shape` / `strides` (its batch dims aligned right; missing or size-1 dims broadcast)."""
    nb = len(shape) - 2
    lead = len(batch) - nb
    eff = [0] * lead + [0 if shape[d] == 1 else strides[d] for d in range(nb)]
    out = np.zeros(prod(batch), dtype=np.int64)
    if out.size:
        grids = np.indices(batch, dtype=np.int64).reshape(len(batch), -1) if batch else np.zeros((0, 1), np.int64)
        for d, s in enumerate(eff):
            out += grids[d] * s
    return out


def _owner(batch, shape) -> np.ndarray:
    """For each broadcast batch element (C order): the index (C order) of the operand's batch
    element its gradient goes to."""
    nb = len(shape) - 2
    lead = len(batch) - nb
    own = shape[:-2]
    out = np.zeros(prod(batch), dtype=np.int64)
    if out.size and batch:
        grids = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)
        mult = 1
        for d in reversed(range(nb)):
            if own[d] != 1:
                out += grids[lead + d] * mult
            mult *= own[d]
    return out


def _fold_table(owner: np.ndarray, P: int, xoff: np.ndarray, yoff: np.ndarray) -> tuple[int, np.ndarray]:
    """(F, table): every output batch element sums the same number F of broadcast elements;
    table[p, f] = (x offset, y offset) of its f-th, in batch order."""
    total = owner.size
    F = total // P if P else 0
    order = np.argsort(owner, kind="stable")  # batch order within each owner
    table = np.stack([xoff[order], yoff[order]], axis=1).reshape(-1)
    assert table.size == 2 * P * F
    return F, np.ascontiguousarray(table, dtype=np.int64)


def plan_call(a_shape, a_strides, b_shape, b_strides, dy_shape, dy_strides) -> tuple[Gemm, Gemm]:
    """(dA gemm, dB gemm) for a, b, dy of these shapes and element strides."""
    a_shape, b_shape, dy_shape = tuple(a_shape), tuple(b_shape), tuple(dy_shape)
    batch = broadcast_shape(a_shape[:-2], b_shape[:-2])
    M, K = a_shape[-2:]
    N = b_shape[-1]
    ao = _batch_offsets(batch, a_shape, a_strides)
    bo = _batch_offsets(batch, b_shape, b_strides)
    yo = _batch_offsets(batch, dy_shape, dy_strides)
    sa, sb, sy = a_strides[-2:], b_strides[-2:], dy_strides[-2:]
    pa, pb = prod(a_shape[:-2]), prod(b_shape[:-2])
    fa, ta = _fold_table(_owner(batch, a_shape), pa, yo, bo)
    fb, tb = _fold_table(_owner(batch, b_shape), pb, ao, yo)
    # dA[m, k] = sum_n dY[m, n] B[k, n]: X = dY (i = m, r = n), Y[r = n][j = k] = B[k, n]
    da = Gemm("da", "dy", "b", M, K, N, fa, pa, sy[0], sy[1], sb[1], sb[0], ta)
    # dB[k, n] = sum_m A[m, k] dY[m, n]: X[i = k][r = m] = A[m, k], Y = dY (r = m, j = n)
    db = Gemm("db", "a", "dy", K, N, M, fb, pb, sa[1], sa[0], sy[0], sy[1], tb)
    return da, db


def orientation(g: Gemm) -> tuple[bool, bool]:
    """(XT, YT) of mm_mma: X contiguous along i, Y contiguous along j (else along r: the
    smaller stride, 1 when a 16-byte copy is possible)."""
    xt = g.xi == 1 if (g.xi == 1 or g.xr == 1) else abs(g.xi) < abs(g.xr)
    yt = g.yj == 1 if (g.yj == 1 or g.yr == 1) else abs(g.yj) < abs(g.yr)
    if g.xi == 1 and g.xr == 1:  # a single row or column: either works; r-contiguous
        xt = False
    if g.yj == 1 and g.yr == 1:
        yt = False
    return xt, yt


def _chunks_ok(g: Gemm, x_ptr: int, y_ptr: int, n: int, whole: bool) -> bool:
    """Copies of n-element chunks along each operand's contiguous dim legal: unit stride there, the
    other stride and every fold offset multiples of n, base pointers 16-byte aligned; `whole`: the
    contiguous extent a multiple of n too (a chunk all in range or all out)."""
    xt, yt = orientation(g)
    xu, xs, xn = (g.xi, g.xr, g.I) if xt else (g.xr, g.xi, g.R)
    yu, ys, yn = (g.yj, g.yr, g.J) if yt else (g.yr, g.yj, g.R)
    if xu != 1 or yu != 1 or xs % n or ys % n or x_ptr % 16 or y_ptr % 16:
        return False
    if whole and (xn % n or yn % n):
        return False
    return not (g.off.size and (g.off % n).any())


def vec_ok(g: Gemm, x_ptr: int, y_ptr: int) -> bool:
    """16-byte copies legal for mm_mma (8 16-bit elements; its cp.async zero-fills partial chunks)."""
    return _chunks_ok(g, x_ptr, y_ptr, 8, False)


def vec4_ok(g: Gemm, x_ptr: int, y_ptr: int) -> bool:
    """16-byte loads legal for mm_sgemm (4 floats; whole chunks only: its loads are not partial)."""
    return _chunks_ok(g, x_ptr, y_ptr, 4, True)


def vec_rule(dt: str):
    """The 16-byte rule of best's kernel for dtype `dt` (mm_mma on 16 bits, mm_sgemm on float32);
    None where it has no 16-byte path (float64)."""
    return {"f32": vec4_ok, "bf16": vec_ok, "f16": vec_ok}.get(dt)


def smem_bytes(xt: bool, yt: bool, bm: int = BM) -> int:
    """mm_mma_smem<XT, YT, BM>() of the .cuh."""
    xe = BK * (bm + PAD) if xt else bm * (BK + PAD)
    ye = BK * (BN + PAD) if yt else BN * (BK + PAD)
    return STAGES * (xe + ye) * 2


def _b(v: bool) -> str:
    return "true" if v else "false"


@dataclass(frozen=True)
class Launch:
    expr: str
    grid: tuple[int, int]
    block: int
    smem: int
    words: tuple[int, ...]
    rows: int = 0  # the block tile's rows (torch_ext's record: which instantiation to launch); 0: untiled


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose(g: Gemm, variant: str, dt: str, vec: bool = False, bm: int | None = None) -> Launch:
    """The launch of GEMM `g` for `variant` (naive, regtile, smem, best) and dtype `dt`; `vec` from
    vec_rule(dt) (best on bf16 / f16 / f32); `bm` forces mm_mma's tile rows or mm_sgemm's square
    tile (tests)."""
    if g.P > MAX_GRID_Y:
        raise ValueError(f"matmul_backward: {g.P} output batch elements for {g.out}, expected at most {MAX_GRID_Y}")
    t = CUDA_TYPE[dt]
    if variant == "naive":
        return Launch(f"mm_naive<{t}>", (_cdiv(g.I * g.J, BLOCK), g.P), BLOCK, 0, tuple(g.words()))
    if variant == "regtile":
        return Launch(f"mm_regtile<{t}>", (_cdiv(_cdiv(g.I, V) * _cdiv(g.J, V), BLOCK), g.P), BLOCK, 0,
                      tuple(g.words()))
    small = _cdiv(g.I, BM) * _cdiv(g.J, BN) * g.P < FULL_WAVE
    if variant == "best" and dt == "f32":
        xt, yt = orientation(g)
        tile = bm or (SMALL_BM if small else BM)
        ti, tj = _cdiv(g.I, tile), _cdiv(g.J, tile)
        return Launch(f"mm_sgemm<{tile}, {tile}, {_b(xt)}, {_b(yt)}, {_b(vec)}>", (ti * tj, g.P), tile * tile // 64,
                      0, tuple(g.words(ti, tj)), tile)
    if variant == "best" and dt in ("bf16", "f16"):
        xt, yt = orientation(g)
        bm = bm or (SMALL_BM if small else BM)
        ti, tj = _cdiv(g.I, bm), _cdiv(g.J, BN)
        return Launch(f"mm_mma<{t}, {bm}, {_b(xt)}, {_b(yt)}, {_b(vec)}>", (ti * tj, g.P), BLOCK,
                      smem_bytes(xt, yt, bm), tuple(g.words(ti, tj)), bm)
    if variant not in ("smem", "best"):
        raise ValueError(f"matmul_backward: unknown variant {variant!r}, expected one of {', '.join(VARIANTS)}")
    bm, bn, bk, tm, tn = SMEM_RUNG
    ti, tj = _cdiv(g.I, bm), _cdiv(g.J, bn)
    return Launch(f"mm_smem<{t}, {bm}, {bn}, {bk}, {tm}, {tn}>", (ti * tj, g.P), (bm // tm) * (bn // tn), 0,
                  tuple(g.words(ti, tj)), bm)


def all_kernel_exprs(dt: str) -> list[str]:
    """Every instantiation the planner can launch for dtype `dt`."""
    t = CUDA_TYPE[dt]
    out = [f"mm_naive<{t}>", f"mm_regtile<{t}>", "mm_smem<{}, {}, {}, {}, {}, {}>".format(t, *SMEM_RUNG)]
    if dt == "f32":
        out += [f"mm_sgemm<{t}, {t}, {_b(xt)}, {_b(yt)}, {_b(v)}>" for t in (SMALL_BM, BM)
                for xt, yt, v in product((False, True), repeat=3)]
    if dt in ("bf16", "f16"):
        out += [f"mm_mma<{t}, {bm}, {_b(xt)}, {_b(yt)}, {_b(v)}>" for bm in (SMALL_BM, BM)
                for xt, yt, v in product((False, True), repeat=3)]
    return out


# ----------------------------------------------------------------------------- torch_ext's record

EMPTY, ZERO, RUN = 0, 1, 2
LAUNCH_WORDS = 6 + GEMM_WORDS
RECORD_WORDS = 2 * LAUNCH_WORDS


def record(gemms, dt: str, cuda: bool, aligned: dict) -> tuple[list[int], np.ndarray]:
    """(MMRecord words, the fold table of both GEMMs concatenated) for torch_ext's op: the @best
    launch of each GEMM on CUDA (16-byte copies where `aligned[input name]` and the layout allow),
    the plain contract on the CPU (its loops read I .. yj and the table)."""
    words, tables, at = [], [], 0
    for g in gemms:
        if g.empty or g.zero:
            words += [EMPTY if g.empty else ZERO, 0, 0, 0, 0, 0] + g.words()
            continue
        xt, yt = orientation(g)
        rule = vec_rule(dt)
        vec = cuda and rule is not None and aligned[g.x] and aligned[g.y] and rule(g, 0, 0)
        launch = choose(g, "best", dt, vec)
        gw = list(launch.words) if cuda else g.words()
        words += [RUN, int(xt), int(yt), int(vec), at, launch.rows] + gw
        tables.append(g.off)
        at += g.off.size
    table = np.concatenate(tables) if tables else np.zeros(0, dtype=np.int64)
    assert len(words) == RECORD_WORDS
    return words, table
