"""The cupy matmul_backward kernels (backends/cuda/matmul_backward.cuh) and their host side, on the CPU.

* The .cuh compiles for sm_90 with NVRTC (every instantiation the plan can launch) and nvcc,
  and its #defines are the plan's constants.
* The exact host code of the cupy backend (`run`, the plan of backends/_plans/) launches the
  kernels on the stand-in (tests/cuda_host: a fiber per thread, real barriers, warp-collective
  ldmatrix / mma, deferred cp.async); `harness.runner.run_case` judges every rung on the smoke
  set and on multi-tile cases: NaN-poisoned outputs, repeats bitwise equal (the stand-in's
  thread schedules change between calls), the float64 oracle and its tolerance.
* mm_mma directly on every operand orientation, with and without 16-byte copies, on tails of
  every dim (partial 16-byte chunks included), several folds and output batches.

Not checked here: timing and the GPU's own rounding; scripts/gpu/cuda_mm.sh runs the same on the device.
"""
from __future__ import annotations

import shutil
import subprocess
from itertools import product

import numpy as np
import pytest

import cuda_host
from backends._plans import matmul_backward_cuda as mmplan
from backends.cupy import matmul_backward as mm
from backends.cupy import nvrtc as _nvrtc
from backends.cupy.common import element_strides
from cases import select
from cases.registry import Case
from harness.registry import Backend, get_op
from harness.runner import run_case
from nvrtc_mark import needs_nvrtc

OP = mm.OP
WHY = cuda_host.available()
needs_host = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")
SOURCE = _nvrtc.read_source(mm.SOURCE)


def _dtype(expr: str) -> str:
    """The element type a kernel name expression instantiates (mm_sgemm: float32 only)."""
    if expr.startswith("mm_sgemm<"):
        return "f32"
    targ = expr.split("<", 1)[1].split(",")[0].rstrip(">").strip()
    return next(k for k, v in mmplan.CUDA_TYPE.items() if v == targ)


def _signature(expr: str) -> list[str]:
    t = mmplan.CUDA_TYPE[_dtype(expr)]
    return ["MMGemm", f"const {t}*", f"const {t}*", "const long long*", f"{t}*"]


_KERNELS: dict = {}


def kernels(dt: str) -> cuda_host.Kernels:
    if dt not in _KERNELS:
        src = f'#include "{_nvrtc.CUDA_DIR / mm.SOURCE}"\n'
        _KERNELS[dt] = cuda_host.Kernels(f"matmul-{dt}", src, {e: _signature(e) for e in mmplan.all_kernel_exprs(dt)})
    return _KERNELS[dt]


class HostDevice:
    """`mm.run`'s device on the CPU: numpy arrays, the .cuh's kernels on the stand-in."""

    def __init__(self, force_scalar: bool = False):
        self.force_scalar = force_scalar
        self.launches: list = []

    def launch(self, launch: mmplan.Launch, args) -> None:
        expr = launch.expr.replace(", true>", ", false>") if self.force_scalar else launch.expr
        dt = _dtype(expr)
        self.launches.append(expr)
        kernels(dt).launch(expr, launch.grid, launch.block, [args[0].tobytes(), *args[1:]], smem=launch.smem)

    def ptr(self, x) -> int:
        return cuda_host.data_address(x)

    def fill_zero(self, x) -> None:
        x[...] = 0

    def table(self, entry, g):
        return g.off


mmhost = Backend("mmhost", framework="numpy", devices=("cpu",), register=False,
                 description="the cupy matmul_backward kernels' CUDA source run on the CPU (tests/cuda_host)")
RUNGS = mmplan.VARIANTS
DEVICES = {name: HostDevice() for name in RUNGS}
DEVICES["best_scalar"] = HostDevice(force_scalar=True)  # mm_mma's / mm_sgemm's element-load path


def _impl(name: str):
    variant = name.removesuffix("_scalar")

    def fn(inputs, outs, params):
        a, b, dy = inputs["a"], inputs["b"], inputs["dy"]
        dt = mm.dtypes.short_or_none(a.dtype)
        entry = mm.entry_for(dt, a.shape, element_strides(a, "a"), b.shape, element_strides(b, "b"), dy.shape,
                             element_strides(dy, "dy"))
        mm.run(DEVICES[name], variant, entry, {"a": a, "b": b, "dy": dy, "da": outs["da"], "db": outs["db"]})
    return fn


