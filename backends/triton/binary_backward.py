"""binary_backward as Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1).

Design (see backends/_plans/binary_backward.py for the K / RA / RB box):

* No broadcast and every tensor contiguous: `_flat_kernel`, one elementwise pass in flat
  1-D blocks.
* Otherwise `_tile_kernel` walks the K x RA x RB box in 3-D tiles.  Tile axis 2 holds the
  class in which grad_out is contiguous, so loads along it coalesce (and vectorise when
  the host can prove alignment).  Each program owns one K block, one block of the
  "fixed" reduced class S and a chunk of blocks of the "looped" reduced class L:
  it keeps the gradient that sums over L in registers across the chunk, and writes the
  gradient that sums over S once per L block.  Both gradients come from one read of
  grad_out.  When one program covers a whole reduction, it writes the output directly;
  otherwise it writes float32 (float64) partials and `_sum_partials_kernel` adds them
  in a fixed order: deterministic, no atomics.
* All index math is int64, so tensors over 2**31 elements work.

Per-class dim sizes and strides travel in a small int64 tensor (the "descriptor"),
so one compiled kernel serves every shape; it is cached per layout and device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from backends._plans import binary_backward as bcast
from backends.triton import triton_backend
from backends.triton.common import IMPORT_ERROR, byte_span, cdiv, check, interpreted, jit, on_device, overlap, p2, tl  # noqa: F401
from backends.triton.common import to_out as _to_out
from backends.triton.common import up as _up
from harness import argcheck
from harness.registry import DEFAULT_VARIANT
from oracle.binary_backward import FNS

OP = "binary_backward"
DTYPES = ("f32", "f16", "bf16", "f64")

# ============================================================================= kernels


@jit
def _pow(x, y):
    """Real x**y as IEEE pow defines it, from exp2/log2 (libdevice pow is not in the interpreter)."""
    r = tl.exp2(y * tl.log2(tl.abs(x)))
    y_int = tl.floor(y) == y
    y_odd = y_int & (tl.floor(y * 0.5) * 2.0 != y)
    r = tl.where(x < 0, tl.where(y_int, tl.where(y_odd, -r, r), float("nan")), r)
    return tl.where((y == 0) | (x == 1), 1.0, r)


@jit
def _partials(a, b, FN: tl.constexpr):
    """df/da, df/db for the fns that need the inputs (add and sub never load them)."""
    if FN == "mul":
        da = b
        db = a
    elif FN == "div":
        da = 1.0 / b
        db = -a / (b * b)
    elif FN == "pow":
        da = b * _pow(a, b - 1.0)
        db = tl.where((a == 0) & (b >= 0), 0.0, _pow(a, b) * tl.log(a))
    else:  # maximum / minimum: ties split the gradient 1/2 : 1/2
        if FN == "maximum":
            wins = a > b
        else:
            wins = a < b
        da = tl.where(a == b, 0.5, tl.where(wins, 1.0, 0.0))
        db = 1.0 - da
    return da, db


@jit
def _flat_kernel(a_ptr, b_ptr, g_ptr, ga_ptr, gb_ptr, n,
                 FN: tl.constexpr, IS_F64: tl.constexpr, BLOCK: tl.constexpr):
    """No broadcast, all contiguous: grad_a = g * da, grad_b = g * db elementwise."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = _up(tl.load(g_ptr + offs, mask=m, other=0.0), IS_F64)
    if FN == "add":
        ta = g
        tb = g
    elif FN == "sub":
        ta = g
        tb = -g
    else:
        a = _up(tl.load(a_ptr + offs, mask=m, other=1.0), IS_F64)
        b = _up(tl.load(b_ptr + offs, mask=m, other=1.0), IS_F64)
        da, db = _partials(a, b, FN)
        ta = g * da
        tb = g * db
    tl.store(ga_ptr + offs, _to_out(ta, ga_ptr), mask=m)
    tl.store(gb_ptr + offs, _to_out(tb, gb_ptr), mask=m)


@jit
def _place(v, AX: tl.constexpr):
    """A 1-D block vector as axis AX of the 3-D tile (size 1 on the other axes)."""
    if AX == 0:
        r = v[:, None, None]
    elif AX == 1:
        r = v[None, :, None]
    else:
        r = v[None, None, :]
    return r


