"""attention_backward: gradients of scaled dot-product attention (flash-attention's backward).

Inputs (flash-attention's layout, heads next to last):

    q        (B, Sq, Hq, D)    queries                      case dtype
    k, v     (B, Sk, Hkv, D)   keys, values                 case dtype
    o        (B, Sq, Hq, D)    the forward's output         case dtype (as the forward stores it)
    do       (B, Sq, Hq, D)    cotangent of o               case dtype
    lse      (B, Hq, Sq)       the forward's log-sum-exp    float32 (float64 in f64 cases), natural log

Params: softmax_scale (default 1/sqrt(D)); causal; window = (left, right), -1 meaning
unbounded; softcap (0 = off).  Outputs: dq (like q), dk and dv (like k), in the case dtype.

Heads (GQA/MQA).  Hq is a multiple of Hkv; g = Hq / Hkv.  Query head h reads kv head
h // g, so dk and dv of kv head c sum over the query heads c*g ... c*g + g - 1.

Mask (flash-attention's `attention_ref`, aligned to the bottom right).  With
off = Sk - Sq, query i may attend key j iff

    (not causal  or j <= i + off)
    and (left < 0  or j >= i + off - left)
    and (right < 0 or j <= i + off + right)

so when Sq != Sk the last query row lines up with the last key, as in flash-attention
(torch SDPA's is_causal is aligned to the top left instead; see backends/baselines/sdpa.py).
causal with a window is the window (left, 0).  A row with no allowed key ("empty": the
first Sq - Sk rows when causal and Sq > Sk, or rows a window misses) has output 0 and
contributes nothing to any gradient: its dq row is 0 and it adds 0 to dk and dv.

Forward, per batch b and query head h (c = h // g its kv head), in exact arithmetic:

    s_ij = scale * q_i . k_j                                   raw scores
    t_ij = softcap * tanh(s_ij / softcap)   (t = s when softcap == 0)
    lse_i = log sum_{j allowed} exp(t_ij)                      (+inf for an empty row, see below)
    P_ij = exp(t_ij - lse_i) if allowed else 0
    o_i  = sum_j P_ij v_j

Backward (the standard formulation, flash-attention 2's algorithm in exact arithmetic):

    dv_j = sum_i P_ij do_i          (also summed over the g query heads of kv head c)
    dP_ij = do_i . v_j
    Di    = do_i . o_i              (= rowsum(do * o))
    dT_ij = P_ij (dP_ij - Di)
    dS_ij = dT_ij * (1 - tanh(s_ij / softcap)**2)   (dS = dT when softcap == 0)
    dq_i = scale * sum_j dS_ij k_j
    dk_j = scale * sum_i dS_ij q_i  (also summed over the group's query heads)

Which o and lse define the answer: THE GIVEN ONES.  P uses the given lse and Di the
given o, exactly as a fused backward kernel (flash-attention, cuDNN, xformers) does: they
are inputs of the op, and a kernel under test receives them rounded as a real forward
stores them (o in the case dtype, lse in float32).  The oracle is therefore the exact
value of what the kernel is asked to compute from the bits it is given; its own
arithmetic is all the kernel is judged on.  (layernorm_backward chose the other way for
its saved mean/rstd, which are float32 and move its gradient by ~u_f32; here o is stored
in the case dtype, and Di from a bf16 o differs from Di from the exact o by ~u_bf16 of
|do||o| -- the size of the whole u_in budget -- so "the exact o" would charge every
fused kernel for the forward's rounding.)  Implementations that recompute the forward
(torch autograd, jax.vjp, SDPA's backends, which all ignore o and lse) compute the exact
gradient of q, k, v instead; the difference between the two is covered by the error
model below (the P * |do*o| term and the lse term of n), and tests/test_oracles.py
checks that on every smoke case (err/tol < 0.5 with the case dtype's tolerance).

Empty rows: the log of an empty sum is -inf, but the stored lse there is +inf, as
flash-attention 2 stores it (`sum == 0 ? INFINITY : ...`): with masked scores at -inf,
exp(-inf - lse) is then 0 for every key, whereas lse = -inf makes a kernel that masks by
-inf compute exp(-inf - -inf) = NaN.  (torch's memory-efficient/xformers forward stores
the mathematical -inf for such a row, and +inf only in the padding past Sq.)  +inf gives
exp(s - lse) = 0 whatever s is, so a backward needs no special case for empty rows.  The
oracle never reads lse on an empty row (any value, +inf, -inf or NaN, gives the zero
row), nor o there.

The JAX oracle (attention_backward_jax) is jax.vjp of a JAX forward -- the softmax of
the masked, capped, scaled scores, times v -- with respect to q, k, v at cotangent do.
It never sees o or lse: it recomputes them.  It agrees with this spec because o and lse
are functions of q, k, v: with the exact o and lse (exact_inputs below) the numpy
formulas are jax.vjp's derivative, to float64 rounding (tests/test_oracles.py checks
1e-13, and both against central differences of sum(do * o(q, k, v))).  With the stored,
rounded o and lse they differ by the rounding, which is inside the tolerance (above).

dtypes: q, k, v, o, do, dq, dk, dv in the case dtype; lse float32 (float64 in f64 cases:
there every other input is exact, and a float32 lse would move P by ~1e-7 relative,
10^9 times the float64 tolerance).  Implementations compute scores, softmax and all
sums in at least float32 and may round P and dS to the input dtype before the matmuls
(flash-attention does).

Error model (see harness/compare.py: tol = u_out|r| + 8 (u_in + u_acc sqrt(n)) s + tiny,
s the L2 norm of the terms an output element is made of).  The chain is
scores -> P -> (dP - Di) -> dS -> sums.  Per (b, h) block:

    dv_j:  terms P_ij do_i                      s_dv^2 = sum_i P_ij^2 do_i^2 = (P^2)^T (do^2)
    dq_i:  terms scale * dS_ij k_j,  plus the errors of forming dS_ij, which are not
           relative to dS_ij: dP_ij - Di cancels, so its error is ~u times the L2 of the
           terms of the two dot products, a_ij = ||do_i * v_j|| and b_i = ||do_i * o_i||
           (b_i also bounds the rounding of the stored o: Di from a rounded o moves by
           ~u_in b_i); and 1 - tanh^2 is formed to absolute, not relative, accuracy.  So
           each j contributes  W_ij = P_ij^2 (a_ij^2 + b_i^2) + dS_ij^2,  and
                                        s_dq^2 = scale^2 W (k^2)
    dk_j:                               s_dk^2 = scale^2 W^T (q^2)   (summed over the group)

(a^2 = (do^2)(v^2)^T is one more matmul; P's own relative errors -- rounding P or dS
to the input dtype, the float32 score, the exp -- are relative to the terms above.)
n counts the roundings chained into an element, each a random walk: the final sum
(the most allowed keys of any row for dq; g times the most queries that any key is
allowed to for dk and dv), plus D for the length-D dot products (s_ij, dP_ij, Di), plus
D * sigma^2, sigma^2 a bound on (scale ||q_i * k_j||)^2, because a float32 score is off
by ~u sqrt(D) times the L2 of its terms and that is a relative error of P, plus
ceil(max |lse|^2): the exponent t - lse is formed with an absolute error ~u |lse|, and a
recomputing implementation's lse differs from the stored float32 one by that much.
These u_acc-sized terms matter in float32 and float64 only; in bf16 and f16 u_in
dominates.  An all-zero output fails: |r| is of order s while the bound is ~8 u_in s.

Cost: flops = 2.5 x the forward's 4*B*Hq*D per (query, key) pair (5 matmuls of 2 flops
per pair and head dim: the recomputed scores, dP, dV, dQ, dK), counting only the allowed
pairs, exactly: causal with Sq = Sk has Sq(Sq+1)/2 of them, i.e. the usual "halved for
causal" (plus the diagonal); a window counts its band.  Bytes: each input read once,
each output written once.

Semantic differences found (who is right, and why):
  * torch SDPA is_causal is top-left aligned; flash-attention (and this spec) bottom-right.
    They differ only when Sq != Sk.  The spec follows flash-attention, the kernels this
    harness tests; backends/baselines/sdpa.py uses an explicit bottom-right mask where the backend
    takes one, and skips the case where it does not (sdpa_flash).
  * Rows with no allowed key: flash-attention gives 0 output and gradient and lse = +inf;
    a plain masked softmax (-inf fill) gives NaN, and torch warns that its lower-right
    CausalBias gives NaN when Sq > Sk.  0 is right: the attention output of an empty
    set of keys is the empty sum, and NaN would poison every dk, dv through dS^T q.
  * flash-attention's `attention_ref` (and the torch baseline, which masks the same way)
    softmaxes -inf rows to NaN and then zeroes them; the gradient stays exact (0), since
    masked_fill's backward selects 0 rather than multiplying.  Its mask and softcap order
    (cap, then mask) and its causal-with-window = window (left, 0) match this spec.
"""
from __future__ import annotations

