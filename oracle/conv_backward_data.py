"""conv_backward_data (dgrad): the gradient of a 1D/2D/3D convolution with respect to its input.

Forward (torch's conv{1,2,3}d, a cross-correlation; see oracle/conv_common.py):

    y[n, co, o] = sum_{ci in group(co), k} x[n, ci, o*s + k*d - p] * w[co, ci - first(co), k]

with per-dim stride s, symmetric zero padding p (x reads 0 outside [0, I)), dilation d and
`groups` blocks of Cin/groups input and Cout/groups output channels.  Output size per dim:
O = floor((I + 2p - d*(k - 1) - 1) / s) + 1.

Backward: given dy (the shape of y) and w, for every input position i and channel ci,

    dx[n, ci, i] = sum_{co in ci's group} sum_{k, o : o*s + k*d - p = i, 0 <= o < O}
                       dy[n, co, o] * w[co, ci - first(co), k]

(the transposed convolution of dy, cropped to the input).  Input positions that no (o, k)
reaches get exactly 0: the last max(0, r - p) rows of a dim, r = (I + 2p - d(k-1) - 1) mod s,
which the last window stops short of, and any position o*s + k*d - p never hits (the gaps
when s exceeds the dilated kernel, or e.g. s = d = 2).

Why the input size is a param: O depends on I only through floor(./s), so with s > 1
several input sizes give the same dy.  E.g. k=3, s=2, p=1: I=7 and I=8 both give O=4; for
I=8 the last row of dx is reached (o=3, k=2), for I=7 it does not exist.  dy and w alone
cannot decide the shape of dx; torch asks for it (conv2d_input's input_size), JAX derives it
from the primal.  `spatial` is I, and the optional `out` param (dy's size) must match the formula.

Layouts (param `layout`):
    channels_first  dy (N, Cout, *O), w (Cout, Cin/groups, *k), dx (N, Cin, *I): torch's NCHW.
    channels_last   dy (N, *O, Cout), w (Cout, *k, Cin/groups), dx (N, *I, Cin): NHWC.
For channels_last the *logical* shapes are the memory order: every tensor is a contiguous
NWC/NHWC/NDHWC buffer (the weight (Cout, kh, kw, Cin/g), i.e. cuDNN's KRSC), byte for byte
what torch's channels_last memory format holds for the same tensors.  So a channels-last
kernel reads and writes plain contiguous arrays, and the torch baseline sees channels-last
strided views (x.movedim(-1, 1)) of the very same memory.

Error model: dx[i] is a sum of the terms t = dy[n, co, o] * w[co, ci, k], so
s_i = sqrt(sum t**2) = sqrt(dgrad(dy**2, w**2)) (the same index math on squared values), and
n = Cout/groups * prod(k) terms (the most any element has; border and gap elements have fewer).

Cost: dy, w read once, dx written once; flops = 2 * N * prod(O) * Cout * Cin/groups * prod(k),
the forward's multiply-adds (the convention cuDNN and the papers use for dgrad).

dtypes: dy and w in the case dtype; accumulate in at least float32; dx in the case dtype.

Where torch and JAX differ, and who is right:
  * float32 on the GPU: torch's cuDNN convolutions default to TF32
    (torch.backends.cudnn.conv.fp32_precision = 'tf32'), XLA's may too.  TF32 rounds the
    inputs to 10 mantissa bits, about 2**-11 relative per term, which is not float32 and fails
    this model; the float64 oracle is right.  The torch baseline turns TF32 off for its call and
    the JAX one asks for Precision.HIGHEST, so the baselines compute what f32 promises.
  * Padding: torch pads both sides of a dim by p; lax.conv_general_dilated takes (low, high)
    pairs.  This op is torch's (symmetric) convolution; the JAX oracle passes (p, p).
  * Input size: torch needs it passed; JAX takes it from the primal (zeros of the input's shape:
    the convolution is linear in x, so the vjp does not depend on the primal's values).
  * Neither library accepts a 1D channels-last memory format; for NWC cases the torch baseline
    passes NCW views with channel stride 1, which torch handles as general strided input.

Peers that disagree: where no (o, k) reaches an input position (e.g. s=4 > k=3), dx is
exactly 0. XLA's transposed convolution writes float32 rounding noise (up to ~5e-6) there while
torch writes 0. The oracle's 0 is right (results/h100/baselines-full/FAILURES.md, class B).
"""
from __future__ import annotations

from functools import lru_cache
from math import prod

import numpy as np

from harness import dtypes
from harness.registry import Cost, OpSpec, register_op
from harness.tensors import from_values, nonzero_uniform
from oracle import conv_common as cc

OP = "conv_backward_data"


def conv_backward_data_numpy(dy: np.ndarray, w: np.ndarray, geo: cc.Geometry) -> np.ndarray:
    """dx in float64 in the case layout, by the scatter formula above."""
    dy, w = (cc.to_internal(np.asarray(a, np.float64), geo) for a in (dy, w))
    return cc.from_internal(cc.dgrad(dy, w, geo), geo)


def conv_backward_data_jax(inputs: dict, params: dict) -> dict:
    """{dx} by jax.vjp of lax.conv_general_dilated w.r.t. its input, at a zero primal.

    dtype-agnostic: the oracle calls it in float64; the `jax` baseline, jitted, in the case dtype.
    """
    return {"dx": _jax_dgrad(cc.geometry(params, OP))(inputs["dy"], inputs["w"])}


