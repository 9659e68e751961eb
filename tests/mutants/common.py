"""What the planted mutants share: the two backends, reading inputs, folding sums, 16-bit accumulators.

Every mutant is the op's float64 reference (its outputs rounded once to the case dtype, the best
any kernel can do) with one bug a kernel author really makes.  `reference` registers the same
references unmutated: they must pass every case, exact set included (tests/test_mutation.py), so
a mutant that fails fails for its bug alone.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.registry import Backend

ALL = ("f32", "f16", "bf16", "f64")
HALF = ("f16", "bf16")  # mutants whose bug only exists in a 16-bit accumulator

mutant = Backend("mutant", framework="numpy", devices=("cpu",), register=False,
                 description="planted near-miss kernels, one bug each (python -m harness mutate)")
reference = Backend("mutant_reference", framework="numpy", devices=("cpu",), register=False,
                    description="the mutants' float64 references, unmutated: they must pass")


def plant(op: str, name: str, dtypes_: tuple[str, ...] = ALL):
    """Register `fn(inputs, outs, params)` as the mutant `mutant@name` of `op`; its docstring is the bug."""
    return mutant.impl(op, variant=name, dtypes=dtypes_)


def f64(x) -> np.ndarray:
    """An input view's values as float64 (what a correct kernel reads)."""
    return np.asarray(x).astype(np.float64)


def as_contiguous(x) -> np.ndarray:
    """The bug of a kernel that ignores strides: the memory from the view's first element, read as if
    the view were C-contiguous (a transposed view reads the wrong elements, a sliced one its NaN gaps)."""
    x = np.asarray(x)
    strides, acc = [], x.itemsize
    for n in reversed(x.shape):
        strides.append(acc)
        acc *= max(n, 1)
    return np.lib.stride_tricks.as_strided(x, x.shape, tuple(reversed(strides)), writeable=False).astype(np.float64)


def write(outs: dict, values: dict) -> None:
    for name, value in values.items():
        outs[name][...] = value


def skip_last(outs: dict, values: dict, name: str) -> None:
    """Write `values`, except the last element of output `name` (left NaN-poisoned): the NaN control."""
    write(outs, {k: v for k, v in values.items() if k != name})
    flat = outs[name].reshape(-1)
    flat[:-1] = np.asarray(values[name]).reshape(-1)[:-1]


# ----------------------------------------------------------------------------- sums over axes


def fold(t: np.ndarray, axes, out_shape, how=None) -> np.ndarray:
    """Sum `t` over `axes` and reshape to `out_shape` (the kept axes keep their order); how(t2) -> (F,)
    replaces the sum of the (F, L) matrix whose rows are the sums and whose columns are their terms."""
    axes = tuple(sorted({a % t.ndim for a in axes})) if t.ndim else ()
    kept = [a for a in range(t.ndim) if a not in axes]
    length = prod(t.shape[a] for a in axes)
    t2 = np.transpose(t, kept + list(axes)).reshape(prod(t.shape[a] for a in kept), length)
    out = t2.sum(axis=1) if how is None or length == 0 else how(t2)
    return np.asarray(out).reshape(out_shape)


def broadcast_axes(x_shape, out_shape) -> tuple[int, ...]:
    """The axes of out_shape along which an operand of x_shape was broadcast."""
    lead = len(out_shape) - len(x_shape)
    return tuple(range(lead)) + tuple(lead + i for i, n in enumerate(x_shape) if n == 1 and out_shape[lead + i] != 1)


def drop_last(t2: np.ndarray) -> np.ndarray:
    """Each sum without its last term."""
    return t2[:, :-1].sum(axis=1) if t2.shape[1] > 1 else t2.sum(axis=1)


def drop_tail(tile: int):
    """Each sum over whole tiles of `tile` terms only, when there is at least one: the tail loop missing."""
    def how(t2):
        length = t2.shape[1]
        return t2[:, :length - length % tile].sum(axis=1) if length > tile else t2.sum(axis=1)
    return how


def tree_drops_odd(t2: np.ndarray) -> np.ndarray:
    """A tree reduction `a[i] += a[i + s]` for s = n/2, n/4, ... that loses a[n - 1] whenever n is odd."""
    while t2.shape[1] > 1:
        s = t2.shape[1] // 2
        t2 = t2[:, :s] + t2[:, s:2 * s]
    return t2[:, 0] if t2.shape[1] else t2.sum(axis=1)


def low_accumulator(dtype: str, lanes: int = 32):
    """Each sum the way a kernel with a `dtype` accumulator forms it: `lanes` lanes each add their
    terms in turn (term i goes to lane i % lanes), then a tree over the lanes; every add rounds to
    `dtype` (the terms themselves are rounded to it first, as the kernel would load them)."""
    low = dtypes.numpy_dtype(dtype)

    @np.errstate(over="ignore", invalid="ignore")  # a 16-bit accumulator may overflow: that is its bug
    def how(t2):
        f, length = t2.shape
        steps = -(-length // lanes)
        padded = np.zeros((f, steps * lanes))
        padded[:, :length] = t2
        terms = padded.astype(low).reshape(f, steps, lanes)
        acc = np.zeros((f, lanes), low)
        for i in range(steps):
            acc = (acc.astype(np.float32) + terms[:, i].astype(np.float32)).astype(low)
        while acc.shape[1] > 1:
            half = acc.shape[1] // 2
            acc = (acc[:, :half].astype(np.float32) + acc[:, half:].astype(np.float32)).astype(low)
        return acc[:, 0].astype(np.float64)
    return how
