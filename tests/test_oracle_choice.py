"""Which oracle judges a case (harness/prepared.py `choose_oracle`): numpy on the host, unless the case
is large -- its float64 inputs over NUMPY_ORACLE_MAX_BYTES, or its cost model's flops over
NUMPY_ORACLE_MAX_FLOPS -- and a GPU is in use, then JAX (x64) on the GPU; an explicit choice wins."""
import numpy as np
import pytest

from cases.registry import Case
from harness import prepare
from harness.prepared import NUMPY_ORACLE_MAX_BYTES, NUMPY_ORACLE_MAX_FLOPS, choose_oracle
from harness.registry import get_op

SMALL = {"x": np.zeros(8)}


class _Big:
    nbytes = NUMPY_ORACLE_MAX_BYTES + 1


@pytest.mark.parametrize("inputs,flops,device,want", [
    (SMALL, 0.0, "cuda", ("numpy", "cpu")),
    (SMALL, NUMPY_ORACLE_MAX_FLOPS, "cuda", ("numpy", "cpu")),         # at the bound: still numpy
    (SMALL, 2 * NUMPY_ORACLE_MAX_FLOPS, "cuda", ("jax", "cuda")),      # flop-heavy, small inputs
    ({"x": _Big()}, 0.0, "cuda", ("jax", "cuda")),                     # large inputs
    (SMALL, 2 * NUMPY_ORACLE_MAX_FLOPS, "cpu", ("numpy", "cpu")),      # no GPU: the host, however long
    ({"x": _Big()}, 0.0, "cuda:1", ("jax", "cuda")),
])
def test_auto_routes_large_cases_to_jax_on_the_gpu(inputs, flops, device, want):
    assert choose_oracle("auto", inputs, device, flops) == want


def test_an_explicit_oracle_wins():
    assert choose_oracle("numpy", {"x": _Big()}, "cuda", 1e15) == ("numpy", "cpu")
    assert choose_oracle("jax", SMALL, "cuda", 0.0) == ("jax", "cpu")


def test_prepare_passes_the_cost_models_flops(monkeypatch):
    """The long attention perf case that took 79.9 s of numpy on the H100 host goes to JAX on a GPU:
    its inputs are under the byte bound, its flops over the flop bound (checked without running it)."""
    case = Case("attention_backward", "bf16", {"B": 1, "Sq": 8192, "Sk": 8192, "Hq": 32, "Hkv": 8, "D": 128,
                                                "causal": True}, frozenset({"perf"}), "test")
    assert get_op(case.op).cost(case).flops > NUMPY_ORACLE_MAX_FLOPS
    seen = []
    monkeypatch.setattr(prepare, "choose_oracle", lambda o, i, d, flops=0.0: seen.append(flops) or ("numpy", "cpu"))
    monkeypatch.setattr(prepare, "finish", lambda p, c: p)  # no oracle run: only the routing is under test
    small = Case("attention_backward", "bf16", {"B": 1, "Sq": 8, "Sk": 8, "Hq": 2, "Hkv": 1, "D": 8},
                 frozenset({"full"}), "test")
    prepare.prepare(small, 0, "auto", "cuda", cache=False)
    assert seen == [get_op("attention_backward").cost(small).flops]


# ----------------------------------------------------------------------------- where the passes run

def _shim():
    """numpy under another name: the passes take their GPU branch (per-head uploads, the larger chunks,
    no worker threads, copies back to the host) with host arrays, so it runs here."""
    import types

    mod = types.ModuleType("xp_shim")
    mod.__dict__.update({k: v for k, v in np.__dict__.items() if not k.startswith("__")})
    return mod


@pytest.mark.parametrize("params", [{"B": 2, "Sq": 37, "Sk": 53, "Hq": 4, "Hkv": 2, "D": 8, "causal": True},
                                    {"B": 1, "Sq": 64, "Sk": 16, "Hq": 2, "Hkv": 1, "D": 16, "window": (5, 3),
                                     "softcap": 20.0},
                                    {"B": 1, "Sq": 9, "Sk": 9, "Hq": 3, "Hkv": 3, "D": 4, "causal": True,
                                     "window": (0, 0)}])
