"""binary_backward through torch autograd: grad of torch.<fn>(a, b)."""
OP = "binary_backward"


def backward(inputs, params):
    import torch

    a = inputs["a"].detach().requires_grad_()
    b = inputs["b"].detach().requires_grad_()
    out = getattr(torch, params["fn"])(a, b)  # add, sub, mul, div, pow, maximum, minimum
    grad_a, grad_b = torch.autograd.grad(out, (a, b), inputs["grad_out"])
    return {"grad_a": grad_a, "grad_b": grad_b}
