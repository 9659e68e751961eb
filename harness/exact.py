"""The exact-arithmetic input set: inputs on which the right answer carries no rounding error.

Why.  Random inputs make sums cancel: a sum of n random-sign terms is about sqrt(n) times one
term, while the tolerance scales with the L2 norm of the terms (harness/compare.py).  A kernel
that drops one term of a long sum, or its last tile, then misses by less than the tolerance
and passes.  On the exact set there is no rounding noise to hide behind: every output an op
declares exact (`registry.ExactSet.outputs`) must come back as the exact value rounded once to
the output dtype, within half an ulp (`compare.exact_tolerance`), and one missing term is an
error of at least one grid step.

The grid.  Every input value is k * 2**e with k a nonzero whole number, |k| <= 255 for a value
summed on its own and <= 15 for a factor of a product (`SINGLE`, `FACTOR`), so:
  - a value and a product of two have at most 8 significant bits: exact in every dtype (bf16 has
    8), so an implementation may form a product in the input dtype, as the spec allows;
  - a sum of n such products, |t| <= T product units each, has every partial sum a whole number
    of units, exact in float32 while it stays below 2**24 units (2**53 in float64).  Whatever the
    order: n*T <= 2**24 (`sum_exact`).  Longer sums of independent random-sign terms, added in an
    order that does not depend on the values (any kernel's tiles, trees and atomics): by Hoeffding
    a partial sum over m terms reaches 12*sqrt(m)*T with probability below 2*exp(-72) ~ 1e-31, and
    `balance` (below) moves a partial sum by at most the original total, so 24*sqrt(n)*T <= 2**24
    is accepted too (`top_for` picks the largest grid that passes: the 33,554,432-term f32 reduce_sum
    gets |k| <= 15, 24 * 5793 * 15 < 2**21);
  - the final store rounds once: half an ulp.  Where the spec lets an implementation round a
    partial result to the output dtype (matmul's per-batch products before a batch-broadcast sum),
    the op claims exactness only when that partial result fits the output dtype (`fits`).

Balanced sums.  In 16-bit outputs a long sum is itself large (sqrt(n) grid steps), and half an
ulp of it can exceed a step.  `balance` flips the signs of some terms of each sum, in a random
order, until the sum is within 2T of zero: the output is then small, representable, and a
missing term shows in bf16 too (the skipped last row of bf16 layernorm 8192x4096's dweight).

Running it: the runner's last check of a passing case (harness/runner.py `_exact_check`): the
input buffers are refilled in place with this set (`prepare`), the outputs re-poisoned, one more
call is judged.
GRADORACLE_EXACT=0 turns it off (e.g. to time a run without its third oracle).
"""
from __future__ import annotations

import os
import zlib
from collections import OrderedDict
from math import prod, sqrt

import numpy as np

from harness import stress
from harness.prepared import Prepared, choose_oracle
from harness.registry import get_op

ENV = "GRADORACLE_EXACT"
ACC_BITS = {"f64": 53, "f32": 24, "f16": 24, "bf16": 24}  # significand bits of the accumulator
OUT_BITS = {"f64": 53, "f32": 24, "f16": 11, "bf16": 8}  # ... and of the output dtype
EXACT = ("exact-arithmetic input set (dyadic grid values on which every sum is exact in float32; refilled in "
         "place, outputs re-poisoned)")

# The latest exact-set verdict (OutputReports, [] when the set did not run): the runner records it,
# harness/mutate.py reads it (`last()`) to report how close a surviving mutant came.
_LAST: list = []


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


# ----------------------------------------------------------------------------- the grid


# The grid's largest whole number: a value summed on its own (8 bits), a factor of a product of two
# (15 * 15 = 225: 8 bits, exact in bf16), and a small one for sums whose partial results must fit a
# 16-bit output too.  Large values matter: a 16-bit accumulator rounds as soon as a partial sum
# passes 256 (bf16) or 2048 (f16) units, so with products of 225 units it errs within a few terms.
SINGLE, FACTOR, SMALL = 255, 15, 3


def unit(top: int) -> float:
    """The grid step for whole numbers up to `top`: the power of two that keeps the values below 1."""
    return 2.0 ** -int(np.ceil(np.log2(top + 1)))


def grid(rng: np.random.Generator, shape, top: int = SMALL) -> np.ndarray:
    """Random sign times k * unit(top), k uniform in 1..top: nonzero, exact in every dtype (top <= 256)."""
    k = rng.integers(1, top + 1, size=shape).astype(np.float64)
    return np.where(rng.random(size=shape) < 0.5, -k, k) * unit(top)


def top_for(n: int, dtype: str, product: bool = False, tops=(SINGLE, FACTOR, SMALL)) -> int:
    """The largest grid top (of `tops`; FACTOR, SMALL for a factor of a product) whose sums of n terms
    stay exact in float32 (`sum_exact`); the last one when none does."""
    tops = tuple(t for t in tops if not product or t <= FACTOR)
    return next((t for t in tops if sum_exact(n, t * t if product else t, dtype)), tops[-1])


