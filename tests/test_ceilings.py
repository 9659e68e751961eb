"""Device ceilings (harness/ceilings.py): measured once, cached per device, and the figures made from them."""
import json
import types

import pytest

from harness import ceilings

FAKE = {"schema": ceilings.SCHEMA, "copy": {"gbs": 3000.0},
        "matmul": {"bf16": {"tflops": 800.0, "name": "bf16"}, "fp32": {"tflops": 50.0, "name": "fp32 (TF32 off)"}}}


def test_cache_is_written_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADORACLE_CACHE", str(tmp_path))
    calls = []

    def fake_measure(device):
        calls.append(device)
        return {**FAKE, "device": ceilings.device_info(device)}

    first = ceilings.get("cpu", measure_fn=fake_measure)
    second = ceilings.get("cpu", measure_fn=fake_measure)
    assert calls == ["cpu"] and first["copy"]["gbs"] == second["copy"]["gbs"] == 3000.0
    path = ceilings.cache_path("cpu")
    assert path.parent == tmp_path and path.name.startswith("ceilings-cpu-") and second["cached"] == str(path)
    ceilings.get("cpu", refresh=True, measure_fn=fake_measure)
    assert calls == ["cpu", "cpu"]
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema": 0}))  # an old format is measured again
    ceilings.get("cpu", measure_fn=fake_measure)
    assert len(calls) == 3
    path.write_text("{not json")
    ceilings.get("cpu", measure_fn=fake_measure)
    assert len(calls) == 4 and json.loads(path.read_text())["schema"] == ceilings.SCHEMA


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("GRADORACLE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ceilings.cache_dir() == tmp_path / ".cache" / "gradoracle"


def test_cpu_measurement_is_quick_and_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(ceilings, "CPU_COPY_BYTES", 8 << 20)
    monkeypatch.setattr(ceilings, "CPU_MATMUL_N", 128)
    record = ceilings.measure("cpu")
    assert record["device"]["kind"] == "cpu" and record["copy"]["gbs"] > 0 and record["copy"]["counts"] == "read+write"
    assert record["matmul"]["fp32"]["tflops"] > 0 and record["matmul"]["bf16"]["tflops"] > 0
    assert "torch" in record["versions"]


def test_matmul_roof_by_dtype_and_figures():
    assert ceilings.matmul_ceiling(FAKE, "bf16") == (800.0, "bf16")
    assert ceilings.matmul_ceiling(FAKE, "f16") == (800.0, "bf16")
    assert ceilings.matmul_ceiling(FAKE, "f32") == (50.0, "fp32 (TF32 off)")
    assert ceilings.matmul_ceiling(FAKE, "f64") == (50.0, "fp32 (TF32 off)")
    assert ceilings.matmul_ceiling({}, "f32") == (None, "fp32")
    f = ceilings.figures(3_000_000_000, 1_000_000_000_000, 2.0, FAKE, "bf16")  # 3 GB and 1 TFLOP in 2 ms
    assert f["gbs"] == pytest.approx(1500.0) and f["pct_copy"] == pytest.approx(50.0)
    assert f["tflops"] == pytest.approx(500.0) and f["pct_matmul"] == pytest.approx(62.5)
    # roofline bound: max(3 GB / 3000 GB/s = 1 ms, 1 TFLOP / 800 TFLOP/s = 1.25 ms) = 1.25 ms of 2 ms
    assert f["pct_roofline"] == pytest.approx(62.5) and f["ai"] == pytest.approx(1000 / 3)
    assert "gbs" not in ceilings.figures(100, 10, None, FAKE, "f32")


def test_cuda_device_info_from_properties(monkeypatch):
    import torch

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", L2_cache_size=50 << 20, multi_processor_count=132,
                                  total_memory=80 << 30, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    info = ceilings.device_info("cuda")
    assert info["l2_bytes"] == 50 << 20 and info["sms"] == 132 and info["capability"] == "9.0"
    assert ceilings.cache_path("cuda", info).name == "ceilings-cuda-nvidia-h100-80gb-hbm3.json"


@pytest.mark.gpu
def test_gpu_ceilings_are_plausible(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.setattr(ceilings, "GPU_MATMUL_N", 4096)
    monkeypatch.setattr(ceilings, "GPU_COPY_BYTES", 1 << 30)
    before = torch.get_float32_matmul_precision()
    record = ceilings.measure("cuda")
    assert record["copy"]["gbs"] > 100 and record["matmul"]["bf16"]["tflops"] > record["matmul"]["fp32"]["tflops"]
    assert record["matmul"]["fp32"]["name"] == "fp32 (TF32 off)"
    assert torch.get_float32_matmul_precision() == before  # TF32 setting restored
