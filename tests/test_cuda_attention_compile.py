"""backends/cuda/attention_backward.cuh compiles for sm_90, with no GPU: every kernel instantiation
the cupy planner can launch (every dtype, padded head dim and tuning candidate) through NVRTC,
as cupy compiles it, and through `nvcc -cubin` (torch_ext's compiler) when nvcc exists.  Also: the
shared-memory sizes the planner asks for fit an H100 block (227 KiB)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from backends.cupy import attention_backward as A
from backends.cupy import nvrtc as _nvrtc

from cuda_host_attention import HEAD_DIMS, signature

SM90_SMEM = 227 * 1024


def _exprs(dt: str) -> list[str]:
    return sorted({e for v in A.VARIANTS for d in HEAD_DIMS for e in A.kernel_exprs(v, dt, d)})


def _nvrtc_ready() -> str | None:
    if _nvrtc.nvrtc_version() is None:
        return "NVRTC not usable (no cupy or libnvrtc)"
    if not _nvrtc.include_dirs():
        return "cuda_fp16.h not found"
    return None


@pytest.mark.skipif(_nvrtc_ready() is not None, reason=str(_nvrtc_ready()))
@pytest.mark.parametrize("dt", A.DTYPES)
def test_nvrtc_compiles_every_instantiation(dt):
    exprs = _exprs(dt)
    cubin, lowered = _nvrtc.compile_cubin(_nvrtc.read_source(A.SOURCE), "sm_90", exprs)
    assert len(cubin) > 0 and set(lowered) == set(exprs)
    for name in lowered.values():
        assert name.encode() in cubin, name


def _instantiation(expr: str) -> str:
    name = expr.split("<", 1)[0]
    return f"template __global__ void {expr}({', '.join(signature(expr))});  // {name}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_every_instantiation(tmp_path):
    procs = {}
    for dt in A.DTYPES:  # one nvcc per dtype, side by side
        src = tmp_path / f"attn_{dt}.cu"
        src.write_text(f'#include "{A.SOURCE}"\n' + "\n".join(_instantiation(e) for e in _exprs(dt)) + "\n")
        out = tmp_path / f"attn_{dt}.cubin"
        procs[dt] = subprocess.Popen(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", f"-I{_nvrtc.CUDA_DIR}",
                                      "-o", str(out), str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
    for dt, proc in procs.items():
        log, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"nvcc failed for {dt}:\n{log[-5000:]}"


def test_shared_memory_fits_an_sm90_block():
    for dp in (64, 128, 256):
        for bm, bn, *_ in A.MAIN_CFGS[dp] + A.LEAN_CFGS[dp]:
            assert A.main_smem(dp, bm, bn) <= SM90_SMEM, (dp, bm, bn)
        for bm, bn in A.DQ_CFGS[dp]:
            assert A.dq_smem(dp, bm, bn) <= SM90_SMEM, (dp, bm, bn)


@pytest.mark.skipif(_nvrtc_ready() is not None, reason=str(_nvrtc_ready()))
@pytest.mark.parametrize("dt", A.TC_DTYPES)
def test_lean_kernels_fit_the_register_file(dt):
    """Every tensor-core kernel of the lean variants (issue 17) compiles for sm_90 within 255
    registers and without spills (ptxas -v through NVRTC, one program per dtype)."""
    from nvrtc_ptxas import ptxas_usage

    exprs = sorted({e for v in ("fa2_lean", "fa2_lean_det") for d in HEAD_DIMS for e in A.kernel_exprs(v, dt, d)
                    if e.startswith(("attn_fa2_main", "attn_fa2_dq", "attn_pre_vec", "attn_dq_convert_vec"))})
    report = ptxas_usage(_nvrtc.read_source(A.SOURCE), "attn_lean.cu", exprs)
    assert set(report) == set(exprs)
    bad = {e: r for e, r in report.items() if r[0] > 255 or r[1] > 0}
    assert not bad, f"registers > 255 or spill stores (registers, spill bytes): {bad}"
