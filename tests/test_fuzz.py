"""Fuzzing with shrinking (harness/fuzz.py): hypothesis draws valid cases of every op and every
implementation that runs on this device must PASS them against the float64 oracle.

    pytest -q tests/test_fuzz.py                      short, derandomized budget (what CI runs)
    pytest -m fuzz                                    the larger, random budget
    pytest -m fuzz --fuzz-examples 1000 -k attention  (or GRADORACLE_FUZZ_EXAMPLES=1000)

A failure is shrunk to a small case and its message is the run's report and the one-line
`python -m harness run ... --case '<json>'` command that replays it.  Inputs use run seed 0
unless --seed is given, so CI is deterministic end to end.

The planted-bug tests prove the machinery: tests/planted_fuzz.py has implementations wrong
only under one non-obvious condition; hypothesis must find each, shrink it to the known
smallest trigger, and its printed repro line must fail again through the CLI.

The strategies are also checked themselves (valid, JSON round trip, small, reaching each edge
they are meant to cover), and drive two more properties: the numpy and JAX oracles agree on
drawn cases, and whatever an op's validate accepts can run.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from math import prod
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

from hypothesis import Phase, assume, given, note  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import planted_fuzz  # noqa: E402  (tests/ is on the path)
from cases.registry import Case, from_json  # noqa: E402
from harness import frameworks, fuzz  # noqa: E402
from harness import registry as reg  # noqa: E402
from harness.registry import get_op, impls_for  # noqa: E402
from harness.runner import run_case  # noqa: E402

pytestmark = pytest.mark.fuzz
ROOT = Path(__file__).resolve().parents[1]

# Examples per test as (ci, deep).  jax and torch.compile compile every new shape (0.1-1 s
# and more) and the Triton interpreter takes ~0.1 s a case; the rest run in milliseconds.
BUDGETS = {"jax": (3, 40), "torch_compile": (3, 30), "triton": (6, 60)}
DEFAULT_BUDGET = (30, 300)
TINY_ON_CPU = {"triton"}  # interpreted on a CPU: draw tiny cases
_GENERATE_ONLY = (Phase.generate,)  # edge searches need no shrinking


def _device(config) -> str:
    device = config.getoption("--device")
    return frameworks.default_device() if device == "auto" else device


def pytest_generate_tests(metafunc):
    """test_fuzz[<op>-<impl>]: every op with a strategy x every implementation that lists the device."""
    if metafunc.function.__name__ != "test_fuzz":
        return
    device = _device(metafunc.config)
    wanted_ops, wanted_impls = metafunc.config.getoption("--op"), metafunc.config.getoption("--backend")
    params = []
    for op in fuzz.strategies():
        if wanted_ops and op not in wanted_ops:
            continue
        for impl in impls_for(op):
            if device not in impl.devices or (wanted_impls and not {impl.id, impl.backend.name} & set(wanted_impls)):
                continue
            params.append(pytest.param(op, impl, id=f"{op}-{impl.id}"))
    metafunc.parametrize(("op_name", "impl"), params)


def _run_seed(config) -> int:
    return config.option.seed if getattr(config, "gradoracle_seed_given", False) else 0


def test_fuzz(op_name, impl, fuzz_budget, request):
    config = request.config
    device = _device(config)
    reason = impl.backend.unavailable_reason(device)
    if reason:
        pytest.skip(reason)
    ci, deep = BUDGETS.get(impl.backend.name, DEFAULT_BUDGET)
    profile = fuzz_budget["profile"]
    examples = fuzz_budget["examples"] or (ci if profile == "ci" else deep)
    tiny = impl.backend.name in TINY_ON_CPU and device == "cpu"
    run_seed = _run_seed(config)

    @fuzz.fuzz_settings(profile, examples)
    @given(case=fuzz.cases(op_name, tiny=tiny))
    def passes(case):
        note(f"case id: {case.id}")
        result = fuzz.check(impl, case, device, run_seed)
        assume(result.status != "SKIP")  # this implementation does not take this case: draw another

    passes()


# ----------------------------------------------------------------------------- the strategies themselves


@pytest.mark.parametrize("op", list(fuzz.strategies()))
def test_strategy_builds_valid_small_cases(op):
    """Every drawn case passes validate (inside the strategy), round-trips through JSON with the
    same id and params (so its repro line names the same inputs), and stays small."""
    limit = 12 * fuzz.MAX_ELEMENTS  # elements over all tensors: milliseconds of work

    @fuzz.fuzz_settings("ci", 60)
    @given(case=fuzz.cases(op))
    def valid(case):
        again = from_json(json.loads(json.dumps(case.to_json())), "round trip")
        assert (again.op, again.dtype, again.params, again.id) == (case.op, case.dtype, case.params, case.id)
        assert sum(prod(s) for s in get_op(op).shapes(case).values()) <= limit

    valid()


def _padded(shape, rank):
    return (1,) * (rank - len(shape)) + tuple(shape)


def _bcast(shape, out) -> bool:
    """`shape` is broadcast against `out` along some axis (a missing leading one or a 1)."""
    return any(n == 1 and m != 1 for n, m in zip(_padded(shape, len(out)), out))


def _empty_attention_row(p) -> bool:
    from oracle.attention_backward import allowed_mask

    mask = allowed_mask(p["Sq"], p["Sk"], p.get("causal", False), p.get("window", (-1, -1)))
    return not mask.any(axis=1).all()


def _out(case, name):
    return tuple(get_op(case.op).shapes(case)[name])


# op -> {edge: predicate on a Case}: each edge a strategy is meant to cover must be reachable.
EDGES = {
    "binary_backward": {
        "a broadcast": lambda c: _bcast(c.params["a"], _out(c, "grad_out")),
        "b broadcast": lambda c: _bcast(c.params["b"], _out(c, "grad_out")),
        "both broadcast": lambda c: all(_bcast(c.params[k], _out(c, "grad_out")) for k in "ab"),
        "rank mismatch": lambda c: len(c.params["a"]) != len(c.params["b"]),
        "a scalar": lambda c: c.params["a"] == [],
        "size 0": lambda c: 0 in _out(c, "grad_out"),
        "odd last dim, b broadcast in the middle": lambda c: planted_fuzz.middle_broadcast_axis(
            c.params["a"], c.params["b"]) is not None,
        "pow": lambda c: c.params["fn"] == "pow",
        "bf16": lambda c: c.dtype == "bf16",
        "a transposed": lambda c: c.params.get("a_layout") == "transposed",
        "b sliced": lambda c: c.params.get("b_layout") == "sliced",
        "grad_out transposed": lambda c: c.params.get("g_layout") == "transposed",
    },
    "reduce_sum": {
        "target form": lambda c: "target" in c.params and len(c.params["target"]) < len(c.params["shape"]),
        "target keeps a 1": lambda c: any(t == 1 < n for t, n in zip(c.params.get("target", [])[::-1],
                                                                     c.params["shape"][::-1])),
        "negative axis": lambda c: any(a < 0 for a in c.params.get("axes") or []),
        "no axis": lambda c: c.params.get("axes", None) == [] and "target" not in c.params,
        "every axis, keepdim": lambda c: "axes" in c.params and c.params["axes"] is None and c.params.get("keepdim"),
        "size 0": lambda c: 0 in c.params["shape"],
        "x transposed": lambda c: c.params.get("x_layout") == "transposed",
    },
    "layernorm_backward": {
        "M = 1, rank 2": lambda c: c.params["shape"][:-1] == [1],
        "N odd over 8": lambda c: c.params["shape"][-1] > 8 and c.params["shape"][-1] % 8 and c.params["shape"][-1] % 2,
        "N = 1": lambda c: c.params["shape"][-1] == 1,
        "no rows": lambda c: 0 in c.params["shape"],
        "weight, no bias": lambda c: c.params.get("bias") is False and "affine" not in c.params,
        "neither": lambda c: c.params.get("bias") is False and c.params.get("affine") is False,
        "eps": lambda c: "eps" in c.params,
        "x transposed": lambda c: c.params.get("x_layout") == "transposed",
    },
    "rmsnorm_backward": {
        "M = 1, rank 2": lambda c: c.params["shape"][:-1] == [1],
        "N odd over 8": lambda c: c.params["shape"][-1] > 8 and c.params["shape"][-1] % 2,
        "rank 3": lambda c: len(c.params["shape"]) == 3,
        "dy sliced": lambda c: c.params.get("dy_layout") == "sliced",
    },
    "attention_backward": {
        "Sq < Sk": lambda c: c.params["Sq"] < c.params["Sk"],
        "Sq > Sk, causal": lambda c: c.params["Sq"] > c.params["Sk"] and c.params.get("causal"),
        "GQA": lambda c: c.params["Hq"] > c.params["Hkv"] > 1,
        "MQA": lambda c: c.params["Hq"] > c.params["Hkv"] == 1,
        "window empties a row": lambda c: "window" in c.params and not c.params.get("causal")
        and _empty_attention_row(c.params),
        "causal + window": lambda c: c.params.get("causal") and "window" in c.params,
        "softcap": lambda c: "softcap" in c.params,
        "decoding": lambda c: c.params["Sq"] == 1 and c.params["Sk"] > 1,
        "head dim 64": lambda c: c.params["D"] == 64,
        "odd head dim": lambda c: c.params["D"] % 2 == 1 and c.params["D"] > 1,
    },
    "conv_backward_data": {
        "rank 3": lambda c: len(c.params["spatial"]) == 3,
        "stride > kernel": lambda c: any(s > k for s, k in zip(c.params["stride"], c.params["kernel"])),
        "depthwise": lambda c: c.params["groups"] == c.params["cin"] > 1,
        "grouped, not depthwise": lambda c: 1 < c.params["groups"] < c.params["cin"],
        "dilation": lambda c: max(c.params["dilation"]) > 1,
        "padding > kernel/2": lambda c: any(2 * p > k for p, k in zip(c.params["padding"], c.params["kernel"])),
        "per-dim strides differ": lambda c: len(set(c.params["stride"])) > 1,
        "channels last": lambda c: c.params["layout"] == "channels_last",
        "w transposed": lambda c: c.params.get("w_layout") == "transposed",
    },
    "conv_backward_weight": {
        "rank 1, stride > kernel": lambda c: len(c.params["spatial"]) == 1
        and c.params["stride"][0] > c.params["kernel"][0],
        "depthwise": lambda c: c.params["groups"] == c.params["cin"] > 1,
        "x sliced": lambda c: c.params.get("x_layout") == "sliced",
    },
    "matmul_backward": {
        "batch broadcast": lambda c: len(c.params["a"]) > 2 and len(c.params["b"]) > 2
        and c.params["a"][:-2] != c.params["b"][:-2],
        "shared weight": lambda c: len(c.params["a"]) > 2 and len(c.params["b"]) == 2,
        "M = 1, batched": lambda c: c.params["a"][-2] == 1 and len(c.params["a"]) > 2,
        "K = 0": lambda c: c.params["a"][-1] == 0,
        "b transposed": lambda c: c.params.get("b_layout") == "transposed",
    },
}


@pytest.mark.parametrize("op", list(fuzz.strategies()))
def test_strategy_reaches_the_edges(op):
    """hypothesis.find reaches each edge case named in EDGES (and shrinks it: cheap, no oracle runs)."""
    from hypothesis import find
    from hypothesis.errors import NoSuchExample

    missed = []
    for edge, predicate in EDGES[op].items():
        try:
            find(fuzz.cases(op), predicate, settings=fuzz.fuzz_settings("ci", 2000, phases=_GENERATE_ONLY))
        except NoSuchExample:
            missed.append(edge)
    assert not missed, f"{op}: the strategy never drew {missed}"


ORACLE_BUDGET = (3, 60)  # (ci, deep) examples per op: the JAX oracle compiles each new shape


@pytest.mark.parametrize("op", list(fuzz.strategies()))
def test_oracles_agree_on_fuzzed_cases(op, fuzz_budget):
    """The numpy and JAX float64 oracles agree to float64 rounding on drawn cases, as
    tests/test_oracles.py checks them on the smoke cases (on the exact forward results where
    the op takes saved ones: attention's o and lse)."""
    import numpy as np

    from harness.prepare import prepare

    spec = get_op(op)
    examples = fuzz_budget["examples"] or ORACLE_BUDGET[fuzz_budget["profile"] == "deep"]

    @fuzz.fuzz_settings(fuzz_budget["profile"], examples)
    @given(case=fuzz.cases(op))
    def agree(case):
        note(f"case: {json.dumps(case.to_json())}")
        prep = prepare(case)
        inputs = prep.inputs64 if spec.exact_inputs is None else spec.exact_inputs(prep.inputs64, case.params)
        ref = prep.ref if spec.exact_inputs is None else spec.numpy_oracle(inputs, case.params)
        got = spec.jax_oracle(prep.inputs64, case.params)
        for name in spec.outputs_of(case):
            assert got[name].shape == ref[name].shape, name
            bound = 1e-13 * (prep.scale[name][0] + np.abs(ref[name])) + 1e-300
            bad = ~(np.abs(got[name] - ref[name]) <= bound)
            assert not bad.any(), (f"{name}: numpy and JAX oracles differ at {np.argwhere(bad)[:3].tolist()} "
                                   f"(max |diff| {np.nanmax(np.abs(got[name] - ref[name]), initial=0):.3g})")

    agree()


# ----------------------------------------------------------------------------- case validation


def _layout_keys(op: str) -> list[str]:
    """The op's tensor-layout params, from its declaration ('a_layout / b_layout / g_layout')."""
    return [k.strip() for doc in get_op(op).params for k in doc.split("/") if k.strip().endswith("_layout")]


UNKNOWN_PARAM = "bogus_param"  # a typo'd param name


@st.composite
def _mutated_cases(draw, op: str):
    """A valid drawn case with one param spoiled: a layout key set to any layout or to a name
    that is none (on any tensor, whatever its rank), or an unknown param added."""
    case = draw(fuzz.cases(op))
    params = dict(case.params)
    keys = _layout_keys(op)
    if keys and draw(st.booleans()):
        params[draw(st.sampled_from(keys))] = draw(st.sampled_from(("transposed", "sliced", "strided")))
    else:
        params[UNKNOWN_PARAM] = 1
    return Case(op, case.dtype, params, frozenset(), fuzz.SOURCE)


VALIDATION_BUGS: dict = {}  # op -> a known validation bug, tracked by a strict xfail (remove once fixed)


@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.xfail(reason=VALIDATION_BUGS[op], strict=True))
                                if op in VALIDATION_BUGS else op for op in fuzz.strategies()])
