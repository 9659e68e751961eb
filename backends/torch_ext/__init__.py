"""The `torch_ext` backend: C++/CUDA kernels registered as torch.library custom ops (namespace
`gradoracle`), all ops built into one extension.

What lives here, and what may be touched: adding an op means its three files here, nothing else
to edit (common.h and this __init__ stay as they are):

    common.h          argument checks every op shares (nothing op-specific)
    <op>.cpp          the op's schemas (TORCH_LIBRARY_FRAGMENT), argument checks and CPU kernel
    <op>_cuda.cu      the op's CUDA launches of the device code in backends/cuda/<op>.cuh
    <op>.h            (optional) what <op>.cpp and <op>_cuda.cu share
    <op>.py           the op's Python side: plans (from backends/_plans/), fake (meta) kernels,
                      Python kernels of public ops, and its harness registration
                      (`argcheck.register(torch_ext, "<op>", ...)`); an `on_load(with_cuda)`
                      function, if it has one, runs once the library is loaded

This __init__ makes the Backend, finds the sources (every *.cpp here, and every *_cuda.cu when
CUDA is built), builds them into one library and imports every op module.  The build is lazy:
on the first availability check or call, with torch.utils.cpp_extension.load, into a build
folder keyed by a hash of the sources, the headers here and in backends/cuda/, the flags and the
torch version (an edit or a torch upgrade rebuilds, an unchanged tree reuses the build).  The
CUDA sources are compiled only when torch has CUDA, a device is visible and CUDA_HOME is set;
otherwise the same library holds the CPU kernels alone.

Importing this package is cheap and never raises: torch is imported only when needed.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import re
import threading
from pathlib import Path

from harness.registry import Backend

_HERE = Path(__file__).resolve().parent
_CUDA_DIR = _HERE.parent / "cuda"  # device code the *_cuda.cu files include
_REPO = _HERE.parent.parent
_NAME = "gradoracle_ext"

_lock = threading.Lock()
_state: dict = {"done": False, "error": None, "with_cuda": False}


def _cpu_sources() -> list[Path]:
    return sorted(_HERE.glob("*.cpp"))


def _cuda_sources() -> list[Path]:
    return sorted(_HERE.glob("*_cuda.cu"))


def _headers() -> list[Path]:
    """Files the sources include: an edit to one rebuilds."""
    return sorted(_HERE.glob("*.h")) + sorted(p for p in _CUDA_DIR.iterdir() if p.suffix in (".h", ".cuh"))


def _cuda_wanted() -> tuple[bool, str]:
    """(compile the *_cuda.cu sources?, why not)."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return False, "CPU torch"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if cpp_extension.CUDA_HOME is None:
        return False, "CUDA_HOME is not set"
    return True, ""


def _build_flags(with_cuda: bool) -> dict:
    # -fopenmp: at::parallel_for is an inline OpenMP loop, serial unless the extension is
    # compiled with OpenMP; the symbols resolve against the libgomp torch has already loaded.
    flags = {"extra_cflags": ["-O3", "-fopenmp"]}
    if with_cuda:
        cuda_flags = ["-O3"]
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            cuda_flags.append("-arch=sm_90")  # H100/H200; TORCH_CUDA_ARCH_LIST overrides
        flags["extra_cuda_cflags"] = cuda_flags
    return flags


def _build_directory(sources: list[Path], flags: dict) -> Path:
    import torch

    digest = hashlib.sha256()
    for path in sorted(sources + _headers()):
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


def _load() -> str | None:
    """Build and load the extension once, then let each op module register its Python side;
    None, or why the backend is unusable."""
    with _lock:
        if _state["done"]:
            return _state["error"]
        _state["done"] = True
        try:
            from torch.utils import cpp_extension

            with_cuda, _ = _cuda_wanted()
            sources = _cpu_sources() + (_cuda_sources() if with_cuda else [])
            flags = _build_flags(with_cuda)
            cpp_extension.load(name=_NAME, sources=[str(s) for s in sources], is_python_module=False,
                               build_directory=str(_build_directory(sources, flags)), verbose=False, **flags)
            for module in _OP_MODULES:
                if hasattr(module, "on_load"):
                    module.on_load(with_cuda)
            _state["with_cuda"] = with_cuda
        except Exception as exc:  # a broken toolchain must read as unavailable
            _state["error"] = f"torch_ext: build failed: {_first_error_line(str(exc))}"
        return _state["error"]


def _check(device: str) -> str | None:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"torch_ext: torch not importable ({exc})"
    error = _load()
    if error:
        return error
    if device == "cuda" and not _state["with_cuda"]:
        return f"torch_ext: built without CUDA ({_cuda_wanted()[1] or 'unknown reason'})"
    return None


def require() -> None:
    """Build and load the extension if not yet done; RuntimeError saying why if it cannot be."""
    error = _load()
    if error:
        raise RuntimeError(error)


_require = require  # the name tests and probes have used

torch_ext = Backend("torch_ext", framework="torch", devices=("cpu", "cuda"),
                    description="C++/CUDA kernels registered as torch.library custom ops (namespace gradoracle)",
                    check=_check)

# Every module of this package is an op (imported with the package, as the harness needs them).
_OP_MODULES = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
               if not info.name.startswith("_")]
