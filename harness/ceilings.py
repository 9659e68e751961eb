"""Measured ceilings of a device, cached per device: the roofs that results are reported against.

What is measured (with the timing engine, hot mode, median of CUDA-event samples):

  copy      device-to-device copy `dst.copy_(src)` of 2 GiB buffers (less when the card has
            under 12 GiB free), counting bytes read + written: 2 x size / time.  The memory
            roof: a memory-bound kernel that moves B bytes cannot beat B / copy.
  bf16      torch.matmul of 8192 x 8192 x 8192 bf16 matrices of random normal values,
            2 x 8192^3 / time.
  fp32      the same in float32 with TF32 off (torch.set_float32_matmul_precision("highest")),
            named "fp32 (TF32 off)" in the record.

On the CPU (so the figures exist anywhere, quickly): copy is np.copyto of 64 MiB buffers
(read + write), the matmuls are 512^3 through torch (numpy for fp32 if torch is missing).

Which matmul roof a case is held to: 16-bit dtypes (bf16, f16) the bf16 one; f32 and f64 the
fp32 (TF32 off) one.  (On an H100 dense f16 equals bf16, and f64 tensor-core peak is about
the fp32 non-tensor peak, so these are the honest roofs for code in those dtypes.)

Binding ceiling (`figures`): a case is held to the roof that bounds it, decided per case by
the roofline: compute-bound (the matmul roof binds) when its flops / matmul roof exceed its bytes
/ copy roof, i.e. its arithmetic intensity flops/bytes is above the ridge point matmul / copy;
else memory-bound (the copy roof).  The headline figure is then % of the matmul roof with TFLOP/s,
or % of the copy roof with GB/s (`binding`, `pct_binding`).  Large attention, conv and matmul cases
land on the compute side; small ones, like every elementwise and norm case, on the memory side.

Impossible figures (`impossible`).  A measured time that implies more than the hardware can do is
a timing or cost-model error, never a result: above the datasheet peak FLOP/s of the case's
dtype class (16-bit: dense bf16/f16 tensor cores; f32: dense TF32 tensor cores, the highest an f32
kernel could use; f64: FP64 tensor cores), or, where every byte must come from DRAM (cold mode, or
a rotation whose sets exceed 2 x L2), above the datasheet memory bandwidth: device time below the
byte model / peak bandwidth.  Peaks come from DATASHEETS by device name; a device not listed there
is not checked (the measured ceilings are not hard limits: a kernel may beat torch's copy).

Cache: one JSON per device, $GRADORACLE_CACHE/ceilings-<device>.json, else
~/.cache/gradoracle/; `python -m harness ceilings --refresh` (or `bench --refresh-ceilings`)
measures again.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

SCHEMA = 1
GPU_COPY_BYTES = 2 << 30
GPU_MATMUL_N = 8192
CPU_COPY_BYTES = 64 << 20
CPU_MATMUL_N = 512
SIXTEEN_BIT = ("bf16", "f16")

# Datasheet peaks (dense, no sparsity): name substring as torch reports it -> (GB/s, {dtype class: TFLOP/s}).
# First match wins, so the longer names come first.
DATASHEETS = (
    ("H100 80GB HBM3", "H100 SXM5", 3350.0, {"16": 989.4, "f32": 494.7, "f64": 66.9}),
    ("H100 NVL", "H100 NVL", 3900.0, {"16": 835.5, "f32": 417.8, "f64": 60.0}),
    ("H100 PCIe", "H100 PCIe", 2000.0, {"16": 756.5, "f32": 378.0, "f64": 51.2}),
    ("H200", "H200 SXM", 4800.0, {"16": 989.4, "f32": 494.7, "f64": 66.9}),
    ("A100-SXM4-80GB", "A100 SXM4 80GB", 2039.0, {"16": 312.0, "f32": 156.0, "f64": 19.5}),
    ("A100-SXM4-40GB", "A100 SXM4 40GB", 1555.0, {"16": 312.0, "f32": 156.0, "f64": 19.5}),
    ("A100 80GB PCIe", "A100 PCIe 80GB", 1935.0, {"16": 312.0, "f32": 156.0, "f64": 19.5}),
    ("A100-PCIE-40GB", "A100 PCIe 40GB", 1555.0, {"16": 312.0, "f32": 156.0, "f64": 19.5}),
)


def cache_dir() -> Path:
    env = os.environ.get("GRADORACLE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gradoracle"


def device_info(device: str) -> dict:
    """Name, kind and the properties the reports print (L2, SMs, memory, capability)."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        info = {"kind": "cuda", "name": p.name, "index": index, "l2_bytes": int(p.L2_cache_size),
                "sms": int(p.multi_processor_count), "memory_bytes": int(p.total_memory),
                "capability": f"{p.major}.{p.minor}", "cuda": torch.version.cuda}
        try:
            import pynvml

            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:
            pass
        return info
    import platform

    from harness.timing import cache_bytes

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"kind": "cpu", "name": name, "cores": os.cpu_count(), "llc_bytes": cache_bytes("cpu")}


