"""torch_ext's matmul_backward custom op on the CPU: the public ops (functional and .out) against
the float64 oracle over batch broadcasts, layouts, dtypes and empty dims; the fake (meta)
kernels; errors; torch.compile(fullgraph=True); and the CUDA records the op would hand the
extension (made with stand-in CUDA tensors: every record names an mm_mma instantiation the .cu
builds, 16-byte copies only where legal).

The harness's smoke cases run through tests/test_correctness.py (`-k "torch_ext and matmul"`).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends._plans import matmul_backward_cuda as mmplan  # noqa: E402
from backends.torch_ext import matmul_backward as tmm  # noqa: E402
from oracle.matmul_backward import matmul_backward_numpy  # noqa: E402
from test_torch_ext_ops import close, extension_ops, view  # noqa: E402

ops = None


@pytest.fixture(scope="module", autouse=True)
def ext():
    global ops
    ops = extension_ops()


def _inputs(a_shape, b_shape, dtype, layouts=("contig",) * 3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y_shape = tuple(torch.broadcast_shapes(a_shape[:-2], b_shape[:-2])) + (a_shape[-2], b_shape[-1])
    return tuple(view(torch.randn(s, generator=g, dtype=torch.float64).to(dtype), lay)
                 for s, lay in zip((a_shape, b_shape, y_shape), layouts))


def _check(a, b, dy, da, db):
    an, bn, yn = (x.double().numpy() for x in (a, b, dy))
    want_a, want_b = matmul_backward_numpy(an, bn, yn)
    sa = np.sqrt(np.abs(matmul_backward_numpy(an ** 2, bn ** 2, yn ** 2)[0]))
    sb = np.sqrt(np.abs(matmul_backward_numpy(an ** 2, bn ** 2, yn ** 2)[1]))
    # terms per element: N (M) times the batch elements folded into it
    n_a = max(1, int(np.prod(dy.shape[:-2])) * dy.shape[-1] // max(1, int(np.prod(a.shape[:-2]))))
    n_b = max(1, int(np.prod(dy.shape[:-1])) // max(1, int(np.prod(b.shape[:-2]))))
    close(da, want_a, sa, n_a, a.dtype)
    close(db, want_b, sb, n_b, a.dtype)


CASES = [((2, 3), (3, 4)), ((4, 1, 8, 16), (3, 16, 12)), ((5, 16, 8), (8, 12)), ((16, 8), (5, 8, 12)),
         ((1, 256), (256, 100)), ((1000, 3), (3, 5)), ((2, 1, 2, 3), (3, 3, 2))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shapes", CASES, ids=[f"{a}x{b}" for a, b in CASES])
def test_matmul_backward_matches_oracle(shapes, dtype):
    a, b, dy = _inputs(*shapes, dtype)
    da, db = ops.matmul_backward(a, b, dy)
    assert da.shape == a.shape and db.shape == b.shape and da.dtype == dtype
    _check(a, b, dy, da, db)


@pytest.mark.parametrize("layouts", [("transposed", "contig", "contig"), ("contig", "transposed", "contig"),
                                     ("contig", "contig", "transposed"), ("sliced", "sliced", "sliced")])
def test_matmul_backward_out_on_strided_views(layouts):
    a, b, dy = _inputs((2, 33, 40), (40, 24), torch.float32, layouts)
    da, db = torch.full(a.shape, float("nan")), torch.full(b.shape, float("nan"))
    got = ops.matmul_backward.out(a, b, dy, da=da, db=db)
    assert got[0] is da and got[1] is db
    _check(a, b, dy, da, db)


@pytest.mark.parametrize("a_shape, b_shape", [((3, 0), (0, 4)), ((0, 5), (5, 4)), ((3, 5), (5, 0)),
                                              ((0, 3, 5), (5, 4))])
def test_matmul_backward_empty_dims(a_shape, b_shape):
    a, b, dy = _inputs(a_shape, b_shape, torch.float32)
    da, db = torch.full(a.shape, float("nan")), torch.full(b.shape, float("nan"))
    ops.matmul_backward.out(a, b, dy, da=da, db=db)
    want_a, want_b = matmul_backward_numpy(a.double().numpy(), b.double().numpy(), dy.double().numpy())
    assert np.array_equal(da.double().numpy(), want_a) and np.array_equal(db.double().numpy(), want_b)


def test_matmul_backward_fake_shapes_and_errors():
    a, b, dy = (torch.empty(s, device="meta") for s in ((4, 1, 8, 16), (3, 16, 12), (4, 3, 8, 12)))
    da, db = ops.matmul_backward(a, b, dy)
    assert da.shape == a.shape and db.shape == b.shape and da.device.type == "meta"
    with pytest.raises(ValueError, match="dy"):
        ops.matmul_backward(a, b, torch.empty((4, 3, 8, 11), device="meta"))
    with pytest.raises(ValueError, match="K"):
        ops.matmul_backward(torch.empty((8, 15), device="meta"), torch.empty((16, 4), device="meta"),
                            torch.empty((8, 4), device="meta"))


def test_matmul_backward_errors_on_cpu():
    a, b, dy = _inputs((8, 16), (16, 4), torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        ops.matmul_backward(a, b.double(), dy)
    with pytest.raises(ValueError, match="shape"):
        ops.matmul_backward(a, b, dy[:, :3])
    da, db = torch.empty(a.shape), torch.empty(b.shape)
    with pytest.raises(ValueError, match="contiguous"):
        ops.matmul_backward.out(a, b, dy, da=torch.empty(16, 8).t(), db=db)
    with pytest.raises(ValueError, match="shares memory"):
        ops.matmul_backward.out(a, b, dy, da=da, db=da.view(-1)[:64].view(16, 4))
    plan, table = tmm.plan_for(a, b, dy)
    with pytest.raises(ValueError, match="plan"):
        ops._matmul_backward_run(a, b, dy, plan[:-1], table, da=da, db=db)
    other, _ = tmm.plan_for(*_inputs((8, 16), (16, 5), torch.float32))
    with pytest.raises(ValueError, match="other shapes"):
        ops._matmul_backward_run(a, b, dy, other, table, da=da, db=db)


def test_matmul_backward_compiles():
    def f(a, b, dy):
        da, db = ops.matmul_backward(a * 2, b, dy)
        return da + 1, db.relu()

    a, b, dy = _inputs((4, 1, 8, 16), (3, 16, 12), torch.float32)
    eager = f(a, b, dy)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(a, b, dy)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


class _FakeCuda:
    """What `_make` reads of a CUDA tensor: shape, strides, dtype, device, data_ptr."""

    def __init__(self, t, ptr=0):
        self.t, self.ptr = t, ptr
        self.shape, self.dtype, self.is_cuda, self.device = t.shape, t.dtype, True, "cpu"

    def stride(self):
        return self.t.stride()

    def dim(self):
        return self.t.dim()

    def data_ptr(self):
        return self.ptr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("layouts", [("contig",) * 3, ("contig", "transposed", "contig"),
                                     ("transposed", "contig", "transposed"), ("sliced",) * 3])
@pytest.mark.parametrize("misaligned", [False, True])
def test_cuda_records(dtype, layouts, misaligned):
    a, b, dy = _inputs((2, 64, 48), (48, 40), dtype, layouts)
    words, table = tmm._make(*(_FakeCuda(x, 2 if misaligned and k == 1 else 0) for k, x in enumerate((a, b, dy))))
    words = words.tolist()
    assert len(words) == mmplan.RECORD_WORDS
    for k, name in enumerate(("da", "db")):
        rec = words[k * mmplan.LAUNCH_WORDS:(k + 1) * mmplan.LAUNCH_WORDS]
        kind, xt, yt, vec, at, bm = rec[:6]
        g = rec[6:]
        assert kind == mmplan.RUN
        assert g[9] * g[10] > 0  # tiles of the launch
        dt = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}.get(dtype)
        if dt is None:  # f64: the smem rung's tiles, element loads
            assert vec == 0 and bm == 64
        else:  # mm_mma on 16 bits, mm_sgemm on float32; a small grid: the 64-row tiles
            flags = f"{mmplan._b(xt)}, {mmplan._b(yt)}, {mmplan._b(vec)}>"
            expr = f"mm_sgemm<{bm}, {bm}, {flags}" if dt == "f32" else f"mm_mma<{mmplan.CUDA_TYPE[dt]}, {bm}, {flags}"
            assert expr in mmplan.all_kernel_exprs(dt) and bm == 64
            uses_b = name == "da"
            assert vec == (layouts != ("sliced",) * 3 and not (misaligned and uses_b)), (name, layouts)
        assert at + 2 * g[3] * g[4] <= table.numel()
