"""Moving test tensors between the host and each backend's array type.

A framework adapter knows four things: how to rebuild a HostTensor's exact strided view
on a device, how to allocate a NaN-poisoned output, how to read an array back as
float64 on the host, and how to wait for the device.  For timing it also keeps a
HostTensor's flat buffer on the device (`upload`, gaps included), views it (`view`),
clones and overwrites it in place (`clone`, `copy`: the timed inputs are refilled with
fresh values before the final, re-validated call), re-poisons outputs (`fill_nan`) and
reads a sample of an output back (`gather64`, `nan_count`) so huge outputs are checked
without copying them whole.  Backends name their framework;
the harness does the conversion, so no backend sees numpy unless it asks for it.

The correctness path (harness/guards.py) also asks for outputs inside canary guard bands
(`guarded`: a flat buffer [canary band | NaN output | canary band] and the contiguous output
view of its middle), reads a band's bits back (`bits_host`) and finds the first element at
which two arrays differ bit for bit (`first_difference`: input snapshots, repeated calls).
Bit patterns go through same-width integer views, so NaN == NaN and -0 != +0 there.
"""
from __future__ import annotations

from math import prod

import numpy as np

from harness import dtypes
from harness.tensors import HostTensor

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def _signed(bits: int, itemsize: int) -> int:
    """An unsigned bit pattern as the signed integer of the same width (torch has no wide unsigned fills)."""
    return int(np.array([bits], dtype=_UINT[itemsize]).view(_INT[itemsize])[0])


def _first_true(flags: np.ndarray) -> tuple[int, int] | None:
    count = int(np.count_nonzero(flags))
    return None if not count else (int(np.argmax(flags)), count)


class NumpyAdapter:
    name = "numpy"

    def to_device(self, t: HostTensor, device: str):
        return self.view(self.upload(t, device), t)

    def upload(self, t: HostTensor, device: str):
        return t.base.copy()

    def view(self, flat, t: HostTensor):
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[t.offset:], t.shape, tuple(s * item for s in t.strides))

    def clone(self, flat):
        return flat.copy()

    def copy(self, dst, src):
        np.copyto(dst, src)
        return dst

    def poisoned(self, shape, dtype: str, device: str):
        return np.full(shape, np.nan, dtype=dtypes.numpy_dtype(dtype))

    def fill_nan(self, x):
        x[...] = np.nan
        return x

    def guarded(self, shape, dtype: str, device: str, guard: int, canary: int):
        n = prod(shape)
        flat = np.full(n + 2 * guard, np.nan, dtype=dtypes.numpy_dtype(dtype))
        bits = flat.view(_UINT[flat.itemsize])
        bits[:guard] = canary
        bits[guard + n:] = canary
        return flat, flat[guard:guard + n].reshape(shape)

    def bits_host(self, flat, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(flat[start:stop]).view(_UINT[flat.itemsize]).copy()

    def first_difference(self, x, y) -> tuple[int, int] | None:
        x, y = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1)
        return _first_true(x.view(_UINT[x.itemsize]) != y.view(_UINT[y.itemsize]))

    def gather64(self, x, flat_index: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(-1)[flat_index].astype(np.float64)

    def nan_count(self, x) -> int:
        return int(np.isnan(np.asarray(x, dtype=np.float64)).sum())

    def to_host64(self, x) -> np.ndarray:
        return np.asarray(x).astype(np.float64)

    def dtype_name(self, x) -> str:
        return dtypes.from_any(np.asarray(x).dtype)

    def sync(self, device: str) -> None:
        pass


class TorchAdapter:
    name = "torch"

    def _dtype(self, name):
        import torch

        return getattr(torch, dtypes.long_name(name))

    def to_device(self, t: HostTensor, device: str):
        return self.view(self.upload(t, device), t)

    def upload(self, t: HostTensor, device: str):
        """The flat buffer (gaps included) on the device."""
        import torch

        base = t.base
        if base.dtype == dtypes.numpy_dtype("bf16"):  # torch.from_numpy has no bfloat16
            flat = torch.from_numpy(base.view(np.uint16).copy()).view(torch.bfloat16)
        else:
            flat = torch.from_numpy(base.copy())
        return flat.to(device)

    def view(self, flat, t: HostTensor):
        return flat.as_strided(t.shape, t.strides, t.offset)

    def clone(self, flat):
        return flat.clone()

    def copy(self, dst, src):
        dst.copy_(src)
        return dst

    def poisoned(self, shape, dtype: str, device: str):
        import torch

        return torch.full(tuple(shape), float("nan"), dtype=self._dtype(dtype), device=device)

    def fill_nan(self, x):
        return x.fill_(float("nan"))

    def _int(self, itemsize: int):
        import torch

        return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]

    def guarded(self, shape, dtype: str, device: str, guard: int, canary: int):
        import torch

        n = prod(shape)
        flat = torch.full((n + 2 * guard,), float("nan"), dtype=self._dtype(dtype), device=device)
        bits = flat.view(self._int(flat.element_size()))
        bits[:guard] = _signed(canary, flat.element_size())
        bits[guard + n:] = _signed(canary, flat.element_size())
        return flat, flat[guard:guard + n].view(tuple(shape))

    def bits_host(self, flat, start: int, stop: int) -> np.ndarray:
        item = flat.element_size()
        return flat[start:stop].view(self._int(item)).cpu().numpy().view(_UINT[item])

    def first_difference(self, x, y) -> tuple[int, int] | None:
        import torch

        xb = x.detach().contiguous().reshape(-1).view(self._int(x.element_size()))
        yb = y.detach().contiguous().reshape(-1).view(self._int(y.element_size()))
        differ = xb != yb
        count = int(differ.sum())
        return None if not count else (int(torch.argmax(differ.to(torch.uint8))), count)

    def gather64(self, x, flat_index: np.ndarray) -> np.ndarray:
        import torch

        index = torch.from_numpy(np.asarray(flat_index, np.int64)).to(x.device)
        return x.detach().reshape(-1)[index].to("cpu", dtype=self._dtype("f64")).numpy()

    def nan_count(self, x) -> int:
        import torch

        return int(torch.isnan(x.detach()).sum())

    def to_host64(self, x) -> np.ndarray:
        return x.detach().to("cpu", dtype=self._dtype("f64")).numpy()

    def dtype_name(self, x) -> str:
        return dtypes.from_any(x.dtype)

    def sync(self, device: str) -> None:
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()


