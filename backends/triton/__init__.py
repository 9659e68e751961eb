"""The `triton` backend: Triton kernels, one module per op.

    common.py     what every kernel module shares: the guarded triton import, the interpreter
                  switch, dtype conversions inside kernels, launch-size helpers
    <op>.py       the op's kernels, launch planning and checks, registered on `triton_backend`
                  with `harness.argcheck.register(triton_backend, "<op>", ...)`

What may be touched: adding a kernel for a new op is one new file here, `<op>.py` (every module
but `common` is imported with the package: a file is an op); a variant of an op that outgrows
its file becomes a subpackage `<op>/`.  Plans shared with other backends come from
backends/_plans/, buffer checks from backends/_buffers.py.  Runs on CUDA, or on the CPU under
TRITON_INTERPRET=1 (set before triton is imported).
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
