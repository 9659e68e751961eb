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
  (float32, float64 for f64; K = how many of dweight, dbias exist), and
  `_partials_kernel` adds the P rows in a fixed order.  With one row block (P == 1) the
  main kernel writes the outputs itself.  No atomics anywhere: deterministic.
* Strided inputs are read in place: leading dims merge where every tensor allows it; when
  more than one row dim is left (a transposed 3-D view), the row offsets of each tensor come
  from an int64 table built once per plan.  The column stride of x, dy and weight is a
  kernel argument (Triton specialises a stride of 1, so contiguous rows vectorise).
* Plans are cached per (op, shape, strides, dtype, device, which tensors exist), so a
  repeated call only checks that no output overlaps another tensor and launches.

All index math on tensor offsets is int64 (tensors over 2**31 elements work).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from backends.triton.common import IMPORT_ERROR, cdiv, interpreted, jit, on_device, p2, tl
from backends.triton.common import to_out as _to_out
from backends.triton.common import up as _up

try:  # Programmatic dependent launch (Hopper): lets stage 2 launch while the main kernel drains
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
          LN: tl.constexpr, HAS_W: tl.constexpr, IS_F64: tl.constexpr, TABLE: tl.constexpr):
    """Load a BM x BN tile: (dy, g, xhat, rstd) in the compute dtype, 0 outside the mask.

    `rows` (int64) and `cols` (int64) index the tile; `w` is the weight at `cols` (unused
    without one).
    """
    m = rmask[:, None] & cmask[None, :]
    xo = _row_offsets(rows, tab_ptr, M, 0, sx, TABLE)
    yo = _row_offsets(rows, tab_ptr, M, 1, sdy, TABLE)
    x = _up(tl.load(x_ptr + (xo[:, None] + cols[None, :] * cx), mask=m, other=0.0), IS_F64)
    dy = _up(tl.load(dy_ptr + (yo[:, None] + cols[None, :] * cdy), mask=m, other=0.0), IS_F64)
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


@jit(do_not_specialize=["M", "rows_per", "n_chunks"])
def _rows_kernel(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, ws_ptr, dw_ptr, db_ptr, tab_ptr, sums_ptr,
                 M, N, rows_per, n_chunks, ws_stride,
                 sx, sdy, sdx, smean, srstd, cx, cdy, cw,
                 LN: tl.constexpr, HAS_W: tl.constexpr, HAS_DB: tl.constexpr, IS_F64: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, CP: tl.constexpr, SPLIT: tl.constexpr,
                 TABLE: tl.constexpr, DIRECT: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """dx of a block of rows, and the block's dweight / dbias partial row (see the module docstring).

    Grid (row blocks, chunks); chunks > 1 only on the split path (SPLIT), where the row sums
    come from `sums_ptr` ([chunks, M, 2]: sum g, sum g * xhat) instead of the tile.
    """
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
                                  sx, sdy, smean, srstd, cx, cdy, w, LN, HAS_W, IS_F64, TABLE)
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
                 mask=rmask[:, None] & cmask[None, :])
        if HAS_W:
            acc_w += dy * xhat
        if HAS_DB:
            acc_b += dy
    if HAS_W:
        pw = tl.sum(acc_w, axis=0)
        if DIRECT:
            tl.store(dw_ptr + cols, _to_out(pw, dw_ptr), mask=cmask)
        else:
            tl.store(ws_ptr + (pid.to(tl.int64) * ws_stride + cols), pw, mask=cmask)
    if HAS_DB:
        pb = tl.sum(acc_b, axis=0)
        if DIRECT:
            tl.store(db_ptr + cols, _to_out(pb, db_ptr), mask=cmask)
        else:
            # dbias's partial follows dweight's in the workspace row
            tl.store(ws_ptr + (pid.to(tl.int64) * ws_stride + (N if HAS_W else 0) + cols), pb, mask=cmask)


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
                              sx, sdy, smean, srstd, cx, cdy, w, LN, HAS_W, IS_F64, TABLE)
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


