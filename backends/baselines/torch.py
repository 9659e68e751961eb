"""`torch`: eager autograd, the baseline a user would otherwise pick (CPU and CUDA)."""
from __future__ import annotations

from backends.baselines import _deviations, _torch_autograd
from harness import argcheck
from harness.registry import Backend


def check_torch(device: str) -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"torch: not importable ({exc})"
    if device == "cuda" and not torch.cuda.is_available():
        return "torch: no CUDA device"
    return None


def copy_into(outs: dict, results: dict) -> None:
    for name, value in results.items():
        outs[name].copy_(value)


torch_backend = Backend("torch", framework="torch", devices=("cpu", "cuda"),
                        description="torch eager autograd", check=check_torch)

for _module in _torch_autograd.modules():
    # Not declared deterministic: on CUDA torch's reductions may use atomics for some shapes.
    @argcheck.register(torch_backend, _module.OP, baseline=True, deterministic=False,
                        dtypes=getattr(_module, "DTYPES", ("f32", "f16", "bf16", "f64")),
                        supports=getattr(_module, "supports", None), deviations=_deviations.TORCH)
    def _eager(inputs, outs, params, _backward=_module.backward):
        copy_into(outs, _backward(inputs, params))