@jit
def _unravel(idx, desc_ptr, BASE: tl.constexpr, ND: tl.constexpr, AL: tl.constexpr):
    """Element offsets in a, b, g, ga, gb of flat index idx (row-major) over ND dims of a class.

    Descriptor row per dim, from BASE: size, then the strides of a, b, g, ga, gb.
    AL packs, 4 bits per tensor (a, b, g, ga, gb), log2 of a power of two that the host
    proved divides these strides.  The hint sits on the loaded strides: a hint on a sum can
    vanish when the compiler folds the sum away.
    """
    zero = idx * 0
    oa = zero
    ob = zero
    og = zero
    oga = zero
    ogb = zero
    for i in tl.static_range(ND):
        row = desc_ptr + BASE + 6 * (ND - 1 - i)
        if i == ND - 1:
            c = idx  # the outermost dim needs no modulo
        else:
            n = tl.load(row)
            c = idx % n
            idx = idx // n
        oa += c * tl.multiple_of(tl.load(row + 1), 1 << (AL & 15))
        ob += c * tl.multiple_of(tl.load(row + 2), 1 << ((AL >> 4) & 15))
        og += c * tl.multiple_of(tl.load(row + 3), 1 << ((AL >> 8) & 15))
        oga += c * tl.multiple_of(tl.load(row + 4), 1 << ((AL >> 12) & 15))
        ogb += c * tl.multiple_of(tl.load(row + 5), 1 << ((AL >> 16) & 15))
    return oa, ob, og, oga, ogb


@jit
def _class_block(j, desc_ptr, BASE: tl.constexpr, ND: tl.constexpr, numel, B: tl.constexpr,
                 FAST: tl.constexpr, cols, ncb, AL: tl.constexpr):
    """Offsets (a, b, g, ga, gb) and mask of block j (B elements) of one class.

    FAST (the class on tile axis 2 only): blocks never straddle its last dim, which has
    unit stride, so offsets are a row start plus arange(B) and the compiler sees contiguity.
    """
    if FAST:
        row = j // ncb
        col = (j - row * ncb) * B + tl.arange(0, B)
        ra, rb, rg, rga, rgb = _unravel(row, desc_ptr, BASE, ND - 1, AL)
        oa = ra + col
        ob = rb + col
        og = rg + col
        oga = rga + col
        ogb = rgb + col
        m = col < cols
    else:
        idx = j * B + tl.arange(0, B)
        oa, ob, og, oga, ogb = _unravel(idx, desc_ptr, BASE, ND, AL)
        m = idx < numel
    return oa, ob, og, oga, ogb, m


@jit
def _tile_terms(a_ptr, b_ptr, g_ptr, k_a, k_b, k_g, k_m, ra_b, ra_g, ra_m, rb_a, rb_g, rb_m,
                AX_K: tl.constexpr, AX_A: tl.constexpr, AX_B: tl.constexpr,
                FN: tl.constexpr, IS_F64: tl.constexpr):
    """t_a = g * df/da and t_b = g * df/db on one tile, 0 outside the box.

    a is loaded without the RA axis and b without the RB axis (they are constant there).
    """
    gm = _place(k_m, AX_K) & _place(ra_m, AX_A) & _place(rb_m, AX_B)
    g_off = _place(k_g, AX_K) + _place(ra_g, AX_A) + _place(rb_g, AX_B)
    g = _up(tl.load(g_ptr + g_off, mask=gm, other=0.0), IS_F64)
    if FN == "add":
        ta = g
        tb = g
    elif FN == "sub":
        ta = g
        tb = -g
    else:
        am = _place(k_m, AX_K) & _place(rb_m, AX_B)
        bm = _place(k_m, AX_K) & _place(ra_m, AX_A)
        a = _up(tl.load(a_ptr + (_place(k_a, AX_K) + _place(rb_a, AX_B)), mask=am, other=1.0), IS_F64)
        b = _up(tl.load(b_ptr + (_place(k_b, AX_K) + _place(ra_b, AX_A)), mask=bm, other=1.0), IS_F64)
        da, db = _partials(a, b, FN)
        # where, not just g == 0: a valid a or b can make a partial inf in a padding lane
        ta = tl.where(gm, g * da, 0.0)
        tb = tl.where(gm, g * db, 0.0)
    return ta, tb


