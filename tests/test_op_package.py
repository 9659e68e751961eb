"""An op from outside the repository (README "Adding an op"): the README's toy package, installed by
pip, found through the `gradoracle.ops` and `gradoracle.backends` entry points and run through
`harness run` (the stress path too), the generated correctness tests and the fuzz tests, with
nothing in harness/ naming it.  And an op that declares only what OpSpec requires: each piece it
leaves out has a default or a clear message, never a bare KeyError."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_readme_examples import readme_files

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The environment of a process that has the README's toy_op package installed (a private folder)."""
    src = tmp_path_factory.mktemp("src")
    files = {name: body for name, body in readme_files().items() if name.startswith("toy_op/")}
    assert {"toy_op/pyproject.toml", "toy_op/toy_op/oracle.py", "toy_op/toy_op/cases.py",
            "toy_op/toy_op/torch_ref.py"} <= set(files)
    for name, body in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(body)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src / "toy_op")], check=True, timeout=300)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def run(args, env, **extra_env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**env, **extra_env}, capture_output=True, text=True,
                          timeout=900)


def test_nothing_in_harness_names_the_toy():
    assert not [p for p in (ROOT / "harness").rglob("*.py") if "toy_backward" in p.read_text()]


def test_list_shows_the_op_its_backend_and_cases(toy):
    out = run(["-m", "harness", "list"], toy)
    assert out.returncode == 0, out.stderr
    assert "toy_backward: inputs x, dy -> outputs dx" in out.stdout
    assert "toy_torch [torch] toy_backward in torch" in out.stdout and "toy_backward: toy_torch" in out.stdout
    assert "toy_backward: smoke=9, full=9, perf=1, stress=0" in out.stdout


def test_describe_prints_the_toy_ops_contract(toy):
    out = run(["-m", "harness", "describe", "toy_backward"], toy)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("toy_backward") and "Example shapes: case " in out.stdout
    for name in ("x", "dy", "dx"):
        assert f"\n  {name}: shape (" in out.stdout
    assert "Conventions of every op" in out.stdout and "Tolerance model:" in out.stdout
    assert "Spec (the docstring of toy_op." in out.stdout


def test_harness_run_passes_and_takes_the_stress_path(toy, tmp_path):
    """With GRADORACLE_HUGE_NUMEL lowered, the 9x4 cases go through harness/stress.py in row chunks
    (row_separable=True in the toy's OpSpec): oracle numpy@rows."""
    out = run(["-m", "harness", "run", "--op", "toy_backward", "--device", "cpu", "--seed", "5",
               "--json", str(tmp_path / "toy.json")], toy, GRADORACLE_HUGE_NUMEL="16")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "18 passed, 0 failed" in out.stdout  # toy_torch, and the jax backend (a jitted jax_vjp of every op)
    rows = json.loads((tmp_path / "toy.json").read_text())["results"]
    assert {r["impl"] for r in rows} == {"toy_torch", "jax"} and all(r["status"] == "PASS" for r in rows)
    chunked = {(r["impl"], r["case"]) for r in rows if r["oracle"] == "numpy@rows"}
    assert chunked == {(i, f"toy[{d},9x4,scale=-2]") for d in ("f32", "f64", "f16", "bf16") for i in ("toy_torch", "jax")}


def test_a_wrong_toy_kernel_fails_with_its_repro_line(toy):
    """The oracle judges the toy: a kernel that drops the factor 2 fails, and the repro line names the op."""
    code = """
import sys
from harness import argcheck
from harness.registry import Backend

bad = Backend("toy_bad", framework="torch", devices=("cpu",))


@argcheck.register(bad, "toy_backward")
def no_factor_two(inputs, outs, params):
    outs["dx"].copy_(params["scale"] * inputs["x"] * inputs["dy"])


from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""
    out = run(["-c", code, "run", "--backend", "toy_bad", "--device", "cpu", "--dtype", "f64", "--seed", "1"], toy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"0 passed, [1-9]\d* failed", out.stdout), out.stdout
    assert "reproduce: python -m harness run --op toy_backward --backend toy_bad" in out.stdout


def test_bad_input_to_the_toy_gets_a_clear_error(toy):
    code = """
import torch
from harness.registry import discover, find_impl
discover()
impl = find_impl("toy_backward", "toy_torch")
x, dy, dx = torch.ones(3, 5), torch.ones(3, 4), torch.empty(3, 5)
for params, ins in (({"shape": [3, 5], "scale": 0.5}, {"x": x, "dy": dy}),
                    ({"shape": [3, 5], "scale": "big"}, {"x": x, "dy": x}),
                    ({"shape": [3, 5], "scale": 0.5}, {"x": x})):
    try:
        impl.fn(ins, {"dx": dx}, params)
    except (ValueError, TypeError) as exc:
        print(type(exc).__name__, exc)
