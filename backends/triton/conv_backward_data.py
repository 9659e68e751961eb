"""conv_backward_data (dgrad) as Triton kernels: implicit GEMM on tensor cores, per filter phase.

    dx[n, ci, i] = sum_{co in group(ci), k : i = o*s + k*d - p, 0 <= o < O} dy[n, co, o] * w[co, ci - first, k]

Design:

* 1D, 2D and 3D all run as 3D (`_conv.geometry3` pads the missing leading dims with size 1,
  kernel 1, stride 1), and every tensor is read and written through its (n, c, d, h, w)
  strides, so channels-first, channels-last and strided views take the same kernel.
* Filter phases (strided dgrad without the zeros): input positions are split by their
  residue r = (i + p) mod s per dim.  In phase r only the taps with k*d = r (mod s) reach an
  input position, and then o = t + (i0 + p - k*d)/s for the phase's t-th position i = i0 + s*t:
  a dense, shifted window of dy.  A program owns one phase's block of BM input positions
  (rows) and a block of BN input channels and loops over that phase's taps only, so the
  zero-inserted positions of the transposed convolution cost nothing.  Positions that no tap
  reaches (s above the dilated kernel) are written as 0 by their phase's programs.
* Tensor-core path (`EW` false): per group a GEMM of (positions x Cout/g) @ (Cout/g x Cin/g)
  per tap, `tl.dot` with float32 accumulation (IEEE float32, DMMA float64).
* Small channel groups (`EW`: Cin/g * Cout/g < 64, depthwise included): a tile of tl.dot would
  be mostly padding, so columns run over all input channels (of every group) and each of the
  Cout/g output channels of a column's group is a multiply-add on the tile (CUDA cores); with
  channels last a depthwise tile's loads are contiguous across channels.
* Accumulates in registers, writes dx once: deterministic, no atomics.
* Pipelining: a phase's taps are made arithmetically from a per-phase header loaded once
  (tap_table), so the tile loads depend on no load inside the loop and triton buffers them
  fully; their weight offsets are proven 16-byte multiples where they are (WVEC), so with
  channels last both tiles load as cp.async vectors.  A contiguous
  channels-first layer on the tensor-core path is staged: dy and w copied to channels last,
  the kernel run on the copies into a channels-last dx buffer, copied back (_conv.Repack;
  a copy between layouts that are the same memory, a 1x1 layer's weights, is skipped);
  read in place its tiles would be per-element gathers, never pipelined.

Host side: plans are cached per (shapes, strides, dtype, device, geometry); a repeated call is
a dict lookup and one launch through the compiled kernel's launcher.  On CUDA the tile is
autotuned per shape class on the first checked call (_conv.Tuner); the unchecked entry never
tunes.  Nothing the oracle defines is unsupported.
"""
from __future__ import annotations

from math import prod

from backends.triton import _conv, _steps, triton_backend
from backends.triton.common import cdiv, jit, tl
from backends.triton.common import to_out as _to_out
from harness import argcheck

OP = "conv_backward_data"
DTYPES = ("f32", "f16", "bf16", "f64")
TUNER = _conv.Tuner(OP)
EW_MAX = 64   # Cin/g * Cout/g below this: the multiply-add path (a tl.dot tile would be mostly padding)


# ============================================================================= kernel