def powers(rng: np.random.Generator, shape, exponents=(-1, 0, 1)) -> np.ndarray:
    """Random sign times 2**e, e drawn from `exponents`: divisors that keep a quotient exact."""
    e = rng.choice(np.asarray(exponents, np.float64), size=shape)
    return np.where(rng.random(size=shape) < 0.5, -1.0, 1.0) * np.exp2(e)


def sum_exact(n: int, units: float, dtype: str) -> bool:
    """Whether every partial sum of n terms of at most `units` grid units each is exact in the
    accumulator of `dtype` (float32, float64 for f64): in every order, or with overwhelming
    probability for random signs (module docstring)."""
    limit = 2.0 ** ACC_BITS[dtype]
    return n * units <= limit or 24 * sqrt(n) * units <= limit


def fits(units: float, dtype: str) -> bool:
    """Whether every whole number of grid units up to `units` is representable in `dtype`."""
    return units <= 2.0 ** OUT_BITS[dtype]


def balance(values: np.ndarray, factor, axes, rng: np.random.Generator, classes=None) -> np.ndarray:
    """`values` with some signs flipped so that each sum over `axes` of values * factor ends within
    2*max|term| of zero.  classes (an int array shaped like values): balance each class of terms on
    its own, so that sums weighted by a per-class constant (layernorm's dweight = sum dy * xhat with
    xhat taking a few values) are small as well as the plain sum (dbias = sum dy)."""
    v = np.array(values, dtype=np.float64)
    axes = tuple(sorted({a % v.ndim for a in axes})) if v.ndim else ()
    length = prod(v.shape[a] for a in axes) if axes else 1
    if length < 2 or not v.size:
        return v
    order_axes = [a for a in range(v.ndim) if a not in axes] + list(axes)
    terms = np.transpose(v * np.broadcast_to(factor, v.shape), order_axes).reshape(-1, length)
    labels = (np.zeros(terms.shape, np.int64) if classes is None else
              np.transpose(np.broadcast_to(classes, v.shape), order_axes).reshape(-1, length))
    order = rng.permutation(length)  # flip in a random order, not the first terms of every sum
    terms, labels = terms[:, order], labels[:, order]
    flip = np.zeros(terms.shape, bool)
    for c in np.unique(labels):
        mine = np.where(labels == c, terms, 0.0)
        total = mine.sum(axis=1, keepdims=True)
        same = (np.sign(mine) == np.sign(total)) & (mine != 0)
        reach = np.cumsum(np.where(same, 2 * np.abs(mine), 0.0), axis=1)
        flip |= same & (reach <= np.abs(total))  # stops within one term (2|t|) of zero
    unshuffled = np.empty_like(flip)
    unshuffled[:, order] = flip
    shape_t = [v.shape[a] for a in order_axes]
    mask = np.transpose(unshuffled.reshape(shape_t), np.argsort(order_axes))
    return np.where(mask, -v, v)


# ----------------------------------------------------------------------------- the set of a case


def seed(case, run_seed: int = 0) -> int:
    return zlib.crc32(f"{case.seed(run_seed)}/exact".encode())


def outputs(case) -> tuple[str, ...]:
    """The outputs of `case` exact on its op's exact set (none when the op has no set)."""
    spec = get_op(case.op)
    if spec.exact_set is None:
        return ()
    return tuple(o for o in spec.exact_set.outputs(case) if o in spec.outputs_of(case))


def applies(case) -> bool:
    return enabled() and not stress.applies(case) and bool(outputs(case))


_CACHE: OrderedDict = OrderedDict()
_CACHE_MAX = 2


def prepare(case, run_seed: int = 0, oracle: str = "auto", device: str = "cpu"):
    """The case's exact-set inputs and oracle (a prepared.Prepared with `exact` set), cached per case."""
    key = (id(case), case.id, run_seed, oracle, device)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    spec = get_op(case.op)
    s = seed(case, run_seed)
    inputs = spec.exact_set.generate(case, np.random.default_rng(s))
    inputs64 = {k: v.float64() for k, v in inputs.items()}
    oracle, where = choose_oracle(oracle, inputs64, device, spec.cost(case).flops)
    ref = spec.jax_oracle(inputs64, case.params, on=where) if oracle == "jax" else \
        spec.numpy_oracle(inputs64, case.params)
    prepared = Prepared(inputs, inputs64, ref, spec.error_scale(inputs64, case.params),
                        oracle if where == "cpu" else f"{oracle}@{where}", s,
                        exact=frozenset(outputs(case)))
    _CACHE[key] = prepared
    while len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return prepared


def remember(reports: list) -> None:
    """Record the latest exact-set verdict (the runner, after its exact check; [] when it did not run)."""
    _LAST[:] = reports


def last() -> list:
    """The latest exact-set verdict: the OutputReports of the last exact check, [] when it did not run."""
    return list(_LAST)