@jit
def _store_grad(out_ptr, ws_ptr, ws_base, val, o1, AX1: tl.constexpr, o2, AX2: tl.constexpr, m1, m2,
                DIRECT: tl.constexpr):
    """Store a reduced tile: into the output (DIRECT) or into partial row ws_base of the workspace."""
    off = _place(o1, AX1) + _place(o2, AX2)
    m = _place(m1, AX1) & _place(m2, AX2)
    if DIRECT:
        tl.store(out_ptr + off, _to_out(val, out_ptr), mask=m)
    else:
        tl.store(ws_ptr + ws_base + off, val, mask=m)


# Sizes and counts that only bound loops and masks are not specialised: fewer recompiles
# across shapes.  `cols` stays specialised: its divisibility lets masked loads vectorise.
@jit(do_not_specialize=["n_k", "n_a", "n_b", "ncb", "nblk_k", "nblk_s", "nblk_l", "iters",
                         "numel_ga", "numel_gb"])
def _tile_kernel(a_ptr, b_ptr, g_ptr, ga_ptr, gb_ptr, wsa_ptr, wsb_ptr, desc_ptr,
                 n_k, n_a, n_b, cols, ncb, nblk_k, nblk_s, nblk_l, iters, numel_ga, numel_gb,
                 FN: tl.constexpr, IS_F64: tl.constexpr,
                 NK: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
                 BK: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr,
                 AX_K: tl.constexpr, AX_A: tl.constexpr, AX_B: tl.constexpr,
                 FAST: tl.constexpr, AL: tl.constexpr, LOOP_B: tl.constexpr,
                 DIRECT_A: tl.constexpr, DIRECT_B: tl.constexpr):
    """Stage 1 over the K x RA x RB box (classes K, RA, RB sit on tile axes AX_K, AX_A, AX_B).

    LOOP_B: the program loops over a chunk of RB blocks with its RA block fixed (else the
    reverse).  FAST: the class on axis 2 uses the contiguous path of _class_block.  The
    looped gradient accumulates whole tiles and reduces across lanes once, after the loop.
    """
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    BASE_A: tl.constexpr = 6 * NK
    BASE_B: tl.constexpr = 6 * (NK + NA)
    T0: tl.constexpr = BK if AX_K == 0 else (BA if AX_A == 0 else BB)
    T1: tl.constexpr = BK if AX_K == 1 else (BA if AX_A == 1 else BB)
    T2: tl.constexpr = BK if AX_K == 2 else (BA if AX_A == 2 else BB)
    pid = tl.program_id(0).to(tl.int64)
    kb = pid % nblk_k
    rest = pid // nblk_k
    sb = rest % nblk_s
    lc = rest // nblk_s
    j0 = lc * iters
    j1 = tl.minimum(j0 + iters, nblk_l)
    acc = tl.zeros([T0, T1, T2], ACC)
    k_a, k_b, k_g, k_ga, k_gb, k_m = _class_block(kb, desc_ptr, 0, NK, n_k, BK, FAST and AX_K == 2,
                                                  cols, ncb, AL)
    if LOOP_B:
        # grad_b sums over RB: accumulated over the chunk; grad_a sums over RA: stored per tile.
        ra_a, ra_b, ra_g, ra_ga, ra_gb, ra_m = _class_block(sb, desc_ptr, BASE_A, NA, n_a, BA,
                                                            FAST and AX_A == 2, cols, ncb, AL)
        for j in range(j0, j1):
            rb_a, rb_b, rb_g, rb_ga, rb_gb, rb_m = _class_block(j, desc_ptr, BASE_B, NB, n_b, BB,
                                                                FAST and AX_B == 2, cols, ncb, AL)
            ta, tb = _tile_terms(a_ptr, b_ptr, g_ptr, k_a, k_b, k_g, k_m, ra_b, ra_g, ra_m,
                                 rb_a, rb_g, rb_m, AX_K, AX_A, AX_B, FN, IS_F64)
            acc += tb
            _store_grad(ga_ptr, wsa_ptr, sb * numel_ga, tl.sum(ta, axis=AX_A, keep_dims=True),
                        k_ga, AX_K, rb_ga, AX_B, k_m, rb_m, DIRECT_A)
        _store_grad(gb_ptr, wsb_ptr, lc * numel_gb, tl.sum(acc, axis=AX_B, keep_dims=True),
                    k_gb, AX_K, ra_gb, AX_A, k_m, ra_m, DIRECT_B)
    else:
        # the mirror image: grad_a accumulated over a chunk of RA blocks, grad_b per tile.
        rb_a, rb_b, rb_g, rb_ga, rb_gb, rb_m = _class_block(sb, desc_ptr, BASE_B, NB, n_b, BB,
                                                            FAST and AX_B == 2, cols, ncb, AL)
        for j in range(j0, j1):
            ra_a, ra_b, ra_g, ra_ga, ra_gb, ra_m = _class_block(j, desc_ptr, BASE_A, NA, n_a, BA,
                                                                FAST and AX_A == 2, cols, ncb, AL)
            ta, tb = _tile_terms(a_ptr, b_ptr, g_ptr, k_a, k_b, k_g, k_m, ra_b, ra_g, ra_m,
                                 rb_a, rb_g, rb_m, AX_K, AX_A, AX_B, FN, IS_F64)
            acc += ta
            _store_grad(gb_ptr, wsb_ptr, sb * numel_gb, tl.sum(tb, axis=AX_B, keep_dims=True),
                        k_gb, AX_K, ra_gb, AX_A, k_m, ra_m, DIRECT_B)
        _store_grad(ga_ptr, wsa_ptr, lc * numel_ga, tl.sum(acc, axis=AX_A, keep_dims=True),
                    k_ga, AX_K, rb_ga, AX_B, k_m, rb_m, DIRECT_A)


