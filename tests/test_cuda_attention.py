"""The cupy attention_backward kernels' CUDA source, executed on the CPU, judged by the harness.

tests/cuda_host_attention.py compiles backends/cuda/attention_backward.cuh with g++ against the
CUDA stand-in (a fiber per thread; ldmatrix / mma.sync / cp.async / shuffles emulated warp by
warp, bit-exact bf16 and f16 rounding).  `attnhost` is the cupy backend's host code
(backends/cupy/attention_backward.call: the same plan and launch sequence) over that device,
registered as a numpy backend for the CPU, so the harness's own `run_case` judges it against the
float64 oracle: NaN-poisoned outputs, repeated calls (bitwise equal for fa2_det), the stale-output
recheck.  The cases are tiny (the stand-in runs ~1e6 thread-steps per second) but cross tile
edges: lengths not multiples of 64, several key and query blocks, masked and unmasked blocks.

What this cannot check: timing, the GPU's own rounding (FMA contraction), and races between
blocks (blocks run one after another): scripts/gpu/cuda_attn.sh runs the full set on the H100.
"""
from __future__ import annotations

import numpy as np
import pytest

import cuda_host
import cuda_host_attention as H
from backends.cupy import attention_backward as A
from backends.cupy import nvrtc as _nvrtc
from cases.registry import Case
from harness.registry import Backend, get_op
from harness.runner import run_case

OP = A.OP
WHY = cuda_host.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")

DEVICE = H.HostAttnDevice()
attnhost = Backend("attnhost", framework="numpy", devices=("cpu",), register=False,
                   description="the cupy attention_backward kernels' CUDA source run on the CPU (tests/cuda_host)")


def _impl(variant: str):
    def fn(inputs, outs, params):
        H.call(DEVICE, variant, inputs, outs, params)
    return fn


for _v, _det in (("fa2", False), ("fa2_det", True), ("fa2_lean", False), ("fa2_lean_det", True)):
    attnhost.impl(OP, variant=_v, dtypes=A.DTYPES, deterministic=_det, supports=A.supports)(_impl(_v))


def _case(dtype, B, Sq, Sk, Hq, Hkv, D, **kw):
    c = Case(OP, dtype, {"B": B, "Sq": Sq, "Sk": Sk, "Hq": Hq, "Hkv": Hkv, "D": D, **kw}, frozenset({"full"}), "test")
    get_op(OP).validate(c)
    return c


# Tensor-core path (bf16 / f16): every feature on tiny shapes that still cross block edges.
TC = [
    _case("bf16", 1, 70, 70, 2, 1, 64, causal=True),                        # GQA, causal, 2 query blocks, 2 key blocks
    _case("f16", 1, 20, 90, 2, 2, 64, window=[8, 4]),                        # Sq < Sk, local window
    _case("bf16", 1, 90, 20, 2, 1, 64, causal=True),                         # Sq > Sk: rows 0-69 empty
    _case("f16", 1, 33, 33, 2, 2, 128, causal=True, softcap=5.0, score_std=4.0),  # softcap engaged, D=128
    _case("bf16", 1, 24, 40, 4, 1, 40, causal=True, window=[6, 0]),          # MQA, odd D (padded, scalar loads)
    _case("bf16", 1, 40, 17, 2, 1, 256, window=[3, 3], softmax_scale=0.2),   # D=256 (two warps per key group)
    _case("f16", 1, 130, 130, 1, 1, 64),                                     # unmasked blocks (the no-mask path)
    _case("bf16", 2, 1, 75, 2, 2, 96, causal=True),                          # decoding row, B=2, D=96
    _case("f16", 1, 16, 1, 2, 1, 64, causal=True),                           # one key
    _case("bf16", 1, 40, 40, 2, 1, 33, causal=True),                         # odd D: scalar loads, scalar dQ adds
    _case("f16", 1, 30, 50, 2, 2, 36, window=[10, 5]),                       # D % 8 != 0: no vector pre / convert
]
# SIMT path (f32 / f64).
SIMT = [
    _case("f32", 1, 30, 37, 4, 2, 64, causal=True, softcap=2.0),
    _case("f64", 1, 25, 12, 2, 1, 40, window=[3, 0]),                        # empty rows
    _case("f32", 2, 9, 9, 2, 2, 200, softmax_scale=0.3),
    _case("f64", 1, 6, 6, 1, 1, 3, causal=True),
]


