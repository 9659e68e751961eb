"""torch_ext's conv_backward_data and conv_backward_weight custom ops on the CPU: the harness's
smoke cases through the registered implementation (the C++ loops, judged by run_case against the
float64 oracle), the public functional and .out ops, their fake (meta) kernels and errors,
torch.compile(fullgraph=True), and the CUDA side without a GPU: conv_backward_cuda.cu compiles
with nvcc against torch's headers, and every kernel the planner can pick is one it launches.
Builds the extension once per process (about 30-60 s on a cold build folder; cached after).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends._plans import conv_cuda as plan  # noqa: E402
from backends.torch_ext import conv_backward as tcb  # noqa: E402
from cases import select  # noqa: E402
from harness.registry import find_impl  # noqa: E402
from harness.runner import run_case  # noqa: E402
from oracle import conv_common as cc  # noqa: E402
from test_torch_ext_ops import extension_ops  # noqa: E402

ops = None


@pytest.fixture(scope="module")
def ext():
    global ops
    ops = extension_ops()
    return ops


SMOKE = [c for op in tcb.OPS for c in select("smoke", op=op)]


@pytest.mark.parametrize("case", SMOKE, ids=[c.id for c in SMOKE])
def test_smoke_cases_on_the_cpu(ext, case):
    result = run_case(find_impl(case.op, "torch_ext"), case, "cpu", run_seed=0)
    assert result.status == "PASS", f"{case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


def _data(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


GEO = dict(n=2, cin=4, cout=6, spatial=[7, 6], kernel=[3, 2], stride=[2, 1], padding=[1, 1], dilation=[1, 2],
           groups=2)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_public_ops_match_the_oracle(ext, layout):
    from oracle.conv_backward_data import conv_backward_data_numpy
    from oracle.conv_backward_weight import conv_backward_weight_numpy

    geo = cc.geometry(dict(GEO, layout=layout))
    cl = layout == "channels_last"
    dy, w, x = _data(geo.y_shape), _data(geo.w_shape, seed=1), _data(geo.x_shape, seed=2)
    args = (GEO["stride"], GEO["padding"], GEO["dilation"], GEO["groups"], cl)
    dx = ops.conv_backward_data(dy, w, GEO["spatial"], *args)
    dw = ops.conv_backward_weight(dy, x, GEO["kernel"], *args)
    np.testing.assert_allclose(dx.numpy(), conv_backward_data_numpy(dy.numpy(), w.numpy(), geo), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(dw.numpy(), conv_backward_weight_numpy(dy.numpy(), x.numpy(), geo), rtol=1e-5,
                               atol=1e-5)
    dx2, dw2 = torch.full_like(dx, float("nan")), torch.full_like(dw, float("nan"))
    ops.conv_backward_data.out(dy, w, GEO["spatial"], *args, dx=dx2)
    ops.conv_backward_weight.out(dy, x, GEO["kernel"], *args, dw=dw2)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2)


def test_fake_shapes_and_errors(ext):
    from torch._subclasses.fake_tensor import FakeTensorMode

    geo = cc.geometry(GEO)
    args = (GEO["stride"], GEO["padding"], GEO["dilation"], GEO["groups"], False)
    with FakeTensorMode():
        dy, w, x = torch.empty(geo.y_shape), torch.empty(geo.w_shape), torch.empty(geo.x_shape)
        assert tuple(ops.conv_backward_data(dy, w, GEO["spatial"], *args).shape) == geo.x_shape
        assert tuple(ops.conv_backward_weight(dy, x, GEO["kernel"], *args).shape) == geo.w_shape
    dy, w = torch.zeros(geo.y_shape), torch.zeros(geo.w_shape)
    with pytest.raises(ValueError, match="conv_backward_data"):  # dy's size does not fit the input size
        ops.conv_backward_data(dy, w, [9, 6], *args)
    with pytest.raises(ValueError, match="groups"):
        ops.conv_backward_data(dy, w, GEO["spatial"], GEO["stride"], GEO["padding"], GEO["dilation"], 4, False)
    with pytest.raises(TypeError, match="dtype"):
        ops.conv_backward_data(dy, w.double(), GEO["spatial"], *args)


def test_ops_compile(ext):
    torch._dynamo.reset()
    geo = cc.geometry(dict(GEO, layout="channels_last"))
    dy, w, x = _data(geo.y_shape), _data(geo.w_shape, seed=1), _data(geo.x_shape, seed=2)
    args = (GEO["stride"], GEO["padding"], GEO["dilation"], GEO["groups"], True)

    def f(dy, w, x):
        dx = ops.conv_backward_data(dy * 2, w, GEO["spatial"], *args)
        dw = ops.conv_backward_weight(dy, x.tanh(), GEO["kernel"], *args)
        return dx + 1, dw.relu()

    eager = f(dy, w, x)
    got = torch.compile(f, fullgraph=True)(dy, w, x)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_every_planned_kernel_is_launched_by_the_extension():
    source = (Path(tcb.__file__).parent / "conv_backward_cuda.cu").read_text()
    for op in tcb.OPS:
        for dt in plan.CUDA_TYPE:
            for expr in plan.all_exprs(op, dt):
                name = expr.split("<")[0]
                assert name in tcb.KINDS or name == "cv_wgrad_finish", expr
                assert f"{name}<T" in source, f"{name} is never launched by conv_backward_cuda.cu"
                if name.startswith("cv_wgrad") and "," in expr:
                    assert f"{name}<T, {expr.split(',')[1].strip().rstrip('>')}>" in source, expr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_cuda_source_compiles(tmp_path):
    """conv_backward_cuda.cu with nvcc against torch's headers (object file only), as
    tests/test_cuda_compile.py does for every *_cuda.cu."""
    inc = Path(torch.__file__).parent / "include"
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    flags = ["-std=c++17", "-arch=sm_90", "-O0", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
             "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "-w"]
    src = Path(tcb.__file__).parent / "conv_backward_cuda.cu"
    proc = subprocess.run(["nvcc", "-c", *flags, f"-I{inc}", f"-I{inc / 'torch' / 'csrc' / 'api' / 'include'}",
                           f"-I{tmp_path / 'stub'}", "-o", str(tmp_path / "x.o"), str(src)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-5000:] + proc.stdout[-3000:]


class _FakeCuda:
    """A CPU tensor that says it is on CUDA: what make_record reads of a CUDA tensor (no GPU here)."""

    def __init__(self, t, ptr: int = 0):
        self.t, self.ptr = t, ptr
        self.is_cuda = True
        self.dtype, self.shape = t.dtype, t.shape
        self.device = type("Dev", (), {"index": 0, "type": "cuda"})()

    def stride(self):
        return self.t.stride()

    def data_ptr(self):
        return self.ptr


def _records_cases():
    """Every fifth perf case of each op, and every perf case with Cin <= SMALLC_MAX (the small-Cin dgrad)."""
    picked = [c for op in tcb.OPS for c in select("perf", op=op)[::5]]
    return picked + [c for op in tcb.OPS for c in select("perf", op=op)
                     if c.params["cin"] <= plan.SMALLC_MAX and c not in picked]


@pytest.mark.parametrize("case", _records_cases(), ids=lambda c: c.id)
def test_cuda_records(monkeypatch, case):
    """The records conv_backward.py would hand the CUDA op for the perf cases: the kind the planner's
    kernel maps to, a grid within CUDA's limits, the finish and workspace of split wgrads, the table."""
    monkeypatch.setattr(tcb, "_num_sms", lambda index: 132)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self)
    geo = cc.geometry(case.params, case.op)
    shapes = (geo.y_shape, geo.w_shape, geo.x_shape) if case.op == tcb.OPS[0] else \
        (geo.y_shape, geo.x_shape, geo.w_shape)
    a, b, out = (_FakeCuda(torch.empty(s, dtype=torch.bfloat16 if case.dtype == "bf16" else torch.float32))
                 for s in shapes)
    record, table = tcb.make_record(case.op, a, b, out, case.params)
    words = record.tolist()
    assert len(words) == tcb.HEADER + plan.WORDS
    op, kind, gx, gy, block, finish, ws, tlen, rows = words[:tcb.HEADER]
    assert op == tcb.OPS.index(case.op) and kind in (1, 2, 3, 4, 5, 6)
    assert 1 <= gx < 2 ** 31 and 1 <= gy <= 65535 and block in (plan.THREADS, plan.DIRECT_THREADS)
    direct = (geo.cin // geo.groups) * (geo.cout // geo.groups) < plan.DIRECT_MAX
    merged = case.op == tcb.OPS[1] and geo.groups == 1 and geo.cin < plan.MERGE_CIG_MAX and \
        np.prod(geo.kernel) > 1 and not direct  # every tap in one GEMM (the ResNet stem)
    smallc = case.op == tcb.OPS[0] and geo.groups == 1 and geo.cin <= plan.SMALLC_MAX and not direct
    vec = case.dtype == "bf16" and geo.channels_last and (geo.cin // geo.groups) % 8 == 0 and \
        (geo.cout // geo.groups) % 8 == 0 and not direct and not merged and not smallc
    assert (kind == 2) == vec and (kind == 4) == merged and (kind in (5, 6)) == smallc, (kind, case.id)
    if smallc:  # 16-byte dy reads (6): channels last, aligned (pointer 0 here), Cout whole 16-byte words
        per16 = 16 // (2 if case.dtype == "bf16" else 4)
        assert (kind == 6) == (geo.channels_last and geo.cout % per16 == 0), (kind, case.id)
        assert rows == (geo.cin if geo.cin <= 4 else 8) and block == plan.SMALLC_THREADS
    if case.op == tcb.OPS[0]:
        assert table is not None and tlen == table.numel() and finish == 0 and ws == 0
    else:
        splits = words[tcb.HEADER + 42]
        assert rows == (0 if kind == 3 else plan.wgrad_bm(case.dtype, geo.cout // geo.groups))
        assert table is None and (finish > 0) == (splits > 1) and ws == (splits > 1) * splits * geo.cout * \
            (geo.cin // geo.groups) * np.prod(geo.kernel)
