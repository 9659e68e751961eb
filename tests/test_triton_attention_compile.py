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

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
SMEM_LIMIT = 232448  # bytes of shared memory a block may use on sm_90
_TY = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64"}
_ITEM = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}


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
    import triton
    from triton.backends.compiler import GPUTarget

    kernel, ptrs, const, warps, stages = _spec(job)
    # As a launch specialises them for contiguous tensors of head dim 64 / 128 / 256: head-dim
    # strides 1 (constants), other strides multiples of 16, pointers 16-byte aligned.
    const = dict(const, **{n: 1 for n in kernel.arg_names if re.fullmatch(r"s\w+_d", n)})
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in const:
            signature[name] = "constexpr"
        elif name in ptrs:
            signature[name] = "*" + ptrs[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i32"
            if re.fullmatch(r"s\w+_[bsh]", name) and "-40-" not in job and "-96-" not in job:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=const, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    out = {"cubin": len(compiled.asm.get("cubin", b"")), "shared": int(compiled.metadata.shared),
           "wgmma": "wgmma" in ptx, "mma": "mma.sync" in ptx, "warps": warps}
    if registers:  # a second ptxas run, for its report: the table mode only (it doubles the time)
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "k.ptx").write_text(ptx)
            log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", str(Path(tmp, "k.ptx")),
                                  "-o", str(Path(tmp, "k.o"))], capture_output=True, text=True).stderr
        regs = re.findall(r"Used (\d+) registers", log)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        out.update(regs=int(regs[0]) if regs else None, spills=int(spills[0]) if spills else 0)
    return out



def _worker(jobs: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    out = {}
    for job in jobs:
        try:
            out[job] = _compile(job)
        except Exception as exc:  # noqa: BLE001 - reported to the test side
            out[job] = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
    print(json.dumps(out))


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    workers = [subprocess.Popen([sys.executable, __file__, "--worker", *JOBS[i::2]], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = {}
    for w in workers:
        stdout, stderr = w.communicate(timeout=1200)
        assert w.returncode == 0, f"compile worker failed:\n{stderr[-4000:]}"
        results.update(json.loads(stdout.strip().splitlines()[-1]))
    return results


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
    _worker(sys.argv[2:])
elif __name__ == "__main__":  # a table of the jobs' resources: python tests/test_triton_attention_compile.py [JOB...]
    sys.path.insert(0, str(ROOT))
    for job in sys.argv[1:] or JOBS:
        print(job, _compile(job, registers=True), flush=True)
