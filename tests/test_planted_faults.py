"""The harness must reject wrong kernels: zeros, copies, unreduced broadcasts, unwritten elements,
out-of-bounds writes and reads, mutated inputs, changing bits on repeated calls, stale outputs."""
from math import prod

import numpy as np
import pytest

import planted as planted_module
from cases import Case, select
from harness import runner
from harness.registry import get_op
from harness.runner import REPEAT_ENV, STALE, prepare, run_case
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


# ----------------------------------------------------------------------------- guards (harness/guards.py)

SMALL = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8]})
ROWS = Case("binary_backward", "f32", {"fn": "mul", "a": [64, 32], "b": [32]})  # a 64-term sum per grad_b


def _torch_impl(variant):
    return planted_module.planted_torch.impls[("binary_backward", variant)]


def _line(result, name, check):
    found = [o for o in result.outputs if o.name == name and o.details.get("check") == check]
    assert len(found) == 1, result.report()
    return found[0].line()


@pytest.mark.parametrize("impl", [_impl("oob_write_after"), _torch_impl("oob_write_after")], ids=["numpy", "torch"])
def test_write_one_past_the_end_fails_naming_output_and_offset(impl):
    result = run_case(impl, SMALL, "cpu")
    assert result.status == "FAIL"
    assert _line(result, "grad_b", "guard_band") == \
        "[grad_b] FAIL guard band written: 1 element(s) after the end changed, first at end+0"
    assert all(o.passed for o in result.outputs if not o.details.get("check"))  # the values alone pass
    assert "reproduce: python -m harness run --op binary_backward --backend " in result.report()


def test_nan_written_before_the_start_fails():
    result = run_case(_impl("oob_write_before"), SMALL, "cpu")
    assert result.status == "FAIL"
    assert _line(result, "grad_a", "guard_band") == \
        "[grad_a] FAIL guard band written: 1 element(s) before the start changed, nearest at start-1"


@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
def test_reads_past_either_end_read_nan_in_every_layout(layout):
    after = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8], "g_layout": layout})
    before = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8], "a_layout": layout})
    for variant, case, out in (("oob_read_after", after, "grad_a"), ("oob_read_before", before, "grad_b")):
        result = run_case(_impl(variant), case, "cpu")
        assert result.status == "FAIL", result.report()
        report = next(o for o in result.outputs if o.name == out)
        assert report.mismatches == 1 and "got nan" in report.message, report.line()


@pytest.mark.parametrize("impl, name, where", [(_impl("mutates_input"), "grad_out", "(0,0)"),
                                               (_torch_impl("mutates_input"), "b", "(0)")], ids=["numpy", "torch"])
def test_input_mutation_fails_naming_the_input_and_first_index(impl, name, where):
    result = run_case(impl, SMALL, "cpu")
    assert result.status == "FAIL"
    line = _line(result, name, "input_mutated")
    count = 48 if name == "grad_out" else 8
    assert line.startswith(f"[{name}] FAIL input modified by the call: {count} element(s) changed, "
                           f"first at {where}: was ")


def test_correct_torch_kernel_passes_every_guard():
    result = run_case(_torch_impl("ok"), SMALL, "cpu")
    assert result.status == "PASS", result.report()
    assert result.calls == 3 and result.spread == 0.0 and result.recheck == "oracle"


def test_deterministic_claim_with_changing_bits_fails():
    result = run_case(_impl("racy_sum"), ROWS, "cpu")
    assert result.status == "FAIL", result.report()
    line = _line(result, "grad_b", "nondeterministic")
    assert line.startswith("[grad_b] FAIL not deterministic (the implementation says it is): call 2 differs bitwise "
                           "from call 1 in ") and "first at (" in line
    assert "call 2 of 2 on the same inputs" in result.reason
    assert 0 < result.spread < 1  # within tolerance: only the bitwise check sees it


def test_declared_nondeterminism_passes_and_reports_its_spread():
    result = run_case(_impl("racy_sum_declared"), ROWS, "cpu", repeats=4)
    assert result.status == "PASS", result.report()
    row = result.to_json()
    assert 0 < row["spread"] < 1 and row["calls"] == 5 and row["recheck"] == "oracle"
    assert "run-to-run spread over 4 calls on the same inputs:" in result.report()