for _name in DEVICES:
    mmhost.impl(OP, variant=_name, dtypes=mm.DTYPES, deterministic=True)(_impl(_name))


def _check(name: str, case) -> None:
    impl = mmhost.impls[(OP, name)]
    result = run_case(impl, case, "cpu", run_seed=0)
    assert result.status == "PASS", f"{impl.id} {case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


def _case(a, b, dtype="bf16", **layouts):
    c = Case(OP, dtype, {"a": list(a), "b": list(b), **layouts}, frozenset({"full"}), "test")
    get_op(OP).validate(c)
    return c


SMOKE = select("smoke", op=OP)


@needs_host
@pytest.mark.parametrize("case", SMOKE, ids=[c.id for c in SMOKE])
def test_every_rung_on_the_smoke_set(case):
    for name in RUNGS:
        _check(name, case)
    if case.dtype != "f64":
        _check("best_scalar", case)


# Several tiles in i and j (128 x 128 tiles), a reduction tail, every layout, folds.
MULTI = [
    _case((136, 40), (40, 130)),
    _case((136, 40), (40, 130), "f16", b_layout="transposed"),
    _case((136, 48), (48, 136), a_layout="transposed"),
    _case((2, 72, 48), (48, 24), "f16", dy_layout="transposed"),
    _case((3, 1, 24, 32), (2, 32, 16), "bf16"),
    _case((40, 24), (3, 24, 136), "bf16", b_layout="transposed"),
    _case((24, 40), (40, 72), "bf16", a_layout="sliced", b_layout="sliced"),
    _case((136, 40), (40, 72), "f32"),
    _case((2, 132, 36), (36, 136), "f32", b_layout="transposed"),
    _case((3, 1, 20, 44), (2, 44, 132), "f32", a_layout="transposed"),
    _case((2, 20, 72), (72, 136), "f64", a_layout="transposed"),
]


@needs_host
@pytest.mark.parametrize("case", MULTI, ids=[c.id for c in MULTI])
def test_best_on_multi_tile_cases(case):
    _check("best", case)
    if case.dtype != "f64":
        _check("best_scalar", case)


def test_perf_layouts_get_16_byte_copies():
    """The perf cases' GEMMs (contiguous, b transposed, batched) all take mm_mma's 16-byte path,
    in the orientation their layout gives."""
    seen = set()
    for a, b, bt in [((4096, 4096), (4096, 14336), False), ((4096, 4096), (4096, 4096), True),
                     ((2, 2048, 4096), (4096, 4096), True), ((32, 2048, 128), (32, 128, 2048), False)]:
        a_str = mmplan_contig(a)
        b_str = mmplan_contig(b) if not bt else mmplan_contig(b[:-2] + (b[-1], b[-2]))[:-2] + (1, b[-2])
        y = np.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])
        for g in mmplan.plan_call(a, a_str, b, b_str, y, mmplan_contig(y)):
            assert mmplan.vec_ok(g, 0, 0), g
            launch = mmplan.choose(g, "best", "bf16", True)
            assert launch.expr.endswith("true>") and launch.block == 256
            assert launch.smem == mmplan.smem_bytes(*mmplan.orientation(g), int(launch.expr.split(", ")[1]))
            seen.add(mmplan.orientation(g))
    assert seen == {(False, False), (False, True), (True, True)}  # (True, False) needs dy transposed


def mmplan_contig(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def test_batch_folds_are_in_batch_order():
    """da of a (2, 1, M, K) against b (3, K, N): each of a's 2 batch elements folds b's 3, in order;
    db (3 of them) folds a's 2."""
    a, b = (2, 1, 4, 8), (3, 8, 16)
    y = (2, 3, 4, 16)
    da, db = mmplan.plan_call(a, mmplan_contig(a), b, mmplan_contig(b), y, mmplan_contig(y))
    assert (da.P, da.F, db.P, db.F) == (2, 3, 3, 2)
    t = da.off.reshape(2, 3, 2)
    assert t[1, 2].tolist() == [(1 * 3 + 2) * 64, 2 * 128]  # dy batch (1, 2), b batch 2
    t = db.off.reshape(3, 2, 2)
    assert t[2, 1].tolist() == [1 * 32, (1 * 3 + 2) * 64]  # a batch 1, dy batch (1, 2)


# ----------------------------------------------------------------------------- mm_mma directly


def _bits16(x: np.ndarray, dt: str) -> np.ndarray:
    if dt == "f16":
        return x.astype(np.float16)
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16)


