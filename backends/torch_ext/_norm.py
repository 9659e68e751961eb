"""The Python side shared by `torch_ext`'s layernorm_backward and rmsnorm_backward: plans, their
cache, the run-op call, and the fake kernels' checks.  (Not an op module: layernorm_backward.py
and rmsnorm_backward.py register the ops.)

The plan is the one cupy@best launches, made by backends/cupy/_norm_plan.py (pure Python that
never imports cupy; imported from there rather than moved, so that cupy's behaviour and tests stay
as they are): the row layout (leading dims merged where every row tensor allows, element strides
for any view), and on CUDA the launch of nb_rows (nb_chunked for long rows) and nb_colsum, or of
nb_rows3 (its partial rows summed in the same cooperative launch, or by nb_colsum), for the
device's SM count and the kernels' occupancy (asked of the extension once per kernel).

The planner's knobs come from GRADORACLE_TORCH_EXT_NORMS (`settings`; GRADORACLE_CUPY_NORMS is
cupy's and is not read here), default kernel=rows3: nb_rows3, cupy@best's default (on the H100,
results/h100/s6/: every full case PASS through the extension with it, and 1.11-1.36x kernel=rows on
the seven perf cases timed, level with cupy@best).  kernel=rows takes nb_rows / nb_chunked.  The
variable is read when a layout is first planned, so a change applies to layouts not planned before it.

The NBRecord words (norm_backward.h) are: kind, vec, vpt, wide, grid, colsum, workspace
elements, stages (nb_rows3's STAGES, else 0), then NBParams.

Records depend on the tensors' shapes, strides, dtype, device and (CUDA) 16-byte alignment only,
so they are cached per layout; argcheck's checks run when a layout is first seen (they depend on
nothing else), and the run op's C++ checks every call.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from backends.cupy import _norm_plan as nplan
from harness import argcheck, dtypes

LN, RMS = nplan.LN, nplan.RMS
ZERO, CPU, ROWS, CHUNKED, ROWS3 = range(5)
HEADER = 8
RECORD_WORDS = HEADER + nplan.PARAMS_WORDS
KINDS = {"rows": ROWS, "chunked": CHUNKED, "rows3": ROWS3}  # planner's Launch.kind -> NBKind

ENV = "GRADORACLE_TORCH_EXT_NORMS"
DEFAULT = "kernel=rows3"
# The knobs the extension honours: the kernel (it builds nb_rows / nb_chunked + nb_colsum, and
# nb_rows3 with the default stages and elements per thread), nb_rows3's finish and rows per block
# (planning only).  The others name instantiations it does not build (stages, elems, nb_rows2's
# prefetch) or cupy's launch path (launch).
BUILT_KERNELS = ("rows", "rows3")
HONOURED = ("kernel", "finish", "minrows")
INPUTS = {LN: ("dy", "x", "weight", "mean", "rstd"), RMS: ("dy", "x", "weight", "rstd")}
OUTPUTS = {LN: ("dx", "dweight", "dbias"), RMS: ("dx", "dweight")}

_RECORDS: dict = {}
_MAX_RECORDS = 1 << 14
_SMS: dict = {}
_OCC: dict = {}


def settings(text: str | None = None) -> dict:
    """The planner's knobs (_norm_plan.settings' dict) from `text` (default: the environment
    variable GRADORACLE_TORCH_EXT_NORMS), comma-separated name=value pairs over DEFAULT, e.g.
    "kernel=rows3" or "kernel=rows3,finish=colsum".  ValueError naming the variable for a bad
    name or value, a kernel the extension does not build, or a knob it does not honour."""
    text = os.environ.get(ENV, "") if text is None else text
    try:
        knobs = nplan.settings(f"{DEFAULT},{text}")  # later pairs win
    except ValueError as e:
        msg = str(e).removeprefix(f"{nplan.ENV}: ").replace(f"{DEFAULT},", "", 1)
        raise ValueError(f"{ENV}: {msg}") from None
    if knobs["kernel"] not in BUILT_KERNELS:
        raise ValueError(f"{ENV}: kernel={knobs['kernel']!r} in {text!r}, which the torch extension does not build; "
                         f"expected one of {', '.join(BUILT_KERNELS)} (nb_rows2 is cupy's alone)")
    defaults = nplan.settings("")
    for name, value in knobs.items():
        if name not in HONOURED and value != defaults[name]:
            raise ValueError(f"{ENV}: {name}={value!r} in {text!r}, which the torch extension does not take: it "
                             f"honours {', '.join(HONOURED)} only (it builds nb_rows3 with the default stages "
                             "and elems; launch and prefetch are cupy's)")
    return knobs


_KNOBS: dict = {}


def knobs() -> dict:
    """settings() for the variable's current value (parsed once per value)."""
    text = os.environ.get(ENV, "")
    got = _KNOBS.get(text)
    if got is None:
        got = _KNOBS[text] = settings(text)
    return got


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
        # block and smem follow from the kernel: the extension knows them (nb_rows3's smem is
        # NBRows3Smem<...>::BYTES, the planner's rows3_smem_bytes).
        key = (op, device_index, expr)
        if key not in _OCC:
            k = parse_expr(op, expr)
            with torch.cuda.device(device_index):
                got = query(k.kind, dtype, k.vec, k.vpt, k.wide, k.gw, k.stages)
            _OCC[key] = max(1, int(got))
        return _OCC[key]
    return occupancy


class Kernel(NamedTuple):
    """An instantiation the extension builds: NBKind and template arguments (gw, stages: nb_rows3's,
    else 0)."""

    kind: int
    vec: int
    vpt: int
    wide: bool
    gw: int = 0
    stages: int = 0


_ITEMSIZE = {"float": 4, "double": 8, "__half": 2, "__nv_bfloat16": 2}


def parse_expr(op: str, expr: str) -> Kernel:
    """The Kernel of a planner's name expression, e.g. 'nb_rows<NBLayerNorm, float, 4, 2, true>' ->
    (ROWS, 4, 2, True, 0, 0), 'nb_rows3<NBRmsNorm, float, 2, 64, 4>' -> (ROWS3, 4, 2, True, 64, 4);
    ValueError for a kernel the extension does not build."""
    m = re.fullmatch(r"nb_(rows|chunked)<\w+, [\w ]+, (\d+), (\d+)(?:, (true|false))?>", expr)
    if m is not None:
        return Kernel(KINDS[m.group(1)], int(m.group(2)), int(m.group(3)), m.group(4) == "true")
    m = re.fullmatch(r"nb_rows3<\w+, (\w+), (\d+), (\d+), (\d+)>", expr)
    if m is not None and m.group(1) in _ITEMSIZE:
        gw = int(m.group(3))
        return Kernel(ROWS3, 16 // _ITEMSIZE[m.group(1)], int(m.group(2)), gw > 32, gw, int(m.group(4)))
    raise ValueError(f"torch_ext {op}: the planner chose {expr!r}, which the extension does not build")


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
    launch = nplan.plan_best(op, dt, layout, has_w, has_b, vec, _num_sms(index), _occupancy(op, index, x.dtype),
                             knobs())
    if launch.kind not in KINDS:
        raise ValueError(f"torch_ext {op}: the planner chose kernel {launch.kind!r}, which the extension does not "
                         "build")
    # Partial rows: summed by nb_colsum, or by nb_rows3 itself after its grid barrier (coop).
    ws = 2 * launch.nparts * layout.n if launch.colsum or launch.coop else 0
    head = [KINDS[launch.kind], launch.vec, launch.vpt, int(launch.gw > 32), launch.grid, int(launch.colsum), ws,
            launch.stages]
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
