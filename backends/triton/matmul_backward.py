"""matmul_backward as Triton kernels on tensor cores (CUDA, or CPU under TRITON_INTERPRET=1).

da = sum_to_shape(dy @ b^T, a.shape) and db = sum_to_shape(a^T @ dy, b.shape) are each a
batched GEMM with a folded batch (`_gemm_tile`):

    C[z] (P x Q, contiguous) = sum_{r < R} X[z, r] (P x L) @ Y[z, r] (L x Q)

* da: P, Q, L = M, K, N; X = dy, Y = b^T.   db: P, Q, L = K, N, M; X = a^T, Y = dy.
* z runs over the output operand's own batch elements, r over the broadcast batch elements
  it folds (the batch dims where it has size 1 or that it lacks).  A program owns one
  BM x BN tile of C[z] and loops over r and then L in BK steps, accumulating in float32
  registers (float64 for float64): the broadcast batch is summed inside the program, in a
  fixed order, with no atomics, and C is written once.
* Operands are read in place through their strides: transposed and sliced views, and the
  transposes of the formulas, are only stride swaps (no copies).  The batch offsets of X and
  Y for each (z, r) come from an int64 table built once per plan, so any batch rank and any
  batch strides (broadcast ones included) take the same kernel.
* Products: `tl.dot` with IEEE float32 (never TF32: the spec is the float32 product) and
  float64 (DMMA); 16-bit inputs run on the tensor cores with float32 accumulation.
* Size-0 dims: an empty output launches nothing; an empty reduction (L = 0 or R = 0) writes 0.
* Software pipeline: the plan proves which operand axis is contiguous with 16-byte aligned runs
  (`aligned_axis`) and tells the kernel (XC, YC), so the tiles load as cp.async vectors into
  multi-stage shared buffers (tests/test_triton_mm_conv_compile.py checks the compiled code).
* Launches: where both gradients take that aligned path, one `_gemm2_kernel` launch makes both
  (programs [0, T0) da, the rest db: twice the programs of one product in one wave, one launch
  a call); otherwise one `_gemm_kernel` launch per non-empty output.
* TMA: for 16-bit inputs on that path the tuner also tries the large tiles with on-device TMA
  descriptors (`candidates`; sm_90); such a plan launches the cp.async kernel instead on a
  call whose tensors are not all 16-byte aligned (`_BothTMA`).
* Staging: float32's dot runs on the FMA units, which read a K-major tile from shared memory one
  element at a time; with row-major dy and b both of da's operands are K-major.  The tuner also
  tries the float32 tiles with da reading transposed copies of dy and b made first (`_Staged`:
  two copies of M*N + K*N elements beside 2*M*N*K multiply-adds) and keeps what is faster.

Host side: plans are cached per (shapes, strides, dtype, device); a repeated call is a dict
lookup and one or two launches through the compiled kernels' own launchers (_steps.Step).  On
CUDA the tile is autotuned per shape class (both products') on the first checked call
(_conv.Tuner); `matmul_backward.unchecked`, what the harness times, never tunes.
Nothing is unsupported: every case the oracle defines runs.
"""
from __future__ import annotations

from math import prod
from operator import itemgetter

from backends.triton import _conv, _steps, triton_backend
from backends.triton.common import IMPORT_ERROR, byte_span, cdiv, interpreted, jit, on_device, overlap, tl
from backends.triton.common import to_out as _to_out
from harness import argcheck

OP = "matmul_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
TUNER = _conv.Tuner(OP)

# ============================================================================= kernel