def _folded_gemm(xt: bool, yt: bool, shape, mult: int, draw):
    """(Gemm, X buffer, Y buffer, X, Y, C) of a folded GEMM test: shape (I, J, R, F, P); X and Y stored
    [F*P][rows][stride], rows along the strided dim, the contiguous one inner (along i for X where xt,
    along j for Y where yt), row strides multiples of `mult` past the extent, drawn by draw(shape);
    X [k][i][r], Y [k][r][j] and the wanted C [p][i][j] in float64."""
    I, J, R, F, P = shape
    pad = lambda n: -(-n // mult) * mult + mult  # noqa: E731
    xr_rows, xc = (R, I) if xt else (I, R)
    yr_rows, yc = (R, J) if yt else (J, R)
    xs, ys = pad(xc), pad(yc)
    xbuf, ybuf = draw((P * F, xr_rows, xs)), draw((P * F, yr_rows, ys))
    xv = xbuf.astype(np.float64)[:, :, :xc]
    yv = ybuf.astype(np.float64)[:, :, :yc]
    X = np.swapaxes(xv, 1, 2) if xt else xv
    Y = yv if yt else np.swapaxes(yv, 1, 2)
    want = np.einsum("kir,krj->kij", X, Y).reshape(P, F, I, J).sum(axis=1)
    g = mmplan.Gemm("da", "dy", "b", I, J, R, F, P,
                    1 if xt else xs, xs if xt else 1, ys if yt else 1, 1 if yt else ys,
                    np.array([[k * xr_rows * xs, k * yr_rows * ys] for k in range(P * F)], dtype=np.int64).reshape(-1))
    assert mmplan.orientation(g) == (xt, yt)
    return g, xbuf, ybuf, X, Y, want


@needs_host
@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("xt, yt, vec", list(product((False, True), repeat=3)))
def test_mma_kernel_tails_and_folds(xt, yt, vec, bm):
    """C = sum over 2 folds of X·Y, 2 output batches, I, J past one tile and R past one k tile, none
    a multiple of 8: partial zero-filled 16-byte chunks at every tail (rows padded to stride 8k)."""
    dt = "bf16" if xt == yt else "f16"
    I, J, R, F, P = 131, 133, 45, 2, 2
    rng = np.random.default_rng(7)
    g, xbuf, ybuf, X, Y, want = _folded_gemm(
        xt, yt, (I, J, R, F, P), 8, lambda s: _bits16(rng.standard_normal(s).astype(np.float32), dt))
    assert mmplan.vec_ok(g, 0, 0)
    launch = mmplan.choose(g, "best", dt, vec, bm)
    assert launch.expr.startswith(f"mm_mma<{mmplan.CUDA_TYPE[dt]}, {bm}, ")
    c = np.full(P * I * J, np.nan, dtype=xbuf.dtype)
    for sched in range(cuda_host.SCHEDULES):
        c[...] = np.nan
        kernels(dt).launch(launch.expr, launch.grid, launch.block, [mm.gemm_struct(launch.words).tobytes(), xbuf,
                           ybuf, g.off, c], smem=launch.smem, schedule=sched)
        got = c.astype(np.float64).reshape(P, I, J)
        assert not np.isnan(got).any()
        scale = np.sqrt(np.einsum("kir,krj->kij", X ** 2, Y ** 2).reshape(P, F, I, J).sum(axis=1))
        # the output's rounding (half an ulp of the 16-bit format) plus fp32 accumulation
        u_out = 2.0 ** -8 if dt == "bf16" else 2.0 ** -11
        err = np.abs(got - want) / (u_out * np.abs(want) + 1e-5 * scale)
        assert (err <= 1).all(), (launch.expr, sched, float(err.max()))


# ----------------------------------------------------------------------------- compile checks


@needs_nvrtc
def test_nvrtc_compiles_every_instantiation_and_constants_match():
    probe = SOURCE + f"""
static_assert(MM_BLOCK == {mmplan.BLOCK} && MM_V == {mmplan.V} && MM_BM == {mmplan.BM} && MM_BN == {mmplan.BN}, "tiles");
static_assert(mm_x_elems<false, 64>() == 64 * (MM_BK + MM_PAD), "BM 64");
static_assert(MM_BK == {mmplan.BK} && MM_STAGES == {mmplan.STAGES} && MM_PAD == {mmplan.PAD}, "pipeline");
static_assert(sizeof(MMGemm) == {mmplan.GEMM_WORDS} * 8 && MM_GEMM_WORDS == {mmplan.GEMM_WORDS}, "MMGemm");
""" + "".join(f'static_assert(mm_mma_smem<{mmplan._b(x)}, {mmplan._b(y)}, {bm}>() == {mmplan.smem_bytes(x, y, bm)}, '
              '"smem");\n' for x, y in product((False, True), repeat=2) for bm in (64, 128))
    exprs = [e for dt in mm.DTYPES for e in mmplan.all_kernel_exprs(dt)]
    cubin, lowered = _nvrtc.compile_cubin(probe, arch="sm_90", name_expressions=exprs)
    for expr in exprs:
        assert lowered[expr].encode() in cubin, expr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_every_instantiation(tmp_path):
    lines = [f'#include "{_nvrtc.CUDA_DIR / mm.SOURCE}"']
    for dt in mm.DTYPES:
        for expr in mmplan.all_kernel_exprs(dt):
            t = mmplan.CUDA_TYPE[dt]
            lines.append(f"template __global__ void {expr}(const __grid_constant__ MMGemm, const {t}*, const {t}*, "
                         f"const long long*, {t}*);")
    src = tmp_path / "mm.cu"
    src.write_text("\n".join(lines) + "\n")
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    out = tmp_path / "mm.cubin"
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas=-v", *defines, "-o", str(out),
                           str(src)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    spills = [int(w) for w in __import__("re").findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert spills and not any(spills), "register spills"


@needs_nvrtc
def test_mma_kernels_fit_two_blocks_per_sm():
    """mm_mma is built for 2 resident 256-thread blocks per SM (__launch_bounds__(256, 2)): at most
    128 registers with no spills, and 2 blocks' shared memory fits an H100 SM (227 KiB)."""
    import re

    from cupy.cuda import nvrtc

    exprs = [e for dt in ("bf16", "f16") for e in mmplan.all_kernel_exprs(dt) if e.startswith("mm_mma")]
    prog = nvrtc.createProgram(SOURCE, "mm.cu", [], [])
    try:
        for e in exprs:
            nvrtc.addNameExpression(prog, e)
        nvrtc.compileProgram(prog, list(_nvrtc.compile_options(("-Xptxas=-v", "-arch=sm_90"))))
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(regs) == len(exprs) and max(regs) <= 128, regs
    assert not any(spills), spills
    assert all(2 * mmplan.smem_bytes(x, y, bm) <= 227 * 1024 for x, y in product((False, True), repeat=2)
               for bm in (64, 128))


def test_cupy_host_checks_on_numpy_arrays():
    """The cupy impl's own checks (beyond argcheck's): dense outputs, no output sharing memory with
    an input or the other output; run on numpy arrays (the same attributes as cupy's)."""
    a, b, dy = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32), np.ones((8, 4), np.float32)
    da, db = np.empty((8, 16), np.float32), np.empty((16, 4), np.float32)
    entry = mm._checked_entry(a, b, dy, da, db)
    assert [g.out for g in entry.gemms] == ["da", "db"]
    mm._check_overlap({"a": a, "b": b, "dy": dy, "da": da, "db": db})
    with pytest.raises(ValueError, match="da must be C-contiguous"):
        mm._checked_entry(a, b, dy, np.empty((16, 8), np.float32).T, db)
    with pytest.raises(ValueError, match="db shares memory with b"):
        mm._check_overlap({"a": a, "b": b, "dy": dy, "da": da, "db": b})
    buf = np.empty(8 * 16 + 64, np.float32)
    with pytest.raises(ValueError, match="da shares memory with db"):
        mm._check_overlap({"a": a, "b": b, "dy": dy, "da": buf[:128].reshape(8, 16), "db": buf[120:184].reshape(16, 4)})
    with pytest.raises(TypeError, match="expected one of"):
        mm._checked_entry(a.astype(np.int32), b, dy, da, db)


# ----------------------------------------------------------------------------- mm_sgemm directly


@needs_host
@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("xt, yt, vec", list(product((False, True), repeat=3)))
def test_sgemm_kernel_tails_and_folds(xt, yt, vec, bm):
    """mm_sgemm (float32) on every operand orientation, with and without 16-byte loads: C = sum over 2
    folds of X·Y, 2 output batches, I and J past one 128 tile and R past several 8-deep steps.  With
    16-byte loads the contiguous extents are multiples of 4 (vec4_ok's rule) but not of the tile; without
    them none is (I, J, R odd); J % 4 picks the vector or the element store of the output."""
    I, J, R = (132, 136, 44) if vec else (131, 133, 45)
    if bm == 64:  # past two 64 tiles
        I, J = I - 60, J - 60
    F, P = 2, 2
    rng = np.random.default_rng(11)
    g, xbuf, ybuf, X, Y, want = _folded_gemm(xt, yt, (I, J, R, F, P), 4,
                                             lambda s: rng.uniform(-2, 2, s).astype(np.float32))
    assert mmplan.vec4_ok(g, 0, 0) == vec
    launch = mmplan.choose(g, "best", "f32", vec, bm)
    assert launch.expr == f"mm_sgemm<{bm}, {bm}, {mmplan._b(xt)}, {mmplan._b(yt)}, {mmplan._b(vec)}>"
    assert launch.block == bm * bm // 64
    scale = np.sqrt(np.einsum("kir,krj->kij", X ** 2, Y ** 2).reshape(P, F, I, J).sum(axis=1))
    c = np.empty(P * I * J, dtype=np.float32)
    for sched in range(cuda_host.SCHEDULES):
        c[...] = np.nan
        kernels("f32").launch(launch.expr, launch.grid, launch.block, [mm.gemm_struct(launch.words).tobytes(), xbuf,
                              ybuf, g.off, c], smem=launch.smem, schedule=sched)
        got = c.astype(np.float64).reshape(P, I, J)
        assert not np.isnan(got).any()
        # float32 accumulation over F * R terms plus the output's rounding
        err = np.abs(got - want) / (2.0 ** -24 * np.abs(want) + 2.0 ** -24 * np.sqrt(F * R) * 4 * scale)
        assert (err <= 1).all(), (launch.expr, sched, float(err.max()))


def test_best_takes_16_byte_sgemm_loads_on_the_f32_perf_case():
    """float32 1024^3 (contiguous): both GEMMs of @best launch mm_sgemm with 16-byte loads, on 64 x 64
    tiles; a transposed or sliced operand, or an extent off the 4-grid, falls back to element loads."""
    a = b = (1024, 1024)
    for g in mmplan.plan_call(a, mmplan_contig(a), b, mmplan_contig(b), (1024, 1024), mmplan_contig((1024, 1024))):
        assert mmplan.vec4_ok(g, 0, 0) and mmplan.vec4_ok(g, 16, 32) and not mmplan.vec4_ok(g, 8, 0)
        # 64 tiles of 128 x 128 would leave half the SMs idle: 256 of 64 x 64
        assert mmplan.choose(g, "best", "f32", True).expr.startswith("mm_sgemm<64, 64, ")
        assert mmplan.choose(g, "best", "bf16", False).expr.startswith("mm_mma<")
        assert mmplan.choose(g, "best", "f64", False).expr.startswith("mm_smem<double, 64, 64, ")
    a, b = (1024, 1026), (1026, 1024)
    assert not all(mmplan.vec4_ok(g, 0, 0) for g in mmplan.plan_call(a, mmplan_contig(a), b, mmplan_contig(b),
                                                                        (1024, 1024), mmplan_contig((1024, 1024))))
