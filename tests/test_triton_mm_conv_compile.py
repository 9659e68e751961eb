"""Compile the Triton matmul_backward / conv_backward_data / conv_backward_weight kernels for sm_90 with no GPU.

Jobs: every perf case of the three ops with the default tile the planner picks, and every
autotuning candidate tile on one bfloat16 case per op.  The plans are made on
torch "meta" tensors with each case's shapes and layout strides (no data), so the launches
are exactly those a CUDA call of the case would make: the same kernels, constexprs, int
arguments, warps and stages.  Each launch is compiled like triton's launcher would specialise
it (ints equal to 1 as constants, ints divisible by 16 and 16-byte aligned pointers marked),
through ptxas for sm_90a.  Checks: a cubin comes out; the GEMM launches of 16-bit cases use
the tensor cores (mma / wgmma in the PTX); the default tiles spill at most SPILL_LIMIT bytes;
and the software pipeline exists (test_matmul_pipelined, test_conv_pipelined): cp.async copies
into at least two shared-memory stages of the operand tiles, which needs the 16-byte alignment
facts the plans prove (matmul XC/YC, dgrad WVEC).

The compiles run in two worker subprocesses with TRITON_INTERPRET unset (under the interpreter
`triton.jit` makes interpreter objects, which `triton.compile` cannot take).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import triton_sm90 as sm90

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
OPS = ("matmul_backward", "conv_backward_data", "conv_backward_weight")
_TORCH_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
SPILL_LIMIT = 16  # bytes a thread may spill (a value parked across the loop; as binary_backward's tuner allows)
_ITEM = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}  # bytes per element of a pointer's triton type
_TRITON_TY = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64", "int32": "i32"}


def _candidate_count(op: str, case) -> int:
    """How many tiles the autotuner tries on this case on CUDA."""
    from backends.triton import _conv
    from harness.registry import get_op

    item = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}[case.dtype]
    if op == "matmul_backward":  # the perf cases' products all take the aligned path: one launch for both
        from backends.triton import matmul_backward as mmb

        return len(mmb.candidates(item, True))
    from backends.triton import conv_backward_data as cbd, conv_backward_weight as cbw

    shapes = get_op(op).shapes(case)
    x, w = ("dx", "w") if op == "conv_backward_data" else ("x", "dw")
    geo = _conv.geometry3(shapes[x], shapes["dy"], shapes[w], case.params, case.params.get("layout") == "channels_last")
    unit = case.params.get("layout") == "channels_last" and all(
        case.params.get(k, "contig") == "contig" for k in ("dy_layout", "w_layout", "x_layout"))
    return len((cbd if op == "conv_backward_data" else cbw).candidates(geo, item, "cuda", unit))


F32_MM = "matmul[f32,A=1024x1024,B=1024x1024]"


def _staged_job() -> str:
    """float32 1024^3 with its first staged candidate (da reads transposed copies of dy and b)."""
    sys.path.insert(0, str(ROOT))
    from backends.triton import matmul_backward as mmb

    return f"matmul_backward|{F32_MM}|{next(i for i, t in enumerate(mmb.candidates(4, True, True)) if t.stage)}"


STAGED_JOB = _staged_job()


def _jobs() -> list[str]:
    """op|case id|tile index ("0": the default): the default of every bfloat16 and float32 perf case
    (float16 compiles the bfloat16 code with another element type), and every candidate of
    the op's first channels-last bfloat16 perf case with more than one channel (matmul: 1024^3)."""
    sys.path.insert(0, str(ROOT))
    from cases import select

    jobs = [STAGED_JOB]
    for op in OPS:
        tuned = False
        for case in select("perf", op=op):
            if case.dtype == "f16":
                continue
            jobs.append(f"{op}|{case.id}|0")
            if case.dtype == "bf16" and not tuned and "C=1->1" not in case.id and (
                    op == "matmul_backward" or case.params.get("layout") == "channels_last"):
                tuned = True
                jobs += [f"{op}|{case.id}|{i}" for i in range(1, _candidate_count(op, case))]
    return jobs


JOBS = _jobs()

# ----------------------------------------------------------------------------- worker side


def _meta(shape, layout: str, dtype):
    """A meta tensor of `shape` with the strides harness.tensors gives `layout` (no data)."""
    import torch

    from harness.tensors import contiguous_strides

    shape = tuple(shape)
    if layout == "transposed":
        stored = shape[:-2] + (shape[-1], shape[-2])
        st = list(contiguous_strides(stored))
        st[-1], st[-2] = st[-2], st[-1]
    elif layout == "sliced":
        st = list(contiguous_strides(shape[:-1] + (2 * shape[-1] + 1,)))
        st[-1] = 2
    else:
        st = contiguous_strides(shape)
    return torch.empty_strided(shape, tuple(st), dtype=dtype, device="meta")