@dataclass(frozen=True)
class Config:
    """Launch sizing.  GPU defaults aim at the H100; tests shrink them to force paths.

    max_block: the widest row held whole in one tile (elements; half for float64); wider rows
      take the split path in chunks of `chunk` columns.
    thread_elems: tile elements per thread (float64: half), which sets the warps of a tile.
    tile_elems: small N: rows per tile so that a tile holds at least about this many elements.
    warps_per_sm: resident warps per SM to aim for; programs = sms * (warps_per_sm // warps).
    ws_ratio: each program owns enough rows that the bytes it reads and writes are at least
      ws_ratio times its partial row's bytes (bounds the workspace and stage 2's work).
    stages: software-pipelining depth of the row loop (1: none).
    pdl: launch stage 2 as a programmatic dependent launch (sm_90, when triton supports it).
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
    stage2_cols: int = 64
    stage2_rows: int = 32
    pdl: bool = True


GPU_CONFIG = Config()
# The interpreter runs programs one after another: few, yet two, so the partials path runs too.
INTERPRETER_CONFIG = replace(GPU_CONFIG, sms=2, warps_per_sm=16, ws_ratio=0, stages=1, pdl=False)


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
    if m == 0:
        return Plan(empty=True, spans=tuple(spans), device_index=device_index)

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
    direct = parts == 1
    pdl = bool(cfg.pdl and PDL_SUPPORTED and not interpreted() and k and not direct)
    col = lambda name: (t[name].stride(-1) if t[name].shape[-1] > 1 else 1) if t[name] is not None else 1  # noqa: E731

    ints = dict(M=m, N=n, rows_per=rows_per, n_chunks=chunks, ws_stride=k * n,
                sx=row_stride["x"], sdy=row_stride["dy"], sdx=row_stride["dx"], smean=row_stride["mean"],
                srstd=row_stride["rstd"], cx=col("x"), cdy=col("dy"), cw=col("weight"))
    constexprs = dict(LN=op == LAYERNORM, HAS_W=has_w, HAS_DB=has_db, IS_F64=item == 8, BM=bm, BN=bn,
                      CP=p2(chunks), SPLIT=split, TABLE=table is not None, DIRECT=direct,
                      STAGES=max(1, cfg.stages), PDL=pdl)
    plan = Plan(empty=False, grid=(parts, chunks), ints=ints, constexprs=constexprs, num_warps=warps,
                parts=parts, k=k, ws_numel=0 if direct else parts * k * n,
                table=table, spans=tuple(spans), device_index=device_index)
    if split:
        sbm = max(1, min(cfg.tile_elems // bn, 4))
        plan.split = dict(grid=(cdiv(m, sbm), chunks), sums_numel=chunks * m * 2,
                          num_warps=_warps(sbm * bn, per_thread, cfg),
                          ints={k_: ints[k_] for k_ in ("M", "N", "sx", "sdy", "smean", "srstd", "cx", "cdy", "cw")},
                          constexprs=dict(LN=constexprs["LN"], HAS_W=has_w, IS_F64=item == 8, BM=sbm, BN=bn,
                                          TABLE=table is not None))
    if k and not direct:
        bp = min(p2(parts), cfg.stage2_rows)
        plan.stage2 = dict(grid=(cdiv(n, cfg.stage2_cols), k), num_warps=max(1, min(4, bp * cfg.stage2_cols // 256)),
                           constexprs=dict(HAS_W=has_w, BP=bp, BN=cfg.stage2_cols, PDL=pdl))
    return plan


# ============================================================================= calling

_PLANS: dict = {}
PLANS_MADE = [0]  # plans built so far (tests read it: a repeated call must not plan again)


def _stride(y):
    return None if y is None else y.stride()


def _check_overlap(op: str, plan: Plan, tensors: tuple) -> None:
    """No output may share memory with an input or another output (they are written while read)."""
    names = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")
    spans = [(i, tensors[i].data_ptr(), length) for i, length in plan.spans]
    for i, start, length in spans:
        if i < 5:
            continue  # inputs may share memory with each other
        for j, other, other_len in spans:
            if j != i and start < other + other_len and other < start + length:
                _fail(op, ValueError, names[i], "a buffer of its own (outputs are written while inputs are read)",
                      f"memory shared with {names[j]}")


def run(op: str, inputs, outs, params=None, cfg: Config | None = None, check: bool = True) -> None:
    """The op on torch tensors: `inputs` / `outs` as the op's spec names them (absent weight,
    dweight, dbias: the case has none).  `cfg` overrides the launch sizing (tests use it).
    check=False skips the per-call overlap check (the timed path, after a checked call)."""
    x = inputs["x"]
    dy = inputs["dy"]
    w = inputs.get("weight")
    mean = inputs.get("mean")
    rstd = inputs["rstd"]
    dx = outs["dx"]
    dw = outs.get("dweight")
    db = outs.get("dbias")
    tensors = (x, dy, w, mean, rstd, dx, dw, db)
    key = (op, x.shape, x.stride(), dy.stride(), _stride(w), _stride(mean), rstd.stride(), dx.stride(),
           _stride(dw), _stride(db), x.dtype, x.device, cfg)
    plan = _PLANS.get(key)
    if plan is None:
        if IMPORT_ERROR is not None:
            raise RuntimeError(f"triton {op}: triton is not importable ({IMPORT_ERROR})")
        if op == LAYERNORM and mean is None:
            _fail(op, TypeError, "mean", "a torch.Tensor", "None (missing)")
        names = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")
        default = INTERPRETER_CONFIG if x.device.type == "cpu" else GPU_CONFIG
        plan = make_plan(op, dict(zip(names, tensors)), cfg or default)
        PLANS_MADE[0] += 1
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    if check:
        _check_overlap(op, plan, tensors)
    if plan.device_index is not None:
        import torch

        if torch.cuda.current_device() != plan.device_index:
            with on_device(x):
                return _launch(plan, tensors)
    _launch(plan, tensors)


def _launch(plan: Plan, tensors: tuple) -> None:
    import torch

    x, dy, w, mean, rstd, dx, dw, db = tensors
    if plan.empty:
        for y in (dw, db):
            if y is not None:
                y.zero_()
        return
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    ws = torch.empty(plan.ws_numel, dtype=acc, device=x.device) if plan.ws_numel else dx
    tab = plan.table if plan.table is not None else x
    sums = x
    if plan.split is not None:
        s = plan.split
        sums = torch.empty(s["sums_numel"], dtype=acc, device=x.device)
        _chunk_sums_kernel[s["grid"]](x, dy, w if w is not None else x, mean if mean is not None else rstd, rstd,
                                      tab, sums, **s["ints"], **s["constexprs"], num_warps=s["num_warps"])
    _rows_kernel[plan.grid](x, dy, w if w is not None else x, mean if mean is not None else rstd, rstd, dx, ws,
                            dw if dw is not None else dx, db if db is not None else dx, tab, sums,
                            **plan.ints, **plan.constexprs, num_warps=plan.num_warps)
    s2 = plan.stage2
    if s2 is not None:
        extra = {"launch_pdl": True} if s2["constexprs"]["PDL"] else {}
        _partials_kernel[s2["grid"]](ws, dw if dw is not None else dx, db if db is not None else dx, plan.ints["N"],
                                     plan.parts, plan.ints["ws_stride"], **s2["constexprs"],
                                     num_warps=s2["num_warps"], **extra)
