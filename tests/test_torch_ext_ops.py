"""torch_ext's reduce_sum, layernorm_backward and rmsnorm_backward custom ops on the CPU: the public
ops (functional and .out) against the float64 oracle in every form (axes, keepdim, sum_to_shape;
weight and bias present or not; N from 1 to 65536; M = 1; strided views), their fake (meta)
kernels, their errors, and the CUDA plans they would hand the extension (made here with stand-in
CUDA tensors: every plan must name a kernel instantiation the .cu files build).

The harness's smoke cases of the three ops run through tests/test_correctness.py
(`-k "torch_ext and (reduce_sum or norm)"`).  Builds the extension once per process (about 30 s
on a cold build folder; cached after).
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends import torch_ext  # noqa: E402
from backends.torch_ext import _norm  # noqa: E402
from backends.torch_ext import reduce_sum as trs  # noqa: E402
from oracle.layernorm_backward import layernorm_backward_numpy  # noqa: E402
from oracle.reduce_sum import reduce_sum_numpy  # noqa: E402
from oracle.rmsnorm_backward import rmsnorm_backward_numpy  # noqa: E402

EPS = 1e-5
ops = None


def extension_ops():
    """torch.ops.gradoracle with the extension built and loaded (the test fails where it cannot be)."""
    reason = torch_ext._check("cpu")
    if reason:
        pytest.fail(reason)
    return torch.ops.gradoracle


@pytest.fixture(scope="module", autouse=True)
def ext():
    global ops
    ops = extension_ops()


def view(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values in a transposed (last two dims swapped in memory) or sliced (stride 2) view."""
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced" and t.dim() >= 1:
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1] + 1, dtype=t.dtype)
        big[..., : 2 * t.shape[-1] : 2] = t
        return big[..., : 2 * t.shape[-1] : 2]
    return t


def close(got: torch.Tensor, want: np.ndarray, scale: np.ndarray, n: int, dtype) -> None:
    """Each element within 8 u sqrt(n + 1) of the L2 norm of the terms it sums (u: the
    accumulation's unit roundoff; f16 / bf16 add one rounding of the output)."""
    assert tuple(got.shape) == want.shape
    got = got.double().numpy()
    assert not np.isnan(got).any(), "NaN in the output"
    u = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    out_u = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}.get(dtype, 0.0)
    tol = 8 * u * math.sqrt(n + 1) * scale + out_u * np.abs(want) + np.finfo(np.float64).tiny
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.max(np.abs(got - want) / tol):.3g} x tol"


# ============================================================================= reduce_sum

RS_FORMS = [
    ((3, 4, 5), {"axes": None}), ((3, 4, 5), {"axes": [0, 2]}), ((3, 4, 5), {"axes": [-1], "keepdim": True}),
    ((3, 4, 5), {"axes": []}), ((3, 4, 5), {"target": [4, 1]}), ((3, 4, 5), {"target": []}),
    ((6, 33, 65), {"axes": [0, 1]}), ((6, 33, 65), {"target": [6, 1, 65]}), ((4000, 3), {"axes": [0]}),
    ((1, 1024), {"axes": [1]}), ((0, 5), {"axes": [0]}), ((3, 0), {"axes": [0]}), ((), {"axes": None}),
    ((2, 1, 3, 1, 2, 1, 2, 1, 2, 3), {"axes": [0, 2, 4, 6, 8]}),
]


@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape,form", RS_FORMS, ids=[f"{s}-{f}" for s, f in RS_FORMS])
def test_reduce_sum_matches_oracle(shape, form, dtype, layout):
    rng = np.random.default_rng(len(shape) + 7 * sum(shape))
    x64 = rng.uniform(-1, 1, shape)
    x = view(torch.tensor(x64, dtype=dtype), layout)
    x64 = x.double().numpy()
    params = dict(form, shape=list(shape))
    want = reduce_sum_numpy(x64, params)
    scale = np.sqrt(reduce_sum_numpy(x64**2, params))
    n = x64.size // max(want.size, 1)
    kwargs = {k: v for k, v in form.items()}
    y = ops.reduce_sum(x, **kwargs)
    close(y, want, scale, n, dtype)
    out = torch.full(want.shape, math.nan, dtype=dtype)
    assert ops.reduce_sum.out(x, **kwargs, y=out) is None
    close(out, want, scale, n, dtype)
    assert torch.equal(ops.reduce_sum(x, **kwargs), y), "not deterministic"


