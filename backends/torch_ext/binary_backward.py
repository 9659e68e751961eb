"""binary_backward for `torch_ext`: the op's Python side (the C++ is binary_backward.cpp / _cuda.cu).

Ops (namespace gradoracle; schemas in binary_backward.cpp):
    binary_backward(Tensor a, Tensor b, Tensor grad_out, str fn) -> (Tensor, Tensor)
    binary_backward.out(..., *, Tensor(a!) grad_a, Tensor(b!) grad_b) -> (Tensor(a!), Tensor(b!))
    _binary_backward_run(a, b, grad_out, fn, Tensor plan, *, grad_a, grad_b) -> ()   (internal)
    _binary_backward_blocks_per_sm(Tensor like, str fn, int kind, bool vectorized) -> int   (internal, CUDA)

The public ops' CPU and CUDA kernels are the Python functions here: they take the plan for the
tensors' layout and call `_binary_backward_run`, whose C++ checks every argument (the same
ValueError / TypeError on both devices) and runs the plan.  The plan is made once, here, from
backends/_plans/: on the CPU the broadcast box (binary_backward.py), on CUDA the @best launch of
binary_backward_cuda.py (`plan_best`) for the device's SM count and each kernel's resident blocks
per SM as the driver gives them for the extension's build (`_binary_backward_blocks_per_sm`), the
plan cupy@best launches.  It depends on shapes, strides, the element size, the fn and (on CUDA)
16-byte alignment only, so it is cached per layout and fn: a call seen before costs a dict lookup.

Both public ops also have a fake (meta) kernel that runs harness.argcheck's checks, so meta
tensors and torch.compile's fake tensors get shapes, and bad arguments clear errors, as real
ones do; a call mixing meta with real tensors (the dispatcher picks Meta for it) is a
ValueError naming the argument.  (In Python, not as a C++ Meta kernel: its checks would have
to be SymInt-aware for dynamic shapes.)
"""
from __future__ import annotations

from backends._plans import binary_backward as bcast
from backends._plans import binary_backward_cuda as cuda_plan
from backends.torch_ext import require, torch_ext
from harness import argcheck

OP = "binary_backward"
DTYPES = ("f32", "f16", "bf16", "f64")

_RECORDS: dict = {}      # layout -> BBLaunch words (int64 CPU tensor)
_MAX_RECORDS = 1 << 14   # a run over many shapes must not grow it without bound
_SMS: dict = {}          # CUDA device index -> multiprocessors
_OCCUPANCY: dict = {}    # (device index, dtype, fn, kind, vectorized) -> resident blocks per SM
_RUN = None              # torch.ops.gradoracle._binary_backward_run.default, once loaded


# ----------------------------------------------------------------------------- plans

def _num_sms(index: int) -> int:
    if index not in _SMS:
        import torch

        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _blocks_per_sm(like, fn: str):
    """plan_best's blocks_per_sm(kind, vectorized) for like's device and dtype and this fn: the
    driver's figure for the kernel the extension built (as cupy asks it for NVRTC's), once each."""
    import torch

    def resident(kind: str, vec: bool) -> int:
        key = (like.device.index, like.dtype, fn, kind, vec)
        if key not in _OCCUPANCY:
            _OCCUPANCY[key] = torch.ops.gradoracle._binary_backward_blocks_per_sm(
                like, fn, cuda_plan.KINDS.index(kind), vec)
        return _OCCUPANCY[key]
    return resident


def _make_record(a, b, g, fn: str, aligned: bool):
    import torch

    try:
        out_shape = bcast.broadcast_shape(a.shape, b.shape)
    except ValueError:
        out_shape = None
    if out_shape is None or len(out_shape) > cuda_plan.MAX_DIMS or tuple(g.shape) != out_shape:
        # Arguments no plan fits: an empty plan, and the C++ checks, which run first, say what is wrong.
        return torch.empty(0, dtype=torch.int64)
    plan = bcast.make_plan(tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), g.stride())
    if a.device.type == "cuda":
        sms = _num_sms(a.device.index)
        launch = cuda_plan.plan_best(plan, sms, (0,) * 5 if aligned else (1,) * 5, a.element_size(),
                                     _blocks_per_sm(a, fn))
        words = cuda_plan.launch_record(launch, plan, sms)
    else:
        words = cuda_plan.box_record(plan)
    return torch.tensor(words, dtype=torch.int64)