"""
    out = run(["-c", code], toy)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("ValueError toy_torch toy_backward: argument 'dy' has shape (3, 4), expected (3, 5) "
                        "(the shape of x (3, 5))"), lines
    assert lines[1] == "ValueError toy_torch toy_backward: params['scale'] is 'big', expected a finite number", lines
    assert lines[2] == "TypeError toy_torch toy_backward: argument 'dy' is missing, expected a torch.Tensor", lines


def test_pytest_correctness_runs_the_toy(toy):
    out = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_correctness.py", "--op", "toy_backward",
               "--device", "cpu"], toy)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "18 passed" in out.stdout


def test_fuzz_tests_run_the_toy(toy):
    tests = ["tests/test_fuzz.py::" + t for t in ("test_fuzz", "test_strategy_builds_valid_small_cases",
                                                 "test_oracles_agree_on_fuzzed_cases",
                                                 "test_validate_accepts_only_runnable_cases",
                                                 "test_every_op_has_a_strategy")]
    out = run(["-m", "pytest", "-v", "-p", "no:cacheprovider", *tests, "-k", "toy_backward or every_op",
               "--op", "toy_backward", "--device", "cpu"], toy)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for test in ("test_fuzz[toy_backward-toy_torch]", "test_fuzz[toy_backward-jax]",
                 "test_strategy_builds_valid_small_cases[toy_backward]",
                 "test_oracles_agree_on_fuzzed_cases[toy_backward]",
                 "test_validate_accepts_only_runnable_cases[toy_backward]", "test_every_op_has_a_strategy"):
        assert f"{test} PASSED" in out.stdout, out.stdout[-3000:]


# ----------------------------------------------------------------------------- an op with only the required pieces


@pytest.fixture
def bare_op():
    """An op declaring only OpSpec's required fields (no argument rule, no strategy, no row split),
    registered for the test and removed after it."""
    from harness.registry import OPS, Cost, OpSpec, load_ops, register_op
    from harness.tensors import from_values

    load_ops()

    def shapes(case):
        s = tuple(case.params["shape"])
        return {"x": s, "dy": s, "dx": s}

    spec = register_op(OpSpec(
        name="bare_backward", doc="dx = dy * x", inputs=("x", "dy"), outputs=("dx",), params={"shape": "shape"},
        shapes=shapes, generate=lambda case, rng: {k: from_values(rng.uniform(1, 2, shapes(case)["x"]), case.dtype)
                                                   for k in ("x", "dy")},
        numpy_oracle=lambda i, p: {"dx": i["x"] * i["dy"]}, jax_vjp=lambda i, p: {"dx": i["x"] * i["dy"]},
        error_scale=lambda i, p: {"dx": (np.abs(i["x"] * i["dy"]), 1)}, cost=lambda case: Cost(0, 0),
        case_id=lambda case: f"bare[{case.dtype},{case.params['shape']}]"))
    yield spec
    del OPS["bare_backward"]


def test_an_op_without_an_argument_rule_is_checked_against_its_shapes(bare_op):
    torch = pytest.importorskip("torch")
    from harness import argcheck

    x = torch.ones(2, 3)
    argcheck.check("bare_backward", {"x": x, "dy": x}, {"dx": torch.empty(2, 3)}, {"shape": [2, 3]}, who="mine",
                   framework="torch")
    with pytest.raises(ValueError, match=re.escape("mine bare_backward: argument 'dy' has shape (2, 4), expected "
                                                   "(2, 3) (the op's shapes() for these params)")):
        argcheck.check("bare_backward", {"x": x, "dy": torch.ones(2, 4)}, {"dx": torch.empty(2, 3)},
                       {"shape": [2, 3]}, who="mine", framework="torch")
    with pytest.raises(ValueError, match="mine bare_backward: params {} do not give the tensors' shapes"):
        argcheck.check("bare_backward", {"x": x, "dy": x}, {"dx": x}, {}, who="mine", framework="torch")


def test_an_op_without_a_strategy_or_row_split_says_so(bare_op):
    pytest.importorskip("hypothesis")
    from cases.registry import Case
    from harness import fuzz, stress

    with pytest.raises(LookupError, match=r"no fuzz strategy for op 'bare_backward': its case module registers none"):
        fuzz.cases("bare_backward")
    assert "bare_backward" not in fuzz.strategies()
    assert stress.row_plan(Case("bare_backward", "f32", {"shape": [1 << 16, 1 << 15]})) is None
    with pytest.raises(KeyError, match=r"unknown op 'nosuch_backward': registered ops are .*bare_backward"):
        fuzz.cases("nosuch_backward")
