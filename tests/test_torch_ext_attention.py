"""torch_ext's attention_backward on the CPU: the C++ loops judged by the harness (float64 oracle,
poisoned outputs, repeats), the public ops (functional and .out) against the harness path, the
fake kernels (meta tensors: shapes, and argcheck's clear errors), torch.compile(fullgraph=True)
matching eager, and a strided (non-contiguous) layout.  The CUDA launches run in the GPU batch
(scripts/gpu/cuda_attn.sh); their compile is tests/test_cuda_compile.py's torch_ext test.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_torch_ext_ops import extension_ops  # noqa: E402

from backends import torch_ext  # noqa: E402
from cases.registry import Case  # noqa: E402
from harness.registry import get_op  # noqa: E402
from harness.runner import run_case  # noqa: E402

OP = "attention_backward"
ops = None


@pytest.fixture(scope="module", autouse=True)
def ext():
    global ops
    ops = extension_ops()
    torch._dynamo.reset()


def _case(dtype, B, Sq, Sk, Hq, Hkv, D, **kw):
    c = Case(OP, dtype, {"B": B, "Sq": Sq, "Sk": Sk, "Hq": Hq, "Hkv": Hkv, "D": D, **kw}, frozenset({"full"}), "test")
    get_op(OP).validate(c)
    return c


CASES = [
    _case("bf16", 1, 37, 37, 4, 2, 64, causal=True),
    _case("f16", 1, 20, 45, 2, 1, 40, window=[5, 3], softcap=4.0),
    _case("f32", 2, 30, 12, 2, 2, 16, causal=True),   # empty rows
    _case("f64", 1, 9, 9, 3, 1, 8, softmax_scale=0.4),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cpu_kernel_by_the_harness(case):
    impl = next(i for (op, _), i in torch_ext.torch_ext.impls.items() if op == OP)
    result = run_case(impl, case, "cpu", run_seed=0, repeats=2)
    assert result.status == "PASS", f"{case.id}: {result.status} {result.reason}"


def _inputs(b=1, sq=10, sk=12, hq=4, hkv=2, d=8, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(dtype).to(device)  # noqa: E731
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return (r(b, sq, hq, d), r(b, sk, hkv, d), r(b, sk, hkv, d), r(b, sq, hq, d), r(b, sq, hq, d),
            (torch.rand(b, hq, sq, generator=g) + 3.0).to(lse_dtype).to(device))


def test_functional_out_and_strided_agree():
    q, k, v, o, do, lse = _inputs()
    dq, dk, dv = ops.attention_backward(q, k, v, o, do, lse, None, True, [4, -1], 2.0)
    outs = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    ops.attention_backward.out(q, k, v, o, do, lse, None, True, [4, -1], 2.0, dq=outs[0], dk=outs[1], dv=outs[2])
    for a, b in zip((dq, dk, dv), outs):
        assert torch.equal(a, b)
    assert dq.abs().sum() > 0 and dk.abs().sum() > 0 and dv.abs().sum() > 0
    # heads-first storage viewed as (B, S, H, D), and a head-dim stride of 2: same numbers
    qs = q.transpose(1, 2).contiguous().transpose(1, 2)
    ks = torch.stack([k, k], -1)[..., 0]
    got = ops.attention_backward(qs, ks, v, o, do, lse, None, True, [4, -1], 2.0)
    for a, b in zip((dq, dk, dv), got):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_fake_kernels_give_shapes_and_clear_errors():
    q, k, v, o, do, lse = (x.to("meta") for x in _inputs(hq=6, hkv=3))
    dq, dk, dv = ops.attention_backward(q, k, v, o, do, lse, 0.5, False, [-1, -1], 0.0)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.device.type == "meta"
    with pytest.raises((ValueError, TypeError), match="attention_backward"):
        ops.attention_backward(q, k[:, :, :2], v, o, do, lse, None, False, [-1, -1], 0.0)  # Hkv 2 vs v's 3


def test_compiles_fullgraph():
    def f(q, k, v, o, do, lse):
        dq, dk, dv = ops.attention_backward(q * 1.5, k, v, o, do, lse, None, True, [-1, -1], 0.0)
        return dq + 1, dk.relu(), dv * 2

    args = _inputs()
    eager = f(*args)
    got = torch.compile(f, fullgraph=True)(*args)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
