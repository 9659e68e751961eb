"""reduce_sum for `torch_ext`: the op's Python side (the C++ is reduce_sum.cpp / _cuda.cu).

Ops (namespace gradoracle; schemas in reduce_sum.cpp):
    reduce_sum(Tensor x, int[]? axes=None, bool keepdim=False, int[]? target=None) -> Tensor
    reduce_sum.out(..., *, Tensor(a!) y) -> ()     (returns nothing, so torch.compile can functionalize it)
    _reduce_sum_run(Tensor x, Tensor plan, *, Tensor(a!) y) -> ()          (internal)

The two forms of oracle/reduce_sum.py: `axes` (None: every axis; []: none) with `keepdim`, or
`target` (sum_to_shape; excludes axes and keepdim).

The plan is the one cupy@best launches: backends/cupy/reduce_sum.py's make_plan / plan_launch,
pure Python that never imports cupy (imported from there rather than moved: its tests tune the
planner through that module's globals).  On the CPU the record holds the collapsed groups for
the C++ loops; on CUDA the launch for the device's SM count and the kernels' occupancy (asked of
the extension once per kernel).  Records depend on shapes, strides, dtype, the form and (CUDA)
16-byte alignment only, so they are cached per layout: a call with a layout seen before costs a
dict lookup and one op call.

Both public ops have a fake (meta) kernel running harness.argcheck's checks, so meta and fake
tensors get shapes, and bad arguments clear errors, as real ones do.
"""
from __future__ import annotations

import re

from backends.cupy import reduce_sum as rs_plan
from backends.torch_ext import require, torch_ext
from harness import argcheck, dtypes
from oracle.reduce_sum import out_shape, reduced_axes

OP = "reduce_sum"
DTYPES = ("f32", "f16", "bf16", "f64")

# RSRecord (reduce_sum.h): header words, then RSParams.
EMPTY, ZERO, CPU, ROW_TEAM, ROW_BLOCK, COL = range(6)
KIND = {"row_team": ROW_TEAM, "row_block": ROW_BLOCK, "col": COL}
HEADER = 8
RECORD_WORDS = HEADER + rs_plan.PARAMS_WORDS

_RECORDS: dict = {}
_MAX_RECORDS = 1 << 14
_SMS: dict = {}
_OCC: dict = {}
_RUN = None  # torch.ops.gradoracle._reduce_sum_run.default, once loaded


# ----------------------------------------------------------------------------- plans

def _form(params) -> tuple:
    target = params.get("target")
    if target is not None:
        return ("target", tuple(target))
    axes = params.get("axes")
    return ("axes", None if axes is None else tuple(axes), bool(params.get("keepdim", False)))


def _occupancy(device_index: int, dtype):
    """occupancy(expr) for the planner: resident blocks per SM of a best kernel, from the extension."""
    import torch

    def occupancy(expr: str) -> int:
        key = (device_index, expr)
        if key not in _OCC:
            kind, vec, simple = parse_expr(expr)
            with torch.cuda.device(device_index):
                got = torch.ops.gradoracle._reduce_sum_occupancy(kind, dtype, vec, simple)
            _OCC[key] = max(1, int(got))
        return _OCC[key]
    return occupancy


def parse_expr(expr: str) -> tuple[int, bool, bool]:
    """(kind, vec, simple) of a best kernel's name expression, e.g. 'rs_col<float, true, false>'."""
    m = re.fullmatch(r"rs_(row_team|row_block|col)<[\w ]+, (true|false), (true|false)>", expr)
    if m is None:
        raise ValueError(f"torch_ext {OP}: the planner chose {expr!r}, which the extension does not build")
    return KIND[m.group(1)], m.group(2) == "true", m.group(3) == "true"


def _num_sms(index: int) -> int:
    if index not in _SMS:
        import torch

        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def make_record(x, params, vec_ok: bool, store_ok: bool) -> list[int]:
    """The RSRecord words for x (its shape, strides, dtype, device) summed as `params` asks;
    vec_ok / store_ok: x / y are 16-byte aligned (CUDA only)."""
    shape = tuple(x.shape)
    plan = rs_plan.make_plan(shape, tuple(x.stride()), reduced_axes(shape, params))
    head = [0] * HEADER
    head[7] = plan.out_numel
    if plan.kind in ("empty", "zero"):
        head[0] = EMPTY if plan.kind == "empty" else ZERO
        return head + [0] * rs_plan.PARAMS_WORDS
    head[1] = int(plan.kind == "col")
    if x.device.type != "cuda":
        head[0] = CPU
        return head + rs_plan.pack_params(plan)
    dt = dtypes.from_any(x.dtype)
    item = x.element_size()
    vec = vec_ok and plan.vec_possible(item)
    store = vec and store_ok and plan.vec_store_possible(item)
    index = x.device.index
    launch = rs_plan.plan_launch(plan, dt, vec=vec, vec_store=store, num_sms=_num_sms(index),
                                 occupancy=_occupancy(index, x.dtype))
    head[:7] = [KIND[launch.kernel], head[1], int(launch.vec), int(launch.simple), launch.grid, launch.n_part,
                launch.n_ticket]
    return head + list(launch.words)


