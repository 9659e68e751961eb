"""`torch_compile`: the same autograd code as `torch`, under torch.compile (Inductor)."""
from __future__ import annotations

from backends.baselines import _deviations, _torch_autograd
from backends.baselines.torch import check_torch, copy_into
from harness import argcheck
from harness.registry import Backend


def _check(device: str) -> str | None:
    reason = check_torch(device)
    return reason.replace("torch:", "torch_compile:") if reason else None


# CUDA only: the baseline a GPU kernel competes with.  (Inductor's CPU code is another
# product, and compiling it per shape would take CI many minutes.)
def _fresh() -> None:
    """Before a benchmark: forget every compiled graph.  With torch's automatic dynamic shapes
    the kernels a shape gets depend on the shapes compiled before it (the second shape
    recompiles dynamic); a fresh start compiles each benchmarked case static, for its shape."""
    import torch._dynamo

    torch._dynamo.reset()


torch_compile = Backend("torch_compile", framework="torch", devices=("cuda",),
                        description="torch.compile of the eager autograd code", check=_check,
                        before_timing=_fresh)

_COMPILED: dict = {}


def _no_silent_eager_fallback(config) -> None:
    """Past dynamo's recompile limit (8 by default) a function silently runs eager, and the
    'torch_compile' figures would be eager ones; a case matrix recompiles far more than 8
    times, so lift the limit, and make hitting it an error rather than a fallback."""
    for name, value in (("recompile_limit", 1 << 16), ("cache_size_limit", 1 << 16),
                        ("accumulated_recompile_limit", 1 << 20), ("accumulated_cache_size_limit", 1 << 20),
                        ("fail_on_recompile_limit_hit", True), ("fail_on_cache_limit_hit", True)):
        if hasattr(config, name):
            setattr(config, name, value)


def _compiled(module):
    """One torch.compile per op with torch's defaults, as a user would write it: the first
    shape compiles static, a changed shape recompiles with automatic dynamic shapes."""
    if module.OP not in _COMPILED:
        import torch
        import torch._dynamo

        _no_silent_eager_fallback(torch._dynamo.config)
        _COMPILED[module.OP] = torch.compile(module.backward)
    return _COMPILED[module.OP]


for _module in _torch_autograd.modules():
    @argcheck.register(torch_compile, _module.OP, deterministic=False,
                        dtypes=getattr(_module, "DTYPES", ("f32", "f16", "bf16", "f64")),
                        supports=getattr(_module, "supports", None), deviations=_deviations.TORCH)
    def _run(inputs, outs, params, _module=_module):
        copy_into(outs, _compiled(_module)(inputs, dict(params)))