def test_default_repeats_are_two_calls_below_the_size_bound(monkeypatch):
    monkeypatch.delenv(REPEAT_ENV, raising=False)
    inputs = prepare(SMALL).inputs
    assert runner.repeat_count(None, SMALL, inputs) == (2, False)
    assert runner.repeat_count(5, SMALL, inputs) == (5, True)
    monkeypatch.setattr(runner, "REPEAT_MAX_BYTES", 16)
    assert runner.repeat_count(None, SMALL, inputs) == (1, False)
    monkeypatch.setenv(REPEAT_ENV, "3")
    assert runner.repeat_count(None, SMALL, inputs) == (3, True)
    result = run_case(_impl("racy_sum"), ROWS, "cpu")
    assert result.status == "FAIL" and result.repro.endswith(" --repeat 3")
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        runner.repeat_count(0, SMALL, inputs)


def test_the_stale_check_tier_is_a_function_of_the_case_not_of_the_machine():
    """Every smoke case gets the second oracle; a 32 Mi-float sum (134 MB) and a 1024^3 matmul (4.3 GFLOP),
    whose preparation takes about 0.4 s on one core, get the `changed` tier on every machine."""
    assert all(runner.cheap_oracle(c) for c in SMOKE)
    big = [c for c in select("full") if c.id in ("sum[f32,X=33554432,axes=all]", "matmul[f32,A=1024x1024,B=1024x1024]")]
    assert len(big) == 2 and not any(runner.cheap_oracle(c) for c in big)


@pytest.mark.parametrize("variant", ["stale_cache", "compute_once", "address_memo"])
@pytest.mark.parametrize("tier", ["oracle", "changed"])
def test_stale_kernels_fail_the_untimed_path(variant, tier, monkeypatch):
    """Right on their first call; the refill-in-place call fails them, with or without a second oracle."""
    if tier == "changed":
        monkeypatch.setattr(runner, "RECHECK_ORACLE_BYTES", -1)
    planted_module.forget()
    result = run_case(_impl(variant), SMALL, "cpu", repeats=1)
    assert result.status == "FAIL" and result.recheck == tier, result.report()
    assert result.reason.startswith(STALE), result.reason
    assert "reproduce: python -m harness run" in result.report()
    if tier == "oracle":
        assert ("first input set's result" in result.reason) or ("unwritten" in result.reason), result.reason
    print(result.report())


@pytest.mark.parametrize("tier", ["oracle", "changed"])
def test_correct_backend_passes_both_stale_tiers_even_on_zero_outputs(tier, monkeypatch):
    """No false alarm: outputs that are exactly zero whatever the inputs (a size-0 broadcast dim) stay equal."""
    from harness.registry import discover, find_impl

    if tier == "changed":
        monkeypatch.setattr(runner, "RECHECK_ORACLE_BYTES", -1)
    discover()
    torch_impl = find_impl("binary_backward", "torch")
    zero_cases = [c for c in BINARY if _trivially_zero(c) and any(prod(r.shape) for r in prepare(c).ref.values())]
    for case in [SMALL] + zero_cases[:3]:
        result = run_case(torch_impl, case, "cpu")
        assert result.status == "PASS" and result.recheck == tier, result.report()


def test_trivial_outputs_are_named_only_when_they_fail():
    zero = run_case(_impl("zeros"), SMALL, "cpu")
    assert all("output is all zeros; worst at" in o.message for o in zero.outputs), zero.report()
    copied = run_case(_impl("copy_input"), SMALL, "cpu")
    assert ["output equals input 'a' bitwise" in copied.outputs[0].message,
            "output equals input 'b' bitwise" in copied.outputs[1].message] == [True, True], copied.report()
    a_bcast = Case("binary_backward", "f32", {"fn": "mul", "a": [1, 1, 4, 5], "b": [2, 3, 4, 5]})
    wrong = run_case(_impl("a_not_reduced"), a_bcast, "cpu")
    assert wrong.status == "FAIL" and "bitwise" not in wrong.report() and "all zeros" not in wrong.report()
    exempt = next(c for c in SMOKE if _trivially_zero(c))  # zeros are right there: no diagnosis
    assert "all zeros" not in run_case(_impl("zeros", exempt.op), exempt, "cpu").report()
