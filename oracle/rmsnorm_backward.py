"""rmsnorm_backward: gradients of RMS normalisation over the last axis (the llama-family norm).

Forward (torch.nn.functional.rms_norm over the last axis of size N; the leading axes, M
rows in all, are independent):

    rstd = 1 / sqrt(mean_j x_j**2 + eps)        xhat = x * rstd        y = xhat * weight

Backward: given dy (shape of x), with g = weight * dy, per row

    dx      = rstd * (g - xhat * mean_j(g * xhat))
    dweight = sum over rows of dy * xhat

dx is the full derivative (it includes the path through rstd) and is overwritten, never
accumulated into.  No mean is subtracted: that is the difference from layer norm.

Inputs: dy and x (the case shape, any rank >= 1, layouts dy_layout / x_layout), weight
(N,), and the forward's saved rstd, shaped like the leading axes (x.shape[:-1]).

Which rstd defines the answer: as for layernorm_backward, the exact one.  Both oracles
compute rstd from x in float64 -- the numpy oracle by the formula above, the JAX oracle
by jax.vjp of a JAX rms norm forward(x, weight, eps) -- so they agree to float64 rounding,
and with the finite differences of the loss (which recompute rstd from the perturbed x).
The rstd input is what a real forward saves: the float64 value rounded to float32
(float64 in f64 cases).  Implementations may use it or recompute it; its rounding moves
dx by ~u_f32 relative to its terms, inside the tolerance.  Defining the answer by the
stored value would make the gradient depend on the forward's rounding; with a consistent
input it makes no difference.

dtypes: dy, x, weight, dx, dweight in the case dtype; rstd float32 (float64 for f64).
Implementations compute in at least float32 (the JAX forward casts to max(dtype, float32)
first and back at the end).

Error model (see harness/compare.py and layernorm_backward).  xhat_j = x_j*rstd is one
product, so its error is relative to |xhat_j|.  dx_i = rstd*g_i - rstd*xhat_i*B with
B = (1/N) sum_j g_j*xhat_j; its terms are rstd*g_i and the N terms rstd*xhat_i*g_j*xhat_j/N:

    s_i = rstd * sqrt(g_i**2 + xhat_i**2 * sum_j (g_j*xhat_j/N)**2),   n = N;

rounding g_i in the input dtype errs ~u_in*rstd*|g_i|, the row sum ~u_acc*sqrt(N) times
the L2 norm of its terms, the stored rstd ~u_f32 relative.  dweight_k sums M terms
dy*xhat: s = sqrt(sum_rows (dy*xhat)**2), n = M.  Zeros fail: |dx_i| ~ rstd*|g_i| ~ s_i.

Where torch and JAX differ from this spec: torch's fused CUDA backward
(aten._fused_rms_norm_backward) uses the rstd it is given (the same to u_f32); it has no
CPU kernel, so on CPU the torch baseline is the autograd of F.rms_norm, which recomputes
rstd in float32 and rounds xhat to the input dtype before the weight multiply (~u_in per
term, covered).  JAX recomputes rstd, as the oracle does.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import from_values, nonzero_uniform
from oracle.layernorm_backward import check_norm_rows, stats_dtype, validate_norm_case

OP = "rmsnorm_backward"
DEFAULT_EPS = 1e-6


def _eps(params) -> float:
    return float(params.get("eps", DEFAULT_EPS))


# ----------------------------------------------------------------------------- the spec in numpy


def rms_rstd(x: np.ndarray, eps: float) -> np.ndarray:
    """rstd over the last axis, keepdims, in float64."""
    return 1.0 / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + eps)


def rmsnorm_forward_numpy(x, weight, eps):
    return x * rms_rstd(x, eps) * weight


def rmsnorm_backward_numpy(dy, x, weight, eps) -> dict:
    """{dx, dweight} in float64 by the formulas above."""
    rstd = rms_rstd(x, eps)
    xhat = x * rstd
    g = dy * weight
    b = (g * xhat).mean(axis=-1, keepdims=True)
    return {"dx": rstd * (g - xhat * b), "dweight": np.sum(dy * xhat, axis=tuple(range(dy.ndim - 1)))}


def rmsnorm_forward_jax(x, weight, eps):
    """The forward in JAX, computing in at least float32 and returning x's dtype."""
    import jax.numpy as jnp
    from jax import lax

    acc = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(acc)
    rstd = lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return (xf * rstd * weight.astype(acc)).astype(x.dtype)


def rmsnorm_backward_jax(inputs: dict, params: dict) -> dict:
    """jax.vjp of rmsnorm_forward_jax in x and weight (the saved rstd input is not used)."""
    import jax

    eps = _eps(params)
    _, vjp = jax.vjp(lambda x, w: rmsnorm_forward_jax(x, w, eps), inputs["x"], inputs["weight"])
    dx, dweight = vjp(inputs["dy"])
    return {"dx": dx, "dweight": dweight}


# ----------------------------------------------------------------------------- declaration


def _shapes(case):
    x = tuple(case.params["shape"])
    return {"dy": x, "x": x, "weight": x[-1:], "rstd": x[:-1], "dx": x, "dweight": x[-1:]}


