"""Which GPUs this host has, counted without initialising CUDA in this process: the entries of
CUDA_VISIBLE_DEVICES when it is set, else NVML's device count (nvidia-ml-py)."""
from __future__ import annotations

import os


def nvml_gpu_count() -> int:
    """GPUs on this host according to NVML (no CUDA context); 0 when NVML is unusable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU to pin
        return 0


def visible_gpus(environ=None, count=nvml_gpu_count) -> list[str]:
    """The GPU ids a worker may be pinned to: CUDA_VISIBLE_DEVICES's entries if set, else '0'..'n-1'."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [g.strip() for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    return [str(i) for i in range(count())]