def _check(variant: str, case) -> None:
    impl = attnhost.impls[(OP, variant)]
    result = run_case(impl, case, "cpu", run_seed=0, repeats=2)
    assert result.status == "PASS", f"{impl.id} {case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


@pytest.mark.parametrize("case", TC + SIMT, ids=[c.id for c in TC + SIMT])
@pytest.mark.parametrize("variant", list(A.VARIANTS))
def test_attention_backward_on_host(variant, case):
    _check(variant, case)


# Every candidate configuration of the tuner (forced through CFG_ENV) on a case per padded head dim
# that crosses block edges in both directions.
CFG_CASES = {64: _case("bf16", 1, 150, 140, 2, 1, 64, causal=True, window=[40, 0]),
             128: _case("f16", 1, 70, 150, 2, 1, 128, causal=True),
             256: _case("bf16", 1, 70, 70, 1, 1, 256, window=[20, 20])}
CFG_PARAMS = [(v, dp, c) for dp in (64, 128, 256) for v in A.VARIANTS
              for c in A.candidates(v, "bf16", dp)[1:]]


def _cfg_text(cfg) -> str:
    main, dq = cfg
    return f"main={'x'.join(map(str, main))}" + (f",dq={'x'.join(map(str, dq))}" if dq else "")


@pytest.mark.parametrize("variant,dp,cfg", CFG_PARAMS, ids=[f"{v}-{dp}-{_cfg_text(c)}" for v, dp, c in CFG_PARAMS])
def test_every_tuning_candidate_on_host(variant, dp, cfg, monkeypatch):
    monkeypatch.setenv(A.CFG_ENV, _cfg_text(cfg))
    assert A.default_cfg(variant, "bf16", dp) == cfg
    _check(variant, CFG_CASES[dp])


