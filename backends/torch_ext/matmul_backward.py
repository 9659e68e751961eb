"""matmul_backward for `torch_ext`: the op's Python side (the C++ is matmul_backward.cpp / _cuda.cu).

Ops (namespace gradoracle; schemas in matmul_backward.cpp):
    matmul_backward(Tensor a, Tensor b, Tensor dy) -> (Tensor, Tensor)
    matmul_backward.out(..., *, Tensor(a!) da, Tensor(b!) db) -> (Tensor(a!), Tensor(b!))
    _matmul_backward_run(a, b, dy, Tensor plan, Tensor table, *, da, db) -> ()     (internal)

The public ops' CPU and CUDA kernels are the Python functions here: they take the record for
the tensors' layout and call `_matmul_backward_run`, whose C++ checks every argument and runs
it: on the CPU plain loops of the .cuh's contract, on CUDA the launches cupy@best makes
(backends/_plans/matmul_backward_cuda.py `record`).  The record (an int64 CPU tensor) and the
fold table (int64, on the tensors' device) depend on shapes, strides, dtype, device and 16-byte
alignment only, so they are cached per layout: a repeated layout costs a dict lookup.

Both public ops have a fake (meta) kernel running harness.argcheck's checks, so meta and fake
tensors get shapes, and bad arguments clear errors, as real ones do.
"""
from __future__ import annotations

from backends._plans import matmul_backward_cuda as mmplan
from backends.torch_ext import require, torch_ext
from harness import argcheck, dtypes

OP = "matmul_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
_RECORDS: dict = {}      # layout -> (record, table)
_MAX_RECORDS = 1 << 12
_RUN = None              # torch.ops.gradoracle._matmul_backward_run.default, once loaded


def _make(a, b, dy):
    import torch

    if a.dim() < 2 or b.dim() < 2 or dy.dim() < 2:
        raise ValueError(f"torch_ext {OP}: a, b and dy need at least 2 dims, got a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}, dy {tuple(dy.shape)}")
    gemms = mmplan.plan_call(tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), tuple(dy.shape), dy.stride())
    aligned = {name: not x.data_ptr() % 16 for name, x in (("a", a), ("b", b), ("dy", dy))}
    words, table = mmplan.record(gemms, dtypes.from_any(a.dtype), a.is_cuda, aligned)
    return torch.tensor(words, dtype=torch.int64), torch.from_numpy(table).to(a.device)


def plan_for(a, b, dy):
    """(record, table) for these tensors, made once per layout."""
    key = (a.device, a.dtype, a.shape, a.stride(), b.shape, b.stride(), dy.shape, dy.stride())
    if a.is_cuda:
        key += (a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, dy.data_ptr() % 16 == 0)
    got = _RECORDS.get(key)
    if got is None:
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        got = _RECORDS[key] = _make(a, b, dy)
    return got


def run(a, b, dy, da, db) -> None:
    """Write da and db in place (the extension must be loaded: `require()`)."""
    plan, table = plan_for(a, b, dy)
    _RUN(a, b, dy, plan, table, da=da, db=db)


# ----------------------------------------------------------------------------- torch.library

def _functional(a, b, dy):
    da, db = a.new_empty(a.shape), a.new_empty(b.shape)
    run(a, b, dy, da, db)
    return da, db


def _out(a, b, dy, *, da, db):
    run(a, b, dy, da, db)
    return da, db


def _check(a, b, dy, da=None, db=None) -> None:
    argcheck.check(OP, {"a": a, "b": b, "dy": dy}, {"da": da, "db": db},
                   {"a": list(a.shape), "b": list(b.shape)}, who="torch_ext", framework="torch")


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and every op's fake kernel."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._matmul_backward_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl("gradoracle::matmul_backward", devices, _functional)
    torch.library.impl("gradoracle::matmul_backward.out", devices, _out)

    @torch.library.register_fake("gradoracle::matmul_backward")
    def _matmul_backward_fake(a, b, dy):
        _check(a, b, dy)
        return a.new_empty(a.shape), a.new_empty(b.shape)

    @torch.library.register_fake("gradoracle::matmul_backward.out")
    def _matmul_backward_out_fake(a, b, dy, *, da, db):
        _check(a, b, dy, da, db)
        return da, db

    @torch.library.register_fake("gradoracle::_matmul_backward_run")
    def _matmul_backward_run_fake(a, b, dy, plan, table, *, da, db):
        _check(a, b, dy, da, db)


# ----------------------------------------------------------------------------- harness

def _kernel_limits(inputs, outs) -> None:
    """Dense outputs apart from the inputs and each other (matmul_backward.cpp checks the same for
    direct callers; here the harness path never depends on an exception thrown in C++)."""
    for name in ("da", "db"):
        out = outs[name]
        if not out.is_contiguous():
            raise ValueError(f"torch_ext {OP}: argument {name!r} has strides {tuple(out.stride())} for shape "
                             f"{tuple(out.shape)}, expected a contiguous tensor (the kernel writes it densely)")
        if not out.numel():
            continue
        ptr = out.untyped_storage().data_ptr()
        for other in ("a", "b", "dy", "db" if name == "da" else None):
            x = outs[other] if other == "db" else inputs.get(other)
            if x is not None and x.numel() and x.untyped_storage().data_ptr() == ptr:
                raise ValueError(f"torch_ext {OP}: argument {name!r} shares memory with {other!r}, expected a "
                                 "separate tensor (outputs are written while inputs are read)")


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=True)
def _matmul_backward_impl(inputs, outs, params):
    """Writes outs['da'], outs['db'] in place (argcheck has validated the call)."""
    require()
    _kernel_limits(inputs, outs)
    run(inputs["a"], inputs["b"], inputs["dy"], outs["da"], outs["db"])


def matmul_backward(a, b, dy):
    """(da, db) of a @ b for dy, by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.matmul_backward(a, b, dy)
