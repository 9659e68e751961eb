"""What a case is judged against: its inputs and the oracle's verdict on them (`Prepared`), the
seeds of its input sets, which oracle runs where, and which outputs are judged on a sample.

Built by harness/prepare.py (the ordinary path) and harness/stress.py (huge cases, in row
chunks); read by the runner and the bench.
"""
from __future__ import annotations

import os
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

# Outputs with more elements than this are judged on a sample when the caller asks (runner.judge):
# SAMPLE_SIZE uniform elements plus the first and the last, the NaN count over all of them.
SAMPLE_ABOVE = 1 << 22
SAMPLE_SIZE = 1 << 20

# Above this many bytes of float64 inputs, "auto" hands the oracle to JAX (jit, x64) on the GPU:
# the numpy definition of a perf-size attention or conv would take hours on the host.
NUMPY_ORACLE_MAX_BYTES = 1 << 30
# ... and above this many flops of the op's cost model: the numpy oracle ran at about 17 GFLOP/s on
# the H100 machine's host (results/h100/s6/: 79.9 s to prepare attention bf16 B=1 S=8k GQA 32:8
# D=128 causal, 1.4e12 flops, whose float64 inputs are 0.9 GiB), about 6 s at this bound.
NUMPY_ORACLE_MAX_FLOPS = 1e11
# The same cases' float64 passes that make their inputs and error scales (oracle.passes) run on the
# GPU through cupy when this is "cuda" (opt-in until an H100 run has set them beside the host's:
# scripts/gpu/oracle_passes.sh); "cpu" or unset: numpy on the host.
PASSES_ENV = "GRADORACLE_ORACLE_PASSES"


@dataclass
class Prepared:
    """A case's inputs and its oracle verdict, shared by every backend that runs it."""

    inputs: dict  # name -> HostTensor (exact values in the case dtype)
    inputs64: dict  # name -> float64 ndarray of the same values
    ref: dict | None  # output name -> float64 oracle value (None while `pending`)
    scale: dict  # output name -> (error scale ndarray, reduction length)
    oracle: str  # which oracle judged: numpy, jax, or jax@cuda
    seed: int
    nan_counts: dict = field(default_factory=dict)  # output name -> NaNs in the oracle's value (lazy)
    # output name -> (flat indices, oracle values, error scales) there: a huge case's outputs whose
    # oracle exists only at a sample (harness/stress.py; `ref` then holds a shape-only placeholder)
    samples: dict = field(default_factory=dict)
    # (oracle, where) of a GPU oracle not run yet (prepare(defer_gpu=True)); prepare.finish runs it
    pending: tuple | None = None
    exact: frozenset = frozenset()  # outputs exact on these inputs (harness/exact.py): judged to output rounding

    def nan_count(self, name: str) -> int:
        if name not in self.nan_counts:
            self.nan_counts[name] = int(np.isnan(self.ref[name]).sum())
        return self.nan_counts[name]


def input_seed(case, run_seed: int = 0, variant: int = 0) -> int:
    """Variant 0 is the case's seed (what `run` checks); variants 1, 2, ... are other input sets of it."""
    seed = case.seed(run_seed)
    return seed if variant == 0 else zlib.crc32(f"{seed}/{variant}".encode())


def choose_oracle(oracle: str, inputs64: dict, device: str, flops: float = 0.0) -> tuple[str, str]:
    """(oracle, where it runs): 'auto' is numpy unless the case is large (its float64 inputs, or the
    flops of its cost model) and a GPU is in use."""
    if oracle != "auto":
        return oracle, "cpu"
    big = sum(v.nbytes for v in inputs64.values()) > NUMPY_ORACLE_MAX_BYTES or flops > NUMPY_ORACLE_MAX_FLOPS
    return ("jax", "cuda") if big and device.startswith("cuda") else ("numpy", "cpu")


def passes_module(oracle: str, device: str, flops: float):
    """The array module of a case's float64 passes (oracle.passes): cupy where $GRADORACLE_ORACLE_PASSES
    is "cuda", the run is on the default CUDA device, and 'auto' would send the case's oracle to the GPU
    by its flops; None (numpy on the host) otherwise.  A bad setting is a ValueError naming it."""
    mode = os.environ.get(PASSES_ENV, "")
    if mode not in ("", "cpu", "cuda"):
        raise ValueError(f"${PASSES_ENV} is {mode!r}, expected 'cuda' or 'cpu' (the default)")
    if mode != "cuda" or oracle != "auto" or device not in ("cuda", "cuda:0") or flops <= NUMPY_ORACLE_MAX_FLOPS:
        return None
    import cupy

    return cupy


@contextmanager
def oracle_passes(oracle: str, device: str, flops: float):
    """Run the float64 passes entered here on passes_module's choice; a GPU's pool is emptied after,
    so that the kernels timed next (and JAX) find the memory free."""
    from oracle import passes  # here: importing oracle imports every op, which imports harness

    xp = passes_module(oracle, device, flops)
    with passes.on(xp):
        try:
            yield
        finally:
            if xp is not None:
                xp.get_default_memory_pool().free_all_blocks()


def sample_index(numel: int, size: int, seed: int) -> np.ndarray:
    """Sorted flat indices: `size` uniform draws plus the first and the last element."""
    rng = np.random.default_rng(seed)
    return np.unique(np.concatenate([rng.integers(0, numel, size), [0, numel - 1]])).astype(np.int64)
