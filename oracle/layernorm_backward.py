"""layernorm_backward: gradients of layer normalisation over the last axis.

Forward (torch.nn.functional.layer_norm over the last axis of size N; the leading axes,
M rows in all, are independent):

    mean = mean_j x_j                rstd = 1 / sqrt(mean_j (x_j - mean)**2 + eps)
    xhat = (x - mean) * rstd         y = xhat * weight + bias

weight (N,) exists when param `affine` is true (default), bias (N,) when param `bias` is
true (default); a missing weight acts as 1, a missing bias as 0.  The variance is the
biased one (divide by N), as torch and JAX compute it.

Backward: given dy (shape of x), with g = weight * dy (g = dy without weight), per row

    dx      = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
    dweight = sum over rows of dy * xhat           (only when affine)
    dbias   = sum over rows of dy                  (only when bias)

dx is the full derivative: it includes the paths through mean and rstd.  dx is
overwritten, never accumulated into.  dweight and dbias exist only for the weight and
bias that exist (the case's outputs are dx and those of them that exist).

Inputs: dy and x (the case shape, any rank >= 1, layouts dy_layout / x_layout), weight
(when affine), and the forward's saved statistics mean and rstd, shaped like the leading
axes (x.shape[:-1]).  The bias tensor is not an input: its value never enters the
backward; param `bias` only says whether dbias is wanted.

Which statistics define the answer (both oracles agree on this).  The oracle is the exact
derivative of the layer norm at x: mean and rstd are functions of x, and both oracles
compute them from x in float64 -- the numpy oracle by the formula above, the JAX oracle
by jax.vjp of a JAX layer norm forward(x, weight, bias, eps) that computes its own
statistics.  So they agree to float64 rounding, and the finite differences of the loss
(which recomputes the statistics from the perturbed x) agree with both.  The mean and
rstd inputs are what a real forward saves: the generator computes them in float64 from
the rounded x and rounds them to float32 (float64 in f64 cases), as torch's CUDA forward
stores them.  An implementation may use them (as fused kernels do) or recompute them:
their rounding moves dx by about u_f32 relative to its terms, far inside the float32
accumulation term of the tolerance.  They do not define the answer, because an oracle
built on them would make the "right" gradient depend on the forward's rounding; with
the inputs made consistent it makes no difference.

dtypes: dy, x, weight, dx, dweight, dbias in the case dtype; mean and rstd float32
(float64 for f64).  Implementations compute in at least float32 (the JAX forward casts
to max(dtype, float32) before the statistics and back at the end).  Note torch's CPU
kernel takes mean/rstd in the input dtype for float16/bfloat16 (its CPU forward stores
them so) and sums dweight/dbias in it: see below and the torch baseline's docstring.

Error model (s_i = L2 norm of the terms each output element is made of, n = reduction
length; see harness/compare.py).  First xhat_j = x_j*rstd - mean*rstd is itself a
difference of two terms, so its error is relative to xs_j = rstd*sqrt(x_j**2 + mean**2),
not to |xhat_j| (which is 0 when N = 1, and small where x_j is near the mean); every
stage below uses xs_j as xhat_j's magnitude.  dx_i = rstd*g_i - rstd*A - rstd*xhat_i*B
with A = (1/N) sum_j g_j and B = (1/N) sum_j g_j*xhat_j.  Its terms are rstd*g_i, the N
terms rstd*g_j/N of the first mean and the N terms rstd*xhat_i*g_j*xhat_j/N of the
second, so

    s_i = rstd * sqrt(g_i**2 + sum_j (g_j/N)**2 + xs_i**2 * sum_j (g_j*xs_j/N)**2),  n = N.

This bounds each stage: rounding g_i in the input dtype errs ~u_in*rstd*|g_i|; the two
row sums err ~u_acc*sqrt(N) times the L2 norm of their terms (the random-walk rule);
rounding xhat_i, the stored mean or the stored rstd errs ~u relative to the terms they
scale; the final cancellation is relative to the terms, not to |dx_i|.  dweight_k sums
M terms dy*xhat: s = sqrt(sum_rows (dy*xs)**2), n = M; dbias_k: s = sqrt(sum_rows dy**2),
n = M.  Zeros fail: |dx_i| is of order rstd*|g_i| ~ s_i, and |dweight_k| of order its s
(the generator keeps |mean| within a few standard deviations, so xs ~ |xhat|), both far
above the 8*(u_in + u_acc*sqrt(n)) bound.

Where torch and JAX differ from this spec: torch's native_layer_norm_backward uses the
mean/rstd it is given (the spec: the exact statistics of x -- the same to u_f32, so it
passes).  On CPU, for float16/bfloat16, torch wants them in the input dtype and sums
dweight/dbias in the input dtype: that breaks "accumulate in at least float32" (err/tol
~4-5 at 4096 rows in bf16), so the torch baseline computes those dtypes on CPU in float32
(CUDA is unaffected: there torch accumulates in float32).  The spec is right: the
gradient is a sum of M terms and a bf16 accumulator loses ~u_bf16*sqrt(M) of it.  JAX
recomputes the statistics, as the oracle does.  An N = 1 row has rstd = 1/sqrt(eps) and
xhat = 0, so its dx and its share of dweight are 0.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.argcheck import fmt_shape
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import LAYOUTS, from_values, nonzero_uniform

OP = "layernorm_backward"
DEFAULT_EPS = 1e-5


def _flags(params) -> tuple[bool, bool, float]:
    return bool(params.get("affine", True)), bool(params.get("bias", True)), float(params.get("eps", DEFAULT_EPS))


# ----------------------------------------------------------------------------- the spec in numpy


def layernorm_stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, rstd) over the last axis, keepdims, in float64."""
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return mean, 1.0 / np.sqrt(var + eps)


