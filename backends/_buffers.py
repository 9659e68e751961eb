"""Buffer checks every kernel backend shares: where an array's bytes lie, and whether two overlap.

One function for every array type a backend hands its kernels: torch tensors (strides in
elements, never negative) and cupy / numpy arrays (strides in bytes, possibly negative).
Imports no framework.
"""
from __future__ import annotations


def byte_span(x) -> tuple[int, int]:
    """[first, end) of the bytes that the elements of `x` occupy (x has at least one element)."""
    if hasattr(x, "data_ptr"):  # torch
        item = x.element_size()
        start = x.data_ptr()
        strides = [s * item for s in x.stride()]
    else:  # cupy (x.data is a MemoryPointer) or numpy
        item = x.itemsize
        start = x.data.ptr if hasattr(x.data, "ptr") else x.__array_interface__["data"][0]
        strides = x.strides
    low = sum((n - 1) * s for n, s in zip(x.shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(x.shape, strides) if s > 0)
    return start + low, start + high + item


def overlap(p: tuple[int, int], q: tuple[int, int]) -> bool:
    """Whether two [first, end) byte spans share a byte."""
    return p[0] < q[1] and q[0] < p[1]
