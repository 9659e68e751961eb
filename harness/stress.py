"""Huge cases (the `stress` set: over 2**31 elements): inputs built in row chunks, a sampled oracle.

Why the ordinary path cannot take them.  A stress case has 2**31 + a few elements in its
largest tensors (bf16: 4.3 GB each).  The ordinary path (harness/prepare.py) holds every input in float64
(17 GB each), the oracle's outputs and their error scales in float64 (17 GB per big output,
twice), and its numpy temporaries on top; `judge` copies each output back as float64 and
compares it with a dozen more 17 GB arrays.  A binary_backward stress case would need well
over 128 GB of host memory; the JAX oracle on the GPU ("auto" above 1 GiB) would need
4 x 17 GB of the 80 GB card, and JAX keeps what it once allocated.

What this module does instead, for the ops whose rows are independent (OpSpec.row_separable: every
tensor either has the row axis, axis 0 of the largest tensor, or is shared by all rows):

- **inputs**: the op's own generator is run on row chunks of the case (the same case with
  fewer rows, CHUNK_ELEMS elements or so each, its own seed (case seed, chunk)), in threads,
  and each chunk's rows are copied into one full buffer per row-split input, with the usual
  NaN guard bands (harness/tensors.py).  Shared inputs (b = (N,), weight, ...) come from
  chunk 0.  The inputs are in the case dtype only: no float64 copy of a big input is kept.
- **oracle**: the op's numpy oracle and error model run on each chunk in float64 (the
  chunk's split inputs with chunk 0's shared ones).  Row-split outputs are exact per
  chunk; shared outputs (sums over the rows: grad_b of a broadcast b, dweight, dbias, a
  sum over axis 0) are the float64 sum of the chunk values, with error scale
  sqrt(sum of the chunks' scale**2) and reduction length the sum of theirs (the tolerance
  model's s and n, harness/compare.py, add up so).  `tests/test_stress.py` checks this
  equals the whole-case oracle on small cases of every op.
- **verdict**: a row-split output of more than SAMPLE_ABOVE elements keeps its oracle value
  and error scale only at a sample of flat indices: prepared.SAMPLE_SIZE uniform ones, plus
  every element in a window around each 2**31 and 2**32 boundary and at the end, where an
  int32 offset goes wrong first.  `runner.judge` gathers the output at those indices on
  the device and compares them under the same tolerance model; its NaN count is checked
  on all elements against the oracle's (counted over every chunk), so an element left
  unwritten anywhere (outputs start NaN) fails.  Smaller outputs are judged whole.

Host memory for the largest case (binary_backward mul, A = B = 2049 x 2**20, bf16): the
three inputs (13 GB), their second set for the stale-output check (13 GB, cached here,
one case at a time), and per thread a chunk's float64 work (about 1 GB): under 50 GB.
`release()` hands cached device memory back before each implementation runs (torch's
caching allocator, cupy's pool): several frameworks share the card, and each keeps what
it freed.  JAX keeps its own unless XLA_PYTHON_CLIENT_ALLOCATOR=platform (scripts/gpu_stress.sh
sets it).
"""
from __future__ import annotations

import gc
import os
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod

import numpy as np

from harness import prepared as _prepared
from harness.registry import get_op
from harness.tensors import HostTensor, contiguous_strides

# A case whose largest tensor has more elements takes this path ($GRADORACLE_HUGE_NUMEL lowers it
# for a dry run of the stress batch on small cases).
HUGE_NUMEL = int(os.environ.get("GRADORACLE_HUGE_NUMEL", 1 << 30))
CHUNK_ELEMS = 1 << 21  # elements of the largest tensor per chunk (16 MB per float64 array: malloc reuses it)
BOUNDARY = 4096  # elements judged on each side of 2**31 and 2**32, and at the end of an output
THREADS_ENV = "GRADORACLE_STRESS_THREADS"
ORACLE_SUFFIX = "@rows"  # Prepared.oracle of a case built here: "numpy@rows" (or "jax@rows")


# ----------------------------------------------------------------------------- the row plan


