"""gradoracle's pytest plugin: correctness tests generated from the op, backend and case registries.

    pytest tests/ [--op OP] [--backend NAME[@VARIANT]] [--cases smoke|full|perf|stress|all|FILE|JSON]
                  [--dtype f32] [--device cpu|cuda|auto] [--seed N] [--oracle auto|numpy|jax]

Each test is `test_correctness[<op>-<impl>-<case>]`; implementations that cannot run a case
(no GPU, unsupported dtype, ...) are skipped with their reason.

Benchmarks are `test_benchmark[<op>-<impl>-<case>]` (tests/test_benchmark.py), timed by the
harness's engine (harness/timing.py) and handed to pytest-benchmark:

    pytest tests/test_benchmark.py --bench [--cases perf] [--bench-mode cold|hot|graph] [--bench-budget S]
    pytest tests/test_benchmark.py --benchmark-only --benchmark-save=NAME   (or --benchmark-enable)

Asked for (--bench, --benchmark-only or --benchmark-enable) they cover `--cases` (default
perf) with the full budgets.  Not asked for (the default `python -m pytest`, CI) they are a
smoke benchmark: per op its smallest smoke case, a handful of samples, hot mode, so the
benchmark path is exercised in seconds.  --benchmark-skip skips them as usual.
"""
from __future__ import annotations

import random

import pytest

from harness.frameworks import default_device, interpret_triton_without_gpu
from harness.multi_gpu.xdist import pin_xdist_worker, xdist_pin_report

pin_xdist_worker()  # pytest -n N: worker gwK sees GPU K mod #GPUs only; before anything initialises CUDA
interpret_triton_without_gpu()  # before any backend imports triton


def pytest_addoption(parser):
    group = parser.getgroup("gradoracle")
    group.addoption("--op", action="append", help="only this op (repeatable)")
    group.addoption("--backend", action="append", help="only this backend or backend@variant (repeatable)")
    group.addoption("--cases", default=None,
                    help="smoke | full | perf | stress | all | FILE.json/yaml | JSON case "
                         "(default: smoke; perf for benchmarks asked for with --bench)")
    group.addoption("--dtype", action="append", help="only this dtype: f32, f16, bf16, f64 (repeatable)")
    group.addoption("--device", default="auto", help="cpu | cuda | auto")
    group.addoption("--seed", type=int, default=None, help="run seed (default: fresh each session, printed)")
    group.addoption("--oracle", default="auto", choices=("auto", "numpy", "jax"),
                      help="auto: numpy, or JAX on the GPU for cases over 1 GiB")
    group.addoption("--bench", action="store_true",
                    help="run test_benchmark over --cases (default perf) with the full timing budgets")
    group.addoption("--bench-mode", default=None, choices=("cold", "hot", "graph"),
                    help="timing mode of the benchmarks (default: cold when asked for, hot for the smoke benchmark)")
    group.addoption("--bench-budget", type=float, default=None, help="sampling seconds per benchmark (default 1.0)")
    _add_fuzz_options(group)


def pytest_configure(config):
    _check_case_file(config.getoption("--cases"))
    config.gradoracle_seed_given = config.getoption("--seed") is not None
    shared = getattr(config, "workerinput", {}).get("gradoracle_seed")  # an xdist worker: the controller's seed
    if config.getoption("--seed") is None:
        config.option.seed = shared if shared is not None else random.SystemRandom().randrange(1 << 31)
    config.pluginmanager.register(xdist_pin_report(), "gradoracle-xdist-pins")  # pytest -n N: "GPU per worker"


def _check_case_file(spec: str | None) -> None:
    """A --cases file or JSON case with a bad entry ends the session at once, exit 2, on its one-line message."""
    from cases.registry import TAGS, CaseFileError, select

    if spec and spec not in TAGS + ("all",):
        try:
            select(spec)
        except CaseFileError as exc:
            pytest.exit(f"error: {exc}", returncode=2)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: every worker runs with the seed the controller printed, so `--seed` repeats the session."""
    node.workerinput["gradoracle_seed"] = node.config.option.seed


def pytest_report_header(config):
    return f"gradoracle: device={_device(config)} cases={_cases(config)} seed={config.option.seed}"


def _device(config) -> str:
    device = config.getoption("--device")
    return default_device() if device == "auto" else device


def _cases(config, bench: bool = False) -> str:
    return config.getoption("--cases") or ("perf" if bench else "smoke")


def _selected(config, cases):
    """harness/selection.py's (case, [impls]) for --op, --dtype and --backend, in case order (each oracle runs once)."""
    from harness.registry import discover
    from harness.selection import select

    discover()
    return select(cases, config.getoption("--op"), config.getoption("--dtype"), config.getoption("--backend"))


