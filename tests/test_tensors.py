"""Layouts of host tensors (harness/tensors.py) and the case validation that relies on them:
a layout is built as asked or rejected with a clear error, never silently replaced by contig."""
import numpy as np
import pytest

from cases import Case
from harness.registry import get_op
from harness.prepare import prepare
from harness.tensors import LAYOUT_MIN_RANK, LAYOUTS, from_values, layout_error


def test_every_layout_has_a_minimum_rank():
    assert set(LAYOUT_MIN_RANK) == set(LAYOUTS)


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_values_builds_exactly_the_layouts_layout_error_accepts(layout, rank):
    values = np.arange(1.0, 1.0 + 2 ** rank).reshape((2,) * rank)
    why = layout_error(layout, rank)
    if why is None:
        t = from_values(values, "f32", layout)
        assert t.layout == layout and t.shape == values.shape and np.array_equal(t.float64(), values)
    else:
        with pytest.raises(ValueError, match=f"layout '{layout}' needs rank >= {LAYOUT_MIN_RANK[layout]}, got rank "
                                             f"{rank}"):
            from_values(values, "f32", layout)


@pytest.mark.parametrize("layout, words", [("sliced", "needs rank >= 1, got rank 0"),
                                           ("transposed", "needs rank >= 2, got rank 0"),
                                           ("strided", "unknown layout 'strided': expected one of contig")])
def test_a_scalar_takes_only_contig(layout, words):
    """Before: a rank-0 tensor ignored its layout (built contig whatever was asked)."""
    assert from_values(np.float64(1.5), "bf16").layout == "contig"
    with pytest.raises(ValueError, match=words):
        from_values(np.float64(1.5), "bf16", layout)


BASE = {"fn": "mul", "a": [2, 3], "b": [3]}


@pytest.mark.parametrize("extra, words", [
    ({"a_layuot": "transposed"}, r"binary_backward case: unknown param 'a_layuot': expected one of fn, a, b, "
                                 r"a_layout, b_layout, g_layout"),
    ({"b_layout": "transposed"}, r"param 'b_layout' \(b has rank 1\): layout 'transposed' needs rank >= 2, got rank 1"),
    ({"a": [], "a_layout": "sliced"}, r"param 'a_layout' \(a has rank 0\): layout 'sliced' needs rank >= 1"),
    ({"g_layout": "strided"}, r"param 'g_layout' \(grad_out has rank 2\): unknown layout 'strided'"),
    ({"a": [2, -3]}, r"param 'a': expected a shape \(a list of non-negative ints\), got \[2, -3\]"),
    ({"b": [4]}, r"params 'a' and 'b': expected shapes that broadcast \(NumPy rules\), got \[2, 3\] and \[4\]"),
])
def test_binary_backward_validate_names_the_param_expected_and_got(extra, words):
    case = Case("binary_backward", "f32", {**BASE, **extra})
    with pytest.raises(ValueError, match=words):
        get_op("binary_backward").validate(case)


@pytest.mark.parametrize("layouts", [{}, {"a_layout": "transposed", "b_layout": "sliced", "g_layout": "sliced"},
                                     {"a": [], "b": [2, 3], "g_layout": "transposed"}])
def test_binary_backward_cases_validate_accepts_run(layouts):
    case = Case("binary_backward", "f32", {**BASE, **layouts})
    get_op("binary_backward").validate(case)
    prepared = prepare(case)
    for key, name in (("a_layout", "a"), ("b_layout", "b"), ("g_layout", "grad_out")):
        assert prepared.inputs[name].layout == layouts.get(key, "contig")
