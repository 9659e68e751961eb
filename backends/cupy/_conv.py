"""What the cupy conv_backward_data and conv_backward_weight modules share: the per-layout plan
cache, the device (cupy launches through NVRTC), and the launch sequences, written against a
small device interface so the CPU stand-in (tests/test_cuda_conv.py) runs the same host code.

Device interface: launch(source, expr, grid, block, args), empty(n, dtype), upload(np.ndarray),
ptr(array), num_sms().  Importing this module never imports cupy.
"""
from __future__ import annotations

import numpy as np

from backends._plans import conv_cuda as plan
from backends.cupy.common import byte_span, element_strides, function, num_sms, overlap
from harness import dtypes

DTYPES = ("f32", "f64", "f16", "bf16")

PARAMS_DTYPE = np.dtype([("words", np.int64, (plan.WORDS,))])
SOURCES = {"conv_backward_data": "conv_backward_data.cuh", "conv_backward_weight": "conv_backward_weight.cuh"}
GEO_KEYS = ("spatial", "kernel", "stride", "padding", "dilation", "groups", "layout", "n", "cin", "cout")
_NULL = np.uint64(0)


def params_struct(words) -> np.ndarray:
    """ConvParams by value: cupy passes the bytes of a size-1 structured array."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


def params_key(params: dict) -> tuple:
    """The geometry params as a hashable key (lists as tuples)."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in (params.get(k) for k in GEO_KEYS))


class CupyDevice:
    def __init__(self):
        import cupy

        self.cupy = cupy

    def launch(self, source: str, expr: str, grid, block: int, args) -> None:
        function(source, expr)(tuple(grid), (block,), tuple(args))

    def empty(self, n: int, dtype):
        return self.cupy.empty(n, dtype=dtype)

    def upload(self, a: np.ndarray):
        return self.cupy.asarray(a)

    def ptr(self, x) -> int:
        return x.data.ptr

    def num_sms(self) -> int:
        return num_sms()


_DEVICE = None


def device() -> CupyDevice:
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = CupyDevice()
    return _DEVICE


class Entry:
    """One layout's launches: the plan, its packed words and (dgrad) its table on the device."""

    __slots__ = ("launch", "params_arg", "table", "ws", "checked")

    def __init__(self, launch: plan.Launch, dev):
        self.launch = launch
        self.params_arg = params_struct(launch.words)
        self.table = dev.upload(launch.table) if launch.table is not None else None
        self.ws = None  # the wgrad workspace, allocated on first use and kept with the plan
        self.checked: set = set()  # address triples whose overlap check passed


def dtype_name(x) -> str:
    return dtypes.from_any(x.dtype)


def check_buffers(op: str, named: dict, out: str) -> None:
    """The output shares no memory with an input (it is written while they are read)."""
    span = byte_span(named[out])
    for name, t in named.items():
        if name != out and t.size and named[out].size and overlap(span, byte_span(t)):
            raise ValueError(f"cupy {op}: {out}: expected a buffer of its own (outputs are written while inputs "
                             f"are read), got memory shared with {name}")


def make_entry(op: str, variant: str, a, b, out, params: dict, dev, aligned: bool = False) -> Entry:
    """The plan of one layout (shapes, strides, dtype, alignment, geometry), checked once."""
    dt = dtype_name(a)
    if not out.flags.c_contiguous:
        name = "dx" if op == OP_D else "dw"
        raise ValueError(f"cupy {op}: argument {name!r} has strides {out.strides} bytes for shape {out.shape}, "
                         "expected a contiguous array (the kernels write it densely)")
    sa, sb, sc = (element_strides(t, name, f"cupy {op}") for t, name in ((a, "dy"), (b, "w" if op == OP_D else "x"),
                                                                        (out, "dx" if op == OP_D else "dw")))
    if op == OP_D:
        launch = plan.dgrad_plan(params, dt, sa, sb, sc, "fastdiv" if variant == "best" else variant,
                                 aligned, small_cin=variant == "best")
    else:
        launch = plan.wgrad_plan(params, dt, sa, sb, sc, dev.num_sms(), aligned, per_tap=variant == "pertap")
    return Entry(launch, dev)


OP_D, OP_W = "conv_backward_data", "conv_backward_weight"


def run(op: str, entry: Entry, dev, a, b, out) -> None:
    """The launches of one call: dgrad one kernel; wgrad the split GEMM, then the finish."""
    la = entry.launch
    src = SOURCES[op]
    if op == OP_D:
        dev.launch(src, la.expr, la.grid, la.block, (entry.params_arg, a, b, out, entry.table))
        return
    if la.finish is None:
        dev.launch(src, la.expr, la.grid, la.block, (entry.params_arg, a, b, out, _NULL))
        return
    if entry.ws is None:
        entry.ws = dev.empty(la.ws_elems, np.float64 if dtype_name(a) == "f64" else np.float32)
    dev.launch(src, la.expr, la.grid, la.block, (entry.params_arg, a, b, out, entry.ws))
    fexpr, fgrid = la.finish
    dev.launch(src, fexpr, fgrid, plan.FINISH_THREADS, (entry.params_arg, entry.ws, out))


_ENTRIES: dict = {}
_MAX_ENTRIES = 1024


def call(op: str, variant: str, a, b, out, params: dict) -> None:
    """One call on cupy arrays: the plan once per (variant, shapes, strides, dtype, geometry, device)."""
    ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
    aligned = not (ptrs[0] | ptrs[1] | ptrs[2]) & 15
    key = (op, variant, a.dtype, a.shape, a.strides, b.shape, b.strides, out.shape, out.strides, a.device.id,
           aligned, params_key(params))
    entry = _ENTRIES.get(key)
    dev = device()
    if entry is None:
        if len(_ENTRIES) >= _MAX_ENTRIES:
            _ENTRIES.clear()
        entry = _ENTRIES[key] = make_entry(op, variant, a, b, out, params, dev, aligned)
    if ptrs not in entry.checked:
        names = ("dy", "w", "dx") if op == OP_D else ("dy", "x", "dw")
        check_buffers(op, dict(zip(names, (a, b, out))), names[2])
        if len(entry.checked) >= 64:
            entry.checked.clear()
        entry.checked.add(ptrs)
    run(op, entry, dev, a, b, out)
