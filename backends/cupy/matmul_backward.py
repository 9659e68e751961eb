"""matmul_backward for the `cupy` backend: raw CUDA C++ (backends/cuda/matmul_backward.cuh)
compiled with NVRTC through cupy.RawModule, launched on cupy's current stream.  Spec:
oracle/matmul_backward.py.

Variants, the matmul ladder of seed 001 then tensor cores (registration order):
  @naive    one thread per output element, operands from global memory.
  @regtile  each thread a 4 x 4 register block.
  @smem     64 x 64 block tiles, 16-deep shared-memory tiles fetched cooperatively, 4 x 4 per thread.
  @best     bf16 / f16: mma.sync m16n8k16 on tensor cores, ldmatrix fragments, a 3-stage
            cp.async pipeline, 128 x 128 x 32 tiles (the `mma` rung); f32 (IEEE, no TF32): mm_sgemm,
            128 x 128 x 8 tiles (64 x 64 where fewer than two waves of them), 8 x 8 per thread
            read from shared memory as 16-byte vectors, two shared buffers fed through registers,
            16-byte global loads where legal; f64: the smem rung's tiles in double.
Every variant runs every dtype and layout (scalar loads where 16-byte copies are illegal) and
is deterministic: a broadcast batch is folded into the GEMM's reduction in a fixed order
(no atomics).  dA and dB are two launches of one folded GEMM (see the .cuh's contract).

Per call: one dict lookup for the checks and the plan (shapes, strides, dtype), a set lookup
for the overlap checks (once per set of addresses), the pointer alignment test and two launches.  The plan itself is backends/_plans/matmul_backward_cuda.py
(shared with torch_ext).  Importing this module never imports cupy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from backends._buffers import byte_span, overlap
from backends._plans import matmul_backward_cuda as mmplan
from backends.cupy import cupy_backend
from backends.cupy.common import element_strides, function
from harness import argcheck, dtypes

OP = "matmul_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
SOURCE = "matmul_backward.cuh"
GEMM_DTYPE = np.dtype([("words", np.int64, (mmplan.GEMM_WORDS,))])
_MAX_ENTRIES = 1 << 12


def gemm_struct(words) -> np.ndarray:
    """MMGemm by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=GEMM_DTYPE)
    arg["words"][0] = words
    return arg


@dataclass
class Entry:
    """The plan of one layout: both GEMMs, and what is derived from them once."""

    dt: str
    gemms: tuple
    vec_static: dict = field(default_factory=dict)   # gemm.out -> 16-byte copies legal but for pointers (vec_rule)
    launches: dict = field(default_factory=dict)     # (variant, gemm.out, vec) -> (Launch, struct)
    tables: dict = field(default_factory=dict)       # (device key, gemm.out) -> the offset table there
    apart: set = field(default_factory=set)          # address tuples checked for overlap

    def launch(self, variant: str, g: mmplan.Gemm, vec: bool):
        key = (variant, g.out, vec)
        got = self.launches.get(key)
        if got is None:
            launch = mmplan.choose(g, variant, self.dt, vec)
            got = self.launches[key] = (launch, gemm_struct(launch.words))
        return got


_ENTRIES: dict = {}


def entry_for(dt: str, a_shape, a_str, b_shape, b_str, dy_shape, dy_str) -> Entry:
    key = (dt, a_shape, a_str, b_shape, b_str, dy_shape, dy_str)
    entry = _ENTRIES.get(key)
    if entry is None:
        gemms = mmplan.plan_call(a_shape, a_str, b_shape, b_str, dy_shape, dy_str)
        entry = Entry(dt, gemms)
        rule = mmplan.vec_rule(dt)
        for g in gemms:  # pointers 0: aligned; the per-call test adds the real ones
            entry.vec_static[g.out] = not g.empty and not g.zero and rule is not None and rule(g, 0, 0)
        if len(_ENTRIES) >= _MAX_ENTRIES:
            _ENTRIES.clear()
        _ENTRIES[key] = entry
    return entry


def run(dev, variant: str, entry: Entry, arrays: dict) -> list:
    """The host side of every variant: per GEMM a zero fill or one launch.  `arrays` holds a, b,
    dy, da, db; returns the launches made."""
    made = []
    wide = variant == "best"  # the only variant with 16-byte paths (entry.vec_static: per dtype)
    for g in entry.gemms:
        out = arrays[g.out]
        if g.empty:
            continue
        if g.zero:
            dev.fill_zero(out)
            continue
        x, y = arrays[g.x], arrays[g.y]
        vec = wide and entry.vec_static[g.out] and dev.ptr(x) % 16 == 0 and dev.ptr(y) % 16 == 0
        launch, struct = entry.launch(variant, g, vec)
        dev.launch(launch, (struct, x, y, dev.table(entry, g), out))
        made.append(launch)
    return made


