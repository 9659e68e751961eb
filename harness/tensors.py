"""Host-side test tensors: exact values in the case dtype, with an explicit memory layout.

A `HostTensor` is a 1-D contiguous buffer plus a strided view of it (shape, strides in
elements, offset).  Backends rebuild the same view on their device
(`torch.as_strided`, cupy's `as_strided`), so a non-contiguous case stays non-contiguous
all the way into the kernel.  Gaps in the buffer that the view does not cover are NaN,
so a kernel that reads the wrong element gets NaN.

Guard bands: every buffer `from_values` builds, in every layout, has `guard` extra NaN
elements before and after the part the view spans (GUARD_BYTES each, counted in elements of
the dtype; the view's offset moves past the first band).  A kernel that reads one element
(or a few hundred bytes) before or past its input reads NaN, and NaN reaches its output
wherever the read changes the result.  The bands are part of `base`, so every copy of it
(`upload`, `clone`, `copy`) carries them; `span_nbytes` is the part a correct kernel touches.
256 bytes also keeps the view's address as aligned as the allocation's (vector loads stay legal).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from harness import dtypes

LAYOUTS = ("contig", "transposed", "sliced")
# The lowest rank each layout can be built for: transposed swaps the last two dims, sliced strides the last.
LAYOUT_MIN_RANK = {"contig": 0, "sliced": 1, "transposed": 2}
GUARD_BYTES = 256  # NaN before and after every input view


def guard_elems(dtype) -> int:
    """Elements of `dtype` in one GUARD_BYTES band (at least one)."""
    return max(1, GUARD_BYTES // np.dtype(dtype).itemsize)


@dataclass
class HostTensor:
    base: np.ndarray  # 1-D, contiguous, in the case dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int
    layout: str = "contig"
    guard: int = 0  # NaN elements before and after the span of the view (already inside `base` and `offset`)

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

    @property
    def span_nbytes(self) -> int:
        """Bytes of `base` between the guard bands: what a correct call may read (gaps included)."""
        return self.base.nbytes - 2 * self.guard * self.base.itemsize

    def locate(self, flat: int) -> str:
        """Where element `flat` of `base` sits, in words: a view index, a gap, or a guard band."""
        span = self.base.size - 2 * self.guard
        if flat < self.guard:
            return f"guard band before the view, start-{self.guard - flat}"
        if flat >= self.guard + span:
            return f"guard band after the view, end+{flat - self.guard - span}"
        # Every layout nests its strides (each divides the next larger one's span), so the
        # index peels off greedily from the largest stride down; a remainder means a gap.
        rel, index = flat - self.offset, [0] * len(self.shape)
        for d in sorted(range(len(self.shape)), key=lambda d: -self.strides[d]):
            if self.strides[d] > 0 and rel >= 0:
                index[d], rel = divmod(rel, self.strides[d])
        if rel != 0 or any(not 0 <= i < n for i, n in zip(index, self.shape)):
            return f"buffer element {flat - self.guard}, a gap between the view's elements"
        return f"({','.join(map(str, index))})"


def layout_error(layout, rank: int) -> str | None:
    """Why `layout` cannot be built for a tensor of rank `rank` (unknown name, rank too low), or None."""
    if not isinstance(layout, str) or layout not in LAYOUT_MIN_RANK:
        return f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}"
    if rank < LAYOUT_MIN_RANK[layout]:
        return f"layout {layout!r} needs rank >= {LAYOUT_MIN_RANK[layout]}, got rank {rank}"
    return None


def _with_guards(inner: np.ndarray, shape, strides, offset: int, layout: str) -> HostTensor:
    """`inner` (the layout's buffer) with a NaN band before and after; the offset moves past the first."""
    g = guard_elems(inner.dtype)
    band = np.full(g, np.nan).astype(inner.dtype)
    return HostTensor(np.concatenate([band, inner.reshape(-1), band]), tuple(shape), tuple(strides), offset + g,
                      layout, g)


def contiguous_strides(shape) -> tuple[int, ...]:
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
    Every layout then gets its NaN guard bands (module docstring).  A layout the rank cannot
    take (LAYOUT_MIN_RANK: transposed below rank 2, sliced on a scalar) or an unknown name
    raises ValueError, never falls back to contig: a scalar is always contig.
    """
    values = np.asarray(values, dtype=np.float64)
    shape = values.shape
    npdt = dtypes.numpy_dtype(dtype)
    why = layout_error(layout, values.ndim)
    if why:
        raise ValueError(f"{why} (shape {shape})")
    if layout == "contig":
        base = np.ascontiguousarray(values.astype(npdt)).reshape(-1)
        return _with_guards(base, shape, contiguous_strides(shape), 0, "contig")
    if layout == "transposed":
        stored = np.ascontiguousarray(np.swapaxes(values, -1, -2).astype(npdt))
        strides = list(contiguous_strides(stored.shape))
        strides[-1], strides[-2] = strides[-2], strides[-1]
        return _with_guards(stored, shape, strides, 0, layout)
    if layout == "sliced":
        wide = np.full(shape[:-1] + (2 * shape[-1] + 1,), np.nan).astype(npdt)
        wide[..., 1::2][..., : shape[-1]] = values.astype(npdt)
        strides = list(contiguous_strides(wide.shape))
        strides[-1] = 2
        return _with_guards(wide, shape, strides, 1, layout)
    raise AssertionError(f"layout {layout!r} has no builder")  # layout_error knows every name above


def nonzero_uniform(rng: np.random.Generator, shape, low: float = 0.25, high: float = 2.0) -> np.ndarray:
    """Random sign times uniform magnitude in [low, high): never zero, well scaled."""
    mag = rng.uniform(low, high, size=shape)
    return np.where(rng.random(size=shape) < 0.5, -mag, mag)


def from_grid(rng: np.random.Generator, shape, grid: np.ndarray) -> np.ndarray:
    """Values drawn from a small set, so that two independent draws tie often."""
    return rng.choice(grid, size=shape)
