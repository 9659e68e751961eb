"""`harness profile`: reading ncu's CSV (a real H100 capture), and a clear exit where ncu is missing."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


def test_tunes_in_a_child_of_its_own_before_ncu(tmp_path, monkeypatch, capsys):
    """The case first runs in a child without ncu (tuners time their candidates undisturbed and
    record the choices in $GRADORACLE_TUNE_FILE), then under ncu with the same file; the readings
    are the ncu child's."""
    from harness.timing import TUNE_FILE_ENV

    calls = []

    def fake_run(cmd, **kw):
        calls.append((cmd, kw.get("env", {}).get(TUNE_FILE_ENV)))
        out = SAMPLE.read_text() if cmd[0] == "ncu-here" else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    monkeypatch.setattr(profile.os, "access", lambda path, mode: True)
    args = SimpleNamespace(op="binary_backward", backend="cupy@opt", case="{}", seed=3, json=None, ncu="ncu-here")
    assert profile.cmd_profile(args) == 0
    (warm, tune_file), (under, tune_file2) = calls
    assert warm[0] == sys.executable and "--child" in warm and under[0] == "ncu-here"
    assert under[under.index(sys.executable):] == warm  # the same child, now under ncu
    assert tune_file and tune_file == tune_file2
    assert "void bb_lk" in capsys.readouterr().out


def test_a_child_that_fails_before_ncu_is_a_clear_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(profile.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "boom: no such case"))
    monkeypatch.setattr(profile.os, "access", lambda path, mode: True)
    args = SimpleNamespace(op="binary_backward", backend="cupy@opt", case="{}", seed=0, json=None, ncu="ncu-here")
    assert profile.cmd_profile(args) == 2
    err = capsys.readouterr().err
    assert "failed before profiling" in err and "boom: no such case" in err
