"""A convolution padded to 3 spatial dims, and the (n, c, d, h, w) element strides of its tensors:
what the triton conv kernels and the CUDA conv plan (conv_cuda.py) both index by.

The missing leading spatial dims get size 1, kernel 1, stride 1, padding 0 and dilation 1, so
1D, 2D and 3D run as 3D; a missing dim's tensor stride is 0.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Geo3:
    """Sizes as ints, per-dim tuples of 3 (d, h, w)."""

    n: int
    cin: int
    cout: int
    groups: int
    inp: tuple   # I
    out: tuple   # O
    k: tuple
    s: tuple
    p: tuple
    d: tuple
    channels_last: bool = False

    @property
    def cig(self) -> int:
        return self.cin // self.groups

    @property
    def cog(self) -> int:
        return self.cout // self.groups


def data_strides(strides, channels_last: bool) -> tuple:
    """(n, c, d, h, w) element strides of (N, C, *S) or (N, *S, C); missing dims stride 0."""
    if channels_last:
        sn, *sp, sc = strides
    else:
        sn, sc, *sp = strides
    return (sn, sc, *([0] * (3 - len(sp)) + list(sp)))


def weight_strides(strides, channels_last: bool) -> tuple:
    """(co, ci, kd, kh, kw) element strides of (Cout, Cin/g, *k) or (Cout, *k, Cin/g)."""
    if channels_last:
        so, *sk, si = strides
    else:
        so, si, *sk = strides
    return (so, si, *([0] * (3 - len(sk)) + list(sk)))