def test_validate_accepts_only_runnable_cases(op):
    """What validate accepts must run: no unknown param may pass (it would be ignored), and the
    inputs and oracle of an accepted case must build without error."""
    from harness.prepare import prepare

    @fuzz.fuzz_settings("ci", 40)
    @given(case=_mutated_cases(op))
    def consistent(case):
        try:
            get_op(op).validate(case)
        except ValueError:
            return
        spec = json.dumps(case.to_json())
        assert UNKNOWN_PARAM not in case.params, f"validate accepted an unknown param: {spec}"
        try:
            prepare(case)
        except Exception as exc:  # noqa: BLE001 - any error here is validate's miss
            raise AssertionError(f"validate accepted {spec}, then preparing it raised "
                                 f"{type(exc).__name__}: {exc}") from exc

    consistent()


def test_every_op_has_a_strategy():
    assert set(fuzz.strategies()) == set(reg.load_ops())


# ----------------------------------------------------------------------------- planted bugs: found, shrunk, replayed

# variant of the fuzzbugs backend -> its op (the expected smallest triggers are in the tests below).
PLANTED = {
    "mid_bcast_odd": "binary_backward",
    "window_top_left": "attention_backward",
}


def _shrink(variant: str) -> str:
    """Fuzz the planted implementation with the CI profile; the failure message of the shrunk case."""
    impl = planted_fuzz.fuzzbugs.impls[(PLANTED[variant], variant)]

    @fuzz.fuzz_settings("ci", 300, report_multiple_bugs=False)
    @given(case=fuzz.cases(PLANTED[variant]))
    def passes(case):
        fuzz.check(impl, case, "cpu")

    with pytest.raises(AssertionError) as failure:
        passes()
    return str(failure.value)


