"""torch_ext backend: the C++ CPU kernel of binary_backward against the float64 oracle.

Builds the extension once per session (about 30 s on a cold build folder; cached after).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends import torch_ext  # noqa: E402
from oracle.binary_backward import FNS, binary_backward_numpy, partials  # noqa: E402
from oracle.broadcast import sum_to_shape  # noqa: E402

EPS = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}


@pytest.fixture(scope="module", autouse=True)
def ext():
    reason = torch_ext._check("cpu")
    if reason:
        pytest.fail(reason)


def op(*args):
    return torch.ops.gradoracle.binary_backward(*args)


def op_out(a, b, g, fn, ga, gb):
    return torch.ops.gradoracle.binary_backward.out(a, b, g, fn, grad_a=ga, grad_b=gb)


# ----------------------------------------------------------------------------- inputs

def draw(rng, fn, a_shape, b_shape):
    """Float64 a, b, grad_out in the ranges the op's generator uses."""
    if fn in ("maximum", "minimum"):  # a coarse grid, so ties occur
        a, b = rng.integers(-4, 5, a_shape) / 4.0, rng.integers(-4, 5, b_shape) / 4.0
    elif fn == "pow":
        a, b = rng.uniform(0.5, 2.0, a_shape), rng.uniform(-2.0, 2.0, b_shape)
    else:
        a = rng.uniform(0.5, 2.0, a_shape) * rng.choice([-1.0, 1.0], a_shape)
        b = rng.uniform(0.5, 2.0, b_shape) * rng.choice([-1.0, 1.0], b_shape)
    g = rng.uniform(-1.0, 1.0, np.broadcast_shapes(a_shape, b_shape))
    return np.asarray(a, np.float64), np.asarray(b, np.float64), g


def view(x: np.ndarray, dtype, layout: str) -> torch.Tensor:
    """x as a torch tensor of `dtype` with the same values and the given memory layout."""
    t = torch.tensor(x, dtype=dtype)
    if layout == "transposed" and t.dim() >= 2:  # column-major storage
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "sliced":  # every other element of a buffer twice as long in the last dim
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=dtype) if t.dim() else None
        if big is not None:
            big[..., ::2] = t
            return big[..., ::2]
    if layout == "expanded" and t.dim() >= 1 and t.shape[0] > 1:  # stride 0 in dim 0
        if bool((t == t[:1]).all()):
            return t[:1].expand(t.shape)
    return t


def check_against_oracle(fn, a, b, g, ga, gb):
    """Each output element within 8 eps sqrt(n+1) of the L2 norm of the terms it sums."""
    a64, b64, g64 = (t.double().numpy() for t in (a, b, g))
    ref_a, ref_b = binary_backward_numpy(fn, a64, b64, g64)
    da, db = partials(fn, a64, b64)
    n_out = g64.size
    for name, got, ref, x, d in (("grad_a", ga, ref_a, a64, da), ("grad_b", gb, ref_b, b64, db)):
        assert tuple(got.shape) == x.shape, name
        got = got.double().numpy()
        assert not np.isnan(got).any(), f"{fn} {name}: NaN left in the output"
        scale = np.sqrt(sum_to_shape((g64 * d) ** 2, x.shape))
        n = n_out // x.size if x.size else 0
        tol = 8 * EPS[ga.dtype] * math.sqrt(n + 1)
        err = np.abs(got - ref) / np.maximum(scale, np.finfo(np.float64).tiny)
        worst = float(err.max()) if err.size else 0.0
        assert worst <= tol, f"{fn} {name}: error {worst:.3g} x L2(terms) > {tol:.3g}"