def _launches(op: str, case, force: int) -> list:
    """[(Launch, pointer dtypes of its tensors)] of the case's plan with candidate tile `force`."""
    import torch

    from harness.registry import get_op

    spec = get_op(op)
    shapes = spec.shapes(case)
    dt = getattr(torch, _TORCH_DT[case.dtype])
    p = case.params
    t = {k: _meta(shapes[k], p.get(f"{k}_layout", "contig"), dt) for k in spec.inputs}
    t.update({k: _meta(shapes[k], "contig", dt) for k in spec.outputs})
    ty = str(dt).split(".")[1]
    if op == "matmul_backward":
        from backends.triton import matmul_backward as mod

        plan = mod._plan(t["a"], t["b"], t["dy"], t["da"], t["db"], False, force)
        # _gemm_kernel: x, y, c and two offset tables; _gemm2_kernel: x0, y0, c0, x1, y1, c1 and four
        return [(p.launch, [ty] * 3 + ["int64"] * 2 if p.launch.n_tensors == 5 else [ty] * 6 + ["int64"] * 4)
                for p in plan.products]
    cl = p.get("layout") == "channels_last"
    if op == "conv_backward_data":
        from backends.triton import conv_backward_data as mod

        plan = mod._plan(t["dy"], t["w"], t["dx"], p, cl, False, force)
        return [(plan.launch, [ty] * 3 + ["int32"])] + _staging(plan, ty)
    from backends.triton import conv_backward_weight as mod

    plan = mod._plan(t["dy"], t["x"], t["dw"], p, cl, False, force)
    acc = "float64" if case.dtype == "f64" else "float32"
    if plan.finish is None:
        return [(plan.main, [ty] * 3)] + _staging(plan, ty)
    return [(plan.main, [ty, ty, acc]), (plan.finish, [acc, ty])] + _staging(plan, ty)


def _staging(plan, ty: str) -> list:
    """The channels-first staging copies of a conv plan (_conv.Repack), if it has them."""
    return [(r.step, [ty, ty]) for r in plan.stage or ()]


def _compile(launch, ptr_types) -> dict:
    kernel = launch.kernel
    names = list(kernel.arg_names)
    ptrs = {names[i]: _TRITON_TY[t] for i, t in enumerate(ptr_types[:launch.n_tensors])}
    values = dict(zip(names[launch.n_tensors:], launch.tail))
    constexpr_names = {p.name for p in kernel.params if p.is_constexpr}
    signature, constexprs, attrs = sm90.launch_signature(
        kernel, ptrs, values, {k: v for k, v in values.items() if k in constexpr_names})
    compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, launch.num_warps, **launch.options)
    r = sm90.ptxas_report(compiled.asm["ptx"])
    ptx = compiled.asm["ptx"]
    return {"kernel": kernel.__name__, "cubin": len(compiled.asm.get("cubin", b"")),
            "mma": bool(re.search(r"\b(w?gmma|mma)\.", ptx)), "wgmma": "wgmma" in ptx, "regs": r["regs"],
            "spills": r["spill_stores"], "warps": launch.num_warps, "stages": launch.options.get("num_stages"),
            "shared": int(compiled.metadata.shared), "item": _ITEM[ptrs[names[0]]],
            # asynchronous global -> shared copies: cp.async (16-byte vectors) or TMA (cp.async.bulk)
            "cp_async": len(re.findall(r"\bcp\.async\.(?:ca|cg|bulk)", ptx)),
            "lds_scalar": len(re.findall(r"\bld\.shared\.b32\b", ptx)),  # 4-byte shared loads (FMA dot)
            "constexprs": {k: v for k, v in constexprs.items() if k in constexpr_names}}


def _compile_job(job: str, by_id: dict, cache: dict) -> list:
    op, cid, force = job.split("|")
    res = []
    for launch, ptrs in _launches(op, by_id[(op, cid)], int(force)):
        key = (launch.signature(), tuple(ptrs))
        if key not in cache:
            cache[key] = _compile(launch, ptrs)
        res.append(cache[key])
    return res


