"""matmul_backward: gradients of a batched matrix product with broadcast batch dims.

Forward: y = a @ b (torch.matmul / np.matmul) with a (..., M, K) and b (..., K, N), both
of rank >= 2.  The batch dims (all but the last two) broadcast by NumPy rules to
B = broadcast(a.shape[:-2], b.shape[:-2]); y has shape (*B, M, N).

Backward: given dy (*B, M, N),

    da = sum_to_shape(dy @ b^T, a.shape)        da[..., m, k] = sum_n dy[..., m, n] * b[..., k, n]
    db = sum_to_shape(a^T @ dy, b.shape)        db[..., k, n] = sum_m a[..., m, k] * dy[..., m, n]

where ^T swaps the last two dims, each product is taken over the broadcast batch B, and
sum_to_shape (oracle.broadcast) sums over the batch dims along which the operand was
broadcast: the leading dims it lacks and those where it has size 1.  So da reduces over
N and a's broadcast batch dims, db over M and b's.  Size-0 dims: a reduction over an
empty dim gives 0 (K = 0 leaves da and db empty; M = 0 makes db zero; N = 0, da).

Inputs: a, b, dy in the case dtype, in any layout (a_layout, b_layout, dy_layout: contig,
transposed, sliced).  b_layout=transposed is the common training case: nn.Linear
stores its weight (N, K) and uses its transpose as b.  Outputs da, db: contiguous, the
case dtype.  Implementations accumulate in at least float32 (tensor cores accumulate
bf16/f16 products in float32).  dy @ b^T rounds each product dy*b in the input dtype at
worst (the u_in term of the tolerance); a batch broadcast may be summed after each
batch's product is rounded to the output dtype (torch does), ~u_in too.

Error model (harness/compare.py): da[..., m, k] is a sum of n = N * (batch elements
summed) terms dy*b, so its scale is their L2 norm,

    s_da = sqrt(sum_to_shape(dy**2 @ (b**2)^T, a.shape)),   n = N * prod(B) / prod(a batch)
    s_db = sqrt(sum_to_shape((a**2)^T @ dy**2, b.shape)),   n = M * prod(B) / prod(b batch)

computed by the same matmuls on the squares (in float32: a magnitude needs no more).
With random-sign inputs |da| ~ s_da, so an all-zero output misses by ~s_da, far above
8*(u_in + u_acc*sqrt(n))*s_da.

On float32: torch on CUDA computes float32 matmuls in IEEE float32 unless TF32 is
enabled (torch.backends.cuda.matmul.allow_tf32 / fp32_precision; off by default for
matmul).  TF32 rounds each input to 10 mantissa bits (u = 2**-11), so a TF32 float32
matmul fails this model, as it should: its error is that of float16 inputs.  JAX leans
the other way: on recent GPUs a float32 jnp.matmul defaults to TF32 (precision DEFAULT).
The spec is the float32 product -- what float32 code asks for, and what torch computes by
default -- so the JAX forward asks for precision HIGHEST on float32 operands (true
float32); other dtypes keep JAX's default (bf16/f16 products, float32 accumulation).
The numpy and JAX float64 oracles agree to float64 rounding.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.argcheck import broadcast, fmt_shape
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import LAYOUTS, from_values, nonzero_uniform
from oracle.broadcast import broadcast_shape, sum_to_shape

OP = "matmul_backward"


def _mT(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------- the spec in numpy


def out_shape(a_shape, b_shape) -> tuple[int, ...]:
    """(*B, M, N) of a @ b; raises ValueError naming the clash."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ValueError(f"{OP}: a and b need rank >= 2, got a {a_shape}, b {b_shape}")
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(f"{OP}: a's K={a_shape[-1]} (last dim) must equal b's K={b_shape[-2]} (second to last)")
    return broadcast_shape(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])


