"""The triton attention_backward (both variants) under the Triton interpreter (TRITON_INTERPRET=1).

* Smoke cases through the harness's own runner (harness/runner.py: fresh inputs, NaN-poisoned
  outputs, guard bands, the float64 oracle's tolerance, repeats -- bitwise for triton@det --
  and the stale-output recheck): every tiny case, and one case per feature (GQA, MQA, window,
  softcap, Sq > Sk and Sq < Sk, empty rows, odd head dims 40/80/96, D = 128 and 256,
  decoding and one key (tiny cases), a peaked softmax, f32 / f16 / bf16 / f64).  The interpreter's tiles are
  32 x 32 (attention_backward.INTERP_CONFIG), so these shapes cross several blocks and run
  the masked and the unmasked loops; a few run again with 16 x 16 tiles, and two GQA / MQA
  cases with the query heads of a kv head split over two programs (partial dk, dv summed).
* Rows with no allowed key: whatever lse and o hold there (+inf, -inf, NaN), dq is 0 there
  and dk, dv are those of the live rows.
* Bad arguments: clear errors that name the implementation, the argument, expected and got.

Where this process does not interpret (a GPU machine), the cases run in one worker
subprocess that sets TRITON_INTERPRET=1 (the setup helpers come from test_triton_interpret).
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from test_triton_interpret import _interpreting_here, _to_torch  # noqa: E402
from triton_interp import check_result, report, worker_results  # noqa: E402

from backends.triton import attention_backward as ab  # noqa: E402
from cases.registry import select  # noqa: E402
from harness import registry  # noqa: E402
from harness.runner import run_case  # noqa: E402

OP = "attention_backward"
TILE16 = ab.Config(16, 16, 4, 1, 16, 16, 4, 1, 16)
SPLIT2 = ab.Config(32, 32, 4, 1, 32, 32, 4, 1, 32, split=2)  # two programs share a kv head's query heads
SIZINGS = {"tile16": TILE16, "split2": SPLIT2}

# Smoke cases by the features they cover (ids as cases/attention_backward.py spells them).
FEATURES = [
    "bf16,B=1,Sq=96,Sk=96,Hq=4,Hkv=2,D=64,win=16x16",
    "f16,B=1,Sq=96,Sk=96,Hq=2,Hkv=1,D=128,causal,win=32x0,softcap=5",
    "f16,B=1,Sq=96,Sk=96,Hq=2,Hkv=2,D=256,win=16x16,softcap=5",
    "bf16,B=1,Sq=64,Sk=128,Hq=4,Hkv=2,D=64,causal",
    "bf16,B=1,Sq=128,Sk=64,Hq=4,Hkv=2,D=64,causal",
    "f32,B=2,Sq=33,Sk=100,Hq=2,Hkv=1,D=64",
    "f16,B=1,Sq=100,Sk=33,Hq=2,Hkv=2,D=64,win=8x8",
    "bf16,B=1,Sq=113,Sk=113,Hq=2,Hkv=1,D=64,causal",
    "bf16,B=1,Sq=77,Sk=77,Hq=2,Hkv=1,D=40,causal",
    "f32,B=1,Sq=50,Sk=70,Hq=2,Hkv=2,D=80,softcap=3",
    "f16,B=1,Sq=77,Sk=77,Hq=4,Hkv=2,D=96,win=8x0",
    "bf16,B=1,Sq=96,Sk=40,Hq=2,Hkv=1,D=64,causal,win=8x0",
    "f32,B=1,Sq=64,Sk=16,Hq=2,Hkv=2,D=32,win=4x4",
    "bf16,B=1,Sq=64,Sk=64,Hq=8,Hkv=1,D=64,causal",
    "bf16,B=1,Sq=128,Sk=128,Hq=2,Hkv=2,D=64,causal,softcap=5,sd=4",
    "f32,B=1,Sq=16,Sk=1,Hq=2,Hkv=1,D=64,causal",
    "f16,B=1,Sq=64,Sk=64,Hq=2,Hkv=2,D=64,causal,scale=0.05",
]
# The det variant on the cases where its dq kernel's block ranges differ most from the main
# kernel's (band edges, Sq != Sk, empty rows, an odd head dim); decoding is among the tiny cases.
DET = [FEATURES[i] for i in (1, 3, 4, 6, 8, 11)]
# With 16 x 16 tiles: more blocks, each loop (masked before, unmasked, masked after) runs more often.
SMALL_TILES = [FEATURES[11], FEATURES[12]]
# GQA (group of 2, softcap and a window) and MQA (group of 8) with the group split over two programs.
SPLIT_CASES = [FEATURES[1], FEATURES[13]]


def _smoke() -> dict:
    return {c.id[len("attn["):-1]: c for c in select("smoke", op=OP)}


def _ids() -> list[str]:
    smoke = _smoke()
    tiny = [k for k, c in smoke.items() if c.params["Sq"] * c.params["Sk"] <= 64]
    ids = [f"triton|{k}|interp" for k in tiny + FEATURES]
    ids += [f"triton@det|{k}|interp" for k in tiny + DET]
    ids += [f"{impl}|{k}|tile16" for k in SMALL_TILES for impl in ("triton", "triton@det")]
    ids += [f"{impl}|{k}|split2" for k in SPLIT_CASES for impl in ("triton", "triton@det")]
    return list(dict.fromkeys(ids))


CASES = _ids()


def run_one(case_id: str) -> str:
    """'ok' or why not: the harness's verdict on one (implementation, case, sizing)."""
    impl_id, key, sizing = case_id.split("|")
    case = _smoke()[key]
    impl = registry.find_impl(OP, impl_id)
    saved = ab.INTERP_CONFIG
    if sizing in SIZINGS:
        ab.INTERP_CONFIG = SIZINGS[sizing]
        ab.clear_plans()
    try:
        r = run_case(impl, case, "cpu", run_seed=7)
    finally:
        if sizing in SIZINGS:
            ab.INTERP_CONFIG = saved
            ab.clear_plans()
    if r.status == "PASS":
        return "ok"
    return f"{r.status}: {r.reason} " + "; ".join(o.message for o in r.outputs if not o.passed)