@jit(do_not_specialize=["parts"])
def _sum_partials_kernel(ws_ptr, out_ptr, n, parts, BP: tl.constexpr, BN: tl.constexpr):
    """Stage 2: out[i] = sum_p ws[p, i], p in a fixed order (BP rows at a time, then a fixed tree)."""
    cols = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    cm = cols < n
    acc = tl.zeros([BN], ws_ptr.dtype.element_ty)
    for p0 in range(0, parts, BP):
        rows = p0 + tl.arange(0, BP).to(tl.int64)
        m = (rows < parts)[:, None] & cm[None, :]
        acc += tl.sum(tl.load(ws_ptr + rows[:, None] * n + cols[None, :], mask=m, other=0.0), axis=0)
    tl.store(out_ptr + cols, _to_out(acc, out_ptr), mask=cm)


# Whether triton.jit made interpreter objects above (TRITON_INTERPRET=1 when it ran).
# ============================================================================= host planning


@dataclass(frozen=True)
class Config:
    """Launch sizing.  GPU defaults aim at H100; tests shrink them to exercise every path.

    Sizes are in bytes per tensor tile, so a tile holds 4096 float32 or 8192 bfloat16 values.
    A thread handles `vectors` 16-byte vectors per tensor in a full tile (8 warps).
    """

    tile_bytes: int = 16384   # stage-1 tile (per loop step)
    vectors: int = 4
    s_max: int = 16           # widest block of the fixed reduced class (its partial count is extent / this)
    programs: int = 1024      # stage-1 programs to aim for: several per SM on 132 SMs
    partial_limit: int = 8    # looped-reduction partials stay under numel(O) / partial_limit elements
    flat_bytes: int = 16384   # per tensor per program in the contiguous no-broadcast kernel
    stage2_bytes: int = 16384
    max_warps: int = 8


GPU_CONFIG = Config()
# The interpreter runs programs one after another: as few programs as the shapes allow.
INTERPRETER_CONFIG = replace(GPU_CONFIG, programs=1)

_CLASSES = ("k", "ra", "rb")
# The tensors whose offset moves along each class (the others have stride 0 there).
_VARY = {"k": ("a", "b", "g", "ga", "gb"), "ra": ("b", "g", "gb"), "rb": ("a", "g", "ga")}