class CupyDevice:
    """What `run` needs from the device: launches, pointers, zero fills, offset tables."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self._smem_set: set = set()

    def launch(self, launch: mmplan.Launch, args) -> None:
        fn = function(SOURCE, launch.expr)
        if launch.smem > mmplan.SMEM_LIMIT:  # the limit is raised per kernel and device
            key = (self.cupy.cuda.runtime.getDevice(), launch.expr)
            if key not in self._smem_set:
                fn.max_dynamic_shared_size_bytes = launch.smem
                self._smem_set.add(key)
        fn(launch.grid, (launch.block,), args, shared_mem=launch.smem)

    def ptr(self, x) -> int:
        return x.data.ptr

    def fill_zero(self, x) -> None:
        if x.nbytes:  # outputs are contiguous; +0.0 is all-zero bits in every float format
            x.data.memset_async(0, x.nbytes)

    def table(self, entry: Entry, g: mmplan.Gemm):
        key = (self.cupy.cuda.runtime.getDevice(), g.out)
        t = entry.tables.get(key)
        if t is None:
            t = entry.tables[key] = self.cupy.asarray(g.off)
        return t


_DEVICE: list = []


def device() -> CupyDevice:
    if not _DEVICE:
        _DEVICE.append(CupyDevice())
    return _DEVICE[0]


_CALLS: dict = {}  # (dtype, shapes, byte strides) -> Entry, for the per-call path


def _checked_entry(a, b, dy, da, db) -> Entry:
    """The checks the kernels rely on beyond argcheck's (dense outputs) and the plan: once per layout."""
    dt = dtypes.short_or_none(a.dtype)
    if dt not in DTYPES:
        raise TypeError(f"{OP}: a has dtype {a.dtype}, expected one of float32, float16, bfloat16, float64")
    for name, x in (("da", da), ("db", db)):
        if x.size and not x.flags.c_contiguous:
            raise ValueError(f"{OP}: {name} must be C-contiguous, got strides {x.strides}")
    return entry_for(dt, a.shape, element_strides(a, "a", OP), b.shape, element_strides(b, "b", OP),
                     dy.shape, element_strides(dy, "dy", OP))


def _check_overlap(arrays: dict) -> None:
    for name in ("da", "db"):
        o = arrays[name]
        if not o.size:
            continue
        for other in ("a", "b", "dy", "db" if name == "da" else None):
            x = arrays.get(other)
            if x is not None and x.size and overlap(byte_span(o), byte_span(x)):
                raise ValueError(f"{OP}: {name} shares memory with {other}, expected a buffer of its own "
                                 "(outputs are written while inputs are read)")


def _entry(inputs, outs) -> tuple[Entry, dict]:
    a, b, dy = inputs["a"], inputs["b"], inputs["dy"]
    da, db = outs["da"], outs["db"]
    key = (a.dtype, a.shape, a.strides, b.shape, b.strides, dy.shape, dy.strides, da.strides, db.strides)
    entry = _CALLS.get(key)
    if entry is None:
        entry = _checked_entry(a, b, dy, da, db)
        if len(_CALLS) >= _MAX_ENTRIES:
            _CALLS.clear()
        _CALLS[key] = entry
    arrays = {"a": a, "b": b, "dy": dy, "da": da, "db": db}
    ptrs = (a.data.ptr, b.data.ptr, dy.data.ptr, da.data.ptr, db.data.ptr)
    if ptrs not in entry.apart:  # the overlap checks once per set of addresses
        _check_overlap(arrays)
        if len(entry.apart) >= 64:
            entry.apart.clear()
        entry.apart.add(ptrs)
    return entry, arrays


def _impl(variant: str):
    def impl(inputs, outs, params):
        entry, arrays = _entry(inputs, outs)
        run(device(), variant, entry, arrays)
    impl.__name__ = impl.__qualname__ = f"matmul_backward_{variant}"
    impl.__doc__ = f"matmul_backward through the {variant} kernels (backends/cuda/matmul_backward.cuh)."
    return impl


# argcheck: names, cupy arrays, dtypes, shapes (the op's rule), one device; the impl then checks
# what its kernels rely on (dense outputs, no overlap).  Ladder order = registration order.
for _variant in mmplan.VARIANTS:
    argcheck.register(cupy_backend, OP, variant=_variant, dtypes=DTYPES, deterministic=True)(_impl(_variant))