import ctypes
import math
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from harness import dtypes
from harness.argcheck import fmt_shape
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import from_values, nonzero_uniform
from oracle import passes

OP = "attention_backward"
# E[x^2] of nonzero_uniform(0.25, 2.0): (2^3 - 0.25^3) / (3 * 1.75).
_UNIFORM_VAR = (2.0**3 - 0.25**3) / (3 * 1.75)
# Row chunks hold at most this many (query, key) pairs per float64 matrix (16 MiB); on a GPU
# (oracle.passes) 256 MiB: a backward block holds about six such matrices at once.
_CHUNK_PAIRS = 1 << 21
_CHUNK_PAIRS_DEVICE = 1 << 25
# Above this many pair-head-dims the numpy passes run one thread per (batch, head).
_THREAD_WORK = 1 << 26


# ----------------------------------------------------------------------------- params


def _params(p: dict, d: int) -> tuple[float, bool, tuple[int, int], float]:
    """(scale, causal, (left, right), softcap) with defaults filled in."""
    scale = p.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    left, right = (int(w) for w in p.get("window", (-1, -1)))
    return scale, bool(p.get("causal", False)), (left, right), float(p.get("softcap", 0.0) or 0.0)


def allowed_mask(sq: int, sk: int, causal: bool, window, rows=None, xp=np, device=None):
    """The (len(rows), Sk) boolean mask of the docstring, literally: query i may attend key j.

    xp: the array module (numpy; jax.numpy in the JAX forward; torch, with device, in the baseline).
    """
    left, right = window
    on = {} if device is None else {"device": device}
    i = xp.arange(sq, **on)[:, None] if rows is None else xp.asarray(rows)[:, None]
    j = xp.arange(sk, **on)[None, :]
    diag = i + (sk - sq)
    ok = xp.ones((i.shape[0], sk), dtype=bool, **on)
    if causal:
        ok &= j <= diag
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def key_bounds(sq: int, sk: int, causal: bool, window) -> tuple[np.ndarray, np.ndarray]:
    """Per query row, the first and last allowed key (the mask is one band per row); lo > hi when empty."""
    left, right = window
    diag = np.arange(sq, dtype=np.int64) + (sk - sq)
    lo = np.maximum(diag - left, 0) if left >= 0 else np.zeros(sq, np.int64)
    right_eff = 0 if causal else right
    hi = np.minimum(diag + right_eff, sk - 1) if right_eff >= 0 else np.full(sq, sk - 1, np.int64)
    return lo, hi