def _warps(elems: int, itemsize: int, cfg: Config) -> int:
    """Warps so that each thread moves about `cfg.vectors` 16-byte vectors per tensor."""
    per_warp = 32 * cfg.vectors * (16 // itemsize)
    return max(1, min(cfg.max_warps, elems // per_warp))


@dataclass
class TileLaunch:
    """Everything `_tile_kernel` needs besides the tensors: the result of planning one call."""

    desc: list[int]           # descriptor rows: size, strides of a, b, g, ga, gb
    ints: dict[str, int]      # runtime int arguments
    constexprs: dict[str, object]
    grid: int
    num_warps: int
    parts_a: int              # partials per grad_a element (1: written directly)
    parts_b: int


def _inner_class(plan) -> str:
    """The class whose last dim has grad_out's smallest stride: it goes on tile axis 2."""
    best, best_stride = "k", None
    for c in _CLASSES:
        grp = getattr(plan, c)
        if grp.ndim:
            s = abs(grp.strides["g"][-1])
            if best_stride is None or s < best_stride:
                best, best_stride = c, s
    return best


def _alignments(plan, inner: str) -> int:
    """Per tensor, log2 of the largest power of two (<= 16) dividing its strides outside the
    inner class's last dim; packed 4 bits per tensor in bcast.TENSORS order."""
    packed = 0
    for i, t in enumerate(bcast.TENSORS):
        align = 16
        for c in _CLASSES:
            grp = getattr(plan, c)
            for d, s in enumerate(grp.strides[t]):
                if s and not (c == inner and d == grp.ndim - 1):
                    align = min(align, abs(s) & -abs(s))
        packed |= (align.bit_length() - 1) << (4 * i)
    return packed


def _blocks(ext: dict, inner: str, inner_len: int, fixed: str, loop: str, tile: int, cfg: Config) -> dict:
    """Block size per class, for a tile of `tile` elements.

    The fixed reduced class gets up to `s_max` first: its gradient has extent / block
    partials, so this bounds that workspace to numel(O) / s_max.  The inner block is wide
    enough that a tensor spanning only the inner axis (b when K is inner) still fills
    16-byte vectors; when K is inner and a reduction runs, it leaves room for a few rows
    so that K splits into more programs.  The loop class, then K, take what is left.
    """
    reduces = ext["ra"] > 1 or ext["rb"] > 1
    block = {fixed: min(p2(ext[fixed]), cfg.s_max)} if fixed != inner else {}
    room = max(1, tile // block.get(fixed, 1))
    block[inner] = min(p2(inner_len), room // cfg.vectors if inner == "k" and reduces else room)
    budget = max(1, room // block[inner])
    for c in (loop, "k"):
        if c not in block:
            block[c] = min(p2(ext[c]), budget)
            budget = max(1, budget // block[c])
    return block


def plan_tile(plan, itemsize: int, fn: str, cfg: Config = GPU_CONFIG) -> TileLaunch:
    """Tile axes, block sizes, chunking and partial counts for a case the flat kernel cannot take."""
    ext = {c: getattr(plan, c).numel for c in _CLASSES}
    inner = _inner_class(plan)
    loop = "rb" if ext["rb"] >= ext["ra"] else "ra"  # loop over the longer reduction
    fixed = "ra" if loop == "rb" else "rb"

    grp = getattr(plan, inner)
    fast = grp.ndim > 0 and all(grp.strides[t][-1] == 1 for t in _VARY[inner])
    cols = grp.sizes[-1] if fast else 1
    block = _blocks(ext, inner, cols if fast else ext[inner], fixed, loop, cfg.tile_bytes // itemsize, cfg)

    ncb = cdiv(cols, block[inner])
    nblk = {c: cdiv(ext[c], block[c]) for c in _CLASSES}
    if fast:
        nblk[inner] = (ext[inner] // cols) * ncb  # blocks never straddle the last dim

    base = nblk["k"] * nblk[fixed]
    grad_l = plan.numel // ext[loop]  # size of the gradient that sums over the loop class
    chunks = min(max(1, cdiv(cfg.programs, base)), nblk[loop],
                 max(1, plan.numel // (cfg.partial_limit * grad_l)))
    iters = cdiv(nblk[loop], chunks)
    chunks = cdiv(nblk[loop], iters)

    parts = {fixed: nblk[fixed], loop: chunks}  # by the class that gradient sums over
    others = [c for c in _CLASSES if c != inner]
    axis = {others[0]: 0, others[1]: 1, inner: 2}
    desc = []
    for c in _CLASSES:
        g = getattr(plan, c)
        for d in range(g.ndim):
            desc += [g.sizes[d]] + [g.strides[t][d] for t in bcast.TENSORS]
    return TileLaunch(
        desc=desc,
        ints=dict(n_k=ext["k"], n_a=ext["ra"], n_b=ext["rb"], cols=cols, ncb=ncb, nblk_k=nblk["k"],
                  nblk_s=nblk[fixed], nblk_l=nblk[loop], iters=iters,
                  numel_ga=plan.numel // ext["ra"], numel_gb=plan.numel // ext["rb"]),
        constexprs=dict(FN=fn, IS_F64=itemsize == 8, NK=plan.k.ndim, NA=plan.ra.ndim, NB=plan.rb.ndim,
                        BK=block["k"], BA=block["ra"], BB=block["rb"],
                        AX_K=axis["k"], AX_A=axis["ra"], AX_B=axis["rb"],
                        FAST=fast, AL=_alignments(plan, inner) if fast else 0, LOOP_B=loop == "rb",
                        DIRECT_A=parts["ra"] == 1, DIRECT_B=parts["rb"] == 1),
        grid=base * chunks,
        num_warps=_warps(block["k"] * block["ra"] * block["rb"], itemsize, cfg),
        parts_a=parts["ra"],
        parts_b=parts["rb"],
    )


def stage2_blocks(parts: int, itemsize: int, cfg: Config = GPU_CONFIG) -> tuple[int, int]:
    """(BP, BN) for `_sum_partials_kernel`: up to 64 partials of BN columns per load."""
    bp = min(p2(parts), 64)
    return bp, max(16, cfg.stage2_bytes // itemsize // bp)


# ============================================================================= launching

_DESC_CACHE: dict = {}


def _descriptor(values: list[int], device):
    """The descriptor as an int64 tensor on `device`, cached so repeated calls skip the copy."""
    import torch

    key = (str(device), tuple(values))
    t = _DESC_CACHE.get(key)
    if t is None:
        if len(_DESC_CACHE) > 256:
            _DESC_CACHE.clear()
        t = _DESC_CACHE[key] = torch.tensor(values or [0], dtype=torch.int64, device=device)
    return t


def _sum_partials(ws, out, parts: int, cfg: Config):
    n, item = out.numel(), ws.element_size()
    bp, bn = stage2_blocks(parts, item, cfg)
    _sum_partials_kernel[(cdiv(n, bn),)](ws, out, n, parts, BP=bp, BN=bn, num_warps=_warps(bp * bn, item, cfg))


def _launch(a, b, g, ga, gb, fn: str, cfg: Config):
    import torch

    plan = bcast.make_plan(tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), g.stride())
    if plan.numel == 0:  # nothing to sum: every gradient is 0
        ga.zero_()
        gb.zero_()
        return
    item = a.element_size()
    if plan.contiguous_fast_path():
        block = min(cfg.flat_bytes // item, p2(plan.numel))
        _flat_kernel[(cdiv(plan.numel, block),)](a, b, g, ga, gb, plan.numel, FN=fn, IS_F64=item == 8,
                                                  BLOCK=block, num_warps=_warps(block, item, cfg))
        return
    L = plan_tile(plan, item, fn, cfg)
    acc = torch.float64 if item == 8 else torch.float32
    ws_a = torch.empty(L.parts_a * ga.numel(), dtype=acc, device=g.device) if L.parts_a > 1 else ga
    ws_b = torch.empty(L.parts_b * gb.numel(), dtype=acc, device=g.device) if L.parts_b > 1 else gb
    _tile_kernel[(L.grid,)](a, b, g, ga, gb, ws_a, ws_b, _descriptor(L.desc, g.device), **L.ints,
                            **L.constexprs, num_warps=L.num_warps)
    if L.parts_a > 1:
        _sum_partials(ws_a, ga, L.parts_a, cfg)
    if L.parts_b > 1:
        _sum_partials(ws_b, gb, L.parts_b, cfg)


# ============================================================================= validation


def _fail(cls, what: str, expected: str, got) -> None:
    raise cls(f"triton {OP}: {what}: expected {expected}, got {got}")


def _validate(inputs, outs, params) -> tuple:
    import torch

    fn = params.get("fn") if isinstance(params, dict) else None
    if fn not in FNS:
        _fail(ValueError, "params['fn']", f"one of {', '.join(FNS)}", repr(fn))
    tensors = {}
    for group, names in ((inputs, ("a", "b", "grad_out")), (outs, ("grad_a", "grad_b"))):
        for name in names:
            x = group.get(name) if isinstance(group, dict) else None
            if not isinstance(x, torch.Tensor):
                _fail(TypeError, name, "a torch.Tensor", type(x).__name__ + (" (missing)" if x is None else ""))
            tensors[name] = x
    a, b, g, ga, gb = tensors.values()
    allowed = {torch.float32, torch.float16, torch.bfloat16, torch.float64}
    if a.dtype not in allowed:
        _fail(TypeError, "a.dtype", "float32, float16, bfloat16 or float64", a.dtype)
    for name, x in tensors.items():
        if x.dtype != a.dtype:
            _fail(TypeError, f"{name}.dtype", f"{a.dtype} (the dtype of a)", x.dtype)
        if x.device != a.device:
            _fail(ValueError, f"{name}.device", f"{a.device} (the device of a)", x.device)
    if a.device.type not in ("cuda", "cpu"):
        _fail(ValueError, "device", "cuda, or cpu under TRITON_INTERPRET=1", a.device)
    try:
        out_shape = bcast.broadcast_shape(a.shape, b.shape)
    except ValueError:
        _fail(ValueError, "shapes of a and b", "broadcastable shapes", f"{tuple(a.shape)} and {tuple(b.shape)}")
    if tuple(g.shape) != out_shape:
        _fail(ValueError, "grad_out.shape", f"{out_shape} (broadcast of a and b)", tuple(g.shape))
    for name, x, shape in (("grad_a", ga, a.shape), ("grad_b", gb, b.shape)):
        if x.shape != shape:
            _fail(ValueError, f"{name}.shape", tuple(shape), tuple(x.shape))
        if not x.is_contiguous():
            _fail(ValueError, name, "a contiguous tensor", f"strides {x.stride()}")
    # Outputs are written while inputs (and, across programs, the other output) are still read.
    spans = {name: byte_span(x) for name, x in tensors.items() if x.numel()}
    for name in ("grad_a", "grad_b"):
        for other in ("a", "b", "grad_out", "grad_a"):
            if other != name and name in spans and other in spans and overlap(spans[name], spans[other]):
                _fail(ValueError, name, "a buffer of its own (outputs are written while inputs are read)",
                      f"memory shared with {other}")
    return fn, a, b, g, ga, gb


# ============================================================================= entry


def run(inputs, outs, params, cfg: Config | None = None) -> None:
    """binary_backward with explicit launch sizing (`cfg`); tests use it to force every path."""
    _launch_checked(*_validate(inputs, outs, params), cfg)


def _launch_checked(fn, a, b, g, ga, gb, cfg: Config | None) -> None:
    if IMPORT_ERROR is not None:
        raise RuntimeError(f"triton {OP}: triton is not importable ({IMPORT_ERROR})")
    with on_device(a):
        _launch(a, b, g, ga, gb, fn, cfg or (INTERPRETER_CONFIG if a.device.type == "cpu" else GPU_CONFIG))


@triton_backend.impl(OP, dtypes=DTYPES, deterministic=True)
def binary_backward(inputs, outs, params):
    # The kernel's own checks first (their messages are pinned by tests/test_triton_interpret.py),
    # then the op's shared ones (unexpected names, the params' shapes).
    checked = _validate(inputs, outs, params)
    argcheck.check_impl(triton_backend.impls[(OP, DEFAULT_VARIANT)], inputs, outs, params)
    _launch_checked(*checked, None)
