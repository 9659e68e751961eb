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

Host side: plans are cached per (shapes, strides, dtype, device, geometry); a repeated call is
a dict lookup and one launch through the compiled kernel's launcher.  On CUDA the tile is
autotuned per shape class on the first checked call (_conv.Tuner); the unchecked entry never
tunes.  Nothing the oracle defines is unsupported.
"""
from __future__ import annotations

from math import prod

from backends.triton import _conv, _launch, triton_backend
from backends.triton.common import IMPORT_ERROR, byte_span, cdiv, jit, on_device, overlap, tl
from backends.triton.common import to_out as _to_out
from harness import argcheck

OP = "conv_backward_data"
DTYPES = ("f32", "f16", "bf16", "f64")
TUNER = _conv.Tuner(OP)
EW_MAX = 64   # Cin/g * Cout/g below this: the multiply-add path (a tl.dot tile would be mostly padding)


# ============================================================================= kernel


@jit
def _dgrad_kernel(dy_ptr, w_ptr, dx_ptr,
                  N, ID, IH, IW, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DLD, DLH, DLW,
                  TD, TH, TW, nrb, ncb, cin, cig, cog,
                  syn, syc, syd, syh, syw, swo, swi, swd, swh, sww, sxn, sxc, sxd, sxh, sxw,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EW: tl.constexpr,
                  IS_F64: tl.constexpr):
    """One phase's BM input positions x BN input channels of dx (see the module docstring)."""
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
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    if EW:
        # Columns: input channels of every group; co = group * cog + j for j < cog.
        cols = cb * BN + tl.arange(0, BN)
        cmask = cols < cin
        grp = cols // cig
        wcol = (cols - grp * cig).to(tl.int64) * swi + (grp * cog).to(tl.int64) * swo
        ycol = (grp * cog).to(tl.int64) * syc
        acc = tl.zeros([BM, BN], ACC)
    else:
        g = cb // ncb
        cols = (cb - g * ncb) * BN + tl.arange(0, BN)
        cmask = cols < cig
        ci = g * cig + cols
        kk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], ACC)
    for kd in range(KD):
        if (kd * DLD - rd) % SD == 0:
            cd = (i0d + PD - kd * DLD) // SD
            od = td + cd
            vd = valid & (od >= 0) & (od < OD)
            for kh in range(KH):
                if (kh * DLH - rh) % SH == 0:
                    chh = (i0h + PH - kh * DLH) // SH
                    oh = th + chh
                    vh = vd & (oh >= 0) & (oh < OH)
                    for kw in range(KW):
                        if (kw * DLW - rw) % SW == 0:
                            cw = (i0w + PW - kw * DLW) // SW
                            ow = tw + cw
                            v = vh & (ow >= 0) & (ow < OW)
                            yrow = ybase + (cd.to(tl.int64) * syd + chh.to(tl.int64) * syh + cw.to(tl.int64) * syw)
                            wtap = kd * swd + kh * swh + kw * sww  # a weight is small: int32 offsets
                            if EW:
                                m = v[:, None] & cmask[None, :]
                                for j in range(cog):
                                    a = tl.load(dy_ptr + yrow[:, None] + (ycol + j * syc)[None, :], mask=m, other=0.0)
                                    b = tl.load(w_ptr + wtap + wcol + j * swo, mask=cmask, other=0.0)
                                    acc += a.to(ACC) * b.to(ACC)[None, :]
                            else:
                                for c0 in range(0, cog, BK):
                                    co = g * cog + c0 + kk
                                    km = (c0 + kk) < cog
                                    a = tl.load(dy_ptr + yrow[:, None] + co[None, :].to(tl.int64) * syc,
                                                mask=v[:, None] & km[None, :], other=0.0)
                                    b = tl.load(w_ptr + wtap + co[:, None].to(tl.int64) * swo
                                                + cols[None, :].to(tl.int64) * swi,
                                                mask=km[:, None] & cmask[None, :], other=0.0)
                                    acc = _conv.mma(a, b, acc)
    if EW:
        chan = cols
    else:
        chan = ci
    xoff = (n64 * sxn + xd.to(tl.int64) * sxd + xh.to(tl.int64) * sxh + xw.to(tl.int64) * sxw)[:, None] \
        + chan[None, :].to(tl.int64) * sxc
    tl.store(dx_ptr + xoff, _to_out(acc, dx_ptr), mask=valid[:, None] & cmask[None, :])


# ============================================================================= planning


def _ew(g: _conv.Geo3) -> bool:
    return g.cig * g.cog < EW_MAX


def candidates(g: _conv.Geo3, itemsize: int, device_type: str) -> list:
    """Tiles (BM positions, BN channels, BK output channels) tried for this geometry, default first."""
    if device_type == "cpu":  # the interpreter
        return [_conv.Tile(128, 16, 16, 1, 1)] if not _ew(g) else [_conv.Tile(512, 16, 1, 1, 1)]
    if _ew(g):
        return [_conv.Tile(64, 64, 1, 4, 1), _conv.Tile(128, 32, 1, 4, 1), _conv.Tile(32, 128, 1, 4, 1),
                _conv.Tile(128, 64, 1, 8, 1)]
    return _conv.gemm_candidates(itemsize)


def _fit(tile: _conv.Tile, g: _conv.Geo3) -> _conv.Tile:
    """Shrink the channel blocks to the group's channels (tl.dot needs 16 at least)."""
    if _ew(g):
        bn = min(tile.bn, max(16, 1 << (g.cin - 1).bit_length()))
        return _conv.Tile(tile.bm, bn, 1, tile.warps, tile.stages)
    bn = min(tile.bn, max(16, 1 << (g.cig - 1).bit_length()))
    bk = min(tile.bk, max(16, 1 << (g.cog - 1).bit_length()))
    warps = tile.warps if tile.bm * bn >= 128 * 64 else min(tile.warps, 4)
    return _conv.Tile(tile.bm, bn, bk, warps, tile.stages)


