"""Compile every attention_backward Triton kernel and sizing for sm_90 (H100) with no GPU.

Jobs: the main (dk, dv; atomic dq) and dq kernels for every autotune candidate of 16-bit
inputs (bf16; f16 differs only in the element type: one job) at padded head dims 64, 128 and
256, odd head dims (40, 96: masked loads), and the float32 / float64 sizing at the head dims
their cases reach (64 and 128; 64), all with every mask feature on (window left and right,
softcap); the preprocess, cast and split-sum kernels per dtype.  Each must
give a cubin whose shared memory fits an H100 SM (227 KiB a block), and the 16-bit ones must
use tensor-core instructions.  `python tests/test_triton_attention_compile.py [JOB...]` prints
each job's registers and spills too (from a second ptxas run).

Compiles run in two worker subprocesses without TRITON_INTERPRET (the test session sets it
on GPU-less machines; interpreter functions cannot be compiled), as tests/test_triton_compile.py does.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import triton_sm90 as sm90

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
SMEM_LIMIT = 232448  # bytes of shared memory a block may use on sm_90
_TY, _ITEM = sm90.TRITON_TY, sm90.ITEM


def _jobs() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from backends.triton import attention_backward as ab

    jobs = []
    for d in (64, 128, 256):
        for i in range(len(ab.candidates(2, d))):
            jobs += [f"main-bf16-{d}-{i}", f"dq-bf16-{d}-{i}"]
    # float32 and float64 take the FMA path; the cases give them head dims up to 128 and 64
    jobs += [f"{k}-f32-{d}-0" for d in (64, 128) for k in ("main", "dq")] + ["main-f64-64-0", "dq-f64-64-0"]
    jobs += ["main-f16-128-0", "main-bf16-40-0", "dq-f16-96-0"]
    jobs += [f"{k}-{dt}-128-0" for dt in _TY for k in ("pre", "cast", "sum")]
    return jobs


JOBS = _jobs()


def _spec(job: str):
    """(kernel, signature types by arg name, constexprs, num_warps, num_stages) of one job."""
    from backends.triton import _attn_kernels as K
    from backends.triton import attention_backward as ab

    kind, dt, d, i = job.split("-")
    d, i = int(d), int(i)
    cfg = ab.candidates(_ITEM[dt], d)[i]
    dp = ab.padded_dim(d)
    ty, acc = _TY[dt], ("fp64" if dt == "f64" else "fp32")
    base = dict(HAS_LEFT=True, HAS_RIGHT=True, IS_F64=dt == "f64", DP=dp)
    flags = dict(SOFTCAP=True, PREC="ieee" if dt in ("f32", "f64") else "tf32", EVEN_D=dp == d)
    if kind == "pre":
        kernel, warps, stages = K._attn_pre_kernel, 4, 1
        const = dict(base, ZERO_DQ=True, BM=cfg.pre_bm)
        ptrs = dict(o_ptr=ty, do_ptr=ty, lse_ptr=acc, c_ptr=acc, delta_ptr=acc, lse2_ptr=acc, dqa_ptr=acc)
    elif kind == "cast":
        kernel, warps, stages = K._attn_cast_kernel, 4, 1
        const = dict(BLOCK=1024)
        ptrs = dict(dqa_ptr=acc, c_ptr=acc, dq_ptr=ty)
    elif kind == "sum":
        kernel, warps, stages = K._attn_sum_kernel, 4, 1
        const = dict(BLOCK=1024)
        ptrs = dict(dkp_ptr=acc, dvp_ptr=acc, dk_ptr=ty, dv_ptr=ty)
    elif kind == "main":
        kernel, warps, stages = K._attn_dkdv_kernel, cfg.warps, cfg.stages
        const = dict(base, **flags, ATOMIC_DQ=True, BM=cfg.bm, BN=cfg.bn)
        ptrs = dict(q_ptr=ty, k_ptr=ty, v_ptr=ty, do_ptr=ty, lse2_ptr=acc, delta_ptr=acc, c_ptr=acc,
                    dk_ptr=ty, dv_ptr=ty, dqa_ptr=acc)
    else:
        kernel, warps, stages = K._attn_dq_kernel, cfg.warps2, cfg.stages2
        const = dict(base, **flags, BM=cfg.bm2, BN=cfg.bn2)
        ptrs = dict(q_ptr=ty, k_ptr=ty, v_ptr=ty, do_ptr=ty, lse2_ptr=acc, delta_ptr=acc, c_ptr=acc, dq_ptr=ty)
    return kernel, ptrs, const, warps, stages


def _compile(job: str, registers: bool = False) -> dict:
    kernel, ptrs, const, warps, stages = _spec(job)
    # As a launch specialises them for contiguous tensors of head dim 64 / 128 / 256: head-dim
    # strides 1 (constants), other strides multiples of 16, pointers 16-byte aligned.
    const = dict(const, **{n: 1 for n in kernel.arg_names if re.fullmatch(r"s\w+_d", n)})
    odd = "-40-" in job or "-96-" in job
    signature, attrs = sm90.signature(kernel, ptrs, const,
                                      lambda i, name: not odd and re.fullmatch(r"s\w+_[bsh]", name) is not None)
    compiled = sm90.compile_sm90(kernel, signature, const, attrs, warps, num_stages=stages)
    ptx = compiled.asm["ptx"]
    out = {"cubin": len(compiled.asm.get("cubin", b"")), "shared": int(compiled.metadata.shared),
           "wgmma": "wgmma" in ptx, "mma": "mma.sync" in ptx, "warps": warps}
    if registers:  # a second ptxas run, for its report: the table mode only (it doubles the time)
        r = sm90.ptxas_report(ptx)
        out.update(regs=r["regs"], spills=r["spill_stores"])
    return out


@pytest.fixture(scope="module")
def compiled() -> dict:
    return sm90.run_workers(__file__, "--worker", [JOBS[i::2] for i in range(2)], timeout=1200)


@pytest.mark.parametrize("job", JOBS)
def test_compiles_for_sm90(compiled, job):
    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["cubin"] > 0, f"{job}: no cubin"
    assert r["shared"] <= SMEM_LIMIT, f"{job}: {r['shared']} bytes of shared memory, an SM block holds {SMEM_LIMIT}"


@pytest.mark.parametrize("job", [j for j in JOBS if j.split("-")[0] in ("main", "dq") and j.split("-")[1] in ("bf16", "f16")])
def test_16bit_dots_use_tensor_cores(compiled, job):
    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["wgmma"] or r["mma"], f"{job}: no tensor-core instruction in the PTX"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sm90.worker(sys.argv[2:], _compile)
elif __name__ == "__main__":  # a table of the jobs' resources: python tests/test_triton_attention_compile.py [JOB...]
    sys.path.insert(0, str(ROOT))
    for job in sys.argv[1:] or JOBS:
        print(job, _compile(job, registers=True), flush=True)