PATTERNS = {
    "same": ((4, 5), (4, 5)),
    "A-broadcast": ((1, 5), (6, 5)),
    "B-broadcast": ((3, 4, 5), (3, 1, 5)),
    "bias": ((33, 17), (17,)),
    "outer": ((40, 1), (1, 37)),
    "both-3d": ((5, 1, 7), (1, 6, 7)),
    "interleaved": ((2, 1, 3, 1, 2), (1, 4, 1, 5, 2)),
    "rank-mismatch": ((2, 3, 4), (4,)),
    "rank-mismatch-b": ((3, 1), (2, 3, 5)),
    "scalar-scalar": ((), ()),
    "scalar-a": ((), (6, 7)),
    "scalar-b": ((5,), ()),
    "size1-both": ((1,), (1, 1)),
    "long-reduce": ((1,), (5000,)),
    "8d": ((2, 1, 2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 2, 1, 2)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_oracle(pattern, dtype):
    a_shape, b_shape = PATTERNS[pattern]
    rng = np.random.default_rng(zlib.crc32(pattern.encode()))
    for fn in FNS:
        a, b, g = (torch.tensor(x, dtype=dtype) for x in draw(rng, fn, a_shape, b_shape))
        ga, gb = torch.full(a_shape, math.nan, dtype=dtype), torch.full(b_shape, math.nan, dtype=dtype)
        returned = op_out(a, b, g, fn, ga, gb)
        assert returned[0] is ga and returned[1] is gb
        check_against_oracle(fn, a, b, g, ga, gb)


# Large enough that the kernel splits a reduction across work items and adds the chunks.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("a_shape,b_shape", [((1,), (300_000,)), ((2048, 1), (1, 600)), ((700, 64), (64,)),
                                             ((3, 1, 5000), (1, 4, 1)), ((64, 1, 33), (1, 100, 33))])
def test_large_reductions(a_shape, b_shape, dtype):
    rng = np.random.default_rng(9)
    for fn in ("mul", "pow"):
        a, b, g = (torch.tensor(x, dtype=dtype) for x in draw(rng, fn, a_shape, b_shape))
        ga, gb = op(a, b, g, fn)
        check_against_oracle(fn, a, b, g, ga, gb)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
@pytest.mark.parametrize("pattern", ["same", "bias", "outer", "both-3d", "interleaved", "rank-mismatch-b"])
def test_non_contiguous_inputs(pattern, layout):
    a_shape, b_shape = PATTERNS[pattern]
    rng = np.random.default_rng(7)
    for fn in ("mul", "pow", "maximum"):
        a, b, g = draw(rng, fn, a_shape, b_shape)
        if layout == "expanded":  # constant along dim 0, so a stride-0 view can hold it
            a = np.broadcast_to(a[:1], a.shape).copy()
        a, b, g = view(a, torch.float64, layout), view(b, torch.float64, layout), view(g, torch.float64, layout)
        ga, gb = op(a, b, g, fn)
        check_against_oracle(fn, a, b, g, ga, gb)


@pytest.mark.parametrize("a_shape,b_shape", [((0, 3), (3,)), ((3, 1), (1, 0)), ((2, 0), (2, 1)), ((0,), ()),
                                             ((4, 1, 0), (1, 5, 1))])
def test_size_zero_dims_give_zeros(a_shape, b_shape):
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    a, b, g = torch.ones(a_shape), torch.ones(b_shape), torch.ones(out_shape)
    ga, gb = torch.full(a_shape, math.nan), torch.full(b_shape, math.nan)
    op_out(a, b, g, "mul", ga, gb)
    assert torch.equal(ga, torch.zeros(a_shape)) and torch.equal(gb, torch.zeros(b_shape))


def test_pow_at_zero_follows_the_spec():
    a = torch.tensor([0.0, 0.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    b = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64)
    g = torch.ones(5, dtype=torch.float64)
    ga, gb = op(a, b, g, "pow")
    ref_a, ref_b = binary_backward_numpy("pow", a.numpy(), b.numpy(), g.numpy())
    np.testing.assert_allclose(ga.numpy(), ref_a, rtol=1e-15, equal_nan=True)  # 0, 1, inf, nan, ...
    np.testing.assert_allclose(gb.numpy(), ref_b, rtol=1e-15, equal_nan=True)  # 0 where a == 0, b >= 0
    assert gb[:4].eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_dtypes_accumulate_in_float(dtype):
    rng = np.random.default_rng(3)
    a, b, g = draw(rng, "mul", (64, 1), (1, 300))
    ta, tb, tg = (torch.tensor(x, dtype=dtype) for x in (a, b, g))
    ga, gb = op(ta, tb, tg, "mul")
    assert ga.dtype == dtype and gb.dtype == dtype
    ref = op(ta.float(), tb.float(), tg.float(), "mul")  # same values, float32 all through
    for got, want in zip((ga, gb), ref):
        assert torch.equal(got, want.to(dtype))  # float accumulation, one rounding at the end


@pytest.mark.parametrize("a_shape,b_shape", [((1,), (100_000,)), ((512, 1), (1, 300)), ((700, 64), (64,)),
                                             ((30, 1, 60), (1, 50, 60))])
def test_deterministic_across_thread_counts(a_shape, b_shape):
    rng = np.random.default_rng(5)
    a, b, g = (torch.tensor(x, dtype=torch.float32) for x in draw(rng, "pow", a_shape, b_shape))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op(a, b, g, "pow")
        torch.set_num_threads(max(2, threads))
        many = op(a, b, g, "pow")
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(x, y) for x, y in zip(one, many))


