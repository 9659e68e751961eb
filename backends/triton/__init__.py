"""The `triton` backend: one module per op (`backends/triton/<op>.py`), each registering its
kernels on `triton_backend`; `common.py` holds what they share.

Adding a kernel for a new op is one new file here: it imports `triton_backend` and the
helpers of `common`, and registers with `harness.argcheck.register(triton_backend, "<op>", ...)`.
Every module of this package is imported when the backend is (a file is an op).
Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (set before triton is imported).
"""
from __future__ import annotations

import importlib
import pkgutil

from backends.triton.common import check
from harness.registry import Backend

triton_backend = Backend("triton", framework="torch", devices=("cuda", "cpu"),
                         description="Triton kernels (CPU runs them under TRITON_INTERPRET=1)", check=check)

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name != "common":
        importlib.import_module(f"{__name__}.{_info.name}")
