"""conv_backward_data and conv_backward_weight for `torch_ext`: the ops' Python side (the C++ is
conv_backward.cpp / conv_backward_cuda.cu).

Ops (namespace gradoracle; schemas in conv_backward.cpp):
    conv_backward_data(dy, w, spatial, stride, padding, dilation, groups, channels_last) -> dx
    conv_backward_weight(dy, x, kernel, stride, padding, dilation, groups, channels_last) -> dw
    and their .out forms (returning nothing, so torch.compile can functionalize them);
    _conv_backward_data_run / _conv_backward_weight_run (internal: check and run a plan).

The plan is the one cupy@best launches (backends/_plans/conv_cuda.py: the ConvParams words, the
dgrad phase table, grid, wgrad splits), packed as a ConvRecordH (conv_backward.h); on the CPU the
same words drive the C++ loops.  Records depend on shapes, strides, dtype, device, the geometry and
(CUDA) 16-byte alignment only, so they are cached per layout: a call with a layout seen before costs
a dict lookup and one op call.  The public ops have fake (meta) kernels running harness.argcheck's
checks, so fake tensors get shapes, and bad arguments clear errors, as real ones do.
"""
from __future__ import annotations

from backends._plans import conv_cuda as plan
from backends.torch_ext import require, torch_ext
from harness import argcheck, dtypes
from oracle import conv_common as cc

OPS = ("conv_backward_data", "conv_backward_weight")
DTYPES = ("f32", "f16", "bf16", "f64")
HEADER = 9  # ConvRecordH words before its ConvParamsH
KINDS = {"cv_dgrad": 1, "cv_wgrad": 1, "cv_dgrad_vec": 2, "cv_wgrad_vec": 2, "cv_dgrad_dw": 3, "cv_wgrad_dw": 3,
         "cv_wgrad_taps": 4, "cv_dgrad_smallc": 5}
_RECORDS: dict = {}
_MAX_RECORDS = 1 << 12
_SMS: dict = {}
_RUN: dict = {}  # op -> torch.ops.gradoracle._<op>_run.default, once loaded


def _num_sms(index: int) -> int:
    if index not in _SMS:
        import torch

        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _check(op: str, a, b, out, params) -> None:
    names = ("dy", "w", "dx") if op == OPS[0] else ("dy", "x", "dw")
    argcheck.check(op, {names[0]: a, names[1]: b}, {names[2]: out}, params, who="torch_ext", framework="torch")


def make_record(op: str, a, b, out, params: dict):
    """(the ConvRecordH words, the dgrad phase table or None) for these tensors."""
    import torch

    dt = dtypes.from_any(a.dtype)
    cuda = a.is_cuda
    aligned = cuda and not (a.data_ptr() % 16 or b.data_ptr() % 16)
    sa, sb, sc = tuple(a.stride()), tuple(b.stride()), tuple(out.stride())
    if op == OPS[0]:
        la = plan.dgrad_plan(params, dt, sa, sb, sc, "fastdiv", aligned)
    else:
        la = plan.wgrad_plan(params, dt, sa, sb, sc, _num_sms(a.device.index) if cuda else 1, aligned)
    name = la.expr.split("<")[0]
    targs = [t.strip() for t in la.expr.split("<", 1)[1].rstrip(">").split(",")]
    smallc = name == "cv_dgrad_smallc"
    kind = KINDS[name] + (smallc and targs[2] == "true") if cuda else 0  # small-Cin: 5, or 6 reading 16 bytes
    finish = la.finish[1][0] if la.finish is not None else 0
    table_len = 0 if la.table is None else len(la.table)
    # the record's bm: a wgrad GEMM's tile rows, the small-Cin dgrad's channel slots
    rows = int(targs[1]) if (op == OPS[1] and len(targs) == 2) or smallc else 0
    head = [OPS.index(op), kind, la.grid[0], la.grid[1], la.block, finish, la.ws_elems if cuda else 0, table_len, rows]
    table = None
    if la.table is not None and cuda:
        table = torch.from_numpy(la.table).to(a.device)
    return torch.tensor(head + la.words, dtype=torch.int64), table


def plan_for(op: str, a, b, out, params: dict):
    key = (op, a.shape, a.stride(), b.shape, b.stride(), out.shape, out.stride(), a.dtype, a.device,
           a.is_cuda and not (a.data_ptr() % 16 or b.data_ptr() % 16), _geo_key(params))
    got = _RECORDS.get(key)
    if got is None:
        _check(op, a, b, out, params)
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        got = _RECORDS[key] = make_record(op, a, b, out, params)
    return got


def _geo_key(params: dict) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v for v in
                 (params.get(k) for k in ("spatial", "kernel", "stride", "padding", "dilation", "groups", "layout")))


def run(op: str, a, b, out, params: dict) -> None:
    record, table = plan_for(op, a, b, out, params)
    if op == OPS[0]:
        _RUN[op](a, b, record, table, dx=out)
    else:
        _RUN[op](a, b, record, dw=out)


# ----------------------------------------------------------------------------- torch.library

