"""`harness run` never dies on a backend, exits honestly and prints readable rows (issue 11, items 2-8).

The planted backends (tests/planted_errors.py: RuntimeError, AssertionError, KeyError, a warned
decline; tests/planted_crash.py: segfault) are found by subprocesses through GRADORACLE_BACKENDS.
"""
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import planted_crash
import planted_errors
from cases.registry import from_json
from harness import argcheck, registry, run_report, runner
from harness.compare import OutputReport
from harness.registry import Backend
from harness.report.text import status_matrix
from harness.results import CaseResult

ROOT = Path(__file__).resolve().parents[1]
CASE = '{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}}'
TWO_CASES = ('[{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}},'
             '{"op":"binary_backward","dtype":"f32","params":{"fn":"add","a":[4],"b":[1]}}]')
RAISING = {"runtime": ("RuntimeError: planted: out of resource", "in runtime"),
           "assertion": ("AssertionError: planted: grad_out must be contiguous", "in _check_contiguous"),
           "keyerror": ("KeyError: 'BLOCK_SIZE_N'", "in keyerror")}


def harness(*args, env_extra=None, timeout=600):
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_errors,planted_crash",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "harness", "run", "--device", "cpu", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _case(spec=CASE):
    return from_json(json.loads(spec), "test")


def _impl(variant):
    return planted_errors.planted_errors.impls[("binary_backward", variant)]


# ----------------------------------------------------------------------------- 2. any exception is an ERROR row


@pytest.mark.parametrize("variant", sorted(RAISING))
def test_any_exception_of_an_implementation_is_an_error_row_with_frames_and_repro(variant):
    row = runner.run_case(_impl(variant), _case(), "cpu", 0)
    message, frame = RAISING[variant]
    assert row.status == "ERROR", row.report()
    assert row.reason.startswith(message), row.reason
    assert "planted_errors.py:" in row.reason and frame in row.reason  # the innermost frames, the culprit's last
    assert "harness/" not in row.reason  # the implementation's own frames, not the harness's calls into it
    report = row.report()
    assert f"reproduce: python -m harness run --op binary_backward --backend planted_errors@{variant} " in report


def test_an_argument_error_of_argcheck_stays_one_line():
    be = Backend("checked_here", framework="numpy", devices=("cpu",), register=False)
    fn = argcheck.register(be, "binary_backward", dtypes=("f32",))(planted_errors.correct)
    inputs = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32), "grad_out": np.zeros((2, 3), np.float32)}
    with pytest.raises(ValueError) as caught:
        fn(inputs, {"grad_a": np.zeros(3, np.float32), "grad_b": np.zeros(3, np.float32)}, _case().params)
    text = runner.describe_exception(caught.value)
    assert "\n" not in text and text.startswith("ValueError: checked_here binary_backward: argument 'grad_a'") and "grad_a" in text


def test_a_sticky_cuda_error_still_leaves_run_case():
    """The CUDA errors that poison the context keep their handling: the runner (harness/isolate.py) stops
    or replaces the process."""
    with pytest.raises(RuntimeError, match="illegal memory access"):
        runner.run_case(planted_crash.planted_crash.impls[("binary_backward", "sticky")], _case(), "cpu", 0)


def test_the_run_goes_on_after_errors_in_this_process(tmp_path):
    out_json = tmp_path / "r.json"
    args = [a for v in ("runtime", "assertion", "keyerror", "correct") for a in ("--backend", f"planted_errors@{v}")]
    out = harness(*args, "--no-isolate", "--cases", TWO_CASES, "--seed", "3", "--json", str(out_json))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    rows = json.loads(out_json.read_text())["results"]
    assert [(r["impl"].split("@")[1], r["status"]) for r in rows] == [
        (v, "PASS" if v == "correct" else "ERROR") for v in ("assertion", "correct", "keyerror", "runtime")] * 2
    assert "2 passed, 6 failed, 0 skipped" in out.stdout
    assert out.stdout.count("reproduce: GRADORACLE_BACKENDS=planted_errors ") == 6


