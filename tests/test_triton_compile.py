"""Compile every Triton kernel of the `triton` backend for sm_90 (H100) with no GPU.

Each job is one kernel with the launch parameters that backends/triton/binary_backward.py would
choose for a real shape (main kernel: every fn and dtype; other code paths: every dtype
with one fn).  For each we check that a cubin comes out, that every pointer offset is
int64 (tensors over 2**31 elements), and, for the main patterns, that loads vectorise.

The compiles run in worker subprocesses with TRITON_INTERPRET unset.  Under
TRITON_INTERPRET=1 (which the test session sets on GPU-less machines before triton is
imported) `triton.jit` makes interpreter objects, and so do the kernels' callees, which
`triton.compile` cannot take; a fresh process gets real JITFunctions.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import triton_sm90 as sm90
from oracle.binary_backward import FNS

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("f32", "f16", "bf16", "f64")
_TRITON_TY, _ITEM = sm90.TRITON_TY, sm90.ITEM

# Shapes (A, B, strides of a, b, g or None for contiguous) whose tile plans cover the paths
# of _tile_kernel.  'rows' is the main kernel and compiles for every fn.
TILE_SHAPES = {
    "rows": ((8, 2048, 4096), (4096,), None),            # K on the contiguous axis, grad_b in partials
    "last": ((8, 2048, 4096), (8, 2048, 1), None),       # RB on the contiguous axis, direct outputs
    "mid": ((8, 2048, 4096), (8, 1, 4096), None),        # K of two dims, row starts from the descriptor
    "a_bcast": ((4096,), (64, 4096), None),              # loops over RA (the mirrored branch)
    "both": ((64, 1, 128), (1, 32, 128), None),          # RA and RB: both reductions in one program
    "outer": ((4096, 1), (1, 64), None),                 # RA contiguous, grad_b in partials
    "strided": ((64, 48), (48,), ((48, 1), (1,), (1, 64))),  # transposed grad_out: generic unravel
    "interleaved": ((8, 1, 16, 1, 32), (1, 8, 1, 16, 32), None),  # two dims in each of RA and RB
    # _batch_kernel: both broadcast, the summed rows contiguous (the perf cases' shapes), and the mirror
    "bb": ((1, 2048, 4096), (8, 2048, 1), None),
    "bb_mirror": ((8, 2048, 1), (1, 2048, 4096), None),
}
TILE_FN = {"strided": "mul", "last": "pow", "mid": "maximum", "a_bcast": "div", "both": "sub",
           "outer": "minimum", "interleaved": "add", "bb_mirror": "pow"}
VECTORISED = ("flat", "tile-rows", "tile-last", "tile-mid", "tile-bb", "cand")  # must emit ld.global.v*
# The autotuner's other candidates (backends/triton/binary_backward.py `candidates`) for the
# main shapes: 'flat' is the no-broadcast llama shape.  Index 0, the default, is compiled above.
CANDIDATE_SHAPES = ("flat", "rows", "last", "mid", "bb")


def _jobs() -> list[str]:
    jobs = [f"flat-{dt}-{fn}" for dt in DTYPES for fn in FNS]
    jobs += [f"tile-rows-{dt}-{fn}" for dt in DTYPES for fn in FNS]
    jobs += [f"tile-{label}-{dt}-{fn}" for label, fn in TILE_FN.items() for dt in DTYPES]
    jobs += [f"tile-bb-{dt}-{fn}" for dt in DTYPES for fn in FNS]  # the batch kernel, every fn
    jobs += [f"stage2-{dt}-sum" for dt in DTYPES]
    jobs += [f"cand-{label}-{i}-{dt}-mul" for label in CANDIDATE_SHAPES for dt in ("bf16", "f32")
             for i in range(1, _candidate_count(label, _ITEM[dt]))]
    # candidates only add and sub get (they read grad_out alone: wider tiles)
    jobs += [f"cand-{label}-{i}-{dt}-{fn}" for label in CANDIDATE_SHAPES for dt in ("bf16", "f32")
             for fn in ("add", "sub") for i in range(_candidate_count(label, _ITEM[dt]),
                                                     _candidate_count(label, _ITEM[dt], fn))]
    return jobs


def _bplan(label: str):
    from backends._plans import binary_backward as _bcast_plan

    a_shape, b_shape, strides = TILE_SHAPES[label] if label != "flat" else ((8, 2048, 4096),) * 2 + (None,)
    out_shape = _bcast_plan.broadcast_shape(a_shape, b_shape)
    contig = _bcast_plan.contiguous_strides
    sa, sb, sg = strides or (contig(a_shape), contig(b_shape), contig(out_shape))
    return _bcast_plan.make_plan(a_shape, b_shape, sa, sb, sg)


def _candidate_count(label: str, item: int, fn: str = "mul") -> int:
    sys.path.insert(0, str(ROOT))
    from backends.triton import binary_backward as tk

    return len(tk.candidates(tk.tune_class(_bplan(label), item, fn)))


JOBS = _jobs()

# ----------------------------------------------------------------------------- worker side


def _launch_args(job: str):
    """(kernel, pointer dtypes, int args, constexprs, num_warps) as the backend would launch it."""
    from backends.triton import binary_backward as tk

    kind, rest = job.split("-", 1)
    *label, dt, fn = rest.split("-")
    ty, item, cfg = _TRITON_TY[dt], _ITEM[dt], tk.GPU_CONFIG
    acc = "fp64" if dt == "f64" else "fp32"
    if kind == "cand":
        plan = _bplan(label[0])
        cfg = tk.candidates(tk.tune_class(plan, item, fn))[int(label[1])]
        kind = "flat" if label[0] == "flat" else "tile"
    if kind == "flat":
        if not label:  # the default sizing of this fn's flat class (pow's is smaller)
            cfg = tk.candidates(tk.tune_class(_bplan("flat"), item, fn))[0]
        block, warps = tk.flat_block(8 * 2048 * 4096, item, cfg)
        ptrs = dict.fromkeys(("a_ptr", "b_ptr", "g_ptr", "ga_ptr", "gb_ptr"), ty)
        return (tk._flat_kernel, ptrs, {"n": 8 * 2048 * 4096},
                {"FN": fn, "IS_F64": dt == "f64", "BLOCK": block}, warps)
    if kind == "stage2":
        acc_item = _ITEM["f64" if dt == "f64" else "f32"]
        bp, bn = tk.stage2_blocks(64, 4096, acc_item, cfg)
        return (tk._sum_partials_kernel, {"ws_ptr": acc, "out_ptr": ty}, {"n": 4096, "parts": 64},
                {"BP": bp, "BN": bn}, tk.stage2_warps(bp, bn, acc_item, cfg))
    plan = _bplan(label[0])
    launch = tk.plan_tile(plan, item, fn, cfg)
    ptrs = dict.fromkeys(("a_ptr", "b_ptr", "g_ptr", "ga_ptr", "gb_ptr"), ty)
    ptrs.update(wsa_ptr=acc if launch.parts_a > 1 or launch.scratch_a else ty,
                wsb_ptr=acc if launch.parts_b > 1 or launch.scratch_b else ty, desc_ptr="i64")
    kernel = tk._batch_kernel if launch.kernel == "batch" else tk._tile_kernel
    return kernel, ptrs, launch.ints, launch.constexprs, launch.num_warps


def _compile(job: str) -> dict:
    kernel, ptrs, ints, constexprs, warps = _launch_args(job)
    # the only ints the backend lets triton specialise
    signature, attrs = sm90.signature(kernel, ptrs, constexprs,
                                      lambda i, name: name in ("n", "cols") and ints[name] % 16 == 0)
    compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, warps)
    # registers and spills, as triton's own ptxas call reports them
    r = sm90.ptxas_report(compiled.asm["ptx"], "-lineinfo", "--regAllocOptLevel=2")
    addptrs, narrow = sm90.pointer_offsets(compiled.asm["ttir"])
    return {
        "cubin": len(compiled.asm.get("cubin", b"")),
        "narrow_offsets": narrow,
        "addptrs": addptrs,
        "vector_loads": sorted(set(re.findall(r"ld\.global(?:\.\w+)*\.v\d\.\w+", compiled.asm["ptx"]))),
        "regs": r["regs"],
        "spills": r["spill_stores"],
        "warps": warps,
    }


# ----------------------------------------------------------------------------- test side


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Compile all jobs in two worker processes (this machine has two cores)."""
    return sm90.run_workers(__file__, "--worker", [JOBS[i::2] for i in range(2)], timeout=900)


