"""`torch_ext`: C++/CUDA kernels registered as torch.library custom ops (namespace `gradoracle`).

The extension is built lazily, on the first availability check or call, with
torch.utils.cpp_extension.load into a build folder keyed by a hash of the sources, the
flags and the torch version (so an edit or a torch upgrade rebuilds, and an unchanged
tree reuses the build).  The CUDA kernel is compiled in only when torch has CUDA and
CUDA_HOME is set; otherwise the same library holds the CPU kernels alone.

Ops (see ops.cpp):
    gradoracle::binary_backward(Tensor a, Tensor b, Tensor grad_out, str fn) -> (Tensor, Tensor)
    gradoracle::binary_backward.out(..., *, Tensor(a!) grad_a, Tensor(b!) grad_b) -> (Tensor(a!), Tensor(b!))

Both ops have a fake (meta) implementation that runs harness.argcheck's checks, so meta
tensors and torch.compile's fake tensors get shapes, and bad arguments clear errors, as real
ones do; a call mixing meta with real tensors (the dispatcher picks Meta for it) is a
ValueError naming the argument.  (In Python, not as a C++ Meta kernel: its checks would have
to be SymInt-aware for dynamic shapes.)

Importing this module is cheap and never raises: torch is imported only when needed.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

from harness import argcheck
from harness.registry import Backend

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent.parent
_CPU_SOURCES = ("ops.cpp", "binary_backward_cpu.cpp")
_CUDA_SOURCES = ("binary_backward_cuda.cu",)
_HEADERS = ("bcast_plan.h", "binary_backward.h", "../cuda/binary_backward.cuh")  # edits rebuild
_NAME = "gradoracle_ext"

_lock = threading.Lock()
_state: dict = {"done": False, "error": None, "with_cuda": False}


def _cuda_wanted() -> tuple[bool, str]:
    """(compile the .cu?, why not)."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return False, "CPU torch"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if cpp_extension.CUDA_HOME is None:
        return False, "CUDA_HOME is not set"
    missing = [s for s in _CUDA_SOURCES if not (_HERE / s).exists()]
    if missing:
        return False, f"missing {', '.join(missing)}"
    return True, ""


def _build_flags(with_cuda: bool) -> dict:
    # -fopenmp: at::parallel_for is an inline OpenMP loop, serial unless the extension is
    # compiled with OpenMP; the symbols resolve against the libgomp torch has already loaded.
    flags = {"extra_cflags": ["-O3", "-fopenmp"]}
    if with_cuda:
        flags["extra_cflags"].append("-DGRADORACLE_WITH_CUDA")
        cuda_flags = ["-O3", "-DGRADORACLE_WITH_CUDA"]
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            cuda_flags.append("-arch=sm_90")  # H100/H200; TORCH_CUDA_ARCH_LIST overrides
        flags["extra_cuda_cflags"] = cuda_flags
    return flags


def _build_directory(sources: list[Path], flags: dict) -> Path:
    import torch

    digest = hashlib.sha256()
    for path in sorted(sources + [_HERE / h for h in _HEADERS]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr((sorted(flags.items()), torch.__version__, os.environ.get("TORCH_CUDA_ARCH_LIST"))).encode())
    root = os.environ.get("GRADORACLE_BUILD_DIR")
    if root is None:
        in_repo = (_REPO / "pyproject.toml").exists() and os.access(_REPO, os.W_OK)
        root = _REPO / "build" / "torch_ext" if in_repo else Path.home() / ".cache" / "gradoracle" / "torch_ext"
    path = Path(root) / digest.hexdigest()[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _first_error_line(text: str) -> str:
    """The compiler's first `error` line, else the first non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\berror\b", ln, re.IGNORECASE) and not ln.startswith("Error building extension"):
            return ln
    return lines[0] if lines else "unknown error"


def _register_fakes() -> None:
    import torch

    def check(a, b, grad_out, fn, grad_a=None, grad_b=None):
        # Any device here (meta included); only their agreement is checked.
        argcheck.check("binary_backward", {"a": a, "b": b, "grad_out": grad_out},
                       {"grad_a": grad_a, "grad_b": grad_b}, {"fn": fn}, who="torch_ext", framework="torch")

    @torch.library.register_fake("gradoracle::binary_backward")
    def _binary_backward_fake(a, b, grad_out, fn):
        check(a, b, grad_out, fn)
        # Outputs are contiguous, shaped like a and b, in a's dtype (as ops.cpp allocates them).
        return a.new_empty(a.shape), a.new_empty(b.shape)

    @torch.library.register_fake("gradoracle::binary_backward.out")
    def _binary_backward_out_fake(a, b, grad_out, fn, *, grad_a, grad_b):
        check(a, b, grad_out, fn, grad_a, grad_b)
        return grad_a, grad_b


def _load() -> str | None:
    """Build and load the extension once; None, or why it is unusable."""
    with _lock:
        if _state["done"]:
            return _state["error"]
        _state["done"] = True
        try:
            from torch.utils import cpp_extension

            with_cuda, _ = _cuda_wanted()
            names = _CPU_SOURCES + (_CUDA_SOURCES if with_cuda else ())
            sources = [_HERE / s for s in names]
            flags = _build_flags(with_cuda)
            cpp_extension.load(name=_NAME, sources=[str(s) for s in sources], is_python_module=False,
                               build_directory=str(_build_directory(sources, flags)), verbose=False, **flags)
            _register_fakes()
            _state["with_cuda"] = with_cuda
        except Exception as exc:  # a broken toolchain must read as unavailable
            _state["error"] = f"torch_ext: build failed: {_first_error_line(str(exc))}"
        return _state["error"]


def _check(device: str) -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"torch_ext: torch not importable ({exc})"
    error = _load()
    if error:
        return error
    if device == "cuda" and not _state["with_cuda"]:
        return f"torch_ext: built without CUDA ({_cuda_wanted()[1] or 'unknown reason'})"
    return None


def _require() -> None:
    error = _load()
    if error:
        raise RuntimeError(error)


torch_ext = Backend("torch_ext", framework="torch", devices=("cpu", "cuda"),
                    description="C++/CUDA kernels registered as torch.library custom ops (namespace gradoracle)",
                    check=_check)


_MAX_RANK = 8  # kMaxDims in bcast_plan.h


def _kernel_limits(inputs, outs) -> None:
    """The kernel's own limits, checked before the op so that the harness path never depends on
    an exception thrown in C++: grad_out's rank, contiguous outputs, no output sharing memory
    with an input or the other output.  (ops.cpp checks the same for direct callers.)"""
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


@argcheck.register(torch_ext, "binary_backward", dtypes=("f32", "f16", "bf16", "f64"), deterministic=True)
def _binary_backward_impl(inputs, outs, params):
    """Writes outs['grad_a'], outs['grad_b'] in place through the .out op.

    argcheck validates the call first, then `_kernel_limits`; the op validates again in C++
    (ops.cpp), for callers of torch.ops.gradoracle.binary_backward that come without this wrapper."""
    import torch

    _require()
    _kernel_limits(inputs, outs)
    torch.ops.gradoracle.binary_backward.out(inputs["a"], inputs["b"], inputs["grad_out"], params["fn"],
                                             grad_a=outs["grad_a"], grad_b=outs["grad_b"])


def binary_backward(a, b, grad_out, fn: str):
    """(grad_a, grad_b) of fn(a, b) for grad_out, by the functional op (works under torch.compile)."""
    import torch

    _require()
    return torch.ops.gradoracle.binary_backward(a, b, grad_out, fn)
