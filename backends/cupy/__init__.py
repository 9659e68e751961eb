"""The `cupy` backend: raw CUDA C++ compiled with NVRTC through cupy.RawModule.

    common.py     availability, NVRTC compilation of backends/cuda/ code (once per process per
                  kernel), device queries, stride checks
    nvrtc.py      header discovery, source reading (local headers inlined) and cubin compilation
                  with NVRTC, also used by the compile tests on machines with no GPU
    <op>.py       the op's host side: argument checks, kernel instantiation names, launches

The device code is backends/cuda/<op>.cuh (written once, shared with torch_ext's nvcc build)
and its launch plan backends/_plans/<op>_cuda.py (shared with torch_ext too).  What may be
touched: a new op is `<op>.py` here plus its .cuh and plan; a ladder of kernel versions is a
set of registered variants (`cupy@naive`, `cupy@opt`, ...).  Every module but `common` and
`nvrtc` is imported with the package (a file is an op).  Importing it never imports cupy.
"""
from __future__ import annotations

import importlib
import pkgutil

from backends.cupy.common import check
from harness.registry import Backend

cupy_backend = Backend("cupy", framework="cupy", devices=("cuda",),
                       description="raw CUDA C++ compiled with NVRTC through cupy.RawModule", check=check)

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name not in ("common", "nvrtc"):
        importlib.import_module(f"{__name__}.{_info.name}")
