"""Convolution geometry and float64 index math shared by conv_backward_data and conv_backward_weight.

The forward both ops differentiate is torch's conv{1,2,3}d: a cross-correlation with
per-dimension stride s, symmetric zero padding p and dilation d, and `groups` blocks of
channels.  In channels-first index form (o, k and the input position are vectors over the
spatial dims, sums are over every k in the kernel box),

    y[n, co, o] = sum_{ci in group(co), k} x[n, ci, o*s + k*d - p] * w[co, ci - first(co), k]

where x outside [0, I) reads as 0 (the padding); output channel co is in group
g = co // (Cout/groups), which sees the Cin/groups input channels group(co) =
[g*Cin/groups, (g+1)*Cin/groups), the first of them first(co); an input channel ci is in
group ci // (Cin/groups) likewise.  The output size along each spatial dim is

    O = floor((I + 2p - d*(k - 1) - 1) / s) + 1            (must be >= 1)

Every array here is in the *internal* layout, channels last: x (N, *I, Cin), y and dy
(N, *O, Cout), w (Cout, *k, Cin/groups).  The op modules convert from the case layout at
the boundary (`to_internal` / `from_internal`).  Each function is a loop over the kernel
offsets k: at offset k the output grid o reads the strided window xp[o*s + k*d] of the
padded input xp, and one matrix product per group does the channel sum, so the code reads
as the formula and runs at BLAS speed.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod

import numpy as np

LAYOUTS = ("channels_first", "channels_last")
_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}
_SPATIAL_LABEL = {1: "L", 2: "HW", 3: "DHW"}
_REQUIRED = ("n", "cin", "cout", "spatial", "kernel")


@dataclass(frozen=True)
class Geometry:
    """A convolution's shapes, normalised from a case's params (per-dim tuples everywhere)."""

    n: int
    cin: int
    cout: int
    spatial: tuple[int, ...]  # input spatial size I
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    layout: str

    @property
    def rank(self) -> int:
        return len(self.spatial)

    @property
    def out(self) -> tuple[int, ...]:
        return tuple(out_size(*a) for a in zip(self.spatial, self.kernel, self.stride, self.padding, self.dilation))

    @property
    def channels_last(self) -> bool:
        return self.layout == "channels_last"

    # Shapes in the case layout (what the tensors, the kernels and the JAX oracle see).
    def data_shape(self, c: int, sizes) -> tuple[int, ...]:
        return (self.n, *sizes, c) if self.channels_last else (self.n, c, *sizes)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return self.data_shape(self.cin, self.spatial)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return self.data_shape(self.cout, self.out)

    @property
    def w_shape(self) -> tuple[int, ...]:
        cig = self.cin // self.groups
        return (self.cout, *self.kernel, cig) if self.channels_last else (self.cout, cig, *self.kernel)

    @property
    def dimension_numbers(self) -> tuple[str, str, str]:
        """lax.conv_general_dilated's (lhs, rhs, out) specs for the case layout."""
        s = _SPATIAL[self.rank]
        if self.channels_last:
            return f"N{s}C", f"O{s}I", f"N{s}C"
        return f"NC{s}", f"OI{s}", f"NC{s}"

    @property
    def macs(self) -> int:
        """Multiply-adds of the forward (and of each backward): N * prod(O) * Cout * Cin/groups * prod(k)."""
        return self.n * prod(self.out) * self.cout * (self.cin // self.groups) * prod(self.kernel)


def out_size(i: int, k: int, s: int, p: int, d: int) -> int:
    return (i + 2 * p - d * (k - 1) - 1) // s + 1


def _per_dim(op: str, params: dict, key: str, rank: int, default: int | None):
    value = params.get(key, default)
    if value is None:
        raise ValueError(f"{op}: missing param {key!r}")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * rank
    value = tuple(value)
    if len(value) != rank or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{op}: param {key!r} must be an int or {rank} ints (one per spatial dim of "
                         f"spatial={list(params.get('spatial', []))}), got {list(value)}")
    return tuple(int(v) for v in value)


def geometry(params: dict, op: str = "conv") -> Geometry:
    """The Geometry of a case's params, validated: ValueError naming op, param, expected and got."""
    for key in _REQUIRED:
        if key not in params:
            raise ValueError(f"{op}: missing param {key!r} (required: {', '.join(_REQUIRED)})")
    spatial = params["spatial"]
    if isinstance(spatial, (int, np.integer)) or not 1 <= len(spatial) <= 3:
        raise ValueError(f"{op}: param 'spatial' must list 1, 2 or 3 input sizes (W, HW or DHW), got {spatial!r}")
    rank = len(spatial)
    spatial = _per_dim(op, params, "spatial", rank, None)
    kernel = _per_dim(op, params, "kernel", rank, None)
    stride = _per_dim(op, params, "stride", rank, 1)
    padding = _per_dim(op, params, "padding", rank, 0)
    dilation = _per_dim(op, params, "dilation", rank, 1)
    for key, values, low in (("spatial", spatial, 1), ("kernel", kernel, 1), ("stride", stride, 1),
                             ("padding", padding, 0), ("dilation", dilation, 1)):
        if min(values) < low:
            raise ValueError(f"{op}: param {key!r} must be >= {low} in every dim, got {list(values)}")
    for key in ("n", "cin", "cout", "groups"):
        v = params.get(key, 1)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{op}: param {key!r} must be an int >= 1, got {v!r}")
    groups = int(params.get("groups", 1))
    for key in ("cin", "cout"):
        if params[key] % groups:
            raise ValueError(f"{op}: param 'groups' must divide {key}: expected a divisor of {params[key]}, "
                             f"got groups={groups}")
    layout = params.get("layout", "channels_first")
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: param 'layout' must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    geo = Geometry(int(params["n"]), int(params["cin"]), int(params["cout"]), spatial, kernel, stride, padding,
                   dilation, groups, layout)
    for j, o in enumerate(geo.out):
        if o < 1:
            span = dilation[j] * (kernel[j] - 1) + 1
            raise ValueError(f"{op}: param 'spatial' dim {j}: expected padded input size I + 2p >= the dilated kernel "
                             f"d*(k-1)+1 = {span}, got I={spatial[j]}, p={padding[j]} (output size {o})")
    if "out" in params:  # dy's spatial size, when a case states it: must match the formula
        want = tuple(params["out"]) if not isinstance(params["out"], (int, np.integer)) else (params["out"],)
        if want != geo.out:
            raise ValueError(f"{op}: param 'out' (dy's spatial size) must be floor((I + 2p - d(k-1) - 1)/s) + 1 = "
                             f"{list(geo.out)} for spatial={list(spatial)}, got {list(want)}")
    return geo


def validate(op: str, params: dict, tensor_layout_keys: tuple[str, ...]) -> Geometry:
    """geometry(), plus: no unknown params (a typo must not silently take a default), and valid
    tensor layouts (contig / transposed / sliced) for the op's input view keys."""
    from harness.tensors import LAYOUTS as TENSOR_LAYOUTS

    known = {"n", "cin", "cout", "spatial", "kernel", "stride", "padding", "dilation", "groups", "layout", "out",
             *tensor_layout_keys}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{op}: unknown param {unknown[0]!r}: expected one of {', '.join(sorted(known))}")
    for key in tensor_layout_keys:
        if params.get(key, "contig") not in TENSOR_LAYOUTS:
            raise ValueError(f"{op}: param {key!r} must be one of {', '.join(TENSOR_LAYOUTS)}, got {params[key]!r}")
    return geometry(params, op)


# ----------------------------------------------------------------------------- layouts


def to_internal(a: np.ndarray, geo: Geometry) -> np.ndarray:
    """Case layout -> internal channels-last: (N, C, *S) -> (N, *S, C); weights (O, I, *k) -> (O, *k, I)."""
    return a if geo.channels_last else np.moveaxis(a, 1, -1)


def from_internal(a: np.ndarray, geo: Geometry) -> np.ndarray:
    """Internal channels-last -> case layout (the inverse of to_internal), contiguous."""
    return np.ascontiguousarray(a if geo.channels_last else np.moveaxis(a, -1, 1))


# ----------------------------------------------------------------------------- index math


def _offsets(geo: Geometry):
    """Every kernel offset k, as a tuple of per-dim indices."""
    return product(*(range(k) for k in geo.kernel))


def _window(geo: Geometry, k: tuple[int, ...]) -> tuple[slice, ...]:
    """Slices of the padded input read by the output grid at kernel offset k: xp[o*s + k*d] for all o."""
    return tuple(slice(kj * d, kj * d + s * (o - 1) + 1, s)
                 for kj, s, d, o in zip(k, geo.stride, geo.dilation, geo.out))


def _blocks(geo: Geometry):
    """(output-channel slice, input-channel slice) of each group."""
    cog, cig = geo.cout // geo.groups, geo.cin // geo.groups
    return [(slice(g * cog, (g + 1) * cog), slice(g * cig, (g + 1) * cig)) for g in range(geo.groups)]


def _pad(x: np.ndarray, geo: Geometry) -> np.ndarray:
    return np.pad(x, [(0, 0)] + [(p, p) for p in geo.padding] + [(0, 0)])


def forward(x: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    """y[n, o, co] = sum_{k, ci in group} xp[n, o*s + k*d, ci] * w[co, k, ci]   (internal layout)."""
    xp = _pad(np.asarray(x, np.float64), geo)
    y = np.zeros((geo.n, *geo.out, geo.cout))
    lead = (slice(None),) * (1 + geo.rank)
    for k in _offsets(geo):
        xs = xp[(slice(None), *_window(geo, k))]  # (N, *O, Cin)
        for co, ci in _blocks(geo):
            y[lead + (co,)] += xs[lead + (ci,)] @ w[(co, *k)].T  # (N,*O,Cin/g) @ (Cin/g, Cout/g)
    return y


def dgrad(dy: np.ndarray, w: np.ndarray, geo: Geometry) -> np.ndarray:
    """dx[n, i, ci] = sum over (o, k) with o*s + k*d - p = i, co in group(ci) of dy[n, o, co] * w[co, k, ci].

    Scatter form: at each offset k, dy @ w[:, k] lands on the strided window of the padded
    dx; the padding is cropped at the end.  Input positions no (o, k) reaches get exactly 0.
    """
    padded = tuple(i + 2 * p for i, p in zip(geo.spatial, geo.padding))
    dxp = np.zeros((geo.n, *padded, geo.cin))
    lead = (slice(None),) * (1 + geo.rank)
    for k in _offsets(geo):
        win = (slice(None), *_window(geo, k))
        for co, ci in _blocks(geo):
            dxp[win + (ci,)] += dy[lead + (co,)] @ w[(co, *k)]  # (N,*O,Cout/g) @ (Cout/g, Cin/g)
    crop = (slice(None), *(slice(p, p + i) for p, i in zip(geo.padding, geo.spatial)), slice(None))
    return dxp[crop]


def wgrad(dy: np.ndarray, x: np.ndarray, geo: Geometry) -> np.ndarray:
    """dw[co, k, ci] = sum_{n, o} dy[n, o, co] * xp[n, o*s + k*d, group(co) first + ci]."""
    xp = _pad(np.asarray(x, np.float64), geo)
    dw = np.zeros((geo.cout, *geo.kernel, geo.cin // geo.groups))
    rows = geo.n * prod(geo.out)
    for k in _offsets(geo):
        xs = xp[(slice(None), *_window(geo, k))].reshape(rows, geo.cin)  # (N*prod(O), Cin)
        dy2 = dy.reshape(rows, geo.cout)
        for co, ci in _blocks(geo):
            dw[(co, *k)] = dy2[:, co].T @ xs[:, ci]  # (Cout/g, N*O) @ (N*O, Cin/g)
    return dw


# ----------------------------------------------------------------------------- JAX forward


def jax_conv(x, w, geo: Geometry):
    """torch's conv forward in JAX, in the case layout: lax.conv_general_dilated at full precision.

    precision=HIGHEST: XLA may otherwise run float32 convolutions in TF32 on the GPU, whose
    10-bit-mantissa inputs break the float32 error model (and the float64 oracle is run at
    HIGHEST by construction).
    """
    from jax import lax

    return lax.conv_general_dilated(
        x, w, window_strides=geo.stride, padding=[(p, p) for p in geo.padding], rhs_dilation=geo.dilation,
        dimension_numbers=geo.dimension_numbers, feature_group_count=geo.groups, precision=lax.Precision.HIGHEST)


# ----------------------------------------------------------------------------- case ids


def _dims(values) -> str:
    return "x".join(map(str, values))


def _uniform(values) -> str:
    return str(values[0]) if len(set(values)) == 1 else _dims(values)


def layout_name(geo: Geometry) -> str:
    s = _SPATIAL[geo.rank].lower()
    return f"n{s}c" if geo.channels_last else f"nc{s}"


def case_id(prefix: str, case, extra_layouts: tuple[str, ...]) -> str:
    """e.g. dgrad2d[bf16,N=32,C=64->64,HW=56x56,k=3x3,s=1,p=1,d=1,g=1,nhwc]."""
    geo = geometry(case.params, prefix)
    parts = [case.dtype, f"N={geo.n}", f"C={geo.cin}->{geo.cout}", f"{_SPATIAL_LABEL[geo.rank]}={_dims(geo.spatial)}",
             f"k={_dims(geo.kernel)}", f"s={_uniform(geo.stride)}", f"p={_uniform(geo.padding)}",
             f"d={_uniform(geo.dilation)}", f"g={geo.groups}", layout_name(geo)]
    parts += [f"{key.removesuffix('_layout')}:{case.params[key]}" for key in extra_layouts
              if case.params.get(key, "contig") != "contig"]
    return f"{prefix}{geo.rank}d[{','.join(parts)}]"


PARAMS = {
    "n": "batch size N",
    "cin / cout": "input / output channels",
    "spatial": "the input's spatial size: [W], [H, W] or [D, H, W]",
    "kernel": "kernel size per spatial dim",
    "stride / padding / dilation": "per spatial dim, or one int for all (defaults 1 / 0 / 1; padding on both sides)",
    "groups": "channel groups, dividing cin and cout (default 1; cin = cout = groups is depthwise)",
    "layout": "channels_first (NCW/NCHW/NCDHW, weight (Cout, Cin/g, *k); the default) or channels_last "
              "(NWC/NHWC/NDHWC, weight (Cout, *k, Cin/g))",
    "out": "optional: dy's spatial size, checked against the output-size formula",
}


def check_geometry(c):
    """The argument rules' shared part (harness/argcheck.py): the params' geometry, its own
    message (which names the param) raised through the call; the Geometry."""
    try:
        return geometry(c.params, c.op)
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc)
        c.fail(ValueError, text[len(c.op) + 2:] if text.startswith(f"{c.op}: ") else text)


def dy_dims(geo: Geometry) -> str:
    """dy's dims in words, for messages: (N, *O, Cout) or (N, Cout, *O)."""
    return "(N, *O, Cout)" if geo.channels_last else "(N, Cout, *O)"
