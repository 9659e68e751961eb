"""The `cupy` backend: raw CUDA C++ compiled with NVRTC through cupy.RawModule.

One module per op (`backends/cupy/<op>.py`: host planning and launch) over the device code in
`backends/cuda/<op>.cuh` (written once, shared with torch_ext's nvcc build); `common.py` holds
compilation, device queries and buffer checks.  A ladder of kernel versions is a set of
registered variants (`cupy@naive`, `cupy@opt`, ...).  Every module of this package is imported
with it (a file is an op).  Importing it never imports cupy.
"""
from __future__ import annotations

import importlib
import pkgutil

from backends.cupy.common import check
from harness.registry import Backend

cupy_backend = Backend("cupy", framework="cupy", devices=("cuda",),
                       description="raw CUDA C++ compiled with NVRTC through cupy.RawModule", check=check)

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name != "common":
        importlib.import_module(f"{__name__}.{_info.name}")