def check_one(case_id: str) -> None:
    verdict = run_one(case_id)
    assert verdict == "ok", verdict


@pytest.fixture(scope="module")
def subprocess_results():
    """Every case's verdict from a worker that sets TRITON_INTERPRET=1 before importing triton."""
    return worker_results(__file__, "--worker", timeout=1200)


@pytest.mark.parametrize("case_id", CASES)
def test_smoke_case_passes(subprocess_results, case_id):
    check_result(subprocess_results, case_id, check_one)


def test_split_for():
    """The fewest programs per kv head (a divisor of the group) that give two programs per SM."""
    assert ab.split_for(4, 128, 132) == 4      # llama-3 8B, 2k tokens, 128 key blocks x kv heads
    assert ab.split_for(4, 256, 132) == 2
    assert ab.split_for(8, 1024, 132) == 1
    assert ab.split_for(6, 16, 132) == 2       # 4 would not divide the group
    assert ab.split_for(1, 1, 132) == 1        # MHA never splits


def test_registration():
    default = registry.find_impl(OP, "triton")
    det = registry.find_impl(OP, "triton@det")
    assert not default.deterministic, "float atomics on dq: the default variant must not claim determinism"
    assert det.deterministic
    assert default.dtypes == det.dtypes == ("f32", "f16", "bf16", "f64")
    assert callable(default.fn.unchecked) and callable(det.fn.unchecked)
    assert ab._supports(SimpleNamespace(params={"D": 256})) is None
    assert "head dim 320 > 256" in ab._supports(SimpleNamespace(params={"D": 320}))


# ----------------------------------------------------------------------------- empty rows