# ----------------------------------------------------------------------------- torch integration

def test_backend_impl_writes_outs_in_place():
    rng = np.random.default_rng(11)
    a, b, g = (torch.tensor(x, dtype=torch.float32) for x in draw(rng, "div", (3, 1, 4), (5, 1)))
    outs = {"grad_a": torch.full((3, 1, 4), math.nan), "grad_b": torch.full((5, 1), math.nan)}
    torch_ext.torch_ext.impls[("binary_backward", "default")].fn({"a": a, "b": b, "grad_out": g}, outs,
                                                                {"fn": "div"})
    check_against_oracle("div", a, b, g, outs["grad_a"], outs["grad_b"])


def test_availability_reasons():
    assert torch_ext.torch_ext.unavailable_reason("cpu") is None
    if not torch.cuda.is_available():
        assert "torch_ext" in torch_ext._check("cuda")


def test_public_function_matches_op():
    a, b, g = torch.rand(3, 1), torch.rand(4), torch.rand(3, 4)
    for x, y in zip(torch_ext.binary_backward.binary_backward(a, b, g, "sub"), op(a, b, g, "sub")):
        assert torch.equal(x, y)


def test_torch_compile_fullgraph_matches_eager():
    def f(a, b, g):
        ga, gb = torch.ops.gradoracle.binary_backward(a, b, g, "div")
        return ga * 2, gb + 1

    a = torch.rand(4, 1, 5, dtype=torch.float64) + 0.5
    b, g = torch.rand(3, 1, dtype=torch.float64) + 0.5, torch.rand(4, 3, 5, dtype=torch.float64)
    compiled = torch.compile(f, fullgraph=True)(a, b, g)
    for x, y in zip(compiled, f(a, b, g)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 1, 5), (3, 1)), ((6,), (6,)), ((), (2, 2))])
def test_opcheck(a_shape, b_shape):
    a, b = torch.rand(a_shape, dtype=torch.float64) + 0.5, torch.rand(b_shape, dtype=torch.float64) + 0.5
    g = torch.rand(torch.broadcast_shapes(a_shape, b_shape), dtype=torch.float64)
    torch.library.opcheck(torch.ops.gradoracle.binary_backward.default, (a, b, g, "pow"))


# ----------------------------------------------------------------------------- plans

# (A, B, layout of a): one of each launch kind of the CUDA plan (zero, fast, ew, lk1, lk8, lr_stream,
# lr_batched), the same as tests/test_cuda_compile.py emulates.
CUDA_KINDS = [((0, 3), (1, 3), "contig"), ((2, 3, 5), (2, 3, 5), "contig"), ((7, 5), (7, 5), "transposed"),
              ((3, 4, 40), (40,), "contig"), ((3, 1, 5), (1, 4, 5), "contig"), ((4, 50), (4, 1), "contig"),
              ((3, 1, 70), (1, 5, 1), "contig")]