@pytest.fixture(scope="module")
def shrunk():
    """variant -> (message, repro line, Case from the line's JSON): each planted bug fuzzed once."""
    found = {}
    for variant in PLANTED:
        message = _shrink(variant)
        line = fuzz.repro_line(message)
        argv = shlex.split(line)
        case = from_json(json.loads(argv[argv.index("--case") + 1]), "repro line")
        found[variant] = (message, line, case)
    return found


def test_binary_bug_shrinks_to_the_smallest_trigger(shrunk):
    message, line, case = shrunk["mid_bcast_odd"]
    p = case.params
    out = tuple(int(n) for n in get_op(case.op).shapes(case)["grad_out"])
    # Smallest trigger: the plainest fn and dtype, no layouts, and the smallest output that has
    # a middle axis b is broadcast along (size 2) and an odd last dim >= 3: 6 elements, (1, 2, 3).
    # Size-1 dims may stay: mutually_broadcastable_shapes cannot drop an inner dim of a
    # max-rank example in one shrink step, so (1, 2, 1, 3) is as far as some paths get (random
    # runs often end there); which operand supplies which dim also varies.
    assert (case.dtype, p["fn"], set(p)) == ("f32", "add", {"fn", "a", "b"}), message
    assert prod(out) == 6 and tuple(n for n in out if n != 1) == (2, 3) and out[0] == 1, message
    assert planted_fuzz.middle_broadcast_axis(p["a"], p["b"]) is not None, message
    assert "[grad_b] FAIL" in message and "[grad_a] PASS" in message, message
    assert line.startswith("python -m harness run --op binary_backward --backend fuzzbugs@mid_bcast_odd "), line