def _inputs(case_key: str, seed: int = 0):
    case = _smoke()[case_key]
    spec = registry.get_op(OP)
    host = spec.generate(case, np.random.default_rng(seed))
    inputs = {k: _to_torch(v).clone() for k, v in host.items()}
    outs = {n: torch.full_like(inputs[m], float("nan")) for n, m in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    return case, inputs, outs


@pytest.mark.parametrize("variant", ["default", "det"])
@pytest.mark.parametrize("fill", [float("-inf"), float("nan"), 0.0])
def test_empty_rows_ignore_lse_and_o(variant, fill):
    """Rows 0-55 see no key: their lse and o are never to be read (the spec); gradients stay put."""
    if not _interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process")
    case, inputs, outs = _inputs("bf16,B=1,Sq=96,Sk=40,Hq=2,Hkv=1,D=64,causal,win=8x0")
    ab.run(inputs, outs, case.params, variant)
    empty = 56
    poisoned = {k: v.clone() for k, v in inputs.items()}
    poisoned["lse"][:, :, :empty] = fill
    poisoned["o"][:, :empty] = float("nan")
    outs2 = {k: torch.full_like(v, float("nan")) for k, v in outs.items()}
    ab.run(poisoned, outs2, case.params, variant)
    assert torch.equal(outs2["dq"][:, :empty], torch.zeros_like(outs2["dq"][:, :empty]))
    for name in ("dq", "dk", "dv"):
        assert torch.equal(outs[name], outs2[name]), f"{name} moved when empty rows' lse / o changed"


# ----------------------------------------------------------------------------- bad arguments


def _good(d: int = 16):
    q = torch.randn(1, 8, 2, d)
    k = torch.randn(1, 8, 1, d)
    inputs = {"q": q, "k": k, "v": torch.randn_like(k), "o": torch.randn_like(q), "do": torch.randn_like(q),
              "lse": torch.zeros(1, 2, 8)}
    outs = {"dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(k)}
    return inputs, outs, {"causal": True}


@pytest.mark.parametrize("mutate, error, words", [
    (lambda i, o, p: i.update(k=torch.randn(1, 8, 3, 16)), ValueError, ["'k'", "3 heads", "divisor"]),
    (lambda i, o, p: i.update(lse=torch.zeros(1, 2, 8, dtype=torch.float16)), TypeError, ["lse", "float32"]),
    (lambda i, o, p: i.update(v=torch.randn(1, 8, 1, 16, dtype=torch.float64)), TypeError, ["'v'", "float64"]),
    (lambda i, o, p: o.update(dq=torch.empty(1, 8, 2, 8)), ValueError, ["'dq'", "(1, 8, 2, 16)"]),
    (lambda i, o, p: p.update(window=[3]), ValueError, ["window", "[left, right]"]),
    (lambda i, o, p: p.update(softmax_scale=-1.0), ValueError, ["softmax_scale"]),
    (lambda i, o, p: o.update(dq=torch.empty(1, 2, 8, 16).transpose(1, 2)), ValueError, ["dq", "contiguous"]),
    (lambda i, o, p: o.update(dk=o["dv"]), ValueError, ["dk", "buffer of its own", "dv"]),
    (lambda i, o, p: o.update(dq=i["q"]), ValueError, ["dq", "buffer of its own", "q"]),
], ids=["gqa_heads", "lse_dtype", "dtype_mix", "out_shape", "window", "scale", "out_strided", "outs_alias",
        "out_aliases_input"])
@pytest.mark.parametrize("impl_id", ["triton", "triton@det"])
def test_bad_arguments(impl_id, mutate, error, words):
    inputs, outs, params = _good()
    mutate(inputs, outs, params)
    with pytest.raises(error) as info:
        registry.find_impl(OP, impl_id).fn(inputs, outs, params)
    msg = str(info.value)
    assert "triton" in msg and OP in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_head_dim_limit():
    inputs, outs, params = _good(320)
    with pytest.raises(ValueError) as info:
        ab.attention_backward(inputs, outs, params)
    msg = str(info.value)
    assert msg.startswith("triton attention_backward: head dim") and "at most 256" in msg and "320" in msg, msg


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    report(CASES, check_one)


def test_dq_by_atomics(monkeypatch):
    """triton's dq: the separate pass where its grid has a program per SM or more, atomics on shorter
    work (decoding) and on the CPU (so the interpreter cases cover the atomic kernels); @det never."""
    monkeypatch.setattr(ab, "_sm_count", lambda device: 132)
    cfg = ab.Config(64, 128, 8, 3, 128, 64, 8, 3)
    cuda, cpu = SimpleNamespace(type="cuda", index=0), SimpleNamespace(type="cpu", index=None)

    def q(b, sq, hq, device=cuda):
        return SimpleNamespace(shape=(b, sq, hq, 128), device=device)

    assert ab.dq_by_atomics("default", q(1, 1, 32), cfg)              # decoding: 32 programs
    assert ab.dq_by_atomics("default", q(1, 1, 64), cfg)
    assert not ab.dq_by_atomics("default", q(32, 512, 16), cfg)       # 4 x 512 programs
    assert ab.dq_by_atomics("default", q(1, 1024, 16), cfg)           # 8 x 16 = 128 programs < 132 SMs
    assert not ab.dq_by_atomics("default", q(1, 2048, 16), cfg)       # 16 x 16
    assert ab.dq_by_atomics("default", q(1, 2048, 16), ab.Config(64, 128, 8, 3, 256, 64, 8, 3))  # 8 x 16
    assert not ab.dq_by_atomics("default", q(1, 2048, 32), cfg)
    assert not ab.dq_by_atomics("det", q(1, 1, 32), cfg)
    assert ab.dq_by_atomics("default", q(32, 512, 16, cpu), cfg)
