"""The cupy conv dgrad / wgrad kernels (backends/cuda/conv_backward_{data,weight}.cuh) without a GPU.

* Compile: every instantiation the plans launch compiles for sm_90 with NVRTC, and with nvcc
  when present; ConvParams has the word count the plan packs.
* Fast divmod: the plan's (mul, shift) reproduce n // d exactly, exhaustively over the ranges the
  kernels divide (every divisor and dividend range of the smoke and full case sets, and every
  divisor up to 2048 over a range of dividends), and at the 2**31 limit.
* Stand-in: the .cuh kernels compiled by g++ against tests/cuda_host (a fiber per thread, warp
  collectives for mma.sync emulated lane by lane), launched by the cupy backend's own host code
  (backends/cupy/_conv.py: plans, ConvParams bytes, phase table, workspace, finish) on a numpy
  device, registered as a numpy backend so the harness's run_case judges each smoke case:
  NaN-poisoned outputs, repeats bitwise equal, the stale-output recheck, the float64 oracle.
  Every dgrad variant and dtype, 1D/2D/3D, stride, dilation, groups, both layouts, strided views.

What this cannot check: timing and the GPU's own rounding (the host has no FMA contraction);
scripts/gpu/cuda_conv.sh runs the same cases on the device.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from math import prod

import numpy as np
import pytest

import cuda_host
from backends._plans import conv_cuda as plan
from backends.cupy import _conv
from backends.cupy import nvrtc as _nvrtc
from cases import select
from harness.registry import Backend
from harness.runner import run_case
from oracle import conv_common as cc
from nvrtc_mark import needs_nvrtc

OPS = ("conv_backward_data", "conv_backward_weight")
DGRAD_VARIANTS = ("div", "fastdiv_load", "fastdiv")
DGRAD_KERNELS = ("cv_dgrad", "cv_dgrad_vec", "cv_dgrad_dw", "cv_dgrad_smallc")  # (params, dy, w, dx, table)
WGRAD_KERNELS = ("cv_wgrad", "cv_wgrad_vec", "cv_wgrad_dw", "cv_wgrad_taps")  # (params, dy, x, dw, ws)


WHY = cuda_host.available()
needs_host = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")


# ============================================================================= compile


@needs_nvrtc
@pytest.mark.parametrize("op", OPS)
def test_nvrtc_compiles_every_instantiation(op):
    exprs = [e for dt in _conv.DTYPES for e in plan.all_exprs(op, dt)]
    cubin, lowered = _nvrtc.compile_cubin(_nvrtc.read_source(_conv.SOURCES[op]), arch="sm_90", name_expressions=exprs)
    for expr in exprs:
        assert lowered[expr].encode() in cubin, f"{expr} missing from the cubin"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("op", OPS)
def test_nvcc_compiles_every_instantiation(op, tmp_path):
    exprs = [e for dt in _conv.DTYPES for e in plan.all_exprs(op, dt)]
    src = tmp_path / "inst.cu"
    inst = "\n".join(f"template __global__ void {_declare(e)};" for e in exprs)
    src.write_text(f'#include "{_nvrtc.CUDA_DIR / _conv.SOURCES[op]}"\n{inst}\n')
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-o", str(tmp_path / "x.cubin"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _declare(expr: str) -> str:
    """An explicit instantiation's declarator for a name expression."""
    name, targs = expr.split("<", 1)
    t = targs.split(",")[0].rstrip(">").strip()
    acc = f"typename CvType<{t}>::Acc"
    if name in DGRAD_KERNELS:
        return f"{expr}(const ConvParams, const {t}*, const {t}*, {t}*, const int*)"
    if name in WGRAD_KERNELS:
        return f"{expr}(const ConvParams, const {t}*, const {t}*, {t}*, {acc}*)"
    return f"{expr}(const ConvParams, const {acc}*, {t}*)"