@lru_cache(maxsize=None)
def _jax_dgrad(geo: cc.Geometry):
    """One jitted vjp per geometry: XLA compiles it once (eagerly, each primitive compiles on its own)."""
    import jax
    import jax.numpy as jnp

    def dgrad(dy, w):
        _, vjp = jax.vjp(lambda x: cc.jax_conv(x, w, geo), jnp.zeros(geo.x_shape, dy.dtype))
        return vjp(dy)[0]

    return jax.jit(dgrad)


# ----------------------------------------------------------------------------- declaration


def _shapes(case):
    geo = cc.geometry(case.params, OP)
    return {"dy": geo.y_shape, "w": geo.w_shape, "dx": geo.x_shape}


def _generate(case, rng):
    p = case.params
    s = _shapes(case)
    return {"dy": from_values(nonzero_uniform(rng, s["dy"]), case.dtype, p.get("dy_layout", "contig")),
            "w": from_values(nonzero_uniform(rng, s["w"]), case.dtype, p.get("w_layout", "contig"))}


def _numpy_oracle(inputs, params):
    return {"dx": conv_backward_data_numpy(inputs["dy"], inputs["w"], cc.geometry(params, OP))}


def _error_scale(inputs, params):
    """s = sqrt(dgrad(dy**2, w**2)): the L2 norm of the terms of each dx element; n = Cout/g * prod(k)."""
    geo = cc.geometry(params, OP)
    scale = np.sqrt(conv_backward_data_numpy(inputs["dy"] ** 2, inputs["w"] ** 2, geo))
    return {"dx": (scale, geo.cout // geo.groups * prod(geo.kernel))}


def _loss(inputs, params):
    """sum(dy * conv(x, w)): its gradient in x is dx.  x is the primal the op never sees (the
    finite-difference test supplies it; the loss is linear in x, so any x will do)."""
    geo = cc.geometry(params, OP)
    y = cc.forward(cc.to_internal(inputs["x"], geo), cc.to_internal(inputs["w"], geo), geo)
    return float(np.sum(cc.to_internal(inputs["dy"], geo) * y))


def _cost(case):
    geo = cc.geometry(case.params, OP)
    item = dtypes.numpy_dtype(case.dtype).itemsize
    return Cost(bytes=item * (prod(geo.y_shape) + prod(geo.w_shape) + prod(geo.x_shape)), flops=2 * geo.macs)


def _case_id(case):
    return cc.case_id("dgrad", case, ("dy_layout", "w_layout"))


def _validate(case):
    cc.validate(OP, case.params, ("dy_layout", "w_layout"))


def _check_args(c) -> None:
    """The argument rule (harness/argcheck.py): the geometry, and dy, w, dx of its shapes."""
    geo = cc.check_geometry(c)
    c.expect("dy", geo.y_shape, lambda: f"{cc.dy_dims(geo)} of the params' geometry")
    c.expect("w", geo.w_shape, lambda: "the weight shape of the params' geometry")
    c.expect("dx", geo.x_shape, lambda: "the input shape of the params' geometry")


SPEC = register_op(OpSpec(
    name=OP,
    doc=__doc__,
    inputs=("dy", "w"),
    outputs=("dx",),
    params={**cc.PARAMS, "dy_layout / w_layout": "contig (default), transposed or sliced"},
    shapes=_shapes,
    generate=_generate,
    numpy_oracle=_numpy_oracle,
    jax_vjp=conv_backward_data_jax,
    error_scale=_error_scale,
    cost=_cost,
    case_id=_case_id,
    loss=_loss,
    wrt={"dx": "x"},
    validate=_validate,
    check_args=_check_args,
    conventions=(
        "torch's convolution (cross-correlation), symmetric zero padding; the input size is a param "
        "(`spatial`), not derived from dy",
        "layout channels_first: dy (N, Cout, *O), w (Cout, Cin/g, *k), dx (N, Cin, *I); channels_last: "
        "contiguous NHWC buffers, w (Cout, *k, Cin/g) (KRSC)",
        "f32 means IEEE float32: TF32 fails the tolerance",
        "accumulate in at least float32; dx in the case dtype, every element written (unreached positions "
        "are 0)",
    ),
))


# ----------------------------------------------------------------------------- exact-arithmetic input set

from harness import exact as _exact  # noqa: E402  (the exact set is declared after the op)
from harness.registry import declare_exact_set  # noqa: E402


def _exact_generate(case, rng):
    """dy and w on the grid +-{1..15}/16 (harness/exact.py): products k/256 with k <= 225."""
    p, s = case.params, _shapes(case)
    return {"dy": from_values(_exact.grid(rng, s["dy"], _exact.FACTOR), case.dtype, p.get("dy_layout", "contig")),
            "w": from_values(_exact.grid(rng, s["w"], _exact.FACTOR), case.dtype, p.get("w_layout", "contig"))}


def _exact_outputs(case):
    """dx: a sum of at most Cout/groups * prod(k) products, exact in float32 at every size here."""
    geo = cc.geometry(case.params, OP)
    return ("dx",) if _exact.sum_exact(geo.cout // geo.groups * prod(geo.kernel), 225, case.dtype) else ()


declare_exact_set(SPEC, _exact_generate, _exact_outputs)
