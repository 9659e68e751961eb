"""`harness run --isolate` and the stop on a lost CUDA context (harness/isolate.py, harness/cuda_errors.py).

The planted backends (tests/planted_crash.py) segfault, abort, exit, hang, raise, or raise
a sticky CUDA error; subprocesses find them through GRADORACLE_BACKENDS.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planted_crash
from harness.cuda_errors import sticky_cuda_error
from harness.isolate import InProcessRunner, IsolatedRunner, stderr_excerpt
from harness.results import CaseResult

ROOT = Path(__file__).resolve().parents[1]
CASE = '{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}}'
TWO_CASES = ('[{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}},'
             '{"op":"binary_backward","dtype":"f32","params":{"fn":"add","a":[4],"b":[1]}}]')


def harness(*args, timeout=600):
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_crash",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _case():
    from cases.registry import from_json

    return from_json(json.loads(CASE), "test")


# ----------------------------------------------------------------------------- sticky errors


@pytest.mark.parametrize("message, name", [
    ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
     "reported at some other API call, so the stacktrace below might be incorrect.", "cudaErrorIllegalAddress"),
    ("cudaErrorIllegalAddress: an illegal memory access was encountered", "cudaErrorIllegalAddress"),
    ("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered", "cudaErrorIllegalAddress"),
    ("Triton Error [CUDA]: an illegal memory access was encountered", "cudaErrorIllegalAddress"),
    ("INTERNAL: CUDA error: Failed to synchronize: CUDA_ERROR_ILLEGAL_ADDRESS", "cudaErrorIllegalAddress"),
    ("CUDA error: unspecified launch failure", "cudaErrorLaunchFailure"),
    ("cudaErrorLaunchFailure: unspecified launch failure", "cudaErrorLaunchFailure"),
    ("CUDA error: misaligned address", "cudaErrorMisalignedAddress"),
    ("CUDA error: device-side assert triggered", "cudaErrorAssert"),
    ("CUDA error: an illegal instruction was encountered", "cudaErrorIllegalInstruction"),
    ("CUDA_ERROR_HARDWARE_STACK_ERROR: hardware stack error", "cudaErrorHardwareStackError"),
    ("the launch timed out and was terminated", "cudaErrorLaunchTimeout"),
])
def test_sticky_cuda_errors_are_recognised_in_every_spelling(message, name):
    assert sticky_cuda_error(message) == name
    assert sticky_cuda_error(RuntimeError(message)) == name


@pytest.mark.parametrize("message", [
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "cudaErrorMemoryAllocation: out of memory",
    "CUDA error: invalid argument",
    "cudaErrorInvalidValue: invalid argument",
    "binary_backward: grad_a has shape (3,), expected (2, 3)",
    "CUDA error: no kernel image is available for execution on the device",
])
def test_other_errors_are_not_sticky(message):
    assert sticky_cuda_error(message) is None
    assert sticky_cuda_error(ValueError(message)) is None


def test_a_sticky_error_is_found_in_the_exception_chain():
    try:
        try:
            raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
        except RuntimeError as inner:
            raise ValueError("copying grad_a back failed") from inner
    except ValueError as outer:
        assert sticky_cuda_error(outer) == "cudaErrorIllegalAddress"


# ----------------------------------------------------------------------------- --isolate, end to end


def test_isolate_marks_crashes_and_hangs_and_the_run_goes_on(tmp_path):
    out_json = tmp_path / "r.json"
    out = harness("--isolate", "--case-timeout", "3", "--backend", "planted_crash", "--backend", "torch",
                  "--device", "cpu", "--seed", "11", "--cases", CASE, "--json", str(out_json))
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(out_json.read_text())
    rows = {r["impl"]: r for r in data["results"]}
    status = {impl: r["status"] for impl, r in rows.items()}
    assert status == {"torch": "PASS", "planted_crash@correct": "PASS", "planted_crash@segfault": "CRASH",
                      "planted_crash@abort": "CRASH", "planted_crash@exit": "CRASH", "planted_crash@hang": "TIMEOUT",
                      "planted_crash@raises": "ERROR", "planted_crash@sticky": "CRASH"}
    assert data["interrupted"] is None and data["counts"]["CRASH"] == 4 and data["counts"]["TIMEOUT"] == 1
    assert "killed by SIGSEGV" in rows["planted_crash@segfault"]["reason"]
    assert "in segfault" in rows["planted_crash@segfault"]["reason"]  # faulthandler's frame of the culprit
    assert rows["planted_crash@segfault"]["crash"]["signal"] == "SIGSEGV"
    assert "killed by SIGABRT" in rows["planted_crash@abort"]["reason"]
    assert "exited with status 3" in rows["planted_crash@exit"]["reason"]
    assert "--case-timeout 3" in rows["planted_crash@hang"]["reason"] and "in hang" in rows["planted_crash@hang"]["reason"]
    assert "planted: an ordinary error" in rows["planted_crash@raises"]["reason"]
    assert "cudaErrorIllegalAddress" in rows["planted_crash@sticky"]["reason"]
    for impl in ("planted_crash@segfault", "planted_crash@abort", "planted_crash@exit", "planted_crash@hang"):
        assert rows[impl]["repro"].startswith(f"GRADORACLE_BACKENDS=planted_crash PYTHONPATH={ROOT / 'tests'} "
                                              "python -m harness run ")
        assert f"--backend {impl} " in rows[impl]["repro"]
    text = out.stdout
    assert "2 passed, 6 failed (4 crashed, 1 timed out), 0 skipped" in text
    assert "CRASH  binary_backward  planted_crash@segfault" in text and "TIMEOUT binary_backward  planted_crash@hang" in text
    assert text.count("reproduce: GRADORACLE_BACKENDS=planted_crash") >= 6


def test_the_repro_command_of_a_crash_reproduces_it(tmp_path):
    out_json = tmp_path / "r.json"
    harness("--isolate", "--backend", "planted_crash@segfault", "--device", "cpu", "--cases", CASE,
            "--json", str(out_json))
    repro = json.loads(out_json.read_text())["results"][0]["repro"]
    repro = repro.replace(" python -m harness ", f" {sys.executable} -m harness ")  # this venv's python
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    again = subprocess.run(repro, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 1 and "killed by SIGSEGV" in again.stdout, again.stdout + again.stderr  # isolated
    again = subprocess.run(repro + " --no-isolate", shell=True, cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)
    assert again.returncode in (-11, 128 + 11), again.stdout + again.stderr  # SIGSEGV, through the shell or not


def test_a_sticky_cuda_error_stops_a_run_without_isolate(tmp_path):
    out_json = tmp_path / "r.json"
    out = harness("--backend", "planted_crash@correct", "--backend", "planted_crash@sticky", "--device", "cpu",
                  "--cases", TWO_CASES, "--json", str(out_json), "--no-isolate")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "STOPPED: CUDA context lost (cudaErrorIllegalAddress) in planted_crash@sticky on binary_backward " \
           "mul[f32,A=2x3,B=3]" in out.stderr
    assert "Later cases cannot run in this process" in out.stderr and "--isolate" in out.stderr
    data = json.loads(out_json.read_text())  # saved, with the culprit's row, and nothing after it
    assert [(r["impl"], r["status"]) for r in data["results"]] == [("planted_crash@correct", "PASS"),
                                                                   ("planted_crash@sticky", "CRASH")]
    assert data["interrupted"].startswith("stopped after 2 results: CUDA context lost")
    assert data["counts"]["CRASH"] == 1


def test_with_isolate_a_sticky_error_costs_one_case(tmp_path):
    out_json = tmp_path / "r.json"
    out = harness("--isolate", "--backend", "planted_crash@correct", "--backend", "planted_crash@sticky",
                  "--device", "cpu", "--cases", TWO_CASES, "--json", str(out_json))
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(out_json.read_text())
    assert [r["status"] for r in data["results"]] == ["PASS", "CRASH", "PASS", "CRASH"]


# ----------------------------------------------------------------------------- the runners, in this process


def test_isolated_runner_replaces_a_dead_worker():
    """The planted backend is not in the registry: the worker imports its module (tests/ on its PYTHONPATH)."""
    impls = planted_crash.planted_crash.impls
    case = _case()
    with IsolatedRunner("cpu", 3, case_timeout=30) as runner:
        first = runner.run(impls[("binary_backward", "segfault")], case)
        second = runner.run(impls[("binary_backward", "correct")], case)
        third = runner.run(impls[("binary_backward", "correct")], case)
        assert runner.started == 2  # one worker died, one served both correct calls
    assert (first.status, second.status, third.status) == ("CRASH", "PASS", "PASS")
    assert "SIGSEGV" in first.report() and "reproduce:" in first.report()
    assert first.repro.startswith("GRADORACLE_BACKENDS=planted_crash ")  # hand-registered: the repro names it


def test_a_signal_while_the_runner_closes_kills_the_worker_and_loses_nothing():
    """`timeout -s INT` can land while close() waits for the worker to exit, after the run's results
    are in hand (an H100 bench lost its rows that way): close() kills the worker and returns."""
    runner = IsolatedRunner("cpu", 3, case_timeout=30)
    ok = runner.run(planted_crash.planted_crash.impls[("binary_backward", "correct")], _case())
    worker = runner.worker
    real_wait, calls = worker.wait, []

    def interrupted_wait(timeout=10.0):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_wait(timeout)

    worker.wait = interrupted_wait
    runner.close()  # no KeyboardInterrupt out of it
    assert ok.status == "PASS" and runner.worker is None
    assert len(calls) == 2 and worker.proc.poll() is not None  # the second wait: kill()'s, after SIGKILL


def test_in_process_runner_turns_a_sticky_error_into_a_crash_row():
    runner = InProcessRunner("cpu", 3)
    ok = runner.run(planted_crash.planted_crash.impls[("binary_backward", "correct")], _case())
    assert ok.status == "PASS" and runner.lost is None
    row = runner.run(planted_crash.planted_crash.impls[("binary_backward", "sticky")], _case())
    assert row.status == "CRASH" and row.to_json()["crash"] == {"cuda_error": "cudaErrorIllegalAddress"}
    assert "planted_crash@sticky" in runner.lost and "mul[f32,A=2x3,B=3]" in runner.lost and "--isolate" in runner.lost
    other = InProcessRunner("cpu", 3)  # not sticky: the case's ERROR row, and the process goes on
    row = other.run(planted_crash.planted_crash.impls[("binary_backward", "raises")], _case())
    assert row.status == "ERROR" and "RuntimeError: planted: an ordinary error" in row.reason and other.lost is None


def test_a_result_survives_the_trip_through_json():
    result = InProcessRunner("cpu", 5).run(planted_crash.planted_crash.impls[("binary_backward", "correct")], _case())
    back = CaseResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.to_json() == result.to_json()
    assert back.report() == result.report() and back.outputs[0].worst_ratio == result.outputs[0].worst_ratio


def test_every_registry_case_keeps_its_id_through_json():
    """A worker rebuilds each case from its JSON: the id (hence the inputs' seed) must not change."""
    from cases import all_cases
    from cases.registry import from_json

    for case in all_cases():
        assert from_json(json.loads(json.dumps(case.to_json())), "worker").id == case.id


def test_stderr_excerpt_keeps_the_crash_and_its_innermost_frames():
    text = "\n".join([
        "some warning", "kernel says: bad index 7", "",
        "Fatal Python error: Segmentation fault", "",
        "Current thread 0x00007f0000000000 (most recent call first):",
        '  File "/x/planted_crash.py", line 45 in segfault',
        '  File "/x/harness/runner.py", line 144 in call',
        '  File "/x/harness/isolate.py", line 470 in worker_main',
        '  File "<frozen runpy>", line 88 in _run_code',
        "", "Extension modules: numpy.core._multiarray_umath, numpy.linalg (total: 2)"])
    lines = stderr_excerpt(text)
    assert lines[:3] == ["some warning", "kernel says: bad index 7", "Fatal Python error: Segmentation fault"]
    assert any("in segfault" in line for line in lines)
    assert not any("isolate.py" in line or "runpy" in line or "Extension modules" in line for line in lines)
    assert stderr_excerpt("\n".join(f"line {i}" for i in range(40)), limit=5) == [f"line {i}" for i in range(35, 40)]


# ----------------------------------------------------------------------------- on a GPU


def _needs_gpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
def test_gpu_illegal_address_is_a_crash_under_isolate(tmp_path):
    _needs_gpu()
    out_json = tmp_path / "r.json"
    out = harness("--isolate", "--backend", "planted_cuda@illegal_address", "--backend", "cupy@opt",
                  "--backend", "torch", "--device", "cuda", "--cases", TWO_CASES, "--json", str(out_json))
    assert out.returncode == 1, out.stdout + out.stderr
    rows = json.loads(out_json.read_text())["results"]
    status = {(r["impl"], r["case"]): r["status"] for r in rows}
    for case in ("mul[f32,A=2x3,B=3]", "add[f32,A=4,B=1]"):
        assert status[("planted_cuda@illegal_address", case)] == "CRASH"
        assert status[("cupy@opt", case)] == "PASS" and status[("torch", case)] == "PASS"  # the run went on
    crash = next(r for r in rows if r["impl"] == "planted_cuda@illegal_address")
    assert crash["crash"]["cuda_error"] == "cudaErrorIllegalAddress", crash["reason"]


@pytest.mark.gpu
def test_gpu_illegal_address_stops_a_run_cleanly_without_isolate(tmp_path):
    _needs_gpu()
    out_json = tmp_path / "r.json"
    # cupy@opt runs first and never starts torch's CUDA: the JSON is still written after the context is gone
    out = harness("--backend", "cupy@opt", "--backend", "planted_cuda@illegal_address", "--device", "cuda",
                  "--cases", TWO_CASES, "--json", str(out_json))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "STOPPED: CUDA context lost (cudaErrorIllegalAddress) in planted_cuda@illegal_address" in out.stderr
    assert "mul[f32,A=2x3,B=3]" in out.stderr and "--isolate" in out.stderr
    data = json.loads(out_json.read_text())
    assert [(r["impl"], r["status"]) for r in data["results"]] == [("cupy@opt", "PASS"),
                                                                   ("planted_cuda@illegal_address", "CRASH")]
    assert data["interrupted"].startswith("stopped after 2 results")
    assert data["device_name"].startswith("NVIDIA")