def _param(case, impl, device: str, slow: bool):
    marks = [pytest.mark.gpu] if device.startswith("cuda") else []
    if slow and case.tags & {"perf", "stress"}:
        marks.append(pytest.mark.slow)
    return pytest.param(case.op, impl, case, id=f"{case.op}-{impl.id}-{case.id}", marks=marks)


def correctness_params(config):
    """(op, impl, case) triples from the registries, ordered by case so each oracle runs once."""
    device = _device(config)
    return [_param(case, impl, device, True) for case, impls in _selected(config, _cases(config)) for impl in impls]


def benchmarks_requested(config) -> bool:
    """Benchmarks were asked for: --bench, --benchmark-only or --benchmark-enable."""
    option = config.option
    return bool(getattr(option, "bench", False) or getattr(option, "benchmark_only", False)
                or getattr(option, "benchmark_enable", False))


def benchmark_params(config):
    """(op, impl, case) for test_benchmark: --cases (default perf) if asked for, else the smoke benchmark."""
    from harness.registry import get_op

    device = _device(config)
    requested = benchmarks_requested(config)
    pairs = _selected(config, _cases(config, bench=True) if requested else "smoke")
    if not requested:  # per op, its smallest smoke case moving at least 4 KiB (else its largest)
        by_op: dict = {}
        for c, impls in pairs:
            by_op.setdefault(c.op, []).append((get_op(c.op).cost(c).bytes, c, impls))
        pairs = []
        for sized in by_op.values():
            sized.sort(key=lambda sc: sc[0])
            pick = next((p for p in sized if p[0] >= 4096), sized[-1])
            pairs.append((pick[1], pick[2]))
    return [_param(case, impl, device, requested) for case, impls in pairs for impl in impls]


def pytest_generate_tests(metafunc):
    if {"op_name", "impl", "case"} <= set(metafunc.fixturenames) and metafunc.function.__name__ == "test_correctness":
        metafunc.parametrize(("op_name", "impl", "case"), correctness_params(metafunc.config))
    if {"op_name", "impl", "case"} <= set(metafunc.fixturenames) and metafunc.function.__name__ == "test_benchmark":
        metafunc.parametrize(("op_name", "impl", "case"), benchmark_params(metafunc.config))


def pytest_collection_modifyitems(config, items):
    """--op also narrows the tests parametrized by a registry case (oracle cross-checks, planted faults)."""
    wanted = config.getoption("--op")
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        op = getattr(case, "op", None)
        (drop if op is not None and op not in wanted else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def bench_session(request):
    """The benchmarks' shared state (harness.bench.BenchSession): timing rules, ceilings, baseline times."""
    from harness import timing
    from harness.bench import BenchOptions, BenchSession

    config = request.config
    requested = benchmarks_requested(config)
    mode = config.getoption("--bench-mode") or ("cold" if requested else "hot")
    if requested:
        cfg = timing.TimingConfig(mode=mode, budget_s=config.getoption("--bench-budget") or 1.0)
    else:  # the smoke benchmark: a few samples, seconds in all
        cfg = timing.TimingConfig(mode=mode, rel_ci=0.05, min_samples=5, max_samples=30,
                                  budget_s=config.getoption("--bench-budget") or 0.03, warmup_max=10,
                                  warmup_budget_s=0.05)
    seed = config.option.seed if config.gradoracle_seed_given else 0
    return BenchSession(BenchOptions(_device(config), cfg, seed, config.getoption("--oracle"), progress=False))


@pytest.fixture
def run_options(request):
    """Device, seed and oracle chosen on the command line."""
    config = request.config
    return {"device": _device(config), "run_seed": config.option.seed, "oracle": config.getoption("--oracle")}


# ----------------------------------------------------------------------------- fuzzing (tests/test_fuzz.py)
# The fuzz tests' budget: short and derandomized in the default run (CI); larger and random
# when asked for with `-m fuzz`, --fuzz-examples N or GRADORACLE_FUZZ_EXAMPLES=N.

def _add_fuzz_options(group):
    group.addoption("--fuzz-examples", type=int, default=None,
                    help="hypothesis examples per fuzz test (implies the random 'deep' profile; "
                         "default: a short derandomized budget, larger under -m fuzz)")


@pytest.fixture(scope="session")
def fuzz_budget(request):
    """{'profile': 'ci' or 'deep', 'examples': N or None (None: each test's default for the profile)}."""
    import os
    import re

    config = request.config
    examples = config.getoption("--fuzz-examples") or int(os.environ.get("GRADORACLE_FUZZ_EXAMPLES") or 0) or None
    asked = re.search(r"(?<!not )\bfuzz\b", config.option.markexpr or "") is not None  # -m fuzz, not -m 'not fuzz'
    return {"profile": "deep" if examples or asked else "ci", "examples": examples}

