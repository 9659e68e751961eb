"""`liger`: Liger-Kernel's Triton layer norm and RMS norm backward kernels, a peer baseline (CUDA).

Usable only where `liger_kernel` imports (pip install liger-kernel); otherwise the backend
is listed as unavailable with the reason.  Each op calls Liger's backward entry point
(liger_kernel.ops.layer_norm.layer_norm_backward / ops.rms_norm.rms_norm_backward) on the
case's saved statistics, as Liger's own autograd Function does after its forward: the
backward alone, like the `torch` baseline.  Liger's kernels index rows by a single row
stride, so non-contiguous dy/x are made contiguous first (what Liger's autograd wrapper
does too, via its ensure_contiguous decorator).

layernorm_backward: Liger always takes a weight and a bias tensor; a case without weight
passes ones (the forward it differentiates is the same) and drops dweight, one without
bias drops dbias.  rmsnorm_backward: Liger's "llama" casting mode (rstd in float32, as
the case stores it), offset 0, dY not overwritten (in_place=False: dy is an input).
"""
from __future__ import annotations

import inspect

from harness import argcheck
from harness.registry import Backend

DTYPES = ("f32", "f16", "bf16")


def _check(device: str) -> str | None:
    try:
        import liger_kernel.ops.layer_norm  # noqa: F401
        import liger_kernel.ops.rms_norm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install (e.g. a triton mismatch)
        return f"liger: liger_kernel not importable ({type(exc).__name__}: {exc})"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "liger: no CUDA device"
    return None


liger = Backend("liger", framework="torch", devices=("cuda",),
                description="Liger-Kernel Triton layer norm / RMS norm backward", check=_check)


def _no_rows(inputs, outs) -> bool:
    """M = 0 rows (a size-0 leading dim): dx is empty and the row sums are 0, without a launch
    (Liger would launch an empty grid)."""
    if inputs["x"].numel():
        return False
    for name, out in outs.items():
        if name != "dx":
            out.zero_()
    return True


@argcheck.register(liger, "layernorm_backward", dtypes=DTYPES, deterministic=False)
def layernorm_backward(inputs, outs, params):
    import torch
    from liger_kernel.ops.layer_norm import layer_norm_backward

    if _no_rows(inputs, outs):
        return
    dy, x = inputs["dy"].contiguous(), inputs["x"].contiguous()
    n = x.shape[-1]
    weight = inputs.get("weight")
    w = weight.contiguous() if weight is not None else torch.ones(n, dtype=x.dtype, device=x.device)
    b = torch.empty(n, dtype=x.dtype, device=x.device)  # read for its dtype only
    mean = inputs["mean"].reshape(-1).contiguous()
    rstd = inputs["rstd"].reshape(-1).contiguous()
    dx, dw, db = layer_norm_backward(dy, x.view(-1, n), w, b, mean, rstd)
    outs["dx"].copy_(dx.view(outs["dx"].shape))
    if "dweight" in outs:
        outs["dweight"].copy_(dw)
    if "dbias" in outs:
        outs["dbias"].copy_(db)


@argcheck.register(liger, "rmsnorm_backward", dtypes=DTYPES, deterministic=False)
def rmsnorm_backward(inputs, outs, params):
    from liger_kernel.ops import rms_norm as lr
    from liger_kernel.ops.utils import calculate_settings

    if _no_rows(inputs, outs):
        return
    dy, x = inputs["dy"].contiguous(), inputs["x"].contiguous()
    n = x.shape[-1]
    block, warps = calculate_settings(n)
    args = [dy, x.view(-1, n), inputs["weight"].contiguous(), inputs["rstd"].reshape(-1).contiguous(),
            0.0, lr._str_to_casting_mode["llama"], block, warps, False]
    if "row_mode" in inspect.signature(lr.rms_norm_backward).parameters:  # liger >= 0.6
        args.append(None)
    dx, dw = lr.rms_norm_backward(*args)
    outs["dx"].copy_(dx.view(outs["dx"].shape))
    outs["dweight"].copy_(dw)
