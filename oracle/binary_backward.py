"""binary_backward: gradients of an elementwise binary op with NumPy broadcasting.

Forward: out = f(a, b), with a of shape A, b of shape B, out of shape O = broadcast(A, B).
Backward: given grad_out (shape O),

    grad_a = sum_to_shape(grad_out * df/da(a, b), A)
    grad_b = sum_to_shape(grad_out * df/db(a, b), B)

where a and b are broadcast to O before the partials are taken, and sum_to_shape sums
over every axis along which the operand was broadcast (leading axes it lacks, and axes
where it has size 1).  An operand broadcast along a size-0 axis gets a gradient of 0.

Partials, for each fn:
    add      df/da = 1             df/db = 1
    sub      df/da = 1             df/db = -1
    mul      df/da = b             df/db = a
    div      df/da = 1/b           df/db = -a/b**2
    pow      df/da = b*a**(b-1)    df/db = a**b * ln(a)
    maximum  df/da = 1 if a > b, 1/2 if a == b, else 0;   df/db = 1 - df/da
    minimum  df/da = 1 if a < b, 1/2 if a == b, else 0;   df/db = 1 - df/da

Ties in maximum/minimum split the gradient equally, as JAX does (torch does the same
for torch.maximum / torch.minimum).  pow is defined by these real formulas: the
generator draws a > 0.  At a == 0 this oracle follows torch and JAX for the one case
that is finite in the limit: df/db = 0 when a == 0 and b >= 0 (a**b*ln a -> 0); df/da at
a == 0 is b*0**(b-1) as IEEE computes it (0 for b > 1, 1 for b == 1, inf for b < 1).
For a < 0 with non-integer b the result is NaN, as in IEEE pow.

dtypes: the inputs are in the case dtype; implementations compute the partials in at
least float32, accumulate the sums in at least float32, and write grad_a, grad_b in
the input dtype.

Peers that disagree: JAX misses the bf16 model on long broadcast reductions (e.g. grad_b of
mul[bf16,A=8x2048x4096,B=8x1x4096]) because XLA keeps part of a bf16 reduce_sum in bf16.
That is JAX's type rule, and the float32-accumulation rule above excludes it, so the oracle
is right (results/h100/baselines-full/FAILURES.md, class A).
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.argcheck import fmt_shape
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import from_grid, from_values, layout_error, nonzero_uniform
from oracle.broadcast import broadcast_shape, sum_to_shape

FNS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
# Arithmetic per output element for both partials and products (log and exp count 1 each).
_FLOPS_PER_ELEMENT = {"add": 0, "sub": 1, "mul": 2, "div": 5, "pow": 9, "maximum": 3, "minimum": 3}
# Multiples of 1/4 in [-2, 2] without 0: exact in every dtype, and two draws tie 1 time in 16.
_TIE_GRID = np.array([v / 4 for v in range(-8, 9) if v])


def partials(fn: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """df/da and df/db in float64, broadcast to the output shape."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        if fn == "add":
            return np.ones_like(a), np.ones_like(b)
        if fn == "sub":
            return np.ones_like(a), -np.ones_like(b)
        if fn == "mul":
            return b.copy(), a.copy()
        if fn == "div":
            return 1.0 / b, -a / (b * b)
        if fn == "pow":
            da = b * np.power(a, b - 1.0)
            db = np.where((a == 0) & (b >= 0), 0.0, np.power(a, b) * np.log(a))
            return da, db
        if fn in ("maximum", "minimum"):
            wins = a > b if fn == "maximum" else a < b
            da = np.where(a == b, 0.5, wins.astype(np.float64))
            return da, 1.0 - da
    raise ValueError(f"binary_backward: unknown fn {fn!r}: expected one of {', '.join(FNS)}")


