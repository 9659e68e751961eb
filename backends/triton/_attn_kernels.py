"""The Triton kernels of attention_backward (FlashAttention-2 structure); host side in attention_backward.py.

    _attn_pre_kernel    per query row: delta = rowsum(o * do) and lse2 = lse * log2(e) (the
                        exponent base the main kernels use), both 0 / +inf on a row with no
                        allowed key; optionally zeroes the float32 dq accumulator
    _attn_dkdv_kernel   one program per (key block, batch, kv head): dk, dv in registers over
                        the query blocks of every query head of the group; with ATOMIC_DQ it
                        also adds dS k into the dq accumulator by float atomics
    _attn_dq_kernel     the deterministic dq: one program per (query block, batch, query head),
                        dq in registers over the key blocks
    _attn_cast_kernel   dq accumulator * scale -> dq in the output dtype
    _attn_sum_kernel    dk, dv from the partials of a split group (GQA with too few programs)

Mask: query i may see key j iff j >= i + off - LEFT (HAS_LEFT) and j <= i + off + RIGHT
(HAS_RIGHT), off = Sk - Sq (aligned bottom-right; the host folds causal into RIGHT = 0).
Each program walks only the blocks of the band that touch its rows or keys, in three loops:
masked blocks before the fully allowed ones, the fully allowed ones (no mask arithmetic at
all), masked blocks after.  Block ranges come from signed floor / ceil divisions done on
non-negative operands (triton's integer division truncates on the GPU, floors in the
interpreter).

Constants (scale, softcap, log2 e) come from a small device tensor in the accumulation dtype:
a float argument is float32 in triton, which would cost float64 cases their digits.
    c[0] qk_mul  = scale * log2e          (scale for float64, which uses exp)
    c[1] cap_in  = scale / softcap
    c[2] cap_out = softcap * log2e        (softcap for float64)
    c[3] dscale  = scale                  (dq, dk are scale * sums of dS)
    c[4] log2e                            (1 for float64)
"""
from __future__ import annotations

from backends.triton.common import INTERPRETER, jit, tl
from backends.triton.common import to_out as _to_out


