"""Compile the `triton` backend's reduce_sum kernels for sm_90 (H100) with no GPU.

Each job is one perf case of reduce_sum (plus float64 versions of the main shapes) under one
finish ("rows", "last", "kernel"; and the presets "stages3", "tiles"), planned as the backend plans it on an H100: 132 SMs, and the
programs per SM of each split variant from its register count, which here comes from
ptxas -v on the variant's PTX (on the GPU, from the loaded kernel).  For each we check
that a cubin comes out, that every pointer offset is int64 (tensors over 2**31 elements),
that the loads of x are 16-byte vectors, and that split launches are one wave of
programs that all fit on the SMs at once.

The compiles run in worker subprocesses with TRITON_INTERPRET unset: under
TRITON_INTERPRET=1 `triton.jit` makes interpreter objects, which `triton.compile` cannot take.
"""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from math import prod
from pathlib import Path

import pytest

import triton_sm90 as sm90

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
SMS = 132
_TRITON_TY, _ITEM = sm90.TRITON_TY, sm90.ITEM
FINISHES = ("rows", "last", "kernel")
# float64 versions of the main shapes (no perf case is float64): full, column and row sums.
F64 = [("f64", [1 << 24], {"axes": None}), ("f64", [8192, 4096], {"axes": [0]}), ("f64", [8192, 4096], {"axes": [1]})]


def _requests() -> dict:
    """label -> (dtype, shape, strides, params) of every shape compiled."""
    sys.path.insert(0, str(ROOT))
    from cases import select

    out = {}
    for case in select("perf", op="reduce_sum"):
        shape = case.params["shape"]
        strides = [prod(shape[i + 1:]) for i in range(len(shape))]
        if case.params.get("x_layout") == "transposed":
            strides[-1], strides[-2] = shape[-2], 1  # the last two dims swapped in memory
        params = {k: v for k, v in case.params.items() if k in ("axes", "keepdim", "target")}
        out[case.id] = (case.dtype, shape, strides, params)
    for dt, shape, params in F64:
        out[f"{dt}{shape}{params}"] = (dt, shape, [prod(shape[i + 1:]) for i in range(len(shape))], params)
    return out


# Sizings the GPU batches weigh against the default (reduce_sum.PRESETS): the software-pipelined
# loop "stages3" and finish "tiles"; every perf shape must compile for them too.
PRESET_JOBS = ("stages3", "tiles")
JOBS = [f"{finish}|{label}" for label in _requests() for finish in FINISHES + PRESET_JOBS]

# ----------------------------------------------------------------------------- worker side

_COMPILED: dict = {}


