"""layernorm_backward for `torch_ext`: the op's Python side (the C++ is layernorm_backward.cpp /
_cuda.cu over norm_backward.h; plans in _norm.py).  Spec: oracle/layernorm_backward.py.

Ops (namespace gradoracle; schemas in layernorm_backward.cpp):
    layernorm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool bias=True)
        -> (Tensor dx, Tensor dweight, Tensor dbias)
        dweight is (N,) when weight is given, else an empty (0,) tensor; dbias is (N,) when bias,
        else (0,) (a custom op returns tensors, not None).
    layernorm_backward.out(dy, x, weight, mean, rstd, *, Tensor(a!) dx, Tensor(b!)? dweight=None,
        Tensor(c!)? dbias=None) -> ()        dweight comes with weight; dbias given: dbias wanted
    _layernorm_backward_run(..., Tensor plan, *, dx, dweight, dbias) -> ()             (internal)

The public ops' CPU and CUDA kernels are the Python functions here: they take the plan for the
tensors' layout (_norm.plan_for, cached) and call the run op, whose C++ checks every argument
and runs it.  Both public ops have a fake (meta) kernel running harness.argcheck's checks.
"""
from __future__ import annotations

from backends.torch_ext import _norm, require, torch_ext
from harness import argcheck

OP = _norm.LN
DTYPES = ("f32", "f16", "bf16", "f64")
_RUN = None  # torch.ops.gradoracle._layernorm_backward_run.default, once loaded


def run(dy, x, weight, mean, rstd, dx, dweight, dbias) -> None:
    """Write dx (and dweight / dbias when given) in place (the extension must be loaded)."""
    plan = _norm.plan_for(OP, dy, x, weight, mean, rstd, dx, dweight, dbias)
    _RUN(dy, x, weight, mean, rstd, plan, dx=dx, dweight=dweight, dbias=dbias)


def _outputs(x, weight, bias: bool):
    n = x.shape[-1]
    dx = x.new_empty(x.shape)
    dweight = x.new_empty((n,) if weight is not None else (0,))
    dbias = x.new_empty((n,) if bias else (0,))
    return dx, dweight, dbias


def _functional(dy, x, weight, mean, rstd, bias=True):
    if x.dim() == 0:  # no N: the checks say so
        _norm.check(OP, {"dy": dy, "x": x, "weight": weight, "mean": mean, "rstd": rstd}, True, bias)
    dx, dweight, dbias = _outputs(x, weight, bias)
    run(dy, x, weight, mean, rstd, dx, dweight if weight is not None else None, dbias if bias else None)
    return dx, dweight, dbias


def _out(dy, x, weight, mean, rstd, *, dx, dweight=None, dbias=None):
    run(dy, x, weight, mean, rstd, dx, dweight, dbias)


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and their fake kernels."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._layernorm_backward_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl(f"gradoracle::{OP}", devices, _functional)
    torch.library.impl(f"gradoracle::{OP}.out", devices, _out)

    @torch.library.register_fake(f"gradoracle::{OP}")
    def _fake(dy, x, weight, mean, rstd, bias=True):
        _norm.check(OP, {"dy": dy, "x": x, "weight": weight, "mean": mean, "rstd": rstd}, True, bias)
        return _outputs(x, weight, bias)

    @torch.library.register_fake(f"gradoracle::{OP}.out")
    def _out_fake(dy, x, weight, mean, rstd, *, dx, dweight=None, dbias=None):
        _norm.check(OP, {"dy": dy, "x": x, "weight": weight, "mean": mean, "rstd": rstd, "dx": dx,
                         "dweight": dweight, "dbias": dbias})

    @torch.library.register_fake(f"gradoracle::_{OP}_run")
    def _run_fake(dy, x, weight, mean, rstd, plan, *, dx, dweight, dbias):
        return None


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=True)
def _layernorm_backward_impl(inputs, outs, params):
    """Writes outs['dx'] (and dweight / dbias as the params ask) in place."""
    require()
    g = inputs.get
    run(inputs["dy"], inputs["x"], g("weight"), inputs["mean"], inputs["rstd"], outs["dx"], outs.get("dweight"),
        outs.get("dbias"))


def layernorm_backward(dy, x, weight, mean, rstd, bias: bool = True):
    """(dx, dweight, dbias) by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.layernorm_backward(dy, x, weight, mean, rstd, bias)