@pytest.mark.parametrize("a_shape,b_shape,layout", CUDA_KINDS)
def test_cuda_launch_records_pass_the_cpp_checks(a_shape, b_shape, layout):
    """torch_ext's CUDA op launches from a record made in Python (backends/_plans/binary_backward_cuda.py)
    and checked in C++ (binary_backward.cpp, the same checks on both devices).  Here on the CPU,
    each record passes every check but the device's, which comes last: the kinds both devices run
    (zero, fast, ew) run and match the oracle, the others are refused for their kind only."""
    from backends._plans import binary_backward as bcast
    from backends._plans import binary_backward_cuda as cuda_plan

    rng = np.random.default_rng(13)
    a, b, g = draw(rng, "mul", a_shape, b_shape)
    a = view(a, torch.float64, layout)
    b, g = torch.tensor(b), torch.tensor(g)
    plan = bcast.make_plan(a_shape, b_shape, a.stride(), b.stride(), g.stride())
    launch = cuda_plan.plan_launch(plan, 132, (0,) * 5, 8)
    record = torch.tensor(cuda_plan.launch_record(launch, plan, 132), dtype=torch.int64)
    ga, gb = torch.full(a_shape, math.nan, dtype=torch.float64), torch.full(b_shape, math.nan, dtype=torch.float64)
    run = torch.ops.gradoracle._binary_backward_run
    if launch.kind in ("zero", "fast", "ew"):
        run(a, b, g, "mul", record, grad_a=ga, grad_b=gb)
        if launch.kind == "zero":
            assert torch.equal(gb, torch.zeros(b_shape, dtype=torch.float64))
        else:
            check_against_oracle("mul", a, b, g, ga, gb)
    else:
        kind = cuda_plan.KINDS.index(launch.kind)
        with pytest.raises(ValueError, match=rf"binary_backward: plan has kind {kind}, which cpu does not run"):
            run(a, b, g, "mul", record, grad_a=ga, grad_b=gb)


def test_cuda_grid_uses_the_builds_resident_blocks(monkeypatch):
    """On CUDA the grid is sized by the driver's resident blocks per SM for the kernel the extension
    built (nvcc gave bb_rows for add in bf16 64 registers: 4 blocks, where the planner's table says 3
    and the grid filled 0.75 of a wave).  Here the op is stood in for: it is asked once per (device,
    dtype, fn, kind, vectorized), and its answer is what plan_best sizes the grid with."""
    from types import SimpleNamespace

    from backends._plans import binary_backward as bcast
    from backends._plans import binary_backward_cuda as cuda_plan
    from backends.torch_ext import binary_backward as tbb

    asked = []

    def fake(like, fn, kind, vec):
        asked.append((fn, cuda_plan.KINDS[kind], vec))
        return 4

    monkeypatch.setattr(tbb, "_OCCUPANCY", {})
    monkeypatch.setattr(torch.ops.gradoracle, "_binary_backward_blocks_per_sm", fake, raising=False)
    like = SimpleNamespace(device=SimpleNamespace(index=0), dtype=torch.bfloat16)
    resident = tbb._blocks_per_sm(like, "add")
    a_shape, b_shape = (8, 2048, 4096), (8, 2048, 1)  # bf16 add's bias row sums: bb_rows
    plan = bcast.make_plan(a_shape, b_shape, (2048 * 4096, 4096, 1), (2048, 1, 1), (2048 * 4096, 4096, 1))
    launch = cuda_plan.plan_best(plan, 132, (0,) * 5, 2, resident)
    cuda_plan.plan_best(plan, 132, (0,) * 5, 2, resident)
    assert launch.kind == "rows" and launch.grid == 4 * 132
    assert asked == [("add", "rows", True)]  # once: the second plan reads the cache
    assert cuda_plan.plan_best(plan, 132, (0,) * 5, 2).grid == 3 * 132  # the table's figure


def test_cuda_occupancy_query_covers_every_launch_kind():
    """binary_backward_cuda.cu's blocks_per_sm has a case for every kind plan_best can return, with
    the vectorized instance where the launch has one (the same kernels `run` launches)."""
    from pathlib import Path

    from backends._plans import binary_backward_cuda as cuda_plan

    src = (Path(torch_ext.__file__).parent / "binary_backward_cuda.cu").read_text()
    body = src[src.index("int64_t blocks_per_sm("):src.index("int64_t binary_backward_blocks_per_sm_cuda(")]
    for kind in cuda_plan.KINDS:
        if kind in ("zero", "box"):
            continue
        assert f"case BB_KIND_{kind.upper()}:" in body, kind
    for kernel in ("bb_cols", "bb_rows", "bb_batch", "bb_both"):
        assert f"query({kernel}<T, FN, V>)" in body and f"query({kernel}<T, FN, 1>)" in body, kernel


