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
* Both operands broadcast with the fixed reduction on the contiguous rows (A=1xMxN, B=BxMx1
  and its mirror): `_batch_kernel` instead, which reads [batches x row chunk] tiles and defers
  the row sum to one cross-warp reduction per tile of batches (`batch_path`, `plan_batch`).
* Memory-bound, so sized for bytes in flight: a thread holds one 16-byte vector per tensor
  per step (about 50-70 registers for mul, so 7-10 programs of 4 warps per SM), the
  operand constant along the loop is read once, every tile has the full 3-D shape (one
  register layout, no shared-memory layout conversions in the loop), the next step's reads
  are issued before this step's math (PREFETCH), and a split loop runs exactly one wave of
  equal programs (sized from the compiled kernel's register count on the GPU).
* All index math is int64, so tensors over 2**31 elements work.

Per-class dim sizes and strides travel in a small int64 tensor (the "descriptor"),
so one compiled kernel serves every shape.

Host side (the Python per call must stay below the kernels' device time):

* Plans are cached per layout (`_PLANS`, see "cached launch plans"): a repeated call is a
  dict lookup, a workspace allocation when partials are used, and one to three launches
  through the compiled kernels' own launchers.
* `binary_backward` (registered) checks its arguments; `binary_backward.unchecked`, what
  the harness times after one checked call, goes straight to the cached plan.
* On CUDA, large calls take their launch sizing from a per-shape-class autotuner that only
  the checked entry runs (see "autotuning"); $GRADORACLE_TRITON_BINARY pins a named sizing
  and $GRADORACLE_TRITON_VARIANTS registers them as `triton@<name>` (see PRESETS).
* scripts/triton_regs.py lists registers, spills and waves of every perf case's launches
  for sm_90 without a GPU; scripts/gpu/triton_tune.sh times them on one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from backends._plans import binary_backward as bcast
from backends.triton import triton_backend
from backends.triton._steps import Step, occupancy as _occupancy, resources as _resources
from backends.triton.common import IMPORT_ERROR, byte_span, cdiv, check, interpreted, jit, on_device, overlap, p2, tl  # noqa: F401
from backends.triton.common import TUNE_ENV, capturing, time_ms, tuning_on  # noqa: F401 - TUNE_ENV: for callers
from backends.triton.common import to_out as _to_out
from backends.triton.common import up as _up
from harness import argcheck
from harness.registry import DEFAULT_VARIANT
from oracle.binary_backward import FNS

OP = "binary_backward"
DTYPES = ("f32", "f16", "bf16", "f64")

# ============================================================================= kernels


@jit
def _pow_partials(a, b, IS_F64: tl.constexpr):
    """b * a**(b-1) and a**b * ln a, the powers as IEEE pow defines them, from exp2 / log2
    (libdevice pow is not in the interpreter).  One log2 of |a| serves both powers and ln a,
    and the parity of b - 1 follows from b's: one log and two exp2 per element, not three and two.
    Signs and NaNs of negative bases follow the real exponents b and b - 1, as the oracle's:
    a sign bit (-0 too) negates an odd power; a finite negative base with a non-integer b is NaN."""
    lg = tl.log2(tl.abs(a))
    bm1 = b - 1.0
    b_int = tl.floor(b) == b
    b_even = b_int & (tl.floor(b * 0.5) * 2.0 == b)
    sign = a.to(tl.int64 if IS_F64 else tl.int32, bitcast=True) < 0
    nan = (a < 0) & (tl.abs(a) != float("inf")) & ~b_int
    # b - 1 has the other parity (also where b - 1 rounds: past 2**24 the float is even, the real one odd)
    p = tl.exp2(b * lg)
    q = tl.exp2(bm1 * lg)
    p = tl.where(sign & b_int & ~b_even, -p, p)
    q = tl.where(sign & b_even, -q, q)
    p = tl.where((b == 0) | (a == 1), 1.0, tl.where(nan, float("nan"), p))
    q = tl.where((bm1 == 0) | (a == 1), 1.0, tl.where(nan, float("nan"), q))
    if IS_F64:
        ln_a = tl.log(a)  # a float literal is float32 in triton: ln 2 would lose digits
    else:
        ln_a = tl.where(a < 0, float("nan"), lg * 0.6931471805599453)
    return b * q, tl.where((a == 0) & (b >= 0), 0.0, p * ln_a)


@jit
def _partials(a, b, FN: tl.constexpr, IS_F64: tl.constexpr):
    """df/da, df/db for the fns that need the inputs (add and sub never load them)."""
    if FN == "mul":
        da = b
        db = a
    elif FN == "div":
        da = 1.0 / b
        db = -a / (b * b)
    elif FN == "pow":
        da, db = _pow_partials(a, b, IS_F64)
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
        da, db = _partials(a, b, FN, IS_F64)
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
def _load_tile(ptr, o1, AX1: tl.constexpr, m1, o2, AX2: tl.constexpr, m2, o3, AX3: tl.constexpr, m3, other,
               IS_F64: tl.constexpr):
    """A whole tile of one tensor: offsets and masks per class, placed on their tile axes.

    An operand constant along a class gets zero offsets there (`_flat_axis`), so every tile
    has the full 3-D shape: the compiler gives g, a and b the same register layout and the
    terms need no layout conversion (through shared memory) inside the loop.
    """
    off = _place(o1, AX1) + _place(o2, AX2) + _place(o3, AX3)
    m = _place(m1, AX1) & _place(m2, AX2) & _place(m3, AX3)
    return _up(tl.load(ptr + off, mask=m, other=other), IS_F64)


@jit
def _flat_axis(B: tl.constexpr):
    """Offsets and mask of a class a tensor does not move along: zeros, all valid."""
    z = tl.zeros([B], tl.int64)
    return z, z == 0


@jit
def _reduce_axis(t, AX: tl.constexpr, B: tl.constexpr):
    """t summed over tile axis AX (kept as size 1); a block of 1 needs no sum (nor a layout change)."""
    if B == 1:
        r = t
    else:
        r = tl.sum(t, axis=AX, keep_dims=True)
    return r


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


@jit
def _terms(g, a, b, m, FN: tl.constexpr, IS_F64: tl.constexpr):
    """t_a = g * df/da and t_b = g * df/db on one tile, 0 outside the box (mask m)."""
    if FN == "add":
        ta = g
        tb = g
    elif FN == "sub":
        ta = g
        tb = -g
    else:
        da, db = _partials(a, b, FN, IS_F64)
        # where, not just g == 0: a valid a or b can make a partial inf in a padding lane
        ta = tl.where(m, g * da, 0.0)
        tb = tl.where(m, g * db, 0.0)
    return ta, tb


@jit
def _loop_loads(j, j1, desc_ptr, g_ptr, x_ptr, k_g, k_x, k_m, s_g, s_m, n_l, cols, ncb,
                BASE_L: tl.constexpr, NL: tl.constexpr, BL: tl.constexpr, FAST_L: tl.constexpr,
                AL: tl.constexpr, LOOP_B: tl.constexpr,
                AX_K: tl.constexpr, AX_S: tl.constexpr, AX_L: tl.constexpr,
                FN: tl.constexpr, IS_F64: tl.constexpr):
    """grad_out and the operand that varies along the loop class (a when looping over RB, b when
    over RA) on loop block j; nothing past the program's last block j1 (a prefetch past it).

    The operand is constant along the fixed class (axis AX_S): it is read as a tile of extent 1
    there and broadcast in the terms.  A full-width tile of one repeated address per row (both
    operands broadcast: A=1xMxN, B=BxMx1, the fixed class a whole 4096-wide row) made each
    thread issue one scalar load per element: 2.3 sectors per request and 31% of DRAM peak
    on the H100 (results/h100/bench-2/profile/08-both-binary_backward-triton.txt)."""
    l_a, l_b, l_g, l_ga, l_gb, l_m = _class_block(j, desc_ptr, BASE_L, NL, n_l, BL, FAST_L, cols, ncb, AL)
    l_m = l_m & (j < j1)
    g = _load_tile(g_ptr, k_g, AX_K, k_m, s_g, AX_S, s_m, l_g, AX_L, l_m, 0.0, IS_F64)
    if FN == "add" or FN == "sub":
        x = g  # the partials are constants: no operand read
    else:
        z, zm = _flat_axis(1)
        if LOOP_B:
            x = _load_tile(x_ptr, k_x, AX_K, k_m, z, AX_S, zm, l_a, AX_L, l_m, 1.0, IS_F64)
        else:
            x = _load_tile(x_ptr, k_x, AX_K, k_m, z, AX_S, zm, l_b, AX_L, l_m, 1.0, IS_F64)
    return g, x


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
                 DIRECT_A: tl.constexpr, DIRECT_B: tl.constexpr, PREFETCH: tl.constexpr):
    """Stage 1 over the K x RA x RB box (classes K, RA, RB sit on tile axes AX_K, AX_A, AX_B).

    LOOP_B: the program loops over a chunk of RB blocks with its RA block fixed (else the
    reverse, "mirrored").  The operand whose gradient sums over the loop class is constant
    along it (b when looping over RB): its tile is read once, before the loop (for pow, per
    step from L1: the compiler would hoist its share of the pow terms and hold them across
    the loop, doubling the registers).  The looped
    gradient accumulates whole tiles and reduces across lanes once, after the loop; the
    fixed one is reduced and stored per tile.  PREFETCH: the loads of block j + 1 are issued
    before block j is computed and stored, so a warp has two tiles of reads in flight.
    FAST: the class on axis 2 uses the contiguous path of _class_block.
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
        z, zm = _flat_axis(BB)
        if FN == "add" or FN == "sub":
            b = acc
        elif FN != "pow":
            b = _load_tile(b_ptr, k_b, AX_K, k_m, ra_b, AX_A, ra_m, z, AX_B, zm, 1.0, IS_F64)
        if PREFETCH:
            g_n, a_n = _loop_loads(j0, j1, desc_ptr, g_ptr, a_ptr, k_g, k_a, k_m, ra_g, ra_m, n_b, cols, ncb,
                                   BASE_B, NB, BB, FAST and AX_B == 2, AL, True, AX_K, AX_A, AX_B, FN, IS_F64)
        for j in range(j0, j1):
            if PREFETCH:
                g = g_n
                a = a_n
                g_n, a_n = _loop_loads(j + 1, j1, desc_ptr, g_ptr, a_ptr, k_g, k_a, k_m, ra_g, ra_m, n_b, cols,
                                       ncb, BASE_B, NB, BB, FAST and AX_B == 2, AL, True, AX_K, AX_A, AX_B,
                                       FN, IS_F64)
            else:
                g, a = _loop_loads(j, j1, desc_ptr, g_ptr, a_ptr, k_g, k_a, k_m, ra_g, ra_m, n_b, cols, ncb,
                                   BASE_B, NB, BB, FAST and AX_B == 2, AL, True, AX_K, AX_A, AX_B, FN, IS_F64)
            rb_a, rb_b, rb_g, rb_ga, rb_gb, rb_m = _class_block(j, desc_ptr, BASE_B, NB, n_b, BB,
                                                                FAST and AX_B == 2, cols, ncb, AL)
            gm = _place(k_m, AX_K) & _place(ra_m, AX_A) & _place(rb_m, AX_B)
            if FN == "pow":
                b = _load_tile(b_ptr, k_b, AX_K, k_m, ra_b, AX_A, ra_m, z, AX_B, zm, 1.0, IS_F64)
            ta, tb = _terms(g, a, b, gm, FN, IS_F64)
            acc += tb
            _store_grad(ga_ptr, wsa_ptr, sb * numel_ga, _reduce_axis(ta, AX_A, BA),
                        k_ga, AX_K, rb_ga, AX_B, k_m, rb_m, DIRECT_A)
        _store_grad(gb_ptr, wsb_ptr, lc * numel_gb, _reduce_axis(acc, AX_B, BB),
                    k_gb, AX_K, ra_gb, AX_A, k_m, ra_m, DIRECT_B)
    else:
        # the mirror image: grad_a accumulated over a chunk of RA blocks, grad_b per tile; a read once.
        rb_a, rb_b, rb_g, rb_ga, rb_gb, rb_m = _class_block(sb, desc_ptr, BASE_B, NB, n_b, BB,
                                                            FAST and AX_B == 2, cols, ncb, AL)
        z, zm = _flat_axis(BA)
        if FN == "add" or FN == "sub":
            a = acc
        elif FN != "pow":
            a = _load_tile(a_ptr, k_a, AX_K, k_m, rb_a, AX_B, rb_m, z, AX_A, zm, 1.0, IS_F64)
        if PREFETCH:
            g_n, b_n = _loop_loads(j0, j1, desc_ptr, g_ptr, b_ptr, k_g, k_b, k_m, rb_g, rb_m, n_a, cols, ncb,
                                   BASE_A, NA, BA, FAST and AX_A == 2, AL, False, AX_K, AX_B, AX_A, FN, IS_F64)
        for j in range(j0, j1):
            if PREFETCH:
                g = g_n
                b = b_n
                g_n, b_n = _loop_loads(j + 1, j1, desc_ptr, g_ptr, b_ptr, k_g, k_b, k_m, rb_g, rb_m, n_a, cols,
                                       ncb, BASE_A, NA, BA, FAST and AX_A == 2, AL, False, AX_K, AX_B, AX_A,
                                       FN, IS_F64)
            else:
                g, b = _loop_loads(j, j1, desc_ptr, g_ptr, b_ptr, k_g, k_b, k_m, rb_g, rb_m, n_a, cols, ncb,
                                   BASE_A, NA, BA, FAST and AX_A == 2, AL, False, AX_K, AX_B, AX_A, FN, IS_F64)
            ra_a, ra_b, ra_g, ra_ga, ra_gb, ra_m = _class_block(j, desc_ptr, BASE_A, NA, n_a, BA,
                                                                FAST and AX_A == 2, cols, ncb, AL)
            gm = _place(k_m, AX_K) & _place(ra_m, AX_A) & _place(rb_m, AX_B)
            if FN == "pow":
                a = _load_tile(a_ptr, k_a, AX_K, k_m, rb_a, AX_B, rb_m, z, AX_A, zm, 1.0, IS_F64)
            ta, tb = _terms(g, a, b, gm, FN, IS_F64)
            acc += ta
            _store_grad(gb_ptr, wsb_ptr, sb * numel_gb, _reduce_axis(tb, AX_B, BB),
                        k_gb, AX_K, ra_gb, AX_A, k_m, ra_m, DIRECT_B)
        _store_grad(ga_ptr, wsa_ptr, lc * numel_ga, _reduce_axis(acc, AX_A, BA),
                    k_ga, AX_K, rb_ga, AX_B, k_m, rb_m, DIRECT_A)


@jit
def _pick(oa, ob, SWAP: tl.constexpr):
    """(X, Y) from per-tensor (a, b) values: X = a unless SWAP (see `_batch_kernel`)."""
    if SWAP:
        r = ob, oa
    else:
        r = oa, ob
    return r


@jit
def _batch_terms(g, x, y, m, FN: tl.constexpr, IS_F64: tl.constexpr, SWAP: tl.constexpr):
    """(t_x, t_y): `_terms` with the operands in the order df/da, df/db expects."""
    if SWAP:
        ta, tb = _terms(g, y, x, m, FN, IS_F64)
        r = tb, ta
    else:
        r = _terms(g, x, y, m, FN, IS_F64)
    return r


@jit
def _batch_loads(j, j_end, desc_ptr, g_ptr, x_ptr, kl_g, kl_m, k_x, k_m, n_r, cols, ncb,
                 BASE_R: tl.constexpr, NR: tl.constexpr, BN: tl.constexpr, AL: tl.constexpr,
                 SWAP: tl.constexpr, FN: tl.constexpr, IS_F64: tl.constexpr):
    """grad_out as a [BT, BN] tile (batches x row chunk j) and X as [1, BN] (X is constant along
    the batches: one read serves every row of the tile); nothing at or past chunk j_end (a prefetch).
    Widened here, not at use: ptxas spends more registers unpacking a carried 16-bit tile (sm_90:
    201 against 139 for bf16 mul)."""
    r_a, r_b, r_g, r_ga, r_gb, r_m = _class_block(j, desc_ptr, BASE_R, NR, n_r, BN, True, cols, ncb, AL)
    r_m = r_m & (j < j_end)
    g = _up(tl.load(g_ptr + (kl_g[:, None] + r_g[None, :]), mask=kl_m[:, None] & r_m[None, :], other=0.0), IS_F64)
    if FN == "add" or FN == "sub":
        x = g  # the partials are constants: no operand read
    else:
        r_x = _pick(r_a, r_b, SWAP)[0]
        x = _up(tl.load(x_ptr + (k_x + r_x)[None, :], mask=(k_m & r_m)[None, :], other=1.0), IS_F64)
    return g, x


@jit
def _batch_store_x(gx_ptr, ws_ptr, v, off, m, row, t, t0, t1, DIRECT: tl.constexpr, ACCUM: tl.constexpr):
    """grad_X's sum over one batch tile, for one row chunk.  ACCUM (a program owns several tiles):
    the running sum lives in the program's own workspace row (the same thread writes and reads
    each element, so no other program or barrier is involved), and the last tile finishes it.
    DIRECT: the program's tiles cover every batch, the finished sum is the output; else it is
    partial row `row`, added up by `_sum_partials_kernel`."""
    ws = ws_ptr + row + off
    if ACCUM:
        v += tl.load(ws, mask=m & (t > t0), other=0.0)
    if DIRECT:
        tl.store(gx_ptr + off, _to_out(v, gx_ptr), mask=m & (t == t1 - 1))
        if ACCUM:
            tl.store(ws, v, mask=m & (t < t1 - 1))
    else:
        tl.store(ws, v, mask=m)


# Sizes and counts that only bound loops and masks are not specialised (see _tile_kernel).
@jit(do_not_specialize=["n_k", "n_l", "n_r", "ncb", "nblk_k", "nblk_l", "nblk_r", "iters", "numel_gx"])
def _batch_kernel(a_ptr, b_ptr, g_ptr, ga_ptr, gb_ptr, wsa_ptr, wsb_ptr, desc_ptr,
                  n_k, n_l, n_r, cols, ncb, nblk_k, nblk_l, nblk_r, iters, numel_gx,
                  FN: tl.constexpr, IS_F64: tl.constexpr,
                  NK: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                  VEC: tl.constexpr, SWAP: tl.constexpr, AL: tl.constexpr, DIRECT: tl.constexpr,
                  ACCUM: tl.constexpr, PREFETCH: tl.constexpr):
    """Both operands broadcast, one reduction (R) on the contiguous rows and one (L) across
    "batches" of them: A=1xMxN, B=BxMx1 (R = N, L = B) and its mirror (SWAP: A=BxMx1, B=1xMxN).

    X is the operand that varies along R (a; b when SWAP), so grad_X sums over L; Y varies along
    L and grad_Y sums over R.  A program owns one K index (M above) and a chunk of batch tiles:
    per tile it walks the row in chunks of [BT batches, BN columns].  grad_Y's terms accumulate
    element-wise in a [BT, BN] tile and are summed across the warps once per tile, after the row:
    no cross-warp reduction, and so no barrier, inside the loop whose loads stream (the generic
    tile kernel summed every step across 16 warps, stalling the next step's reads).  grad_X's
    sum over the tile's batches runs along axis 0, which each thread holds whole (BN spans the
    warps: the host sizes it so), so it needs no communication either.  PREFETCH issues the
    next chunk's reads before this chunk's math.
    """
    ACC: tl.constexpr = tl.float64 if IS_F64 else tl.float32
    BASE_A: tl.constexpr = 6 * NK
    BASE_B: tl.constexpr = 6 * (NK + NA)
    BASE_L: tl.constexpr = BASE_B if SWAP else BASE_A
    BASE_R: tl.constexpr = BASE_A if SWAP else BASE_B
    NL: tl.constexpr = NB if SWAP else NA
    NR: tl.constexpr = NA if SWAP else NB
    pid = tl.program_id(0).to(tl.int64)
    kb = pid % nblk_k
    lc = pid // nblk_k
    t0 = lc * iters
    t1 = tl.minimum(t0 + iters, nblk_l)
    k_a, k_b, k_g, k_ga, k_gb, k_m = _class_block(kb, desc_ptr, 0, NK, n_k, 1, False, cols, ncb, AL)
    k_x, k_y = _pick(k_a, k_b, SWAP)
    k_gx, k_gy = _pick(k_ga, k_gb, SWAP)
    x_ptr, y_ptr = _pick(a_ptr, b_ptr, SWAP)
    gx_ptr, gy_ptr = _pick(ga_ptr, gb_ptr, SWAP)
    ws_ptr = _pick(wsa_ptr, wsb_ptr, SWAP)[0]
    for t in range(t0, t1):
        l_a, l_b, l_g, l_ga, l_gb, l_m = _class_block(t, desc_ptr, BASE_L, NL, n_l, BT, False, cols, ncb, AL)
        l_y = _pick(l_a, l_b, SWAP)[1]
        l_gy = _pick(l_ga, l_gb, SWAP)[1]
        kl_m = k_m & l_m
        kl_g = k_g + l_g
        if FN == "add" or FN == "sub":
            y = tl.zeros([BT, 1], ACC)
        else:
            y = _up(tl.load(y_ptr + (k_y + l_y)[:, None], mask=kl_m[:, None], other=1.0), IS_F64)
        acc = tl.zeros([BT, BN // VEC], ACC)
        if PREFETCH:
            g_n, x_n = _batch_loads(0, nblk_r, desc_ptr, g_ptr, x_ptr, kl_g, kl_m, k_x, k_m, n_r, cols, ncb,
                                    BASE_R, NR, BN, AL, SWAP, FN, IS_F64)
        for j in range(0, nblk_r):
            if PREFETCH:
                g = g_n
                x = x_n
                g_n, x_n = _batch_loads(j + 1, nblk_r, desc_ptr, g_ptr, x_ptr, kl_g, kl_m, k_x, k_m, n_r, cols,
                                        ncb, BASE_R, NR, BN, AL, SWAP, FN, IS_F64)
            else:
                g, x = _batch_loads(j, nblk_r, desc_ptr, g_ptr, x_ptr, kl_g, kl_m, k_x, k_m, n_r, cols, ncb,
                                    BASE_R, NR, BN, AL, SWAP, FN, IS_F64)
            r_a, r_b, r_g, r_ga, r_gb, r_m = _class_block(j, desc_ptr, BASE_R, NR, n_r, BN, True, cols, ncb, AL)
            r_gx = _pick(r_ga, r_gb, SWAP)[0]
            tx, ty = _batch_terms(g, x, y, kl_m[:, None] & r_m[None, :], FN, IS_F64, SWAP)
            # each thread's VEC adjacent columns (one 16-byte vector) first, within the thread:
            # the running sum keeps BT x BN / VEC values, not BT x BN
            acc += tl.sum(tl.reshape(ty, [BT, BN // VEC, VEC]), axis=2)
            _batch_store_x(gx_ptr, ws_ptr, tl.sum(tx, axis=0), k_gx + r_gx, k_m & r_m, lc * numel_gx,
                           t, t0, t1, DIRECT, ACCUM)
        gy = tl.sum(acc, axis=1)
        tl.store(gy_ptr + k_gy + l_gy, _to_out(gy, gy_ptr), mask=kl_m)


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


# ============================================================================= host planning


@dataclass(frozen=True)
class Config:
    """Launch sizing.  GPU defaults aim at H100; the autotuner tries variations of them (see
    `candidates`), GRADORACLE_TRITON_BINARY pins one (see `PRESETS`), and tests shrink them to
    exercise every path.

    Sizes are in bytes per tensor tile, so a 2 KiB tile holds 512 float32 or 1024 bfloat16
    values.  A thread handles `vectors` 16-byte vectors per tensor in a full tile (this sets
    the warps): few values per thread keep the registers low (about 60 for mul) and so many
    warps resident per SM, which is what keeps enough reads in flight.
    """

    tile_bytes: int = 2048    # stage-1 tile (per loop step)
    vectors: int = 1
    inner_bytes: int = 1024   # K on the contiguous axis and a reduction runs: K block width in bytes
    s_max: int = 16           # widest block of the fixed reduced class (its partial count is extent / this)
    row_bytes: int = 8192     # the fixed reduction on the contiguous axis: its block may widen to this
    loop_inner: bool = False  # both classes reduce, the longer on the contiguous axis: loop over it (else the other)
    prefetch: bool = True     # issue the next loop step's reads before computing this one
    waves: int = 1            # a split loop runs sms x occupancy x waves programs: whole waves, equal chunks
    occupancy: int = 8        # programs per SM when the compiled kernel is not asked (no GPU)
    max_occupancy: int = 16   # bound on the above (fixes the split variant before it is asked)
    sms: int = 0              # SMs; 0: the device's (132, an H100, when planning without one)
    partial_limit: int = 8    # looped-reduction partials stay under numel(O) / partial_limit elements ...
    partial_share: float | None = 0.02  # ... and their traffic (write + read) under this share of the call's bytes
    flat_bytes: int = 16384   # per tensor per program in the contiguous no-broadcast kernel
    flat_vectors: int = 4     # ... and its 16-byte vectors per thread per tensor
    stage2_rows: int = 256    # partial rows the partial-sum kernel adds per load (all of them, mostly)
    stage2_bytes: int = 16384   # largest load of the partial-sum kernel
    stage2_programs: int = 256
    max_warps: int = 16       # the tile kernel's (a tile widened to whole rows); the others stop at 8
    # `_batch_kernel` (both operands broadcast, a summed row on the contiguous axis; 0: the tile kernel):
    batch_tile: int = 8       # batches per tile: grad_out rows a thread reads per step, one vector each
    batch_bytes: int = 2048   # row chunk per step, in bytes (a warp covers 512 of them per vector)
    batch_warps: int = 4      # few warps a program, so several programs share an SM


GPU_CONFIG = Config()
# The interpreter runs programs one after another: as few programs as the shapes allow.
INTERPRETER_CONFIG = replace(GPU_CONFIG, sms=1, occupancy=1, partial_share=None)
# Named sizings: GRADORACLE_TRITON_BINARY=<name> pins one on the GPU (no tuning), and
# GRADORACLE_TRITON_VARIANTS=<name>,... registers `triton@<name>` for each, so that one bench
# run lines them up beside the tuned default.  "old" is the sizing before the register diet.
PRESETS = {
    "lean": GPU_CONFIG,
    "lean_noprefetch": replace(GPU_CONFIG, prefetch=False),
    "wide": replace(GPU_CONFIG, tile_bytes=4096, vectors=2),
    # add/sub read grad_out alone (a and b are not needed): at the sizing of mul a thread has half
    # the reads in flight (85% of copy on the bias gradient, mul 91%); four vectors a thread instead.
    "wide4": replace(GPU_CONFIG, tile_bytes=8192, vectors=4),
    "narrow_strips": replace(GPU_CONFIG, inner_bytes=512),
    "loop_inner": replace(GPU_CONFIG, loop_inner=True),
    "whole_rows": replace(GPU_CONFIG, row_bytes=16384),
    # both operands broadcast (A=1xMxN, B=BxMx1): the generic tile kernel instead of _batch_kernel,
    # and _batch_kernel at half the batches a tile
    "no_batch": replace(GPU_CONFIG, batch_tile=0),
    "batch4": replace(GPU_CONFIG, batch_tile=4),
    "old": replace(GPU_CONFIG, tile_bytes=16384, vectors=4, waves=0, partial_share=0.01, prefetch=False,
                   loop_inner=True, row_bytes=0, stage2_rows=64, max_warps=8, batch_tile=0),
}
PRESET_ENV = "GRADORACLE_TRITON_BINARY"
VARIANTS_ENV = "GRADORACLE_TRITON_VARIANTS"
_OLD_PROGRAMS = 1024  # "old" (waves=0): stage-1 programs aimed at, whatever the occupancy

_CLASSES = ("k", "ra", "rb")
# The tensors whose offset moves along each class (the others have stride 0 there).
_VARY = {"k": ("a", "b", "g", "ga", "gb"), "ra": ("b", "g", "gb"), "rb": ("a", "g", "ga")}


def _warps(elems: int, itemsize: int, cfg: Config, vectors: int | None = None, most: int | None = None) -> int:
    """Warps so that each thread moves about `vectors` (cfg.vectors) 16-byte vectors per tensor,
    at most `most` (cfg.max_warps)."""
    per_warp = 32 * (vectors or cfg.vectors) * max(1, 16 // itemsize)
    return max(1, min(most or cfg.max_warps, elems // per_warp))


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
    occupancy: int | None = None  # programs per SM the split was sized with (None: no split asked)
    kernel: str = "tile"      # "tile": _tile_kernel; "batch": _batch_kernel
    scratch_a: bool = False   # grad_a needs a workspace row even when direct (a running sum)
    scratch_b: bool = False
    grad_numels: tuple = (0, 0)  # numel of grad_a, of grad_b


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


def _roles(plan, cfg: Config = GPU_CONFIG) -> tuple[dict, str, str, str]:
    """(extent per class, inner class, looped reduced class, fixed reduced class).

    The loop runs over the longer reduction; with `loop_inner` off, over the other one when
    both reduce and the longer one is on the contiguous axis (then each step sums whole
    contiguous rows of the fixed class, and the looped gradient accumulates in lanes)."""
    ext = {c: getattr(plan, c).numel for c in _CLASSES}
    inner = _inner_class(plan)
    loop = "rb" if ext["rb"] >= ext["ra"] else "ra"  # loop over the longer reduction
    other = "ra" if loop == "rb" else "rb"
    if not cfg.loop_inner and loop == inner and ext[other] > 1:
        loop, other = other, loop
    return ext, inner, loop, other


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


def _blocks(ext: dict, inner: str, inner_len: int, fixed: str, loop: str, itemsize: int, cfg: Config) -> dict:
    """Block size per class, for a tile of `cfg.tile_bytes` per tensor.

    The fixed reduced class gets up to `s_max` first: its gradient has extent / block
    partials, so this bounds that workspace to numel(O) / s_max; on the contiguous axis it
    gets whole rows up to `row_bytes` (the tile grows), so short rows need no partials.  When K is inner and a
    reduction runs, the K block is `inner_bytes` wide: narrow column strips make many K
    blocks, so the programs needed to fill the GPU come with few partials of the looped
    reduction.  The loop class, then K, take what is left.
    """
    tile = max(1, cfg.tile_bytes // itemsize)
    reduces = ext["ra"] > 1 or ext["rb"] > 1
    block = {fixed: min(p2(ext[fixed]), cfg.s_max)} if fixed != inner else {}
    room = max(1, tile // block.get(fixed, 1))
    width = min(room, max(1, cfg.inner_bytes // itemsize)) if inner == "k" and reduces else room
    if fixed == inner and ext[fixed] > 1:  # whole rows of the fixed reduction where they fit: no partials
        width = room = max(room, min(p2(inner_len), cfg.row_bytes // itemsize))
    block[inner] = min(p2(inner_len), width)
    budget = max(1, room // block[inner])
    for c in (loop, "k"):
        if c not in block:
            block[c] = min(p2(ext[c]), budget)
            budget = max(1, budget // block[c])
    return block


def min_bytes(plan, itemsize: int) -> int:
    """The call's minimum traffic: a, b, grad_out read once, grad_a, grad_b written once."""
    n = plan.numel
    return itemsize * (n + 2 * (n // max(1, plan.ra.numel)) + 2 * (n // max(1, plan.rb.numel)))


def plan_tile(plan, itemsize: int, fn: str, cfg: Config = GPU_CONFIG, sms: int = 132,
              occupancy=None) -> TileLaunch:
    """Tile axes, block sizes, chunking and partial counts for a case the flat kernel cannot take.

    The looped reduction is split into chunks (one program each, its own partial row) so that
    the grid fills whole waves: sms x occupancy x cfg.waves programs of equal length, all
    resident at once, so no SM idles through a partial last wave.  occupancy(launch) -> the
    programs per SM of the split launch's compiled kernel, or None (then cfg.occupancy).
    """
    if batch_path(plan, cfg):
        return plan_batch(plan, itemsize, fn, cfg, sms)
    ext, inner, loop, fixed = _roles(plan, cfg)
    fast = _fast(plan, inner)
    cols = getattr(plan, inner).sizes[-1] if fast else 1
    block = _blocks(ext, inner, cols if fast else ext[inner], fixed, loop, itemsize, cfg)

    ncb = cdiv(cols, block[inner])
    nblk = {c: cdiv(ext[c], block[c]) for c in _CLASSES}
    if fast:
        nblk[inner] = (ext[inner] // cols) * ncb  # blocks never straddle the last dim

    base = nblk["k"] * nblk[fixed]
    grad_l = plan.numel // ext[loop]  # size of the gradient that sums over the loop class
    caps = [nblk[loop], max(1, plan.numel // (cfg.partial_limit * grad_l))]
    if cfg.partial_share is not None:
        acc_item = 8 if itemsize == 8 else 4
        caps.append(max(1, int(cfg.partial_share * min_bytes(plan, itemsize) / (2 * grad_l * acc_item))))
    if cfg.waves:
        most = min(*caps, max(1, sms * cfg.max_occupancy * cfg.waves // base))
    else:  # the old sizing: about _OLD_PROGRAMS programs
        most = min(*caps, max(1, cdiv(_OLD_PROGRAMS, base)))

    others = [c for c in _CLASSES if c != inner]
    axis = {others[0]: 0, others[1]: 1, inner: 2}
    L = TileLaunch(
        desc=_descriptor_rows(plan),
        ints=dict(n_k=ext["k"], n_a=ext["ra"], n_b=ext["rb"], cols=cols, ncb=ncb, nblk_k=nblk["k"],
                  nblk_s=nblk[fixed], nblk_l=nblk[loop], iters=nblk[loop],
                  numel_ga=plan.numel // ext["ra"], numel_gb=plan.numel // ext["rb"]),
        constexprs=dict(FN=fn, IS_F64=itemsize == 8, NK=plan.k.ndim, NA=plan.ra.ndim, NB=plan.rb.ndim,
                        BK=block["k"], BA=block["ra"], BB=block["rb"],
                        AX_K=axis["k"], AX_A=axis["ra"], AX_B=axis["rb"],
                        FAST=fast, AL=_alignments(plan, inner) if fast else 0, LOOP_B=loop == "rb",
                        DIRECT_A=True, DIRECT_B=True, PREFETCH=cfg.prefetch),
        grid=base,
        num_warps=_warps(block["k"] * block["ra"] * block["rb"], itemsize, cfg),
        parts_a=1,
        parts_b=1,
        grad_numels=(plan.numel // ext["ra"], plan.numel // ext["rb"]),
    )
    parts = {fixed: nblk[fixed], loop: 1}  # partial rows per gradient element, by the class it sums over
    if most > 1:
        parts[loop] = most  # the split variant (partials for the looped gradient): size it from its occupancy
        _set_parts(L, parts)
        if cfg.waves:
            occ = min((occupancy(L) if occupancy else None) or cfg.occupancy, cfg.max_occupancy)
            chunks = min(most, max(1, sms * occ * cfg.waves // base))
            L.occupancy = occ
        else:
            chunks = most
        iters = cdiv(nblk[loop], chunks)
        parts[loop] = cdiv(nblk[loop], iters)  # every chunk but the last has exactly `iters` blocks
        L.ints["iters"] = iters
        L.grid = base * parts[loop]
    _set_parts(L, parts)
    return L


def _fast(plan, inner: str) -> bool:
    """Whether the inner class's last dim has unit stride in every tensor that moves along it."""
    grp = getattr(plan, inner)
    return grp.ndim > 0 and all(grp.strides[t][-1] == 1 for t in _VARY[inner])


def _descriptor_rows(plan) -> list[int]:
    """Per dim of each class (k, ra, rb): its size, then the strides of a, b, g, ga, gb."""
    desc = []
    for c in _CLASSES:
        g = getattr(plan, c)
        for d in range(g.ndim):
            desc += [g.sizes[d]] + [g.strides[t][d] for t in bcast.TENSORS]
    return desc


def batch_path(plan, cfg: Config = GPU_CONFIG) -> bool:
    """Whether `_batch_kernel` takes the call: both gradients reduce, the fixed reduction (whole
    rows a step) is on a contiguous axis, and the sizing allows it (batch_tile > 0)."""
    if not cfg.batch_tile:
        return False
    ext, inner, loop, fixed = _roles(plan, cfg)
    return fixed == inner and ext[fixed] > 1 and ext[loop] > 1 and _fast(plan, inner)


def plan_batch(plan, itemsize: int, fn: str, cfg: Config = GPU_CONFIG, sms: int = 132) -> TileLaunch:
    """`_batch_kernel`'s launch: one program per K index and chunk of batch tiles.

    The row chunk BN is `batch_bytes` wide (less for shorter rows) and its warps sit side by side
    along it, one 16-byte vector per thread per batch row: axis 0 (the batches) stays within each
    thread.  The batch tiles are split over programs only when the K extent alone leaves the GPU
    short of `sms x occupancy x waves` programs; then grad_X is written in partials.
    """
    ext, inner, loop, _ = _roles(plan, cfg)
    cols = getattr(plan, inner).sizes[-1]
    bn = min(p2(cols), max(1, cfg.batch_bytes // itemsize))
    bt = min(p2(ext[loop]), cfg.batch_tile)
    nblk_l = cdiv(ext[loop], bt)
    ncb = cdiv(cols, bn)
    parts = max(1, min(nblk_l, sms * cfg.occupancy * max(1, cfg.waves) // ext["k"]))
    iters = cdiv(nblk_l, parts)
    parts = cdiv(nblk_l, iters)  # every chunk but the last has exactly `iters` tiles
    swap = loop == "rb"  # X (the operand constant along the batches) is b
    grad_x = plan.numel // ext[loop]
    L = TileLaunch(
        desc=_descriptor_rows(plan),
        ints=dict(n_k=ext["k"], n_l=ext[loop], n_r=ext[inner], cols=cols, ncb=ncb, nblk_k=ext["k"],
                  nblk_l=nblk_l, nblk_r=(ext[inner] // cols) * ncb, iters=iters, numel_gx=grad_x),
        constexprs=dict(FN=fn, IS_F64=itemsize == 8, NK=plan.k.ndim, NA=plan.ra.ndim, NB=plan.rb.ndim,
                        BT=bt, BN=bn, VEC=min(bn, max(1, 16 // itemsize)), SWAP=swap, AL=_alignments(plan, inner), DIRECT=parts == 1,
                        # pow's terms beside a prefetched tile spill at 8 batches of 16-bit values (sm_90)
                        ACCUM=iters > 1, PREFETCH=cfg.prefetch and fn != "pow"),
        grid=ext["k"] * parts,
        num_warps=_warps(bn, itemsize, cfg, 1, cfg.batch_warps),
        parts_a=1 if swap else parts,
        parts_b=parts if swap else 1,
        kernel="batch",
        grad_numels=(plan.numel // ext["ra"], plan.numel // ext["rb"]),
    )
    if swap:
        L.scratch_b = iters > 1
    else:
        L.scratch_a = iters > 1
    return L


def _set_parts(L: TileLaunch, parts: dict) -> None:
    """Partial rows per element of grad_a (it sums over RA) and grad_b (over RB); 1: direct."""
    L.parts_a, L.parts_b = parts["ra"], parts["rb"]
    L.constexprs.update(DIRECT_A=parts["ra"] == 1, DIRECT_B=parts["rb"] == 1)


def flat_block(n: int, itemsize: int, cfg: Config) -> tuple[int, int]:
    """(BLOCK, num_warps) of `_flat_kernel` over n elements."""
    block = min(cfg.flat_bytes // itemsize, p2(n))
    return block, _warps(block, itemsize, cfg, cfg.flat_vectors)


def stage2_warps(bp: int, bn: int, itemsize: int, cfg: Config = GPU_CONFIG) -> int:
    return _warps(bp * bn, itemsize, cfg, 1, 8)


def stage2_blocks(parts: int, n: int, itemsize: int, cfg: Config = GPU_CONFIG) -> tuple[int, int]:
    """(BP, BN) for `_sum_partials_kernel` summing `parts` rows of n: up to `stage2_rows` partials
    (mostly all: one load, one L2 round trip) of BN columns, BN narrow enough for about
    `stage2_programs` programs (the partials sit in L2 and a few programs would leave most SMs
    idle), at least 16."""
    bp = min(p2(parts), cfg.stage2_rows)
    return bp, max(16, min(cfg.stage2_bytes // itemsize // bp, p2(cdiv(n, cfg.stage2_programs))))


# ============================================================================= cached launch plans
#
# A call is planned once per (fn, dtype, device, shapes, strides, 16-byte alignment of each
# data pointer, sizing): the broadcast plan, the tile plan, the descriptor tensor and the
# kernels' arguments go into a plan object kept in _PLANS.  A repeated call is a dict lookup,
# the workspace allocation and one to three launches.  The key holds everything triton
# specialises a kernel on (pointer dtypes and alignment; every int argument derives from
# shapes and strides), so a plan's compiled kernels are valid for every call that finds it.
# Nothing in a plan depends on buffer addresses or contents.

_PLANS: dict = {}
_PLANS_MAX = 4096  # distinct layouts kept; past this the cache starts afresh


class _Plan:
    """A planned call: `plan(a, b, g, ga, gb)` launches it on the tensors' device."""

    __slots__ = ("device", "index", "torch")

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        self.index = device.index if device.type == "cuda" else None

    def __call__(self, a, b, g, ga, gb) -> None:
        # triton launches on the current device; switching costs microseconds, so only when needed
        if self.index is None or self.torch.cuda.current_device() == self.index:
            self.run(a, b, g, ga, gb)
        else:
            with self.torch.cuda.device(self.index):
                self.run(a, b, g, ga, gb)

    def steps(self) -> list:
        """The plan's launches (`Step`s; each keeps its compiled kernel after its first launch)."""
        return []

    def signature(self) -> tuple:
        """What the plan launches: equal signatures run the same kernels the same way."""
        return ()


class _ZeroPlan(_Plan):
    """numel(O) == 0: nothing to sum, every gradient is 0."""

    __slots__ = ()

    def run(self, a, b, g, ga, gb) -> None:
        ga.zero_()
        gb.zero_()


class _FlatPlan(_Plan):
    """No broadcast, every tensor contiguous: one `_flat_kernel` launch."""

    __slots__ = ("step",)

    def __init__(self, device, step: Step):
        super().__init__(device)
        self.step = step

    def run(self, a, b, g, ga, gb) -> None:
        self.step.launch(a, b, g, ga, gb)

    def steps(self) -> list:
        return [self.step]

    def signature(self) -> tuple:
        return self.step.signature()


class _TilePlan(_Plan):
    """`_tile_kernel`, then `_sum_partials_kernel` for each gradient written in partials."""

    __slots__ = ("main", "desc", "acc", "ws_a", "ws_b", "sum_a", "sum_b", "launch")

    def __init__(self, device, launch: TileLaunch, itemsize: int, cfg: Config):
        super().__init__(device)
        torch = self.torch
        self.launch = launch
        self.desc = _descriptor(launch.desc, device)
        self.acc = torch.float64 if itemsize == 8 else torch.float32
        kernel = _batch_kernel if launch.kernel == "batch" else _tile_kernel
        self.main = Step(kernel, launch.grid, 8, {**launch.ints, **launch.constexprs}, launch.num_warps)
        numel_ga, numel_gb = launch.grad_numels
        self.ws_a, self.sum_a = self._stage2(launch.parts_a, numel_ga, cfg, launch.scratch_a)
        self.ws_b, self.sum_b = self._stage2(launch.parts_b, numel_gb, cfg, launch.scratch_b)

    def _stage2(self, parts: int, n: int, cfg: Config, scratch: bool = False):
        """(workspace elements, the step that sums them) for a gradient of n elements; (0, None): direct.
        `scratch`: a direct gradient that still needs one workspace row (a running sum)."""
        if parts == 1:
            return (n if scratch else 0), None
        item = 8 if self.acc == self.torch.float64 else 4
        bp, bn = stage2_blocks(parts, n, item, cfg)
        return parts * n, Step(_sum_partials_kernel, cdiv(n, bn), 2, dict(n=n, parts=parts, BP=bp, BN=bn),
                               stage2_warps(bp, bn, item, cfg))

    def run(self, a, b, g, ga, gb) -> None:
        # A fresh workspace per call from torch's caching allocator: stream-ordered, so calls in
        # flight on other streams, devices or CUDA graphs never share one.
        empty = self.torch.empty
        wa = empty(self.ws_a, dtype=self.acc, device=self.device) if self.ws_a else ga
        wb = empty(self.ws_b, dtype=self.acc, device=self.device) if self.ws_b else gb
        self.main.launch(a, b, g, ga, gb, wa, wb, self.desc)
        if self.sum_a:
            self.sum_a.launch(wa, ga)
        if self.sum_b:
            self.sum_b.launch(wb, gb)

    def steps(self) -> list:
        return [s for s in (self.main, self.sum_a, self.sum_b) if s]

    def signature(self) -> tuple:
        return (self.main.signature(), self.ws_a, self.ws_b,
                self.sum_a and self.sum_a.signature(), self.sum_b and self.sum_b.signature())


def _descriptor(values: list[int], device):
    import torch

    return torch.tensor(values or [0], dtype=torch.int64, device=device)


def _sm_count(device) -> int:
    n = _SMS.get(device.index)
    if n is None:
        import torch

        n = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


_SMS: dict = {}  # device index -> SM count


def _build(bplan, fn: str, itemsize: int, cfg: Config, device, tensors: tuple | None = None) -> _Plan:
    """The launch plan of a call with broadcast plan `bplan`, sized by `cfg`.  With the call's
    tensors on CUDA, a split loop is sized from the compiled kernel's occupancy."""
    if bplan.numel == 0:
        return _ZeroPlan(device)
    if bplan.contiguous_fast_path():
        n = bplan.numel
        block, warps = flat_block(n, itemsize, cfg)
        return _FlatPlan(device, Step(_flat_kernel, cdiv(n, block), 5,
                                      dict(n=n, FN=fn, IS_F64=itemsize == 8, BLOCK=block), warps))
    on_gpu = device.type == "cuda"
    sms = cfg.sms or (_sm_count(device) if on_gpu else 132)
    ask = None
    if on_gpu and tensors is not None:

        def ask(L: TileLaunch):  # the split variant compiled now (the launch then finds it in the cache)
            import torch

            a, b, g, ga, gb = tensors
            acc = torch.float64 if itemsize == 8 else torch.float32
            wa = torch.empty(16, dtype=acc, device=device) if L.parts_a > 1 else ga
            wb = torch.empty(16, dtype=acc, device=device) if L.parts_b > 1 else gb
            res = _resources(_tile_kernel, (a, b, g, ga, gb, wa, wb, _descriptor(L.desc, device)),
                             {**L.ints, **L.constexprs}, L.num_warps)
            return _occupancy(res, L.num_warps, device)

    return _TilePlan(device, plan_tile(bplan, itemsize, fn, cfg, sms, ask), itemsize, cfg)


def _key(fn: str, a, b, g, ga, gb, cfg) -> tuple:
    return (fn, cfg, a.dtype, a.device, a.shape, b.shape, a.stride(), b.stride(), g.stride(),
            a.data_ptr() & 15 == 0, b.data_ptr() & 15 == 0, g.data_ptr() & 15 == 0,
            ga.data_ptr() & 15 == 0, gb.data_ptr() & 15 == 0)


def _call(fn: str, a, b, g, ga, gb, cfg: Config | None = None, tune: bool = False) -> None:
    """Launch binary_backward on checked tensors; plan on the first call of a layout.

    cfg None: the default sizing for the device (on CUDA, the autotuned one: see `_autotune`);
    tune: a missing tuning choice may be settled now (the checked entry only).
    """
    key = _key(fn, a, b, g, ga, gb, cfg)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _new_plan(key, fn, a, b, g, ga, gb, cfg, tune)
    plan(a, b, g, ga, gb)


def _new_plan(key: tuple, fn: str, a, b, g, ga, gb, cfg: Config | None, tune: bool) -> _Plan:
    if IMPORT_ERROR is not None:
        raise RuntimeError(f"triton {OP}: triton is not importable ({IMPORT_ERROR})")
    with on_device(a):
        bplan = bcast.make_plan(tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), g.stride())
        item = a.element_size()
        if cfg is not None:
            plan = _build(bplan, fn, item, cfg, a.device, (a, b, g, ga, gb))
        elif a.device.type != "cuda":
            plan = _build(bplan, fn, item, INTERPRETER_CONFIG, a.device)
        else:
            plan = _auto_plan(bplan, fn, item, (a, b, g, ga, gb), tune)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def clear_plans() -> None:
    """Forget every cached plan (tests; a process that changes many layouts)."""
    _PLANS.clear()


# ============================================================================= autotuning
#
# Large CUDA calls (TUNE_MIN_BYTES of traffic or more) pick their Config among a few candidates
# per shape class (`tune_class`: the fn; flat or tile; which class is on the contiguous axis;
# which reductions run and how long the looped one is; dtype size), timed on the call's own
# tensors.  The fn is part of the class: pow needs several times the registers of mul, so a
# sizing that suits mul can spill for pow (a 16 KiB-per-program flat pow chosen on mul's
# timings spilled 600 bytes a thread and took 3.4 ms instead of 0.23).  A candidate whose
# compiled kernel spills (over SPILL_LIMIT bytes) is never chosen over the default.  The choice is kept per device and
# class, for the life of the process.  Only the checked entry (`binary_backward`, the
# registered function) tunes; `binary_backward.unchecked`, what timed loops call, never does:
# the harness calls the checked function first, which settles the choice, and the plan it
# builds is the one every later call of the layout reuses.  Deterministic: the choice is made
# before the call's own launch and never changes after, so every call of a layout runs the
# same kernels with the same sizing and the same summation order.  (Two processes may choose
# differently on near ties: the default wins unless another candidate is TUNE_MARGIN faster;
# GRADORACLE_TRITON_TUNE=0 turns tuning off, GRADORACLE_TRITON_BINARY=<preset> pins a sizing.)
# Smaller calls always use the defaults.

TUNE_MIN_BYTES = 128 << 20   # well past L2 (50 MiB on H100): back-to-back timings read DRAM
TUNE_MARGIN = 0.02
SPILL_LIMIT = 16  # bytes a thread may spill (a value parked across the loop) and still be chosen
_TUNED: dict = {}        # (device index, tune class) -> Config
TUNING_LOG: dict = {}    # (device index, tune class) -> what was tried: configs, ms, spills, the choice


def tune_class(bplan, itemsize: int, fn: str = "mul") -> tuple:
    """The shape class a tuning choice is kept for."""
    if bplan.contiguous_fast_path():
        return ("flat", fn, itemsize)
    if batch_path(bplan):
        return ("batch", fn, itemsize)
    ext, inner, loop, fixed = _roles(bplan, replace(GPU_CONFIG, loop_inner=True))
    role = "k" if inner == "k" else ("loop" if inner == loop else "fixed")
    length = 0 if ext[loop] < 256 else 1 if ext[loop] < 4096 else 2
    return ("tile", fn, role, ext[loop] > 1, ext[fixed] > 1, length, itemsize)


def candidates(cls: tuple) -> list[Config]:
    """Configs tried for a tune class, the default first.  Every one keeps a thread's values
    per tensor at 16-32 bytes or, in the flat kernel, at most 64: no spills for any fn."""
    g = GPU_CONFIG
    if cls[0] == "flat":
        fn = cls[1]
        if fn == "pow":  # about 3 registers per value: 8 values a thread
            return [replace(g, flat_bytes=4096, flat_vectors=1), replace(g, flat_bytes=8192, flat_vectors=2),
                    replace(g, flat_bytes=8192, flat_vectors=1)]
        return [g, replace(g, flat_bytes=8192, flat_vectors=2), replace(g, flat_bytes=4096, flat_vectors=1),
                replace(g, flat_bytes=16384, flat_vectors=2)]
    if cls[0] == "batch":  # fewer batches a tile (more programs an SM), and the generic tile kernel
        return [g, replace(g, prefetch=False), replace(g, batch_tile=4), replace(g, batch_tile=0)]
    _, fn, role, loop_reduces, fixed_reduces, _, _ = cls
    wide = replace(g, tile_bytes=4096, vectors=2)
    if role == "k" and loop_reduces:  # column strips of K, rows summed: the bias-gradient shape
        out = [g, replace(g, prefetch=False), wide, replace(g, inner_bytes=512),
               replace(g, inner_bytes=2048, partial_share=0.03)]
        if fn in ("add", "sub"):  # grad_out is the only read: room for four vectors a thread (PRESETS["wide4"])
            out.append(replace(g, tile_bytes=8192, vectors=4))
        return out
    if role == "loop" and fixed_reduces:  # both reduce, the looped one contiguous
        return [g, replace(g, prefetch=False), replace(g, row_bytes=16384), replace(g, loop_inner=True)]
    if role == "loop":  # the contiguous class is the one summed: row sums, a few steps a row (no prefetch)
        return [replace(g, prefetch=False), g, wide, replace(g, tile_bytes=8192, vectors=2, prefetch=False)]
    return [g, replace(g, prefetch=False), wide]


def _preset() -> Config | None:
    """The sizing $GRADORACLE_TRITON_BINARY pins (None: tune)."""
    name = os.environ.get(PRESET_ENV, "")
    if not name:
        return None
    if name not in PRESETS:
        raise ValueError(f"triton {OP}: ${PRESET_ENV}: expected one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[name]


def _auto_plan(bplan, fn: str, itemsize: int, tensors: tuple, tune: bool) -> _Plan:
    """The plan with the default sizing, or for a large call its class's tuned sizing (settled
    now, by timing the candidates, when `tune` and no choice exists yet)."""
    device = tensors[0].device
    pinned = _preset()
    if pinned is not None:
        return _build(bplan, fn, itemsize, pinned, device, tensors)
    if bplan.numel == 0 or min_bytes(bplan, itemsize) < TUNE_MIN_BYTES or not tuning_on():
        return _build(bplan, fn, itemsize, candidates(tune_class(bplan, itemsize, fn))[0], device, tensors)
    tkey = (device.index, tune_class(bplan, itemsize, fn))
    cfg = _TUNED.get(tkey)
    if cfg is None and tune and not capturing(device):
        return _autotune(tkey, bplan, fn, itemsize, tensors)
    return _build(bplan, fn, itemsize, cfg or candidates(tkey[1])[0], device, tensors)


def _time_ms(plan: _Plan, tensors: tuple) -> float:
    """The plan's time on `tensors` (common.time_ms; a seam the tests replace)."""
    return time_ms(lambda: plan(*tensors))


def plan_spills(plan: _Plan) -> int:
    """Bytes a thread spills in the plan's worst launch (0 where the compiled kernels do not say)."""
    return max([(s.resources() or {}).get("spills", 0) for s in plan.steps()] or [0])


def _autotune(tkey: tuple, bplan, fn: str, itemsize: int, tensors: tuple) -> _Plan:
    """Time each candidate of the class on this call's tensors; keep the fastest (the default
    unless another is TUNE_MARGIN faster; never one that spills) and return its plan, compiled."""
    device = tensors[0].device
    tried, plans, seen = [], [], {}
    for i, cfg in enumerate(candidates(tkey[1])):
        plan = _build(bplan, fn, itemsize, cfg, device, tensors)
        sig = plan.signature()
        if sig in seen:  # this shape plans the same launches under both configs
            tried.append({"config": cfg, "same_as": seen[sig]})
            plans.append(None)
            continue
        seen[sig] = i
        try:
            ms = _time_ms(plan, tensors)
        except Exception as exc:  # noqa: BLE001 - e.g. out of resources: that candidate is out
            if i == 0:
                raise
            tried.append({"config": cfg, "error": f"{type(exc).__name__}: {exc}"[:300]})
            plans.append(None)
            continue
        spills = plan_spills(plan)
        tried.append({"config": cfg, "ms": ms, "spills": spills})
        plans.append(plan)
    timed = [(t["ms"], i) for i, t in enumerate(tried) if "ms" in t and (i == 0 or t["spills"] <= SPILL_LIMIT)]
    best_ms, best = min(timed)
    if best_ms > (1 - TUNE_MARGIN) * tried[0]["ms"]:
        best = 0
    _TUNED[tkey] = tried[best]["config"]
    TUNING_LOG[tkey] = {"tried": tried, "chosen": best, "case_bytes": min_bytes(bplan, itemsize)}
    return plans[best]


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
    fn, a, b, g, ga, gb = _validate(inputs, outs, params)
    _call(fn, a, b, g, ga, gb, cfg)


@triton_backend.impl(OP, dtypes=DTYPES, deterministic=True)
def binary_backward(inputs, outs, params):
    """The checked entry: the kernel's own checks first (their messages are pinned by
    tests/test_triton_interpret.py), then the op's shared ones (unexpected names, the params'
    shapes); on a layout's first call it plans, and on CUDA may settle the autotuning choice."""
    fn, a, b, g, ga, gb = _validate(inputs, outs, params)
    argcheck.check_impl(_IMPL, inputs, outs, params)
    _call(fn, a, b, g, ga, gb, None, True)


_IMPL = triton_backend.impls[(OP, DEFAULT_VARIANT)]


def _unchecked(inputs, outs, params):
    """What timed loops call (`registry.timed_callable`), once the checked entry has passed on
    alike arguments: no checks, no tuning; a cached plan and its launches."""
    _call(params["fn"], inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"])


binary_backward.unchecked = _unchecked


def _variant(name: str, cfg: Config):
    """`triton@<name>`: binary_backward with the sizing `cfg` pinned (no tuning), checked and unchecked."""

    def checked(inputs, outs, params):
        fn, a, b, g, ga, gb = _validate(inputs, outs, params)
        argcheck.check_impl(triton_backend.impls[(OP, name)], inputs, outs, params)
        _call(fn, a, b, g, ga, gb, cfg)

    def unchecked(inputs, outs, params):
        _call(params["fn"], inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"], cfg)

    checked.unchecked = unchecked
    checked.__doc__ = f"binary_backward sized by the preset {name!r}: {cfg}"
    triton_backend.impl(OP, variant=name, dtypes=DTYPES, deterministic=True)(checked)


def _register_variants() -> None:
    """The presets named in $GRADORACLE_TRITON_VARIANTS (comma-separated; "all": every one)."""
    names = [v.strip() for v in os.environ.get(VARIANTS_ENV, "").split(",") if v.strip()]
    if names == ["all"]:
        names = list(PRESETS)
    for name in names:
        if name not in PRESETS:
            raise ValueError(f"triton {OP}: ${VARIANTS_ENV}: expected names from {', '.join(PRESETS)} "
                             f"(or all), got {name!r}")
        _variant(name, PRESETS[name])


_preset()  # a bad $GRADORACLE_TRITON_BINARY fails at import, with its message
_register_variants()