def _plan(dy, w, dx, params, channels_last: bool, tune: bool, force: int | None = None):
    import torch  # noqa: F401 - the launch's tensors are torch's

    g = _conv.geometry3(dx.shape, dy.shape, w.shape, params, channels_last)
    if dx.numel() == 0:
        return None
    sy, sw, sx = _conv.strides5(dy, channels_last), _conv.wstrides5(w, channels_last), _conv.strides5(dx, channels_last)
    phases = prod(g.s)
    t = tuple(cdiv(i, s) for i, s in zip(g.inp, g.s))
    rows = g.n * prod(t)
    item = dy.element_size()

    def build(tile):
        tile = _fit(tile, g)
        nrb = cdiv(rows, tile.bm)
        ncb = cdiv(g.cin if _ew(g) else g.cig, tile.bn)
        values = dict(N=g.n, ID=g.inp[0], IH=g.inp[1], IW=g.inp[2], OD=g.out[0], OH=g.out[1], OW=g.out[2],
                      KD=g.k[0], KH=g.k[1], KW=g.k[2], SD=g.s[0], SH=g.s[1], SW=g.s[2],
                      PD=g.p[0], PH=g.p[1], PW=g.p[2], DLD=g.d[0], DLH=g.d[1], DLW=g.d[2],
                      TD=t[0], TH=t[1], TW=t[2], nrb=nrb, ncb=ncb, cin=g.cin, cig=g.cig, cog=g.cog,
                      syn=sy[0], syc=sy[1], syd=sy[2], syh=sy[3], syw=sy[4],
                      swo=sw[0], swi=sw[1], swd=sw[2], swh=sw[3], sww=sw[4],
                      sxn=sx[0], sxc=sx[1], sxd=sx[2], sxh=sx[3], sxw=sx[4],
                      BM=tile.bm, BN=tile.bn, BK=tile.bk, EW=_ew(g), IS_F64=item == 8)
        grid = (phases * nrb, ncb if _ew(g) else g.groups * ncb)
        launch = _launch.Launch(_dgrad_kernel, grid, 3, values, tile.warps, num_stages=tile.stages)
        runner = lambda: launch(dy, w, dx)  # noqa: E731 - the tuner times the plan on this call's tensors
        runner.launch = launch
        return runner

    cls = (str(dy.dtype), _ew(g), g.k, g.s, g.d, _conv.bucket(g.cig), _conv.bucket(g.cog), _conv.bucket(rows),
           channels_last)
    return TUNER.pick(cls, candidates(g, item, dy.device.type), build, dy.device, 2.0 * g.n * prod(g.out)
                      * g.cout * g.cig * prod(g.k), tune, force).launch


_PLANS: dict = {}
_PLANS_MAX = 256


def _pkey(params) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()
                 if k in ("stride", "padding", "dilation", "groups", "layout"))


def _call(dy, w, dx, params, tune: bool) -> None:
    key = (dy.shape, w.shape, dx.shape, dy.stride(), w.stride(), dx.stride(), dy.dtype, dy.device, _pkey(params))
    plan = _PLANS.get(key, False)
    if plan is False:
        if IMPORT_ERROR is not None:
            raise RuntimeError(f"triton {OP}: triton is not importable ({IMPORT_ERROR})")
        with on_device(dy):
            plan = _plan(dy, w, dx, params, params.get("layout", "channels_first") == "channels_last", tune)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    if plan is None:
        return
    if dy.device.type == "cuda":
        with on_device(dy):
            plan(dy, w, dx)
    else:
        plan(dy, w, dx)


def clear_plans() -> None:
    _PLANS.clear()


# ============================================================================= entry


def check_kernel_args(op: str, named: dict, out: str) -> None:
    """What the kernels need beyond the op's argument rule: one device, the output contiguous
    in its layout and sharing no memory with an input (it is written while they are read)."""
    first = next(iter(named.values()))
    for name, t in named.items():
        if t.device != first.device:
            raise ValueError(f"triton {op}: {name}.device: expected {first.device} (the device of "
                             f"{next(iter(named))}), got {t.device}")
    if first.device.type not in ("cuda", "cpu"):
        raise ValueError(f"triton {op}: device: expected cuda, or cpu under TRITON_INTERPRET=1, got {first.device}")
    if not named[out].is_contiguous():
        raise ValueError(f"triton {op}: {out}: expected a contiguous tensor, got strides {named[out].stride()}")
    if named[out].numel():
        span = byte_span(named[out])
        for name, t in named.items():
            if name != out and t.numel() and overlap(span, byte_span(t)):
                raise ValueError(f"triton {op}: {out}: expected a buffer of its own (outputs are written while "
                                 f"inputs are read), got memory shared with {name}")


@argcheck.register(triton_backend, OP, dtypes=DTYPES, deterministic=True)
def conv_backward_data(inputs, outs, params):
    """The op's argument checks (harness.argcheck), the kernel's own, then the launch; on a
    layout's first call it plans, and on CUDA may settle the autotuning choice."""
    check_kernel_args(OP, {"dy": inputs["dy"], "w": inputs["w"], "dx": outs["dx"]}, "dx")
    _call(inputs["dy"], inputs["w"], outs["dx"], params, True)


def _unchecked(inputs, outs, params):
    """What timed loops call: the cached plan and its launch; no checks, no tuning."""
    _call(inputs["dy"], inputs["w"], outs["dx"], params, False)


conv_backward_data.unchecked = _unchecked
