"""conv_backward_data through torch: torch.nn.grad.conv{1,2,3}d_input (cuDNN on the GPU).

channels_last cases arrive as contiguous NWC/NHWC/NDHWC tensors (weight (Cout, *k, Cin/g));
movedim(-1, 1) turns them into torch's logical NCHW shapes with channels-last strides, i.e.
torch's channels_last memory format, so cuDNN runs its NHWC kernels, and the result is moved
back the same way.  TF32 is off for the call: torch's cuDNN convolutions default to TF32 in
float32, which is not float32 (see oracle/conv_backward_data.py).
"""
from __future__ import annotations

from contextlib import contextmanager

from oracle import conv_common as cc

OP = "conv_backward_data"


@contextmanager
def ieee_fp32():
    """cuDNN convolutions in true float32 for the duration (restores the user's setting)."""
    import torch

    conv = torch.backends.cudnn.conv
    old = conv.fp32_precision
    conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        conv.fp32_precision = old


def to_torch(t, geo: cc.Geometry):
    """A case-layout tensor as torch's logical channels-first view (same memory)."""
    return t.movedim(-1, 1) if geo.channels_last else t


def from_torch(t, geo: cc.Geometry):
    return t.movedim(1, -1) if geo.channels_last else t


def conv_args(geo: cc.Geometry) -> dict:
    return {"stride": geo.stride, "padding": geo.padding, "dilation": geo.dilation, "groups": geo.groups}


def backward(inputs, params):
    import torch

    geo = cc.geometry(params, OP)
    fn = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}[geo.rank]
    input_size = (geo.n, geo.cin, *geo.spatial)  # not recoverable from dy when stride > 1
    with ieee_fp32():
        dx = fn(input_size, to_torch(inputs["w"], geo), to_torch(inputs["dy"], geo), **conv_args(geo))
    return {"dx": from_torch(dx, geo)}