def _params(op: str, a, b, size, stride, padding, dilation, groups, channels_last) -> dict:
    """The oracle's params of a call of a public op (sizes from the tensors' shapes)."""
    rank = a.dim() - 2
    if rank not in (1, 2, 3) or b.dim() != a.dim():
        raise ValueError(f"torch_ext {op}: dy and {'w' if op == OPS[0] else 'x'} must be 3-, 4- or 5-D tensors of "
                         f"one rank, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    cout = a.shape[-1] if channels_last else a.shape[1]
    params = {"n": int(a.shape[0]), "cout": int(cout), "stride": list(stride), "padding": list(padding),
              "dilation": list(dilation), "groups": int(groups),
              "layout": "channels_last" if channels_last else "channels_first"}
    if op == OPS[0]:
        params["cin"] = int(b.shape[-1] if channels_last else b.shape[1]) * int(groups)
        params["spatial"] = list(size)
        params["kernel"] = list(b.shape[1:-1] if channels_last else b.shape[2:])
    else:
        params["cin"] = int(b.shape[-1] if channels_last else b.shape[1])
        params["spatial"] = list(b.shape[1:-1] if channels_last else b.shape[2:])
        params["kernel"] = list(size)
    return params


def _out_shape(op: str, params: dict) -> tuple:
    geo = cc.geometry(params, op)
    return geo.x_shape if op == OPS[0] else geo.w_shape


def _make_ops(op: str, devices):
    import torch

    def functional(a, b, size, stride, padding, dilation, groups, channels_last):
        params = _params(op, a, b, size, stride, padding, dilation, groups, channels_last)
        _check(op, a, b, None, params)
        out = a.new_empty(_out_shape(op, params))
        run(op, a, b, out, params)
        return out

    def out_form(a, b, size, stride, padding, dilation, groups, channels_last, **outs):
        params = _params(op, a, b, size, stride, padding, dilation, groups, channels_last)
        run(op, a, b, next(iter(outs.values())), params)

    torch.library.impl(f"gradoracle::{op}", devices, functional)
    torch.library.impl(f"gradoracle::{op}.out", devices, out_form)

    @torch.library.register_fake(f"gradoracle::{op}")
    def _fake(a, b, size, stride, padding, dilation, groups, channels_last):
        params = _params(op, a, b, size, stride, padding, dilation, groups, channels_last)
        _check(op, a, b, None, params)
        return a.new_empty(_out_shape(op, params))

    @torch.library.register_fake(f"gradoracle::{op}.out")
    def _out_fake(a, b, size, stride, padding, dilation, groups, channels_last, **outs):
        _check(op, a, b, next(iter(outs.values())),
               _params(op, a, b, size, stride, padding, dilation, groups, channels_last))


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and their fake kernels."""
    import torch

    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    for op in OPS:
        _RUN[op] = getattr(torch.ops.gradoracle, f"_{op}_run").default
        _make_ops(op, devices)

    @torch.library.register_fake("gradoracle::_conv_backward_data_run")
    def _dgrad_run_fake(dy, w, plan_, table, *, dx):
        return None

    @torch.library.register_fake("gradoracle::_conv_backward_weight_run")
    def _wgrad_run_fake(dy, x, plan_, *, dw):
        return None


# ----------------------------------------------------------------------------- harness

def _kernel_limits(op: str, named: dict, out: str) -> None:
    """What the kernels rely on beyond argcheck's checks: the output contiguous (in its layout) and
    apart from the inputs."""
    o = named[out]
    if not o.is_contiguous():
        raise ValueError(f"torch_ext {op}: argument {out!r} has strides {tuple(o.stride())} for shape "
                         f"{tuple(o.shape)}, expected a contiguous tensor (the kernels write it densely)")
    for name, t in named.items():
        if name != out and t.numel() and o.numel() and t.untyped_storage().data_ptr() == o.untyped_storage().data_ptr():
            raise ValueError(f"torch_ext {op}: argument {out!r} shares memory with {name!r}, expected a separate "
                             "tensor (it is written while the inputs are read)")


@argcheck.register(torch_ext, OPS[0], dtypes=DTYPES, deterministic=True)
def _conv_backward_data_impl(inputs, outs, params):
    """Writes outs['dx'] in place (argcheck has validated the call)."""
    require()
    named = {"dy": inputs["dy"], "w": inputs["w"], "dx": outs["dx"]}
    _kernel_limits(OPS[0], named, "dx")
    run(OPS[0], named["dy"], named["w"], named["dx"], params)


@argcheck.register(torch_ext, OPS[1], dtypes=DTYPES, deterministic=True)
def _conv_backward_weight_impl(inputs, outs, params):
    """Writes outs['dw'] in place (argcheck has validated the call)."""
    require()
    named = {"dy": inputs["dy"], "x": inputs["x"], "dw": outs["dw"]}
    _kernel_limits(OPS[1], named, "dw")
    run(OPS[1], named["dy"], named["x"], named["dw"], params)


def conv_backward_data(dy, w, spatial, stride, padding, dilation, groups: int = 1, channels_last: bool = False):
    """dx by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.conv_backward_data(dy, w, list(spatial), list(stride), list(padding), list(dilation),
                                                   groups, channels_last)


def conv_backward_weight(dy, x, kernel, stride, padding, dilation, groups: int = 1, channels_last: bool = False):
    """dw by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.conv_backward_weight(dy, x, list(kernel), list(stride), list(padding),
                                                     list(dilation), groups, channels_last)
