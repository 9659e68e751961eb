"""conv_backward_weight through torch: torch.nn.grad.conv{1,2,3}d_weight (cuDNN on the GPU).

Layouts and TF32 as in conv_backward_data.py: channels_last tensors go in as torch
channels-last views and dw (Cout, Cin/g, *k) comes back permuted to (Cout, *k, Cin/g).
"""
from __future__ import annotations

from backends.baselines._torch_autograd.conv_backward_data import conv_args, from_torch, ieee_fp32, to_torch
from oracle import conv_common as cc

OP = "conv_backward_weight"


def backward(inputs, params):
    import torch

    geo = cc.geometry(params, OP)
    fn = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight, 3: torch.nn.grad.conv3d_weight}[geo.rank]
    weight_size = (geo.cout, geo.cin // geo.groups, *geo.kernel)
    with ieee_fp32():
        dw = fn(to_torch(inputs["x"], geo), weight_size, to_torch(inputs["dy"], geo), **conv_args(geo))
    return {"dw": from_torch(dw, geo)}