def _worker(jobs: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from cases import select

    by_id = {(c.op, c.id): c for op in OPS for c in select("perf", op=op)}
    cache = {}
    sm90.worker(jobs, lambda job: _compile_job(job, by_id, cache), error=lambda msg: [{"error": msg}])


# ----------------------------------------------------------------------------- test side


@pytest.fixture(scope="module")
def compiled() -> dict:
    return sm90.run_workers(__file__, "--worker", [JOBS[i::2] for i in range(2)], timeout=1200)


@pytest.mark.parametrize("job", JOBS)
def test_compiles_for_sm90(compiled, job):
    for r in compiled[job]:
        assert "error" not in r, r.get("error")
        assert r["cubin"] > 0, f"{job}: no cubin"


@pytest.mark.parametrize("job", [j for j in JOBS if j.endswith("|0")])
def test_default_tiles(compiled, job):
    """16-bit GEMM launches run on the tensor cores; default tiles spill at most SPILL_LIMIT bytes."""
    for r in compiled[job]:
        assert "error" not in r, r.get("error")
        if r["kernel"] not in ("_finish_kernel", "_repack_kernel") and not r["constexprs"].get("EW") and (
                "bf16" in job or "f16" in job):
            assert r["mma"], f"{job}: {r['kernel']} has no mma/wgmma: not on the tensor cores"
        assert r["spills"] <= SPILL_LIMIT, f"{job}: {r['kernel']} spills {r['spills']} bytes ({r['regs']} registers)"


REGS_MAX = 232  # registers per thread a matmul tile may use (255 is ptxas's ceiling: no room left)


@pytest.mark.parametrize("job", [j for j in JOBS if j.startswith("matmul_backward|")])
def test_matmul_pipelined(compiled, job):
    """Every matmul perf case's default tile, and every candidate the tuner may pick, compiles to a
    software pipeline: asynchronous 16-byte copies (cp.async or TMA) of both operands into at least
    two shared-memory stages of the BM x BK and BK x BN tiles; wgmma for 16-bit inputs; no spills."""
    for r in compiled[job]:
        assert "error" not in r, r.get("error")
        c = r["constexprs"]
        # _gemm2_kernel: da's tile (BM0 x BN0) and db's (BM1 x BN1) in branches sharing the memory
        stage = max((c[f"BM{s}"] * c["BK"] + c["BK"] * c[f"BN{s}"]) * r["item"]
                    for s in (("",) if "BM" in c else ("0", "1")))
        codes = {k: v for k, v in c.items() if k[:2] in ("XC", "YC")}
        assert r["shared"] >= 2 * stage, (f"{job}: {r['shared']} bytes of shared memory: fewer than 2 stages of "
                                          f"{stage} ({codes}): the loads are not pipelined")
        assert r["cp_async"] > 0, f"{job}: no cp.async in the PTX: the operand loads are not asynchronous copies"
        if r["item"] == 2:
            assert r["wgmma"], f"{job}: no wgmma"
        assert r["spills"] == 0, f"{job}: spills {r['spills']} bytes ({r['regs']} registers)"
        assert r["regs"] is None or r["regs"] <= REGS_MAX, f"{job}: {r['regs']} registers per thread"


def test_matmul_f32_staged_reads_shared_memory_as_vectors(compiled):
    """float32's dot runs on the FMA units: with row-major dy and b, da's tiles are K-major and the
    default plan reads them from shared memory one element at a time; the staged plan's da reads
    transposed copies, all vectors.  (db's branch reads vectors in both.)"""
    default, staged = compiled[f"matmul_backward|{F32_MM}|0"], compiled[STAGED_JOB]
    assert [r["kernel"] for r in staged] == ["_gemm2_kernel"], staged
    assert staged[0]["constexprs"]["XC0"] == 2 and staged[0]["constexprs"]["YC0"] == 2, staged[0]["constexprs"]
    assert default[0]["lds_scalar"] > 0, default[0]
    assert staged[0]["lds_scalar"] == 0, staged[0]


def _aligned_conv_jobs() -> list[str]:
    """16-bit and float32 conv jobs whose tensor-core tiles can all be 16-byte vectors: every
    tensor contiguous in its layout (channels first is staged to channels last, _conv.Repack),
    and Cin/g, Cout/g multiples of 16 bytes.  Not here: strided views of channels-first tensors
    (not staged: their tiles are gathers)."""
    from cases import select

    by_id = {(c.op, c.id): c for op in OPS[1:] for c in select("perf", op=op)}
    out = []
    for job in JOBS:
        op, cid, _ = job.split("|")
        if op == "matmul_backward" or by_id[(op, cid)].dtype == "f64":
            continue
        p, vec = by_id[(op, cid)].params, 16 // sm90.ITEM[by_id[(op, cid)].dtype]
        g = p.get("groups", 1)
        if (all(p.get(k, "contig") == "contig" for k in ("dy_layout", "w_layout", "x_layout"))
                and (p["cin"] // g) % vec == 0 and (p["cout"] // g) % vec == 0):
            out.append(job)
    return out


@pytest.mark.parametrize("job", _aligned_conv_jobs())
def test_conv_pipelined(compiled, job):
    """The tensor-core launches of aligned conv cases, channels last or staged channels first
    (default tiles and the tuner's candidates), pipeline both operands: cp.async into at least two
    stages of the tiles; wgmma."""
    for r in compiled[job]:
        assert "error" not in r, r.get("error")
        c = r["constexprs"]
        if r["kernel"] in ("_finish_kernel", "_repack_kernel") or c.get("EW"):
            continue
        stage = (c["BM"] * c["BK"] + c["BK"] * c["BN"]) * r["item"]
        assert r["shared"] >= 2 * stage, (f"{job}: {r['kernel']}: {r['shared']} bytes of shared memory: fewer "
                                          f"than 2 stages of {stage}: the loads are not pipelined")
        assert r["cp_async"] > 0, f"{job}: {r['kernel']}: no cp.async in the PTX"
        if r["item"] == 2:
            assert r["wgmma"], f"{job}: {r['kernel']}: no wgmma"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2:])
