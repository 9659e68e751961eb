"""The cupy attention_backward kernels (backends/cuda/attention_backward.cuh) on the CPU stand-in.

`HostAttnDevice` is the device `backends.cupy.attention_backward.run` launches on: the kernels
compiled by g++ against tests/cuda_host (a fiber per thread; ldmatrix, mma.sync, cp.async and
shuffles emulated warp by warp, see mma.cuh), one library per dtype holding every instantiation
the planner can launch for it, numpy buffers.  Workspaces start as NaN, so a row read before the
preprocess writes it shows; launches cycle through the stand-in's thread schedules.
"""
from __future__ import annotations

import numpy as np

import cuda_host
from backends.cupy import attention_backward as A
from backends.cupy import nvrtc as _nvrtc
from backends.cupy.common import CUDA_TYPE

HEAD_DIMS = (8, 64, 128, 256)  # one per DP / NPL the planner picks from


def signature(expr: str) -> list[str]:
    """Parameter types of a kernel of the .cuh, as C++ spells them."""
    name, targs = expr.split("<", 1)
    args = [a.strip() for a in targs.rstrip(">").split(",")]
    t, p = args[0], "AttnParams"
    ins = [f"const {t}*"] * 4  # q, k, v, do
    if name == "attn_pre_vec":
        return [p, f"const {t}*", f"const {t}*", "const float*", "float*", "float*", "float*"]
    if name == "attn_pre":
        acc = args[1]
        return [p, f"const {t}*", f"const {t}*", f"const {acc}*", f"{acc}*", f"{acc}*", "float*"]
    if name == "attn_fa2_main":
        return [p, "double", "double", *ins, "const float*", "const float*", "float*", "float*", f"{t}*", f"{t}*"]
    if name == "attn_split_sum":
        return [p, "const float*", f"{t}*", f"{t}*"]
    if name in ("attn_dq_convert", "attn_dq_convert_vec"):
        return [p, "double", "const float*", f"{t}*"]
    if name == "attn_fa2_dq":
        return [p, "double", "double", *ins, "const float*", "const float*", f"{t}*"]
    acc = args[1]
    stats = [f"const {acc}*", f"const {acc}*"]
    if name == "attn_simt_dq":
        return [p, "double", "double", *ins, *stats, f"{t}*"]
    if name == "attn_simt_dkdv":
        return [p, "double", "double", *ins, *stats, f"{t}*", f"{t}*"]
    raise KeyError(expr)


_KERNELS: dict = {}


def kernels(dt: str) -> "cuda_host.Kernels":
    if dt not in _KERNELS:
        exprs = sorted({e for v in A.VARIANTS for d in HEAD_DIMS for e in A.kernel_exprs(v, dt, d)})
        source = f'#include "{_nvrtc.CUDA_DIR / A.SOURCE}"\n'
        _KERNELS[dt] = cuda_host.Kernels(f"attention_backward-{dt}", source, {e: signature(e) for e in exprs})
    return _KERNELS[dt]


class HostAttnDevice:
    """One SM: every GQA case with few key blocks splits its query heads over blocks (attn_split_sum)."""

    def __init__(self, sms: int = 1):
        self.sms = sms
        self.launches: list[str] = []

    def num_sms(self) -> int:
        return self.sms

    def launch(self, launch, args) -> None:
        t = launch.expr.split("<", 1)[1].split(",")[0].rstrip(">").strip()
        dt = next(k for k, v in CUDA_TYPE.items() if v == t)
        vals = [None if isinstance(a, np.uint64) else float(a) if isinstance(a, np.float64) else a for a in args]
        self.launches.append(launch.expr)
        kernels(dt).launch(launch.expr, launch.grid, launch.block, vals, smem=launch.smem)

    def workspace(self, p, name: str, n: int, dtype):
        bufs = p.__dict__.setdefault("_host_bufs", {})
        if name not in bufs:
            bufs[name] = np.full(n, np.nan, dtype=dtype)
        return bufs[name]


def call(dev: HostAttnDevice, variant: str, inputs, outs, params) -> None:
    A.call(dev, variant, inputs, outs, params, xp=np, address=cuda_host.data_address)
