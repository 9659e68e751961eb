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