@dataclass(frozen=True)
class RowPlan:
    """How a case splits into row chunks: `rows` along axis 0 of the largest tensor."""

    rows: int
    chunk_rows: int
    split: frozenset  # tensors (inputs and outputs) that have the row axis
    shared: frozenset  # tensors every row shares

    def bounds(self) -> list[tuple[int, int]]:
        return [(r, min(r + self.chunk_rows, self.rows)) for r in range(0, self.rows, self.chunk_rows)]


def _is_shape(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in v)


def sub_case(case, rows: int, k: int):
    """The case with `k` rows instead of `rows`: every shape param whose first dim is `rows`."""
    from cases.registry import Case

    params = {key: [k, *v[1:]] if _is_shape(v) and v[0] == rows else v for key, v in case.params.items()}
    return Case(case.op, case.dtype, params, case.tags, case.source)


_PLANS: dict = {}


def row_plan(case) -> RowPlan | None:
    """The case's row plan, or None when it is not a huge, row-separable, contiguous case."""
    if not get_op(case.op).row_separable:
        return None
    key = (case.op, case.id, case.dtype)
    if key not in _PLANS:
        _PLANS[key] = _make_plan(case)
    return _PLANS[key]


def _make_plan(case) -> RowPlan | None:
    if any(k.endswith("_layout") and v != "contig" for k, v in case.params.items()):
        return None  # chunks are stacked as contiguous rows
    spec = get_op(case.op)
    try:
        shapes = {k: tuple(v) for k, v in spec.shapes(case).items()}
        big = max(shapes, key=lambda k: prod(shapes[k]))
    except (ValueError, TypeError, KeyError):  # a malformed case: the ordinary path reports it
        return None
    if prod(shapes[big]) <= HUGE_NUMEL or not shapes[big]:
        return None
    rows = shapes[big][0]
    if rows < 3:
        return None
    split, shared = set(), set()
    for k in (1, 2):  # two sizes, so that a dim equal to k by chance cannot mislead
        sub = sub_case(case, rows, k)
        try:
            spec.validate(sub)
            sub_shapes = {n: tuple(v) for n, v in spec.shapes(sub).items()}
        except (ValueError, TypeError, KeyError):
            return None
        if set(sub_shapes) != set(shapes):
            return None
        for name, full in shapes.items():
            got = sub_shapes[name]
            if got == full:
                shared.add(name)
            elif full and full[0] == rows and got == (k, *full[1:]):
                split.add(name)
            else:
                return None
    if split & shared or big not in split:
        return None
    row_elems = prod(shapes[big]) // rows
    return RowPlan(rows, max(1, CHUNK_ELEMS // max(row_elems, 1)), frozenset(split), frozenset(shared))


def applies(case) -> bool:
    """Whether `case` takes this module's path (huge and row-separable): harness/prepare.py asks."""
    return row_plan(case) is not None


# ----------------------------------------------------------------------------- inputs


def _threads() -> int:
    try:
        return max(1, int(os.environ[THREADS_ENV]))
    except (KeyError, ValueError):
        return max(1, min(32, os.cpu_count() or 1))


def _check_chunk_tensor(name: str, t: HostTensor) -> None:
    if t.layout != "contig" or t.offset != t.guard or t.base.size != prod(t.shape) + 2 * t.guard:
        raise ValueError(f"stress: input {name!r} of a row chunk is not a contiguous buffer with guard bands")


def _full_buffer(t: HostTensor, shape) -> HostTensor:
    """An empty full-size buffer like chunk tensor `t` (same dtype and guard bands) for `shape`."""
    g, n = t.guard, prod(shape)
    base = np.empty(n + 2 * g, dtype=t.base.dtype)
    base[:g] = t.base[:g]
    base[g + n:] = t.base[t.base.size - g:]
    return HostTensor(base, tuple(shape), contiguous_strides(shape), g, "contig", g)


class _Build:
    """One pass over a case's row chunks: inputs into full buffers and, if asked, the chunked verdict."""

    def __init__(self, case, seed: int, oracle: str | None):
        self.case, self.seed, self.oracle = case, seed, oracle
        self.spec = get_op(case.op)
        self.plan = row_plan(case)
        self.shapes = {k: tuple(v) for k, v in self.spec.shapes(case).items()}
        self.inputs: dict = {}
        self.shared64: dict = {}
        self.sampled: dict = {}  # huge split output -> sorted flat indices
        self.row_elems = {k: prod(s[1:]) for k, s in self.shapes.items() if k in self.plan.split}

    def chunk_inputs(self, c: int, r0: int, r1: int) -> dict:
        """Chunk c (rows r0..r1) drawn by the op's generator with seed (case seed, c), its split
        inputs copied into their rows of the full buffers."""
        sub = sub_case(self.case, self.plan.rows, r1 - r0)
        got = self.spec.generate(sub, np.random.default_rng((self.seed, c)))
        if c == 0:  # fixes the shared inputs and allocates the full buffers of the split ones
            for name, t in got.items():
                if name in self.plan.split:
                    _check_chunk_tensor(name, t)
                    self.inputs[name] = _full_buffer(t, self.shapes[name])
                else:
                    self.inputs[name] = t
        for name, t in got.items():
            if name in self.plan.split:
                _check_chunk_tensor(name, t)
                dst, rs = self.inputs[name], self.row_elems[name]
                dst.base[dst.guard + r0 * rs: dst.guard + r1 * rs] = t.base[t.guard: t.guard + (r1 - r0) * rs]
        return got

    def verdict(self, c: int, r0: int, r1: int, got: dict):
        """The chunk's oracle and error scale, reduced to what the full verdict keeps."""
        sub = sub_case(self.case, self.plan.rows, r1 - r0)
        in64 = {k: self.shared64[k] if k in self.shared64 else t.float64() for k, t in got.items()}
        if self.oracle == "jax":
            ref = self.spec.jax_oracle(in64, sub.params, on="cpu")
        else:
            ref = self.spec.numpy_oracle(in64, sub.params)
        scale = self.spec.error_scale(in64, sub.params)
        del in64
        out = {}
        for name in self.spec.outputs_of(self.case):
            r, (s, n) = np.asarray(ref[name], np.float64), scale[name]
            s = np.asarray(s, np.float64)
            if name in self.sampled:
                rs = self.row_elems[name]
                idx = self.sampled[name]
                i0, i1 = np.searchsorted(idx, [r0 * rs, r1 * rs])
                local = idx[i0:i1] - r0 * rs
                out[name] = ("sampled", r.reshape(-1)[local].copy(), s.reshape(-1)[local].copy(),
                             int(np.isnan(r).sum()), n)
            elif name in self.plan.split:
                out[name] = ("rows", r, s, 0, n)
            else:
                out[name] = ("shared", r, np.square(s), 0, n)
        return out

    def run(self) -> tuple[dict, dict, dict, dict, dict]:
        """(inputs, ref, scale, samples, nan counts); the last four empty without an oracle."""
        bounds = self.plan.bounds()
        got0 = self.chunk_inputs(0, *bounds[0])
        if self.oracle is not None:
            self.shared64 = {k: t.float64() for k, t in self.inputs.items() if k in self.plan.shared}
            for name in self.spec.outputs_of(self.case):
                numel = prod(self.shapes[name])
                if name in self.plan.split and numel > _prepared.SAMPLE_ABOVE:
                    self.sampled[name] = sample_indices(numel, _prepared.SAMPLE_SIZE, self.seed)

        def task(item):
            c, (r0, r1) = item
            got = got0 if c == 0 else self.chunk_inputs(c, r0, r1)
            return None if self.oracle is None else self.verdict(c, r0, r1, got)

        parts: dict = {}
        with ThreadPoolExecutor(min(_threads(), len(bounds))) as pool:
            for res in pool.map(task, enumerate(bounds)):  # in chunk order: sums are reproducible
                if res is None:
                    continue
                for name, (kind, r, s, nans, n) in res.items():
                    acc = parts.setdefault(name, {"kind": kind, "r": [], "s": [], "nan": 0, "n": []})
                    acc["nan"] += nans
                    acc["n"].append(n)
                    if kind == "shared":  # running sums: nothing per chunk is kept
                        acc["r"] = [r] if not acc["r"] else [acc["r"][0] + r]
                        acc["s"] = [s] if not acc["s"] else [acc["s"][0] + s]
                    else:
                        acc["r"].append(r)
                        acc["s"].append(s)
        if self.oracle is None:
            return self.inputs, {}, {}, {}, {}
        ref, scale, samples, nans = {}, {}, {}, {}
        for name, acc in parts.items():
            shape = self.shapes[name]
            if acc["kind"] == "shared":
                ref[name], scale[name] = acc["r"][0], (np.sqrt(acc["s"][0]), int(sum(acc["n"])))
                continue
            if len(set(acc["n"])) != 1:
                raise ValueError(f"stress: output {name!r} has reduction lengths {sorted(set(acc['n']))} across "
                                 "row chunks: the op is not row-separable")
            if acc["kind"] == "rows":
                ref[name] = np.concatenate(acc["r"], axis=0).reshape(shape)
                scale[name] = (np.concatenate(acc["s"], axis=0).reshape(shape), acc["n"][0])
                continue
            placeholder = np.broadcast_to(np.float64(np.nan), shape)  # shape only: no memory
            ref[name], scale[name] = placeholder, (placeholder, acc["n"][0])
            samples[name] = (self.sampled[name], np.concatenate(acc["r"]), np.concatenate(acc["s"]))
            nans[name] = acc["nan"]
        return self.inputs, ref, scale, samples, nans


def sample_indices(numel: int, size: int, seed: int) -> np.ndarray:
    """What prepared.sample_index draws (`size` uniform flat indices, the first and the last), plus
    every element within BOUNDARY of the 2**31 and 2**32 flat offsets and the last BOUNDARY ones:
    sorted, unique, int64.  (Sorted by hand: np.unique takes seconds on a million indices.)"""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, numel, size), np.array([0, numel - 1]), np.arange(max(0, numel - BOUNDARY), numel)]
    for edge in (1 << 31, 1 << 32):
        if edge < numel + BOUNDARY:
            parts.append(np.arange(max(0, edge - BOUNDARY), min(numel, edge + BOUNDARY)))
    idx = np.sort(np.concatenate(parts).astype(np.int64))
    return idx[np.concatenate(([True], idx[1:] != idx[:-1]))]


