"""`torch_compile`: the same autograd code as `torch`, under torch.compile (Inductor)."""
from __future__ import annotations

from backends import _torch_autograd
from backends.torch_eager import check_torch, copy_into
from harness.registry import Backend


def _check(device: str) -> str | None:
    reason = check_torch(device)
    return reason.replace("torch:", "torch_compile:") if reason else None


# CUDA only: the baseline a GPU kernel competes with.  (Inductor's CPU code is another
# product, and compiling it per shape would take CI many minutes.)
torch_compile = Backend("torch_compile", framework="torch", devices=("cuda",),
                        description="torch.compile of the eager autograd code", check=_check)

_COMPILED: dict = {}


def _compiled(module):
    """One torch.compile per op; it recompiles per shape and dtype on its own (dynamic=False)."""
    if module.OP not in _COMPILED:
        import torch

        _COMPILED[module.OP] = torch.compile(module.backward, dynamic=False)
    return _COMPILED[module.OP]


for _module in _torch_autograd.modules():
    @torch_compile.impl(_module.OP, deterministic=False,
                        dtypes=getattr(_module, "DTYPES", ("f32", "f16", "bf16", "f64")),
                        supports=getattr(_module, "supports", None))
    def _run(inputs, outs, params, _module=_module):
        copy_into(outs, _compiled(_module)(inputs, dict(params)))