def pair_counts(sq: int, sk: int, causal: bool, window) -> tuple[int, int, int]:
    """(allowed pairs in all, most keys any row may attend, most queries any key is attended by)."""
    lo, hi = key_bounds(sq, sk, causal, window)
    per_row = np.maximum(hi - lo + 1, 0)
    live = per_row > 0
    per_key = np.zeros(sk + 1, np.int64)  # difference array over keys
    np.add.at(per_key, lo[live], 1)
    np.add.at(per_key, hi[live] + 1, -1)
    return int(per_row.sum()), int(per_row.max(initial=0)), int(np.cumsum(per_key)[:sk].max(initial=0))


# ----------------------------------------------------------------------------- the spec in numpy, one block


def _scores(q, k, scale, softcap, xp=np):
    """(t, tanh(s/softcap) or None): capped scaled scores of one block."""
    s = (q @ k.T) * scale
    if not softcap:
        return s, None
    th = xp.tanh(s / softcap)
    return softcap * th, th


def attention_forward_block(q, k, v, allowed, scale, softcap, xp=np):
    """(o, lse) of one (batch, head) block: q (R, D) against k, v (C, D), allowed (R, C).

    lse is +inf on a row with no allowed key, and o is 0 there.  xp: the array module of the
    arrays (numpy; cupy where oracle.passes puts the passes on the GPU).
    """
    t, _ = _scores(q, k, scale, softcap, xp)
    t = xp.where(allowed, t, -np.inf)
    m = t.max(axis=1) if t.shape[1] else xp.full(t.shape[0], -np.inf)
    live = xp.isfinite(m)
    e = xp.exp(t - xp.where(live, m, 0.0)[:, None])  # masked: exp(-inf) = 0
    l = e.sum(axis=1)
    o = (e @ v) / xp.where(live, l, 1.0)[:, None]
    with np.errstate(divide="ignore"):
        lse = xp.where(live, m + xp.log(xp.where(live, l, 1.0)), np.inf)
    return o, lse


