"""The two oracles check each other on every smoke case, and both match central finite differences."""
from math import prod

import numpy as np
import pytest

from cases import select
from harness.registry import get_op, load_ops
from harness.runner import prepare

SMOKE = select("smoke")
# Small enough for one pair of forward evaluations per input element.
TINY = [c for c in SMOKE if max(prod(s) for s in get_op(c.op).shapes(c).values()) <= 64]


@pytest.mark.parametrize("case", SMOKE, ids=lambda c: f"{c.op}-{c.id}")
def test_numpy_matches_jax(case):
    spec = get_op(case.op)
    prep = prepare(case)
    jax_out = spec.jax_oracle(prep.inputs64, case.params)
    for name in spec.outputs:
        ref, got = prep.ref[name], jax_out[name]
        assert got.shape == ref.shape, name
        scale = prep.scale[name][0]
        np.testing.assert_array_less(np.abs(got - ref), 1e-13 * (scale + np.abs(ref)) + 1e-300, err_msg=name)


@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c.op}-{c.id}")
def test_oracles_match_central_differences(case):
    spec = get_op(case.op)
    prep = prepare(case)
    jax_out = spec.jax_oracle(prep.inputs64, case.params)
    h = 1e-6
    for out_name, wrt in spec.wrt.items():
        x = prep.inputs64[wrt]
        fd = np.zeros(x.shape)
        for idx in np.ndindex(x.shape):
            plus = {k: v.copy() for k, v in prep.inputs64.items()}
            minus = {k: v.copy() for k, v in prep.inputs64.items()}
            plus[wrt][idx] += h
            minus[wrt][idx] -= h
            fd[idx] = (spec.loss(plus, case.params) - spec.loss(minus, case.params)) / (2 * h)
        for oracle, got in (("numpy", prep.ref[out_name]), ("jax", jax_out[out_name])):
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6, err_msg=f"{oracle} {out_name}")


def test_every_op_has_both_oracles_and_a_tiny_case():
    for name, spec in load_ops().items():
        assert spec.loss and spec.wrt, name
        assert any(c.op == name for c in TINY), name