# ----------------------------------------------------------------------------- entry points


_INPUTS: OrderedDict = OrderedDict()  # (op, case id, seed) -> inputs: the stale check's second set, one case
_LOCK = threading.Lock()


def generate(case, seed: int) -> dict:
    """The case's inputs (HostTensors) for an input seed, built in row chunks; the last one is cached."""
    key = (case.op, case.id, seed)
    with _LOCK:
        if key in _INPUTS:
            return _INPUTS[key]
        _INPUTS.clear()  # one huge input set at a time
    inputs = _Build(case, seed, None).run()[0]
    with _LOCK:
        _INPUTS[key] = inputs
    return inputs


def build_prepared(case, seed: int, oracle: str = "auto"):
    """prepared.Prepared for a huge case: inputs, the chunked oracle, the samples (module docstring)."""
    which = "jax" if oracle == "jax" else "numpy"
    inputs, ref, scale, samples, nans = _Build(case, seed, which).run()
    inputs64 = {k: t.float64() for k, t in inputs.items() if k in row_plan(case).shared}
    return _prepared.Prepared(inputs, inputs64, ref, scale, which + ORACLE_SUFFIX, seed, nan_counts=nans,
                           samples=samples)


def release(device: str) -> None:
    """Hand cached device memory back (torch's caching allocator, cupy's pools) before a huge case."""
    gc.collect()
    if not str(device).startswith("cuda"):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a lost context is reported by the call that follows
            pass
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
        except Exception:  # noqa: BLE001
            pass
