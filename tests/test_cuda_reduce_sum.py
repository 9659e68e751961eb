"""The reduce_sum CUDA kernels (backends/cuda/reduce_sum.cuh) and the cupy backend's host side
(backends/cupy/reduce_sum.py), without a GPU.

* Compile checks: every instantiation (each ladder rung and best kernel x dtype) compiles for
  sm_90 with NVRTC, and with `nvcc -cubin` when nvcc exists; RSParams has the layout the host packs.
* The planner, pure Python: the collapsed (outer, reduced, inner) plan of every form, the kernel,
  lanes, chunks and grid chosen for the perf cases, the ladder's passes and its SKIP reasons.
* The host side run for real against an emulator: `run_best` / `run_rung` (the code the backend
  runs) launch kernels on `EmuDevice`, whose kernels are line-by-line Python ports of the .cuh
  kernels, thread by thread (float64 arithmetic: indexing and structure are checked, not
  rounding).  Results must match the float64 oracle; every output element and partial is
  written exactly once per launch; 16-byte loads and stores must be aligned; tickets must be
  back at zero after each launch; blocks run in a random order, and two orders must give the
  same bits (the last-block finish is deterministic whichever block finishes last).
* The backend surface: availability, argument checks, the plan cache, no cupy import.
"""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from backends.cupy import nvrtc as _nvrtc
from backends.cupy import reduce_sum as rs
from cases import select
from harness.tensors import from_values
from oracle.reduce_sum import out_shape, reduce_sum_numpy
from nvrtc_mark import needs_nvrtc
from nvrtc_ptxas import ptxas_usage

SOURCE = _nvrtc.read_source(rs.SOURCE)
ITEMSIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}


# ============================================================================= compile checks


@needs_nvrtc
@pytest.mark.parametrize("dt", rs.DTYPES)
def test_nvrtc_compiles_every_instantiation(dt):
    exprs = rs.all_kernel_exprs(dt)
    n_pairs = 1 if dt in ("f32", "f64") else 4  # (T, A), (T, T), (A, A), (A, T) without repeats
    assert len(exprs) == len(set(exprs)) == len(rs.RUNGS) * n_pairs + 3 * 4
    cubin, lowered = _nvrtc.compile_cubin(SOURCE, arch="sm_90", name_expressions=exprs)
    for expr in exprs:
        assert lowered[expr].encode() in cubin, f"{expr} ({lowered[expr]}) missing from the cubin"


def _ptxas(exprs, options=()) -> dict[str, tuple[int, int]]:
    """{name expression: (registers, spill store bytes)} of reduce_sum.cuh's kernels on sm_90."""
    return ptxas_usage(SOURCE, "rs.cu", exprs, options)


@needs_nvrtc
def test_best_kernels_fit_four_blocks_per_sm():
    """rs_row_team (every instantiation) and rs_col's SIMPLE ones are built for 4 resident 256-thread
    blocks per SM: at most 64 registers (the transposed bias gradient's 4096 teams then fit one
    wave; the plan takes the driver's occupancy), spills at most a few dozen bytes (only the
    general 16-bit team kernels spill at all); GRADORACLE_CUPY_RS=teamblocks=1 drops the bound."""
    exprs = [rs.kernel_expr(k, dt, vec, simple) for k in ("row_team", "col") for dt in rs.DTYPES
             for vec in (False, True) for simple in (False, True) if k == "row_team" or simple]
    report = _ptxas(exprs)
    assert set(report) == set(exprs)
    for expr, (regs, spill) in report.items():
        assert regs <= 64, (expr, regs)
        assert spill <= (32 if expr.startswith("rs_row_team") else 0), (expr, spill)
    team = rs.kernel_expr("row_team", "bf16", True, False)
    assert _ptxas([team], rs.build_options("teamblocks=1"))[team][0] > 64  # the bound is what holds it


def test_build_options():
    assert rs.build_options("") == ()
    assert rs.build_options("teamblocks=1, colblocks=3") == ("-DRS_TEAM_MIN_BLOCKS=1", "-DRS_COL_MIN_BLOCKS=3")
    for bad in ("teamblocks=0", "teamblocks=x", "blocks=2"):
        with pytest.raises(ValueError, match=rs.ENV):
            rs.build_options(bad)


@needs_nvrtc
def test_params_layout_matches_host_packing():
    # Every field is long long (no padding): a constant built in declaration order and read back by
    # name pins each field's position to the host's word order.
    md = rs.MAX_DIMS
    def arr(first):
        return "{" + ", ".join(str(first + i) for i in range(md)) + "}"

    group = f"{{1, 2, {arr(10)}, {arr(20)}, {arr(30)}}}"
    fields = ", ".join(str(100 + i) for i in range(len(rs.FIELDS)))
    checks = "\n".join(f'static_assert(kProbe.{name} == {100 + i}, "{name}");' for i, name in enumerate(rs.FIELDS))
    probe = SOURCE + f"""
static_assert(RS_BLOCK == {rs.BLOCK}, "BLOCK");
static_assert(RS_MAX_DIMS == {md}, "MAX_DIMS");
static_assert(RS_UNROLL == {rs.UNROLL}, "UNROLL");
static_assert(sizeof(RSParams) == {rs.PARAMS_WORDS} * 8, "RSParams size");
static_assert(sizeof(RSGroup) == {rs.GROUP_WORDS} * 8, "RSGroup size");
constexpr RSGroup kGroup = {group};
static_assert(kGroup.ndim == 1 && kGroup.numel == 2 && kGroup.size[{md - 1}] == {10 + md - 1}, "RSGroup head");
static_assert(kGroup.xs[0] == 20 && kGroup.ys[0] == 30 && kGroup.ys[{md - 1}] == {30 + md - 1}, "RSGroup strides");
constexpr RSParams kProbe = {{kGroup, {{3, 4}}, {fields}}};
static_assert(kProbe.outer.numel == 2 && kProbe.red.ndim == 3 && kProbe.red.numel == 4, "groups");
{checks}
"""
    cubin, _ = _nvrtc.compile_cubin(probe, name_expressions=["rs_v0<float, float>"])
    assert cubin
    assert rs.PARAMS_DTYPE.itemsize == rs.PARAMS_WORDS * 8 and rs.PARAMS_WORDS == 2 * rs.GROUP_WORDS + len(rs.FIELDS)


