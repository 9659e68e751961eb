"""matmul_backward as Triton kernels on tensor cores (CUDA, or CPU under TRITON_INTERPRET=1).

da = sum_to_shape(dy @ b^T, a.shape) and db = sum_to_shape(a^T @ dy, b.shape) are each one
launch of `_gemm_kernel`, a batched GEMM with a folded batch:

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

Host side: plans are cached per (shapes, strides, dtype, device); a repeated call is a dict
lookup and two launches through the compiled kernels' own launchers (_steps.Step).  On
CUDA the tile of each product is autotuned per shape class on the first checked call
(_conv.Tuner); `matmul_backward.unchecked`, what the harness times, never tunes.
Nothing is unsupported: every case the oracle defines runs.
"""
from __future__ import annotations

from math import prod

from backends.triton import _conv, _steps, triton_backend
from backends.triton.common import IMPORT_ERROR, byte_span, cdiv, jit, on_device, overlap, tl
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
# The plan proves it for an operand (`_contiguity`) and then says along which axis (1: the L
# axis, 2: the P (X) or Q (Y) axis; 0: no facts, the scalar fallback): that axis has stride 1
# (written as a literal 1 below), the other stride, every batch offset of the operand and the
# size of the contiguous axis are multiples of VEC.  `v // VEC * VEC` restates such a fact
# exactly (tl.multiple_of has no effect on a scalar argument); the base pointers' own alignment
# is triton's launch specialisation.
@jit(do_not_specialize=["P", "Q", "L"])
def _gemm_kernel(x_ptr, y_ptr, c_ptr, xoff_ptr, yoff_ptr,
                 P, Q, L, R, sxp, sxl, syl, syq,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                 EVEN_L: tl.constexpr, IS_F64: tl.constexpr,
                 XC: tl.constexpr, YC: tl.constexpr, VEC: tl.constexpr):
    """C[z] = sum_r X[z, r] @ Y[z, r]; program = (z, tile), tiles in grouped order along P."""
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
    pid = tl.program_id(0)
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


class _Product:
    """One launch of `_gemm_kernel` for one gradient: the Step, and which tensors it takes."""

    __slots__ = ("launch", "xi", "yi", "ci", "xoff", "yoff")

    def __init__(self, launch, xi, yi, ci, xoff, yoff):
        self.launch, self.xi, self.yi, self.ci, self.xoff, self.yoff = launch, xi, yi, ci, xoff, yoff

    def __call__(self, t):
        self.launch(t[self.xi], t[self.yi], t[self.ci], self.xoff, self.yoff)


def _product(which, a, b, dy, out, tune, force=None):
    """The plan of da (which="da") or db: a _Product, or None when the output is empty."""
    import torch

    full = tuple(dy.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    sa, sb, sy = a.stride(), b.stride(), dy.stride()
    if which == "da":  # X = dy (M x N), Y = b^T (N x K)
        p, q, ln = m, k, n
        xi, yi, ci = 2, 1, 3
        sxp, sxl, syl, syq = sy[-2], sy[-1], sb[-1], sb[-2]
        xoff, yoff, z, r = _batch_tables(a.shape[:-2], full, sy[:-2], b.shape[:-2], sb[:-2], full)
    else:              # X = a^T (K x M), Y = dy (M x N)
        p, q, ln = k, n, m
        xi, yi, ci = 0, 2, 4
        sxp, sxl, syl, syq = sa[-1], sa[-2], sy[-2], sy[-1]
        xoff, yoff, z, r = _batch_tables(b.shape[:-2], a.shape[:-2], sa[:-2], full, sy[:-2], full)
    if p * q * z == 0:
        return None
    dev = dy.device
    item = dy.element_size()
    vec = 16 // item
    xc = aligned_axis(sxl, sxp, ln, p, xoff, vec)
    yc = aligned_axis(syl, syq, ln, q, yoff, vec)
    xoff = torch.from_numpy(xoff).to(dev)
    yoff = torch.from_numpy(yoff).to(dev)

    def build(tile):
        tile = _conv.small_tile(tile, p, q)
        values = dict(P=p, Q=q, L=ln, R=r, sxp=sxp, sxl=sxl, syl=syl, syq=syq, BM=tile.bm, BN=tile.bn,
                      BK=tile.bk, GROUP=tile.group, EVEN_L=ln % tile.bk == 0, IS_F64=item == 8,
                      XC=xc, YC=yc, VEC=vec)
        grid = z * cdiv(p, tile.bm) * cdiv(q, tile.bn)
        launch = _steps.Step(_gemm_kernel, grid, 5, values, tile.warps, num_stages=tile.stages)
        prod_ = _Product(launch, xi, yi, ci, xoff, yoff)
        tensors = (a, b, dy, out if which == "da" else None, out if which == "db" else None)
        runner = lambda: prod_(tensors)  # noqa: E731 - the tuner times the plan on this call's tensors
        runner.product = prod_
        return runner

    cls = (which, str(dy.dtype), _conv.bucket(p), _conv.bucket(q), _conv.bucket(ln), r > 1,
           sxp == 1, syq == 1, xc, yc)
    cands = [_conv.INTERPRETER_TILE] if dev.type == "cpu" else _conv.gemm_candidates(item)
    return TUNER.pick(cls, cands, build, dev, 2.0 * p * q * ln * z * r, tune, force).product


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
            plan = _Plan([p for p in (_product("da", a, b, dy, da, tune), _product("db", a, b, dy, db, tune))
                          if p is not None])
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
