"""The raw CUDA kernels (backends/cuda/*.cuh), their launch plan (backends/_plans/) and the cupy
backend's host side, without a GPU.

* Compile checks: every instantiation of every kernel (dtype x fn x kernel) compiles for
  sm_90 with NVRTC, and with `nvcc -cubin` when nvcc exists.  BBParams has the layout the
  host packs.
* The host side, run for real against an emulator: `run_opt` / `run_naive` (the exact code
  the cupy backend runs) launch kernels on `EmuDevice`, whose kernels are line-by-line
  Python ports of the .cuh kernels, thread by thread, barrier phase by barrier phase.  The
  results must match the float64 oracle, and every element of every output or partial row
  must be written exactly once.  This checks the launch planning, the role mapping, the
  packing of BBParams and the kernels' index math, tiling and reduction structure.
* The backend's availability reason and argument checks.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from backends._plans import binary_backward as _bcast_plan
from backends._plans import binary_backward_cuda as cuda_plan
from backends.cupy import binary_backward as cupy_raw
from backends.cupy import nvrtc as _nvrtc
from oracle.binary_backward import FNS, binary_backward_numpy
from nvrtc_mark import needs_nvrtc
from nvrtc_ptxas import ptxas_usage

SOURCE = _nvrtc.read_source(cupy_raw.SOURCE)


# ============================================================================= compile checks


@needs_nvrtc
@pytest.mark.parametrize("dt", cupy_raw.DTYPES)
def test_nvrtc_compiles_every_instantiation(dt):
    exprs = cupy_raw.all_kernel_exprs(dt)
    assert len(exprs) == len(FNS) * 16 + 1  # 7 opt / naive kinds, opt2, cols, rows, batch, both (scalar and packed)
    cubin, lowered = _nvrtc.compile_cubin(SOURCE, arch="sm_90", name_expressions=exprs)
    assert len(cubin) > 0
    for expr in exprs:
        assert lowered[expr].encode() in cubin, f"{expr} ({lowered[expr]}) missing from the cubin"


@needs_nvrtc
def test_params_layout_matches_host_packing():
    # All fields are long long (no padding), so sizes in declaration order fix the layout.
    probe = SOURCE + f"""
static_assert(BB_MAX_DIMS == {cuda_plan.MAX_DIMS}, "MAX_DIMS");
static_assert(BB_BLOCK == {cuda_plan.BLOCK}, "BLOCK");
static_assert(BB_J == {cuda_plan.J_BATCH}, "J");
static_assert(BB_EW_TILE == {cuda_plan.EW_TILE}, "EW_TILE");
static_assert(sizeof(BBParams) == {cuda_plan.PARAMS_WORDS} * 8, "BBParams size");
static_assert(sizeof(BBGroup::size) == {cuda_plan.MAX_DIMS} * 8, "BBGroup sizes");
static_assert(sizeof(BBGroup::stride) == {5 * cuda_plan.MAX_DIMS} * 8, "BBGroup strides");
static_assert(sizeof(BBParams::grp) == {3 * cuda_plan.GROUP_WORDS} * 8, "BBParams groups");
static_assert(sizeof(BBCollapsed) == {cuda_plan.COLLAPSED_WORDS} * 8, "BBCollapsed size");
static_assert(BB_COLLAPSED_WORDS == {cuda_plan.COLLAPSED_WORDS}, "BB_COLLAPSED_WORDS");
static_assert(sizeof(BBParams::chunk) == 24 && sizeof(BBParams::nchunk) == 24 && sizeof(BBParams::numel_out) == 16,
              "BBParams arrays");
"""
    cubin, _ = _nvrtc.compile_cubin(probe, name_expressions=["bb_finalize<float>"])
    assert cubin
    assert cupy_raw.PARAMS_DTYPE.itemsize == cuda_plan.PARAMS_WORDS * 8
    assert cupy_raw.COLLAPSED_DTYPE.itemsize == cuda_plan.COLLAPSED_WORDS * 8


def ptxas_report(exprs, arch: str = "sm_90") -> dict[str, tuple[int, int]]:
    """{name expression: (registers, spill store bytes)} of binary_backward.cuh's kernels."""
    return ptxas_usage(SOURCE, "bb.cu", exprs, arch=arch)


@needs_nvrtc
def test_best_kernels_fit_their_launch_bounds():
    """bb_rows / bb_batch are built for BB_BEST_MIN_BLOCKS (3) resident 256-thread blocks per SM:
    at most 80 registers, and at most a few dozen bytes of spills (only the 16-bit packed batch
    kernels spill at all); bb_cols for BB_COLS_MIN_BLOCKS (4): at most 64 registers, no spills
    but the one measured below.
    The plan's default occupancy table assumes as much."""
    exprs = [cupy_raw.kernel_expr(k, dt, fn, vec) for k in ("cols", "rows", "batch") for dt in ("bf16", "f32")
             for fn in ("mul", "div", "maximum") for vec in (False, True)]
    report = ptxas_report(exprs)
    assert set(report) == set(exprs)
    for expr, (regs, spill) in report.items():
        assert regs <= 80, (expr, regs)
        assert spill <= 64, (expr, spill)
    assert cuda_plan.BEST_BLOCKS_PER_SM["rows"] == cuda_plan.BEST_BLOCKS_PER_SM["batch"] == 3
    assert "#define BB_BEST_MIN_BLOCKS 3" in SOURCE
    # bb_cols: 4 blocks per SM, so at most 64 registers, and no spills at all
    assert cuda_plan.BEST_BLOCKS_PER_SM["cols"] == 4 and "#define BB_COLS_MIN_BLOCKS 4" in SOURCE
    for expr, (regs, spill) in report.items():
        if expr.startswith("bb_cols<"):
            # One measured exception: bf16 div without the L2 prefetch (BB_BEST_PF 0) spills 12 bytes,
            # and still beats the spill-free prefetching build on the H100 (B = 4096: 92.4% of copy
            # against 88.9%; results/h100/cupy/bcast-3/tune.txt).
            allowed = 16 if expr == "bb_cols<__nv_bfloat16, 3, 8>" else 0
            assert regs <= 64 and spill <= allowed, (expr, regs, spill)


