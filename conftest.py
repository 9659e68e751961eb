"""gradoracle's pytest plugin: correctness tests generated from the op, backend and case registries.

    pytest tests/ [--op OP] [--backend NAME[@VARIANT]] [--cases smoke|full|perf|stress|all|FILE|JSON]
                  [--dtype f32] [--device cpu|cuda|auto] [--seed N] [--oracle numpy|jax]

Each test is `test_correctness[<op>-<impl>-<case>]`; implementations that cannot run a case
(no GPU, unsupported dtype, ...) are skipped with their reason.
"""
from __future__ import annotations

import random

import pytest

from harness.frameworks import default_device, interpret_triton_without_gpu

interpret_triton_without_gpu()  # before any backend imports triton


def pytest_addoption(parser):
    group = parser.getgroup("gradoracle")
    group.addoption("--op", action="append", help="only this op (repeatable)")
    group.addoption("--backend", action="append", help="only this backend or backend@variant (repeatable)")
    group.addoption("--cases", default="smoke", help="smoke | full | perf | stress | all | FILE.json/yaml | JSON case")
    group.addoption("--dtype", action="append", help="only this dtype: f32, f16, bf16, f64 (repeatable)")
    group.addoption("--device", default="auto", help="cpu | cuda | auto")
    group.addoption("--seed", type=int, default=None, help="run seed (default: fresh each session, printed)")
    group.addoption("--oracle", default="numpy", choices=("numpy", "jax"))


def pytest_configure(config):
    if config.getoption("--seed") is None:
        config.option.seed = random.SystemRandom().randrange(1 << 31)


def pytest_report_header(config):
    return f"gradoracle: device={_device(config)} cases={config.getoption('--cases')} seed={config.option.seed}"


def _device(config) -> str:
    device = config.getoption("--device")
    return default_device() if device == "auto" else device


def correctness_params(config):
    """(op, impl, case) triples from the registries, ordered by case so each oracle runs once."""
    from cases import select
    from harness.registry import discover, impls_for

    discover()
    wanted_ops, wanted_impls = config.getoption("--op"), config.getoption("--backend")
    dtypes = config.getoption("--dtype")
    device = _device(config)
    params = []
    for case in select(config.getoption("--cases")):
        if (wanted_ops and case.op not in wanted_ops) or (dtypes and case.dtype not in dtypes):
            continue
        for impl in impls_for(case.op):
            if wanted_impls and impl.id not in wanted_impls and impl.backend.name not in wanted_impls:
                continue
            marks = [pytest.mark.gpu] if device.startswith("cuda") else []
            if case.tags & {"perf", "stress"}:
                marks.append(pytest.mark.slow)
            params.append(pytest.param(case.op, impl, case, id=f"{case.op}-{impl.id}-{case.id}", marks=marks))
    return params


def pytest_generate_tests(metafunc):
    if {"op_name", "impl", "case"} <= set(metafunc.fixturenames) and metafunc.function.__name__ == "test_correctness":
        metafunc.parametrize(("op_name", "impl", "case"), correctness_params(metafunc.config))


@pytest.fixture
def run_options(request):
    """Device, seed and oracle chosen on the command line."""
    config = request.config
    return {"device": _device(config), "run_seed": config.option.seed, "oracle": config.getoption("--oracle")}