def test_a_plan_for_other_tensors_is_refused():
    from backends._plans import binary_backward as bcast
    from backends._plans import binary_backward_cuda as cuda_plan

    a, b, g = torch.rand(3, 4, 6, dtype=torch.float64), torch.rand(6, dtype=torch.float64), torch.rand(3, 4, 6, dtype=torch.float64)
    ga, gb = torch.empty_like(a), torch.empty_like(b)
    run = torch.ops.gradoracle._binary_backward_run
    other = bcast.make_plan((3, 4, 5), (5,), (20, 5, 1), (1,), (20, 5, 1))
    with pytest.raises(ValueError, match=r"binary_backward: plan is for 60 elements of grad_out, got 72"):
        run(a, b, g, "mul", torch.tensor(cuda_plan.box_record(other), dtype=torch.int64), grad_a=ga, grad_b=gb)
    with pytest.raises(ValueError, match=r"binary_backward: plan must be a contiguous int64 CPU tensor of \d+ words"):
        run(a, b, g, "mul", torch.zeros(3, dtype=torch.int64), grad_a=ga, grad_b=gb)


# ----------------------------------------------------------------------------- bad input

def _args(**override):
    args = {"a": torch.rand(2, 3, 4), "b": torch.rand(3, 1), "grad_out": torch.rand(2, 3, 4), "fn": "mul",
            "grad_a": torch.empty(2, 3, 4), "grad_b": torch.empty(3, 1)}
    args.update(override)
    return args


BAD = {
    "grad_out shape": (_args(grad_out=torch.rand(2, 3)), ValueError, r"grad_out has shape \[2, 3\], expected \[2, 3, 4\]"),
    "int a": (_args(a=torch.ones(2, 3, 4, dtype=torch.int32)), TypeError, r"a has dtype Int, expected one of float32"),
    "b dtype": (_args(b=torch.rand(3, 1, dtype=torch.float64)), TypeError, r"b has dtype float64, expected float32"),
    "grad_out dtype": (_args(grad_out=torch.rand(2, 3, 4).half()), TypeError, r"grad_out has dtype float16"),
    "no broadcast": (_args(b=torch.rand(5)), ValueError, r"shapes \[2, 3, 4\] and \[5\] do not broadcast"),
    "fn": (_args(fn="tanh"), ValueError, r"fn is 'tanh', expected one of add, sub"),
    "rank 9": (_args(a=torch.rand([1] * 9), b=torch.rand(1), grad_out=torch.rand([1] * 9),
                     grad_a=torch.empty([1] * 9), grad_b=torch.empty(1)), ValueError, r"has rank 9, expected at most 8"),
    "grad_a shape": (_args(grad_a=torch.empty(2, 3)), ValueError, r"grad_a has shape \[2, 3\], expected \[2, 3, 4\]"),
    "grad_b shape": (_args(grad_b=torch.empty(3)), ValueError, r"grad_b has shape \[3\], expected \[3, 1\]"),
    "grad_a dtype": (_args(grad_a=torch.empty(2, 3, 4, dtype=torch.float64)), TypeError, r"grad_a has dtype float64"),
    "grad_a strided": (_args(grad_a=torch.empty(4, 3, 2).permute(2, 1, 0)), ValueError, r"grad_a must be contiguous"),
    "grad_b aliases grad_a": (None, ValueError, r"grad_a shares memory with grad_b"),
    "grad_a aliases input": (None, ValueError, r"grad_a shares memory with a"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_errors_name_op_and_argument(case):
    args, exc, pattern = BAD[case]
    if case == "grad_b aliases grad_a":
        buf = torch.empty(24)
        args = _args(b=torch.rand(2, 3, 4), grad_a=buf.view(2, 3, 4), grad_b=buf.view(2, 3, 4))
    elif case == "grad_a aliases input":
        args = _args()
        args["grad_a"] = args["a"]
    with pytest.raises(exc, match="binary_backward: " + ".*" + pattern):
        op_out(args["a"], args["b"], args["grad_out"], args["fn"], args["grad_a"], args["grad_b"])


def test_functional_op_validates_too():
    with pytest.raises(ValueError, match=r"binary_backward: grad_out has shape \[3\], expected \[2, 3\]"):
        op(torch.rand(2, 3), torch.rand(3), torch.rand(3), "add")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_devices_rejected():
    with pytest.raises(ValueError, match=r"binary_backward: .* is on device"):
        op(torch.rand(2, 3, device="cuda"), torch.rand(3), torch.rand(2, 3, device="cuda"), "add")
