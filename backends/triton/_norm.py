"""Kernels and host planning shared by the Triton layernorm_backward and rmsnorm_backward.

Per row of x (M rows of N; the leading dims are the rows), with g = weight * dy (dy when
there is no weight) and xhat = (x - mean) * rstd (rmsnorm: x * rstd):

    dx = rstd * (g - a - xhat * b),   a = mean_j g (layernorm only),   b = mean_j g * xhat
    dweight = sum over rows of dy * xhat,   dbias = sum over rows of dy

Design (memory bound: read dy and x once, write dx once):

* Rows path (p2(N) <= Config.max_block): `_rows_kernel`.  Program p owns a contiguous block
  of rows and walks it in tiles of BM rows x BN >= N columns.  One load of a tile gives the
  row sums (float32; float64 for f64 data), dx, and the tile's dy * xhat and dy, added to
  accumulators that stay in registers for the whole block.  The row loop is software
  pipelined (`num_stages`): the next tiles' loads are in flight while one computes.  Small
  N takes several rows per tile (BM > 1), so a tile still holds a few thousand elements.
* Split path (wider rows): the row is cut into C chunks of BN columns.  `_chunk_sums_kernel`
  writes the two partial row sums of each (chunk, row); `_rows_kernel` (SPLIT) then runs on
  a row-block x chunk grid and adds a row's C partial sums in a fixed order before it
  computes its chunk of dx and of the partials.  x and dy are read twice there.
* dweight / dbias: each program writes its partial row(s) into a workspace [P, K, N]
  (float32, float64 for f64; K = how many of dweight, dbias exist).  The P rows are added
  in a fixed order either by the main kernel's last programs to finish (Config.finish
  "last": a ticket counter, one launch per call, `_finish_last`) or by a second kernel
  (`_partials_kernel`, finish "kernel").  With one row block (P == 1) the main kernel
  writes the outputs itself.  No atomic adds of data anywhere: the same bits every call.
* Strided inputs are read in place: leading dims merge where every tensor allows it; when
  more than one row dim is left (a transposed 3-D view), the row offsets of each tensor come
  from an int64 table built once per plan.  The column stride of x, dy and weight is a
  kernel argument (Triton specialises a stride of 1, so contiguous rows vectorise).
* Plans are cached per (op, shape, strides, dtype, device, which tensors exist, sizing) as a
  `Call`, so a repeated call only checks that no output overlaps another tensor (the checked
  entry), allocates its workspace and launches, straight through the compiled kernels'
  launchers after the first call (backends/triton/_steps.py).  From then on a CUDA call goes
  through one closure made for its plan (`Call._make_fast`, Config.fast): each tensor's data
  pointer read once, every launch handed to triton's launcher module directly
  (`_steps.raw_launch`): half the Python of the Step-by-Step path, the same launches.
* Sizing: `Config`; $GRADORACLE_TRITON_NORM ("finish=kernel,stages=4") overrides the GPU
  defaults, so a candidate runs through the harness without a code change.

All index math on tensor offsets is int64 (tensors over 2**31 elements work).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from backends.triton import _steps
from backends.triton.common import INTERPRETER, IMPORT_ERROR, cdiv, interpreted, jit, on_device, p2, tl
from backends.triton.common import to_out as _to_out
from backends.triton.common import up as _up

try:  # Programmatic dependent launch (Hopper): lets _partials_kernel launch while the main kernel drains
    from triton.backends.nvidia.compiler import CUDAOptions as _CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    PDL_SUPPORTED = "launch_pdl" in getattr(_CUDAOptions, "__dataclass_fields__", {})
except Exception:  # noqa: BLE001 - an older or CPU-only triton: no PDL
    PDL_SUPPORTED = False
    gdc_launch_dependents = gdc_wait = None

LAYERNORM = "layernorm_backward"
RMSNORM = "rmsnorm_backward"
OPS = (LAYERNORM, RMSNORM)
# Tensors with per-row offsets, in the order of the offset table's rows.
ROW_TENSORS = ("x", "dy", "dx", "mean", "rstd")

# ============================================================================= kernels


@jit
def _row_offsets(rows, tab_ptr, M, K: tl.constexpr, stride, TABLE: tl.constexpr):
    """Element offsets of `rows` (int64) in tensor K of ROW_TENSORS: rows * stride, or the table."""
    if TABLE:
        off = tl.load(tab_ptr + K * M.to(tl.int64) + rows)
    else:
        off = rows * stride
    return off


@jit
def _tile(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, tab_ptr, rows, rmask, cols, cmask, M,
          sx, sdy, smean, srstd, cx, cdy, w,
          LN: tl.constexpr, HAS_W: tl.constexpr, IS_F64: tl.constexpr, TABLE: tl.constexpr,
          EVICT: tl.constexpr):
    """Load a BM x BN tile: (dy, g, xhat, rstd) in the compute dtype, 0 outside the mask.

    `rows` (int64) and `cols` (int64) index the tile; `w` is the weight at `cols` (unused
    without one).  EVICT: L2 eviction policy of the x and dy loads ("evict_first": streamed).
    """
    m = rmask[:, None] & cmask[None, :]
    xo = _row_offsets(rows, tab_ptr, M, 0, sx, TABLE)
    yo = _row_offsets(rows, tab_ptr, M, 1, sdy, TABLE)
    x = _up(tl.load(x_ptr + (xo[:, None] + cols[None, :] * cx), mask=m, other=0.0, eviction_policy=EVICT), IS_F64)
    dy = _up(tl.load(dy_ptr + (yo[:, None] + cols[None, :] * cdy), mask=m, other=0.0, eviction_policy=EVICT),
             IS_F64)
    rstd = _up(tl.load(rstd_ptr + _row_offsets(rows, tab_ptr, M, 4, srstd, TABLE), mask=rmask, other=0.0), IS_F64)
    if LN:
        mean = _up(tl.load(mean_ptr + _row_offsets(rows, tab_ptr, M, 3, smean, TABLE), mask=rmask, other=0.0),
                   IS_F64)
        xhat = (x - mean[:, None]) * rstd[:, None]
    else:
        xhat = x * rstd[:, None]
    # 0 outside the tile, whatever the statistics hold: a NaN mean must not reach other rows' sums
    xhat = tl.where(m, xhat, 0.0)
    if HAS_W:
        g = dy * w[None, :]
    else:
        g = dy
    return dy, g, xhat, rstd


# Spins of a finisher's wait before it gives up (each is an L2 round trip and two barriers, about
# a microsecond: seconds, where a normal wait is the tail of one kernel).
SPIN_LIMIT = tl.constexpr(1 << 22)


@jit
def _trap(x):
    """Abort the kernel (PTX trap): the launch fails with a CUDA error.  Not under the interpreter,
    which never waits (one finisher)."""
    if not INTERPRETER:
        tl.inline_asm_elementwise("trap;\n mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@jit
def _finish_last(ws_ptr, dw_ptr, db_ptr, cnt_ptr, N, ws_stride, fin_tiles, finishers,
                 HAS_W: tl.constexpr, HAS_DB: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr):
    """FINISH 2: after its partial row is stored, a program takes a ticket on cnt_ptr[0]; the
    programs that take the last `finishers` tickets add the partial rows of the whole grid,
    each for its own slice of `fin_tiles` x BC of the K * N workspace columns, in a fixed
    order (BP rows a step, a fixed tree inside a step), and write dweight / dbias.

    A finisher waits (spinning on the counter) until every program has stored its partial.
    It cannot wait forever: there are at most half as many finishers as SMs (finish_shape),
    so a program still to come always finds a slot that no waiting finisher holds (and a
    wait of seconds traps: a CUDA error, never a hang).  The last finisher done (cnt_ptr[1])
    resets both counters to 0 for the next launch on the stream.  Which program finishes a
    slice does not change its sum: the same bits every call.
    """
    parts = tl.num_programs(0)
    total = parts * tl.num_programs(1)
    # Every thread's partial is stored before one thread releases them with the ticket
    # (gpu-scope acq_rel); the broadcast of the ticket orders the reads after it.
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    first = total - finishers
    if ticket >= first:
        seen = ticket + 1
        spins = 0
        while (seen < total) & (spins < SPIN_LIMIT):
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            spins += 1
        if seen < total:
            _trap(seen)  # seconds without progress: a crash with a CUDA error, never a hang or wrong sums
        c_lo = (ticket - first).to(tl.int64) * fin_tiles * BC
        c_hi = tl.minimum(c_lo + fin_tiles * BC, ws_stride)
        for c0 in range(c_lo, c_hi, BC):
            c = c0 + tl.arange(0, BC)
            cm = c < c_hi
            acc = tl.zeros([BP, BC], ws_ptr.dtype.element_ty)
            for p0 in range(0, parts, BP):
                p = p0 + tl.arange(0, BP).to(tl.int64)
                m = (p < parts)[:, None] & cm[None, :]
                # .cg: read the partials from L2, where the other programs wrote them
                acc += tl.load(ws_ptr + (p[:, None] * ws_stride + c[None, :]), mask=m, other=0.0,
                               cache_modifier=".cg")
            s = tl.sum(acc, axis=0)
            if HAS_W:
                tl.store(dw_ptr + c, _to_out(s, dw_ptr), mask=cm & (c < N))
                if HAS_DB:  # dbias's partials follow dweight's in the workspace row
                    tl.store(db_ptr + (c - N), _to_out(s, db_ptr), mask=cm & (c >= N))
            else:
                tl.store(db_ptr + c, _to_out(s, db_ptr), mask=cm)
        done = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == finishers - 1:
            tl.atomic_xchg(cnt_ptr + 1, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


@jit(do_not_specialize=["M", "rows_per", "n_chunks", "fin_tiles", "finishers"])
def _rows_kernel(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, ws_ptr, dw_ptr, db_ptr, tab_ptr, sums_ptr,
                 cnt_ptr, M, N, rows_per, n_chunks, ws_stride, fin_tiles, finishers,
                 sx, sdy, sdx, smean, srstd, cx, cdy, cw,
                 LN: tl.constexpr, HAS_W: tl.constexpr, HAS_DB: tl.constexpr, IS_F64: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, CP: tl.constexpr, SPLIT: tl.constexpr,
                 TABLE: tl.constexpr, FINISH: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
                 FIN_BP: tl.constexpr, FIN_BC: tl.constexpr, STREAM: tl.constexpr):
    """dx of a block of rows, and the block's dweight / dbias partial row (see the module docstring).

    Grid (row blocks, chunks); chunks > 1 only on the split path (SPLIT), where the row sums
    come from `sums_ptr` ([chunks, M, 2]: sum g, sum g * xhat) instead of the tile.
    FINISH 0: one row block, the partial row is the output; 1: partial rows into the
    workspace, _partials_kernel adds them; 2: as 1, and the last programs add them
    (_finish_last, counters at cnt_ptr).  STREAM: x and dy read, dx written with streaming
    cache hints (evict first; .cs stores), so they leave L2 to the partials.
    """
    EVICT: tl.constexpr = "evict_first" if STREAM else ""
    DX_CACHE: tl.constexpr = ".cs" if STREAM else ""
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    if PDL:
        gdc_launch_dependents()  # stage 2 may launch now; it waits for this grid to finish
    pid = tl.program_id(0)
    cols = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
    cmask = cols < N
    if HAS_W:
        w = _up(tl.load(w_ptr + cols * cw, mask=cmask, other=0.0), IS_F64)
    else:
        w = cols  # unused
    r0 = pid.to(tl.int64) * rows_per
    r1 = tl.minimum(r0 + rows_per, M)
    acc_w = tl.zeros([BM, BN], ACC)
    acc_b = tl.zeros([BM, BN], ACC)
    for r in tl.range(r0, r1, BM, num_stages=STAGES):
        rows = r + tl.arange(0, BM).to(tl.int64)
        rmask = rows < r1
        dy, g, xhat, rstd = _tile(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, tab_ptr, rows, rmask, cols, cmask, M,
                                  sx, sdy, smean, srstd, cx, cdy, w, LN, HAS_W, IS_F64, TABLE, EVICT)
        if SPLIT:
            # the C chunks' partial sums of these rows, added in a fixed order
            c = tl.arange(0, CP).to(tl.int64)
            s_off = (c[None, :] * M + rows[:, None]) * 2
            sm = rmask[:, None] & (c < n_chunks)[None, :]
            b = tl.sum(tl.load(sums_ptr + s_off + 1, mask=sm, other=0.0), axis=1)
            if LN:
                a = tl.sum(tl.load(sums_ptr + s_off, mask=sm, other=0.0), axis=1)
        else:
            b = tl.sum(g * xhat, axis=1)
            if LN:
                a = tl.sum(g, axis=1)
        if LN:
            d = rstd[:, None] * (g - (a / N)[:, None] - xhat * (b / N)[:, None])
        else:
            d = rstd[:, None] * (g - xhat * (b / N)[:, None])
        do = _row_offsets(rows, tab_ptr, M, 2, sdx, TABLE)
        tl.store(dx_ptr + (do[:, None] + cols[None, :]), _to_out(d, dx_ptr),
                 mask=rmask[:, None] & cmask[None, :], cache_modifier=DX_CACHE)
        if HAS_W:
            acc_w += dy * xhat
        if HAS_DB:
            acc_b += dy
    if HAS_W:
        pw = tl.sum(acc_w, axis=0)
        if FINISH == 0:
            tl.store(dw_ptr + cols, _to_out(pw, dw_ptr), mask=cmask)
        else:
            tl.store(ws_ptr + (pid.to(tl.int64) * ws_stride + cols), pw, mask=cmask)
    if HAS_DB:
        pb = tl.sum(acc_b, axis=0)
        if FINISH == 0:
            tl.store(db_ptr + cols, _to_out(pb, db_ptr), mask=cmask)
        else:
            # dbias's partial follows dweight's in the workspace row
            tl.store(ws_ptr + (pid.to(tl.int64) * ws_stride + (N if HAS_W else 0) + cols), pb, mask=cmask)
    if FINISH == 2:
        _finish_last(ws_ptr, dw_ptr, db_ptr, cnt_ptr, N, ws_stride, fin_tiles, finishers, HAS_W, HAS_DB,
                     FIN_BP, FIN_BC)


@jit(do_not_specialize=["M"])
def _chunk_sums_kernel(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, tab_ptr, sums_ptr, M, N,
                       sx, sdy, smean, srstd, cx, cdy, cw,
                       LN: tl.constexpr, HAS_W: tl.constexpr, IS_F64: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, TABLE: tl.constexpr):
    """Split path, pass 1: sums[chunk, row] = (sum g, sum g * xhat) over the chunk's columns."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rmask = rows < M
    chunk = tl.program_id(1).to(tl.int64)
    cols = chunk * BN + tl.arange(0, BN)
    cmask = cols < N
    if HAS_W:
        w = _up(tl.load(w_ptr + cols * cw, mask=cmask, other=0.0), IS_F64)
    else:
        w = cols  # unused
    dy, g, xhat, rstd = _tile(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, tab_ptr, rows, rmask, cols, cmask, M,
                              sx, sdy, smean, srstd, cx, cdy, w, LN, HAS_W, IS_F64, TABLE, "")
    out = sums_ptr + (chunk * M + rows) * 2
    if LN:
        tl.store(out, tl.sum(g, axis=1), mask=rmask)
    tl.store(out + 1, tl.sum(g * xhat, axis=1), mask=rmask)