def _generate(case, rng):
    """Rows with their own scale, so rows cannot be mixed up."""
    p = case.params
    shape = tuple(p["shape"])
    x = rng.uniform(0.25, 4.0, shape[:-1] + (1,)) * nonzero_uniform(rng, shape)
    x_t = from_values(x, case.dtype, p.get("x_layout", "contig"))
    rstd = rms_rstd(x_t.float64(), _eps(p))
    return {
        "dy": from_values(nonzero_uniform(rng, shape), case.dtype, p.get("dy_layout", "contig")),
        "x": x_t,
        "weight": from_values(nonzero_uniform(rng, shape[-1:]), case.dtype),
        "rstd": from_values(rstd[..., 0], stats_dtype(case.dtype)),
    }


def _numpy_oracle(inputs, params):
    return rmsnorm_backward_numpy(inputs["dy"], inputs["x"], inputs["weight"], _eps(params))


def _loss(inputs, params):
    """sum(dy * rms_norm(x, weight)), rstd recomputed from x."""
    return float(np.sum(inputs["dy"] * rmsnorm_forward_numpy(inputs["x"], inputs["weight"], _eps(params))))


def _error_scale(inputs, params):
    dy, x = inputs["dy"], inputs["x"]
    n = x.shape[-1]
    rstd = rms_rstd(x, _eps(params))
    xhat = x * rstd
    g = dy * inputs["weight"]
    xhat_terms = np.square(xhat) * np.sum(np.square(g * xhat), axis=-1, keepdims=True) / n**2
    return {"dx": (rstd * np.sqrt(np.square(g) + xhat_terms), n),
            "dweight": (np.sqrt(np.sum(np.square(dy * xhat), axis=tuple(range(x.ndim - 1)))), prod(x.shape[:-1]))}


def _cost(case):
    """Bytes: dy, x, dx; weight, dweight; rstd.  Flops per element: xhat (1), g (1), the row
    sum (2), dx (3), dweight (2)."""
    s = _shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    stat_item = dtypes.numpy_dtype(stats_dtype(case.dtype)).itemsize
    mn, n = prod(s["x"]), s["x"][-1]
    return Cost(bytes=item * (3 * mn + 2 * n) + stat_item * (mn // n if n else 0), flops=9 * mn)


def _fmt(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _case_id(case):
    p = case.params
    parts = [case.dtype, _fmt(p["shape"])]
    if _eps(p) != DEFAULT_EPS:
        parts.append(f"eps={_eps(p):g}")
    parts += [f"{t}:{p[k]}" for t, k in (("dY", "dy_layout"), ("X", "x_layout")) if p.get(k, "contig") != "contig"]
    return f"rmsnorm[{','.join(parts)}]"


def _validate(case):
    validate_norm_case(OP, case, {"shape", "eps", "dy_layout", "x_layout"})


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): eps, and the norm shapes."""
    c.number("eps", 1e-6, 0.0, strict=True)
    check_norm_rows(c)


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("dy", "x", "weight", "rstd"),
    outputs=("dx", "dweight"),
    params={"shape": "shape of x and dy, normalised over the last dim (N)",
            "eps": f"added to the mean square (default {DEFAULT_EPS:g})",
            "dy_layout / x_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=rmsnorm_backward_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"dx": "x", "dweight": "weight"},
    validate=_validate,
    check_args=_check_args,
    stats=("rstd",),
    row_separable=True,
    conventions=(
        "rstd input is float32 (float64 in f64 cases), shaped x.shape[:-1]; no mean is subtracted",
        "dx is the full derivative (through rstd); dx is overwritten, never accumulated into",
        "compute and accumulate in at least float32; dx, dweight in the case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402
from oracle.layernorm_backward import _eps_absorbed, _eps_free_scale, exact_deviations, exact_norm_outputs  # noqa: E402


def _exact_generate(case, rng):
    """x = deviation * s, whole-number deviations (5, 1 x 7 per block of 8, else 2) with random signs
    and mean square 4 (layernorm_backward.exact_deviations), s a power of two large enough that the
    mean square absorbs eps, so rstd is exactly 1/(2s); dy on the grid +-{1..15}/16 and weight on
    +-{1,2,3}/4, dy balanced over the rows for each value of x, so dweight ends near 0."""
    p = case.params
    shape = tuple(p["shape"])
    eps, n, rows = _eps(p), shape[-1], prod(shape[:-1])
    devs, square = exact_deviations(rng, rows, n, zero_sum=False)
    s = _eps_free_scale(eps, square, case.dtype)
    x = (devs * s).reshape(shape)
    dy = _exact.grid(rng, shape, _exact.FACTOR)
    if len(shape) > 1:
        dy = _exact.balance(dy, 1.0, tuple(range(len(shape) - 1)), rng,
                            classes=(devs.reshape(shape) + 8).astype(np.int64))
    return {
        "dy": from_values(dy, case.dtype, p.get("dy_layout", "contig")),
        "x": from_values(x, case.dtype, p.get("x_layout", "contig")),
        "weight": from_values(_exact.grid(rng, shape[-1:]), case.dtype),
        "rstd": from_values(np.full(shape[:-1], 1.0 / np.sqrt(square * s * s + eps)), stats_dtype(case.dtype)),
    }


def _exact_outputs(case):
    """dx and dweight where layernorm_backward.exact_norm_outputs holds."""
    eps, shape = _eps(case.params), case.params["shape"]
    s = _eps_free_scale(eps, 4.0, case.dtype)
    exact = exact_norm_outputs(shape[-1], prod(shape[:-1]), _eps_absorbed(4.0 * s * s, eps), case.dtype)
    return ("dx", "dweight") if exact else ()


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