def test_attention_passes_on_another_array_module_match_the_host(params):
    """The same float64 formulas through oracle.passes' other branch (what cupy runs on a GPU): the
    forward that makes o and lse, the oracle and the error scale equal the host's to float64 rounding
    (the chunks differ, so the sums' order may)."""
    from oracle import attention_backward as ab
    from oracle import passes

    case = Case("attention_backward", "f64", params, frozenset({"full"}), "test")
    spec = get_op(case.op)
    host_in = {k: v.float64() for k, v in spec.generate(case, np.random.default_rng(3)).items()}
    with passes.on(_shim()):
        assert passes.current() is not np
        shim_in = {k: v.float64() for k, v in spec.generate(case, np.random.default_rng(3)).items()}
        shim_ref = ab.attention_backward_numpy(host_in, params)
        shim_scale = spec.error_scale(host_in, params)
    assert passes.current() is np
    for name in host_in:
        np.testing.assert_allclose(shim_in[name], host_in[name], rtol=1e-13, atol=0)
    host_ref = ab.attention_backward_numpy(host_in, params)
    host_scale = spec.error_scale(host_in, params)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_allclose(shim_ref[name], host_ref[name], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(shim_scale[name][0], host_scale[name][0], rtol=1e-12, atol=1e-13)
        assert shim_scale[name][1] == host_scale[name][1]


def test_the_block_formulas_take_the_array_module():
    """Inside the block functions every array call goes through xp (a np.* function would pull a GPU
    array to the host, or fail): only numpy's constants and error state are named."""
    import inspect
    import re

    from oracle import attention_backward as ab

    for fn in (ab._scores, ab.attention_forward_block, ab.attention_backward_block):
        body = inspect.getsource(fn)
        names = set(re.findall(r"\bnp\.(\w+)", body))
        assert names <= {"inf", "errstate"}, (fn.__name__, names)


def test_passes_stay_in_their_thread():
    """A prepare thread's choice is its own (contextvars): the other threads' passes stay on the host."""
    import threading

    from oracle import passes

    seen = []
    with passes.on(_shim()):
        t = threading.Thread(target=lambda: seen.append(passes.current()))
        t.start()
        t.join()
    assert seen == [np]


@pytest.mark.parametrize("env,oracle,device,flops,on", [
    (None, "auto", "cuda", 2 * NUMPY_ORACLE_MAX_FLOPS, False),     # opt-in
    ("cpu", "auto", "cuda", 2 * NUMPY_ORACLE_MAX_FLOPS, False),
    ("cuda", "auto", "cpu", 2 * NUMPY_ORACLE_MAX_FLOPS, False),    # no GPU in use
    ("cuda", "auto", "cuda", NUMPY_ORACLE_MAX_FLOPS, False),       # at the bound: the host
    ("cuda", "numpy", "cuda", 2 * NUMPY_ORACLE_MAX_FLOPS, False),  # an explicit oracle keeps the host
    ("cuda", "auto", "cuda:1", 2 * NUMPY_ORACLE_MAX_FLOPS, False),  # the default device only
    ("cuda", "auto", "cuda", 2 * NUMPY_ORACLE_MAX_FLOPS, True),
])
def test_passes_module_is_opt_in_and_for_large_cases(monkeypatch, env, oracle, device, flops, on):
    from harness import prepared

    if env is None:
        monkeypatch.delenv(prepared.PASSES_ENV, raising=False)
    else:
        monkeypatch.setenv(prepared.PASSES_ENV, env)
    if on:
        cupy = pytest.importorskip("cupy")
        assert prepared.passes_module(oracle, device, flops) is cupy
    else:
        assert prepared.passes_module(oracle, device, flops) is None


def test_a_bad_passes_setting_names_the_variable(monkeypatch):
    from harness import prepared

    monkeypatch.setenv(prepared.PASSES_ENV, "gpu")
    with pytest.raises(ValueError, match=r"\$GRADORACLE_ORACLE_PASSES is 'gpu', expected 'cuda' or 'cpu'"):
        prepared.passes_module("auto", "cuda", 1e15)


def test_prepare_and_generate_enter_the_passes(monkeypatch):
    """prepare (inputs and error scale) and generate (the bench's timing set) run inside oracle_passes
    with the case's flops; the oracle itself is chosen as before."""
    from contextlib import contextmanager

    seen = []

    @contextmanager
    def spy(oracle, device, flops):
        seen.append((oracle, device, flops))
        yield

    monkeypatch.setattr(prepare, "oracle_passes", spy)
    monkeypatch.setattr(prepare, "finish", lambda p, c: p)
    small = Case("attention_backward", "bf16", {"B": 1, "Sq": 8, "Sk": 8, "Hq": 2, "Hkv": 1, "D": 8},
                 frozenset({"full"}), "test")
    flops = get_op("attention_backward").cost(small).flops
    prepare.prepare(small, 0, "auto", "cuda", cache=False)
    prepare.generate(small, 0, 1, "auto", "cuda")
    assert seen == [("auto", "cuda", flops)] * 2