def _compile(kernel, ptrs: dict, ints: dict, constexprs: dict, warps: int) -> dict:
    """Compile one variant for sm_90 (cached) and read its PTX and register count."""
    skip = sm90.no_specialise(kernel)
    key = (kernel.__name__ if hasattr(kernel, "__name__") else str(kernel), tuple(sorted(ptrs.items())),
           tuple(sorted(constexprs.items())), warps,
           tuple(sorted((k, v % 16 == 0) for k, v in ints.items() if k not in skip)))
    if key in _COMPILED:
        return _COMPILED[key]
    # what the launcher specialises: ints divisible by 16 that the kernel lets it
    signature, attrs = sm90.signature(kernel, ptrs, constexprs,
                                      lambda i, name: name not in skip and ints[name] % 16 == 0)
    compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, warps)
    ptx = compiled.asm["ptx"]
    addptrs, narrow = sm90.pointer_offsets(compiled.asm["ttir"])
    r = sm90.ptxas_report(ptx, "--regAllocOptLevel=2")
    out = {
        "cubin": len(compiled.asm.get("cubin", b"")),
        "narrow_offsets": narrow,
        "addptrs": addptrs,
        # the loads of x: plain ld.global (the partials are read with .cg)
        "x_loads": sorted(set(re.findall(r"ld\.global\.(?:v\d\.)?[bf]\d+", ptx))),
        # the pipelined loop (STAGES) reads x with asynchronous copies to shared memory: their byte counts
        "async_copies": sorted(set(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*\], (0x[0-9a-f]+|\d+)", ptx))),
        "regs": r["regs"],
        "spills": r["spill_stores"],
        "shared": int(compiled.metadata.shared),
    }
    _COMPILED[key] = out
    return out


def _pointers(L, dt: str) -> dict:
    ty, acc = _TRITON_TY[dt], "fp64" if dt == "f64" else "fp32"
    finish = L.constexprs["FINISH"]
    return {"x_ptr": ty, "y_ptr": ty, "ws_ptr": acc if finish else ty,
            "cnt_ptr": "i32" if finish >= 2 else (acc if finish else ty), "desc_ptr": "i64"}


def _job(job: str) -> dict:
    from backends.triton import reduce_sum as rs

    finish, label = job.split("|", 1)
    dt, shape, strides, params = _requests()[label]
    cfg = rs.PRESETS[finish] if finish in PRESET_JOBS else replace(rs.GPU_CONFIG, finish=finish)
    kernels = rs._KERNELS

    def occupancy(L):  # as the GPU planner asks it: the split variant's registers and shared memory
        ints = dict(L.ints, chunks=2)
        r = _compile(kernels[L.kernel], _pointers(L, dt), ints, L.constexprs, L.num_warps)
        return rs.programs_per_sm(r["regs"], r["shared"], L.num_warps) if r["regs"] else None

    L = rs.plan_request(shape, strides, _ITEM[dt], params, cfg, SMS, occupancy)
    r = dict(_compile(kernels[L.kernel], _pointers(L, dt), L.ints, L.constexprs, L.num_warps))
    r.update(kernel=L.kernel, grid=L.grid, chunks=L.chunks, warps=L.num_warps,
             occupancy=rs.programs_per_sm(r["regs"], r["shared"], L.num_warps) if r["regs"] else None)
    if L.stage2 is not None:
        grid, bp, bn, warps = L.stage2
        acc = "fp64" if dt == "f64" else "fp32"
        s2 = _compile(rs._stage2_kernel, {"ws_ptr": acc, "y_ptr": _TRITON_TY[dt]},
                      {"n_y": L.n_y, "parts": L.chunks}, {"BP": bp, "BN": bn}, warps)
        r["stage2"] = {k: s2[k] for k in ("cubin", "narrow_offsets", "addptrs")}
    return r


# ----------------------------------------------------------------------------- test side


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Compile all jobs in two worker processes (this machine has two cores): finish "kernel" in one,
    the rest in the other, so each worker's cache serves the shapes that share a variant."""
    groups = [[j for j in JOBS if j.startswith("kernel|")], [j for j in JOBS if not j.startswith("kernel|")]]
    return sm90.run_workers(__file__, "--worker", groups, timeout=900)


def _ok(compiled, job) -> dict:
    r = compiled[job]
    assert "error" not in r, r.get("error")
    return r


@pytest.mark.parametrize("job", JOBS)
def test_compiles_for_sm90(compiled, job):
    r = _ok(compiled, job)
    assert r["cubin"] > 0, f"{job}: no cubin"
    if "stage2" in r:
        assert r["stage2"]["cubin"] > 0, f"{job}: no cubin for the stage-2 kernel"
    assert not job.startswith("kernel") or r["chunks"] == 1 or "stage2" in r


@pytest.mark.parametrize("job", JOBS)
def test_offsets_are_int64(compiled, job):
    r = _ok(compiled, job)
    for part in (r, r.get("stage2")):
        if part:
            assert part["addptrs"] > 0
            assert not part["narrow_offsets"], f"{job}: pointer offsets of type {part['narrow_offsets']} overflow"


@pytest.mark.parametrize("job", JOBS)
def test_loads_are_16_byte_vectors(compiled, job):
    r = _ok(compiled, job)
    wide = [ld for ld in r["x_loads"] if ld in ("ld.global.v4.b32", "ld.global.v2.b64")]
    if job.split("|")[0] == "stages3":
        wide = [n for n in r["async_copies"] if int(n, 0) == 16]
    assert wide, f"{job}: x is not read in 16-byte vectors: {r['x_loads']}, async copies {r['async_copies']}"


@pytest.mark.parametrize("job", JOBS)
def test_no_spills(compiled, job):
    r = _ok(compiled, job)
    assert r["spills"] == 0, f"{job}: {r['spills']} bytes of spill stores at {r['regs']} registers"


@pytest.mark.parametrize("job", JOBS)
def test_split_launches_are_one_resident_wave(compiled, job):
    """A split launch sized from the variant's own occupancy: every program resident at once,
    at least three 16 KiB tiles in flight per SM; no occupancy below 3 anywhere."""
    r = _ok(compiled, job)
    assert r["regs"] and r["occupancy"] >= 3, f"{job}: {r['regs']} registers, {r['occupancy']} programs per SM"
    if r["chunks"] > 1:
        assert r["grid"] <= SMS * r["occupancy"], f"{job}: grid {r['grid']} over one wave"
        assert r["grid"] >= SMS * r["occupancy"] * 3 // 4, f"{job}: grid {r['grid']} leaves SMs idle"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sm90.worker(sys.argv[2:], _job)
