"""Broadcasting helpers shared by the oracles: the one definition of 'sum over broadcast axes'."""
from __future__ import annotations

import numpy as np


def broadcast_shape(*shapes) -> tuple[int, ...]:
    """NumPy broadcasting of `shapes`; raises ValueError naming the clashing dim."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast") from None


def sum_to_shape(x: np.ndarray, shape) -> np.ndarray:
    """Sum `x` over the axes along which an array of `shape` was broadcast to `x.shape`.

    Leading axes that `shape` lacks are summed away; axes where `shape` has 1 and `x`
    does not are summed with keepdims.  An axis of size 0 in `x` sums to 0.
    """
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    if lead < 0:
        raise ValueError(f"sum_to_shape: target {shape} has more dims than {x.shape}")
    out = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    if axes:
        out = out.sum(axis=axes, keepdims=True)
    if out.shape != shape:
        raise ValueError(f"sum_to_shape: {x.shape} does not reduce to {shape}")
    return out
