"""layernorm_backward through torch: aten.native_layer_norm_backward, the kernel torch's
autograd runs for layer_norm, called with the saved mean/rstd (the backward alone: no
forward is recomputed, as in a training step).

torch wants mean/rstd shaped like its forward saves them, (*leading, 1).  The bias tensor
is only how torch learns that dbias is wanted: its values are never read, so an
uninitialised one stands in for it.

On CPU, for float16/bfloat16, torch's kernel takes mean/rstd in the input dtype (its CPU
forward stores them so) and sums dweight/dbias in the input dtype, which fails the
spec's float32-accumulation rule (err/tol ~4-5 at 4096 rows in bf16).  So on CPU those
dtypes run the same kernel on float32 copies and round the results once, as the spec
asks.  On CUDA torch keeps mean/rstd in float32 and accumulates in float32: the half
dtypes call the kernel as they are.

mean and rstd are made contiguous first: torch 2.13's CPU native_layer_norm_backward reads a
strided (e.g. sliced) mean/rstd as if it were dense, and returns NaN or wrong rows.
"""
OP = "layernorm_backward"


def backward(inputs, params):
    import torch

    dy, x, weight = inputs["dy"], inputs["x"], inputs.get("weight")
    dtype, n = x.dtype, x.shape[-1]
    # contiguous(): torch's CPU kernel reads strided mean/rstd as if dense (a silent wrong answer).
    mean, rstd = inputs["mean"].contiguous().unsqueeze(-1), inputs["rstd"].contiguous().unsqueeze(-1)
    if x.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        dy, x = dy.float(), x.float()
        weight = weight.float() if weight is not None else None
    bias = torch.empty(n, dtype=x.dtype, device=x.device) if params.get("bias", True) else None
    dx, dweight, dbias = torch.ops.aten.native_layer_norm_backward(
        dy, x, [n], mean, rstd, weight, bias, [True, weight is not None, bias is not None])
    out = {"dx": dx.to(dtype)}
    if weight is not None:
        out["dweight"] = dweight.to(dtype)
    if bias is not None:
        out["dbias"] = dbias.to(dtype)
    return out
