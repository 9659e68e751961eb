"""Repro lines that really reproduce (harness.runner.repro_command, CaseResult.report), and timed
calls that skip the argument checks once the first call passed them (harness.registry.timed_callable)."""
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import planted_fuzz
from cases import Case
from harness import argcheck, runner, timing
from harness.isolate import IsolatedRunner
from harness.results import CaseResult
from harness.registry import ENV_BACKENDS, Backend, discover, find_impl, timed_callable
from oracle.binary_backward import partials
from oracle.broadcast import sum_to_shape

ROOT = Path(__file__).resolve().parents[1]
CASE = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8]})
TRIGGER = Case("binary_backward", "f32", {"fn": "add", "a": [1, 2, 3], "b": [1, 1, 3]})  # fuzzbugs@mid_bcast_odd fails
QUICK = timing.TimingConfig(mode="hot", rel_ci=0.05, min_samples=5, max_samples=30, budget_s=0.05,
                            warmup_budget_s=0.05, warmup_max=10)


def _mid_bcast():
    return planted_fuzz.fuzzbugs.impls[("binary_backward", "mid_bcast_odd")]


# ----------------------------------------------------------------------------- the repro line


@pytest.mark.parametrize("status", ["FAIL", "ERROR", "CRASH", "TIMEOUT"])
def test_every_failed_row_prints_its_repro_line(status):
    row = runner.CaseResult("binary_backward", "x", "mul[f32]", "f32", "cpu", status, reason="why",
                            repro="python -m harness run --op binary_backward --backend x")
    assert row.report().splitlines()[-1] == "  reproduce: python -m harness run --op binary_backward --backend x"
    again = CaseResult.from_json(row.to_json())  # what --isolate and --gpus read back from a worker
    assert again.report().count("reproduce: ") == 1


@pytest.mark.parametrize("status", ["PASS", "SKIP"])
def test_passing_rows_print_none(status):
    row = runner.CaseResult("binary_backward", "x", "mul[f32]", "f32", "cpu", status, repro="python -m harness run")
    assert "reproduce:" not in row.report()


def test_no_prefix_for_a_backend_the_cli_finds_by_itself(monkeypatch):
    discover()
    monkeypatch.setenv(ENV_BACKENDS, "planted_fuzz")
    line = runner.repro_command(find_impl("binary_backward", "torch"), CASE, 0, "cpu")
    assert line.startswith("python -m harness run --op binary_backward --backend torch "), line
    monkeypatch.delenv(ENV_BACKENDS)
    assert runner.repro_command(_mid_bcast(), CASE, 0, "cpu").startswith("python -m harness run ")


def test_a_backend_from_the_environment_variable_is_named_and_the_line_reproduces(monkeypatch):
    """As registry.discover() leaves it: the backend's origin is a module of $GRADORACLE_BACKENDS.
    The printed line, run by a shell from the repo root, fails the same case again."""
    monkeypatch.setenv(ENV_BACKENDS, "some_other_module, planted_fuzz")
    monkeypatch.setattr(planted_fuzz.fuzzbugs, "origin", "planted_fuzz")
    result = runner.run_case(_mid_bcast(), TRIGGER, "cpu", run_seed=0)
    assert result.status == "FAIL", result.report()
    assert result.repro.startswith(f"{ENV_BACKENDS}=planted_fuzz PYTHONPATH={ROOT / 'tests'} "
                                   "python -m harness run --op binary_backward "
                                   "--backend fuzzbugs@mid_bcast_odd "), result.repro
    line = result.report().splitlines()[-1].split("reproduce: ", 1)[1]
    assert line == result.repro
    argv = shlex.split(line)
    assert argv[:3] == [f"{ENV_BACKENDS}=planted_fuzz", f"PYTHONPATH={ROOT / 'tests'}", "python"]
    command = " ".join(argv[:2] + [shlex.quote(sys.executable)] + [shlex.quote(a) for a in argv[3:]])
    # only the line itself may name the module and its folder
    env = {k: v for k, v in os.environ.items() if k not in (ENV_BACKENDS, "PYTHONPATH")}
    out = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert any(row.startswith("FAIL") and TRIGGER.id in row for row in out.stdout.splitlines()), out.stdout


def test_isolated_rows_of_a_hand_registered_backend_name_its_module():
    """A FAIL row computed in an --isolate worker gets the prefix too (the worker cannot tell that the
    parent registered the backend by hand), once."""
    with IsolatedRunner("cpu", 0, case_timeout=120) as isolated:
        row = isolated.run(_mid_bcast(), TRIGGER)
    assert row.status == "FAIL", row.report()
    assert row.repro.startswith(f"{ENV_BACKENDS}=planted_fuzz PYTHONPATH={ROOT / 'tests'} python -m harness run "), \
        row.repro
    assert row.repro.count(f"{ENV_BACKENDS}=") == 1 and f"reproduce: {row.repro}" in row.report()