@needs_nvrtc
def test_both_kernel_fits_four_blocks_per_sm():
    """bb_both (both operands broadcast, a short Y) is built for BB_BOTH_MIN_BLOCKS (4) resident
    256-thread blocks per SM, 50% occupancy: at most 64 registers in every dtype, with 4 rows of g
    in flight in f32 (BBBothRows; 1 in the other types) on 16-byte packs, and the fns of the perf
    cases (mul) and those without a division spill nothing.  Measured exceptions (sm_90): f32 div (8
    bytes) and pow (16) with packs, bf16 div / pow (up to 24) with packs, and the f64 div / pow
    builds (up to 152 bytes), whose divisions and pow / log take the registers."""
    exprs = [cupy_raw.kernel_expr("both", dt, fn, vec) for dt in cupy_raw.DTYPES for fn in FNS for vec in (False, True)]
    assert "bb_both<__nv_bfloat16, 2, 8>" in exprs and "bb_both<__half, 2, 8>" in exprs  # 16-byte packs
    assert "bb_both<float, 2, 4>" in exprs and "bb_both<double, 2, 2>" in exprs
    report = ptxas_report(exprs)
    assert set(report) == set(exprs)
    assert cuda_plan.BEST_BLOCKS_PER_SM["both"] == 4 and "#define BB_BOTH_MIN_BLOCKS 4" in SOURCE
    assert "#define BB_YG" not in SOURCE  # BBBothRows' per-type rows unless a host overrides them
    for expr, (regs, spill) in report.items():
        allowed = 0
        if expr in ("bb_both<float, 3, 4>", "bb_both<float, 4, 4>"):
            allowed = 16
        if expr.startswith("bb_both<__nv_bfloat16, 3,") or expr.startswith("bb_both<__nv_bfloat16, 4,"):
            allowed = 24
        if expr.startswith("bb_both<double, 3,") or expr.startswith("bb_both<double, 4,"):
            allowed = 160
        assert regs <= 64 and spill <= allowed, (expr, regs, spill)
    for expr in ("bb_both<float, 2, 4>", "bb_both<__nv_bfloat16, 2, 8>", "bb_both<__half, 2, 8>"):
        assert report[expr][1] == 0, (expr, report[expr])  # the perf case's fn: no spill


@needs_nvrtc
def test_nvrtc_error_carries_the_log():
    with pytest.raises(_nvrtc.NvrtcError, match="undefined_thing"):
        _nvrtc.compile_cubin("__global__ void k() { undefined_thing(); }", name_expressions=["k"])