class CupyAdapter:
    name = "cupy"

    def to_device(self, t: HostTensor, device: str):
        return self.view(self.upload(t, device), t)

    def upload(self, t: HostTensor, device: str):
        import cupy

        return cupy.asarray(t.base)

    def view(self, flat, t: HostTensor):
        import cupy

        item = flat.itemsize
        if not prod(t.shape):
            return cupy.empty(t.shape, dtype=flat.dtype)
        return cupy.lib.stride_tricks.as_strided(flat[t.offset:], t.shape, tuple(s * item for s in t.strides))

    def clone(self, flat):
        return flat.copy()

    def copy(self, dst, src):
        dst[...] = src
        return dst

    def poisoned(self, shape, dtype: str, device: str):
        import cupy

        return cupy.full(tuple(shape), np.nan, dtype=dtypes.numpy_dtype(dtype))

    def fill_nan(self, x):
        x.fill(np.nan)
        return x

    def guarded(self, shape, dtype: str, device: str, guard: int, canary: int):
        import cupy

        n = prod(shape)
        flat = cupy.full(n + 2 * guard, np.nan, dtype=dtypes.numpy_dtype(dtype))
        bits = flat.view(_UINT[flat.itemsize])
        bits[:guard] = canary
        bits[guard + n:] = canary
        return flat, flat[guard:guard + n].reshape(tuple(shape))

    def bits_host(self, flat, start: int, stop: int) -> np.ndarray:
        return flat[start:stop].view(_UINT[flat.itemsize]).get()

    def first_difference(self, x, y) -> tuple[int, int] | None:
        import cupy

        xb = cupy.ascontiguousarray(x).reshape(-1).view(_UINT[x.itemsize])
        yb = cupy.ascontiguousarray(y).reshape(-1).view(_UINT[y.itemsize])
        differ = xb != yb
        count = int(cupy.count_nonzero(differ))
        return None if not count else (int(cupy.argmax(differ.astype(cupy.uint8))), count)

    # Through same-width unsigned views: integer gathers and bit tests need no float16 or
    # bfloat16 kernels; the values become float64 on the host.
    _UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    _NAN_ABOVE = {2: {"float16": 0x7C00, "bfloat16": 0x7F80}, 4: 0x7F800000, 8: 0x7FF0000000000000}

    def gather64(self, x, flat_index: np.ndarray) -> np.ndarray:
        import cupy

        bits = x.reshape(-1).view(self._UINT[x.itemsize])[cupy.asarray(np.asarray(flat_index, np.int64))]
        return bits.get().view(np.dtype(x.dtype)).astype(np.float64)

    def nan_count(self, x) -> int:
        """NaN: exponent all ones and a non-zero mantissa, read off the bits."""
        import cupy

        above = self._NAN_ABOVE[x.itemsize]
        if isinstance(above, dict):
            above = above[np.dtype(x.dtype).name]
        width = 8 * x.itemsize
        magnitude = x.reshape(-1).view(self._UINT[x.itemsize]) & self._UINT[x.itemsize]((1 << (width - 1)) - 1)
        return int(cupy.count_nonzero(magnitude > self._UINT[x.itemsize](above)))

    def to_host64(self, x) -> np.ndarray:
        return np.asarray(x.get()).astype(np.float64)

    def dtype_name(self, x) -> str:
        return dtypes.from_any(x.dtype)

    def sync(self, device: str) -> None:
        import cupy

        cupy.cuda.get_current_stream().synchronize()


