"""Timed runs are re-validated: a backend that is right once and stale after must fail (harness.runner.timed_check)."""
import numpy as np
import pytest

import planted
from cases import Case
from harness import prepared as prepared_mod
from harness import runner, timing
from harness.registry import Backend, discover, find_impl, impls_for
from oracle.binary_backward import partials
from oracle.broadcast import sum_to_shape

CASE = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8]})
QUICK = timing.TimingConfig(mode="hot", rel_ci=0.05, min_samples=5, max_samples=30, budget_s=0.05,
                            warmup_budget_s=0.05, warmup_max=10)


def _impl(variant):
    return planted.planted.impls[("binary_backward", variant)]


@pytest.mark.parametrize("variant", ["stale_cache", "compute_once", "address_memo"])
def test_stale_backend_passes_its_first_call_and_fails_revalidation(variant):
    planted.forget()
    # One call, no repeats or stale-output check (run_case's own checks fail these: test_planted_faults.py).
    first = runner.run_case(_impl(variant), CASE, "cpu", run_seed=3, oracle="numpy", repeats=1, recheck=False)
    assert first.status == "PASS", first.report()
    planted.forget()
    timed = runner.run_case(_impl(variant), CASE, "cpu", run_seed=3, oracle="numpy", timed=True,
                            timing_config=QUICK, repeats=1)
    assert timed.status == "FAIL", timed.report()
    # Its one untimed call passed (no repeat, no stale check): the timed path is what failed it.
    assert (timed.calls, timed.recheck) == (1, ""), timed.report()
    assert timed.reason.startswith(runner.REVALIDATION), timed.reason
    assert timed.repro.endswith(" --time") and timed.timing["n"] >= 5
    text = timed.report()
    assert "[grad_a] FAIL" in text and "stale or cached output?" in text
    print(text)


def test_correct_backend_passes_timed_revalidation_in_every_mode():
    discover()
    torch_impl = find_impl("binary_backward", "torch")
    for mode in ("cold", "hot", "graph"):
        r = runner.run_case(torch_impl, CASE, "cpu", run_seed=1, oracle="numpy", timed=True,
                            timing_config=timing.TimingConfig(mode=mode, budget_s=0.02, min_samples=3,
                                                              warmup_budget_s=0.02))
        assert r.status == "PASS", r.report()
        assert r.time_ms > 0 and r.timing["requested_mode"] == mode and r.timing["final_ms"] > 0
        assert r.timing["mode"] == ("hot" if mode == "graph" else mode)


def test_rotated_sets_are_refilled_where_the_final_call_reads():
    """k input copies: the final call's set (whichever it is) gets the fresh values; the memo still fails."""
    cfg = timing.TimingConfig(mode="hot", rotate=3, rel_ci=0.05, min_samples=4, max_samples=11, budget_s=0.05)
    final = runner.prepare(CASE, 5, "numpy", variant=1)
    timing_inputs = runner.generate(CASE, 5, variant=0)
    planted.forget()
    bad = runner.timed_check(_impl("address_memo"), CASE, "cpu", timing_inputs, final, cfg)
    assert bad.status == "FAIL" and bad.samples.rotate == 3
    discover()
    good = runner.timed_check(find_impl("binary_backward", "torch"), CASE, "cpu", timing_inputs, final, cfg)
    assert good.status == "PASS" and good.samples.rotate == 3


class _FakeGraphRun:
    """Stands in for timing.time_fn in graph mode: 'replays' re-run the captured call indices."""

    def __init__(self, call, calls=4, first=10):
        self.call, self.calls, self.first = call, calls, first

    def __call__(self, call, device, cfg, framework, sync, clock, rotate):
        graph = type("G", (), {"replay": lambda g: [call(self.first + i) for i in range(self.calls)]})()
        for _ in range(3):
            graph.replay()
        samples = timing.Samples([1.0] * 5, "graph", "cuda_graph", calls_per_sample=self.calls)
        return timing.TimedRun(samples, self.first + self.calls - 1, lambda: (graph.replay(), 1.0)[1], graph)


def test_graph_branch_repoisons_every_set_and_judges_the_replayed_outputs(monkeypatch):
    monkeypatch.setattr(runner.timing, "time_fn", _FakeGraphRun(None))
    cfg = timing.TimingConfig(mode="hot", rotate=2)
    final = runner.prepare(CASE, 2, "numpy", variant=1)
    timing_inputs = runner.generate(CASE, 2, variant=0)
    discover()
    good = runner.timed_check(find_impl("binary_backward", "torch"), CASE, "cpu", timing_inputs, final, cfg)
    assert good.status == "PASS", [o.line() for o in good.outputs]
    planted.forget()
    bad = runner.timed_check(_impl("compute_once"), CASE, "cpu", timing_inputs, final, cfg)
    assert bad.status == "FAIL" and "got nan" in bad.outputs[0].message


# ----------------------------------------------------------------------------- sampled judging

holes = Backend("holes", framework="numpy", devices=("cpu",), register=False)