@pytest.mark.parametrize("job", JOBS)
def test_compiles_for_sm90(compiled, job):
    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["cubin"] > 0, f"{job}: no cubin"


@pytest.mark.parametrize("job", JOBS)
def test_offsets_are_int64(compiled, job):
    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["addptrs"] > 0
    assert not r["narrow_offsets"], f"{job}: pointer offsets of type {r['narrow_offsets']} overflow past 2**31"


@pytest.mark.parametrize("job", [j for j in JOBS if j.startswith(VECTORISED)])
def test_main_patterns_vectorise(compiled, job):
    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["vector_loads"], f"{job}: no vectorised global loads in the PTX"


@pytest.mark.parametrize("job", JOBS)
def test_no_spills(compiled, job):
    """No launch the backend plans (default sizings and every autotune candidate) spills
    registers, beyond a value parked across a loop (SPILL_LIMIT bytes)."""
    from backends.triton import binary_backward as tk

    r = compiled[job]
    assert "error" not in r, r.get("error")
    assert r["regs"], f"{job}: ptxas reported no register count"
    assert r["spills"] <= tk.SPILL_LIMIT, f"{job}: {r['spills']} bytes of spill stores at {r['regs']} registers"


@pytest.mark.parametrize("job", [j for j in JOBS if j.startswith(("tile-rows", "tile-last", "tile-mid", "tile-a_bcast"))
                                 and j.split("-")[-1] in ("mul", "add", "div", "maximum")
                                 and j.split("-")[-2] in ("bf16", "f16", "f32")])
def test_main_patterns_keep_many_warps_resident(compiled, job):
    """The register diet: the main broadcast patterns' tile kernels leave room for at least 24
    resident warps per SM (a quarter of 64 K registers would allow 16 at 128 registers)."""
    from backends.triton._steps import programs_per_sm

    r = compiled[job]
    assert "error" not in r, r.get("error")
    warps = programs_per_sm(r["regs"], 0, r["warps"]) * r["warps"]
    assert warps >= 24, f"{job}: {r['regs']} registers x {r['warps']} warps: {warps} warps per SM"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sm90.worker(sys.argv[2:], _compile)