# Sizes are not specialised (fewer compiles across shapes; EVEN_L covers the one that matters).
# R is: R = 1 (no folded batch) drops the outer loop, whose live values across the pipelined inner
# loop would otherwise spill the large tiles.
#
# Alignment (XC, YC): the loads of a tile become 16-byte vectors (and so cp.async copies, which
# the software pipeline needs: 2-byte scalar loads are not pipelined at all) only where triton can
# prove that runs of VEC = 16 bytes / itemsize elements are contiguous and start 16-byte aligned.
# The plan proves it for an operand (`aligned_axis`) and then says along which axis (1: the L
# axis, 2: the P (X) or Q (Y) axis; 0: no facts, the scalar fallback): that axis has stride 1
# (written as a literal 1 below), the other stride, every batch offset of the operand and the
# size of the contiguous axis are multiples of VEC.  `v // VEC * VEC` restates such a fact
# exactly (tl.multiple_of has no effect on a scalar argument); the base pointers' own alignment
# is triton's launch specialisation.
@jit
def _gemm_tile(x_ptr, y_ptr, c_ptr, xoff_ptr, yoff_ptr, pid,
               P, Q, L, R, sxp, sxl, syl, syq,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
               EVEN_L: tl.constexpr, IS_F64: tl.constexpr,
               XC: tl.constexpr, YC: tl.constexpr, VEC: tl.constexpr, TMA: tl.constexpr = False):
    """Program `pid` of C[z] = sum_r X[z, r] @ Y[z, r]: pid = (z, tile), tiles in grouped order along P.
    TMA (XC, YC nonzero, base pointers 16-byte aligned): the operand tiles come through on-device
    TMA descriptors (made per batch element; out-of-range rows and columns read as 0)."""
    if XC == 1 or YC == 1:
        L = L // VEC * VEC
    if XC == 1:
        sxp = sxp // VEC * VEC
    if XC == 2:
        P = P // VEC * VEC
        sxl = sxl // VEC * VEC
    if YC == 1:
        syq = syq // VEC * VEC
    if YC == 2:
        Q = Q // VEC * VEC
        syl = syl // VEC * VEC
    tiles_p = tl.cdiv(P, BM)
    tiles_q = tl.cdiv(Q, BN)
    per_z = tiles_p * tiles_q
    z = pid // per_z
    t = pid - z * per_z
    # Grouped order: GROUP row tiles sweep the columns together, so Y tiles are reused from L2.
    width = GROUP * tiles_q
    first = (t // width) * GROUP
    rows = tl.minimum(tiles_p - first, GROUP)
    tp = first + (t % width) % rows
    tq = (t % width) // rows
    rp = tp * BM + tl.arange(0, BM)
    rq = tq * BN + tl.arange(0, BN)
    # Out-of-range rows/columns read a valid row/column and are never stored: the loads need no
    # mask along P and Q.  Along a contiguous axis whose size is a multiple of VEC, `% P` keeps
    # each aligned run of VEC indices contiguous (a clamp to 0 would not).
    if XC == 2:
        rpl = tl.max_contiguous(tl.multiple_of(rp % P, VEC), VEC).to(tl.int64)
    else:
        rpl = tl.where(rp < P, rp, 0).to(tl.int64)
    if YC == 2:
        rql = tl.max_contiguous(tl.multiple_of(rq % Q, VEC), VEC).to(tl.int64)
    else:
        rql = tl.where(rq < Q, rq, 0).to(tl.int64)
    rl = tl.arange(0, BK)
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    acc = tl.zeros([BM, BN], ACC)
    zr = z.to(tl.int64) * R
    for r in range(R):
        xo = tl.load(xoff_ptr + zr + r)
        yo = tl.load(yoff_ptr + zr + r)
        if XC != 0:
            xo = xo // VEC * VEC
        if YC != 0:
            yo = yo // VEC * VEC
        if TMA:
            if XC == 1:
                xd = tl.make_tensor_descriptor(x_ptr + xo, shape=[P, L], strides=[sxp, 1], block_shape=[BM, BK])
            else:
                xd = tl.make_tensor_descriptor(x_ptr + xo, shape=[L, P], strides=[sxl, 1], block_shape=[BK, BM])
            if YC == 1:
                yd = tl.make_tensor_descriptor(y_ptr + yo, shape=[Q, L], strides=[syq, 1], block_shape=[BN, BK])
            else:
                yd = tl.make_tensor_descriptor(y_ptr + yo, shape=[L, Q], strides=[syl, 1], block_shape=[BK, BN])
            for l0 in range(0, L, BK):
                if XC == 1:
                    a = xd.load([tp * BM, l0])
                else:
                    a = xd.load([l0, tp * BM]).T
                if YC == 1:
                    b = yd.load([tq * BN, l0]).T
                else:
                    b = yd.load([l0, tq * BN])
                acc = _conv.mma(a, b, acc)
        else:
            if XC == 1:
                xp = x_ptr + xo + rpl[:, None] * sxp + rl[None, :]
            elif XC == 2:
                xp = x_ptr + xo + rpl[:, None] + rl[None, :].to(tl.int64) * sxl
            else:
                xp = x_ptr + xo + rpl[:, None] * sxp + rl[None, :].to(tl.int64) * sxl
            if YC == 1:
                yp = y_ptr + yo + rl[:, None] + rql[None, :] * syq
            elif YC == 2:
                yp = y_ptr + yo + rl[:, None].to(tl.int64) * syl + rql[None, :]
            else:
                yp = y_ptr + yo + rl[:, None].to(tl.int64) * syl + rql[None, :] * syq
            for l0 in range(0, L, BK):
                if EVEN_L:
                    a = tl.load(xp)
                    b = tl.load(yp)
                else:
                    a = tl.load(xp, mask=(rl[None, :] + l0) < L, other=0.0)
                    b = tl.load(yp, mask=(rl[:, None] + l0) < L, other=0.0)
                acc = _conv.mma(a, b, acc)
                if XC == 1:
                    xp += BK
                else:
                    xp += BK * sxl
                if YC == 1:
                    yp += BK
                else:
                    yp += BK * syl
    cp = c_ptr + z.to(tl.int64) * P * Q + rp[:, None].to(tl.int64) * Q + rq[None, :]
    tl.store(cp, _to_out(acc, c_ptr), mask=(rp[:, None] < P) & (rq[None, :] < Q))


@jit(do_not_specialize=["P", "Q", "L"])
def _gemm_kernel(x_ptr, y_ptr, c_ptr, xoff_ptr, yoff_ptr,
                 P, Q, L, R, sxp, sxl, syl, syq,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                 EVEN_L: tl.constexpr, IS_F64: tl.constexpr,
                 XC: tl.constexpr, YC: tl.constexpr, VEC: tl.constexpr):
    """One product: C[z] = sum_r X[z, r] @ Y[z, r] (see _gemm_tile)."""
    _gemm_tile(x_ptr, y_ptr, c_ptr, xoff_ptr, yoff_ptr, tl.program_id(0), P, Q, L, R, sxp, sxl, syl, syq,
               BM, BN, BK, GROUP, EVEN_L, IS_F64, XC, YC, VEC)


# da and db in one launch: programs [0, T0) make da, the rest db.  One wave instead of two where a
# product alone would leave SMs idle (1024^3 with 128 x 128 tiles: 64 tiles per product on 132 SMs),
# and one launch a call.  Each branch is the single-product kernel with its own constexprs.
@jit(do_not_specialize=["T0", "P0", "Q0", "L0", "P1", "Q1", "L1"])
def _gemm2_kernel(x0_ptr, y0_ptr, c0_ptr, x1_ptr, y1_ptr, c1_ptr, xoff0_ptr, yoff0_ptr, xoff1_ptr, yoff1_ptr, T0,
                  P0, Q0, L0, R0, sxp0, sxl0, syl0, syq0,
                  P1, Q1, L1, R1, sxp1, sxl1, syl1, syq1,
                  BM0: tl.constexpr, BN0: tl.constexpr, EVEN_L0: tl.constexpr, XC0: tl.constexpr, YC0: tl.constexpr,
                  BM1: tl.constexpr, BN1: tl.constexpr, EVEN_L1: tl.constexpr, XC1: tl.constexpr, YC1: tl.constexpr,
                  BK: tl.constexpr, GROUP: tl.constexpr, IS_F64: tl.constexpr, VEC: tl.constexpr,
                  TMA: tl.constexpr):
    """Two products: C0 = X0 @ Y0 (programs < T0: da, X0 = dy, Y0 = b^T) and C1 = X1 @ Y1 (db, X1 = a^T,
    Y1 = dy); the operands are separate pointers so that da may read staged copies (_Staged)."""
    pid = tl.program_id(0)
    if pid < T0:
        _gemm_tile(x0_ptr, y0_ptr, c0_ptr, xoff0_ptr, yoff0_ptr, pid, P0, Q0, L0, R0, sxp0, sxl0, syl0, syq0,
                   BM0, BN0, BK, GROUP, EVEN_L0, IS_F64, XC0, YC0, VEC, TMA)
    else:
        _gemm_tile(x1_ptr, y1_ptr, c1_ptr, xoff1_ptr, yoff1_ptr, pid - T0, P1, Q1, L1, R1, sxp1, sxl1, syl1, syq1,
                   BM1, BN1, BK, GROUP, EVEN_L1, IS_F64, XC1, YC1, VEC, TMA)


# ============================================================================= planning


def _batch_tables(out_batch, x_batch, x_strides, y_batch, y_strides, full):
    """int64 (Z*R,) offset tables of X and Y: z over the output operand's batch elements
    (row-major), r over the batch elements it folds.  *_batch: each operand's batch shape;
    full: the broadcast batch shape; strides: the operands' batch strides (elements)."""
    import numpy as np

    nb = len(full)

    def pad(shape, strides):
        return (1,) * (nb - len(shape)) + tuple(shape), (0,) * (nb - len(strides)) + tuple(strides)

    ob, _ = pad(out_batch, ())
    kept = [j for j in range(nb) if ob[j] == full[j]]
    folded = [j for j in range(nb) if ob[j] != full[j]]

    def offsets(shape, strides):
        shape, strides = pad(shape, strides)
        off = np.zeros(full, dtype=np.int64)
        for j in range(nb):
            idx = np.arange(full[j], dtype=np.int64) if shape[j] == full[j] else np.zeros(full[j], np.int64)
            off = off + (idx * strides[j]).reshape([-1 if i == j else 1 for i in range(nb)])
        return np.ascontiguousarray(np.transpose(off, kept + folded)).reshape(-1)

    z = prod(full[j] for j in kept)
    r = prod(full[j] for j in folded)
    return offsets(x_batch, x_strides), offsets(y_batch, y_strides), z, r


def aligned_axis(l_stride: int, o_stride: int, l_size: int, o_size: int, offsets, vec: int) -> int:
    """The kernel's XC (YC) for the operand X (Y): its axis L and its other axis P (Q) have
    strides l_stride, o_stride and sizes l_size, o_size; offsets: its batch offsets (elements).
    1: contiguous along L, 2: along the other axis, each with the other stride, every offset and
    the contiguous axis's size multiples of vec (16 bytes); 0: not all of these hold."""
    import numpy as np

    if np.any(np.asarray(offsets) % vec):
        return 0
    if l_stride == 1 and o_stride % vec == 0 and l_size % vec == 0:
        return 1
    if o_stride == 1 and l_stride % vec == 0 and o_size % vec == 0:
        return 2
    return 0


class _Side:
    """One gradient's GEMM (see _gemm_tile): its sizes, strides and alignment codes, which of
    (a, b, dy, da, db) are its X, Y and C, its offset tables (device tensors), its tuner class."""

    __slots__ = ("p", "q", "ln", "z", "r", "sxp", "sxl", "syl", "syq", "xc", "yc", "xi", "yi", "ci",
                 "xoff", "yoff", "cls")

    def values(self, tile, suffix: str = "") -> dict:
        """The kernel's int and per-product constexpr arguments for this side with `tile`."""
        v = dict(P=self.p, Q=self.q, L=self.ln, R=self.r, sxp=self.sxp, sxl=self.sxl, syl=self.syl, syq=self.syq,
                 BM=tile.bm, BN=tile.bn, EVEN_L=self.ln % tile.bk == 0, XC=self.xc, YC=self.yc)
        return {k + suffix: x for k, x in v.items()}

    def tiles(self, tile) -> int:
        return self.z * cdiv(self.p, tile.bm) * cdiv(self.q, tile.bn)


def _side(which, a, b, dy, vec: int):
    """The _Side of da (which="da") or db, or None when that output is empty."""
    import torch

    full = tuple(dy.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    sa, sb, sy = a.stride(), b.stride(), dy.stride()
    s = _Side()
    if which == "da":  # X = dy (M x N), Y = b^T (N x K)
        s.p, s.q, s.ln = m, k, n
        s.xi, s.yi, s.ci = 2, 1, 3
        s.sxp, s.sxl, s.syl, s.syq = sy[-2], sy[-1], sb[-1], sb[-2]
        xoff, yoff, s.z, s.r = _batch_tables(a.shape[:-2], full, sy[:-2], b.shape[:-2], sb[:-2], full)
    else:              # X = a^T (K x M), Y = dy (M x N)
        s.p, s.q, s.ln = k, n, m
        s.xi, s.yi, s.ci = 0, 2, 4
        s.sxp, s.sxl, s.syl, s.syq = sa[-1], sa[-2], sy[-2], sy[-1]
        xoff, yoff, s.z, s.r = _batch_tables(b.shape[:-2], a.shape[:-2], sa[:-2], full, sy[:-2], full)
    if s.p * s.q * s.z == 0:
        return None
    s.xc = aligned_axis(s.sxl, s.sxp, s.ln, s.p, xoff, vec)
    s.yc = aligned_axis(s.syl, s.syq, s.ln, s.q, yoff, vec)
    s.xoff = torch.from_numpy(xoff).to(dy.device)
    s.yoff = torch.from_numpy(yoff).to(dy.device)
    s.cls = (which, _conv.bucket(s.p), _conv.bucket(s.q), _conv.bucket(s.ln), s.r > 1, s.xc, s.yc)
    return s


class _Product:
    """One launch of `_gemm_kernel` for one gradient: the Step, and which tensors it takes."""

    __slots__ = ("launch", "xi", "yi", "ci", "xoff", "yoff")

    def __init__(self, launch, side):
        self.launch, self.xi, self.yi, self.ci, self.xoff, self.yoff = \
            launch, side.xi, side.yi, side.ci, side.xoff, side.yoff

    def __call__(self, t):
        self.launch(t[self.xi], t[self.yi], t[self.ci], self.xoff, self.yoff)


class _Both:
    """One launch of `_gemm2_kernel`: da and db together."""

    __slots__ = ("launch", "pick", "tables")

    def __init__(self, launch, da, db):
        self.launch, self.pick = launch, itemgetter(da.xi, da.yi, da.ci, db.xi, db.yi, db.ci)
        self.tables = (da.xoff, da.yoff, db.xoff, db.yoff)

    def __call__(self, t):
        self.launch(*self.pick(t), *self.tables)


class _BothTMA(_Both):
    """`_gemm2_kernel` with TMA descriptors, and the cp.async launch it falls back to on a call
    whose tensors are not all 16-byte aligned (TMA needs aligned bases; the plan cannot know)."""

    __slots__ = ("fallback",)

    def __init__(self, launch, fallback, da, db):
        super().__init__(launch, da, db)
        self.fallback = fallback

    def __call__(self, t):
        ptrs = self.pick(t)
        (self.launch if _steps.aligned(ptrs) else self.fallback)(*ptrs, *self.tables)


_ALLOCATOR_SET = []


def _tma_allocator() -> None:
    """Give triton the global scratch allocator its on-device TMA descriptors need (once)."""
    if _ALLOCATOR_SET:
        return
    import torch
    import triton

    dev = "cpu" if interpreted() else "cuda"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    _ALLOCATOR_SET.append(True)


def candidates(itemsize: int, fused: bool, stageable: bool = False) -> list:
    """Tiles the tuner tries, the default first: the GEMM tiles; where both products take the
    aligned path in 16 bits, TMA variants of the two largest (sm_90: elsewhere they fail to
    compile and the tuner drops them); where da's operands can be staged (`_stageable`), the
    float32 tiles again with staging, but for 64 x 64 (staged, ptxas spills it: 32 bytes at 96
    registers; the other three use none)."""
    from dataclasses import replace

    cands = _conv.gemm_candidates(itemsize)
    if fused and itemsize == 2:
        cands += [replace(cands[0], tma=True), replace(cands[1], tma=True)]
    if stageable:
        cands += [replace(c, stage=True) for c in cands if (c.bm, c.bn) != (64, 64)]
    return cands


def _stageable(a, b, dy, vec: int) -> bool:
    """Whether da's operands can be staged (_Staged): float32 (its tl.dot runs on the FMA units; the
    16-bit tiles feed ldmatrix, which reads K-major tiles well), dy and b contiguous, so that da's X
    (dy) and Y (b^T) are both K-major, and M, N, K multiples of VEC (the copies aligned too)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return (dy.element_size() == 4 and m * k * n > 0 and m % vec == 0 and k % vec == 0 and n % vec == 0
            and _conv.repackable(dy, prod(dy.shape[:-2]), m) and _conv.repackable(b, prod(b.shape[:-2]), k))


class _Staged:
    """A plan whose da reads copies of dy and b made first (_conv.Repack: (.., M, N) to (.., N, M) and
    (.., K, N) to (.., N, K)), through which its X and Y are M- and K-major: float32's FMA dot reads
    both tiles from shared memory as vectors, where from K-major tiles it reads one element at a
    time (the unstaged da's sm_90 PTX has 144 scalar ld.shared.b32 a 64 x 64 tile, db's none).
    The buffers are kept with the plan (calls on one stream are ordered) and refilled every call."""

    __slots__ = ("copies", "bufs", "views", "inner", "products")

    def __init__(self, copies, bufs, views, inner):
        self.copies, self.bufs, self.views, self.inner = copies, bufs, views, inner
        self.products = inner.products if isinstance(inner, _Plan) else [inner]

    def __call__(self, t):
        self.copies[0](t[2], self.bufs[0])
        self.copies[1](t[1], self.bufs[1])
        self.inner(t + self.views)


def _plan(a, b, dy, da, db, tune, force=None):
    """The plan of one layout: a _Plan of one launch of `_gemm2_kernel` (both gradients, on the
    aligned path), or one `_gemm_kernel` launch per non-empty output.  The tile is the tuner's
    choice for the class (force: candidate `force`, untimed)."""
    item = dy.element_size()
    vec = 16 // item
    sides = [s for s in (_side("da", a, b, dy, vec), _side("db", a, b, dy, vec)) if s is not None]
    if not sides:
        return _Plan([])
    tensors = (a, b, dy, da, db)
    common = dict(IS_F64=item == 8, VEC=vec)
    # One launch for both where both take the aligned path; the gather fallback (a code 0) needs
    # so many registers for its per-element pointers that the two branches together would spill.
    fused = len(sides) == 2 and all(s.xc and s.yc for s in sides)
    stageable = len(sides) == 2 and sides[0].xc == 1 and sides[0].yc == 1 and _stageable(a, b, dy, vec)
    staging = []  # (copies, buffers, views, da's side): made once, shared by the staged candidates

    def staged():
        if not staging:
            import torch

            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            bufs = (torch.empty(dy.shape[:-2] + (n, m), dtype=dy.dtype, device=dy.device),
                    torch.empty(b.shape[:-2] + (n, k), dtype=b.dtype, device=b.device))
            views = (bufs[0].transpose(-1, -2), bufs[1].transpose(-1, -2))  # dy and b, M- and K-major
            side = _side("da", a, views[1], views[0], vec)
            side.xi, side.yi = 5, 6  # the views follow (a, b, dy, da, db)
            copies = (_conv.Repack(prod(dy.shape[:-2]), m, n), _conv.Repack(prod(b.shape[:-2]), k, n))
            staging.extend([copies, bufs, views, side])
        return staging

    def build(tile):
        if tile.stage and stageable:
            copies, bufs, views, side = staged()
            launch = _Staged(copies, bufs, views, launches(tile, [side, sides[1]]))
        else:
            launch = launches(tile, sides)
        runner = lambda: launch(tensors)  # noqa: E731 - the tuner times the plan on this call's tensors
        runner.launch = launch
        return runner

    def launches(tile, sides):
        """The launch(es) of `sides` with `tile`: a _Product, a _Plan of them, _Both or _BothTMA."""
        fitted = [_conv.small_tile(tile, s.p, s.q) for s in sides]
        warps = max(t.warps for t in fitted)
        common.update(BK=tile.bk, GROUP=tile.group)
        if not fused:
            launches = [_Product(_steps.Step(_gemm_kernel, s.tiles(f), 5, {**s.values(f), **common}, f.warps,
                                             num_stages=tile.stages), s) for s, f in zip(sides, fitted)]
            launch = launches[0] if len(launches) == 1 else _Plan(launches)
        else:
            t0 = sides[0].tiles(fitted[0])
            values = {"T0": t0, **sides[0].values(fitted[0], "0"), **sides[1].values(fitted[1], "1"), **common,
                      "TMA": False}
            grid = t0 + sides[1].tiles(fitted[1])
            step = _steps.Step(_gemm2_kernel, grid, 10, values, warps, num_stages=tile.stages)
            launch = _Both(step, *sides)
            if tile.tma:
                _tma_allocator()
                tma = _steps.Step(_gemm2_kernel, grid, 10, {**values, "TMA": True}, warps, num_stages=tile.stages)
                launch = _BothTMA(tma, step, *sides)
        return launch

    cls = (str(dy.dtype), stageable) + tuple(s.cls for s in sides)
    cands = [_conv.INTERPRETER_TILE] if dy.device.type == "cpu" else candidates(item, fused, stageable)
    flops = sum(2.0 * s.p * s.q * s.ln * s.z * s.r for s in sides)
    launch = TUNER.pick(cls, cands, build, dy.device, flops, tune, force).launch
    return launch if isinstance(launch, (_Plan, _Staged)) else _Plan([launch])


class _Plan:
    __slots__ = ("products",)

    def __init__(self, products):
        self.products = products

    def __call__(self, tensors):
        for p in self.products:
            p(tensors)


_PLANS: dict = {}
_PLANS_MAX = 256


def _call(a, b, dy, da, db, tune: bool) -> None:
    key = (a.shape, b.shape, a.stride(), b.stride(), dy.stride(), a.dtype, a.device)
    plan = _PLANS.get(key)
    if plan is None:
        if IMPORT_ERROR is not None:
            raise RuntimeError(f"triton {OP}: triton is not importable ({IMPORT_ERROR})")
        with on_device(a):
            plan = _plan(a, b, dy, da, db, tune)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    if _conv.other_device(a):
        with on_device(a):
            plan((a, b, dy, da, db))
    else:
        plan((a, b, dy, da, db))


def clear_plans() -> None:
    _PLANS.clear()


# ============================================================================= entry


def _check_kernel_args(inputs, outs) -> None:
    """What the kernels need beyond the op's argument rule: one device, outputs contiguous and
    sharing no memory with another tensor (they are written while the inputs are read)."""
    a, b, dy, da, db = inputs["a"], inputs["b"], inputs["dy"], outs["da"], outs["db"]
    for name, t in (("b", b), ("dy", dy), ("da", da), ("db", db)):
        if t.device != a.device:
            raise ValueError(f"triton {OP}: {name}.device: expected {a.device} (the device of a), got {t.device}")
    if a.device.type not in ("cuda", "cpu"):
        raise ValueError(f"triton {OP}: device: expected cuda, or cpu under TRITON_INTERPRET=1, got {a.device}")
    for name, t in (("da", da), ("db", db)):
        if not t.is_contiguous():
            raise ValueError(f"triton {OP}: {name}: expected a contiguous tensor, got strides {t.stride()}")
    spans = {name: byte_span(t) for name, t in (("a", a), ("b", b), ("dy", dy), ("da", da), ("db", db)) if t.numel()}
    for name in ("da", "db"):
        for other in spans:
            if other != name and name in spans and overlap(spans[name], spans[other]):
                raise ValueError(f"triton {OP}: {name}: expected a buffer of its own (outputs are written while "
                                 f"inputs are read), got memory shared with {other}")


@argcheck.register(triton_backend, OP, dtypes=DTYPES, deterministic=True)
def matmul_backward(inputs, outs, params):
    """The op's argument checks (harness.argcheck), the kernels' own, then the launches; on a
    layout's first call it plans, and on CUDA may settle the autotuning choice."""
    _check_kernel_args(inputs, outs)
    _call(inputs["a"], inputs["b"], inputs["dy"], outs["da"], outs["db"], True)


def _unchecked(inputs, outs, params):
    """What timed loops call: the cached plan and its launches; no checks, no tuning."""
    _call(inputs["a"], inputs["b"], inputs["dy"], outs["da"], outs["db"], False)


matmul_backward.unchecked = _unchecked