def attention_backward_block(q, k, v, o, do, lse, allowed, scale, softcap, want_ref=True, want_scale=False,
                             xp=np):
    """One (batch, head) block in float64 by the formulas of the docstring.

    q, o, do (R, D) rows of one query head; k, v (C, D) the keys they may see; lse (R,);
    allowed (R, C).  Returns {dq (R, D), dk (C, D), dv (C, D)} and, with want_scale, the
    squared error scales {dq2, dk2, dv2} of the error model (before summing over blocks).
    xp: the arrays' module, as in attention_forward_block.
    """
    t, th = _scores(q, k, scale, softcap, xp)
    live = allowed.any(axis=1)
    p = xp.exp(xp.where(allowed, t - xp.where(live, lse, 0.0)[:, None], -np.inf))  # masked -> 0
    del t
    dp = do @ v.T
    di = xp.einsum("id,id->i", do, o)
    ds = p * (dp - di[:, None])
    del dp
    if th is not None:
        ds *= 1.0 - th * th
    out = {}
    if want_ref:
        out["dq"] = scale * (ds @ k)
        out["dk"] = scale * (ds.T @ q)
        out["dv"] = p.T @ do
    if want_scale:
        do2 = do * do
        p2 = p * p
        w = (do2 @ (v * v).T + xp.einsum("id,id->i", do2, o * o)[:, None]) * p2 + ds * ds
        out["dq2"] = scale * scale * (w @ (k * k))
        out["dk2"] = scale * scale * (w.T @ (q * q))
        out["dv2"] = p2.T @ do2
    return out


# ----------------------------------------------------------------------------- the driver: heads, chunks, threads