# ----------------------------------------------------------------------------- timed calls skip the checks

counted = Backend("counted", framework="numpy", devices=("cpu",), register=False)
RAW_CALLS = []


@argcheck.register(counted, "binary_backward", dtypes=("f32",))
def counted_mul(inputs, outs, params):
    RAW_CALLS.append(1)
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    outs["grad_a"][...] = sum_to_shape(g * da, a.shape)
    outs["grad_b"][...] = sum_to_shape(g * db, b.shape)


def test_timed_callable_is_the_unchecked_function_where_there_is_one():
    impl = counted.impls[("binary_backward", "default")]
    assert timed_callable(impl) is impl.fn.unchecked and impl.fn is not impl.fn.unchecked
    plain = _mid_bcast()
    assert not hasattr(plain.fn, "unchecked") and timed_callable(plain) is plain.fn
    discover()
    torch_impl = find_impl("binary_backward", "torch")  # argcheck.register: every library backend has one
    assert timed_callable(torch_impl) is torch_impl.fn.unchecked


@pytest.mark.parametrize("rotate", [1, 3])
def test_only_the_first_timed_call_runs_the_argument_checks(rotate, monkeypatch):
    checks = []
    real = argcheck.check_impl
    monkeypatch.setattr(argcheck, "check_impl", lambda *a, **k: (checks.append(1), real(*a, **k))[1])
    impl = counted.impls[("binary_backward", "default")]
    cfg = dataclasses.replace(QUICK, rotate=rotate)
    RAW_CALLS.clear()
    r = runner.timed_check(impl, CASE, "cpu", runner.generate(CASE, 0), runner.prepare(CASE, 0, "numpy", variant=1),
                           cfg)
    assert r.status == "PASS", [o.line() for o in r.outputs]
    assert r.samples.rotate == rotate and len(RAW_CALLS) >= r.samples.n + 2  # warm-up, samples, the final call
    assert checks == [1]


def test_a_first_timed_call_that_fails_the_checks_is_an_error():
    """The checks still guard the timed path: a call they reject never reaches the raw function."""
    impl = counted.impls[("binary_backward", "default")]
    bad = Case("binary_backward", "f64", {"fn": "mul", "a": [6, 8], "b": [8]})  # counted takes f32 only
    RAW_CALLS.clear()
    r = runner.timed_check(impl, bad, "cpu", runner.generate(bad, 0), runner.prepare(bad, 0, "numpy", variant=1),
                           QUICK)
    assert r.status == "ERROR" and "counted binary_backward" in r.reason and "float64" in r.reason, r.reason
    assert RAW_CALLS == []


def test_every_timed_call_runs_inside_quiet():
    """The bench's prefetch is held back (`quiet`) while samples and the final call are taken: a
    thread preparing an oracle beside a multi-launch op stretches the gaps between its launches."""
    import contextlib

    state = {"inside": False, "outside_calls": 0, "entries": 0}

    @contextlib.contextmanager
    def quiet():
        state["inside"], state["entries"] = True, state["entries"] + 1
        try:
            yield
        finally:
            state["inside"] = False

    impl = counted.impls[("binary_backward", "default")]
    real = impl.fn.unchecked

    def watched(inputs, outs, params):
        state["outside_calls"] += not state["inside"]
        return real(inputs, outs, params)

    RAW_CALLS.clear()
    spied = dataclasses.replace(impl, fn=watched)
    r = runner.timed_check(spied, CASE, "cpu", runner.generate(CASE, 0), runner.prepare(CASE, 0, "numpy", variant=1),
                           QUICK, quiet=quiet)
    assert r.status == "PASS", [o.line() for o in r.outputs]
    assert state["outside_calls"] == 0 and state["entries"] == 2 and len(RAW_CALLS) >= r.samples.n + 2


def test_prefetch_quiet_holds_preparation_back():
    import time

    from harness.bench import Prefetch

    running = []
    pre = Prefetch([1, 2, 3], lambda x: (running.append(x), time.sleep(0.05), x)[2], depth=2)
    it = iter(pre)
    assert next(it)[1] == 1
    with pre.quiet():
        seen = len(running)
        time.sleep(0.2)  # nothing new starts while quiet
        assert len(running) == seen and pre._busy == 0
    assert [v for _, v in it] == [2, 3]
