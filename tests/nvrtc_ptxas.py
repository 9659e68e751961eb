"""Registers and spills of NVRTC-compiled CUDA kernels, read from ptxas's -v log (the tests that
hold a kernel to its launch bounds)."""
from __future__ import annotations

import re

from backends.cupy import nvrtc as _nvrtc


def ptxas_usage(source: str, filename: str, exprs, options=(), arch: str = "sm_90") -> dict[str, tuple[int, int]]:
    """{name expression: (registers, spill store bytes)} of `exprs` in `source` built for `arch`
    with the project's NVRTC options plus `options`."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        nvrtc.compileProgram(prog, list(_nvrtc.compile_options(("-Xptxas=-v", f"-arch={arch}", *options))))
        log = nvrtc.getProgramLog(prog)
        names = {nvrtc.getLoweredName(prog, e): e for e in exprs}
    finally:
        nvrtc.destroyProgram(prog)
    out, cur, spill = {}, None, 0
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = names.get(m[1])
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m[1])
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            out[cur] = (int(m[1]), spill)
    return out
