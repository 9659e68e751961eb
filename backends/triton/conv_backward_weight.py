"""conv_backward_weight (wgrad) as Triton kernels: implicit GEMM on tensor cores, split over N x O.

    dw[co, c, k] = sum_n sum_{o < O} dy[n, co, o] * x[n, first(co) + c, o*s + k*d - p]

Design:

* 1D, 2D and 3D run as 3D (`_conv.geometry3`), and every tensor is read and written through
  its strides, so channels-first, channels-last and strided views take the same kernel.
* Per filter tap k and group, dw[:, :, k] is a GEMM (Cout/g x P) @ (P x Cin/g) over the
  P = N * prod(O) output positions: `tl.dot` on a BM x BK tile of dy (transposed by its
  strides) and a BK x BN tile of x read at o*s + k*d - p (taps reading the padding load 0).
* Split-K: the positions are cut into S equal chunks (S sized so the launch fills the GPU);
  program (tap, tile, split) accumulates its chunk in float32 registers (float64 for
  float64) and, when S > 1, writes its partial tile to an fp32 workspace [S, taps, Cout,
  Cin/g]; `_finish_kernel` then adds the S partials of each weight in a fixed order and
  writes dw in its dtype.  With S = 1 the main kernel writes dw itself.  Deterministic: no
  atomics, the same summation order on every call of a plan.
* Channels first, contiguous, on the tensor-core path: dy and x are staged to channels last
  (_conv.Repack; one channel: used in place) so the tiles load as pipelined cp.async vectors,
  not per-element gathers; dw is written in its own layout through its strides.
* Small Cin (`MT`: groups 1, Cin < MT_CIG_MAX, more than one tap, not EW; the RGB stem): one GEMM for
  every tap, its columns the (tap, c) pairs, so the BN-wide column tile is not mostly padding and dy
  is read once per column tile rather than once per tap; x is gathered per column at o*s + k*d - p.
  (A GEMM per tap put 3 of its 16+ columns to use on the stem; the CUDA kernel's same change,
  cupy's cv_wgrad_taps, measured 17-25x there.)
* Small channel groups (`EW`: Cin/g * Cout/g < 64, depthwise included): columns run over
  the (co, c) pairs of all groups (contiguous across channels for a channels-last depthwise
  layer) and each step is a multiply-add on a BK x BN tile, summed over BK at the end.

Host side: plans are cached per (shapes, strides, dtype, device, geometry); a repeated call is
a dict lookup and one or two launches (S > 1: into the plan's own workspace) through the
compiled kernels' launchers.  On CUDA the tile (and so S) is autotuned per shape class on
the first checked call (_conv.Tuner); the unchecked entry never tunes.  Nothing the oracle
defines is unsupported.
"""
from __future__ import annotations

from math import prod

from backends.triton import _conv, _steps, triton_backend
from backends.triton.common import cdiv, jit, tl
from backends.triton.common import to_out as _to_out
from backends.triton.conv_backward_data import EW_MAX
from harness import argcheck

OP = "conv_backward_weight"
DTYPES = ("f32", "f16", "bf16", "f64")
TUNER = _conv.Tuner(OP)
# The finish: BLOCK weights a program, FINISH_SB partial rows loaded at once.  One row at a time, each
# thread waited out a load per partial in turn: 20-49 us for 6.6-8.7 MB on the H100, 6% occupancy,
# 60-81% of stalls on the loads (results/h100/s15/call3, call4).
FINISH_BLOCK = 256
FINISH_SB = 8
MT_CIG_MAX = 16  # groups 1 with Cin below this (and more than one tap): every tap in one GEMM (MT)


# ============================================================================= kernels


# Spatial sizes are not specialised (one compiled kernel serves many layers); channel counts and
# tensor strides are (aligned channel blocks with unit stride: vectorised loads, see _dgrad_kernel).
@jit(do_not_specialize=["N", "ID", "IH", "IW", "OD", "OH", "OW", "PD", "PH", "PW", "npos", "chunk", "tiles",
                        "nmb", "nnb"])
