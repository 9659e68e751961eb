"""The dtypes gradoracle knows, by their short case-id names.

Host arrays use numpy dtypes; bfloat16 comes from ml_dtypes (numpy has none).
`unit_roundoff` is u = 2**-(mantissa bits + 1), the bound on the relative
error of one correctly rounded operation, which the tolerance model uses.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

NAMES = ("f32", "f16", "bf16", "f64")

_NUMPY = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}
_LONG = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}
_UNIT_ROUNDOFF = {"f64": 2.0**-53, "f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
# Smallest normal number: below it relative error models break down (subnormals).
_TINY = {k: float(ml_dtypes.finfo(v).tiny) for k, v in _NUMPY.items()}


def check(name: str) -> str:
    if name not in _NUMPY:
        raise ValueError(f"unknown dtype {name!r}: expected one of {', '.join(NAMES)}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    return _NUMPY[check(name)]


def long_name(name: str) -> str:
    """'bf16' -> 'bfloat16', the spelling torch, jax and cupy use."""
    return _LONG[check(name)]


def from_any(dtype) -> str:
    """Short name of a numpy/torch/jax/cupy dtype object or its string."""
    text = str(dtype).replace("torch.", "")
    for short, long in _LONG.items():
        if text in (short, long):
            return short
    raise TypeError(f"unsupported dtype {dtype}: expected one of {', '.join(_LONG.values())}")


_SHORT: dict = {}  # dtype object -> short name or None


def short_or_none(dtype) -> str | None:
    """from_any's short name, or None for a dtype the project has no name for; cached per dtype
    object (argument checks and launch paths call it on every call)."""
    if dtype not in _SHORT:
        try:
            _SHORT[dtype] = from_any(dtype)
        except TypeError:
            _SHORT[dtype] = None
    return _SHORT[dtype]


def unit_roundoff(name: str) -> float:
    return _UNIT_ROUNDOFF[check(name)]


def accumulate_dtype(name: str) -> str:
    """The precision reductions must at least use: float32, or float64 for float64."""
    return "f64" if check(name) == "f64" else "f32"


def tiny(name: str) -> float:
    return _TINY[check(name)]