def test_attention_bug_shrinks_to_the_smallest_trigger(shrunk):
    message, line, case = shrunk["window_top_left"]
    # Smallest trigger: one of everything, one query against two keys, the window's right side 0
    # (left unbounded, the simple side); no causal, softcap, scale or score spread.
    assert case.dtype == "f32", message
    assert case.params == {"B": 1, "Sq": 1, "Sk": 2, "Hq": 1, "Hkv": 1, "D": 1, "window": [-1, 0]}, message
    assert line.startswith("python -m harness run --op attention_backward --backend fuzzbugs@window_top_left "), line


@pytest.mark.parametrize("variant", list(PLANTED))
def test_planted_bug_needs_its_condition(variant):
    """Away from its trigger each planted implementation passes: the search had to find the condition."""
    op = PLANTED[variant]
    impl = planted_fuzz.fuzzbugs.impls[(op, variant)]
    if op == "binary_backward":
        triggers = lambda c: planted_fuzz.middle_broadcast_axis(c.params["a"], c.params["b"]) is not None  # noqa: E731
    else:
        triggers = lambda c: planted_fuzz.window_misaligned(c.params)  # noqa: E731
    quiet = fuzz.cases(op).filter(lambda c: not triggers(c))

    @fuzz.fuzz_settings("ci", 40)
    @given(case=quiet)
    def passes(case):
        fuzz.check(impl, case, "cpu")

    passes()


