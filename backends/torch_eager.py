"""`torch`: eager autograd, the baseline a user would otherwise pick (CPU and CUDA)."""
from __future__ import annotations

from harness.registry import Backend


def _check(device: str) -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"torch: not importable ({exc})"
    if device == "cuda" and not torch.cuda.is_available():
        return "torch: no CUDA device"
    return None


torch_backend = Backend("torch", framework="torch", devices=("cpu", "cuda"),
                        description="torch eager autograd (torch.autograd.grad of the forward)", check=_check)

_FORWARD = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow",
            "maximum": "maximum", "minimum": "minimum"}


@torch_backend.impl("binary_backward", baseline=True, deterministic=False)
def binary_backward(inputs, outs, params):
    """Autograd of torch.<fn>(a, b): what a training framework gets with no custom kernel.

    Not declared deterministic: on CUDA, sum_to_size may use atomics for some shapes.
    """
    import torch

    a = inputs["a"].detach().requires_grad_()
    b = inputs["b"].detach().requires_grad_()
    out = getattr(torch, _FORWARD[params["fn"]])(a, b)
    grad_a, grad_b = torch.autograd.grad(out, (a, b), inputs["grad_out"])
    outs["grad_a"].copy_(grad_a)
    outs["grad_b"].copy_(grad_b)