def _nvcc_instantiations(dt: str) -> str:
    """A .cu that explicitly instantiates every kernel of the .cuh for one dtype."""
    t, a = rs.CUDA_TYPE[dt], rs.acc_type(dt)
    lines = [f'#include "{_nvrtc.CUDA_DIR / rs.SOURCE}"']
    for rung in rs.RUNGS:
        for ti, to in sorted({(t, a), (t, t), (a, a), (a, t)}):
            lines.append(f"template __global__ void rs_{rung}<{ti}, {to}>(const {ti}*, {to}*, long long, long long, "
                         f"long long);")
    for vec in ("true", "false"):
        for simple in ("true", "false"):
            targs = f"{t}, {vec}, {simple}"
            lines += [
                f"template __global__ void rs_row_team<{targs}>(const __grid_constant__ RSParams, const {t}*, {t}*);",
                f"template __global__ void rs_row_block<{targs}>(const __grid_constant__ RSParams, const {t}*, {t}*, "
                f"{a}*, unsigned int*);",
                f"template __global__ void rs_col<{targs}>(const __grid_constant__ RSParams, const {t}*, {t}*, {a}*, "
                f"unsigned int*);",
            ]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_every_instantiation(tmp_path):
    # Torch extensions compile with these defines; the .cuh must not rely on implicit half conversions.
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    procs = {}
    for dt in rs.DTYPES:
        src, out = tmp_path / f"rs_{dt}.cu", tmp_path / f"rs_{dt}.cubin"
        src.write_text(_nvcc_instantiations(dt))
        procs[dt] = (out, subprocess.Popen(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", *defines, "-o", str(out),
                                            str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for dt, (out, proc) in procs.items():
        log, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"nvcc failed for {dt}:\n{log[-5000:]}"
        assert out.stat().st_size > 0


# ============================================================================= planning


def _plan(shape, axes=None, layout="contig", target=None):
    params = {"shape": list(shape)}
    if target is not None:
        params["target"] = list(target)
    else:
        params["axes"] = axes
    if layout != "contig":
        params["x_layout"] = layout
    case = SimpleNamespace(params=params)
    return rs.case_plan(case)


G = rs.Group


@pytest.mark.parametrize("shape,axes,target,layout,want", [
    # full sums: one segment, one run
    ((2, 3, 4), None, None, "contig", dict(kind="row", outer=G(), red=G(), run=24, run_xs=1)),
    ((7,), None, None, "contig", dict(kind="row", outer=G(), red=G(), run=7, run_xs=1)),
    # row sums: segments of contiguous runs
    ((5, 6, 7), (2,), None, "contig", dict(kind="row", outer=G((30,), (7,), (1,)), red=G(), run=7, run_xs=1)),
    ((5, 6, 7), (1, 2), None, "contig", dict(kind="row", outer=G((5,), (42,), (1,)), red=G(), run=42, run_xs=1)),
    # reduced dims on both sides of a kept one: runs of 7, 5 of them 42 apart
    ((5, 6, 7), (0, 2), None, "contig", dict(kind="row", outer=G((6,), (7,), (1,)), red=G((5,), (42,), (0,)),
                                             run=7, run_xs=1)),
    # column sums: a kept dim is the fastest
    ((5, 6, 7), (0,), None, "contig", dict(kind="col", outer=G(), red=G((5,), (42,), (0,)), inner=42, inner_xs=1,
                                           inner_ys=1)),
    ((5, 6, 7), (1,), None, "contig", dict(kind="col", outer=G((5,), (42,), (7,)), red=G((6,), (7,), (0,)), inner=7,
                                           inner_xs=1, inner_ys=1)),
    ((5, 6, 7), None, (5, 1, 7), "contig", dict(kind="col", outer=G((5,), (42,), (7,)), red=G((6,), (7,), (0,)),
                                                inner=7, inner_xs=1, inner_ys=1)),
    ((3, 4, 5), None, (5,), "contig", dict(kind="col", outer=G(), red=G((12,), (5,), (0,)), inner=5, inner_xs=1,
                                           inner_ys=1)),
    ((3, 4, 5), None, (1, 4, 1), "contig", dict(kind="row", outer=G((4,), (5,), (1,)), red=G((3,), (20,), (0,)),
                                                run=5, run_xs=1)),
    # nothing reduced: the identity, a column copy
    ((3, 4, 5), (), None, "contig", dict(kind="col", outer=G(), red=G(), inner=60, inner_xs=1, inner_ys=1)),
    ((), None, None, "contig", dict(kind="col", outer=G(), red=G(), inner=1, inner_xs=0, inner_ys=0)),
    # size-1 dims vanish
    ((1, 5, 1), (0, 2), None, "contig", dict(kind="col", outer=G(), red=G(), inner=5, inner_xs=1, inner_ys=1)),
    ((1024, 1), (0,), None, "contig", dict(kind="row", outer=G(), red=G(), run=1024, run_xs=1)),
    # layouts: transposed (stored (65, 33)), sliced (stride 2, rows of 131)
    ((33, 65), (0,), None, "transposed", dict(kind="row", outer=G((65,), (33,), (1,)), red=G(), run=33, run_xs=1)),
    ((33, 65), (1,), None, "transposed", dict(kind="col", outer=G(), red=G((65,), (33,), (0,)), inner=33,
                                              inner_xs=1, inner_ys=1)),
    ((33, 65), (1,), None, "sliced", dict(kind="row", outer=G((33,), (131,), (1,)), red=G(), run=65, run_xs=2)),
    ((33, 65), (0,), None, "sliced", dict(kind="col", outer=G(), red=G((33,), (131,), (0,)), inner=65, inner_xs=2,
                                          inner_ys=1)),
    ((4, 33, 65), None, (65,), "transposed", dict(kind="row", outer=G((65,), (33,), (1,)),
                                                  red=G((4,), (2145,), (0,)), run=33, run_xs=1)),
    # the perf shapes
    ((8, 2048, 4096), None, (4096,), "contig", dict(kind="col", outer=G(), red=G((16384,), (4096,), (0,)),
                                                    inner=4096, inner_xs=1, inner_ys=1)),
    ((8, 2048, 4096), None, (8, 1, 4096), "contig", dict(kind="col", outer=G((8,), (2048 * 4096,), (4096,)),
                                                         red=G((2048,), (4096,), (0,)), inner=4096, inner_xs=1,
                                                         inner_ys=1)),
    ((8, 2048, 4096), None, (1, 2048, 4096), "contig", dict(kind="col", outer=G(), red=G((8,), (2048 * 4096,), (0,)),
                                                            inner=2048 * 4096, inner_xs=1, inner_ys=1)),
    ((8, 2048, 4096), None, (8, 2048, 1), "contig", dict(kind="row", outer=G((16384,), (4096,), (1,)), red=G(),
                                                         run=4096, run_xs=1)),
    ((8, 2048, 4096), None, (4096,), "transposed", dict(kind="row", outer=G((4096,), (2048,), (1,)),
                                                        red=G((8,), (2048 * 4096,), (0,)), run=2048, run_xs=1)),
])
def test_make_plan(shape, axes, target, layout, want):
    plan = _plan(shape, axes, layout, target)
    for key, value in want.items():
        assert getattr(plan, key) == value, f"{key}: {getattr(plan, key)} != {value} in {plan}"
    assert plan.out_numel == math.prod(out_shape(shape, {"target": target} if target is not None else {"axes": axes}))


def test_make_plan_empty_and_zero():
    assert _plan((3, 0), (0,)).kind == "empty"
    assert _plan((0, 5), (0,)).kind == "zero" and _plan((0, 5), (0,)).out_numel == 5
    assert _plan((2, 0, 3), target=(1, 3)).kind == "zero"
    assert _plan((0, 5), None).kind == "zero"  # the full sum of nothing is one 0


def test_collapse_needs_both_strides_to_chain():
    # x dims (2, 3) contiguous in x, but y keeps them swapped: no merge.
    grp = rs.collapse([(2, 3, 1), (3, 1, 2)])
    assert grp.sizes == (2, 3) and grp.xs == (3, 1) and grp.ys == (1, 2)
    grp = rs.collapse([(2, 3, 3), (3, 1, 1), (1, 99, 99)])
    assert grp == G((6,), (1,), (1,))
    # negative strides sort by magnitude
    grp = rs.collapse([(4, 1, 0), (5, -4, 0)])
    assert grp.sizes == (5, 4) and grp.xs == (-4, 1)


def test_make_plan_rejects_too_many_dims():
    shape = (2,) * 10
    strides = tuple(3 ** (10 - d) for d in range(10))  # nothing merges
    with pytest.raises(ValueError, match="reduce_sum: x has 10 reduced dims that do not merge"):
        rs.make_plan(shape, strides, range(10))


def test_layout_strides_match_the_harness():
    for shape in [(3, 4, 5), (33, 65), (7,)]:
        for layout in ("contig", "transposed", "sliced"):
            if layout == "transposed" and len(shape) < 2:
                continue
            t = from_values(np.ones(shape), "f32", layout)
            assert rs.layout_strides(shape, layout) == tuple(t.strides), (shape, layout)


def _launch(shape, axes=None, target=None, dt="f32", layout="contig", **kw):
    plan = _plan(shape, axes, layout, target)
    item = ITEMSIZE[dt]
    launch = rs.plan_launch(plan, dt, vec=plan.vec_possible(item), vec_store=plan.vec_store_possible(item), **kw)
    return plan, launch, _parse(launch.words)


def test_plan_seed_full_sum_fills_one_wave():
    for dt, v in (("f32", 4), ("bf16", 8)):
        plan, launch, p = _launch((32 * 1024 * 1024,), None, dt=dt, num_sms=132, occupancy=lambda e: 4)
        assert launch.kernel == "row_block" and launch.vec and launch.simple
        assert p.nchunk == 132 * 4 == launch.grid == p.ntiles and launch.n_part == p.ntiles and launch.n_ticket == 1
        assert p.units == 32 * 1024 * 1024 // v and p.tail == 0


@pytest.mark.parametrize("shape,axes,target", [((16384, 4096), (1,), None), ((8, 2048, 4096), (-1,), None),
                                               ((8, 2048, 4096), None, (8, 2048, 1))])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_plan_row_sums_use_warps(shape, axes, target, dt):
    plan, launch, p = _launch(shape, axes, target, dt, num_sms=132, occupancy=lambda e: 4)
    assert launch.kernel == "row_team" and launch.vec and launch.simple and launch.n_part == 0
    assert p.lanes == 32 and p.nseg == 16384 and p.units == 4096 // (16 // ITEMSIZE[dt])
    assert launch.grid == 16384 // (rs.BLOCK // 32)


@pytest.mark.parametrize("shape,axes,target", [((16384, 4096), (0,), None), ((8, 2048, 4096), (0, 1), None),
                                               ((8, 2048, 4096), None, (4096,)), ((8, 2048, 4096), None, (8, 1, 4096))])
@pytest.mark.parametrize("dt,occ", [("f32", 5), ("bf16", 4), ("f16", 4)])
def test_plan_column_sums_split_rows_to_fill_the_gpu(shape, axes, target, dt, occ):
    plan, launch, p = _launch(shape, axes, target, dt, num_sms=132, occupancy=lambda e: occ)
    v = 16 // ITEMSIZE[dt]
    assert launch.kernel == "col" and launch.vec and launch.simple
    assert p.lanes * v == rs.COL_TILE and p.ctiles == 4096 // rs.COL_TILE
    base = p.outer.numel * p.ctiles
    assert p.nchunk > 1 and p.ntiles == base * p.nchunk == launch.grid <= 132 * occ
    assert p.ntiles > 132 * occ - base  # no more than one more chunk would fit
    assert p.chunk * p.nchunk >= plan.red.numel > p.chunk * (p.nchunk - 1)
    assert launch.n_part == p.ntiles * rs.COL_TILE and launch.n_ticket == base
    # every row slot gets at least MIN_ROWS_PER_THREAD rows
    assert p.chunk // (rs.BLOCK // p.lanes) >= rs.MIN_ROWS_PER_THREAD


def test_plan_short_reduction_over_long_rows_widens_tiles():
    plan, launch, p = _launch((8, 2048, 4096), target=(1, 2048, 4096), dt="bf16", num_sms=132,
                              occupancy=lambda e: 4)
    assert launch.kernel == "col" and p.lanes == rs.BLOCK and p.nchunk == 1 and launch.n_part == 0
    assert p.ctiles == 2048 * 4096 // (8 * 256) == p.ntiles == launch.grid  # 7.8 waves: a block per tile
    assert p.vec_store == 1


def test_plan_transposed_bias_gradient():
    # 4096 warps: 512 blocks fit one wave at 4 blocks per SM ...
    plan, launch, p = _launch((8, 2048, 4096), target=(4096,), dt="bf16", layout="transposed", num_sms=132,
                              occupancy=lambda e: 4)
    assert launch.kernel == "row_team" and launch.vec and not launch.simple and launch.grid == 512
    assert p.nseg == 4096 and p.nvec == 2048 // 8 and p.units == 8 * 256 and p.lanes == 32
    # ... but at 3 they would run 1.3 waves: a block per segment instead (10 waves balance themselves)
    plan, launch, p = _launch((8, 2048, 4096), target=(4096,), dt="bf16", layout="transposed", num_sms=132,
                              occupancy=lambda e: 3)
    assert launch.kernel == "row_block" and p.nchunk == 1 and launch.grid == p.ntiles == 4096


def test_wave_efficiency_and_chunks():
    assert rs.wave_efficiency(100, 528) == 1.0 and rs.wave_efficiency(1056, 528) == 1.0
    assert rs.wave_efficiency(2048, 528) == pytest.approx(2048 / 2112)
    assert rs.wave_efficiency(512, 396) == pytest.approx(512 / 792)
    assert rs.chunks_for(1, 528, 10**6) == 528                 # one task: a wave of chunks
    assert rs.chunks_for(32, 528, 10**6) == 16 and rs.chunks_for(32, 528, 5) == 5
    assert rs.chunks_for(4096, 396, 10**6) == 1                # over MANY_WAVES waves
    assert rs.chunks_for(2048, 528, 10**6) == 1                # 3.9 waves, last one nearly full
    assert rs.chunks_for(700, 528, 10**6) == 4                 # 1.3 waves: split into 2800 tasks
    assert rs.chunks_for(700, 528, 2) == 2
    assert rs.chunks_for(5, 1, 10**6) == 1 and rs.chunks_for(10**9, 1, 10**6) == 1
    assert rs.chunks_for(1, 10**6, 10**9) == rs.MAX_CHUNKS


def test_plan_limits_on_huge_inputs():
    """Over 2**31 elements: chunk counts and the grid stay bounded, sizes stay exact in int64."""
    for target in [(1 << 20,), (2049, 1)]:
        plan, launch, p = _launch((2049, 1 << 20), target=target, dt="bf16", num_sms=132, occupancy=lambda e: 4)
        assert launch.grid <= 132 * 4 * rs.MAX_WAVES and p.nchunk <= rs.MAX_CHUNKS
    plan, launch, p = _launch((2049, 1 << 20), axes=(1,), dt="bf16", num_sms=132, occupancy=lambda e: 4)
    assert launch.kernel == "row_block" and p.units == (1 << 20) // 8


def test_rung_segments_and_reasons():
    assert rs.rung_segments(_plan((5, 6, 7), None)) == (1, 210, 0)
    assert rs.rung_segments(_plan((5, 6, 7), (2,))) == (30, 7, 7)
    assert rs.rung_segments(_plan((33, 65), (0,), "transposed")) == (65, 33, 33)
    assert rs.rung_segments(_plan((3, 4, 5), ())) == (60, 1, 1)
    assert rs.rung_segments(_plan((), None)) == (1, 1, 0)
    assert "column sum" in rs.rung_segments(_plan((5, 6, 7), (0,)))
    assert "runs of 7 elements" in rs.rung_segments(_plan((5, 6, 7), (0, 2)))
    assert "2 elements apart" in rs.rung_segments(_plan((33, 65), (1,), "sliced"))


def test_rung_passes():
    assert rs.rung_passes(1, 0, 256) == [(1, 0, 1)]
    assert rs.rung_passes(32 * 1024 * 1024, 0, 256) == [(1 << 25, 0, 1 << 17), (1 << 17, 1 << 17, 512),
                                                      (512, 512, 2), (2, 2, 1)]
    assert rs.rung_passes(4096, 4096, 512) == [(4096, 4096, 8), (8, 8, 1)]
    assert [rs.rung_span(r) for r in rs.RUNGS] == [256] * 3 + [512] * 3


def test_rungs_accept_full_and_row_sums_and_skip_columns_with_a_reason():
    smoke = [c for c in select("smoke") if c.op == rs.OP]
    perf = [c for c in select("perf") if c.op == rs.OP]
    for rung in rs.RUNGS:
        impl = rs.cupy_backend.impls[(rs.OP, rung)]
        for case in smoke + perf:
            why = impl.supports(case)
            plan = rs.case_plan(case)
            full_or_rows = plan.kind == "row" and plan.red.ndim == 0 and plan.run_xs == 1
            if full_or_rows:
                assert why is None, (rung, case.id, why)
            if plan.kind == "col" and plan.red_numel > 1:
                assert why and why.startswith(f"cupy@{rung}: the textbook kernels reduce contiguous segments"), why
        assert sum(impl.supports(c) is None for c in perf) == 8  # the two full sums and six row sums
    best = rs.cupy_backend.impls[(rs.OP, "best")]
    assert all(best.supports(c) is None for c in select("all") if c.op == rs.OP)


# ============================================================================= kernel emulator
#
# Memory is float64 numpy buffers; an Arr is a strided view (what a cupy array is to the host
# code: shape, byte strides, an address).  Every store is counted; loads are bounds-checked and
# 16-byte packs must be 16-byte aligned.

BLOCK = rs.BLOCK
UR = rs.UNROLL


class Buf:
    def __init__(self, values):
        self.v = np.asarray(values, dtype=np.float64).copy()
        self.writes = np.zeros(self.v.size, dtype=np.int64)


class Arr:
    _next_address = 1 << 20  # each buffer gets its own 256-byte aligned address range

    def __init__(self, buf: Buf, shape, strides, offset: int, itemsize: int):
        self.buf, self.shape, self.offset, self.itemsize = buf, tuple(shape), offset, itemsize
        self.strides = tuple(s * itemsize for s in strides)  # bytes, as cupy has them
        self.dtype = np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[itemsize])
        base = Arr._next_address
        Arr._next_address += -(-(buf.v.size * itemsize + 1) // 256) * 256
        self.address = base + offset * itemsize
        self.data = SimpleNamespace(ptr=self.address)
        self.flags = SimpleNamespace(c_contiguous=tuple(strides) == rs.contiguous_strides(shape))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def load(self, off: int) -> float:
        i = self.offset + off
        assert 0 <= i < self.buf.v.size, f"load out of bounds: {off}"
        return float(self.buf.v[i])

    def pack(self, off: int, n: int) -> list[float]:
        if n > 1:
            assert (self.address + off * self.itemsize) % 16 == 0, f"misaligned 16-byte load at element {off}"
        return [self.load(off + e) for e in range(n)]

    def store(self, off: int, x: float, n_pack: int = 1) -> None:
        if n_pack > 1:
            assert (self.address + off * self.itemsize) % 16 == 0, f"misaligned 16-byte store at element {off}"
        i = self.offset + off
        assert 0 <= i < self.buf.v.size, f"store out of bounds: {off}"
        self.buf.v[i] = x
        self.buf.writes[i] += 1

    def values(self) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(self.buf.v[self.offset:], self.shape,
                                               tuple(s // self.itemsize * 8 for s in self.strides)).copy()


def _parse(words):
    w = [int(x) for x in np.asarray(words).reshape(-1)]
    assert len(w) == rs.PARAMS_WORDS
    md, gw = rs.MAX_DIMS, rs.GROUP_WORDS

    def group(i):
        g = SimpleNamespace(ndim=w[i], numel=w[i + 1], size=w[i + 2:i + 2 + md], xs=w[i + 2 + md:i + 2 + 2 * md],
                            ys=w[i + 2 + 2 * md:i + 2 + 3 * md])
        assert g.numel == math.prod(g.size[:g.ndim]) and all(n == 1 for n in g.size[g.ndim:])
        assert all(s == 0 for s in g.xs[g.ndim:] + g.ys[g.ndim:]), "unused strides must be packed as 0 (SIMPLE)"
        return g

    p = SimpleNamespace(outer=group(0), red=group(gw), **dict(zip(rs.FIELDS, w[2 * gw:])))
    assert p.lanes == 1 << p.lanes_log2
    return p


# ----------------------------------------------------------------------------- shared device code


def _offsets(g, idx):
    """rs_offsets."""
    xo = yo = 0
    if g.ndim == 0:
        return 0, 0
    if g.ndim == 1:
        return idx * g.xs[0], idx * g.ys[0]
    i = idx
    for d in range(g.ndim - 1, -1, -1):
        q = i // g.size[d] if d > 0 else 0
        r = i - q * g.size[d]
        xo += r * g.xs[d]
        yo += r * g.ys[d]
        i = q
    return xo, yo


def _offsets_of(simple, g, idx):
    return (idx * g.xs[0], idx * g.ys[0]) if simple else _offsets(g, idx)


def _x_offset(simple, g, idx):
    return idx * g.xs[0] if simple or g.ndim == 1 else _offsets(g, idx)[0]


def _unit_offset(p, u, vec, simple, V):
    step = V if vec else p.run_xs
    if simple or p.red.ndim == 0:
        return u * step
    ro, v = divmod(u, p.nvec)
    return _x_offset(False, p.red, ro) + v * step


def _sum_units(p, x, base, first, step, with_tail, vec, simple, V):
    """rs_sum_units."""
    acc = 0.0
    u0 = first
    while u0 < p.units:
        packs = [x.pack(base + _unit_offset(p, u0 + r * step, vec, simple, V), V)
                 for r in range(UR) if u0 + r * step < p.units]
        for pk in packs:
            for e in pk:
                acc += e
        u0 += step * UR
    if vec and with_tail:
        e = first
        while e < p.tail:
            acc += x.load(base + p.nvec * V + e)
            e += step
    return acc


def _lanes_sum(vals, width):
    """rs_lanes_sum over a warp's 32 values: butterfly within aligned groups of `width`."""
    v = list(vals)
    mask = width >> 1
    while mask >= 1:
        v = [v[i] + v[i ^ mask] for i in range(32)]
        mask >>= 1
    return v


def _block_sum(vals):
    """rs_block_sum: thread 0's result."""
    warp_sums = [_lanes_sum(vals[w * 32:(w + 1) * 32], 32)[0] for w in range(BLOCK // 32)]
    return _lanes_sum(warp_sums + [0.0] * (32 - len(warp_sums)), BLOCK // 32)[0]


# ----------------------------------------------------------------------------- best kernels


def emu_row_team(vec, simple, V, order, p, x, y):
    lg = p.lanes_log2
    width, per_block = 1 << lg, BLOCK >> lg
    nteams = len(order) * per_block
    for b in order:
        for warp in range(BLOCK // 32):
            tids = range(warp * 32, warp * 32 + 32)
            warp_team0 = b * per_block + ((warp * 32) >> lg)
            s0 = warp_team0
            while s0 < p.nseg:
                accs, dest = [], []
                for tid in tids:
                    lane, team = tid & (width - 1), b * per_block + (tid >> lg)
                    seg = s0 + (team - warp_team0)
                    acc, yo = 0.0, None
                    if seg < p.nseg:
                        xo, yo = _offsets_of(simple, p.outer, seg)
                        acc = _sum_units(p, x, xo, lane, width, True, vec, simple, V)
                    accs.append(acc)
                    dest.append(yo if lane == 0 else None)
                for v, yo in zip(_lanes_sum(accs, width), dest):
                    if yo is not None:
                        y.store(yo, v)
                s0 += nteams


def emu_row_block(vec, simple, V, order, p, x, y, part, ticket):
    grid = len(order)
    for b in order:
        for t in range(b, p.ntiles, grid):
            seg, c = divmod(t, p.nchunk)
            xo, yo = _offsets_of(simple, p.outer, seg)
            v = _block_sum([_sum_units(p, x, xo, c * BLOCK + tid, p.nchunk * BLOCK, c == 0, vec, simple, V)
                            for tid in range(BLOCK)])
            if p.nchunk == 1:
                y.store(yo, v)
                continue
            part.store(t, v)
            got = ticket[seg]
            ticket[seg] += 1
            if got == p.nchunk - 1:  # the last ticket: finish the segment
                first = seg * p.nchunk
                v = _block_sum([sum(part.load(first + c2) for c2 in range(tid, p.nchunk, BLOCK))
                                for tid in range(BLOCK)])
                y.store(yo, v)
                ticket[seg] = 0


def _slots_sum(acc, nw, lanes):
    """rs_slots_sum: acc[tid] lists of V values; slot w == 0 gets the fixed-order tree sums."""
    if nw == 1:
        return acc
    red = [list(a) for a in acc]
    s = nw >> 1
    while s > 0:
        for tid in range(BLOCK):
            if (tid // lanes) < s:
                red[tid] = [a + b for a, b in zip(red[tid], red[tid + s * lanes])]
        s >>= 1
    return red


def _col_store(p, vec, V, y, yo, i0, vals):
    if vec and p.vec_store:
        for e in range(V):
            y.store(yo + i0 + e, vals[e], n_pack=V if e == 0 else 1)
    else:
        for e in range(V):
            if vec or i0 + e < p.inner:
                y.store(yo + (i0 + e) * p.inner_ys, vals[e])


def emu_col(vec, simple, V, order, p, x, y, part, ticket):
    grid = len(order)
    lanes, nw = p.lanes, BLOCK >> p.lanes_log2
    tc = lanes * V
    for b in order:
        for t in range(b, p.ntiles, grid):
            tile, c = divmod(t, p.nchunk)
            o, ct = divmod(tile, p.ctiles)
            xo, yo = _offsets_of(simple, p.outer, o)
            acc = []
            for tid in range(BLOCK):
                lane, w = tid & (lanes - 1), tid >> p.lanes_log2
                i0 = ct * tc + lane * V
                a = [0.0] * V
                if i0 < p.inner:
                    xc = xo + i0 * p.inner_xs
                    r_lo = c * p.chunk
                    r_hi = min(p.red.numel, r_lo + p.chunk)
                    for r0 in range(r_lo + w, r_hi, nw * UR):
                        packs = [x.pack(xc + _x_offset(simple, p.red, r0 + k * nw), V)
                                 for k in range(UR) if r0 + k * nw < r_hi]
                        for pk in packs:
                            a = [s + e for s, e in zip(a, pk)]
                acc.append(a)
            acc = _slots_sum(acc, nw, lanes)
            lanes_cols = [(lane, ct * tc + lane * V) for lane in range(lanes)]
            if p.nchunk == 1:
                for lane, i0 in lanes_cols:
                    if i0 < p.inner:
                        _col_store(p, vec, V, y, yo, i0, acc[lane])
                continue
            tile_part = tile * p.nchunk * tc
            for lane, _ in lanes_cols:
                for e in range(V):
                    part.store(tile_part + c * tc + lane * V + e, acc[lane][e])
            got = ticket[tile]
            ticket[tile] += 1
            if got == p.nchunk - 1:
                acc = []
                for tid in range(BLOCK):
                    lane, w = tid & (lanes - 1), tid >> p.lanes_log2
                    acc.append([sum(part.load(tile_part + cc * tc + lane * V + e) for cc in range(w, p.nchunk, nw))
                                for e in range(V)])
                acc = _slots_sum(acc, nw, lanes)
                for lane, i0 in lanes_cols:
                    if i0 < p.inner:
                        _col_store(p, vec, V, y, yo, i0, acc[lane])
                ticket[tile] = 0


# ----------------------------------------------------------------------------- the ladder


def emu_rung(rung, grid, src, dst, n, seg_stride, seg0):
    """rs_v0 .. rs_v5: grid = (blocks per segment, segments)."""
    nb, nsegs = grid
    k = rs.RUNGS.index(rung)
    tid = np.arange(BLOCK)
    for j in range(nsegs):
        seg = seg0 + j
        base = seg * seg_stride

        def ld(i):
            return src.load(base + i) if i < n else 0.0

        for b in range(nb):
            if k < 3:
                sdata = np.array([ld(b * BLOCK + t) for t in range(BLOCK)])
            else:
                sdata = np.array([ld(b * 2 * BLOCK + t) + ld(b * 2 * BLOCK + t + BLOCK) for t in range(BLOCK)])
            if k == 0:  # interleaved: tid % (2 s) == 0 adds sdata[tid + s]
                s = 1
                while s < BLOCK:
                    idx = tid[tid % (2 * s) == 0]
                    sdata[idx] += sdata[idx + s]
                    s *= 2
            elif k == 1:  # strided index 2 s tid
                s = 1
                while s < BLOCK:
                    index = 2 * s * tid
                    index = index[index < BLOCK]
                    sdata[index] += sdata[index + s]
                    s *= 2
            elif k in (2, 3, 4):  # sequential addressing (v4: down to s = 64, then the unrolled warp)
                s = BLOCK // 2
                while s > (32 if k == 4 else 0):
                    sdata[:s] += sdata[s:2 * s]
                    s >>= 1
                if k == 4:
                    v = sdata[:32].copy()
                    for s in (32, 16, 8, 4, 2, 1):
                        v = v + sdata[tid[:32] + s]  # every lane reads, __syncwarp, then writes
                        sdata[:32] = v
            else:  # v5: warp shuffles, then the first warp over the warp sums
                warp_sums = [_lanes_sum(sdata[w * 32:(w + 1) * 32], 32)[0] for w in range(BLOCK // 32)]
                sdata[0] = _lanes_sum(warp_sums + [0.0] * (32 - len(warp_sums)), BLOCK // 32)[0]
            dst.store(seg * nb + b, float(sdata[0]))


# ----------------------------------------------------------------------------- the device


class EmuDevice:
    def __init__(self, num_sms=4, occupancy=2, seed=0, itemsize=4):
        self.sms, self.occ = num_sms, occupancy
        self.rng = np.random.default_rng(seed)
        self.itemsize = itemsize
        self.launches, self.parts, self.tickets = [], [], []

    def num_sms(self):
        return self.sms

    def occupancy(self, expr):
        return self.occ

    def ptr(self, a):
        return a.address

    def empty(self, n, dtype):
        item = np.dtype(dtype).itemsize
        arr = Arr(Buf(np.full(max(n, 1), np.nan)), (n,), (1,), 0, item)
        self.parts.append(arr)
        return arr

    def fill_zero(self, y):
        for i in range(y.size):
            y.store(i, 0.0)

    def workspace(self, n_part, n_ticket, dtype):
        part = Arr(Buf(np.full(n_part, np.nan)), (n_part,), (1,), 0, np.dtype(dtype).itemsize)
        ticket = np.zeros(n_ticket, dtype=np.int64)
        self.parts.append(part)
        self.tickets.append(ticket)
        return part, ticket

    def launch(self, expr, grid, args):
        self.launches.append((expr, tuple(grid)))
        name, targs = expr.split("<", 1)
        targs = [s.strip() for s in targs.rstrip(">").split(",")]
        if name.startswith("rs_v"):
            assert len(grid) == 2 and grid[1] <= rs.MAX_GRID_Y
            emu_rung(name[3:], grid, args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
            return
        assert len(grid) == 1 and isinstance(args[0], np.ndarray) and args[0].dtype == rs.PARAMS_DTYPE
        p = _parse(args[0]["words"][0])
        vec, simple = targs[1] == "true", targs[2] == "true"
        V = 16 // self.itemsize if vec else 1
        order = list(self.rng.permutation(grid[0]))
        if name == "rs_row_team":
            emu_row_team(vec, simple, V, order, p, *args[1:])
        elif name == "rs_row_block":
            emu_row_block(vec, simple, V, order, p, *(None if isinstance(a, np.uint64) else a for a in args[1:]))
        elif name == "rs_col":
            emu_col(vec, simple, V, order, p, *(None if isinstance(a, np.uint64) else a for a in args[1:]))
        else:
            raise AssertionError(f"unknown kernel {expr}")
        for ticket in self.tickets:
            assert not ticket.any(), f"tickets left armed after {expr}: {ticket}"


# ============================================================================= emulated runs


def _make_x(values: np.ndarray, layout: str, itemsize: int, misalign: bool = False) -> Arr:
    """x as the harness lays it out (harness.tensors.from_values: contig, transposed, sliced), or
    `padded` (rows padded to a multiple of 8 elements, like a pitched allocation), with NaN gaps
    and NaN guard bands."""
    guard = 256 // itemsize
    if layout == "padded":
        shape = values.shape
        wide = np.full(shape[:-1] + (-(-shape[-1] // 8) * 8,), np.nan)
        wide[..., :shape[-1]] = values
        strides, inner, offset = rs.contiguous_strides(wide.shape), wide.reshape(-1), 0
    else:
        t = from_values(values, "f64", layout)  # float64 keeps the values exact
        strides, inner, offset = t.strides, np.asarray(t.base[t.guard:t.base.size - t.guard]), t.offset - t.guard
    buf = np.concatenate([np.full(guard + misalign, np.nan), inner, np.full(guard, np.nan)])
    return Arr(Buf(buf), values.shape, strides, guard + misalign + offset, itemsize)


def _emulate(variant, shape, params, layout="contig", dt="f32", seed=0, num_sms=4, occupancy=2, misalign=False,
             order_seed=None):
    """Runs `variant` (best or a rung) through its host code on the emulator, checks y against the
    oracle and the write counts; returns (y, dev, entry, what run_best / run_rung returned)."""
    rng = np.random.default_rng(seed)
    item = ITEMSIZE[dt]
    values = rng.uniform(-2, 2, shape)
    x = _make_x(values, layout, item, misalign)
    oshape = out_shape(shape, params)
    guard = 256 // item
    y = Arr(Buf(np.full(math.prod(oshape) + 2 * guard, np.nan)), oshape, rs.contiguous_strides(oshape), guard, item)
    entry = rs.entry_for(x.shape, x.strides, x.dtype, params)
    rs.check_args(x, y, entry)
    dev = EmuDevice(num_sms, occupancy, seed if order_seed is None else order_seed, item)
    if variant == "best":
        got = rs.run_best(dev, dt, entry, x, y)
    else:
        got = rs.run_rung(dev, variant, dt, entry, x, y)
    want = reduce_sum_numpy(values, params)
    if y.size:
        np.testing.assert_allclose(y.values(), want, rtol=1e-12, atol=1e-12, err_msg=f"{dev.launches}")
        assert (y.buf.writes[guard:guard + y.size] == 1).all(), f"y elements written {y.buf.writes} times"
    assert not y.buf.writes[:guard].any() and not y.buf.writes[guard + y.size:].any(), "write outside y"
    for part in dev.parts:  # pass outputs and partials: each element written exactly once
        assert (part.buf.writes[:part.size] == 1).all(), f"partials written {part.buf.writes} times"
    return y, dev, entry, got


def _best_kernel(dev):
    names = {e.split("<")[0] for e, _ in dev.launches}
    assert len(names) <= 1, dev.launches
    return names.pop() if names else None


# (shape, params, layout, dtype, expected kernel): every kernel, flag and layout.
BEST_CASES = [
    ((3, 4, 5), {"axes": None}, "contig", "f32", "rs_row_team"),
    ((1000,), {"axes": None}, "contig", "f32", "rs_row_team"),          # vector units and a tail? 1000 % 4 = 0
    ((1003,), {"axes": None}, "contig", "f16", "rs_row_team"),          # tail of 3 after 8-element packs
    ((7, 13), {"axes": [1]}, "contig", "bf16", "rs_row_team"),
    ((6, 40), {"axes": [1]}, "contig", "f32", "rs_row_team"),           # vec rows, 10 packs each
    ((5, 6, 7), {"axes": [0, 2]}, "contig", "f32", "rs_row_team"),      # runs of 7, not SIMPLE
    ((4, 6, 8), {"axes": [0, 2]}, "contig", "f32", "rs_row_team"),      # vec runs of 8, not SIMPLE
    ((4, 2, 6), {"axes": [0, 2]}, "padded", "f32", "rs_row_team"),      # runs of 6: no packs (6 % 4)
    ((4, 2, 8), {"axes": [0, 2]}, "padded", "f32", "rs_row_team"),      # packs of runs 16 apart
    ((4, 2, 6), {"axes": [0]}, "padded", "f32", "rs_col"),              # 6 columns: no packs
    ((3, 5, 16), {"axes": [1]}, "padded", "bf16", "rs_col"),            # vec loads, vec stores
    ((33, 65), {"axes": [0]}, "transposed", "f32", "rs_row_team"),
    ((33, 65), {"axes": [-1]}, "sliced", "f64", "rs_row_team"),         # run stride 2
    ((4, 33, 65), {"target": [65]}, "transposed", "f32", "rs_row_team"),
    ((2, 3, 4, 5), {"axes": [1, 3]}, "contig", "f32", "rs_row_team"),   # outer (2, 4), not SIMPLE
    ((3, 4, 5), {"axes": [0]}, "contig", "f32", "rs_col"),              # vec columns of 20
    ((5, 6, 7), {"target": [5, 1, 7]}, "contig", "f32", "rs_col"),
    ((4, 6, 16), {"target": [4, 1, 16]}, "contig", "bf16", "rs_col"),   # vec loads and vec stores
    ((33, 65), {"axes": [-1]}, "transposed", "f32", "rs_col"),
    ((33, 65), {"axes": [0]}, "sliced", "f32", "rs_col"),               # inner stride 2
    ((2, 3, 4, 8), {"axes": [1]}, "contig", "f64", "rs_col"),           # outer (2,), inner 32
    ((3, 2, 5, 4), {"target": [3, 1, 5, 1]}, "contig", "f32", "rs_row_team"),
    ((3, 2, 4, 8), {"target": [3, 1, 1, 8]}, "contig", "f32", "rs_col"),
    ((2, 3, 2, 5), {"axes": [0, 2]}, "contig", "f32", "rs_col"),       # red (2, 2) does not merge: not SIMPLE
    ((2, 3, 2, 5), {"axes": [0, 2]}, "transposed", "f32", "rs_row_team"),
    ((3, 4, 5), {"axes": []}, "contig", "f32", "rs_col"),               # the identity
    ((3, 4, 5), {"axes": []}, "sliced", "bf16", "rs_col"),
    ((3, 4), {"axes": []}, "transposed", "f32", "rs_col"),              # x strides chain, y strides do not
    ((2, 3, 4), {"target": [1, 3, 4]}, "transposed", "f32", "rs_col"),
    ((), {"axes": None}, "contig", "f32", "rs_col"),
    ((1, 5, 1), {"axes": [0, 2], "keepdim": True}, "contig", "f32", "rs_col"),
    ((0, 5), {"axes": [0]}, "contig", "f32", None),                     # zero: memset
    ((3, 0), {"axes": [0]}, "contig", "f32", None),                     # empty: nothing
    ((4, 3000), {"axes": [1]}, "contig", "f32", "rs_row_block"),        # few long segments
    ((2, 3001), {"axes": [1]}, "contig", "bf16", "rs_row_block"),
]


@pytest.mark.parametrize("shape,params,layout,dt,kernel", BEST_CASES,
                         ids=[f"{dt}-{s}-{p}-{lay}" for s, p, lay, dt, _ in BEST_CASES])
def test_emulated_best_matches_oracle(shape, params, layout, dt, kernel):
    y, dev, entry, launch = _emulate("best", shape, params, layout, dt)
    assert _best_kernel(dev) == kernel
    if launch is not None:
        item = ITEMSIZE[dt]
        assert launch.vec == entry.plan.vec_possible(item) and launch.simple == entry.plan.simple()


@pytest.mark.parametrize("shape,params,layout,dt", [
    ((3000,), {"axes": None}, "contig", "f32"),
    ((2, 6000), {"axes": [1]}, "contig", "f16"),             # tail of packs per segment, 3 chunks
    ((3, 2, 1200), {"axes": [0, 2]}, "contig", "f32"),       # runs, general offsets, chunks
    ((400, 24), {"axes": [0]}, "contig", "f32"),
    ((3, 600, 16), {"target": [3, 1, 16]}, "contig", "bf16"),
    ((60, 33), {"axes": [0]}, "sliced", "f32"),
    ((50, 6, 4, 8), {"axes": [0, 2]}, "contig", "f64"),      # red (50, 4): general rows, chunked
])
def test_emulated_chunked_reductions_finish_deterministically(monkeypatch, shape, params, layout, dt):
    """Few elements per thread and many SMs force several chunks per segment / column tile:
    partials, tickets and the last-block finish.  Other block orders (another block finishes
    last) give the same bits."""
    monkeypatch.setattr(rs, "MIN_UNITS_PER_THREAD", 1)
    monkeypatch.setattr(rs, "MIN_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(rs, "_PLANS", {})
    outs = []
    for order_seed in (1, 2, 3):
        y, dev, _, launch = _emulate("best", shape, params, layout, dt, seed=1, num_sms=64, occupancy=4,
                                     order_seed=order_seed)
        assert launch.kernel in ("row_block", "col") and _parse(launch.words).nchunk > 1
        outs.append(y.values())
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("shape,params,dt,kernel", [
    ((3, 3000), {"axes": [1]}, "f32", "row_block"),
    ((600, 3), {"axes": [1]}, "f32", "row_team"),
    ((5, 40, 24), {"target": [5, 1, 24]}, "bf16", "col"),
])
def test_emulated_grid_stride_over_tiles(monkeypatch, shape, params, dt, kernel):
    """One SM, one resident block: grids smaller than the tile count loop over tiles."""
    monkeypatch.setattr(rs, "MAX_WAVES", 1)
    monkeypatch.setattr(rs, "MIN_UNITS_PER_THREAD", 1)
    monkeypatch.setattr(rs, "MIN_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(rs, "_PLANS", {})
    _, dev, _, launch = _emulate("best", shape, params, "contig", dt, num_sms=1, occupancy=1)
    p = _parse(launch.words)
    tasks = p.ntiles if launch.kernel != "row_team" else _ceil(p.nseg, rs.BLOCK // p.lanes)
    assert launch.kernel == kernel and launch.grid == 1 < tasks


def _ceil(a, b):
    return -(-a // b)


@pytest.mark.parametrize("dt", ["f32", "bf16", "f64"])
def test_emulated_misaligned_x_takes_the_scalar_path(dt):
    _, _, entry, launch = _emulate("best", (6, 64), {"axes": [1]}, "contig", dt, misalign=True)
    assert entry.vec_ok and not launch.vec
    _, _, entry, launch = _emulate("best", (6, 64), {"axes": [0]}, "contig", dt, misalign=True)
    assert entry.vec_ok and not launch.vec


RUNG_CASES = [
    ((7,), {"axes": None}, "contig", "f32"),
    ((600,), {"axes": None}, "contig", "f32"),              # two passes (three blocks, then one)
    ((1300,), {"axes": None}, "contig", "bf16"),             # v3+: three blocks of 512
    ((5, 6, 7), {"axes": [1, 2]}, "contig", "f64"),
    ((4, 300), {"axes": [1]}, "contig", "f16"),              # segments, two passes for v0-v2
    ((33, 65), {"axes": [0]}, "transposed", "f32"),          # segments 33 apart
    ((3, 4, 5), {"axes": []}, "contig", "f32"),              # the identity: segments of one element
    ((), {"axes": None}, "contig", "f32"),
    ((0, 5), {"axes": [0]}, "contig", "f32"),
    ((3, 0), {"axes": [0]}, "contig", "f32"),
]


@pytest.mark.parametrize("rung", rs.RUNGS)
@pytest.mark.parametrize("shape,params,layout,dt", RUNG_CASES,
                         ids=[f"{d}-{s}-{p}-{lay}" for s, p, lay, d in RUNG_CASES])
def test_emulated_rungs_match_oracle(rung, shape, params, layout, dt):
    _, dev, entry, passes = _emulate(rung, shape, params, layout, dt)
    if entry.plan.kind in ("row", "col"):
        assert len(passes) >= 1 and all(e.startswith(f"rs_{rung}<") for e, _ in dev.launches)
        t, a = rs.CUDA_TYPE[dt], rs.acc_type(dt)
        assert dev.launches[0][0].startswith(f"rs_{rung}<{t}, ") and dev.launches[-1][0].endswith(f", {t}>")
        for expr, _ in dev.launches[1:]:
            assert expr.startswith(f"rs_{rung}<{a}, "), "later passes read the accumulator partials"


def test_emulated_rung_three_passes_and_many_segments(monkeypatch):
    _, dev, _, passes = _emulate("v2", (70000,), {"axes": None})
    assert passes == [(70000, 0, 274), (274, 274, 2), (2, 2, 1)]
    assert [g for _, g in dev.launches] == [(274, 1), (2, 1), (1, 1)]
    monkeypatch.setattr(rs, "MAX_GRID_Y", 4)  # segments spread over several launches
    _, dev, _, _ = _emulate("v2", (10, 20), {"axes": [1]})
    assert [g for _, g in dev.launches] == [(1, 4), (1, 4), (1, 2)]


def test_rung_refuses_a_column_form():
    entry = rs.entry_for((5, 6), (24, 4), np.dtype(np.float32), {"axes": [0]})
    with pytest.raises(ValueError, match="cupy@v3 cannot run this form: the textbook kernels reduce contiguous"):
        rs.run_rung(EmuDevice(), "v3", "f32", entry, None, None)


def _smoke_cases():
    return [c for c in select("smoke") if c.op == rs.OP]


@pytest.mark.parametrize("variant", ["best", "v0", "v4"])
def test_emulated_smoke_set(variant):
    """Every smoke case the variant accepts, through its host code and emulated kernels."""
    impl = rs.cupy_backend.impls[(rs.OP, variant)]
    ran = 0
    for case in _smoke_cases():
        if impl.supports(case) is not None:
            continue
        _emulate(variant, tuple(case.params["shape"]), case.params, case.params.get("x_layout", "contig"), case.dtype)
        ran += 1
    assert ran >= 27


def test_emulated_fuzz_cases():
    """The op's fuzz strategy (harness/fuzz.py: ranks 0-4, size-0 and wide dims, both forms,
    keepdim, every layout and dtype) through best and the rungs, on several device sizes."""
    hypothesis = pytest.importorskip("hypothesis")
    from harness import fuzz

    st = hypothesis.strategies

    @fuzz.fuzz_settings("ci", 150)
    @hypothesis.given(case=fuzz.cases(rs.OP), variant=st.sampled_from(("best", "best", "v0", "v3", "v4", "v5")),
                      sms=st.sampled_from((1, 4, 132)), occupancy=st.sampled_from((1, 2, 8)))
    def passes(case, variant, sms, occupancy):
        shape = tuple(case.params["shape"])
        hypothesis.assume(math.prod(shape) <= 30000)  # the emulator walks every thread in Python
        if rs.cupy_backend.impls[(rs.OP, variant)].supports(case) is None:
            _emulate(variant, shape, case.params, case.params.get("x_layout", "contig"), case.dtype, num_sms=sms,
                     occupancy=occupancy)

    passes()


# ============================================================================= backend surface


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_gpu_visible(), reason="a CUDA device is visible")
def test_cupy_backend_reports_no_device():
    assert rs.cupy_backend.unavailable_reason("cpu").startswith("cupy: runs on cuda")


def test_variants_registered_in_ladder_order():
    impls = [(op, v) for op, v in rs.cupy_backend.impls if op == rs.OP]
    assert [v for _, v in impls] == list(rs.RUNGS) + ["best"]
    for _, v in impls:
        impl = rs.cupy_backend.impls[(rs.OP, v)]
        assert impl.deterministic and set(impl.dtypes) == {"f32", "f16", "bf16", "f64"}


def test_importing_the_module_does_not_import_cupy():
    code = "import sys; import backends.cupy.reduce_sum; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_nvrtc.CUDA_DIR.parent.parent))


def test_one_nvrtc_module_per_dtype(monkeypatch):
    """kernel(expr) compiles every instantiation of the expression's dtype at once, once."""
    built = []

    class FakeModule:
        def __init__(self, code, options, name_expressions):
            assert code == SOURCE and any(o.startswith("-std=") for o in options)
            built.append(tuple(name_expressions))

        def get_function(self, expr):
            return ("fn", expr)

    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(RawModule=FakeModule))
    monkeypatch.setattr(rs, "_KERNELS", {})
    monkeypatch.setattr(rs, "_EXPR_DTYPE", {})
    assert rs.kernel("rs_col<__half, true, true>") == ("fn", "rs_col<__half, true, true>")
    assert rs.kernel("rs_v3<float, __half>") == ("fn", "rs_v3<float, __half>")
    assert built == [tuple(rs.all_kernel_exprs("f16"))]
    assert rs.kernel("rs_v0<float, float>") == ("fn", "rs_v0<float, float>")  # already in f16's module
    rs.kernel("rs_row_team<float, true, true>")
    assert built[1:] == [tuple(rs.all_kernel_exprs("f32"))]
    with pytest.raises(KeyError, match="no kernel instantiation 'rs_v9<float, float>'"):
        rs.kernel("rs_v9<float, float>")


def test_plan_cache_skips_planning(monkeypatch):
    monkeypatch.setattr(rs, "_PLANS", {})
    params = {"axes": [1]}
    first = rs.entry_for((4, 8), (32, 4), np.dtype(np.float32), params)
    monkeypatch.setattr(rs, "make_plan", lambda *a: pytest.fail("planned twice"))
    assert rs.entry_for((4, 8), (32, 4), np.dtype(np.float32), {"axes": [1]}) is first
    dev = EmuDevice()
    x = _make_x(np.ones((4, 8)), "contig", 4)
    y = Arr(Buf(np.zeros(4)), (4,), (1,), 0, 4)
    launch = rs.run_best(dev, "f32", first, x, y)
    monkeypatch.setattr(rs, "plan_launch", lambda *a, **k: pytest.fail("launch planned twice"))
    assert rs.run_best(dev, "f32", first, x, y) is launch


def test_check_args_messages():
    x = np.zeros((4, 6), np.float32)
    entry = rs.entry_for(x.shape, x.strides, x.dtype, {"axes": [1]})
    rs.check_args(x, np.zeros(4, np.float32), entry)
    with pytest.raises(ValueError, match="reduce_sum: y has 5 elements, expected 4"):
        rs.check_args(x, np.zeros(5, np.float32), entry)
    with pytest.raises(ValueError, match="reduce_sum: y must be C-contiguous"):
        rs.check_args(x, np.zeros(8, np.float32)[::2], entry)
    with pytest.raises(ValueError, match="reduce_sum: y shares memory with x"):
        rs.check_args(x, x.reshape(-1)[20:24], entry)
    with pytest.raises(ValueError, match="strides .* expected multiples of its itemsize 4"):
        rs.entry_for((4, 6), (24, 2), np.dtype(np.float32), {"axes": [1]})
    with pytest.raises(TypeError, match="reduce_sum: x has dtype int32, expected one of float32"):
        rs._entry({"x": np.zeros(3, np.int32)}, {"y": np.zeros((), np.int32)}, {"axes": None})
    with pytest.raises(TypeError, match="reduce_sum: y has dtype float64, expected float32"):
        rs._entry({"x": np.zeros(3, np.float32)}, {"y": np.zeros((), np.float64)}, {"axes": None})