@jit
def _floor_div(x, d: tl.constexpr):
    """floor(x / d) for any sign of x (d > 0)."""
    return tl.where(x >= 0, x // d, -((-x + d - 1) // d))


@jit
def _ceil_div(x, d: tl.constexpr):
    """ceil(x / d) for any sign of x (d > 0)."""
    return tl.where(x >= 0, (x + d - 1) // d, -((-x) // d))


@jit
def _exp(x, IS_F64: tl.constexpr):
    if IS_F64:
        y = tl.exp(x)
    else:
        y = tl.exp2(x)
    return y


@jit
def _tanh(x, IS_F64: tl.constexpr):
    """tanh from one exponential (no libdevice in the interpreter); absolute error ~u."""
    if IS_F64:
        e = tl.exp(-2.0 * tl.abs(x))
    else:
        e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b accumulated in float32 (float64); ieee: no TF32 for float32 inputs."""
    if INTERPRETER and a.dtype == tl.bfloat16:
        # The interpreter's dot misreads bfloat16 (numpy has none); the products of bfloat16
        # values are exact in float32, so this is the GPU's sum.
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == "ieee":
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@jit
def _round(x, like):
    """x in the dtype of `like`, rounded to nearest even (the interpreter truncates to
    bfloat16, so there the rounding is done on the bits, as common.to_out does)."""
    if INTERPRETER and like.dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(like.dtype)
    return y


# ----------------------------------------------------------------------------- preprocess


# Sizes and band limits vary from call to call and gain nothing from triton's specialisation
# (divisible by 16, equal to 1): left unspecialised, they do not multiply the compiles.
_SIZES = ["Sq", "Sk", "Hq", "Hkv", "G", "SPLIT", "D", "LEFT", "RIGHT"]


@jit(do_not_specialize=[n for n in _SIZES if n not in ("Hkv", "G", "SPLIT")])
def _attn_pre_kernel(o_ptr, do_ptr, lse_ptr, c_ptr, delta_ptr, lse2_ptr, dqa_ptr,
                     so_b, so_s, so_h, so_d, sd_b, sd_s, sd_h, sd_d, sl_b, sl_h, sl_s,
                     Sq, Sk, Hq, D, LEFT, RIGHT,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ZERO_DQ: tl.constexpr,
                     IS_F64: tl.constexpr, BM: tl.constexpr, DP: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = tl.arange(0, DP)
    rm = rows < Sq
    m2 = rm[:, None] & (cols < D)[None, :]
    o = tl.load(o_ptr + b * so_b + h * so_h + rows.to(tl.int64)[:, None] * so_s + cols[None, :] * so_d,
                mask=m2, other=0.0)
    do = tl.load(do_ptr + b * sd_b + h * sd_h + rows.to(tl.int64)[:, None] * sd_s + cols[None, :] * sd_d,
                 mask=m2, other=0.0)
    if IS_F64:
        delta = tl.sum(o.to(tl.float64) * do.to(tl.float64), axis=1)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    lse = tl.load(lse_ptr + b * sl_b + h * sl_h + rows.to(tl.int64) * sl_s, mask=rm, other=0.0)
    # A row with no allowed key: its lse and o are never read (the spec); +inf makes every p 0.
    diag = rows + (Sk - Sq)
    lo = tl.zeros_like(rows)
    hi = tl.zeros_like(rows) + (Sk - 1)
    if HAS_LEFT:
        lo = tl.maximum(lo, diag - LEFT)
    if HAS_RIGHT:
        hi = tl.minimum(hi, diag + RIGHT)
    live = lo <= hi
    log2e = tl.load(c_ptr + 4)
    lse2 = tl.where(live, lse * log2e, float("inf"))
    delta = tl.where(live, delta, 0.0)
    out = bh.to(tl.int64) * Sq + rows
    tl.store(delta_ptr + out, delta, mask=rm)
    tl.store(lse2_ptr + out, lse2, mask=rm)
    if ZERO_DQ:  # the accumulator has dq's layout (B, Sq, Hq, D), contiguous
        acc_off = ((b * Sq + rows.to(tl.int64)[:, None]) * Hq + h) * D + cols[None, :]
        tl.store(dqa_ptr + acc_off, tl.zeros((BM, DP), dtype=dqa_ptr.dtype.element_ty), mask=m2)


# ----------------------------------------------------------------------------- dk, dv (and atomic dq)


@jit
def _dkdv_step(dk_acc, dv_acc, kt, vt, q_base, do_base, l2_base, di_base, dqa_base, m0,
               cols_n, dcols, dm, sq_s, sq_d, sd_s, sd_d, sa_s, Sq, Sk, LEFT, RIGHT,
               qk_mul, cap_in, cap_out,
               MASK: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
               ATOMIC_DQ: tl.constexpr, IS_F64: tl.constexpr, PREC: tl.constexpr, EVEN_D: tl.constexpr,
               BM: tl.constexpr):
    """One query block against the program's key block: dv += P^T do, dk += dS^T q (unscaled)."""
    rows = m0 + tl.arange(0, BM)
    r64 = rows.to(tl.int64)
    if MASK:
        rm = rows < Sq
        lm = rm[:, None] & dm[None, :]
        q = tl.load(q_base + r64[:, None] * sq_s + dcols[None, :] * sq_d, mask=lm, other=0.0)
        do = tl.load(do_base + r64[:, None] * sd_s + dcols[None, :] * sd_d, mask=lm, other=0.0)
        l2 = tl.load(l2_base + rows, mask=rm, other=float("inf"))
        di = tl.load(di_base + rows, mask=rm, other=0.0)
    else:
        if EVEN_D:
            q = tl.load(q_base + r64[:, None] * sq_s + dcols[None, :] * sq_d)
            do = tl.load(do_base + r64[:, None] * sd_s + dcols[None, :] * sd_d)
        else:
            q = tl.load(q_base + r64[:, None] * sq_s + dcols[None, :] * sq_d, mask=dm[None, :], other=0.0)
            do = tl.load(do_base + r64[:, None] * sd_s + dcols[None, :] * sd_d, mask=dm[None, :], other=0.0)
        l2 = tl.load(l2_base + rows)
        di = tl.load(di_base + rows)
    st = _dot(kt, tl.trans(q), PREC)  # (BN, BM) raw scores q.k
    if SOFTCAP:
        th = _tanh(st * cap_in, IS_F64)
        tt = th * cap_out
    else:
        tt = st * qk_mul
    pt = _exp(tt - l2[None, :], IS_F64)
    if MASK:
        diag = rows + (Sk - Sq)
        ok = (cols_n < Sk)[:, None] & (rows < Sq)[None, :]
        if HAS_RIGHT:
            ok = ok & (cols_n[:, None] <= diag[None, :] + RIGHT)
        if HAS_LEFT:
            ok = ok & (cols_n[:, None] >= diag[None, :] - LEFT)
        pt = tl.where(ok, pt, 0.0)
    dv_acc += _dot(_round(pt, kt), do, PREC)
    dpt = _dot(vt, tl.trans(do), PREC)
    dst = pt * (dpt - di[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - th * th)
    ds16 = _round(dst, kt)
    dk_acc += _dot(ds16, q, PREC)
    if ATOMIC_DQ:
        dq = _dot(tl.trans(ds16), kt, PREC)  # (BM, DP)
        ptrs = dqa_base + r64[:, None] * sa_s + dcols[None, :]
        if MASK:
            tl.atomic_add(ptrs, dq, mask=(rows < Sq)[:, None] & dm[None, :], sem="relaxed")
        elif EVEN_D:
            tl.atomic_add(ptrs, dq, sem="relaxed")
        else:
            tl.atomic_add(ptrs, dq, mask=dm[None, :], sem="relaxed")
    return dk_acc, dv_acc


@jit(do_not_specialize=_SIZES)
def _attn_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, c_ptr, dk_ptr, dv_ptr, dqa_ptr,
                      sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d,
                      sd_b, sd_s, sd_h, sd_d, sdk_p, sdk_b, sdk_s, sdk_h, sdv_p, sdv_b, sdv_s, sdv_h,
                      Sq, Sk, Hq, Hkv, G, SPLIT, D, LEFT, RIGHT,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                      ATOMIC_DQ: tl.constexpr, IS_F64: tl.constexpr, PREC: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, EVEN_D: tl.constexpr):
    """SPLIT > 1: the G query heads of a kv head are shared by SPLIT programs, each writing its
    partial dk, dv (float32 / float64) at dk_ptr + split * sdk_p; _attn_sum_kernel adds them."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    sp = bh % SPLIT
    bh = bh // SPLIT
    b = (bh // Hkv).to(tl.int64)
    hk = bh % Hkv
    n0 = pid_n * BN
    cols_n = n0 + tl.arange(0, BN)
    n64 = cols_n.to(tl.int64)
    dcols = tl.arange(0, DP)
    dm = dcols < D
    km = (cols_n < Sk)[:, None] & dm[None, :]
    kt = tl.load(k_ptr + b * sk_b + hk.to(tl.int64) * sk_h + n64[:, None] * sk_s + dcols[None, :] * sk_d,
                 mask=km, other=0.0)
    vt = tl.load(v_ptr + b * sv_b + hk.to(tl.int64) * sv_h + n64[:, None] * sv_s + dcols[None, :] * sv_d,
                 mask=km, other=0.0)
    if IS_F64:
        acc_ty = tl.float64
    else:
        acc_ty = tl.float32
    dk_acc = tl.zeros((BN, DP), dtype=acc_ty)
    dv_acc = tl.zeros((BN, DP), dtype=acc_ty)
    qk_mul = tl.load(c_ptr)
    cap_in = tl.load(c_ptr + 1)
    cap_out = tl.load(c_ptr + 2)
    dscale = tl.load(c_ptr + 3)

    off = Sk - Sq
    # Query rows that see any key of [n0, n0 + BN): i + off + RIGHT >= n0, i + off - LEFT <= n0 + BN - 1.
    i_lo = pid_n * 0
    i_hi = i_lo + (Sq - 1)
    if HAS_RIGHT:
        i_lo = tl.maximum(i_lo, n0 - off - RIGHT)
    if HAS_LEFT:
        i_hi = tl.minimum(i_hi, n0 + BN - 1 - off + LEFT)
    m_begin = _floor_div(i_lo, BM)
    m_end = tl.where(i_hi >= i_lo, _floor_div(i_hi, BM) + 1, m_begin)
    # Fully allowed blocks: rows inside Sq, keys inside Sk, the whole tile inside the band.
    a = m_begin
    z = i_lo * 0 + Sq // BM
    if HAS_RIGHT:  # m0 + off + RIGHT >= n0 + BN - 1
        a = tl.maximum(a, _ceil_div(n0 + BN - 1 - off - RIGHT, BM))
    if HAS_LEFT:  # m0 + BM - 1 + off - LEFT <= n0
        z = tl.minimum(z, _floor_div(n0 + LEFT - off - BM + 1, BM) + 1)
    z = tl.where(n0 + BN <= Sk, z, a)
    a = tl.minimum(a, m_end)
    z = tl.minimum(tl.maximum(z, a), m_end)

    per = G // SPLIT
    for hh in range(sp * per, sp * per + per):
        h = (hk * G + hh).to(tl.int64)
        q_base = q_ptr + b * sq_b + h * sq_h
        do_base = do_ptr + b * sd_b + h * sd_h
        row0 = (b * Hq + h) * Sq
        l2_base = lse2_ptr + row0
        di_base = delta_ptr + row0
        dqa_base = dqa_ptr + (b * Sq * Hq + h) * D  # (B, Sq, Hq, D) contiguous: row stride Hq * D
        for m in range(m_begin, a):
            dk_acc, dv_acc = _dkdv_step(dk_acc, dv_acc, kt, vt, q_base, do_base, l2_base, di_base, dqa_base,
                                        m * BM, cols_n, dcols, dm, sq_s, sq_d, sd_s, sd_d, Hq * D, Sq, Sk,
                                        LEFT, RIGHT, qk_mul, cap_in, cap_out, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                        ATOMIC_DQ, IS_F64, PREC, EVEN_D, BM)
        for m in range(a, z):
            dk_acc, dv_acc = _dkdv_step(dk_acc, dv_acc, kt, vt, q_base, do_base, l2_base, di_base, dqa_base,
                                        m * BM, cols_n, dcols, dm, sq_s, sq_d, sd_s, sd_d, Hq * D, Sq, Sk,
                                        LEFT, RIGHT, qk_mul, cap_in, cap_out, False, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                        ATOMIC_DQ, IS_F64, PREC, EVEN_D, BM)
        for m in range(z, m_end):
            dk_acc, dv_acc = _dkdv_step(dk_acc, dv_acc, kt, vt, q_base, do_base, l2_base, di_base, dqa_base,
                                        m * BM, cols_n, dcols, dm, sq_s, sq_d, sd_s, sd_d, Hq * D, Sq, Sk,
                                        LEFT, RIGHT, qk_mul, cap_in, cap_out, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                                        ATOMIC_DQ, IS_F64, PREC, EVEN_D, BM)

    hk64 = hk.to(tl.int64)
    sp64 = sp.to(tl.int64)
    dk_ptrs = dk_ptr + sp64 * sdk_p + b * sdk_b + hk64 * sdk_h + n64[:, None] * sdk_s + dcols[None, :]
    dv_ptrs = dv_ptr + sp64 * sdv_p + b * sdv_b + hk64 * sdv_h + n64[:, None] * sdv_s + dcols[None, :]
    tl.store(dk_ptrs, _to_out(dk_acc * dscale, dk_ptr), mask=km)
    tl.store(dv_ptrs, _to_out(dv_acc, dv_ptr), mask=km)


# ----------------------------------------------------------------------------- deterministic dq


@jit
def _dq_step(dq_acc, q, do, l2, di, rows, k_base, v_base, n0, dcols, dm, sk_s, sk_d, sv_s, sv_d,
             Sq, Sk, LEFT, RIGHT, qk_mul, cap_in, cap_out,
             MASK: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
             IS_F64: tl.constexpr, PREC: tl.constexpr, EVEN_D: tl.constexpr, BN: tl.constexpr):
    """One key block against the program's query block: dq += dS k (unscaled)."""
    cols_n = n0 + tl.arange(0, BN)
    n64 = cols_n.to(tl.int64)
    if MASK:
        km = (cols_n < Sk)[:, None] & dm[None, :]
        kt = tl.load(k_base + n64[:, None] * sk_s + dcols[None, :] * sk_d, mask=km, other=0.0)
        vt = tl.load(v_base + n64[:, None] * sv_s + dcols[None, :] * sv_d, mask=km, other=0.0)
    elif EVEN_D:
        kt = tl.load(k_base + n64[:, None] * sk_s + dcols[None, :] * sk_d)
        vt = tl.load(v_base + n64[:, None] * sv_s + dcols[None, :] * sv_d)
    else:
        kt = tl.load(k_base + n64[:, None] * sk_s + dcols[None, :] * sk_d, mask=dm[None, :], other=0.0)
        vt = tl.load(v_base + n64[:, None] * sv_s + dcols[None, :] * sv_d, mask=dm[None, :], other=0.0)
    s = _dot(q, tl.trans(kt), PREC)  # (BM, BN)
    if SOFTCAP:
        th = _tanh(s * cap_in, IS_F64)
        t = th * cap_out
    else:
        t = s * qk_mul
    p = _exp(t - l2[:, None], IS_F64)
    if MASK:
        diag = rows + (Sk - Sq)
        ok = (rows < Sq)[:, None] & (cols_n < Sk)[None, :]
        if HAS_RIGHT:
            ok = ok & (cols_n[None, :] <= diag[:, None] + RIGHT)
        if HAS_LEFT:
            ok = ok & (cols_n[None, :] >= diag[:, None] - LEFT)
        p = tl.where(ok, p, 0.0)
    dp = _dot(do, tl.trans(vt), PREC)
    ds = p * (dp - di[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - th * th)
    dq_acc += _dot(_round(ds, kt), kt, PREC)
    return dq_acc


@jit(do_not_specialize=[n for n in _SIZES if n not in ("Hkv", "SPLIT")])
def _attn_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, c_ptr, dq_ptr,
                    sq_b, sq_s, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d,
                    sd_b, sd_s, sd_h, sd_d, sdq_b, sdq_s, sdq_h,
                    Sq, Sk, Hq, G, D, LEFT, RIGHT,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
                    IS_F64: tl.constexpr, PREC: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, EVEN_D: tl.constexpr):
    # The last query blocks first: under a causal mask they see the most keys (longest first
    # leaves no long program for the tail of the grid).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    h64 = h.to(tl.int64)
    hk = (h // G).to(tl.int64)
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    r64 = rows.to(tl.int64)
    rm = rows < Sq
    dcols = tl.arange(0, DP)
    dm = dcols < D
    lm = rm[:, None] & dm[None, :]
    q = tl.load(q_ptr + b * sq_b + h64 * sq_h + r64[:, None] * sq_s + dcols[None, :] * sq_d, mask=lm, other=0.0)
    do = tl.load(do_ptr + b * sd_b + h64 * sd_h + r64[:, None] * sd_s + dcols[None, :] * sd_d, mask=lm, other=0.0)
    row0 = (b * Hq + h64) * Sq
    l2 = tl.load(lse2_ptr + row0 + rows, mask=rm, other=float("inf"))
    di = tl.load(delta_ptr + row0 + rows, mask=rm, other=0.0)
    if IS_F64:
        dq_acc = tl.zeros((BM, DP), dtype=tl.float64)
    else:
        dq_acc = tl.zeros((BM, DP), dtype=tl.float32)
    qk_mul = tl.load(c_ptr)
    cap_in = tl.load(c_ptr + 1)
    cap_out = tl.load(c_ptr + 2)
    dscale = tl.load(c_ptr + 3)

    off = Sk - Sq
    # Keys that any row of [m0, m0 + BM) sees: j >= m0 + off - LEFT, j <= m0 + BM - 1 + off + RIGHT.
    j_lo = pid_m * 0
    j_hi = j_lo + (Sk - 1)
    if HAS_LEFT:
        j_lo = tl.maximum(j_lo, m0 + off - LEFT)
    if HAS_RIGHT:
        j_hi = tl.minimum(j_hi, m0 + BM - 1 + off + RIGHT)
    n_begin = _floor_div(j_lo, BN)
    n_end = tl.where(j_hi >= j_lo, _floor_div(j_hi, BN) + 1, n_begin)
    a = n_begin
    z = j_lo * 0 + Sk // BN
    if HAS_LEFT:  # n0 >= m0 + BM - 1 + off - LEFT
        a = tl.maximum(a, _ceil_div(m0 + BM - 1 + off - LEFT, BN))
    if HAS_RIGHT:  # n0 + BN - 1 <= m0 + off + RIGHT
        z = tl.minimum(z, _floor_div(m0 + off + RIGHT - BN + 1, BN) + 1)
    z = tl.where(m0 + BM <= Sq, z, a)
    a = tl.minimum(a, n_end)
    z = tl.minimum(tl.maximum(z, a), n_end)

    k_base = k_ptr + b * sk_b + hk * sk_h
    v_base = v_ptr + b * sv_b + hk * sv_h
    for n in range(n_begin, a):
        dq_acc = _dq_step(dq_acc, q, do, l2, di, rows, k_base, v_base, n * BN, dcols, dm, sk_s, sk_d, sv_s, sv_d,
                          Sq, Sk, LEFT, RIGHT, qk_mul, cap_in, cap_out, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                          IS_F64, PREC, EVEN_D, BN)
    for n in range(a, z):
        dq_acc = _dq_step(dq_acc, q, do, l2, di, rows, k_base, v_base, n * BN, dcols, dm, sk_s, sk_d, sv_s, sv_d,
                          Sq, Sk, LEFT, RIGHT, qk_mul, cap_in, cap_out, False, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                          IS_F64, PREC, EVEN_D, BN)
    for n in range(z, n_end):
        dq_acc = _dq_step(dq_acc, q, do, l2, di, rows, k_base, v_base, n * BN, dcols, dm, sk_s, sk_d, sv_s, sv_d,
                          Sq, Sk, LEFT, RIGHT, qk_mul, cap_in, cap_out, True, HAS_LEFT, HAS_RIGHT, SOFTCAP,
                          IS_F64, PREC, EVEN_D, BN)
    dq_ptrs = dq_ptr + b * sdq_b + h64 * sdq_h + r64[:, None] * sdq_s + dcols[None, :]
    tl.store(dq_ptrs, _to_out(dq_acc * dscale, dq_ptr), mask=lm)


# ----------------------------------------------------------------------------- dq accumulator -> dq


@jit(do_not_specialize=["n"])
def _attn_cast_kernel(dqa_ptr, c_ptr, dq_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(dqa_ptr + offs, mask=m, other=0.0) * tl.load(c_ptr + 3)
    tl.store(dq_ptr + offs, _to_out(x, dq_ptr), mask=m)


# ----------------------------------------------------------------------------- split dk, dv partials -> dk, dv


@jit(do_not_specialize=["n", "SPLIT"])
def _attn_sum_kernel(dkp_ptr, dvp_ptr, dk_ptr, dv_ptr, n, SPLIT, BLOCK: tl.constexpr):
    """dk, dv = the sums of SPLIT partials (contiguous, n elements apart), added in a fixed order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    pk = dkp_ptr + offs
    pv = dvp_ptr + offs
    ak = tl.load(pk, mask=m, other=0.0)
    av = tl.load(pv, mask=m, other=0.0)
    for _ in range(1, SPLIT):  # pointers step by n (64-bit sums: SPLIT * n may pass 2**31)
        pk += n
        pv += n
        ak += tl.load(pk, mask=m, other=0.0)
        av += tl.load(pv, mask=m, other=0.0)
    tl.store(dk_ptr + offs, _to_out(ak, dk_ptr), mask=m)
    tl.store(dv_ptr + offs, _to_out(av, dv_ptr), mask=m)