def test_params_word_count_matches_the_header():
    text = (_nvrtc.CUDA_DIR / "conv_common.cuh").read_text()
    start = text.index("struct ConvParams {")
    body = "\n".join(line.split("//")[0] for line in text[start:text.index("};", start)].splitlines()[1:])
    count = 0
    for decl in body.split(";"):
        if "long long" not in decl:
            continue
        for name in decl.replace("long long", "").split(","):
            name = name.strip()
            count += int(name[name.index("[") + 1:name.index("]")]) if "[" in name else 1
    assert count == plan.WORDS
    assert f"#define CV_WORDS {plan.WORDS}" in text
    for macro, value in (("CV_BM", plan.BM), ("CV_BM_TC", plan.BM_TC), ("CV_BN", plan.BN), ("CV_BK", plan.BK),
                         ("CV_THREADS", plan.THREADS)):
        assert re.search(rf"^#define {macro} {value}\b", text, re.M), macro
    assert f"#define CVD_HEAD {plan.DGRAD_HEAD}" in (_nvrtc.CUDA_DIR / "conv_backward_data.cuh").read_text()


# ============================================================================= fast divmod


def _divisions(case):
    """(divisor, dividend bound) of every division the kernels make for a case."""
    g = plan.geo3(case.params, case.op)
    out = []
    if case.op == "conv_backward_data":
        for T, _, _ in plan.phases(g):
            m = g.n * prod(T)
            out += [(T[2], m), (T[1], _cdiv(m, T[2])), (T[0], _cdiv(m, T[2] * T[1]))]
            if g.cig * g.cog < plan.DIRECT_MAX:  # the direct kernel's element -> (row, channel) split
                out.append((g.cin, m * g.cin))
    else:
        rows = g.n * prod(g.out)
        o = g.out
        out += [(o[2], rows), (o[1], _cdiv(rows, o[2])), (o[0], _cdiv(rows, o[2] * o[1]))]
    return out