def test_repro_lines_replay_in_process(shrunk):
    """The printed case, read back from its JSON, fails again through run_case."""
    for variant, (message, _, case) in shrunk.items():
        impl = planted_fuzz.fuzzbugs.impls[(PLANTED[variant], variant)]
        assert run_case(impl, case, "cpu", 0).status == "FAIL", message


def _cli_argv(line: str) -> tuple[list[str], dict]:
    """The printed command as a subprocess argv + environment that registers the planted backend.

    With GRADORACLE_BACKENDS (harness.registry.ENV_BACKENDS) the line runs verbatim; without
    it, a one-line wrapper registers the backend and hands the line's arguments to the CLI."""
    argv = shlex.split(line)
    prefix = {}  # a repro line may start with GRADORACLE_BACKENDS=<module> (runner.repro_command)
    while argv and "=" in argv[0] and argv[0] != "python":
        key, value = argv.pop(0).split("=", 1)
        prefix[key] = value
    assert argv[:3] == ["python", "-m", "harness"], line
    env = {**os.environ, **prefix, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT),
                                                                                os.environ.get("PYTHONPATH")]))}
    if hasattr(reg, "ENV_BACKENDS"):
        env[reg.ENV_BACKENDS] = "planted_fuzz"
        return [sys.executable] + argv[1:], env
    wrapper = ("import sys, planted_fuzz; planted_fuzz.install(); from harness.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-c", wrapper] + argv[3:], env


def test_repro_lines_replay_through_the_cli(shrunk):
    """Each printed `python -m harness run ... --case '<json>'` line, run as a command, fails again
    (exit status 1, a FAIL row for the same case).  Both run at once: each CLI start imports
    every backend (seconds)."""
    procs = {}
    for variant, (_, line, _) in shrunk.items():
        argv, env = _cli_argv(line)
        procs[variant] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True)
    for variant, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        case = shrunk[variant][2]
        assert proc.returncode == 1, out
        assert any(row.startswith("FAIL") and case.id in row for row in out.splitlines()), out
