"""Every torch_ext custom op under torch.compile(fullgraph=True) on the CPU matches eager: the
fake (meta) kernels give the compiler the shapes, the ops stay opaque calls inside the graph, and
compiled training code can use them (issue 15).  Each function mixes the op with ordinary torch
code around it, so the graph has something to fuse on both sides.

Inductor compiles C++ here (a few seconds to a minute per function on a slow machine).  The
extension is built once per process (about 30 s on a cold build folder; cached after).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_torch_ext_ops import extension_ops  # noqa: E402

ops = None


@pytest.fixture(scope="module", autouse=True)
def ext():
    global ops
    ops = extension_ops()
    torch._dynamo.reset()


def compiled_matches_eager(fn, *args):
    eager = fn(*args)
    got = torch.compile(fn, fullgraph=True)(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_binary_backward_compiles():
    def f(a, b, g):
        ga, gb = ops.binary_backward(a * 2, b, g, "mul")
        return ga + 1, gb.relu()

    compiled_matches_eager(f, torch.randn(4, 1, 5), torch.randn(3, 5), torch.randn(4, 3, 5))


def test_reduce_sum_compiles():
    def f(x):
        y = ops.reduce_sum(x.tanh(), [0, 2], False)
        z = ops.reduce_sum(x, None, False, [1, 5])  # sum_to_shape form
        w = ops.reduce_sum(x.transpose(0, 1), [1], True)  # a strided view
        return y * 2, z - 1, w

    compiled_matches_eager(f, torch.randn(6, 4, 5))


def test_reduce_sum_out_compiles():
    def f(x):
        y = torch.empty(4, dtype=x.dtype)
        ops.reduce_sum.out(x * 3, [0, 2], y=y)
        return y + 1

    compiled_matches_eager(f, torch.randn(6, 4, 5))


def test_layernorm_backward_compiles():
    def f(dy, x, w, mean, rstd):
        dx, dw, db = ops.layernorm_backward(dy * 0.5, x, w, mean, rstd, True)
        dx2, dw2, db2 = ops.layernorm_backward(dy, x, None, mean, rstd, False)  # no weight, no bias
        return dx.sum(-1), dw * 2, db, dx2, dw2, db2

    x = torch.randn(5, 7, 16)
    mean = x.mean(-1)
    rstd = torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    compiled_matches_eager(f, torch.randn(5, 7, 16), x, torch.rand(16) + 0.5, mean, rstd)


def test_rmsnorm_backward_compiles():
    def f(dy, x, w, rstd):
        dx, dw = ops.rmsnorm_backward(dy, x, w * 2, rstd)
        return dx + x, dw.sum()

    x = torch.randn(9, 33)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-5)
    compiled_matches_eager(f, torch.randn(9, 33), x, torch.rand(33) + 0.5, rstd)


def test_norm_out_compiles():
    def f(dy, x, w, rstd):
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        ops.rmsnorm_backward.out(dy, x, w, rstd, dx=dx, dweight=dw)
        return dx * 2, dw

    x = torch.randn(4, 8)
    compiled_matches_eager(f, torch.randn(4, 8), x, torch.rand(8) + 0.5, torch.rsqrt(x.pow(2).mean(-1) + 1e-5))
