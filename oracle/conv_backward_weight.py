"""conv_backward_weight (wgrad): the gradient of a 1D/2D/3D convolution with respect to its weight.

Forward (torch's conv{1,2,3}d, a cross-correlation; see oracle/conv_common.py):

    y[n, co, o] = sum_{ci in group(co), k} x[n, ci, o*s + k*d - p] * w[co, ci - first(co), k]

with per-dim stride s, symmetric zero padding p (x reads 0 outside [0, I)), dilation d and
`groups` blocks of Cin/groups input and Cout/groups output channels.  Output size per dim:
O = floor((I + 2p - d*(k - 1) - 1) / s) + 1.

Backward: given dy (the shape of y) and x, for every weight element,

    dw[co, c, k] = sum_{n} sum_{o < O} dy[n, co, o] * x[n, first(co) + c, o*s + k*d - p]

(a correlation of x with dy over the batch and the output grid; terms that read the padding
are 0).  The kernel size is a param (it is not recoverable from x and dy when s > 1, just as
the input size is not for dgrad); `spatial` is x's size and the optional `out` param (dy's
size) must match the formula.  Input rows that no window reads (the last max(0, r - p) of a dim,
r = (I + 2p - d(k-1) - 1) mod s, and any position o*s + k*d - p never hits, as when s exceeds the
dilated kernel or s = d = 2) contribute nothing.

Layouts (param `layout`):
    channels_first  dy (N, Cout, *O), x (N, Cin, *I), dw (Cout, Cin/groups, *k): torch's NCHW.
    channels_last   dy (N, *O, Cout), x (N, *I, Cin), dw (Cout, *k, Cin/groups): NHWC.
For channels_last the *logical* shapes are the memory order: every tensor is a contiguous
NWC/NHWC/NDHWC buffer and dw is (Cout, kh, kw, Cin/g) (cuDNN's KRSC), byte for byte what
torch's channels_last memory format holds for the same tensors.  A channels-last kernel
writes dw as a plain contiguous array; the torch baseline computes with channels-last views
and permutes its result back.

Error model: dw[j] is a sum of the terms t = dy[n, co, o] * x[n, ci, o*s + k*d - p], so
s_j = sqrt(sum t**2) = sqrt(wgrad(dy**2, x**2)) (the same index math on squared values), and
n = N * prod(O) terms.  These reductions are long (ResNet-50's 3x3 layer at batch 32: 100352
terms), so the u_acc * sqrt(n) part of the tolerance dominates in float32: an accumulator
in float16/bfloat16 fails, as the rule requires.

Cost: dy, x read once, dw written once; flops = 2 * N * prod(O) * Cout * Cin/groups * prod(k),
the forward's multiply-adds.

dtypes: dy and x in the case dtype; accumulate in at least float32; dw in the case dtype.

Where torch and JAX differ, and who is right: as for conv_backward_data (TF32 on the GPU is
off in both baselines because it is not float32; torch's padding is symmetric and the JAX
oracle passes (p, p); the vjp is taken at a zero weight, the convolution being linear in w).

Peers that disagree: on a few f32 cases torch, torch_compile and jax return bitwise-equal dw up to
1.8x over tolerance, all from one cuDNN wgrad engine (torch's cudnn.deterministic pick, 10-40x the
default engine's error). The default engine, ATen native and the CPU pass, so the oracle is right
(results/h100/baselines-full/FAILURES.md, class C).
"""
from __future__ import annotations

from functools import lru_cache
from math import prod

import numpy as np

from harness import dtypes
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import from_values, nonzero_uniform
from oracle import conv_common as cc

OP = "conv_backward_weight"


def conv_backward_weight_numpy(dy: np.ndarray, x: np.ndarray, geo: cc.Geometry) -> np.ndarray:
    """dw in float64 in the case layout, by the correlation formula above."""
    dy, x = (cc.to_internal(np.asarray(a, np.float64), geo) for a in (dy, x))
    return cc.from_internal(cc.wgrad(dy, x, geo), geo)


def conv_backward_weight_jax(inputs: dict, params: dict) -> dict:
    """{dw} by jax.vjp of lax.conv_general_dilated w.r.t. its weight, at a zero primal.

    dtype-agnostic: the oracle calls it in float64; the `jax` baseline, jitted, in the case dtype.
    """
    return {"dw": _jax_wgrad(cc.geometry(params, OP))(inputs["dy"], inputs["x"])}


