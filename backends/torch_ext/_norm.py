"""The Python side shared by `torch_ext`'s layernorm_backward and rmsnorm_backward: plans, their
cache, the run-op call, and the fake kernels' checks.  (Not an op module: layernorm_backward.py
and rmsnorm_backward.py register the ops.)

The plan is the one cupy@best launches, made by backends/cupy/_norm_plan.py (pure Python that
never imports cupy; imported from there rather than moved, so that cupy's behaviour and tests stay
as they are): the row layout (leading dims merged where every row tensor allows, element strides
for any view), and on CUDA the launch of nb_rows (nb_chunked for long rows) and nb_colsum, for
the device's SM count and the kernels' occupancy (asked of the extension once per kernel).  The
planner's default kernel is used whatever GRADORACLE_CUPY_NORMS says (nb_rows2 / nb_rows3 are cupy's alone).
The NBRecord words (norm_backward.h) are: kind, vec, vpt, wide, grid, colsum, workspace
elements, a spare word, then NBParams.

Records depend on the tensors' shapes, strides, dtype, device and (CUDA) 16-byte alignment only,
so they are cached per layout; argcheck's checks run when a layout is first seen (they depend on
nothing else), and the run op's C++ checks every call.
"""
from __future__ import annotations

import re

from backends.cupy import _norm_plan as nplan
from harness import argcheck, dtypes

LN, RMS = nplan.LN, nplan.RMS
ZERO, CPU, ROWS, CHUNKED = range(4)
HEADER = 8
RECORD_WORDS = HEADER + nplan.PARAMS_WORDS
# The kernels the extension builds: nb_rows / nb_chunked + nb_colsum (nb_rows3, the cupy default since the
# H100 run of results/h100/cupy/norms-v7/, is not in the extension yet).
KNOBS = nplan.settings("kernel=rows")
INPUTS = {LN: ("dy", "x", "weight", "mean", "rstd"), RMS: ("dy", "x", "weight", "rstd")}
OUTPUTS = {LN: ("dx", "dweight", "dbias"), RMS: ("dx", "dweight")}

_RECORDS: dict = {}
_MAX_RECORDS = 1 << 14
_SMS: dict = {}
_OCC: dict = {}


def params_of(op: str, args: dict) -> dict:
    """The oracle's params of a call (which optional tensors exist)."""
    params = {"shape": list(args["x"].shape)}
    if op == LN:
        params["affine"] = args.get("weight") is not None
        params["bias"] = args.get("dbias") is not None
    return params


def check(op: str, args: dict, functional: bool = False, bias: bool = True) -> None:
    """argcheck's checks of a call on `args` (name -> tensor or None; outputs may be absent when
    `functional`, then `bias` says whether dbias is wanted)."""
    params = params_of(op, args)
    if functional and op == LN:
        params["bias"] = bias
    inputs = {k: args[k] for k in INPUTS[op] if args.get(k) is not None}
    outs = {k: args.get(k) for k in OUTPUTS[op]}
    if op == LN:
        outs = {k: v for k, v in outs.items() if k == "dx" or (k == "dweight" and params["affine"])
                or (k == "dbias" and params["bias"])}
    if not functional:  # argcheck lets a functional call leave outputs out; an .out call may not
        for name, out in outs.items():
            if out is None:
                raise ValueError(f"torch_ext {op}: argument {name!r} is missing, expected a tensor"
                                 + (" (weight is given, so dweight is wanted)" if name == "dweight" else ""))
    argcheck.check(op, inputs, outs, params, who="torch_ext", framework="torch")


def _num_sms(index: int) -> int:
    if index not in _SMS:
        import torch

        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _occupancy(op: str, device_index: int, dtype):
    """occupancy(expr, block, smem) for the planner, from the extension's query of the kernel."""
    import torch

    query = getattr(torch.ops.gradoracle, f"_{op}_occupancy")

    def occupancy(expr: str, block: int, smem: int = 0) -> int:
        key = (op, device_index, expr)
        if key not in _OCC:
            with torch.cuda.device(device_index):
                got = query(*_query_args(op, expr, dtype))
            _OCC[key] = max(1, int(got))
        return _OCC[key]
    return occupancy