@jit(do_not_specialize=["parts"])
def _partials_kernel(ws_ptr, dw_ptr, db_ptr, N, parts, ws_stride,
                     HAS_W: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """Stage 2: output k (dweight, then dbias) = sum over p of ws[p, k, :], p in a fixed order."""
    if PDL:
        gdc_wait()  # the main kernel has finished and its partials are visible
    k = tl.program_id(1)
    cols = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    cm = cols < N
    base = ws_ptr + k.to(tl.int64) * N
    acc = tl.zeros([BP, BN], ws_ptr.dtype.element_ty)
    for p0 in range(0, parts, BP):
        p = p0 + tl.arange(0, BP).to(tl.int64)
        m = (p < parts)[:, None] & cm[None, :]
        acc += tl.load(base + p[:, None] * ws_stride + cols[None, :], mask=m, other=0.0)
    total = tl.sum(acc, axis=0)
    if HAS_W:
        if k == 0:
            tl.store(dw_ptr + cols, _to_out(total, dw_ptr), mask=cm)
        else:
            tl.store(db_ptr + cols, _to_out(total, db_ptr), mask=cm)
    else:
        tl.store(db_ptr + cols, _to_out(total, db_ptr), mask=cm)


# ============================================================================= planning

FINISHES = ("last", "kernel")
CONFIG_ENV = "GRADORACLE_TRITON_NORM"


@dataclass(frozen=True)
class Config:
    """Launch sizing.  GPU defaults aim at the H100; tests shrink them to force paths.

    max_block: the widest row held whole in one tile (elements; half for float64); wider rows
      take the split path in chunks of `chunk` columns.
    thread_elems: tile elements per thread (float64: half), which sets the warps of a tile.
    tile_elems: small N: rows per tile so that a tile holds at least about this many elements.
    warps_per_sm: resident warps per SM to aim for; programs = sms * (warps_per_sm // warps).
    ws_ratio: each program owns enough rows that the bytes it reads and writes are at least
      ws_ratio times its partial row's bytes (bounds the workspace and the partials' sum).
    stages: software-pipelining depth of the row loop (1: none).
    inflight: KiB of x and dy loads to keep in flight per SM (0: off): raises the pipelining
      depth above `stages` to (programs per SM) x (stages - 1) x (tile bytes) >= this, within
      inflight_smem KiB of shared memory per SM (the pipeline's buffers).
    finish: how the partial rows become dweight / dbias: "last", the last programs of the main
      kernel add them (one launch; up to `finishers` programs, at most half the SMs, each a
      slice of the columns, in tiles of fin_thread_elems per thread with up to fin_rows partial
      rows a step); "kernel", a second kernel
      (_partials_kernel: stage2_cols columns and up to stage2_rows partial rows a step).
    pdl: finish "kernel": launch it as a programmatic dependent launch (sm_90, when triton
      supports it), so it is resident and waiting when the main kernel ends.
    stream: x and dy loads evict first from L2, dx stores streamed (.cs): the partials stay in L2.
    launch: how calls reach the compiled kernels (backends/triton/_steps.py: direct, tensors, jit).
    ws_cache: keep the partials' workspace between calls (one buffer per device, stream and
      accumulator dtype, grown as needed; calls on one stream run in order, so they can share
      it) instead of a torch.empty per call.  A call during CUDA-graph capture still allocates
      its own.  Changes no kernel; the GPU work is the same, minus the allocator's.
    fast: after the first call, each call goes through one closure of the Call that reads the
      tensors' pointers once and hands every launch straight to triton's launcher
      (`_steps.raw_launch`), instead of Step by Step.  Host-side only: the same launches.
    last_below: finish "kernel" plans take finish "last" when the call moves at most this many
      bytes (x, dy and dx): below it a second launch costs the host more than the kernel runs
      (on the H100's host about 13 us a launch against a 9-12 us kernel), so the one-launch
      finish is faster for the caller although its device time is a little longer.  0: never.
    """

    sms: int = 0              # 0: the device's SM count (132 on an H100; 132 when there is no device)
    max_block: int = 8192
    chunk: int = 4096
    thread_elems: int = 16
    tile_elems: int = 2048
    max_warps: int = 16
    warps_per_sm: int = 16
    ws_ratio: int = 12
    stages: int = 3
    inflight: int = 0
    inflight_smem: int = 192
    max_stages: int = 8
    finish: str = "last"
    finishers: int = 64
    fin_thread_elems: int = 32
    fin_rows: int = 128
    stage2_cols: int = 64
    stage2_rows: int = 32
    pdl: bool = True
    stream: bool = False      # streaming cache hints on x, dy and dx (evict first)
    launch: str = ""          # "": $GRADORACLE_TRITON_LAUNCH, else direct
    ws_cache: bool = False    # reuse one workspace per device and stream (no torch.empty per call)
    fast: bool = False        # one per-call closure with raw launches once the kernels are compiled
    last_below: int = 0       # bytes: smaller calls take finish "last" instead of "kernel"


def parse_config(text: str, base: Config) -> Config:
    """`base` with the fields that `text` ("finish=kernel,stages=4,pdl=0") sets."""
    fields = {f.name: f.type for f in Config.__dataclass_fields__.values()}
    changes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in fields:
            raise ValueError(f"triton norms: ${CONFIG_ENV}: expected name=value with a name among "
                             f"{', '.join(fields)}, got {item!r}")
        kind = type(getattr(base, name))
        try:
            if kind is bool:
                if value.lower() not in ("0", "1", "true", "false", "on", "off"):
                    raise ValueError(value)
                changes[name] = value.lower() in ("1", "true", "on")
            else:
                changes[name] = kind(value)
        except ValueError:
            raise ValueError(f"triton norms: ${CONFIG_ENV}: {name}: expected a {kind.__name__}, "
                             f"got {value!r}") from None
    cfg = replace(base, **changes)
    if cfg.finish not in FINISHES:
        raise ValueError(f"triton norms: finish: expected one of {', '.join(FINISHES)}, got {cfg.finish!r}")
    return cfg


# $GRADORACLE_TRITON_NORM overrides the GPU sizing (a candidate picked without editing code).
# The H100 sweep (results/h100/triton/norms-2/): the second-kernel finish with 128x32 stage-2 tiles
# reached the bar on 16 of 28 perf shapes, the single-kernel "last" finish on fewer.
# The host A/B (results/h100/s5/, scripts/gpu/triton_norms_host.py): Step by Step costs 24-40 us of
# host time a call, so the 10-28 us calls were host-bound; the fast closure with the kept workspace
# cut that to 16-27 us with the same bits.  The one-launch finish for calls of at most 32 MiB cut the
# three 10 us calls' loop from 24-26 us to 12-19 (one launch is about 13 us of host time there); with
# it on, every full case passed on the H100 (results/h100/s6/: 120/120, 41 of them on finish "last").
LAST_BELOW = 32 << 20  # bytes moved (x, dy read, dx written): smaller calls finish in one launch
GPU_DEFAULT = Config(finish="kernel", stage2_rows=128, stage2_cols=32, fast=True, ws_cache=True,
                     last_below=LAST_BELOW)
GPU_CONFIG = parse_config(os.environ.get(CONFIG_ENV, ""), GPU_DEFAULT)
# The interpreter runs programs one after another: few, yet two, so the partials path runs too;
# one finisher (a finisher waits for the programs after it, which the interpreter runs later).
INTERPRETER_CONFIG = replace(Config(), sms=2, warps_per_sm=16, ws_ratio=0, stages=1, pdl=False, finishers=1)


@dataclass
class Plan:
    """Everything a call needs besides the tensors: the result of planning one layout."""

    empty: bool                 # no rows: dx is empty, dweight and dbias are 0
    grid: tuple = ()
    ints: dict = field(default_factory=dict)       # runtime int arguments of _rows_kernel
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 1
    parts: int = 1              # row blocks: partial rows per output
    k: int = 0                  # outputs reduced over rows (dweight, dbias)
    ws_numel: int = 0           # workspace elements (0: none, the main kernel writes the outputs)
    table: object = None        # int64 row-offset table on the device, or None
    split: dict | None = None   # _chunk_sums_kernel launch: grid, sums_numel, constexprs, num_warps
    stage2: dict | None = None  # _partials_kernel launch: grid, constexprs, num_warps
    spans: tuple = ()           # (index, bytes) of each non-empty tensor, for the overlap check
    device_index: int | None = None
    launch: str = "direct"      # launch mode of the plan's kernels (_steps.MODES)
    ws_cache: bool = False      # Config.ws_cache
    fast: bool = True           # Config.fast


_SM_COUNT: dict = {}


def sm_count(device) -> int:
    """SMs of a CUDA device (cached); 132, an H100's, for any other device (meta tensors in tests)."""
    if device.type != "cuda":
        return 132
    index = device.index if device.index is not None else 0
    if index not in _SM_COUNT:
        import torch

        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _fail(op: str, cls, what: str, expected: str, got) -> None:
    raise cls(f"triton {op}: {what}: expected {expected}, got {got}")


def merge_rows(sizes, strides: dict) -> list:
    """Leading (row) dims as [(size, {tensor: stride})], size-1 dims dropped and neighbours
    merged where every tensor's strides allow (outer stride == inner stride * inner size)."""
    merged: list = []
    for d, n in enumerate(sizes):
        if n == 1:
            continue
        st = {t: s[d] for t, s in strides.items()}
        if merged and all(merged[-1][1][t] == st[t] * n for t in st):
            merged[-1] = (merged[-1][0] * n, st)
        else:
            merged.append((n, st))
    return merged


def _offset_table(merged: list, m: int, device):
    """int64 [len(ROW_TENSORS), M]: each tensor's element offset of every row (row-major order)."""
    import torch

    rem = torch.arange(m, dtype=torch.int64)
    table = torch.zeros((len(ROW_TENSORS), m), dtype=torch.int64)
    for n, st in reversed(merged):
        idx = rem % n
        rem = rem // n
        for k, t in enumerate(ROW_TENSORS):
            table[k] += idx * st[t]
    return table.to(device)


def _warps(elems: int, per_thread: int, cfg: Config) -> int:
    return max(1, min(cfg.max_warps, elems // (32 * per_thread)))


def tile_shape(n: int, m: int, item: int, cfg: Config) -> tuple[int, int, bool]:
    """(BM, BN, split) for rows of n elements of `item` bytes."""
    limit = cfg.max_block if item <= 4 else max(1, cfg.max_block // 2)
    if p2(n) <= limit:
        bn = p2(n)
        bm = max(1, min(cfg.tile_elems // bn, p2(max(m, 1))))
        return bm, bn, False
    return 1, min(p2(cfg.chunk), limit), True


def pipeline_depth(tile_bytes: int, per_sm: int, cfg: Config) -> int:
    """Stages of the row loop for tiles of `tile_bytes` (x and dy) and `per_sm` programs per SM:
    cfg.stages, raised until cfg.inflight KiB per SM are in flight (stages - 1 tiles per
    program), within cfg.inflight_smem KiB of pipeline buffers per SM and cfg.max_stages."""
    stages = max(1, cfg.stages)
    if cfg.inflight > 0:
        per_stage = max(1, tile_bytes * per_sm)
        want = 1 + cdiv(cfg.inflight * 1024, per_stage)
        room = 1 + (cfg.inflight_smem * 1024) // per_stage
        stages = max(stages, min(want, room, cfg.max_stages))
    return stages


def finish_shape(parts: int, programs: int, width: int, warps: int, sms: int, cfg: Config,
                 one_finisher: bool) -> dict:
    """finish "last": tile (FIN_BP partial rows x FIN_BC columns: fin_thread_elems per thread of
    `warps` warps), finishers and column tiles per finisher, for `parts` partial rows of `width`
    columns written by `programs` programs on `sms` SMs.

    Finishers wait for the programs after them: at most half the SMs, so however the programs
    are placed (one per SM at least, other work on up to half of them) every program still to
    come finds a slot that no waiting finisher holds.
    """
    bp = min(p2(parts), p2(max(1, cfg.fin_rows)))
    bc = max(16, p2(max(1, cfg.fin_thread_elems * 32 * warps)) // bp)
    col_tiles = cdiv(width, bc)
    finishers = 1 if one_finisher else max(1, min(cfg.finishers, programs, col_tiles, sms // 2))
    per = cdiv(col_tiles, finishers)
    return dict(FIN_BP=bp, FIN_BC=bc, fin_tiles=per, finishers=cdiv(col_tiles, per))


def make_plan(op: str, t: dict, cfg: Config) -> Plan:
    """Plan a call from its tensors `t` (x, dy, weight, mean, rstd, dx, dweight, dbias; absent ones None).

    Checks what the kernels need beyond the op's argument checks (harness.argcheck): supported
    dtype, contiguous outputs, weight and dweight together.
    """
    import torch

    x, dx = t["x"], t["dx"]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        _fail(op, TypeError, "x.dtype", "float32, float16, bfloat16 or float64", x.dtype)
    if x.dim() < 1 or x.shape[-1] < 1:
        _fail(op, ValueError, "x.shape", "at least 1 dim and a last (normalised) dim N >= 1", tuple(x.shape))
    if (t["weight"] is None) != (t["dweight"] is None):
        _fail(op, ValueError, "weight and dweight", "both or neither", "only one of them")
    if cfg.finish not in FINISHES:
        _fail(op, ValueError, "Config.finish", " or ".join(FINISHES), repr(cfg.finish))
    for name in ("dx", "dweight", "dbias"):
        y = t[name]
        if y is not None and not y.is_contiguous():
            _fail(op, ValueError, name, "a contiguous tensor", f"strides {y.stride()}")
    shape = tuple(x.shape)
    n, rows = shape[-1], shape[:-1]
    m = 1
    for s in rows:
        m *= s
    item = x.element_size()
    has_w, has_db = t["weight"] is not None, t["dbias"] is not None
    k = int(has_w) + int(has_db)
    spans = []
    for i, name in enumerate(("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")):
        y = t[name]
        if y is not None and y.numel():
            spans.append((i, y.element_size() * (1 + sum((s - 1) * st for s, st in zip(y.shape, y.stride())))))
    device_index = x.device.index if x.device.type == "cuda" else None
    launch = _steps.default_mode() if not cfg.launch else cfg.launch
    if launch not in _steps.MODES:
        _fail(op, ValueError, "Config.launch", " or ".join(_steps.MODES), repr(launch))
    if m == 0:
        return Plan(empty=True, spans=tuple(spans), device_index=device_index, launch=launch, fast=False)

    # rows: merged leading dims; one left -> a stride per tensor, more -> an offset table
    zero = (0,) * len(rows)
    strides = {"x": x.stride()[:-1], "dy": t["dy"].stride()[:-1], "dx": dx.stride()[:-1],
               "mean": t["mean"].stride() if t["mean"] is not None else zero, "rstd": t["rstd"].stride()}
    merged = merge_rows(rows, strides)
    table = _offset_table(merged, m, x.device) if len(merged) > 1 else None
    row_stride = merged[0][1] if len(merged) == 1 else dict.fromkeys(ROW_TENSORS, 0)

    bm, bn, split = tile_shape(n, m, item, cfg)
    per_thread = cfg.thread_elems if item <= 4 else max(1, cfg.thread_elems // 2)
    warps = _warps(bm * bn, per_thread, cfg)
    chunks = cdiv(n, bn) if split else 1
    sms = cfg.sms or sm_count(x.device)
    target = max(1, sms * max(1, cfg.warps_per_sm // warps) // chunks)
    acc_item = 8 if item == 8 else 4
    min_rows = cdiv(cfg.ws_ratio * k * acc_item, 3 * item) if k else 1
    rows_per = max(cdiv(m, target), min_rows, 1)
    rows_per = cdiv(rows_per, bm) * bm
    parts = cdiv(m, rows_per)
    stages = pipeline_depth(bm * bn * item * 2, cdiv(parts * chunks, sms), cfg)
    last = cfg.finish == "last" or m * n * item * 3 <= cfg.last_below
    finish = 0 if k == 0 or parts == 1 else (2 if last else 1)
    pdl = bool(cfg.pdl and PDL_SUPPORTED and not interpreted() and finish == 1)
    # The interpreter runs programs in order: a finisher would wait for programs that never run.
    one_finisher = x.device.type == "cpu" or (interpreted() and x.device.type != "meta")
    fin = finish_shape(parts, parts * chunks, k * n, warps, sms, cfg, one_finisher) if finish == 2 else \
        dict(FIN_BP=1, FIN_BC=16, fin_tiles=0, finishers=0)
    col = lambda name: (t[name].stride(-1) if t[name].shape[-1] > 1 else 1) if t[name] is not None else 1  # noqa: E731

    ints = dict(M=m, N=n, rows_per=rows_per, n_chunks=chunks, ws_stride=k * n,
                fin_tiles=fin["fin_tiles"], finishers=fin["finishers"],
                sx=row_stride["x"], sdy=row_stride["dy"], sdx=row_stride["dx"], smean=row_stride["mean"],
                srstd=row_stride["rstd"], cx=col("x"), cdy=col("dy"), cw=col("weight"))
    constexprs = dict(LN=op == LAYERNORM, HAS_W=has_w, HAS_DB=has_db, IS_F64=item == 8, BM=bm, BN=bn,
                      CP=p2(chunks), SPLIT=split, TABLE=table is not None, FINISH=finish,
                      STAGES=stages, PDL=pdl, FIN_BP=fin["FIN_BP"], FIN_BC=fin["FIN_BC"],
                      STREAM=bool(cfg.stream))
    plan = Plan(empty=False, grid=(parts, chunks), ints=ints, constexprs=constexprs, num_warps=warps,
                parts=parts, k=k, ws_numel=0 if finish == 0 else parts * k * n,
                table=table, spans=tuple(spans), device_index=device_index, launch=launch,
                ws_cache=bool(cfg.ws_cache), fast=bool(cfg.fast))
    if split:
        sbm = max(1, min(cfg.tile_elems // bn, 4))
        plan.split = dict(grid=(cdiv(m, sbm), chunks), sums_numel=chunks * m * 2,
                          num_warps=_warps(sbm * bn, per_thread, cfg),
                          ints={k_: ints[k_] for k_ in ("M", "N", "sx", "sdy", "smean", "srstd", "cx", "cdy", "cw")},
                          constexprs=dict(LN=constexprs["LN"], HAS_W=has_w, IS_F64=item == 8, BM=sbm, BN=bn,
                                          TABLE=table is not None))
    if finish == 1:
        bp = min(p2(parts), p2(max(1, cfg.stage2_rows)))
        plan.stage2 = dict(grid=(cdiv(n, cfg.stage2_cols), k), num_warps=max(1, min(4, bp * cfg.stage2_cols // 256)),
                           ints=dict(N=n, parts=parts, ws_stride=k * n),
                           constexprs=dict(HAS_W=has_w, BP=bp, BN=cfg.stage2_cols, PDL=pdl))
    return plan


# ============================================================================= calling

_PLANS: dict = {}
PLANS_MADE = [0]  # plans built so far (tests read it: a repeated call must not plan again)
NAMES = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")


class Call:
    """A planned layout, ready to launch: `call(x, dy, w, mean, rstd, dx, dw, db)` (absent ones None).

    Holds the plan, its kernels' Steps (backends/triton/_steps.py: after the first call they
    go straight to the compiled kernels) and what a call allocates.  Per call: the device
    check, the workspace and row-sum buffers (torch.empty: the caching allocator orders them
    on the stream, so calls on other streams or in CUDA graphs never share one; Config.ws_cache
    keeps one workspace per stream instead), the ticket counters of finish "last" (per device
    and stream; every launch leaves them at zero), and one to three launches.

    `entry` is what `run` calls: `__call__` (Step by Step) until every kernel of the plan has
    been launched directly once, then (Config.fast, on CUDA) `fast`, a closure made for this
    plan that does the same launches with less Python (see `_make_fast`).
    """

    __slots__ = ("plan", "main", "split", "stage2", "acc", "device", "index", "torch", "counters", "sums_numel",
                 "current_device", "current_stream", "ws_numel", "finish_last", "entry", "fast", "fast_state",
                 "fast_calls")

    def __init__(self, plan: Plan, device, dtype):
        import torch

        self.plan, self.torch, self.device, self.index = plan, torch, device, plan.device_index
        # torch.cuda.current_device() and the stream triton's own launches use, minus their wrappers
        self.current_device = getattr(torch._C, "_cuda_getDevice", None)
        self.current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32
        self.main = self.split = self.stage2 = None
        self.counters = {}
        self.sums_numel = 0
        self.ws_numel = plan.ws_numel
        self.finish_last = bool(plan.constexprs.get("FINISH") == 2)
        self.entry = self.__call__
        self.fast = None
        # None: a fast closure may still be made (after the next call); False: never (the plan,
        # the device or this triton do not allow one, or it failed once)
        self.fast_state = None if plan.fast and plan.device_index is not None and plan.launch == "direct" else False
        self.fast_calls = [0]  # calls through `fast` (tests and reports read it)
        if plan.empty:
            return
        mode = plan.launch
        self.main = _steps.Step(_rows_kernel, plan.grid, 12, {**plan.ints, **plan.constexprs}, plan.num_warps,
                                mode)
        if plan.split is not None:
            s = plan.split
            self.sums_numel = s["sums_numel"]
            self.split = _steps.Step(_chunk_sums_kernel, s["grid"], 7, {**s["ints"], **s["constexprs"]},
                                     s["num_warps"], mode)
        if plan.stage2 is not None:
            s = plan.stage2
            extra = {"launch_pdl": True} if s["constexprs"]["PDL"] else {}
            self.stage2 = _steps.Step(_partials_kernel, s["grid"], 3, {**s["ints"], **s["constexprs"]},
                                      s["num_warps"], mode, **extra)

    def __call__(self, x, dy, w, mean, rstd, dx, dw, db) -> None:
        # triton launches on the current device: switch only when needed (it costs microseconds)
        if self.index is not None and self.current_device() != self.index:
            with self.torch.cuda.device(self.index):
                return self.launch(x, dy, w, mean, rstd, dx, dw, db)
        self.launch(x, dy, w, mean, rstd, dx, dw, db)
        if self.fast_state is None:
            self._try_fast((x, dy, w, mean, rstd, dx, dw, db))

    def launch(self, x, dy, w, mean, rstd, dx, dw, db) -> None:
        main = self.main
        if main is None:  # no rows
            for y in (dw, db):
                if y is not None:
                    y.zero_()
            return
        stream = None if self.index is None else self.current_stream(self.index)
        if self.split is not None or self.stage2 is not None or self.plan.table is not None:
            main_args, split = self.operands(x, dy, w, mean, rstd, dx, dw, db, stream)
            if split is not None:
                self.split(*split, stream=stream)
            main(*main_args, stream=stream)
            if self.stage2 is not None:
                self.stage2(main_args[6], main_args[7], main_args[8], stream=stream)
            return
        # the common plan (one launch, contiguous rows): the operands inline, nothing looked up twice
        ws = self.workspace(stream) if self.ws_numel else dx
        cnt = x
        if self.finish_last:
            cnt = self.counters.get(stream)
            if cnt is None:
                cnt = self.counters[stream] = _counters(self.device, stream)
        main(x, dy, x if w is None else w, rstd if mean is None else mean, rstd, dx, ws, dx if dw is None else dw,
             dx if db is None else db, x, x, cnt, stream=stream)

    def workspace(self, stream):
        """The partials' workspace of a call on `stream`: fresh from the caching allocator, or
        (plan.ws_cache, not while a CUDA graph is being captured) the stream's kept one."""
        if self.plan.ws_cache:
            return _workspace(self.device, stream, self.ws_numel, self.acc)
        return self.torch.empty(self.ws_numel, dtype=self.acc, device=self.device)

    def operands(self, x, dy, w, mean, rstd, dx, dw, db, stream):
        """The tensor arguments of the main kernel and of _chunk_sums_kernel (None: not launched):
        the workspace and row-sum buffers allocated, stand-ins for absent tensors (pointers
        the kernels never dereference), the ticket counters of the stream."""
        plan, empty = self.plan, self.torch.empty
        w = x if w is None else w
        mean = rstd if mean is None else mean
        dw = dx if dw is None else dw
        db = dx if db is None else db
        ws = self.workspace(stream) if plan.ws_numel else dx
        tab = x if plan.table is None else plan.table
        sums = x
        split = None
        if self.split is not None:
            sums = empty(self.sums_numel, dtype=self.acc, device=self.device)
            split = (x, dy, w, mean, rstd, tab, sums)
        cnt = x
        if plan.constexprs["FINISH"] == 2:
            cnt = self.counters.get(stream)
            if cnt is None:
                cnt = self.counters[stream] = _counters(self.device, stream)
        return (x, dy, w, mean, rstd, dx, ws, dw, db, tab, sums, cnt), split

    # ------------------------------------------------------------------ the fast path

    def _try_fast(self, tensors: tuple) -> None:
        """Make `fast` and route calls through it, once every Step of the plan launches directly
        (an aligned first call on CUDA) and this triton allows raw launches; give up for good
        where it never will."""
        steps = [s for s in (self.split, self.main, self.stage2) if s is not None]
        if any(s.runner is None for s in steps):
            return  # not launched directly yet (a misaligned first call): try after the next call
        chains = _steps.hook_chains()
        goes = [s.raw() for s in steps]
        if chains is None or not all(goes) or _steps._data_ptr is None:
            self.fast_state = False
            return
        self.fast = self._make_fast(tensors, goes, chains)
        self.fast_state = True
        self.entry = self.fast

    def _make_fast(self, tensors: tuple, goes: list, chains: tuple):
        """The per-call closure of this plan: `fast(x, dy, w, mean, rstd, dx, dw, db)`.

        Which tensors exist is fixed by the plan cache key (None for absent ones), so the
        closure reads each present tensor's data pointer once, into one list with the
        workspace, the row sums, the offset table and the stream's counters after them, and
        gives each launch its arguments by index into that list (absent ones: the same
        stand-ins as `operands`), then the Step's fixed tail.  Whatever it does not handle
        goes through `__call__`: another device current, a launch hook registered, a pointer
        off the 16-byte alignment the kernels were compiled for.
        """
        from functools import reduce
        from operator import itemgetter, or_

        plan, torch_empty, acc, device = self.plan, self.torch.empty, self.acc, self.device
        present = tuple(i for i, t in enumerate(tensors) if t is not None)
        pos = {name: present.index(i) for i, name in enumerate(NAMES) if i in present}
        n = len(present)
        ws_numel, sums_numel = plan.ws_numel, self.sums_numel
        table = plan.table
        extra = {}
        for name, wanted in (("ws", ws_numel), ("sums", sums_numel), ("tab", table is not None),
                             ("cnt", self.finish_last)):
            if wanted:
                extra[name] = n + len(extra)
        at = {**pos, **extra}
        x_, rstd_, dx_ = at["x"], at["rstd"], at["dx"]
        w_, mean_ = at.get("weight", x_), at.get("mean", rstd_)
        dw_, db_ = at.get("dweight", dx_), at.get("dbias", dx_)
        ws_, sums_, tab_, cnt_ = at.get("ws", dx_), at.get("sums", x_), at.get("tab", x_), at.get("cnt", x_)
        args_of = {
            "split": (x_, at["dy"], w_, mean_, rstd_, tab_, sums_),
            "main": (x_, at["dy"], w_, mean_, rstd_, dx_, ws_, dw_, db_, tab_, sums_, cnt_),
            "stage2": (ws_, dw_, db_),
        }
        named = [(k, s) for k, s in (("split", self.split), ("main", self.main), ("stage2", self.stage2)) if s]
        launches = tuple((go, itemgetter(*args_of[k]), s.tail) for go, (k, s) in zip(goes, named))
        pick = itemgetter(*present)
        data_ptr = _steps._data_ptr
        index, current_device, current_stream = self.index, self.current_device, self.current_stream
        enter, leave = chains
        tab_ptr = table.data_ptr() if table is not None else 0
        counters, finish_last, ws_cache = {}, self.finish_last, plan.ws_cache
        slow, counted = self.__call__, self.fast_calls

        def fast(*t):
            if current_device() != index or enter.calls or leave.calls:
                return slow(*t)
            ptrs = list(map(data_ptr, pick(t)))
            if reduce(or_, ptrs) & (_steps.ALIGN - 1):
                return slow(*t)
            stream = current_stream(index)
            if ws_numel:  # kept alive until the launches are queued (the allocator orders its reuse)
                ws = _workspace(device, stream, ws_numel, acc) if ws_cache else \
                    torch_empty(ws_numel, dtype=acc, device=device)
                ptrs.append(ws.data_ptr())
            if sums_numel:
                sums = torch_empty(sums_numel, dtype=acc, device=device)
                ptrs.append(sums.data_ptr())
            if tab_ptr:
                ptrs.append(tab_ptr)
            if finish_last:
                cnt = counters.get(stream)
                if cnt is None:
                    cnt = counters[stream] = _counters(device, stream).data_ptr()
                ptrs.append(cnt)
            try:
                for go, gather, tail in launches:
                    go(stream, gather(ptrs) + tail)
            except TypeError:  # a launcher that takes other arguments (caught on the first launch)
                self.entry, self.fast_state = slow, False
                return slow(*t)
            counted[0] += 1

        return fast

    def warmup(self, x, dy, w, mean, rstd, dx, dw, db) -> None:
        """Compile (or find in triton's caches) every kernel of the plan for tensors like these; launch nothing."""
        if self.plan.empty:
            return
        main, split = self.operands(x, dy, w, mean, rstd, dx, dw, db, None)
        if split is not None:
            self.split.warmup(*split)
        self.main.warmup(*main)
        if self.stage2 is not None:
            self.stage2.warmup(main[6], main[7], main[8])

    def launches(self) -> dict:
        """The plan's Launches by name (reports read their compiled kernels)."""
        return {k: v for k, v in (("main", self.main), ("chunk_sums", self.split), ("stage2", self.stage2)) if v}


_COUNTERS: dict = {}
_WORKSPACES: dict = {}
_TORCH = []  # torch, imported on the first kept workspace


def _workspace(device, stream, numel: int, dtype):
    """Config.ws_cache: the workspace kept for (device, stream, dtype), grown to `numel` when
    smaller; a fresh one while the stream is being captured into a CUDA graph (a graph must own
    its buffers: a kept one would be shared by its replays and the eager calls)."""
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    torch = _TORCH[0]
    if device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(numel, dtype=dtype, device=device)
    key = (device.type, device.index, stream, dtype)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < numel:  # the old one's queued uses are on this stream: freed in order
        ws = _WORKSPACES[key] = torch.empty(numel, dtype=dtype, device=device)
    return ws


def _counters(device, stream):
    """Two int32 zeros per device and stream: finish "last"'s tickets (kernels leave them at 0)."""
    key = (device.type, device.index, stream)
    c = _COUNTERS.get(key)
    if c is None:
        import torch

        c = _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return c


def _check_overlap(op: str, plan: Plan, tensors: tuple) -> None:
    """No output may share memory with an input or another output (they are written while read)."""
    spans = [(i, tensors[i].data_ptr(), length) for i, length in plan.spans]
    for i, start, length in spans:
        if i < 5:
            continue  # inputs may share memory with each other
        for j, other, other_len in spans:
            if j != i and start < other + other_len and other < start + length:
                _fail(op, ValueError, NAMES[i], "a buffer of its own (outputs are written while inputs are read)",
                      f"memory shared with {NAMES[j]}")


def _key(op: str, tensors: tuple, cfg) -> tuple:
    """The plan cache key of a call: the layout of every tensor (None for absent ones), dtype, device."""
    x, dy, w, mean, rstd, dx, dw, db = tensors
    return (op, x.shape, x.stride(), dy.stride(), None if w is None else w.stride(),
            None if mean is None else mean.stride(), rstd.stride(), dx.stride(), None if dw is None else dw.stride(),
            None if db is None else db.stride(), x.dtype, x.device, cfg)


def prepare(op: str, tensors: tuple, cfg: Config | None = None) -> Call:
    """The Call of these tensors' layout (x, dy, weight, mean, rstd, dx, dweight, dbias), planned
    on its first call."""
    key = _key(op, tensors, cfg)
    call = _PLANS.get(key)
    if call is None:
        call = _new_call(key, op, tensors, cfg)
    return call


def _new_call(key: tuple, op: str, tensors: tuple, cfg: Config | None) -> Call:
    if IMPORT_ERROR is not None:
        raise RuntimeError(f"triton {op}: triton is not importable ({IMPORT_ERROR})")
    x, mean = tensors[0], tensors[3]
    if op == LAYERNORM and mean is None:
        _fail(op, TypeError, "mean", "a torch.Tensor", "None (missing)")
    default = INTERPRETER_CONFIG if x.device.type == "cpu" else GPU_CONFIG
    with on_device(x):
        call = Call(make_plan(op, dict(zip(NAMES, tensors)), cfg or default), x.device, x.dtype)
    PLANS_MADE[0] += 1
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = call
    return call


def run(op: str, inputs, outs, params=None, cfg: Config | None = None, check: bool = True) -> None:
    """The op on torch tensors: `inputs` / `outs` as the op's spec names them (absent weight,
    dweight, dbias: the case has none).  `cfg` overrides the launch sizing (tests use it).
    check=False skips the per-call overlap check (the timed path, after a checked call)."""
    tensors = (inputs["x"], inputs["dy"], inputs.get("weight"), inputs.get("mean"), inputs["rstd"],
               outs["dx"], outs.get("dweight"), outs.get("dbias"))
    call = _PLANS.get(_key(op, tensors, cfg))
    if call is None:
        call = prepare(op, tensors, cfg)
    if check:
        _check_overlap(op, call.plan, tensors)
    call.entry(*tensors)
