"""reduce_sum: the backward of broadcast (expand) -- sum the incoming gradient x over axes.

One op, two param forms (a case uses exactly one):

  axes form    params shape, axes, keepdim
      y = sum of x over `axes`.  axes: a list of distinct ints in [-rank, rank), negative
      counting from the end; absent or null means every axis.  keepdim (default false)
      keeps each reduced axis as size 1.  An empty list reduces nothing: y = x.
  target form  params shape, target
      y = sum_to_shape(x, target): x reduced to a shape it broadcasts from, as autograd
      reduces the gradient of an operand that NumPy broadcasting expanded.  target has at
      most rank(x) dims; aligned from the right, each is either x's size or 1.  The leading
      axes target lacks are summed away, the axes where target has 1 (and x does not) are
      summed keeping size 1 (`oracle.broadcast.sum_to_shape`).  target [] is the full sum.

A sum over an axis of size 0 is 0.  x is the incoming gradient (any layout: contig,
transposed or sliced view, param x_layout); y is written contiguous.

Forward it differentiates: out = broadcast of v (shaped like y) to x's shape -- in the
axes form after re-inserting the reduced axes as size 1 when keepdim is off.  y is the
vector-Jacobian product of that broadcast with cotangent x: y = d/dv sum(x * out).  The
JAX oracle is exactly that: jax.vjp of jnp.broadcast_to (with jnp.expand_dims), whose
transpose rule sums; an independent derivation of the numpy sum.

dtypes: x and y in the case dtype.  Implementations accumulate in at least float32 (the
JAX forward casts v up to max(dtype, float32) before broadcasting, so its vjp sums in
float32 and casts once at the end) and round y once to the input dtype.

Error model: y_j is a plain sum of the n = (number of reduced elements) terms x_ij, so
s_j = sqrt(sum_i x_ij**2), the L2 norm of its terms, and n the number of reduced elements.

Where torch differs from this spec: `x.sum(dim=[])` in torch sums *every* axis (an empty
dim list means "all" in torch), while NumPy and JAX sum none.  This spec follows
NumPy/JAX -- the backward of a broadcast along no axes is the identity -- and the torch
baseline special-cases the empty list.  `Tensor.sum_to_size` is the target form exactly.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.argcheck import fmt_shape
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import LAYOUTS, from_values, nonzero_uniform
from oracle.broadcast import sum_to_shape

OP = "reduce_sum"


# ----------------------------------------------------------------------------- the spec in numpy


def normalize_axes(axes, rank: int) -> tuple[int, ...]:
    """axes as sorted non-negative ints; None means every axis."""
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted(a % rank if rank else a for a in axes))


def reduced_axes(x_shape, params) -> tuple[int, ...]:
    """The axes of x that are summed (in either form)."""
    x_shape = tuple(x_shape)
    if "target" in params:
        target = tuple(params["target"])
        lead = len(x_shape) - len(target)
        return tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target) if t == 1 and x_shape[lead + i] != 1)
    return normalize_axes(params.get("axes"), len(x_shape))


def out_shape(x_shape, params) -> tuple[int, ...]:
    x_shape = tuple(x_shape)
    if "target" in params:
        return tuple(params["target"])
    axes = normalize_axes(params.get("axes"), len(x_shape))
    if params.get("keepdim", False):
        return tuple(1 if i in axes else n for i, n in enumerate(x_shape))
    return tuple(n for i, n in enumerate(x_shape) if i not in axes)


def reduce_sum_numpy(x: np.ndarray, params) -> np.ndarray:
    """y in float64: np.sum over the axes (axes form) or sum_to_shape (target form)."""
    x = np.asarray(x, np.float64)
    if "target" in params:
        return sum_to_shape(x, params["target"])
    axes = normalize_axes(params.get("axes"), x.ndim)
    return np.sum(x, axis=axes, keepdims=bool(params.get("keepdim", False)))


def broadcast_numpy(v: np.ndarray, x_shape, params) -> np.ndarray:
    """The forward: v (shaped like y) broadcast to x's shape."""
    if "target" not in params and not params.get("keepdim", False):
        v = np.expand_dims(v, normalize_axes(params.get("axes"), len(x_shape)))
    return np.broadcast_to(v, tuple(x_shape))


