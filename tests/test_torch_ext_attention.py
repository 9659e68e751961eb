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


@pytest.mark.parametrize("variant", ["default", "det"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cpu_kernel_by_the_harness(case, variant):
    impl = torch_ext.torch_ext.impls[(OP, variant)]
    assert impl.deterministic == (variant == "det")
    result = run_case(impl, case, "cpu", run_seed=0, repeats=2)
    assert result.status == "PASS", f"{case.id}: {result.status} {result.reason}"


def built_tiles() -> dict:
    """The tiles attention_backward_cuda.cu builds, read from its AttnTiles specialisations: padded head
    dim -> ((BM, BN, WD, QS) of the lean main kernel, (BM, BN) of the deterministic dq kernel)."""
    import re
    from pathlib import Path

    src = (Path(torch_ext.__file__).parent / "attention_backward_cuda.cu").read_text()
    found = re.findall(r"struct AttnTiles<(\d+)> \{ static constexpr int BM = (\d+), BN = (\d+), WD = (\d+), "
                       r"QS = (\d+), QBM = (\d+), QBN = (\d+); \};", src)
    tiles = {int(dp): (tuple(map(int, t[:4])), tuple(map(int, t[4:]))) for dp, *t in found}
    assert sorted(tiles) == [64, 128, 256], found
    return tiles


@pytest.mark.parametrize("vec", [False, True])
@pytest.mark.parametrize("d", [8, 40, 64, 96, 128, 200, 256])
@pytest.mark.parametrize("variant", ["fa2_lean", "fa2_lean_det"])
def test_cuda_plan_header_names_what_the_extension_builds(variant, d, vec):
    """The plan header the CUDA run op reads (attention_backward.h AttnHeader): the kind, the lean
    tiles the .cu builds, the preprocess's lanes per row (0: the scalar preprocess and convert), and
    the grids of cupy's launches, whose kernels are the ones the .cu launches for that kind."""
    from backends.cupy import attention_backward as A
    from backends.torch_ext import attention_backward as TA

    det = variant.endswith("_det")
    sizes = (2, 100, 130, 8, 2, d)
    b, sq, sk, hq, hkv, _ = sizes
    q_like = (sq * hq * d, hq * d, d, 1)
    kv_like = (sk * hkv * d, hkv * d, d, 1)
    strides = {"q": q_like, "o": q_like, "do": q_like, "dq": q_like, "k": kv_like, "v": kv_like, "dk": kv_like,
               "dv": kv_like, "lse": (hq * sq, sq, 1)}
    params = {"softmax_scale": None, "causal": True, "window": [-1, -1], "softcap": 0.0}
    words, _, _ = TA.plan_words(variant, "bf16", sizes, strides, True, params, sms=132, vec=vec)
    kind, dp, bm, bn, wd, qs, qbm, qbn, npl, lpr, g0x, g1x, g1y, g2x, g2y, g3x = words[:16]
    assert kind == TA.KIND[variant] and dp == A.padded_dim(d) and npl == 0
    main, dq = built_tiles()[dp]
    assert (bm, bn, wd, qs) == main and (qbm, qbn) == (dq if det else (0, 0))
    assert lpr == (A.pre_lanes(d) if vec else 0)
    p = A.plan(variant, "bf16", sizes, strides, True, params, None, 132, vec)
    flag = "false" if det else "true"
    assert [x.expr for x in p.launches[:3]] == [
        f"attn_pre_vec<__nv_bfloat16, {lpr}>" if vec else "attn_pre<__nv_bfloat16, float>",
        f"attn_fa2_main<__nv_bfloat16, {dp}, {bm}, {bn}, {wd}, {flag}, {qs}, {flag}>",
        f"attn_fa2_dq<__nv_bfloat16, {dp}, {qbm}, {qbn}>" if det else
        f"attn_dq_convert{'_vec' if vec else ''}<__nv_bfloat16>"]
    assert (g0x, g1x, g1y, g2x, g2y) == (p.launches[0].grid[0], *p.launches[1].grid, *p.launches[2].grid)
    assert g3x == (p.launches[3].grid[0] if len(p.launches) > 3 else 0)


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
