"""The harness must reject wrong kernels: zeros, copies, unreduced broadcasts, unwritten elements."""
from math import prod

import numpy as np
import pytest

from cases import Case, select
from harness.registry import get_op
from harness.runner import prepare, run_case
from planted import planted

SMOKE = select("smoke")  # every op
BINARY = [c for c in SMOKE if c.op == "binary_backward"]


def _impl(variant, op="binary_backward"):
    return planted.impls[(op, variant)]


def _trivially_zero(case):
    """Cases whose every output is empty or exactly zero: e.g. an operand broadcast along a size-0 dim."""
    ref = prepare(case).ref
    return all(prod(r.shape) == 0 or not np.any(r) for r in ref.values())


@pytest.mark.parametrize("case", SMOKE, ids=lambda c: f"{c.op}-{c.id}")
def test_all_zero_output_fails(case):
    result = run_case(_impl("zeros", case.op), case, "cpu")
    if _trivially_zero(case):
        assert result.status == "PASS"  # zeros are the right answer (see the exemption test)
    else:
        assert result.status == "FAIL", result.report()


def test_zero_exemptions_are_only_empty_cases():
    exempt = [c for c in SMOKE if _trivially_zero(c)]
    assert exempt, "the smoke set should include size-0 dims"
    # only cases where some tensor has a size-0 dim (e.g. an operand broadcast along it)
    assert all(any(0 in s for s in get_op(c.op).shapes(c).values()) for c in exempt), [c.id for c in exempt]


@pytest.mark.parametrize("case", [c for c in BINARY if prod(c.params["a"]) > 1 or prod(c.params["b"]) > 1],
                         ids=lambda c: c.id)
def test_copy_of_input_fails(case):
    assert run_case(_impl("copy_input"), case, "cpu").status == "FAIL"


def test_planted_unreduced_grad_a_fails_readably():
    """The seed's bug: grad_a not reduced when A is broadcast.  B-broadcast cases pass, A-broadcast fail."""
    b_only = Case("binary_backward", "f32", {"fn": "mul", "a": [2, 3, 4, 5], "b": [1, 1, 4, 5]})
    a_bcast = Case("binary_backward", "f32", {"fn": "mul", "a": [1, 1, 4, 5], "b": [2, 3, 4, 5]})
    assert run_case(_impl("a_not_reduced"), b_only, "cpu").status == "PASS"
    result = run_case(_impl("a_not_reduced"), a_bcast, "cpu")
    assert result.status == "FAIL"
    text = result.report()
    assert "[grad_a] FAIL max_abs=" in text and "mismatches=" in text and "@ (" in text
    assert "[grad_b] PASS" in text
    assert "reproduce: python -m harness run --op binary_backward --backend planted@a_not_reduced" in text
    print(text)


def test_unwritten_element_fails_through_nan_poison():
    case = Case("binary_backward", "f32", {"fn": "add", "a": [3, 4], "b": [4]})
    result = run_case(_impl("misses_last"), case, "cpu")
    assert result.status == "FAIL"
    grad_b = next(o for o in result.outputs if o.name == "grad_b")
    assert grad_b.mismatches == 1 and grad_b.worst_index == (3,) and "got nan" in grad_b.message


def test_float16_accumulation_fails_long_reductions():
    case = Case("binary_backward", "f16", {"fn": "mul", "a": [4096, 64], "b": [64]})
    assert run_case(_impl("fp16_accumulate"), case, "cpu").status == "FAIL"