@jit
def _tap(ti, hdr, td, th, tw, valid, ybase, OD, OH, OW, syd, syh, syw):
    """Tap ti of a phase from its header `hdr` (see tap_table; loaded once per program): the dy
    row offsets of the tile's positions (ybase shifted by the tap's dy window shift), which of
    them fall inside dy, and the tap's weight offset.  Arithmetic only: the tile loads that
    depend on it are then first-level loads for triton's pipeliner (with the taps loaded from a
    table every step, the pipeliner spends a stage on those loads and buffers the tiles less)."""
    cntw, cnth, sd0, sh0, sw0, dqd, dqh, dqw, w0, wsd, wsh, wsw = hdr
    jw = ti % cntw
    rest = ti // cntw
    jh = rest % cnth
    jd = rest // cnth
    cd = sd0 - jd * dqd
    chh = sh0 - jh * dqh
    cw = sw0 - jw * dqw
    wtap = w0 + jd * wsd + jh * wsh + jw * wsw
    od = td + cd
    oh = th + chh
    ow = tw + cw
    v = valid & (od >= 0) & (od < OD) & (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
    yrow = ybase + (cd.to(tl.int64) * syd + chh.to(tl.int64) * syh + cw.to(tl.int64) * syw)
    return yrow, v, wtap


@jit
def _header(tab):
    """A phase's tap header (tap_table) after its tap count, as a tuple of scalars."""
    return (tl.load(tab + 1), tl.load(tab + 2), tl.load(tab + 3), tl.load(tab + 4), tl.load(tab + 5),
            tl.load(tab + 6), tl.load(tab + 7), tl.load(tab + 8), tl.load(tab + 9), tl.load(tab + 10),
            tl.load(tab + 11), tl.load(tab + 12))


# Spatial sizes are not specialised (one compiled kernel serves many layers; the full case set
# would otherwise compile one per case).  Channel counts and tensor strides are: a unit channel
# stride and a channel block start known to be a multiple of 16 let the tiles' loads vectorise
# (without that every element gets its own 64-bit pointer, and the big tiles spill).
@jit(do_not_specialize=["N", "ID", "IH", "IW", "OD", "OH", "OW", "PD", "PH", "PW", "TD", "TH", "TW", "nrb", "ncb",
                        "trow"])
def _dgrad_kernel(dy_ptr, w_ptr, dx_ptr, tap_ptr,
                  N, ID, IH, IW, OD, OH, OW, SD, SH, SW, PD, PH, PW,
                  TD, TH, TW, nrb, ncb, cin, cig, cog, trow,
                  syn, syc, syd, syh, syw, swo, swi, sxn, sxc, sxd, sxh, sxw,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EW: tl.constexpr,
                  IS_F64: tl.constexpr, WVEC: tl.constexpr):
    """One phase's BM input positions x BN input channels of dx (see the module docstring).

    tap_ptr: int32 [phases, trow = HEADER]: per phase the count of its taps and how to make each
    (tap_table).  WVEC > 1: the plan found every tap's weight offset a multiple of WVEC elements
    (16 bytes)."""
    pid = tl.program_id(0)
    ph = pid // nrb
    rb = pid - ph * nrb
    rw = ph % SW
    rh = (ph // SW) % SH
    rd = ph // (SW * SH)
    # First input index of the phase per dim: i0 = (r - p) mod s.
    i0d = ((rd - PD) % SD + SD) % SD
    i0h = ((rh - PH) % SH + SH) % SH
    i0w = ((rw - PW) % SW + SW) % SW
    rows = rb * BM + tl.arange(0, BM)
    tw = rows % TW
    rest = rows // TW
    th = rest % TH
    rest = rest // TH
    td = rest % TD
    n = rest // TD
    xd = i0d + SD * td
    xh = i0h + SH * th
    xw = i0w + SW * tw
    valid = (n < N) & (xd < ID) & (xh < IH) & (xw < IW)
    n64 = n.to(tl.int64)
    ybase = n64 * syn + td.to(tl.int64) * syd + th.to(tl.int64) * syh + tw.to(tl.int64) * syw
    cb = tl.program_id(1)
    tab = tap_ptr + ph * trow
    ntaps = tl.load(tab)
    hdr = _header(tab)
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    acc = tl.zeros([BM, BN], ACC)
    if EW:
        # Columns: input channels of every group; co = group * cog + j for j < cog.
        cols = cb * BN + tl.arange(0, BN)
        cmask = cols < cin
        grp = cols // cig
        wcol = (cols - grp * cig) * swi + grp * cog * swo   # a weight is small: int32 offsets
        ycol = (grp * cog).to(tl.int64) * syc
        for ti in range(ntaps):
            yrow, v, wtap = _tap(ti, hdr, td, th, tw, valid, ybase, OD, OH, OW, syd, syh, syw)
            m = v[:, None] & cmask[None, :]
            for j in range(cog):
                a = tl.load(dy_ptr + yrow[:, None] + (ycol + j * syc)[None, :], mask=m, other=0.0)
                b = tl.load(w_ptr + wtap + wcol + j * swo, mask=cmask, other=0.0)
                acc += a.to(ACC) * b.to(ACC)[None, :]
        chan = cols
    else:
        # One flat loop over (tap, Cout/g block): the software pipeline spans the taps.
        g = cb // ncb
        cols = (cb - g * ncb) * BN + tl.arange(0, BN)
        cmask = cols < cig
        kk = tl.arange(0, BK)
        nco = tl.cdiv(cog, BK)
        wcol = cols[None, :] * swi
        for it in range(ntaps * nco):
            ti = it // nco
            c0 = (it - ti * nco) * BK
            yrow, v, wtap = _tap(ti, hdr, td, th, tw, valid, ybase, OD, OH, OW, syd, syh, syw)
            if WVEC > 1:
                # Restates the plan's fact (exact): with it the weight tile's rows are known to start
                # 16-byte aligned, so it loads as cp.async vectors and joins the software pipeline
                # (without it, a synchronous scalar load every step).
                wtap = wtap // WVEC * WVEC
            co = g * cog + c0 + kk
            km = (c0 + kk) < cog
            a = tl.load(dy_ptr + yrow[:, None] + co[None, :].to(tl.int64) * syc,
                        mask=v[:, None] & km[None, :], other=0.0)
            b = tl.load(w_ptr + wtap + co[:, None] * swo + wcol, mask=km[:, None] & cmask[None, :], other=0.0)
            acc = _conv.mma(a, b, acc)
        chan = g * cig + cols
    xoff = (n64 * sxn + xd.to(tl.int64) * sxd + xh.to(tl.int64) * sxh + xw.to(tl.int64) * sxw)[:, None] \
        + chan[None, :].to(tl.int64) * sxc
    tl.store(dx_ptr + xoff, _to_out(acc, dx_ptr), mask=valid[:, None] & cmask[None, :])


HEADER = 13  # int32 words per phase of the tap table


def _dim_taps(k: int, d: int, s: int, p: int, r: int):
    """The taps of one dim reaching the inputs of residue r: (count, first kk, step between kk,
    dy shift of the first, shift decrement per step).  kk*d = r (mod s) is an arithmetic
    progression in kk; the shift (i0 + p - kk*d) / s of input i0 = (r - p) mod s is exact."""
    sols = [kk for kk in range(k) if (kk * d - r) % s == 0]
    if not sols:
        return 0, 0, 0, 0, 0
    step = sols[1] - sols[0] if len(sols) > 1 else 0
    assert all(b - a == step for a, b in zip(sols, sols[1:])), sols
    i0 = (r - p) % s
    assert (i0 + p - sols[0] * d) % s == 0 and (step * d) % s == 0
    return len(sols), sols[0], step, (i0 + p - sols[0] * d) // s, step * d // s


def tap_table(g: _conv.Geo3, sw: tuple):
    """(int32 [phases, HEADER], every tap's weight offset): per phase, its tap count and how to
    make tap ti = ((jd * cnth) + jh) * cntw + jw (taps in (kd, kh, kw) order, the product of each
    dim's progression): [ntaps, cntw, cnth, dy shifts of tap 0 (d, h, w), shift decrements per
    step (d, h, w), weight offset of tap 0, weight offset increments per step (d, h, w)]."""
    import numpy as np
    from itertools import product as cartesian

    phases = list(cartesian(*(range(s) for s in g.s)))
    tab = np.zeros((len(phases), HEADER), dtype=np.int64)
    offsets = []
    for i, r in enumerate(phases):
        dims = [_dim_taps(*args) for args in zip(g.k, g.d, g.s, g.p, r)]
        cnt = [t[0] for t in dims]
        wstep = [t[2] * sw[2 + j] for j, t in enumerate(dims)]
        w0 = sum(t[1] * sw[2 + j] for j, t in enumerate(dims))
        tab[i] = [cnt[0] * cnt[1] * cnt[2], cnt[2], cnt[1], *(t[3] for t in dims), *(t[4] for t in dims), w0, *wstep]
        offsets += [w0 + sum(j * ws for j, ws in zip(js, wstep)) for js in cartesian(*(range(c) for c in cnt))]
    assert np.abs(tab).max(initial=0) < 2**31
    return tab.astype(np.int32).reshape(-1), offsets


# ============================================================================= planning


def _ew(g: _conv.Geo3) -> bool:
    return g.cig * g.cog < EW_MAX


def candidates(g: _conv.Geo3, itemsize: int, device_type: str, unit_channels: bool = True) -> list:
    """Tiles (BM positions, BN channels, BK output channels) tried for this geometry, default first,
    none that fits it (_fit) as an earlier one does."""
    if device_type == "cpu":  # the interpreter
        cands = [_conv.Tile(128, 16, 16, 1, 1)] if not _ew(g) else [_conv.Tile(2048, 16, 1, 1, 1)]
    elif _ew(g):  # bm: elements of the tile (rows = bm / channels), bn: channels at most
        cands = [_conv.Tile(1024, 64, 1, 4, 1), _conv.Tile(2048, 64, 1, 8, 1), _conv.Tile(512, 32, 1, 4, 1),
                 _conv.Tile(2048, 128, 1, 8, 1)]
    else:
        # unit_channels: dy's and w's channel strides are 1, so the tiles' loads vectorise along channels
        cands = _conv.gemm_candidates(itemsize) if unit_channels else _conv.gather_candidates(itemsize)
    return _conv.distinct(cands, lambda t: _fit(t, g))


def _fit(tile: _conv.Tile, g: _conv.Geo3) -> _conv.Tile:
    """Shrink the channel blocks to the group's channels (tl.dot needs 16 at least)."""
    if _ew(g):  # no tl.dot: any power of two; the tile keeps its element count
        bn = min(tile.bn, 1 << (g.cin - 1).bit_length())
        return _conv.Tile(max(16, tile.bm // bn), bn, 1, tile.warps, tile.stages)
    bn = min(tile.bn, max(16, 1 << (g.cig - 1).bit_length()))
    bk = min(tile.bk, max(16, 1 << (g.cog - 1).bit_length()))
    warps = tile.warps if tile.bm * bn >= 128 * 64 else min(tile.warps, 4)
    return _conv.Tile(tile.bm, bn, bk, warps, tile.stages)


class _Launch:
    """The kernel's launch with its tap table (a tensor the plan owns) appended.  Staged (`stage`:
    the Repacks of dy and w to channels last and of the kernel's channels-last dx back), it runs
    on the layer's staging buffers (_conv.Staging).  dx is staged too: written in place in
    channels first, a tile's stores are scattered (one 64-bit address per element), and the
    large tiles spill."""

    __slots__ = ("launch", "taps", "stage")

    def __init__(self, launch, taps, stage=None):
        self.launch, self.taps, self.stage = launch, taps, stage

    def __call__(self, dy, w, dx):
        if self.stage is None:
            self.launch(dy, w, dx, self.taps)
            return
        stage = self.stage
        bufs = stage.buffers(dy, w, dx)
        out = dx if bufs[2] is None else bufs[2]
        self.launch(stage.operand(0, dy, bufs), stage.operand(1, w, bufs), out, self.taps)
        if bufs[2] is not None:
            stage[2](bufs[2], dx)


def _plan(dy, w, dx, params, channels_last: bool, tune: bool, force: int | None = None):
    import torch

    g = _conv.geometry3(dx.shape, dy.shape, w.shape, params, channels_last)
    if dx.numel() == 0:
        return None
    sy, sw, sx = _conv.strides5(dy, channels_last), _conv.wstrides5(w, channels_last), _conv.strides5(dx, channels_last)
    phases = prod(g.s)
    t = tuple(cdiv(i, s) for i, s in zip(g.inp, g.s))
    rows = g.n * prod(t)
    item = dy.element_size()
    # Channels first, tensor-core path: stage dy and w to channels last (see _conv.Repack).
    stage = None
    if (not channels_last and not _ew(g) and _conv.repackable(dy, g.n, g.cout) and _conv.repackable(w, g.cout, g.cig)
            and _conv.repackable(dx, g.n, prod(g.inp))):
        stage = _conv.Staging(_conv.Repack(g.n, g.cout, prod(g.out)), _conv.Repack(g.cout, g.cig, prod(g.k)),
                              _conv.Repack(g.n, prod(g.inp), g.cin))
        sy, sw, sx = (_conv.staged_strides5(sy, g.cout), _conv.staged_strides5(sw, g.cig),
                      _conv.staged_strides5(sx, g.cin))

    tab, offsets = tap_table(g, sw)
    wvec = 16 // item if all(o % (16 // item) == 0 for o in offsets) else 1
    taps = torch.from_numpy(tab).to(dy.device)

    def build(tile):
        tile = _fit(tile, g)
        nrb = cdiv(rows, tile.bm)
        ncb = cdiv(g.cin if _ew(g) else g.cig, tile.bn)
        values = dict(N=g.n, ID=g.inp[0], IH=g.inp[1], IW=g.inp[2], OD=g.out[0], OH=g.out[1], OW=g.out[2],
                      SD=g.s[0], SH=g.s[1], SW=g.s[2], PD=g.p[0], PH=g.p[1], PW=g.p[2],
                      TD=t[0], TH=t[1], TW=t[2], nrb=nrb, ncb=ncb, cin=g.cin, cig=g.cig, cog=g.cog, trow=HEADER,
                      syn=sy[0], syc=sy[1], syd=sy[2], syh=sy[3], syw=sy[4], swo=sw[0], swi=sw[1],
                      sxn=sx[0], sxc=sx[1], sxd=sx[2], sxh=sx[3], sxw=sx[4],
                      BM=tile.bm, BN=tile.bn, BK=tile.bk, EW=_ew(g), IS_F64=item == 8,
                      WVEC=wvec)
        grid = (phases * nrb, ncb if _ew(g) else g.groups * ncb)
        launch = _Launch(_steps.Step(_dgrad_kernel, grid, 4, values, tile.warps, num_stages=tile.stages), taps,
                         stage)
        runner = lambda: launch(dy, w, dx)  # noqa: E731 - the tuner times the plan on this call's tensors
        runner.launch = launch
        return runner

    cls = (str(dy.dtype), _ew(g), g.k, g.s, g.d, _conv.bucket(g.cig), _conv.bucket(g.cog), _conv.bucket(rows),
           channels_last, sy[1] == 1, stage is not None)
    # Staged with channel counts off the 16-byte grid, the tiles still gather: the small tiles.
    unit = sy[1] == 1 and (stage is None or _conv.channels_aligned(g, item))
    return TUNER.pick(cls, candidates(g, item, dy.device.type, unit), build, dy.device, 2.0 * g.n * prod(g.out)
                      * g.cout * g.cig * prod(g.k), tune, force).launch


_PLANS: dict = {}


def _call(dy, w, dx, params, tune: bool) -> None:
    _conv.call(OP, _PLANS, _plan, dy, w, dx, params, tune)


def clear_plans() -> None:
    _PLANS.clear()


# ============================================================================= entry


@argcheck.register(triton_backend, OP, dtypes=DTYPES, deterministic=True)
def conv_backward_data(inputs, outs, params):
    """The op's argument checks (harness.argcheck), the kernel's own, then the launch; on a
    layout's first call it plans, and on CUDA may settle the autotuning choice."""
    _conv.check_kernel_args(OP, {"dy": inputs["dy"], "w": inputs["w"], "dx": outs["dx"]}, "dx")
    _call(inputs["dy"], inputs["w"], outs["dx"], params, True)


def _unchecked(inputs, outs, params):
    """What timed loops call: the cached plan and its launch; no checks, no tuning."""
    _call(inputs["dy"], inputs["w"], outs["dx"], params, False)


conv_backward_data.unchecked = _unchecked