def binary_backward_numpy(fn: str, a: np.ndarray, b: np.ndarray, grad_out: np.ndarray):
    """(grad_a, grad_b) in float64 by the explicit formulas above."""
    out_shape = broadcast_shape(np.shape(a), np.shape(b))
    if np.shape(grad_out) != out_shape:
        raise ValueError(f"binary_backward: grad_out has shape {np.shape(grad_out)}, expected {out_shape}")
    da, db = partials(fn, a, b)
    return sum_to_shape(grad_out * da, np.shape(a)), sum_to_shape(grad_out * db, np.shape(b))


def binary_backward_jax(inputs: dict, params: dict) -> dict:
    """{grad_a, grad_b} by jax.vjp of the forward jnp.<fn>(a, b): an independent derivation.

    dtype-agnostic: the oracle calls it in float64; the `jax` baseline calls it jitted in
    the case dtype on the GPU.
    """
    import jax
    import jax.numpy as jnp

    forward = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
               "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum}[params["fn"]]
    _, vjp = jax.vjp(forward, inputs["a"], inputs["b"])
    grad_a, grad_b = vjp(inputs["grad_out"])
    return {"grad_a": grad_a, "grad_b": grad_b}


# ----------------------------------------------------------------------------- declaration


_NUMPY_FORWARD = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
                  "maximum": np.maximum, "minimum": np.minimum}


def _loss(inputs, params):
    """sum(grad_out * f(a, b)): its gradient in a and b is (grad_a, grad_b)."""
    return float(np.sum(inputs["grad_out"] * _NUMPY_FORWARD[params["fn"]](inputs["a"], inputs["b"])))


def _shapes(case):
    a, b = tuple(case.params["a"]), tuple(case.params["b"])
    out = broadcast_shape(a, b)
    return {"a": a, "b": b, "grad_out": out, "grad_a": a, "grad_b": b}


def _generate(case, rng):
    p = case.params
    shapes = _shapes(case)
    fn = p["fn"]
    if fn in ("maximum", "minimum"):
        a, b = from_grid(rng, shapes["a"], _TIE_GRID), from_grid(rng, shapes["b"], _TIE_GRID)
    elif fn == "pow":
        a, b = rng.uniform(0.5, 2.0, shapes["a"]), rng.uniform(-2.0, 2.0, shapes["b"])
    elif fn == "div":
        a, b = nonzero_uniform(rng, shapes["a"]), nonzero_uniform(rng, shapes["b"], 0.5, 2.0)
    else:
        a, b = nonzero_uniform(rng, shapes["a"]), nonzero_uniform(rng, shapes["b"])
    g = nonzero_uniform(rng, shapes["grad_out"])
    return {
        "a": from_values(a, case.dtype, p.get("a_layout", "contig")),
        "b": from_values(b, case.dtype, p.get("b_layout", "contig")),
        "grad_out": from_values(g, case.dtype, p.get("g_layout", "contig")),
    }


def _numpy_oracle(inputs, params):
    ga, gb = binary_backward_numpy(params["fn"], inputs["a"], inputs["b"], inputs["grad_out"])
    return {"grad_a": ga, "grad_b": gb}


def _error_scale(inputs, params):
    """Per output element: sqrt of the sum of squared terms it reduces, and how many terms."""
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    da, db = partials(params["fn"], a, b)
    out = {}
    for name, x, d in (("grad_a", a, da), ("grad_b", b, db)):
        terms = g * d
        n = prod(g.shape) // prod(x.shape) if prod(x.shape) else 0
        out[name] = (np.sqrt(sum_to_shape(terms * terms, x.shape)), n)
    return out


def _cost(case):
    """Bytes: a, b and grad_out read once, grad_a and grad_b written once, in the case dtype:
    itemsize * (2|A| + 2|B| + |O|); for add and sub, whose partials are constants, a and b need
    not be read: itemsize * (|A| + |B| + |O|).  Flops: per element of O the partials and their products
    with grad_out (add 0, sub 1, mul 2, div 5, pow 9, maximum/minimum 3; exp and log count 1),
    plus one add per term folded away by each broadcast reduction: (|O| - |A|) + (|O| - |B|)."""
    s = _shapes(case)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    na, nb, no = prod(s["a"]), prod(s["b"]), prod(s["grad_out"])
    flops = no * _FLOPS_PER_ELEMENT[case.params["fn"]] + (no - na) + (no - nb)
    reads_ab = case.params["fn"] not in ("add", "sub")
    return Cost(bytes=item * ((2 if reads_ab else 1) * (na + nb) + no), flops=max(flops, 0))