def reduce_sum_jax(inputs: dict, params: dict) -> dict:
    """{y} by jax.vjp of the broadcast forward, at v = 0 (the forward is linear in v).

    dtype-agnostic: v is cast up to at least float32 before the broadcast and the result
    back to x's dtype, so in bf16/f16 the transpose (the sum) runs in float32; in float64
    every cast is the identity.
    """
    import jax
    import jax.numpy as jnp

    x = inputs["x"]
    shape = out_shape(x.shape, params)
    acc = jnp.promote_types(x.dtype, jnp.float32)

    def forward(v):
        v = v.astype(acc)
        if "target" not in params and not params.get("keepdim", False):
            v = jnp.expand_dims(v, normalize_axes(params.get("axes"), x.ndim))
        return jnp.broadcast_to(v, x.shape).astype(x.dtype)

    _, vjp = jax.vjp(forward, jnp.zeros(shape, x.dtype))
    (y,) = vjp(x)
    return {"y": y}


# ----------------------------------------------------------------------------- declaration


def _shapes(case):
    x = tuple(case.params["shape"])
    return {"x": x, "y": out_shape(x, case.params)}


def _generate(case, rng):
    x = nonzero_uniform(rng, tuple(case.params["shape"]))
    return {"x": from_values(x, case.dtype, case.params.get("x_layout", "contig"))}


def _numpy_oracle(inputs, params):
    return {"y": reduce_sum_numpy(inputs["x"], params)}


def _loss(inputs, params):
    """sum(x * broadcast(v)): its gradient in v is y.  v is not an input of the backward."""
    x = inputs["x"]
    return float(np.sum(x * broadcast_numpy(inputs["v"], x.shape, params)))


def _error_scale(inputs, params):
    x = inputs["x"]
    n = prod(x.shape[a] for a in reduced_axes(x.shape, params))
    return {"y": (np.sqrt(reduce_sum_numpy(np.square(x), params)), n)}


def _cost(case):
    """Bytes: x read once, y written once, in the case dtype: itemsize * (|x| + |y|).  Flops: one add
    per term folded away, |x| - |y|."""
    s = _shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    nx, ny = prod(s["x"]), prod(s["y"])
    return Cost(bytes=item * (nx + ny), flops=max(nx - ny, 0))