class JaxAdapter:
    name = "jax"

    def to_device(self, t: HostTensor, device: str):
        return self.upload(t, device)

    # JAX arrays are immutable and have no strided views: the "buffer" is the logical array, a
    # clone is the same array, and a refill (`copy`) hands back the source.
    def upload(self, t: HostTensor, device: str):
        from oracle.jax_setup import device as jax_device, jax

        return jax.device_put(np.array(t.view, order="C"), jax_device(device))

    def view(self, flat, t: HostTensor):
        return flat

    def clone(self, flat):
        return flat

    def copy(self, dst, src):
        return src

    def poisoned(self, shape, dtype: str, device: str):
        return None  # JAX is functional: its implementations return their outputs

    def fill_nan(self, x):
        return None

    def guarded(self, shape, dtype: str, device: str, guard: int, canary: int):
        """No buffer to guard: JAX implementations return new arrays, they cannot write out of bounds."""
        return None, None

    def bits_host(self, flat, start: int, stop: int) -> np.ndarray:
        a = np.asarray(flat)[start:stop]
        return np.ascontiguousarray(a).view(_UINT[a.itemsize]).copy()

    def first_difference(self, x, y) -> tuple[int, int] | None:
        return NumpyAdapter().first_difference(np.asarray(x), np.asarray(y))

    def gather64(self, x, flat_index: np.ndarray) -> np.ndarray:
        return np.asarray(x.reshape(-1)[np.asarray(flat_index, np.int64)]).astype(np.float64)

    def nan_count(self, x) -> int:
        import jax.numpy as jnp

        return int(jnp.isnan(x).sum())

    def to_host64(self, x) -> np.ndarray:
        return np.asarray(x).astype(np.float64)

    def dtype_name(self, x) -> str:
        return dtypes.from_any(x.dtype)

    def sync(self, device: str) -> None:
        pass  # to_host64 blocks; timing code calls block_until_ready on outputs


ADAPTERS = {a.name: a for a in (NumpyAdapter(), TorchAdapter(), CupyAdapter(), JaxAdapter())}


def adapter(framework: str):
    if framework not in ADAPTERS:
        raise KeyError(f"unknown framework {framework!r}: expected one of {', '.join(ADAPTERS)}")
    return ADAPTERS[framework]


def interpret_triton_without_gpu() -> None:
    """With no GPU, run Triton kernels in its interpreter: the CPU default.

    Triton reads TRITON_INTERPRET when it is imported, so this runs before any backend loads.
    """
    import os

    if default_device() == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def default_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu': the CPU backends are the embedded default."""
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
