"""The launch plan of the binary_backward device code (backends/cuda/binary_backward.cuh): the one
plan both of its hosts use, the cupy backend (NVRTC) and torch_ext's CUDA op (nvcc).

From the broadcast plan (binary_backward.py: the K x RA x RB box) `plan_launch` picks the
kernel of the opt ladder rung, assigns the groups and operands to the kernel's roles, sizes the
tiles and chunks, and packs BBParams; `plan_best` does the same for the @best rung (16-byte
packs where the layout and the pointers allow, grids of one wave of resident blocks, chunk counts
that fill the wave: `_fill_waves`); `naive_words` packs the @naive kernel's, `opt2_words` the
@opt2 kernel's BBCollapsed (O's dims collapsed per tensor).  The contract (roles, slots, what
each field means) is documented at the top of the .cuh; the structs are in
backends/cuda/binary_backward_defs.h.  cupy passes the words as the kernel's by-value argument;
torch_ext passes a whole launch record (`KINDS`, `LAUNCH_WORDS`: the BBLaunch struct) to its C++
op, which only launches.

Pure Python: tested without a GPU (tests/test_cuda_compile.py runs it against an emulator of
the kernels).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from backends._plans import binary_backward as bcast
from backends._plans.binary_backward import Group, Plan

# Must match backends/cuda/binary_backward_defs.h and .cuh (tests/test_cuda_compile.py checks them).
MAX_DIMS = bcast.MAX_DIMS
BLOCK = 256
J_BATCH = 8
EW_TILE = 1024
GROUP_WORDS = 2 + MAX_DIMS + 5 * MAX_DIMS
PARAMS_WORDS = 3 * GROUP_WORDS + 12

# Launch heuristics.
BLOCKS_PER_SM = 2048 // BLOCK  # resident 256-thread blocks at full occupancy
TARGET_WAVES = 2               # aim the tile count at this many full waves
MAX_GRID_WAVES = 4             # grid-stride kernels launch at most this many waves of blocks
MAX_CHUNKS = 1024              # bound on partial rows per output
MIN_ITEMS_PER_THREAD = 8       # a chunk gives each thread at least this many rows / elements
DEFAULT_SMS = 132              # H100 SXM; only used when no device is queried

ROLE_SLOTS = {False: ("a", "b", "g", "ga", "gb"), True: ("b", "a", "g", "gb", "ga")}  # by `swap`

# ============================================================================= launch planning


@dataclass
class Launch:
    """One configured launch of the opt variant (see the .cuh contract)."""

    kind: str                   # zero | fast | ew | lk1 | lk8 | lr_stream | lr_batched
    grid: int = 0
    words: list[int] = field(default_factory=list)  # BBParams, PARAMS_WORDS int64 (not for fast/zero)
    swap: bool = False          # True: role P is b (dP = grad_b), Q is a
    nchunks: tuple[int, int] = (1, 1)  # partial rows of dP, dQ (1: written final by the kernel)
    numel_out: tuple[int, int] = (0, 0)  # numel of dP, dQ
    vectorized: bool = False    # fast and the @best kernels: 16-byte packs


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _log2_pow2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _sorted_group(grp: Group) -> Group:
    """The group's dims reordered by decreasing |g stride|, so the fastest dim in g is innermost."""
    order = sorted(range(grp.ndim), key=lambda d: -abs(grp.strides["g"][d]))
    return Group([grp.sizes[d] for d in order], {t: [s[d] for d in order] for t, s in grp.strides.items()})


def _min_g_stride(grp: Group) -> float:
    return min((abs(s) for s in grp.strides["g"]), default=float("inf"))


def pack_group(grp: Group | None, slots) -> list[int]:
    """BBGroup words: ndim, numel, size[8], stride[5][8] with strides in `slots` order."""
    grp = grp or Group()
    pad = MAX_DIMS - grp.ndim
    words = [grp.ndim, grp.numel] + list(grp.sizes) + [1] * pad
    for slot in slots:
        words += list(grp.strides[slot]) + [0] * pad
    assert len(words) == GROUP_WORDS
    return words