def _cdiv(a, b):
    return -(-a // b)


def test_fast_divmod_is_exact_over_every_case_range():
    bounds: dict[int, int] = {}
    for tag in ("smoke", "full"):
        for op in OPS:
            for case in select(tag, op=op):
                for d, n in _divisions(case):
                    bounds[d] = max(bounds.get(d, 0), n)
    assert bounds
    for d, n in sorted(bounds.items()):
        x = np.arange(n, dtype=np.uint64)
        assert np.array_equal(plan.fast_div(x, d), x // np.uint64(d)), d


def test_fast_divmod_is_exact_for_small_divisors_and_at_the_limit():
    x = np.arange(1 << 17, dtype=np.uint64)
    top = np.uint64(2 ** 31) - np.arange(1, 1 << 12, dtype=np.uint64)
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 2 ** 31, 1 << 14).astype(np.uint64)
    for d in list(range(1, 2049)) + [3 * 2 ** k for k in range(20)] + [2 ** 31 - 1, 2 ** 30 + 1, 100003]:
        for n in (x, top, rand):
            assert np.array_equal(plan.fast_div(n, d), n // np.uint64(d)), d
    with pytest.raises(ValueError):
        plan.magic(0)


# ============================================================================= plans


def test_dgrad_phases_cover_every_input_position_once():
    for case in select("smoke", op="conv_backward_data"):
        g = plan.geo3(case.params, case.op)
        seen = np.zeros(g.inp, dtype=int)
        for T, i0, taps in plan.phases(g):
            idx = np.ix_(*(i0[j] + g.s[j] * np.arange(T[j]) for j in range(3)))
            seen[idx] += 1
            for kd, kh, kw, cd, ch, cw in taps:  # the tap's window: i = o*s + k*d - p
                for j, (k, c) in enumerate(((kd, cd), (kh, ch), (kw, cw))):
                    assert (i0[j] + g.p[j] - k * g.d[j]) == c * g.s[j]
        assert (seen == 1).all(), case.id


def test_wgrad_splits_fill_the_gpu_and_stay_in_grid_limits():
    params = dict(n=32, cin=64, cout=64, spatial=[56, 56], kernel=[3, 3], padding=[1, 1], stride=[1, 1],
                  dilation=[1, 1], groups=1, layout="channels_last")
    la = plan.wgrad_plan(params, "bf16", (56 * 56 * 64, 56 * 64, 64, 1), (56 * 56 * 64, 56 * 64, 64, 1),
                         (9 * 64, 3 * 64, 64, 1), 132)
    splits = la.words[42]
    assert splits > 1 and la.finish is not None
    assert la.grid[0] * la.grid[1] >= 4 * 132
    assert la.grid[1] <= plan.GRID_Y_MAX


def _nhwc(n, c, h, w):
    """Contiguous channels-last element strides in (n, h, w, c) order."""
    return (h * w * c, w * c, c, 1)


def _wgrad_stem(cin=3, cout=64, groups=1, per_tap=False, dt="bf16"):
    """The ResNet stem's wgrad (N=32, 224x224, 7x7, stride 2, pad 3) planned for an H100 (132 SMs)."""
    params = dict(n=32, cin=cin, cout=cout, spatial=[224, 224], kernel=[7, 7], padding=[3, 3], stride=[2, 2],
                  dilation=[1, 1], groups=groups, layout="channels_last")
    return plan.wgrad_plan(params, dt, _nhwc(32, cout, 112, 112), _nhwc(32, cin, 224, 224),
                           (49 * cin // groups, 7 * cin // groups, cin // groups, 1), 132, aligned=True,
                           per_tap=per_tap)


def test_wgrad_stem_plans_the_merged_taps():
    la = _wgrad_stem()
    cblocks, splits, chunk, taps = la.words[41], la.words[42], la.words[43], la.words[44]
    assert la.expr == "cv_wgrad_taps<__nv_bfloat16, 64>"
    assert taps == 49 and cblocks == _cdiv(49 * 3, plan.BN) == 3  # the 147 (tap, ci) columns
    assert la.grid == (cblocks, splits)  # one output-channel block, no taps in y
    assert la.grid[0] * la.grid[1] >= 4 * 132 - cblocks and chunk >= 8 * plan.BK
    assert splits * chunk >= 32 * 112 * 112 > (splits - 1) * chunk
    assert la.finish is not None and la.ws_elems == splits * 64 * 49 * 3
    assert _wgrad_stem(dt="f32").expr == "cv_wgrad_taps<float, 64>"


def test_wgrad_merged_taps_only_where_the_tile_is_mostly_padding():
    assert _wgrad_stem(per_tap=True).expr == "cv_wgrad<__nv_bfloat16, 64>"  # @pertap: a GEMM per tap
    assert _wgrad_stem(cin=64).expr == "cv_wgrad_vec<__nv_bfloat16, 64>"
    assert _wgrad_stem(cin=plan.MERGE_CIG_MAX).expr.startswith("cv_wgrad_vec<")
    assert _wgrad_stem(cin=6, groups=2).expr == "cv_wgrad<__nv_bfloat16, 64>"  # Cin/g 3, but grouped
    assert _wgrad_stem(cin=1, cout=8).expr == "cv_wgrad_dw<__nv_bfloat16>"      # direct keeps priority


# ============================================================================= stand-in


def _signature(expr: str) -> list[str]:
    name, targs = expr.split("<", 1)
    t = targs.split(",")[0].rstrip(">").strip()
    acc = "double" if t == "double" else "float"
    if name in DGRAD_KERNELS:
        return ["ConvParams", f"const {t}*", f"const {t}*", f"{t}*", "const int*"]
    if name in WGRAD_KERNELS:
        return ["ConvParams", f"const {t}*", f"const {t}*", f"{t}*", f"{acc}*"]
    return ["ConvParams", f"const {acc}*", f"{t}*"]


_KERNELS: dict = {}


def _kernels(op: str, dt: str):
    key = (op, dt)
    if key not in _KERNELS:
        exprs = plan.all_exprs(op, dt)
        _KERNELS[key] = cuda_host.Kernels(f"{op}-{dt}", f'#include "{_nvrtc.CUDA_DIR / _conv.SOURCES[op]}"',
                                          {e: _signature(e) for e in exprs})
    return _KERNELS[key]


class HostConvDevice:
    """backends/cupy/_conv.py's device on the CPU: numpy buffers, the kernels on the stand-in."""

    def __init__(self, sms: int = 3):
        self.sms = sms

    def launch(self, source, expr, grid, block, args):
        op = next(o for o, s in _conv.SOURCES.items() if s == source)
        t = expr.split("<", 1)[1].split(",")[0].rstrip(">").strip()
        dt = next(k for k, v in plan.CUDA_TYPE.items() if v == t)
        args = [None if isinstance(a, np.uint64) else a for a in args]
        _kernels(op, dt).launch(expr, grid, block, args)

    def empty(self, n, dtype):
        return np.full(n, np.nan, dtype=dtype)  # a partial read before it is written shows

    def upload(self, a):
        return a

    def ptr(self, x):
        return cuda_host.data_address(x)

    def num_sms(self):
        return self.sms


convhost = Backend("convhost", framework="numpy", devices=("cpu",), register=False,
                   description="the cupy conv kernels' CUDA source run on the CPU (tests/cuda_host)")
_ENTRIES: dict = {}


def _impl(op: str, variant: str, sms: int, aligned: bool = False, gemm: bool = False):
    """aligned=True plans as if every pointer were 16-byte aligned (the channels-last fast path where
    it applies): the stand-in's cp.async copies any address, so the path's index math is checked on
    the harness's guarded buffers too.  gemm=True: the GEMM kernels even for small channel groups
    (plan.DIRECT_MAX 0), so the smoke set's small cases test their tiles' edges."""
    dev = HostConvDevice(sms)
    names = ("dy", "w", "dx") if op == "conv_backward_data" else ("dy", "x", "dw")

    def fn(inputs, outs, params):
        a, b, out = inputs[names[0]], inputs[names[1]], outs[names[2]]
        key = (op, variant, sms, aligned, gemm, a.dtype, a.shape, a.strides, b.shape, b.strides, out.strides,
               _conv.params_key(params))
        entry = _ENTRIES.get(key)
        if entry is None:
            saved = plan.DIRECT_MAX
            plan.DIRECT_MAX = 0 if gemm else saved
            try:
                entry = _ENTRIES[key] = _conv.make_entry(op, variant, a, b, out, params, dev, aligned)
            finally:
                plan.DIRECT_MAX = saved
            kind = entry.launch.expr.split("<")[0]
            merged = variant != "pertap" and _taps_case(op, params, gemm)
            small = variant == "best" and _smallc_case(op, params, gemm)
            assert kind.endswith("_vec") == (aligned and _vec_case(op, params, a) and not merged and not small), \
                entry.launch.expr
            assert kind.endswith("_dw") == (not gemm and _direct_case(op, params)), entry.launch.expr
            assert (kind == "cv_wgrad_taps") == merged, entry.launch.expr
            assert (kind == "cv_dgrad_smallc") == small, entry.launch.expr
        _conv.run(op, entry, dev, a, b, out)
    return fn


for _v in DGRAD_VARIANTS:
    convhost.impl("conv_backward_data", variant=_v, dtypes=_conv.DTYPES, deterministic=True)(
        _impl("conv_backward_data", _v, 3))
for _v in DGRAD_VARIANTS:
    convhost.impl("conv_backward_data", variant=f"{_v}_gemm", dtypes=_conv.DTYPES, deterministic=True)(
        _impl("conv_backward_data", _v, 3, gemm=True))
convhost.impl("conv_backward_weight", variant="best_gemm", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_weight", "best", 3, gemm=True))
for _v in DGRAD_VARIANTS:
    convhost.impl("conv_backward_data", variant=f"{_v}_vec", dtypes=_conv.DTYPES, deterministic=True)(
        _impl("conv_backward_data", _v, 3, aligned=True))
convhost.impl("conv_backward_weight", variant="best_vec", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_weight", "best", 3, aligned=True))
convhost.impl("conv_backward_weight", variant="best", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_weight", "best", 3))
convhost.impl("conv_backward_weight", variant="one_split", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_weight", "best", 0))  # 0 SMs: one chunk, the block writes dw itself
convhost.impl("conv_backward_weight", variant="pertap", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_weight", "pertap", 3))
convhost.impl("conv_backward_data", variant="best", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_data", "best", 3))
convhost.impl("conv_backward_data", variant="best_vec", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_data", "best", 3, aligned=True))
convhost.impl("conv_backward_data", variant="best_gemm", dtypes=_conv.DTYPES, deterministic=True)(
    _impl("conv_backward_data", "best", 3, gemm=True))


def _vec_case(op, params, a) -> bool:
    """What the plan's vec_ok decides, restated: 16-bit, channels last, contiguous views, channels per
    group multiples of 8."""
    g = cc.geometry(params, op)
    views = ("dy_layout", "w_layout") if op == "conv_backward_data" else ("dy_layout", "x_layout")
    return (a.dtype.itemsize == 2 and g.channels_last and (g.cin // g.groups) * (g.cout // g.groups) >= plan.DIRECT_MAX and all(params.get(k, "contig") == "contig" for k in views)
            and (g.cin // g.groups) % 8 == 0 and (g.cout // g.groups) % 8 == 0)


def _direct_case(op, params) -> bool:
    g = cc.geometry(params, op)
    return (g.cin // g.groups) * (g.cout // g.groups) < plan.DIRECT_MAX


def _taps_case(op, params, gemm=False) -> bool:
    """Where wgrad_plan merges the taps (unless per_tap), restated: groups 1, Cin below MERGE_CIG_MAX,
    more than one tap, not a direct case (unless gemm)."""
    g = cc.geometry(params, op)
    return (op == "conv_backward_weight" and g.groups == 1 and g.cin < plan.MERGE_CIG_MAX and prod(g.kernel) > 1
            and (gemm or not _direct_case(op, params)))


def _smallc_case(op, params, gemm=False) -> bool:
    """Where dgrad_plan takes cv_dgrad_smallc for small_cin, restated: groups 1, Cin up to SMALLC_MAX,
    not a direct case (unless gemm)."""
    g = cc.geometry(params, op)
    return (op == "conv_backward_data" and g.groups == 1 and g.cin <= plan.SMALLC_MAX
            and (gemm or not _direct_case(op, params)))


def _check(op, variant, case):
    result = run_case(convhost.impls[(op, variant)], case, "cpu", run_seed=0, repeats=1)
    assert result.status == "PASS", f"{variant} {case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


def _small(case) -> bool:
    """Cases small enough for the stand-in at every variant (the rest run at @fastdiv only)."""
    g = cc.geometry(case.params, case.op)
    return g.macs <= 200_000


DSMOKE = select("smoke", op="conv_backward_data")
WSMOKE = select("smoke", op="conv_backward_weight")


@needs_host
@pytest.mark.parametrize("case", DSMOKE, ids=[c.id for c in DSMOKE])
def test_dgrad_smoke(case):
    _check("conv_backward_data", "fastdiv", case)
    if _smallc_case(case.op, case.params):
        _check("conv_backward_data", "best", case)
    elif _smallc_case(case.op, case.params, gemm=True):  # a direct case: the small-Cin kernel still checked
        _check("conv_backward_data", "best_gemm", case)
    g = cc.geometry(case.params, case.op)
    if _direct_case(case.op, case.params):
        _check("conv_backward_data", "fastdiv_gemm", case)
    if max(g.stride) > 1 and _small(case):  # the coordinate-mapping variants differ on strided cases
        for v in ("div", "fastdiv_load"):
            _check("conv_backward_data", v, case)
            if _direct_case(case.op, case.params):
                _check("conv_backward_data", f"{v}_gemm", case)


@needs_host
@pytest.mark.parametrize("case", WSMOKE, ids=[c.id for c in WSMOKE])
def test_wgrad_smoke(case):
    _check("conv_backward_weight", "best", case)
    if _direct_case(case.op, case.params):
        _check("conv_backward_weight", "best_gemm", case)
    if _small(case):
        _check("conv_backward_weight", "one_split", case)
    if _taps_case(case.op, case.params):  # best took the merged GEMM: the per-tap GEMM checked too
        _check("conv_backward_weight", "pertap", case)


# Channels-last cases for the 16-byte fast path (16-bit, channels per group multiples of 8): stride,
# dilation, padding, groups, 1D / 3D, tails of the 64-wide tiles, and long reductions (wgrad splits).
def _vcase(op, dtype, **p):
    from cases.registry import Case
    from harness.registry import get_op

    rank = len(p["spatial"])
    full = {"stride": [1] * rank, "padding": [0] * rank, "dilation": [1] * rank, "groups": 1,
            "layout": "channels_last", **{k: ([v] * rank if isinstance(v, int) and k in ("stride", "padding",
                                                                                          "dilation") else v)
                                          for k, v in p.items()}}
    c = Case(op, dtype, full, frozenset({"full"}), "test")
    get_op(op).validate(c)
    return c


VEC_GEOS = [
    dict(n=2, cin=16, cout=24, spatial=[7, 9], kernel=[3, 3], stride=2, padding=1),
    dict(n=1, cin=8, cout=72, spatial=[6, 5], kernel=[3, 3], padding=2, dilation=2),
    dict(n=2, cin=80, cout=16, spatial=[5, 6], kernel=[1, 1], stride=2),
    dict(n=2, cin=16, cout=32, spatial=[6, 6], kernel=[3, 3], padding=1, groups=2),
    dict(n=2, cin=8, cout=8, spatial=[21], kernel=[5], stride=3, padding=2),
    dict(n=1, cin=8, cout=16, spatial=[4, 5, 6], kernel=[3, 1, 3], stride=[2, 1, 1], padding=[1, 0, 1]),
    dict(n=4, cin=16, cout=8, spatial=[20, 20], kernel=[3, 3], padding=1),
]
VEC_CASES = [_vcase(op, dt, **geo) for geo in VEC_GEOS for op in OPS for dt in ("bf16", "f16")][:len(VEC_GEOS) * 4]


@needs_host
@pytest.mark.parametrize("case", VEC_CASES, ids=[c.id for c in VEC_CASES])
def test_channels_last_fast_path(case):
    if case.op == "conv_backward_data":
        _check(case.op, "fastdiv_vec", case)
        if case.dtype == "bf16" and max(case.params["stride"]) > 1:
            for v in ("div_vec", "fastdiv_load_vec"):
                _check(case.op, v, case)
    else:
        _check(case.op, "best_vec", case)


# Cases for the merged-tap path (cv_wgrad_taps): Cin 1-5, stride, padding, dilation, 1D / 2D / 3D,
# both layouts, Cout over one 64-row tile, 147 columns (3 column blocks); at the stand-in's 3 SMs the
# N=4 case splits its 1600 pairs in 7 chunks, and one_split writes dw from the block itself; Cin=8
# channels-last bf16 takes the merged GEMM, not the 16-byte path (best_vec).
TAPS_GEOS = [
    dict(n=3, cin=1, cout=70, spatial=[40], kernel=[5], stride=3, padding=2, dilation=2),
    dict(n=2, cin=3, cout=24, spatial=[9, 9], kernel=[3, 3], stride=2, padding=1),
    dict(n=2, cin=3, cout=16, spatial=[15, 15], kernel=[7, 7], stride=2, padding=3),
    dict(n=4, cin=5, cout=16, spatial=[20, 20], kernel=[3, 3], padding=1),
    dict(n=2, cin=8, cout=16, spatial=[10, 10], kernel=[3, 3], padding=1),
    dict(n=1, cin=2, cout=40, spatial=[4, 5, 6], kernel=[3, 2, 3], stride=[2, 1, 1], padding=[1, 0, 1],
         dilation=[1, 2, 1]),
]
TAPS_CASES = [_vcase("conv_backward_weight", dt, layout=lay, **geo) for geo in TAPS_GEOS for dt in ("f32", "bf16")
              for lay in ("channels_last", "channels_first")]


@needs_host
@pytest.mark.parametrize("case", TAPS_CASES, ids=[c.id for c in TAPS_CASES])
def test_wgrad_merged_taps(case):
    _check(case.op, "best", case)  # its plan asserts cv_wgrad_taps (_impl)
    _check(case.op, "pertap", case)
    if case.params["n"] == 2:
        _check(case.op, "one_split", case)
    if case.dtype == "bf16" and case.params["layout"] == "channels_last":  # aligned: merged ahead of the 16-byte path
        _check(case.op, "best_vec", case)


# Cases for the small-Cin dgrad (cv_dgrad_smallc, cupy@best): the merged-tap geometries as dgrad, plus
# Cin 6 (8 register slots, 2 past Cin), a phase with no taps (stride 2, a 1x1 kernel: those positions 0),
# Cout over one 32-channel chunk and not a multiple of it, more than 4 taps a phase (the 7x7 stem).
SMALLC_GEOS = TAPS_GEOS + [
    dict(n=2, cin=6, cout=40, spatial=[8, 9], kernel=[3, 3], stride=2, padding=1),
    dict(n=2, cin=3, cout=16, spatial=[9, 9], kernel=[1, 1], stride=2),
]
SMALLC_CASES = [_vcase("conv_backward_data", dt, layout=lay, **geo) for geo in SMALLC_GEOS
                for dt in ("f32", "bf16") for lay in ("channels_last", "channels_first")]


@needs_host
@pytest.mark.parametrize("case", SMALLC_CASES, ids=[c.id for c in SMALLC_CASES])
def test_dgrad_small_cin(case):
    _check(case.op, "best", case)  # its plan asserts cv_dgrad_smallc (_impl)
    if case.params["layout"] == "channels_last":  # aligned: dy as 16-byte words where Cout allows
        _check(case.op, "best_vec", case)


def test_dgrad_small_cin_plans():
    def launch(cin, cout, dt="bf16", aligned=True, small_cin=True):
        params = dict(n=32, cin=cin, cout=cout, spatial=[224, 224], kernel=[7, 7], padding=[3, 3], stride=[2, 2],
                      dilation=[1, 1], groups=1, layout="channels_last")
        return plan.dgrad_plan(params, dt, _nhwc(32, cout, 112, 112), (49 * cin, 7 * cin, cin, 1),
                               _nhwc(32, cin, 224, 224), "fastdiv", aligned, small_cin=small_cin)

    la = launch(3, 64)
    assert la.expr == "cv_dgrad_smallc<__nv_bfloat16, 3, true>"
    assert la.grid == (_cdiv(32 * 112 * 112, plan.SMALLC_THREADS), 4) and la.block == plan.SMALLC_THREADS
    assert launch(3, 64, aligned=False).expr.endswith(", 3, false>")
    assert launch(3, 60).expr.endswith(", 3, false>")  # Cout not whole 16-byte words
    assert launch(6, 64, dt="f32").expr == "cv_dgrad_smallc<float, 8, true>"
    assert launch(16, 64).expr.startswith("cv_dgrad_vec<")  # above SMALLC_MAX: the GEMM
    assert launch(3, 64, small_cin=False).expr == "cv_dgrad<__nv_bfloat16, 2>"  # @fastdiv: the GEMM tile
