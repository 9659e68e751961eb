"""The two oracles check each other on every smoke case, and both match central finite differences."""
from math import prod

import numpy as np
import pytest

from cases import select
from harness.compare import compare
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
    assert set(jax_out) == set(prep.ref) == set(spec.outputs_of(case))
    refs = _numpy_on_exact_inputs(spec, prep, case)
    for name in spec.outputs_of(case):
        ref, got = refs[name], jax_out[name]
        assert got.shape == ref.shape, name
        scale = prep.scale[name][0]
        np.testing.assert_array_less(np.abs(got - ref), 1e-13 * (scale + np.abs(ref)) + 1e-300, err_msg=name)


def _numpy_on_exact_inputs(spec, prep, case):
    """The numpy oracle where it matches jax.vjp exactly.  An op with exact_inputs (attention) takes
    saved forward results, rounded as stored, and uses them as given; the vjp recomputes them.  Then
    the numpy oracle runs again on the exact ones, and the rounding of the stored ones must stay well
    inside the tolerance model (the recomputing baselines, torch and jax, rely on that)."""
    if spec.exact_inputs is None:
        return prep.ref
    exact = spec.numpy_oracle(spec.exact_inputs(prep.inputs64, case.params), case.params)
    for name in spec.outputs_of(case):
        scale, n = prep.scale[name]
        report = compare(name, prep.ref[name], exact[name], scale, n, case.dtype)
        assert report.worst_ratio < 0.5, f"stored forward results move {name} by {report.line()}"
    return exact


@pytest.mark.parametrize("case", TINY, ids=lambda c: f"{c.op}-{c.id}")
def test_oracles_match_central_differences(case):
    spec = get_op(case.op)
    prep = prepare(case)
    jax_out = spec.jax_oracle(prep.inputs64, case.params)
    refs = _numpy_on_exact_inputs(spec, prep, case)
    h = 1e-6
    for out_name, wrt in spec.wrt.items():
        if out_name not in spec.outputs_of(case):  # an optional output this case does not have
            continue
        point = dict(prep.inputs64)
        if wrt not in point:  # a primal the op does not take (conv dgrad's x): the op's output cannot depend
            # on it, so the loss is linear in it and any point will do
            point[wrt] = np.random.default_rng(0).uniform(-1, 1, prep.ref[out_name].shape)
        x = point[wrt]
        fd = np.zeros(x.shape)
        for idx in np.ndindex(x.shape):
            plus = {k: v.copy() for k, v in point.items()}
            minus = {k: v.copy() for k, v in point.items()}
            plus[wrt][idx] += h
            minus[wrt][idx] -= h
            fd[idx] = (spec.loss(plus, case.params) - spec.loss(minus, case.params)) / (2 * h)
        for oracle, got in (("numpy", refs[out_name]), ("jax", jax_out[out_name])):
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6, err_msg=f"{oracle} {out_name}")


def test_every_op_has_both_oracles_and_a_tiny_case():
    for name, spec in load_ops().items():
        assert spec.loss and spec.wrt, name
        assert any(c.op == name for c in TINY), name