def _fmt(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _case_id(case):
    p = case.params
    parts = [case.dtype, "X=" + _fmt(p["shape"])]
    if "target" in p:
        head = "sum_to"
        parts.append("T=" + _fmt(p["target"]))
    else:
        head = "sum"
        axes = p.get("axes")
        parts.append("axes=all" if axes is None else f"axes=({','.join(map(str, axes))})")
        if p.get("keepdim", False):
            parts.append("keepdim")
    if p.get("x_layout", "contig") != "contig":
        parts.append(f"X:{p['x_layout']}")
    return f"{head}[{','.join(parts)}]"


def _validate(case):
    p = case.params
    where = f"{OP} case"
    if "shape" not in p:
        raise ValueError(f"{where}: missing param 'shape' in {p}")
    shape = tuple(p["shape"])
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise ValueError(f"{where}: param 'shape' must be non-negative ints, got {list(shape)}")
    unknown = set(p) - {"shape", "axes", "keepdim", "target", "x_layout"}
    if unknown:
        raise ValueError(f"{where}: unknown params {sorted(unknown)}: expected shape, axes, keepdim, target, x_layout")
    if "target" in p:
        if "axes" in p or "keepdim" in p:
            raise ValueError(f"{where}: param 'target' excludes 'axes'/'keepdim' (one form per case), got {p}")
        target = tuple(p["target"])
        lead = len(shape) - len(target)
        if lead < 0 or any(t not in (n, 1) for t, n in zip(target, shape[lead:])):
            raise ValueError(f"{where}: param 'target' must be a shape {list(shape)} broadcasts from "
                             f"(each dim equal or 1, aligned right), got {list(target)}")
    elif p.get("axes") is not None:
        axes = p["axes"]
        rank = len(shape)
        if any(not isinstance(a, int) or not -rank <= a < rank for a in axes):
            raise ValueError(f"{where}: param 'axes' must be ints in [{-rank}, {rank}), got {list(axes)}")
        if len({a % rank for a in axes}) != len(axes):
            raise ValueError(f"{where}: param 'axes' repeats an axis: {list(axes)}")
    layout = p.get("x_layout", "contig")
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: param 'x_layout' must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout != "contig" and len(shape) < (2 if layout == "transposed" else 1):
        raise ValueError(f"{where}: param 'x_layout' {layout!r} needs a rank >= "
                         f"{2 if layout == 'transposed' else 1} shape, got {list(shape)}")


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): x's shape, one form of params (target, or
    axes/keepdim) that fits it, and y the shape the sum gives."""
    c.expect_param_shape("x", "shape")
    x = c.shape("x")
    rank = len(x)
    if "target" in c.params:
        if "axes" in c.params or "keepdim" in c.params:
            c.fail(ValueError, f"params has 'target' and {'axes' if 'axes' in c.params else 'keepdim'}, "
                               "expected one form: target, or axes/keepdim")
        target = c.ints("target", c.params["target"])
        lead = rank - len(target)
        if lead < 0 or any(t not in (n, 1) for t, n in zip(target, x[lead:])):
            c.fail(ValueError, f"params['target'] is {list(target)}, expected a shape x {fmt_shape(x)} sums to "
                               f"(at most {rank} dims aligned from the right, each equal to x's or 1)")
        why = lambda: f"x {fmt_shape(x)} summed to params['target']"  # noqa: E731
    else:
        axes = c.params.get("axes")
        if axes is not None:
            axes = c.ints("axes", axes)
            if any(not -rank <= ax < rank for ax in axes) or len({ax % rank for ax in axes}) != len(axes):
                c.fail(ValueError, f"params['axes'] is {list(axes)}, expected distinct axes of x {fmt_shape(x)} "
                                   f"in [{-rank}, {rank})")
        c.flag("keepdim", False)
        why = lambda: f"x {fmt_shape(x)} summed over params['axes']"  # noqa: E731
    c.expect("y", out_shape(x, c.params), why)


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("x",),
    outputs=("y",),
    params={"shape": "shape of x",
            "axes": "axes form: list of axes to sum (negative ok); absent/null = all, [] = none",
            "keepdim": "axes form: keep reduced axes as size 1 (default false)",
            "target": "target form (instead of axes/keepdim): the shape x is summed to, as sum_to_size",
            "x_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=reduce_sum_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"y": "v"},
    validate=_validate,
    check_args=_check_args,
    row_separable=True,
    conventions=(
        "axes form: an empty axes list sums nothing (NumPy/JAX), unlike torch's x.sum(dim=[]); absent or "
        "null axes sum every axis",
        "target form: sum_to_shape(x, target), as autograd reduces a broadcast operand's gradient",
        "x in any layout (x_layout); y contiguous, accumulated in at least float32 and rounded once to the "
        "case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402


def _exact_terms(case) -> int:
    shape = tuple(case.params["shape"])
    return prod(shape[a] for a in reduced_axes(shape, case.params))


def _exact_generate(case, rng):
    """x on the grid +-{1..255} (fewer for very long sums: exact.top_for), balanced so that each sum
    ends within two terms of zero: every partial sum is exact in float32, y is small enough that
    bf16 resolves one term of it, and a 16-bit accumulator rounds within a few terms."""
    shape = tuple(case.params["shape"])
    x = _exact.grid(rng, shape, _exact.top_for(_exact_terms(case), case.dtype))
    x = _exact.balance(x, 1.0, reduced_axes(shape, case.params), rng)
    return {"x": from_values(x, case.dtype, case.params.get("x_layout", "contig"))}


def _exact_outputs(case):
    n = _exact_terms(case)
    return ("y",) if _exact.sum_exact(n, _exact.top_for(n, case.dtype), case.dtype) else ()


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
