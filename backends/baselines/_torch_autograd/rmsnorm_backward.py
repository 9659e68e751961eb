"""rmsnorm_backward through torch.

On CUDA: aten._fused_rms_norm_backward, the kernel torch's autograd runs for
F.rms_norm there, called with the saved rstd (the backward alone, as in a training step).
torch has no CPU kernel for it, so on CPU this is the autograd of F.rms_norm itself --
torch's composite CPU rms_norm, which recomputes rstd in float32 and differentiates
through it (what a CPU user gets).
"""
OP = "rmsnorm_backward"


def backward(inputs, params):
    import torch

    dy, x, weight = inputs["dy"], inputs["x"], inputs["weight"]
    n = x.shape[-1]
    if x.device.type == "cuda" and hasattr(torch.ops.aten, "_fused_rms_norm_backward"):
        rstd = inputs["rstd"].contiguous().unsqueeze(-1)  # as for layernorm: never trust a strided rstd
        dx, dweight = torch.ops.aten._fused_rms_norm_backward(dy, x, [n], rstd, weight, [True, True])
        return {"dx": dx, "dweight": dweight}
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = torch.nn.functional.rms_norm(x, [n], weight, params.get("eps", 1e-6))
    dx, dweight = torch.autograd.grad(y, (x, weight), dy)
    return {"dx": dx, "dweight": dweight}