def parse_expr(op: str, expr: str) -> tuple[int, int, int, bool]:
    """(kind, vec, vpt, wide) of a planner's name expression, e.g. 'nb_rows<NBLayerNorm, float, 4, 2,
    true>' -> (ROWS, 4, 2, True); ValueError for a kernel the extension does not build."""
    m = re.fullmatch(r"nb_(rows|chunked)<\w+, [\w ]+, (\d+), (\d+)(?:, (true|false))?>", expr)
    if m is None:
        raise ValueError(f"torch_ext {op}: the planner chose {expr!r}, which the extension does not build")
    return ROWS if m.group(1) == "rows" else CHUNKED, int(m.group(2)), int(m.group(3)), m.group(4) == "true"


def _query_args(op: str, expr: str, dtype) -> tuple:
    kind, vec, vpt, wide = parse_expr(op, expr)
    return kind, dtype, vec, vpt, wide


def _strides(args: dict) -> dict:
    """Element strides as _norm_plan.make_layout takes them."""
    return {k: (tuple(t.stride()) if t is not None else None) for k, t in args.items()}


def make_record(op: str, args: dict) -> list[int]:
    """The NBRecord words of a call on `args` (name -> tensor or None)."""
    x = args["x"]
    layout = nplan.make_layout(op, tuple(x.shape), _strides(args))
    has_w, has_b = args.get("weight") is not None, args.get("dbias") is not None
    flags = (nplan.HAS_W if has_w else 0) | (nplan.HAS_B if has_b else 0)
    if layout.rows == 0 or x.device.type != "cuda":
        return [ZERO if layout.rows == 0 else CPU] + [0] * (HEADER - 1) + nplan.pack_params(layout, flags)
    dt = dtypes.from_any(x.dtype)
    aligned = not any(args[k].data_ptr() % 16 for k in ("x", "dy", "dx", "weight") if args.get(k) is not None)
    vec = nplan.vector_width(layout, x.element_size(), aligned, has_w)
    index = x.device.index
    launch = nplan.plan_best(op, dt, layout, has_w, has_b, vec, _num_sms(index), _occupancy(op, index, x.dtype), KNOBS)
    if launch.kind not in ("rows", "chunked"):
        raise ValueError(f"torch_ext {op}: the planner chose kernel {launch.kind!r}, which the extension does not build")
    ws = 2 * launch.nparts * layout.n if launch.colsum else 0
    head = [ROWS if launch.kind == "rows" else CHUNKED, launch.vec, launch.vpt, int(launch.gw > 32), launch.grid,
            int(launch.colsum), ws, 0]
    return head + list(launch.words)


def plan_for(op: str, dy, x, weight, mean, rstd, dx, dweight, dbias):
    """The NBRecord (an int64 CPU tensor) for these tensors (mean None for rmsnorm; weight,
    dweight, dbias None where absent), made once per layout.  The key holds what the plan depends
    on and the call's checks do not pin down (x's shape, dtype and device, the strides, which
    optional tensors exist, alignment); the run op's C++ checks every tensor's shape, dtype and
    device on every call, so a key that matches a checked call cannot let a bad one through."""
    key = (op, x.shape, x.dtype, x.get_device(), x.stride(), dy.stride(), dx.stride(), rstd.stride(),
           None if mean is None else mean.stride(), None if weight is None else weight.stride(), dweight is None,
           dbias is None)
    if x.is_cuda:
        key += (not (x.data_ptr() | dy.data_ptr() | dx.data_ptr() | (0 if weight is None else weight.data_ptr())) % 16,)
    record = _RECORDS.get(key)
    if record is None:
        import torch

        args = {"dy": dy, "x": x, "weight": weight, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dweight,
                "dbias": dbias}
        check(op, args)
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        record = _RECORDS[key] = torch.tensor(make_record(op, args), dtype=torch.int64)
    return record