def _row_chunks(lo, hi, sk, pairs: int = _CHUNK_PAIRS):
    """(i0, i1, j0, j1): row chunks and the key range their allowed keys span; empty chunks left out."""
    sq = len(lo)
    rows = max(1, min(sq, pairs // max(sk, 1)))
    for i0 in range(0, sq, rows):
        i1 = min(sq, i0 + rows)
        live = hi[i0:i1] >= lo[i0:i1]
        if live.any():
            yield i0, i1, int(lo[i0:i1][live].min()), int(hi[i0:i1][live].max()) + 1


@contextmanager
def _blas_threads(n: int):
    """Limit numpy's OpenBLAS to n threads while worker threads each run their own matmuls."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, put in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                         ("openblas_get_num_threads", "openblas_set_num_threads")):
            if hasattr(lib, get) and hasattr(lib, put):
                found.append((getattr(lib, put), getattr(lib, get)()))
                getattr(lib, put)(n)
                break
    try:
        yield
    finally:
        for put, old in found:
            put(old)


def _map_heads(fn, tasks, work: int, xp=np):
    """fn over tasks, in order; in threads (numpy and BLAS release the GIL) when the work is large
    and the passes run on the host (a GPU's passes queue on one stream, in this thread)."""
    workers = min(len(tasks), os.cpu_count() or 1)
    if work < _THREAD_WORK or workers < 2 or xp is not np:
        yield from map(fn, tasks)
        return
    with _blas_threads(1), ThreadPoolExecutor(workers) as pool:
        yield from pool.map(fn, tasks)


def _check_inputs(inputs: dict, names) -> tuple[int, int, int, int, int, int]:
    q = inputs["q"]
    if q.ndim != 4:
        raise ValueError(f"{OP}: input 'q' must be (B, Sq, Hq, D), got shape {q.shape}")
    b, sq, hq, d = q.shape
    k = inputs["k"]
    if k.ndim != 4 or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{OP}: input 'k' must be (B={b}, Sk, Hkv, D={d}), got shape {k.shape}")
    sk, hkv = k.shape[1], k.shape[2]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"{OP}: Hq={hq} must be a multiple of Hkv={hkv} (inputs q, k)")
    expected = {"v": (b, sk, hkv, d), "o": (b, sq, hq, d), "do": (b, sq, hq, d), "lse": (b, hq, sq)}
    for name in names:
        if name in expected and inputs[name].shape != expected[name]:
            raise ValueError(f"{OP}: input {name!r} has shape {inputs[name].shape}, expected {expected[name]}")
    return b, sq, sk, hq, hkv, d


def _head_arrays(xp, *arrays):
    """Contiguous copies of one head's slices, on xp's device (host numpy arrays in, for both)."""
    return tuple(xp.asarray(np.ascontiguousarray(x)) for x in arrays)


def attention_forward_numpy(q, k, v, params) -> tuple[np.ndarray, np.ndarray]:
    """(o (B, Sq, Hq, D), lse (B, Hq, Sq)) in float64, per (batch, head) and row chunk; on the
    array module of oracle.passes (numpy unless the harness put the passes on a GPU)."""
    b, sq, sk, hq, hkv, d = _check_inputs({"q": q, "k": k, "v": v}, ("v",))
    scale, causal, window, softcap = _params(params, d)
    g = hq // hkv
    lo, hi = key_bounds(sq, sk, causal, window)
    xp = passes.current()
    pairs = _CHUNK_PAIRS if xp is np else _CHUNK_PAIRS_DEVICE
    o = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), np.inf)

    def head(task):
        bi, h = task
        qh, kh, vh = _head_arrays(xp, q[bi, :, h], k[bi, :, h // g], v[bi, :, h // g])
        oh, lseh = xp.zeros((sq, d)), xp.full(sq, np.inf)
        for i0, i1, j0, j1 in _row_chunks(lo, hi, sk, pairs):
            allowed = allowed_mask(sq, sk, causal, window, np.arange(i0, i1), xp)[:, j0:j1]
            oh[i0:i1], lseh[i0:i1] = attention_forward_block(qh[i0:i1], kh[j0:j1], vh[j0:j1], allowed, scale,
                                                             softcap, xp)
        o[bi, :, h], lse[bi, h] = passes.to_host(oh), passes.to_host(lseh)

    tasks = [(bi, h) for bi in range(b) for h in range(hq)]
    for _ in _map_heads(head, tasks, b * hq * pair_counts(sq, sk, causal, window)[0] * d, xp):
        pass
    return o, lse


def _backward_pass(inputs: dict, params: dict, want_ref: bool, want_scale: bool) -> dict:
    """dq, dk, dv (want_ref) and/or the squared error scales dq2, dk2, dv2 (want_scale), float64."""
    b, sq, sk, hq, hkv, d = _check_inputs(inputs, ("v", "o", "do", "lse"))
    scale, causal, window, softcap = _params(params, d)
    g = hq // hkv
    lo, hi = key_bounds(sq, sk, causal, window)
    keys = [n for n, on in (("dq", want_ref), ("dk", want_ref), ("dv", want_ref),
                            ("dq2", want_scale), ("dk2", want_scale), ("dv2", want_scale)) if on]
    q, k, v, o, do, lse = (inputs[n] for n in ("q", "k", "v", "o", "do", "lse"))
    xp = passes.current()  # numpy, or the GPU's module where the harness put the passes there
    pairs = _CHUNK_PAIRS if xp is np else _CHUNK_PAIRS_DEVICE

    def head(task):
        bi, h = task
        c = h // g
        qh, oh, doh, lseh, kh, vh = _head_arrays(xp, q[bi, :, h], o[bi, :, h], do[bi, :, h], lse[bi, h],
                                                 k[bi, :, c], v[bi, :, c])
        acc = {n: xp.zeros((sq if n.startswith("dq") else sk, d)) for n in keys}
        for i0, i1, j0, j1 in _row_chunks(lo, hi, sk, pairs):
            allowed = allowed_mask(sq, sk, causal, window, np.arange(i0, i1), xp)[:, j0:j1]
            part = attention_backward_block(qh[i0:i1], kh[j0:j1], vh[j0:j1], oh[i0:i1], doh[i0:i1],
                                            lseh[i0:i1], allowed, scale, softcap, want_ref, want_scale, xp)
            for n, val in part.items():
                if n.startswith("dq"):
                    acc[n][i0:i1] = val
                else:
                    acc[n][j0:j1] += val
        return bi, h, {n: passes.to_host(val) for n, val in acc.items()}

    out = {n: np.zeros((b, sq, hq, d) if n.startswith("dq") else (b, sk, hkv, d)) for n in keys}
    tasks = [(bi, h) for bi in range(b) for h in range(hq)]
    for bi, h, acc in _map_heads(head, tasks, b * hq * pair_counts(sq, sk, causal, window)[0] * d, xp):
        for n, val in acc.items():  # in task order: the group sums are deterministic
            if n.startswith("dq"):
                out[n][bi, :, h] = val
            else:
                out[n][bi, :, h // g] += val
    return out


def attention_backward_numpy(inputs: dict, params: dict) -> dict:
    """{dq, dk, dv} in float64 from q, k, v, o, do, lse (all float64 arrays) by the formulas above."""
    return _backward_pass(inputs, params, True, False)


# ----------------------------------------------------------------------------- JAX: vjp of the forward


# Above this many scores in float64 the JAX forward runs one kv head group at a time
# (lax.map of a rematerialised block), so the vjp never holds all heads' scores at once.
_JAX_BLOCKWISE_SCORES = 1 << 27


def attention_backward_jax(inputs: dict, params: dict) -> dict:
    """{dq, dk, dv} by jax.vjp of a JAX attention forward w.r.t. q, k, v at cotangent do.

    An independent derivation: it ignores the o and lse inputs and differentiates
    softmax(mask(cap(scale q k^T))) v.  dtype-agnostic: it computes in
    max(dtype, float32) (float64 for the oracle) and returns the input dtype, like
    flash-attention's attention_ref with upcast.  Jitted per params (the oracle would
    otherwise dispatch op by op); inside the `jax` backend's own jit it is inlined.
    """
    key = repr(sorted(params.items()))
    if key not in _JAX_VJP:
        import jax

        _JAX_VJP[key] = jax.jit(lambda q, k, v, do: _vjp_jax(q, k, v, do, dict(params)))
    dq, dk, dv = _JAX_VJP[key](inputs["q"], inputs["k"], inputs["v"], inputs["do"])
    return {"dq": dq, "dk": dk, "dv": dv}


_JAX_VJP: dict = {}


def _vjp_jax(q, k, v, do, params):
    import jax
    import jax.numpy as jnp

    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale, causal, window, softcap = _params(params, d)
    dtype = q.dtype
    work = jnp.promote_types(dtype, jnp.float32)
    allowed = allowed_mask(sq, sk, causal, window, xp=jnp)  # traced from iotas, not a baked constant
    # XLA runs float32 einsums in TF32 on the GPU by default (precision DEFAULT): that is not
    # float32 attention, and fails the float32 model (seen on the H100: err/tol ~100-230).
    # HIGHEST asks for true float32 products, as the spec (and torch's default) means.
    precision = jax.lax.Precision.HIGHEST

    def block(qb, kb, vb):
        """One kv head and its g query heads: qb (Sq, g, D), kb, vb (Sk, D) -> o (Sq, g, D)."""
        s = jnp.einsum("qgd,kd->gqk", qb.astype(work), kb.astype(work), precision=precision) * scale
        if softcap:
            s = softcap * jnp.tanh(s / softcap)
        s = jnp.where(allowed, s, -jnp.inf)
        m = jax.lax.stop_gradient(s.max(axis=-1, keepdims=True))
        e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))  # masked and empty rows: exp(-inf) = 0
        l = e.sum(axis=-1, keepdims=True)
        p = e / jnp.where(l > 0, l, 1.0)
        return jnp.einsum("gqk,kd->qgd", p, vb.astype(work), precision=precision).astype(dtype)

    def forward(q, k, v):
        qb = q.reshape(b, sq, hkv, g, d).transpose(0, 2, 1, 3, 4).reshape(b * hkv, sq, g, d)
        kb = k.transpose(0, 2, 1, 3).reshape(b * hkv, sk, d)
        vb = v.transpose(0, 2, 1, 3).reshape(b * hkv, sk, d)
        if b * hq * sq * sk > _JAX_BLOCKWISE_SCORES:
            ob = jax.lax.map(lambda x: jax.checkpoint(block)(*x), (qb, kb, vb))
        else:
            ob = jax.vmap(block)(qb, kb, vb)
        return ob.reshape(b, hkv, sq, g, d).transpose(0, 2, 1, 3, 4).reshape(b, sq, hq, d)

    _, vjp = jax.vjp(forward, q, k, v)
    return vjp(do.astype(dtype))


# ----------------------------------------------------------------------------- declaration


def _dims(case) -> tuple[int, int, int, int, int, int]:
    p = case.params
    return tuple(int(p[key]) for key in ("B", "Sq", "Sk", "Hq", "Hkv", "D"))


def _shapes(case):
    b, sq, sk, hq, hkv, d = _dims(case)
    qs, ks = (b, sq, hq, d), (b, sk, hkv, d)
    return {"q": qs, "k": ks, "v": ks, "o": qs, "do": qs, "lse": (b, hq, sq), "dq": qs, "dk": ks, "dv": ks}


def lse_dtype(dtype: str) -> str:
    """float32, or float64 in f64 cases (the accumulation dtype)."""
    return dtypes.accumulate_dtype(dtype)


def _generate(case, rng):
    """q, k scaled so the raw scores scale*q.k have std score_std (default 1); v, do of std 1.

    Values are nonzero_uniform (never 0) rounded to the case dtype; o and lse come from the
    float64 forward on those rounded values, then o is rounded to the case dtype and lse
    to float32 (float64 for f64), as a real forward stores them.
    """
    p = case.params
    b, sq, sk, hq, hkv, d = _dims(case)
    scale, _, _, _ = _params(p, d)
    qk_std = math.sqrt(float(p.get("score_std", 1.0)) / (scale * math.sqrt(d)))
    unit = 1.0 / math.sqrt(_UNIFORM_VAR)
    shapes = _shapes(case)
    out = {}
    for name, std in (("q", qk_std), ("k", qk_std), ("v", 1.0), ("do", 1.0)):
        out[name] = from_values(nonzero_uniform(rng, shapes[name]) * (std * unit), case.dtype)
    o, lse = attention_forward_numpy(out["q"].float64(), out["k"].float64(), out["v"].float64(), p)
    out["o"] = from_values(o, case.dtype)
    out["lse"] = from_values(lse, lse_dtype(case.dtype))
    return out


def exact_inputs(inputs: dict, params: dict) -> dict:
    """The inputs with o and lse replaced by the exact float64 forward of q, k, v (see the docstring)."""
    o, lse = attention_forward_numpy(inputs["q"], inputs["k"], inputs["v"], params)
    return {**inputs, "o": o, "lse": lse}


# One-entry memo: the runner asks for the oracle and then the error scale of the same inputs;
# one pass over the blocks computes both (the scores, P and dP are shared).
_MEMO: dict = {}


def _memo_key(inputs, params):
    return tuple(id(inputs[n]) for n in ("q", "k", "v", "o", "do", "lse")) + (repr(sorted(params.items())),)


def _numpy_oracle(inputs, params):
    both = _backward_pass(inputs, params, True, True)
    _MEMO.clear()
    _MEMO[_memo_key(inputs, params)] = (inputs, {n: both[n] for n in ("dq2", "dk2", "dv2")})
    return {n: both[n] for n in ("dq", "dk", "dv")}


def _error_scale(inputs, params):
    """{dq, dk, dv: (s, n)} of the error model in the docstring."""
    hit = _MEMO.pop(_memo_key(inputs, params), None)
    squares = hit[1] if hit is not None and all(hit[0][n] is inputs[n] for n in hit[0]) else \
        _backward_pass(inputs, params, False, True)
    _MEMO.clear()
    b, sq, sk, hq, hkv, d = _check_inputs(inputs, ())
    scale, causal, window, softcap = _params(params, d)
    _, max_keys, max_queries = pair_counts(sq, sk, causal, window)
    lse = inputs["lse"]
    finite = np.abs(lse[np.isfinite(lse)])
    lse_terms = math.ceil(float(finite.max(initial=0.0)) ** 2)
    # sigma^2 >= (scale * ||q_i * k_j||)^2 for every pair: scale^2 * max_i ||q_i||^2 * max k^2.
    sigma2 = scale * scale * float(np.max(np.sum(inputs["q"] ** 2, axis=-1), initial=0.0)) * \
        float(np.max(inputs["k"] ** 2, initial=0.0))
    chain = d + math.ceil(d * sigma2) + lse_terms
    g = hq // hkv
    return {"dq": (np.sqrt(squares["dq2"]), max_keys + chain),
            "dk": (np.sqrt(squares["dk2"]), g * max_queries + chain),
            "dv": (np.sqrt(squares["dv2"]), g * max_queries + chain)}


def _loss(inputs, params):
    """sum(do * o(q, k, v)): its gradient in q, k, v is (dq, dk, dv)."""
    o, _ = attention_forward_numpy(inputs["q"], inputs["k"], inputs["v"], params)
    return float(np.sum(inputs["do"] * o))


def _cost(case):
    b, sq, sk, hq, hkv, d = _dims(case)
    _, causal, window, _ = _params(case.params, d)
    pairs = pair_counts(sq, sk, causal, window)[0]
    item = dtypes.numpy_dtype(case.dtype).itemsize
    lse_item = dtypes.numpy_dtype(lse_dtype(case.dtype)).itemsize
    q_like, kv_like = b * sq * hq * d, b * sk * hkv * d
    return Cost(bytes=item * (4 * q_like + 4 * kv_like) + lse_item * b * hq * sq,
                flops=int(2.5 * 4 * b * hq * d * pairs))


def _num(x) -> str:
    return f"{float(x):g}"


def _case_id(case):
    p = case.params
    b, sq, sk, hq, hkv, d = _dims(case)
    parts = [case.dtype, f"B={b}", f"Sq={sq}", f"Sk={sk}", f"Hq={hq}", f"Hkv={hkv}", f"D={d}"]
    if p.get("causal"):
        parts.append("causal")
    window = tuple(int(w) for w in p.get("window", (-1, -1)))
    if window != (-1, -1):
        parts.append(f"win={window[0]}x{window[1]}")
    if p.get("softcap"):
        parts.append(f"softcap={_num(p['softcap'])}")
    if p.get("softmax_scale") is not None:
        parts.append(f"scale={_num(p['softmax_scale'])}")
    if float(p.get("score_std", 1.0)) != 1.0:
        parts.append(f"sd={_num(p['score_std'])}")
    return f"attn[{','.join(parts)}]"


_KNOWN = {"B", "Sq", "Sk", "Hq", "Hkv", "D", "causal", "window", "softcap", "softmax_scale", "score_std"}


def _bad(param, expected, got):
    return ValueError(f"{OP} case: param {param!r}: expected {expected}, got {got!r}")


def _validate(case):
    p = case.params
    unknown = set(p) - _KNOWN
    if unknown:
        raise _bad(sorted(unknown)[0], f"one of {', '.join(sorted(_KNOWN))}", p[sorted(unknown)[0]])
    for key in ("B", "Sq", "Sk", "Hq", "Hkv", "D"):
        if key not in p:
            raise ValueError(f"{OP} case: missing param {key!r} in {p}")
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < 1:
            raise _bad(key, "an int >= 1", p[key])
    if p["Hq"] % p["Hkv"]:
        raise _bad("Hq", f"a multiple of Hkv={p['Hkv']} (GQA/MQA groups)", p["Hq"])
    window = p.get("window", [-1, -1])
    if (not isinstance(window, (list, tuple)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        raise _bad("window", "[left, right], ints >= -1 (-1 = unbounded)", window)
    if not isinstance(p.get("causal", False), bool):
        raise _bad("causal", "true or false", p["causal"])
    for key, floor in (("softcap", 0.0), ("score_std", None), ("softmax_scale", None)):
        value = p.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (value < floor if floor is not None else value <= 0):
            raise _bad(key, "a finite number >= 0 (0 = off)" if floor is not None else "a finite number > 0", value)


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): causal, window, softcap, softmax_scale; q (B, Sq,
    Hq, D) and k (B, Sk, Hkv, D) with Hkv dividing Hq, and the params' B/Sq/Sk/Hq/Hkv/D; v, dk,
    dv like k; o, do, dq like q; lse (B, Hq, Sq)."""
    c.flag("causal", False)
    window = c.params.get("window", (-1, -1))
    if (not isinstance(window, (list, tuple)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        c.fail(ValueError, f"params['window'] is {window!r}, expected [left, right], ints >= -1 (-1 = unbounded)")
    c.number("softcap", 0.0, 0.0, strict=False, none_ok=True)
    c.number("softmax_scale", None, 0.0, strict=True, none_ok=True)
    q, k = c.shape("q"), c.shape("k")
    for name, s, dims in (("q", q, "(B, Sq, Hq, D)"), ("k", k, "(B, Sk, Hkv, D)")):
        if len(s) != 4 or min(s) < 1:
            c.fail(ValueError, f"argument {name!r} has shape {fmt_shape(s)}, expected 4 dims {dims}, each >= 1")
    c.expect("q", tuple(c.params.get(key, n) for key, n in zip(("B", "Sq", "Hq", "D"), q)),
             lambda: "params B, Sq, Hq, D")
    b, sq, hq, d = q
    c.expect("k", (b, c.params.get("Sk", k[1]), c.params.get("Hkv", k[2]), d),
             lambda: f"(B, Sk, Hkv, D) with B and D of q {fmt_shape(q)}")
    hkv = k[2]
    if hq % hkv:
        c.fail(ValueError, f"argument 'k' has {hkv} heads (Hkv = k.shape[2]), expected a divisor of "
                           f"Hq = {hq} (q.shape[2]): each kv head serves Hq / Hkv query heads")
    for name in ("v", "dk", "dv"):
        c.expect(name, k, lambda: "the shape of k")
    for name in ("o", "do", "dq"):
        c.expect(name, q, lambda: "the shape of q")
    c.expect("lse", (b, hq, sq), lambda: f"(B, Hq, Sq) of q {fmt_shape(q)}")


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("q", "k", "v", "o", "do", "lse"),
    outputs=("dq", "dk", "dv"),
    params={"B / Sq / Sk / Hq / Hkv / D": "batch, query and key lengths, query and kv heads (Hq % Hkv == 0), head dim",
            "causal": "bottom-right aligned causal mask (default false)",
            "window": "[left, right] local window, -1 = unbounded (default [-1, -1])",
            "softcap": "scores -> softcap*tanh(scores/softcap); 0 = off (default)",
            "softmax_scale": "score scale (default 1/sqrt(D))",
            "score_std": "generator: std of the raw scaled scores (default 1)"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=attention_backward_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"dq": "q", "dk": "k", "dv": "v"},
    validate=_validate,
    exact_inputs=exact_inputs,
    check_args=_check_args,
    stats=("lse",),
    conventions=(
        "layout (B, S, H, D): heads next to last (flash-attention's), not torch SDPA's (B, H, S, D)",
        "lse (B, Hq, Sq) in float32 (float64 in f64 cases), natural log (not log2)",
        "o and lse are the forward's, given: use them as given (P from lse, Di = rowsum(do * o)), do not "
        "recompute the forward",
        "GQA/MQA: query head h reads kv head h // (Hq / Hkv); dk and dv of a kv head sum over its query heads",
        "causal and window masks aligned to the bottom right when Sq != Sk (flash-attention), not SDPA's top "
        "left",
        "a row with no allowed key: its dq row is 0 and it adds nothing to dk, dv",
        "softmax_scale defaults to 1/sqrt(D); softcap 0 is off",
        "accumulate in at least float32; dq, dk, dv in the case dtype",
    ),
))
