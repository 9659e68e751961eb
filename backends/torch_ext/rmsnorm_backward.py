"""rmsnorm_backward for `torch_ext`: the op's Python side (the C++ is rmsnorm_backward.cpp /
_cuda.cu over norm_backward.h; plans in _norm.py).  Spec: oracle/rmsnorm_backward.py.

Ops (namespace gradoracle; schemas in rmsnorm_backward.cpp):
    rmsnorm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor dx, Tensor dweight)
    rmsnorm_backward.out(dy, x, weight, rstd, *, Tensor(a!) dx, Tensor(b!) dweight) -> ()
    _rmsnorm_backward_run(..., Tensor plan, *, dx, dweight) -> ()                      (internal)

The public ops' CPU and CUDA kernels are the Python functions here: they take the plan for the
tensors' layout (_norm.plan_for, cached) and call the run op, whose C++ checks every argument
and runs it.  Both public ops have a fake (meta) kernel running harness.argcheck's checks.
"""
from __future__ import annotations

from backends.torch_ext import _norm, require, torch_ext
from harness import argcheck

OP = _norm.RMS
DTYPES = ("f32", "f16", "bf16", "f64")
_RUN = None  # torch.ops.gradoracle._rmsnorm_backward_run.default, once loaded


def run(dy, x, weight, rstd, dx, dweight) -> None:
    """Write dx and dweight in place (the extension must be loaded)."""
    _RUN(dy, x, weight, rstd, _norm.plan_for(OP, dy, x, weight, None, rstd, dx, dweight, None), dx=dx, dweight=dweight)


def _args(dy, x, weight, rstd, dx=None, dweight=None) -> dict:
    return {"dy": dy, "x": x, "weight": weight, "rstd": rstd, "dx": dx, "dweight": dweight}


def _functional(dy, x, weight, rstd):
    if x.dim() == 0:  # no N: the checks say so
        _norm.check(OP, _args(dy, x, weight, rstd), True)
    dx, dweight = x.new_empty(x.shape), x.new_empty((x.shape[-1],))
    run(dy, x, weight, rstd, dx, dweight)
    return dx, dweight


def _out(dy, x, weight, rstd, *, dx, dweight):
    run(dy, x, weight, rstd, dx, dweight)


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and their fake kernels."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._rmsnorm_backward_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl(f"gradoracle::{OP}", devices, _functional)
    torch.library.impl(f"gradoracle::{OP}.out", devices, _out)

    @torch.library.register_fake(f"gradoracle::{OP}")
    def _fake(dy, x, weight, rstd):
        _norm.check(OP, _args(dy, x, weight, rstd), True)
        return x.new_empty(x.shape), x.new_empty((x.shape[-1],))

    @torch.library.register_fake(f"gradoracle::{OP}.out")
    def _out_fake(dy, x, weight, rstd, *, dx, dweight):
        _norm.check(OP, _args(dy, x, weight, rstd, dx, dweight))

    @torch.library.register_fake(f"gradoracle::_{OP}_run")
    def _run_fake(dy, x, weight, rstd, plan, *, dx, dweight):
        return None


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=True)
def _rmsnorm_backward_impl(inputs, outs, params):
    """Writes outs['dx'] and outs['dweight'] in place."""
    require()
    run(inputs["dy"], inputs["x"], inputs["weight"], inputs["rstd"], outs["dx"], outs["dweight"])


def rmsnorm_backward(dy, x, weight, rstd):
    """(dx, dweight) by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.rmsnorm_backward(dy, x, weight, rstd)