def cache_path(device: str, info: dict | None = None) -> Path:
    info = info or device_info(device)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{info['kind']}-{info['name']}").strip("-").lower()
    return cache_dir() / f"ceilings-{slug}.json"


def _time(call, device: str, budget_s: float, min_samples: int = 5) -> dict:
    from harness import timing

    cfg = timing.TimingConfig(mode="hot", rel_ci=0.01, min_samples=min_samples, max_samples=200,
                              budget_s=budget_s, warmup_budget_s=min(budget_s, 1.0), loop=False, memory=False)
    run = timing.time_fn(lambda i: call(), device, cfg, "torch")
    return run.samples.to_json()


def _brief(samples: dict) -> dict:
    return {k: samples[k] for k in ("median", "ci_lo", "ci_hi", "n", "dropped", "stop")}


def measure(device: str) -> dict:
    """Measure the ceilings of `device` now (a few seconds on a GPU, about one on the CPU)."""
    info = device_info(device)
    record = {"schema": SCHEMA, "device": info, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "versions": _versions()}
    if device.startswith("cuda"):
        record.update(_measure_cuda(device))
    else:
        record.update(_measure_cpu())
    return record


def _cuda_copy(device: str, size: int) -> dict:
    import torch

    src = torch.empty(size // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return _time(lambda: dst.copy_(src), device, 1.0, 10)


def _cuda_matmul(device: str, dtype, n: int) -> dict:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return _time(lambda: torch.matmul(a, b, out=c), device, 1.5, 5)


def _measure_cuda(device: str) -> dict:
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    size = GPU_COPY_BYTES if free >= 12 << 30 else max(free // 6, 64 << 20)
    copy = _cuda_copy(device, size)
    out = {"copy": {"gbs": 2 * size / (copy["median"] * 1e-3) / 1e9, "bytes_each": size, "counts": "read+write",
                    "method": f"torch dst.copy_(src), {size / 2**30:.2f} GiB each, 2 x size / median time",
                    "samples": _brief(copy)}, "matmul": {}}
    n = GPU_MATMUL_N
    previous = torch.get_float32_matmul_precision()
    try:
        for key, dtype, label in (("bf16", torch.bfloat16, "bf16"), ("fp32", torch.float32, "fp32 (TF32 off)")):
            if key == "fp32":
                torch.set_float32_matmul_precision("highest")
            s = _cuda_matmul(device, dtype, n)
            out["matmul"][key] = {"tflops": 2 * n**3 / (s["median"] * 1e-3) / 1e12, "n": n, "name": label,
                                  "method": f"torch.matmul {n}^3 {label}, random normal", "samples": _brief(s)}
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.cuda.empty_cache()
    return out


def _measure_cpu() -> dict:
    import numpy as np

    src = np.random.default_rng(0).random(CPU_COPY_BYTES // 8)
    dst = np.empty_like(src)
    copy = _time(lambda: np.copyto(dst, src), "cpu", 0.3)
    out = {"copy": {"gbs": 2 * CPU_COPY_BYTES / (copy["median"] * 1e-3) / 1e9, "bytes_each": CPU_COPY_BYTES,
                    "counts": "read+write", "method": f"np.copyto, {CPU_COPY_BYTES >> 20} MiB each",
                    "samples": _brief(copy)}, "matmul": {}}
    n = CPU_MATMUL_N
    try:
        import torch

        for key, dtype, label in (("bf16", torch.bfloat16, "bf16"), ("fp32", torch.float32, "fp32")):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            s = _time(lambda: torch.matmul(a, b), "cpu", 0.3, 3)
            out["matmul"][key] = {"tflops": 2 * n**3 / (s["median"] * 1e-3) / 1e12, "n": n, "name": label,
                                  "method": f"torch.matmul {n}^3 {label} on the CPU", "samples": _brief(s)}
    except ImportError:
        a, b = np.random.default_rng(1).random((n, n), np.float32), np.random.default_rng(2).random((n, n), np.float32)
        s = _time(lambda: a @ b, "cpu", 0.3, 3)
        out["matmul"]["fp32"] = {"tflops": 2 * n**3 / (s["median"] * 1e-3) / 1e12, "n": n, "name": "fp32",
                                 "method": f"numpy {n}^3 fp32 on the CPU", "samples": _brief(s)}
    return out


def get(device: str, refresh: bool = False, measure_fn=None) -> dict:
    """The device's ceilings from the cache, measured (and cached) if absent, stale-schema or refresh."""
    info = device_info(device)
    path = cache_path(device, info)
    if not refresh and path.exists():
        try:
            record = json.loads(path.read_text())
            if record.get("schema") == SCHEMA and record.get("device", {}).get("name") == info["name"]:
                record["cached"] = str(path)
                return record
        except (OSError, ValueError):
            pass
    record = (measure_fn or measure)(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    record["cached"] = str(path)
    return record


def matmul_ceiling(ceilings: dict, dtype: str) -> tuple[float | None, str]:
    """(TFLOP/s, name) of the matmul roof for a case dtype: bf16 for 16-bit dtypes, fp32 otherwise."""
    key = "bf16" if dtype in SIXTEEN_BIT else "fp32"
    entry = (ceilings or {}).get("matmul", {}).get(key)
    if not entry:
        return None, key
    return entry["tflops"], entry.get("name", key)


def datasheet(name: str | None) -> dict | None:
    """{"name", "gbs", "tflops": {dtype class: TFLOP/s}} of a device by its name, or None if not listed."""
    for key, label, gbs, tflops in DATASHEETS:
        if name and key.lower() in name.lower():
            return {"name": label, "gbs": gbs, "tflops": tflops}
    return None


def _dtype_class(dtype: str) -> str:
    return "16" if dtype in SIXTEEN_BIT else dtype


def impossible(nbytes: int, flops: int, time_ms: float, dtype: str, device_name: str | None,
               dram: bool) -> str | None:
    """Why a time is faster than the hardware allows (see the module docstring), or None.

    dram: every byte of the cost model had to come from DRAM (cold mode, or sets over 2 x L2)."""
    sheet = datasheet(device_name)
    if sheet is None or not time_ms or time_ms <= 0:
        return None
    seconds = time_ms * 1e-3
    peak = sheet["tflops"].get(_dtype_class(dtype))
    if peak and flops / seconds / 1e12 > peak:
        return (f"IMPOSSIBLE: {flops / seconds / 1e12:.4g} TFLOP/s is above the {sheet['name']} datasheet peak "
                f"{peak:.4g} TFLOP/s for {dtype}: a timing or flop-model error")
    floor_ms = nbytes / (sheet["gbs"] * 1e9) * 1e3
    if dram and time_ms < floor_ms:
        return (f"IMPOSSIBLE: {time_ms:.4g} ms is below the byte model's floor {floor_ms:.4g} ms "
                f"({nbytes} B at the {sheet['name']} datasheet peak {sheet['gbs']:.0f} GB/s; "
                f"{nbytes / seconds / 1e9:.0f} GB/s): a timing or byte-model error")
    return None


def figures(nbytes: int, flops: int, time_ms: float | None, ceilings: dict | None, dtype: str,
            dram: bool = True) -> dict:
    """GB/s and % of the copy roof, TFLOP/s and % of the matmul roof, arithmetic intensity, the
    binding roof and % of it, and % of the roofline (the roofline's lower bound on the time,
    max(bytes/copy, flops/matmul), over the measured time).  A time faster than the datasheet
    allows (`impossible`; dram: whether the bandwidth limit applies) gets `impossible`, its reason,
    and no rates: it is not a result."""
    out = {"bytes": nbytes, "flops": flops, "ai": flops / nbytes if nbytes else None}
    copy = (ceilings or {}).get("copy", {}).get("gbs")
    mm, mm_name = matmul_ceiling(ceilings, dtype)
    if copy and mm:
        out["binding"] = "matmul" if flops / (mm * 1e12) > nbytes / (copy * 1e9) else "copy"
    if not time_ms or time_ms <= 0:
        return out
    why = impossible(nbytes, flops, time_ms, dtype, ((ceilings or {}).get("device") or {}).get("name"), dram)
    if why:
        out["impossible"] = why
        return out
    seconds = time_ms * 1e-3
    out["gbs"] = nbytes / seconds / 1e9
    out["tflops"] = flops / seconds / 1e12
    out["matmul_roof"] = mm_name
    if copy:
        out["pct_copy"] = 100 * out["gbs"] / copy
    if mm:
        out["pct_matmul"] = 100 * out["tflops"] / mm
    if copy and mm:
        bound = max(nbytes / (copy * 1e9), flops / (mm * 1e12))
        out["pct_roofline"] = 100 * bound / seconds
        out["pct_binding"] = out["pct_matmul"] if out["binding"] == "matmul" else out["pct_copy"]
    return out


def _versions() -> dict:
    import importlib.metadata as md
    import sys

    out = {"python": sys.version.split()[0]}
    for pkg in ("numpy", "torch", "triton", "jax", "jaxlib", "cupy-cuda13x", "cupy-cuda12x", "nvidia-ml-py"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out