def _fmt(shape) -> str:
    return "x".join(map(str, shape)) if len(shape) else "scalar"


def _case_id(case):
    p = case.params
    extra = [f"{t}:{p[k]}" for t, k in (("A", "a_layout"), ("B", "b_layout"), ("G", "g_layout"))
             if p.get(k, "contig") != "contig"]
    return f"{p['fn']}[{','.join([case.dtype, 'A=' + _fmt(p['a']), 'B=' + _fmt(p['b'])] + extra)}]"


_LAYOUT_KEYS = {"a_layout": "a", "b_layout": "b", "g_layout": "grad_out"}  # param -> the tensor it lays out
_KNOWN = ("fn", "a", "b", *_LAYOUT_KEYS)


def _validate(case):
    p = case.params
    where = "binary_backward case"
    for key in ("fn", "a", "b"):
        if key not in p:
            raise ValueError(f"{where}: missing param {key!r} in {p}")
    unknown = sorted(set(p) - set(_KNOWN))
    if unknown:
        raise ValueError(f"{where}: unknown param {unknown[0]!r}: expected one of {', '.join(_KNOWN)}")
    if p["fn"] not in FNS:
        raise ValueError(f"{where}: param fn {p['fn']!r} is not one of {', '.join(FNS)}")
    for key in ("a", "b"):
        shape = p[key]
        if not isinstance(shape, (list, tuple)) or any(
                isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
            raise ValueError(f"{where}: param {key!r}: expected a shape (a list of non-negative ints), got {shape!r}")
    try:
        ranks = {"a": len(p["a"]), "b": len(p["b"]), "grad_out": len(broadcast_shape(p["a"], p["b"]))}
    except ValueError:
        raise ValueError(f"{where}: params 'a' and 'b': expected shapes that broadcast (NumPy rules), "
                         f"got {list(p['a'])} and {list(p['b'])}, which do not broadcast") from None
    for key, tensor in _LAYOUT_KEYS.items():
        why = layout_error(p.get(key, "contig"), ranks[tensor])
        if why:
            raise ValueError(f"{where}: param {key!r} ({tensor} has rank {ranks[tensor]}): {why}")


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): fn, and a, b, grad_out, grad_a, grad_b broadcast-consistent."""
    fn = c.params.get("fn")
    if fn not in FNS:
        c.fail(ValueError, f"params['fn'] is {fn!r}, expected one of {', '.join(FNS)}")
    c.expect_param_shape("a", "a")
    c.expect_param_shape("b", "b")
    a, b = c.shape("a"), c.shape("b")
    c.expect("grad_out", c.broadcast("a", "b"), lambda: f"the broadcast of a {fmt_shape(a)} and b {fmt_shape(b)}")
    c.expect("grad_a", a, lambda: "the shape of a")
    c.expect("grad_b", b, lambda: "the shape of b")


SPEC = register_op(OpSpec(
    name="binary_backward",
    doc=__doc__,
    inputs=("a", "b", "grad_out"),
    outputs=("grad_a", "grad_b"),
    params={"fn": f"one of {', '.join(FNS)}", "a": "shape A", "b": "shape B",
            "a_layout / b_layout / g_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=binary_backward_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"grad_a": "a", "grad_b": "b"},
    validate=_validate,
    check_args=_check_args,
    row_separable=True,
    conventions=(
        "NumPy broadcasting: grad_a, grad_b are summed over every axis their operand was broadcast along "
        "(sum_to_shape)",
        "maximum/minimum: a tie splits the gradient 1/2 and 1/2 (as JAX and torch do)",
        "partials and sums in at least float32; grad_a, grad_b written in the case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402

def _broadcast_axes(x_shape, out_shape) -> tuple[int, ...]:
    """The axes of out along which an operand of x_shape was broadcast (the axes its gradient sums)."""
    lead = len(out_shape) - len(x_shape)
    return tuple(range(lead)) + tuple(lead + i for i, n in enumerate(x_shape) if n == 1 and out_shape[lead + i] != 1)


def _exact_plan(case) -> tuple[int, int, int]:
    """(grid top of grad_out, grid top of a and b, largest |term| in grid units) on the exact set.

    add/sub sum grad_out alone (up to 255); mul sums g*b and g*a (15 * 15 = 225); div's b is a power
    of two (+-{1/2, 1, 2}) and its g*a/b**2 is up to 16 * 15 * 15 units of the finest step;
    maximum/minimum draw a and b from +-{1,2,3} (ties 1 time in 6) and sum g/2 or g; each top falls
    back to a smaller grid where the sums would be too long to stay exact (exact.top_for)."""
    fn, shapes = case.params["fn"], _shapes(case)
    out = prod(shapes["grad_out"])
    n = max(out // max(prod(shapes[x]), 1) for x in ("a", "b"))
    if fn in ("add", "sub"):
        t = _exact.top_for(n, case.dtype)
        return t, _exact.FACTOR, t
    if fn in ("maximum", "minimum"):
        t = _exact.top_for(2 * n, case.dtype)
        return t, _exact.SMALL, 2 * t
    if fn == "div":
        t = _exact.top_for(16 * n, case.dtype, product=True)
        return t, t, 16 * t * t
    t = _exact.top_for(n, case.dtype, product=True)
    return t, t, t * t


def _exact_generate(case, rng):
    """a, b, grad_out on the grid of _exact_plan (harness/exact.py); div's b a power of two, so 1/b and
    1/b**2 are exact.  pow gets a in {1/2, 1, 2} and b in +-{1, 2} (its a**b * ln a is never exact:
    not declared).  grad_out is balanced over the longer broadcast reduction, so that sum ends near 0."""
    p, shapes = case.params, _shapes(case)
    fn, out = p["fn"], shapes["grad_out"]
    g_top, ab_top, _ = _exact_plan(case) if fn != "pow" else (_exact.SMALL, _exact.SMALL, 0)
    if fn == "pow":
        a, b = np.exp2(rng.integers(-1, 2, shapes["a"])), _exact.grid(rng, shapes["b"], top=2) * 4
    else:
        a = _exact.grid(rng, shapes["a"], ab_top)
        b = _exact.powers(rng, shapes["b"]) if fn == "div" else _exact.grid(rng, shapes["b"], ab_top)
    g = _exact.grid(rng, out, g_top)
    da, db = partials(fn, a, b)
    n, axes, d = max(((prod(out) // max(prod(shapes[x]), 1), _broadcast_axes(shapes[x], out), dx)
                      for x, dx in (("a", da), ("b", db))), key=lambda t: t[0])
    if n > 1:
        g = _exact.balance(g, d, axes, rng)
    return {"a": from_values(a, case.dtype, p.get("a_layout", "contig")),
            "b": from_values(b, case.dtype, p.get("b_layout", "contig")),
            "grad_out": from_values(g, case.dtype, p.get("g_layout", "contig"))}


def _exact_outputs(case):
    """grad_a and grad_b, except for pow (exp and log) and sums too long to stay exact in float32."""
    if case.params["fn"] == "pow":
        return ()
    shapes, units = _shapes(case), _exact_plan(case)[2]
    out = prod(shapes["grad_out"])
    return tuple(g for g, x in (("grad_a", "a"), ("grad_b", "b"))
                 if _exact.sum_exact(out // max(prod(shapes[x]), 1), units, case.dtype))


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