def test_plans_reach_every_kernel_path():
    """The cases above launch the paths they claim: main kernel unmasked blocks exist, both head-dim
    slices at D=256, the scalar-load path for odd D, SIMT for f32 / f64."""
    seen = set()
    for case in TC + SIMT:
        p = case.params
        for variant in ("fa2", "fa2_det"):
            sizes = (p["B"], p["Sq"], p["Sk"], p["Hq"], p["Hkv"], p["D"])
            for launch in A._launches(variant, case.dtype, sizes, A.default_cfg(variant, case.dtype, p["D"])):
                seen.add(launch.expr.split("<")[0])
    assert seen == {"attn_pre", "attn_fa2_main", "attn_dq_convert", "attn_fa2_dq", "attn_simt_dq", "attn_simt_dkdv"}
    splits = {A.split_for(c.params["Hq"] // c.params["Hkv"], 1, DEVICE.num_sms()) for c in TC}
    assert 1 in splits and max(splits) > 1  # both the direct dk, dv stores and the split partials + attn_split_sum
    assert A.padded_dim(40) == 64 and A.padded_dim(96) == 128 and A.padded_dim(200) == 256
    assert A.lanes_per_row(3) == 1 and A.lanes_per_row(200) == 8
    assert [A.pre_lanes(d) for d in (8, 40, 64, 128, 256)] == [1, 8, 8, 16, 32]


def test_lean_variants_take_the_vector_kernels_when_aligned():
    """fa2_lean uses attn_pre_vec and attn_dq_convert_vec when D % 8 == 0 (arrays aligned), the scalar
    kernels otherwise; fa2 never does (its measured kernels stay as they were)."""
    vec = {"attn_pre_vec", "attn_dq_convert_vec"}
    for d, want in ((64, vec), (36, set())):
        for variant in ("fa2", "fa2_lean"):
            DEVICE.launches.clear()
            _check(variant, _case("bf16", 1, 20, 20, 2, 1, d, causal=True))
            names = {e.split("<")[0] for e in DEVICE.launches}
            assert names & vec == (want if variant == "fa2_lean" else set()), (variant, d, names)
            lean_main = [e for e in DEVICE.launches if e.startswith("attn_fa2_main")]
            assert all(e.count(",") == (7 if variant == "fa2_lean" else 5) for e in lean_main), lean_main


def test_head_dim_above_256_is_declined():
    c = _case("bf16", 1, 4, 4, 1, 1, 264)
    assert "264" in A.supports(c)


def test_params_struct_matches_the_cuh():
    """AttnParams' fields, in order, as the .cuh declares them."""
    import re

    text = (_nvrtc.CUDA_DIR / A.SOURCE).read_text()
    body = re.sub(r"//[^\n]*", "", re.search(r"struct AttnParams \{(.*?)\};", text, re.S).group(1))
    fields = re.findall(r"\b(\w+)\s*[,;]", body.replace("long long", ""))
    assert tuple(fields) == A.FIELDS
    assert np.dtype(A.PARAMS_DTYPE).itemsize == 8 * len(A.FIELDS)


def test_outputs_must_be_contiguous_and_separate():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"q": f(1, 4, 2, 8), "k": f(1, 4, 1, 8), "v": f(1, 4, 1, 8), "o": f(1, 4, 2, 8), "do": f(1, 4, 2, 8),
              "lse": f(1, 2, 4) + 3}
    params = {"causal": True}
    good = {"dq": np.empty_like(inputs["q"]), "dk": np.empty_like(inputs["k"]), "dv": np.empty_like(inputs["v"])}
    H.call(DEVICE, "fa2", inputs, good, params)
    assert np.isfinite(good["dq"]).all() and np.abs(good["dk"]).sum() > 0
    strided = dict(good, dk=np.empty((1, 4, 1, 16), np.float32)[..., ::2])
    with pytest.raises(ValueError, match="dk must be contiguous"):
        H.call(DEVICE, "fa2", inputs, strided, params)
    with pytest.raises(ValueError, match="dq shares memory with q"):
        H.call(DEVICE, "fa2_det", inputs, dict(good, dq=inputs["q"]), params)


def test_repeated_calls_take_the_fast_path(monkeypatch):
    """A second call with the same arrays is a lookup (no checks, no planning) and gives the same bits."""
    rng = np.random.default_rng(1)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"q": f(1, 5, 2, 8), "k": f(1, 7, 1, 8), "v": f(1, 7, 1, 8), "o": f(1, 5, 2, 8), "do": f(1, 5, 2, 8),
              "lse": f(1, 2, 5) + 3}
    outs = {"dq": np.empty_like(inputs["q"]), "dk": np.empty_like(inputs["k"]), "dv": np.empty_like(inputs["v"])}
    H.call(DEVICE, "fa2_det", inputs, outs, {"window": [2, 1]})
    first = {k: v.copy() for k, v in outs.items()}
    monkeypatch.setattr(A, "plan", lambda *a, **k: pytest.fail("planned again"))
    monkeypatch.setattr(A, "_check_outputs", lambda *a, **k: pytest.fail("checked again"))
    for y in outs.values():
        y[...] = np.nan
    H.call(DEVICE, "fa2_det", inputs, outs, {"window": [2, 1]})
    for k in outs:
        assert np.array_equal(outs[k], first[k])


# Shared-memory banks (the stand-in's bank model, tests/test_cuda_host_banks.py): every ldmatrix of
# the tensor-core kernels and every cp.async tile fill is conflict-free, in every tile configuration
# (the padded row pitches are odd multiples of 16 bytes).
BANK_CASES = {64: _case("bf16", 1, 70, 70, 2, 1, 64, causal=True), 128: _case("bf16", 1, 70, 70, 2, 1, 128),
              256: _case("bf16", 1, 40, 40, 1, 1, 256, causal=True)}
BANK_PARAMS = [(v, dp, c) for dp in (64, 128, 256) for v in A.VARIANTS for c in A.candidates(v, "bf16", dp)]


@pytest.mark.parametrize("variant,dp,cfg", BANK_PARAMS, ids=[f"{v}-{dp}-{_cfg_text(c)}" for v, dp, c in BANK_PARAMS])
def test_shared_memory_is_bank_conflict_free(variant, dp, cfg, monkeypatch):
    monkeypatch.setenv(A.CFG_ENV, _cfg_text(cfg))
    lib = H.kernels("bf16")
    lib.bank_stats()  # reset
    _check(variant, BANK_CASES[dp])
    s = lib.bank_stats()
    assert s["ld_instr"] > 0 and s["cp_rounds"] > 0
    assert s["ld_extra"] == 0 and s["cp_extra"] == 0, s