def matmul_backward_numpy(a: np.ndarray, b: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(da, db) in float64 by the formulas above."""
    if dy.shape != out_shape(a.shape, b.shape):
        raise ValueError(f"{OP}: dy has shape {dy.shape}, expected {out_shape(a.shape, b.shape)}")
    return sum_to_shape(np.matmul(dy, _mT(b)), a.shape), sum_to_shape(np.matmul(_mT(a), dy), b.shape)


def matmul_backward_jax(inputs: dict, params: dict) -> dict:
    """{da, db} by jax.vjp of jnp.matmul(a, b): JAX's transpose rules for dot_general and
    for the batch broadcast, an independent derivation.  dtype-agnostic."""
    import jax
    import jax.numpy as jnp

    # float32 in, float32 products out (not TF32): see the module docstring.
    precision = jax.lax.Precision.HIGHEST if inputs["a"].dtype == jnp.float32 else None
    _, vjp = jax.vjp(lambda a, b: jnp.matmul(a, b, precision=precision), inputs["a"], inputs["b"])
    da, db = vjp(inputs["dy"])
    return {"da": da, "db": db}


# ----------------------------------------------------------------------------- declaration


def _shapes(case):
    a, b = tuple(case.params["a"]), tuple(case.params["b"])
    y = out_shape(a, b)
    return {"a": a, "b": b, "dy": y, "da": a, "db": b}


def _generate(case, rng):
    p = case.params
    s = _shapes(case)
    return {name: from_values(nonzero_uniform(rng, s[name]), case.dtype, p.get(f"{name}_layout", "contig"))
            for name in ("a", "b", "dy")}


def _numpy_oracle(inputs, params):
    da, db = matmul_backward_numpy(inputs["a"], inputs["b"], inputs["dy"])
    return {"da": da, "db": db}


def _loss(inputs, params):
    """sum(dy * (a @ b)): its gradient in a and b is (da, db)."""
    return float(np.sum(inputs["dy"] * np.matmul(inputs["a"], inputs["b"])))


def _batch_factor(operand_shape, y_shape) -> int:
    """How many batch elements of y each batch element of the operand's gradient sums."""
    ob, yb = prod(operand_shape[:-2]), prod(y_shape[:-2])
    return yb // ob if ob else 0


def _error_scale(inputs, params):
    # Squares are non-negative, so their sums need no float64: float32 matmuls halve the memory
    # and time of a perf-size scale (a magnitude, accurate to ~1e-7, which is plenty).
    a2, b2, dy2 = (np.square(inputs[k]).astype(np.float32) for k in ("a", "b", "dy"))
    a, b, dy = inputs["a"], inputs["b"], inputs["dy"]
    m, n = a.shape[-2], b.shape[-1]
    s_da = np.sqrt(sum_to_shape(np.matmul(dy2, _mT(b2)), a.shape).astype(np.float64))
    s_db = np.sqrt(sum_to_shape(np.matmul(_mT(a2), dy2), b.shape).astype(np.float64))
    return {"da": (s_da, n * _batch_factor(a.shape, dy.shape)), "db": (s_db, m * _batch_factor(b.shape, dy.shape))}


def _cost(case):
    """Two products of 2*M*N*K flops per batch element; a, b, dy read once, da, db written once."""
    s = _shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    *batch, m, n = s["dy"]
    k = s["a"][-1]
    return Cost(bytes=item * (2 * prod(s["a"]) + 2 * prod(s["b"]) + prod(s["dy"])),
                flops=2 * 2 * m * n * k * prod(batch))


def _fmt(shape) -> str:
    return "x".join(map(str, shape))


def _case_id(case):
    p = case.params
    extra = [f"{t}:{p[k]}" for t, k in (("A", "a_layout"), ("B", "b_layout"), ("dY", "dy_layout"))
             if p.get(k, "contig") != "contig"]
    return f"matmul[{','.join([case.dtype, 'A=' + _fmt(p['a']), 'B=' + _fmt(p['b'])] + extra)}]"


def _validate(case):
    p = case.params
    where = f"{OP} case"
    for key in ("a", "b"):
        if key not in p:
            raise ValueError(f"{where}: missing param {key!r} in {p}")
        if not isinstance(p[key], (list, tuple)) or any(not isinstance(d, int) or d < 0 for d in p[key]):
            raise ValueError(f"{where}: param {key!r} must be a list of non-negative ints, got {p[key]!r}")
    unknown = set(p) - {"a", "b", "a_layout", "b_layout", "dy_layout"}
    if unknown:
        raise ValueError(f"{where}: unknown params {sorted(unknown)}: expected a, b, a_layout, b_layout, dy_layout")
    try:
        out_shape(p["a"], p["b"])
    except ValueError as exc:
        raise ValueError(f"{where}: params 'a' {list(p['a'])} and 'b' {list(p['b'])}: {exc}") from None
    for key in ("a_layout", "b_layout", "dy_layout"):
        if p.get(key, "contig") not in LAYOUTS:
            raise ValueError(f"{where}: param {key!r} must be one of {', '.join(LAYOUTS)}, got {p[key]!r}")


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): a (..., M, K), b (..., K, N) with broadcastable
    batch dims, dy (*batch, M, N), da and db like a and b."""
    c.expect_param_shape("a", "a")
    c.expect_param_shape("b", "b")
    a, b = c.shape("a"), c.shape("b")
    for name, s, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if len(s) < 2:
            c.fail(ValueError, f"argument {name!r} has shape {fmt_shape(s)}, expected at least 2 dims {dims}")
    if a[-1] != b[-2]:
        c.fail(ValueError, f"argument 'b' has shape {fmt_shape(b)}, expected b.shape[-2] = {a[-1]} "
                           f"(K, the last dim of a {fmt_shape(a)})")
    batch = broadcast(a[:-2], b[:-2])
    if isinstance(batch, str):
        c.fail(ValueError, f"arguments 'a' {fmt_shape(a)} and 'b' {fmt_shape(b)} have batch dims "
                           f"{fmt_shape(a[:-2])} and {fmt_shape(b[:-2])}, expected broadcastable batch dims, "
                           f"got {batch}")
    out = batch + (a[-2], b[-1])
    c.expect("dy", out, lambda: f"(*batch, M, N) of a {fmt_shape(a)} @ b {fmt_shape(b)}")
    c.expect("da", a, lambda: "the shape of a")
    c.expect("db", b, lambda: "the shape of b")


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("a", "b", "dy"),
    outputs=("da", "db"),
    params={"a": "shape (..., M, K)", "b": "shape (..., K, N); batch dims broadcast with a's",
            "a_layout / b_layout / dy_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=matmul_backward_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"da": "a", "db": "b"},
    validate=_validate,
    check_args=_check_args,
    conventions=(
        "batch dims broadcast by NumPy rules; da, db are summed over the batch dims their operand was "
        "broadcast along",
        "inputs in any layout (a_layout, b_layout, dy_layout); b_layout=transposed is nn.Linear's weight",
        "f32 means IEEE float32: TF32 fails the tolerance",
        "accumulate in at least float32; da, db contiguous in the case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402


def _exact_top(case) -> int:
    """The grid's largest whole number: 15 (products up to 225, 8 bits), or 3 where an output folds a
    broadcast batch in a 16-bit dtype (each batch element's product, which the spec lets an
    implementation round to the output dtype before the batch sum, must fit it: 9 per term)."""
    s = _shapes(case)
    folded = any(_batch_factor(s[x], s["dy"]) > 1 for x in ("a", "b"))
    return _exact.SMALL if folded and case.dtype in ("f16", "bf16") else _exact.FACTOR


def _exact_generate(case, rng):
    """a, b, dy on the grid +-{1..top} (harness/exact.py, top from _exact_top)."""
    p, s, top = case.params, _shapes(case), _exact_top(case)
    return {name: from_values(_exact.grid(rng, s[name], top), case.dtype, p.get(f"{name}_layout", "contig"))
            for name in ("a", "b", "dy")}


def _exact_outputs(case):
    """da (db) when its sum of N (M) products per batch element, times the batch elements it folds, is
    exact in float32, and -- when it folds a broadcast batch -- each batch element's product fits the
    output dtype too (the spec lets an implementation round it there before the batch sum, as torch does)."""
    s = _shapes(case)
    m, n = s["a"][-2], s["b"][-1]
    units = _exact_top(case) ** 2
    out = []
    for name, operand, per_batch in (("da", "a", n), ("db", "b", m)):
        folded = _batch_factor(s[operand], s["dy"])
        if _exact.sum_exact(per_batch * max(folded, 1), units, case.dtype) and \
                (folded <= 1 or _exact.fits(units * per_batch, case.dtype)):
            out.append(name)
    return tuple(out)


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