@holes.impl("binary_backward", variant="one_hole", dtypes=("f32",))
def one_hole(inputs, outs, params):
    """Right everywhere except one element of grad_a in the middle, never written."""
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    outs["grad_a"][...] = sum_to_shape(g * da, a.shape)
    outs["grad_b"][...] = sum_to_shape(g * db, b.shape)
    outs["grad_a"].reshape(-1)[outs["grad_a"].size // 2 + 1] = np.nan


def test_sampled_judging_checks_values_on_a_sample_and_nans_everywhere(monkeypatch):
    big = Case("binary_backward", "f32", {"fn": "mul", "a": [64, 64], "b": [64]})
    prepared = runner.prepare(big, 0, "numpy")
    discover()
    torch_impl = find_impl("binary_backward", "torch")
    inputs, outs = runner.call(torch_impl, prepared, big, "cpu")
    monkeypatch.setattr(prepared_mod, "SAMPLE_SIZE", 16)
    reports = runner.judge(torch_impl, prepared, big, outs, sample_above=100)
    grad_a, grad_b = reports
    assert grad_a.passed and "sampled" in grad_a.message and grad_a.numel <= 18
    assert grad_a.details["sampled"]["numel"] == 4096
    assert grad_b.passed and "sampled" not in grad_b.message  # 64 elements: judged whole
    idx = runner.sample_index(4096, 16, prepared.seed)
    assert idx[0] == 0 and idx[-1] == 4095 and (np.diff(idx) > 0).all()
    _, holey = runner.call(holes.impls[("binary_backward", "one_hole")], prepared, big, "cpu")
    assert 2049 not in idx  # the hole is outside the sample...
    reports = runner.judge(holes.impls[("binary_backward", "one_hole")], prepared, big, holey, sample_above=100)
    assert not reports[0].passed and "NaN count 1, the oracle has 0" in reports[0].message  # ...and still found
    wrong = {k: v * 1.5 for k, v in outs.items()}
    reports = runner.judge(torch_impl, prepared, big, wrong, sample_above=100)
    assert not reports[0].passed and reports[0].worst_index != () and len(reports[0].worst_index) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cold", "graph"])
def test_every_cuda_backend_times_and_revalidates(mode, monkeypatch):
    """On a GPU: each backend of binary_backward, timed and re-validated (sampled judging on the device)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    discover()
    case = Case("binary_backward", "bf16", {"fn": "mul", "a": [64, 256], "b": [256]})
    final = runner.prepare(case, 0, "numpy")
    timing_inputs = runner.generate(case, 0, variant=1)
    monkeypatch.setattr(prepared_mod, "SAMPLE_SIZE", 512)
    cfg = timing.TimingConfig(mode=mode, budget_s=0.05, min_samples=5, warmup_budget_s=0.1)
    ran = 0
    for impl in impls_for("binary_backward"):
        if impl.skip_reason(case, "cuda"):
            continue
        r = runner.timed_check(impl, case, "cuda", timing_inputs, final, cfg, sample_above=1000)
        assert r.status == "PASS", (impl.id, r.reason, [o.line() for o in r.outputs])
        assert "sampled" in r.outputs[0].message and r.samples.median > 0
        if mode == "graph" and impl.backend.framework != "jax":
            print(impl.id, r.samples.mode, r.samples.fallback)
        ran += 1
    assert ran >= 3


def test_failed_revalidation_says_stale_or_inaccurate():
    """The diagnosis after a failed re-validation: a wrong-everywhere kernel is called inaccurate,
    a cached one stale (the cached variants above), so a precision failure on the second input
    set is not reported as caching."""
    first, alt = runner.prepare(CASE, 3, "numpy"), runner.prepare(CASE, 3, "numpy", variant=1)
    why = runner.diagnose_revalidation(planted.planted.impls[("binary_backward", "zeros")], first, alt, CASE, "cpu")
    assert why.startswith("fails on a second input set"), why
    planted.forget()
    runner.call(_impl("stale_cache"), first, CASE, "cpu")
    why = runner.diagnose_revalidation(_impl("stale_cache"), first, alt, CASE, "cpu")
    assert why.endswith("returns the first input set's result."), why


def test_bench_row_says_inaccurate_not_stale_for_a_wrong_kernel():
    """bench's timed inputs have no oracle: its diagnosis runs without the first set and must
    still call a kernel that is wrong on every input set inaccurate, not stale (a cached one is
    told apart by returning the same bits on both sets: test_bench_cli)."""
    from harness import bench, timing

    impl = planted.planted.impls[("binary_backward", "copy_input")]  # wrong, but follows its inputs
    opts = bench.BenchOptions("cpu", timing.TimingConfig(mode="hot", budget_s=0.01, min_samples=3), progress=False)
    inputs = bench.finish(CASE, bench.case_inputs(CASE, 0, "numpy", "cpu"))
    row = bench.bench_pair(impl, CASE, inputs, opts)
    assert row["status"] == "FAIL" and row["reason"].startswith("fails on a second input set"), row["reason"]