def plan_for(x, y, params):
    """The RSRecord (an int64 CPU tensor) for these tensors, made once per layout (after
    argcheck's checks of the call, which depend on nothing else)."""
    # y's dtype and device are checked by the run op on every call; its shape only here.
    key = (x.shape, x.stride(), x.dtype, x.get_device(), y.shape, _form(params))
    if x.is_cuda:
        key += (not x.data_ptr() % 16, not y.data_ptr() % 16)
    record = _RECORDS.get(key)
    if record is None:
        import torch

        _check(x, dict(params, shape=list(x.shape)), y)
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        words = make_record(x, params, x.is_cuda and key[-2], x.is_cuda and key[-1])
        record = _RECORDS[key] = torch.tensor(words, dtype=torch.int64)
    return record


def run(x, y, params) -> None:
    """Write y in place (the extension must be loaded: `require()`)."""
    _RUN(x, plan_for(x, y, params), y=y)


# ----------------------------------------------------------------------------- torch.library

def _params(x, axes, keepdim, target) -> dict:
    """The oracle's params of a call of the public op (the form it names)."""
    params = {"shape": list(x.shape)}
    if target is not None:
        if axes is not None or keepdim:
            raise ValueError(f"torch_ext {OP}: target {list(target)} was given with "
                             f"{'axes' if axes is not None else 'keepdim'}, expected one form: target, "
                             "or axes/keepdim")
        params["target"] = list(target)
    else:
        params["axes"] = None if axes is None else list(axes)
        params["keepdim"] = bool(keepdim)
    return params


def _check(x, params, y=None) -> None:
    argcheck.check(OP, {"x": x}, {"y": y}, params, who="torch_ext", framework="torch")


_SHAPES: dict = {}  # (x shape, form) -> y's shape, once argcheck has passed the form


def _out_shape(x, params) -> tuple:
    key = (x.shape, _form(params))
    shape = _SHAPES.get(key)
    if shape is None:
        _check(x, params)
        if len(_SHAPES) >= _MAX_RECORDS:
            _SHAPES.clear()
        shape = _SHAPES[key] = out_shape(tuple(x.shape), params)
    return shape


# The public ops' kernels: the form and the shapes are checked by plan_for (once per layout), the
# tensors again by the run op's C++.
def _functional(x, axes=None, keepdim=False, target=None):
    params = _params(x, axes, keepdim, target)
    y = x.new_empty(_out_shape(x, params))
    run(x, y, params)
    return y


def _out(x, axes=None, keepdim=False, target=None, *, y):
    run(x, y, _params(x, axes, keepdim, target))


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and their fake kernels."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._reduce_sum_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl("gradoracle::reduce_sum", devices, _functional)
    torch.library.impl("gradoracle::reduce_sum.out", devices, _out)

    @torch.library.register_fake("gradoracle::reduce_sum")
    def _reduce_sum_fake(x, axes=None, keepdim=False, target=None):
        params = _params(x, axes, keepdim, target)
        _check(x, params)
        return x.new_empty(out_shape(tuple(x.shape), params))

    @torch.library.register_fake("gradoracle::reduce_sum.out")
    def _reduce_sum_out_fake(x, axes=None, keepdim=False, target=None, *, y):
        _check(x, _params(x, axes, keepdim, target), y)

    @torch.library.register_fake("gradoracle::_reduce_sum_run")
    def _reduce_sum_run_fake(x, plan, *, y):
        return None


# ----------------------------------------------------------------------------- harness

def _kernel_limits(x, y) -> None:
    """What the kernels rely on beyond argcheck's checks (reduce_sum.cpp checks them again for direct
    callers): y contiguous and apart from x."""
    if not y.is_contiguous():
        raise ValueError(f"torch_ext {OP}: argument 'y' has strides {tuple(y.stride())} for shape "
                         f"{tuple(y.shape)}, expected a contiguous tensor (the kernel writes it densely)")
    if x.numel() and y.numel() and x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr():
        raise ValueError(f"torch_ext {OP}: argument 'y' shares memory with 'x', expected a separate tensor "
                         "(y is written while x is read)")


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=True)
def _reduce_sum_impl(inputs, outs, params):
    """Writes outs['y'] in place (argcheck has validated the call)."""
    require()
    x, y = inputs["x"], outs["y"]
    _kernel_limits(x, y)
    run(x, y, params)


def reduce_sum(x, axes=None, keepdim: bool = False, target=None):
    """y = x summed over axes (or to `target`), by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.reduce_sum(x, axes, keepdim, target)
