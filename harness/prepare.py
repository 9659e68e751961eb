"""`prepare()`: the one way a case's inputs and oracle verdict are built, for run, bench, pytest
and the `--gpus` workers alike.

    prepare(case, run_seed, oracle, device, variant)   -> prepared.Prepared
    generate(case, run_seed, variant)                  -> the inputs alone (HostTensors), no oracle
    finish(prepared, case)                             -> runs a GPU oracle that prepare() deferred

Inputs are a pure function of the case, the run seed and the seed variant (0: what `run`
checks; 1, 2, ...: other input sets of the same case, for the stale-output check and the
bench's timed calls).  A huge case (over stress.HUGE_NUMEL elements, row-separable) is
built in row chunks with a sampled oracle (harness/stress.py); every other case takes the
ordinary path: inputs, their float64 values, the oracle ("auto": numpy, or JAX on the GPU for
cases over prepared.NUMPY_ORACLE_MAX_BYTES or NUMPY_ORACLE_MAX_FLOPS) and the error scale.

cache=True (the default) keeps the last CACHE_MAX results, so every implementation of one
case shares one oracle run; the bench prepares in threads with cache=False and
defer_gpu=True, which leaves an oracle that would run on the GPU to `finish()` in the main
thread, between measurements.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from harness import stress
from harness.prepared import Prepared, choose_oracle, input_seed, oracle_passes
from harness.registry import get_op

CACHE_MAX = 3  # large cases hold several GB of float64; keep only the most recent
_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()


def generate(case, run_seed: int = 0, variant: int = 0, oracle: str = "auto", device: str = "cpu") -> dict:
    """The case's inputs (HostTensors) for a seed variant, without an oracle (oracle and device: where
    the passes that make them may run, `oracle_passes`)."""
    seed = input_seed(case, run_seed, variant)
    if stress.applies(case):
        return stress.generate(case, seed)
    spec = get_op(case.op)
    with oracle_passes(oracle, device, spec.cost(case).flops):
        return spec.generate(case, np.random.default_rng(seed))


def prepare(case, run_seed: int = 0, oracle: str = "auto", device: str = "cpu", variant: int = 0, *,
            cache: bool = True, defer_gpu: bool = False) -> Prepared:
    """Inputs (seed variant `variant`) and the oracle's verdict on them; see the module docstring."""
    key = (id(case), case.id, run_seed, oracle, device, variant, defer_gpu)
    if cache:
        with _LOCK:
            if key in _CACHE:
                _CACHE.move_to_end(key)
                return _CACHE[key]
            if stress.applies(case):  # a huge case holds GBs of inputs: drop the other huge ones first
                for k in [k for k, p in _CACHE.items() if p.oracle.endswith(stress.ORACLE_SUFFIX)]:
                    del _CACHE[k]
    prepared = _build(case, run_seed, oracle, device, variant, defer_gpu)
    if cache:
        with _LOCK:
            _CACHE[key] = prepared
            while len(_CACHE) > CACHE_MAX:
                _CACHE.popitem(last=False)
    return prepared


def _build(case, run_seed: int, oracle: str, device: str, variant: int, defer_gpu: bool) -> Prepared:
    seed = input_seed(case, run_seed, variant)
    if stress.applies(case):  # over HUGE_NUMEL elements: row chunks and a sampled oracle (host only)
        return stress.build_prepared(case, seed, oracle)
    spec = get_op(case.op)
    flops = spec.cost(case).flops
    with oracle_passes(oracle, device, flops):  # the host's numpy, or the GPU for the large ones (opt-in)
        inputs = spec.generate(case, np.random.default_rng(seed))
        inputs64 = {k: v.float64() for k, v in inputs.items()}
        which, where = choose_oracle(oracle, inputs64, device, flops)
        scale = spec.error_scale(inputs64, case.params)
    label = which if where == "cpu" else f"{which}@{where}"
    prepared = Prepared(inputs, inputs64, None, scale, label, seed, pending=(which, where))
    if not (defer_gpu and where != "cpu"):
        finish(prepared, case)
    return prepared


def finish(prepared: Prepared, case) -> Prepared:
    """Run the oracle left pending (prepare(defer_gpu=True) on a case whose oracle runs on the GPU)."""
    if prepared.pending is not None:
        which, where = prepared.pending
        spec = get_op(case.op)
        prepared.ref = spec.jax_oracle(prepared.inputs64, case.params, on=where) if which == "jax" \
            else spec.numpy_oracle(prepared.inputs64, case.params)
        prepared.pending = None
    return prepared
