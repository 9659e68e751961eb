"""`harness profile`: reading ncu's CSV (a real H100 capture), and a clear exit where ncu is missing."""
import subprocess
import sys
from pathlib import Path

from harness import profile

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "ncu-raw-h100.csv"  # `ncu --csv --page raw` of cupy@opt, bf16 mul, on an H100


def test_parses_a_real_capture_kernel_by_kernel():
    kernels = profile.parse_csv(SAMPLE.read_text())
    assert [k["name"].split("<")[0] for k in kernels] == ["void bb_lk", "void bb_finalize"]
    main = kernels[0]
    assert main["duration_ns"] > 1e5 and main["dram_read_bytes"] > 2.6e8  # 8x2048x4096 bf16 grad_out + a: 268 MB
    assert 0 < main["waves_per_sm"] < 10 and 0 < main["tail_wave_fill"] <= 1


def test_derived_figures():
    k = profile.derive({"duration_ns": 1000.0, "dram_read_bytes": 2000.0, "dram_write_bytes": 1000.0,
                        "ld_sectors": 40.0, "ld_requests": 10.0, "waves_per_sm": 2.25,
                        "stall_long_scoreboard_pct": 70.0, "stall_wait_pct": 5.0, "stall_barrier_pct": 9.0})
    assert k["dram_gbps"] == 3.0 and k["ld_sectors_per_request"] == 4.0 and k["st_sectors_per_request"] is None
    assert k["tail_wave_fill"] == 0.25
    assert [s["reason"] for s in k["top_stalls"]] == ["long_scoreboard", "barrier", "wait"]
    text = profile.format_kernel({"id": "0", "name": "k", **k})
    assert "3 GB/s" in text and "last wave 25% full" in text and "long_scoreboard 70.0%" in text


def test_no_ncu_is_a_clear_exit_2(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    case = '{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[4,5],"b":[5]}}'
    out = subprocess.run([sys.executable, "-m", "harness", "profile", "--op", "binary_backward", "--backend", "torch",
                          "--case", case, "--ncu", str(tmp_path / "no-ncu-here")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    assert "is not an executable file" in out.stderr
    plain = subprocess.run([sys.executable, "-m", "harness", "profile", "--op", "binary_backward", "--backend",
                            "torch", "--case", case], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**env, "PYTHONPATH": str(ROOT)})
    if profile.find_ncu() is None:  # this machine has none at the fixed places either
        assert plain.returncode == 2 and "ncu (Nsight Compute) was not found" in plain.stderr


def test_diagnoses_counter_permission_and_sandbox():
    assert "performance counters" in profile._diagnose("==ERROR== ERR_NVGPUCTRPERM - The user does not have")
    assert "cannot initialise" in profile._diagnose("Failed to initialize the profiler: LibraryNotLoaded")