def _wgrad_kernel(dy_ptr, x_ptr, out_ptr,
                  N, ID, IH, IW, OD, OH, OW, KH, KW, SD, SH, SW, PD, PH, PW, DLD, DLH, DLW,
                  npos, chunk, tiles, nmb, nnb, cout, cig, cog,
                  syn, syc, syd, syh, syw, sxn, sxc, sxd, sxh, sxw,
                  so_co, so_ci, so_kd, so_kh, so_kw, so_split,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EW: tl.constexpr,
                  IS_F64: tl.constexpr, MT: tl.constexpr = False, KD: tl.constexpr = 1):
    """One tap's BM x BN tile of dw (EW: BN (co, c) pairs; MT: BN (tap, c) pairs of every tap, the
    grid's taps axis 1) over one chunk of positions."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tap = pid // tiles
    t = pid - tap * tiles
    kw = tap % KW
    kh = (tap // KW) % KH
    kd = tap // (KW * KH)
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    if MT:  # columns j = tap * Cin + c; the tap's offsets k*d - p per column
        mb = t // nnb
        nb = t - mb * nnb
        col = mb * BM + tl.arange(0, BM)
        cm = col < cog
        co = col
        j = nb * BN + tl.arange(0, BN)
        qm = j < KD * KH * KW * cig
        jt = j // cig
        ci = j - jt * cig
        kw = jt % KW
        kh = (jt // KW) % KH
        kd = jt // (KW * KH)
        cin = ci
        acc = tl.zeros([BM, BN], ACC)
    elif EW:
        q = t * BN + tl.arange(0, BN)
        qm = q < cout * cig
        co = q // cig
        ci = q - co * cig
        cin = (co // cog) * cig + ci
        acc = tl.zeros([BK, BN], ACC)
    else:
        g = t // (nmb * nnb)
        r = t - g * (nmb * nnb)
        mb = r // nnb
        nb = r - mb * nnb
        col = mb * BM + tl.arange(0, BM)
        cm = col < cog
        co = g * cog + col
        ci = nb * BN + tl.arange(0, BN)
        qm = ci < cig
        cin = g * cig + ci
        acc = tl.zeros([BM, BN], ACC)
    ycol = co.to(tl.int64) * syc
    xcol = cin.to(tl.int64) * sxc
    # The tap's input offset per dim: i = o*s + (k*d - p) (MT: one per column).
    shd = kd * DLD - PD
    shh = kh * DLH - PH
    shw = kw * DLW - PW
    start = split * chunk
    end = tl.minimum(start + chunk, npos)
    for p0 in range(start, end, BK):
        pos = p0 + tl.arange(0, BK)
        pm = pos < end
        ow = pos % OW
        rest = pos // OW
        oh = rest % OH
        rest = rest // OH
        od = rest % OD
        n = (rest // OD).to(tl.int64)
        yoff = n * syn + od.to(tl.int64) * syd + oh.to(tl.int64) * syh + ow.to(tl.int64) * syw
        if MT:  # x at o*s + k*d - p for each (position, column)
            xd2 = (od * SD)[:, None] + shd[None, :]
            xh2 = (oh * SH)[:, None] + shh[None, :]
            xw2 = (ow * SW)[:, None] + shw[None, :]
            v2 = pm[:, None] & qm[None, :] & (xd2 >= 0) & (xd2 < ID) & (xh2 >= 0) & (xh2 < IH) & (xw2 >= 0) & \
                (xw2 < IW)
            xo2 = n[:, None] * sxn + xd2.to(tl.int64) * sxd + xh2.to(tl.int64) * sxh + xw2.to(tl.int64) * sxw
            a = tl.load(dy_ptr + ycol[:, None] + yoff[None, :], mask=cm[:, None] & pm[None, :], other=0.0)
            b = tl.load(x_ptr + xo2 + xcol[None, :], mask=v2, other=0.0)
            acc = _conv.mma(a, b, acc)
        else:
            xd = od * SD + shd
            xh = oh * SH + shh
            xw = ow * SW + shw
            v = pm & (xd >= 0) & (xd < ID) & (xh >= 0) & (xh < IH) & (xw >= 0) & (xw < IW)
            xoff = n * sxn + xd.to(tl.int64) * sxd + xh.to(tl.int64) * sxh + xw.to(tl.int64) * sxw
            if EW:
                a = tl.load(dy_ptr + yoff[:, None] + ycol[None, :], mask=pm[:, None] & qm[None, :], other=0.0)
                b = tl.load(x_ptr + xoff[:, None] + xcol[None, :], mask=v[:, None] & qm[None, :], other=0.0)
                acc += a.to(ACC) * b.to(ACC)
            else:
                a = tl.load(dy_ptr + ycol[:, None] + yoff[None, :], mask=cm[:, None] & pm[None, :], other=0.0)
                b = tl.load(x_ptr + xoff[:, None] + xcol[None, :], mask=v[:, None] & qm[None, :], other=0.0)
                acc = _conv.mma(a, b, acc)
    # The tap offsets of dw (MT: per column).
    base = split.to(tl.int64) * so_split + kd * so_kd + kh * so_kh + kw * so_kw
    if EW:
        res = tl.sum(acc, axis=0)
        tl.store(out_ptr + base + co * so_co + ci * so_ci, _to_out(res, out_ptr), mask=qm)
    else:
        if MT:
            off = base[None, :] + co[:, None] * so_co + ci[None, :] * so_ci
        else:
            off = base + co[:, None] * so_co + ci[None, :] * so_ci
        tl.store(out_ptr + off, _to_out(acc, out_ptr), mask=cm[:, None] & qm[None, :])


@jit(do_not_specialize=["E", "S", "cout", "cig", "KH", "KW"])
def _finish_kernel(ws_ptr, dw_ptr, E, S, cout, cig, KH, KW, so_co, so_ci, so_kd, so_kh, so_kw,
                   BLOCK: tl.constexpr, SB: tl.constexpr, IS_F64: tl.constexpr):
    """dw = the sum of the S partial rows of the workspace [S, taps, Cout, Cin/g]: SB rows loaded at
    once and summed by a fixed tree, the groups added in order (the same bits every call)."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < E
    acc = tl.zeros([BLOCK], tl.float64 if IS_F64 else tl.float32)
    for s0 in range(0, S, SB):
        rows = s0 + tl.arange(0, SB)
        part = tl.load(ws_ptr + rows[:, None] * E + e[None, :], mask=(rows[:, None] < S) & m[None, :], other=0.0)
        acc += tl.sum(part, axis=0)  # the workspace is small: int32 offsets
    ci = e % cig
    r = e // cig
    co = r % cout
    tap = r // cout
    kw = tap % KW
    kh = (tap // KW) % KH
    kd = tap // (KW * KH)
    tl.store(dw_ptr + co * so_co + ci * so_ci + kd * so_kd + kh * so_kh + kw * so_kw, _to_out(acc, dw_ptr), mask=m)


# ============================================================================= planning


def _ew(g: _conv.Geo3) -> bool:
    return g.cig * g.cog < EW_MAX


def _mt(g: _conv.Geo3) -> bool:
    return not _ew(g) and g.groups == 1 and g.cig < MT_CIG_MAX and prod(g.k) > 1


def candidates(g: _conv.Geo3, itemsize: int, device_type: str, unit_channels: bool = True) -> list:
    """Tiles (BM output channels, BN input channels, BK positions) tried, the default first, none that
    fits the geometry (_fit) as an earlier one does."""
    if device_type == "cpu":  # the interpreter
        cands = [_conv.Tile(1, 64, 2048, 1, 1)] if _ew(g) else [_conv.Tile(16, 16, 32, 1, 1)]
    elif _ew(g):  # bk: elements of the tile (positions = bk / columns), bn: (co, c) columns at most
        cands = [_conv.Tile(1, 64, 2048, 4, 1), _conv.Tile(1, 128, 4096, 8, 1), _conv.Tile(1, 32, 2048, 4, 1)]
    else:  # unit_channels: dy's and x's channel strides are 1, so the tiles' loads vectorise along channels
        cands = _conv.gemm_candidates(itemsize) if unit_channels else _conv.gather_candidates(itemsize)
    return _conv.distinct(cands, lambda t: _fit(t, g))


def _fit(tile: _conv.Tile, g: _conv.Geo3) -> _conv.Tile:
    if _ew(g):  # no tl.dot: any power of two; the tile keeps its element count
        bn = min(tile.bn, 1 << (g.cout * g.cig - 1).bit_length())
        return _conv.Tile(1, bn, max(16, tile.bk // bn), tile.warps, tile.stages)
    bm = min(tile.bm, max(16, 1 << (g.cog - 1).bit_length()))
    cols = prod(g.k) * g.cig if _mt(g) else g.cig  # MT: the (tap, c) columns
    bn = min(tile.bn, max(16, 1 << (cols - 1).bit_length()))
    warps = tile.warps if bm * bn >= 128 * 64 else min(tile.warps, 4)
    return _conv.Tile(bm, bn, tile.bk, warps, tile.stages)


def splits_for(programs: int, npos: int, bk: int, device_type: str, sms: int = 132) -> int:
    """Chunks of the position reduction: programs * chunks up to 4 per SM (two waves of two, or one
    of four, the main kernel's residency at 96-128 registers), each chunk >= 8 steps of BK (the
    interpreter: >= 2 steps and at most 3 chunks, so the split path runs on small cases).  Rounded
    down: rounded up, the 3x3 layers' 9 programs a chunk made 531 against 528 slots, and the 3
    left over ran as a second wave of their own (results/h100/s15/call3)."""
    if device_type == "cpu":  # the interpreter
        return max(1, min(3, npos // (2 * bk)))
    want = (2 * sms * 2) // max(programs, 1)
    return max(1, min(want, npos // (8 * bk)))


class _Plan:
    """The main launch, and with S > 1 the finish and the partials workspace.  The workspace is
    allocated on the first call and kept: calls on one stream are ordered, so the next call's
    partials are written only after this call's finish has read them.  Staged (`stage`: the
    Repacks of dy and x), dy and x are first copied to channels last (_conv.Staging buffers)."""

    __slots__ = ("main", "finish", "ws_numel", "ws_dtype", "ws", "stage")

    def __init__(self, main, finish, ws_numel, ws_dtype, stage=None):
        self.main, self.finish, self.ws_numel, self.ws_dtype, self.ws = main, finish, ws_numel, ws_dtype, None
        self.stage = stage

    def __call__(self, dy, x, dw):
        if self.stage is not None:
            bufs = self.stage.buffers(dy, x)
            dy, x = self.stage.operand(0, dy, bufs), self.stage.operand(1, x, bufs)
        if self.finish is None:
            self.main(dy, x, dw)
            return
        ws = self.ws
        if ws is None:
            import torch

            ws = self.ws = torch.empty(self.ws_numel, dtype=self.ws_dtype, device=dy.device)
        self.main(dy, x, ws)
        self.finish(ws, dw)


def _plan(dy, x, dw, params, channels_last: bool, tune: bool, force: int | None = None):
    import torch

    g = _conv.geometry3(x.shape, dy.shape, dw.shape, params, channels_last)
    if dw.numel() == 0:
        return None
    sy, sx, so = _conv.strides5(dy, channels_last), _conv.strides5(x, channels_last), _conv.wstrides5(dw, channels_last)
    taps = prod(g.k)
    npos = g.n * prod(g.out)
    item = dy.element_size()
    dev = dy.device
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    E = taps * g.cout * g.cig
    mt = _mt(g)
    ws_dtype = torch.float64 if item == 8 else torch.float32
    # Channels first, tensor-core path: stage dy and x to channels last (see _conv.Repack).
    stage = None
    if not channels_last and not _ew(g) and _conv.repackable(dy, g.n, g.cout) and _conv.repackable(x, g.n, g.cin):
        stage = _conv.Staging(_conv.Repack(g.n, g.cout, prod(g.out)), _conv.Repack(g.n, g.cin, prod(g.inp)))
        sy, sx = _conv.staged_strides5(sy, g.cout), _conv.staged_strides5(sx, g.cin)

    def build(tile):
        tile = _fit(tile, g)
        if _ew(g):
            nmb = nnb = 1
            tiles = cdiv(g.cout * g.cig, tile.bn)
        elif mt:
            nmb, nnb = cdiv(g.cog, tile.bm), cdiv(taps * g.cig, tile.bn)
            tiles = nmb * nnb
        else:
            nmb, nnb = cdiv(g.cog, tile.bm), cdiv(g.cig, tile.bn)
            tiles = g.groups * nmb * nnb
        lanes = 1 if mt else taps  # the grid's taps axis
        s = splits_for(lanes * tiles, npos, tile.bk, dev.type, sms)
        chunk = cdiv(cdiv(npos, s), tile.bk) * tile.bk
        s = cdiv(npos, chunk) if npos else 1
        if s > 1:  # workspace [S, taps, Cout, Cin/g], contiguous
            ostr = dict(so_co=g.cig, so_ci=1, so_kd=g.k[1] * g.k[2] * g.cout * g.cig, so_kh=g.k[2] * g.cout * g.cig,
                        so_kw=g.cout * g.cig, so_split=E)
        else:
            ostr = dict(so_co=so[0], so_ci=so[1], so_kd=so[2], so_kh=so[3], so_kw=so[4], so_split=0)
        values = dict(N=g.n, ID=g.inp[0], IH=g.inp[1], IW=g.inp[2], OD=g.out[0], OH=g.out[1], OW=g.out[2],
                      KH=g.k[1], KW=g.k[2], SD=g.s[0], SH=g.s[1], SW=g.s[2],
                      PD=g.p[0], PH=g.p[1], PW=g.p[2], DLD=g.d[0], DLH=g.d[1], DLW=g.d[2],
                      npos=npos, chunk=chunk, tiles=tiles, nmb=nmb, nnb=nnb, cout=g.cout, cig=g.cig, cog=g.cog,
                      syn=sy[0], syc=sy[1], syd=sy[2], syh=sy[3], syw=sy[4],
                      sxn=sx[0], sxc=sx[1], sxd=sx[2], sxh=sx[3], sxw=sx[4], **ostr,
                      BM=tile.bm, BN=tile.bn, BK=tile.bk, EW=_ew(g), IS_F64=item == 8, MT=mt, KD=g.k[0])
        main = _steps.Step(_wgrad_kernel, (lanes * tiles, s), 3, values, tile.warps, num_stages=tile.stages)
        finish = None
        if s > 1:
            fv = dict(E=E, S=s, cout=g.cout, cig=g.cig, KH=g.k[1], KW=g.k[2], so_co=so[0], so_ci=so[1],
                      so_kd=so[2], so_kh=so[3], so_kw=so[4], BLOCK=FINISH_BLOCK, SB=FINISH_SB, IS_F64=item == 8)
            finish = _steps.Step(_finish_kernel, cdiv(E, FINISH_BLOCK), 2, fv, 4)
        plan = _Plan(main, finish, s * E, ws_dtype, stage)
        runner = lambda: plan(dy, x, dw)  # noqa: E731 - the tuner times the plan on this call's tensors
        runner.plan = plan
        return runner

    cls = (str(dy.dtype), _ew(g), mt, taps, _conv.bucket(g.cig), _conv.bucket(g.cog), _conv.bucket(npos), g.groups > 1,
           channels_last, sy[1] == 1 and sx[1] == 1, stage is not None)
    # Staged with channel counts off the 16-byte grid, the tiles still gather: the small tiles.
    unit = sy[1] == 1 and sx[1] == 1 and (stage is None or _conv.channels_aligned(g, item))
    return TUNER.pick(cls, candidates(g, item, dev.type, unit), build, dev, 2.0 * npos * g.cout * g.cig * taps, tune,
                      force).plan


_PLANS: dict = {}


def _call(dy, x, dw, params, tune: bool) -> None:
    _conv.call(OP, _PLANS, _plan, dy, x, dw, params, tune)


def clear_plans() -> None:
    _PLANS.clear()


# ============================================================================= entry


@argcheck.register(triton_backend, OP, dtypes=DTYPES, deterministic=True)
def conv_backward_weight(inputs, outs, params):
    """The op's argument checks (harness.argcheck), the kernel's own, then the launches; on a
    layout's first call it plans, and on CUDA may settle the autotuning choice."""
    _conv.check_kernel_args(OP, {"dy": inputs["dy"], "x": inputs["x"], "dw": outs["dw"]}, "dw")
    _call(inputs["dy"], inputs["x"], outs["dw"], params, True)


def _unchecked(inputs, outs, params):
    """What timed loops call: the cached plan and its launches; no checks, no tuning."""
    _call(inputs["dy"], inputs["x"], outs["dw"], params, False)


conv_backward_weight.unchecked = _unchecked