@lru_cache(maxsize=None)
def _jax_wgrad(geo: cc.Geometry):
    """One jitted vjp per geometry: XLA compiles it once (eagerly, each primitive compiles on its own)."""
    import jax
    import jax.numpy as jnp

    def wgrad(dy, x):
        _, vjp = jax.vjp(lambda w: cc.jax_conv(x, w, geo), jnp.zeros(geo.w_shape, dy.dtype))
        return vjp(dy)[0]

    return jax.jit(wgrad)


# ----------------------------------------------------------------------------- declaration


def _shapes(case):
    geo = cc.geometry(case.params, OP)
    return {"dy": geo.y_shape, "x": geo.x_shape, "dw": geo.w_shape}


def _generate(case, rng):
    p = case.params
    s = _shapes(case)
    return {"dy": from_values(nonzero_uniform(rng, s["dy"]), case.dtype, p.get("dy_layout", "contig")),
            "x": from_values(nonzero_uniform(rng, s["x"]), case.dtype, p.get("x_layout", "contig"))}


def _numpy_oracle(inputs, params):
    return {"dw": conv_backward_weight_numpy(inputs["dy"], inputs["x"], cc.geometry(params, OP))}


def _error_scale(inputs, params):
    """s = sqrt(wgrad(dy**2, x**2)): the L2 norm of the terms of each dw element; n = N * prod(O)."""
    geo = cc.geometry(params, OP)
    scale = np.sqrt(conv_backward_weight_numpy(inputs["dy"] ** 2, inputs["x"] ** 2, geo))
    return {"dw": (scale, geo.n * prod(geo.out))}


def _loss(inputs, params):
    """sum(dy * conv(x, w)): its gradient in w is dw.  w is the primal the op never sees (the
    finite-difference test supplies it; the loss is linear in w, so any w will do)."""
    geo = cc.geometry(params, OP)
    y = cc.forward(cc.to_internal(inputs["x"], geo), cc.to_internal(inputs["w"], geo), geo)
    return float(np.sum(cc.to_internal(inputs["dy"], geo) * y))


def _cost(case):
    geo = cc.geometry(case.params, OP)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    return Cost(bytes=item * (prod(geo.y_shape) + prod(geo.x_shape) + prod(geo.w_shape)), flops=2 * geo.macs)


def _case_id(case):
    return cc.case_id("wgrad", case, ("dy_layout", "x_layout"))


def _validate(case):
    cc.validate(OP, case.params, ("dy_layout", "x_layout"))


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): the geometry, and dy, x, dw of its shapes."""
    geo = cc.check_geometry(c)
    c.expect("dy", geo.y_shape, lambda: f"{cc.dy_dims(geo)} of the params' geometry")
    c.expect("x", geo.x_shape, lambda: "the input shape of the params' geometry")
    c.expect("dw", geo.w_shape, lambda: "the weight shape of the params' geometry")


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("dy", "x"),
    outputs=("dw",),
    params={**cc.PARAMS, "dy_layout / x_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=conv_backward_weight_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"dw": "w"},
    validate=_validate,
    check_args=_check_args,
    conventions=(
        "torch's convolution (cross-correlation), symmetric zero padding; the kernel size is a param, not "
        "derived from x and dy",
        "layout channels_first: dy (N, Cout, *O), x (N, Cin, *I), dw (Cout, Cin/g, *k); channels_last: "
        "contiguous NHWC buffers, dw (Cout, *k, Cin/g) (KRSC)",
        "f32 means IEEE float32: TF32 fails the tolerance",
        "accumulate in at least float32 (the reductions are long: N * prod(O) terms); dw in the case dtype",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402


def _exact_generate(case, rng):
    """dy and x on the grid +-{1..15}/16 (harness/exact.py): products k/256 with k <= 225."""
    p, s = case.params, _shapes(case)
    return {"dy": from_values(_exact.grid(rng, s["dy"], _exact.FACTOR), case.dtype, p.get("dy_layout", "contig")),
            "x": from_values(_exact.grid(rng, s["x"], _exact.FACTOR), case.dtype, p.get("x_layout", "contig"))}


def _exact_outputs(case):
    """dw: a sum of N * prod(O) products (fewer where taps read the padding), exact in float32 while
    sum_exact holds (every case here)."""
    geo = cc.geometry(case.params, OP)
    return ("dw",) if _exact.sum_exact(geo.n * prod(geo.out), 225, case.dtype) else ()


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