def _nvcc_instantiations(dt: str) -> str:
    """A .cu that explicitly instantiates every kernel of the .cuh for one dtype and every fn."""
    t = cupy_raw.CUDA_TYPE[dt]
    a = f"bb_acc_t<{t}>"
    pp = f"const __grid_constant__ BBParams, const {t}*, const {t}*, const {t}*"
    lines = [f'#include "{_nvrtc.CUDA_DIR / cupy_raw.SOURCE}"',
             f"template __global__ void bb_finalize<{t}>(const {a}*, long long, long long, {t}*);"]
    for f in range(len(FNS)):
        lines += [
            f"template __global__ void bb_fast<{t}, {f}>(const {t}*, const {t}*, const {t}*, {t}*, {t}*, "
            f"long long, int);",
            f"template __global__ void bb_ew<{t}, {f}>({pp}, {t}*, {t}*);",
            f"template __global__ void bb_lk<{t}, {f}, 1>({pp}, {t}*, {a}*, {t}*, {a}*);",
            f"template __global__ void bb_lk<{t}, {f}, BB_J>({pp}, {t}*, {a}*, {t}*, {a}*);",
            f"template __global__ void bb_lr_stream<{t}, {f}>({pp}, {t}*, {a}*, {t}*);",
            f"template __global__ void bb_lr_batched<{t}, {f}>({pp}, {t}*, {a}*, {t}*, {a}*);",
            f"template __global__ void bb_naive<{t}, {f}>({pp}, {a}*, {a}*);",
            f"template __global__ void bb_opt2<{t}, {f}>(const __grid_constant__ BBCollapsed, const {t}*, "
            f"const {t}*, const {t}*, {t}*, {t}*, {a}*, {a}*);",
        ]
        for v in (1, 16 // cupy_raw.ITEMSIZE[dt]):
            lines += [f"template __global__ void bb_cols<{t}, {f}, {v}>({pp}, {t}*, {a}*, {t}*);",
                      f"template __global__ void bb_rows<{t}, {f}, {v}>({pp}, {t}*, {a}*, {t}*);",
                      f"template __global__ void bb_batch<{t}, {f}, {v}>({pp}, {t}*, {a}*, {t}*, {a}*);",
                      f"template __global__ void bb_both<{t}, {f}, {v}>({pp}, {t}*, {a}*, {t}*);"]
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_every_instantiation(tmp_path):
    # Torch extensions compile with these defines; the .cuh must not rely on implicit half conversions.
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    procs = {}
    for dt in cupy_raw.DTYPES:  # one nvcc per dtype, run side by side
        src, out = tmp_path / f"instantiate_{dt}.cu", tmp_path / f"bb_{dt}.cubin"
        src.write_text(_nvcc_instantiations(dt))
        procs[dt] = (out, subprocess.Popen(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", *defines, "-o", str(out),
                                            str(src)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for dt, (out, proc) in procs.items():
        log, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"nvcc failed for {dt}:\n{log[-5000:]}"
        assert out.stat().st_size > 0


def test_fn_list_is_the_oracles():
    """The C++ fn list (one X-macro, shared by the .cuh and torch_ext's CPU kernel) is the oracle's
    FNS in order: the FN template argument of every kernel is an index into FNS."""
    text = (_nvrtc.CUDA_DIR / "binary_backward_defs.h").read_text()
    listed = re.search(r"#define BB_FNS\(X\) (.*)", text)[1]
    assert tuple(re.findall(r"X\(\w+, (\w+)\)", listed)) == FNS
    assert tuple(re.findall(r"X\((\w+), \w+\)", listed)) == tuple(fn.upper() for fn in FNS)


@needs_nvrtc
def test_launch_record_layout_matches_host_packing():
    """BBLaunch, the record torch_ext's C++ op launches from, has the words and kinds the plan packs."""
    kinds = "\n".join(f'static_assert(BB_KIND_{k.upper()} == {i}, "{k}");' for i, k in enumerate(cuda_plan.KINDS))
    probe = SOURCE + f"""
static_assert(sizeof(BBLaunch) == {cuda_plan.LAUNCH_WORDS} * 8, "BBLaunch size");
static_assert(BB_LAUNCH_WORDS == {cuda_plan.LAUNCH_WORDS}, "BB_LAUNCH_WORDS");
static_assert(BB_NUM_KINDS == {len(cuda_plan.KINDS)}, "kinds");
static_assert(BB_NUM_FNS == {len(FNS)}, "fns");
{kinds}
"""
    cubin, _ = _nvrtc.compile_cubin(probe, name_expressions=["bb_finalize<float>"])
    assert cubin


def test_launch_records_have_the_struct_layout():
    for a_shape, b_shape, _, kind in EMU_CASES:
        plan = _plan(a_shape, b_shape)
        launch = cuda_plan.plan_launch(plan, num_sms=132)
        record = cuda_plan.launch_record(launch, plan, 132)
        box = cuda_plan.box_record(plan)
        assert len(record) == len(box) == cuda_plan.LAUNCH_WORDS
        assert cuda_plan.KINDS[record[0]] == launch.kind and record[3] == plan.numel
        assert record[cuda_plan.LAUNCH_HEADER_WORDS:] == (launch.words or cuda_plan.naive_words(plan))
        for i in range(2):  # stage 2 has a grid exactly where an output has partial rows
            assert (record[8 + i] > 0) == (launch.nchunks[i] > 1)
        assert cuda_plan.KINDS[box[0]] in ("zero", "fast", "ew", "box")
        assert box[cuda_plan.LAUNCH_HEADER_WORDS:] == cuda_plan.naive_words(plan)
        for words in (record, box):  # the three groups tile the box (the C++ side checks it too)
            numels = [_parse(words[cuda_plan.LAUNCH_HEADER_WORDS:]).grp[i].numel for i in range(3)]
            assert math.prod(numels) == plan.numel


def _torch_include_dirs():
    torch = pytest.importorskip("torch")
    from pathlib import Path

    inc = Path(torch.__file__).parent / "include"
    return [inc, inc / "torch" / "csrc" / "api" / "include"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_torch_ext_cuda_sources_compile(tmp_path):
    """Every *_cuda.cu of torch_ext compiles with nvcc against torch's headers, here, with no GPU
    (object files only: nothing links or loads).  A CPU torch wheel lacks one generated CUDA header
    (c10/cuda/impl/cuda_cmake_macros.h); a stand-in with its one define is put first on the path."""
    include = _torch_include_dirs()
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    flags = ["-std=c++17", "-arch=sm_90", "-O0", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
             "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "-w"]
    incs = [f"-I{d}" for d in include] + [f"-I{tmp_path / 'stub'}"]  # the real header, if any, wins
    sources = sorted((_nvrtc.CUDA_DIR.parent / "torch_ext").glob("*_cuda.cu"))
    assert sources
    procs = {src: subprocess.Popen(["nvcc", "-c", *flags, *incs, "-o", str(tmp_path / (src.stem + ".o")), str(src)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for src in sources}
    for src, proc in procs.items():
        log, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"nvcc failed for {src.name}:\n{log[-5000:]}"


# ============================================================================= kernel emulator
#
# Line-by-line ports of the .cuh kernels.  Memory is float64 numpy buffers; pointers are
# (buffer, element offset); every store is counted.  Arithmetic is float64 (the emulator
# checks indexing and structure, not rounding).

BLOCK = cuda_plan.BLOCK
NT = 5
P_, Q_, G_, DP_, DQ_ = range(NT)


class Buf:
    def __init__(self, values: np.ndarray):
        self.v = np.asarray(values, dtype=np.float64).copy()
        self.writes = np.zeros(self.v.size, dtype=np.int64)


class Arr:
    """A strided view of a Buf: what a backend's array is to the host code."""

    def __init__(self, buf: Buf, shape, strides, offset: int = 0, itemsize: int = 4, align: int = 256):
        self.buf, self.shape, self.offset = buf, tuple(shape), offset
        self.strides = tuple(s * itemsize for s in strides)  # bytes, as cupy has them
        self.dtype = np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[itemsize])
        self.address = align + offset * itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def load(self, off: int) -> float:
        assert 0 <= self.offset + off < self.buf.v.size, "load out of bounds"
        return float(self.buf.v[self.offset + off])

    def store(self, off: int, x: float) -> None:
        i = self.offset + off
        assert 0 <= i < self.buf.v.size, "store out of bounds"
        self.buf.v[i] = x
        self.buf.writes[i] += 1

    def values(self) -> np.ndarray:
        item = self.dtype.itemsize
        return np.lib.stride_tricks.as_strided(self.buf.v[self.offset:], self.shape,
                                               tuple(s // item * 8 for s in self.strides)).copy()


def _parse(words):
    w = [int(x) for x in np.asarray(words).reshape(-1)]
    assert len(w) == cuda_plan.PARAMS_WORDS
    groups, i, md = [], 0, cuda_plan.MAX_DIMS
    for _ in range(3):
        groups.append(SimpleNamespace(ndim=w[i], numel=w[i + 1], size=w[i + 2:i + 2 + md],
                                      stride=[w[i + 2 + md * (s + 1):i + 2 + md * (s + 2)] for s in range(NT)]))
        assert groups[-1].numel == math.prod(groups[-1].size[:groups[-1].ndim])
        i += cuda_plan.GROUP_WORDS
    return SimpleNamespace(grp=groups, lanes=w[i], lanes_log2=w[i + 1], chunk=w[i + 2:i + 5], nchunk=w[i + 5:i + 8],
                           ntiles=w[i + 8], swap=w[i + 9], numel_out=w[i + 10:i + 12])


def _unravel(gr, nd, idx, off):
    i = idx
    for d in range(nd - 1, -1, -1):
        if d > 0:
            q = i // gr.size[d]
            r, i = i - q * gr.size[d], q
        else:
            r = i
        for t in range(NT):
            off[t] += r * gr.stride[t][d]


def _offsets(gr, idx):
    off = [0] * NT
    _unravel(gr, gr.ndim, idx, off)
    return off


def _partials(fn, a, b):
    if fn == 0:
        return 1.0, 1.0
    if fn == 1:
        return 1.0, -1.0
    if fn == 2:
        return b, a
    if fn == 3:
        return 1.0 / b, -a / (b * b)
    if fn == 4:
        return b * a ** (b - 1.0), (0.0 if a == 0 and b >= 0 else a ** b * math.log(a))
    wins = a > b if fn == 5 else a < b
    da = 0.5 if a == b else (1.0 if wins else 0.0)
    return da, 1.0 - da


def _terms(fn, p, q, g, swap):
    da, db = _partials(fn, q if swap else p, p if swap else q)
    ta, tb = g * da, g * db
    return (tb, ta) if swap else (ta, tb)


def _uses_operands(fn):
    return fn >= 2


def _store(out, part, nchunk, chunk, numel_out, off, v):
    if nchunk == 1:
        out.store(off, v)
    else:
        part.store(chunk * numel_out + off, v)


def _block_reduce_slots(red, J, nw, lanes):
    """bb_block_reduce_slots after the first barrier: red[j][tid], fixed-order tree over slots."""
    s = nw >> 1
    while s > 0:
        for tid in range(BLOCK):
            if (tid >> (lanes.bit_length() - 1)) < s:
                for j in range(J):
                    red[j][tid] += red[j][tid + s * lanes]
        s >>= 1


def emu_fast(fn, grid, a, b, g, ga, gb, n, vectorized, itemsize):
    V = 16 // itemsize
    step = grid * BLOCK

    def element(i):
        ops = (a.load(i), b.load(i)) if _uses_operands(fn) else (0.0, 0.0)
        ta, tb = _terms(fn, *ops, g.load(i), False)
        ga.store(i, ta)
        gb.store(i, tb)

    done = (n // V) * V if vectorized else 0
    for tid in range(grid * BLOCK):
        if vectorized:
            for i in range(tid, n // V, step):  # one 16-byte pack per step
                for e in range(V):
                    element(i * V + e)
        for i in range(done + tid, n, step):  # scalar tail (everything when not vectorized)
            element(i)


def emu_ew(fn, grid, p, a, b, g, ga, gb):
    K = p.grp[0]
    nd_rows = K.ndim - 1
    ncols = K.size[nd_rows]
    nrows = K.numel // ncols
    tc, tr = p.lanes, cuda_plan.EW_TILE // p.lanes
    assert tc == 1 << p.lanes_log2
    for blk in range(grid):
        for t in range(blk, p.ntiles, grid):
            c0, r0 = (t % p.nchunk[0]) * tc, (t // p.nchunk[0]) * tr
            for tid in range(BLOCK):
                for e in range(cuda_plan.EW_TILE // BLOCK):
                    idx = tid + e * BLOCK
                    col, row = c0 + (idx & (tc - 1)), r0 + (idx >> p.lanes_log2)
                    if col < ncols and row < nrows:
                        off = [col * K.stride[s][nd_rows] for s in range(NT)]
                        _unravel(K, nd_rows, row, off)
                        ops = (a.load(off[P_]), b.load(off[Q_])) if _uses_operands(fn) else (0.0, 0.0)
                        ta, tb = _terms(fn, *ops, g.load(off[G_]), False)
                        ga.store(off[DP_], ta)
                        gb.store(off[DP_], tb)  # as the kernel: both outputs share O's strides


def emu_lk(fn, J, grid, p, P, Q, g, dP, dP_part, dQ, dQ_part):
    K, U, V = p.grp
    kw, lg = p.lanes, p.lanes_log2
    nw = BLOCK >> lg
    UR = 1 if J >= 4 else 4 // J
    swap = p.swap != 0
    assert J > 1 or U.numel == 1
    for blk in range(grid):
        for t in range(blk, p.ntiles, grid):
            kt, rest = t % p.nchunk[0], t // p.nchunk[0]
            cu, cv = rest % p.nchunk[1], rest // p.nchunk[1]
            red = [[0.0] * BLOCK for _ in range(J)]
            keep = {}
            for tid in range(BLOCK):
                lane, w = tid & (kw - 1), tid >> lg
                k = kt * kw + lane
                kok = k < K.numel
                ko = _offsets(K, k if kok else 0)
                uok, pv, goff, dpoff, accp = [], [], [], [], [0.0] * J
                for j in range(J):
                    u = cu * p.chunk[1] + j
                    uok.append(kok and j < p.chunk[1] and u < U.numel)
                    uo = _offsets(U, u if uok[j] else 0)
                    goff.append(ko[G_] + uo[G_])
                    dpoff.append(ko[DP_] + uo[DP_])
                    pv.append(P.load(ko[P_] + uo[P_]) if _uses_operands(fn) and uok[j] else 0.0)
                if kok:
                    v_lo = cv * p.chunk[2]
                    v_hi = min(V.numel, v_lo + p.chunk[2])
                    for v0 in range(v_lo + w, v_hi, nw * UR):
                        for r in range(UR):
                            v = v0 + r * nw
                            if v >= v_hi:
                                continue
                            vo = _offsets(V, v)
                            qv = Q.load(ko[Q_] + vo[Q_]) if _uses_operands(fn) else 0.0
                            sq = 0.0
                            for j in range(J):
                                if uok[j]:
                                    tp, tq = _terms(fn, pv[j], qv, g.load(goff[j] + vo[G_]), swap)
                                    accp[j] += tp
                                    sq += tq
                            if J == 1:  # U empty: always final
                                assert p.nchunk[1] == 1 and dQ_part is None
                                dQ.store(ko[DQ_] + vo[DQ_], sq)
                            else:
                                _store(dQ, dQ_part, p.nchunk[1], cu, p.numel_out[1], ko[DQ_] + vo[DQ_], sq)
                for j in range(J):
                    red[j][tid] = accp[j]
                keep[tid] = (w, uok, dpoff)
            _block_reduce_slots(red, J, nw, kw)
            for tid, (w, uok, dpoff) in keep.items():
                if w == 0:
                    for j in range(J):
                        if uok[j]:
                            _store(dP, dP_part, p.nchunk[2], cv, p.numel_out[0], dpoff[j], red[j][tid])


def emu_lr_stream(fn, grid, p, P, Q, g, dP, dP_part, dQ):
    X, _, Z = p.grp
    xw, lg = p.lanes, p.lanes_log2
    spw, nseg = 32 >> lg, BLOCK >> lg
    swap = p.swap != 0
    for blk in range(grid):
        for warp in range(BLOCK // 32):
            warp_seg0 = warp * spw
            t0 = blk * nseg + warp_seg0
            while t0 < p.ntiles:  # warp-uniform
                acc = {}
                for tid in range(warp * 32, warp * 32 + 32):
                    lane, seg = tid & (xw - 1), tid >> lg
                    task = t0 + (seg - warp_seg0)
                    valid = task < p.ntiles
                    cx, z = (task % p.nchunk[0], task // p.nchunk[0]) if valid else (0, 0)
                    zo = _offsets(Z, z)
                    accp = 0.0
                    if valid:
                        pv = P.load(zo[P_]) if _uses_operands(fn) else 0.0
                        x_lo = cx * p.chunk[0]
                        x_hi = min(X.numel, x_lo + p.chunk[0])
                        for x0 in range(x_lo + lane, x_hi, xw * 4):
                            for r in range(4):
                                x = x0 + r * xw
                                if x >= x_hi:
                                    continue
                                xo = _offsets(X, x)
                                qv = Q.load(zo[Q_] + xo[Q_]) if _uses_operands(fn) else 0.0
                                tp, tq = _terms(fn, pv, qv, g.load(zo[G_] + xo[G_]), swap)
                                accp += tp
                                dQ.store(zo[DQ_] + xo[DQ_], tq)
                    acc[tid] = (seg, lane, valid, cx, zo, accp)
                for tid, (seg, lane, valid, cx, zo, _) in acc.items():  # bb_segment_sum
                    if valid and lane == 0:
                        total = sum(v[5] for v in acc.values() if v[0] == seg)
                        _store(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[DP_], total)
                t0 += grid * nseg


def emu_lr_batched(fn, grid, p, P, Q, g, dP, dP_part, dQ, dQ_part):
    X, Y, Z = p.grp
    J = cuda_plan.J_BATCH
    xw, lg = p.lanes, p.lanes_log2
    nw = BLOCK >> lg
    swap = p.swap != 0
    for blk in range(grid):
        for t in range(blk, p.ntiles, grid):
            cx, rest = t % p.nchunk[0], t // p.nchunk[0]
            cy, z = rest % p.nchunk[1], rest // p.nchunk[1]
            zo = _offsets(Z, z)
            th = []
            for tid in range(BLOCK):
                lane = tid & (xw - 1)
                xok, qv, goff, dqoff = [], [], [], []
                for j in range(J):
                    x = cx * p.chunk[0] + j * xw + lane
                    xok.append(x < X.numel)
                    xo = _offsets(X, x if xok[j] else 0)
                    goff.append(zo[G_] + xo[G_])
                    dqoff.append(zo[DQ_] + xo[DQ_])
                    qv.append(Q.load(zo[Q_] + xo[Q_]) if _uses_operands(fn) and xok[j] else 0.0)
                th.append(SimpleNamespace(lane=lane, w=tid >> lg, xok=xok, qv=qv, goff=goff, dqoff=dqoff,
                                          accq=[0.0] * J))
            y_lo = cy * p.chunk[1]
            y_hi = min(Y.numel, y_lo + p.chunk[1])
            for y0 in range(y_lo, y_hi, nw):
                sp = [0.0] * BLOCK
                yos = {}
                for tid, s in enumerate(th):
                    y = y0 + s.w
                    if y < y_hi:
                        yo = yos[tid] = _offsets(Y, y)
                        pv = P.load(zo[P_] + yo[P_]) if _uses_operands(fn) else 0.0
                        for j in range(J):
                            if s.xok[j]:
                                tp, tq = _terms(fn, pv, s.qv[j], g.load(s.goff[j] + yo[G_]), swap)
                                sp[tid] += tp
                                s.accq[j] += tq
                for tid, s in enumerate(th):  # bb_segment_sum: lanes tid - lane .. + xw
                    if tid in yos and s.lane == 0:
                        total = sum(sp[tid:tid + xw])
                        _store(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[DP_] + yos[tid][DP_], total)
            red = [[th[tid].accq[j] for tid in range(BLOCK)] for j in range(J)]
            _block_reduce_slots(red, J, nw, xw)
            for tid, s in enumerate(th):
                if s.w == 0:
                    for j in range(J):
                        if s.xok[j]:
                            _store(dQ, dQ_part, p.nchunk[1], cy, p.numel_out[1], s.dqoff[j], red[j][tid])


def emu_naive(fn, grid, p, a, b, g, acc_a, acc_b):
    K, RA, RB = p.grp
    n = K.numel * RA.numel * RB.numel
    for i in range(n):  # grid-stride coverage of 0..n-1 is trivial
        rb, ra, k = i % RB.numel, (i // RB.numel) % RA.numel, i // RB.numel // RA.numel
        off = _offsets(K, k)
        _unravel(RA, RA.ndim, ra, off)
        _unravel(RB, RB.ndim, rb, off)
        da, db = _partials(fn, a.load(off[0]), b.load(off[1]))
        gv = g.load(off[2])
        acc_a.buf.v[acc_a.offset + off[3]] += gv * da  # atomicAdd
        acc_b.buf.v[acc_b.offset + off[4]] += gv * db


def emu_finalize(grid, part, nchunks, n, out):
    for i in range(n):
        out.store(i, sum(part.load(c * n + i) for c in range(nchunks)))


class EmuDevice:
    """cupy_raw's device interface, running the emulated kernels."""

    def __init__(self, num_sms: int, itemsize: int = 4):
        self.sms, self.itemsize, self.launches, self.parts = num_sms, itemsize, [], []

    def num_sms(self):
        return self.sms

    def ptr(self, x):
        return x.address

    def empty(self, n, dtype):
        part = Arr(Buf(np.full(n, np.nan)), (n,), (1,), itemsize=np.dtype(dtype).itemsize)
        self.parts.append(part)
        return part

    def zeros(self, n, dtype):
        return Arr(Buf(np.zeros(n)), (n,), (1,), itemsize=np.dtype(dtype).itemsize)

    def fill_zero(self, x):
        for i in range(x.size):
            x.store(i, 0.0)

    def launch(self, expr, grid, args):
        self.launches.append(expr)
        name, targs = expr.split("<", 1)
        targs = [s.strip() for s in targs.rstrip(">").split(",")]
        fn = int(targs[1]) if len(targs) > 1 else None
        args = [None if isinstance(x, np.uint64) and int(x) == 0 else x for x in args]
        if name != "bb_fast" and name != "bb_finalize":
            assert isinstance(args[0], np.ndarray) and args[0].dtype == cupy_raw.PARAMS_DTYPE and args[0].size == 1
            args[0] = _parse(args[0]["words"][0])
        if name == "bb_fast":
            emu_fast(fn, grid, *args[:5], int(args[5]), int(args[6]), self.itemsize)
        elif name == "bb_ew":
            emu_ew(fn, grid, *args)
        elif name == "bb_lk":
            emu_lk(fn, int(targs[2]), grid, *args)
        elif name == "bb_lr_stream":
            emu_lr_stream(fn, grid, *args)
        elif name == "bb_lr_batched":
            emu_lr_batched(fn, grid, *args)
        elif name == "bb_naive":
            emu_naive(fn, grid, *args)
        elif name == "bb_finalize":
            emu_finalize(grid, args[0], int(args[1]), int(args[2]), args[3])
        else:
            raise AssertionError(f"unknown kernel {expr}")


# ============================================================================= emulated runs


def _layout(values: np.ndarray, layout: str, itemsize: int):
    """(Arr, float64 values) with the HostTensor layouts: contig, transposed, sliced; NaN gaps."""
    shape = values.shape
    if layout == "transposed" and values.ndim >= 2:
        stored = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        strides = list(_bcast_plan.contiguous_strides(stored.shape))
        strides[-1], strides[-2] = strides[-2], strides[-1]
        return Arr(Buf(stored.reshape(-1)), shape, strides, 0, itemsize), values
    if layout == "sliced" and values.ndim >= 1:
        wide = np.full(shape[:-1] + (2 * shape[-1] + 1,), np.nan)
        wide[..., 1::2][..., :shape[-1]] = values
        strides = list(_bcast_plan.contiguous_strides(wide.shape))
        strides[-1] = 2
        return Arr(Buf(wide.reshape(-1)), shape, strides, 1, itemsize), values
    return Arr(Buf(values.reshape(-1)), shape, _bcast_plan.contiguous_strides(shape), 0, itemsize), values


def _inputs(fn, a_shape, b_shape, rng):
    out_shape = _bcast_plan.broadcast_shape(a_shape, b_shape)
    if fn in ("maximum", "minimum"):
        grid = np.array([-1.0, -0.5, 0.5, 1.0])
        a, b = rng.choice(grid, a_shape), rng.choice(grid, b_shape)
    elif fn == "pow":
        a, b = rng.uniform(0.5, 2.0, a_shape), rng.uniform(-2.0, 2.0, b_shape)
    else:
        a = rng.uniform(0.5, 2.0, a_shape) * rng.choice([-1.0, 1.0], a_shape)
        b = rng.uniform(0.5, 2.0, b_shape) * rng.choice([-1.0, 1.0], b_shape)
    return np.asarray(a, float), np.asarray(b, float), rng.uniform(-2.0, 2.0, out_shape)


def _emulate(fn, a_shape, b_shape, layouts=("contig",) * 3, variant="opt", num_sms=1, itemsize=4, seed=0,
             misalign=False):
    rng = np.random.default_rng(seed)
    a_val, b_val, g_val = _inputs(fn, a_shape, b_shape, rng)
    (a, _), (b, _), (g, _) = (_layout(v, lay, itemsize) for v, lay in zip((a_val, b_val, g_val), layouts))
    if misalign:
        a.address += itemsize
    ga = Arr(Buf(np.full(max(a.size, 1), np.nan)), a_shape, _bcast_plan.contiguous_strides(a_shape), 0, itemsize)
    gb = Arr(Buf(np.full(max(b.size, 1), np.nan)), b_shape, _bcast_plan.contiguous_strides(b_shape), 0, itemsize)
    plan = _bcast_plan.make_plan(a.shape, b.shape, *(cupy_raw.element_strides(x, n) for x, n in
                                                     ((a, "a"), (b, "b"), (g, "grad_out"))))
    dev = EmuDevice(num_sms, itemsize)
    dt = {2: "f16", 4: "f32", 8: "f64"}[itemsize]
    run = cupy_raw.run_opt if variant == "opt" else cupy_raw.run_naive
    launch = run(dev, dt, fn, a, b, g, ga, gb, plan)
    want_a, want_b = binary_backward_numpy(fn, a_val, b_val, g_val)
    for name, arr, want in (("grad_a", ga, want_a), ("grad_b", gb, want_b)):
        if arr.size:
            np.testing.assert_allclose(arr.values(), want, rtol=1e-12, atol=1e-12, err_msg=f"{name} {dev.launches}")
            assert (arr.buf.writes[:arr.size] == 1).all(), f"{name}: elements written {arr.buf.writes} times"
    for part in dev.parts:  # every partial row element written exactly once
        assert (part.buf.writes == 1).all(), f"partial rows written {part.buf.writes} times"
    return launch, dev


# (A, B, layouts, expected kernel): every kernel and role, broadcast on either side.
EMU_CASES = [
    ((2, 3, 5), (2, 3, 5), ("contig",) * 3, "fast"),
    ((), (), ("contig",) * 3, "fast"),
    ((7, 5), (7, 5), ("transposed", "contig", "contig"), "ew"),
    ((6, 9), (6, 9), ("contig", "sliced", "transposed"), "ew"),
    ((37,), (37,), ("sliced", "contig", "contig"), "ew"),
    ((3, 4, 40), (40,), ("contig",) * 3, "lk1"),            # bias-like: RB rows, P = b
    ((40,), (3, 4, 40), ("contig",) * 3, "lk1"),            # mirrored: RA rows, P = a
    ((3, 70, 6), (3, 1, 6), ("contig",) * 3, "lk1"),        # (8,2048,4096)+(8,1,4096) shape class
    ((3, 1, 5), (1, 4, 5), ("contig",) * 3, "lk8"),         # both broadcast, lanes along K
    ((9, 1, 5), (1, 20, 5), ("contig", "contig", "transposed"), None),
    ((5, 1, 3), (1, 11, 3), ("transposed", "sliced", "contig"), None),
    ((4, 50), (4, 1), ("contig",) * 3, "lr_stream"),        # row reduction, P = b
    ((4, 1), (4, 50), ("contig",) * 3, "lr_stream"),        # row reduction, P = a
    ((300,), (), ("contig",) * 3, "lr_stream"),             # scalar b
    ((), (3, 7), ("contig",) * 3, "lr_stream"),             # scalar a
    ((3, 1, 70), (1, 5, 1), ("contig",) * 3, "lr_batched"),  # both broadcast, lanes reduced
    ((1, 9, 1), (6, 1, 45), ("contig",) * 3, "lr_batched"),
    ((2, 6, 1), (2, 6, 33), ("sliced", "transposed", "transposed"), None),
    ((2, 1, 4, 3), (1, 5, 4, 1), ("transposed", "transposed", "sliced"), None),
    ((0, 3), (1, 3), ("contig",) * 3, "zero"),
]


@pytest.mark.parametrize("a_shape,b_shape,layouts,kind", EMU_CASES,
                         ids=[f"{a}+{b}-{'/'.join(lay)}" for a, b, lay, _ in EMU_CASES])
def test_emulated_opt_matches_oracle(a_shape, b_shape, layouts, kind):
    for i, fn in enumerate(FNS):
        launch, _ = _emulate(fn, a_shape, b_shape, layouts, seed=i)
        if kind is not None:
            assert launch.kind == kind


@pytest.mark.parametrize("a_shape,b_shape", [((3, 300, 10), (10,)), ((5, 600), (5, 1)), ((600,), ()),
                                             ((40, 1, 6), (1, 50, 6)), ((2, 1, 90), (1, 60, 1)),
                                             ((20, 1, 3), (1, 17, 3))])
def test_emulated_chunked_reductions(monkeypatch, a_shape, b_shape):
    """Small MIN_ITEMS and many SMs force several chunks: partial rows plus bb_finalize."""
    monkeypatch.setattr(cuda_plan, "MIN_ITEMS_PER_THREAD", 1)
    launch, dev = _emulate("mul", a_shape, b_shape, num_sms=64)
    assert max(launch.nchunks) > 1 and any("bb_finalize" in x for x in dev.launches)


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4, 5), (5,)), ((4, 50), (4, 1)), ((3, 1, 5), (1, 4, 5)),
                                             ((6, 7), (6, 7)), ((), ())])
def test_emulated_naive_matches_oracle(a_shape, b_shape):
    for fn in FNS:
        _emulate(fn, a_shape, b_shape, variant="naive")


@pytest.mark.parametrize("itemsize,misalign", [(4, False), (2, False), (8, False), (4, True)])
def test_emulated_fast_path_vectorization(itemsize, misalign):
    launch, _ = _emulate("div", (3, 37), (3, 37), itemsize=itemsize, misalign=misalign)
    assert launch.kind == "fast" and launch.vectorized is (not misalign)


# ============================================================================= planning


def _plan(a_shape, b_shape):
    return _bcast_plan.make_plan(a_shape, b_shape, _bcast_plan.contiguous_strides(a_shape),
                                 _bcast_plan.contiguous_strides(b_shape),
                                 _bcast_plan.contiguous_strides(_bcast_plan.broadcast_shape(a_shape, b_shape)))


@pytest.mark.parametrize("a_shape,b_shape,kind,lanes,swap", [
    ((8, 2048, 4096), (4096,), "lk1", 32, True),
    ((8, 2048, 4096), (8, 2048, 1), "lr_stream", 32, True),
    ((8, 2048, 4096), (8, 1, 4096), "lk1", 32, True),
    ((8, 1, 4096), (8, 2048, 4096), "lk1", 32, False),
    ((3, 1, 5), (1, 4, 5), "lk8", 8, False),
    ((64, 1, 1024), (1, 64, 1), "lr_batched", 32, True),
    ((8, 2048, 4096), (8, 2048, 4096), "fast", None, False),
])
def test_plan_launch_for_important_patterns(a_shape, b_shape, kind, lanes, swap):
    launch = cuda_plan.plan_launch(_plan(a_shape, b_shape), num_sms=132)
    assert launch.kind == kind and launch.swap is swap
    if lanes is not None:
        p = _parse(launch.words)
        assert p.lanes == lanes and 1 << p.lanes_log2 == lanes
        assert p.ntiles >= 1 and launch.grid <= 132 * cuda_plan.BLOCKS_PER_SM * cuda_plan.MAX_GRID_WAVES
        assert all(1 <= n <= cuda_plan.MAX_CHUNKS for n in launch.nchunks)


def test_bias_plan_tiles_and_chunks():
    launch = cuda_plan.plan_launch(_plan((8, 2048, 4096), (4096,)), num_sms=132)
    p = _parse(launch.words)
    assert p.nchunk[0] == 4096 // 32 and p.nchunk[1] == 1          # 128 k tiles, U empty
    assert 2 <= p.nchunk[2] <= 64 and p.chunk[2] * p.nchunk[2] >= 8 * 2048  # a few row chunks cover V
    assert launch.nchunks == (p.nchunk[2], 1) and launch.numel_out == (4096, 8 * 2048 * 4096)


def test_row_reduction_plan_has_few_chunks():
    launch = cuda_plan.plan_launch(_plan((8, 2048, 4096), (8, 2048, 1)), num_sms=132)
    p = _parse(launch.words)
    assert p.nchunk[2] == 8 * 2048 and p.nchunk[0] <= 4 and p.chunk[0] % 32 == 0
    assert p.ntiles == p.nchunk[0] * p.nchunk[2]


def test_huge_case_uses_bounded_chunks_and_grid():
    """Over 2**31 elements: chunk counts and the grid stay bounded, words stay int64."""
    launch = cuda_plan.plan_launch(_plan((4, 2**20, 1024), (1024,)), num_sms=132)
    assert max(launch.nchunks) <= cuda_plan.MAX_CHUNKS and launch.grid < 2**31
    assert _parse(launch.words).grp[2].numel == 4 * 2**20
    launch = cuda_plan.plan_launch(_plan((2**31 + 7,), (2**31 + 7,)), num_sms=132, itemsize=2)
    assert launch.kind == "fast" and launch.grid <= 132 * 32


@pytest.mark.parametrize("n,min_per,base,target,multiple", [
    (16384, 64, 128, 2112, 1), (16384, 64, 1, 2112, 1), (5, 64, 1, 2112, 1), (4096, 256, 16384, 16896, 32),
    (10**9, 8, 1, 10**6, 32), (1, 1, 1, 1, 1)])
def test_split_chunks_invariants(n, min_per, base, target, multiple):
    nchunks, size = cuda_plan.split_chunks(n, min_per, base, target, multiple)
    assert 1 <= nchunks <= cuda_plan.MAX_CHUNKS
    assert size % multiple == 0 and (nchunks - 1) * size < n <= nchunks * size
    assert nchunks == 1 or size >= min_per


def test_sorted_group_puts_g_fast_dim_last():
    grp = _bcast_plan.Group([3, 4, 5], {"a": [1, 3, 12], "b": [0, 0, 0], "g": [1, 15, 3], "ga": [20, 5, 1],
                                        "gb": [0, 0, 0]})
    s = cuda_plan._sorted_group(grp)
    assert s.sizes == [4, 5, 3] and s.strides["g"] == [15, 3, 1] and s.strides["a"] == [3, 12, 1]


def test_params_words_roundtrip():
    plan = _plan((2, 3, 4), (3, 1))
    launch = cuda_plan.plan_launch(plan, num_sms=4)
    arg = cupy_raw.params_struct(launch.words)
    assert arg.size == 1 and arg.nbytes == cuda_plan.PARAMS_WORDS * 8
    assert list(arg["words"][0]) == launch.words


def test_kernel_exprs():
    assert cupy_raw.kernel_expr("lk8", "f16", "mul") == "bb_lk<__half, 2, 8>"
    assert cupy_raw.kernel_expr("lk1", "bf16", "add") == "bb_lk<__nv_bfloat16, 0, 1>"
    assert cupy_raw.kernel_expr("finalize", "f64") == "bb_finalize<double>"
    assert cupy_raw.kernel_expr("lr_stream", "f32", "minimum") == "bb_lr_stream<float, 6>"


# ============================================================================= backend surface


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_gpu_visible(), reason="a CUDA device is visible")
def test_cupy_backend_reports_no_device():
    reason = cupy_raw.check("cuda")
    assert reason is not None and reason.startswith("cupy: no CUDA device"), reason
    assert cupy_raw.check("cpu") == "cupy: runs on cuda, not cpu"
    assert cupy_raw.cupy_backend.unavailable_reason("cpu").startswith("cupy: runs on cuda")


def test_cupy_backend_registers_the_ladder():
    impls = cupy_raw.cupy_backend.impls
    assert impls[("binary_backward", "opt")].deterministic and not impls[("binary_backward", "naive")].deterministic
    assert set(impls[("binary_backward", "opt")].dtypes) == {"f32", "f16", "bf16", "f64"}
    ladder = [v for (op, v) in impls if op == "binary_backward"]
    assert ladder == ["naive", "opt", "opt2", "best"]  # registration order: speedups are against naive
    assert impls[("binary_backward", "best")].deterministic and not impls[("binary_backward", "opt2")].deterministic


def test_importing_the_backend_does_not_import_cupy():
    code = "import sys; import backends.cupy.binary_backward, backends.cupy.nvrtc; assert 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_nvrtc.CUDA_DIR.parent.parent))


def _args(a_shape=(2, 3), b_shape=(3,), g_shape=None, dtype=np.float32, ga_shape=None, fn="mul"):
    g_shape = _bcast_plan.broadcast_shape(a_shape, b_shape) if g_shape is None else g_shape
    ins = {"a": np.zeros(a_shape, dtype), "b": np.zeros(b_shape, dtype), "grad_out": np.zeros(g_shape, dtype)}
    outs = {"grad_a": np.zeros(a_shape if ga_shape is None else ga_shape, dtype), "grad_b": np.zeros(b_shape, dtype)}
    return ins, outs, {"fn": fn}


def test_check_args_messages():
    assert cupy_raw.check_args(*_args()) == ("f32", "mul")
    with pytest.raises(ValueError, match=r"binary_backward: grad_out has shape \(2, 4\), expected \(2, 3\)"):
        cupy_raw.check_args(*_args(g_shape=(2, 4)))
    with pytest.raises(ValueError, match=r"binary_backward: grad_a has shape \(3,\), expected \(2, 3\)"):
        cupy_raw.check_args(*_args(ga_shape=(3,)))
    with pytest.raises(ValueError, match="binary_backward: fn is 'tan', expected one of add, sub"):
        cupy_raw.check_args(*_args(fn="tan"))
    with pytest.raises(TypeError, match="binary_backward: a has dtype int32, expected one of float32"):
        cupy_raw.check_args(*_args(dtype=np.int32))
    ins, outs, params = _args()
    ins["b"] = ins["b"].astype(np.float64)
    with pytest.raises(TypeError, match=r"binary_backward: b has dtype float64, expected float32 \(the dtype of a\)"):
        cupy_raw.check_args(ins, outs, params)
    ins, outs, params = _args(a_shape=(3, 4), b_shape=(4,))
    outs["grad_a"] = np.zeros((4, 3), np.float32).T
    with pytest.raises(ValueError, match="binary_backward: grad_a must be C-contiguous"):
        cupy_raw.check_args(ins, outs, params)
