"""Host-side test tensors: exact values in the case dtype, with an explicit memory layout.

A `HostTensor` is a 1-D contiguous buffer plus a strided view of it (shape, strides in
elements, offset).  Backends rebuild the same view on their device
(`torch.as_strided`, cupy's `as_strided`), so a non-contiguous case stays non-contiguous
all the way into the kernel.  Gaps in the buffer that the view does not cover are NaN,
so a kernel that reads the wrong element gets NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from harness import dtypes

LAYOUTS = ("contig", "transposed", "sliced")


@dataclass
class HostTensor:
    base: np.ndarray  # 1-D, contiguous, in the case dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int
    layout: str = "contig"

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def view(self) -> np.ndarray:
        """The strided numpy view (read-only: it shares the buffer)."""
        item = self.base.itemsize
        return np.lib.stride_tricks.as_strided(self.base[self.offset:], self.shape,
                                               tuple(s * item for s in self.strides), writeable=False)

    def float64(self) -> np.ndarray:
        """The exact values, as a contiguous float64 array: what the oracle sees."""
        return np.array(self.view, dtype=np.float64, order="C") if prod(self.shape) else np.zeros(self.shape)

    def is_contiguous(self) -> bool:
        return self.layout == "contig"


def _contiguous_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def from_values(values: np.ndarray, dtype: str, layout: str = "contig") -> HostTensor:
    """Round float64 `values` to `dtype` and store them in the given layout.

    contig: row-major.  transposed: the buffer holds the array with its last two dims
    swapped, so the view's last dim has a large stride.  sliced: the buffer's last dim is
    doubled and the view takes every other element from offset 1 (gaps are NaN).
    """
    values = np.asarray(values, dtype=np.float64)
    shape = values.shape
    npdt = dtypes.numpy_dtype(dtype)
    if layout == "contig" or values.ndim == 0:
        base = np.ascontiguousarray(values.astype(npdt)).reshape(-1)
        return HostTensor(base, shape, _contiguous_strides(shape), 0, "contig")
    if layout == "transposed":
        if values.ndim < 2:
            raise ValueError(f"layout 'transposed' needs rank >= 2, got shape {shape}")
        stored = np.ascontiguousarray(np.swapaxes(values, -1, -2).astype(npdt))
        strides = list(_contiguous_strides(stored.shape))
        strides[-1], strides[-2] = strides[-2], strides[-1]
        return HostTensor(stored.reshape(-1), shape, tuple(strides), 0, layout)
    if layout == "sliced":
        wide = np.full(shape[:-1] + (2 * shape[-1] + 1,), np.nan).astype(npdt)
        wide[..., 1::2][..., : shape[-1]] = values.astype(npdt)
        strides = list(_contiguous_strides(wide.shape))
        strides[-1] = 2
        return HostTensor(wide.reshape(-1), shape, tuple(strides), 1, layout)
    raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def nonzero_uniform(rng: np.random.Generator, shape, low: float = 0.25, high: float = 2.0) -> np.ndarray:
    """Random sign times uniform magnitude in [low, high): never zero, well scaled."""
    mag = rng.uniform(low, high, size=shape)
    return np.where(rng.random(size=shape) < 0.5, -mag, mag)


def from_grid(rng: np.random.Generator, shape, grid: np.ndarray) -> np.ndarray:
    """Values drawn from a small set, so that two independent draws tie often."""
    return rng.choice(grid, size=shape)