def pack_params(groups, slots, *, lanes=1, chunk=(1, 1, 1), nchunk=(1, 1, 1), ntiles=1, swap=False,
                numel_out=(0, 0)) -> list[int]:
    """BBParams words in field order (the struct is all long long)."""
    words = []
    for grp in groups:
        words += pack_group(grp, slots)
    words += [lanes, _log2_pow2(lanes), *chunk, *nchunk, ntiles, int(swap), *numel_out]
    assert len(words) == PARAMS_WORDS
    return words


def split_chunks(n_items: int, min_per_chunk: int, base_tiles: int, target_tiles: int,
                 multiple: int = 1) -> tuple[int, int]:
    """(number of chunks, chunk length) for splitting n_items so that base_tiles * chunks is
    at most about target_tiles (no split when base_tiles alone reaches it: partials cost a
    buffer and a second launch), each chunk has at least min_per_chunk items, there are at
    most MAX_CHUNKS, and the chunk length is a multiple of `multiple`."""
    want = target_tiles // max(base_tiles, 1)
    most = max(1, n_items // max(min_per_chunk, 1))
    n = max(1, min(want, most, MAX_CHUNKS))
    size = _ceil_div(_ceil_div(n_items, n), multiple) * multiple
    return _ceil_div(n_items, size), size


def _grid(tiles: int, num_sms: int) -> int:
    return max(1, min(tiles, num_sms * BLOCKS_PER_SM * MAX_GRID_WAVES))


def _target_blocks(num_sms: int) -> int:
    return num_sms * BLOCKS_PER_SM * TARGET_WAVES


def _plan_ew(plan: Plan, num_sms: int) -> Launch:
    k = _sorted_group(plan.k)
    ncols = k.sizes[-1]
    nrows = k.numel // ncols
    # A tensor whose fast dim is not the column dim (a transposed view) wants tiles that span
    # rows, so its sectors are reused from L1; otherwise take wide rows.
    fast_dims = {min(range(k.ndim), key=lambda d: (abs(k.strides[t][d]), -d)) for t in ROLE_SLOTS[False]}
    tc = 32 if fast_dims != {k.ndim - 1} else min(EW_TILE, max(32, next_pow2(ncols)))
    nchunk = (_ceil_div(ncols, tc), _ceil_div(nrows, EW_TILE // tc), 1)
    ntiles = nchunk[0] * nchunk[1]
    words = pack_params([k, None, None], ROLE_SLOTS[False], lanes=tc, chunk=(tc, EW_TILE // tc, 1),
                        nchunk=nchunk, ntiles=ntiles)
    return Launch("ew", _grid(ntiles, num_sms), words)


def _plan_lk(plan: Plan, k: Group, num_sms: int) -> Launch:
    """Lanes along K; U = the smaller reduced group (in registers), V = the other (rows)."""
    ra, rb = _sorted_group(plan.ra), _sorted_group(plan.rb)
    u, v = (ra, rb) if ra.numel <= rb.numel else (rb, ra)
    swap = v is rb  # P is the operand broadcast along V: b when V = RB
    j = 1 if u.numel == 1 else J_BATCH
    kw = min(32, next_pow2(k.numel))
    nw = BLOCK // kw
    n_kt = _ceil_div(k.numel, kw)
    cu = min(u.numel, j)
    n_cu = _ceil_div(u.numel, cu)
    n_cv, cv = split_chunks(v.numel, nw * MIN_ITEMS_PER_THREAD, n_kt * n_cu, _target_blocks(num_sms))
    ntiles = n_kt * n_cu * n_cv
    numel_p, numel_q = k.numel * u.numel, k.numel * v.numel  # dP keeps K, U; dQ keeps K, V
    words = pack_params([k, u, v], ROLE_SLOTS[swap], lanes=kw, chunk=(kw, cu, cv), nchunk=(n_kt, n_cu, n_cv),
                        ntiles=ntiles, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("lk1" if j == 1 else "lk8", _grid(ntiles, num_sms), words, swap, (n_cv, n_cu), (numel_p, numel_q))


def _plan_lr(plan: Plan, x: Group, x_is_ra: bool, num_sms: int) -> Launch:
    """Lanes along the reduced group X that holds grad_out's fast dim; Y = the other one."""
    y = _sorted_group(plan.rb if x_is_ra else plan.ra)
    z = _sorted_group(plan.k)
    swap = not x_is_ra  # P is the operand broadcast along X: b when X = RB
    xw = min(32, next_pow2(x.numel))
    numel_p, numel_q = z.numel * y.numel, z.numel * x.numel  # dP keeps Z, Y; dQ keeps Z, X
    if y.numel == 1:
        segs_target = num_sms * 2048 * TARGET_WAVES // xw
        n_cx, cx = split_chunks(x.numel, xw * MIN_ITEMS_PER_THREAD, z.numel, segs_target, multiple=xw)
        ntasks = n_cx * z.numel
        words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, 1, 1), nchunk=(n_cx, 1, z.numel),
                            ntiles=ntasks, swap=swap, numel_out=(numel_p, numel_q))
        return Launch("lr_stream", _grid(_ceil_div(ntasks, BLOCK // xw), num_sms), words, swap, (n_cx, 1),
                      (numel_p, numel_q))
    nw = BLOCK // xw
    cx = xw * J_BATCH
    n_cx = _ceil_div(x.numel, cx)
    n_cy, cy = split_chunks(y.numel, nw * MIN_ITEMS_PER_THREAD, n_cx * z.numel, _target_blocks(num_sms))
    ntiles = n_cx * n_cy * z.numel
    words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, cy, 1), nchunk=(n_cx, n_cy, z.numel),
                        ntiles=ntiles, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("lr_batched", _grid(ntiles, num_sms), words, swap, (n_cx, n_cy), (numel_p, numel_q))


def plan_launch(plan: Plan, num_sms: int = DEFAULT_SMS, ptrs=(0, 0, 0, 0, 0), itemsize: int = 4) -> Launch:
    """The opt variant's launch for `plan`.  `ptrs` (a, b, g, ga, gb addresses) and `itemsize`
    decide the fast path's 16-byte vectorization."""
    if plan.numel == 0:
        return Launch("zero")
    if plan.contiguous_fast_path():
        vec = all(p % 16 == 0 for p in ptrs)
        items = plan.numel // (16 // itemsize) if vec else plan.numel
        return Launch("fast", _grid(_ceil_div(max(items, 1), BLOCK), num_sms), vectorized=vec)
    if plan.no_broadcast:
        return _plan_ew(plan, num_sms)
    # Lanes go along the group that holds grad_out's fastest dim (ties: K first).
    groups = {"k": plan.k, "ra": plan.ra, "rb": plan.rb}
    lane = min((name for name, g in groups.items() if g.ndim), key=lambda name: _min_g_stride(groups[name]))
    if lane == "k":
        return _plan_lk(plan, _sorted_group(plan.k), num_sms)
    return _plan_lr(plan, _sorted_group(groups[lane]), lane == "ra", num_sms)


def naive_words(plan: Plan) -> list[int]:
    """BBParams for bb_naive: the plan's groups as they are, natural slots."""
    return pack_params([plan.k, plan.ra, plan.rb], ROLE_SLOTS[False])


def finalize_grid(n: int, num_sms: int = DEFAULT_SMS) -> int:
    return _grid(_ceil_div(n, BLOCK), num_sms)


def naive_grid(n: int) -> int:
    return max(1, min(_ceil_div(n, BLOCK), 2**31 - 1))


# ============================================================================= launch record (torch_ext)

# BB_KIND_* in binary_backward_defs.h, in order.  zero..lr_batched are the launches above; "box"
# is the CPU kernel's: no launch, the K, RA, RB groups as they are (naive_words).
KINDS = ("zero", "fast", "ew", "lk1", "lk8", "lr_stream", "lr_batched", "box", "cols", "rows", "batch", "both")
LAUNCH_HEADER_WORDS = 10  # kind, grid, vectorized, numel, nchunks[2], numel_out[2], finalize_grid[2]
LAUNCH_WORDS = LAUNCH_HEADER_WORDS + PARAMS_WORDS


def launch_record(launch: Launch, plan: Plan, num_sms: int = DEFAULT_SMS) -> list[int]:
    """BBLaunch words for `launch` (plan_launch's, for `num_sms`) of `plan`: a C++ host launches
    from these alone, stage 2 included.  Kinds that take no BBParams (zero, fast) carry the plan's
    groups as they are, so every record describes its box."""
    words = launch.words or naive_words(plan)
    stage2 = [finalize_grid(n, num_sms) if chunks > 1 else 0 for chunks, n in zip(launch.nchunks, launch.numel_out)]
    return [KINDS.index(launch.kind), launch.grid, int(launch.vectorized), plan.numel, *launch.nchunks,
            *launch.numel_out, *stage2, *words]


def box_record(plan: Plan) -> list[int]:
    """BBLaunch words for a CPU kernel: the kind (zero, fast, ew or box: how much of the box it
    must walk) and the K, RA, RB groups as they are, natural slots."""
    kind = ("zero" if plan.numel == 0 else "fast" if plan.contiguous_fast_path()
            else "ew" if plan.no_broadcast else "box")
    return [KINDS.index(kind), 0, 0, plan.numel, 1, 1, 0, 0, 0, 0, *naive_words(plan)]


# ============================================================================= @opt2 (BBCollapsed)

COLLAPSED_WORDS = 3 + 5 + 3 * 5 * MAX_DIMS  # BB_COLLAPSED_WORDS


def _out_dims(a_shape, b_shape, a_strides, b_strides, g_strides):
    """O's size > 1 dims, outer -> inner: (size, O's row-major stride, {tensor: stride})."""
    out_shape = bcast.broadcast_shape(a_shape, b_shape)
    rank = len(out_shape)

    def pad(shape, strides):
        lead = rank - len(shape)
        return (1,) * lead + tuple(shape), (0,) * lead + tuple(strides)

    a_p, a_s = pad(a_shape, a_strides)
    b_p, b_s = pad(b_shape, b_strides)
    ga_s = pad(a_shape, bcast.contiguous_strides(a_shape))[1]
    gb_s = pad(b_shape, bcast.contiguous_strides(b_shape))[1]
    div = bcast.contiguous_strides(out_shape)
    dims = []
    for d, n in enumerate(out_shape):
        if n == 1:
            continue
        dims.append((n, div[d], {"a": 0 if a_p[d] == 1 else a_s[d], "b": 0 if b_p[d] == 1 else b_s[d],
                                 "g": g_strides[d], "ga": 0 if a_p[d] == 1 else ga_s[d],
                                 "gb": 0 if b_p[d] == 1 else gb_s[d]}))
    return out_shape, dims


def collapse(dims, tensor: str) -> list[tuple[int, int, int]]:
    """(div, size, stride) of O's dims collapsed for `tensor`: dims it does not move along dropped,
    an outer dim merged into the inner one where both the tensor's strides and O's chain."""
    out: list[list[int]] = []
    for n, div, s in reversed(dims):  # inner -> outer
        st = s[tensor]
        if st == 0:
            continue
        if out and out[-1][2] * out[-1][1] == st and out[-1][0] * out[-1][1] == div:
            out[-1][1] *= n
        else:
            out.append([div, n, st])
    return [tuple(x) for x in reversed(out)]


def opt2_words(a_shape, b_shape, a_strides, b_strides, g_strides) -> tuple[list[int], tuple[bool, bool], int]:
    """(BBCollapsed words, (grad_a direct, grad_b direct), numel(O)) for the @opt2 rung."""
    out_shape, dims = _out_dims(a_shape, b_shape, a_strides, b_strides, g_strides)
    numel = 1
    for n in out_shape:
        numel *= n
    direct = tuple(all(s[t] != 0 for _, _, s in dims) for t in ("a", "b"))
    per = {t: collapse(dims, t) for t in bcast.TENSORS}
    for t, c in per.items():
        if len(c) > MAX_DIMS:
            raise ValueError(f"binary_backward: {t} has {len(c)} dims after collapsing, expected at most {MAX_DIMS}")
    words = [numel, int(direct[0]), int(direct[1])] + [len(per[t]) for t in bcast.TENSORS]
    for field_ in range(3):  # div, size, stride
        for t in bcast.TENSORS:
            col = [c[field_] for c in per[t]]
            words += col + [1 if field_ < 2 else 0] * (MAX_DIMS - len(col))
    assert len(words) == COLLAPSED_WORDS
    return words, direct, numel


# ============================================================================= @best

# Resident 256-thread blocks per SM assumed when none is measured (the cupy host asks the driver
# for each compiled kernel's figure; torch_ext plans with these).  From ptxas -v on sm_90 (NVRTC,
# f32 / bf16): bb_rows / bb_batch are built for 3 (__launch_bounds__: at most 80 registers; small
# spills in the 16-bit vectorized batch kernels), bb_cols for 4 (at most 64, one row in flight
# per thread, no spills), bb_both for 4 (at most 64, 4 rows of g in flight in 4-byte types;
# add / sub / mul / maximum / minimum spill nothing but in f64), bb_fast uses
# 30-44 registers, bb_ew 58-60, bb_lk<J = 8> and bb_lr_batched 98-116.  The grid is never more than
# one wave.
BEST_BLOCKS_PER_SM = {"fast": 5, "ew": 4, "cols": 4, "rows": 3, "batch": 3, "both": 4, "lk8": 2, "lr_batched": 2}
MIN_ROWS_PER_SLOT = 8   # bb_cols: a chunk gives each row slot at least this many rows
MIN_PACKS_PER_LANE = 2  # bb_rows, bb_both: a chunk gives each lane at least this many packs
BATCH_ROWS = 8          # BB_YT: the most rows of Y bb_both holds


def _dense_packs(group: Group, inner_names, other_groups, names, vec: int) -> bool:
    """True when `group`'s innermost dim is dense (stride 1) in every tensor of `inner_names`,
    its size is a multiple of vec, and every other stride of `names` in `group` and
    `other_groups` is a multiple of vec: then packs of vec elements along it never straddle."""
    if group.ndim == 0 or group.sizes[-1] % vec:
        return False
    if any(group.strides[t][-1] != 1 for t in inner_names):
        return False
    for grp in (group, *other_groups):
        for t in names:
            strides = grp.strides[t][:-1] if grp is group else grp.strides[t]
            if any(s % vec for s in strides):
                return False
    return True


def wave_fill(items: int, slots: int) -> float:
    """Busy fraction of `slots` workers over ceil(items / slots) rounds of equal items."""
    return items / (_ceil_div(items, slots) * slots)


def _fill_waves(base: int, most: int, slots: int) -> int:
    """The number of chunks n <= most (at most 64) for which base * n equal work items fill
    rounds of `slots` workers best: a partial last round idles the rest of the GPU (the source's
    tail wave).  Among counts within 2% of the best, the fewest (partial rows cost a buffer and a
    second launch)."""
    scores = []
    for n in range(1, min(most, 64) + 1):
        scores.append((wave_fill(base * n, slots), n))
        if base * n >= 8 * slots:  # enough rounds: the tail is small whatever n is
            break
    top = max(f for f, _ in scores)
    return min(n for f, n in scores if f >= top - 0.02)


def _plan_cols(plan: Plan, k: Group, vec_ok: bool, itemsize: int, resident) -> Launch:
    swap = plan.ra.ndim == 0  # P = the operand broadcast along R: b when R = RB
    rgrp = _sorted_group(plan.rb if swap else plan.ra)
    v = 16 // itemsize
    if not (vec_ok and _dense_packs(k, bcast.TENSORS, [rgrp], bcast.TENSORS, v)):
        v = 1
    resident = resident("cols", v > 1)
    packs = k.numel // v
    kw = min(32, next_pow2(packs))
    nw = BLOCK // kw
    n_kt = _ceil_div(packs, kw)
    most = max(1, min(MAX_CHUNKS, rgrp.numel // (nw * MIN_ROWS_PER_SLOT)))
    n_cv = _fill_waves(n_kt, most, resident)
    cv = _ceil_div(rgrp.numel, n_cv)
    n_cv = _ceil_div(rgrp.numel, cv)
    ntiles = n_kt * n_cv
    numel_p, numel_q = k.numel, k.numel * rgrp.numel
    words = pack_params([k, None, rgrp], ROLE_SLOTS[swap], lanes=kw, chunk=(kw * v, 1, cv), nchunk=(n_kt, 1, n_cv),
                        ntiles=ntiles, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("cols", min(ntiles, resident), words, swap, (n_cv, 1), (numel_p, numel_q), vectorized=v > 1)


def _plan_rows(plan: Plan, x: Group, x_is_ra: bool, vec_ok: bool, itemsize: int, resident) -> Launch:
    z = _sorted_group(plan.k)
    swap = not x_is_ra  # P is the operand broadcast along X: b when X = RB
    q_name, d_q = ("a", "ga") if swap else ("b", "gb")
    names = (q_name, "g", d_q)
    v = 16 // itemsize
    if not (vec_ok and _dense_packs(x, names, [z], names, v)):
        v = 1
    resident = resident("rows", v > 1)
    packs = x.numel // v
    xw = min(32, next_pow2(packs))
    segs_per_block = BLOCK // xw
    slots = resident * segs_per_block  # segments of one wave
    most = max(1, min(MAX_CHUNKS, packs // (xw * MIN_PACKS_PER_LANE)))
    n_cx = _fill_waves(z.numel, most, slots)
    cx = _ceil_div(packs, n_cx) * v
    n_cx = _ceil_div(x.numel, cx)
    ntasks = n_cx * z.numel
    numel_p, numel_q = z.numel, z.numel * x.numel
    words = pack_params([x, None, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, 1, 1), nchunk=(n_cx, 1, z.numel),
                        ntiles=ntasks, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("rows", min(_ceil_div(ntasks, segs_per_block), resident), words, swap, (n_cx, 1),
                  (numel_p, numel_q), vectorized=v > 1)


def _plan_both(x: Group, y: Group, z: Group, swap: bool, v: int, resident) -> Launch:
    """bb_both: a task per (z, X chunk), all of the short one-dim Y in each thread.  Segments are
    as wide as the packs allow (up to the whole block, each lane at least MIN_PACKS_PER_LANE packs),
    so that a task is a whole row of X, with dP written final and no bb_finalize launch, whenever
    the rows fill the GPU's segment slots; X is cut into chunks only when they do not."""
    resident = resident("both", v > 1)
    packs = x.numel // v
    xw = min(BLOCK, next_pow2(_ceil_div(packs, MIN_PACKS_PER_LANE)))
    segs_per_block = BLOCK // xw
    most = max(1, min(MAX_CHUNKS, packs // (xw * MIN_PACKS_PER_LANE)))
    n_cx = _fill_waves(z.numel, most, resident * segs_per_block)
    cx = _ceil_div(packs, n_cx) * v
    n_cx = _ceil_div(x.numel, cx)
    ntasks = n_cx * z.numel
    numel_p, numel_q = z.numel * y.numel, z.numel * x.numel  # dP keeps Z, Y; dQ keeps Z, X
    words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(cx, 1, 0), nchunk=(n_cx, 1, z.numel),
                        ntiles=ntasks, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("both", min(_ceil_div(ntasks, segs_per_block), resident), words, swap, (n_cx, 1),
                  (numel_p, numel_q), vectorized=v > 1)


def _plan_batch(plan: Plan, x: Group, x_is_ra: bool, vec_ok: bool, itemsize: int, resident,
                legacy: bool = False) -> Launch:
    """Both operands broadcast, lanes along X.  A short one-dim Y (numel <= BATCH_ROWS): bb_both;
    otherwise (or `legacy`) bb_batch, one pack per lane and a task per (z, XW * V x's, Y chunk)."""
    y = _sorted_group(plan.rb if x_is_ra else plan.ra)
    z = _sorted_group(plan.k)
    swap = not x_is_ra  # P is the operand broadcast along X: b when X = RB
    q_name, d_q = ("a", "ga") if swap else ("b", "gb")
    names = (q_name, "g", d_q)
    v = 16 // itemsize
    if not (vec_ok and _dense_packs(x, names, [y, z], names, v)):
        v = 1
    if not legacy and y.ndim == 1 and y.numel <= BATCH_ROWS:
        return _plan_both(x, y, z, swap, v, resident)
    resident = resident("batch", v > 1)
    packs = x.numel // v
    xw = min(32, next_pow2(packs))
    segs_per_block = BLOCK // xw
    numel_p, numel_q = z.numel * y.numel, z.numel * x.numel  # dP keeps Z, Y; dQ keeps Z, X
    n_cx = _ceil_div(packs, xw)
    most = max(1, min(MAX_CHUNKS, y.numel // MIN_ROWS_PER_SLOT))
    n_cy = _fill_waves(n_cx * z.numel, most, resident * segs_per_block)
    cy = _ceil_div(y.numel, n_cy)
    n_cy = _ceil_div(y.numel, cy)
    ntasks = n_cx * n_cy * z.numel
    words = pack_params([x, y, z], ROLE_SLOTS[swap], lanes=xw, chunk=(xw * v, cy, 0), nchunk=(n_cx, n_cy, z.numel),
                        ntiles=ntasks, swap=swap, numel_out=(numel_p, numel_q))
    return Launch("batch", min(_ceil_div(ntasks, segs_per_block), resident), words, swap, (n_cx, n_cy),
                  (numel_p, numel_q), vectorized=v > 1)


def plan_best(plan: Plan, num_sms: int = DEFAULT_SMS, ptrs=(0, 0, 0, 0, 0), itemsize: int = 4,
              blocks_per_sm=None, legacy: bool = False) -> Launch:
    """The @best rung's launch for `plan`: no atomics, 16-byte packs where the layout and the
    pointers allow, and a grid of at most one wave of resident blocks (grid-stride loops; the
    work is split so that the wave is as full as it can be).  blocks_per_sm(kind, vectorized) ->
    resident blocks per SM of that kernel (default: BEST_BLOCKS_PER_SM).  legacy: the launches
    of the first GPU runs' @best (bb_batch's y-looped mode for every Y), kept for A/B timing."""
    def resident(kind: str, vec: bool) -> int:
        bps = blocks_per_sm(kind, vec) if blocks_per_sm else BEST_BLOCKS_PER_SM.get(kind, 2)
        return num_sms * max(1, int(bps))

    if plan.numel == 0:
        return Launch("zero")
    aligned = all(p % 16 == 0 for p in ptrs)
    if plan.contiguous_fast_path():
        items = plan.numel // (16 // itemsize) if aligned else plan.numel
        return Launch("fast", max(1, min(_ceil_div(max(items, 1), BLOCK), resident("fast", aligned))),
                      vectorized=aligned)
    groups = {"k": plan.k, "ra": plan.ra, "rb": plan.rb}
    if not plan.no_broadcast:
        lane = min((name for name, g in groups.items() if g.ndim), key=lambda name: _min_g_stride(groups[name]))
        if lane == "k" and min(plan.ra.numel, plan.rb.numel) == 1:
            return _plan_cols(plan, _sorted_group(plan.k), aligned, itemsize, resident)
        if lane != "k" and (plan.rb if lane == "ra" else plan.ra).numel == 1:
            return _plan_rows(plan, _sorted_group(groups[lane]), lane == "ra", aligned, itemsize, resident)
        if lane != "k":
            return _plan_batch(plan, _sorted_group(groups[lane]), lane == "ra", aligned, itemsize, resident, legacy)
    la = plan_launch(plan, num_sms, ptrs, itemsize)  # strided no-broadcast, both reduced: the opt kernels
    la.grid = min(la.grid, resident(la.kind, False))
    return la
