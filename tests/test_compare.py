"""harness.compare's fast path (everything finite) against its general path: the same report, field by
field, on outputs that pass, fail, hold exact zeros and ties; and compare picks the general path where
anything is inf or NaN."""
from __future__ import annotations

import numpy as np
import pytest

from harness import compare as cmp


def _arrays(seed: int, shape, fail: bool, zeros: bool):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3], size=shape)
    scale = np.abs(rng.standard_normal(shape)) + 0.1
    got = ref + rng.standard_normal(shape) * 1e-9
    if zeros:  # exact zeros in ref, in got - ref, and both (0/0 in the relative error)
        flat_ref, flat_got = ref.reshape(-1), got.reshape(-1)
        idx = rng.choice(flat_ref.size, size=max(1, flat_ref.size // 5), replace=False)
        flat_ref[idx[::2]] = 0.0
        flat_got[idx] = flat_ref[idx]
        flat_got[idx[1::4]] = 1e-3  # a zero oracle value, a nonzero output: relative error inf
    if fail:
        i = rng.choice(got.size, size=min(3, got.size), replace=False)
        got.reshape(-1)[i] += 1e4 * (1.0 + np.abs(ref.reshape(-1)[i]))
    return got, ref, scale


def _fields(r: cmp.OutputReport) -> dict:
    return {k: getattr(r, k) for k in ("name", "passed", "max_abs", "max_abs_index", "max_rel", "rel_l2",
                                       "mismatches", "numel", "worst_ratio", "worst_index", "message")}


@pytest.mark.parametrize("shape", [(1,), (7,), (5, 33), (3, 4, 17), (2, 300)])
@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("chunk", [7, 64, cmp.CHUNK])  # chunks that split the arrays, and one that does not
def test_fast_path_matches_the_general_path(monkeypatch, shape, fail, zeros, dtype, exact, chunk):
    monkeypatch.setattr(cmp, "CHUNK", chunk)
    got, ref, scale = _arrays(hash((shape, fail, zeros, dtype)) % 2**32, shape, fail, zeros)
    tol = cmp.exact_tolerance(ref, dtype) if exact else cmp.tolerance(ref, scale, 16, dtype)
    fast = cmp._finite_report("dx", got, ref, tol, ref.size, exact)
    general = cmp._general_report("dx", got, got - ref, ref, tol, ref.size, exact)
    assert fast.rel_l2 == pytest.approx(general.rel_l2, rel=1e-12, abs=0)  # sums of squares per chunk
    fast.rel_l2 = general.rel_l2
    assert _fields(fast) == _fields(general)
    if fail:  # the planted errors are seen
        assert not fast.passed and fast.mismatches >= min(3, ref.size) and fast.message


def test_all_zero_output_and_oracle():
    ref = np.zeros((4, 5))
    tol = cmp.tolerance(ref, np.ones_like(ref), 8, "f32")
    fast = cmp._finite_report("dw", ref.copy(), ref, tol, ref.size, False)
    assert _fields(fast) == _fields(cmp._general_report("dw", ref.copy(), ref - ref, ref, tol, ref.size, False))
    assert fast.passed and fast.max_rel == 0.0 and fast.rel_l2 == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["got", "ref"])
def test_non_finite_values_take_the_general_path(monkeypatch, bad, where):
    got, ref, scale = _arrays(3, (6, 7), False, False)
    (got if where == "got" else ref)[2, 3] = bad
    monkeypatch.setattr(cmp, "_finite_report", lambda *a, **k: pytest.fail("fast path on non-finite values"))
    report = cmp.compare("dx", got, ref, scale, 16, "f32")
    assert not report.passed and report.worst_index == (2, 3)


def test_finite_values_take_the_fast_path(monkeypatch):
    got, ref, scale = _arrays(4, (6, 7), False, True)
    monkeypatch.setattr(cmp, "_general_report", lambda *a, **k: pytest.fail("general path on finite values"))
    assert cmp.compare("dx", got, ref, scale, 16, "f32").numel == got.size


@pytest.mark.parametrize("got_value,passes", [(np.inf, True), (-np.inf, False), (1e30, False), (np.nan, False)])
def test_an_inf_oracle_value_passes_only_the_same_inf(got_value, passes):
    """The tolerance is inf where the oracle is inf (u * |ref|): without its own rule a finite output
    would pass there."""
    ref = np.array([1.0, np.inf, -2.0])
    got = np.array([1.0, got_value, -2.0])
    report = cmp.compare("dy", got, ref, np.ones(3), 4, "f32")
    assert report.passed == passes
    if not passes:
        assert report.mismatches == 1 and report.worst_index == (1,) and report.worst_ratio == np.inf


@pytest.mark.parametrize("chunk", [3, 5, 1 << 16])
def test_ties_across_chunks_name_the_first_element(monkeypatch, chunk):
    """np.argmax names the first of equal largest values; the chunked fast path must too."""
    monkeypatch.setattr(cmp, "CHUNK", chunk)
    ref = np.ones(20)
    got = ref.copy()
    got[[4, 9, 17]] += 0.5  # three equal errors, in different chunks
    report = cmp.compare("dx", got, ref, np.ones(20), 4, "f32")
    assert not report.passed and report.mismatches == 3
    assert report.max_abs_index == (4,) and report.worst_index == (4,)