def plan_for(a, b, grad_out, fn: str, grad_a, grad_b):
    """The BBLaunch words (an int64 CPU tensor) for these tensors and fn, made once per layout and fn
    (the fn changes the kernel's registers, so its resident blocks and the grid)."""
    aligned = a.is_cuda and not (a.data_ptr() | b.data_ptr() | grad_out.data_ptr() | grad_a.data_ptr()
                                 | grad_b.data_ptr()) % 16
    key = (a.device, a.dtype, fn, a.shape, a.stride(), b.shape, b.stride(), grad_out.shape, grad_out.stride(),
           aligned)
    record = _RECORDS.get(key)
    if record is None:
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        record = _RECORDS[key] = _make_record(a, b, grad_out, fn, aligned)
    return record


def run(a, b, grad_out, fn: str, grad_a, grad_b) -> None:
    """Write grad_a and grad_b in place (the extension must be loaded: `require()`)."""
    _RUN(a, b, grad_out, fn, plan_for(a, b, grad_out, fn, grad_a, grad_b), grad_a=grad_a, grad_b=grad_b)


# ----------------------------------------------------------------------------- torch.library

def _functional(a, b, grad_out, fn):
    # Outputs are contiguous, shaped like a and b, in a's dtype and on a's device.
    grad_a, grad_b = a.new_empty(a.shape), a.new_empty(b.shape)
    run(a, b, grad_out, fn, grad_a, grad_b)
    return grad_a, grad_b


def _out(a, b, grad_out, fn, *, grad_a, grad_b):
    run(a, b, grad_out, fn, grad_a, grad_b)
    return grad_a, grad_b


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and every op's fake kernel."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._binary_backward_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl("gradoracle::binary_backward", devices, _functional)
    torch.library.impl("gradoracle::binary_backward.out", devices, _out)

    def check(a, b, grad_out, fn, grad_a=None, grad_b=None):
        # Any device here (meta included); only their agreement is checked.
        argcheck.check(OP, {"a": a, "b": b, "grad_out": grad_out}, {"grad_a": grad_a, "grad_b": grad_b},
                       {"fn": fn}, who="torch_ext", framework="torch")

    @torch.library.register_fake("gradoracle::binary_backward")
    def _binary_backward_fake(a, b, grad_out, fn):
        check(a, b, grad_out, fn)
        return a.new_empty(a.shape), a.new_empty(b.shape)

    @torch.library.register_fake("gradoracle::binary_backward.out")
    def _binary_backward_out_fake(a, b, grad_out, fn, *, grad_a, grad_b):
        check(a, b, grad_out, fn, grad_a, grad_b)
        return grad_a, grad_b

    @torch.library.register_fake("gradoracle::_binary_backward_run")
    def _binary_backward_run_fake(a, b, grad_out, fn, plan, *, grad_a, grad_b):
        check(a, b, grad_out, fn, grad_a, grad_b)


# ----------------------------------------------------------------------------- harness

_MAX_RANK = cuda_plan.MAX_DIMS  # BB_MAX_DIMS


def _kernel_limits(inputs, outs) -> None:
    """The kernel's own limits, checked before the op so that the harness path never depends on
    an exception thrown in C++: grad_out's rank, contiguous outputs, no output sharing memory
    with an input or the other output.  (binary_backward.cpp checks the same for direct callers.)"""
    rank = inputs["grad_out"].dim()
    if rank > _MAX_RANK:
        raise ValueError(f"torch_ext binary_backward: argument 'grad_out' has {rank} dims, expected at most "
                         f"{_MAX_RANK} (the kernels unravel at most {_MAX_RANK})")
    for name in ("grad_a", "grad_b"):
        out = outs[name]
        if not out.is_contiguous():
            raise ValueError(f"torch_ext binary_backward: argument {name!r} has strides {tuple(out.stride())} for "
                             f"shape {tuple(out.shape)}, expected a contiguous tensor (the kernel writes it densely)")
        if not out.numel():
            continue
        ptr = out.untyped_storage().data_ptr()
        for other in ("a", "b", "grad_out", "grad_b" if name == "grad_a" else None):
            x = outs[other] if other == "grad_b" else inputs.get(other)
            if x is not None and x.numel() and x.untyped_storage().data_ptr() == ptr:
                raise ValueError(f"torch_ext binary_backward: argument {name!r} shares memory with {other!r}, "
                                 "expected a separate tensor (outputs are written while inputs are read)")


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=True)
def _binary_backward_impl(inputs, outs, params):
    """Writes outs['grad_a'], outs['grad_b'] in place.

    argcheck validates the call first, then `_kernel_limits`; the op validates again in C++
    (binary_backward.cpp), for callers of torch.ops.gradoracle.binary_backward that come without
    this wrapper."""
    require()
    _kernel_limits(inputs, outs)
    run(inputs["a"], inputs["b"], inputs["grad_out"], params["fn"], outs["grad_a"], outs["grad_b"])


def binary_backward(a, b, grad_out, fn: str):
    """(grad_a, grad_b) of fn(a, b) for grad_out, by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.binary_backward(a, b, grad_out, fn)
