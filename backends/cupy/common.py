"""What every op module of the `cupy` backend shares: availability, NVRTC compilation of the
device code in backends/cuda/ (once per process per kernel), device queries, stride checks, and
the buffer checks (byte_span, overlap: defined once for every backend in backends/_buffers.py,
re-exported here).

Importing it never imports cupy.
"""
from __future__ import annotations

from backends._buffers import byte_span, overlap  # noqa: F401 - re-exported for op modules
from backends.cupy import nvrtc as _nvrtc

CUDA_TYPE = {"f32": "float", "f64": "double", "f16": "__half", "bf16": "__nv_bfloat16"}

_FUNCTIONS: dict = {}
_SMS: dict[int, int] = {}


def check(device: str) -> str | None:
    """None if the backend can run on `device`, else why not."""
    if device != "cuda":
        return f"cupy: runs on cuda, not {device}"
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - any broken install reads as unavailable
        return f"cupy: not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, wrong driver, ...
        return f"cupy: no CUDA device ({type(exc).__name__}: {exc})"
    if count == 0:
        return "cupy: no CUDA device"
    if not _nvrtc.include_dirs():
        return "cupy: cuda_fp16.h not found (set CUDA_PATH, or pip install nvidia-cuda-runtime)"
    return None


def function(source: str, expr: str, options=()):
    """The kernel for name expression `expr` of backends/cuda/`source`, compiled once per process
    (and cached on disk by cupy)."""
    key = (source, expr, tuple(options))
    fn = _FUNCTIONS.get(key)
    if fn is None:
        import cupy

        module = cupy.RawModule(code=_nvrtc.read_source(source), options=_nvrtc.compile_options(options),
                                name_expressions=[expr])
        fn = _FUNCTIONS[key] = module.get_function(expr)
    return fn


def num_sms() -> int:
    """Multiprocessors of cupy's current device (queried once per device)."""
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _SMS:
        _SMS[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _SMS[dev.id]


def element_strides(x, name: str, op: str = "cupy") -> tuple[int, ...]:
    """Strides in elements (cupy gives bytes); ValueError if one is not a whole number of elements."""
    item = x.dtype.itemsize
    if any(s % item for s in x.strides):
        raise ValueError(f"{op}: {name} has strides {x.strides} bytes, expected multiples of its itemsize {item}")
    return tuple(s // item for s in x.strides)

