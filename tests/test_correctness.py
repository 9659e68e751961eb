"""Every registered implementation against the float64 oracle on every selected case."""
import pytest

from harness.runner import run_case


def test_correctness(op_name, impl, case, run_options):
    result = run_case(impl, case, **run_options)
    if result.status == "SKIP":
        pytest.skip(result.reason)
    assert result.status == "PASS", "\n" + result.report()