def test_reduce_sum_fake_shapes_and_errors():
    x = torch.empty(3, 4, 5, device="meta")
    assert ops.reduce_sum(x, [0, 2]).shape == (4,)
    assert ops.reduce_sum(x, [1], True).shape == (3, 1, 5)
    assert ops.reduce_sum(x).shape == ()
    assert ops.reduce_sum(x, target=[1, 5]).shape == (1, 5)
    with pytest.raises(ValueError, match=r"reduce_sum.*axes.*\[0, 3\]"):
        ops.reduce_sum(x, [0, 3])
    with pytest.raises(ValueError, match=r"reduce_sum.*target"):
        ops.reduce_sum(x, target=[2, 5])
    with pytest.raises(ValueError, match=r"reduce_sum.*one form"):
        ops.reduce_sum(x, [0], target=[4, 5])
    with pytest.raises(ValueError, match=r"reduce_sum.*'y'"):
        ops.reduce_sum.out(x, [0], y=torch.empty(5, 5, device="meta"))


def test_reduce_sum_errors_on_cpu():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"reduce_sum.*'y'.*shape"):
        ops.reduce_sum.out(x, [0], y=torch.empty(3))
    with pytest.raises(TypeError, match=r"reduce_sum.*dtype"):
        ops.reduce_sum.out(x, [0], y=torch.empty(4, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"reduce_sum.*int32"):
        ops.reduce_sum(x.int(), [0])
    y = torch.empty(4)
    with pytest.raises(ValueError, match=r"reduce_sum: plan must be a contiguous int64 CPU tensor"):
        ops._reduce_sum_run(x, torch.zeros(3, dtype=torch.int64), y=y)
    with pytest.raises(ValueError, match=r"reduce_sum: y shares memory with x"):
        ops._reduce_sum_run(x, trs.plan_for(x, y, {"axes": [0]}), y=x[0])


# ============================================================================= norms

def norm_inputs(op, shape, dtype, affine=True, layout="contig", seed=0):
    rng = np.random.default_rng(seed)
    n = shape[-1]
    x = view(torch.tensor(rng.uniform(-2, 2, shape) + rng.uniform(-1, 1, shape[:-1] + (1,)), dtype=dtype), layout)
    dy = view(torch.tensor(rng.uniform(-1, 1, shape), dtype=dtype), layout)
    w = torch.tensor(rng.uniform(0.5, 1.5, (n,)), dtype=dtype) if affine else None
    x64 = x.double().numpy()
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if op == _norm.LN:
        mean = x64.mean(-1)
        rstd = 1 / np.sqrt(((x64 - mean[..., None]) ** 2).mean(-1) + EPS)
        return dy, x, w, torch.tensor(mean, dtype=acc), torch.tensor(rstd, dtype=acc)
    rstd = 1 / np.sqrt((x64**2).mean(-1) + EPS)
    return dy, x, w, None, torch.tensor(rstd, dtype=acc)


def check_norm(op, dy, x, w, got, bias, dtype):
    d64, x64 = dy.double().numpy(), x.double().numpy()
    w64 = w.double().numpy() if w is not None else None
    n = x64.shape[-1]
    if op == _norm.LN:
        ref = layernorm_backward_numpy(d64, x64, w64, EPS, bias)
    else:
        ref = rmsnorm_backward_numpy(d64, x64, w64, EPS)
    g = d64 * (w64 if w64 is not None else 1.0)
    rows = x64.size // n
    # dx's terms are O(rstd * |g|) over a row of n; dweight / dbias sum rows of |dy| (|xhat| ~ a few).
    scale_dx = 4 * np.sqrt((g**2).sum(-1, keepdims=True) + 1) * np.ones_like(x64)
    close(got[0], ref["dx"], scale_dx * 8, n, dtype)
    if w is not None:
        close(got[1], ref["dweight"], 8 * np.sqrt((d64**2).reshape(-1, n).sum(0)) + 1e-30, rows, dtype)
    if bias:
        close(got[2], ref["dbias"], np.sqrt((d64**2).reshape(-1, n).sum(0)) + 1e-30, rows, dtype)


NORM_SHAPES = [(1, 1), (3, 5), (7,), (1, 65536), (2, 3, 1000), (70, 33), (300, 8)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("affine,bias", [(True, True), (False, True), (True, False), (False, False)])
def test_layernorm_backward_matches_oracle(shape, dtype, affine, bias):
    dy, x, w, mean, rstd = norm_inputs(_norm.LN, shape, dtype, affine)
    got = ops.layernorm_backward(dy, x, w, mean, rstd, bias)
    assert got[1].shape == ((shape[-1],) if affine else (0,)) and got[2].shape == ((shape[-1],) if bias else (0,))
    check_norm(_norm.LN, dy, x, w, got, bias, dtype)
    dx = torch.full(shape, math.nan, dtype=dtype)
    dw = torch.full((shape[-1],), math.nan, dtype=dtype) if affine else None
    db = torch.full((shape[-1],), math.nan, dtype=dtype) if bias else None
    ops.layernorm_backward.out(dy, x, w, mean, rstd, dx=dx, dweight=dw, dbias=db)
    check_norm(_norm.LN, dy, x, w, (dx, dw, db), bias, dtype)
    assert all(torch.equal(a, b) for a, b in zip(got, ops.layernorm_backward(dy, x, w, mean, rstd, bias)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_rmsnorm_backward_matches_oracle(shape, dtype):
    dy, x, w, _, rstd = norm_inputs(_norm.RMS, shape, dtype)
    got = ops.rmsnorm_backward(dy, x, w, rstd)
    check_norm(_norm.RMS, dy, x, w, got, False, dtype)
    dx, dw = torch.full(shape, math.nan, dtype=dtype), torch.full((shape[-1],), math.nan, dtype=dtype)
    ops.rmsnorm_backward.out(dy, x, w, rstd, dx=dx, dweight=dw)
    check_norm(_norm.RMS, dy, x, w, (dx, dw), False, dtype)


@pytest.mark.parametrize("op", [_norm.LN, _norm.RMS])
@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_norms_on_strided_views(op, layout):
    dy, x, w, mean, rstd = norm_inputs(op, (4, 6, 17), torch.float64, layout=layout, seed=3)
    assert not x.is_contiguous() and not dy.is_contiguous()
    stats = (mean, rstd) if op == _norm.LN else (rstd,)
    got = getattr(ops, op)(dy, x, w, *stats)
    check_norm(op, dy, x, w, got, op == _norm.LN, torch.float64)
    # statistics as strided views too (every other element of a longer buffer)
    stats = tuple(view(s, "sliced") for s in stats)
    got = getattr(ops, op)(dy, x, w, *stats)
    check_norm(op, dy, x, w, got, op == _norm.LN, torch.float64)


def test_norms_with_no_rows():
    x = torch.empty(0, 8)
    for op, stats in ((_norm.LN, (torch.empty(0), torch.empty(0))), (_norm.RMS, (torch.empty(0),))):
        got = getattr(ops, op)(x, x, torch.ones(8), *stats)
        assert got[0].shape == (0, 8) and torch.equal(got[1], torch.zeros(8))


def test_norm_fake_shapes_and_errors():
    m = dict(device="meta")
    x, w, s = torch.empty(2, 3, 8, **m), torch.empty(8, **m), torch.empty(2, 3, **m)
    dx, dw, db = ops.layernorm_backward(x, x, w, s, s)
    assert dx.shape == (2, 3, 8) and dw.shape == (8,) and db.shape == (8,)
    dx, dw, db = ops.layernorm_backward(x, x, None, s, s, False)
    assert dw.shape == (0,) and db.shape == (0,)
    dx, dw = ops.rmsnorm_backward(x, x, w, s)
    assert dx.shape == (2, 3, 8) and dw.shape == (8,)
    with pytest.raises(ValueError, match=r"layernorm_backward.*'rstd'.*\(2, 3\)"):
        ops.layernorm_backward(x, x, w, s, torch.empty(2, **m))
    with pytest.raises(ValueError, match=r"rmsnorm_backward.*'weight'.*\(8,\)"):
        ops.rmsnorm_backward(x, x, torch.empty(7, **m), s)
    with pytest.raises(TypeError, match=r"rmsnorm_backward.*'rstd'.*float32"):
        ops.rmsnorm_backward(x, x, w, torch.empty(2, 3, dtype=torch.float16, **m))
    with pytest.raises(ValueError, match=r"layernorm_backward.*'dx'"):
        ops.layernorm_backward.out(x, x, w, s, s, dx=torch.empty(2, 8, **m), dweight=torch.empty(8, **m))


def test_norm_errors_on_cpu():
    dy, x, w, mean, rstd = norm_inputs(_norm.LN, (3, 8), torch.float32)
    with pytest.raises(ValueError, match=r"layernorm_backward.*'dweight'"):
        ops.layernorm_backward.out(dy, x, w, mean, rstd, dx=torch.empty(3, 8))  # weight without dweight
    with pytest.raises(ValueError, match=r"layernorm_backward: dx shares memory with dy"):
        ops._layernorm_backward_run(dy, x, None, mean, rstd, torch.tensor(_norm.make_record(
            _norm.LN, {"dy": dy, "x": x, "weight": None, "mean": mean, "rstd": rstd, "dx": dy, "dweight": None,
                       "dbias": None})), dx=dy, dweight=None, dbias=None)
    # Named either way: argcheck's anchor is dy ("argument 'x' has dtype float64, expected float32"),
    # the C++ check's is x ("dy has dtype float32, expected float64"); which one answers depends on
    # whether the op's Python CPU kernel or the C++ one was registered last in this process (the
    # whole suite reaches the C++ one: seen in CI, not reproduced alone).
    with pytest.raises(TypeError, match=r"rmsnorm_backward.*('x' has dtype float64, expected float32"
                                        r"|dy has dtype float32, expected float64)"):
        ops.rmsnorm_backward(dy, x.double(), w, rstd)


# ============================================================================= CUDA plans (no GPU)

class FakeCuda:
    """What the planners read of a CUDA tensor: shape, strides, dtype, device, address."""

    def __init__(self, shape, dtype, strides=None, ptr=1 << 20):
        self.shape, self.dtype = torch.Size(shape), dtype
        self._strides = tuple(strides) if strides is not None else torch.empty(shape, device="meta").stride()
        self.device, self.is_cuda, self._ptr = torch.device("cuda", 0), True, ptr

    def stride(self):
        return self._strides

    def element_size(self):
        return torch.empty(0, dtype=self.dtype).element_size()

    def data_ptr(self):
        return self._ptr


@pytest.fixture
def fake_gpu(monkeypatch):
    """132 SMs, and occupancy answered without a device."""
    monkeypatch.setattr(_norm, "_num_sms", lambda index: 132)
    monkeypatch.setattr(_norm, "_occupancy", lambda op, index, dtype: lambda expr, block, smem=0: 1)
    monkeypatch.setattr(trs, "_num_sms", lambda index: 132)
    monkeypatch.setattr(trs, "_occupancy", lambda index, dtype: lambda expr: 2)


def rows3_smem(itemsize, vpt, gw, stages) -> int:
    """NBRows3Smem<T, VPT, GW, STAGES>::BYTES (norm_rows3.cuh), written out again."""
    block, vec, acc = max(256, gw), 16 // itemsize, 8 if itemsize == 8 else 4
    stage = 2 * vpt * block * 16 + 2 * block * acc
    return max(stages * stage + vpt * block * 16, 2 * vpt * vec * block * acc)


def built_rows3(itemsize, vpt, gw, stages) -> bool:
    """nb_rows3_built / nb_rows3_stages of norm_backward_cuda.h, written out again: VPT 1 for GW <= 32,
    else ROWS3_ELEMS / VEC (1 in 16-bit types: VPT 1 throughout); 4 stages, fewer while the shared
    memory exceeds 227 KiB less 8 KiB."""
    m = max(1, (4 if itemsize == 8 else 8) // (16 // itemsize))
    if not (gw in [1 << k for k in range(11)] and (gw <= 32 or m == 1 if vpt == 1 else vpt == m and gw >= 32)):
        return False
    s = 4
    while s > 2 and rows3_smem(itemsize, vpt, gw, s) > 232448 - 8192:
        s -= 1
    return stages == s


def built_norm_kernel(kind, itemsize, vec, vpt, gw=0, stages=0) -> bool:
    """The instantiations norm_backward_cuda.h builds (nb_rows_elems / nb_chunk_elems, nb_rows3_built)."""
    if vec not in (1, 16 // itemsize):
        return False
    if kind == _norm.ROWS:
        most = ({2: 16, 4: 8, 8: 4} if vec > 1 else {2: 8, 4: 8, 8: 4})[itemsize]
        return vpt in (1, 2, 4, 8) and vpt * vec <= most
    if kind == _norm.ROWS3:
        return vec > 1 and built_rows3(itemsize, vpt, gw, stages)
    return kind == _norm.CHUNKED and vpt == (4 if itemsize == 8 else 8) // vec


GW_WORD = _norm.HEADER + _norm.nplan.FLAGS_WORD + 1  # NBParams.gw in a record


@pytest.mark.parametrize("setting,kinds", [("", {_norm.ROWS3, _norm.ROWS, _norm.CHUNKED}),
                                           ("kernel=rows", {_norm.ROWS, _norm.CHUNKED}),
                                           ("kernel=rows3,finish=colsum", {_norm.ROWS3, _norm.ROWS, _norm.CHUNKED})])
@pytest.mark.parametrize("op", [_norm.LN, _norm.RMS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=["f32", "f16", "bf16", "f64"])
def test_every_cuda_norm_plan_names_a_built_kernel(fake_gpu, monkeypatch, setting, kinds, op, dtype):
    """With GRADORACLE_TORCH_EXT_NORMS unset (kernel=rows3, fused finish), kernel=rows, and kernel=rows3
    with nb_colsum: every record names a built kernel, and its partial rows are summed by one of
    the two finishes (nb_rows3's cooperative grid within the resident blocks)."""
    monkeypatch.setenv(_norm.ENV, setting)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    seen = set()
    for n in sorted({1, 3, 7, 100, 1000, 1023, 65535} | {1 << k for k in range(17)} | {3 << k for k in range(15)}):
        for rows, ptr in ((1, 1 << 20), (4096, 1 << 20), (4096, (1 << 20) + 2)):
            shape = (rows, n)
            args = {"dy": FakeCuda(shape, dtype, ptr=ptr), "x": FakeCuda(shape, dtype), "weight": FakeCuda((n,), dtype),
                    "mean": FakeCuda((rows,), acc) if op == _norm.LN else None, "rstd": FakeCuda((rows,), acc),
                    "dx": FakeCuda(shape, dtype), "dweight": FakeCuda((n,), dtype),
                    "dbias": FakeCuda((n,), dtype) if op == _norm.LN else None}
            words = _norm.make_record(op, args)
            assert len(words) == _norm.RECORD_WORDS
            kind, vec, vpt, wide, grid, colsum, ws, stages = words[: _norm.HEADER]
            flags, gw = words[GW_WORD - 1], words[GW_WORD]
            assert built_norm_kernel(kind, args["x"].element_size(), vec, vpt, gw, stages), (n, rows, words[:8])
            coop = bool(flags & _norm.nplan.PHASE_COLS)
            if kind == _norm.ROWS3:
                assert flags & _norm.nplan.PHASE_ROWS and not (coop and colsum)
                assert coop == ("colsum" not in setting and grid > 1)
                assert not coop or grid <= 132  # the fake device: 132 SMs, 1 block each
            else:
                assert stages == 0 and not flags & (_norm.nplan.PHASE_ROWS | _norm.nplan.PHASE_COLS)
            assert grid >= 1 and (colsum or coop or grid == 1) and (not (colsum or coop) or ws >= 2 * grid * n)
            assert vec == 1 or ptr % 16 == 0
            seen.add((kind, vec, vpt, wide))
    assert {k for k, *_ in seen} == kinds  # every kernel of the setting reached


@pytest.mark.parametrize("shape,form", RS_FORMS + [((8, 2048, 4096), {"target": [4096]}),
                                                   ((32 << 20,), {"axes": None}), ((16384, 4096), {"axes": [1]})],
                         ids=str)
def test_cuda_reduce_sum_plans(fake_gpu, shape, form):
    params = dict(form, shape=list(shape))
    x = FakeCuda(shape, torch.bfloat16)
    words = trs.make_record(x, params, True, True)
    assert len(words) == trs.RECORD_WORDS
    kind, col, vec, simple, grid, n_part, n_ticket, out_numel = words[: trs.HEADER]
    from oracle.reduce_sum import out_shape

    assert out_numel == math.prod(out_shape(shape, params))
    if kind in (trs.EMPTY, trs.ZERO):
        return
    assert kind in (trs.ROW_TEAM, trs.ROW_BLOCK, trs.COL) and kind == (trs.COL if col else kind)
    assert grid >= 1 and (n_part == 0) == (n_ticket == 0)


@pytest.mark.parametrize("op", [_norm.LN, _norm.RMS])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16", "f64"])
def test_every_planner_kernel_of_the_rows_path_is_built(op, dt):
    """Every nb_rows / nb_chunked / nb_rows3 instantiation the planner can name with the knobs
    the extension takes (_norm_plan.all_kernel_exprs) parses, and is one norm_backward_cuda.h
    builds; and every nb_rows3 it builds is one the planner names (none built for nothing)."""
    item = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}[dt]
    exprs = _norm.nplan.all_kernel_exprs(op, dt, _norm.settings("kernel=rows3"))
    exprs = [e for e in exprs if e.startswith(("nb_rows<", "nb_chunked<", "nb_rows3<"))]
    rows3 = set()
    for expr in exprs:
        k = _norm.parse_expr(op, expr)
        assert built_norm_kernel(k.kind, item, k.vec, k.vpt, k.gw, k.stages), expr
        if k.kind == _norm.ROWS3:
            assert k.vec == 16 // item and k.wide == (k.gw > 32)
            rows3.add((k.vpt, k.gw, k.stages))
    built = {(vpt, gw, s) for vpt in (1, 2) for gw in (1 << g for g in range(11)) for s in (2, 3, 4)
             if built_rows3(item, vpt, gw, s)}
    assert rows3 == built and len(built) == (11 if item == 2 else 12)
    for bad in ("nb_rows2<NBRmsNorm, float, 4, 1, 512, 1>", "nb_rows3<NBRmsNorm, float2, 2, 32, 4>"):
        with pytest.raises(ValueError, match="does not build"):
            _norm.parse_expr(op, bad)


def test_rows3_constants_match_the_planner():
    """norm_backward_cuda.h's copies of the planner's nb_rows3 constants (the instantiations and
    their STAGES follow from them) and NBRows3Smem's formula (the occupancy query's shared memory)."""
    src = (Path(_norm.__file__).parent / "norm_backward_cuda.h").read_text()
    assert f"kNbRows3Stages = {_norm.nplan.STAGES};" in src
    assert "kNbRows3SmemLimit = 232448 - 8192;" in src and _norm.nplan.ROWS3_SMEM_LIMIT == 232448 - 8192
    assert f"kNbRows3MaxGwLog2 = {_norm.nplan.ROWS3_MAX_GW.bit_length() - 1};" in src
    assert _norm.nplan.ROWS3_ELEMS == {2: 8, 4: 8, 8: 4} and _norm.nplan.ROWS3_MIN_BLOCK == 256
    for dt, item in (("bf16", 2), ("f32", 4), ("f64", 8)):
        for vpt, gw, s in ((1, 1, 4), (1, 512, 4), (2, 1024, 2), (2, 64, 3)):
            assert _norm.nplan.rows3_smem_bytes(dt, vpt, gw, s) == rows3_smem(item, vpt, gw, s)


def test_norms_setting(monkeypatch):
    """GRADORACLE_TORCH_EXT_NORMS: default kernel=rows3 (unset or empty), the kernels the extension
    builds, the knobs it takes; anything else a ValueError naming the variable; read per value."""
    monkeypatch.delenv(_norm.ENV, raising=False)
    assert _norm.knobs()["kernel"] == "rows3" and _norm.settings("")["kernel"] == "rows3"
    got = _norm.settings("kernel=rows3, finish=colsum,minrows=8")
    assert (got["kernel"], got["finish"], got["minrows"]) == ("rows3", "colsum", 8)
    assert _norm.settings("kernel=rows,kernel=rows3")["kernel"] == "rows3"
    monkeypatch.setenv(_norm.ENV, "kernel=rows")
    assert _norm.knobs()["kernel"] == "rows"
    for text, match in (("kernel=rows2", r"kernel='rows2'.*does not build.*rows, rows3"),
                        ("kernel=rows4", r"kernel='rows4', expected one of"),
                        ("stages=3", r"stages=3.*does not take.*kernel, finish, minrows"),
                        ("kernel=rows3,elems=16", r"elems=16.*does not take"),
                        ("launch=cupy", r"launch='cupy'.*does not take"),
                        ("kernels=rows3", r"unknown setting 'kernels'")):
        with pytest.raises(ValueError, match=_norm.ENV + ": " + match):
            _norm.settings(text)
    monkeypatch.setenv(_norm.ENV, "kernel=rows2")
    with pytest.raises(ValueError, match=_norm.ENV):
        _norm.knobs()


def test_reduce_sum_kernel_names_parse():
    for kernel, kind in trs.KIND.items():
        for vec in (True, False):
            for simple in (True, False):
                assert trs.parse_expr(trs.rs_plan.kernel_expr(kernel, "bf16", vec, simple)) == (kind, vec, simple)
    with pytest.raises(ValueError, match="does not build"):
        trs.parse_expr("rs_v5<float, float>")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_norm_cuda_sources_compile(tmp_path):
    """layernorm_backward_cuda.cu and rmsnorm_backward_cuda.cu with nvcc against torch's headers
    (object files only, as the extension's build compiles them, C++20), and ptxas on every nb_rows3
    instantiation: the 46 per op the planner names, at most NB_ROWS3_REGS = 64 registers, no stack,
    no spills (a compile error here would break every op of the extension)."""
    inc = Path(torch.__file__).parent / "include"
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    flags = ["-std=c++20", "-arch=sm_90", "-O0", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
             "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-w",
             "-Xptxas", "-v", f"-I{inc}", f"-I{inc / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{tmp_path / 'stub'}"]
    here = Path(_norm.__file__).parent
    procs = {f: subprocess.Popen(["nvcc", "-c", *flags, "-o", str(tmp_path / f"{f}.o"), str(here / f"{f}_cuda.cu")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for f in ("layernorm_backward", "rmsnorm_backward")}
    for f, proc in procs.items():
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, out[-5000:]
        usage = re.findall(r"Compiling entry function '(\w*nb_rows3\w*)' for 'sm_90'\n(?:ptxas info.*\n)*?"
                           r"ptxas info\s+: Function properties for \w+\n\s+(\d+) bytes stack frame, (\d+) bytes spill "
                           r"stores, (\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers", out)
        assert len(usage) == 46, (f, len(usage))
        for name, stack, st, ld, regs in usage:
            assert int(regs) <= 64 and stack == st == ld == "0", (f, name, regs, stack, st, ld)