def layernorm_forward_numpy(x, weight, bias, eps):
    mean, rstd = layernorm_stats(x, eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layernorm_backward_numpy(dy, x, weight, eps, want_bias: bool) -> dict:
    """{dx, dweight (if weight is given), dbias (if want_bias)} in float64 by the formulas above."""
    mean, rstd = layernorm_stats(x, eps)
    xhat = (x - mean) * rstd
    g = dy * weight if weight is not None else dy
    a = g.mean(axis=-1, keepdims=True)
    b = (g * xhat).mean(axis=-1, keepdims=True)
    out = {"dx": rstd * (g - a - xhat * b)}
    rows = tuple(range(dy.ndim - 1))
    if weight is not None:
        out["dweight"] = np.sum(dy * xhat, axis=rows)
    if want_bias:
        out["dbias"] = np.sum(dy, axis=rows)
    return out


def layernorm_forward_jax(x, weight, bias, eps):
    """The forward in JAX, computing in at least float32 and returning x's dtype."""
    import jax.numpy as jnp
    from jax import lax

    acc = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(acc)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.astype(acc)
    if bias is not None:
        y = y + bias.astype(acc)
    return y.astype(x.dtype)


def layernorm_backward_jax(inputs: dict, params: dict) -> dict:
    """jax.vjp of layernorm_forward_jax in x, weight and bias (taken at 0: it enters linearly).

    The saved mean/rstd inputs are not used: the forward recomputes them from x, which is
    the definition the spec adopts (see the module docstring).
    """
    import jax
    import jax.numpy as jnp

    affine, has_bias, eps = _flags(params)
    x, dy = inputs["x"], inputs["dy"]
    names = ["x"] + (["weight"] if affine else []) + (["bias"] if has_bias else [])
    primals = [x] + ([inputs["weight"]] if affine else []) + ([jnp.zeros(x.shape[-1:], x.dtype)] if has_bias else [])

    def forward(*args):
        named = dict(zip(names, args))
        return layernorm_forward_jax(named["x"], named.get("weight"), named.get("bias"), eps)

    _, vjp = jax.vjp(forward, *primals)
    grads = dict(zip(names, vjp(dy)))
    out = {"dx": grads["x"]}
    if affine:
        out["dweight"] = grads["weight"]
    if has_bias:
        out["dbias"] = grads["bias"]
    return out


# ----------------------------------------------------------------------------- declaration


def stats_dtype(dtype: str) -> str:
    """The dtype the forward saves mean/rstd in: float32, float64 for f64."""
    return "f64" if dtype == "f64" else "f32"


def _shapes(case):
    x = tuple(case.params["shape"])
    affine, has_bias, _ = _flags(case.params)
    out = {"dy": x, "x": x, "mean": x[:-1], "rstd": x[:-1], "dx": x}
    if affine:
        out["weight"] = out["dweight"] = x[-1:]
    if has_bias:
        out["dbias"] = x[-1:]
    return out


def _generate(case, rng):
    """Rows with their own offset and scale, so mean matters and rows cannot be mixed up."""
    p = case.params
    shape = tuple(p["shape"])
    affine, _, eps = _flags(p)
    rows = shape[:-1] + (1,)
    x = rng.uniform(0.5, 4.0, rows) * (rng.uniform(-2.0, 2.0, rows) + nonzero_uniform(rng, shape))
    x_t = from_values(x, case.dtype, p.get("x_layout", "contig"))
    mean, rstd = layernorm_stats(x_t.float64(), eps)
    out = {
        "dy": from_values(nonzero_uniform(rng, shape), case.dtype, p.get("dy_layout", "contig")),
        "x": x_t,
        "mean": from_values(mean[..., 0], stats_dtype(case.dtype)),
        "rstd": from_values(rstd[..., 0], stats_dtype(case.dtype)),
    }
    if affine:
        out["weight"] = from_values(nonzero_uniform(rng, shape[-1:]), case.dtype)
    return out


def _numpy_oracle(inputs, params):
    _, has_bias, eps = _flags(params)
    return layernorm_backward_numpy(inputs["dy"], inputs["x"], inputs.get("weight"), eps, has_bias)


def _loss(inputs, params):
    """sum(dy * layer_norm(x, weight, bias)), statistics recomputed from x."""
    affine, has_bias, eps = _flags(params)
    weight = inputs["weight"] if affine else None
    bias = inputs.get("bias") if has_bias else None  # not an input: present only when it is differentiated
    return float(np.sum(inputs["dy"] * layernorm_forward_numpy(inputs["x"], weight, bias, eps)))


def _error_scale(inputs, params):
    affine, has_bias, eps = _flags(params)
    dy, x = inputs["dy"], inputs["x"]
    n = x.shape[-1]
    mean, rstd = layernorm_stats(x, eps)
    xs2 = np.square(rstd) * (np.square(x) + np.square(mean))  # (L2 of the terms of xhat)**2
    g = dy * inputs["weight"] if affine else dy
    mean_terms = np.sum(np.square(g), axis=-1, keepdims=True) / n**2
    xhat_terms = xs2 * np.sum(np.square(g) * xs2, axis=-1, keepdims=True) / n**2
    out = {"dx": (rstd * np.sqrt(np.square(g) + mean_terms + xhat_terms), n)}
    rows = tuple(range(x.ndim - 1))
    m = prod(x.shape[:-1])
    if affine:
        out["dweight"] = (np.sqrt(np.sum(np.square(dy) * xs2, axis=rows)), m)
    if has_bias:
        out["dbias"] = (np.sqrt(np.sum(np.square(dy), axis=rows)), m)
    return out


def _cost(case):
    """Bytes: dy, x, dx; weight, dweight, dbias as present; mean and rstd.  Flops per element:
    xhat (2), g (1), the two row sums (3), dx (4), dweight (2), dbias (1)."""
    s = _shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    stat_item = dtypes.numpy_dtype(stats_dtype(case.dtype)).itemsize
    affine, has_bias, _ = _flags(case.params)
    mn, n = prod(s["x"]), s["x"][-1]
    per_vector = (2 if affine else 0) + (1 if has_bias else 0)
    flops = mn * (9 + (1 if affine else 0) + (2 if affine else 0) + (1 if has_bias else 0))
    return Cost(bytes=item * (3 * mn + per_vector * n) + stat_item * 2 * (mn // n if n else 0), flops=flops)


def _fmt(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _case_id(case):
    p = case.params
    affine, has_bias, eps = _flags(p)
    parts = [case.dtype, _fmt(p["shape"])]
    if not affine:
        parts.append("noaffine")
    if not has_bias:
        parts.append("nobias")
    if eps != DEFAULT_EPS:
        parts.append(f"eps={eps:g}")
    parts += [f"{t}:{p[k]}" for t, k in (("dY", "dy_layout"), ("X", "x_layout")) if p.get(k, "contig") != "contig"]
    return f"layernorm[{','.join(parts)}]"


def validate_norm_case(op: str, case, allowed: set[str]) -> None:
    """Shared checks of a normalisation case's params (layernorm_backward, rmsnorm_backward)."""
    p = case.params
    where = f"{op} case"
    if "shape" not in p:
        raise ValueError(f"{where}: missing param 'shape' in {p}")
    shape = p["shape"]
    if not isinstance(shape, (list, tuple)) or not shape or any(not isinstance(n, int) or n < 0 for n in shape):
        raise ValueError(f"{where}: param 'shape' must be a list of >= 1 non-negative ints, got {shape!r}")
    if shape[-1] < 1:
        raise ValueError(f"{where}: param 'shape' must have a normalised (last) dim >= 1, got {list(shape)}")
    unknown = set(p) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown params {sorted(unknown)}: expected {', '.join(sorted(allowed))}")
    eps = p.get("eps", 1.0)
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"{where}: param 'eps' must be a positive number, got {eps!r}")
    for key in ("dy_layout", "x_layout"):
        layout = p.get(key, "contig")
        if layout not in LAYOUTS:
            raise ValueError(f"{where}: param {key!r} must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if layout == "transposed" and len(shape) < 2:
            raise ValueError(f"{where}: param {key!r} 'transposed' needs a rank >= 2 shape, got {list(shape)}")


def _validate(case):
    validate_norm_case(OP, case, {"shape", "affine", "bias", "eps", "dy_layout", "x_layout"})
    for key in ("affine", "bias"):
        if not isinstance(case.params.get(key, True), bool):
            raise ValueError(f"{OP} case: param {key!r} must be true or false, got {case.params[key]!r}")


def check_norm_rows(c) -> tuple[tuple[int, ...], int]:
    """The argument rule's shapes for layernorm and rmsnorm: x (at least 1 dim, N = its last
    >= 1), dy and dx like x, weight/dweight/dbias (N,), mean/rstd one per row; x's shape and N."""
    c.expect_param_shape("x", "shape")
    x = c.shape("x")
    if not x or x[-1] < 1:
        c.fail(ValueError, f"argument 'x' has shape {fmt_shape(x)}, expected at least 1 dim and a last "
                           "(normalised) dim N >= 1")
    n = x[-1]
    c.expect("dy", x, lambda: "the shape of x")
    for name in ("weight", "dweight", "dbias"):
        c.expect(name, (n,), lambda: f"N = x.shape[-1] of x {fmt_shape(x)}")
    for name in ("mean", "rstd"):
        c.expect(name, x[:-1], lambda: f"one per row of x {fmt_shape(x)}: x.shape[:-1]")
    c.expect("dx", x, lambda: "the shape of x")
    return x, n


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): affine, bias, eps, and the norm shapes."""
    c.flag("affine", True)
    c.flag("bias", True)
    c.number("eps", 1e-5, 0.0, strict=True)
    check_norm_rows(c)


_NAMES: dict = {}  # (affine, bias) -> (inputs, outputs): argcheck asks on every call


def _io_names(params) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """weight and dweight exist when params affine is true, dbias when bias is (both default true)."""
    key = (params.get("affine", True), params.get("bias", True))
    if key not in _NAMES:
        affine, bias = key
        _NAMES[key] = (tuple(n for n in SPEC.inputs if n != "weight" or affine),
                       tuple(n for n in SPEC.outputs if (n != "dweight" or affine) and (n != "dbias" or bias)))
    return _NAMES[key]


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("dy", "x", "weight", "mean", "rstd"),
    outputs=("dx", "dweight", "dbias"),
    params={"shape": "shape of x and dy, normalised over the last dim (N)",
            "affine": "a weight (N,) exists: input weight, output dweight (default true)",
            "bias": "a bias (N,) exists: output dbias (default true)",
            "eps": f"added to the variance (default {DEFAULT_EPS:g})",
            "dy_layout / x_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=layernorm_backward_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"dx": "x", "dweight": "weight", "dbias": "bias"},
    validate=_validate,
    check_args=_check_args,
    io_names=_io_names,
    stats=("mean", "rstd"),
    row_separable=True,
    conventions=(
        "mean and rstd inputs are float32 (float64 in f64 cases), shaped x.shape[:-1]; the variance is the "
        "biased one (divide by N)",
        "dx is the full derivative (through mean and rstd); dx is overwritten, never accumulated into",
        "weight exists iff param affine, dweight too; dbias exists iff param bias (the bias tensor is not an "
        "input)",
        "compute and accumulate in at least float32; dx, dweight, dbias in the case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402

_BLOCK8 = np.array([5.0, 1, -1, -1, -1, -1, -1, -1])  # sum 0, mean square 4
_BLOCK5 = np.array([3.0, -3, 1, -1, 0])  # sum 0, mean square 4
_PAIR = np.array([2.0, -2])  # sum 0, mean square 4
_FREE8 = np.array([5.0, 1, 1, 1, 1, 1, 1, 1])  # mean square 4 (signs free: no mean to keep)


def exact_deviations(rng, rows: int, n: int, zero_sum: bool = True) -> tuple[np.ndarray, float]:
    """((rows, n) whole-number deviations, their mean square V per row): V = 4 except for n = 1 and 3.

    zero_sum (layer norm): each row is blocks of 8 (5, 1, -1 x 6), one block (3, -3, 1, -1, 0) for an
    odd remainder, and pairs (2, -2); every block sums to 0 and has mean square 4.  n = 1 and 3 have
    no such row: 0 (V = 0) and (2, -1, -1) (V = 2).  Without (rms norm): blocks (5, 1 x 7) and
    single 2s.  Each block gets a random sign and each row is shuffled, so a row sums to exactly 0
    (zero_sum) and its mean square is exactly V: 1/sqrt(V) is a power of two.
    """
    if not zero_sum:
        blocks = [_FREE8] * (n // 8) + [np.array([2.0])] * (n % 8)
        square = 4.0
    elif n in (0, 1, 3):
        blocks, square = ([np.zeros(n)], 0.0) if n < 3 else ([np.array([2.0, -1, -1])], 2.0)
    else:
        q, r = divmod(n, 8)
        if r % 2 and q and r < 5:  # 9 = 5 + 2 + 2, 11 = 5 + 2 + 2 + 2: give one block of 8 back
            q, r = q - 1, r + 8
        blocks = [_BLOCK8] * q + [_BLOCK5] * (r % 2) + [_PAIR] * ((r - 5 * (r % 2)) // 2)
        square = 4.0
    row = np.concatenate(blocks) if blocks else np.zeros(0)
    block_of = np.repeat(np.arange(len(blocks)), [len(b) for b in blocks])
    rows = max(rows, 0)
    signs = np.where(rng.random((rows, len(blocks))) < 0.5, -1.0, 1.0)[:, block_of] if zero_sum else \
        np.where(rng.random((rows, len(row))) < 0.5, -1.0, 1.0)
    return rng.permuted(row * signs, axis=1), square


def _eps_free_scale(eps: float, square: float, dtype: str) -> float:
    """A power of two s such that the variance square * s**2 absorbs eps in float64 (var + eps == var:
    the oracle's rstd is then exactly a power of two, as is every float32 implementation's); capped
    where x = 5s must stay finite (f16: there eps cannot be absorbed and dx, dweight are not exact)."""
    if not square:
        return 1.0
    want = int(np.ceil(0.5 * np.log2(eps * 2.0**54 / square)))
    cap = 11 if dtype == "f16" else 60
    return float(2.0 ** max(0, min(want, cap)))


def _eps_absorbed(var: float, eps: float) -> bool:
    return var > 0 and float(np.float64(var) + np.float64(eps)) == var


def _exact_generate(case, rng):
    """x = mean + deviation * s with whole-number deviations of mean square 4 (exact_deviations) and
    s a power of two large enough that the variance absorbs eps (so rstd is exactly 1/(2s)); dy on
    the grid +-{1..15}/16, weight and the row means (times s) on +-{1,2,3}/4 (harness/exact.py).
    dy is balanced over the rows, separately for each deviation value, so that dweight and dbias
    end near 0."""
    p = case.params
    shape = tuple(p["shape"])
    affine, _, eps = _flags(p)
    n, rows = shape[-1], prod(shape[:-1])
    devs, square = exact_deviations(rng, rows, n)
    s = _eps_free_scale(eps, square, case.dtype)
    mean = _exact.grid(rng, (rows, 1)) * s
    x = (mean + devs * s).reshape(shape)
    var = square * s * s
    rstd = 1.0 / np.sqrt(var + eps)
    dy = _exact.grid(rng, shape, _exact.FACTOR)
    if len(shape) > 1:
        dy = _exact.balance(dy, 1.0, tuple(range(len(shape) - 1)), rng,
                            classes=(devs.reshape(shape) + 8).astype(np.int64))
    out = {
        "dy": from_values(dy, case.dtype, p.get("dy_layout", "contig")),
        "x": from_values(x, case.dtype, p.get("x_layout", "contig")),
        "mean": from_values(mean.reshape(shape[:-1]), stats_dtype(case.dtype)),
        "rstd": from_values(np.full(shape[:-1], rstd), stats_dtype(case.dtype)),
    }
    if affine:
        out["weight"] = from_values(_exact.grid(rng, shape[-1:]), case.dtype)
    return out


def exact_norm_outputs(n: int, rows: int, var_exact: bool, dtype: str) -> bool:
    """Whether dx and dweight are exact: rstd a power of two that every float32 implementation gets
    (the variance absorbs eps; never in f16, whose range is too small for that), N a power of two
    (the means divide by N exactly however they are formed) and at most 2**13, and dweight's sum
    of `rows` terms exact in float32.  The bound on N: g = weight * dy is a multiple of 2**-6 up
    to 45/64, xhat of 1/2 up to 5/2, so g - mean(g) - xhat * mean(g * xhat) is a multiple of
    2**-8 / N below 5.8, 5.8 * 2**8 * N units, within float32's 2**24 for N <= 2**13."""
    return var_exact and n & (n - 1) == 0 and n <= 1 << 13 and dtype != "f16" and \
        _exact.sum_exact(rows, 75, dtype)  # dy * xhat: 15/16 * 5/2, 75 units of 2**-5


def _exact_outputs(case):
    """dbias always; dx and dweight where exact_norm_outputs holds (not N = 1: rstd = 1/sqrt(eps) there,
    and x*rstd - mean*rstd, formed with an fma, leaves a rounding residue where xhat is 0)."""
    p = case.params
    shape = tuple(p["shape"])
    affine, has_bias, eps = _flags(p)
    n = shape[-1]
    square = exact_deviations(np.random.default_rng(0), 0, n)[1]
    s = _eps_free_scale(eps, square, case.dtype)
    rows = prod(shape[:-1])
    exact = exact_norm_outputs(n, rows, _eps_absorbed(square * s * s, eps), case.dtype)
    dbias = has_bias and _exact.sum_exact(rows, _exact.FACTOR, case.dtype)
    return tuple(o for o, on in (("dx", exact), ("dweight", exact and affine), ("dbias", dbias)) if on)


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