# ----------------------------------------------------------------------------- 3. crash isolation by default


def test_a_kernel_under_test_runs_isolated_by_default_and_a_crash_is_a_row(tmp_path):
    out_json = tmp_path / "r.json"
    out = harness("--backend", "planted_crash@segfault", "--backend", "planted_crash@correct", "--cases", TWO_CASES,
                  "--json", str(out_json))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "isolate=worker process" in out.stdout.splitlines()[0]
    data = json.loads(out_json.read_text())
    assert [r["status"] for r in data["results"]] == ["PASS", "CRASH", "PASS", "CRASH"]
    assert "killed by SIGSEGV" in data["results"][1]["reason"] and data["interrupted"] is None
    assert "2 passed, 2 failed (2 crashed, 0 timed out), 0 skipped" in out.stdout


def test_an_isolated_cpu_run_leaves_torch_to_its_worker():
    """The overhead of isolation: the worker starts first and imports torch; on a machine with no GPU
    device node the parent never does (it would only to choose the default device)."""
    from harness import isolate

    if not isolate.surely_no_gpu():
        pytest.skip("a GPU node exists: the parent asks the worker for the device")
    code = ("import sys; from harness.cli import main; code = main(sys.argv[1:]); "
            "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_errors", PYTHONPATH=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", code, "run", "--backend", "planted_errors@correct", "--cases", CASE],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "isolate=worker process" in out.stdout and "torch imported: False" in out.stdout, out.stdout


def test_no_isolate_runs_in_this_process():
    out = harness("--backend", "planted_crash@segfault", "--no-isolate", "--cases", CASE)
    assert out.returncode in (-11, 128 + 11), out.stdout + out.stderr  # SIGSEGV: the run itself died
    assert "isolate=" not in out.stdout


def test_baselines_alone_run_in_this_process():
    class Args:
        isolate = no_isolate = False

    torch_impl = registry.find_impl("binary_backward", "torch")
    mine = planted_errors.planted_errors.impls[("binary_backward", "correct")]
    assert run_report.isolate_by_default(Args, [(_case(), [torch_impl])]) is False
    assert run_report.isolate_by_default(Args, [(_case(), [torch_impl, mine])]) is True
    Args.no_isolate = True
    assert run_report.isolate_by_default(Args, [(_case(), [torch_impl, mine])]) is False


# ----------------------------------------------------------------------------- 4. nothing ran: exit 5


def test_a_run_where_everything_is_skipped_exits_5_with_the_top_reasons():
    out = harness("--backend", "cupy@opt", "--cases", TWO_CASES)
    assert out.returncode == 5, out.stdout + out.stderr
    assert "nothing ran: all 2 selected cases were skipped; top reasons:" in out.stdout
    assert re.search(r"\n\s+2 x cupy", out.stdout), out.stdout


def test_an_empty_selection_exits_5():
    out = harness("--backend", "torch", "--cases", CASE, "--dtype", "f64")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "nothing ran: the selection is empty" in out.stdout


# ----------------------------------------------------------------------------- 5. import failures are shown


def test_a_named_backend_that_fails_to_import_is_shown_with_its_error_and_origin(tmp_path):
    (tmp_path / "brokenmod.py").write_text("import os\nraise ImportError('planted: libfoo.so: cannot open shared "
                                           "object file')\n")
    env = {"GRADORACLE_BACKENDS": "brokenmod",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests")])}
    out = harness("--backend", "brokenmod", "--cases", CASE, env_extra=env)
    assert out.returncode != 0
    assert ("error: backend brokenmod failed to import: import of brokenmod failed: ImportError: planted: "
            "libfoo.so: cannot open shared object file") in out.stderr, out.stderr
    assert f"raised at {tmp_path / 'brokenmod.py'}:2" in out.stderr
    ran = harness("--backend", "torch", "--cases", CASE, env_extra=env)  # named through the variable: an error too
    assert ran.returncode == 1 and "PASS   binary_backward  torch" in ran.stdout
    assert "error: backend brokenmod failed to import" in ran.stderr


def test_another_backend_that_fails_to_import_is_one_warning_line(monkeypatch):
    monkeypatch.setattr(registry, "BROKEN", {"fancy": "import of backends.fancy failed: ImportError: no libcuda\nmore"})
    monkeypatch.setattr(run_report, "BROKEN", registry.BROKEN)
    monkeypatch.delenv("GRADORACLE_BACKENDS", raising=False)
    stream = io.StringIO()
    assert run_report.import_failures(["torch"], stream) is False
    assert stream.getvalue() == ("warning: backend fancy is unavailable: import of backends.fancy failed: "
                                 "ImportError: no libcuda\n")
    stream = io.StringIO()
    assert run_report.import_failures(["fancy@v2"], stream) is True
    assert stream.getvalue().startswith("error: backend fancy failed to import: ")


# ----------------------------------------------------------------------------- 6. skip reasons, warnings captured


def test_a_decline_is_a_skip_whose_reason_holds_the_warning():
    import torch

    if torch.cuda.is_available():
        pytest.skip("the planted decline declines only without CUDA")
    row = runner.run_case(_impl("declines"), _case(), "cpu", 0)
    assert row.status == "SKIP", row.report()
    assert "NotImplementedError: planted: no available kernel" in row.reason
    assert planted_errors.DECLINE_WARNING in row.reason and row.extra["warnings"]


@pytest.mark.parametrize("isolation", ["--no-isolate", "--isolate"])
def test_show_skips_prints_reasons_and_the_log_stays_clean(isolation):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the planted decline declines only without CUDA")
    out = harness("--backend", "planted_errors@declines", "--backend", "cupy@opt", "--cases", CASE, "--show-skips",
                  isolation)
    assert out.returncode == 5, out.stdout + out.stderr  # nothing ran
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("SKIP") and "planted_errors@declines" in line)
    assert planted_errors.DECLINE_WARNING in lines[at + 1] and "no available kernel" in lines[at + 1]
    at = next(i for i, line in enumerate(lines) if line.startswith("SKIP") and "cupy@opt" in line)
    assert lines[at + 1].strip().startswith("cupy"), lines[at + 1]
    assert "UserWarning" not in out.stderr and planted_errors.DECLINE_WARNING not in out.stderr


# ----------------------------------------------------------------------------- 7. err/tol, rel_l2, the matrix


def test_the_row_shows_err_tol_and_rel_l2_of_the_worst_output():
    row = CaseResult("binary_backward", "x", "mul[f32]", "f32", "cpu", "PASS", outputs=[
        OutputReport("grad_a", True, max_rel=82.0, rel_l2=1e-3, numel=6, worst_ratio=0.5),
        OutputReport("grad_b", True, max_rel=float("inf"), rel_l2=2e-2, numel=3, worst_ratio=0.125)])
    line = run_report.row_line(row)
    assert line.split()[-2:] == ["0.5", "2.00e-02"], line
    assert "max_rel" not in run_report.HEADER and run_report.HEADER.split()[-3:] == ["err/tol", "rel_l2", "time_ms"]


def test_the_matrix_counts_each_verdict_per_implementation_and_op():
    lines = status_matrix([("binary_backward", "torch", "PASS"), ("binary_backward", "torch", "FAIL"),
                           ("binary_backward", "torch", "XFAIL"), ("reduce_sum", "torch", "SKIP"),
                           ("reduce_sum", "cupy", "ERROR")])
    assert lines[0].split() == ["impl", "\\", "op", "binary", "reduce_sum"]
    assert lines[1].split() == ["torch", "1", "1F", "1x", "0", "1S"]
    assert lines[2].split() == ["cupy", "·", "0", "1E"]


def test_a_run_ends_with_the_matrix():
    out = harness("--backend", "torch", "--backend", "cupy@opt", "--cases", TWO_CASES, "--show-skips")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max_rel" not in out.stdout and "err/tol" in out.stdout.splitlines()[1]
    tail = out.stdout.splitlines()
    at = next(i for i, line in enumerate(tail) if line.startswith("impl \\ op"))
    assert tail[at + 1].split() == ["torch", "2"] and tail[at + 2].split() == ["cupy@opt", "0", "2S"]


# ----------------------------------------------------------------------------- 8. the repro line is self-sufficient


def test_the_repro_line_of_an_env_backend_reproduces_in_a_fresh_shell(tmp_path):
    pkg = tmp_path / "outside" / "tmpkern"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        """An outside backend with a planted bug: grad_b is written as zeros."""
        from harness.registry import Backend

        mine = Backend("tmpkern", framework="numpy", devices=("cpu",), register=False)


        @mine.impl("binary_backward", dtypes=("f32",))
        def wrong(inputs, outs, params):
            outs["grad_a"][...] = inputs["grad_out"] * inputs["b"]
            outs["grad_b"][...] = 0
        '''))
    env = {"GRADORACLE_BACKENDS": "tmpkern", "PYTHONPATH": str(tmp_path / "outside")}
    out = harness("--backend", "tmpkern", "--cases", CASE, env_extra=env)
    assert out.returncode == 1, out.stdout + out.stderr
    line = next(x.split("reproduce: ", 1)[1] for x in out.stdout.splitlines() if "reproduce: " in x)
    assert line.startswith(f"GRADORACLE_BACKENDS=tmpkern PYTHONPATH={tmp_path / 'outside'} python -m harness run "), line
    fresh = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
             "HOME": os.environ.get("HOME", "/tmp")}
    again = subprocess.run(["bash", "-c", line], cwd=ROOT, env=fresh, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1, again.stdout + again.stderr
    assert any(r.startswith("FAIL   binary_backward  tmpkern") for r in again.stdout.splitlines()), again.stdout


def test_sdpa_reads_torchs_cpp_warnings_off_stderr(capfd):
    """torch's can_use_*_attention checks print their reasons through C++ TORCH_WARN to fd 2 (no Python
    warning): backends/baselines/sdpa.py reads them from there into the skip reason, off the log."""
    from backends.baselines import sdpa

    line = (b"[W1124 01:02:03.456789 4242 sdp_utils.cpp:583] Warning: Flash attention requires q,k,v to have the "
            b"same last dimension and to be less than or equal to 256. Got Query.size(-1): 300 "
            b"(function check_head_dim_size_flash)\n")
    result, printed = sdpa.with_stderr(lambda: os.write(2, line) and False)
    assert result is False
    assert sdpa.cpp_warnings(printed) == ["Flash attention requires q,k,v to have the same last dimension and to be "
                                          "less than or equal to 256. Got Query.size(-1): 300"]
    assert capfd.readouterr().err == ""


def test_gpus_workers_whose_shards_were_all_skipped_are_complete():
    """A --gpus worker that ran nothing exits 5; the merged run is complete, and exits 5 itself."""
    out = harness("--gpus", "2", "--backend", "cupy@opt", "--cases", TWO_CASES)
    assert out.returncode == 5, out.stdout + out.stderr
    assert "incomplete" not in out.stdout + out.stderr and "nothing ran: all 2 selected cases were skipped" in out.stdout


def test_a_second_sigterm_cannot_interrupt_the_save_of_an_interrupted_run():
    """`timeout` signals the whole process group: the first TERM interrupts the run, a second one
    (seen on the H100 while the interrupted run printed its summary) must not kill the save."""
    import signal

    from harness import cli

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, cli._sigterm_as_interrupt)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: no KeyboardInterrupt, the process lives
    finally:
        signal.signal(signal.SIGTERM, before)
